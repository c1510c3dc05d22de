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
    assert "on the CPU" in r.stderr and r.stdout == ""  # a note, not a result: stderr


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
    "cluster": ["{d}/adk_dims.dcd", "--top", "{d}/adk_open.pdb", "--select", "ca", "--cutoff", "2"],
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


# --------------------------------------------------------------------------------------------------
# Issue 16: help, mistyped command lines, messages in the CLI's words, tables on stdout


def _subparsers():
    import argparse

    from protgpu.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_protgpu_alone_prints_the_help_and_exits_2(capsys):
    """Exit 2: nothing was run (a script calling ``protgpu $EMPTY`` does not look successful)."""
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("usage: protgpu") and "pairwise-rmsd" in out and "protgpu COMMAND --help" in out
    assert err == ""


def test_batch_subcommand_alone_prints_its_help(capsys):
    assert main(["rmsd"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: protgpu rmsd") and "examples:" in out


@pytest.mark.parametrize("name", ["info", "kernels", "distances", "contacts", "rmsd", "pairwise-rmsd", "score"])
def test_every_subcommand_help_has_a_description_and_examples(name, capsys):
    sub = _subparsers()[name]
    assert sub.description and len(sub.description) > 40
    text = sub.format_help()
    examples = [ln for ln in text.split("examples:", 1)[1].splitlines() if ln.startswith(f"  protgpu {name}")]
    assert 2 <= len(examples) <= 3, text
    assert not sub.allow_abbrev


# the formats each subcommand writes with --out, and none other
OUT_FORMATS = {
    "distances": {".npy", ".npz"},
    "contacts": {".npz"},
    "rmsd": {".csv", ".jsonl", ".parquet", ".npy", ".npz"},
    "pairwise-rmsd": {".npy", ".npz", ".zarr"},
    "score": {".csv", ".jsonl", ".parquet"},
}


@pytest.mark.parametrize("name", sorted(OUT_FORMATS))
def test_out_help_lists_only_the_formats_the_subcommand_writes(name):
    import re

    out = next(a for a in _subparsers()[name]._actions if "--out" in a.option_strings)
    assert set(re.findall(r"(?<!\w)\.(?:npy|npz|csv|jsonl|parquet|zarr)\b", out.help)) == OUT_FORMATS[name], out.help


def _one_line_error(r, *needles):
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_misspelt_option_suggests_the_closest(datasets):
    r = run_cli("contacts", datasets / "adk_open.pdb", "--cuttoff", "5")
    _one_line_error(r, "--cuttoff", "did you mean --cutoff?", "protgpu contacts --help")


def test_option_prefix_is_refused_not_taken(tmp_path, datasets):
    """``--cutof 5`` used to be taken as ``--cutoff 5``; now it is an error (and a suggestion)."""
    out = tmp_path / "m.npz"
    r = run_cli("contacts", datasets / "adk_open.pdb", "--cutof", "5", "--out", out)
    _one_line_error(r, "--cutof", "did you mean --cutoff?")
    assert not out.exists()


def test_unknown_subcommand_and_choice_suggest(datasets):
    _one_line_error(run_cli("rmds", datasets / "adk_open.pdb"), "invalid choice: 'rmds'", "did you mean rmsd?")
    _one_line_error(run_cli("contacts", datasets / "adk_open.pdb", "--scheme", "closest_heavy"),
                    "did you mean closest-heavy?")
    _one_line_error(run_cli("rmsd", datasets / "adk_open.pdb"), "required: --ref", "see protgpu rmsd --help")


def test_selection_keyword_of_another_tool_names_protgpus(datasets, capsys):
    assert main(["distances", str(datasets / "adk_open.pdb"), "-s", "resSeq 10-20", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "'resSeq'" in err and "use resid" in err and "residue number" in err
    assert main(["distances", str(datasets / "adk_open.pdb"), "-s", "resn GLY", "--device", "cpu"]) == 2
    assert "use resname" in capsys.readouterr().err
    assert main(["distances", str(datasets / "adk_open.pdb"), "-s", "backbon", "--device", "cpu"]) == 2
    assert "did you mean backbone?" in capsys.readouterr().err


def test_chain_that_is_not_there_lists_the_chains(tmp_path, datasets, capsys):
    lines = (datasets / "adk_open.pdb").read_text().splitlines()
    pdb = tmp_path / "bc.pdb"  # chains B (residues 1-100) and C
    pdb.write_text("\n".join(ln[:21] + ("B" if int(ln[22:26]) <= 100 else "C") + ln[22:]
                             if ln.startswith(("ATOM", "HETATM")) else ln for ln in lines) + "\n")
    assert main(["distances", str(pdb), "-s", "chain A and ca", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "selection 'chain A and ca' matches no atoms" in err and "the chains here: B, C" in err
    assert len(err.strip().splitlines()) == 1
    # without chain ids the message says so, and names the segids instead
    assert main(["distances", str(datasets / "adk_open.pdb"), "-s", "chain A", "--device", "cpu"]) == 2
    assert "no chain id; their segids: 4AKE" in capsys.readouterr().err
    # present names that select nothing together stay the plain message
    assert main(["distances", str(pdb), "-s", "chain B and resid 150", "--device", "cpu"]) == 2
    assert "matches no atoms" in capsys.readouterr().err


def test_library_messages_use_option_names(datasets, capsys):
    """``pass top=`` is ``--top`` on the command line, ``residues='x'`` is ``--select 'x'``."""
    assert main(["rmsd", str(datasets / "adk_dims.dcd"), "--ref", str(datasets / "adk_open.pdb"),
                 "--device", "cpu", "-q"]) == 2
    err = capsys.readouterr().err
    assert "pass --top" in err and "top=" not in err
    from protgpu.commands._cli_text import cli_words

    assert cli_words("a.pdb: residues='chain Z' selects no residue", "contacts") == \
        "a.pdb: --select 'chain Z' selects no residue"
    assert cli_words("device='gpu' asked for, but no GPU is usable") == "--device gpu asked for, but no GPU is usable"
    assert cli_words("cutoff must be a positive number") == "--cutoff must be a positive number"
    assert cli_words("x: no atoms to score with atoms='ca'", "score") == "x: no atoms to score with --lddt-atoms 'ca'"
    assert cli_words("temperature must be positive (Angstrom^2), got -1") == "--temperature must be positive " \
        "(Angstrom^2), got -1"


def test_errors_name_the_destination_not_the_temporary_file(tmp_path, datasets):
    dest = tmp_path / "aligned.xyzq"
    r = run_cli("rmsd", datasets / "adk_open.pdb", "--ref", datasets / "adk_closed.pdb", "--superpose-out", dest)
    _one_line_error(r, f"{dest}", "mdtraj cannot write")
    assert ".tmp" not in r.stderr and ".aligned" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def _table(text: str) -> list[list[str]]:
    rows = [ln.split("\t") for ln in text.splitlines()]
    assert rows and all(len(r) == len(rows[0]) for r in rows), text
    return rows


def test_stdout_tables_have_a_header_row(datasets, capsys):
    d = str(datasets)
    runs = {
        ("distances", f"{d}/adk_open.pdb", f"{d}/adk_closed.pdb", "-s", "ca"):
            ["input", "frames", "atoms", "shape", "min_angstrom", "max_angstrom"],
        ("contacts", f"{d}/adk_open.pdb"): ["input", "summary", "device", "seconds"],
        ("rmsd", f"{d}/adk_open.pdb", f"{d}/adk_closed.pdb", "--ref", f"{d}/adk_open.pdb", "-s", "ca"):
            ["input", "frame", "rmsd_angstrom"],
        ("score", f"{d}/adk_closed.pdb", "--ref", f"{d}/adk_open.pdb", "-m", "tm", "--jobs", "1"):
            ["model", "tm", "n_aligned"],
    }
    for argv, header in runs.items():
        assert main([*argv, "--device", "cpu"]) == 0
        out, err = capsys.readouterr()
        rows = _table(out)
        assert rows[0][: len(header)] == header, (argv, out)
        assert len(rows) == (3 if argv[0] in ("distances", "rmsd") else 2), (argv, out)
        assert "on the CPU" in err  # the closing note is not in the table


def test_kernels_list_has_a_header_row():
    pytest.importorskip("cuda.core")
    r = run_cli("kernels")
    assert r.returncode == 0, r.stderr
    rows = _table(r.stdout)
    assert rows[0] == ["kernel", "entry_point"] and len(rows) > 5


def test_rmsd_of_a_dcd_on_stdout_parses_as_a_table(datasets, tmp_path):
    """``protgpu rmsd traj.dcd ... > rmsd.tsv``: what lands in the file is the table and nothing else."""
    import csv

    r = subprocess.run([sys.executable, "-m", "protgpu.cli", "rmsd", str(datasets / "adk_dims.dcd"), "--top",
                        str(datasets / "adk_open.pdb"), "--ref", str(datasets / "adk_closed.pdb"), "-s", "ca"],
                       capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PROTGPU_DISABLE_GPU": "1"})
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(r.stdout.splitlines(), delimiter="\t"))
    assert len(rows) == 98 and list(rows[0]) == ["input", "frame", "rmsd_angstrom"]
    assert [int(x["frame"]) for x in rows] == list(range(98))
    assert all(0 < float(x["rmsd_angstrom"]) < 20 for x in rows)
