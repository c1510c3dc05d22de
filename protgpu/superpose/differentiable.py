"""Gradients of :func:`~protgpu.rmsd` and :func:`~protgpu.superpose` for torch tensors that require grad.

The forward pass is the path without gradients (``rmsd_numpy`` on the CPU, ``rmsd_cuda`` on the GPU: the
same numbers, moved coordinates included); :class:`QCPFunction` gives the RMSD on the fitted atoms, the
optimal rotation, the translation and the moved coordinates, and its backward pass is one fused CUDA
kernel per frame (``kernels/qcp_backward.cu``; a second one for the reference's gradient) for float32 and
float64 CUDA tensors, and torch operations otherwise (:func:`backward_torch`: the kernels' twin, used on
the CPU and as their parity reference). The measured RMSD (``atoms=``) is a torch expression of them.

Maths (notation of ``docs/design/differentiable.md``): with weights ``w`` (W = sum w), centred fitted
atoms ``xc`` (mobile) and ``yc`` (reference), ``B = sum_i w_i yc_i xc_i^T`` and the optimal proper
rotation R (maximises tr(R^T B); ``aligned = R xc + c_y``, ``t = c_y - R c_x``):

* RMSD (envelope theorem: R is optimal, so its own change does not move the RMSD to first order):
  ``dRMSD/dx_i = w_i (xc_i - R^T yc_i) / (W RMSD)`` and ``dRMSD/dy_i = -R dRMSD/dx_i`` summed over
  frames. At RMSD = 0 (identical up to a rigid motion) the RMSD is a cone, not differentiable; the
  gradient returned is 0, its minimal-norm subgradient (and what a central difference gives), for
  every RMSD below ``RMSD_FLOOR_ULPS`` ulps of the reference's RMS radius (2e-13 of it in float64,
  1e-4 in float32, the dtype of the mobile coordinates), where rounding decides the residuals.
* Moved coordinates and translation: ``coords_i = R x_i + t``. With upstream gradients ``g_i`` (coords)
  and ``g_t``, ``T = g_t + sum_i g_i`` reaches the translation and ``G = g_R + sum_i g_i (x_i - c_x)^T
  - g_t c_x^T`` the rotation; ``x_i`` gets ``R^T g_i`` directly, each fitted atom ``-w_i R^T T / W``
  through ``c_x`` and each reference atom ``w_i T / W`` through ``c_y``.
* Rotation: stationarity makes ``P = R^T B`` symmetric. A change dB moves R by ``dR = R [omega]_x``
  with ``(tr(P) I - P) omega = vee(R^T dB - dB^T R)``; the matrix ``A = tr(P) I - P`` has the
  eigenvalues ``p_j + p_k`` (sums of pairs of P's eigenvalues), so for an upstream gradient G of R,
  ``dL/dB = R [z]_x`` with ``A z = vee(K - K^T)``, ``K = R^T G``. A is singular exactly where the
  optimal rotation is not unique: collinear atoms (rotation about the line), fewer than 3 atoms, all
  atoms at one point, or two singular values equal with a reflection. There z is taken from
  ``(A^2 + eps^2 I) z = A vee(K - K^T)`` (Tikhonov, ``eps = 1e-9 tr(P)``): the components along free
  rotation axes are 0 (the minimal-norm solution) and the gradient stays finite; elsewhere the
  difference from the exact derivative is ~(eps / (p_j + p_k))^2. Planar (non-collinear) atoms are not
  degenerate: their rotation is unique and its derivative exact. Both the twin and the kernel solve in
  P's eigenbasis (A shares it): ``z = V diag(a / (a^2 + eps^2)) V^T vee(K - K^T)``, ``a_k = tr P - p_k``,
  bounded by ``|vee| / (2 eps)`` however a near-zero ``a_k`` rounds (an LU solve failed there).
* Then ``dL/dx_i = w_i B'^T yc_i`` and ``dL/dy_i = w_i sum_f B'_f xc_fi`` with ``B' = dL/dB``.
"""

from __future__ import annotations

import numpy as np

from .._array import is_cupy_array
from .._autograd import refuse_grad_of, single_tensor
from .._inputs import coordinates
from ._prepare import prepare, resolve_selection
from .to_reference import (
    SuperposeResult,
    _finite_rmsd,
    centre_reference,
    reference_on_device,
    rmsd_cuda,
    rmsd_numpy,
)

#: RMSDs below this many ulps (of the backward's dtype) of the reference's RMS radius count as 0 in the
#: RMSD's gradient: below it the residuals' rounding decides their direction.
RMSD_FLOOR_ULPS = 1000.0

#: Relative Tikhonov regularisation of the rotation's derivative (see the module docstring).
ROTATION_EPS = 1e-9

#: Absolute floor of the regularisation: sqrt of float64's smallest normal number (eps^2 stays normal).
ROTATION_EPS_ABS = float(np.finfo(np.float64).tiny) ** 0.5

#: Fitted atoms per block of ``qcp_bwd_reference_*`` and the threads its grid aims at (frames are cut
#: into chunks until the grid has about this many; each chunk's partial sums are one (n, 3) slab).
REFERENCE_BLOCK = 128
REFERENCE_THREADS = 1 << 18


def _torch():
    import torch

    return torch


def _as_torch(a, device):
    """A NumPy or CuPy result as a torch tensor on ``device`` (no copy for CuPy)."""
    torch = _torch()
    t = torch.from_dlpack(a) if is_cupy_array(a) else torch.from_numpy(np.ascontiguousarray(a))
    return t if t.device == device else t.to(device)


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
    eps = ROTATION_EPS * tr.abs() + ROTATION_EPS_ABS
    kappa = _vee_antisym(rot.transpose(-1, -2) @ g_rot)
    # (A^2 + eps^2 I) z = A kappa in P's eigenbasis (A = tr P I - P shares it): bounded by |kappa| / (2 eps)
    # where an LU solve of the nearly singular system fails (both collinear) or is rounding noise
    lam, v = torch.linalg.eigh(p)
    a = tr[:, None] - lam
    u = (v.transpose(-1, -2) @ kappa[..., None])[..., 0] * (a / (a * a + (eps * eps)[:, None]))
    z = (v @ u[..., None])[..., 0]
    return rot @ _skew(z)


class _Info:
    """What the forward hands the backward besides tensors (host values: no device reads)."""

    __slots__ = ("cy", "dev_ops", "fit", "fit_t", "floor_ulps", "inv_w", "n_fit", "unique_fit", "w", "y")

    def __init__(self, y, w, fit, fit_t):
        self.y, self.w, self.fit, self.fit_t = y, w, fit, fit_t
        self.n_fit = len(y)
        self.unique_fit = fit is None or len(np.unique(fit)) == len(fit)
        self.dev_ops = None  # reference_on_device's operands (the CUDA path)
        _, self.cy, gb, self.inv_w = centre_reference(y, w)
        # the reference's RMS radius: the RMSD floor is RMSD_FLOOR_ULPS ulps of it
        self.floor_ulps = RMSD_FLOOR_ULPS * float(np.sqrt(gb * self.inv_w))

    def floor(self, dtype) -> float:
        return self.floor_ulps * float(_torch().finfo(dtype).eps)


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
        """(x (F, N, 3), y_fit (n, 3) float64 or None) -> (rmsd (F,), R (F, 3, 3), t (F, 3), coords
        (F, N, 3) or None) by the path without gradients; ``info`` (an :class:`_Info`), ``be``, ``name``
        and ``want_coords`` ride along (no gradient). ``y_fit`` is None when the reference needs none."""

        @staticmethod
        def forward(ctx, x, y, info, be, name, want_coords):
            xd = x.detach()
            xw = be.asarray(xd)
            if xw.dtype.kind != "f":
                xw = xw.astype(np.float64)
            run = rmsd_cuda if be.on_gpu else rmsd_numpy
            r, rot, t, coords = run(xw, (info.y, None), info.fit, None, info.w, None, want_coords=want_coords)
            if be.on_gpu:
                info.dev_ops = reference_on_device(info.y, info.w, info.fit)  # (memoised: rmsd_cuda's own)
            if not is_cupy_array(r):
                _finite_rmsd(r, name)
            dev = x.device
            r, rot, t = _as_torch(r, dev), _as_torch(rot, dev), _as_torch(t, dev)
            coords = None if coords is None else _as_torch(coords, dev)
            ctx.save_for_backward(xd, None if y is None else y.detach(), r, rot, t)
            ctx.info = info
            ctx.set_materialize_grads(False)
            return r, rot, t, coords

        @staticmethod
        def backward(ctx, g_r, g_rot, g_t, g_c):
            x, y, r, rot, t = ctx.saved_tensors
            need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            if g_r is None and g_rot is None and g_t is None and g_c is None:
                return None, None, None, None, None, None
            info = ctx.info
            if x.is_cuda and x.dtype in (torch.float32, torch.float64) and info.unique_fit \
                    and info.dev_ops is not None:
                gx, gy = backward_cuda(x, r, rot, t, info, (g_r, g_rot, g_t, g_c), need_x, need_y)
            else:
                gx, gy = backward_torch(x, r, rot, t, info, (g_r, g_rot, g_t, g_c), need_x, need_y)
            return (gx if need_x else None), (gy if need_y else None), None, None, None, None

    return _QCP


def backward_torch(x, r, rot, t, info, grads, need_x: bool, need_y: bool):
    """The backward pass in torch operations (the CPU path, other dtypes, and the kernels' twin).

    Parameters
    ----------
    x : tensor (F, N, 3)
        Mobile frames (any float dtype; the gradient is computed in it, float64 for others).
    r, rot, t : float64 tensors (F,), (F, 3, 3), (F, 3)
        The forward's RMSD on the fitted atoms, rotation and translation.
    info : _Info
        The fitted reference atoms (host float64), weights, fitted atom indices, centroid and floor.
    grads : tuple
        Upstream gradients of (rmsd, rotation, translation, coords), each None when absent.
    need_x, need_y : bool

    Returns
    -------
    gx (F, N, 3) in x's float dtype or None, gy (n_fit, 3) float64 or None.
    """
    torch = _torch()
    g_r, g_rot, g_t, g_c = grads
    f64 = torch.float64
    dev = x.device
    dt = x.dtype if x.is_floating_point() else f64
    y = torch.as_tensor(info.y, device=dev)
    wv = torch.ones(len(y), dtype=f64, device=dev) if info.w is None else torch.as_tensor(info.w, device=dev)
    cy = torch.as_tensor(info.cy, device=dev)
    inv_w = info.inv_w
    cx = ((cy - t)[:, None, :] @ rot)[:, 0]  # the fitted centroid from t = c_y - R c_x
    xf = x if info.fit_t is None else x[:, info.fit_t]
    xc = xf.to(dt) - cx.to(dt)[:, None, :]
    yc = y - cy
    gx = gy = gx_all = None
    g_big, tt = g_rot, g_t  # everything that reaches the rotation (G) and the translation (T)
    if g_c is not None:
        gc = g_c.to(dt)
        gx_all = torch.matmul(gc, rot.to(dt))  # R^T g_i, every atom
        gg = torch.matmul(gc.transpose(-1, -2), x.to(dt) - cx.to(dt)[:, None, :]).to(f64)
        g_big = gg if g_big is None else g_big + gg
        s = g_c.to(f64).sum(1)
        tt = s if tt is None else tt + s
    if g_t is not None:
        gt = -g_t[:, :, None] * cx[:, None, :]
        g_big = gt if g_big is None else g_big + gt
    if g_r is not None:
        # envelope theorem: w_i (xc_i - R^T yc_i) / (W rmsd); 0 at rmsd = 0 (module doc), and below the
        # rounding floor of the residuals, where their direction is noise
        live = r > info.floor(dt)
        coef = torch.where(live, g_r * inv_w / torch.where(live, r, 1.0), 0.0)
        resid = xc - torch.matmul(yc.to(dt), rot.to(dt))
        gx = resid * (coef[:, None, None] * wv[None, :, None]).to(dt)
        if need_y:
            gy = -torch.einsum("fij,fnj->ni", rot, gx.to(f64))
    if g_big is not None:
        wyc = wv[:, None] * yc
        b = torch.matmul(wyc.t().to(dt), xc).to(f64)  # sum_i w_i yc_i xc_i^T
        gb = rotation_backward(rot, b, g_big)
        gxr = torch.matmul(wyc.to(dt), gb.to(dt))
        gx = gxr if gx is None else gx + gxr
        if need_y:
            gyr = wv[:, None] * torch.einsum("fnj,fij->ni", xc.to(f64), gb)
            gy = gyr if gy is None else gy + gyr
    if tt is not None:
        rtt = (tt[:, None, :] @ rot)[:, 0] * inv_w  # R^T T / W
        gxt = (-wv[None, :, None] * rtt[:, None, :]).to(dt)
        gx = gxt if gx is None else gx + gxt
        if need_y:
            gyt = wv[:, None] * (tt.sum(0) * inv_w)[None, :]
            gy = gyt if gy is None else gy + gyt
    if not need_x:
        return None, gy
    if info.fit_t is not None:
        gx = torch.zeros(x.shape, dtype=dt, device=dev).index_add_(1, info.fit_t, gx)
    if gx_all is not None:
        gx = gx + gx_all
    return gx, gy


# Launch plans of qcp_backward.cu, by (device, dtype, sizes, scalars): a training loop calls back with
# the same shapes and reference every step. Cleared when it grows (references that change every call).
_PLANS: dict = {}


def _plan(key, entry, grid, block, tail):
    plan = _PLANS.get(key)
    if plan is None:
        from .. import _cuda

        if len(_PLANS) > 64:
            _PLANS.clear()
        plan = _PLANS[key] = _cuda.build_plan(_cuda.get_kernel("qcp_backward", entry), grid, block, tail)
    return plan


def backward_cuda(x, r, rot, t, info, grads, need_x: bool, need_y: bool):
    """:func:`backward_torch` by ``kernels/qcp_backward.cu`` for float32 / float64 CUDA tensors: one launch
    for the mobile's gradient (and the frames' numbers for the reference's), one more for the reference's
    gradient in chunks of frames, then a sum over the chunks. On the caller's current stream, no host
    synchronisation. Same parameters and results as :func:`backward_torch`; fitted atoms must not repeat."""
    torch = _torch()
    from . import kernels

    g_r, g_rot, g_t, g_c = (None if g is None else g.contiguous() for g in grads)
    if g_c is not None and g_c.dtype != x.dtype:
        g_c = g_c.to(x.dtype)
    x = x.contiguous()
    f, n_atoms = x.shape[:2]
    n = info.n_fit
    dev = x.device
    di = dev.index if dev.index is not None else torch.cuda.current_device()
    sfx = "f32" if x.dtype == torch.float32 else "f64"
    (cy, _, inv_w), _, ref_d, idx_d = info.dev_ops
    weighted = int(info.w is not None)
    floor = info.floor(x.dtype)
    stream = torch.cuda.current_stream(dev).cuda_stream
    gx = None
    if need_x:
        # with selected atoms and no coords gradient the kernel writes the fitted atoms only
        gx = torch.zeros_like(x) if (idx_d is not None and g_c is None) else torch.empty_like(x)
    frame = torch.empty((f, 13), dtype=torch.float64, device=dev) if need_y else None
    tail = (np.int64(f), np.int32(n_atoms), np.int32(n), np.int32(weighted), float(inv_w), float(cy[0]),
            float(cy[1]), float(cy[2]), floor, ROTATION_EPS, ROTATION_EPS_ABS)
    plan = _plan(("frames", di, sfx, tail), f"qcp_bwd_frames_{sfx}", kernels.warp_grid(f, 1, kernels.WARP_THREADS),
                 (kernels.WARP_THREADS,), tail)

    def ptr(a):
        return 0 if a is None else (a.data.ptr if is_cupy_array(a) else a.data_ptr())

    plan.launch(stream, di, ptr(x), ptr(idx_d), ptr(ref_d), ptr(rot), ptr(t), ptr(r), ptr(g_r), ptr(g_rot),
                ptr(g_t), ptr(g_c), ptr(gx), ptr(frame))
    gy = None
    if need_y:
        blocks = -(-n // REFERENCE_BLOCK)
        chunks = int(min(max(1, REFERENCE_THREADS // (blocks * REFERENCE_BLOCK)), f, 65535))
        chunk = -(-f // chunks)
        chunks = -(-f // chunk)
        partial = torch.empty((chunks, n, 3), dtype=torch.float64, device=dev)
        tail_r = (np.int64(f), np.int32(n_atoms), np.int32(n), np.int32(weighted), np.int64(chunk))
        plan_r = _plan(("reference", di, sfx, tail_r), f"qcp_bwd_reference_{sfx}", (blocks, chunks),
                       (REFERENCE_BLOCK,), tail_r)
        plan_r.launch(stream, di, ptr(x), ptr(idx_d), ptr(ref_d), ptr(frame), ptr(partial))
        gy = partial[0] if chunks == 1 else partial.sum(0)
    return gx, gy


def rmsd_with_grad(mobile, reference, fit, atoms, weights, ref_frame, device, *, want_superpose: bool):
    """:func:`~protgpu.rmsd` (or :func:`~protgpu.superpose`) when an input requires grad: the same
    values, as torch tensors with a ``grad_fn`` (see the module docstring)."""
    torch = _torch()
    fname = "pg.superpose" if want_superpose else "pg.rmsd"
    single_tensor(mobile, "mobile", fname)
    single_tensor(reference, "reference", fname)
    refuse_grad_of(fname, "weights", weights)
    # the torch tensors themselves (graph kept); the front door resolves everything else in prepare
    mob, mob_s = (mobile, None) if isinstance(mobile, torch.Tensor) else coordinates(mobile, "mobile")[:2]
    ref, ref_s, ref_name = (reference, None, "reference") if isinstance(reference, torch.Tensor) else \
        coordinates(reference, "reference")
    p = prepare(mob_s if mob_s is not None else mob, ref_s if ref_s is not None else ref, fit, atoms, weights,
                ref_frame, device, need_rotation=want_superpose)
    tensors = [a for a in (mob, ref) if isinstance(a, torch.Tensor)]
    dev = next((a.device for a in tensors if a.requires_grad), tensors[0].device)
    # mobile frames (F, N, 3) in torch: the caller's tensor (graph kept) or a constant
    x = mob if isinstance(mob, torch.Tensor) else torch.as_tensor(np.asarray(p.mobile))
    x = x.to(dev)
    x = x if x.ndim == 3 else x[None]
    if not x.is_floating_point():
        x = x.to(torch.float64)
    fit_t = None if p.fit is None else torch.as_tensor(p.fit, device=dev)
    info = _Info(p.ref[0], p.w_fit, p.fit, fit_t)
    # the reference's atoms in torch, lined up with the mobile's, only where a gradient flows to them
    y_fit = y_meas = None
    if isinstance(ref, torch.Tensor) and ref.requires_grad and torch.is_grad_enabled():
        yf = ref[ref_frame] if ref.ndim == 3 else ref
        yf = yf.to(device=dev, dtype=torch.float64)
        fit_r = resolve_selection(fit, ref_s, yf.shape[0], ref_name, "fit", other=mob_s)
        y_fit = yf if fit_r is None else yf[torch.as_tensor(fit_r, device=dev)]
        if atoms is not None:
            meas_r = resolve_selection(atoms, ref_s, yf.shape[0], ref_name, "atoms", other=mob_s)
            y_meas = yf[torch.as_tensor(meas_r, device=dev)]
    r, rot, t, coords = QCPFunction.apply(x, y_fit, info, p.be, p.name, want_superpose)
    if atoms is not None:
        if y_fit is None:
            y_fit = torch.as_tensor(p.ref[0], device=dev)
            y_meas = torch.as_tensor(p.ref[1], device=dev)
        r = _measured_rmsd(x, y_fit, y_meas, rot, p, dev)
    if not want_superpose:
        return r
    return SuperposeResult(coords, rot, t, r)


def _measured_rmsd(x, y_fit, y_meas, rot, p, dev):
    """RMSD on the measured atoms after the fit on the fitted ones, in torch (float64)."""
    torch = _torch()
    w_fit = None if p.w_fit is None else torch.as_tensor(p.w_fit, device=dev)
    x_fit = x if p.fit is None else x[:, torch.as_tensor(p.fit, device=dev)]
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
