"""The whole-run part of ``protgpu cluster``: one clustering over the frames of all inputs (loaded by the
engine through :class:`CoordinatesJob`, as ``protgpu pairwise-rmsd`` does), the per-frame table and the
representative structures. Nothing here parses a command line."""

from __future__ import annotations

import numpy as np

from ...errors import InputError

__all__ = ["ClusterRun"]


class ClusterRun:
    """One clustering of the stacked frames of every input.

    Parameters
    ----------
    method, metric, cutoff, k, linkage, seed, precision, device
        As :func:`protgpu.cluster` (``metric`` "rmsd" or "tm"; for "tm" the loaded atoms are one CA per
        residue: ``--select ca``).
    """

    def __init__(self, *, method: str = "gromos", metric: str = "rmsd", cutoff=None, k=None,
                 linkage: str = "average", seed=0, precision: str = "float64", device: str = "auto"):
        self.method, self.metric, self.cutoff, self.k, self.linkage = method, metric, cutoff, k, linkage
        self.seed, self.precision, self.device = seed, precision, device

    def options(self) -> dict:
        return {"method": self.method, "metric": self.metric, "cutoff": self.cutoff, "k": self.k,
                "linkage": self.linkage, "seed": self.seed, "precision": self.precision}

    def check(self) -> None:
        """The parameters' errors before any input is read (the domain function's own checks)."""
        from ...cluster.core import LINKAGES, METHODS, _check_params

        if self.method not in METHODS:
            raise InputError(f"method {self.method!r}: use one of {', '.join(METHODS)}")
        if self.method == "hierarchical" and self.linkage not in LINKAGES:
            raise InputError(f"linkage {self.linkage!r}: use one of {', '.join(LINKAGES)}")
        _check_params(self.method, self.cutoff, self.k)

    def run(self, coords: np.ndarray):
        """:func:`protgpu.cluster` of ``coords`` (F, N, 3)."""
        from ...cluster import cluster

        return cluster(coords, method=self.method, metric=self.metric, cutoff=self.cutoff, k=self.k,
                       linkage=self.linkage, seed=self.seed, precision=self.precision, device=self.device)

    @staticmethod
    def frame_index(entries: list[dict]):
        """(input name, frame within it) of every stacked frame, from the loading manifest's entries."""
        names, frames = [], []
        for e in entries:
            if e["status"] == "ok":
                f = e["rows"][0]["frames"]
                names += [e["input"]] * f
                frames.append(np.arange(f, dtype=np.int64))
        return names, (np.concatenate(frames) if frames else np.zeros(0, np.int64))

    @staticmethod
    def rows(names, frames, labels, medoids) -> list[dict]:
        """One row per frame: input, frame, cluster (0-based), and whether it is its cluster's representative."""
        rep = np.zeros(len(labels), dtype=bool)
        rep[np.asarray(medoids)] = True
        return [{"input": n, "frame": int(f), "cluster": int(c), "representative": bool(r)}
                for n, f, c, r in zip(names, frames.tolist(), np.asarray(labels).tolist(), rep.tolist(), strict=True)]

    @staticmethod
    def representatives(names, frames, medoids, *, select=None, top=None):
        """The representative frames as one Structure (a model per cluster, in cluster order): each
        medoid's frame taken from its input, with the atoms of ``select``."""
        from ...io import load
        from ...structure import Structure

        coords, atoms, cache = [], None, {}
        for m in np.asarray(medoids).tolist():
            path = names[m]
            if path not in cache:
                s = load(path, top=top)
                cache = {path: s.select(select) if select else s}  # one input held at a time
            s = cache[path]
            if atoms is None:
                atoms = s.atoms
            coords.append(s.coords[int(frames[m])])
        return Structure(np.stack(coords), atoms, source="cluster representatives")
