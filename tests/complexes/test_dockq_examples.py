"""pg.score_complex's DockQ against DockQ's own published example: the 1A2K pair of DockQ's README
(bjornwallner/DockQ ``examples/1A2K_r_l_b*.pdb``, datasets/dockq/, datasets/PROVENANCE.md)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg

MODEL, NATIVE = "1A2K_r_l_b.model.pdb.gz", "1A2K_r_l_b.pdb.gz"

# DockQ's README, ``DockQ examples/1A2K_r_l_b.model.pdb examples/1A2K_r_l_b.pdb``:
# "Total DockQ over 3 native interfaces: 0.653 with BAC:ABC model:native mapping", then per native
# interface (model chains in brackets) DockQ, iRMSD, LRMSD, fnat, fnonnat, F1, printed to 3 decimals.
README_TOTAL = 0.653
README_MAPPING = {"A": "B", "B": "A", "C": "C"}  # native chain -> model chain ("BAC:ABC")
README = {  # native interface: (dockq, irmsd, lrmsd, fnat, fnonnat, f1)
    ("A", "B"): (0.994, 0.000, 0.000, 0.983, 0.008, 0.987),  # model B, A
    ("A", "C"): (0.511, 1.237, 6.864, 0.333, 0.000, 0.500),  # model B, C
    ("B", "C"): (0.453, 2.104, 8.131, 0.500, 0.107, 0.641),  # model A, C
}

# DockQ's README, Python API example: run_on_all_native_interfaces(model, native,
# chain_map={"A": "A", "B": "B"}) on the same files, printed at full precision (an earlier DockQ v2).
README_API_AB = {"dockq": 0.9425398964102757, "irmsd": 0.3753064373774967,
                 "lrmsd": 0.5535111803522507, "fnat": 106 / 119, "fnonnat": 12 / 118,
                 "nnat": 119, "nmdl": 118}

# DockQ 2.1.3 (PyPI) on these files (``--json``), computed for this test: GlobalDockQ, and per native
# interface DockQ, iRMSD, LRMSD, nat_total, model_total (DockQ's float32 coordinates: its RMSDs differ
# from protgpu's float64 ones by up to 5e-5 A, its DockQ by up to 1e-6).
DOCKQ_213_GLOBAL = 0.6529108576461689
DOCKQ_213 = {
    ("A", "B"): (0.9943977591032992, 1.4879852993911616e-06, 1.7561467431420824e-06, 119, 118),
    ("A", "C"): (0.5112803577991729, 1.2369153344265127, 6.8643675801712165, 3, 1),
    ("B", "C"): (0.4530544560360343, 2.103856735883947, 8.131498538876196, 50, 28),
}
# ... and its API example, chain map A:A, B:B (the README's numbers above, to within 2e-7).
DOCKQ_213_API_AB = {"dockq": 0.9425399167707744, "irmsd": 0.37530623885751874,
                    "lrmsd": 0.5535110205621364}
# DockQ 2.1.3 again with its superpositions in float64 (Bio.SVDSuperimposer fed float64 copies of its
# float32 coordinates; contacts unchanged): per native interface DockQ, iRMSD, LRMSD, and the API
# example's AB. The float32 arithmetic was the whole difference: these agree with protgpu to 1e-12.
DOCKQ_213_FLOAT64 = {
    ("A", "B"): (0.9943977591036415, 8.939206062037087e-15, 7.644907324734097e-15),
    ("A", "C"): (0.5112812082908073, 1.2369151888595733, 6.864331741815745),
    ("B", "C"): (0.4530554540297315, 2.103856809018143, 8.131449499067282),
}
DOCKQ_213_FLOAT64_API_AB = (0.9425399150284584, 0.37530624865934215, 0.5535111739847302)


# device="cpu": the float64 host path, whose numbers the 1e-9 comparisons below pin; the GPU path is
# tested against it in tests/complexes/test_complex_gpu.py.
@pytest.fixture(scope="module")
def table(datasets):
    d = datasets / "dockq"
    return pg.score_complex(d / MODEL, d / NATIVE, metrics=("dockq",), device="cpu")


@pytest.fixture(scope="module")
def table_ab(datasets):
    d = datasets / "dockq"
    return pg.score_complex(d / MODEL, d / NATIVE, metrics=("dockq",), chain_mapping={"A": "A", "B": "B"},
                            device="cpu")


def _per_interface(table, name):
    return {iface: float(table[name][0, i]) for i, iface in enumerate(table["interfaces"])}


def _f1(fnat, fnonnat):
    """DockQ's F1: recall fnat, precision 1 - fnonnat."""
    precision = 1.0 - fnonnat
    return 2 * fnat * precision / (fnat + precision)


def test_1a2k_mapping_and_interfaces(table):
    assert table["chain_mapping"][0].chains == README_MAPPING
    assert sorted(table["interfaces"]) == sorted(README)


def test_1a2k_total_dockq_as_printed(table):
    assert round(float(table["dockq"][0]), 3) == pytest.approx(README_TOTAL, abs=1e-9)


@pytest.mark.parametrize("iface", list(README))
def test_1a2k_interface_as_printed(table, iface):
    dockq, irmsd, lrmsd, fnat, fnonnat, f1 = README[iface]
    got = {name: _per_interface(table, name)[iface]
           for name in ("dockq_per_interface", "irmsd", "lrmsd", "fnat", "fnonnat")}
    assert round(got["dockq_per_interface"], 3) == pytest.approx(dockq, abs=1e-9)
    assert round(got["irmsd"], 3) == pytest.approx(irmsd, abs=1e-9)
    assert round(got["lrmsd"], 3) == pytest.approx(lrmsd, abs=1e-9)
    assert round(got["fnat"], 3) == pytest.approx(fnat, abs=1e-9)
    assert round(got["fnonnat"], 3) == pytest.approx(fnonnat, abs=1e-9)
    assert round(_f1(got["fnat"], got["fnonnat"]), 3) == pytest.approx(f1, abs=1e-9)


def test_1a2k_agrees_with_dockq_213(table):
    assert float(table["dockq"][0]) == pytest.approx(DOCKQ_213_GLOBAL, abs=2e-6)
    for iface, (dockq, irmsd, lrmsd, nnat, nmdl) in DOCKQ_213.items():
        assert _per_interface(table, "dockq_per_interface")[iface] == pytest.approx(dockq, abs=2e-6)
        assert _per_interface(table, "irmsd")[iface] == pytest.approx(irmsd, abs=1e-4)
        assert _per_interface(table, "lrmsd")[iface] == pytest.approx(lrmsd, abs=1e-4)
        assert _per_interface(table, "nnat")[iface] == nnat
        assert _per_interface(table, "nmdl")[iface] == nmdl


def test_1a2k_agrees_with_dockq_213_in_float64(table, table_ab):
    names = ("dockq_per_interface", "irmsd", "lrmsd")
    for iface, want in DOCKQ_213_FLOAT64.items():
        got = [_per_interface(table, name)[iface] for name in names]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    got = [_per_interface(table_ab, name)[("A", "B")] for name in names]
    np.testing.assert_allclose(got, DOCKQ_213_FLOAT64_API_AB, rtol=1e-9, atol=1e-9)


def test_1a2k_api_example_chain_map_ab(table_ab):
    """The README's API example: native A, B scored against model A, B (the other assignment of the homodimer A, B)."""
    assert table_ab["chain_mapping"][0].chains == {"A": "A", "B": "B"}
    got = {name: _per_interface(table_ab, name)[("A", "B")]
           for name in ("dockq_per_interface", "irmsd", "lrmsd", "fnat", "fnonnat", "nnat", "nmdl")}
    assert got["nnat"] == README_API_AB["nnat"] and got["nmdl"] == README_API_AB["nmdl"]
    assert got["fnat"] == pytest.approx(README_API_AB["fnat"], rel=1e-12)
    assert got["fnonnat"] == pytest.approx(README_API_AB["fnonnat"], rel=1e-12)
    for name, key in (("dockq_per_interface", "dockq"), ("irmsd", "irmsd"), ("lrmsd", "lrmsd")):
        assert got[name] == pytest.approx(README_API_AB[key], rel=1e-6)
        assert got[name] == pytest.approx(DOCKQ_213_API_AB[key], rel=1e-6)
    # DockQ's API reports GlobalDockQ over the interfaces of the mapped chains only (0.9425);
    # protgpu's aggregate is DockQ v2's over all native interfaces, the unmapped ones counting 0.
    assert np.isnan(_per_interface(table_ab, "dockq_per_interface")[("A", "C")])
    assert float(table_ab["dockq"][0]) == pytest.approx(got["dockq_per_interface"] / 3, rel=1e-12)
