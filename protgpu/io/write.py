"""The one atomic writer, and the writers built on it: :func:`save_array` and :func:`save`.

Every output protgpu writes goes through :func:`atomic_path`: a temporary file (or folder, for a
Zarr store) beside the destination, renamed into place on success and removed on failure, so a
reader never sees a half-written output and a finished run leaves only its outputs.
:func:`remove_stale_temps` removes what a killed run left behind. See ``docs/design/io.md``.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..structure import Structure
from .formats import MMCIF_EXTENSIONS, PDB_EXTENSIONS, WRITABLE_EXTENSIONS, split_ext

__all__ = ["atomic_path", "remove_stale_temps", "save", "save_array", "write_atomic"]


def _default_mode() -> int:
    # mkstemp creates 0600 files; give results the permissions a plain open() would (0666 & ~umask).
    # Reading the umask means setting it; done once, at import, before any worker threads exist.
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_mode() if sys.platform != "win32" else None


def _remove(p: Path) -> None:
    """Remove a file, link or folder tree; gone already is fine."""
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()
    except FileNotFoundError:
        pass


@contextmanager
def atomic_path(path, *, directory: bool = False):
    """Context manager yielding a temporary path beside ``path``, which takes ``path``'s place on success.

    The temporary lives in the same folder (so :func:`os.replace` is an atomic rename on the same
    filesystem) and is named ``.NAME.<random>.tmp`` followed by ``path``'s last suffix (so
    ``np.save`` adds no second ``.npy``; folders get no suffix). On any exception it is removed
    and ``path`` is left as it was: a reader never sees a half-written output.

    * ``directory=False`` (a file): the temporary file exists (empty) when the block starts; on
      success it gets the permissions a plain ``open()`` would give (``0666 & ~umask``) and
      replaces ``path``.
    * ``directory=True`` (a folder, such as a Zarr store): the temporary path does not exist yet;
      the block creates it. A folder cannot be renamed over a non-empty one, so an existing
      ``path`` is first renamed aside (``.NAME.<random>.old.tmp``) and removed after the swap: a
      reader sees the old output, or the new one, or (for the instant between two renames) none,
      never a partly written one. If the swap fails the old output is put back.

    Parameters
    ----------
    path : str or os.PathLike
        Final destination (a trailing ``/`` is ignored).
    directory : bool
        Whether the output is a folder.

    Yields
    ------
    str
        Temporary path to write to.

    Raises
    ------
    InputError
        The destination's folder does not exist.

    Examples
    --------
    >>> import os, tempfile
    >>> dest = os.path.join(tempfile.mkdtemp(), "notes.txt")
    >>> with atomic_path(dest) as tmp:
    ...     with open(tmp, "w") as fh:
    ...         _ = fh.write("frame 0")
    ...     print(os.path.exists(dest))  # nothing at the destination until the block ends
    False
    >>> open(dest).read()
    'frame 0'
    >>> store = os.path.join(os.path.dirname(dest), "out.zarr")
    >>> with atomic_path(store, directory=True) as tmp:
    ...     os.makedirs(tmp)
    ...     _ = open(os.path.join(tmp, "zarr.json"), "w").write("{}")
    >>> sorted(os.listdir(os.path.dirname(dest))), os.listdir(store)
    (['notes.txt', 'out.zarr'], ['zarr.json'])
    """
    dest = Path(str(path).rstrip("/") or "/") if directory else Path(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{dest}: directory {folder} does not exist")
    if not directory:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{dest.name}.", suffix=f".tmp{''.join(dest.suffixes[-1:])}")
        os.close(fd)
        try:
            yield tmp
            if _FILE_MODE is not None:
                os.chmod(tmp, _FILE_MODE)
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return
    tag = uuid.uuid4().hex[:8]
    tmp = folder / f".{dest.name}.{tag}.tmp"
    try:
        yield str(tmp)
        old = None
        if dest.exists() or dest.is_symlink():
            old = folder / f".{dest.name}.{tag}.old.tmp"
            os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except BaseException:
            if old is not None:
                os.replace(old, dest)
            raise
        if old is not None:
            _remove(old)
    except BaseException:
        _remove(tmp)
        raise


def remove_stale_temps(path) -> list[str]:
    """Remove the temporaries that a killed run's :func:`atomic_path` left beside ``path``.

    Only names :func:`atomic_path` makes for ``path`` are touched (``.NAME.<8 characters>.tmp``,
    ``.old.tmp`` and ``.tmp.SUFFIX``, files or folders); the name is matched literally, so glob
    characters in it (``*``, ``?``, ``[``) match nothing else.

    Parameters
    ----------
    path : str or os.PathLike
        The output whose temporaries to remove (a trailing ``/`` is ignored).

    Returns
    -------
    list of str
        The paths removed.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for name in (".out.csv.ab12cd34.tmp.csv", ".out.csv.notes", "other.csv"):
    ...     _ = open(os.path.join(d, name), "w").write("x")
    >>> [os.path.basename(p) for p in remove_stale_temps(os.path.join(d, "out.csv"))]
    ['.out.csv.ab12cd34.tmp.csv']
    >>> sorted(os.listdir(d))
    ['.out.csv.notes', 'other.csv']
    """
    dest = Path(str(path).rstrip("/") or "/")
    folder = dest.parent if str(dest.parent) else Path(".")
    exact = re.compile(re.escape(f".{dest.name}.") + r"[0-9a-z_]{8}\.(?:old\.)?tmp(?:\.[^.]*)?")
    removed = []
    try:
        found = glob.glob(os.path.join(glob.escape(str(folder)), glob.escape(f".{dest.name}.") + "*.tmp*"))
    except OSError:
        return removed
    for p in sorted(found):
        if exact.fullmatch(os.path.basename(p)):
            try:
                _remove(Path(p))
            except OSError:
                continue
            removed.append(p)
    return removed


def write_atomic(path, write_fn: Callable[[str], object]) -> Path:
    """Write a file atomically: ``write_fn(tmp_path)`` then rename ``tmp_path`` onto ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination.
    write_fn : callable
        Called with a temporary path (same directory, same suffix) that it must write.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> p = write_atomic(os.path.join(d, "x.npy"), lambda tmp: np.save(tmp, np.arange(3)))
    >>> np.load(p).tolist()
    [0, 1, 2]
    """
    with atomic_path(path) as tmp:
        write_fn(tmp)
    return Path(path)


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):  # CuPy
        return x.get()
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch
        return x.detach().cpu().numpy()
    return np.asarray(x)


def save_array(path, data) -> Path:
    """Save an array (``.npy``) or arrays (``.npz``, compressed) atomically.

    Parameters
    ----------
    path : str or os.PathLike
        ``.npy`` (``data`` must be one array) or ``.npz``.
    data : array_like or dict of str to array_like
        A dict is saved as an ``.npz`` with its keys; a single array to ``.npz`` is stored under
        ``"arr_0"``. CuPy and torch arrays are copied to host first.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        Other suffix, or a dict given for ``.npy``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "rmsd.npz")
    >>> out = save_array(path, {"rmsd": np.zeros((3, 3), np.float32), "frame": np.arange(3)})
    >>> with np.load(out) as z:
    ...     print(sorted(z.files), z["frame"].tolist())
    ['frame', 'rmsd'] [0, 1, 2]
    """
    dest = Path(path)
    suffix = dest.suffix.lower()
    if suffix == ".npy":
        if isinstance(data, dict):
            raise InputError(f"{dest}: a dict of arrays needs a .npz file, not .npy")
        arr = _to_numpy(data)
        return write_atomic(dest, lambda tmp: np.save(tmp, arr))
    if suffix == ".npz":
        items = data.items() if isinstance(data, dict) else [("arr_0", data)]
        arrays = {str(k): _to_numpy(v) for k, v in items}
        return write_atomic(dest, lambda tmp: np.savez_compressed(tmp, **arrays))
    raise InputError(f"{dest}: unsupported output suffix {suffix or '(none)'!r}; use .npy or .npz")


# ----------------------------------------------------------------------------------------------------
# pg.save: structures to PDB / mmCIF (gemmi) and DCD / XTC (mdtraj)
# ----------------------------------------------------------------------------------------------------


def save(structure, path) -> Path:
    """Write a Structure to a file, atomically: PDB or mmCIF (every frame a model), DCD or XTC.

    Parameters
    ----------
    structure : Structure, path, mdtraj.Trajectory, Bio.PDB entity, or a list of these
        Anything with atom tables (a list is stacked as frames, as :func:`protgpu.load` does);
        coordinates in Angstrom, as everywhere in protgpu.
    path : str or os.PathLike
        ``.pdb`` / ``.ent`` or ``.cif`` / ``.mmcif`` (optionally ``.gz``): written through gemmi,
        with the atom table (names, elements, residues, chains, segment ids, HETATM flags) and
        every frame as a model, coordinates to 0.001 Angstrom; the box is not written. ``.dcd``
        (Angstrom) and ``.xtc`` (nm, 0.001 nm precision): written through mdtraj, every frame
        a frame, with the box when the structure has one (and the times, for XTC); they hold
        coordinates only, so loading them back needs ``top=`` (for instance the same structure
        saved as PDB).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        Input without atom names (a bare coordinate array), NaN, infinite or out-of-range coordinates,
        an unsupported suffix (the supported ones are listed), or the folder of ``path`` does not exist.

    Examples
    --------
    >>> import os, tempfile
    >>> import protgpu as pg
    >>> s = pg.load("datasets/adk_open.pdb")
    >>> out = pg.save(s.select("ca"), os.path.join(tempfile.mkdtemp(), "ca.cif"))
    >>> pg.load(out).n_atoms
    214
    """
    from .._inputs import as_structure, check_finite, source_name

    # the front door: a Structure, path, mdtraj or Bio.PDB object, or a list of them (stacked as frames)
    structure = as_structure(structure, "structure")
    check_finite(structure.coords, source_name(structure, "structure"))
    dest = Path(path)
    ext, gz = split_ext(dest)
    if ext in PDB_EXTENSIONS or ext in MMCIF_EXTENSIONS:
        text = _gemmi_text(structure, mmcif=ext in MMCIF_EXTENSIONS).encode()
        data = gzip.compress(text, mtime=0) if gz else text
        return write_atomic(dest, lambda tmp: Path(tmp).write_bytes(data))
    if ext in (".dcd", ".xtc") and not gz:
        with atomic_path(dest) as tmp:
            _write_mdtraj(structure, tmp, ext)
        return dest
    supported = ", ".join(list(WRITABLE_EXTENSIONS) + [e + ".gz" for e in PDB_EXTENSIONS + MMCIF_EXTENSIONS])
    raise InputError(f"{dest}: cannot write {ext + ('.gz' if gz else '') or '(no extension)'!r} files; "
                     f"supported: {supported}")


def _gemmi_text(s: Structure, *, mmcif: bool) -> str:
    """PDB or mmCIF text of every frame of ``s`` (a model each), built through gemmi."""
    import gemmi

    atoms = s.atoms
    st = gemmi.Structure()
    model = gemmi.Model(1)
    names, elements, resnames = atoms.name.tolist(), atoms.element.tolist(), atoms.resname.tolist()
    resids, icodes, chains = atoms.resid.tolist(), atoms.icode.tolist(), atoms.chain.tolist()
    segids, hetero, rindex = atoms.segid.tolist(), atoms.hetero.tolist(), atoms.residue_index.tolist()
    chain = residue = None
    last_res = None
    for i in range(len(atoms)):
        if chain is None or chains[i] != chain.name:
            if chain is not None:
                chain.add_residue(residue)
                model.add_chain(chain)
                residue = None
            chain = gemmi.Chain(chains[i])
        if rindex[i] != last_res:
            if residue is not None:
                chain.add_residue(residue)
            residue = gemmi.Residue()
            residue.name = resnames[i]
            residue.seqid = gemmi.SeqId(int(resids[i]), icodes[i] or " ")
            residue.segment = segids[i]
            residue.het_flag = "H" if hetero[i] else "A"
            last_res = rindex[i]
        a = gemmi.Atom()
        a.name = names[i]
        a.element = gemmi.Element(elements[i] if elements[i] not in ("", "X") else "X")
        a.occ = 1.0
        a.serial = i + 1
        residue.add_atom(a)
    if chain is not None:
        chain.add_residue(residue)
        model.add_chain(chain)
    st.add_model(model)
    for f in range(1, s.n_frames):
        st.add_model(model.clone())
        st[f].num = f + 1
    for f in range(s.n_frames):
        xyz = s.coords[f].astype(np.float64).tolist()
        for a, (x, y, z) in zip(st[f].all(), xyz, strict=True):
            a.atom.pos = gemmi.Position(x, y, z)
    st.setup_entities()
    if mmcif:
        return st.make_mmcif_document().as_string()
    text = st.make_pdb_string(gemmi.PdbWriteOptions(minimal=True, preserve_serial=True))
    # gemmi writes a "CRYST1 1 1 1" placeholder for a structure without a cell; readers (mdtraj, and
    # protgpu's own) take that as "no box", but a file with no CRYST1 says so plainly.
    if text.startswith("CRYST1    1.000    1.000    1.000"):
        text = text.split("\n", 1)[1]
    return text


def _write_mdtraj(s: Structure, tmp: str, ext: str) -> None:
    """Frames of ``s`` to a DCD (Angstrom) or XTC (nm) file at ``tmp``, with the box when there is one."""
    from mdtraj.formats import DCDTrajectoryFile, XTCTrajectoryFile
    from mdtraj.utils import box_vectors_to_lengths_and_angles

    box = s.box
    if ext == ".dcd":
        kw = {}
        if box is not None:
            a, b, c, alpha, beta, gamma = box_vectors_to_lengths_and_angles(box[:, 0], box[:, 1], box[:, 2])
            kw = {"cell_lengths": np.stack([a, b, c], axis=1), "cell_angles": np.stack([alpha, beta, gamma], axis=1)}
        with DCDTrajectoryFile(tmp, "w", force_overwrite=True) as fh:
            fh.write(s.coords, **kw)
        return
    with XTCTrajectoryFile(tmp, "w", force_overwrite=True) as fh:
        fh.write(
            s.coords / np.float32(10.0),
            time=None if s.time is None else s.time.astype(np.float32),
            box=None if box is None else box / np.float32(10.0),
        )
