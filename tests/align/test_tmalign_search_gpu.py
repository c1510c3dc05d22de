"""tm_align_matrix and the database search on the GPU give the CPU's numbers (run on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.align import database

pytestmark = pytest.mark.gpu

FILES = ("d1t3ba2.pdb", "d2nwta1.pdb", "d2a6ca1.pdb", "d1neqa_.pdb", "d1cxya_.pdb", "d3lf5a_.pdb")


@pytest.fixture(scope="module")
def chains(gpu, datasets):
    return [database.read_chain(datasets / "tmalign" / f) for f in FILES]


def test_matrix_gpu_equals_cpu(chains, tmp_path):
    cpu = pg.tm_align_matrix(chains, device="cpu")
    mm = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float32, shape=cpu.shape)
    got = pg.tm_align_matrix(chains, device="gpu", out=mm, tile=4)
    np.testing.assert_allclose(got, cpu, atol=1e-6)
    np.testing.assert_array_equal(np.diag(got), 1.0)


def test_search_gpu_equals_cpu(chains, tmp_path):
    db = database.load(database.write(tmp_path / "db.pgdb", chains))
    cpu = database.search(chains[0], db, device="cpu")
    got = database.search(chains[0], db, device="gpu", chunk=4)
    assert [r["target"] for r in got] == [r["target"] for r in cpu]
    for a, b in zip(got, cpu, strict=True):
        assert a["tm_query"] == pytest.approx(b["tm_query"], abs=1e-6)
        assert a["tm_target"] == pytest.approx(b["tm_target"], abs=1e-6)
        assert a["n_aligned"] == b["n_aligned"]
