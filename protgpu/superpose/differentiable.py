"""Gradients of :func:`~protgpu.rmsd` and :func:`~protgpu.superpose` for torch tensors that require grad.

The forward pass is the QCP path of :mod:`.to_reference` (``rmsd_numpy`` on the CPU, ``rmsd_cuda`` on the
GPU: the same numbers as without gradients); the backward pass is torch operations (CUDA kernels for
CUDA tensors). :class:`QCPFunction` gives the RMSD on the fitted atoms and the optimal rotation; the
measured RMSD (``atoms=``), the translation and the moved coordinates are torch expressions of them.

Maths (notation of ``docs/design/differentiable.md``): with weights ``w`` (W = sum w), centred fitted
atoms ``xc`` (mobile) and ``yc`` (reference), ``B = sum_i w_i yc_i xc_i^T`` and the optimal proper
rotation R (maximises tr(R^T B); ``aligned = R xc + c_y``):

* RMSD (envelope theorem: R is optimal, so its own change does not move the RMSD to first order):
  ``dRMSD/dx_i = w_i (xc_i - R^T yc_i) / (W RMSD)`` and ``dRMSD/dy_i = -R dRMSD/dx_i`` summed over
  frames. At RMSD = 0 (identical up to a rigid motion) the RMSD is a cone, not differentiable; the
  gradient returned is 0, its minimal-norm subgradient (and what a central difference gives), for
  every RMSD below ``RMSD_FLOOR_ULPS`` ulps of the reference's RMS radius (2e-13 of it in float64,
  1e-4 in float32, the dtype of the mobile coordinates), where rounding decides the residuals.
* Rotation: stationarity makes ``P = R^T B`` symmetric. A change dB moves R by ``dR = R [omega]_x``
  with ``(tr(P) I - P) omega = vee(R^T dB - dB^T R)``; the matrix ``A = tr(P) I - P`` has the
  eigenvalues ``p_j + p_k`` (sums of pairs of P's eigenvalues), so for an upstream gradient G of R,
  ``dL/dB = R [z]_x`` with ``A z = vee(K - K^T)``, ``K = R^T G``. A is singular exactly where the
  optimal rotation is not unique: collinear atoms (rotation about the line), fewer than 3 atoms, all
  atoms at one point, or two singular values equal with a reflection. There z is taken from
  ``(A^2 + eps^2 I) z = A vee(K - K^T)`` (Tikhonov, ``eps = 1e-9 tr(P)``): the components along free
  rotation axes are 0 (the minimal-norm solution) and the gradient stays finite; elsewhere the
  difference from the exact derivative is ~(eps / (p_j + p_k))^2. Planar (non-collinear) atoms are not
  degenerate: their rotation is unique and its derivative exact.
"""

from __future__ import annotations

import numpy as np

from .._array import is_cupy_array, to_numpy
from .._autograd import refuse_grad_of, single_tensor
from .._inputs import coordinates
from ._prepare import float_dtype, prepare, resolve_selection
from .to_reference import SuperposeResult, _finite_rmsd, rmsd_cuda, rmsd_numpy

#: RMSDs below this many ulps (of the backward's dtype) of the reference's RMS radius count as 0 in the
#: RMSD's gradient: below it the residuals' rounding decides their direction.
RMSD_FLOOR_ULPS = 1000.0

#: Relative Tikhonov regularisation of the rotation's derivative (see the module docstring).
ROTATION_EPS = 1e-9


def _torch():
    import torch

    return torch


def _as_torch(a, device):
    """A NumPy or CuPy result as a torch tensor on ``device``."""
    torch = _torch()
    t = torch.from_dlpack(a) if is_cupy_array(a) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device)


def _skew(z):
    """[z]_x (..., 3, 3) of z (..., 3): ``[z]_x v = z x v``."""
    torch = _torch()
    o = torch.zeros_like(z[..., 0])
    return torch.stack([torch.stack([o, -z[..., 2], z[..., 1]], -1),
                        torch.stack([z[..., 2], o, -z[..., 0]], -1),
                        torch.stack([-z[..., 1], z[..., 0], o], -1)], -2)


def _vee_antisym(k):
    """vee(K - K^T) (..., 3) of K (..., 3, 3)."""
    torch = _torch()
    return torch.stack([k[..., 2, 1] - k[..., 1, 2], k[..., 0, 2] - k[..., 2, 0], k[..., 1, 0] - k[..., 0, 1]], -1)


def _centroid(a, w):
    """Weighted centroid of a (..., n, 3) (w (n,) or None)."""
    if w is None:
        return a.mean(dim=-2)
    return (w.to(a.dtype)[:, None] * a).sum(dim=-2) / w.sum().to(a.dtype)


def rotation_backward(rot, b, g_rot):
    """dL/dB (F, 3, 3) float64 from dL/dR ``g_rot`` for rotations ``rot`` optimal for ``b`` (module doc)."""
    torch = _torch()
    p = rot.transpose(-1, -2) @ b
    p = 0.5 * (p + p.transpose(-1, -2))
    tr = p.diagonal(dim1=-2, dim2=-1).sum(-1)
    eye = torch.eye(3, dtype=p.dtype, device=p.device)
    a = tr[:, None, None] * eye - p
    eps = ROTATION_EPS * tr.abs() + torch.finfo(p.dtype).tiny ** 0.5
    kappa = _vee_antisym(rot.transpose(-1, -2) @ g_rot)
    z = torch.linalg.solve(a @ a + (eps * eps)[:, None, None] * eye, (a @ kappa[..., None]))[..., 0]
    return rot @ _skew(z)


class QCPFunction:
    """Namespace of the autograd Function (built on first use: torch is optional)."""

    _fn = None

    @classmethod
    def apply(cls, *args):
        if cls._fn is None:
            cls._fn = _make_function()
        return cls._fn.apply(*args)


def _make_function():
    torch = _torch()

    class _QCP(torch.autograd.Function):
        """(x_fit (F, n, 3), y_fit (n, 3) float64, w (n,) float64 or None) -> (rmsd (F,), R (F, 3, 3)),
        float64, forward by the QCP path; ``be`` and ``name`` ride along (no gradient)."""

        @staticmethod
        def forward(ctx, x, y, w, be, name):
            xw = be.asarray(x.detach())
            if xw.dtype.kind != "f":
                xw = xw.astype(np.float64)
            yh = y.detach().cpu().numpy()
            wh = None if w is None else w.detach().cpu().numpy()
            if be.on_gpu:
                r, rot, t, _ = rmsd_cuda(xw, (yh, None), None, None, wh, None)
            else:
                r, rot, t, _ = rmsd_numpy(xw, (yh, None), None, None, wh, None)
            if not is_cupy_array(r):
                _finite_rmsd(r, name)
            r, rot, t = (_as_torch(a, x.device) for a in (r, rot, t))
            cy = _centroid(y.detach(), w)
            # the fitted centroid from the translation t = c_y - R c_x (no pass over the frames)
            cx = ((cy - t)[:, None, :] @ rot)[:, 0]
            ctx.save_for_backward(x.detach(), y.detach(), w, r, rot, cx, cy)
            ctx.set_materialize_grads(False)
            return r, rot

        @staticmethod
        def backward(ctx, g_r, g_rot):
            x, y, w, r, rot, cx, cy = ctx.saved_tensors
            need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            dt = x.dtype if x.is_floating_point() else torch.float64
            xc = x.to(dt) - cx.to(dt)[:, None, :]
            yc = y - cy
            wv = torch.ones(len(y), dtype=torch.float64, device=y.device) if w is None else w
            wsum = wv.sum()
            gx = gy = None
            if g_r is not None:
                # envelope theorem: w_i (xc_i - R^T yc_i) / (W rmsd); 0 at rmsd = 0 (module doc), and
                # below the rounding floor of the residuals, where their direction is noise
                floor = RMSD_FLOOR_ULPS * torch.finfo(dt).eps * torch.sqrt((wv[:, None] * yc * yc).sum() / wsum)
                live = r > floor
                coef = torch.where(live, g_r / (wsum * torch.where(live, r, 1.0)), 0.0)
                resid = xc - torch.matmul(yc.to(dt), rot.to(dt))
                gx = resid * (coef[:, None, None] * wv[None, :, None]).to(dt)
                if need_y:
                    gy = -torch.einsum("fij,fnj->ni", rot, gx.to(torch.float64))
            if g_rot is not None:
                wyc = wv[:, None] * yc
                b = torch.matmul(wyc.t().to(dt), xc).to(torch.float64)  # sum_i w_i yc_i xc_i^T
                gb = rotation_backward(rot, b, g_rot)
                gxr = torch.matmul(wyc.to(dt), gb.to(dt))
                gx = gxr if gx is None else gx + gxr
                if need_y:
                    gyr = wv[:, None] * torch.einsum("fnj,fij->ni", xc.to(torch.float64), gb)
                    gy = gyr if gy is None else gy + gyr
            return (gx if need_x else None), gy, None, None, None

    return _QCP


def rmsd_with_grad(mobile, reference, fit, atoms, weights, ref_frame, device, *, want_superpose: bool):
    """:func:`~protgpu.rmsd` (or :func:`~protgpu.superpose`) when an input requires grad: the same
    values, as torch tensors with a ``grad_fn`` (see the module docstring)."""
    torch = _torch()
    fname = "pg.superpose" if want_superpose else "pg.rmsd"
    single_tensor(mobile, "mobile", fname)
    single_tensor(reference, "reference", fname)
    refuse_grad_of(fname, "weights", weights)
    mob, mob_s, mob_name = coordinates(mobile, "mobile")
    ref, ref_s, ref_name = coordinates(reference, "reference")
    p = prepare(mob_s if mob_s is not None else mob, ref_s if ref_s is not None else ref, fit, atoms, weights,
                ref_frame, device, need_rotation=want_superpose)
    tensors = [a for a in (mob, ref) if isinstance(a, torch.Tensor)]
    dev = next((a.device for a in tensors if a.requires_grad), tensors[0].device)
    # mobile frames (F, N, 3) in torch: the caller's tensor (graph kept) or a constant
    x = mob if isinstance(mob, torch.Tensor) else torch.as_tensor(np.asarray(to_numpy(p.mobile)))
    x = x.to(dev)
    x = x if x.ndim == 3 else x[None]
    if not x.is_floating_point():
        x = x.to(torch.float64)
    # reference atoms lined up with the mobile's, float64
    if isinstance(ref, torch.Tensor):
        yf = ref[ref_frame] if ref.ndim == 3 else ref
        yf = yf.to(device=dev, dtype=torch.float64)
        fit_r = resolve_selection(fit, ref_s, yf.shape[0], ref_name, "fit", other=mob_s)
        meas_r = resolve_selection(atoms, ref_s, yf.shape[0], ref_name, "atoms", other=mob_s)
        y_fit = yf if fit_r is None else yf[torch.as_tensor(fit_r, device=dev)]
        y_meas = None if atoms is None else yf[torch.as_tensor(meas_r, device=dev)]
    else:
        y_fit = torch.as_tensor(p.ref[0], device=dev)
        y_meas = None if p.ref[1] is None else torch.as_tensor(p.ref[1], device=dev)
    w_fit = None if p.w_fit is None else torch.as_tensor(p.w_fit, device=dev)
    x_fit = x if p.fit is None else x[:, torch.as_tensor(p.fit, device=dev)]
    r, rot = QCPFunction.apply(x_fit, y_fit, w_fit, p.be, p.name)
    if y_meas is not None:
        r = _measured_rmsd(x, x_fit, y_fit, y_meas, rot, p, w_fit, dev)
    if not want_superpose:
        return r
    cx = _centroid(x_fit.to(torch.float64), w_fit)
    t = _centroid(y_fit, w_fit) - (rot @ cx[:, :, None])[:, :, 0]
    coords = (x.to(torch.float64) @ rot.transpose(-1, -2) + t[:, None, :])
    coords = coords.to(torch.float32 if float_dtype(_np_dtype(x)) == np.float32 else torch.float64)
    return SuperposeResult(coords, rot, t, r)


def _np_dtype(t):
    return np.dtype(str(t.dtype).replace("torch.", ""))


def _measured_rmsd(x, x_fit, y_fit, y_meas, rot, p, w_fit, dev):
    """RMSD on the measured atoms after the fit on the fitted ones, in torch (float64)."""
    torch = _torch()
    xm = x[:, torch.as_tensor(p.meas, device=dev)].to(torch.float64)
    cx = _centroid(x_fit.to(torch.float64), w_fit)
    cy = _centroid(y_fit, w_fit)
    d = (xm - cx[:, None, :]) @ rot.transpose(-1, -2) + cy - y_meas
    sq = (d * d).sum(-1)
    if p.w_meas is None:
        e = sq.mean(-1)
    else:
        wm = torch.as_tensor(p.w_meas, device=dev)
        e = (sq * wm).sum(-1) / wm.sum()
    # sqrt's derivative is infinite at 0: there the gradient is 0 (the cone's minimal subgradient)
    pos = e > 0
    return torch.where(pos, torch.sqrt(torch.where(pos, e, 1.0)), 0.0)
