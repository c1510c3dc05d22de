"""Which inputs ask for gradients, and the one refusal for functions that cannot give them.

protgpu's contract for torch users (DESIGN.md, convention 16): a torch input that requires grad gets
a result with a ``grad_fn``, or a one-line :class:`~protgpu.errors.ProtgpuError` - never a silently
detached tensor. The differentiable functions ask :func:`wants_grad` on their first line and take
their torch path; every other public function that takes coordinates calls :func:`refuse_grad` there.

Under ``torch.no_grad()`` (or ``torch.inference_mode()``) nothing asks for gradients, so every
function runs as usual: the caller has said that no graph is wanted.

Internal API; see ``docs/design/differentiable.md``. Imports no torch (``sys.modules`` is checked).
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import InputError

#: What is differentiable, for the refusal's message (and the docs).
DIFFERENTIABLE = ("pg.rmsd and pg.superpose (mobile and reference coordinates), pg.distances (x and y), "
                  "pg.lddt(..., smooth=True) (model coordinates) and pg.attention")


class NotDifferentiableError(InputError, TypeError):
    """A torch input requires grad, but the function (or the path the call takes) gives no gradients."""


def _requires_grad(x: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if isinstance(x, torch.Tensor):
        return bool(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return any(_requires_grad(i) for i in x)
    return False


def _grad_enabled() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled()


def wants_grad(*inputs: Any) -> bool:
    """True when grad mode is on and an input (or an item of a list/tuple input) is a torch tensor that
    requires grad."""
    return _grad_enabled() and any(_requires_grad(x) for x in inputs)


def refuse_grad(function_name: str, *inputs: Any) -> None:
    """Raise :class:`NotDifferentiableError` if an input asks for gradients (see :func:`wants_grad`).

    Parameters
    ----------
    function_name : str
        The public name, e.g. ``"pg.tm_score"``.
    *inputs
        The call's array-like arguments (anything else is ignored).

    Raises
    ------
    NotDifferentiableError
        One line: the function, that it is not differentiable, and what is.
    """
    if wants_grad(*inputs):
        raise NotDifferentiableError(
            f"{function_name} is not differentiable, but an input requires grad (detach it or call it under "
            f"torch.no_grad()); differentiable: {DIFFERENTIABLE}")


def refuse_grad_of(function_name: str, argument: str, value: Any) -> None:
    """Raise :class:`NotDifferentiableError` if ``value`` (an argument of a differentiable function that
    gives no gradient with respect to it, e.g. ``weights``) requires grad."""
    if wants_grad(value):
        raise NotDifferentiableError(
            f"{function_name} is not differentiable with respect to {argument}, which requires grad "
            f"(detach it); differentiable: {DIFFERENTIABLE}")


def single_tensor(value: Any, what: str, function_name: str) -> None:
    """InputError for a list/tuple holding tensors that require grad: the front door stacks lists on
    the host, which would cut the graph; the caller stacks them (``torch.stack``) instead."""
    if isinstance(value, (list, tuple)) and wants_grad(value):
        raise InputError(f"{function_name}: {what} is a list of tensors that require grad; pass one tensor "
                         "(torch.stack) so that gradients can flow")
