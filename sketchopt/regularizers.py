r"""Composite regularizers ``phi`` and their proximal steps under a metric ``H``.

Every rule of :mod:`sketchopt.transforms` (composite mirror descent and dual averaging) reduces to
one proximal step per parameter leaf (Duchi, Hazan & Singer, *Adaptive Subgradient Methods*,
sec. 6, eq. 21)::

    x* = argmin_x  <u, x> + c * phi(x) + 1/2 <x, H x>,        c >= 0,

with ``u`` a flat ``(d,)`` vector and ``H`` one of the operators of :mod:`sketchopt._operators`.
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
* ``prox(u, c, op, *, shape, x0=None)`` -- the ``x*`` above (flat in, flat out);
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

``l1_ball`` runs this Newton method for at most 8 iterations; its model only sees the current
support of the projection and can crawl when the constraint is strongly active, the support tiny
and ``H`` badly conditioned. Unconverged problems then switch to a search for the constraint's
multiplier ``theta`` (Illinois false position on the continuous, monotone, piecewise-linear
``||x(theta)||_1``), where ``x(theta)`` is the ``l1``-regularized step above, warm-started; the
reported iterations are the total inner Newton iterations.

For very large bases (``n > 1024``, e.g. ADA-FULL in high dimension) the ``O(k n d + k^2 d)``
Newton work dominates and ``solver="auto"`` switches to over-relaxed (1.6) **ADMM** on ``x = z``:
the ``x``-step is a Woodbury shifted solve ``(H + rho I)^{-1}``, the ``z``-step the Euclidean prox,
with
``rho = sqrt(lambda_min * lambda_max)`` (the optimal choice for strongly convex quadratics, Ghadimi
et al. 2015); ``O(n d)`` per iteration but ``O(sqrt(kappa))`` iterations, so badly conditioned
problems may hit ``max_iter``. ``solver="newton"`` / ``"admm"`` force a choice.

Stopping rule: the relative KKT residual measured in the metric's dual norm,
``||e||_{H^{-1}} / max(||u||_{H^{-1}}, ||x||_H)`` where ``e`` is an element of
``u + H x + c d(phi)(x)`` at the returned ``x`` (Newton: ``e = B^T (B x - g)``, in ``O(k)``;
ADMM: ``e = u + H z + rho w``, checked every 10 iterations). By strong convexity it bounds the
relative error, ``||x - x*||_H <= ||e||_{H^{-1}}``, and unlike the Euclidean residual it is
insensitive to the conditioning of ``H``. The loop stops when it is below ``tol`` (``tol`` is
raised to ``64 * eps`` of the working dtype), after ``max_iter`` iterations (default 50 for Newton,
5000 for ADMM), or when Newton stalls at rounding level (a full step that no longer reduces a
residual below ``6.4e4 * eps``; float32 with ``kappa ~ 1e6``). Both solvers warm-start from ``x0``
(Newton from ``g0 = B x0``, ADMM from ``z0 = x0`` and its matching dual). Problems with a
positively homogeneous ``phi`` are rescaled by ``max |u|`` so that huge inputs (``1e30`` in float32)
do not overflow; the operator's ``scale_exp`` is honoured.

All functions are jittable and vmappable (over ``u``, ``c`` and batched operators); the working
dtype is ``u``'s (at least float32) and the result has ``u``'s dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from sketchopt._operators import DiagonalOperator, LowRankOperator

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
]

_HIGHEST = "highest"
_NEWTON_MAX_BASIS = 1024  # solver="auto": Newton up to this many basis rows, then ADMM
_SOLVERS = ("auto", "newton", "admm")
_ADMM_RELAXATION = 1.6
_ADMM_CHECK = 10  # ADMM iterations between two (exact) residual checks
_ARMIJO = 1e-4
_MAX_BACKTRACK = 30


class ProxInfo(NamedTuple):
    """Diagnostics of one proximal step: iterations of the inner solver and its final residual.

    Closed forms report ``iterations = 0`` and ``residual = 0``.
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


def _safe_div(a, b):
    """``a / b`` with ``0`` where ``b == 0``."""
    return jnp.where(b != 0, a / jnp.where(b != 0, b, 1), 0)


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


def _check_nonneg(name, value):
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
        raise ValueError(
            f"{name}: expected a finite number >= 0 (a concrete value), got {value!r}"
        ) from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return v


@dataclasses.dataclass(frozen=True)
class Regularizer:
    """Base class of the composite terms; build instances with the module's constructors.

    Attributes:
      strength: the regularization strength (the radius for ``l1_ball``).
      tol: relative KKT tolerance of the inner solver (``LowRankOperator`` only), in ``(0, 1)``.
      max_iter: iteration cap of the inner solver, ``>= 1``; ``None``: 50 (Newton), 5000 (ADMM).
      solver: ``"auto"`` (Newton up to 1024 basis rows, else ADMM), ``"newton"`` or ``"admm"``.
    """

    strength: float
    tol: float = 1e-6
    max_iter: int | None = None
    solver: str = "auto"

    name = "regularizer"
    _homogeneous = True  # phi(a x) = a phi(x) for a > 0: the prox problem can be rescaled

    def __post_init__(self):
        strength = _check_nonneg(f"{self.name}: `strength`", self.strength)
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
        """``phi(x)`` for a leaf of any shape."""
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

    def _lowrank_exact(self, u, c, op, shape):
        """Exact solution for a LowRankOperator, or ``None`` to use the inner solver."""
        return None

    def _newton(self, u, c, op, shape, x0, tol, max_iter):
        return _newton_dual(self, u, c, op, shape, x0, tol, max_iter)

    # ---- public API ---------------------------------------------------------------------------

    def prox_euclidean(self, v, t, *, shape):
        """``argmin_x 1/2 ||x - v||^2 + t * phi(x)``; ``v`` flat or of ``shape``, same shape out."""
        v = jnp.asarray(v)
        wd = _work_dtype(v.dtype)
        flat = v.reshape(-1).astype(wd)
        t = jnp.maximum(jnp.asarray(t, wd), 0)
        x, _ = self._euclid(flat, t, tuple(shape))
        return x.astype(v.dtype).reshape(v.shape)

    def prox(self, u, c, op, *, shape, x0=None):
        """``argmin_x <u, x> + c * phi(x) + 1/2 <x, H x>`` for flat ``u`` and ``H = op``."""
        return self.prox_with_info(u, c, op, shape=shape, x0=x0)[0]

    def prox_with_info(self, u, c, op, *, shape, x0=None):
        """Like :meth:`prox`, also returning a :class:`ProxInfo`."""
        u = jnp.asarray(u)
        shape = tuple(shape)
        d = math.prod(shape)
        if u.size != d:
            raise ValueError(f"{self.name}.prox: u has {u.size} entries, shape {shape} has {d}")
        wd = _work_dtype(u.dtype)
        uf = u.reshape(-1).astype(wd)
        c = jnp.maximum(jnp.asarray(c, wd), 0)
        zero_info = ProxInfo(jnp.int32(0), jnp.zeros((), wd))
        if isinstance(op, DiagonalOperator):
            h = jnp.asarray(op.diag, wd).reshape(-1)
            h = jnp.maximum(h, 0)
            uf = jnp.where(h > 0, uf, 0)
            x, info = self._diag(uf, c, h, shape), zero_info
        elif isinstance(op, LowRankOperator):
            op = op._replace(
                scalar=jnp.asarray(op.scalar, wd),
                basis=jnp.asarray(op.basis, wd),
                coef=jnp.asarray(op.coef, wd),
                weights=jnp.maximum(jnp.asarray(op.weights, wd), 0),
            )
            x, info = self._lowrank(uf, c, op, shape, x0)
        else:
            raise TypeError(
                f"{self.name}.prox: op must be a DiagonalOperator or LowRankOperator, got "
                f"{type(op).__name__}"
            )
        return x.astype(u.dtype).reshape(u.shape), info

    # ---- low-rank dispatch ----------------------------------------------------------------------

    def _lowrank(self, u, c, op, shape, x0):
        wd = u.dtype
        zero_info = ProxInfo(jnp.int32(0), jnp.zeros((), wd))
        exact = self._lowrank_exact(u, c, op, shape)
        if exact is not None:
            return exact, zero_info
        if u.size == 0:
            return u, zero_info
        solver = self.solver
        if solver == "auto":
            solver = "newton" if op.basis.shape[0] <= _NEWTON_MAX_BASIS else "admm"
        max_iter = self.max_iter or (50 if solver == "newton" else 5000)
        tol = max(self.tol, 64 * float(jnp.finfo(wd).eps))
        if x0 is not None:
            x0 = jnp.asarray(x0, wd).reshape(-1)
            x0 = jnp.where(jnp.isfinite(x0), x0, 0)  # a warm start must never poison the solve
        # Rescale homogeneous problems: x*(u, c) = sigma * x*(u / sigma, c / sigma).
        if self._homogeneous:
            m = jnp.max(jnp.abs(u), initial=0)
            sigma = jnp.where(m > 0, m, 1)
        else:
            sigma = jnp.ones((), wd)
        us, cs = u / sigma, c / sigma
        x0s = None if x0 is None else x0 / sigma
        if solver == "newton":
            xs, info = self._newton(us, cs, op, shape, x0s, tol, max_iter)
        else:
            xs, info = _admm(self, us, cs, op, shape, x0s, tol, max_iter)
        x = xs * sigma
        if self._homogeneous:
            # c * strength == 0: the unregularized minimizer, exactly.
            free = c * self.strength == 0
            x = jnp.where(free, -op.solve(u), x)
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


def _newton_dual(reg, u, c, op, shape, x0, tol, max_iter):
    """Semismooth Newton on the k-dimensional dual (see the module docstring)."""
    wd = u.dtype
    eps = jnp.finfo(wd).eps
    s = op.scalar
    sw, bmat, bt = _lowrank_parts(op)
    k = sw.shape[0]
    cw = sw[:, None] * op.coef  # (k, n)
    scale_exp = -jnp.asarray(getattr(op, "scale_exp", 0), jnp.int32)
    t = c / s
    nu_h = _norm_hinv(op, u)
    wmax = jnp.max(op.weights, initial=0)

    def primal(q):
        return reg._euclid(-q / s, t, shape)

    def dual_terms(q, x, gam):
        terms = jnp.stack(
            [
                jnp.vdot(q, x),
                c * reg._dual_value(x, shape),
                0.5 * s * jnp.vdot(x, x),
                -0.5 * jnp.vdot(gam, gam),
            ]
        )
        return jnp.sum(terms), jnp.sum(jnp.abs(terms))

    # Residual in the H^{-1} norm: on the rows of V, H has eigenvalues s + w_j, hence
    # ||B^T r||_{H^{-1}}^2 = sum_j w_j r_j^2 / (s + w_j); ||x||_H^2 = s ||x||^2 + ||B x||^2.
    hinv_w = op.weights / (s + op.weights)

    def residual(x, bx, gam):
        e_h = _safe_norm(jnp.sqrt(hinv_w) * (bx - gam))
        x_h = jnp.sqrt(s * jnp.vdot(x, x) + jnp.vdot(bx, bx))
        return e_h / jnp.maximum(jnp.maximum(nu_h, x_h), jnp.finfo(wd).tiny)

    # B materialized once as a k x d matrix (V = 2**-scale_exp coef @ basis; scale the basis, not
    # the possibly huge/tiny products). The Newton matrix is then assembled as a Gram matrix,
    # positive semidefinite by construction whatever the conditioning of coef and basis.
    bm = jnp.matmul(cw, jnp.ldexp(op.basis, scale_exp), precision=_HIGHEST)
    projector = getattr(reg, "_jac_projector", False)

    def newton_matrix(jac):
        y = bm * jnp.sqrt(jac.dg)
        m = None
        if jac.g is not None:
            qm = jnp.einsum("krc,rc->kr", bm.reshape((k, *jac.g.shape)), jac.g, precision=_HIGHEST)
            if projector:
                # J = D - sum_r g_r g_r^T / |A_r| is a projector P (D binary, g_r = sign on A_r):
                # B J B^T = (B P)(B P)^T, with B P = B D - sum_r (B g_r) g_r^T / |A_r|.
                y = y + jnp.einsum("kr,rc->krc", qm * jac.a, jac.g).reshape(k, -1)
            else:  # a_r >= 0: a sum of positive semidefinite terms
                m = jnp.matmul(qm * jac.a, qm.T, precision=_HIGHEST)
        g = jnp.matmul(y, y.T, precision=_HIGHEST)
        m = g if m is None else g + m
        return jnp.eye(k, dtype=wd) + m / s

    if x0 is None:
        gam0 = jnp.zeros((k,), wd)
        q0 = u
    else:
        gam0 = bmat(x0)
        q0 = u + bt(gam0)
    xi0, jac0 = primal(q0)
    bx0 = bmat(xi0)
    d0, _ = dual_terms(q0, xi0, gam0)
    res0 = residual(xi0, bx0, gam0)
    noise = 1e3 * 64 * eps  # below this, a full step that does not reduce the residual = stalled

    def cond(st):
        it, *_, res, stalled = st
        return (it < max_iter) & (res > tol) & ~stalled

    def body(st):
        it, gam, q, x, jac, bx, dval, res, _ = st
        grad = bx - gam
        mat = newton_matrix(jac)
        chol = jnp.linalg.cholesky(mat)
        step = jax.scipy.linalg.cho_solve((chol, True), grad)
        slope = jnp.vdot(grad, step)
        ok = jnp.all(jnp.isfinite(step)) & (slope > 0)
        # Fallback: a gradient step with the 1/L step size (L = 1 + w_max/s).
        step = jnp.where(ok, step, grad / (1 + wmax / s))
        slope = jnp.vdot(grad, step)
        btd = bt(step)

        def ls_cond(ls):
            j, _, accepted, *_ = ls
            return (~accepted) & (j < _MAX_BACKTRACK)

        def ls_body(ls):
            j, alpha, *_ = ls
            qa = q + alpha * btd
            xa, jaca = primal(qa)
            da, mag = dual_terms(qa, xa, gam + alpha * step)
            slack = 64 * eps * mag  # D is only known to rounding: accept within it
            acc = jnp.isfinite(da) & (da >= dval + _ARMIJO * alpha * slope - slack)
            return j + 1, jnp.where(acc, alpha, alpha / 2), acc, qa, xa, jaca, da

        init = (jnp.int32(0), jnp.ones((), wd), jnp.zeros((), bool), q, x, jac, dval)
        _, alpha, accepted, qa, xa, jaca, da = lax.while_loop(ls_cond, ls_body, init)

        def pick(new, old):
            return jax.tree.map(lambda a, b: jnp.where(accepted, a, b), new, old)

        gam_n, q_n, x_n, jac_n, d_n = pick(
            (gam + alpha * step, qa, xa, jaca, da), (gam, q, x, jac, dval)
        )
        bx_n = bmat(x_n)
        res_n = residual(x_n, bx_n, gam_n)
        stalled = ~accepted | ((alpha == 1) & (res_n > 0.9 * res) & (res_n < noise))
        return it + 1, gam_n, q_n, x_n, jac_n, bx_n, d_n, res_n, stalled

    st = (jnp.int32(0), gam0, q0, xi0, jac0, bx0, d0, res0, jnp.zeros((), bool))
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


def _l1_ball_newton(u, radius, op, shape, x0, tol, max_iter):
    """``argmin <u, x> + 1/2 <x, H x>`` s.t. ``||x||_1 <= radius`` for a LowRankOperator.

    Phase 1: the dual Newton method with the ball's projection as the Euclidean prox (a few
    iterations; it converges in 2-3 on typical problems). Its Newton model only sees the current
    support of the projection, so when the constraint is strongly active, the support small and
    ``H`` badly conditioned it can crawl. Phase 2 (only if phase 1 did not converge) searches the
    multiplier instead: ``x(theta) = argmin <u, x> + theta ||x||_1 + 1/2 <x, H x>`` (the robust l1
    solver, warm-started) has ``||x(theta)||_1`` continuous, non-increasing and piecewise linear
    in ``theta``; Illinois false position on ``[0, ||u||_inf]`` finds ``||x(theta)||_1 = radius``.
    """
    wd = u.dtype
    eps = jnp.finfo(wd).eps
    direct_iters = min(max_iter, _BALL_DIRECT_ITERS)
    x1, info1 = _newton_dual(_Ball(radius), u, jnp.ones((), wd), op, shape, x0, tol, direct_iters)
    done1 = info1.residual <= tol

    x_free = -op.solve(u)
    f_free = jnp.sum(jnp.abs(x_free)) - radius  # > 0 unless the constraint is inactive
    theta_max = jnp.max(jnp.abs(u), initial=0)  # x(theta) = 0 from here on
    l1 = _L1(1.0)
    inner_iters = max(max_iter, 20)

    def value(theta, x_prev):
        x, info = _newton_dual(l1, u, theta, op, shape, x_prev, tol, inner_iters)
        return x, info, jnp.sum(jnp.abs(x)) - radius

    # Initial multiplier from phase 1: on the support, -(u + H x)_i = theta sign(x_i).
    g = -(u + op.matvec(x1)) * jnp.sign(x1)
    nnz = jnp.sum(x1 != 0)
    theta0 = jnp.where(nnz > 0, jnp.sum(jnp.where(x1 != 0, g, 0)) / jnp.maximum(nnz, 1), 0)
    theta0 = jnp.where((theta0 > 0) & (theta0 < theta_max), theta0, 0.5 * theta_max)

    def cond(st):
        it, lo, _, hi, _, _, _, _, res, _ = st
        width_ok = hi - lo > 4 * eps * hi
        return ~done1 & (it < max_iter) & (res > tol) & width_ok

    def body(st):
        it, lo, f_lo, hi, f_hi, theta, x, side, _, inner = st
        x, info, f = value(theta, x)
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
    x2 = _l1_ball_euclid(x2, radius, 1, x2.size)[0]  # exact feasibility (moves x by <= tol)
    x = jnp.where(done1, x1, jnp.where(f_free <= 0, x_free, x2))
    res = jnp.where(done1, info1.residual, jnp.where(f_free <= 0, 0, res2))
    iters = info1.iterations + jnp.where(done1, 0, inner)
    return x, ProxInfo(iters, res)


def _admm(reg, u, c, op, shape, x0, tol, max_iter):
    """Over-relaxed ADMM on ``x = z`` (see the module docstring)."""
    wd = u.dtype
    lo = op.scalar
    hi = op.scalar + jnp.max(op.weights, initial=0)
    rho = jnp.sqrt(lo * hi)
    alpha = _ADMM_RELAXATION
    nu_h = jnp.sqrt(jnp.maximum(jnp.vdot(u, op.solve(u)), 0))

    if x0 is None:
        z0 = jnp.zeros_like(u)
        w0 = -u / rho
    else:
        z0 = x0
        w0 = -(u + op.matvec(x0)) / rho

    def step(_, zw):
        z, w = zw
        x = op.solve_shifted(rho, rho * (z - w) - u)
        xh = alpha * x + (1 - alpha) * z
        z_n, _ = reg._euclid(xh + w, c / rho, shape)
        return z_n, w + xh - z_n

    def cond(st):
        it, _, _, res = st
        return (it < max_iter) & (res > tol)

    def body(st):
        it, z, w, _ = st
        z, w = lax.fori_loop(0, _ADMM_CHECK, step, (z, w))
        # The z-step gives rho * w in c d(phi)(z), so e = u + H z + rho w is an element of the
        # subdifferential of the objective at z: an exact KKT residual, one product with H.
        hz = op.matvec(z)
        e = u + hz + rho * w
        e_h = jnp.sqrt(jnp.maximum(jnp.vdot(e, op.solve(e)), 0))
        z_h = jnp.sqrt(jnp.maximum(jnp.vdot(z, hz), 0))
        scale = jnp.maximum(jnp.maximum(nu_h, z_h), jnp.finfo(wd).tiny)
        return it + _ADMM_CHECK, z, w, e_h / scale

    st = (jnp.int32(0), z0, w0, jnp.asarray(jnp.inf, wd))
    it, z, _, res = lax.while_loop(cond, body, st)
    return z, ProxInfo(it, res)


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
        x = jnp.sign(v) * jnp.maximum(jnp.abs(v) - tau, 0)
        dg = (jnp.abs(v) > tau).astype(v.dtype)
        return x, _Jac(dg, None, None)

    def _diag(self, u, c, h, shape):
        num = jnp.sign(u) * jnp.maximum(jnp.abs(u) - c * self.strength, 0)
        return -_safe_div(num, h)


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

    def _lowrank_exact(self, u, c, op, shape):
        return -op.solve_shifted(c * self.strength, u)


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

    def _lowrank_exact(self, u, c, op, shape):
        tau = c * self.strength
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

    def _newton(self, u, c, op, shape, x0, tol, max_iter):
        # x*(u, r) = m x*(u / m, r / m): rescale so that max |u| = 1 (huge inputs do not overflow).
        m = jnp.max(jnp.abs(u), initial=0)
        m = jnp.where(m > 0, m, 1)
        x0 = None if x0 is None else x0 / m
        x, info = _l1_ball_newton(u / m, self.strength / m, op, shape, x0, tol, max_iter)
        return x * m, info

    def _diag(self, u, c, h, shape):
        au = jnp.abs(u)
        inv = _safe_div(jnp.ones_like(h), h)
        theta = _threshold(au[None], inv[None], (au * inv)[None], self.strength)[0]
        x = -jnp.sign(u) * _safe_div(jnp.maximum(au - theta, 0), h)
        return jnp.where(theta > 0, _renormalize_l1(x, self.strength), x)


@dataclasses.dataclass(frozen=True)
class _MixedL1L2(Regularizer):
    name = "mixed_l1_l2"

    def value(self, x):
        x = jnp.asarray(x)
        rows, cols = _rows(x.shape)
        return self.strength * jnp.sum(_safe_norm(x.reshape(rows, cols), axis=-1))

    def _euclid(self, v, t, shape):
        return _group_l2_euclid(v, t * self.strength, *_rows(shape))

    def _diag(self, u, c, h, shape):
        return _group_l2_diag(u, c * self.strength, h, *_rows(shape))


@dataclasses.dataclass(frozen=True)
class _MixedL1Linf(Regularizer):
    name = "mixed_l1_linf"

    def value(self, x):
        x = jnp.asarray(x)
        rows, cols = _rows(x.shape)
        return self.strength * jnp.sum(jnp.max(jnp.abs(x.reshape(rows, cols)), axis=-1, initial=0))

    def _euclid(self, v, t, shape):
        return _linf_euclid(v, t * self.strength, *_rows(shape))

    def _diag(self, u, c, h, shape):
        return _linf_diag(u, c * self.strength, h, *_rows(shape))


# --------------------------------------------------------------------------------------------------
# constructors

_DOC_KW = """
    Keyword arguments (inner solver, used only with a ``LowRankOperator``):
      tol: relative KKT tolerance in ``(0, 1)`` (default ``1e-6``; never below ``64 * eps``).
      max_iter: iteration cap ``>= 1`` (default ``None``: 50 Newton / 5000 ADMM iterations).
      solver: ``"auto"`` (default), ``"newton"`` or ``"admm"``.
"""


def l1(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(x) = strength * ||x||_1`` (Duchi et al. sec. 6.1, eq. 22 and 24)."""
    return _L1(strength, tol, max_iter, solver)


def l2_squared(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(x) = strength / 2 * ||x||_2^2`` -- the paper's convention (sec. 6.2).

    With it the diagonal step is eq. 25: ``x = -(H + c * strength * I)^{-1} u``; for a
    ``LowRankOperator`` the same formula is one Woodbury solve (exact, no iterations).
    """
    return _L2Squared(strength, tol, max_iter, solver)


def l2(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(x) = strength * ||x||_2``, the group norm of the whole leaf (sec. 6.4).

    Solved exactly for both operators through a scalar secular equation (see module docstring).
    """
    return _L2(strength, tol, max_iter, solver)


def linf(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(x) = strength * ||x||_inf`` of the whole leaf (sec. 6.5)."""
    return _Linf(strength, tol, max_iter, solver)


def l1_ball(radius, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """The constraint ``||x||_1 <= radius`` (sec. 6.3): ``phi`` is its indicator.

    ``value`` is 0 inside (with a few ulps of slack, so prox outputs count as feasible) and
    ``+inf`` outside. The constraint is enforced whatever ``c`` (the indicator is scale-invariant).
    The radius is available as ``.radius`` (and ``.strength``).
    """
    try:
        return _L1Ball(radius, tol, max_iter, solver)
    except ValueError as err:
        raise ValueError(str(err).replace("`strength`", "`radius`")) from None


def mixed_l1_l2(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(X) = strength * sum_i ||X_i||_2`` over the rows of a 2-D leaf (sec. 6.6).

    A leaf that is not 2-D is treated as a single row (then this is :func:`l2`).
    """
    return _MixedL1L2(strength, tol, max_iter, solver)


def mixed_l1_linf(strength, *, tol=1e-6, max_iter=None, solver="auto") -> Regularizer:
    """``phi(X) = strength * sum_i ||X_i||_inf`` over the rows of a 2-D leaf (sec. 6.6).

    A leaf that is not 2-D is treated as a single row (then this is :func:`linf`).
    """
    return _MixedL1Linf(strength, tol, max_iter, solver)


for _f in (l1, l2_squared, l2, linf, l1_ball, mixed_l1_l2, mixed_l1_linf):
    _f.__doc__ = (_f.__doc__ or "") + _DOC_KW
del _f
