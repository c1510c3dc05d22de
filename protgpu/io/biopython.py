"""Biopython ``Structure`` / ``Model`` / ``Chain`` objects to a :class:`~protgpu.structure.core.Structure`
(Angstrom; each Bio model a frame). Internal API: :func:`from_biopython`.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..structure import AtomTable, Structure, guess_elements


def from_biopython(obj) -> Structure:
    """A Structure from a Bio.PDB Structure (each model a frame), Model or Chain; Angstrom as given."""
    level = getattr(obj, "level", None)
    if level == "S":
        models = list(obj)
        source = f"Bio.PDB structure {obj.id}"
    elif level in ("M", "C"):
        models = [obj]
        source = f"Bio.PDB {'model' if level == 'M' else 'chain'} {obj.id}"
    else:
        raise InputError(f"cannot load Bio.PDB object at level {level!r}: pass a Structure, Model or Chain")
    if not models:
        raise InputError(f"{source}: no models")
    coords, tables = [], []
    for m in models:
        atoms = list(m.get_atoms())
        if not atoms:
            raise InputError(f"{source}: model {getattr(m, 'serial_num', m.id)} has no atoms")
        coords.append(np.array([a.coord for a in atoms], dtype=np.float32))
        tables.append(atoms)
    first = tables[0]

    def number(m):  # Bio's serial_num is the MODEL number (1-based); id is 0-based
        return getattr(m, "serial_num", m.id)

    for m, atoms in zip(models[1:], tables[1:], strict=True):
        if len(atoms) != len(first):
            raise InputError(
                f"{source}: model {number(m)} has {len(atoms)} atoms but model {number(models[0])} has "
                f"{len(first)}; every model must have the same atoms in the same order"
            )
        pairs = enumerate(zip(atoms, first, strict=True))
        diff = next((i for i, (a, b) in pairs if a.get_name() != b.get_name()), None)
        if diff is not None:
            raise InputError(
                f"{source}: model {number(m)} atom {diff} is {atoms[diff].get_name()} but model "
                f"{number(models[0])} has {first[diff].get_name()}; every model must have the same atoms in the "
                "same order"
            )
    names, elements, resnames, resids, icodes, chains, segids, hetero = [], [], [], [], [], [], [], []
    for a in first:
        res = a.get_parent()
        hetflag, resseq, icode = res.id
        names.append(a.get_name())
        elements.append((a.element or "").strip().upper())
        resnames.append(res.get_resname().strip())
        resids.append(resseq)
        icodes.append(icode.strip())
        chains.append(res.get_parent().id.strip())
        segids.append((res.segid or "").strip())
        hetero.append(hetflag.strip() != "")
    name_arr = np.asarray(names, dtype=str)
    resname_arr = np.asarray(resnames, dtype=str)
    element = np.asarray(elements, dtype="<U2")
    missing = (element == "") | (element == "X")
    if missing.any():
        element[missing] = guess_elements(name_arr[missing], resname_arr[missing])
    atoms_table = AtomTable(
        name=name_arr, element=element, resname=resname_arr, resid=np.asarray(resids, dtype=np.int32),
        icode=np.asarray(icodes, dtype=str), chain=np.asarray(chains, dtype=str),
        segid=np.asarray(segids, dtype=str), hetero=np.asarray(hetero, dtype=bool),
    )
    return Structure(np.stack(coords), atoms_table, source=source)
