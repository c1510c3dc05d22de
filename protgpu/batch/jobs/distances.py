"""The job of ``protgpu distances``: a distance matrix per input, same-size inputs stacked."""

from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..job import Job, apply_selection, warm_device
from ..results import Result

__all__ = ["DistancesJob"]


class DistancesJob(Job):
    """All-atom (or selected) distance matrices of every input, float32 Angstrom, one array per input.

    Inputs with the same atom count (and no periodic box) are stacked into one
    :func:`protgpu.distances` call of at most ``max_batch_bytes`` of output.

    Parameters
    ----------
    select : str, optional
    top : str, optional
        Topology for trajectory inputs.
    periodic : bool
        Minimum-image distances with each input's box (an input without a box fails).
    summary : bool
        Put frames, atoms and the smallest non-zero / largest distance in each input's row.
    device : {"auto", "cpu", "gpu"}
    batch_size : int
    max_batch_bytes : int
        Largest stacked output of one call.
    """

    name = "distances"

    def __init__(self, *, select: str | None = None, top=None, periodic: bool = False, summary: bool = False,
                 device: str = "auto", batch_size: int = 64, max_batch_bytes: int = 1 << 28):
        self.select = select
        self.top = None if top is None else str(top)
        self.periodic = bool(periodic)
        self.summary = bool(summary)
        self.device = device
        self.batch_size = int(batch_size)
        self.max_batch_bytes = int(max_batch_bytes)
        # a stack of more output than this is computed in chunks of frames, each reported as progress
        self.progress_bytes = 1 << 26

    def options(self) -> dict:
        return {"select": self.select, "top": self.top, "periodic": self.periodic}

    def load(self, path: str):
        from ...io import load

        s = apply_selection(load(path, top=self.top), self.select, path)
        if self.periodic and s.box is None:
            raise InputError(f"{path}: --periodic given but the file has no box")
        return {"coords": s.coords, "box": s.box if self.periodic else None}

    def size(self, item) -> object:
        return (item["coords"].shape[1], item["box"] is not None)

    def warm_up(self) -> None:
        """Decide ``device="auto"`` once the engine's parse workers have started (:func:`warm_device`);
        on the GPU also compute one 2-atom matrix, which creates the CUDA context and loads the
        distance kernel (every box mode runs the same kernel) while the workers parse."""
        from ...distances import distances

        warm_device(self.device, lambda: distances(np.zeros((1, 2, 3), np.float32), device=self.device))

    def _frames_in_chunks(self, stack: np.ndarray, per_frame: int, done: int, total: int) -> np.ndarray:
        """``distances(stack)``, in chunks of frames of at most ``progress_bytes`` of output when the
        stack is larger (a long trajectory), reporting each chunk's frames as progress. Frames are
        independent, so the chunks change no value."""
        from ...distances import distances

        step = max(1, self.progress_bytes // per_frame)
        if len(stack) <= step:
            d = distances(stack, device=self.device)
        else:
            d = np.empty((len(stack), stack.shape[1], stack.shape[1]), stack.dtype)
            for f0 in range(0, len(stack), step):
                distances(stack[f0:f0 + step], out=d[f0:f0 + step], device=self.device)
                self.report_progress((done + min(f0 + step, len(stack))) / total)
        self.report_progress((done + len(stack)) / total)
        return d

    def compute(self, items: list) -> list:
        from ...distances import distances

        out: list = [None] * len(items)
        total_frames = sum(it["coords"].shape[0] for it in items)
        done_frames = 0
        i = 0
        while i < len(items):
            c = items[i]["coords"]
            if items[i]["box"] is not None:
                out[i] = distances(c, box=items[i]["box"], device=self.device)
                done_frames += c.shape[0]
                self.report_progress(done_frames / total_frames)
                i += 1
                continue
            # stack the run of inputs with this atom count, up to the byte budget
            per_frame = 4 * c.shape[1] ** 2
            j, frames = i, 0
            while (j < len(items) and items[j]["box"] is None and items[j]["coords"].shape[1] == c.shape[1]
                   and (j == i or (frames + items[j]["coords"].shape[0]) * per_frame <= self.max_batch_bytes)):
                frames += items[j]["coords"].shape[0]
                j += 1
            stack = c if j == i + 1 else np.concatenate([it["coords"] for it in items[i:j]])
            d = self._frames_in_chunks(stack, per_frame, done_frames, total_frames)
            done_frames += len(stack)
            f0 = 0
            for k in range(i, j):
                n = items[k]["coords"].shape[0]
                out[k] = d[f0:f0 + n]
                f0 += n
            i = j
        results = []
        for d in out:
            row = {}
            if self.summary:
                pos = d[d > 0]
                row = {"frames": int(d.shape[0]), "atoms": int(d.shape[1]),
                       "min": float(pos.min()) if pos.size else 0.0, "max": float(d.max()) if d.size else 0.0}
            results.append(Result(rows=[row] if row else [], arrays={"": d}))
        return results

