"""The GPU path's host side (protgpu/align/gpu.py) without a GPU: the vectorised unpacking equals the
per-pair code it replaced (``numpy_twin._gapped``, the specification, and ``tm_align_pair``'s distance
expression) byte for byte and bit for bit; ``pack``'s vectorised parameters equal the scalar functions;
and ``tm_align_gpu`` / ``pg.tm_align(device="gpu")``, run on a stand-in device (CuPy's calls on NumPy
arrays, the kernel replaced by the CPU path), equal the CPU path, through several chunks and pieces."""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.align import api, gpu
from protgpu.align.numpy_twin import _gapped, _gapped_many, tm_align_pair

# --------------------------------------------------------------------------------------------------
# _gapped_many against _gapped


@st.composite
def _pair(draw):
    """(mobile letters, target letters, ia, ja, close): any lengths from 0, strictly increasing aligned
    residues (none, some, every residue of the shorter chain, gaps at either end or none)."""
    l1, l2 = draw(st.integers(0, 24)), draw(st.integers(0, 24))
    letters = st.text(alphabet="ACDGX", min_size=0, max_size=0)
    seq_x = draw(st.text(alphabet="ACDGX", min_size=l1, max_size=l1)) if l1 else draw(letters)
    seq_y = draw(st.text(alphabet="ACDGX", min_size=l2, max_size=l2)) if l2 else draw(letters)
    kind = draw(st.sampled_from(["some", "none", "all"]))
    if kind == "all":
        n = min(l1, l2)
        ia = sorted(draw(st.sets(st.integers(0, l1 - 1), min_size=n, max_size=n))) if n else []
        ja = sorted(draw(st.sets(st.integers(0, l2 - 1), min_size=n, max_size=n))) if n else []
    elif kind == "none" or not min(l1, l2):
        ia, ja = [], []
    else:
        ia = sorted(draw(st.sets(st.integers(0, l1 - 1), max_size=min(l1, l2))))
        ja = sorted(draw(st.sets(st.integers(0, l2 - 1), min_size=len(ia), max_size=len(ia))))
        ia = ia[:len(ja)]
    close = draw(st.lists(st.booleans(), min_size=len(ia), max_size=len(ia)))
    return seq_x, seq_y, np.array(ia, dtype=np.int64), np.array(ja, dtype=np.int64), np.array(close, dtype=bool)


def _many(pairs):
    """_gapped_many over ``pairs`` (as _pair draws them), each pair's letters stored once in one buffer."""
    text, xs, xl, ys, yl = "", [], [], [], []
    for seq_x, seq_y, *_ in pairs:
        xs.append(len(text))
        xl.append(len(seq_x))
        text += seq_x
        ys.append(len(text))
        yl.append(len(seq_y))
        text += seq_y

    def cat(k, dt):
        return np.concatenate([np.zeros(0, dt)] + [p[k] for p in pairs]).astype(dt)

    return _gapped_many(np.frombuffer(text.encode("ascii"), dtype=np.uint8), xs, xl, ys, yl,
                        [len(p[2]) for p in pairs], cat(2, np.int64), cat(3, np.int64), cat(4, bool))


_ALL = ("ACDG", "CADGX", np.arange(4), np.array([0, 1, 2, 4]), np.array([True, False, True, True]))
_ENDS = ("GGACDA", "XACD", np.array([2, 3]), np.array([1, 3]), np.array([False, True]))
_EMPTY = ("AC", "", np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))


@settings(max_examples=150, deadline=None)
@example(pairs=[_ALL, _ENDS, _EMPTY, ("", "", *_EMPTY[2:]), _ALL])
@example(pairs=[])
@given(pairs=st.lists(_pair(), max_size=6))
def test_gapped_many_equals_gapped(pairs):
    """Every pair's three printed lines and identity count are _gapped's, byte for byte, whatever the
    lengths (zero too), alignment (empty, all aligned, gaps at either end) and neighbouring pairs."""
    top, mid, bottom, same = _many(pairs)
    assert len(top) == len(mid) == len(bottom) == len(same) == len(pairs)
    for k, (seq_x, seq_y, ia, ja, close) in enumerate(pairs):
        assert (top[k], mid[k], bottom[k], int(same[k])) == _gapped(seq_x, seq_y, ia, ja, close), k
        assert type(top[k]) is str and type(mid[k]) is str and type(bottom[k]) is str


# --------------------------------------------------------------------------------------------------
# unpack against the per-pair code


def _walk(rng, n: int) -> np.ndarray:
    steps = rng.normal(size=(n, 3))
    steps *= 3.8 / np.linalg.norm(steps, axis=1, keepdims=True)
    return np.cumsum(steps, axis=0) + rng.normal(scale=20, size=3)


def _rotation(rng) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q *= np.sign(np.diag(r))
    return q * np.linalg.det(q)


def _outputs(rng, pk, near_pairs=()):
    """Kernel-like outputs for the packed pairs: random monotone maps (some empty, some all aligned),
    random superpositions; in ``near_pairs`` an aligned pair sits 5 A apart to the last bits."""
    n = len(pk.pair_chain)
    values = rng.random((n, 4))
    rt = np.zeros((n, 12))
    maps = np.full(max(pk.map_total, 1), -1, np.int32)
    n_ali = np.zeros(n, np.int32)
    for p, (a, b) in enumerate(pk.pair_chain.tolist()):
        l1, l2 = int(pk.chain_len[a]), int(pk.chain_len[b])
        kind = p % 4
        k = 0 if kind == 0 else min(l1, l2) if kind == 1 else int(rng.integers(0, min(l1, l2) + 1))
        ia = np.sort(rng.choice(l1, k, replace=False))
        ja = np.sort(rng.choice(l2, k, replace=False))
        maps[pk.map_off[p] + ja] = ia
        n_ali[p] = max(k - int(rng.integers(0, 2)), 0)  # the kernel's count (can differ from the map's)
        rt[p, :9] = _rotation(rng).ravel()
        rt[p, 9:] = rng.normal(scale=10, size=3)
        if p in near_pairs and k:
            rot, t = rt[p, :9].reshape(3, 3), rt[p, 9:]
            x = pk.coords[pk.chain_off[a] + ia[0]]
            y = pk.coords[pk.chain_off[b] + ja[0]]
            u = x @ rot.T + t - y
            rt[p, 9:] = t + u * (5.0 / np.linalg.norm(u) - 1) + rng.choice([0, 1e-13, -1e-13, 4e-15])
    return values, n_ali, rt, maps


def _assert_rows_equal(got, want):
    for name in want._fields:
        g, w = getattr(got, name), getattr(want, name)
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), name
        else:
            assert type(g) is type(w), name
            assert g == w or (g != g and w != w), (name, g, w)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_unpack_equals_the_per_pair_code(seed):
    """gpu.unpack (all pairs at once) equals the per-pair code it replaced (gpu._finish_one:
    tm_align_pair's distance expression and _gapped) on every field, bit for bit and byte for byte:
    random chains and maps, empty and full alignments, distances of 5 A to the last bits, a non-ASCII
    sequence and a map that goes back (the last two take the per-pair code)."""
    rng = np.random.default_rng(seed)
    chains = [_walk(rng, int(n)) for n in rng.integers(5, 40, size=6)]
    seqs = ["".join(rng.choice(list("ACDGX"), len(c))) for c in chains]
    seqs[4] = "é" * len(chains[4])
    pairs = rng.integers(0, 6, size=(30, 2))
    pk = gpu.pack(chains, chains, pairs, [float(len(chains[b])) for b in pairs[:, 1]])
    values, n_ali, rt, maps = _outputs(rng, pk, near_pairs=set(range(0, 30, 3)))
    bad = next(p for p, (_a, b) in enumerate(pk.pair_chain.tolist())
               if (maps[pk.map_off[p]:][:pk.chain_len[b]] >= 0).sum() > 1)
    seg = maps[pk.map_off[bad]:pk.map_off[bad] + pk.chain_len[pk.pair_chain[bad, 1]]]
    hit = np.flatnonzero(seg >= 0)
    seg[hit[0]], seg[hit[1]] = seg[hit[1]], seg[hit[0]]  # a map that goes back
    got = gpu.unpack(pk, values, n_ali, rt, maps, seqs, seqs)
    letters = gpu.letters(seqs, seqs)
    assert len(got) == len(pairs)
    for p in range(len(pairs)):
        l2 = int(pk.chain_len[pk.pair_chain[p, 1]])
        want = gpu._finish_one(pk, pk.pair_chain[p], values[p], int(n_ali[p]), rt[p],
                               np.asarray(maps[pk.map_off[p]:pk.map_off[p] + l2], dtype=np.int64), letters)[0]
        _assert_rows_equal(got[p], want)


def test_finish_of_some_pairs_in_any_order():
    """gpu.finish on a subset of the pairs in another order, their maps where pack put them (not end to
    end), gives those pairs' rows of unpack."""
    rng = np.random.default_rng(5)
    chains = [_walk(rng, int(n)) for n in (7, 19, 26, 12)]
    seqs = ["".join(rng.choice(list("ACDGX"), len(c))) for c in chains]
    pairs = rng.integers(0, 4, size=(20, 2))
    pk = gpu.pack(chains, chains, pairs, [float(len(chains[b])) for b in pairs[:, 1]])
    values, n_ali, rt, maps = _outputs(rng, pk)
    whole = gpu.unpack(pk, values, n_ali, rt, maps, seqs, seqs)
    idx = np.array([13, 2, 19, 7, 8, 0])
    part = gpu.finish(pk, pk.pair_chain[idx], pk.map_off[idx], values[idx], n_ali[idx], rt[idx], maps,
                      gpu.letters(seqs, seqs))
    for k, p in enumerate(idx.tolist()):
        _assert_rows_equal(part[k], whole[p])


def test_near_cutoff_distances_take_the_exact_expression():
    """An aligned pair at 5 A to the last bit is marked as tm_align_pair's expression marks it (the
    vectorised distances are another sum order: those within rounding of the cutoff are redone)."""
    rng = np.random.default_rng(7)
    chains = [_walk(rng, 12), _walk(rng, 15)]
    pk = gpu.pack(chains, chains, [(0, 1)] * 40, [15.0] * 40)
    values, n_ali, rt, maps = _outputs(rng, pk, near_pairs=set(range(40)))
    got = gpu.unpack(pk, values, n_ali, rt, maps, ["A" * 12, "A" * 15], ["A" * 12, "A" * 15])
    flips = set()
    for p in range(40):
        ia, ja = got.aligned[p][:, 0], got.aligned[p][:, 1]
        rot, t = rt[p, :9].reshape(3, 3), rt[p, 9:]
        d = np.sqrt(np.sum((chains[0][ia] @ rot.T + t - chains[1][ja]) ** 2, axis=1))
        assert got.match[p].replace(" ", "") == "".join(":" if v < 5.0 else "." for v in d)
        if len(d):
            flips.add(bool(d[0] < 5.0))
    assert flips == {True, False}  # both sides of the cutoff were met


# --------------------------------------------------------------------------------------------------
# pack


def test_pack_parameters_equal_the_scalar_functions(monkeypatch):
    rng = np.random.default_rng(3)
    chains = [np.zeros((int(n), 3)) for n in rng.integers(5, 400, size=20)]
    pairs = rng.integers(0, 20, size=(300, 2))
    lens = np.array([len(c) for c in chains])
    l1, l2 = lens[pairs[:, 0]], lens[pairs[:, 1]]
    norms = np.select([np.arange(300) % 4 == k for k in range(3)], [l1, l2, (l1 + l2) * 0.5], 123.5).astype(float)
    pk = gpu.pack(chains, chains, pairs, norms)
    want = np.array([gpu.pair_params(int(a), int(b), float(n)) for a, b, n in zip(l1, l2, norms, strict=True)])
    assert pk.params.tobytes() == want.tobytes()
    assert gpu.pack(chains, chains, np.zeros((0, 2), int), []).params.shape == (0, gpu.N_PARAM)
    ws = gpu.workspace_bytes(l1, l2, 8)
    assert ws.tolist() == [gpu.workspace_bytes(int(a), int(b), 8) for a, b in zip(l1, l2, strict=True)]
    assert type(gpu.workspace_bytes(81, 87, 8)) is int
    monkeypatch.setattr(gpu, "BUCKETS", ((100, 64, 4), (250, 128, 3)))
    want = [list(gpu.block_config(int(a), int(b))) for a, b in zip(l1, l2, strict=True)]
    assert gpu.block_configs(l1, l2).tolist() == want


# --------------------------------------------------------------------------------------------------
# tm_align_gpu on a stand-in device


class _Stream:
    def __init__(self, non_blocking=False):
        self.events = 0

    def record(self):
        self.events += 1
        return object()

    def wait_event(self, event):
        assert event is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.ndarray = type("ndarray", (), {})  # nothing is one: inputs stay NumPy
    cp.asarray = np.array
    cp.empty, cp.zeros = np.empty, np.zeros
    cp.uint8, cp.int32, cp.int64 = np.uint8, np.int32, np.int64
    cp.asnumpy = lambda a, stream=None: np.array(a)
    cp.cuda = types.SimpleNamespace(Stream=_Stream, get_current_stream=_Stream,
                                    Device=lambda: types.SimpleNamespace(id=0))
    return cp


def _cpu_kernel(launched):
    """The kernel's contract, by the CPU path: each pair of the launch aligned with tm_align_pair."""

    def launch(kernel, grid, block, coords, chain_off, chain_len, pair_chain, params, map_off, n, work, stride,
               out_val, out_n, out_rt, maps, out_prof, stream=None):
        assert grid == (int(n),) and len(pair_chain) == n and work.size == n * stride
        launched.append(int(n))
        for p, (a, b) in enumerate(pair_chain.tolist()):
            x = coords[chain_off[a]:chain_off[a] + chain_len[a]]
            y = coords[chain_off[b]:chain_off[b] + chain_len[b]]
            assert gpu.workspace_bytes(len(x), len(y), block[0] // 32) <= stride
            r = tm_align_pair(x, y, "X" * len(x), "X" * len(y), l_norm=float(params[p, 6]))
            out_val[p] = (r.tm_mobile, r.tm_target, r.tm, r.rmsd)
            out_n[p] = r.n_aligned
            out_rt[p] = np.r_[r.rotation.ravel(), r.translation]
            maps[map_off[p]:map_off[p] + len(y)] = -1
            maps[map_off[p] + r.aligned[:, 1]] = r.aligned[:, 0]
            if out_prof is not None:
                out_prof[p] = np.arange(len(gpu.PROFILE_SLOTS))

    return launch


@contextlib.contextmanager
def _stand_in_device(monkeypatch, launched):
    from protgpu import _cuda

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(_cuda, "get_kernel", lambda *a, **k: "tmalign_pairs")
    monkeypatch.setattr(_cuda, "launch", _cpu_kernel(launched))
    monkeypatch.setattr(api, "resolve_device", lambda device: "gpu" if device == "gpu" else "cpu")
    monkeypatch.setattr(gpu, "_STREAMS", {})
    yield


def _assert_results_equal(got, want):
    assert type(got) is type(want)
    for name in want._fields:
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if w.dtype == object:
            for k in range(len(w)):
                assert type(g[k]) is type(w[k]), name
                if isinstance(w[k], np.ndarray):
                    assert g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]), (name, k)
                else:
                    assert g[k] == w[k], (name, k)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("budget, pieces", [("1e12", 4), ("30000", 3), ("1", 1)],
                         ids=["one-chunk", "chunks-and-pieces", "a-launch-a-pair"])
def test_tm_align_on_a_stand_in_device_equals_the_cpu_path(monkeypatch, budget, pieces):
    """pg.tm_align(device="gpu") with the kernel replaced by the CPU path equals pg.tm_align(device="cpu")
    on every field (the printed alignments byte for byte), for one chunk, several chunks launched as
    several pieces, and one launch a pair; normalisations by the mobile chain and by a length."""
    rng = np.random.default_rng(11)
    chains = [_walk(rng, int(n)) for n in (9, 23, 31, 17, 40)]
    pairs = np.array([(0, 1), (1, 0), (2, 3), (3, 4), (4, 2), (1, 3), (0, 4), (2, 2)])
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", budget)
    monkeypatch.setattr(gpu, "PIECES", pieces)
    monkeypatch.setattr(gpu, "MIN_PIECE", 2)
    launched: list = []
    with _stand_in_device(monkeypatch, launched):
        for norm in (None, "mobile", 30.5):
            got = pg.tm_align(chains, chains, pairs=pairs, normalize_by=norm, device="gpu")
            want = pg.tm_align(chains, chains, pairs=pairs, normalize_by=norm, device="cpu")
            _assert_results_equal(got, want)
        none = pg.tm_align(chains, chains, pairs=np.zeros((0, 2), int), normalize_by="nonsense", device="gpu")
        _assert_results_equal(none, pg.tm_align(chains, chains, pairs=np.zeros((0, 2), int), device="cpu"))
        batch, prof = gpu.tm_align_gpu(chains, chains, ["X" * len(c) for c in chains], ["X" * len(c) for c in chains],
                                       pairs, [float(len(chains[b])) for b in pairs[:, 1]], profile=True)
    assert sum(launched) == 4 * len(pairs)
    if budget == "1":
        assert set(launched) == {1}
    elif pieces > 1:
        assert len(launched) > 4 * 2  # chunks cut into pieces
    assert prof.tolist() == [list(range(len(gpu.PROFILE_SLOTS)))] * len(pairs)
    assert [r.n_aligned for r in batch] == want.n_aligned.tolist() and len(batch) == len(pairs)
