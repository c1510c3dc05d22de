"""pg.map_chains: chains by sequence, equivalent chains by the best global score, residues by a
semi-global alignment (OpenStructure's chain mapper)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.scoring import _mapping as mp


def _homodimer(datasets, tmp_path, *, swap: bool, shift: float = 40.0, name: str = "dimer.pdb"):
    """adenylate kinase twice (chain A, and chain B shifted along x); with ``swap`` the chain letters of
    the two copies are exchanged, so the model's chain A sits where the reference's chain B is."""
    lines = [ln for ln in (datasets / "adk_open.pdb").read_text().splitlines() if ln.startswith("ATOM")]
    first, second = ("B", "A") if swap else ("A", "B")
    out = []
    for chain, dx in ((first, 0.0), (second, shift)):
        for ln in lines:
            x = float(ln[30:38]) + dx
            out.append(f"{ln[:21]}{chain}{ln[22:30]}{x:8.3f}{ln[38:]}")
        out.append("TER")
    if swap:  # file order A then B, whatever their positions
        out = out[len(lines) + 1:] + out[:len(lines) + 1]
    path = tmp_path / name
    path.write_text("\n".join(out) + "\nEND\n")
    return path


def test_1eud_chains_and_residues(eud):
    model, ref = eud
    m = pg.map_chains(model, ref)
    assert m.chains == {"A": "A", "B": "B"}
    assert m.groups == [["A"], ["B"]]
    assert m.identity["A"] == 100.0 and m.identity["B"] == pytest.approx(100 * 240 / 241)
    assert {c: len(p) for c, p in m.residues.items()} == {"A": 290, "B": 241}
    assert m.unmapped_model == []


def test_alignment_is_semiglobal(eud):
    """The model's chain B starts at LNLQEY, the reference's at MVNLQEY: with free end gaps model L39
    pairs with reference V2 (one mismatch); a global alignment pays a cheaper mismatch L/M plus an inner
    gap and shifts the first residue onto M1 (what OpenStructure's SemiGlobalAlign avoids)."""
    model, ref = eud
    m = pg.map_chains(model, ref)
    mi, ri = mp.residue_info(pg.load(model)), mp.residue_info(pg.load(ref))
    p = m.residues["B"]
    assert (mi.resid[p[0, 0]], ri.resid[p[0, 1]]) == (39, 2)
    assert np.all(np.diff(ri.resid[p[:, 1]]) == 1)


def test_residue_pairs_feed_the_scorers(eud):
    model, ref = eud
    m = pg.map_chains(model, ref)
    pairs = m.residue_pairs()
    assert pairs.shape == (531, 2) and np.all(np.diff(pairs[:, 1]) > 0)
    assert 0.6 < pg.lddt(model, ref, atoms="ca", mapping=pairs, device="cpu") < 0.65


def test_homomer_swapped_chains_are_reassigned(datasets, tmp_path):
    ref = _homodimer(datasets, tmp_path, swap=False, name="ref.pdb")
    model = _homodimer(datasets, tmp_path, swap=True, name="model.pdb")
    m = pg.map_chains(model, ref)
    assert m.groups == [["A", "B"]]
    assert m.chains == {"A": "B", "B": "A"}
    assert m.score == pytest.approx(1.0)
    same = pg.map_chains(ref, ref)
    assert same.chains == {"A": "A", "B": "B"}


def test_homomer_greedy_when_too_many_assignments(datasets, tmp_path):
    ref = _homodimer(datasets, tmp_path, swap=False, name="ref.pdb")
    model = _homodimer(datasets, tmp_path, swap=True, name="model.pdb")
    m = pg.map_chains(model, ref, max_naive=1)
    assert m.chains == {"A": "B", "B": "A"}


def test_explicit_chain_mapping(eud):
    model, ref = eud
    m = pg.map_chains(model, ref, chain_mapping={"A": "A"})
    assert m.chains == {"A": "A"} and m.unmapped_model == ["B"]
    with pytest.raises(pg.InputError, match=r"^1eud_mdl_partial-dimer.pdb: chain_mapping names model chain 'Z'"):
        pg.map_chains(model, ref, chain_mapping={"A": "Z"})
    with pytest.raises(pg.InputError, match="reference chain 'Q'"):
        pg.map_chains(model, ref, chain_mapping={"Q": "A"})
    with pytest.raises(pg.InputError, match="chain_mapping must be"):
        pg.map_chains(model, ref, chain_mapping="best")


def test_unmappable_model_is_one_line_naming_file_and_chains(datasets, eud):
    _, ref = eud
    with pytest.raises(pg.InputError) as e:
        pg.map_chains(datasets / "adk_open.pdb", ref, min_identity=50)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("adk_open.pdb: no model chain maps to the reference 1eud_ref.pdb")
    assert "model chains ['4AKE']" in msg and "reference chains ['A', 'B']" in msg


def test_array_model_takes_the_reference_topology(datasets):
    ref = pg.load(datasets / "adk_open.pdb")
    m = pg.map_chains(ref.coords[0] + 1.0, ref)
    assert m.chains == {"4AKE": "4AKE"} and len(m.residues["4AKE"]) == ref.n_residues
    with pytest.raises(pg.InputError, match="must have its 3341 atoms, got 5"):
        pg.map_chains(np.zeros((5, 3)), ref)


def test_bad_min_identity(eud):
    with pytest.raises(pg.InputError, match="min_identity"):
        pg.map_chains(*eud, min_identity=150)


def test_a_handful_of_aligned_residues_maps_nothing(datasets, eud):
    """Adenylate kinase aligns 5 residues to 1EUD's chain A at 40 % identity (semi-global, free end
    gaps): above min_identity, but too few aligned residues for the identity to mean anything."""
    _, ref = eud
    with pytest.raises(pg.InputError, match="fewer than 10 aligned residues"):
        pg.map_chains(datasets / "adk_open.pdb", ref)


def test_a_peptide_maps_on_half_its_length(eud):
    """A 6-residue piece of chain B (beside all of chain A) maps: the aligned-residue floor is half the
    shorter chain for peptides."""
    _, ref = eud
    s = pg.load(ref)
    b_res = np.unique(s.atoms.residue_index[s.atoms.chain == "B"])[100:106]
    keep = np.flatnonzero((s.atoms.chain == "A") | np.isin(s.atoms.residue_index, b_res))
    cm = pg.map_chains(s.select(keep), ref)
    assert cm.chains == {"A": "A", "B": "B"} and len(cm.residues["B"]) == 6
