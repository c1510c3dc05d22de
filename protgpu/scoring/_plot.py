"""Per-residue lDDT line plot (``protgpu score --plot``).

matplotlib is imported only here, when a figure is drawn, and used through its object API on an Agg
canvas (no ``pyplot``): nothing touches the process-wide backend or needs a display.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError, ProtgpuError

_MAX_LINES = 12  # beyond this many models the plot shows their median and range instead


def plot_lddt_per_residue(per_residue, path, *, labels: Sequence[str] | None = None,
                          names: Sequence[str] | None = None, title: str | None = None, dpi: int = 150):
    """Draw per-residue lDDT of one or more models along the reference sequence and write a PNG.

    Parameters
    ----------
    per_residue : array_like, shape (M, R) or (R,)
        Per-residue lDDT (0..1); NaN (residue absent or without contacts) leaves a gap.
    path : str or os.PathLike
        Output ``.png`` file, written atomically.
    labels : sequence of str, optional
        Residue labels (``"A:12"``), R of them; about 15 are shown on the x axis.
    names : sequence of str, optional
        Model names for the legend (up to 12 models are drawn as lines; more are summarised by their
        median and min-max band).
    title : str, optional
    dpi : int

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ProtgpuError("--plot needs matplotlib: pip install matplotlib") from None
    y = np.atleast_2d(np.asarray(per_residue, dtype=np.float64))
    m, r = y.shape
    if labels is not None and len(labels) != r:
        raise InputError(f"plot: {len(labels)} residue labels for {r} residues")
    x = np.arange(r)
    fig = Figure(figsize=(max(6.0, min(16.0, r / 25)), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if m <= _MAX_LINES:
        for i in range(m):
            ax.plot(x, y[i], lw=1.0, label=None if names is None else str(names[i]))
        if names is not None and m > 1:
            ax.legend(fontsize=7, loc="lower left", ncol=2)
    else:
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
                lo, med, hi = np.nanmin(y, axis=0), np.nanmedian(y, axis=0), np.nanmax(y, axis=0)
        ax.fill_between(x, lo, hi, alpha=0.3, lw=0, label=f"min-max of {m} models")
        ax.plot(x, med, lw=1.2, label="median")
        ax.legend(fontsize=7, loc="lower left")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(-0.5, r - 0.5)
    ax.set_ylabel("lDDT")
    ax.set_xlabel("reference residue")
    if labels is not None and r:
        step = max(1, int(np.ceil(r / 15)))
        ticks = np.arange(0, r, step)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(labels[i]) for i in ticks], rotation=45, ha="right", fontsize=7)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    from ..io import write_atomic

    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
