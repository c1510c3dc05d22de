"""Residue-name and element tables, and the element guess for files without an element column.

Which residue names are amino acids (with the force-field and modified names mapped to their
parent), which are water, and the PDB padding rules by which an atom name spells its element.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "AMINO_ACIDS",
    "NONSTANDARD_RESNAMES",
    "VIRTUAL_SITE_ELEMENTS",
    "WATER_RESNAMES",
    "guess_elements",
    "is_virtual_site",
    "standardize_resnames",
]

#: The 20 canonical amino acids plus selenocysteine and pyrrolysine, as 3-letter PDB names.
AMINO_ACIDS = frozenset(
    "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL SEC PYL".split()
)

#: Residue names that force fields and the PDB use for (modified or differently protonated) amino
#: acids, mapped to the parent amino acid. Protonation/tautomer names come from CHARMM (HSD/HSE/HSP),
#: AMBER (HID/HIE/HIP, CYX/CYM, ASH/GLH/LYN) and GROMOS/GROMACS (HIS1/HISA/HISB/HISD/HISE/HISH, CYS2,
#: LYSH, ...). Common PDB modified residues map to their parent: MSE (selenomethionine) -> MET, so
#: selenomethionine counts as protein and its CA is selected by ``ca`` (its SE atom keeps element SE).
NONSTANDARD_RESNAMES = {
    **dict.fromkeys(
        "HSD HSE HSP HID HIE HIP HIS1 HIS2 HISA HISB HISD HISE HISH HISP HSC HSN HN1 HN2 HIN".split(),
        "HIS",
    ),
    **dict.fromkeys("CYX CYM CYS2 CYSH CYN CSS CYF CYP".split(), "CYS"),
    **dict.fromkeys("ASH ASPH ASPP ASN1".split(), "ASP"),
    **dict.fromkeys("GLH GLUH GLUP".split(), "GLU"),
    **dict.fromkeys("LYN LYSH LSN LYP MLY KCX".split(), "LYS"),
    **dict.fromkeys("ARN".split(), "ARG"),
    **dict.fromkeys("TYM".split(), "TYR"),
    "MSE": "MET",
    "TPO": "THR",
    "SEP": "SER",
    "PTR": "TYR",
    "HYP": "PRO",
    "CSO": "CYS",
    "CME": "CYS",
    "CSD": "CYS",
    "OCS": "CYS",
    "MEN": "ASN",
    "PCA": "GLU",
    "SCY": "CYS",
    "CSX": "CYS",
    "FME": "MET",
    "AIB": "ALA",
    "NLE": "LEU",
    "NEP": "HIS",
    "HIC": "HIS",
    "ALY": "LYS",
    "M3L": "LYS",
    "MLZ": "LYS",
    "CGU": "GLU",
    "CSE": "SEC",
    # D-amino acids
    "DAL": "ALA", "DAR": "ARG", "DSG": "ASN", "DAS": "ASP", "DCY": "CYS", "DGN": "GLN", "DGL": "GLU",
    "DHI": "HIS", "DIL": "ILE", "DLE": "LEU", "DLY": "LYS", "MED": "MET", "DPN": "PHE", "DPR": "PRO",
    "DSN": "SER", "DTH": "THR", "DTR": "TRP", "DTY": "TYR", "DVA": "VAL",
}

#: Residue names of water across the PDB and the common MD packages.
WATER_RESNAMES = frozenset(
    "HOH WAT H2O DOD D2O SOL TIP TIP2 TIP3 TIP4 TIP5 TIP3P TIP4P TIP5P T3P T4P T5P SPC SPCE SPC/E "
    "OPC OPC3 TP3 HO4 W".split()
)


# Two-letter element symbols that PDB atom names of ions and ligands start with. Kept short on
# purpose: only symbols that occur in biomolecular files, so that e.g. "CD" (a carbon in a side
# chain) is never read as cadmium outside the HETATM/unknown-residue case below.
_TWO_LETTER_ELEMENTS = frozenset(
    "HE LI BE NE NA MG AL SI CL AR CA SC TI CR MN FE CO NI CU ZN GA GE AS SE BR KR RB SR ZR MO RU RH PD "
    "AG CD IN SN SB TE XE CS BA LA CE GD YB W PT AU HG TL PB BI".split()
)
#: Element symbols of virtual sites (TIP4P/TIP5P charge sites, lone pairs): not atoms of any element,
#: so never heavy atoms. Loaders give them ""; the others are what files write in the element column.
VIRTUAL_SITE_ELEMENTS = frozenset({"", "VS", "M", "EP", "LP"})
# Virtual-site names of water models (GROMACS MW, CHARMM OM, Amber EPW/EP1/EP2, TIP5P LP1/LP2).
_WATER_SITE_NAMES = frozenset("MW MW1 MW2 M OM EP EPW EP1 EP2 LP LP1 LP2".split())


def is_virtual_site(name: str, resname: str) -> bool:
    """Whether the atom ``name`` of residue ``resname`` is a virtual site (no element): a water
    model's charge site or lone pair, or any atom named LP*/EP* outside polymers (CHARMM Drude lone
    pairs, Amber extra points).

    Examples
    --------
    >>> is_virtual_site("MW", "SOL"), is_virtual_site("LP1", "ETH"), is_virtual_site("CA", "ALA")
    (True, True, False)
    """
    n, r = name.strip().upper(), resname.strip().upper()
    if r in WATER_RESNAMES:
        return n in _WATER_SITE_NAMES
    return n.startswith(("LP", "EP")) and NONSTANDARD_RESNAMES.get(r, r) not in AMINO_ACIDS


_ONE_LETTER_ELEMENTS = frozenset("H D C N O S P F K I B V U W Y".split())
# Single-atom ion residues of CHARMM/AMBER whose atom name does not spell the element.
_ION_RESNAMES = {
    "SOD": "NA",
    "NA+": "NA",
    "CLA": "CL",
    "CL-": "CL",
    "POT": "K",
    "K+": "K",
    "CAL": "CA",
    "CES": "CS",
    "LIT": "LI",
    "ZN2": "ZN",
    "MG2": "MG",
    "RUB": "RB",
}


def standardize_resnames(resname: np.ndarray) -> np.ndarray:
    """Map residue names to standard amino-acid names where a mapping is known.

    Parameters
    ----------
    resname : np.ndarray of str, shape (n,)
        Residue names as found in a file (e.g. ``"HSD"``, ``"MSE"``, ``"ALA"``).

    Returns
    -------
    np.ndarray of str, shape (n,)
        ``resname`` with the names in :data:`NONSTANDARD_RESNAMES` replaced by their parent amino acid
        (``HSD`` -> ``HIS``, ``CYX`` -> ``CYS``, ``MSE`` -> ``MET``, ...); other names unchanged.

    Examples
    --------
    >>> import numpy as np
    >>> standardize_resnames(np.array(["HSD", "MSE", "ALA", "CYX", "HOH"])).tolist()
    ['HIS', 'MET', 'ALA', 'CYS', 'HOH']
    """
    resname = np.asarray(resname, dtype=str)
    if resname.size == 0:
        return resname.copy()
    # Map the (few) distinct names, then broadcast back: no per-atom Python work.
    uniq, inverse = np.unique(resname, return_inverse=True)
    mapped = np.array([NONSTANDARD_RESNAMES.get(str(u).upper(), str(u)) for u in uniq], dtype=str)
    return mapped[inverse.reshape(resname.shape)]


def _guess_one_element(padded_name: str, resname: str) -> str:
    """Element symbol of one atom from its (PDB-padded, 4-character) name and residue name."""
    name = padded_name.strip().upper()
    letters = name.lstrip("0123456789")
    res = resname.strip().upper()
    if is_virtual_site(name, res):
        return ""
    if res in _ION_RESNAMES:
        return _ION_RESNAMES[res]
    if not letters:
        return "X"
    std = NONSTANDARD_RESNAMES.get(res, res)
    if std in AMINO_ACIDS or res in WATER_RESNAMES:
        # Polymer and water atom names start with their element (CA is C-alpha, HG12 a hydrogen);
        # the exception is selenium of selenomethionine.
        if letters.startswith("SE") and res in ("MSE", "SEC"):
            return "SE"
        return letters[0]
    two = letters[:2]
    # A single-atom residue named like its atom ("ZN"/"ZN", "CL"/"CL") is that ion; otherwise the
    # PDB convention puts two-letter elements at the name's first column (no leading blank).
    if two in _TWO_LETTER_ELEMENTS and (name == res or (padded_name[:1] not in " 0123456789")):
        if len(letters) <= 2 or letters[0] not in "CHNOS" or name == res:
            return two
    if letters[0] in _ONE_LETTER_ELEMENTS:
        return letters[0]
    return two if two in _TWO_LETTER_ELEMENTS else "X"


def guess_elements(names: np.ndarray, resnames: np.ndarray) -> np.ndarray:
    """Guess upper-case element symbols from atom and residue names.

    Used where a file has no element column. Names are read as the PDB pads them: a name whose
    first column is blank or a digit has a one-letter element (``" CA "`` is carbon); a name that
    starts in the first column may be a two-letter element (``"FE  "``, ``"CL  "``). Atoms of amino
    acids and water always take the first letter (``"HG12"`` is hydrogen), except selenium of MSE.

    Parameters
    ----------
    names : np.ndarray of str, shape (n,)
        Atom names, ideally padded to 4 characters as in PDB columns 13-16.
    resnames : np.ndarray of str, shape (n,)
        Residue names.

    Returns
    -------
    np.ndarray of str, shape (n,)
        Element symbols such as ``"C"``, ``"SE"``, ``"ZN"``; ``"X"`` when nothing fits.

    Examples
    --------
    A protein's CA is carbon, a calcium ion's CA is calcium; ``HG1`` of leucine is hydrogen:

    >>> import numpy as np
    >>> names = np.array([" CA ", "CA  ", " HG1", "FE  ", "SE  "])
    >>> resnames = np.array(["ALA", "CA", "LEU", "HEM", "MSE"])
    >>> guess_elements(names, resnames).tolist()
    ['C', 'CA', 'H', 'FE', 'SE']
    """
    names = np.asarray(names, dtype=str)
    resnames = np.asarray(resnames, dtype=str)
    if names.size == 0:
        return np.zeros(0, dtype="<U2")
    # Distinct (name, resname) pairs are few even in big systems: guess once per pair.
    pairs = np.char.add(np.char.add(names, "\x1f"), resnames)
    uniq, inverse = np.unique(pairs, return_inverse=True)
    guessed = []
    for p in uniq.tolist():
        n, r = p.split("\x1f", 1)
        guessed.append(_guess_one_element(n, r))
    return np.array(guessed, dtype=str)[inverse.reshape(names.shape)]
