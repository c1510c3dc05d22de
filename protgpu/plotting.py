"""Figures for the CLI and notebooks: labelled heatmaps written as PNG files.

matplotlib is optional (``pip install 'protgpu[docs]'``) and imported only when a figure is drawn. The
figure is drawn with matplotlib's object API on an Agg canvas (no ``pyplot``), so nothing here touches
the process-wide backend or needs a display, and it is safe from threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import InputError, ProtgpuError

__all__ = ["heatmap"]


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ProtgpuError("plotting needs matplotlib: pip install matplotlib (or 'protgpu[docs]')") from None
    return Figure, FigureCanvasAgg


def _tick_positions(n: int, max_ticks: int) -> np.ndarray:
    if n <= max_ticks:
        return np.arange(n)
    step = int(np.ceil(n / max_ticks))
    return np.arange(0, n, step)


def _labels(values, n: int, name: str) -> list[str] | None:
    if values is None:
        return None
    out = [str(v) for v in (values.tolist() if isinstance(values, np.ndarray) else list(values))]
    if len(out) != n:
        raise InputError(f"heatmap: {name} has {len(out)} labels for {n} rows/columns")
    return out


def heatmap(matrix, path, *, xlabels: Sequence | None = None, ylabels: Sequence | None = None,
            title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
            cbar_label: str | None = None, vmin: float | None = None, vmax: float | None = None,
            cmap: str = "viridis", max_ticks: int = 20, dpi: int = 150, size: float = 6.0):
    """Draw a 2-D array as a heatmap with labelled axes and a colour bar, and write it as a PNG.

    Parameters
    ----------
    matrix : array_like, shape (n_rows, n_cols)
        Values (NumPy, CuPy or torch). NaN and +-inf cells are left blank.
    path : str or os.PathLike
        Output ``.png`` file, written atomically (a temporary file renamed into place).
    xlabels, ylabels : sequence, optional
        One label per column / row (residue numbers, ``"A:LYS12"`` labels, ...); at most
        ``max_ticks`` of them are shown, evenly spaced. Default: 0-based indices. ``ylabels``
        defaults to ``xlabels`` for a square matrix.
    title, xlabel, ylabel, cbar_label : str, optional
        Figure title, axis titles and colour-bar title.
    vmin, vmax : float, optional
        Colour range (e.g. 0 and 1 for a frequency map). Default: the finite data range.
    cmap : str
        matplotlib colour map name.
    max_ticks : int
        Most tick labels per axis.
    dpi : int
        Resolution.
    size : float
        Figure width in inches (height follows the aspect ratio).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        ``matrix`` is not 2-D, a label list has the wrong length, or the path does not end in .png.
    ProtgpuError
        matplotlib is not installed.
    """
    from pathlib import Path

    from ._array import to_numpy
    from .io import write_atomic

    m = np.asarray(to_numpy(matrix), dtype=np.float64)
    if m.ndim != 2 or 0 in m.shape:
        raise InputError(f"heatmap: matrix must be a non-empty 2-D array, got shape {m.shape}")
    dest = Path(path)
    if dest.suffix.lower() != ".png":
        raise InputError(f"{dest}: heatmaps are written as .png files")
    n_rows, n_cols = m.shape
    xl = _labels(xlabels, n_cols, "xlabels")
    yl = _labels(ylabels, n_rows, "ylabels")
    if yl is None and xl is not None and n_rows == n_cols:
        yl = xl
    Figure, FigureCanvasAgg = _matplotlib()

    masked = np.ma.masked_invalid(m)
    fig = Figure(figsize=(size, size * max(0.3, min(3.0, n_rows / n_cols)) * 0.9 + 0.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    img = ax.imshow(masked, origin="lower", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax,
                    aspect="equal" if n_rows == n_cols else "auto")
    for axis, n, labels, setter, label_setter in (
        ("x", n_cols, xl, ax.set_xticks, ax.set_xticklabels),
        ("y", n_rows, yl, ax.set_yticks, ax.set_yticklabels),
    ):
        pos = _tick_positions(n, max_ticks)
        setter(pos)
        label_setter([labels[p] for p in pos] if labels is not None else [str(p) for p in pos],
                     rotation=90 if axis == "x" and labels is not None and max(map(len, labels)) > 4 else 0,
                     fontsize=7)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    cbar = fig.colorbar(img, ax=ax, fraction=0.046, pad=0.04)
    if cbar_label:
        cbar.set_label(cbar_label)
    fig.tight_layout()
    return write_atomic(dest, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
