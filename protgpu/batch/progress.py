"""Progress on stderr: :class:`BatchProgress` (the batch engine's display: a rich bar on a terminal,
periodic log lines otherwise); silent with --quiet."""

from __future__ import annotations

import os
import sys
import time


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def default_interval() -> float:
    """Seconds between progress log lines off a terminal: ``$PROTGPU_PROGRESS_INTERVAL``, else 5."""
    try:
        return float(os.environ.get("PROTGPU_PROGRESS_INTERVAL") or 5.0)
    except ValueError:
        return 5.0


class BatchProgress:
    """Progress of a batch run on ``stream`` (stderr): a rich bar (count, files/s, failures, ETA) on a
    terminal, a plain log line every ``interval`` seconds otherwise (for SLURM logs and pipes), and
    nothing when ``quiet``.

    It counts work as it is done: finished inputs (:meth:`advance`) and, within a batch that computes,
    the part of it the job has reported (:meth:`partial`: frames of a long trajectory, inputs of a
    batch). The rate and the ETA come from that completed work over the time elapsed, not from the
    spacing of the last updates (which made a batch that finished at once look like thousands of
    files a second). Nothing here starts a thread (the engine forks its parse workers only while this
    process runs a single thread): the display is redrawn, and log lines written, when work is
    reported; the last line is written by :meth:`close`.

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
        Seconds between log lines; default :func:`default_interval`.
    tty : bool, optional
        Force the terminal (True) or log-line (False) display; default: ``stream.isatty()``.
    """

    def __init__(self, total: int, *, description: str, quiet: bool = False, stream=None,
                 interval: float | None = None, tty: bool | None = None):
        self._time = time.monotonic
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.failed = int(total), 0, 0
        self.part = 0.0  # inputs' worth of work done in the batch now computing
        self.description = description
        self.t0 = self.last = self._time()
        self.interval = default_interval() if interval is None else float(interval)
        self._logged = None  # (done, part) of the last log line
        if tty is None:
            tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.mode = "off" if quiet or self.total < 1 else ("bar" if tty else "log")
        self._bar = None
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            # redrawn from advance(), not by rich's refresh thread (see above)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[failed]}"),
                                 TextColumn("{task.fields[eta]}"),
                                 console=Console(file=self.stream, force_terminal=True), transient=True,
                                 auto_refresh=False)
            self._drawn = float("-inf")
            self._bar.start()
            self._task = self._bar.add_task(description, total=self.total, failed="", rate="", eta="")

    @property
    def work(self) -> float:
        """Inputs' worth of work done: finished inputs plus the reported part of the current batch."""
        return min(self.done + self.part, float(self.total))

    def advance(self, ok: bool = True, n: int = 1) -> None:
        """Count ``n`` finished inputs (failed ones when ``ok`` is False)."""
        self.done += n
        self.part = 0.0
        if not ok:
            self.failed += n
        self._update()

    def partial(self, n: float) -> None:
        """``n`` inputs' worth of the batch now computing is done (reported by the job)."""
        self.part = max(0.0, float(n))
        self._update()

    def _rate_eta(self, now: float) -> tuple[float, str]:
        elapsed = max(now - self.t0, 1e-9)
        work = self.work
        rate = work / elapsed
        eta = _eta((self.total - work) / rate) if rate > 0 else "?"
        return rate, eta

    def _update(self) -> None:
        now = self._time()
        if self.mode == "bar":
            final = self.done >= self.total
            if now - self._drawn >= 0.1 or final:  # at most 10 redraws a second
                self._drawn = now
                rate, eta = self._rate_eta(now)
                self._bar.update(self._task, completed=self.work, rate=f"{rate:.1f} files/s" if self.work else "",
                                 failed=f"{self.failed} failed" if self.failed else "", eta=f"ETA {eta}")
                self._bar.refresh()
        elif self.mode == "log" and now - self.last >= self.interval:
            self._log(now)

    def _log(self, now: float) -> None:
        self.last = now
        self._logged = (self.done, self.part)
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The plain progress line: count (with the part of the current batch), percent, failures,
        rate and ETA."""
        now = now if now is not None else self._time()
        rate, eta = self._rate_eta(now)
        work = self.work
        count = f"{self.done}/{self.total}" if work == self.done else f"{work:.1f}/{self.total}"
        pct = 100.0 * work / self.total if self.total else 100.0
        return (f"{self.description}: {count} inputs ({pct:.0f}%), {self.failed} failed, "
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
        """Stop the display; off a terminal, write the last line when the run outlasted one interval
        and the last line written is out of date."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.mode == "log":
            now = self._time()
            if self._logged != (self.done, self.part) and (self._logged is not None
                                                           or now - self.t0 >= self.interval):
                self._log(now)
        self.mode = "off"
