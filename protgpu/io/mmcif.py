"""mmCIF through gemmi: read with ``gemmi.read_structure`` and flattened with ``gemmi.FlatStructure``
(NumPy arrays, no per-atom Python). gemmi is imported inside the functions.

Internal API: :func:`read_mmcif` (a path) and :func:`from_gemmi` (a ``gemmi.Structure``).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..structure import AtomTable, Structure
from ._common import altloc_keep, cell_box, check_model_atoms, check_models, one_line, split_models
from ._files import check_file, compression_of, read_bytes
from .formats import split_ext


def read_mmcif(path, name: str, *, altloc: str, model) -> Structure:
    """Read the mmCIF file ``path`` through gemmi (see :func:`protgpu.io.load` for ``altloc`` and ``model``).

    A compressed file (gzip, bzip2, xz: recognised by content) is decompressed by protgpu, under the
    input size cap, and parsed from memory. The ``_cell`` becomes a crystal box (see
    :func:`protgpu.io._common.cell_box`)."""
    import gemmi

    with open_checked(path) as head:
        # (gemmi decides by the name: a .gz holding plain text would fail there)
        compressed = compression_of(head) is not None or split_ext(path)[1]
    try:
        if compressed:
            doc = gemmi.cif.read_string(read_bytes(path).decode("utf-8", "replace"))
            st = gemmi.make_structure_from_block(doc.sole_block())
        else:
            # merge_chain_parts=False keeps atoms in file order (gemmi otherwise moves a chain's
            # waters/ligands next to its polymer).
            st = gemmi.read_structure(str(path), merge_chain_parts=False, format=gemmi.CoorFormat.Mmcif)
    except InputError:
        raise
    except Exception as exc:  # gemmi raises RuntimeError, ValueError, ...: all become one line
        raise InputError(f"{name}: cannot read mmCIF: {one_line(exc)}") from None
    s = from_gemmi(st, name, altloc=altloc, model=model)
    c = st.cell
    box = cell_box((c.a, c.b, c.c, c.alpha, c.beta, c.gamma), name)
    if box is not None:
        s = Structure(s.coords, s.atoms, source=name, box=box, box_source="crystal")
    return s


def open_checked(path):
    """The first 6 bytes of the regular, non-empty file ``path`` (the compression magic), in a
    context manager."""
    import contextlib

    check_file(path)
    with open(path, "rb") as fh:
        head = fh.read(6)
    return contextlib.nullcontext(head)


def from_gemmi(st, name: str, *, altloc: str, model) -> Structure:
    """A Structure from a ``gemmi.Structure``, flattened by ``gemmi.FlatStructure`` (every model a frame)."""
    import gemmi

    flat = gemmi.FlatStructure(st)
    if len(flat) == 0:
        raise InputError(f"{name}: no atoms found")
    flat.strings_as_numbers = False

    def text(a):
        return np.char.strip(np.asarray(a).astype("U"))

    model_num = np.asarray(flat.model_num)
    # FlatStructure lists models in file order; renumber them 0..M-1 for splitting.
    change = np.ones(model_num.size, dtype=bool)
    change[1:] = model_num[1:] != model_num[:-1]
    model_id = np.cumsum(change) - 1
    model_numbers = model_num[change].tolist()

    atom_name = text(flat.atom_names)
    chain = text(flat.chain_ids)
    resname = text(flat.residue_names)
    resid = np.asarray(flat.resnums).astype(np.int32)
    ic = np.asarray(flat.icodes)
    alt = np.asarray(flat.altlocs)
    has_alt = (alt != 0) & (alt != 32)
    keep = None
    if has_alt.any():
        grp_change = np.ones(resid.size, dtype=bool)
        grp_change[1:] = (chain[1:] != chain[:-1]) | (resid[1:] != resid[:-1])
        grp_change[1:] |= (ic[1:] != ic[:-1]) | (model_id[1:] != model_id[:-1])
        _, name_key = np.unique(atom_name, return_inverse=True)
        occ_all = np.asarray(flat.occ)
        keep = altloc_keep(np.cumsum(grp_change), name_key.ravel(), has_alt, lambda idx: occ_all[idx], altloc)
    sel, model_numbers = split_models(model_id, model_numbers, model, name)
    if sel is not None:
        keep = sel if keep is None else keep & sel
    pos = np.asarray(flat.pos)
    het = np.asarray(flat.het_flags) == ord("H")
    element = np.char.upper(text(flat.element_names))
    if keep is not None:
        atom_name, chain, resname, resid, ic = atom_name[keep], chain[keep], resname[keep], resid[keep], ic[keep]
        pos, het, element, model_id = pos[keep], het[keep], element[keep], model_id[keep]
    n_models = len(model_numbers)
    n = atom_name.size
    if n_models > 1:
        counts = np.bincount(model_id - model_id.min(), minlength=n_models)
        check_models(counts, model_numbers, name)
        n = int(counts[0])

        def describe(m, a):
            return f"{atom_name[m * n + a]} {resname[m * n + a]}"

        _, nk = np.unique(atom_name, return_inverse=True)
        check_model_atoms(nk.ravel(), n_models, model_numbers, describe, name)
    icode = np.where(ic[:n] == 32, "", np.char.decode(ic[:n].astype(np.uint8).view("S1"), "latin-1"))
    atoms = AtomTable(
        name=atom_name[:n],
        element=element[:n],
        resname=resname[:n],
        resid=resid[:n],
        icode=np.char.strip(icode.astype("U1")),
        chain=chain[:n],
        segid=np.full(n, "", dtype="<U1"),
        hetero=het[:n],
    )
    return Structure(pos.reshape(n_models, n, 3), atoms, source=name)
