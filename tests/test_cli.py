"""The ``protgpu`` command: subcommands run, bad input exits 2 with one line and no partial output."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from protgpu.cli import main


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "protgpu.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PROTGPU_DISABLE_GPU": "1"})


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("info", "kernels", "distances"):
        assert cmd in out


def test_info_runs_without_gpu():
    r = run_cli("info", "--no-compile")
    assert r.returncode == 0, r.stderr
    assert "protgpu" in r.stdout and "GPU" in r.stdout


def test_kernels_check_reports_each_compilation(monkeypatch, capsys):
    # One kernel (every kernel is compiled once in the suite, by tests/test_kernels.py).
    pytest.importorskip("cuda.core")
    from protgpu._cuda import loader

    monkeypatch.setattr(loader, "kernel_files", lambda: ["lddt"])
    assert main(["kernels", "--check", "--arch", "sm_90"]) == 0
    captured = capsys.readouterr()
    assert "ok  lddt.cu  sm_90" in captured.out and "1 compilations" in captured.err


def test_kernels_check_bad_arch_fails():
    pytest.importorskip("cuda.core")
    r = run_cli("kernels", "--check", "--arch", "gfx90a")
    assert r.returncode == 2 and "sm_XY" in r.stderr and "Traceback" not in r.stderr


def test_distances_writes_npy(tmp_path, datasets):
    out = tmp_path / "d.npy"
    r = run_cli("distances", datasets / "adk_open.pdb", "--select", "ca", "--out", out)
    assert r.returncode == 0, r.stderr
    d = np.load(out)
    assert d.shape == (1, 214, 214) and d.dtype == np.float32
    assert "on the CPU" in r.stdout


def test_distances_many_inputs_to_npz(tmp_path, datasets):
    out = tmp_path / "d.npz"
    r = run_cli("distances", datasets / "adk_open.pdb", datasets / "adk_closed.pdb", "-s", "ca", "-o", out)
    assert r.returncode == 0, r.stderr
    with np.load(out) as z:
        assert {"adk_open", "adk_closed", "inputs"} <= set(z.files)
        assert z["adk_closed"].shape == (1, 214, 214)


@pytest.mark.parametrize(
    "make, expect",
    [
        (lambda p: None, "no such file"),
        (lambda p: p.write_text(""), "bad.pdb"),
        (lambda p: p.write_text("this is not a structure\n" * 5), "bad.pdb"),
        (lambda p: p.write_text("ATOM      1  N   MET A   1      11.104  13.207"), "bad.pdb"),
    ],
)
def test_bad_inputs_exit_2_with_one_line_and_no_output(tmp_path, make, expect):
    bad = tmp_path / "bad.pdb"
    make(bad)
    out = tmp_path / "d.npy"
    r = run_cli("distances", bad, "--out", out)
    assert r.returncode == 2
    assert expect in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.glob("*.npy*")) == []


def test_empty_selection_is_an_error(tmp_path, datasets):
    r = run_cli("distances", datasets / "adk_open.pdb", "--select", "resname XYZ", "--out", tmp_path / "d.npy")
    assert r.returncode == 2 and "adk_open.pdb" in r.stderr and "Traceback" not in r.stderr


def test_gpu_forced_without_gpu_is_a_clear_error(datasets):
    r = run_cli("distances", datasets / "adk_open.pdb", "--select", "ca", "--device", "gpu")
    assert r.returncode == 2 and "no GPU is usable" in r.stderr


def test_list_file_input(tmp_path, datasets):
    lst = tmp_path / "inputs.txt"
    lst.write_text(f"# two structures\n{datasets / 'adk_open.pdb'}\n\n{datasets / 'adk_closed.pdb'}\n")
    r = run_cli("distances", f"@{lst}", "-s", "ca", "-q", "-o", tmp_path / "d.npz")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""


def test_score_consensus_ranks_an_ensemble(tmp_path, datasets):
    """protgpu score --consensus: the frames of the AdK trajectory, ranked, written as CSV."""
    import csv

    out = tmp_path / "ranking.csv"
    r = run_cli("score", datasets / "adk_dims.dcd", "--top", datasets / "adk_open.pdb", "--consensus",
                "--temperature", "2.5", "--out", out)
    assert r.returncode == 0, r.stderr
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 98 and [int(x["rank"]) for x in rows] == list(range(1, 99))
    scores = [float(x["consensus"]) for x in rows]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] <= scores[0] <= 1
    assert "T = 2.5 A^2" in r.stderr


def test_score_needs_ref_or_consensus(datasets):
    r = run_cli("score", datasets / "adk_open.pdb")
    assert r.returncode == 2 and "--ref is required" in r.stderr
    r = run_cli("score", datasets / "adk_open.pdb", "--ref", datasets / "adk_open.pdb", "--consensus")
    assert r.returncode == 2 and "leave out --ref" in r.stderr


# --------------------------------------------------------------------------------------------------
# --plot: every subcommand that has the option writes a PNG that is not blank

PLOT_RUNS = {
    "contacts": ["{d}/adk_open.pdb"],
    "rmsd": ["{d}/adk_dims.dcd", "--top", "{d}/adk_open.pdb", "--ref", "{d}/adk_closed.pdb", "--select", "ca"],
    "pairwise-rmsd": ["{d}/adk_dims.dcd", "--top", "{d}/adk_open.pdb", "--select", "ca"],
    "score": ["{d}/adk_closed.pdb", "{d}/adk_open.pdb", "--ref", "{d}/adk_open.pdb", "--metrics", "lddt",
              "--jobs", "1"],
}


def _subcommands_with_plot() -> list[str]:
    import argparse

    from protgpu.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # no public handle
    return sorted(name for name, sub in subs.choices.items()
                  if any("--plot" in a.option_strings for a in sub._actions))


def test_every_plot_option_is_tested():
    assert _subcommands_with_plot() == sorted(PLOT_RUNS)


@pytest.mark.parametrize("command", sorted(PLOT_RUNS))
def test_plot_option_writes_a_png_that_is_not_blank(tmp_path, datasets, command, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    png = tmp_path / f"{command}.png"
    argv = [command, *(a.format(d=datasets) for a in PLOT_RUNS[command]), "--plot", str(png), "--device", "cpu", "-q"]
    assert main(argv) == 0, capsys.readouterr().err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rgb = np.round(imread(png)[..., :3] * 255).astype(np.int16).reshape(-1, 3)
    assert len(rgb) > 300 * 300
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    assert len(colours) > 20, f"{command}: {len(colours)} colours"
    assert counts.max() / counts.sum() < 0.995, f"{command}: one flat colour"
    coloured = int((rgb.max(axis=1) - rgb.min(axis=1) > 60).sum())  # data, not only black text and axes
    assert coloured > 100, f"{command}: {coloured} coloured pixels"
    assert [p.name for p in tmp_path.iterdir()] == [png.name]  # no temporary file left behind
