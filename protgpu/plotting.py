"""Figures for the CLI and notebooks: labelled heatmaps and line plots written as PNG, SVG or PDF
files (by the file name's suffix, :data:`FIGURE_SUFFIXES`).

:func:`heatmap` draws a matrix (contact maps, distance maps, pairwise RMSD) with a colour bar;
:func:`line_plot` draws one or more series against a shared x axis (RMSD against frame);
:func:`per_residue_plot` is the line plot with residue numbers on the x axis (per-residue lDDT). Every
``--plot`` option of the ``protgpu`` command draws through these three.

matplotlib is optional (``pip install 'protgpu[docs]'``) and imported only when a figure is drawn. The
figure is drawn with matplotlib's object API on an Agg canvas (no ``pyplot``), so nothing here touches
the process-wide backend or needs a display, and it is safe from threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import InputError, ProtgpuError

__all__ = ["cluster_sizes_plot", "dendrogram_plot", "heatmap", "line_plot", "per_residue_plot"]

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
"""The figure formats: matplotlib writes each with its own backend (PNG through Agg, SVG, PDF)."""


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ProtgpuError("plotting needs matplotlib: pip install matplotlib (or 'protgpu[docs]')") from None
    return Figure, FigureCanvasAgg


def _new_figure(figsize: tuple[float, float]):
    """A matplotlib Figure on its own Agg canvas (no pyplot: no global backend, thread-safe)."""
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)  # attaches itself to ``fig``, so savefig renders with Agg
    return fig


def _save_figure(fig, dest, dpi: int):
    """Lay ``fig`` out and write it at ``dest`` atomically (a temporary name, then a rename), in the
    format of ``dest``'s suffix (``dpi`` sets a PNG's pixels and the rasters inside an SVG or PDF).

    Returns
    -------
    pathlib.Path
        ``dest``.
    """
    from .io import write_atomic

    fig.tight_layout()
    fmt = dest.suffix.lower().lstrip(".")
    # No date in an SVG or PDF file: a PDF of the same figure is then the same bytes.
    meta = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}.get(fmt)
    return write_atomic(dest, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt, metadata=meta))


def _tick_positions(n: int, max_ticks: int) -> np.ndarray:
    if n <= max_ticks:
        return np.arange(n)
    step = int(np.ceil(n / max_ticks))
    return np.arange(0, n, step)


def _labels(values, n: int, name: str, func: str = "heatmap", what: str = "rows/columns") -> list[str] | None:
    if values is None:
        return None
    out = [str(v) for v in (values.tolist() if isinstance(values, np.ndarray) else list(values))]
    if len(out) != n:
        raise InputError(f"{func}: {name} has {len(out)} labels for {n} {what}")
    return out


def _figure_path(path, what: str):
    from pathlib import Path

    dest = Path(path)
    if dest.suffix.lower() not in FIGURE_SUFFIXES:
        raise InputError(f"{dest}: {what} are written as {', '.join(FIGURE_SUFFIXES)} files")
    return dest


def require_figure(path, option: str = "--plot") -> None:
    """Check a CLI plot option before any work is done: a ``.png``, ``.svg`` or ``.pdf`` name, and
    matplotlib importable.

    Parameters
    ----------
    path : str or os.PathLike
        The file name given to ``option``.
    option : str
        The option's name, for the message.

    Raises
    ------
    InputError
        The name does not end in one of :data:`FIGURE_SUFFIXES`, or matplotlib is not installed (one
        line each, naming ``option`` and the file).
    """
    if not str(path).lower().endswith(FIGURE_SUFFIXES):
        raise InputError(f"{option} {path}: use a .png, .svg or .pdf file name")
    try:
        _matplotlib()
    except ProtgpuError:
        raise InputError(f"{option} {path}: plotting needs matplotlib (pip install matplotlib)") from None


def heatmap(matrix, path, *, xlabels: Sequence | None = None, ylabels: Sequence | None = None,
            title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
            cbar_label: str | None = None, vmin: float | None = None, vmax: float | None = None,
            cmap: str = "viridis", cbar_marks: dict | None = None, blocks: Sequence | None = None,
            max_ticks: int = 20, dpi: int = 150, size: float = 6.0):
    """Draw a 2-D array as a heatmap with labelled axes and a colour bar, and write it as a PNG, SVG
    or PDF file.

    Parameters
    ----------
    matrix : array_like, shape (n_rows, n_cols)
        Values (NumPy, CuPy or torch). NaN and +-inf cells are left blank.
    path : str or os.PathLike
        Output ``.png``, ``.svg`` or ``.pdf`` file, written atomically (a temporary file renamed into
        place).
    xlabels, ylabels : sequence, optional
        One label per column / row (residue numbers, ``"A:LYS12"`` labels, ...); at most
        ``max_ticks`` of them are shown, evenly spaced. Default: 0-based indices. ``ylabels``
        defaults to ``xlabels`` for a square matrix.
    title, xlabel, ylabel, cbar_label : str, optional
        Figure title, axis titles and colour-bar title.
    vmin, vmax : float, optional
        Colour range (e.g. 0 and 1 for a frequency map). Default: the finite data range. Values
        beyond a given limit are drawn in the end colour, and the colour bar ends in an arrow on that
        side to say so.
    cmap : str
        matplotlib colour map name.
    cbar_marks : dict of float to str, optional
        Values to mark on the colour bar with a line and a label (e.g. ``{4.5: "cutoff 4.5 Å"}``).
    blocks : sequence of (str, int, int), optional
        For a matrix whose rows and columns are the same items in order (frames of several inputs):
        ``(label, start, stop)`` of each consecutive block. Lines part the blocks and labels along
        the top edge name them (up to 30 blocks are labelled).
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
        ``matrix`` is not 2-D, a label list has the wrong length, or the path does not end in .png,
        .svg or .pdf.
    ProtgpuError
        matplotlib is not installed.

    Examples
    --------
    A CA distance map of adenylate kinase with residue numbers on both axes:

    >>> import os, tempfile
    >>> import protgpu as pg
    >>> ca = pg.load("datasets/adk_open.pdb").select("ca")
    >>> d = pg.distances(ca, device="cpu")[0]
    >>> d.shape
    (214, 214)
    >>> png = heatmap(d, os.path.join(tempfile.mkdtemp(), "adk_ca.png"), xlabels=ca.atoms.resid,
    ...               xlabel="residue", ylabel="residue", cbar_label="distance (Å)", dpi=40)
    >>> png.name, png.read_bytes()[1:4]
    ('adk_ca.png', b'PNG')
    """
    from ._array import to_numpy

    m = np.asarray(to_numpy(matrix), dtype=np.float64)
    if m.ndim != 2 or 0 in m.shape:
        raise InputError(f"heatmap: matrix must be a non-empty 2-D array, got shape {m.shape}")
    dest = _figure_path(path, "heatmaps")
    n_rows, n_cols = m.shape
    xl = _labels(xlabels, n_cols, "xlabels")
    yl = _labels(ylabels, n_rows, "ylabels")
    if yl is None and xl is not None and n_rows == n_cols:
        yl = xl
    fig = _new_figure((size, size * max(0.3, min(3.0, n_rows / n_cols)) * 0.9 + 0.6))
    masked = np.ma.masked_invalid(m)
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
    finite = m[np.isfinite(m)]
    over = bool(vmax is not None and finite.size and finite.max() > vmax)
    under = bool(vmin is not None and finite.size and finite.min() < vmin)
    extend = {(True, True): "both", (True, False): "max", (False, True): "min"}.get((over, under), "neither")
    cbar = fig.colorbar(img, ax=ax, fraction=0.046, pad=0.04, extend=extend)
    if cbar_label:
        cbar.set_label(cbar_label)
    if cbar_marks:
        _mark_colour_bar(cbar, cbar_marks)
    if blocks:
        _draw_blocks(ax, blocks, n_rows, n_cols)
    return _save_figure(fig, dest, dpi)


def _mark_colour_bar(cbar, marks: dict) -> None:
    """A red line across the colour bar at each value of ``marks``, with its label as a tick label
    (numeric ticks too close to it are dropped so that the labels do not overlap)."""
    lo, hi = cbar.mappable.get_clim()
    near = 0.06 * (hi - lo)
    ticks = {float(t): f"{t:g}" for t in cbar.get_ticks()
             if lo <= t <= hi and all(abs(t - v) > near for v in marks)}
    for value, text in marks.items():
        cbar.ax.axhline(value, color="red", lw=1.5)
        ticks[float(value)] = text
    order = sorted(ticks)
    cbar.set_ticks(order, labels=[ticks[t] for t in order])
    for value, label in zip(order, cbar.ax.get_yticklabels(), strict=True):
        if value in marks:
            label.set_color("red")


def _draw_blocks(ax, blocks, n_rows: int, n_cols: int) -> None:
    """Lines between consecutive ``(label, start, stop)`` blocks of rows and columns, and the labels
    along the top edge."""
    starts = [int(a) for _, a, _ in blocks]
    for a in starts[1:]:
        if 0 < a < n_cols:
            ax.axvline(a - 0.5, color="white", lw=1.0)
        if 0 < a < n_rows:
            ax.axhline(a - 0.5, color="white", lw=1.0)
    if len(blocks) > 30:  # past that the labels overlap; the lines still show the blocks
        return
    centres = [(int(a) + int(b) - 1) / 2 for _, a, b in blocks]
    names = [str(label) for label, _, _ in blocks]
    top = ax.secondary_xaxis("top")
    top.set_xticks(centres)
    top.set_xticklabels(names, rotation=30 if max(map(len, names)) > 6 else 0, ha="left", fontsize=6)


def line_plot(values, path, *, x=None, xticklabels: Sequence | None = None, names: Sequence | None = None,
              title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
              ylim: tuple[float, float] | None = None, lines: bool = True, max_lines: int = 12, max_ticks: int = 15,
              dpi: int = 150, width: float | None = None):
    """Draw one or more series against a shared x axis and write the figure (PNG, SVG or PDF).

    Parameters
    ----------
    values : array_like, shape (n_series, n_points) or (n_points,)
        The series (NumPy, CuPy or torch; any real dtype, drawn as float64). NaN and +-inf leave a
        gap, so series of different lengths can be padded with NaN.
    path : str or os.PathLike
        Output ``.png``, ``.svg`` or ``.pdf`` file, written atomically (a temporary file renamed into
        place).
    x : array_like, shape (n_points,), optional
        x position of each point. Default: 0, 1, ..., n_points - 1.
    xticklabels : sequence, optional
        One label per point (residue numbers, ``"A:12"`` labels, file names); at most ``max_ticks``
        of them are shown, evenly spaced, rotated when longer than four characters. Default:
        matplotlib's numeric ticks.
    names : sequence of str, optional
        One name per series, shown in a legend when there is more than one series.
    title, xlabel, ylabel : str, optional
        Figure title and axis titles.
    ylim : (float, float), optional
        y range (e.g. ``(0, 1.02)`` for scores in [0, 1]). Default: the data range.
    lines : bool
        Join the points; False draws markers only (points that are not a sequence, e.g. one per
        input file). Series of at most 60 points get markers either way.
    max_lines : int
        Most series drawn as separate lines; beyond that the figure shows their median and their
        min-max band (a legend says how many series), which stays readable for thousands of models.
    max_ticks : int
        Most tick labels on the x axis when ``xticklabels`` is given.
    dpi : int
        Resolution.
    width : float, optional
        Figure width in inches (height 3.6 in). Default: grows with ``n_points``, 6 to 16 in.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        ``values`` is empty or has more than 2 dimensions, ``x``, ``xticklabels`` or ``names`` has the
        wrong length, or the path does not end in .png, .svg or .pdf.
    ProtgpuError
        matplotlib is not installed.

    Examples
    --------
    RMSD of each frame of a short trajectory to its first frame:

    >>> import os, tempfile
    >>> import protgpu as pg
    >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb", frames=slice(0, 20))
    >>> r = pg.rmsd(traj, traj.frames(0), fit="ca", device="cpu")
    >>> png = line_plot(r, os.path.join(tempfile.mkdtemp(), "rmsd.png"), xlabel="frame",
    ...                 ylabel="RMSD (Å)", title="adk_dims.dcd vs frame 0", dpi=40)
    >>> png.name, png.read_bytes()[1:4]
    ('rmsd.png', b'PNG')
    """
    from ._array import to_numpy

    y = np.array(to_numpy(values), dtype=np.float64)  # a copy: infinities are set to NaN below
    if y.ndim == 1:
        y = y[None]
    if y.ndim != 2 or 0 in y.shape:
        raise InputError(f"line_plot: values must be a non-empty 1-D or 2-D array, got shape {y.shape}")
    dest = _figure_path(path, "line plots")
    m, n = y.shape
    xs = np.arange(n, dtype=np.float64) if x is None else np.asarray(to_numpy(x), dtype=np.float64).ravel()
    if len(xs) != n:
        raise InputError(f"line_plot: x has {len(xs)} positions for {n} points")
    ticks = _labels(xticklabels, n, "xticklabels", "line_plot", "points")
    series = _labels(names, m, "names", "line_plot", "series")
    fig = _new_figure((width or max(6.0, min(16.0, n / 25)), 3.6))
    ax = fig.add_subplot(1, 1, 1)
    # Markers on short series: a point between two gaps (NaN) would otherwise not be drawn at all.
    style = {"lw": 1.0 if lines else 0.0, "marker": "o" if n <= 60 or not lines else None,
             "markersize": (3 if lines else 5) if n <= 200 else 1.5}
    y[~np.isfinite(y)] = np.nan
    if m <= max_lines:
        for i in range(m):
            ax.plot(xs, y[i], label=None if series is None else series[i], **style)
        if series is not None and m > 1:
            ax.legend(fontsize=7, loc="best", ncol=2 if m > 4 else 1)
    else:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # columns where every series is NaN
            lo, med, hi = np.nanmin(y, axis=0), np.nanmedian(y, axis=0), np.nanmax(y, axis=0)
        ax.fill_between(xs, lo, hi, alpha=0.3, lw=0, label=f"min-max of {m} series")
        ax.plot(xs, med, label="median", **style)
        ax.legend(fontsize=7, loc="best")
    if ticks is not None:
        pos = _tick_positions(n, max_ticks)
        ax.set_xticks(xs[pos])
        long = max(map(len, ticks)) > 4
        ax.set_xticklabels([ticks[p] for p in pos], rotation=45 if long else 0, ha="right" if long else "center",
                           fontsize=7)
    if n > 1:
        step = (xs[-1] - xs[0]) / (n - 1)
        ax.set_xlim(xs[0] - step / 2, xs[-1] + step / 2)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    return _save_figure(fig, dest, dpi)


def per_residue_plot(values, path, *, labels: Sequence | None = None, names: Sequence | None = None,
                     title: str | None = None, ylabel: str = "lDDT", ylim: tuple[float, float] | None = (0.0, 1.02),
                     xlabel: str = "reference residue", max_lines: int = 12, dpi: int = 150):
    """Draw a per-residue score of one or more models along the sequence and write a figure.

    :func:`line_plot` with residue numbers on the x axis and, by default, the axis of a score in
    [0, 1] (per-residue lDDT, as ``protgpu score --plot`` draws it).

    Parameters
    ----------
    values : array_like, shape (M, R) or (R,)
        Per-residue values of M models over R residues; NaN (a residue absent from a model, or
        without pairs) leaves a gap.
    path : str or os.PathLike
        Output ``.png``, ``.svg`` or ``.pdf`` file, written atomically.
    labels : sequence, optional
        One label per residue (residue numbers, or ``"A:12"`` as
        :func:`protgpu.scoring.lddt_residue_labels` gives them); about 15 are shown. Default: 1-based
        positions 1, 2, ..., R.
    names : sequence of str, optional
        Model names for the legend (shown with two models or more).
    title : str, optional
    ylabel, xlabel : str
        Axis titles.
    ylim : (float, float) or None
        y range; None fits the data (for values that are not in [0, 1]).
    max_lines : int
        Most models drawn as lines; more are drawn as their median and min-max band.
    dpi : int
        Resolution.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        Empty ``values``, ``labels`` or ``names`` of the wrong length, or a path not ending in .png,
        .svg or .pdf.
    ProtgpuError
        matplotlib is not installed.

    Examples
    --------
    Per-residue lDDT of the closed form of adenylate kinase against the open form, CA atoms:

    >>> import os, tempfile
    >>> import protgpu as pg
    >>> ref = pg.load("datasets/adk_open.pdb")
    >>> score, per = pg.lddt("datasets/adk_closed.pdb", ref, atoms="ca", per_residue=True, device="cpu")
    >>> per.shape
    (214,)
    >>> png = per_residue_plot(per, os.path.join(tempfile.mkdtemp(), "lddt.png"),
    ...                        labels=pg.scoring.lddt_residue_labels(ref), dpi=40)
    >>> png.name, png.read_bytes()[1:4]
    ('lddt.png', b'PNG')
    """
    from ._array import to_numpy

    v = np.asarray(to_numpy(values), dtype=np.float64)
    if labels is None and v.ndim in (1, 2) and v.shape[-1]:
        labels = range(1, v.shape[-1] + 1)
    return line_plot(v, path, xticklabels=None if labels is None else list(labels), names=names, title=title,
                     xlabel=xlabel, ylabel=ylabel, ylim=ylim, max_lines=max_lines, dpi=dpi)


def cluster_sizes_plot(labels, sizes, path, *, title: str | None = None, max_clusters: int = 20, dpi: int = 150):
    """Cluster of each frame against the frame index (top) and the frames per cluster (bottom), PNG/SVG/PDF.

    Parameters
    ----------
    labels : array_like (frames,) int
        Cluster of each frame, 0-based (:attr:`protgpu.cluster.Clustering.labels`).
    sizes : array_like (clusters,) int
    path : str or os.PathLike
        ``.png``, ``.svg`` or ``.pdf``, written atomically.
    title : str, optional
    max_clusters : int
        Clusters drawn in the size bars (the largest first); the rest are summed into one bar.
    dpi : int

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import os, tempfile
    >>> p = cluster_sizes_plot([0, 0, 1, 0, 2], [3, 1, 1], os.path.join(tempfile.mkdtemp(), "c.png"), dpi=40)
    >>> p.read_bytes()[1:4]
    b'PNG'
    """
    from ._array import to_numpy

    lab = np.asarray(to_numpy(labels), dtype=np.int64).ravel()
    sz = np.asarray(to_numpy(sizes), dtype=np.int64).ravel()
    if lab.size == 0 or sz.size == 0:
        raise InputError("cluster_sizes_plot: labels and sizes must be non-empty")
    dest = _figure_path(path, "cluster plots")
    fig = _new_figure((max(6.0, min(16.0, lab.size / 200)), 5.4))
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    ax1.scatter(np.arange(lab.size), lab, s=2 if lab.size > 500 else 8, c=lab, cmap="tab20", lw=0)
    from matplotlib.ticker import MaxNLocator

    ax1.yaxis.set_major_locator(MaxNLocator(integer=True))  # cluster numbers, not fractions
    ax1.set_xlabel("frame index")
    ax1.set_ylabel("cluster")
    order = np.argsort(-sz, kind="stable")
    shown = order[:max_clusters]
    heights = list(sz[shown])
    names = [str(int(c)) for c in shown]
    if order.size > max_clusters:
        heights.append(int(sz[order[max_clusters:]].sum()))
        names.append(f"{order.size - max_clusters} more")
    ax2.bar(np.arange(len(heights)), heights)
    ax2.set_xticks(np.arange(len(heights)))
    ax2.set_xticklabels(names, fontsize=7, rotation=45 if len(names) > 10 else 0)
    ax2.set_xlabel("cluster")
    ax2.set_ylabel("frames")
    if title:
        ax1.set_title(title, fontsize=9)
    return _save_figure(fig, dest, dpi)


def dendrogram_plot(linkage, path, *, title: str | None = None, max_leaves: int = 60, ylabel: str = "height (Å)",
                    dpi: int = 150):
    """The dendrogram of a SciPy linkage matrix (truncated to ``max_leaves`` leaves), PNG/SVG/PDF.

    Parameters
    ----------
    linkage : np.ndarray (F - 1, 4)
        SciPy's format (:attr:`protgpu.cluster.Clustering.linkage`).
    path : str or os.PathLike
        ``.png``, ``.svg`` or ``.pdf``, written atomically.
    title : str, optional
    max_leaves : int
        Larger trees are drawn with their last merges only (SciPy's ``truncate_mode="lastp"``).
    ylabel : str
    dpi : int

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> z = np.array([[0, 1, 1.0, 2], [2, 3, 2.0, 3]])
    >>> dendrogram_plot(z, os.path.join(tempfile.mkdtemp(), "d.png"), dpi=40).read_bytes()[1:4]
    b'PNG'
    """
    from scipy.cluster.hierarchy import dendrogram

    z = np.asarray(linkage, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != 4 or z.shape[0] < 1:
        raise InputError(f"dendrogram_plot: linkage must be SciPy's (n - 1, 4) matrix, got shape {z.shape}")
    dest = _figure_path(path, "dendrograms")
    fig = _new_figure((8.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    lastp = z.shape[0] + 1 > max_leaves
    dendrogram(z, ax=ax, truncate_mode="lastp" if lastp else None, p=max_leaves, no_labels=z.shape[0] > 200,
               color_threshold=None)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("frames (cluster sizes in brackets)" if lastp else "frame")
    if title:
        ax.set_title(title, fontsize=9)
    return _save_figure(fig, dest, dpi)
