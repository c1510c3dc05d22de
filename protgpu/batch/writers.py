"""The batch engine's outputs: tables (``.csv``, ``.jsonl``, ``.parquet``), deterministic ``.npz``
files, Zarr stores and the errors file, each written atomically (a temporary name beside the
destination, then a rename).

Internal API (the engine, the CLI and tests): :func:`check_out_suffix`, :func:`write_output` (an atomic
write whose failure is an :class:`OutputError`), :func:`write_npz`, :func:`write_errors`,
:func:`require_zarr`. Every temporary name comes from the one atomic writer,
:func:`protgpu.io.atomic_path`, and :func:`protgpu.io.remove_stale_temps` removes what a killed run left.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..errors import InputError, ProtgpuError
from ..io.write import atomic_path
from .inputs import common_root, display_path, input_name

__all__ = ["ARRAY_SUFFIXES", "TABLE_SUFFIXES", "OutputError", "stem_keys", "write_table", "write_zarr"]

TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")
ARRAY_SUFFIXES = (".npz", ".npy")


class OutputError(ProtgpuError, OSError):
    """An output file could not be written (disk full, permission denied, missing folder). What was
    written before stays valid: the previous output is untouched and the manifest can be resumed."""


def check_out_suffix(out: Path) -> str:
    """The suffix of ``out`` among :data:`TABLE_SUFFIXES` and :data:`ARRAY_SUFFIXES`.

    Raises
    ------
    InputError
        Another suffix.
    """
    low = out.name.lower()
    for s in TABLE_SUFFIXES + ARRAY_SUFFIXES:
        if low.endswith(s):
            return s
    raise InputError(f"--out {out}: use one of {', '.join(TABLE_SUFFIXES + ARRAY_SUFFIXES)}")


def write_output(path, fn):
    """``write_atomic`` with write failures turned into :class:`OutputError`; first removes the
    temporaries a killed earlier write of ``path`` left (a manifest's or errors file's too, which no
    other cleanup names)."""
    from ..io import remove_stale_temps, write_atomic

    remove_stale_temps(path)
    try:
        return write_atomic(path, fn)
    except OSError as exc:
        if isinstance(exc, ProtgpuError):
            raise
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc}); the previous file, if any, is "
                          "unchanged") from None


def _columns_of(rows: list[dict]) -> list[str]:
    seen: dict = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def _cell(v):
    """A table value as written: a string whose name bytes were not UTF-8 (a surrogate escape) shows
    them as ``\\xNN`` (:func:`display_path`), so that every format can encode it."""
    return display_path(v) if isinstance(v, str) else v


def write_table(path, rows: list[dict], columns: list[str] | None = None) -> Path:
    """Write rows as a ``.csv``, ``.jsonl`` or ``.parquet`` table, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; the suffix picks the format. Parquet needs pyarrow.
    rows : iterable of dict
        Column name -> value (str, int, float, bool or None; None is an empty CSV cell, JSON null,
        a Parquet null). CSV and JSONL are written as the rows come (read twice when ``columns`` is
        None: pass a sequence then).
    columns : list of str, optional
        Columns in order (missing values are None); default: every key in order of first appearance.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    InputError
        Unknown suffix, or parquet without pyarrow.
    OutputError
        The file could not be written; an earlier file of that name is left as it was.

    Examples
    --------
    >>> import os, tempfile
    >>> rows = [{"model": "a.pdb", "tm": 0.91}, {"model": "b.pdb", "tm": 0.45, "note": "partial"}]
    >>> path = write_table(os.path.join(tempfile.mkdtemp(), "scores.csv"), rows)
    >>> print(path.read_text(), end="")
    model,tm,note
    a.pdb,0.91,
    b.pdb,0.45,partial
    """
    path = Path(path)
    cols = list(columns) if columns is not None else _columns_of(rows)
    low = path.name.lower()
    if low.endswith(".csv"):
        def write_csv(tmp):
            with open(tmp, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow([_cell(c) for c in cols])
                for r in rows:
                    w.writerow(["" if r.get(c) is None else _cell(r.get(c)) for c in cols])

        return write_output(path, write_csv)
    if low.endswith(".jsonl"):
        def write_jsonl(tmp):
            with open(tmp, "w") as fh:
                for r in rows:
                    fh.write(json.dumps({_cell(c): _cell(r.get(c)) for c in cols}) + "\n")

        return write_output(path, write_jsonl)
    if low.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"--out {path}: writing parquet needs pyarrow (pip install pyarrow); "
                             "or use .csv / .jsonl") from None
        rows = rows if isinstance(rows, list) else list(rows)  # read once, not once per column
        table = pa.table({_cell(c): [_cell(r.get(c)) for r in rows] for c in cols})
        return write_output(path, lambda tmp: pq.write_table(table, tmp))
    raise InputError(f"--out {path}: use a .csv, .jsonl or .parquet file name")


def write_npz(tmp: str, items: Iterable) -> None:
    """A compressed .npz written one array at a time (np.load reads it), with fixed zip timestamps so
    that equal results give equal bytes."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for key, arr in items:
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)


def stem_keys(paths: list[str], reserved=("inputs",)) -> list[str]:
    """One .npz key per input: its path relative to the inputs' common folder
    (:func:`~protgpu.batch.inputs.input_name`) without ``.gz`` and the extension, made unique.

    Parameters
    ----------
    paths : list of str
        Every input of the run (all shards), so that each shard keys an input as the full run does.
    reserved : tuple of str
        Keys already taken (the ``inputs`` array of an engine's ``.npz``).

    Returns
    -------
    list of str
        One key per path, in order.

    Examples
    --------
    >>> stem_keys(["m/x.pdb", "m/y.pdb"]), stem_keys(["af/a/x.pdb", "af/b/x.pdb.gz", "af/inputs.cif"])
    (['x', 'y'], ['a/x', 'b/x', 'inputs_2'])
    >>> stem_keys(["m/x.pdb", "m/x.cif"])
    ['x', 'x_2']
    """
    root = common_root(paths)
    used, keys = set(reserved), []
    for p in paths:
        base = input_name(p, root)
        if base.lower().endswith(".gz"):
            base = base[:-3]
        folder, leaf = os.path.split(base)
        stem = os.path.splitext(leaf)[0] or "input"
        stem = f"{folder}/{stem}" if folder else stem
        key, i = stem, 1
        while key in used:
            i += 1
            key = f"{stem}_{i}"
        used.add(key)
        keys.append(key)
    return keys


def _errors_path(out: Path) -> Path:
    return out.with_name(out.name + ".errors.tsv")


def write_errors(out: Path, failed: list) -> Path | None:
    """Write ``OUT.errors.tsv`` (``input``, ``sha256``, ``error`` of each ``(path, sha, error)`` in
    ``failed``), atomically; with nothing failed, remove an old one and return None."""
    path = _errors_path(out)
    if not failed:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None

    def clean(s):
        return " ".join(display_path(str(s or "")).split())  # one line, no tabs

    text = "input\tsha256\terror\n" + "".join(f"{clean(p)}\t{sha or ''}\t{clean(err)}\n" for p, sha, err in failed)
    write_output(path, lambda tmp: Path(tmp).write_text(text))
    return path


def require_zarr(dest, option: str = "--out"):
    """The ``zarr`` module (version 3 or later), or an :class:`InputError` naming ``dest``."""
    try:
        import zarr
    except ImportError:
        raise InputError(f"{option} {dest}: writing .zarr needs the zarr package (pip install zarr)") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise InputError(f"{option} {dest}: writing .zarr needs zarr 3 or later (found {zarr.__version__})")
    return zarr


def _zarr_put(group, key: str, arr: np.ndarray) -> None:
    if arr.dtype.kind in "US":
        # variable-length UTF-8: the string type the Zarr v3 specification defines
        z = group.create_array(key, shape=arr.shape, dtype=str)
        z[...] = arr.astype(str)
        return
    # chunks of about 4 MiB along the first axis (one input's frames or a matrix's rows)
    rows = (1 << 22) // max(1, arr.itemsize * int(np.prod(arr.shape[1:])))
    chunks = tuple(max(1, c) for c in (min(arr.shape[0], rows), *arr.shape[1:])) if arr.ndim else ()
    z = group.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=chunks)
    z[...] = arr


def write_zarr(dest, items: Iterable, attrs: dict | None = None) -> Path:
    """Write named arrays as one Zarr (v3) group, atomically (:func:`protgpu.io.atomic_path`).

    Parameters
    ----------
    dest : str or os.PathLike
        The store folder, ``NAME.zarr``.
    items : iterable of (str, array_like)
        Array names (a ``/`` makes a subgroup: ``adk_open/distances``) and arrays; string arrays are
        stored as variable-length UTF-8. Written one at a time, so a generator keeps memory low.
    attrs : dict, optional
        JSON attributes of the root group.

    Returns
    -------
    pathlib.Path
        ``dest``.

    Raises
    ------
    InputError
        zarr is not installed, or the folder of ``dest`` does not exist.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> items = [("adk_open/distances", np.zeros((1, 3, 3), np.float32)), ("inputs", np.array(["adk_open.pdb"]))]
    >>> path = write_zarr(os.path.join(tempfile.mkdtemp(), "d.zarr"), items)
    >>> import zarr
    >>> g = zarr.open_group(str(path), mode="r")
    >>> g["adk_open/distances"].shape, g["inputs"][:].tolist()
    ((1, 3, 3), ['adk_open.pdb'])
    """
    zarr = require_zarr(dest)
    with atomic_path(dest, directory=True) as tmp:
        root = zarr.open_group(tmp, mode="w")
        if attrs:
            root.attrs.update(attrs)
        for key, arr in items:
            _zarr_put(root, str(key), np.asarray(arr))
    return Path(str(dest).rstrip("/"))


