"""Figures: :func:`protgpu.plotting.heatmap`, :func:`~protgpu.plotting.line_plot`,
:func:`~protgpu.plotting.per_residue_plot` and the ``--plot`` options of ``protgpu contacts``,
``protgpu rmsd``, ``protgpu pairwise-rmsd`` and ``protgpu score``.

Each test checks that the PNG is written, is a real PNG and is not blank (many colours, most pixels
not background), and, by catching the matplotlib Figure as it is saved, that the axes carry their
titles, residue numbers as tick labels and a labelled colour bar.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from protgpu.errors import InputError

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

matplotlib = pytest.importorskip("matplotlib")


# --------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def saved_figures(monkeypatch):
    """Every matplotlib Figure saved during the test, in order (``Figure.savefig`` is wrapped)."""
    from matplotlib.figure import Figure

    figures = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def assert_png_not_blank(path, max_background: float | str | None = None) -> np.ndarray:
    """The file is a PNG of a reasonable size whose pixels are not one flat colour, with data drawn
    in colour (not only black axes and text); returns the pixels.

    ``max_background``: the largest fraction of pixels in the background colour; default 0.95 for a
    heatmap (filled), 0.995 when given as ``"lines"`` (a line plot is mostly white).
    """
    from matplotlib.image import imread

    limit = {None: 0.95, "lines": 0.995}.get(max_background, max_background)
    path = Path(path)
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] >= 100 and img.shape[1] >= 100, img.shape
    rgb = np.round(img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    background = counts.max() / counts.sum()
    assert len(colours) > 20, f"{path}: only {len(colours)} colours"
    assert background < limit, f"{path}: {background:.1%} of the pixels are the background colour"
    saturated = int((rgb.max(axis=1).astype(int) - rgb.min(axis=1) > 60).sum())
    assert saturated > 100, f"{path}: only {saturated} coloured pixels (no data drawn?)"
    return img


def tick_texts(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def colorbar_axes(fig, main):
    others = [ax for ax in fig.axes if ax is not main]
    assert others, "no colour bar"
    return others[0]


def no_temp_files(folder: Path) -> None:
    leftovers = [p.name for p in folder.iterdir() if ".tmp" in p.name or p.name.startswith(".")]
    assert not leftovers, leftovers


# --------------------------------------------------------------------------------------------------
# protgpu.plotting.heatmap


def test_heatmap_writes_labelled_png(tmp_path, saved_figures):
    from protgpu.plotting import heatmap

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)) * 8
    m = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    numbers = list(range(101, 141))
    out = heatmap(m, tmp_path / "map.png", xlabels=numbers, title="distances", xlabel="residue",
                  ylabel="residue", cbar_label="distance (Å)", max_ticks=10, dpi=60)
    assert Path(out) == tmp_path / "map.png"
    assert_png_not_blank(out)
    fig = saved_figures[-1]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "residue" and ax.get_ylabel() == "residue"
    assert ax.get_title() == "distances"
    xt, yt = tick_texts(ax.xaxis), tick_texts(ax.yaxis)
    assert 2 <= len(xt) <= 10 and xt[0] == "101"
    assert set(xt) <= {str(n) for n in numbers} and yt == xt  # ylabels default to xlabels (square)
    assert colorbar_axes(fig, ax).get_ylabel() == "distance (Å)"
    no_temp_files(tmp_path)


def test_heatmap_non_square_nan_inf_and_default_ticks(tmp_path, saved_figures):
    from protgpu.plotting import heatmap

    m = np.arange(5 * 60, dtype=np.float64).reshape(5, 60)
    m[0, 0], m[1, 1], m[2, 2] = np.nan, np.inf, -np.inf  # left blank, not an error
    out = heatmap(m, tmp_path / "rect.png", xlabels=[f"A:{i}" for i in range(60)], max_ticks=12, dpi=60)
    assert_png_not_blank(out)
    ax = saved_figures[-1].axes[0]
    assert len(tick_texts(ax.xaxis)) <= 12
    assert tick_texts(ax.yaxis)[0] == "0"  # rows without labels are numbered from 0


def test_heatmap_colour_range(tmp_path, saved_figures):
    from protgpu.plotting import heatmap

    freq = np.clip(np.random.default_rng(1).random((30, 30)), 0, 1)
    heatmap(freq, tmp_path / "freq.png", vmin=0.0, vmax=1.0, cbar_label="fraction of frames in contact", dpi=60)
    img = saved_figures[-1].axes[0].images[0]
    assert img.get_clim() == (0.0, 1.0)
    assert_png_not_blank(tmp_path / "freq.png")


def test_heatmap_replaces_an_existing_file_atomically(tmp_path):
    from protgpu.plotting import heatmap

    dest = tmp_path / "map.png"
    dest.write_bytes(b"old")
    heatmap(np.eye(20), dest, dpi=40)
    assert dest.read_bytes()[:8] == PNG_SIGNATURE
    no_temp_files(tmp_path)


@pytest.mark.parametrize("matrix, kwargs, dest, match", [
    (np.zeros(10), {}, "a.png", "2-D"),
    (np.zeros((0, 4)), {}, "a.png", "2-D"),
    (np.zeros((4, 4)), {"xlabels": [1, 2, 3]}, "a.png", "xlabels"),
    (np.zeros((4, 5)), {"ylabels": [1, 2]}, "a.png", "ylabels"),
    (np.zeros((4, 4)), {}, "a.jpg", "png"),
])
def test_heatmap_rejects_bad_input_without_writing(tmp_path, matrix, kwargs, dest, match):
    from protgpu.plotting import heatmap

    with pytest.raises(InputError, match=match):
        heatmap(matrix, tmp_path / dest, **kwargs)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# protgpu.plotting.line_plot and per_residue_plot


def test_line_plot_series_legend_ticks_and_gaps(tmp_path, saved_figures):
    from protgpu.plotting import line_plot

    y = np.stack([np.sqrt(np.arange(80.0)), 0.5 * np.sqrt(np.arange(80.0))])
    y[1, 10:15] = np.nan
    y[0, 3] = np.inf
    before = y.copy()
    out = line_plot(y, tmp_path / "lines.png", names=["run 1", "run 2"], xticklabels=[f"A:{i}" for i in range(80)],
                    xlabel="residue", ylabel="RMSD (Å)", title="two runs", max_ticks=8, dpi=60)
    assert Path(out) == tmp_path / "lines.png"
    assert_png_not_blank(out, "lines")
    np.testing.assert_array_equal(y, before)  # the caller's array is not touched
    ax = saved_figures[-1].axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("residue", "RMSD (Å)", "two runs")
    lines = ax.get_lines()
    assert len(lines) == 2 and np.isnan(lines[1].get_ydata()[10:15]).all() and np.isnan(lines[0].get_ydata()[3])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["run 1", "run 2"]
    ticks = tick_texts(ax.xaxis)
    assert 2 <= len(ticks) <= 8 and ticks[0] == "A:0"
    no_temp_files(tmp_path)


def test_line_plot_one_series_custom_x_and_ylim(tmp_path, saved_figures):
    from protgpu.plotting import line_plot

    x = np.linspace(0.0, 2.0, 30)  # e.g. time in ns
    out = line_plot(np.cos(x), tmp_path / "one.png", x=x, names=["only"], ylim=(-1.0, 1.0), dpi=60)
    assert_png_not_blank(out, "lines")
    ax = saved_figures[-1].axes[0]
    assert ax.get_legend() is None  # one series: no legend
    assert ax.get_ylim() == (-1.0, 1.0)
    np.testing.assert_allclose(ax.get_lines()[0].get_xdata(), x)


def test_line_plot_many_series_become_a_band(tmp_path, saved_figures):
    from protgpu.plotting import line_plot

    y = np.random.default_rng(3).random((40, 50))
    y[:, 7] = np.nan  # a point missing from every series: no warning, a gap
    out = line_plot(y, tmp_path / "band.png", max_lines=12, dpi=60)
    assert_png_not_blank(out, "lines")
    ax = saved_figures[-1].axes[0]
    assert len(ax.get_lines()) == 1 and len(ax.collections) == 1  # the median and the min-max band
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "median" in texts and any("40" in t for t in texts)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata()[:7], np.median(y[:, :7], axis=0))


def test_per_residue_plot_residue_numbers_and_score_axis(tmp_path, saved_figures):
    from protgpu.plotting import per_residue_plot

    per = np.random.default_rng(4).random((3, 120))
    out = per_residue_plot(per, tmp_path / "lddt.png", names=["m1", "m2", "m3"], dpi=60)
    assert_png_not_blank(out, "lines")
    ax = saved_figures[-1].axes[0]
    assert ax.get_ylabel() == "lDDT" and "residue" in ax.get_xlabel()
    assert ax.get_ylim() == (0.0, 1.02)
    ticks = tick_texts(ax.xaxis)
    assert ticks[0] == "1" and all(t.isdigit() and 1 <= int(t) <= 120 for t in ticks)  # 1-based by default
    assert len(ax.get_lines()) == 3 and ax.get_legend() is not None
    per_residue_plot(per[0] * 50, tmp_path / "other.png", labels=range(201, 321), ylabel="B-factor", ylim=None,
                     dpi=60)
    ax = saved_figures[-1].axes[0]
    assert tick_texts(ax.xaxis)[0] == "201" and ax.get_ylim()[1] > 40
    assert_png_not_blank(tmp_path / "other.png", "lines")


@pytest.mark.parametrize("func, values, kwargs, dest, match", [
    ("line_plot", np.zeros((2, 3, 4)), {}, "a.png", "1-D or 2-D"),
    ("line_plot", np.zeros((2, 0)), {}, "a.png", "non-empty"),
    ("line_plot", np.zeros((2, 5)), {"names": ["a"]}, "a.png", "names"),
    ("line_plot", np.zeros(5), {"x": [1, 2]}, "a.png", "x has 2"),
    ("line_plot", np.zeros(5), {"xticklabels": [1, 2]}, "a.png", "xticklabels"),
    ("line_plot", np.zeros(5), {}, "a.jpg", r"\.png, \.svg, \.pdf"),
    ("per_residue_plot", np.zeros(5), {"labels": [1, 2]}, "a.png", "xticklabels"),
    ("per_residue_plot", np.zeros(0), {}, "a.png", "non-empty"),
])
def test_line_plots_reject_bad_input_without_writing(tmp_path, func, values, kwargs, dest, match):
    import protgpu.plotting

    with pytest.raises(InputError, match=match):
        getattr(protgpu.plotting, func)(values, tmp_path / dest, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_require_figure(tmp_path, monkeypatch):
    from protgpu.plotting import require_figure

    for name in ("a.PNG", "a.svg", "a.pdf"):
        require_figure(tmp_path / name)
    with pytest.raises(InputError, match=r"--plot .*x\.jpg: use a \.png, \.svg or \.pdf"):
        require_figure(tmp_path / "x.jpg")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(InputError, match="--map .*needs matplotlib"):
        require_figure(tmp_path / "a.png", "--map")


@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF-")])
def test_figures_are_written_as_svg_and_pdf(tmp_path, suffix, magic):
    """Issue 16: --plot writes .svg and .pdf as well as .png, each in its own format."""
    from protgpu.plotting import heatmap, line_plot, per_residue_plot

    heatmap(np.arange(36.0).reshape(6, 6), tmp_path / f"h{suffix}")
    line_plot(np.arange(10.0), tmp_path / f"l{suffix}")
    per_residue_plot(np.linspace(0, 1, 8), tmp_path / f"p{suffix}")
    for name in ("h", "l", "p"):
        data = (tmp_path / f"{name}{suffix}").read_bytes()
        assert data.startswith(magic), data[:20]
    if suffix == ".svg":  # a real SVG drawing, not a PNG in disguise
        assert b"<svg" in (tmp_path / "h.svg").read_bytes()
    else:  # the same figure gives the same bytes (no date inside)
        heatmap(np.arange(36.0).reshape(6, 6), tmp_path / f"h2{suffix}")
        assert (tmp_path / f"h2{suffix}").read_bytes() == (tmp_path / f"h{suffix}").read_bytes()
    no_temp_files(tmp_path)


def test_capped_colour_range_is_marked_not_silent(tmp_path, saved_figures):
    """Values above vmax end the colour bar in an arrow (extend="max"); marks are labelled lines."""
    from protgpu.plotting import heatmap

    m = np.arange(36.0).reshape(6, 6)
    heatmap(m, tmp_path / "capped.png", vmin=0.0, vmax=10.0, cbar_marks={4.5: "cutoff 4.5 Å"})
    heatmap(m, tmp_path / "full.png", vmin=0.0, vmax=40.0)
    capped, full = saved_figures
    cbar = capped.axes[0].images[0].colorbar
    assert cbar.extend == "max" and full.axes[0].images[0].colorbar.extend == "neither"
    assert "cutoff 4.5 Å" in tick_texts(cbar.ax.yaxis)
    assert any(np.allclose(line.get_ydata(), 4.5) for line in cbar.ax.get_lines())


def test_heatmap_blocks_draw_lines_and_labels(tmp_path, saved_figures):
    from protgpu.plotting import heatmap

    heatmap(np.random.default_rng(0).random((9, 9)), tmp_path / "b.png",
            blocks=[("a.dcd", 0, 4), ("b.dcd", 4, 9)])
    ax = saved_figures[-1].axes[0]
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_xdata()[0] == line.get_xdata()[1]] == [3.5]
    top = ax.child_axes[0]
    assert tick_texts(top.xaxis) == ["a.dcd", "b.dcd"]


def test_plotting_imports_matplotlib_only_to_draw(tmp_path):
    """``import protgpu.plotting`` stays light, and drawing never imports pyplot (no global backend
    change, no display needed)."""
    code = (
        "import sys, numpy as np\n"
        "import protgpu, protgpu.plotting\n"
        "assert 'matplotlib' not in sys.modules, 'imported matplotlib at import time'\n"
        f"protgpu.plotting.heatmap(np.eye(12), {str(tmp_path / 'x.png')!r})\n"
        f"protgpu.plotting.per_residue_plot(np.eye(12), {str(tmp_path / 'y.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'plotting imported pyplot'\n"
    )
    env_path = f"{REPO}"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), "PYTHONPATH": env_path}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "x.png").is_file() and (tmp_path / "y.png").is_file()


def _env() -> dict:
    import os

    env = dict(os.environ)
    env["PROTGPU_DISABLE_GPU"] = "1"  # only the figure is under test here
    return env


# --------------------------------------------------------------------------------------------------
# The CLI's --plot options


def run_cli(argv, capsys) -> tuple[int, str, str]:
    from protgpu.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_contacts_plot_one_file_per_structure(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "map.png"
    code, _, err = run_cli(["contacts", datasets / "adk_open.pdb", datasets / "adk_closed.pdb", "--plot", png,
                            "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    assert not png.exists()  # several inputs: one file each, named after the input
    # The batch engine may finish the inputs in any order: match each figure by its title.
    by_title = {fig.axes[0].get_title().split(":")[0]: fig for fig in saved_figures}
    for name in ("adk_open", "adk_closed"):
        assert_png_not_blank(tmp_path / f"map_{name}.png")
        fig = by_title[f"{name}.pdb"]
        ax = fig.axes[0]
        assert ax.get_xlabel() == "residue" and ax.get_ylabel() == "residue"
        assert tick_texts(ax.xaxis)[0] == "1"  # residue numbers as in the file (adk starts at MET 1)
        assert "distance" in colorbar_axes(fig, ax).get_ylabel()


def test_contacts_plot_trajectory_is_a_frequency_map(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "freq.png"
    code, _, err = run_cli(["contacts", datasets / "adk_dims.dcd", "--top", datasets / "adk_open.pdb",
                            "--select", "resid 1-80", "--frequency", "--plot", png, "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    assert_png_not_blank(png)
    fig = saved_figures[-1]
    ax = fig.axes[0]
    assert "98 frames" in ax.get_title()
    assert colorbar_axes(fig, ax).get_ylabel() == "fraction of frames in contact"
    assert ax.images[0].get_clim() == (0.0, 1.0)


def test_pairwise_rmsd_plot(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "rmsd.png"
    code, _, err = run_cli(["pairwise-rmsd", datasets / "adk_dims.dcd", "--top", datasets / "adk_open.pdb",
                            "--select", "ca", "--plot", png, "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    assert_png_not_blank(png)
    fig = saved_figures[-1]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "frame index" and ax.get_ylabel() == "frame index"
    assert "98 frames" in ax.get_title()
    assert tick_texts(ax.xaxis)[:2] == ["0", "9"] and tick_texts(ax.yaxis) == tick_texts(ax.xaxis)
    assert colorbar_axes(fig, ax).get_ylabel() == "RMSD (Å)"
    assert ax.images[0].get_clim()[0] == 0.0


def test_pairwise_rmsd_plot_thins_a_large_matrix_keeping_frame_indices(monkeypatch, tmp_path, saved_figures):
    from protgpu.commands import rmsd as rmsd_cmd

    m = np.random.default_rng(2).random((4500, 4500)).astype(np.float32)
    rmsd_cmd._plot_pairwise(str(tmp_path / "big.png"), m, "4500 frames")
    ax = saved_figures[-1].axes[0]
    assert ax.images[0].get_array().shape == (1500, 1500)  # every 3rd frame
    assert all(int(t) % 3 == 0 for t in tick_texts(ax.xaxis)) and int(tick_texts(ax.xaxis)[-1]) > 4000
    assert_png_not_blank(tmp_path / "big.png")


def test_rmsd_plot_one_line_per_trajectory(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "rmsd.png"
    dcd, top = datasets / "adk_dims.dcd", datasets / "adk_open.pdb"
    code, _, err = run_cli(["rmsd", dcd, "--top", top, "--ref", datasets / "adk_closed.pdb", "--select", "ca",
                            "--plot", png, "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    assert_png_not_blank(png, "lines")
    ax = saved_figures[-1].axes[0]
    assert ax.get_xlabel() == "frame index" and ax.get_ylabel() == "RMSD (Å)"
    assert "adk_closed.pdb" in ax.get_title() and "adk_dims.dcd" in ax.get_title()
    (line,) = ax.get_lines()
    y = line.get_ydata()
    assert len(y) == 98 and 0 < y.min() and y.max() < 10  # adk open -> closed: at most a few A
    assert ax.get_legend() is None  # one input: the title names it


def test_rmsd_plot_single_frame_inputs_along_x(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "models.png"
    code, _, err = run_cli(["rmsd", datasets / "adk_open.pdb", datasets / "adk_closed.pdb", "--ref",
                            datasets / "adk_open.pdb", "--fit", "ca", "--plot", png, "--device", "cpu", "-q"],
                           capsys)
    assert code == 0, err
    assert_png_not_blank(png, "lines")
    ax = saved_figures[-1].axes[0]
    assert ax.get_xlabel() == "input" and tick_texts(ax.xaxis) == ["adk_open.pdb", "adk_closed.pdb"]
    (line,) = ax.get_lines()
    assert line.get_ydata()[0] < 1e-3 < line.get_ydata()[1]
    assert line.get_linewidth() == 0 and line.get_marker() == "o"  # separate models: points, not a line


def test_score_plot_per_residue_lddt(tmp_path, datasets, saved_figures, capsys):
    png = tmp_path / "lddt.png"
    code, _, err = run_cli(["score", datasets / "adk_closed.pdb", datasets / "adk_open.pdb", "--ref",
                            datasets / "adk_open.pdb", "--metrics", "lddt", "--plot", png, "--device", "cpu",
                            "--jobs", "1", "-q"], capsys)
    assert code == 0, err
    assert_png_not_blank(png, "lines")
    ax = saved_figures[-1].axes[0]
    assert ax.get_ylabel() == "lDDT" and "residue" in ax.get_xlabel()
    assert ax.get_ylim()[0] == 0.0
    assert len(ax.get_lines()) == 2  # one line per model
    labels = tick_texts(ax.xaxis)
    assert labels and all(any(ch.isdigit() for ch in t) for t in labels)  # residue numbers on the x axis
    assert ax.get_legend() is not None


@pytest.mark.parametrize("argv", [
    ["contacts", "{d}/adk_open.pdb", "--plot", "{t}/x.jpg"],
    ["rmsd", "{d}/adk_open.pdb", "--ref", "{d}/adk_closed.pdb", "--plot", "{t}/x.gif"],
    ["pairwise-rmsd", "{d}/adk_open.pdb", "{d}/adk_closed.pdb", "--plot", "{t}/x.eps"],
    ["score", "{d}/adk_closed.pdb", "--ref", "{d}/adk_open.pdb", "--plot", "{t}/x.tiff"],
])
def test_plot_needs_a_figure_name(tmp_path, datasets, capsys, argv):
    argv = [a.format(d=datasets, t=tmp_path) for a in argv] + ["--device", "cpu", "-q"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert ".png, .svg or .pdf" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, argv", [
    ("contacts", ["{d}/adk_open.pdb"]),
    ("rmsd", ["{d}/adk_dims.dcd", "--top", "{d}/adk_open.pdb", "--ref", "{d}/adk_closed.pdb", "-s", "ca"]),
    ("pairwise-rmsd", ["{d}/adk_open.pdb", "{d}/adk_closed.pdb", "-s", "ca"]),
    ("score", ["{d}/adk_closed.pdb", "--ref", "{d}/adk_open.pdb", "--metrics", "lddt", "--jobs", "1"]),
])
@pytest.mark.parametrize("suffix, magic", [(".svg", b"<?xml"), (".pdf", b"%PDF-")])
def test_every_plot_option_writes_svg_and_pdf(tmp_path, datasets, capsys, command, argv, suffix, magic):
    fig = tmp_path / f"fig{suffix}"
    code, _, err = run_cli([command, *(a.format(d=datasets) for a in argv), "--plot", fig, "--device", "cpu", "-q"],
                           capsys)
    assert code == 0, err
    assert fig.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [fig.name]


def test_contacts_distance_map_marks_the_cutoff_and_the_cap(tmp_path, datasets, saved_figures, capsys):
    """Issue 16: the colours stop at 4 x cutoff; the colour bar says so (arrow) and marks the cutoff."""
    code, _, err = run_cli(["contacts", datasets / "adk_open.pdb", "--cutoff", "5", "--plot", tmp_path / "m.png",
                            "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    cbar = saved_figures[-1].axes[0].images[0].colorbar
    assert cbar.extend == "max" and cbar.mappable.get_clim() == (0.0, 20.0)
    assert "cutoff 5 Å" in tick_texts(cbar.ax.yaxis)


def test_pairwise_rmsd_plot_of_several_inputs_shows_their_blocks(tmp_path, datasets, saved_figures, capsys):
    code, _, err = run_cli(["pairwise-rmsd", datasets / "adk_open.pdb", datasets / "adk_dims.dcd",
                            datasets / "adk_closed.pdb", "--top", datasets / "adk_open.pdb", "-s", "ca",
                            "--plot", tmp_path / "p.png", "--device", "cpu", "-q"], capsys)
    assert code == 0, err
    ax = saved_figures[-1].axes[0]
    vertical = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_xdata()[0] == line.get_xdata()[1])
    assert vertical == [0.5, 98.5]  # 1 frame, 98 frames, 1 frame
    assert tick_texts(ax.child_axes[0].xaxis) == ["adk_open.pdb", "adk_dims.dcd", "adk_closed.pdb"]


@pytest.mark.parametrize("argv", [
    ["contacts", "{d}/adk_open.pdb", "--plot", "{t}/x.png"],
    ["rmsd", "{d}/adk_open.pdb", "--ref", "{d}/adk_closed.pdb", "--plot", "{t}/x.png"],
    ["pairwise-rmsd", "{d}/adk_open.pdb", "{d}/adk_closed.pdb", "--select", "ca", "--plot", "{t}/x.png"],
    ["score", "{d}/adk_closed.pdb", "--ref", "{d}/adk_open.pdb", "--metrics", "lddt", "--jobs", "1",
     "--plot", "{t}/x.png"],
])
def test_plot_without_matplotlib_is_one_line_error(tmp_path, datasets, capsys, monkeypatch, argv):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    argv = [a.format(d=datasets, t=tmp_path) for a in argv] + ["--device", "cpu", "-q"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    assert "matplotlib" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()
