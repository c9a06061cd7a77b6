r"""Eigendecomposition of a symmetric arrowhead matrix in ``O(n^2)`` plain array operations.

After a frequent-directions shrink the sketch's Gram matrix is diagonal, so adding one row makes
it an *arrowhead* matrix

    A = [[diag(d), z], [z^T, alpha]]      (d, z of length k; n = k + 1),

whose eigenvalues are the roots of the secular equation

    f(lam) = alpha - lam - sum_i z_i^2 / (d_i - lam) = 0,

one in each gap of the sorted poles ``d`` (Cauchy interlacing) and one beyond each end. LAPACK
solves the same problem for a rank-one update of a diagonal matrix (``dlaed4``) and forms its
eigenvectors stably by Gu & Eisenstat's method (``dlaed9``); this module does both for the
arrowhead form with no solver library call, so that XLA fuses the work on any device:

* **Deflation.** A pole whose ``|z_i|`` is below ``8 eps max(|d|, |z|, |alpha|)`` is an
  eigenvalue itself (eigenvector ``e_i``), as in LAPACK's ``dlaed2``. Two active poles closer
  than that would need a Givens rotation to deflate: the solve reports failure instead and the
  caller falls back to ``eigh`` (:func:`eigh_arrow`).
* **Roots.** Each root is found in the shifted variable ``tau = lam - d_o`` from the pole ``d_o``
  nearer to it (so ``d_i - lam = (d_i - d_o) - tau`` keeps its relative accuracy), by the
  fixed-weight iteration of Bunch, Nielsen & Sorensen ("Rank-one modification of the symmetric
  eigenproblem", Numer. Math. 1978): the nearest pole's term exactly, the rest of ``f``
  linearized, one quadratic per step, safeguarded by bisection of a bracket that the sign of
  ``f`` keeps. A fixed number of steps (no data-dependent loop), then a residual test.
* **Vectors.** Gu & Eisenstat ("A stable and efficient algorithm for the rank-one modification
  of the symmetric eigenproblem", SIMAX 1994), for the arrowhead form as in Jakovcevic Stor,
  Slapnicar & Barlow ("Accurate eigenvalue decomposition of real symmetric arrowhead matrices
  and applications", LAA 2015): the ``z_hat`` for which the computed roots are exact,
  ``z_hat_i^2 = -prod_j (lam_j - d_i) / prod_{l != i} (d_l - d_i)``, gives eigenvectors
  ``(z_hat_i / (d_i - lam_j))_i, -1`` that are orthogonal to working precision however the roots
  cluster.

The lazy basis of the FD sketches (``sketchopt.sketches``) needs one more small factorization per
shrink, a null vector of a ``(k - 1) x k`` matrix; :func:`null_vector` takes it from
``jnp.linalg.qr`` on CPU (LAPACK) and from :func:`householder_null_vector`, the same Householder
reflections unrolled into plain array operations, where ``arrowhead_pays``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sketchopt import _groups, _numerics, _solvers

__all__ = [
    "arrowhead_eigh",
    "arrowhead_pays",
    "diagonal_desc",
    "eigh_arrow",
    "eigh_desc_structured",
    "householder_null_vector",
    "null_vector",
]

# Iterations per root. Convergence is quadratic from the bracket's midpoint; the residual test
# after the last step catches the rare root that needs more (the caller then uses eigh).
_STEPS = {4: 8, 8: 12}


def _safe(x):
    """``x`` with exact zeros replaced by 1, for a denominator whose zero lanes are masked."""
    return jnp.where(x != 0, x, 1)


class _Secular(NamedTuple):
    """The secular equation of one arrowhead, set up per root slot ``j = 0..k``.

    Root ``j <= r`` (``r`` active poles, sorted descending first) lies in ``(a_j, a_{j-1})``
    (``j = 0``: above ``a_0``; ``j = r``: below ``a_{r-1}``) and is ``a[origin] + tau`` with
    ``tau`` in ``(lo, hi)``, the half of the interval next to the origin pole.
    """

    z2: jax.Array  # (k,) z_i^2, 0 for deflated poles
    active: jax.Array  # (k,)
    delta: jax.Array  # (k+1, k) a_i - a_origin(j)
    base: jax.Array  # (k+1,) alpha - a_origin(j)
    origin: jax.Array  # (k+1,) pole index of the shift
    use_hi: jax.Array  # (k+1,) the origin is the upper pole (tau < 0)
    interior: jax.Array  # (k+1,) bracketed by two poles
    delta_p: jax.Array  # (k+1,) the other bracketing pole, shifted (1 when none)
    origin_side: jax.Array  # (k+1, k) poles on the origin's side of root j
    lo: jax.Array
    hi: jax.Array
    r: jax.Array


def _setup(a, z, alpha, active) -> _Secular:
    """Brackets and origins of the roots (the nearer pole, chosen by ``f``'s sign at the
    interval's midpoint)."""
    k = a.shape[0]
    r = jnp.sum(active)
    z2 = jnp.where(active, jnp.square(z), 0)
    znorm = jnp.sqrt(jnp.sum(z2))
    j = jnp.arange(k + 1)
    last = jnp.maximum(r - 1, 0)
    lo_pole, hi_pole = jnp.minimum(j, k - 1), jnp.maximum(j - 1, 0)
    below = jnp.where(j < r, a[lo_pole], jnp.minimum(a[last], alpha) - znorm)
    above = jnp.where(j > 0, a[hi_pole], jnp.maximum(a[0], alpha) + znorm)
    mid = 0.5 * (below + above)
    gaps = a[None, :] - mid[:, None]
    f_mid = alpha - mid - jnp.sum(jnp.where(active, z2 / _safe(gaps), 0), axis=1)
    use_hi = jnp.where(j == 0, False, jnp.where(j == r, True, f_mid > 0))
    origin = jnp.where(use_hi, hi_pole, lo_pole)
    shift = a[origin]
    interior = (j > 0) & (j < r)
    other = jnp.where(use_hi, lo_pole, hi_pole)
    delta = a[None, :] - shift[:, None]
    above_root = jnp.arange(k)[None, :] < j[:, None]  # poles a_i > lam_j
    return _Secular(
        z2=z2,
        active=active,
        delta=delta,
        base=alpha - shift,
        origin=origin,
        use_hi=use_hi,
        interior=interior,
        delta_p=jnp.where(interior, delta[j, other], 1),
        origin_side=jnp.where(use_hi[:, None], above_root, ~above_root) & active[None, :],
        lo=jnp.where(use_hi, jnp.where(j == r, below, mid) - shift, 0),
        hi=jnp.where(use_hi, 0, jnp.where(j == 0, above, mid) - shift),
        r=r,
    )


def _terms(sec: _Secular, tau):
    """``(f(tau), R(tau), R'(tau), |terms|)``: ``f`` at ``a[origin] + tau``, ``R`` the part of
    ``f`` without the origin pole's term ``z_o^2 / tau``, and the size of ``f``'s terms."""
    k = sec.z2.shape[0]
    own = jax.nn.one_hot(sec.origin, k, dtype=jnp.bool_)
    mask = sec.active[None, :] & ~own
    den = _safe(jnp.where(mask, sec.delta - tau[:, None], 1))
    terms = jnp.where(mask, sec.z2[None, :] / den, 0)
    value = sec.base - tau - jnp.sum(terms, axis=1)
    slope = -1 - jnp.sum(jnp.where(mask, terms / den, 0), axis=1)
    pole = sec.z2[sec.origin] / _safe(tau)
    size = jnp.abs(sec.base) + jnp.abs(tau) + jnp.sum(jnp.abs(terms), axis=1) + jnp.abs(pole)
    return value + pole, value, slope, size


def _fixed_weight(sec: _Secular, tau, value, slope):
    """Nearest pole exact, the rest linear (Bunch, Nielsen & Sorensen):
    ``slope t^2 + (value - slope tau) t + z_o^2 = 0``, the root on the origin's side."""
    z2o = sec.z2[sec.origin]
    b = value - slope * tau
    disc = jnp.sqrt(jnp.maximum(b * b - 4 * slope * z2o, 0))
    q = -0.5 * (b + jnp.where(b >= 0, disc, -disc))
    t1, t2 = q / jnp.where(slope != 0, slope, -1), z2o / _safe(q)
    return jnp.where(sec.use_hi, jnp.minimum(t1, t2), jnp.maximum(t1, t2))


def _middle_way(sec: _Secular, tau, fval):
    """Both bracketing poles exact, weights matching ``f'`` side by side, a constant for the rest
    (Li's middle way, as LAPACK's ``dlaed4``): ``C + S_o / (0 - t) + S_p / (d_p - t) = 0``, i.e.
    ``C t^2 - (C d_p + S_o + S_p) t + S_o d_p = 0``, the root between 0 and ``d_p``."""
    den = _safe(sec.delta - tau[:, None])
    sq = jnp.where(sec.active[None, :], sec.z2[None, :] / (den * den), 0)
    d_origin = jnp.sum(jnp.where(sec.origin_side, sq, 0), axis=1)
    d_other = jnp.sum(jnp.where(sec.origin_side, 0, sq), axis=1) + 1  # with the -t term's slope
    gap_o, gap_p = -tau, sec.delta_p - tau
    s_o, s_p = -d_origin * gap_o * gap_o, -d_other * gap_p * gap_p
    c = fval - s_o / _safe(gap_o) - s_p / _safe(gap_p)
    b = c * sec.delta_p + s_o + s_p
    disc = jnp.sqrt(jnp.maximum(b * b - 4 * c * s_o * sec.delta_p, 0))
    q = 0.5 * (b + jnp.where(b >= 0, disc, -disc))
    t1, t2 = q / _safe(c), s_o * sec.delta_p / _safe(q)
    between = (t2 * sec.delta_p > 0) & (jnp.abs(t2) < jnp.abs(sec.delta_p))
    return jnp.where(between | (c == 0), t2, t1)


def _roots(a, z, alpha, active, steps):
    """The roots over the active poles ``a`` (descending, deflated poles after them): ``(origin,
    tau, ok)`` per slot, root ``j <= r`` being ``a[origin] + tau``. A fixed number of steps of
    the middle way (the outer roots: fixed weight), each kept inside a bracket that the sign of
    ``f`` shrinks (bisection where a step would leave it), a root frozen once ``|f|`` is within
    round-off."""
    k = a.shape[0]
    eps = jnp.finfo(a.dtype).eps
    sec = _setup(a, z, alpha, active)

    def converged(fval, size):
        return jnp.abs(fval) <= 8 * (k + 1) * eps * size

    def step(_, carry):
        tau, lo, hi = carry
        fval, value, slope, size = _terms(sec, tau)
        lo, hi = jnp.where(fval > 0, tau, lo), jnp.where(fval > 0, hi, tau)  # f decreases
        cand = jnp.where(
            sec.interior, _middle_way(sec, tau, fval), _fixed_weight(sec, tau, value, slope)
        )
        # The bracket's ends are earlier iterates: a converged step may land on one.
        inside = (cand >= lo) & (cand <= hi) & jnp.isfinite(cand)
        new = jnp.where(inside, cand, 0.5 * (lo + hi))
        return jnp.where(converged(fval, size), tau, new), lo, hi

    start = (0.5 * (sec.lo + sec.hi), sec.lo, sec.hi)
    tau, lo, hi = jax.lax.fori_loop(0, steps, step, start, unroll=True)
    fval, _, _, size = _terms(sec, tau)
    done = converged(fval, size) | (hi - lo <= 4 * eps * jnp.abs(tau))
    return sec.origin, tau, jnp.all(jnp.where(jnp.arange(k + 1) <= sec.r, done, True))


def _vectors(a, za, act, origin, tau):
    """Gu-Eisenstat: the ``z_hat`` for which the computed roots are exact, then the vectors
    ``(z_hat_i / (a_i - lam_j))_i, -1``, normalized (rows: roots; columns: poles, corner)."""
    k = a.shape[0]
    i = jnp.arange(k)
    # lam_j - a_i = (a_origin(j) - a_i) + tau_j, accurate to the data's own rounding
    diff = (a[origin][:, None] - a[None, :]) + tau[:, None]  # (k+1, k)
    # z_hat_i^2 = (lam_i - a_i)(a_i - lam_{i+1}) prod_{l<i} (lam_l - a_i)/(a_l - a_i)
    #             prod_{l>i} (lam_{l+1} - a_i)/(a_l - a_i): every ratio O(1), nothing overflows.
    partner = jnp.where(i[None, :] < i[:, None], i[None, :], i[None, :] + 1)  # [i, l]
    pair = act[None, :] & act[:, None] & (i[None, :] != i[:, None])
    gap = a[None, :] - a[:, None]  # [i, l] = a_l - a_i
    ratio = jnp.where(pair, diff[partner, i[:, None]] / _safe(jnp.where(pair, gap, 1)), 1)
    ends = diff[i, i] * -diff[jnp.minimum(i + 1, k), i]
    zhat2 = jnp.maximum(ends * jnp.prod(ratio, axis=1), 0)
    zhat = jnp.where(act, jnp.sign(za) * jnp.sqrt(zhat2), 0)
    body = jnp.where(act[None, :], zhat[None, :] / _safe(-diff), 0)
    vec = jnp.concatenate([body, -jnp.ones((k + 1, 1), a.dtype)], axis=1)
    norm = jnp.sqrt(jnp.sum(jnp.square(vec), axis=1, keepdims=True))
    return vec / jnp.where(jnp.isfinite(norm) & (norm > 0), norm, 1)


def arrowhead_eigh(d, z, alpha, *, steps=None):
    """Eigendecomposition of ``A = [[diag(d), z], [z^T, alpha]]`` (module docstring).

    Args:
      d: ``(k,)`` the diagonal, any order.
      z: ``(k,)`` the arrow.
      alpha: the corner.
      steps: iterations per root (default by dtype).

    Returns:
      ``(lam, u, ok)``: eigenvalues descending ``(k + 1,)``, eigenvectors as the columns of
      ``u`` (rows in the order ``d[0], ..., d[k-1], corner``) and whether every root converged
      and no two active poles coincide; where ``ok`` is false the caller should use ``eigh``
      (the values are then finite but not accurate).
    """
    dtype = jnp.result_type(d, z, alpha)
    d, z, alpha = d.astype(dtype), z.astype(dtype), jnp.asarray(alpha, dtype)
    k = d.shape[0]
    eps = jnp.finfo(dtype).eps
    steps = _STEPS[jnp.dtype(dtype).itemsize] if steps is None else steps
    big = jnp.maximum(jnp.max(jnp.abs(d), initial=0), jnp.abs(alpha))
    tol = 8 * eps * jnp.maximum(big, jnp.max(jnp.abs(z), initial=0))
    active = jnp.abs(z) > tol  # LAPACK's dlaed2 deflation test
    order = jnp.lexsort((-d, ~active))  # active poles first, each part descending
    a, za, act = d[order], jnp.where(active, z, 0)[order], active[order]
    r = jnp.sum(act)
    distinct = jnp.all(jnp.where(act[:-1] & act[1:], a[:-1] - a[1:] > tol, True))
    origin, tau, converged = _roots(a, za, alpha, act, steps)
    vec = _vectors(a, za, act, origin, tau)
    # Slots past r hold the deflated poles (eigenvalue a_i, vector e_i); with no active pole
    # slot 0 is the corner itself.
    j = jnp.arange(k + 1)
    deflated = jnp.clip(j - 1, 0, k - 1)
    e_pole = jnp.eye(k + 1, dtype=dtype)[deflated]
    corner = (r == 0) & (j == 0)
    lam = jnp.where(corner, alpha, jnp.where(j <= r, a[origin] + tau, a[deflated]))
    vec = jnp.where((j <= r)[:, None], vec, e_pole)
    vec = jnp.where(corner[:, None], jnp.eye(k + 1, dtype=dtype)[k], vec)
    # Back to the caller's order of d; eigenvalues descending.
    inverse = jnp.zeros((k,), jnp.int32).at[order].set(jnp.arange(k, dtype=jnp.int32))
    vec = vec[:, jnp.concatenate([inverse, jnp.array([k], jnp.int32)])]
    desc = jnp.argsort(-lam)
    return lam[desc], vec[desc].T, converged & distinct


def eigh_arrow(gram, j):
    """``(mu, u, ok)`` of a symmetric matrix whose off-diagonal entries are zero outside row and
    column ``j`` (a traced index): :func:`arrowhead_eigh` in the matrix's own index order."""
    n = gram.shape[-1]
    idx = jnp.arange(n)
    others = jnp.where(idx < j, idx, idx + 1)[: n - 1]  # every index but j, in order
    lam, u, ok = arrowhead_eigh(jnp.diagonal(gram)[others], gram[j, others], gram[j, j])
    order = jnp.concatenate([others, jnp.reshape(j, (1,)).astype(others.dtype)])
    return lam, jnp.zeros_like(u).at[order].set(u), ok


def arrowhead_pays() -> bool:
    """Whether the arrowhead solve is worth its kernels: on GPU and TPU ``eigh`` is a solver
    library call costing far more than the ``O(n^2)`` fused work; on XLA:CPU, LAPACK's ``syevd``
    on an ``11 x 11`` matrix (about 3 us) beats the solve's dozens of small kernels (measured:
    ADA-FD at ``d = 100`` went from 11 to 33 us per step). :func:`sketchopt.accelerator_path`
    (or ``SKETCHOPT_ACCELERATOR_PATH=1``) takes this path on the CPU too, so that tests cover it
    on every machine (:func:`sketchopt._solvers.accelerator_path_active`)."""
    return _solvers.accelerator_path_active()


def eigh_desc_structured(gram, arrow):
    """:func:`sketchopt._numerics.eigh_desc` for a Gram matrix that is usually diagonal or an
    arrowhead (off-diagonal entries only in row and column ``arrow``), checked at run time.

    A diagonal matrix is sorted (no solve at all: after a per-step FD shrink the Gram matrix is
    ``diag(shrunk)``); an arrowhead goes through :func:`eigh_arrow` where it converges, on the
    backends where that pays (:func:`arrowhead_pays`); anything else through ``eigh``.

    Returns ``(mu, u, fallback)`` with ``mu`` descending (round-off zeroed) and ``fallback``
    whether an arrowhead (or diagonal) matrix needed ``eigh``. Inside a vmapped group of leaves
    (``sketchopt._groups.grouped``) this is ``eigh`` alone: there a ``cond`` runs every branch.
    A complex (Hermitian) ``gram`` always takes ``eigh`` (the arrowhead solve is real).
    """
    n = gram.shape[-1]
    if n >= 2 and not jnp.iscomplexobj(gram) and _solvers.batchable():
        return _structured_batched(gram, arrow)
    if _groups.grouped() or n < 2 or jnp.iscomplexobj(gram):
        mu, u = _numerics.eigh_desc(gram)
        return mu, u, jnp.bool_(False)
    is_diag, is_arrow = _structure(gram, arrow)
    pays = arrowhead_pays()
    which = jnp.where(is_diag, 1, jnp.where(is_arrow & pays, 2, 0))
    # Module-level branches, operands passed explicitly: outside jit the switch is then traced
    # and compiled once, not at every call (closures would be new functions each time).
    branches = _BRANCHES_ARROW if pays else _BRANCHES
    mu, u, fallback = jax.lax.switch(which, branches, gram, jnp.asarray(arrow, jnp.int32))
    return _numerics.zero_round_off_eigenvalues(mu, n), u, fallback


def diagonal_desc(gram):
    """:func:`sketchopt._numerics.eigh_desc` of a matrix known to be diagonal: its diagonal
    sorted descending (round-off zeroed as there) and the permuted identity, no solve and no
    check (the per-step FD family's Gram matrix after an update). Complex (Hermitian): the
    diagonal is real, the vectors complex, as ``eigh`` gives them."""
    mu, u, _ = _diagonal(gram, None)
    return _numerics.zero_round_off_eigenvalues(mu, gram.shape[-1]), u


def _structure(gram, arrow):
    """Whether ``gram`` is diagonal, and whether it is a (symmetric) arrowhead at ``arrow``."""
    idx = jnp.arange(gram.shape[-1])
    zero = gram == 0
    off = idx[:, None] != idx[None, :]
    is_diag = jnp.all(zero | ~off)
    in_arrow = (idx[:, None] == arrow) | (idx[None, :] == arrow)
    is_arrow = jnp.all(zero | ~off | in_arrow) & jnp.all(gram == gram.T)
    return is_diag, is_arrow


def _structured_batched(gram, arrow):
    """:func:`eigh_desc_structured` inside the update's batched factorizations
    (:mod:`sketchopt._solvers`): a diagonal matrix sorted in plain array operations, any other
    through one ``eigh`` request batched with every group's, run only when some leaf of the
    update needs it (``when``). No arrowhead solve here: with one batched call per update
    instead of one per group, its fused kernels no longer pay for their compile time."""
    is_diag, _ = _structure(gram, arrow)
    mu, u, _ = _diagonal(gram, arrow)
    general_mu, general_u = _numerics.eigh_desc(gram, zero_round_off=False, when=~is_diag)
    mu = jnp.where(is_diag, mu, general_mu)
    u = jnp.where(is_diag, u, general_u)
    return _numerics.zero_round_off_eigenvalues(mu, gram.shape[-1]), u, jnp.bool_(False)


def _general(gram, arrow):
    del arrow
    return (*_numerics.eigh_desc(gram, zero_round_off=False), jnp.bool_(False))


def _diagonal(gram, arrow):
    del arrow
    diag = jnp.real(jnp.diagonal(gram))  # Hermitian: a real diagonal (a real gram: itself)
    order = jnp.argsort(-diag)
    eye = jnp.eye(gram.shape[-1], dtype=gram.dtype)
    return jnp.maximum(diag[order], 0), eye[:, order], jnp.bool_(False)


def _accept(lam, u, gram):
    del gram
    return jnp.maximum(lam, 0), u, jnp.bool_(False)


def _fall_back(lam, u, gram):
    del lam, u
    return (*_numerics.eigh_desc(gram, zero_round_off=False), jnp.bool_(True))


def _arrowhead(gram, arrow):
    lam, u, ok = eigh_arrow(gram, arrow)
    return jax.lax.cond(ok, _accept, _fall_back, lam, u, gram)


_BRANCHES = (_general, _diagonal)
_BRANCHES_ARROW = (_general, _diagonal, _arrowhead)


def householder_null_vector(a):
    """A unit ``q`` with ``a @ q = 0`` for a ``k x n`` matrix ``a``, ``k < n``, in plain array
    operations: Householder QR of ``a^T`` (Golub & Van Loan, Alg. 5.2.1), unrolled over the ``k``
    static columns, and ``q = H_0 H_1 ... H_{k-1} e_n``, the last column of the complete ``Q``.

    ``a`` is scaled to a largest entry of 1 first; a zero column is left alone (``H = I``), so
    any rank works; ``q`` is orthogonal to the rows
    of ``a`` to round-off relative to ``||a||``, as LAPACK's ``geqrf`` + ``orgqr`` give it.
    """
    k, n = a.shape
    scale = jnp.max(jnp.abs(a), initial=0)
    r = (a / jnp.where(scale > 0, scale, 1)).T  # no under/overflow in the squared norms
    idx = jnp.arange(n)
    reflectors = []
    for j in range(k):
        x = jnp.where(idx >= j, r[:, j], 0)
        norm = jnp.sqrt(jnp.sum(jnp.square(x)))
        sign = jnp.where(x[j] < 0, -1, 1).astype(a.dtype)
        v = x.at[j].add(sign * norm)  # x + sign(x_j) ||x|| e_j: no cancellation
        v_norm = jnp.sqrt(jnp.sum(jnp.square(v)))
        v = jnp.where(v_norm > 0, v / jnp.where(v_norm > 0, v_norm, 1), 0)
        r = r - 2 * jnp.outer(v, v @ r)
        reflectors.append(v)
    q = jnp.zeros((n,), a.dtype).at[n - 1].set(1)
    for v in reversed(reflectors):
        q = q - 2 * v * (v @ q)
    return q


def null_vector(a):
    """A unit ``q`` with ``a @ q = 0`` for a ``k x n`` matrix ``a``, ``k < n``:
    :func:`householder_null_vector` (no solver-library call) where the arrowhead solve pays
    (:func:`arrowhead_pays`) and inside the driver's batched factorizations (the lazy basis
    serves rows of 16384 entries and more, beside whose ``O(n d)`` pass the ``k`` reflections
    cost nothing, and a QR there would be one more batched call per update); LAPACK's complete
    QR of ``a^T`` on the CPU otherwise. A complex ``a`` always takes the QR, whose last column
    ``q`` satisfies ``q^H a^T = 0``: the null vector is ``conj(q)``."""
    if jnp.iscomplexobj(a):
        q, _ = _solvers.qr(a.T, mode="complete")
        return jnp.conj(q[:, -1])
    if arrowhead_pays() or _solvers.batchable():
        return householder_null_vector(a)
    q, _ = _solvers.qr(a.T, mode="complete")
    return q[:, -1]
