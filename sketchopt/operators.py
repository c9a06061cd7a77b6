"""Structured symmetric positive-definite operators ``H``: how a metric hands ``H_t`` to the rules.

A metric of :mod:`sketchopt.metrics` exposes its current ``H_t`` as an operator. The rules need
one method of it, :meth:`Operator.solve` (``H_t^{-1} y``); the proximal steps of
:mod:`sketchopt.regularizers` exploit the structure of two concrete forms:

* :class:`DiagonalOperator` -- ``H = diag(h)`` (ADA-DIAG);
* :class:`LowRankOperator` -- ``H = scalar * I + V^T diag(weights) V`` with ``V = coef @ basis``
  having orthonormal (or zero) rows (ADA-FD with any sketch; ADA-FULL with ``V`` the full
  eigenbasis; RADAGRAD; the sketched Newton metrics). ``V`` is never materialized: products go
  through the ``n x d`` ``basis`` and the small ``k x n`` ``coef``, so each product costs
  ``O(n*d)``.

A third, :class:`SubspaceOperator`, is ADA-LR's ``H^{-1} = V diag(1 / w) V^T`` (no step off the
sketched subspace): it has ``solve`` only, so ADA-LR takes no regularizer (the rules say so when
they are built, see :func:`supports_regularizers`). A fourth, :class:`KroneckerOperator`, is a
Kronecker-factored metric's ``H^{-1} y = vec(L^{-p} Y R^{-q})`` (Shampoo's form,
:func:`sketchopt.metrics.kron_sketched`), ``solve`` only as well.

Writing a metric of one's own: return any object with ``solve(y) -> H^{-1} y`` (the
:class:`Operator` protocol) from its ``update`` and ``operator``; return a
:class:`DiagonalOperator` or a :class:`LowRankOperator` for it to combine with a regularizer.
All vectors are flat ``(d,)`` arrays.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from sketchopt import _numerics, _partitioning
from sketchopt import kron as _kron

__all__ = [
    "DiagonalOperator",
    "KroneckerOperator",
    "LowRankOperator",
    "Operator",
    "SubspaceOperator",
    "supports_regularizers",
]


@runtime_checkable
class Operator(Protocol):
    """What the rules need of ``H_t``: ``solve(y) = H_t^{-1} y`` for a flat ``(d,)`` vector.

    The operator must be a pytree (a ``NamedTuple`` of arrays is simplest): it is returned from
    inside ``jit`` and ``vmap``.
    """

    def solve(self, y): ...


class DiagonalOperator(NamedTuple):
    """``H = diag(diag)`` with ``diag >= 0``; zero entries follow the safe ``0/0 = 0``."""

    diag: jnp.ndarray

    def matvec(self, x):
        return self.diag * x

    def solve(self, y):
        """``H^{-1} y`` with the safe convention ``0/0 = 0`` (ADA-DIAG with ``delta = 0``)."""
        safe = jnp.where(self.diag > 0, self.diag, 1)
        return jnp.where(self.diag > 0, y / safe, 0)

    def solve_shifted(self, rho, y):
        """``(H + rho I)^{-1} y``."""
        return y / (self.diag + rho)

    def lambda_min(self):
        return jnp.min(self.diag, initial=jnp.inf)

    def lambda_max(self):
        return jnp.max(self.diag, initial=0)


class LowRankOperator(NamedTuple):
    """``H = 4**value_exp (scalar I + V^T diag(weights) V)``, ``V = 2**-scale_exp coef @ basis``.

    ``V`` has orthonormal (or exactly zero) rows, ``scalar > 0`` and ``scalar + weights > 0``
    (RADAGRAD's ``H = I + V^T diag(Sigma^{1/2} + delta - 1) V`` has negative weights). The power
    of two ``2**-scale_exp`` (default 0) keeps products finite for sketches of huge or tiny rows.
    Inverses split ``y`` on the range of the rows with ``weights != 0`` (projector ``P``):
    ``H^{-1} y = V^T diag(1 / (scalar + weights)) V y + (y - P y) / scalar``. This is the Woodbury
    identity of the Ada-FD paper (the formula below eq. 5), ``(c I + V^T W V)^{-1} = (1/c) (I -
    V^T diag(w / (c + w)) V)``, written so that nothing cancels: the Woodbury form subtracts two
    vectors of size ``|y| / c`` to leave one of size ``|y| / (c + w)``, which in float32 loses
    everything once ``c < eps w`` (``delta = 1e-8`` against unit gradients). The residual
    ``y - P y`` is cleaned of the projector's round-off
    (:func:`sketchopt._numerics.denoise_residual`) before it is divided by the small ``c``.

    The one low-rank type of the package: the metrics hand it to the rules and regularizers
    (``value_exp = 0``: ``scalar`` and ``weights`` in true units), and
    :func:`sketchopt.sketches.low_rank` returns a sketch's covariance ``C = alpha I + V^T diag(lam)
    V`` as one (``sketchopt.sketches.LowRank`` is this class), with ``scalar = alpha`` and
    ``weights = lam`` stored divided by ``4**value_exp`` (``value_exp = scale_exp``), so that
    nothing overflows or underflows whatever the rows' magnitude; :attr:`alpha`,
    :attr:`eigenvalues` and the ``true_*``/``sqrt_*`` methods read it that way. Build it by
    keyword: the field order is not that of 0.3's ``sketches.LowRank``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt.operators import LowRankOperator
      >>> op = LowRankOperator(
      ...     scalar=jnp.array(1.0), basis=jnp.eye(2, 3), coef=jnp.eye(2),
      ...     weights=jnp.array([3.0, 0.0]))
      >>> op.solve(jnp.array([4.0, 2.0, 1.0]))  # diag(4, 1, 1)^{-1} y
      Array([1., 2., 1.], dtype=float32)

    References:
      Wan & Zhang, "Efficient Adaptive Online Learning via Frequent Directions" (Ada-FD), the
      Woodbury form below eq. 5.
    """

    scalar: jnp.ndarray
    basis: jnp.ndarray  # (n, d)
    coef: jnp.ndarray  # (k, n)
    weights: jnp.ndarray  # (k,)
    scale_exp: jnp.ndarray | int = 0
    value_exp: jnp.ndarray | int = 0  # scalar and weights are stored divided by 4**value_exp

    # -- the sketch reading (sketchopt.sketches.low_rank): C = alpha I + V^T diag(lam) V.

    @property
    def alpha(self):
        """``scalar``: the sketch's ridge, divided by ``4**value_exp``."""
        return self.scalar

    @property
    def eigenvalues(self):
        """``weights``: the sketch's ``lam`` (descending), divided by ``4**value_exp``."""
        return self.weights

    def true_eigenvalues(self):
        """``weights`` in true units."""
        return _numerics.ldexp(self.weights, 2 * jnp.asarray(self.value_exp, jnp.int32))

    def true_alpha(self):
        """``scalar`` in true units."""
        return _numerics.ldexp(self.scalar, 2 * jnp.asarray(self.value_exp, jnp.int32))

    def sqrt_eigenvalues(self):
        """``sqrt(weights)`` in true units."""
        return _numerics.ldexp(jnp.sqrt(self.weights), jnp.asarray(self.value_exp, jnp.int32))

    def sqrt_alpha(self):
        """``sqrt(scalar)`` in true units."""
        return _numerics.ldexp(jnp.sqrt(self.scalar), jnp.asarray(self.value_exp, jnp.int32))

    def in_true_units(self) -> LowRankOperator:
        """The same ``H`` with ``value_exp = 0`` (``scalar`` and ``weights`` in true units), the
        form the regularizers' proximal steps read; ``self`` when it is already in it."""
        if _unit_values(self):
            return self
        return self._replace(scalar=self.true_alpha(), weights=self.true_eigenvalues(), value_exp=0)

    def directions(self):
        """``V`` materialized (``k x d``)."""
        coef = _numerics.ldexp(self.coef, -jnp.asarray(self.scale_exp, jnp.int32))
        return jnp.matmul(coef, self.basis, precision=_numerics.HIGHEST)

    def project_product(self, product):
        """``V g`` from ``product = basis @ g / 4**scale_exp`` (what a sketch update returns)."""
        return self.coef @ _numerics.ldexp(product, jnp.asarray(self.scale_exp, jnp.int32))

    # -- products and solves.

    def project(self, x):
        """``V x`` (k,), one pass over ``basis``."""
        x = _numerics.ldexp(x, -jnp.asarray(self.scale_exp, jnp.int32))
        return self.coef @ _partitioning.contract_d(self.basis, x)

    def lift(self, a):
        """``V^T a`` (d,), one pass over ``basis``; ``a`` may be a ``(j, k)`` stack of vectors.

        Complex ``V``: ``V^H a = conj(V^T conj(a))`` (the adjoint of :meth:`project`)."""
        # Scale a first: coef may carry 2**scale_exp itself (Oja's unit directions), and
        # a @ coef could then overflow where the result does not.
        if jnp.iscomplexobj(self.basis) or jnp.iscomplexobj(self.coef):
            return jnp.conj(self._lift_plain(jnp.conj(a)))
        return self._lift_plain(a)

    def _lift_plain(self, a):
        a = _numerics.ldexp(a, -jnp.asarray(self.scale_exp, jnp.int32)) @ self.coef
        return jnp.matmul(a, self.basis, precision=_numerics.HIGHEST)

    def solve_projected(self, y, vy, rho=0.0):
        """``(H + rho I)^{-1} y`` given ``vy = V y`` already (one pass over ``basis``)."""
        if not _unit_values(self):  # H / 4**value_exp + rho / 4**value_exp, solved, rescaled
            e = jnp.asarray(self.value_exp, jnp.int32)
            unit = self._replace(value_exp=0)
            shifted = _numerics.ldexp(jnp.asarray(rho, self.scalar.dtype), -2 * e)
            return _numerics.ldexp(unit.solve_projected(y, vy, shifted), -2 * e)
        c = self.scalar + rho
        vy = jnp.where(self.weights != 0, vy, 0)
        inside, projected = self.lift(jnp.stack([vy / (c + self.weights), vy]))
        residual = _numerics.denoise_residual(y - projected, y, self.weights.shape[0])
        return inside + residual / c

    def matvec(self, x):
        out = self.scalar * x + self.lift(self.weights * self.project(x))
        if _unit_values(self):
            return out
        return _numerics.ldexp(out, 2 * jnp.asarray(self.value_exp, jnp.int32))

    def solve_shifted(self, rho, y):
        """``(H + rho I)^{-1} y`` in ``O(n*d)`` (two passes over ``basis``)."""
        return self.solve_projected(y, self.project(y), rho)

    def solve(self, y):
        return self.solve_shifted(0.0, y)

    def lambda_min(self):
        """A lower bound of the spectrum (exact when ``k < d``)."""
        return self.true_alpha() if not _unit_values(self) else self.scalar

    def lambda_max(self):
        top = self.scalar + jnp.max(self.weights, initial=0)
        if _unit_values(self):
            return top
        return _numerics.ldexp(top, 2 * jnp.asarray(self.value_exp, jnp.int32))


def _unit_values(op: LowRankOperator) -> bool:
    """Whether ``scalar`` and ``weights`` are in true units (``value_exp`` is the static 0),
    the form the metrics build and the regularizers' proximal steps read."""
    return isinstance(op.value_exp, int) and op.value_exp == 0


class SubspaceOperator(NamedTuple):
    """``H^{-1} y = V diag(1 / weights) V^T y`` with ``V = vt`` (``k x d``, orthonormal rows).

    ADA-LR's metric (Ada-FD paper eq. 3): ``H`` is defined on the sketched subspace only (no step
    outside it), so it has no ``matvec`` and no proximal structure: ``solve`` only.
    """

    vt: jnp.ndarray  # (k, d)
    weights: jnp.ndarray  # (k,), > 0

    def solve(self, y):
        coef = _partitioning.contract_d(self.vt, y) / self.weights
        return jnp.matmul(coef, self.vt, precision=_numerics.HIGHEST)


class KroneckerOperator(NamedTuple):
    """``H^{-1} y = vec(L Y R)`` for ``Y = y`` reshaped to ``m x n`` (C order), with ``L`` and
    ``R`` the inverse roots of a Kronecker-factored metric's two sides
    (:class:`sketchopt.kron.InverseRoot`, ``tail I + basis^T diag(coef) basis``): ``O(k m n)``.
    Shampoo's ``L_t^{-1/4} G R_t^{-1/4}``; ``solve`` only (no regularizer)."""

    left: Any  # kron.InverseRoot over the m rows
    right: Any  # kron.InverseRoot over the n columns

    def solve(self, y):
        m, n = self.left.basis.shape[-1], self.right.basis.shape[-1]

        def one(left, right, mat):
            return _kron.apply_right(right, _kron.apply_left(left, mat))

        mat = jnp.reshape(y, (-1, m, n) if self.left.basis.ndim == 3 else (m, n))
        # under an explicit mesh: laid out like the two sides' bases, and back
        mat, layout = _kron.match_sides(mat, self.left.basis, self.right.basis), mat
        if mat.ndim == 3:  # a stack of layers, one pair of roots each
            out = jax.vmap(one)(self.left, self.right, mat)
        else:
            out = one(self.left, self.right, mat)
        return jnp.reshape(_partitioning.like(out, layout), y.shape)


def supports_regularizers(op) -> bool:
    """Whether the regularizers' proximal steps accept ``op``: a diagonal ``H``, or a low-rank one
    in true units (``value_exp`` the static 0, as every metric builds it; a sketch's scaled
    covariance from :func:`sketchopt.sketches.low_rank` is not).

    Args:
      op: an operator returned by a metric.

    Returns:
      Whether :mod:`sketchopt.regularizers` can take its proximal steps in ``op``'s norm.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization" (JMLR 2011), sec. 6 (the composite steps for diagonal and full ``H``).

    Examples:
      >>> import jax.numpy as jnp
      >>> from sketchopt import operators
      >>> operators.supports_regularizers(operators.DiagonalOperator(jnp.ones(2)))
      True
      >>> operators.supports_regularizers(operators.SubspaceOperator(jnp.eye(1, 2), jnp.ones(1)))
      False
    """
    if isinstance(op, LowRankOperator):
        return _unit_values(op)
    return isinstance(op, DiagonalOperator)
