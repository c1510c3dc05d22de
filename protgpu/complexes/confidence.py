"""Model confidence: what structure predictors write (pLDDT, pTM, ipTM, PAE) and the interface
confidences pipelines derive from it (ipSAE, pDockQ, pDockQ2, LIS).

Readers (``docs/design/confidence.md`` lists the public material each follows):

* B-factor pLDDT of AlphaFold2 / ColabFold / ESMFold / Chai PDB and mmCIF files, 0-1 and 0-100
  scales told apart;
* AlphaFold 3 ``*_confidences.json`` (server: ``*_full_data_*.json``) and ``*_summary_confidences*.json``;
* Boltz ``confidence_*.json``, ``pae_*.npz``, ``plddt_*.npz``;
* Chai-1 ``scores.*.npz`` (pLDDT is in the model's B-factors);
* ColabFold / AlphaFold2 ``*scores*.json`` and the AlphaFold DB PAE JSON.

pLDDT is always returned on the 0-100 scale; PAE in Angstrom.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._inputs import as_structure
from ..errors import InputError
from ..io._files import check_file, read_bytes
from ..io.pdb import _looks_like_mmcif
from ..structure import WATER_RESNAMES

__all__ = [
    "Confidence",
    "interface_confidence",
    "ipsae",
    "lis",
    "pdockq",
    "pdockq2",
    "plddt_from_bfactors",
    "read_confidence",
]


@dataclass
class Confidence:
    """Model confidence read from a predictor's files.

    Attributes
    ----------
    plddt : np.ndarray of float64, shape (R,), or None
        pLDDT per residue (token), 0-100. From B-factors: the CA atom's value (the residue's mean when
        it has no CA).
    atom_plddt : np.ndarray of float64, shape (atoms,), or None
        pLDDT per atom, 0-100 (B-factors, AlphaFold 3 ``atom_plddts``).
    pae : np.ndarray of float64, shape (N, N), or None
        Predicted aligned error in Angstrom; row i is the frame of token i (aligned on i, error at j).
    ptm, iptm : float or None
    chain_ptm : dict of str to float, or None
    chain_pair_iptm : dict of (str, str) to float, or None
    chains : list of str, or None
        Chain of each chain index the files use (the structure's chain ids when it was given,
        otherwise the file's own ids or "0", "1", ...).
    token_chains : np.ndarray of str, shape (N,), or None
        Chain of each token (PAE row), when known.
    format : str
        ``"bfactor"``, ``"af3"``, ``"boltz"``, ``"chai"`` or ``"colabfold"``.
    files : tuple of str
        The files read.
    extra : dict
        Other scalars the files carry (``ranking_score``, ``confidence_score``, ``aggregate_score``, ...).
    """

    plddt: np.ndarray | None = None
    atom_plddt: np.ndarray | None = None
    pae: np.ndarray | None = None
    ptm: float | None = None
    iptm: float | None = None
    chain_ptm: dict | None = None
    chain_pair_iptm: dict | None = None
    chains: list | None = None
    token_chains: np.ndarray | None = None
    format: str = ""
    files: tuple = ()
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# pLDDT from B-factors

def _bfactors(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chain, resid, icode, atom name) keys and B-factors of the first model's atoms, first altloc."""
    import gemmi

    # through protgpu's reader of files (regular files only, the size cap, compression by content)
    data = read_bytes(path)
    text = data.decode("utf-8", "replace")
    try:
        if _looks_like_mmcif(data):
            st = gemmi.make_structure_from_block(gemmi.cif.read_string(text).sole_block())
        else:
            st = gemmi.read_pdb_string(text)
    except Exception as exc:  # gemmi raises RuntimeError, ValueError, ...: one line
        raise InputError(f"{path}: cannot read B-factors: {str(exc).splitlines()[0]}") from None
    st.remove_alternative_conformations()
    keys, b = [], []
    for ch in st[0]:
        for res in ch:
            for at in res:
                keys.append((ch.name, res.seqid.num, res.seqid.icode.strip(), at.name))
                b.append(at.b_iso)
    return keys, np.asarray(b, dtype=np.float64)


def _scale_plddt(values: np.ndarray, where: str) -> np.ndarray:
    """pLDDT on 0-100 from values on either scale: all values <= 1 means the 0-1 scale (ESMFold,
    Boltz); a real model on 0-100 has no residue below 1. Values outside [0, 100] are no pLDDT."""
    if values.size == 0:
        return values
    lo, hi = float(values.min()), float(values.max())
    if lo < 0 or hi > 100:
        raise InputError(f"{where}: B-factors span {lo:g}..{hi:g}, outside 0-100: not pLDDT values")
    return values * 100.0 if hi <= 1.0 else values


def _residue_values(structure, atom_values: np.ndarray) -> np.ndarray:
    """Per residue: the CA atom's value, or the residue's mean when it has no CA."""
    ri = structure.atoms.residue_index
    n_res = structure.n_residues
    out = np.bincount(ri, weights=atom_values, minlength=n_res) / np.maximum(np.bincount(ri, minlength=n_res), 1)
    ca = np.flatnonzero(structure.atoms.name == "CA")
    out[ri[ca]] = atom_values[ca]
    return out


def plddt_from_bfactors(path, structure=None) -> Confidence:
    """pLDDT from the B-factor column of a predicted model (AlphaFold2, ColabFold, ESMFold, Chai).

    Parameters
    ----------
    path : str or os.PathLike
        PDB or mmCIF file (compressed too, as :func:`protgpu.load` reads).
    structure : Structure, optional
        The model as loaded (default ``protgpu.load(path)``); B-factors are matched to its atoms by
        chain, residue number, insertion code and atom name.

    Returns
    -------
    Confidence
        ``atom_plddt`` per atom and ``plddt`` per residue (the CA's value), both 0-100: a file
        whose B-factors are all <= 1 is on the 0-1 scale (ESMFold) and is multiplied by 100.

    Raises
    ------
    InputError
        Unreadable file, B-factors outside 0-100, or atoms of the structure missing from the file.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "esmfold.pdb")
    >>> line = "ATOM      1  CA  ALA A   1       0.000   0.000   0.000  1.00  0.87           C"
    >>> _ = open(path, "w").write(line + "\\nEND\\n")
    >>> plddt_from_bfactors(path).plddt  # 0-1 scale told apart
    array([87.])
    """
    name = os.fspath(path)
    s = as_structure(structure if structure is not None else name, "structure")
    keys, b = _bfactors(name)
    index = {k: i for i, k in reversed(list(enumerate(keys)))}  # first occurrence wins
    a = s.atoms
    try:
        take = np.fromiter(
            (index[(c, int(r), ic, n)] for c, r, ic, n in zip(a.chain.tolist(), a.resid.tolist(),
                                                                 a.icode.tolist(), a.name.tolist(), strict=True)),
            dtype=np.int64, count=len(a))
    except KeyError as exc:
        raise InputError(f"{name}: atom {exc.args[0]} of {s.source or 'the structure'} has no B-factor "
                         "in the file") from None
    # (gemmi keeps B-factors as float32: rounding to 1e-4 drops that noise, files carry 2 decimals)
    atom = np.round(_scale_plddt(b[take], name), 4)
    return Confidence(plddt=_residue_values(s, atom), atom_plddt=atom, format="bfactor", files=(name,))


# --------------------------------------------------------------------------------------------------
# predictor files

def _load_json(path: Path):
    try:
        return json.loads(read_bytes(path))
    except ValueError as exc:
        raise InputError(f"{path}: cannot read JSON: {str(exc).splitlines()[0]}") from None


def _load_npz(path: Path) -> dict:
    try:
        with np.load(io.BytesIO(read_bytes(path)), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read NPZ: {str(exc).splitlines()[0]}") from None


def _square(m, where: Path, what: str = "PAE") -> np.ndarray:
    a = np.asarray(m, dtype=np.float64)
    if a.ndim == 3 and a.shape[0] == 1:  # (Chai/Boltz keep a leading sample axis at times)
        a = a[0]
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise InputError(f"{where}: {what} must be a square matrix, got shape {a.shape}")
    return a


def _opt(d: dict, key: str):
    v = d.get(key)
    return None if v is None else float(np.asarray(v).reshape(-1)[0])


def _chain_arrays(conf: Confidence, per_chain, pair, ids=None) -> None:
    """Fill ``chain_ptm`` / ``chain_pair_iptm`` from per-chain lists and a pair matrix."""
    if per_chain is not None:
        v = np.asarray(per_chain, dtype=np.float64).reshape(-1)
        conf.chains = list(ids) if ids is not None else [str(i) for i in range(v.size)]
        conf.chain_ptm = dict(zip(conf.chains, v.tolist(), strict=True))
    if pair is not None:
        m = np.asarray(pair, dtype=np.float64)
        m = m.reshape(m.shape[-2:]) if m.ndim > 2 else m
        if conf.chains is None:
            conf.chains = list(ids) if ids is not None else [str(i) for i in range(m.shape[0])]
        if m.shape != (len(conf.chains), len(conf.chains)):
            raise InputError(f"{conf.files[-1]}: chain-pair ipTM has shape {m.shape} for {len(conf.chains)} chains")
        conf.chain_pair_iptm = {(a, b): float(m[i, j]) for i, a in enumerate(conf.chains)
                                for j, b in enumerate(conf.chains)}


def _read_af3(conf: Confidence, full: Path | None, summary: Path | None) -> None:
    conf.format = "af3"
    if full is not None:
        d = _load_json(full)
        conf.files += (str(full),)
        if "pae" in d:
            conf.pae = _square(d["pae"], full)
        if "atom_plddts" in d:
            conf.atom_plddt = np.asarray(d["atom_plddts"], dtype=np.float64)
        if "token_chain_ids" in d:
            conf.token_chains = np.asarray(d["token_chain_ids"], dtype=str)
            conf.chains = list(dict.fromkeys(conf.token_chains.tolist()))
    if summary is not None:
        d = _load_json(summary)
        conf.files += (str(summary),)
        conf.ptm, conf.iptm = _opt(d, "ptm"), _opt(d, "iptm")
        for k in ("ranking_score", "fraction_disordered", "has_clash", "num_recycles"):
            if k in d:
                conf.extra[k] = float(d[k])
        _chain_arrays(conf, d.get("chain_ptm"), d.get("chain_pair_iptm"), conf.chains)


def _read_boltz(conf: Confidence, summary: Path | None, pae: Path | None, plddt: Path | None) -> None:
    conf.format = "boltz"
    if summary is not None:
        d = _load_json(summary)
        conf.files += (str(summary),)
        conf.ptm, conf.iptm = _opt(d, "ptm"), _opt(d, "iptm")
        for k in ("confidence_score", "ligand_iptm", "protein_iptm", "complex_plddt", "complex_iplddt",
                  "complex_pde", "complex_ipde"):
            if k in d:
                conf.extra[k] = float(d[k])
        chains = d.get("chains_ptm")
        if isinstance(chains, dict):
            ids = sorted(chains, key=int)
            _chain_arrays(conf, [chains[i] for i in ids], None, ids)
            pairs = d.get("pair_chains_iptm")
            if isinstance(pairs, dict):
                _chain_arrays(conf, None, [[pairs[a][b] for b in ids] for a in ids], ids)
    if pae is not None:
        conf.files += (str(pae),)
        z = _load_npz(pae)
        if "pae" not in z:
            raise InputError(f"{pae}: no 'pae' array (keys: {', '.join(z)})")
        conf.pae = _square(z["pae"], pae)
    if plddt is not None:
        conf.files += (str(plddt),)
        z = _load_npz(plddt)
        if "plddt" not in z:
            raise InputError(f"{plddt}: no 'plddt' array (keys: {', '.join(z)})")
        v = np.asarray(z["plddt"], dtype=np.float64).reshape(-1)
        conf.plddt = _scale_plddt(v, str(plddt))  # Boltz writes 0-1


def _read_chai(conf: Confidence, scores: Path) -> None:
    conf.format = "chai"
    conf.files += (str(scores),)
    z = _load_npz(scores)
    conf.ptm, conf.iptm = _opt(z, "ptm"), _opt(z, "iptm")
    for k in ("aggregate_score", "has_inter_chain_clashes"):
        if k in z:
            conf.extra[k] = float(np.asarray(z[k]).reshape(-1)[0])
    _chain_arrays(conf, z.get("per_chain_ptm"), z.get("per_chain_pair_iptm"))


def _read_colabfold(conf: Confidence, path: Path) -> None:
    conf.format = "colabfold"
    conf.files += (str(path),)
    d = _load_json(path)
    if isinstance(d, list) and d and isinstance(d[0], dict):  # AlphaFold DB PAE file: [{...}]
        d = d[0]
    pae = d.get("pae", d.get("predicted_aligned_error"))
    if pae is not None:
        conf.pae = _square(pae, path)
    if "plddt" in d:
        conf.plddt = _scale_plddt(np.asarray(d["plddt"], dtype=np.float64), str(path))
    conf.ptm, conf.iptm = _opt(d, "ptm"), _opt(d, "iptm")


_AF3_FULL = re.compile(r"(.*)_(confidences|full_data)(_\d+)?\.json$")
_AF3_SUMMARY = re.compile(r"(.*)_summary_confidences(_\d+)?\.json$")
_BOLTZ = re.compile(r"(confidence|pae|plddt)_(.+)\.(json|npz)$")
_CHAI = re.compile(r"scores\.(.+)\.npz$")


def _sibling(p: Path, name: str) -> Path | None:
    q = p.with_name(name)
    return q if q.is_file() else None


def _read_file(p: Path) -> Confidence:
    """Read one confidence file and the siblings that belong to it (same model)."""
    conf = Confidence()
    name = p.name
    if m := _AF3_SUMMARY.match(name):
        full = _sibling(p, f"{m[1]}_confidences{m[2] or ''}.json") or _sibling(p, f"{m[1]}_full_data{m[2] or ''}.json")
        _read_af3(conf, full, p)
    elif m := _AF3_FULL.match(name):
        _read_af3(conf, p, _sibling(p, f"{m[1]}_summary_confidences{m[3] or ''}.json"))
    elif m := _BOLTZ.match(name):
        stem = m[2]
        _read_boltz(conf, _sibling(p, f"confidence_{stem}.json"), _sibling(p, f"pae_{stem}.npz"),
                    _sibling(p, f"plddt_{stem}.npz"))
    elif _CHAI.match(name):
        _read_chai(conf, p)
    elif name.endswith(".json"):
        _read_colabfold(conf, p)
    else:
        return plddt_from_bfactors(p)
    return conf


def _pick_in_folder(folder: Path) -> Path:
    """The one model's confidence file in a predictor's output folder."""
    files = sorted(f for f in folder.iterdir() if f.is_file())
    groups = {}
    for f in files:
        if m := _AF3_SUMMARY.match(f.name):
            groups.setdefault(("af3", m[1], m[2]), f)
        elif (m := _AF3_FULL.match(f.name)) and not _AF3_SUMMARY.match(f.name):
            groups.setdefault(("af3", m[1], m[3]), f)
        elif m := _BOLTZ.match(f.name):
            groups.setdefault(("boltz", m[2]), f)
        elif _CHAI.match(f.name):
            groups[("chai", f.name)] = f
        elif f.name.endswith(".json") and "scores" in f.name:
            groups[("colabfold", f.name)] = f
    if not groups:
        raise InputError(f"{folder}: no AlphaFold 3, Boltz, Chai or ColabFold confidence files found")
    if len(groups) > 1:
        names = ", ".join(sorted(g.name for g in groups.values())[:4])
        raise InputError(f"{folder}: confidence files of {len(groups)} models ({names}, ...); "
                         "name one file")
    return next(iter(groups.values()))


# --------------------------------------------------------------------------------------------------
# matching a structure

def residue_tokens(structure) -> np.ndarray:
    """Token index of each residue, as AlphaFold 3, Boltz and Chai tokenise: one token per polymer
    residue, one per heavy atom of a ligand (hetero, non-polymer) residue; water has none (-1).

    Returns
    -------
    np.ndarray of int64, shape (R,)
        First token of each residue (a ligand's atoms take the following ones); -1 for water.
    """
    return _tokens(structure)[0]


_POLYMER = sorted(
    "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL SEC PYL "
    "A C G U DA DC DG DT".split())


def _tokens(structure) -> tuple[np.ndarray, int]:
    """(first token of each residue, -1 for water; number of tokens)."""
    res = structure.residues
    if not len(res):
        return np.zeros(0, np.int64), 0
    is_water = np.isin(res.resname, list(WATER_RESNAMES))
    ligand = structure.atoms.hetero[res.atom_start] & ~np.isin(res.std_resname, _POLYMER)
    heavy = (structure.atoms.element != "H").astype(np.int64)
    width = np.where(is_water, 0, np.where(ligand, np.add.reduceat(heavy, res.atom_start), 1))
    ends = np.cumsum(width)
    return np.where(is_water, -1, ends - width).astype(np.int64), int(ends[-1])


def _chain_ids(structure) -> list:
    res = structure.residues
    keep = ~np.isin(res.resname, list(WATER_RESNAMES))
    return list(dict.fromkeys(res.chain[keep].tolist()))


def _match(conf: Confidence, s, conf_name: str, struct_name: str) -> None:
    """Check the confidence against the structure (one-line error naming both files) and fill the
    per-residue pLDDT from per-atom values."""
    chains = _chain_ids(s)

    def bad(what, n_conf, n_struct):
        raise InputError(f"{conf_name}: {n_conf} {what} but {struct_name} has {n_struct}")

    if conf.chains is not None and len(conf.chains) != len(chains):
        bad("chains", len(conf.chains), len(chains))
    if conf.chains is not None and conf.format in ("boltz", "chai"):  # the files number chains 0..n-1
        rename = dict(zip(conf.chains, chains, strict=True))
        conf.chains = chains
        if conf.chain_ptm is not None:
            conf.chain_ptm = {rename[k]: v for k, v in conf.chain_ptm.items()}
        if conf.chain_pair_iptm is not None:
            conf.chain_pair_iptm = {(rename[a], rename[b]): v for (a, b), v in conf.chain_pair_iptm.items()}
    n_tok, n_res = _tokens(s)[1], s.n_residues
    for what, arr in (("PAE rows", None if conf.pae is None else conf.pae.shape[0]),
                      ("pLDDT tokens", None if conf.plddt is None else conf.plddt.shape[0])):
        if arr is not None and arr not in (n_tok, n_res):
            bad(what, arr, f"{n_tok} tokens ({n_res} residues)")
    if conf.atom_plddt is not None:
        heavy = s.atoms.element != "H"
        if conf.atom_plddt.shape[0] == len(s.atoms):
            atom = conf.atom_plddt
        elif conf.atom_plddt.shape[0] == int(heavy.sum()):
            atom = np.full(len(s.atoms), np.nan)
            atom[heavy] = conf.atom_plddt
        else:
            bad("atom pLDDTs", conf.atom_plddt.shape[0], f"{len(s.atoms)} atoms ({int(heavy.sum())} heavy)")
        conf.atom_plddt = atom
        if conf.plddt is None:
            conf.plddt = _residue_values(s, np.nan_to_num(atom))
    if conf.token_chains is None and conf.pae is not None and conf.pae.shape[0] == n_res:
        conf.token_chains = s.residues.chain.copy()


def read_confidence(path_or_folder, structure=None) -> Confidence:
    """Read a predicted model's confidence: pLDDT, pTM, ipTM and PAE, where the files have them.

    Parameters
    ----------
    path_or_folder : str or os.PathLike
        One file: an AlphaFold 3 ``*_confidences.json`` / ``*_full_data_N.json`` or
        ``*_summary_confidences*.json`` (the other one of the pair is read too when it lies next to
        it), a Boltz ``confidence_*.json`` / ``pae_*.npz`` / ``plddt_*.npz`` (with their siblings),
        a Chai ``scores.*.npz``, a ColabFold ``*scores*.json`` or AlphaFold DB PAE JSON, or a
        PDB/mmCIF model (pLDDT from its B-factors). A folder holding one model's files.
    structure : Structure or path, optional
        The predicted model. When given, chain and residue (token) counts are checked against it,
        Boltz/Chai chain numbers become its chain ids, and per-residue pLDDT is taken from
        AlphaFold 3's per-atom values (the CA atom's).

    Returns
    -------
    Confidence

    Raises
    ------
    InputError
        A missing or unreadable file, a folder with no or several models' files, or a confidence file
        that does not match the structure (the message names both files and the counts).

    Examples
    --------
    >>> import protgpu as pg
    >>> from pathlib import Path
    >>> from protgpu.complexes import read_confidence
    >>> data = Path(pg.__file__).resolve().parents[1] / "datasets" / "confidence"
    >>> c = read_confidence(data / "fold_5b8c_summary_confidences_0.json")
    >>> c.format, c.ptm, c.iptm, c.chain_pair_iptm["0", "1"]
    ('af3', 0.87, 0.82, 0.79)
    """
    p = Path(os.fspath(path_or_folder))
    if p.is_dir():
        p = _pick_in_folder(p)
    elif not p.exists():
        raise InputError(f"{p}: no such file or folder")
    else:
        check_file(p)  # the loaders' one check and wording: a pipe, a device, an empty file
    conf = _read_file(p)
    if structure is not None:
        s = as_structure(structure, "structure")
        if conf.format == "bfactor":
            conf = plddt_from_bfactors(p, s)
        shown = os.fspath(structure) if isinstance(structure, (str, os.PathLike)) else (s.source or "the structure")
        _match(conf, s, str(p), shown)
    return conf


# --------------------------------------------------------------------------------------------------
# derived interface confidences

def _chain_index(chains) -> tuple[np.ndarray, list]:
    c = np.asarray(chains).astype(str)
    return c, list(dict.fromkeys(c.tolist()))


def _ptm_term(pae: np.ndarray, d0) -> np.ndarray:
    """The TM-score term 1 / (1 + (e / d0)^2) of an aligned error e (Zhang & Skolnick 2004)."""
    return 1.0 / (1.0 + (pae / d0) ** 2)


def _d0(n) -> np.ndarray:
    """TM-score's d0 = 1.24 (L - 15)^(1/3) - 1.8 with L at least 27 and d0 at least 1 (ipSAE's rule)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 27.0)
    return np.maximum(1.24 * np.cbrt(n - 15.0) - 1.8, 1.0)


def ipsae(pae, chains, *, pae_cutoff: float = 10.0) -> dict:
    """ipSAE, the interface score from aligned errors of Dunbrack (2025).

    R. L. Dunbrack, "Rēs ipSAE loquunt: What's wrong with AlphaFold's ipTM score and how to fix it",
    bioRxiv 2025.02.10.637595. For chains A (aligned) and B (scored), with residue i of A:

        ipSAE(A->B) = max_i  mean_{j in B, PAE_ij < cutoff}  1 / (1 + (PAE_ij / d0(n_i))^2)

    where n_i is the number of residues j of B with PAE_ij < cutoff and
    d0(L) = 1.24 (max(L, 27) - 15)^(1/3) - 1.8 (at least 1). A residue with no such j scores 0.
    The paper reports the pair's value as max(ipSAE(A->B), ipSAE(B->A)).

    Parameters
    ----------
    pae : array_like, shape (N, N)
        PAE in Angstrom, row i aligned on token i.
    chains : array_like of str, shape (N,)
        Chain of each token.
    pae_cutoff : float
        Angstrom; the paper uses 10 for AlphaFold 3 and Boltz, 15 for AlphaFold2.

    Returns
    -------
    dict of (str, str) to float
        Asymmetric ipSAE(A->B) for every ordered pair of different chains.

    Examples
    --------
    >>> ipsae([[0.0, 2.0], [4.0, 0.0]], ["A", "B"])  # one residue each: d0 = d0(27) = 1.039
    {('A', 'B'): 0.2124..., ('B', 'A'): 0.0631...}
    """
    e = np.asarray(pae, dtype=np.float64)
    c, ids = _chain_index(chains)
    out = {}
    for a in ids:
        rows = e[c == a]
        for b in ids:
            if a == b:
                continue
            block = rows[:, c == b]
            ok = block < pae_cutoff
            n = ok.sum(axis=1)
            term = _ptm_term(block, _d0(n)[:, None])
            per_res = np.where(n > 0, (term * ok).sum(axis=1) / np.maximum(n, 1), 0.0)
            out[a, b] = float(per_res.max()) if per_res.size else 0.0
    return out


def lis(pae, chains, *, pae_cutoff: float = 12.0) -> dict:
    """LIS, the local interaction score of Kim et al. (2024).

    A.-R. Kim, Y. Hu, A. Comjean, J. Rodiger, S. E. Mohr, N. Perrimon, "Enhanced protein-protein
    interaction discovery via AlphaFold-Multimer", bioRxiv 2024.02.19.580970. Over the inter-chain
    PAE block of chains A (rows) and B (columns), the entries with PAE <= 12 Angstrom are mapped to
    (12 - PAE) / 12 and averaged (0 when there are none). The paper's LIS of a pair is the mean of the
    two directions, ``(lis[a, b] + lis[b, a]) / 2``.

    Parameters
    ----------
    pae : array_like, shape (N, N)
    chains : array_like of str, shape (N,)
    pae_cutoff : float
        Angstrom (the paper's 12).

    Returns
    -------
    dict of (str, str) to float
        Directional LIS for every ordered pair of different chains.

    Examples
    --------
    >>> lis([[0.0, 2.0], [4.0, 0.0]], ["A", "B"])  # (12 - 2) / 12 and (12 - 4) / 12
    {('A', 'B'): 0.8333..., ('B', 'A'): 0.6666...}
    """
    e = np.asarray(pae, dtype=np.float64)
    c, ids = _chain_index(chains)
    out = {}
    for a in ids:
        for b in ids:
            if a != b:
                v = e[np.ix_(c == a, c == b)]
                v = v[v <= pae_cutoff]
                out[a, b] = float(((pae_cutoff - v) / pae_cutoff).mean()) if v.size else 0.0
    return out


def _interfaces(coords, plddt, chains, cutoff):
    """For each ordered pair (a, b) of different chains: a, b, the (rows of a, columns of b) index
    of the pair's block, the contact mask (representative atoms within ``cutoff``, <= as the papers)
    and the mean pLDDT of the interface residues of both chains (NaN without contacts)."""
    from ..distances import distances

    x = np.asarray(coords, dtype=np.float64)
    p = np.asarray(plddt, dtype=np.float64)
    c, ids = _chain_index(chains)
    for a in ids:
        ia = np.flatnonzero(c == a)
        for b in ids:
            if a == b:
                continue
            ib = np.flatnonzero(c == b)
            d = np.asarray(distances(x[ia], x[ib], device="cpu"), dtype=np.float64).reshape(ia.size, ib.size)
            ok = d <= cutoff
            sel = np.concatenate([ia[ok.any(axis=1)], ib[ok.any(axis=0)]])
            yield a, b, np.ix_(ia, ib), ok, (p[sel].mean() if sel.size else np.nan)


def pdockq(coords, plddt, chains, *, cutoff: float = 8.0) -> dict:
    """pDockQ of Bryant, Pozzati and Elofsson (2022).

    P. Bryant, G. Pozzati, A. Elofsson, "Improved prediction of protein-protein interactions using
    AlphaFold2", Nat. Commun. 13, 1265 (2022). With the interface residues of chains A and B (CB atoms,
    CA for glycine, within 8 Angstrom of the other chain), n the number of such CB-CB contacts and
    <pLDDT> the mean pLDDT (0-100) of the interface residues of both chains:

        x = <pLDDT> log10(n);   pDockQ = 0.724 / (1 + exp(-0.052 (x - 152.611))) + 0.018

    and 0 when there is no contact.

    Parameters
    ----------
    coords : array_like, shape (N, 3)
        One representative atom per residue (CB, CA for glycine), Angstrom.
    plddt : array_like, shape (N,)
        pLDDT per residue, 0-100.
    chains : array_like of str, shape (N,)
    cutoff : float
        Contact distance, Angstrom (the paper's 8).

    Returns
    -------
    dict of (str, str) to float
        pDockQ for every ordered pair of different chains (symmetric).

    Examples
    --------
    >>> d = pdockq([[0, 0, 0], [5, 0, 0]], [90.0, 80.0], ["A", "B"])  # one contact: log10(1) = 0
    >>> round(d["A", "B"], 4), round(0.724 / (1 + 2.718281828 ** (0.052 * 152.611)) + 0.018, 4)
    (0.0183, 0.0183)
    """
    out = {}
    for a, b, _, ok, mean in _interfaces(coords, plddt, chains, cutoff):
        if not ok.any():
            out[a, b] = 0.0
            continue
        t = mean * np.log10(ok.sum())
        out[a, b] = float(0.724 / (1.0 + np.exp(-0.052 * (t - 152.611))) + 0.018)
    return out


def pdockq2(coords, plddt, pae, chains, *, cutoff: float = 8.0) -> dict:
    """pDockQ2 of Zhu, Shenoy, Kundrotas and Elofsson (2023).

    W. Zhu, A. Shenoy, P. Kundrotas, A. Elofsson, "Evaluation of AlphaFold-Multimer prediction on
    multi-chain protein complexes", Bioinformatics 39, btad424 (2023). Over the interface contacts
    (i in A, j in B, representative atoms within 8 Angstrom), with d0 = 10 Angstrom:

        x = <1 / (1 + (PAE_ij / d0)^2)>_contacts * <pLDDT>_interface
        pDockQ2 = 1.31 / (1 + exp(-0.075 (x - 84.733))) + 0.005

    where PAE_ij is read in A's frame (row i) and <pLDDT> is over the interface residues of both
    chains (as ipSAE's reference implementation does); 0 when there is no contact.

    Parameters
    ----------
    coords : array_like, shape (N, 3)
    plddt : array_like, shape (N,)
        0-100.
    pae : array_like, shape (N, N)
    chains : array_like of str, shape (N,)
    cutoff : float

    Returns
    -------
    dict of (str, str) to float
        pDockQ2 for every ordered pair (A's frame).

    Examples
    --------
    >>> d = pdockq2([[0, 0, 0], [5, 0, 0]], [90.0, 80.0], [[0.0, 2.0], [4.0, 0.0]], ["A", "B"])
    >>> round(d["A", "B"], 3), round(d["B", "A"], 3)  # PAE 2 A in A's frame, 4 A in B's
    (0.587, 0.395)
    """
    e = np.asarray(pae, dtype=np.float64)
    out = {}
    for a, b, block, ok, mean in _interfaces(coords, plddt, chains, cutoff):
        if not ok.any():
            out[a, b] = 0.0
            continue
        t = _ptm_term(e[block][ok], 10.0).mean() * mean
        out[a, b] = float(1.31 / (1.0 + np.exp(-0.075 * (t - 84.733))) + 0.005)
    return out


def representative_atoms(structure) -> np.ndarray:
    """Index of each residue's CB atom (CA for glycine or when there is no CB; -1 when neither)."""
    a = structure.atoms
    n_res = structure.n_residues
    out = np.full(n_res, -1, dtype=np.int64)
    ca = np.flatnonzero(a.name == "CA")
    out[a.residue_index[ca]] = ca
    cb = np.flatnonzero((a.name == "CB") & (a.std_resname != "GLY"))
    out[a.residue_index[cb]] = cb
    return out


def interface_confidence(structure, confidence: Confidence, *, pae_cutoff: float = 10.0,
                         contact_cutoff: float = 8.0) -> list[dict]:
    """ipSAE, pDockQ, pDockQ2, LIS and the predictor's chain-pair ipTM for every ordered chain pair.

    Parameters
    ----------
    structure : Structure or path
        The predicted model.
    confidence : Confidence
        From :func:`read_confidence` (pLDDT per residue; PAE for ipSAE, pDockQ2 and LIS).
    pae_cutoff : float
        ipSAE's PAE cutoff, Angstrom.
    contact_cutoff : float
        pDockQ/pDockQ2 contact distance between representative atoms (CB, CA for glycine).

    Returns
    -------
    list of dict
        One row per ordered pair: ``chain_1``, ``chain_2``, ``ipsae`` (1 -> 2), ``ipsae_max``,
        ``pdockq``, ``pdockq2``, ``lis`` (1 -> 2), ``lis_mean``, ``iptm`` (None where not available).

    Examples
    --------
    >>> import numpy as np
    >>> import protgpu as pg
    >>> from pathlib import Path
    >>> data = Path(pg.__file__).resolve().parents[1] / "datasets" / "openstructure"
    >>> s = pg.load(data / "1eud_mdl_partial-dimer.pdb")
    >>> rows = interface_confidence(s, Confidence(plddt=np.full(s.n_residues, 85.0)))
    >>> [(r["chain_1"], r["chain_2"], round(r["pdockq"], 3), r["ipsae"]) for r in rows]
    [('B', 'A', 0.277, None), ('A', 'B', 0.277, None)]
    """
    s = as_structure(structure, "structure")
    rep = representative_atoms(s)
    keep = rep >= 0  # residues with a CA (polymer residues): the tokens the scores are defined on
    tokens = residue_tokens(s)[keep]
    coords = s.coords[0][rep[keep]]
    chains = s.residues.chain[keep]
    where = s.source or "structure"
    if confidence.plddt is None:
        raise InputError(f"{where}: the confidence has no per-residue pLDDT")
    plddt = confidence.plddt
    plddt = plddt[tokens] if plddt.shape[0] != s.n_residues else plddt[keep]
    pae = None
    if confidence.pae is not None:
        sel = tokens if confidence.pae.shape[0] != s.n_residues else np.flatnonzero(keep)
        pae = confidence.pae[np.ix_(sel, sel)]
    pd = pdockq(coords, plddt, chains, cutoff=contact_cutoff)
    sae = ipsae(pae, chains, pae_cutoff=pae_cutoff) if pae is not None else {}
    pd2 = pdockq2(coords, plddt, pae, chains, cutoff=contact_cutoff) if pae is not None else {}
    ls = lis(pae, chains) if pae is not None else {}
    iptm = confidence.chain_pair_iptm or {}
    rows = []
    for a, b in pd:
        rows.append({
            "chain_1": a, "chain_2": b,
            "ipsae": sae.get((a, b)),
            "ipsae_max": max(sae[a, b], sae[b, a]) if sae else None,
            "pdockq": pd[a, b],
            "pdockq2": pd2.get((a, b)),
            "lis": ls.get((a, b)),
            "lis_mean": (ls[a, b] + ls[b, a]) / 2 if ls else None,
            "iptm": iptm.get((a, b)),
        })
    return rows
