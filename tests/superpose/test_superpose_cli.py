"""The CLI commands of protgpu.superpose: protgpu rmsd and protgpu pairwise-rmsd."""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.errors import InputError
from protgpu.superpose import (
    pairwise_rmsd,
    rmsd,
)

# --------------------------------------------------------------------------------------------------
# CLI


def _cli(argv):
    import argparse

    from protgpu.cli import _common_parsers
    from protgpu.commands import rmsd as cmd

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"), _common_parsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_rmsd(shared_datasets, tmp_path, capsys):
    pdb = str(shared_datasets / "mdtraj" / "2EQQ.pdb")
    out = tmp_path / "r.npz"
    aligned = tmp_path / "aligned.pdb"
    assert _cli(["rmsd", pdb, "--ref", pdb, "--fit", "ca", "--select", "heavy", "--out", str(out),
                 "--superpose-out", str(aligned), "-q"]) == 0
    got = np.load(out)
    from protgpu.io import load

    s = load(pdb)
    np.testing.assert_allclose(got["rmsd"], rmsd(s, s, fit="ca", atoms="heavy", device="cpu"), atol=1e-6)
    assert list(got["frame"]) == list(range(20))
    moved = load(aligned)
    assert moved.n_frames == 20 and moved.n_atoms == s.n_atoms
    ca = s.select_indices("ca")
    # aligned CA atoms sit on the reference's (PDB keeps 3 decimals)
    d = np.sqrt(((moved.coords[:, ca] - s.coords[0, ca]) ** 2).sum(-1).mean(-1))
    np.testing.assert_allclose(d, rmsd(s, s, fit="ca", device="cpu"), atol=2e-3)
    assert _cli(["rmsd", pdb, "--ref", pdb, "--select", "ca", "--out", str(tmp_path / "r.csv"), "-q"]) == 0
    assert (tmp_path / "r.csv").read_text().startswith("input,frame,rmsd_angstrom\n")
    with pytest.raises(InputError, match="--out"):
        _cli(["rmsd", pdb, "--ref", pdb, "--out", str(tmp_path / "r.txt")])


def test_cli_pairwise(datasets, tmp_path, capsys):
    dcd, top = str(datasets / "adk_dims.dcd"), str(datasets / "adk_open.pdb")
    out = tmp_path / "d.npy"
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--out", str(out), "-q"]) == 0
    d = np.load(out)
    from protgpu.io import load

    s = load(dcd, top=top).select("ca")
    np.testing.assert_allclose(d, pairwise_rmsd(s, device="cpu"), atol=1e-6)
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--condensed", "--out",
                 str(tmp_path / "c.npz"), "-q"]) == 0
    c = np.load(tmp_path / "c.npz")
    assert c["rmsd"].shape == (98 * 97 // 2,) and len(c["frame"]) == 98
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "98 frames" in capsys.readouterr().out


def test_cli_pairwise_zarr_equals_npy(datasets, tmp_path):
    try:
        import zarr
    except ImportError:  # without zarr (the test extra installs it): a clear error instead
        with pytest.raises(InputError, match="zarr"):
            _cli(["pairwise-rmsd", str(datasets / "adk_open.pdb"), "--out", str(tmp_path / "d.zarr")])
        return
    for out in ("d.zarr", "d.npy"):
        assert _cli(["pairwise-rmsd", str(datasets / "adk_closed.pdb"), str(datasets / "adk_open.pdb"), "--select",
                     "ca", "--out", str(tmp_path / out), "-q"]) == 0
    z = zarr.open_array(str(tmp_path / "d.zarr"), mode="r")
    assert z.shape == (2, 2) and z[0, 1] > 1
    np.testing.assert_array_equal(z[:], np.load(tmp_path / "d.npy"))


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_pairwise_rmsd_full_disk_is_one_line_and_leaves_nothing(datasets, tmp_path, capsys, monkeypatch, suffix):
    """A full disk (ENOSPC) while writing the matrix: one line naming --out, a non-zero exit, no output
    and no temporary file (a memory-mapped .npy claims its blocks first: writing into a sparse file on a
    full disk would kill the process with SIGBUS instead)."""
    import errno
    import os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if suffix == ".npy":
        monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    else:
        monkeypatch.setattr(np.lib.format, "write_array", full)
    out = tmp_path / f"m{suffix}"
    dcd, top = str(datasets / "adk_dims.dcd"), str(datasets / "adk_open.pdb")
    from protgpu.cli import main

    rc = main(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and f"--out {out}: cannot write (No space left on device)" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
