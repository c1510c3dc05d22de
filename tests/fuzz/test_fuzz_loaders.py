"""Fuzz the loaders: generated PDB / mmCIF / GRO text, byte-level mutations of the real files in
``datasets/``, compression and odd file names.

Each case loads one file under a deadline (``signal.setitimer``) and an address-space bound
(``RLIMIT_AS``, soft limit only) and is classified:

* ``ok``: a Structure came back (equal to the unmutated parse where the change keeps the file
  valid: compression, a byte-order mark, CRLF line ends, a renamed file);
* ``clean``: a ProtgpuError whose message is one line naming the file;
* ``other``: any other exception, or a ProtgpuError message that is several lines or does not
  name the file;
* ``bad-result``: a Structure that breaks what every load promises (at least one atom, coordinates
  below 1e5 Angstrom, a box with positive edges) or differs from the unmutated parse;
* ``rejected``: an error for a file that is still valid;
* ``hang``: the deadline passed; ``memory``: the address-space bound was hit.

Only ``ok`` and ``clean`` pass. The tally of every run is printed at the end of the module
(``pytest -s``) and written as JSON to ``$PROTGPU_FUZZ_REPORT`` when set;
``PROTGPU_FUZZ_COUNT_ONLY=1`` counts without failing (how the counts of a tree before a fix are
taken).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import json
import lzma
import os
import resource
import signal
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.errors import ProtgpuError

DATASETS = Path(__file__).resolve().parents[2] / "datasets"
DEADLINE_S = 10.0  # per case; a clean load of the largest input takes well under a second
MEMORY_BOUND = 3 << 30  # bytes of address space a case may add
COUNT_ONLY = os.environ.get("PROTGPU_FUZZ_COUNT_ONLY", "") not in ("", "0")
TALLY: Counter = Counter()
EXAMPLES: dict = {}
FUZZ = settings(
    max_examples=100, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


class _Hang(BaseException):
    """Raised by the alarm: a BaseException, so no loader's ``except Exception`` swallows it."""


def _vm_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def _bounded():
    """The case's deadline and address-space bound, both lifted on the way out."""
    def alarm(signum, frame):
        raise _Hang

    old_handler = signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_bytes() + MEMORY_BOUND
    if hard == resource.RLIM_INFINITY or limit < hard:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _same(a, b) -> bool:
    return (a.n_atoms == b.n_atoms and a.n_frames == b.n_frames and np.array_equal(a.coords, b.coords)
            and a.atoms == b.atoms)


def _judge(s, expect) -> tuple[str, str]:
    if s.n_atoms == 0:
        return "bad-result", "no atoms"
    if float(np.abs(s.coords).max()) >= 1e5:
        return "bad-result", f"coordinate {float(np.abs(s.coords).max()):g}"
    if s.box is not None and not (np.linalg.norm(s.box, axis=2) > 0).all():
        return "bad-result", "box with a zero edge"
    if expect is not None and not _same(s, expect):
        return "bad-result", "differs from the unmutated parse"
    return "ok", ""


def classify(path, expect=None, **kwargs) -> str:
    """Load ``path`` under the bounds; the case's class (see the module docstring)."""
    name = os.path.basename(os.fspath(path))
    try:
        with _bounded():
            s = pg.load(path, **kwargs)
    except _Hang:
        kind, detail = "hang", ""
    except MemoryError:
        kind, detail = "memory", ""
    except ProtgpuError as exc:
        msg = str(exc)
        good = "\n" not in msg.strip() and name in msg
        kind, detail = ("clean" if good else "other"), msg[:300]
        if good and expect is not None:
            kind = "rejected"
    except Exception as exc:  # noqa: BLE001 - the point is to catch every other kind
        kind, detail = "other", f"{type(exc).__name__}: {str(exc)[:300]}"
    else:
        kind, detail = _judge(s, expect)
    TALLY["tried"] += 1
    TALLY[kind] += 1
    if kind not in ("ok", "clean"):
        EXAMPLES.setdefault(kind, []).append(f"{name}: {detail}")
    return kind


def check(path, expect=None, **kwargs) -> None:
    kind = classify(path, expect, **kwargs)
    if not COUNT_ONLY:
        assert kind in ("ok", "clean"), f"{path}: {kind}: {EXAMPLES[kind][-1]}"


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    text = json.dumps({"tally": dict(TALLY), "examples": {k: v[:8] for k, v in EXAMPLES.items()}}, indent=1)
    print("\nfuzz tally:", text)
    if os.environ.get("PROTGPU_FUZZ_REPORT"):
        Path(os.environ["PROTGPU_FUZZ_REPORT"]).write_text(text)


_DIR = Path(tempfile.mkdtemp(prefix="protgpu-fuzz-"))
_COUNT = iter(range(1 << 30))


def write(name: str, data: bytes) -> Path:
    """``data`` in a fresh folder as ``name`` (each case its own folder: names may repeat)."""
    folder = _DIR / str(next(_COUNT))
    folder.mkdir()
    path = folder / name
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def real():
    """The small real inputs, their bytes and their parse: a PDB (first 300 atoms of adk), the
    same as mmCIF and GRO (written by protgpu and mdtraj)."""
    lines = (DATASETS / "adk_open.pdb").read_bytes().splitlines(keepends=True)
    atoms = [ln for ln in lines if ln.startswith(b"ATOM")][:300]
    pdb = b"".join([ln for ln in lines if not ln.startswith((b"ATOM", b"HETATM", b"END"))] + atoms + [b"END\n"])
    out = {"pdb": pdb}
    ref = pg.load(write("ref.pdb", pdb))
    cif = write("ref.cif", b"")
    pg.save(ref, cif)
    out["cif"] = cif.read_bytes()
    import mdtraj

    gro = write("ref.gro", b"")
    mdtraj.load(str(write("ref2.pdb", pdb))).save_gro(str(gro))
    out["gro"] = gro.read_bytes()
    parsed = {k: pg.load(write(f"ref.{k}", v)) for k, v in out.items()}
    return out, parsed


# -- generated text -------------------------------------------------------------------------------

_num = st.one_of(
    st.floats(-9999, 9999, allow_nan=False).map(lambda v: f"{v:8.3f}"[:8].rjust(8)),
    st.sampled_from(["     nan", "     inf", "1e30    ", "99999999", "  1_000 ", "        ", "-0.0e+05",
                     " 1.0.0  ", "\x00\x00\x00\x00\x00\x00\x00\x00", "   -    "]),
    st.text(alphabet="0123456789.-+eE _", min_size=8, max_size=8),
)


@st.composite
def pdb_text(draw) -> bytes:
    n = draw(st.integers(0, 12))
    lines = []
    if draw(st.booleans()):
        lines.append("CRYST1" + "".join(draw(_num)[:8].rjust(9) for _ in range(3)) + "  90.00  90.00  90.00 P 1")
    for i in range(n):
        rec = draw(st.sampled_from(["ATOM  ", "HETATM", "MODEL ", "ENDMDL", "TER   ", "ATOM"]))
        name = draw(st.sampled_from([" CA ", " N  ", " MW ", "EPW ", " O  ", "HT1 ", "CD  ", "", "\u00e9\u00e9"]))
        res = draw(st.sampled_from(["ALA", "HOH", "TIP4", "ILE", "", "ZN "]))
        resid = draw(st.sampled_from(["   1", "  -1", "A000", "  x ", "9999"]))
        x, y, z = draw(_num), draw(_num), draw(_num)
        elem = draw(st.sampled_from(["C", "", "M", "ZN", "1", "EP"]))
        line = f"{rec}{i + 1:5d} {name:4s} {res:3s} A{resid}    {x}{y}{z}  1.00  0.00          {elem:>2s}"
        lines.append(line[: draw(st.integers(0, 90))] if draw(st.integers(0, 9)) == 0 else line)
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\nEND\n", "\r\n"]))
    prefix = draw(st.sampled_from(["", "\ufeff", "\ufeff\ufeff"]))
    return (prefix + text).encode(draw(st.sampled_from(["utf-8", "latin-1"])), errors="replace")


@st.composite
def cif_text(draw) -> bytes:
    n = draw(st.integers(0, 6))
    lines = ["data_x", "loop_"] + [f"_atom_site.{k}" for k in (
        "group_PDB", "id", "type_symbol", "label_atom_id", "label_comp_id", "label_asym_id", "label_seq_id",
        "Cartn_x", "Cartn_y", "Cartn_z", "pdbx_PDB_model_num")]
    for i in range(n):
        x, y, z = (draw(_num).strip() or "?" for _ in range(3))
        elem = draw(st.sampled_from(["C", "N", "?", ".", "M"]))
        model = draw(st.sampled_from(["1", "2", "x", "?"]))
        lines.append(f"ATOM {i + 1} {elem} CA ALA A {i + 1} {x} {y} {z} {model}")
    if draw(st.booleans()):
        cell = [draw(st.sampled_from(["1", "0", "-5", "50.0", "?", "1e30"])) for _ in range(3)]
        lines += [f"_cell.length_{a} {v}" for a, v in zip("abc", cell, strict=True)]
        lines += [f"_cell.angle_{a} 90" for a in ("alpha", "beta", "gamma")]
    return ("\n".join(lines) + "\n").encode()


@st.composite
def gro_text(draw) -> bytes:
    n = draw(st.integers(0, 5))
    declared = draw(st.sampled_from([n, n + 1, max(n - 1, 0), 0, 10**9]))
    lines = ["title", f"{declared:5d}"]
    for i in range(n):
        name = draw(st.sampled_from(["OW", "HW1", "MW", "CA"]))
        res = draw(st.sampled_from(["SOL", "ALA"]))
        x, y, z = (draw(_num) for _ in range(3))
        lines.append(f"{i + 1:5d}{res:<5s}{name:>5s}{i + 1:5d}{x}{y}{z}")
    box = draw(st.sampled_from(["   1.00000   1.00000   1.00000", "  -1.0 -1.0 -1.0", "", "0 0 0", "x"]))
    lines.append(box)
    return ("\n".join(lines) + "\n").encode()


@FUZZ
@given(pdb_text(), st.sampled_from(["x.pdb", "x.ent", "X.PDB"]))
def test_generated_pdb(text, name):
    check(write(name, text))


@FUZZ
@given(cif_text())
def test_generated_cif(text):
    check(write("x.cif", text))


@FUZZ
@given(gro_text())
def test_generated_gro(text):
    check(write("x.gro", text))


# -- mutations of real files ----------------------------------------------------------------------

@st.composite
def mutation(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice", "line"]))
    b = bytearray(data)
    at = draw(st.integers(0, len(b) - 1))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
    elif kind == "insert":
        b[at:at] = draw(st.binary(min_size=1, max_size=64))
    elif kind == "delete":
        del b[at : at + draw(st.integers(1, 200))]
    elif kind == "truncate":
        del b[at:]
    elif kind == "splice":  # a copy of another stretch of the file
        src = draw(st.integers(0, len(b) - 1))
        b[at:at] = b[src : src + draw(st.integers(1, 400))]
    else:  # one line replaced by an odd one
        line = draw(st.sampled_from([
            b"ATOM      1  CA  ALA A   1    1e30    0.000   0.000  1.00  0.00           C",
            b"ATOM      1  CA  ALA A   1      " + b"9" * 100000,
            b"ATOM      1  CA  ALA A   1     1_000   0.000   0.000  1.00  0.00           C",
            b"MODEL        x", b"ENDMDL", b"CRYST1    0.000    0.000    0.000  90.00  90.00  90.00",
            b"CRYST1   -1.000   10.000   10.000  90.00  90.00  90.00", b"\x00" * 80, b"\xff\xfe",
        ]))
        nl = b.find(b"\n", at)
        b[at : nl if nl >= 0 else len(b)] = line
    return bytes(b)


@pytest.mark.parametrize("fmt", ["pdb", "cif", "gro"])
def test_mutated_real(real, fmt):
    data = real[0][fmt]

    @FUZZ
    @given(mutation(data))
    def run(mutated):
        check(write(f"m.{fmt}", mutated))

    run()


def test_mutated_dcd():
    data = (DATASETS / "adk_dims.dcd").read_bytes()[:200_000]  # the header and a few frames
    top = str(DATASETS / "adk_open.pdb")

    @settings(FUZZ, max_examples=30)
    @given(st.integers(0, 4000), st.integers(0, 255), st.booleans())
    def run(at, value, cut):
        b = bytearray(data)
        if cut:
            del b[at * 20:]
        else:
            b[at] = value
        check(write("m.dcd", bytes(b)), top=top)

    run()


# -- valid changes: the parse must stay equal ------------------------------------------------------

_PACKERS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


@pytest.mark.parametrize("fmt", ["pdb", "cif", "gro"])
@pytest.mark.parametrize("suffix", sorted(_PACKERS))
def test_compressed_equal(real, fmt, suffix):
    data, parsed = real
    check(write(f"c.{fmt}{suffix}", _PACKERS[suffix](data[fmt])), expect=parsed[fmt])


@pytest.mark.parametrize("fmt", ["pdb", "cif"])
def test_plain_text_named_gz(real, fmt):
    data, parsed = real
    check(write(f"plain.{fmt}.gz", data[fmt]), expect=parsed[fmt])


@pytest.mark.parametrize("change", ["bom", "crlf", "upper-name", "spaces in name", "unicode-name"])
def test_valid_changes_pdb(real, change):
    data, parsed = real
    text, name = data["pdb"], "v.pdb"
    if change == "bom":
        text = b"\xef\xbb\xbf" + text.split(b"\n", 4)[-1]  # the BOM right before the first atom lines
    elif change == "crlf":
        text = text.replace(b"\n", b"\r\n")
    elif change == "upper-name":
        name = "V.PDB"
    elif change == "spaces in name":
        name = "a b  c.pdb"
    else:
        name = "\u00e9\u4e2d.pdb"
    expect = pg.load(write("plain.pdb", text.replace(b"\r\n", b"\n").replace(b"\xef\xbb\xbf", b"")))
    assert expect.n_atoms == parsed["pdb"].n_atoms
    check(write(name, text), expect=expect)


@pytest.mark.parametrize("fmt", ["pdb", "cif", "gro"])
@pytest.mark.parametrize("suffix", sorted(_PACKERS))
def test_corrupt_compressed(real, fmt, suffix):
    packed = _PACKERS[suffix](real[0][fmt])
    for cut in (len(packed) // 2, 12):
        check(write(f"cut.{fmt}{suffix}", packed[:cut]))
    flipped = bytearray(packed)
    flipped[len(flipped) // 2] ^= 0xFF
    check(write(f"flip.{fmt}{suffix}", bytes(flipped)))


# -- odd files and names --------------------------------------------------------------------------

def test_odd_files(real):
    folder = _DIR / "odd"
    folder.mkdir()
    fifo = folder / "pipe.pdb"
    os.mkfifo(fifo)
    check(fifo)
    for target in ("/dev/zero", "/dev/urandom", "/dev/null"):
        link = folder / f"link-{Path(target).name}.pdb"
        link.symlink_to(target)
        check(link)
    (folder / "dir.pdb").mkdir()
    check(folder / "dir.pdb")
    check(folder / "missing.pdb")
    dangling = folder / "dangling.pdb"
    dangling.symlink_to(folder / "nowhere.pdb")
    check(dangling)
    for name in ("noext", "x.pdb.gz.gz", "x.", ".pdb", "x.pdb.zip", "x.gro.gz"):
        check(write(name, real[0]["pdb"]))
    check(write("empty.pdb", b""))
    check(write("empty.pdb.gz", gzip.compress(b"")))
    check(write("zeros.gro", b"t\n    0\n   1.0   1.0   1.0\n"))
