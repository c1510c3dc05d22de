"""Progress on stderr: :func:`progress` (a rich bar over a loop) and :class:`BatchProgress` (the batch
engine's display: a bar on a terminal, periodic log lines otherwise); silent with --quiet."""

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


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


class BatchProgress:
    """Progress of a batch run on ``stream`` (stderr): a rich bar (count, files/s, failures, ETA) on a
    terminal, a plain log line every ``interval`` seconds otherwise (for SLURM logs and pipes), and
    nothing when ``quiet`` or for a single input.

    Parameters
    ----------
    total : int
        Inputs of the run.
    description : str
        Label, e.g. the subcommand's name.
    quiet : bool
    stream : file, optional
        Default ``sys.stderr``.
    interval : float, optional
        Seconds between log lines; default ``$PROTGPU_PROGRESS_INTERVAL`` or 10.
    tty : bool, optional
        Force the terminal (True) or log-line (False) display; default: ``stream.isatty()``.
    """

    def __init__(self, total: int, *, description: str, quiet: bool = False, stream=None,
                 interval: float | None = None, tty: bool | None = None):
        import os
        import time

        self._time = time.monotonic
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.failed = int(total), 0, 0
        self.description = description
        self.t0 = self.last = self._time()
        self.interval = float(os.environ.get("PROTGPU_PROGRESS_INTERVAL", 10)) if interval is None else float(interval)
        if tty is None:
            tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.mode = "off" if quiet or self.total < 2 else ("bar" if tty else "log")
        self._bar = None
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            class FilesPerSecond(ProgressColumn):
                def render(self, task) -> Text:
                    return Text(f"{task.speed:.1f} files/s" if task.speed else "")

            # redrawn from advance(), not by rich's refresh thread: the batch engine forks its parse
            # workers only while this process runs a single thread
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 FilesPerSecond(), TextColumn("{task.fields[failed]}"), TimeRemainingColumn(),
                                 console=Console(file=self.stream, force_terminal=True), transient=True,
                                 auto_refresh=False)
            self._drawn = float("-inf")
            self._bar.start()
            self._task = self._bar.add_task(description, total=self.total, failed="")

    def advance(self, ok: bool = True, n: int = 1) -> None:
        """Count ``n`` finished inputs (failed ones when ``ok`` is False)."""
        self.done += n
        if not ok:
            self.failed += n
        if self.mode == "bar":
            self._bar.update(self._task, advance=n, failed=f"{self.failed} failed" if self.failed else "")
            now = self._time()
            if now - self._drawn >= 0.1 or self.done >= self.total:  # at most 10 redraws a second
                self._drawn = now
                self._bar.refresh()
        elif self.mode == "log":
            now = self._time()
            if now - self.last >= self.interval:
                self.last = now
                self.stream.write(self.line(now) + "\n")
                self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The plain progress line: count, percent, failures, rate and ETA."""
        elapsed = max((now if now is not None else self._time()) - self.t0, 1e-9)
        rate = self.done / elapsed
        left = self.total - self.done
        eta = _eta(left / rate) if rate > 0 else "?"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"{self.description}: {self.done}/{self.total} inputs ({pct:.0f}%), {self.failed} failed, "
                f"{rate:.1f} files/s, ETA {eta}")

    def note(self, msg: str) -> None:
        """A one-line message (prefixed with the description) that does not garble the bar."""
        msg = f"{self.description}: {msg}"
        if self.mode == "bar":
            self._bar.console.print(msg, markup=False, highlight=False)
        else:
            self.stream.write(msg + "\n")
            self.stream.flush()

    def note_to(self, fallback):
        """A note function: printed with the display when there is one, else handed to ``fallback``."""
        return fallback if self.mode == "off" else self.note

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
