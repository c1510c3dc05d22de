"""Every public function x a torch input that requires grad: a result with a grad_fn (the differentiable
functions), or a one-line NotDifferentiableError (every other function taking coordinates) - never a
silently detached result (DESIGN.md convention 16; protgpu/_autograd.py). Beside test_front_door.py's
function x form table, over the same ensemble."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import protgpu as pg
from protgpu._autograd import NotDifferentiableError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ensemble(datasets):
    ca = pg.load(datasets / "adk_open.pdb").select("ca")
    rng = np.random.default_rng(7)
    x0 = ca.coords[0].astype(np.float64)
    coords = np.stack([x0 + rng.normal(scale=s, size=x0.shape) for s in (0.0, 0.8, 1.6)])
    return ca, coords


def _grad(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=True)


# name -> call(grad tensor (frames, atoms, 3), reference Structure)
DIFFERENTIABLE = {
    "rmsd": lambda x, ref: pg.rmsd(x, ref, device="cpu"),
    "superpose": lambda x, ref: pg.superpose(x, ref, device="cpu").coords,
    "distances": lambda x, ref: pg.distances(x, device="cpu"),
    "lddt(smooth=True)": lambda x, ref: pg.lddt(x, ref, smooth=True, device="cpu"),
}
REFUSED = {
    "pairwise_rmsd": lambda x, ref: pg.pairwise_rmsd(x, device="cpu"),
    "tm_score": lambda x, ref: pg.tm_score(x, ref, device="cpu"),
    "gdt": lambda x, ref: pg.gdt(x, ref, device="cpu"),
    "lddt": lambda x, ref: pg.lddt(x, ref, device="cpu"),
    "consensus_score": lambda x, ref: pg.consensus_score(x, device="cpu"),
    "contacts": lambda x, ref: pg.contacts(ref, coords=x, scheme="ca", cutoff=8.0, device="cpu"),
    "native_contacts": lambda x, ref: pg.native_contacts(ref, ref, coords=x, selection="ca", cutoff=8.0, device="cpu"),
    "tm_align": lambda x, ref: pg.tm_align(x, ref, device="cpu"),
    "tm_align_matrix": lambda x, ref: pg.tm_align_matrix(x, device="cpu"),
    "cluster": lambda x, ref: pg.cluster(x, cutoff=2.0, device="cpu"),
    "map_chains": lambda x, ref: pg.map_chains(x, ref),
    "score_complex": lambda x, ref: pg.score_complex(x, ref, metrics=("bb_lddt", "rmsd")),
}
# Public callables that take no coordinates a gradient could flow from, or are owned elsewhere:
# save writes a file (no tensor result to detach); attention has its own autograd (issue 20, attention);
# read_confidence reads predictors' files; design_sanity takes structures with atom tables (a bare tensor is
# refused for lack of them, after refuse_grad).
EXEMPT = {"load", "save", "gpu_available", "attention", "Structure", "read_confidence", "design_sanity"}


def test_every_public_function_is_classified():
    public = {n for n in pg.__all__ if callable(getattr(pg, n)) and not inspect.isclass(getattr(pg, n))}
    named = {n.split("(")[0] for n in (*DIFFERENTIABLE, *REFUSED)} | EXEMPT
    assert public <= named, f"unclassified public functions: {sorted(public - named)}"


@pytest.mark.parametrize("fn", list(DIFFERENTIABLE))
def test_differentiable_functions_give_a_graph(fn, ensemble):
    ref, coords = ensemble
    x = _grad(coords)
    out = DIFFERENTIABLE[fn](x, ref)
    assert out.grad_fn is not None
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("fn", list(REFUSED))
def test_other_functions_refuse_in_one_line(fn, ensemble):
    ref, coords = ensemble
    with pytest.raises(NotDifferentiableError, match=r"^pg\.\S+( \(smooth=False\))? is not differentiable") as e:
        REFUSED[fn](_grad(coords), ref)
    assert "\n" not in str(e.value) and "differentiable: pg.rmsd" in str(e.value)
    assert isinstance(e.value, pg.ProtgpuError)


@pytest.mark.parametrize("fn", list(REFUSED))
def test_under_no_grad_they_run(fn, ensemble):
    """torch.no_grad() says no graph is wanted: the function runs as for any tensor."""
    ref, coords = ensemble
    with torch.no_grad():
        REFUSED[fn](_grad(coords), ref)


def test_a_grad_tensor_inside_a_list_is_seen(ensemble):
    ref, coords = ensemble
    with pytest.raises(NotDifferentiableError):
        pg.tm_score([_grad(coords[0]), coords[1]], ref, device="cpu")
