"""A progress bar (rich) for loops over many inputs; silent for one input or with --quiet."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: list[T], *, description: str, quiet: bool = False, min_items: int = 2) -> Iterator[T]:
    """Yield ``items``, drawing a rich progress bar (count, files/s, ETA) on stderr when there are at
    least ``min_items`` and stderr is a terminal."""
    if quiet or len(items) < min_items or not sys.stderr.isatty():
        yield from items
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class FilesPerSecond(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed:.1f} files/s" if task.speed else "")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), FilesPerSecond(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=len(items))
        for it in items:
            yield it
            bar.advance(task)
