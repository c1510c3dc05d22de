"""Model confidence: readers of predictor files (synthetic files in each documented layout, one real
AlphaFold 3 summary) and the derived interface scores against values computed here from the papers'
formulas, term by term."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import protgpu as pg
from protgpu.complexes import confidence as cf
from protgpu.complexes import interface_confidence, ipsae, lis, pdockq, pdockq2, read_confidence
from protgpu.errors import InputError

DATA = Path(__file__).resolve().parents[2] / "datasets"


def _pdb(path: Path, chains: dict, bfac) -> Path:
    """A PDB of CA + CB atoms (GLY: CA only) per residue along x, B-factors from ``bfac(k)``."""
    lines, k, serial = [], 0, 1
    for ch, (names, offset) in chains.items():
        for r, rn in enumerate(names, start=1):
            for at, dy in (("CA", 0.0), ("CB", 1.5)):
                if at == "CB" and rn == "GLY":
                    continue
                x, y, z = 3.8 * r, offset + dy, 0.0
                lines.append(f"ATOM  {serial:5d}  {at:<3s} {rn} {ch}{r:4d}    {x:8.3f}{y:8.3f}{z:8.3f}  1.00"
                             f"{bfac(k):6.2f}           C")
                serial += 1
            k += 1
    path.write_text("\n".join(lines) + "\nEND\n")
    return path


def test_bfactor_scales_told_apart(tmp_path):
    chains = {"A": (["ALA", "GLY", "SER"], 0.0)}
    p100 = _pdb(tmp_path / "af2.pdb", chains, lambda k: [91.0, 42.0, 70.0][k])
    p1 = _pdb(tmp_path / "esm.pdb", chains, lambda k: [0.91, 0.42, 0.70][k])
    c100, c1 = read_confidence(p100), read_confidence(p1)
    assert c100.format == "bfactor"
    np.testing.assert_allclose(c100.plddt, [91.0, 42.0, 70.0])
    np.testing.assert_allclose(c1.plddt, [91.0, 42.0, 70.0], atol=1e-4)
    assert c100.atom_plddt.shape == (5,)  # CA + CB, CA, CA + CB


def test_bfactor_out_of_range_is_one_line(tmp_path):
    p = _pdb(tmp_path / "xtal.pdb", {"A": (["ALA"], 0.0)}, lambda k: 120.0)
    with pytest.raises(InputError, match=r"xtal\.pdb: B-factors span .* not pLDDT") as e:
        read_confidence(p)
    assert "\n" not in str(e.value)


def test_bfactor_mmcif(tmp_path):
    import gemmi

    p = _pdb(tmp_path / "m.pdb", {"A": (["ALA", "GLY"], 0.0), "B": (["LYS"], 6.0)}, lambda k: 50.0 + k)
    st = gemmi.read_structure(str(p))
    st.setup_entities()
    cif = tmp_path / "m.cif"
    st.make_mmcif_document().write_file(str(cif))
    np.testing.assert_allclose(read_confidence(cif).plddt, [50.0, 51.0, 52.0])


def _af3(folder: Path, n_a=3, n_b=2, stem="fold_x"):
    rng = np.random.default_rng(0)
    n = n_a + n_b
    full = {"atom_chain_ids": ["A"] * (2 * n_a) + ["B"] * (2 * n_b),
            "atom_plddts": rng.uniform(30, 95, 2 * n).round(2).tolist(),
            "pae": rng.uniform(0.5, 30, (n, n)).round(2).tolist(),
            "token_chain_ids": ["A"] * n_a + ["B"] * n_b,
            "token_res_ids": list(range(1, n_a + 1)) + list(range(1, n_b + 1))}
    summary = {"chain_iptm": [0.6, 0.61], "chain_pair_iptm": [[0.8, 0.6], [0.6, 0.7]], "chain_ptm": [0.8, 0.7],
               "iptm": 0.6, "ptm": 0.75, "ranking_score": 0.66, "has_clash": 0.0, "fraction_disordered": 0.0,
               "num_recycles": 10.0}
    (folder / f"{stem}_full_data_0.json").write_text(json.dumps(full))
    (folder / f"{stem}_summary_confidences_0.json").write_text(json.dumps(summary))
    return full, summary


def test_af3_pair_read_from_either_file_and_folder(tmp_path):
    full, summary = _af3(tmp_path)
    for src in (tmp_path, tmp_path / "fold_x_full_data_0.json", tmp_path / "fold_x_summary_confidences_0.json"):
        c = read_confidence(src)
        assert c.format == "af3" and len(c.files) == 2
        assert (c.ptm, c.iptm) == (0.75, 0.6)
        np.testing.assert_array_equal(c.pae, np.asarray(full["pae"]))
        assert c.chain_pair_iptm[("A", "B")] == 0.6 and c.chain_ptm == {"A": 0.8, "B": 0.7}
        assert c.extra["ranking_score"] == 0.66


def test_af3_per_residue_plddt_from_atoms_with_structure(tmp_path):
    full, _ = _af3(tmp_path, n_a=3, n_b=2)
    model = _pdb(tmp_path / "fold_x_model_0.pdb", {"A": (["ALA"] * 3, 0.0), "B": (["SER"] * 2, 6.0)}, lambda k: 0.0)
    c = read_confidence(tmp_path, structure=model)
    atom = np.asarray(full["atom_plddts"])
    np.testing.assert_allclose(c.plddt, atom[0::2])  # the CA of each (CA, CB) residue


def test_real_af3_summary():
    c = read_confidence(DATA / "confidence" / "fold_5b8c_summary_confidences_0.json")
    assert (c.ptm, c.iptm) == (0.87, 0.82)
    assert c.chains == ["0", "1", "2"] and c.chain_pair_iptm[("1", "2")] == 0.9
    assert c.extra["ranking_score"] == 0.86


def test_files_are_read_as_every_input_is(tmp_path):
    # through protgpu's file reader: a gzipped file is read, a named pipe refused at once (no hang)
    import gzip
    import os

    src = DATA / "confidence" / "fold_5b8c_summary_confidences_0.json"
    gz = tmp_path / "fold_x_summary_confidences_0.json"
    gz.write_bytes(gzip.compress(src.read_bytes()))  # compression is recognised by content
    assert read_confidence(gz).ptm == read_confidence(src).ptm
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fold_y_summary_confidences_0.json"
        os.mkfifo(fifo)
        with pytest.raises(InputError, match="not a regular file"):
            read_confidence(fifo)


def test_boltz_files(tmp_path):
    rng = np.random.default_rng(1)
    pae = rng.uniform(0, 25, (4, 4)).astype(np.float32)
    np.savez(tmp_path / "pae_des_model_0.npz", pae=pae)
    np.savez(tmp_path / "plddt_des_model_0.npz", plddt=np.array([0.9, 0.8, 0.5, 0.25], np.float32))
    (tmp_path / "confidence_des_model_0.json").write_text(json.dumps({
        "confidence_score": 0.8, "ptm": 0.7, "iptm": 0.5, "complex_plddt": 0.61,
        "chains_ptm": {"0": 0.9, "1": 0.4},
        "pair_chains_iptm": {"0": {"0": 0.9, "1": 0.5}, "1": {"0": 0.55, "1": 0.4}}}))
    model = _pdb(tmp_path / "des_model_0.pdb", {"A": (["ALA"] * 2, 0.0), "B": (["SER"] * 2, 6.0)}, lambda k: 0.0)
    c = read_confidence(tmp_path / "pae_des_model_0.npz", structure=model)
    assert c.format == "boltz" and len(c.files) == 3
    np.testing.assert_allclose(c.plddt, [90, 80, 50, 25], rtol=1e-6)
    np.testing.assert_allclose(c.pae, pae)
    assert c.chain_pair_iptm[("B", "A")] == 0.55 and c.chain_ptm == {"A": 0.9, "B": 0.4}


def test_chai_scores(tmp_path):
    np.savez(tmp_path / "scores.model_idx_0.npz", aggregate_score=np.array([0.7]), ptm=np.array([0.8]),
             iptm=np.array([0.6]), per_chain_ptm=np.array([[0.8, 0.7]]),
             per_chain_pair_iptm=np.array([[[0.8, 0.6], [0.62, 0.7]]]), has_inter_chain_clashes=np.array([False]))
    c = read_confidence(tmp_path)
    assert c.format == "chai" and (c.ptm, c.iptm) == (0.8, 0.6)
    assert c.chain_pair_iptm[("1", "0")] == 0.62 and c.extra["aggregate_score"] == 0.7


def test_colabfold_scores(tmp_path):
    p = tmp_path / "x_scores_rank_001.json"
    p.write_text(json.dumps({"plddt": [80.0, 70.0], "pae": [[0.2, 5.0], [6.0, 0.3]], "ptm": 0.5, "max_pae": 31.75}))
    c = read_confidence(p)
    assert c.format == "colabfold" and c.ptm == 0.5 and c.iptm is None
    np.testing.assert_allclose(c.plddt, [80, 70])


def test_mismatch_names_both_files(tmp_path):
    _af3(tmp_path, n_a=3, n_b=2)
    model = _pdb(tmp_path / "other.pdb", {"A": (["ALA"] * 4, 0.0), "B": (["SER"] * 2, 6.0)}, lambda k: 0.0)
    with pytest.raises(InputError) as e:
        read_confidence(tmp_path / "fold_x_full_data_0.json", structure=model)
    msg = str(e.value)
    assert "fold_x_full_data_0.json" in msg and "other.pdb" in msg and "\n" not in msg
    one_chain = _pdb(tmp_path / "mono.pdb", {"A": (["ALA"] * 5, 0.0)}, lambda k: 0.0)
    with pytest.raises(InputError, match=r"fold_x_full_data_0\.json: 2 chains but .*mono\.pdb has 1"):
        read_confidence(tmp_path / "fold_x_full_data_0.json", structure=one_chain)


def test_folder_errors(tmp_path):
    with pytest.raises(InputError, match="no AlphaFold 3, Boltz, Chai"):
        read_confidence(tmp_path)
    _af3(tmp_path, stem="a")
    _af3(tmp_path, stem="b")
    with pytest.raises(InputError, match="2 models"):
        read_confidence(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        read_confidence(tmp_path / "missing.json")


# ---- derived scores: each checked against the formula written out here, loop by loop -------------

def _d0(n):
    n = max(n, 27)
    return max(1.24 * (n - 15) ** (1 / 3) - 1.8, 1.0)


def test_ipsae_matches_definition():
    rng = np.random.default_rng(3)
    chains = np.array(["A"] * 5 + ["B"] * 4)
    pae = rng.uniform(0, 20, (9, 9))
    got = ipsae(pae, chains, pae_cutoff=10.0)
    for a, b in (("A", "B"), ("B", "A")):
        best = 0.0
        for i in np.flatnonzero(chains == a):
            js = [j for j in np.flatnonzero(chains == b) if pae[i, j] < 10.0]
            if js:
                d0 = _d0(len(js))
                best = max(best, sum(1 / (1 + (pae[i, j] / d0) ** 2) for j in js) / len(js))
        assert got[a, b] == pytest.approx(best, rel=1e-12)
    # d0 of fewer than 27 residues is d0(27) = 1.24 * 12^(1/3) - 1.8
    assert cf._d0(5) == pytest.approx(1.24 * 12 ** (1 / 3) - 1.8)
    assert ipsae(np.full((4, 4), 30.0), ["A", "A", "B", "B"])["A", "B"] == 0.0


def test_lis_matches_definition():
    chains = ["A", "A", "B"]
    pae = np.array([[0, 1, 3.0], [1, 0, 13.0], [6.0, 12.0, 0]])
    got = lis(pae, chains)
    assert got["A", "B"] == pytest.approx((12 - 3) / 12)  # 13 > 12 is left out
    assert got["B", "A"] == pytest.approx(((12 - 6) / 12 + 0.0) / 2)  # 12 <= 12 counts, as 0


def _two_chain_geometry():
    # A: residues at x = 0, 4, 30; B: residues at x = 0, 7 (y = 6) and 40 -> contacts (<= 8 A):
    # A0-B0 (6), A0-B1 (9.2: no), A1-B0 (7.2), A1-B1 (6.7)
    coords = np.array([[0, 0, 0], [4, 0, 0], [30, 0, 0], [0, 6, 0], [7, 6, 0], [40, 6, 0]], float)
    chains = np.array(["A", "A", "A", "B", "B", "B"])
    plddt = np.array([90.0, 80.0, 20.0, 70.0, 60.0, 10.0])
    return coords, chains, plddt


def test_pdockq_matches_definition():
    coords, chains, plddt = _two_chain_geometry()
    d = np.linalg.norm(coords[:3, None] - coords[None, 3:], axis=-1)
    contacts = np.argwhere(d <= 8.0)
    n = len(contacts)
    assert n == 3
    mean = np.mean(np.concatenate([plddt[:3][np.unique(contacts[:, 0])], plddt[3:][np.unique(contacts[:, 1])]]))
    x = mean * math.log10(n)
    want = 0.724 / (1 + math.exp(-0.052 * (x - 152.611))) + 0.018
    got = pdockq(coords, plddt, chains)
    assert got["A", "B"] == pytest.approx(want, rel=1e-12) and got["B", "A"] == pytest.approx(want, rel=1e-12)
    far = coords.copy()
    far[3:, 1] += 100
    assert pdockq(far, plddt, chains)["A", "B"] == 0.0


def test_pdockq2_matches_definition():
    coords, chains, plddt = _two_chain_geometry()
    rng = np.random.default_rng(5)
    pae = rng.uniform(1, 20, (6, 6))
    d = np.linalg.norm(coords[:3, None] - coords[None, 3:], axis=-1)
    contacts = np.argwhere(d <= 8.0)
    term = np.mean([1 / (1 + (pae[i, 3 + j] / 10.0) ** 2) for i, j in contacts])
    mean = np.mean(np.concatenate([plddt[:3][np.unique(contacts[:, 0])], plddt[3:][np.unique(contacts[:, 1])]]))
    want = 1.31 / (1 + math.exp(-0.075 * (term * mean - 84.733))) + 0.005
    assert pdockq2(coords, plddt, pae, chains)["A", "B"] == pytest.approx(want, rel=1e-12)


def test_interface_confidence_rows(tmp_path):
    # A real dimer (1eud model) with synthetic confidence: scores come out per ordered pair and equal
    # the array functions on the CB (CA for GLY) atoms.
    s = pg.load(DATA / "openstructure" / "1eud_mdl_partial-dimer.pdb")
    rep = cf.representative_atoms(s)
    keep = rep >= 0
    n = s.n_residues
    rng = np.random.default_rng(7)
    conf = cf.Confidence(plddt=rng.uniform(40, 95, n), pae=rng.uniform(0, 30, (n, n)))
    rows = interface_confidence(s, conf)
    pairs = {(r["chain_1"], r["chain_2"]): r for r in rows}
    chains = s.residues.chain[keep]
    idx = np.flatnonzero(keep)
    want = ipsae(conf.pae[np.ix_(idx, idx)], chains)
    for (a, b), r in pairs.items():
        assert r["ipsae"] == pytest.approx(want[a, b])
        assert r["ipsae_max"] == pytest.approx(max(want[a, b], want[b, a]))
        assert 0.018 <= r["pdockq"] <= 0.742 or r["pdockq"] == 0.0
        assert r["lis_mean"] == pytest.approx((r["lis"] + pairs[b, a]["lis"]) / 2)


def test_tokens_count_ligand_atoms_and_skip_water(tmp_path):
    p = _pdb(tmp_path / "lig.pdb", {"A": (["ALA", "GLY"], 0.0)}, lambda k: 50.0)
    text = p.read_text().replace("END\n", "")
    text += ("HETATM   10  C1  LIG A 101      20.000   0.000   0.000  1.00 50.00           C\n"
             "HETATM   11  O1  LIG A 101      21.000   0.000   0.000  1.00 50.00           O\n"
             "HETATM   12  N1  LIG A 101      20.000   1.000   0.000  1.00 50.00           N\n"
             "HETATM   13  O   HOH A 201      30.000   0.000   0.000  1.00 50.00           O\nEND\n")
    p.write_text(text)
    s = pg.load(p)
    np.testing.assert_array_equal(cf.residue_tokens(s), [0, 1, 2, -1])  # ALA, GLY, LIG (3 atoms), water
    np.savez(tmp_path / "pae_lig_model_0.npz", pae=np.zeros((5, 5)))
    assert read_confidence(tmp_path / "pae_lig_model_0.npz", structure=s).pae.shape == (5, 5)
    np.savez(tmp_path / "pae_lig_model_0.npz", pae=np.zeros((6, 6)))
    with pytest.raises(InputError, match=r"6 PAE rows but .*lig\.pdb has 5 tokens \(4 residues\)"):
        read_confidence(tmp_path / "pae_lig_model_0.npz", structure=s)
