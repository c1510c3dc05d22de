"""One table row per design: the columns of ``protgpu evaluate`` (docs/design/complexes.md).

:func:`confidence_file` finds a predictor's confidence files next to a model structure;
:func:`confidence_columns`, :func:`sanity_columns` and :func:`score_columns` turn
:func:`~protgpu.complexes.read_confidence` + :func:`~protgpu.complexes.interface_confidence`,
:func:`~protgpu.complexes.design_sanity` and :func:`~protgpu.complexes.score_complex` results into flat
scalar columns (a table cell holds one number or string).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..errors import InputError

# the helpers of protgpu evaluate's job, importable by name; the public API is pg.score_complex & co.
__all__: list[str] = []

#: Confidence columns, NaN (empty) where the files do not have them. The interface values are the best
#: chain pair's (for two chains, the pair's): ipSAE the larger direction (Dunbrack 2025), pDockQ (Bryant
#: et al. 2022), pDockQ2 (Zhu et al. 2023) the larger direction, LIS the two directions' mean (Kim et al.
#: 2024); ipTM the predictor's own.
CONFIDENCE_COLUMNS = ("confidence_format", "plddt_mean", "ptm", "iptm", "ipsae", "pdockq", "pdockq2", "lis")

#: Design-sanity columns (:func:`protgpu.complexes.design_sanity`).
SANITY_COLUMNS = ("n_chains", "n_residues", "chain_residues", "clashes", "clashes_intra", "clashes_inter",
                  "radius_of_gyration", "n_interface_residues", "interface_contacts", "buried_interface_contacts")

# the structure file -> its confidence files, by predictor (each (pattern on the structure's name,
# candidate file names)); read_confidence reads the partner files of the one named
_NEXT_TO = (
    # AlphaFold 3: <job>_model[_N].cif -> <job>_summary_confidences[_N].json (+ full_data / confidences)
    (re.compile(r"(.+)_model(_\d+)?\.(cif|pdb)$"),
     lambda m: [f"{m[1]}_summary_confidences{m[2] or ''}.json", f"{m[1]}_full_data{m[2] or ''}.json",
                f"{m[1]}_confidences{m[2] or ''}.json",
                # Boltz: <name>_model_N.cif -> confidence_/pae_/plddt_<name>_model_N
                f"confidence_{m[1]}_model{m[2] or ''}.json", f"pae_{m[1]}_model{m[2] or ''}.npz",
                f"plddt_{m[1]}_model{m[2] or ''}.npz"]),
    # Chai-1: pred.model_idx_N.cif -> scores.model_idx_N.npz
    (re.compile(r"pred\.(.+)\.(cif|pdb)$"), lambda m: [f"scores.{m[1]}.npz"]),
    # ColabFold: <x>_(un)relaxed_<rest>.pdb -> <x>_scores_<rest>.json
    (re.compile(r"(.+)_(?:un)?relaxed_(.+)\.(pdb|cif)$"), lambda m: [f"{m[1]}_scores_{m[2]}.json"]),
)


def confidence_file(structure_path) -> Path | None:
    """The predictor's confidence file that belongs to a model structure file, or None.

    AlphaFold 3 (``<job>_model_N.cif`` -> ``<job>_summary_confidences_N.json`` and its full-data
    partner), Boltz (``<name>_model_N.cif`` -> ``confidence_<name>_model_N.json``, ``pae_*.npz``,
    ``plddt_*.npz``), Chai-1 (``pred.model_idx_N.cif`` -> ``scores.model_idx_N.npz``) and ColabFold
    (``<x>_unrelaxed_<rest>.pdb`` -> ``<x>_scores_<rest>.json``), looked for in the structure's folder.
    :func:`~protgpu.complexes.read_confidence` of the returned file reads its partners too.
    """
    p = Path(os.fspath(structure_path))
    name = re.sub(r"\.(gz|bz2|xz)$", "", p.name)
    for pattern, names in _NEXT_TO:
        m = pattern.match(name)
        if m:
            for n in names(m):
                q = p.with_name(n)
                if q.is_file():
                    return q
    return None


def _best(values) -> float:
    v = [float(x) for x in values if x is not None and np.isfinite(x)]
    return max(v) if v else float("nan")


def confidence_columns(structure, path, mode: str = "auto") -> dict:
    """The :data:`CONFIDENCE_COLUMNS` of one model.

    Parameters
    ----------
    structure : Structure
        The model, as loaded from ``path``.
    path : str or os.PathLike
        The model's file.
    mode : {"auto", "none"}
        ``auto``: the predictor's files next to the model (:func:`confidence_file`), else its
        B-factors when they can be pLDDT (0-1 or 0-100); ``none``: no confidence (the columns are NaN).

    Raises
    ------
    InputError
        A confidence file that does not match the structure (naming both files), an unreadable one.
    """
    from .confidence import interface_confidence, read_confidence

    out: dict = {c: float("nan") for c in CONFIDENCE_COLUMNS}
    out["confidence_format"] = ""
    if mode == "none":
        return out
    found = confidence_file(path)
    try:
        conf = read_confidence(found if found is not None else path, structure)
    except InputError:
        if found is not None:
            raise  # a predictor's file that is bad or does not match: the design fails, naming both
        return out  # B-factors that are no pLDDT (a crystal structure, a design tool's zeros): no confidence
    out["confidence_format"] = conf.format
    if conf.plddt is not None and conf.plddt.size:
        out["plddt_mean"] = float(np.nanmean(conf.plddt))
    out["ptm"] = float("nan") if conf.ptm is None else float(conf.ptm)
    out["iptm"] = float("nan") if conf.iptm is None else float(conf.iptm)
    if conf.plddt is not None and len(set(structure.residues.chain.tolist())) > 1:
        rows = interface_confidence(structure, conf)
        out["ipsae"] = _best(r["ipsae_max"] for r in rows)
        out["pdockq"] = _best(r["pdockq"] for r in rows)
        out["pdockq2"] = _best(r["pdockq2"] for r in rows)
        out["lis"] = _best(r["lis_mean"] for r in rows)
    return out


def sanity_columns(structure, topology=None, found: dict | None = None) -> dict:
    """The :data:`SANITY_COLUMNS` of one model (its first frame); ``chain_residues`` as text ``A:120,B:85``.
    ``topology``: its atom table's :class:`~protgpu.complexes.sanity.SanityTopology` when the caller keeps
    one per table (the models of one design share it); ``found``: with it, as ``sanity_of``'s."""
    from .sanity import design_sanity, sanity_of

    m = design_sanity(structure) if topology is None else sanity_of(topology, structure.coords[0], found=found)
    out = {c: m[c] for c in SANITY_COLUMNS if c != "chain_residues"}
    out["chain_residues"] = ",".join(f"{c}:{n}" for c, n in m["chain_residues"].items())
    out["radius_of_gyration"] = float(out["radius_of_gyration"])
    return {c: out[c] for c in SANITY_COLUMNS}


def score_column_names(metrics, interfaces) -> list[str]:
    """The score columns of :func:`score_columns`, in order: the metrics, then per reference interface
    ``<part>:<chain><chain>`` (``dockq:AB``, ``fnat:AB``, ``irmsd:AB``, ``lrmsd:AB``, ...), then
    ``chain_mapping``."""
    from .scores import DOCKQ_PARTS

    cols = list(metrics)
    for a, b in interfaces:
        cols += [f"{'dockq' if p == 'dockq_per_interface' else p}:{a}{b}" for p in DOCKQ_PARTS]
    return cols + ["chain_mapping"]


def score_columns(table: dict, k: int) -> dict:
    """Row ``k`` of a :func:`~protgpu.complexes.score_complex` table as flat columns
    (:func:`score_column_names`); ``chain_mapping`` as text ``reference:model`` pairs, ``A:B,B:A``."""
    from .scores import DOCKQ_PARTS, METRICS

    out = {m: float(table[m][k]) for m in METRICS if m in table}
    for i, (a, b) in enumerate(table.get("interfaces", [])):
        for p in DOCKQ_PARTS:
            out[f"{'dockq' if p == 'dockq_per_interface' else p}:{a}{b}"] = float(table[p][k, i])
    cm = table["chain_mapping"][k]
    out["chain_mapping"] = ",".join(f"{r}:{m}" for r, m in cm.chains.items())
    return out
