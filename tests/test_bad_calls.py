"""Bad API calls of issue 21 (hostile inputs): each is a ProtgpuError with one line, never NumPy's or
Python's own exception, and nothing is allocated for a request that cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.errors import InputError, MemoryBudgetError, ProtgpuError

X = np.random.default_rng(0).random((5, 10, 3)).astype(np.float32) * 10


def _readonly_out():
    out = np.zeros((5, 10, 10), np.float32)
    out.setflags(write=False)
    return out


CASES = {
    "box as text": (lambda: pg.distances(X, box="10 10 10", device="cpu"), InputError, "box must be numbers"),
    "out= a list": (lambda: pg.distances(X, out=[1, 2], device="cpu"), InputError, "NumPy or CuPy array"),
    "out= read-only": (lambda: pg.distances(X, out=_readonly_out(), device="cpu"), InputError, "read-only"),
    "ref_frame=1.5": (lambda: pg.rmsd(X, X, ref_frame=1.5, device="cpu"), InputError, "integer frame index"),
    "ref_frame=True": (lambda: pg.rmsd(X, X, ref_frame=True, device="cpu"), InputError, "integer frame index"),
    "pairs of text": (lambda: pg.distances(X, pairs=[["a", "b"]], device="cpu"), InputError, "integer atom"),
    # a broadcast view: 2e9 rows that would take 30 GiB as the int64 copy, refused before any copy
    "2e9 pairs": (lambda: pg.distances(X, pairs=np.broadcast_to(np.zeros((1, 2), np.int64), (2_000_000_000, 2)),
                                       device="cpu"), MemoryBudgetError, "2000000000 pairs over 5 frames"),
    "object array": (lambda: pg.distances(np.array([[1, "a", None]], dtype=object), device="cpu"), InputError,
                     "must be numeric"),
    "ragged list": (lambda: pg.distances([[0.0, 1.0, 2.0], [1.0, 2.0]], device="cpu"), InputError, "ragged"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_call_is_one_protgpu_error(case):
    call, kind, text = CASES[case]
    with pytest.raises(ProtgpuError) as info:
        call()
    assert isinstance(info.value, kind) and text in str(info.value)
    assert "\n" not in str(info.value)


def test_selection_nested_5000_deep_is_refused(datasets):
    s = pg.load(datasets / "adk_open.pdb")
    with pytest.raises(InputError, match="nests too deeply"):
        s.select("(" * 5000 + "name CA" + ")" * 5000)
    assert s.select("(((name CA)))").n_atoms == 214  # a few levels are fine


def test_contacts_of_a_huge_broadcast_view_is_refused_before_any_pass(datasets):
    """2,000,000 frames that are one frame broadcast: refused by size at once (it used to check the
    coordinates and copy them first, and the OOM killer ended the process)."""
    import time

    s = pg.load(datasets / "adk_open.pdb")
    view = np.broadcast_to(s.coords[:1], (2_000_000, s.n_atoms, 3))
    t = time.perf_counter()
    with pytest.raises(MemoryBudgetError, match="contacts of 2000000 frames"):
        pg.contacts(s, coords=view, device="cpu")
    assert time.perf_counter() - t < 5.0  # no pass over the 80 GB the view stands for


def test_host_memory_takes_the_least_of_machine_cgroup_and_rlimit(monkeypatch):
    from protgpu import _memory

    monkeypatch.setattr(_memory, "_machine_available_bytes", lambda: 8 << 30)
    monkeypatch.setattr(_memory, "_cgroup_available_bytes", lambda: 2 << 30)
    monkeypatch.setattr(_memory, "_rlimit_available_bytes", lambda: None)
    assert _memory.host_available_bytes() == 2 << 30
    with pytest.raises(MemoryBudgetError, match="only 2.0 GiB"):
        _memory.check_host_fits(3 << 30, "a result")
