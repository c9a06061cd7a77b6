r"""Composite regularizers ``phi`` and their proximal steps under a metric ``H``.

Every rule of :mod:`sketchopt.transforms` (composite mirror descent and dual averaging) reduces to
one proximal step per parameter leaf (Duchi, Hazan & Singer, *Adaptive Subgradient Methods*,
sec. 6, eq. 21)::

    x* = argmin_x  <u, x> + c * phi(x) + 1/2 <x, H x>,        c >= 0,

with ``u`` a flat ``(d,)`` vector and ``H`` one of the operators of :mod:`sketchopt.operators`.
The same problem in **center form**, ``x* = argmin_x c * phi(x) + 1/2 ||x - z||_H^2``
(``u = -H z``), is what the rules pass (``z`` = the unregularized step, e.g.
``x_t - eta H^{-1} g_t``): forming ``u = eta g - H x_t`` loses the part of ``x_t`` on the small
eigenvalues of ``H`` to rounding once ``cond(H) > 1/eps`` (``|g| ~ 1e4``, ``delta = 1e-3`` in
float32), and the step is then garbage. Every solver below works on ``z`` directly and never
forms ``H z``.
This module provides the regularizers

====================  ========================================================================
constructor           ``phi(x)``
====================  ========================================================================
``l1(s)``             ``s * ||x||_1``
``l2_squared(s)``     ``s/2 * ||x||_2^2`` (the paper's convention of sec. 6.2, giving eq. 25)
``l2(s)``             ``s * ||x||_2`` (one group: the whole leaf)
``linf(s)``           ``s * ||x||_inf``
``l1_ball(r)``        indicator of ``{x : ||x||_1 <= r}`` (the domain ``X`` of sec. 6.3)
``mixed_l1_l2(s)``    ``s * sum_i ||X_i||_2`` over the rows ``X_i`` of a 2-D leaf (sec. 6.6)
``mixed_l1_linf(s)``  ``s * sum_i ||X_i||_inf`` over the rows of a 2-D leaf (sec. 6.6)
====================  ========================================================================

For the mixed norms a leaf that is not 2-D is treated as a single row, i.e. ``mixed_l1_l2`` is then
``l2`` and ``mixed_l1_linf`` is ``linf`` of the whole leaf. ``l1_ball`` is a constraint, not a
penalty: the indicator is invariant under scaling by ``c > 0`` and the constraint is enforced for
every ``c`` (also ``c = 0``), so iterates always stay feasible.

Each constructor returns an immutable (hashable) object with

* ``value(x)`` -- ``phi(x)`` for a leaf of any shape;
* ``prox(u, c, op, *, shape, x0=None, center=None)`` -- the ``x*`` above (flat in, flat out);
  ``prox(None, c, op, shape=..., center=z)`` is the center form;
* ``prox_with_info(...)`` -- the same plus a :class:`ProxInfo` (iterations, final residual);
* ``prox_euclidean(v, t, *, shape)`` -- ``argmin_x 1/2 ||x - v||^2 + t * phi(x)``.

Diagonal metric (``DiagonalOperator``, ADA-DIAG): the closed forms of the paper
---------------------------------------------------------------------------------
* ``l1``: eq. 22/24, ``x_i = -sign(u_i) [|u_i| - c s]_+ / h_i``.
* ``l2_squared``: eq. 25, ``x = -u / (h + c s)``.
* ``l1_ball``: Fig. 3 (sort-based, exact): ``x_i = -sign(u_i) [|u_i| - theta]_+ / h_i`` with the
  threshold ``theta >= 0`` making ``||x||_1 = r`` (or ``theta = 0`` if already feasible).
* ``linf``: the dual of sec. 6.5 is the same weighted l1 projection (Fig. 3) of ``u``; it gives
  ``x = -clip(u / h, -theta, theta)`` with ``sum_i [|u_i| - theta h_i]_+ = c s`` (``x = 0`` when
  ``||u||_1 <= c s``). Exact, sort-based.
* ``l2`` (group): ``x = 0`` if ``||u|| <= c s``, else ``x = -t u / (1 + t h)`` where ``t > 0``
  solves the scalar secular equation ``||u / (1 + t h)|| = c s``. This is the paper's Fig. 4
  problem; instead of its bisection we run Newton on ``1/||u / (1 + t h)|| = 1/(c s)``, whose
  left-hand side is concave and increasing in ``t``, started from a lower bound of the root: the
  iterates increase monotonically and converge quadratically to machine precision (typically
  4-8 steps of O(d)).
* mixed norms: the same, row by row (sec. 6.6), vectorized over rows.

Coordinates with ``h_i = 0`` (ADA-DIAG with ``delta = 0``, where ``u_i = 0`` too) give ``x_i = 0``.

Low-rank-plus-identity metric (``LowRankOperator``, ADA-FD and ADA-FULL)
-------------------------------------------------------------------------
Write ``H = s I + B^T B`` with ``B = W^{1/2} V`` (``k x d``). ``H`` itself (``d x d``) is never
formed: products go through the operator's ``project``/``lift`` (``O(n d)`` each). Three cases have
exact solutions:

* ``l2_squared``: ``x = -(H + c s I)^{-1} u``, one Woodbury shifted solve;
* ``l2``: the eigen-decomposition of ``H`` is known (eigenvalues ``s + w_j`` on the rows of ``V``,
  ``s`` on their orthogonal complement), so the secular equation of the diagonal case is solved on
  the ``k + 1`` numbers ``(V u, ||u - V^T V u||)`` and ``x = -(H + mu I)^{-1} u``;
* ``c * strength = 0`` (``phi`` switched off): ``x = -H^{-1} u`` by Woodbury, exactly.

In center form both use the spectrum directly, ``x = (H + mu I)^{-1} H z`` as
``V^T diag((s + w) / (s + w + mu)) V z + s / (s + mu) (z - V^T V z)`` (the secular equation on
``((s + w) V z, s ||z - V^T V z||)``), and ``phi = 0`` gives ``x = z``.

The others (``l1``, ``linf``, ``l1_ball``, mixed norms) use an inner solver. The default is a
**semismooth Newton method on the k-dimensional dual**. Dualizing only the low-rank part,
``1/2 ||B x||^2 = max_g <g, B x> - 1/2 ||g||^2``, gives the concave dual

    D(g) = min_x [ <u + B^T g, x> + c phi(x) + s/2 ||x||^2 ] - 1/2 ||g||^2,

whose inner minimizer is the *Euclidean* prox ``x(g) = prox_{(c/s) phi}(-(u + B^T g)/s)`` (closed
form for every regularizer here), with ``grad D(g) = B x(g) - g``; the optimum has ``g = B x*``.
``D`` is 1-strongly concave with a Lipschitz, strongly semismooth gradient, so Newton steps
``(I + B J B^T / s) dg = B x(g) - g`` (``J`` a generalized Jacobian of the Euclidean prox, "diagonal
plus one rank-one term per group") with an Armijo line search on ``D`` converge globally and
superlinearly -- finitely for the piecewise-affine ``l1``/``linf``/``l1_ball`` proxes once the
active set is identified. The Newton matrix has eigenvalues in ``[1, 1 + w_max/s]``: the
conditioning of ``H`` (``lambda_max/lambda_min`` up to 1e6 and beyond) hardly changes the iteration
count (typically 2-8), unlike first-order splittings (ADMM, accelerated proximal gradient) that
need ``O(sqrt(kappa) log(1/tol))`` iterations. ``B`` is materialized once as a ``k x d`` matrix
(``O(k n d)``) so that the ``k x k`` Newton matrix is assembled as a Gram matrix ``Y Y^T``
(``O(k^2 d)`` per iteration), positive semidefinite by construction however ill-conditioned
``coef`` and ``basis`` are. Per iteration further: one lift, one projection and ``O(d)`` per
line-search trial. Every iterate ``x(g)`` is an output of the Euclidean prox, hence exactly sparse
(``l1``) and exactly feasible (``l1_ball``).

In center form the dual variable is shifted by the center, ``g' = g - B z``: then
``x(g') = prox_{(c/s) phi}(z - B^T g' / s)``, ``grad D = B (x - z) - g'`` and
``D(g') = c phi(x) + s/2 ||x - z||^2 + <B^T g', x - z> - 1/2 ||g'||^2`` (+ const), with the same
Newton matrix. At the solution ``B^T g' / s = -(c/s) (V^T W V) H^{-1} xi`` (``xi`` in ``d phi``)
is of the size of the regularizer's effect, so nothing cancels however large ``w / s`` is; the
``u``-form is the special case ``z = 0``.

``l1_ball`` runs this Newton method for at most 8 iterations; its model only sees the current
support of the projection and can crawl when the constraint is strongly active, the support tiny
and ``H`` badly conditioned. Unconverged problems then switch to a search for the constraint's
multiplier ``theta`` (Illinois false position on the continuous, monotone, piecewise-linear
``||x(theta)||_1``), where ``x(theta)`` is the ``l1``-regularized step above, warm-started; the
reported iterations are the total inner Newton iterations.

When the constraint cuts the large eigenvalues of ``H`` its multiplier is of their size, so both
phases compute ``x`` on the support from numbers of size ``theta / s`` and lose it to rounding
(``eps * cond(H)``). After each phase an **active-set polish** therefore solves the KKT system on
the support (``|A| <= k`` entries, an ``(|A| + 1)``-dimensional, well-conditioned system), adding
or dropping single coordinates, and keeps the result only if it passes the optimality check (it
then reports residual 0).

For very large bases (``n > 1024``, e.g. ADA-FULL in high dimension) the ``O(k n d + k^2 d)``
Newton work dominates and ``solver="auto"`` switches to over-relaxed (1.6) **ADMM** on ``x = y``:
the ``x``-step is a Woodbury shifted solve ``(H + rho I)^{-1}``, the ``y``-step the Euclidean prox,
with ``rho = sqrt(lambda_min * lambda_max)`` (the optimal choice for strongly convex quadratics,
Ghadimi et al. 2015); ``O(n d)`` per iteration but ``O(sqrt(kappa))`` iterations, so badly
conditioned problems may hit ``max_iter``. ``solver="newton"`` / ``"admm"`` force a choice.

Stopping rule: the relative KKT residual measured in the metric's dual norm,
``||e||_{H^{-1}} / max(||u||_{H^{-1}}, ||x||_H)`` where ``e`` is an element of
``u + H x + c d(phi)(x)`` at the returned ``x`` (Newton: ``e = B^T (B x - g)``, in ``O(k)``;
ADMM: ``e = u + H y + rho w``, checked every 10 iterations; in center form
``||u||_{H^{-1}} = ||z||_H``, ``e = B^T (B (x - z) - g')`` and ``e = H (y - z) + rho w``). By
strong convexity it bounds the relative error, ``||x - x*||_H <= ||e||_{H^{-1}}``, and unlike the
Euclidean residual it is insensitive to the conditioning of ``H``. The loop stops when it is below
``tol`` (``tol`` is raised to ``64 * eps`` of the working dtype), after ``max_iter`` iterations
(default 50 for Newton, 5000 for ADMM), or when Newton stalls at rounding level (a full step that
no longer reduces a residual below ``6.4e4 * eps``; float32 with ``kappa ~ 1e6``). Both solvers
warm-start from ``x0`` (Newton from ``g0 = B x0``, ADMM from ``y0 = x0`` and its matching dual).
In center form the solvers start at ``x = z`` (``g' = 0``) and Newton takes ``x0`` only when its
dual value is higher; ADMM's ``x``-step is then ``z + rho (H + rho I)^{-1} (v - z)`` and its
residual uses ``H (y - z)``. Problems with a positively homogeneous ``phi`` (and ``l1_ball``,
with its radius) are rescaled by ``max |u|`` (center form: ``max |z|``) so that huge inputs
(``1e30`` in float32) do not overflow; the operator's ``scale_exp`` is honoured.

All functions are jittable and vmappable (over ``u``, ``c`` and batched operators); the working
dtype is ``u``'s (the center's in center form; at least float32) and the result has that dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from sketchopt import _numerics, _partitioning, _validation
from sketchopt.operators import DiagonalOperator, LowRankOperator

__all__ = [
    "ProxInfo",
    "Regularizer",
    "l1",
    "l1_ball",
    "l2",
    "l2_squared",
    "linf",
    "mixed_l1_l2",
    "mixed_l1_linf",
    "soft_threshold",
]


def _vdot(a, b):
    """``<a, b>`` over the (possibly sharded) long axis, a replicated scalar."""
    return _partitioning.contract_d(jnp.ravel(a), jnp.ravel(b))


def _einsum_small(spec, a, b):
    """An einsum contracting (part of) the long axis into a small, replicated result."""
    if _partitioning.explicit_mesh():
        return jnp.einsum(
            spec, a, b, precision=_numerics.HIGHEST, out_sharding=jax.sharding.PartitionSpec()
        )
    return jnp.einsum(spec, a, b, precision=_numerics.HIGHEST)


_NEWTON_MAX_BASIS = 1024  # solver="auto": Newton up to this many basis rows, then ADMM
_SOLVERS = ("auto", "newton", "admm")
_ADMM_RELAXATION = 1.6
_ADMM_CHECK = 10  # ADMM iterations between two (exact) residual checks
_ARMIJO = 1e-4
_MAX_BACKTRACK = 30


class ProxInfo(NamedTuple):
    """Diagnostics of one proximal step: iterations of the inner solver and its final residual.

    Closed forms report ``iterations = 0`` and ``residual = 0``. The residual is the relative KKT
    residual in the metric's dual norm, ``||e||_{H^{-1}} / max(||u||_{H^{-1}}, ||x||_H)`` with
    ``e`` an element of ``u + H x + c d(phi)(x)`` (center form: ``||u||_{H^{-1}} = ||z||_H``); by
    strong convexity ``||x - x*||_H <= ||e||_{H^{-1}}``.

    Attributes:
      iterations: int32 scalar, the inner solver's iterations (``l1_ball``: the inner Newton
        iterations of both phases).
      residual: scalar of the working dtype, the final relative KKT residual (0 for closed forms
        and for verified active-set solutions of ``l1_ball``).

    References:
      The step is eq. (21) of Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online
      Learning and Stochastic Optimization"; the residual is this module's stopping rule.

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import l1
      >>> h = DiagonalOperator(jnp.array([2.0, 1.0]))
      >>> x, info = l1(1.0).prox_with_info(jnp.array([3.0, -0.5]), 1.0, h, shape=(2,))
      >>> x.tolist(), int(info.iterations), float(info.residual)
      ([-1.0, 0.0], 0, 0.0)
    """

    iterations: jnp.ndarray
    residual: jnp.ndarray


# --------------------------------------------------------------------------------------------------
# small numerical helpers


def _work_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _safe_norm(x, axis=None, keepdims=False):
    """``||x||_2`` without overflow/underflow (scaled by ``max |x|``); 0 for empty or zero input."""
    a = jnp.abs(x)
    m = jnp.max(a, axis=axis, keepdims=True, initial=0)
    ms = jnp.where(m > 0, m, 1)
    n = ms * jnp.sqrt(jnp.sum(jnp.square(a / ms), axis=axis, keepdims=True))
    n = jnp.where(m > 0, n, 0)
    if not keepdims:
        n = jnp.squeeze(n, axis=axis) if axis is not None else n.reshape(())
    return n


def _complex_check(reg, wd, op):
    """The real dtype of ``wd``; for complex ``wd`` (complex parameters), a ``TypeError`` at trace
    time unless the prox has a Hermitian form here: ``l1`` with a diagonal metric (the complex
    soft threshold ``z max(0, 1 - tau / |z|)``, which shrinks the modulus and keeps the phase)
    and ``l2_squared`` with either metric (``x = (H + c s I)^{-1} H z``)."""
    if not jnp.issubdtype(wd, jnp.complexfloating):
        return wd
    if reg.name == "l2_squared" or (reg.name == "l1" and isinstance(op, DiagonalOperator)):
        return jnp.finfo(wd).dtype
    where = " with a low-rank metric" if reg.name == "l1" else ""
    raise TypeError(f"regularizer {reg.name}{where}: complex parameters are not supported")


def _safe_div(a, b):
    """``a / b`` with ``0`` where ``b == 0``."""
    return jnp.where(b != 0, a / jnp.where(b != 0, b, 1), 0)


def _argmax_last(a, iota):
    """``argmax`` along the last axis by two max-reductions (ties: the largest index), so that a
    sharded axis is all-reduced, never gathered; ``iota`` is ``arange`` of that axis."""
    top = jnp.max(a, axis=-1, keepdims=True)
    return jnp.maximum(jnp.max(jnp.where(a == top, iota, -1), axis=-1), 0)


def _rows(shape) -> tuple[int, int]:
    """The ``(rows, cols)`` view used by the mixed norms: 2-D leaves by rows, others as one row."""
    shape = tuple(shape)
    if len(shape) == 2:
        return shape
    return 1, math.prod(shape)


def _threshold(keys, weights, wk, radius):
    """Fig. 3 of Duchi et al.: ``theta >= 0`` with ``sum_i w_i [k_i - theta]_+ = radius``.

    Works along the last axis (``keys``, ``weights >= 0``, ``wk = weights * keys`` computed by the
    caller as accurately as possible), ``radius >= 0`` broadcast over the leading axes. Returns
    ``0`` when ``sum_i w_i k_i <= radius`` (constraint inactive) and ``max k`` when ``radius = 0``.
    Sort-based, ``O(m log m)``, exact up to rounding.
    """
    if keys.shape[-1] == 0:
        return jnp.zeros(keys.shape[:-1], keys.dtype)
    # The sort needs the whole axis on each device (under an explicit mesh, gather it).
    keys, weights, wk = (_partitioning.replicate(a) for a in (keys, weights, wk))
    order = jnp.argsort(-keys, axis=-1)
    ks = jnp.take_along_axis(keys, order, axis=-1)
    s1 = jnp.cumsum(jnp.take_along_axis(wk, order, axis=-1), axis=-1)
    s2 = jnp.cumsum(jnp.take_along_axis(weights, order, axis=-1), axis=-1)
    radius = jnp.asarray(radius, keys.dtype)[..., None]
    # c_rho = sum_{j <= rho} w_j (k_rho - k_j) + radius is non-increasing in rho: a prefix is valid.
    valid = ks * s2 - s1 + radius > 0
    rho = jnp.sum(valid, axis=-1, keepdims=True)
    idx = jnp.maximum(rho - 1, 0)
    s1r = jnp.take_along_axis(s1, idx, axis=-1)
    s2r = jnp.take_along_axis(s2, idx, axis=-1)
    kmax = ks[..., :1]
    theta = jnp.where(rho > 0, _safe_div(s1r - radius, s2r), kmax)
    theta = jnp.where(s1[..., -1:] <= radius, 0, theta)
    theta = jnp.clip(theta, 0, kmax)
    return theta[..., 0]


def _secular_t(a, h, tau, max_iter=64):
    """Solve ``|| a / (1 + t h) ||_2 = tau`` for ``t > 0``, row-wise along the last axis.

    Preconditions per row: ``||a|| > tau > 0`` and ``h > 0`` wherever ``a != 0``. The function
    ``1/||a/(1 + t h)||`` is concave and increasing in ``t``; Newton from the lower bound
    ``t_lo = (||a||/tau - 1)/h_max`` increases monotonically to the root. Rows violating the
    preconditions return a finite (meaningless) value that the caller masks out.
    """
    dtype = a.dtype
    eps = jnp.finfo(dtype).eps
    # Rescale each row so that max|a| = 1 (1e30 inputs in float32 must not overflow).
    m = jnp.max(jnp.abs(a), axis=-1, keepdims=True, initial=0)
    ms = jnp.where(m > 0, m, 1)
    a = a / ms
    tau = jnp.asarray(tau, dtype) / ms[..., 0]
    a2 = jnp.square(a)
    na = jnp.sqrt(jnp.sum(a2, axis=-1))
    ratio = jnp.maximum(na / jnp.where(tau > 0, tau, 1) - 1, 0)
    nz = a != 0
    h_max = jnp.max(jnp.where(nz, h, 0), axis=-1, initial=0)
    h_min = jnp.min(jnp.where(nz, h, jnp.inf), axis=-1, initial=jnp.inf)
    t_lo = _safe_div(ratio, h_max)
    t_hi = jnp.where(h_min > 0, ratio / jnp.where(h_min > 0, h_min, 1), jnp.finfo(dtype).max)
    t_hi = jnp.where(jnp.isfinite(t_hi), t_hi, jnp.finfo(dtype).max)
    inv_tau = 1 / jnp.where(tau > 0, tau, 1)

    def newton(t):
        tt = t[..., None]
        den = 1 + tt * h
        g2 = jnp.sum(a2 / jnp.square(den), axis=-1)
        g = jnp.sqrt(g2)
        f = 1 / jnp.where(g > 0, g, 1) - inv_tau
        df = jnp.sum(a2 * h / (den * jnp.square(den)), axis=-1) / jnp.where(g > 0, g * g2, 1)
        step = _safe_div(-f, df)
        t_new = jnp.clip(t + jnp.maximum(step, 0), t_lo, t_hi)
        return t_new

    def cond(state):
        it, t, t_prev = state
        moving = jnp.any(jnp.abs(t - t_prev) > 4 * eps * jnp.abs(t))
        return (it < max_iter) & moving

    def body(state):
        it, t, _ = state
        return it + 1, newton(t), t

    t0 = t_lo
    _, t, _ = lax.while_loop(cond, body, (jnp.int32(1), newton(t0), t0))
    return t


# --------------------------------------------------------------------------------------------------
# Jacobian of a Euclidean prox: J = diag(dg) + sum_r a_r g_r g_r^T, g_r supported on row r.


class _Jac(NamedTuple):
    dg: jnp.ndarray  # (d,)
    g: Any  # (R, C) or None
    a: Any  # (R,) or None


@dataclasses.dataclass(frozen=True)
class Regularizer:
    """Base class of the composite terms; build instances with the module's constructors.

    An instance defines ``phi`` (:meth:`value`) and computes, for a metric ``H`` (a
    ``DiagonalOperator`` or a ``LowRankOperator``), the proximal step

        ``prox(u, c, H) = argmin_x <u, x> + c * phi(x) + 1/2 <x, H x>``,

    or in center form ``argmin_x c * phi(x) + 1/2 ||x - z||_H^2`` (:meth:`prox`), and the
    Euclidean prox ``argmin_x 1/2 ||x - v||^2 + t * phi(x)`` (:meth:`prox_euclidean`). Diagonal
    metrics use the closed forms of the paper; low-rank metrics an exact formula where one exists
    and otherwise the inner solver (semismooth Newton on the k-dimensional dual, or ADMM; module
    docstring). Instances are immutable and hashable.

    Attributes:
      strength: the regularization strength (the radius for ``l1_ball``).
      tol: relative KKT tolerance of the inner solver (``LowRankOperator`` only), in ``(0, 1)``
        (default ``1e-6``; never below ``64 * eps`` of the working dtype).
      max_iter: iteration cap of the inner solver, ``>= 1``; ``None``: 50 (Newton), 5000 (ADMM).
      solver: ``"auto"`` (Newton up to 1024 basis rows, else ADMM), ``"newton"`` or ``"admm"``.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6, eq. (21) (the step) and sec. 6.1-6.6 (the diagonal closed forms);
      Ghadimi, Teixeira, Shames & Johansson, "Optimal Parameter Selection for the Alternating
      Direction Method of Multipliers (ADMM): Quadratic Problems", IEEE TAC 2015 (ADMM's
      ``rho = sqrt(lambda_min lambda_max)``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import LowRankOperator
      >>> from sketchopt.regularizers import l1, l2_squared
      >>> reg = l1(0.5)
      >>> float(reg.value(jnp.array([1.0, -2.0])))
      1.5
      >>> reg.prox_euclidean(jnp.array([1.0, 0.25]), 1.0, shape=(2,)).tolist()
      [0.5, 0.0]
      >>> op = LowRankOperator(  # H = I + 3 e_1 e_1^T = diag(4, 1, 1)
      ...     scalar=jnp.array(1.0), basis=jnp.eye(2, 3), coef=jnp.eye(2),
      ...     weights=jnp.array([3.0, 0.0]))
      >>> u = jnp.array([10.0, -4.0, 1.0])
      >>> l2_squared(1.0).prox(u, 1.0, op, shape=(3,)).round(4).tolist()  # -(H + I)^{-1} u
      [-2.0, 2.0, -0.5]
    """

    strength: float
    tol: float = 1e-6
    max_iter: int | None = None
    solver: str = "auto"

    name = "regularizer"
    _homogeneous = True  # phi(a x) = a phi(x) for a > 0: the prox problem can be rescaled

    def __post_init__(self):
        # One rule for every constructor (sketchopt._validation): a concrete strength is checked
        # and kept as a float, a traced one (vmap, inject_hyperparams) is accepted as it is.
        strength = _validation.strength(
            "strength" if self.name != "l1_ball" else "radius", self.strength
        )
        if not _validation.is_traced(strength):
            strength = float(strength)
        object.__setattr__(self, "strength", strength)
        tol = self.tol
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
            raise ValueError(f"{self.name}: `tol` must be a number in (0, 1), got {tol!r}")
        object.__setattr__(self, "tol", float(tol))
        mi = self.max_iter
        if mi is not None and (isinstance(mi, bool) or not isinstance(mi, int) or mi < 1):
            raise ValueError(f"{self.name}: `max_iter` must be an int >= 1 or None, got {mi!r}")
        if self.solver not in _SOLVERS:
            raise ValueError(
                f"{self.name}: `solver` must be one of {_SOLVERS}, got {self.solver!r}"
            )

    # ---- to be provided by subclasses -------------------------------------------------------

    def value(self, x):
        """``phi(x)`` (a scalar) for a leaf ``x`` of any shape."""
        raise NotImplementedError

    def _dual_value(self, x, shape):
        """``phi`` on outputs of the Euclidean prox (the indicator is 0 there)."""
        return self.value(x.reshape(shape))

    def _euclid(self, v, t, shape):
        """``(prox_{t phi}(v), Jacobian)`` for flat ``v``; ``t >= 0`` scalar."""
        raise NotImplementedError

    def _diag(self, u, c, h, shape):
        """Closed form for ``H = diag(h)``, flat ``u``; ``u = 0`` wherever ``h = 0``."""
        raise NotImplementedError

    def _lowrank_exact(self, u, c, op, shape, z=None):
        """Exact solution for a LowRankOperator, or ``None`` to use the inner solver.

        One of ``u`` (the linear term) and ``z`` (the center) is given, the other is ``None``.
        """
        return None

    def _newton(self, u, c, op, shape, x0, tol, max_iter, z=None):
        return _newton_dual(self, u, c, op, shape, x0, tol, max_iter, z)

    # ---- public API ---------------------------------------------------------------------------

    def prox_euclidean(self, v, t, *, shape):
        """``argmin_x 1/2 ||x - v||^2 + t * phi(x)``: the prox with ``H = I``, in closed form.

        Args:
          v: the point, flat or of ``shape``.
          t: ``>= 0``, scalar weight of ``phi`` (negative values count as 0).
          shape: the leaf's shape (the mixed norms read its rows).

        Returns:
          The minimizer, with the shape and dtype of ``v``.
        """
        v = jnp.asarray(v)
        wd = _work_dtype(v.dtype)
        flat = v.reshape(-1).astype(wd)
        t = jnp.maximum(jnp.asarray(t, wd), 0)
        x, _ = self._euclid(flat, t, tuple(shape))
        return x.astype(v.dtype).reshape(v.shape)

    def prox(self, u, c, op, *, shape, x0=None, center=None):
        """``argmin_x <u, x> + c * phi(x) + 1/2 <x, H x>`` for flat ``u`` and ``H = op``.

        With ``center=z`` (and ``u=None``) this is the prox at ``z`` in the ``H``-norm,
        ``argmin_x c * phi(x) + 1/2 ||x - z||_H^2``: the same problem as ``u = -H z``, but
        accurate when ``H`` is ill-conditioned (``cond(H)`` up to ``1/eps`` and beyond), where
        forming ``u = -H z`` loses the part of ``z`` on the small eigenvalues of ``H`` to
        rounding. Composite mirror descent is this prox at ``z = x_t - eta H^{-1} g_t``. When
        both are given the problem is ``argmin <u, x> + c phi(x) + 1/2 ||x - z||_H^2``, solved as
        the prox at ``z - H^{-1} u``.

        Args:
          u: the linear term with ``prod(shape)`` entries, or ``None`` (then give ``center``).
          c: ``>= 0``, scalar weight of ``phi`` (negative values count as 0).
          op: ``H``, a ``DiagonalOperator`` or a ``LowRankOperator``.
          shape: the leaf's shape (the mixed norms read its rows).
          x0: optional warm start of the inner solver (``LowRankOperator`` only).
          center: the center ``z`` with ``prod(shape)`` entries, or ``None``.

        Returns:
          ``x*``, shaped like ``center`` if given, else like ``u``, in their promoted dtype.
        """
        return self.prox_with_info(u, c, op, shape=shape, x0=x0, center=center)[0]

    def prox_with_info(self, u, c, op, *, shape, x0=None, center=None):
        """Like :meth:`prox` (same arguments), also returning a :class:`ProxInfo`.

        Returns:
          ``(x*, info)``.
        """
        if u is None and center is None:
            raise ValueError(f"{self.name}.prox: give `u`, `center` or both")
        ref = jnp.asarray(u if center is None else center)
        shape = tuple(shape)
        d = math.prod(shape)
        for what, a in (("u", u), ("center", center)):
            if a is not None and jnp.size(a) != d:
                raise ValueError(
                    f"{self.name}.prox: {what} has {jnp.size(a)} entries, shape {shape} has {d}"
                )
        dtype = ref.dtype if u is None else jnp.result_type(u, ref)
        wd = _work_dtype(dtype)
        rd = _complex_check(self, wd, op)  # the real dtype of c, h, scalar, weights
        uf = None if u is None else jnp.asarray(u).reshape(-1).astype(wd)
        zf = None if center is None else jnp.asarray(center).reshape(-1).astype(wd)
        c = jnp.maximum(jnp.asarray(c, rd), 0)
        zero_info = ProxInfo(jnp.int32(0), jnp.zeros((), rd))
        if isinstance(op, DiagonalOperator):
            h = jnp.asarray(op.diag, rd).reshape(-1)
            h = jnp.maximum(h, 0)
            if zf is not None:  # per coordinate: no cancellation across coordinates
                uz = -h * zf
                uf = uz if uf is None else uf + uz
            uf = jnp.where(h > 0, uf, 0)
            x, info = self._diag(uf, c, h, shape), zero_info
        elif isinstance(op, LowRankOperator):
            op = op.in_true_units()._replace(
                scalar=jnp.asarray(op.scalar, rd),
                basis=jnp.asarray(op.basis, wd),
                coef=jnp.asarray(op.coef, wd),
                weights=jnp.maximum(jnp.asarray(op.weights, rd), 0),
            )
            if uf is not None and zf is not None:
                zf, uf = zf - op.solve(uf), None
            x, info = self._lowrank(uf, c, op, shape, x0, zf)
        else:
            raise TypeError(
                f"{self.name}.prox: op must be a DiagonalOperator or LowRankOperator, got "
                f"{type(op).__name__}"
            )
        return x.astype(dtype).reshape(ref.shape), info

    # ---- low-rank dispatch ----------------------------------------------------------------------

    def _lowrank(self, u, c, op, shape, x0, z=None):
        """``u``-form (``z is None``) or center form (``u is None``), see :meth:`prox`."""
        a = u if z is None else z
        wd = a.dtype
        zero_info = ProxInfo(jnp.int32(0), jnp.zeros((), wd))
        exact = self._lowrank_exact(u, c, op, shape, z)
        if exact is not None:
            return exact, zero_info
        if a.size == 0:
            return a, zero_info
        solver = self.solver
        if solver == "auto":
            solver = "newton" if op.basis.shape[0] <= _NEWTON_MAX_BASIS else "admm"
        max_iter = self.max_iter or (50 if solver == "newton" else 5000)
        tol = max(self.tol, 64 * float(jnp.finfo(wd).eps))
        if x0 is not None:
            x0 = jnp.asarray(x0, wd).reshape(-1)
            x0 = jnp.where(jnp.isfinite(x0), x0, 0)  # a warm start must never poison the solve
        # Rescale homogeneous problems: x*(u, c) = sigma * x*(u / sigma, c / sigma), and the same
        # for the center form, x*(z, c) = sigma * x*(z / sigma, c / sigma).
        if self._homogeneous:
            m = jnp.max(jnp.abs(a), initial=0)
            sigma = jnp.where(m > 0, m, 1)
        else:
            sigma = jnp.ones((), wd)
        us = None if u is None else u / sigma
        zs = None if z is None else z / sigma
        cs = c / sigma
        x0s = None if x0 is None else x0 / sigma
        if solver == "newton":
            xs, info = self._newton(us, cs, op, shape, x0s, tol, max_iter, zs)
        else:
            xs, info = _admm(self, us, cs, op, shape, x0s, tol, max_iter, zs)
        x = xs * sigma
        if self._homogeneous:
            # c * strength == 0: the unregularized minimizer, exactly.
            free = c * self.strength == 0
            x = jnp.where(free, -op.solve(u) if z is None else z, x)
            info = ProxInfo(jnp.where(free, 0, info.iterations), jnp.where(free, 0, info.residual))
        return x, info


def _lowrank_parts(op):
    """``B x`` and ``B^T a`` for ``B = W^{1/2} V``, through the operator's own products."""
    sw = jnp.sqrt(op.weights)

    def bmat(x):
        return sw * op.project(x)

    def bt(a):
        return op.lift(sw * a)

    return sw, bmat, bt


def _norm_hinv(op, u):
    """``||u||_{H^{-1}} = sqrt(u^T H^{-1} u)`` from the spectral form of ``H`` (two passes)."""
    p = op.project(u)
    perp = _safe_norm(u - op.lift(p))
    s = op.scalar
    return jnp.sqrt(jnp.sum(jnp.square(p) / (s + op.weights)) + jnp.square(perp) / s)


def _norm_h(op, z, bz):
    """``||z||_H = sqrt(s ||z||^2 + ||B z||^2)`` given ``bz = B z``, without overflow."""
    return jnp.hypot(jnp.sqrt(op.scalar) * _safe_norm(z), _safe_norm(bz))


class _DualProblem(NamedTuple):
    """One problem of :func:`_newton_dual` and the data its helpers share (built once)."""

    reg: Any  # the regularizer (or _Ball)
    u: Any  # u-form: the linear term; center form: None
    z: Any  # center form: the center; u-form: None
    c: Any
    shape: tuple
    op: Any  # the LowRankOperator
    wd: Any  # working dtype
    eps: Any
    s: Any  # the operator's scalar
    k: int  # rows of B
    t: Any  # c / s, the weight of the Euclidean prox
    wmax: Any  # max w: L = 1 + w_max / s bounds the dual's curvature
    bmat: Any  # x -> B x
    bt: Any  # a -> B^T a
    bz: Any  # B z (u-form: 0)
    nu_h: Any  # ||u||_{H^{-1}} (center form: ||z||_H)
    hinv_w: Any  # w / (s + w): the eigenvalues of B H^{-1} B^T on the rows of V
    bm: Any  # B as a k x d matrix
    projector: bool  # the Euclidean prox's Jacobian is a projector (l1-ball)


def _dual_problem(reg, u, c, op, shape, z):
    """The data of :func:`_newton_dual` for one problem (u-form or center form)."""
    wd = (u if z is None else z).dtype
    eps = jnp.finfo(wd).eps
    s = op.scalar
    sw, bmat, bt = _lowrank_parts(op)
    k = sw.shape[0]
    cw = sw[:, None] * op.coef  # (k, n)
    scale_exp = -jnp.asarray(getattr(op, "scale_exp", 0), jnp.int32)
    t = c / s
    wmax = jnp.max(op.weights, initial=0)
    if z is None:
        nu_h = _norm_hinv(op, u)
        bz = jnp.zeros((k,), wd)
    else:
        bz = bmat(z)
        nu_h = _norm_h(op, z, bz)  # ||u||_{H^{-1}} for u = -H z
    # Residual in the H^{-1} norm: on the rows of V, H has eigenvalues s + w_j, hence
    # ||B^T r||_{H^{-1}}^2 = sum_j w_j r_j^2 / (s + w_j); ||x||_H^2 = s ||x||^2 + ||B x||^2.
    hinv_w = op.weights / (s + op.weights)
    # B materialized once as a k x d matrix (V = 2**-scale_exp coef @ basis; scale the basis, not
    # the possibly huge/tiny products). The Newton matrix is then assembled as a Gram matrix,
    # positive semidefinite by construction whatever the conditioning of coef and basis.
    bm = jnp.matmul(cw, _numerics.ldexp(op.basis, scale_exp), precision=_numerics.HIGHEST)
    projector = getattr(reg, "_jac_projector", False)
    return _DualProblem(
        reg, u, z, c, shape, op, wd, eps, s, k, t, wmax, bmat, bt, bz, nu_h, hinv_w, bm, projector
    )


def _dual_primal(p, btg):
    """``x(g') = prox_{(c/s) phi}(z - B^T g' / s)`` (u-form: ``-(u + B^T g) / s``), its Jacobian."""
    if p.z is None:
        return p.reg._euclid(-(p.u + btg) / p.s, p.t, p.shape)
    return p.reg._euclid(p.z - btg / p.s, p.t, p.shape)


def _dual_shift(p, x):
    """``x - z`` (u-form: ``x``)."""
    return x if p.z is None else x - p.z


def _dual_objective(p, btg, x, gam):
    """``(D(g'), sum of |terms of D|)`` at ``x = x(g')``, ``btg = B^T g'``, ``gam = g'``.

    ``D(g') = [<u, x>] + c phi(x) + s/2 ||x - z||^2 + <B^T g', x - z> - 1/2 ||g'||^2``: at the
    optimum every term is of the size of the objective (no ``u``, no ``H z``), so the Armijo test
    keeps its meaning however ill-conditioned ``H`` is; the second value scales its slack.
    """
    xz = _dual_shift(p, x)
    terms = [
        p.c * p.reg._dual_value(x, p.shape),
        0.5 * p.s * _vdot(xz, xz),
        _vdot(btg, xz),
        -0.5 * _vdot(gam, gam),
    ]
    if p.z is None:
        terms.append(_vdot(p.u, x))
    terms = jnp.stack(terms)
    return jnp.sum(terms), jnp.sum(jnp.abs(terms))


def _dual_residual(p, x, bxz, gam):
    """The relative KKT residual ``||e||_{H^{-1}} / max(||u||_{H^{-1}}, ||x||_H)``.

    ``e = B^T (B (x - z) - g')``, from ``bxz = B (x - z)`` and ``gam = g'``.
    """
    e_h = _safe_norm(jnp.sqrt(p.hinv_w) * (bxz - gam))
    x_h = _norm_h(p.op, x, bxz + p.bz)
    return e_h / jnp.maximum(jnp.maximum(p.nu_h, x_h), jnp.finfo(p.wd).tiny)


def _dual_newton_matrix(p, jac):
    """The Newton matrix ``I + B J B^T / s`` (``J`` = ``jac``), assembled as a Gram matrix."""
    k = p.k
    y = p.bm * jnp.sqrt(jac.dg)
    m = None
    if jac.g is not None:
        qm = _einsum_small("krc,rc->kr", p.bm.reshape((k, *jac.g.shape)), jac.g)
        if p.projector:
            # J = D - sum_r g_r g_r^T / |A_r| is a projector P (D binary, g_r = sign on A_r):
            # B J B^T = (B P)(B P)^T, with B P = B D - sum_r (B g_r) g_r^T / |A_r|.
            y = y + jnp.einsum("kr,rc->krc", qm * jac.a, jac.g).reshape(k, -1)
        else:  # a_r >= 0: a sum of positive semidefinite terms
            m = jnp.matmul(qm * jac.a, qm.T, precision=_numerics.HIGHEST)
    g = _partitioning.contract_d(y, y.T)
    m = g if m is None else g + m
    return jnp.eye(k, dtype=p.wd) + m / p.s


def _dual_start(p, x0):
    """The starting point ``(g', B^T g', x(g'), Jacobian, D(g'))`` of :func:`_newton_dual`.

    Cold start ``g' = 0`` (``g = B z``; u-form: ``g = 0``). A warm start ``x0`` gives
    ``g' = B (x0 - z)``; in the center form it is kept only if its dual value is higher:
    ``g' = 0`` is ``x = z``, usually the better start there, and an ``x0`` far from ``z`` along the
    large eigenvalues of ``H`` would make ``||B^T g'|| / s ~ cond(H) ||x0 - z||`` (rounding, or
    overflow).
    """
    wd = p.wd
    gam0 = jnp.zeros((p.k,), wd)
    btg0 = jnp.zeros_like(p.u if p.z is None else p.z)
    xi0, jac0 = _dual_primal(p, btg0)
    d0, _ = _dual_objective(p, btg0, xi0, gam0)
    if x0 is None:
        return gam0, btg0, xi0, jac0, d0
    # Only a warm start whose dual terms cannot overflow is evaluated at all (no transient
    # inf/NaN): they are O(w_max^2 / s ||x0 - z||^2).
    lim = jnp.sqrt(jnp.finfo(wd).max / 1e3) * jnp.sqrt(p.s) / jnp.maximum(p.wmax, 1)
    x0 = jnp.where(_safe_norm(_dual_shift(p, x0)) <= lim, x0, 0 if p.z is None else p.z)
    gam_w = p.bmat(_dual_shift(p, x0))
    btg_w = p.bt(gam_w)
    xi_w, jac_w = _dual_primal(p, btg_w)
    d_w, mag_w = _dual_objective(p, btg_w, xi_w, gam_w)
    warm = jnp.isfinite(d_w) & jnp.all(jnp.isfinite(xi_w))
    if p.z is not None:
        warm = warm & (d_w - 64 * p.eps * mag_w > d0)
    return jax.tree.map(
        lambda a, b: jnp.where(warm, a, b),
        (gam_w, btg_w, xi_w, jac_w, d_w),
        (gam0, btg0, xi0, jac0, d0),
    )


def _dual_line_search(p, gam, btg, x, jac, dval, step, slope, btd):
    """Armijo backtracking on ``D`` along ``step`` (``btd = B^T step``), from ``alpha = 1``.

    Returns ``(alpha, accepted, B^T g'_a, x_a, jac_a, D_a)`` at the last trial. ``D`` is only
    known to rounding, so a trial within ``64 eps`` of the size of its terms is accepted.
    """

    def ls_cond(ls):
        j, _, accepted, *_ = ls
        return (~accepted) & (j < _MAX_BACKTRACK)

    def ls_body(ls):
        j, alpha, *_ = ls
        btga = btg + alpha * btd
        xa, jaca = _dual_primal(p, btga)
        da, mag = _dual_objective(p, btga, xa, gam + alpha * step)
        slack = 64 * p.eps * mag  # D is only known to rounding: accept within it
        acc = jnp.isfinite(da) & (da >= dval + _ARMIJO * alpha * slope - slack)
        return j + 1, jnp.where(acc, alpha, alpha / 2), acc, btga, xa, jaca, da

    init = (jnp.int32(0), jnp.ones((), p.wd), jnp.zeros((), bool), btg, x, jac, dval)
    _, alpha, accepted, btga, xa, jaca, da = lax.while_loop(ls_cond, ls_body, init)
    return alpha, accepted, btga, xa, jaca, da


def _dual_newton_step(p, noise, st):
    """One damped semismooth Newton step ``(I + B J B^T / s) dg = B (x - z) - g'`` on the dual.

    Falls back to a gradient step with the ``1/L`` step size (``L = 1 + w_max / s``) when the
    Newton direction is not an ascent direction; flags a stall when no trial is accepted or a full
    step no longer reduces a residual below ``noise``.
    """
    it, gam, btg, x, jac, bx, dval, res, _ = st
    grad = bx - gam
    mat = _dual_newton_matrix(p, jac)
    chol = jnp.linalg.cholesky(mat)
    step = jax.scipy.linalg.cho_solve((chol, True), grad)
    slope = _vdot(grad, step)
    ok = jnp.all(jnp.isfinite(step)) & (slope > 0)
    # Fallback: a gradient step with the 1/L step size (L = 1 + w_max/s).
    step = jnp.where(ok, step, grad / (1 + p.wmax / p.s))
    slope = _vdot(grad, step)
    btd = p.bt(step)
    alpha, accepted, btga, xa, jaca, da = _dual_line_search(
        p, gam, btg, x, jac, dval, step, slope, btd
    )
    gam_n, btg_n, x_n, jac_n, d_n = jax.tree.map(
        lambda a, b: jnp.where(accepted, a, b),
        (gam + alpha * step, btga, xa, jaca, da),
        (gam, btg, x, jac, dval),
    )
    bx_n = p.bmat(_dual_shift(p, x_n))
    res_n = _dual_residual(p, x_n, bx_n, gam_n)
    stalled = ~accepted | ((alpha == 1) & (res_n > 0.9 * res) & (res_n < noise))
    return it + 1, gam_n, btg_n, x_n, jac_n, bx_n, d_n, res_n, stalled


def _newton_dual(reg, u, c, op, shape, x0, tol, max_iter, z=None):
    """Semismooth Newton on the k-dimensional dual (see the module docstring).

    ``u``-form (``z is None``): ``argmin <u, x> + c phi(x) + 1/2 <x, H x>``; center form
    (``u is None``): ``argmin c phi(x) + 1/2 ||x - z||_H^2``. The dual variable is shifted by
    the center, ``g' = g - B z``: then ``x(g') = prox_{(c/s) phi}(z - B^T g' / s)``, the gradient is
    ``B (x - z) - g'`` and nothing of the size of ``H z`` is ever formed (``u = -H z`` would lose
    ``s z`` against ``B^T B z`` when ``cond(H) > 1/eps``). The ``u``-form is the case ``z = 0``.
    """
    p = _dual_problem(reg, u, c, op, shape, z)
    gam0, btg0, xi0, jac0, d0 = _dual_start(p, x0)
    bx0 = p.bmat(_dual_shift(p, xi0))
    res0 = _dual_residual(p, xi0, bx0, gam0)
    noise = 1e3 * 64 * p.eps  # below this, a full step that does not reduce the residual = stalled

    def cond(st):
        it, *_, res, stalled = st
        return (it < max_iter) & (res > tol) & ~stalled

    def body(st):
        return _dual_newton_step(p, noise, st)

    st = (jnp.int32(0), gam0, btg0, xi0, jac0, bx0, d0, res0, jnp.zeros((), bool))
    it, _, _, x, _, _, _, res, _ = lax.while_loop(cond, body, st)
    return x, ProxInfo(it, res)


class _Ball(NamedTuple):
    """The l1-ball constraint with a traced radius, in the form :func:`_newton_dual` consumes."""

    radius: Any
    _jac_projector = True

    def _euclid(self, v, t, shape):
        return _l1_ball_euclid(v, self.radius, 1, v.size)

    def _dual_value(self, x, shape):
        return jnp.zeros((), x.dtype)


_BALL_DIRECT_ITERS = 8


class _Polish(NamedTuple):
    """One problem of :func:`_l1_ball_polish` and the data its helpers share."""

    radius: Any
    op: Any
    u: Any  # u-form: the linear term; center form: None
    z: Any  # center form: the center; u-form: None
    wd: Any  # working dtype
    eps: Any
    m: int  # the largest support tried, min(k, d)
    s: Any  # the operator's scalar
    sw: Any  # W^{1/2}
    e: Any  # -scale_exp
    iota: Any  # arange(d), laid out like x


def _largest_entries(x, m, iota):
    """Indices and values of the ``m`` largest ``|x_i|``, by ``m`` rounds of argmax.

    Everything on the support goes through one-hot contractions and reductions over ``d``
    (sharded like ``x``): nothing is gathered.
    """

    def largest(i, carry):
        ax, idx, vals = carry
        j = _argmax_last(ax, iota)
        idx, vals = idx.at[i].set(j.astype(idx.dtype)), vals.at[i].set(jnp.max(ax))
        return jnp.where(iota == j, -1, ax), idx, vals

    init = (jnp.abs(x), jnp.zeros((m,), jnp.int32), jnp.zeros((m,), x.dtype))
    _, idx0, vals = lax.fori_loop(0, m, largest, init)
    return idx0, vals


def _support_system(pb, idx, mask):
    """The KKT system on the support ``A`` (the slots ``idx`` where ``mask``).

    Returns ``(sel, on_a, H_AA, z_A, b)``: ``H_AA = s I + B_A^T B_A``, ``b = B_A^T B z_off``
    (``z_off``: ``z`` off ``A``; u-form: ``b = -u_A``, ``z_A = 0``); ``sel`` holds the one-hot
    rows of ``A``, ``on_a`` marks ``A`` along ``d``.
    """
    m, wd, op = pb.m, pb.wd, pb.op
    sel = (pb.iota[None, :] == idx[:, None]).astype(wd) * mask[:, None].astype(wd)  # (m, d)
    # B_A = W^{1/2} V[:, A] (k x m): columns of the basis by one contraction over d
    cols = _numerics.ldexp(_partitioning.contract_d(op.basis, sel.T), pb.e)
    ba = pb.sw[:, None] * jnp.matmul(op.coef, cols, precision=_numerics.HIGHEST)
    haa = jnp.matmul(ba.T, ba, precision=_numerics.HIGHEST) + pb.s * jnp.eye(m, dtype=wd)
    on_a = jnp.matmul(mask.astype(wd), sel, precision=_numerics.HIGHEST) > 0  # (d,)
    if pb.z is None:
        za = jnp.zeros((m,), wd)
        b = -_partitioning.contract_d(sel, pb.u)
    else:
        za = _partitioning.contract_d(sel, pb.z)
        z_off = jnp.where(on_a, 0, pb.z)
        b = jnp.matmul(ba.T, pb.sw * op.project(z_off), precision=_numerics.HIGHEST)
    b = jnp.where(mask, b, 0)
    return sel, on_a, haa, za, b


def _polish_solve(pb, idx, sig, mask):
    """Solve the KKT system on the support ``A`` with signs ``sig`` and check optimality.

    ``H_AA d + theta sig = b``, ``sig^T d = radius - sig^T z_A`` by two Cholesky solves
    (``p = H_AA^{-1} b``, ``q = H_AA^{-1} sig``, ``theta = (sig^T p - radius + sig^T z_A) /
    sig^T q``, ``x_A = z_A + p - theta q``). Returns ``(x, ok, viol, wrong, grad, finite)``:
    ``viol`` the off-support excess ``|grad_j| - theta`` (with rounding slack), ``wrong`` the
    signed values on ``A`` (negative: wrong sign), ``ok`` whether ``x`` is a verified KKT point.
    """
    op, u, z, radius = pb.op, pb.u, pb.z, pb.radius
    sel, on_a, haa, za, b = _support_system(pb, idx, mask)
    chol = jnp.linalg.cholesky(haa)
    p = jax.scipy.linalg.cho_solve((chol, True), b)
    q = jax.scipy.linalg.cho_solve((chol, True), sig)
    sq = jnp.dot(sig, q)
    theta = (jnp.dot(sig, p) - (radius - jnp.dot(sig, za))) / jnp.where(sq > 0, sq, 1)
    y = jnp.where(mask, za + p - theta * q, 0)
    xn = jnp.matmul(y, sel, precision=_numerics.HIGHEST)
    xn = _renormalize_l1(xn[None], radius)[0]
    grad = op.matvec(xn) + u if z is None else op.matvec(xn - z)
    slack = 1e3 * pb.eps * jnp.maximum(theta, jnp.max(jnp.abs(grad), initial=0))
    viol = jnp.where(on_a, -jnp.inf, jnp.abs(grad) - theta - slack)
    wrong = jnp.where(mask, sig * y, jnp.inf)
    finite = jnp.all(jnp.isfinite(xn)) & jnp.isfinite(theta) & (sq > 0)
    ok = finite & (theta >= 0) & jnp.all(wrong >= 0) & jnp.all(viol <= 0) & jnp.any(mask)
    return xn, ok, viol, wrong, grad, finite


def _polish_step(pb, st):
    """One primal active-set step of :func:`_l1_ball_polish` (state in, state out).

    Solves on the support; if that is not optimal, drops the value of most wrong sign, else adds
    the coordinate that violates ``|grad_j| <= theta`` most.
    """
    it, idx, sig, mask, _, _, _ = st
    iota = pb.iota
    xn, ok, viol, wrong, grad, finite = _polish_solve(pb, idx, sig, mask)
    drop = jnp.min(wrong) < 0
    j = _argmax_last(viol, iota).astype(idx.dtype)
    free = jnp.argmin(mask)  # first free slot (False < True)
    can_add = ~mask[free] & (jnp.max(viol) > 0)
    # drop the most negative value; else add the most violating coordinate
    mask_d = mask.at[jnp.argmin(wrong)].set(False)
    idx_a = idx.at[free].set(j)
    sig_a = sig.at[free].set(-jnp.sign(_dot_rows(iota, j[None], grad)[0]))
    mask_a = mask.at[free].set(True)
    idx_n = jnp.where(drop, idx, idx_a)
    sig_n = jnp.where(drop, jnp.where(mask_d, sig, 0), sig_a)
    mask_n = jnp.where(drop, mask_d, mask_a)
    stop = ~finite | (~drop & ~can_add)
    keep = ok | stop
    return (
        it + 1,
        jnp.where(keep, idx, idx_n),
        jnp.where(keep, sig, sig_n),
        jnp.where(keep, mask, mask_n),
        xn,
        ok,
        stop,
    )


def _l1_ball_polish(x, radius, op, u=None, z=None, skip=False):
    """Active-set refinement of an approximate l1-ball solution with a support of ``<= k``
    entries; returns ``(x_new, accepted)``.

    When the constraint cuts the large eigenvalues of ``H``, its multiplier ``theta`` is of their
    size and every dual formulation computes ``x = P(v)`` from a ``v`` of size ``theta / s``:
    the values on the support cancel (relative error ``eps * cond(H)``) and the support itself
    can come out incomplete. On a support ``A`` with signs ``sigma`` the solution solves
    ``H_AA d + theta sigma = (B^T B z_off)_A``, ``sigma^T d = radius - sigma^T z_A`` with
    ``x_A = z_A + d`` (``z_off``: ``z`` off ``A``; ``u``-form: ``H_AA x_A + theta sigma = -u_A``),
    an ``(|A| + 1)``-dimensional system that is well conditioned when ``|A| <= k`` and ``B_A``
    has full rank -- the generic case when ``theta`` is large. Starting from the support of
    ``x``, a primal active-set loop adds the coordinate that violates ``|(u + H (x - z))_j| <=
    theta`` most, or drops one whose value has the wrong sign, at most ``2 k + 2`` times. The
    result is accepted only at a verified KKT point (signs, ``theta >= 0``, the off-support
    bound with rounding slack); otherwise (or with ``skip``) ``x`` is returned unchanged.
    """
    wd = x.dtype
    eps = jnp.finfo(wd).eps
    d = x.size
    m = min(op.weights.shape[0], d)
    if m == 0:
        return x, jnp.zeros((), bool)
    s = op.scalar
    sw = jnp.sqrt(op.weights)
    e = -jnp.asarray(op.scale_exp, jnp.int32)
    iota = _partitioning.like_last_axis(jnp.arange(d), x)
    pb = _Polish(radius, op, u, z, wd, eps, m, s, sw, e, iota)
    idx0, vals = _largest_entries(x, m, iota)
    mask0 = vals > 0
    sig0 = jnp.where(mask0, jnp.sign(_dot_rows(iota, idx0, x)), 0)
    fits = (jnp.sum(x != 0) <= m) & (radius > 0)

    def cond(st):
        it, _, _, _, _, ok, stop = st
        return ~ok & ~stop & (it < 2 * m + 2)

    def body(st):
        return _polish_step(pb, st)

    stop0 = ~fits | ~jnp.any(mask0) | skip
    st = (jnp.int32(0), idx0, sig0, mask0, x, jnp.zeros((), bool), stop0)
    _, _, _, _, xn, ok, _ = lax.while_loop(cond, body, st)
    return jnp.where(ok, xn, x), ok


def _dot_rows(iota, idx, v):
    """``v[idx]`` as a contraction with one-hot rows (no gather of a sharded ``v``)."""
    sel = (iota[None, :] == idx[:, None]).astype(v.dtype)
    return _partitioning.contract_d(sel, v)


def _ball_unconstrained(u, op, z, eps):
    """``(x_free, theta_max)``: the minimizer without the constraint, and where ``x(theta) = 0``.

    ``x_free = -H^{-1} u`` (center form: ``z``); ``theta_max = ||u||_inf`` (center form: an upper
    bound of ``||H z||_inf``).
    """
    if z is None:
        x_free = -op.solve(u)
        theta_max = jnp.max(jnp.abs(u), initial=0)  # x(theta) = 0 from here on
    else:
        x_free = z
        # An upper bound of ||H z||_inf (s |z_i| + |(V^T W V z)_i| >= |(H z)_i|), no cancellation.
        hz = jnp.abs(op.scalar * z) + jnp.abs(op.lift(op.weights * op.project(z)))
        theta_max = (1 + 64 * eps) * jnp.max(hz, initial=0)
    return x_free, theta_max


def _ball_phase1(u, radius, op, shape, x0, tol, iters, z, one, f_free):
    """Phase 1 of :func:`_l1_ball_newton`: the dual Newton method on the ball, then the polish.

    At most ``iters`` iterations with the ball's projection as the Euclidean prox; the active-set
    polish is skipped when the constraint is inactive (``f_free <= 0``). A polished result
    reports residual 0.
    """
    x1, info1 = _newton_dual(_Ball(radius), u, one, op, shape, x0, tol, iters, z)
    x1p, polished1 = _l1_ball_polish(x1, radius, op, u, z, skip=f_free <= 0)
    x1 = jnp.where(polished1, x1p, x1)
    info1 = ProxInfo(info1.iterations, jnp.where(polished1, 0, info1.residual))
    return x1, info1


def _ball_theta0(x1, u, op, z, theta_max):
    """The multiplier ``theta`` estimated from the phase-1 solution ``x1``.

    On the support ``-(u + H (x - z))_i = theta sign(x_i)``: the mean of the left side times
    ``sign(x_i)`` there, or ``theta_max / 2`` if that is outside ``(0, theta_max)``.
    """
    grad = op.matvec(x1) + u if z is None else op.matvec(x1 - z)
    g = -grad * jnp.sign(x1)
    nnz = jnp.sum(x1 != 0)
    theta0 = jnp.where(nnz > 0, jnp.sum(jnp.where(x1 != 0, g, 0)) / jnp.maximum(nnz, 1), 0)
    return jnp.where((theta0 > 0) & (theta0 < theta_max), theta0, 0.5 * theta_max)


def _illinois_step(lo, f_lo, hi, f_hi, side, theta, f):
    """One Illinois false-position step for the root of ``f(theta) = ||x(theta)||_1 - radius``.

    Shrinks the bracket ``[lo, hi]`` with the value ``f`` at ``theta`` (the retained end's value
    halved when the same end moves twice) and returns ``(lo, f_lo, hi, f_hi, side, theta_next)``;
    bisection when the secant point would leave the bracket.
    """
    right = f <= 0  # feasible: theta is an upper end of the bracket
    lo_n = jnp.where(right, lo, theta)
    f_lo_n = jnp.where(right, jnp.where(side == 1, 0.5 * f_lo, f_lo), f)
    hi_n = jnp.where(right, theta, hi)
    f_hi_n = jnp.where(right, f, jnp.where(side == -1, 0.5 * f_hi, f_hi))
    side_n = jnp.where(right, 1, -1).astype(jnp.int32)
    # Illinois false position, bisection when it would leave the bracket
    t_fp = lo_n + f_lo_n * (hi_n - lo_n) / jnp.where(f_lo_n != f_hi_n, f_lo_n - f_hi_n, 1)
    ok = (t_fp > lo_n) & (t_fp < hi_n) & jnp.isfinite(t_fp)
    theta_n = jnp.where(ok, t_fp, 0.5 * (lo_n + hi_n))
    return lo_n, f_lo_n, hi_n, f_hi_n, side_n, theta_n


def _ball_phase2(u, radius, op, shape, tol, max_iter, z, x1, theta0, theta_max, f_free, done1):
    """Phase 2 of :func:`_l1_ball_newton`: the multiplier search on ``[0, theta_max]``.

    ``x(theta) = argmin <u, x> + theta ||x||_1 + 1/2 <x, H x>`` (the l1 dual Newton solver,
    warm-started from the previous ``x``) until ``||x(theta)||_1 = radius`` to ``tol``. Returns
    ``(iterations, x, residual, inner Newton iterations)``; no iteration if ``done1``.
    """
    wd = x1.dtype
    eps = jnp.finfo(wd).eps
    l1 = _L1(1.0)
    inner_iters = max(max_iter, 20)

    def cond(st):
        it, lo, _, hi, _, _, _, _, res, _ = st
        width_ok = hi - lo > 4 * eps * hi
        return ~done1 & (it < max_iter) & (res > tol) & width_ok

    def body(st):
        it, lo, f_lo, hi, f_hi, theta, x, side, _, inner = st
        x, info = _newton_dual(l1, u, theta, op, shape, x, tol, inner_iters, z)
        f = jnp.sum(jnp.abs(x)) - radius
        lo_n, f_lo_n, hi_n, f_hi_n, side_n, theta_n = _illinois_step(
            lo, f_lo, hi, f_hi, side, theta, f
        )
        # residual: inner KKT residual plus the relative violation of ||x||_1 = radius
        res = jnp.maximum(info.residual, jnp.abs(f) / jnp.maximum(radius, jnp.finfo(wd).tiny))
        return (
            it + 1,
            lo_n,
            f_lo_n,
            hi_n,
            f_hi_n,
            theta_n,
            x,
            side_n,
            res,
            inner + info.iterations,
        )

    st = (
        jnp.int32(0),
        jnp.zeros((), wd),
        f_free,
        theta_max,
        -radius * jnp.ones((), wd),
        theta0,
        x1,
        jnp.int32(0),
        jnp.asarray(jnp.inf, wd),
        jnp.int32(0),
    )
    it, *_, x2, _, res2, inner = lax.while_loop(cond, body, st)
    return it, x2, res2, inner


def _l1_ball_newton(u, radius, op, shape, x0, tol, max_iter, z=None):
    """``argmin <u, x> + 1/2 <x, H x>`` s.t. ``||x||_1 <= radius`` for a LowRankOperator.

    (Center form, ``u is None``: ``argmin 1/2 ||x - z||_H^2`` s.t. ``||x||_1 <= radius``, i.e.
    ``u = -H z`` without forming it.) Phase 1 (:func:`_ball_phase1`): the dual Newton method with
    the ball's projection as the Euclidean prox (a few iterations; it converges in 2-3 on typical
    problems). Its Newton model only sees the current support of the projection, so when the
    constraint is strongly active, the support small and ``H`` badly conditioned it can crawl.
    Phase 2 (:func:`_ball_phase2`, only if phase 1 did not converge) searches the multiplier
    instead: ``x(theta) = argmin <u, x> + theta ||x||_1 + 1/2 <x, H x>`` (the robust l1 solver,
    warm-started) has ``||x(theta)||_1`` continuous, non-increasing and piecewise linear in
    ``theta``; Illinois false position on ``[0, ||u||_inf]`` finds ``||x(theta)||_1 = radius``.
    Each phase ends with the active-set polish (:func:`_l1_ball_polish`).
    """
    wd = (u if z is None else z).dtype
    eps = jnp.finfo(wd).eps
    direct_iters = min(max_iter, _BALL_DIRECT_ITERS)
    one = jnp.ones((), wd)
    x_free, theta_max = _ball_unconstrained(u, op, z, eps)
    f_free = jnp.sum(jnp.abs(x_free)) - radius  # > 0 unless the constraint is inactive

    x1, info1 = _ball_phase1(u, radius, op, shape, x0, tol, direct_iters, z, one, f_free)
    done1 = info1.residual <= tol
    # Initial multiplier from phase 1: on the support, -(u + H x)_i = theta sign(x_i).
    theta0 = _ball_theta0(x1, u, op, z, theta_max)
    _, x2, res2, inner = _ball_phase2(
        u, radius, op, shape, tol, max_iter, z, x1, theta0, theta_max, f_free, done1
    )
    x2 = _l1_ball_euclid(x2, radius, 1, x2.size)[0]  # exact feasibility (moves x by <= tol)
    x2p, polished2 = _l1_ball_polish(x2, radius, op, u, z, skip=done1 | (f_free <= 0))
    x2 = jnp.where(polished2, x2p, x2)
    res2 = jnp.where(polished2, 0, res2)
    x = jnp.where(done1, x1, jnp.where(f_free <= 0, x_free, x2))
    res = jnp.where(done1, info1.residual, jnp.where(f_free <= 0, 0, res2))
    iters = info1.iterations + jnp.where(done1, 0, inner)
    return x, ProxInfo(iters, res)


def _admm(reg, u, c, op, shape, x0, tol, max_iter, z=None):
    """Over-relaxed ADMM on ``x = y`` (see the module docstring).

    Center form (``u is None``): the ``x``-step ``(H + rho I)^{-1} (rho v + H z)`` is written
    ``z + rho (H + rho I)^{-1} (v - z)`` and the residual uses ``H (y - z)``, so ``H z`` is never
    formed; the ``u``-form is the case ``z = 0``.
    """
    wd = (u if z is None else z).dtype
    lo = op.scalar
    hi = op.scalar + jnp.max(op.weights, initial=0)
    rho = jnp.sqrt(lo * hi)
    alpha = _ADMM_RELAXATION
    sw = jnp.sqrt(op.weights)

    def norm_h(y):
        return _norm_h(op, y, sw * op.project(y))

    if z is None:
        nu_h = jnp.sqrt(jnp.maximum(_vdot(u, op.solve(u)), 0))
        if x0 is None:
            z0 = jnp.zeros_like(u)
            w0 = -u / rho
        else:
            z0 = x0
            w0 = -(u + op.matvec(x0)) / rho
    else:
        nu_h = norm_h(z)
        z0 = z if x0 is None else x0
        w0 = -op.matvec(z0 - z) / rho

    def step(_, yw):
        y, w = yw
        if z is None:
            x = op.solve_shifted(rho, rho * (y - w) - u)
        else:
            x = z + rho * op.solve_shifted(rho, y - w - z)
        xh = alpha * x + (1 - alpha) * y
        y_n, _ = reg._euclid(xh + w, c / rho, shape)
        return y_n, w + xh - y_n

    def cond(st):
        it, _, _, res = st
        return (it < max_iter) & (res > tol)

    def body(st):
        it, y, w, _ = st
        y, w = lax.fori_loop(0, _ADMM_CHECK, step, (y, w))
        # The y-step gives rho * w in c d(phi)(y), so e = u + H (y - z) + rho w is an element of
        # the subdifferential of the objective at y: an exact KKT residual, one product with H.
        if z is None:
            hy = op.matvec(y)
            e = u + hy + rho * w
            y_h = jnp.sqrt(jnp.maximum(_vdot(y, hy), 0))
        else:
            e = op.matvec(y - z) + rho * w
            y_h = norm_h(y)
        e_h = jnp.sqrt(jnp.maximum(_vdot(e, op.solve(e)), 0))
        scale = jnp.maximum(jnp.maximum(nu_h, y_h), jnp.finfo(wd).tiny)
        return it + _ADMM_CHECK, y, w, e_h / scale

    st = (jnp.int32(0), z0, w0, jnp.asarray(jnp.inf, wd))
    it, y, _, res = lax.while_loop(cond, body, st)
    return y, ProxInfo(it, res)


# --------------------------------------------------------------------------------------------------
# the regularizers


@dataclasses.dataclass(frozen=True)
class _L1(Regularizer):
    name = "l1"

    def value(self, x):
        x = jnp.asarray(x)
        return self.strength * jnp.sum(jnp.abs(x))

    def _euclid(self, v, t, shape):
        tau = t * self.strength
        x = soft_threshold(v, tau)
        dg = (jnp.abs(v) > tau).astype(v.dtype)
        return x, _Jac(dg, None, None)

    def _diag(self, u, c, h, shape):
        return -_safe_div(soft_threshold(u, c * self.strength), h)


@dataclasses.dataclass(frozen=True)
class _L2Squared(Regularizer):
    name = "l2_squared"

    def value(self, x):
        x = jnp.asarray(x)
        return 0.5 * self.strength * jnp.sum(jnp.square(x))

    def _euclid(self, v, t, shape):
        f = 1 / (1 + t * self.strength)
        return v * f, _Jac(jnp.full_like(v, f), None, None)

    def _diag(self, u, c, h, shape):
        return -_safe_div(u, h + c * self.strength)

    def _lowrank_exact(self, u, c, op, shape, z=None):
        mu = c * self.strength
        if z is None:
            return -op.solve_shifted(mu, u)
        # x = (H + mu I)^{-1} H z, on the spectrum of H (no H z, no z - mu (H + mu I)^{-1} z).
        p, zp = _split_center(op, z)
        return jnp.where(mu == 0, z, _shrink_center(op, p, zp, mu))


def _split_center(op, z):
    """``(V z, z - V^T V z)``: ``z`` on the rows of ``V`` and on their orthogonal complement."""
    p = op.project(z)
    return p, z - op.lift(p)


def _shrink_center(op, p, zp, mu):
    """``(H + mu I)^{-1} H z`` from :func:`_split_center`: ``(s + w) / (s + w + mu)`` on the rows
    of ``V``, ``s / (s + mu)`` on their complement; accurate whatever ``cond(H)``, ``mu >= 0``."""
    s, w = op.scalar, op.weights
    return op.lift((s + w) / (s + w + mu) * p) + (s / (s + mu)) * zp


def _group_l2_euclid(v, tau, rows, cols):
    """Row-wise group shrinkage ``v_r * [1 - tau/||v_r||]_+`` and its Jacobian."""
    vr = v.reshape(rows, cols)
    n = _safe_norm(vr, axis=-1, keepdims=True)
    active = n > tau
    ns = jnp.where(active, n, 1)
    frac = jnp.where(active, tau / ns, 0)
    x = jnp.where(active, vr * (1 - frac), 0)
    free = tau == 0
    dg = jnp.where(free, 1, jnp.where(active, 1 - frac, 0)) * jnp.ones_like(vr)
    g = jnp.where(active, vr / ns, 0)
    a = jnp.where(free, 0, frac[:, 0])
    return x.reshape(-1), _Jac(dg.reshape(-1), g, a)


def _group_l2_diag(u, tau, h, rows, cols):
    """Row-wise ``argmin <u_r, x> + 1/2 <x, diag(h_r) x> + tau ||x||_2`` (Fig. 4 problem)."""
    ur = u.reshape(rows, cols)
    hr = h.reshape(rows, cols)
    nu = _safe_norm(ur, axis=-1)
    active = nu > tau
    t = _secular_t(ur, hr, jnp.broadcast_to(tau, nu.shape))
    t = t[:, None]
    x = jnp.where(active[:, None], -ur * (t / (1 + t * hr)), 0)  # no overflow for huge t, u
    x_free = -_safe_div(ur, hr)
    x = jnp.where(tau == 0, x_free, x)
    return x.reshape(-1)


@dataclasses.dataclass(frozen=True)
class _L2(Regularizer):
    name = "l2"

    def value(self, x):
        return self.strength * _safe_norm(jnp.asarray(x))

    def _euclid(self, v, t, shape):
        return _group_l2_euclid(v, t * self.strength, 1, v.size)

    def _diag(self, u, c, h, shape):
        return _group_l2_diag(u, c * self.strength, h, 1, u.size)

    def _lowrank_exact(self, u, c, op, shape, z=None):
        tau = c * self.strength
        if z is not None:
            return self._lowrank_center(tau, op, z)
        # Spectral data of H: eigenvalues s + w_j on the rows of V, s on their complement.
        p = op.project(u)
        perp = _safe_norm(u - op.lift(p))
        a = jnp.concatenate([p, perp[None]])[None, :]
        h = jnp.concatenate([op.scalar + op.weights, op.scalar[None]])[None, :]
        active = _safe_norm(u) > tau
        t = _secular_t(a, h, tau[None])[0]
        mu = jnp.where(active & (t > 0), 1 / jnp.where(t > 0, t, 1), 1)
        x = jnp.where(active, -op.solve_shifted(mu, u), 0)
        return jnp.where(tau == 0, -op.solve(u), x)

    def _lowrank_center(self, tau, op, z):
        """``argmin tau ||x|| + 1/2 ||x - z||_H^2``: the secular equation of ``u = -H z`` on the
        spectral data ``((s + w) V z, s ||z - V^T V z||)``, then ``x = (H + mu I)^{-1} H z``."""
        p, zp = _split_center(op, z)
        # x*(z, tau) = m x*(z / m, tau / m), and t = 1 / mu does not depend on m: scale the
        # spectral data so that (s + w) V z cannot overflow.
        m = jnp.max(jnp.abs(z), initial=0)
        m = jnp.where(m > 0, m, 1)
        s, w = op.scalar, op.weights
        a = jnp.concatenate([(s + w) * (p / m), (s * _safe_norm(zp / m))[None]])[None, :]
        h = jnp.concatenate([s + w, s[None]])[None, :]
        tau_m = tau / m
        active = _safe_norm(a) > tau_m
        t = _secular_t(a, h, tau_m[None])[0]
        mu = jnp.where(active & (t > 0), 1 / jnp.where(t > 0, t, 1), 1)
        x = jnp.where(active, _shrink_center(op, p, zp, mu), 0)
        return jnp.where(tau_m == 0, z, x)


def _renormalize_l1(x, radius):
    """Rescale the rows of ``x`` to l1 norm ``radius`` (0 rows stay 0).

    ``[|v| - theta]_+`` cancels catastrophically when the ball is tiny next to ``v``; the
    rescaling restores ``||x||_1 = radius`` (feasibility, and exactness for 1-sparse answers).
    """
    n1 = jnp.sum(jnp.abs(x), axis=-1, keepdims=True)
    return jnp.where(n1 > 0, x * (radius / jnp.where(n1 > 0, n1, 1)), x)


def _l1_ball_euclid(v, radius, rows, cols):
    """Row-wise projection onto ``{||x_r||_1 <= radius}`` and its Jacobian."""
    vr = v.reshape(rows, cols)
    av = jnp.abs(vr)
    theta = _threshold(av, jnp.ones_like(av), av, radius)[:, None]
    x = jnp.sign(vr) * jnp.maximum(av - theta, 0)
    inside = jnp.sum(av, axis=-1, keepdims=True) <= radius
    x = jnp.where(inside, vr, _renormalize_l1(x, radius))
    act = (av > theta) & ~inside
    # Far outside a small ball, |v_i| - theta can round to 0 for every i (|v| ~ radius / eps):
    # the projection then sits on the largest entry (exactly, for a strict maximum).
    if cols > 0:
        iota = _partitioning.like_last_axis(jnp.arange(cols), v)
        top = iota[None, :] == _argmax_last(av, iota)[:, None]
        lost = ~inside & ~jnp.any(act, axis=-1, keepdims=True) & (radius > 0)
        x = jnp.where(lost, jnp.where(top, jnp.sign(vr) * radius, 0), x)
        act = jnp.where(lost, top, act)
    nact = jnp.sum(act, axis=-1)
    dg = jnp.where(inside, 1, act.astype(v.dtype))
    g = jnp.where(act, jnp.sign(vr), 0)
    a = jnp.where(nact > 0, -1 / jnp.maximum(nact, 1), 0).astype(v.dtype)
    return x.reshape(-1), _Jac(dg.reshape(-1), g, a)


def _linf_euclid(v, tau, rows, cols):
    """Row-wise ``prox_{tau ||.||_inf}(v) = v - P_{l1 ball(tau)}(v)`` (Moreau) and its Jacobian."""
    vr = v.reshape(rows, cols)
    av = jnp.abs(vr)
    theta = _threshold(av, jnp.ones_like(av), av, tau)[:, None]
    zero = (jnp.sum(av, axis=-1, keepdims=True) <= tau) & (tau > 0)
    x = jnp.where(zero, 0, jnp.sign(vr) * jnp.minimum(av, theta))
    capped = (av > theta) & ~zero & (tau > 0)
    ncap = jnp.sum(capped, axis=-1)
    dg = jnp.where(zero, 0, 1 - capped.astype(v.dtype))
    g = jnp.where(capped, jnp.sign(vr), 0)
    a = jnp.where(ncap > 0, 1 / jnp.maximum(ncap, 1), 0).astype(v.dtype)
    return x.reshape(-1), _Jac(dg.reshape(-1), g, a)


def _linf_diag(u, tau, h, rows, cols):
    """Row-wise ``argmin <u, x> + 1/2 <x, diag(h) x> + tau ||x||_inf`` via the dual (sec. 6.5).

    The dual is the weighted l1 projection of Fig. 3; it yields ``x = -clip(u/h, -theta, theta)``
    with ``sum_i [|u_i| - theta h_i]_+ = tau``.
    """
    ur = u.reshape(rows, cols)
    hr = h.reshape(rows, cols)
    au = jnp.abs(ur)
    keys = _safe_div(au, hr)
    theta = _threshold(keys, hr, au, tau)[:, None]
    zero = jnp.sum(au, axis=-1, keepdims=True) <= tau
    x = -jnp.sign(ur) * jnp.minimum(keys, theta)
    x = jnp.where(zero, 0, x)
    return x.reshape(-1)


@dataclasses.dataclass(frozen=True)
class _Linf(Regularizer):
    name = "linf"

    def value(self, x):
        return self.strength * jnp.max(jnp.abs(jnp.asarray(x)), initial=0)

    def _euclid(self, v, t, shape):
        return _linf_euclid(v, t * self.strength, 1, v.size)

    def _diag(self, u, c, h, shape):
        return _linf_diag(u, c * self.strength, h, 1, u.size)


@dataclasses.dataclass(frozen=True)
class _L1Ball(Regularizer):
    name = "l1_ball"
    _homogeneous = False
    _jac_projector = True

    @property
    def radius(self):
        return self.strength

    def value(self, x):
        x = jnp.asarray(x)
        wd = _work_dtype(x.dtype)
        n1 = jnp.sum(jnp.abs(x.astype(wd)))
        slack = 16 * jnp.finfo(wd).eps * jnp.maximum(self.strength, n1)
        return jnp.where(n1 <= self.strength + slack, 0, jnp.inf).astype(wd)

    def _dual_value(self, x, shape):
        return jnp.zeros((), x.dtype)

    def _euclid(self, v, t, shape):
        return _l1_ball_euclid(v, self.strength, 1, v.size)

    def _newton(self, u, c, op, shape, x0, tol, max_iter, z=None):
        # x*(u, r) = m x*(u / m, r / m) (also for the center z): rescale so that max |u| = 1
        # (or max |z| = 1), so that huge inputs do not overflow.
        a = u if z is None else z
        m = jnp.max(jnp.abs(a), initial=0)
        m = jnp.where(m > 0, m, 1)
        x0 = None if x0 is None else x0 / m
        us = None if u is None else u / m
        zs = None if z is None else z / m
        x, info = _l1_ball_newton(us, self.strength / m, op, shape, x0, tol, max_iter, zs)
        return x * m, info

    def _diag(self, u, c, h, shape):
        au = jnp.abs(u)
        inv = _safe_div(jnp.ones_like(h), h)
        theta = _threshold(au[None], inv[None], (au * inv)[None], self.strength)[0]
        x = -jnp.sign(u) * _safe_div(jnp.maximum(au - theta, 0), h)
        return jnp.where(theta > 0, _renormalize_l1(x, self.strength), x)


class _RowSum(Regularizer):
    """``phi(X) = strength * sum_i norm(X_i)`` over the rows of a 2-D leaf (sec. 6.6); a leaf
    that is not 2-D is one row. Subclasses name the row norm and its two row-wise prox solvers
    ``(v, tau, rows, cols)`` (Euclidean) and ``(u, tau, h, rows, cols)`` (diagonal ``H``)."""

    @staticmethod
    def _row_norms(x):
        raise NotImplementedError

    def value(self, x):
        x = jnp.asarray(x)
        return self.strength * jnp.sum(self._row_norms(x.reshape(_rows(x.shape))))

    def _euclid(self, v, t, shape):
        return type(self)._row_euclid(v, t * self.strength, *_rows(shape))

    def _diag(self, u, c, h, shape):
        return type(self)._row_diag(u, c * self.strength, h, *_rows(shape))


@dataclasses.dataclass(frozen=True)
class _MixedL1L2(_RowSum):
    name = "mixed_l1_l2"
    _row_norms = staticmethod(lambda x: _safe_norm(x, axis=-1))
    _row_euclid, _row_diag = staticmethod(_group_l2_euclid), staticmethod(_group_l2_diag)


@dataclasses.dataclass(frozen=True)
class _MixedL1Linf(_RowSum):
    name = "mixed_l1_linf"
    _row_norms = staticmethod(lambda x: jnp.max(jnp.abs(x), axis=-1, initial=0))
    _row_euclid, _row_diag = staticmethod(_linf_euclid), staticmethod(_linf_diag)


# --------------------------------------------------------------------------------------------------
# constructors


def soft_threshold(v, threshold):
    """``sgn(v) max(0, |v| - threshold)``: the Euclidean proximal map of ``threshold ||x||_1``.

    ``soft_threshold(v, t) = argmin_x 1/2 ||x - v||^2 + t ||x||_1``, entry by entry. The closed
    form behind :func:`l1` with a ``DiagonalOperator`` and the truncation step of the sparse
    first-order learners (L1-FOBOS, L1-RDA, FTRL-Proximal, truncated gradient in
    :mod:`sketchopt.first_order`).

    Args:
      v: an array.
      threshold: ``>= 0``, a scalar or an array broadcasting against ``v``.

    Returns:
      ``v`` shrunk towards zero by ``threshold``, entries within ``threshold`` of zero set to 0.
      A complex ``v`` has its modulus shrunk and its phase kept, ``v max(0, 1 - threshold /
      |v|)`` (the proximal map of ``threshold sum_i |v_i|`` on ``C^d``).

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.1, eq. (24) (with ``H = I``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.regularizers import soft_threshold
      >>> soft_threshold(jnp.array([-2.0, 0.5, 3.0]), 1.0)
      Array([-1.,  0.,  2.], dtype=float32)
    """
    # complex v: jnp.sign(v) = v / |v|, the complex soft threshold v max(0, 1 - threshold / |v|)
    return jnp.sign(v) * jnp.maximum(jnp.abs(v) - threshold, 0)


def l1(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The l1 penalty ``phi(x) = strength * ||x||_1``.

    Proximal map (``tau = c * strength``): ``x* = argmin_x <u, x> + tau ||x||_1 + 1/2 <x, H x>``.
    With ``H = diag(h)`` it is the closed form ``x_i = -sign(u_i) [|u_i| - tau]_+ / h_i``; in
    center form ``x_i = sign(z_i) [|z_i| - tau / h_i]_+``. With a ``LowRankOperator`` the inner
    solver (module docstring) runs on the Euclidean prox ``soft_threshold(v, t * strength)``, so
    every iterate is exactly sparse.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings (``LowRankOperator`` only), see
        :class:`Regularizer`.

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.1, eq. (22) (u-form, dual averaging) and eq. (24) (center form,
      composite mirror descent).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import l1
      >>> h = DiagonalOperator(jnp.array([1.0, 2.0, 4.0]))
      >>> l1(1.0).prox(jnp.array([3.0, -0.5, -5.0]), 1.0, h, shape=(3,)).tolist()
      [-2.0, 0.0, 1.0]
    """
    return _L1(strength, tol, max_iter, solver)


def l2_squared(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The squared l2 penalty ``phi(x) = strength / 2 * ||x||_2^2`` (the paper's convention).

    Proximal map: ``x* = -(H + c * strength * I)^{-1} u``; center form
    ``x* = (H + c * strength * I)^{-1} H z``. With ``H = diag(h)``,
    ``x_i = -u_i / (h_i + c * strength)``; with a ``LowRankOperator``, one Woodbury shifted solve
    (center form: the same on the spectrum of ``H``), exact, without iterations.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings, see :class:`Regularizer` (unused: every
        case has a closed form).

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.2, eq. (25).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import l2_squared
      >>> h = DiagonalOperator(jnp.array([1.0, 2.0]))
      >>> l2_squared(2.0).prox(jnp.array([3.0, -6.0]), 1.0, h, shape=(2,)).tolist()
      [-1.0, 1.5]
    """
    return _L2Squared(strength, tol, max_iter, solver)


def l2(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The group norm ``phi(x) = strength * ||x||_2`` of the whole leaf.

    Proximal map (``tau = c * strength``): ``x* = argmin_x <u, x> + tau ||x||_2 + 1/2 <x, H x>``
    is ``0`` if ``||u||_2 <= tau``, else ``x* = -(H + mu I)^{-1} u`` with ``mu = 1/t`` and
    ``t > 0`` the root of the secular equation ``||(I + t H)^{-1} u||_2 = tau``. With
    ``H = diag(h)`` the equation is on ``(u, h)``; with a ``LowRankOperator`` on the ``k + 1``
    numbers ``(V u, ||u - V^T V u||)`` and eigenvalues ``(s + w, s)`` of ``H``. Both are exact:
    Newton on the concave ``1/||(I + t H)^{-1} u|| = 1/tau`` instead of the paper's bisection.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings, see :class:`Regularizer` (unused: every
        case is solved through the secular equation).

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.4, eq. (29) and Fig. 4 (the same problem, solved by bisection there).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import l2
      >>> h = DiagonalOperator(jnp.ones(2))
      >>> l2(2.5).prox(jnp.array([3.0, 4.0]), 1.0, h, shape=(2,)).round(4).tolist()
      [-1.5, -2.0]
    """
    return _L2(strength, tol, max_iter, solver)


def linf(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The max norm ``phi(x) = strength * ||x||_inf`` of the whole leaf.

    Proximal map (``tau = c * strength``): ``x* = argmin_x <u, x> + tau ||x||_inf + 1/2 <x, H x>``.
    Its dual is a weighted l1-ball projection: with ``H = diag(h)``,
    ``x* = -clip(u / h, -theta, theta)`` where ``theta >= 0`` solves
    ``sum_i [|u_i| - theta h_i]_+ = tau`` (sort-based and exact; ``x* = 0`` if
    ``||u||_1 <= tau``). The Euclidean prox is ``v - P(v)`` (Moreau), ``P`` the projection onto
    ``{||y||_1 <= t * strength}``; a ``LowRankOperator`` uses the inner solver on it.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings (``LowRankOperator`` only), see
        :class:`Regularizer`.

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.5, eq. (31), solved by the weighted projection of Fig. 3 (eq. 28);
      Duchi, Shalev-Shwartz, Singer & Chandra, "Efficient Projections onto the l1-Ball for
      Learning in High Dimensions", ICML 2008, Fig. 1 (the projection ``P``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import linf
      >>> h = DiagonalOperator(jnp.ones(3))
      >>> linf(2.0).prox(jnp.array([3.0, -1.0, 0.5]), 1.0, h, shape=(3,)).tolist()
      [-1.0, 1.0, -0.5]
    """
    return _Linf(strength, tol, max_iter, solver)


def l1_ball(radius, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The constraint ``||x||_1 <= radius``: ``phi`` is its indicator.

    ``value`` is 0 inside (with a few ulps of slack, so prox outputs count as feasible) and
    ``+inf`` outside. The constraint is enforced whatever ``c`` (the indicator is scale-invariant).
    The radius is available as ``.radius`` (and ``.strength``).

    Proximal map: ``x* = argmin_{||x||_1 <= radius} <u, x> + 1/2 <x, H x>``. With
    ``H = diag(h)`` it is exact: ``x*_i = -sign(u_i) [|u_i| - theta]_+ / h_i`` with ``theta >= 0``
    making ``||x*||_1 = radius`` (``theta = 0`` if ``-H^{-1} u`` is feasible), found by sorting.
    The Euclidean prox is the projection onto the ball (sort-based). A ``LowRankOperator`` uses
    the dual Newton method with that projection, then, if needed, a search for ``theta`` and an
    active-set polish on the support (module docstring).

    Args:
      radius: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings (``LowRankOperator`` only), see
        :class:`Regularizer`.

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.3, eq. (26) and Fig. 3 (eq. 28); Duchi, Shalev-Shwartz, Singer &
      Chandra, "Efficient Projections onto the l1-Ball for Learning in High Dimensions",
      ICML 2008, Fig. 1 (the Euclidean projection).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import l1_ball
      >>> h = DiagonalOperator(jnp.ones(3))
      >>> l1_ball(3.0).prox(jnp.array([4.0, -2.0, -0.5]), 1.0, h, shape=(3,)).tolist()
      [-2.5, 0.5, 0.0]
    """
    try:
        return _L1Ball(radius, tol, max_iter, solver)
    except ValueError as err:
        raise ValueError(str(err).replace("`strength`", "`radius`")) from None


def mixed_l1_l2(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The mixed norm ``phi(X) = strength * sum_i ||X_i||_2`` over the rows of a 2-D leaf.

    A leaf that is not 2-D is treated as a single row (then this is :func:`l2`). Proximal map:
    ``argmin_X <U, X> + c phi(X) + 1/2 <X, H X>``; with ``H = diag(h)`` it separates into the
    :func:`l2` problem of each row (exact, secular equation). The Euclidean prox is the row-wise
    shrinkage ``V_i [1 - t * strength / ||V_i||_2]_+``; a ``LowRankOperator`` (which couples
    the rows) uses the inner solver on it.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings (``LowRankOperator`` only), see
        :class:`Regularizer`.

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.6 (``p = 2``, the rows solved as in sec. 6.4, eq. 29).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import mixed_l1_l2
      >>> h = DiagonalOperator(jnp.ones(4))
      >>> u = jnp.array([[3.0, 4.0], [0.6, 0.8]])  # row norms 5 and 1
      >>> mixed_l1_l2(2.5).prox(u, 1.0, h, shape=(2, 2)).round(4).tolist()
      [[-1.5, -2.0], [0.0, 0.0]]
    """
    return _MixedL1L2(strength, tol, max_iter, solver)


def mixed_l1_linf(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The mixed norm ``phi(X) = strength * sum_i ||X_i||_inf`` over the rows of a 2-D leaf.

    A leaf that is not 2-D is treated as a single row (then this is :func:`linf`). Proximal map:
    ``argmin_X <U, X> + c phi(X) + 1/2 <X, H X>``; with ``H = diag(h)`` it separates into the
    :func:`linf` problem of each row (exact, sort-based). The Euclidean prox is the row-wise
    ``V_i - P(V_i)``; a ``LowRankOperator`` (which couples the rows) uses the inner solver on it.

    Args:
      strength: ``>= 0``, a float or a traced scalar.
      tol, max_iter, solver: the inner solver's settings (``LowRankOperator`` only), see
        :class:`Regularizer`.

    Returns:
      A :class:`Regularizer`.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", sec. 6.6 (``p = inf``, the rows solved as in sec. 6.5, eq. 31).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import DiagonalOperator
      >>> from sketchopt.regularizers import mixed_l1_linf
      >>> h = DiagonalOperator(jnp.ones(4))
      >>> u = jnp.array([[3.0, -1.0], [-0.5, -0.5]])  # row l1 norms 4 and 1
      >>> mixed_l1_linf(2.0).prox(u, 1.0, h, shape=(2, 2)).tolist()
      [[-1.0, 1.0], [0.0, 0.0]]
    """
    return _MixedL1Linf(strength, tol, max_iter, solver)
