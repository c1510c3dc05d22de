"""Every public function x every input form (the front door, ``protgpu._inputs``).

One conformational ensemble (three frames of adenylate kinase's CA atoms) is passed in each form that
``docs/concepts.rst`` promises. Each function must give the same answer for every form, or, where a
form lacks what the function needs (atom names for contacts), the same clear error.
"""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu._array import to_numpy
from protgpu.errors import InputError

N_FRAMES = 3


@pytest.fixture(scope="module")
def ensemble(datasets, tmp_path_factory):
    """(three-frame CA Structure, one-frame reference Structure, folder with its files)."""
    ca = pg.load(datasets / "adk_open.pdb").select("ca")
    rng = np.random.default_rng(7)
    x0 = ca.coords[0].astype(np.float64)
    frames = [x0 + rng.normal(scale=s, size=x0.shape) for s in (0.0, 0.8, 1.6)]
    # PDB precision (3 decimals), so that files and arrays hold the same numbers
    coords = np.round(np.stack(frames), 3).astype(np.float32)
    s3 = pg.Structure(coords, ca.atoms, source="ensemble")
    ref = pg.Structure(np.round(x0 + rng.normal(scale=1.2, size=x0.shape), 3)[None].astype(np.float32),
                       ca.atoms, source="ref")
    folder = tmp_path_factory.mktemp("forms")
    pg.save(s3, folder / "ensemble.pdb")
    for i in range(N_FRAMES):
        pg.save(s3.frames(i), folder / f"frame{i}.pdb")
    return s3, ref, folder


def _mdtraj(path):
    md = pytest.importorskip("mdtraj")
    return md.load(str(path))


def _biopython(path):
    from Bio.PDB import PDBParser

    return PDBParser(QUIET=True).get_structure("ens", str(path))


def _torch(a):
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.ascontiguousarray(a))


FORMS = {
    "Structure": lambda s, f: s,
    "str path": lambda s, f: str(f / "ensemble.pdb"),
    "pathlib.Path": lambda s, f: f / "ensemble.pdb",
    "mdtraj.Trajectory": lambda s, f: _mdtraj(f / "ensemble.pdb"),
    "Bio.PDB Structure": lambda s, f: _biopython(f / "ensemble.pdb"),
    "list of Structures": lambda s, f: [s.frames(i) for i in range(N_FRAMES)],
    "list of paths": lambda s, f: [str(f / f"frame{i}.pdb") for i in range(N_FRAMES)],
    "ndarray (frames, atoms, 3)": lambda s, f: s.coords.copy(),
    "float64 ndarray": lambda s, f: s.coords.astype(np.float64),
    "torch tensor": lambda s, f: _torch(s.coords),
    "list of arrays": lambda s, f: [s.coords[i] for i in range(N_FRAMES)],
}
TOPOLOGY_FORMS = {"Structure", "str path", "pathlib.Path", "mdtraj.Trajectory", "Bio.PDB Structure",
                  "list of Structures", "list of paths"}


def _contacts(x, ref, device):
    return pg.contacts(x, scheme="ca", cutoff=8.0, device=device).distances


def _native(x, ref, device):
    return pg.native_contacts(x, ref, selection="ca", cutoff=8.0, device=device).q_hard


def _saved(x, ref, device):
    """pg.save (an output function) through the front door: what it wrote, loaded back."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        return pg.load(pg.save(x, Path(d) / "out.pdb")).coords


# name -> (call(form, reference Structure, device) -> array, needs atom tables)
FUNCTIONS = {
    "save": (_saved, True),
    "distances": (lambda x, ref, device: pg.distances(x, device=device), False),
    "rmsd": (lambda x, ref, device: pg.rmsd(x, ref, device=device), False),
    "superpose": (lambda x, ref, device: pg.superpose(x, ref, device=device).rmsd, False),
    "pairwise_rmsd": (lambda x, ref, device: pg.pairwise_rmsd(x, device=device), False),
    "tm_score": (lambda x, ref, device: pg.tm_score(x, ref, device=device).tm, False),
    "gdt": (lambda x, ref, device: pg.gdt(x, ref, device=device), False),  # (gdt_ts, gdt_ha)
    "lddt": (lambda x, ref, device: pg.lddt(x, ref, device=device), False),
    "consensus_score": (lambda x, ref, device: pg.consensus_score(x, device=device), False),
    "contacts": (_contacts, True),
    "native_contacts": (_native, True),
    "cluster": (lambda x, ref, device: pg.cluster(x, method="kmedoids", k=2, device=device).labels, False),
    "tm_align": (lambda x, ref, device: pg.tm_align(x, ref, device=device).tm, False),
    "tm_align_matrix": (lambda x, ref, device: pg.tm_align_matrix(x, device=device), False),
    "score_complex": (lambda x, ref, device: pg.score_complex(x, ref, metrics=("lddt", "rmsd"))["lddt"], False),
    "design_sanity": (lambda x, ref, device: pg.design_sanity(x)["radius_of_gyration"], True),
}
# Results that are NumPy tables whatever came in (alignments and chain mappings are not arrays of one
# type; tm_align's and score_complex's GPU paths are checked against the CPU in tests/align and
# tests/complexes): in the form table on the CPU only.
CPU_ONLY = {"tm_align", "tm_align_matrix", "score_complex", "design_sanity"}


def _host(result) -> np.ndarray:
    """A result (an array, or a tuple of them) as one float64 NumPy array."""
    if isinstance(result, tuple):
        return np.asarray([to_numpy(r) for r in result], dtype=np.float64)
    return np.asarray(to_numpy(result), dtype=np.float64)


def _same(got, expected, form):
    got = _host(got)
    assert got.shape == expected.shape
    # mdtraj holds nanometres in float32: its Angstrom differ from the file's in the 7th digit
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-4 if "mdtraj" in form else 1e-5)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("fn", list(FUNCTIONS))
def test_every_function_takes_every_form(fn, form, ensemble):
    s3, ref, folder = ensemble
    call, needs_atoms = FUNCTIONS[fn]
    x = FORMS[form](s3, folder)
    if needs_atoms and form not in TOPOLOGY_FORMS:
        with pytest.raises(InputError, match=r"no atom names or residues; pass a Structure"):
            call(x, ref, "cpu")
        return
    expected = _host(call(s3, ref, "cpu"))
    _same(call(x, ref, "cpu"), expected, form)


@pytest.mark.gpu
@pytest.mark.parametrize("form", [*FORMS, "device array"])
@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if f not in CPU_ONLY])
def test_every_function_takes_every_form_on_the_gpu(fn, form, ensemble, gpu):
    """The same table on the GPU (device="gpu"), plus coordinates already on the device (CuPy)."""
    s3, ref, folder = ensemble
    call, needs_atoms = FUNCTIONS[fn]
    x = gpu.asarray(s3.coords) if form == "device array" else FORMS[form](s3, folder)
    if needs_atoms and form not in TOPOLOGY_FORMS:
        with pytest.raises(InputError, match=r"no atom names or residues; pass a Structure"):
            call(x, ref, "gpu")
        return
    expected = _host(call(s3, ref, "cpu"))
    got = call(x, ref, "gpu")
    if form == "device array":  # CuPy in, CuPy out
        assert not isinstance(got[0] if isinstance(got, tuple) else got, np.ndarray)
    # the kernels reorder float32 sums: agreement to float32 rounding of the largest value
    got = _host(got)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-4 * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if f not in CPU_ONLY])
def test_every_function_takes_each_array_kind(fn, ensemble, array_kind):
    """NumPy, torch (and CuPy on the GPU) arrays, through the array-kind fixture: the same values, and
    results of the array type that came in."""
    s3, ref, _ = ensemble
    kind, convert = array_kind
    call, needs_atoms = FUNCTIONS[fn]
    device = "gpu" if kind == "cupy" else "cpu"
    x = convert(s3.coords)
    if needs_atoms:
        with pytest.raises(InputError, match=r"no atom names or residues"):
            call(x, ref, device)
        return
    expected = _host(call(s3, ref, "cpu"))
    result = call(x, ref, device)
    first = result[0] if isinstance(result, tuple) else result
    assert type(first).__module__.split(".")[0] == type(x).__module__.split(".")[0], (type(first), type(x))
    got = _host(result)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=2e-4 * max(1.0, float(np.abs(expected).max())))


BAD = {
    "NaN": (lambda a: _poke(a, np.nan), r"NaN or infinite coordinates in frame 1 \(atom 4\)"),
    "inf": (lambda a: _poke(a, -np.inf), r"NaN or infinite coordinates in frame 1 \(atom 4\)"),
    "1e30": (lambda a: _poke(a, 1e30), r"coordinates beyond ±1e\+06 Angstrom in frame 1 \(atom 4\)"),
    "strings": (lambda a: a.astype(str), r"coordinates must be numeric"),
    "complex": (lambda a: a.astype(np.complex64), r"coordinates must be real numbers"),
    # a list is frames to distances, models to the scores (where the second model has 5 atoms, not 214)
    "ragged list": (lambda a: [a[0], a[1][:5]], r"(ragged|different shapes|must have its 214 atoms, got 5)"),
}


def _poke(a, value):
    a = a.astype(np.float64)
    a[1, 4, 2] = value
    return a


# rmsd() checks its (F,) result instead of the coordinates (see its docstring): a NaN surfaces there
BAD_FUNCTIONS = ["distances", "superpose", "pairwise_rmsd", "tm_score", "gdt", "lddt", "consensus_score", "cluster",
                 "tm_align", "score_complex"]


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("fn", BAD_FUNCTIONS)
def test_every_function_gives_the_same_error(fn, bad, ensemble):
    s3, ref, _ = ensemble
    make, message = BAD[bad]
    if fn == "tm_align" and bad == "ragged list":  # chains of different lengths are what tm_align aligns
        assert FUNCTIONS[fn][0](make(s3.coords), ref, "cpu").shape == (2,)
        return
    with pytest.raises(InputError, match=message):
        FUNCTIONS[fn][0](make(s3.coords), ref, "cpu")


def test_unknown_type_is_named(ensemble):
    s3, ref, _ = ensemble
    for fn in ("distances", "rmsd", "pairwise_rmsd", "tm_score", "lddt", "consensus_score", "contacts", "save",
               "cluster", "tm_align", "score_complex", "design_sanity"):
        with pytest.raises(InputError, match=r"expected a Structure, a file path, .*; got dict"):
            FUNCTIONS[fn][0]({"x": 1}, ref, "cpu")


@pytest.mark.parametrize("value, message", [(np.nan, "NaN or infinite"), (-np.inf, "NaN or infinite"),
                                            (1e30, r"coordinates beyond ±1e\+06 Angstrom")])
def test_save_refuses_bad_coordinates_and_writes_nothing(value, message, ensemble, tmp_path):
    """A Structure's coordinates can be changed in place after it was checked: save checks them again."""
    s3, _, _ = ensemble
    broken = pg.Structure(s3.coords.copy(), s3.atoms, source="broken")
    broken.coords[1, 4, 2] = value
    with pytest.raises(InputError, match=rf"broken: {message} .*in frame 1 \(atom 4\)"):
        pg.save(broken, tmp_path / "out.pdb")
    assert list(tmp_path.iterdir()) == []
