"""Smooth lDDT (pg.lddt(smooth=True)): the AlphaFold 3 formula, convergence to the exact lDDT on the
shipped structures as the sigmoids sharpen, gradients w.r.t. model tensors, and the exact path unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def adk(datasets):
    return pg.load(datasets / "adk_closed.pdb"), pg.load(datasets / "adk_open.pdb")


@pytest.mark.parametrize("atoms", ["heavy", "ca"])
def test_converges_to_the_exact_lddt(adk, atoms):
    model, ref = adk
    exact, exact_res = pg.lddt(model, ref, atoms=atoms, per_residue=True, device="cpu")
    gaps = []
    for t in (1.0, 0.1, 0.01, 1e-4):
        s, s_res = pg.lddt(model, ref, atoms=atoms, per_residue=True, smooth=True, temperature=t, device="cpu")
        gaps.append(abs(s - exact))
        if t == 1e-4:
            # a pair exactly at a threshold (PDB's 3 decimals make ties) counts 1/2: for CA residues with
            # ~50 pairs x 4 thresholds, one or two such pairs move a residue by up to 0.0054
            np.testing.assert_allclose(s_res, exact_res, atol=1e-2, equal_nan=True)
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-4


def test_af3_formula_on_two_atoms():
    """One pair: smooth lDDT = mean over t of sigmoid(t - |d - d_ref|) (AlphaFold 3, T = 1)."""
    ref = np.array([[0.0, 0, 0], [3.0, 0, 0]])
    model = np.array([[0.0, 0, 0], [3.7, 0, 0]])
    want = np.mean([1 / (1 + np.exp(-(t - 0.7))) for t in (0.5, 1.0, 2.0, 4.0)])
    assert pg.lddt(model, ref, smooth=True, device="cpu") == pytest.approx(want, rel=1e-12)


def test_gradcheck_on_model_coordinates(adk):
    model, ref = adk
    y = ref.select("ca").coords[0, :40].astype(np.float64)
    x = torch.tensor(model.select("ca").coords[0, :40], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: pg.lddt(a, y, smooth=True, per_residue=True, device="cpu"), (x,))
    assert torch.autograd.gradcheck(lambda a: pg.lddt(a, y, smooth=True, temperature=0.3, device="cpu"), (x,))


def test_grad_model_against_a_reference_structure(adk):
    """A tensor holding all atoms of the reference Structure (symmetry resolution on): same value as the
    Structure model, a grad_fn, finite gradients."""
    model, ref = adk
    x = torch.tensor(ref.coords[0], dtype=torch.float64) + 0.3 * torch.randn(ref.n_atoms, 3, dtype=torch.float64,
                                                                             generator=torch.Generator().manual_seed(0))
    x.requires_grad_()
    v = pg.lddt(x, ref, smooth=True, device="cpu")
    assert v.grad_fn is not None and v.ndim == 0
    as_structure = pg.Structure(x.detach().numpy()[None], ref.atoms)
    assert float(v.detach()) == pytest.approx(pg.lddt(as_structure, ref, smooth=True, device="cpu"), rel=1e-6)
    v.backward()
    assert torch.isfinite(x.grad).all() and torch.count_nonzero(x.grad) > 0


def test_exact_path_refuses_grad_and_the_reference_is_not_differentiable(adk):
    _, ref = adk
    x = torch.tensor(ref.coords[0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(pg.ProtgpuError, match=r"pg.lddt \(smooth=False\) is not differentiable"):
        pg.lddt(x, ref, device="cpu")
    ca = torch.tensor(ref.select("ca").coords[0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(pg.ProtgpuError, match="not differentiable with respect to reference"):
        pg.lddt(ca.detach(), ca, smooth=True, device="cpu")
    with pytest.raises(pg.InputError, match="temperature"):
        pg.lddt(ca.detach(), ca.detach(), smooth=True, temperature=0, device="cpu")
