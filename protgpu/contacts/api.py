"""The public contact functions: :func:`contacts` (residue contact maps, frequencies, sparse pairs) and
:func:`native_contacts` (fractions of native contacts Q(t)). Each validates, resolves its inputs
(:mod:`protgpu.contacts.inputs`), builds the scheme's atom lists (:mod:`protgpu.contacts.schemes`),
picks the backend and converts back; the work runs in :mod:`protgpu.contacts.numpy_twin` (CPU) or
:mod:`protgpu.contacts.cuda` (GPU)."""

from __future__ import annotations

import warnings

import numpy as np

from .._array import dispatch, get_namespace, to_numpy
from .._autograd import refuse_grad
from .._inputs import as_structure
from .._memory import check_host_fits
from ..errors import InputError
from .cuda import contacts_cuda
from .inputs import work_coords
from .maps import ContactMap, NativeContacts
from .numpy_twin import contacts_cpu
from .schemes import SCHEMES, _upper, allowed_block, allowed_pairs, residue_keys, scheme_atoms

__all__ = ["contacts", "native_contacts"]


def check_parameters(*, scheme: str = "closest-heavy", cutoff: float = 4.5, min_separation: int = 3,
                     output: str = "dense") -> None:
    """The one check of :func:`contacts`' parameters, which the contacts job also runs before it reads
    any input (so that a bad ``--cutoff`` stops a batch at once instead of failing every input).

    Raises
    ------
    InputError
        An unknown scheme or output, a cutoff that is not a positive finite number of Angstrom, a
        min_separation that is not a non-negative integer.

    Warns
    -----
    UserWarning
        A cutoff below 1 Angstrom, which finds no contacts between residues: usually a value in nm.
    """
    if scheme not in SCHEMES:
        raise InputError(f"scheme {scheme!r}: choose from {', '.join(SCHEMES)}")
    if output not in ("dense", "pairs"):
        raise InputError(f"output must be 'dense' or 'pairs', not {output!r}")
    if isinstance(cutoff, bool) or not (isinstance(cutoff, (int, float, np.integer, np.floating))
                                        and np.isfinite(cutoff) and cutoff > 0):
        raise InputError(f"cutoff must be a positive number of Angstrom, got {cutoff!r}")
    if isinstance(min_separation, bool) or not isinstance(min_separation, (int, np.integer)) or min_separation < 0:
        raise InputError(f"min_separation must be a non-negative integer, got {min_separation!r}")
    if cutoff < 1.0:
        warnings.warn(f"cutoff={cutoff:g} Angstrom: protgpu's distances are in Angstrom (1 nm = 10 A), and "
                      "residues are never this close", UserWarning, stacklevel=3)


def contacts(structure, *, scheme: str = "closest-heavy", cutoff: float = 4.5, min_separation: int = 3,
             residues=None, frequency: bool = False, output: str = "dense", inter_chain: bool = True,
             periodic: bool | None = None, coords=None, top=None, device: str = "auto") -> ContactMap:
    """Residue contact maps: residue-pair distances, contacts and contact frequencies.

    Parameters
    ----------
    structure : Structure, path or mdtraj.Trajectory
        Atoms and frames (anything :func:`protgpu.load` reads; ``top`` for trajectory files).
    scheme : {"closest-heavy", "ca", "closest", "sidechain", "sidechain-heavy"}
        How a residue distance is taken (mdtraj's schemes; :mod:`protgpu.contacts.schemes` lists the atoms
        each uses and the glycine case).
    cutoff : float
        Contact when the residue distance is strictly below it, Angstrom.
    min_separation : int
        Same-chain pairs closer than this in residue index are excluded (mdtraj's ``contacts="all"``
        uses 3).
    residues : None, "all", str, array of int or bool, optional
        Residues of the map; default those with a CA atom (see :func:`protgpu.contacts.schemes.scheme_atoms`).
    frequency : bool
        Keep only the (R, R) frequency map: ``distances``, ``contacts`` and ``pairs`` are None and
        memory no longer grows with the number of frames (takes precedence over ``output``).
    output : {"dense", "pairs"}
        ``"pairs"`` returns the contacts as sparse (frame, i, j, distance) records
        (:class:`~protgpu.contacts.maps.ContactPairs`) instead of dense maps, for large systems.
    inter_chain : bool
        Include pairs of residues from different chains (mdtraj's ``contacts="all"`` does not).
    periodic : bool or None
        Minimum-image distances with the structure's box. ``None`` (default): a simulation box
        (a trajectory's), not a crystal cell read from a PDB/mmCIF file; ``True``: any box;
        ``False``: none (:meth:`Structure.periodic_box`).
    coords : array, optional
        Coordinates to use instead of ``structure.coords``: (frames, atoms, 3) for the structure's
        atoms, NumPy, CuPy or torch (e.g. frames already on the GPU). The output follows its type.
    top : optional
        Topology for trajectory paths, as :func:`protgpu.load`.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    ContactMap
        ``distances`` (frames, R, R) in Angstrom, ``contacts`` (frames, R, R) bool, ``frequency``
        (R, R) float64, ``residues`` (labels), or ``pairs`` with ``output="pairs"``.

    Raises
    ------
    InputError
        Unknown scheme or output, bad cutoff/separation, empty residue selection, wrong coords.

    Examples
    --------
    >>> import protgpu as pg
    >>> from pathlib import Path
    >>> from protgpu.contacts import contacts
    >>> s = pg.load(Path(pg.__file__).resolve().parents[1] / "datasets" / "adk_open.pdb")
    >>> cm = contacts(s, device="cpu")
    >>> cm.distances.shape, cm.contacts.dtype, len(cm.residues)
    ((1, 214, 214), dtype('bool'), 214)
    >>> bool((cm.distances[0] == cm.distances[0].T).all())
    True
    """
    refuse_grad("pg.contacts", structure, coords)
    check_parameters(scheme=scheme, cutoff=cutoff, min_separation=min_separation, output=output)
    s = as_structure(structure, "structure", top=top)
    what = s.source or "structure"
    res_sel, atom_idx, starts = scheme_atoms(s, scheme, residues)
    chain, labels = residue_keys(s, res_sel)
    seq = res_sel.astype(np.int64)
    allowed = allowed_pairs(chain, seq, int(min_separation), inter_chain)
    be = dispatch(coords, device=device)
    if coords is not None and be.kind in ("numpy", "torch-cpu"):  # refuse what cannot fit before the
        # coordinates are checked or copied (a broadcast view can claim terabytes in a few bytes)
        shape = tuple(getattr(coords, "shape", ()) or np.shape(coords))
        n_in = shape[0] if len(shape) == 3 else 1
        copy = 0 if isinstance(coords, np.ndarray) and coords.dtype == np.float32 and coords.flags.c_contiguous \
            else n_in * s.n_atoms * 3 * 4
        dense = 0 if frequency or output == "pairs" else n_in * len(res_sel) ** 2 * 5
        check_host_fits(copy + dense, f"contacts of {n_in} frames x {s.n_atoms} atoms ({what})")
    x = work_coords(s, coords, be, what)
    box = s.periodic_box(periodic)
    keep = "frequency" if frequency else ("pairs" if output == "pairs" else "dense")
    n_frames, r = x.shape[0], len(res_sel)
    if keep == "dense" and be.kind in ("numpy", "torch-cpu"):
        check_host_fits(n_frames * r * r * (x.dtype.itemsize + 1), f"contact maps of {n_frames} frames x {r}^2")
    if be.on_gpu:
        dist, cont, counts, pairs = contacts_cuda(
            x, atom_idx, starts, chain, seq, box, cutoff=float(cutoff), min_sep=int(min_separation),
            inter_chain=inter_chain, keep=keep, dense_on_host=be.kind in ("numpy", "torch-cpu"))
        xp = get_namespace(counts)
    else:
        dist, cont, counts, pairs = contacts_cpu(x, atom_idx, starts, allowed, box, cutoff=float(cutoff), keep=keep)
        xp = np
    freq = counts.astype(xp.float64) / n_frames
    cm = ContactMap(
        residues=labels,
        distances=be.wrap(dist) if dist is not None else None,
        contacts=be.wrap(cont) if cont is not None else None,
        frequency=be.wrap(freq),
        pairs=be.wrap(pairs) if pairs is not None else None,
        scheme=scheme,
        cutoff=float(cutoff),
        min_separation=int(min_separation),
        inter_chain=bool(inter_chain),
        n_frames=n_frames,
        device=be.device,
        n_pairs=int(np.triu(allowed, 1).sum()),
        source=s.source,
    )
    return cm


def native_contacts(trajectory, reference, *, selection="heavy", cutoff: float = 4.5, min_separation: int = 4,
                    beta: float = 5.0, lambda_constant: float = 1.8, inter_chain: bool = True,
                    periodic: bool | None = None, coords=None, top=None, device: str = "auto") -> NativeContacts:
    """Fraction of native contacts Q(t), hard and soft (Best, Hummer and Eaton 2013).

    Native pairs are the atom pairs of ``selection`` that are within ``cutoff`` in the reference
    (``r0 <= cutoff``, as MDAnalysis' ``contact_matrix``), from residues at least ``min_separation``
    apart in the same chain (Best et al. use "more than three residues": 4), or from different chains
    (``inter_chain``). For each frame, over the K native pairs with current distance r:

    * ``q_soft`` = mean of ``1 / (1 + exp(beta (r - lambda_constant r0)))`` (MDAnalysis ``soft_cut_q``;
      beta = 5 per Angstrom, lambda = 1.8 for all-atom models, 1.5 for coarse-grained ones);
    * ``q_hard`` = fraction with ``r <= r0`` (MDAnalysis ``hard_cut_q`` as ``Contacts`` calls it);
    * ``q_radius`` = fraction with ``r <= cutoff`` (MDAnalysis ``radius_cut_q``).

    Parameters
    ----------
    trajectory : Structure, path or mdtraj.Trajectory
        Frames to score.
    reference : Structure, path or mdtraj.Trajectory
        The native state (its first frame), with the same atoms after ``selection`` (same count and
        names, in the same order).
    selection : str or index array
        Atoms that make contacts; default ``"heavy"``.
    cutoff : float
        Native-contact radius in the reference, Angstrom.
    min_separation : int
        Minimum residue-index separation of same-chain pairs.
    beta, lambda_constant : float
        Soft switching parameters (1/Angstrom, unitless).
    inter_chain : bool
        Count pairs of atoms from different chains.
    periodic : bool or None
        Minimum-image distances with the structures' boxes: ``None`` (default) applies simulation
        boxes but not crystal cells, ``True`` any box, ``False`` none (:meth:`Structure.periodic_box`).
    coords : array, optional
        Trajectory coordinates to use instead of ``trajectory.coords`` (NumPy, CuPy or torch).
    top : optional
        Topology for trajectory paths.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    NativeContacts
        ``q_soft``, ``q_hard``, ``q_radius`` (frames,) float64 of the coordinates' array type, and the
        native ``pairs`` (K, 2) with their reference distances ``r0`` (K,).

    Raises
    ------
    InputError
        Mismatched atoms between trajectory and reference, or no native contact.

    Examples
    --------
    Native CA contacts (8 Angstrom) of the closed form of adenylate kinase along a closed-to-open
    transition, every 24th frame:

    >>> import protgpu as pg
    >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb")
    >>> q = native_contacts(traj.frames(slice(0, 98, 24)), "datasets/adk_closed.pdb", selection="ca",
    ...                     cutoff=8.0, device="cpu")
    >>> len(q.pairs)
    448
    >>> q.q_radius.round(3).tolist()
    [0.92, 0.795, 0.826, 0.817, 0.833]
    >>> q.q_soft.round(2).tolist()
    [1.0, 0.99, 0.96, 0.94, 0.94]
    """
    refuse_grad("pg.native_contacts", trajectory, reference, coords)
    from ..distances import distances

    traj = as_structure(trajectory, "trajectory", top=top)
    ref = as_structure(reference, "reference", top=top)
    idx = traj.select_indices(selection)
    ridx = ref.select_indices(selection)
    tname, rname = traj.source or "trajectory", ref.source or "reference"
    if idx.size < 2:
        raise InputError(f"{tname}: selection {selection!r} matches fewer than two atoms")
    if idx.size != ridx.size:
        raise InputError(f"{tname}: selection {selection!r} gives {idx.size} atoms but {ridx.size} in {rname}")
    if not np.array_equal(_upper(traj.atoms.name[idx]), _upper(ref.atoms.name[ridx])):
        k = int(np.flatnonzero(_upper(traj.atoms.name[idx]) != _upper(ref.atoms.name[ridx]))[0])
        raise InputError(f"{tname}: atom {k} of the selection is {traj.atoms.name[idx][k]} but "
                         f"{ref.atoms.name[ridx][k]} in {rname}")
    # Native pairs from the reference, in float64 on the host, in row blocks (done once).
    x0 = np.asarray(ref.coords[0, ridx], dtype=np.float64)
    rbox = ref.periodic_box(periodic)
    rbox = None if rbox is None else rbox[0]
    ri = np.asarray(traj.atoms.residue_index, dtype=np.int64)[idx]
    tab = traj.residues
    key = np.char.add(np.char.add(np.asarray(tab.chain, dtype=str), "\x1f"), np.asarray(tab.segid, dtype=str))
    chain = np.unique(key, return_inverse=True)[1].reshape(-1)[ri]
    found_a, found_b = [], []
    n = idx.size
    step = max(1, (1 << 22) // n)
    for a0 in range(0, n, step):
        a1 = min(n, a0 + step)
        d = np.asarray(distances(x0[a0:a1], x0[a0:], box=rbox, device="cpu"))  # rows vs atoms >= a0
        ok = allowed_block(chain[a0:a1], ri[a0:a1], chain[a0:], ri[a0:], int(min_separation), inter_chain)
        ok &= d <= cutoff
        ok &= np.arange(a0, a1)[:, None] < np.arange(a0, n)[None, :]
        ia, ib = np.nonzero(ok)
        found_a.append(ia + a0)
        found_b.append(ib + a0)
    ia, ib = (np.concatenate(v) for v in (found_a, found_b))
    if ia.size == 0:
        raise InputError(f"{rname}: no native contacts within {cutoff} A for selection {selection!r}")
    pairs = np.stack([idx[ia], idx[ib]], axis=1).astype(np.int64)

    be = dispatch(coords, device=device)
    x = work_coords(traj, coords, be, tname)
    xp = get_namespace(x)
    box = traj.periodic_box(periodic)
    # r and r0 in float64 through the same code on the same device (as MDAnalysis computes both with
    # distance_array): a frame equal to the reference then has r == r0 exactly, and q_hard = 1.
    used = np.unique(pairs)
    local = np.searchsorted(used, pairs)
    x_used = xp.ascontiguousarray(x[:, xp.asarray(used)].astype(xp.float64))
    x_ref = xp.asarray(np.asarray(ref.coords[:1], dtype=np.float64)[:, ridx[np.searchsorted(idx, used)]])
    r0_d = distances(x_ref, pairs=local, box=rbox, device=be.device)[0]
    r = distances(x_used, pairs=local, box=box, device=be.device)  # (F, K)
    r0 = to_numpy(r0_d).astype(np.float64)
    r0_d, r = xp.asarray(r0_d), xp.asarray(r)
    with np.errstate(over="ignore"):
        q_soft = (1.0 / (1.0 + xp.exp(beta * (r - lambda_constant * r0_d[None])))).mean(axis=1)
    q_hard = (r <= r0_d[None]).mean(axis=1)
    q_radius = (r <= cutoff).mean(axis=1)
    return NativeContacts(be.wrap(q_soft), be.wrap(q_hard), be.wrap(q_radius), pairs, r0)
