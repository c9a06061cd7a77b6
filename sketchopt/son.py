r"""Sketched Online Newton (SON) and the Online Newton Step, as Optax gradient transformations.

SON (Luo, Agarwal, Cesa-Bianchi & Langford 2016, ``shared/papers/004``) is the Online Newton Step
with its ``d x d`` matrix replaced by a sketch. At round ``t`` with gradient ``g_t``:

* the *to-sketch vector* ``ghat_t = sqrt(sigma_t + eta_t) g_t`` enters the sketch ``S`` (Alg. 1
  line 7-8), so that ``A_t = alpha I + S^T S`` approximates ``alpha I + sum_s ghat_s ghat_s^T``;
* the update is the Newton step ``u_{t+1} = w_t - A_t^{-1} g_t`` (Alg. 1 line 9); as an Optax
  transformation it returns the delta ``-A_t^{-1} g_t``;
* before predicting on the next example ``x_{t+1}`` the weights are projected in the ``A_t``-norm
  onto ``{w : |w^T x_{t+1}| <= C}`` (eq. 1, Lemma 1): :func:`project_bounded_prediction`.

Transforms (all ``optax.GradientTransformationExtraArgs``):

* :func:`fd_son` -- FD-SON: frequent directions (SON Alg. 2; ``fast=True``: doubling buffer);
* :func:`rfd_son` -- RFD-SON (RFD paper, ``shared/papers/002``, Alg. 3; ``fast=True``: Alg. 6):
  ``A_t = B^T B + alpha_t I`` with RFD's adaptive ``alpha_t``; ``alpha0 = 0`` is RFD0-SON, which
  uses the Moore-Penrose pseudo-inverse while ``alpha_t = 0`` (RFD paper, appendix A);
* :func:`oja_son` -- Oja-SON (SON Alg. 3);
* :func:`rp_son` -- RP-SON: Gaussian random projections, ``(alpha I + S S^T)^{-1}`` maintained by
  the paper's two rank-one Woodbury updates (SON sec. 3);
* :func:`ons` -- the full-matrix Online Newton Step (``O(d^2)`` per step, Sherman-Morrison), the
  baseline the sketched ones approximate (with ``sketch_size > d`` FD-SON equals it).

On the package's architecture (metric x rule): each transform is the mirror-descent rule with step
1 (``sketchopt.rules.metric_rule``) in SON's metric ``H_t = D_t^{1/2} A_t D_t^{1/2}``, whose
operator (:class:`SketchedNewtonOperator`, :class:`RandomProjectionNewtonOperator`,
:class:`DenseInverseOperator`, each leaf state's ``newton_operator()``) solves with ``A_t`` and
gives the pieces of the projection; :func:`newton_metric` is that metric for any sketch, usable
with :func:`sketchopt.mirror_descent`. The state class stays :class:`SONState`, where
:func:`project_bounded_prediction` finds it.

``alpha = 0`` is allowed for FD- and Oja-SON (the pseudo-inverse of SON Appendix D, no step outside
the sketch) and is RFD0-SON's start; with a full-rank ``A`` (sketch larger than ``d``, after ``d``
independent gradients) such runs are exactly invariant to ``x -> M x`` (SON sec. 2). While ``A`` is
rank-deficient no variant is: ``(M G M^T)^+ M g`` and ``M^{-T} G^+ g`` differ by a null-space
vector, as for ONS itself.

A full SON run (Alg. 1) with a linear model::

    tx = sketchopt.fd_son(alpha=1.0, sketch_size=10)
    state = tx.init(w)
    for x, y in stream:
        w = sketchopt.project_bounded_prediction(state, w, x, bound=C)   # Alg. 1 line 5
        prediction = w @ x                                               # line 6
        g = jax.grad(loss)(w, x, y)                                      # line 7
        updates, state = tx.update(g, state)                             # lines 8-9
        w = optax.apply_updates(w, updates)

Conventions (shared with :mod:`sketchopt.transforms`):

* ``eta`` and ``curvature`` (the paper's ``eta_t`` and ``sigma_t``) are floats or Optax schedules
  of the step count (``count = t - 1``). Defaults: ``eta_t = 1/sqrt(t)`` (SON, general convex
  losses: ``O(1/sqrt(t))``), and ``eta_t = 1/t`` for :func:`rfd_son` (RFD paper, its
  hyperparameter-free RFD0-SON). With ``curvature = sigma > 0`` (exp-concave losses, e.g. the
  squared loss with ``sigma = 1/(8 C^2)``) the papers take ``eta = 0``.
* Every leaf of the parameter pytree gets its own sketch (block-diagonal ``A``); a leaf of any
  shape is its flattened vector. ``optax.flatten(tx)`` gives one sketch over all parameters. The
  bounded-prediction projection couples the leaves through the single constraint ``|w^T x| <= C``.
* A leaf whose gradient (or its to-sketch vector) is not finite is skipped: its state is left
  exactly as it was (a selection, not a ``lax.cond``, so a donated state is not copied), its
  update is zero, and ``nonfinite_count`` counts it. A non-finite update, which the numerics
  below should never produce, is zeroed and counted as well.
* States are at least float32 (bf16 parameters keep a float32 sketch) and float64 when the
  parameters are. Quadratic quantities never leave the sketches' power-of-two scaled units
  unprotected: ``A^{-1} g`` is assembled from mantissa/exponent pairs, so gradients of norm
  ``1e30`` or ``1e-30`` in float32 give finite (and, where representable, accurate) updates.

Diagonal rescaling (SON sec. 5.2, ``diagonal_rescaling=True``): SON is run in the coordinates
``z = D_t^{1/2} w`` where ``D_t = 0.1 I + diag(sum_{s<t} g_s g_s^T)`` (the paper's footnote gives
``D_1 = 0.1 I``; we keep the ``0.1`` as a floor ever after, so coordinates that never saw a
gradient stay well defined). In ``z``-coordinates the example is ``D_t^{-1/2} x_t`` and the gradient
``D_t^{-1/2} g_t``; the sketch receives ``ghat_t = sqrt(sigma_t + eta_t) D_t^{-1/2} g_t`` and
``A_t = alpha I + S^T S`` is built from these rescaled gradients. Mapped back to the parameters:

    w_{t+1} = w_t - D_t^{-1/2} A_t^{-1} D_t^{-1/2} g_t,

i.e. the metric in parameter space is ``D_t^{1/2} A_t D_t^{1/2}``. Directions outside the sketch get
the step ``-(1/alpha) D_t^{-1} g_t`` (a per-coordinate, scale-invariant step as in Ross et al.'s
normalized updates) instead of the plain gradient step ``-(1/alpha) g_t``. The projection uses the
same metric: it projects ``D_t^{1/2} w`` in the ``A_t``-norm with the example
``D_t^{-1/2} x`` and maps the move back with ``D_t^{-1/2}``. ``D_t`` is updated with ``g_t^2``
after the step, so the state always holds the ``D`` of the next round.

Complex parameters (see :mod:`sketchopt.metrics`, "Complex parameters"): ``A_t = alpha I + S^H
S`` approximates ``alpha I + sum_s ghat_s ghat_s^H`` (Hermitian), the sketches store their
conjugate rows, RP-SON's kept ``(alpha I + S S^H)^{-1}`` and ONS's ``A_t^{-1}`` are Hermitian with
Sherman-Morrison steps ``M - (M v)(M v)^H / (1 + v^H M v)``, and ``alpha``, ``eta_t``,
``sigma_t`` and ``D_t`` (from ``|g|^2``) are real. :func:`project_bounded_prediction` (a bound on
a real prediction ``|w^T x|``) refuses complex parameters with a ``TypeError``.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _numerics, _partitioning, _validation
from sketchopt import metrics as _metrics
from sketchopt import operators as _operators
from sketchopt import rules as _rules
from sketchopt import sketches as _sketches

__all__ = [
    "DenseInverseOperator",
    "ONSLeafState",
    "RandomProjectionNewtonOperator",
    "RandomProjectionNewtonState",
    "RescaledOperator",
    "SONState",
    "SketchedNewtonOperator",
    "SketchedNewtonState",
    "fd_son",
    "newton_metric",
    "ons",
    "oja_son",
    "project_bounded_prediction",
    "rfd_son",
    "rp_son",
]


# D_1 = 0.1 I (SON sec. 5.2, footnote 6).
_DIAGONAL_INIT = 0.1


# ----------------------------------------------------------------------------------------------
# States.


class SONState(NamedTuple):
    """State of every transform of this module.

    ``leaf_state`` is a :class:`sketchopt.LeafGroups` of per-leaf states
    (:class:`SketchedNewtonState`, :class:`RandomProjectionNewtonState` or
    :class:`ONSLeafState`), stacked by group of equal-shaped leaves (e.g.
    ``leaf_state.alpha.as_dict()``, or :func:`sketchopt.per_leaf_states`); ``count``
    is the number of ``update`` calls, ``nonfinite_count`` the number of leaf updates skipped for
    non-finite input. :func:`project_bounded_prediction` finds this state
    anywhere inside an optimizer state.
    """

    count: jax.Array
    leaf_state: Any
    nonfinite_count: jax.Array


class SketchedNewtonState(NamedTuple):
    """Per-leaf state of FD-, RFD- and Oja-SON.

    ``sketch`` is the sketch state of :mod:`sketchopt.sketches`; ``A = alpha I + C`` with ``C`` the
    sketched covariance (its own ``alpha`` included: RFD's adaptive ridge). ``alpha`` is the fixed
    ridge used at the last update (0 for :func:`rfd_son`). ``diag_sqrt`` is ``D^{1/2}`` for the
    diagonal rescaling (``None`` when it is off: no zero-size placeholder, so the state
    checkpoints with orbax).
    """

    sketch: Any
    alpha: jax.Array
    diag_sqrt: jax.Array | None

    def newton_operator(self) -> SketchedNewtonOperator:
        """``A = alpha I + C`` (in the rescaled coordinates), ``O(m^3)`` small work."""
        return SketchedNewtonOperator(_sketches.low_rank(self.sketch), self.alpha)

    @property
    def dim(self) -> int:
        rows = getattr(self.sketch, "rows", None)
        return (self.sketch.directions if rows is None else rows).shape[-1]


class RandomProjectionNewtonState(NamedTuple):
    """Per-leaf state of RP-SON: the random-projection sketch and ``inverse`` =
    ``4**e (alpha I + S S^T)^{-1}`` (``e`` the sketch's ``scale_exp``), the paper's ``H_t`` in the
    sketch's scaled units, maintained by two rank-one Woodbury updates per step; ``diag_sqrt`` as
    in :class:`SketchedNewtonState`."""

    sketch: _sketches.RandomProjectionState
    inverse: jax.Array
    alpha: jax.Array
    diag_sqrt: jax.Array | None

    #: The sketch's rows are updated in place and not re-read (see
    #: :class:`sketchopt.sketches.RandomProjectionState`); ``inverse`` is derived from the
    #: sketch, so the non-finite policy keeps or drops the leaf state as one unit.
    GUARDED = ("sketch",)

    def newton_operator(self) -> RandomProjectionNewtonOperator:
        """``A = alpha I + S^T S`` (in the rescaled coordinates)."""
        return RandomProjectionNewtonOperator(self.sketch, self.inverse, self.alpha)

    @property
    def dim(self) -> int:
        return self.sketch.rows.shape[-1]


class ONSLeafState(NamedTuple):
    """Per-leaf state of :func:`ons`: ``inverse = A_t^{-1}`` (``d x d``, Sherman-Morrison) and,
    for its safeguard, ``gram = (A_t - alpha I) / 4**scale_exp``."""

    inverse: jax.Array
    gram: jax.Array
    scale_exp: jax.Array
    alpha: jax.Array
    diag_sqrt: jax.Array | None

    def newton_operator(self) -> DenseInverseOperator:
        """``A`` through the kept ``A^{-1}`` (in the rescaled coordinates)."""
        return DenseInverseOperator(self.inverse)

    @property
    def dim(self) -> int:
        return self.inverse.shape[-1]


# ----------------------------------------------------------------------------------------------
# Validation and small helpers.


def _check_son_options(eta, default_eta, curvature, diagonal_rescaling):
    """Validate the options every SON transform shares; ``eta=None`` takes ``default_eta``."""
    eta = default_eta if eta is None else _validation.step_size("eta", eta)
    _validation.step_size("curvature", curvature)
    return eta, _validation.flag("diagonal_rescaling", diagonal_rescaling)


# ----------------------------------------------------------------------------------------------
# A^+ y for A = alpha I + V^T diag(lam) V + alpha_sketch I (FD, RFD, Oja).


def _lowrank_terms(lr: _sketches.LowRank, alpha):
    """Mantissa/exponent of the total ridge and of the per-direction ``ridge + lam``."""
    e = lr.scale_exp
    am, aq = _numerics.mantissa_exponent(lr.alpha)
    ridge = _numerics.mantissa_exponent_add(
        _numerics.mantissa_exponent(alpha.astype(lr.alpha.dtype)), (am, aq + 2 * e)
    )
    lm, lq = _numerics.mantissa_exponent(lr.eigenvalues)
    denom = _numerics.mantissa_exponent_add(ridge, (lm, lq + 2 * e))
    return ridge, denom, lr.eigenvalues > 0


def _lift(lr: _sketches.LowRank, a):
    """``V^T a`` for each row of a ``(j, k)`` stack, in one pass over the basis, each row
    normalized first: ``LowRank.lift`` scales by ``2**-scale_exp`` inside, which would flush a
    small row (e.g. ``1e-31`` against rows of norm ``1e30``). Each result is scaled back by its
    own scalar power of two (an array of exponents would take ``jnp.ldexp``'s slow elementwise
    path over ``d``)."""
    ea = _numerics.exponent(jnp.max(jnp.abs(a), axis=-1, keepdims=True, initial=0))
    s = jnp.where(ea == _numerics.NO_EXPONENT, 0, -ea)
    lifted = lr.lift(_numerics.ldexp(a, s))
    return jnp.stack([_numerics.ldexp(lifted[i], -s[i, 0]) for i in range(a.shape[0])])


def _lowrank_pinv(lr: _sketches.LowRank, alpha, y, vy=None, *, want_null=False):
    """``A^+ y = 2**k * zhat`` for ``A = alpha I + V^T diag(lam) V + alpha_sketch I``.

    ``A^+ = V^T diag(1/(ridge + lam)) V + (I - P)/ridge`` with ``P`` the projector on the
    directions with ``lam > 0`` (the second term is dropped when ``ridge = 0``: the Moore-Penrose
    pseudo-inverse, RFD paper appendix A). All scales enter as powers of two, so ``zhat`` is
    bounded by about ``2 |y|`` and ``k`` carries the magnitude; one pass for ``V y`` (skipped when
    ``vy`` is given) and one for both lifts. The residual ``(I - P) y`` is cleaned of round-off
    (:func:`sketchopt._numerics.denoise_residual`). With ``want_null`` also returns it when the
    ridge is 0 (zeros otherwise): the component of ``y`` in the null space of ``A``.
    """
    (rm, rq), (dm, dq), mask = _lowrank_terms(lr, alpha)
    has_ridge = rm > 0
    qmin = jnp.minimum(
        jnp.min(jnp.where(mask, dq, _numerics.BIG_EXPONENT), initial=_numerics.BIG_EXPONENT),
        jnp.where(has_ridge, rq, _numerics.BIG_EXPONENT),
    )
    active = jnp.any(mask) | has_ridge
    k = jnp.where(active, -qmin, _numerics.NO_EXPONENT).astype(jnp.int32)
    if vy is None:
        vy = lr.project(y)
    vy = jnp.where(mask, vy, 0)
    # Exponent shifts below are <= 0, so every coefficient is at most 2 |V y|.
    shift = jnp.where(mask, qmin - dq, 0)  # (masked-out lanes: no 0 * inf, not even transient)
    coef = jnp.where(mask, _numerics.ldexp(vy / jnp.where(mask, dm, 1), shift), 0)
    # both lifts, P y and V^T coef, in one pass over the basis
    projected, lifted = _lift(lr, jnp.stack([vy, coef]))
    residual = _numerics.denoise_residual(y - projected, y, lr.basis.shape[0])
    ridge_factor = jnp.where(
        has_ridge,
        _numerics.ldexp(1 / jnp.where(has_ridge, rm, 1), jnp.where(active, qmin - rq, 0)),
        0,
    )
    zhat = jnp.where(active, lifted + ridge_factor * residual, 0)
    if not want_null:
        return zhat, k, None
    return zhat, k, jnp.where(has_ridge, 0, residual)


# ----------------------------------------------------------------------------------------------
# The Newton operators: A_t of each family, what SON's metric and the projection solve with.


class _LeafTerms(NamedTuple):
    """The per-leaf pieces of Lemma 1 for a normalized example ``xhat``."""

    zhat: jax.Array  # A^+ xhat = 2**k zhat
    k: jax.Array
    null: jax.Array  # component of xhat in the null space of A (0 if A is invertible)
    null_cost: jax.Array  # null^T A null = null_cost * 2**null_cost_exp
    null_cost_exp: jax.Array


class SketchedNewtonOperator(NamedTuple):
    """FD/RFD/Oja-SON's ``A = alpha I + C``, ``C = V^T diag(lam) V + alpha_sketch I`` the sketch's
    covariance (:func:`sketchopt.sketches.low_rank`). ``solve`` is the pseudo-inverse (no step
    outside the sketch while the total ridge is 0: SON Appendix D, RFD paper appendix A)."""

    factors: _operators.LowRankOperator
    alpha: jax.Array

    def solve(self, y, vy=None):
        """``A^+ y``; ``vy = V y`` when known (saves a pass over the sketch)."""
        zhat, k, _ = _lowrank_pinv(self.factors, self.alpha, y, vy)
        return _numerics.ldexp(zhat, k)

    def projection_terms(self, x) -> _LeafTerms:
        """Lemma 1's pieces for ``x`` (``|x| <= 1``), with the null-space component."""
        lr = self.factors
        zhat, k, null = _lowrank_pinv(lr, self.alpha, x, want_null=True)
        vn = lr.project(null)
        cost = jnp.sum(jnp.where(lr.eigenvalues > 0, lr.eigenvalues * _numerics.abs2(vn), 0))
        return _LeafTerms(zhat, k, null, cost.astype(x.dtype), 2 * lr.scale_exp)


class RandomProjectionNewtonOperator(NamedTuple):
    """RP-SON's ``A = alpha I + S^T S`` with the kept ``inverse = 4**e (alpha I + S S^T)^{-1}``
    (see :class:`RandomProjectionNewtonState`); always invertible (``alpha > 0``)."""

    sketch: _sketches.RandomProjectionState
    inverse: jax.Array
    alpha: jax.Array

    def solve(self, y):
        """``A^{-1} y`` (:func:`_rp_pinv`)."""
        return _numerics.ldexp(*_rp_pinv(self, y))

    def projection_terms(self, x) -> _LeafTerms:
        zhat, k = _rp_pinv(self, x)
        zero = jnp.zeros((), x.dtype)
        return _LeafTerms(zhat, k, jnp.zeros_like(x), zero, jnp.int32(0))


class DenseInverseOperator(NamedTuple):
    """ONS's ``A`` through its kept ``d x d`` inverse (always invertible)."""

    inverse: jax.Array

    def solve(self, y):
        return jnp.matmul(self.inverse, y, precision=_numerics.HIGHEST)

    def projection_terms(self, x) -> _LeafTerms:
        zero = jnp.zeros((), x.dtype)
        return _LeafTerms(self.solve(x), jnp.int32(0), jnp.zeros_like(x), zero, jnp.int32(0))


# ----------------------------------------------------------------------------------------------
# The transforms.


class RescaledOperator(NamedTuple):
    """``D^{1/2} A D^{1/2}``: a Newton operator ``A`` in the coordinates ``z = D^{1/2} w`` of the
    diagonal rescaling (SON sec. 5.2), mapped back to the parameters: ``solve(y) = D^{-1/2}
    A^+ D^{-1/2} y``."""

    inner: Any
    diag_sqrt: jax.Array

    def solve(self, y):
        return self.inner.solve(y / self.diag_sqrt) / self.diag_sqrt


def _newton_metric(name, init_leaf, absorb, *, eta, curvature, diagonal_rescaling, **fields):
    """SON's metric ``H_t = D_t^{1/2} A_t D_t^{1/2}`` (``D = I`` without diagonal rescaling) from
    its per-leaf pieces, a :class:`sketchopt.metrics.Metric`.

    ``init_leaf(index, dim, dtype) -> leaf state``; ``absorb(ls, gz, ghat, c, valid) -> (ls,
    A_t^+ gz)`` absorbs the to-sketch vector ``ghat = sqrt(c) gz`` (SON Alg. 1 line 8) and
    solves with the new ``A_t``; with ``valid`` false it receives zeros and must return its state
    bit-identical. ``c = eta_t + sigma_t`` comes from the metric's ``hyper``. ``fields``:
    ``paddable``, ``seeded`` of the ``Metric``.
    """

    def init(shape, dtype=jnp.float32, index=0):
        dim = _metrics.flat_size(shape)
        ls = init_leaf(index, dim, dtype)
        rdtype = _numerics.real_dtype(dtype)  # complex: D_t is real (sums of |g|^2)
        diag = jnp.full((dim,), np.sqrt(_DIAGONAL_INIT), rdtype) if diagonal_rescaling else None
        return ls._replace(diag_sqrt=diag)

    def hyper(count):
        return _leafwise.at_step(eta, count), _leafwise.at_step(curvature, count)

    def operator(ls):
        op = ls.newton_operator()
        return op if ls.diag_sqrt is None else RescaledOperator(op, ls.diag_sqrt)

    def to_sketch(ls, g, hyper):
        """``c = eta_t + sigma_t``, ``gz = D^{-1/2} g``, ``ghat = sqrt(c) gz``."""
        rdtype = _numerics.real_dtype(g.dtype)  # complex g: c real
        c = jnp.asarray(hyper[0], rdtype) + jnp.asarray(hyper[1], rdtype)
        gz = g / ls.diag_sqrt if diagonal_rescaling else g
        return c, gz, jnp.sqrt(c) * gz

    def accepts(ls, g, hyper):
        # A finite gradient can still give a non-finite to-sketch vector (absurd eta/sigma).
        return jnp.all(jnp.isfinite(to_sketch(ls, g, hyper)[2]))

    def update(ls, g, valid=True, *, hyper):
        c, gz, ghat = to_sketch(ls, g, hyper)
        gz = jnp.where(valid, gz, 0)
        ghat = jnp.where(valid, ghat, 0)
        new, sol = absorb(ls, gz, ghat, c, valid)
        if not diagonal_rescaling:
            return new, operator(new), sol
        # H_t = D_t^{1/2} A_t D_t^{1/2} with this round's D (the one sol used); the state keeps
        # the next round's D (module docstring). hypot(D, 0) == D exactly.
        op = operator(new)
        g = jnp.abs(g) if jnp.iscomplexobj(g) else g  # complex: D_t from |g|^2
        new = new._replace(diag_sqrt=jnp.hypot(ls.diag_sqrt, jnp.where(valid, g, 0)))
        return new, op, sol / ls.diag_sqrt

    return _metrics.Metric(init, update, operator, name, hyper=hyper, accepts=accepts, **fields)


def _son_transform(metric):
    """A SON transform: mirror descent with step 1 in SON's metric (SON Alg. 1 line 9,
    ``u_{t+1} = w_t - A_t^{-1} g_t``), on the shared driver, with the state :class:`SONState`."""
    return _leafwise.leafwise(_rules.metric_rule(metric, 1.0, field="leaf_state"), SONState)


def newton_metric(
    sketch: _sketches.Sketch,
    alpha: float = 0.0,
    *,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    diagonal_rescaling: bool = False,
) -> _metrics.Metric:
    r"""SON's metric ``A_t = alpha I + S_t^T S_t`` with ``S`` any sketch of the to-sketch vectors.

    At step ``t`` the sketch absorbs ``ghat_t = sqrt(sigma_t + eta_t) g_t`` (SON Alg. 1 line 8), so
    that ``A_t`` approximates ``alpha I + sum_{s<=t} (sigma_s + eta_s) g_s g_s^T``, the matrix of
    the Online Newton Step (SON eq. 2). Its solve is the Moore-Penrose pseudo-inverse where
    ``A_t`` is singular (``alpha = 0``: SON Appendix D). :func:`fd_son`, :func:`rfd_son` and
    :func:`oja_son` are this metric under the mirror-descent rule with step 1 (with a state of
    class :class:`SONState`, which :func:`project_bounded_prediction` finds):
    ``mirror_descent(1.0, newton_metric(sketch, alpha))`` equals :func:`fd_son`, and
    :func:`oja_son` for a single leaf (``oja_son`` draws each leaf's initial directions from its
    index, this metric uses the sketch's own for every leaf); :func:`rfd_son` also sets
    ``eta = 1/t`` and RFD's ``alpha0``.

    Args:
      sketch: a sketch of :mod:`sketchopt.sketches` (FD, RFD, Oja; its own ``alpha`` enters
        ``A_t`` too: RFD's adaptive ridge).
      alpha: the fixed ridge ``alpha >= 0``.
      eta: ``eta_t``, a float or an Optax schedule of the 0-based count; default ``1/sqrt(t)``.
      curvature: ``sigma_t >= 0`` (exp-concavity, SON Assumption 2), float or schedule.
      diagonal_rescaling: SON sec. 5.2 (module docstring): ``H_t = D_t^{1/2} A_t D_t^{1/2}``.

    Returns:
      A :class:`sketchopt.metrics.Metric` whose operator solves with ``H_t`` (``solve``, the
      pseudo-inverse) and is not combinable with a regularizer.

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), Alg. 1 and eq. 2.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> metric = sketchopt.son.newton_metric(sketchopt.sketches.frequent_directions(4), 1.0)
      >>> tx = sketchopt.mirror_descent(1.0, metric)
      >>> state = tx.init(jnp.zeros(3))
      >>> updates, state = tx.update(jnp.array([1.0, 0.0, 0.0]), state)
      >>> updates[0]  # -(I + g g^T)^{-1} g = -g / 2 at t = 1 (eta_1 = 1)
      Array(-0.5, dtype=float32)
    """
    _validation.ridge("alpha", alpha)
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_sqrt_time, curvature, diagonal_rescaling
    )
    metric = _sketched_newton_metric(
        lambda i: sketch, alpha, eta=eta, curvature=curvature, diagonal_rescaling=diagonal_rescaling
    )
    if sketch.spec is None:
        return metric
    # Equal arguments make equal metrics: a rebuilt transform reuses its compiled update.
    spec = _validation.spec_key("newton", sketch.spec, alpha, eta, curvature, diagonal_rescaling)
    return metric._replace(spec=spec)


#: The smallest value of the library's own ``eta_t`` schedules over an int32 step count.
_SCHEDULE_FLOORS = ((_numerics.inverse_sqrt_time, 2.0**-15.5), (_numerics.inverse_time, 2.0**-31))


def _always_positive(eta, curvature, dtype) -> bool:
    """Whether ``c_t = eta_t + sigma_t`` (the weight of ``ghat = sqrt(c_t) g_t``, SON Alg. 1
    line 8) is a normal positive number of ``dtype`` at every step, known before tracing:
    ``eta`` or ``sigma`` is such a number, or ``eta`` is one of the library's own schedules
    (``1/sqrt(t)``, ``1/t``) whose smallest value over an int32 step count is (a device that
    flushes subnormals to zero could make a subnormal ``c`` zero; float16's ``1/t`` underflows
    after 2**24 steps). Its square root is then positive, and ``V g`` comes from the sketch's
    own ``B ghat`` divided by it."""
    tiny = float(jnp.finfo(dtype).tiny)

    def positive(value):
        floor = next((f for schedule, f in _SCHEDULE_FLOORS if value is schedule), None)
        if floor is None and isinstance(value, numbers.Real) and not isinstance(value, bool):
            floor = float(value)
        return floor is not None and floor >= tiny

    return positive(eta) or positive(curvature)


def _sketched_newton_metric(
    make_sketch, alpha, *, eta, curvature, diagonal_rescaling, init_alpha=None
):
    """FD/RFD/Oja-SON's metric: ``make_sketch(leaf_index)`` gives the sketch of a leaf."""
    sketch0 = make_sketch(0)
    read = _sketches.reader(sketch0)  # per-step FD: its diagonal Gram matrix, no eigh

    def init_leaf(i, dim, dtype):
        sk_state = make_sketch(i).init(dim, dtype)
        if init_alpha is not None:  # RFD's alpha^(0), stored in the sketch's scaled units (e = 0)
            sk_state = sk_state._replace(alpha=jnp.asarray(init_alpha, sk_state.alpha.dtype))
        alpha_dtype = _numerics.real_dtype(dtype)  # complex leaves: a real ridge
        return SketchedNewtonState(sk_state, jnp.asarray(alpha, alpha_dtype), None)

    def absorb(ls, gz, ghat, c, valid):
        a = jnp.where(valid, jnp.asarray(alpha, ls.alpha.dtype), ls.alpha)
        root = jnp.sqrt(c)
        sk_state, product = sketch0.absorb(ls.sketch, ghat, valid)
        lr = read(sk_state)

        # V g from the sketch's own B g (docs/design.md, Speed: fused work); one more pass if c = 0,
        # in a cond that XLA charges at every step: left out where c > 0 at every step.
        def fused():
            return lr.project_product(product) / root

        if _always_positive(eta, curvature, c.dtype):
            vg = fused()
        else:
            vg = jax.lax.cond(root > 0, fused, lambda: lr.project(gz))
        return ls._replace(sketch=sk_state, alpha=a), SketchedNewtonOperator(lr, a).solve(gz, vg)

    return _newton_metric(
        f"newton[{sketch0.name}]",
        init_leaf,
        absorb,
        eta=eta,
        curvature=curvature,
        diagonal_rescaling=diagonal_rescaling,
        paddable=sketch0.paddable,
        seeded=True,
    )


def _sketched_son(make_sketch, alpha, **options):
    """FD/RFD/Oja-SON: :func:`_son_transform` of :func:`_sketched_newton_metric`."""
    return _son_transform(_sketched_newton_metric(make_sketch, alpha, **options))


@_leafwise.compiled
def fd_son(
    alpha: float = 1.0,
    sketch_size: int = 10,
    *,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    fast: bool = False,
    diagonal_rescaling: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """FD-SON: SON Alg. 1 with the frequent-directions sketch (Alg. 2).

    Start at ``alpha=1`` (the default): SON has no learning rate, and ``1/alpha``, its step
    outside the sketch, is best 30-100x above Adam's best rate on networks (the README's
    "Choosing a learner", from the defaults page's sweep).

    ``A_t = alpha I + S_t^T S_t`` where ``S`` (``sketch_size = m`` rows including the slot of the
    incoming row) is the FD sketch of the to-sketch vectors ``sqrt(curvature_t + eta_t) g_t``;
    the update is ``-A_t^{-1} g_t`` (Woodbury through the sketch, ``O(m d)``). With
    ``sketch_size > d`` FD never shrinks and FD-SON equals :func:`ons`.

    Defaults: ``alpha = 1`` and ``m = 10``. SON has no learning rate: ``1/alpha`` is its step
    outside the sketch, and inside it the Newton step shrinks the gradient by ``alpha + eta_t
    lambda``. Over ``1/alpha`` from ``1e-4`` to 1 (``experiments/run.py defaults``) the training
    loss of small networks falls all the way to ``alpha = 1`` (smaller ``alpha`` is a plain
    gradient step longer than 1 outside the sketch); like AdaGrad, with no momentum and a step
    that decays, it does not reach Adam's loss there: SON is a method for online convex problems.
    ``alpha`` is not scale-free: scale it with the gradients' squared norm.

    Args:
      alpha: the ridge ``alpha >= 0``; ``1/alpha`` is the step size of the directions outside the
        sketch. ``alpha = 0`` uses the Moore-Penrose pseudo-inverse (SON Appendix D), i.e. no step
        outside the sketch.
      sketch_size: ``m >= 1``.
      eta: ``eta_t`` (float or schedule of the 0-based count); default ``1/sqrt(t)``.
      curvature: ``sigma_t >= 0`` of Assumption 2 (exp-concavity), float or schedule.
      fast: the doubling buffer (``2 m`` rows, rotated every ``m`` steps; RFD paper Alg. 4).
      diagonal_rescaling: SON sec. 5.2, see the module docstring.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a :class:`SONState`; ``update``
      returns ``-A_t^{-1} g_t`` per leaf (``params`` are not needed).

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), Alg. 1 with the FD sketch of Alg. 2.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.fd_son(alpha=1.0, sketch_size=3)
      >>> state = tx.init(jnp.zeros(2))
      >>> updates, state = tx.update(jnp.array([1.0, 0.0]), state)
      >>> updates[0]  # -(I + g g^T)^{-1} g = -g / 2 at t = 1 (eta_1 = 1)
      Array(-0.5, dtype=float32)
    """
    _validation.ridge("alpha", alpha)
    tau = _validation.size("sketch_size", sketch_size)
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_sqrt_time, curvature, diagonal_rescaling
    )
    fast = _validation.flag("fast", fast)
    sketch = _sketches.frequent_directions(tau, fast=fast)
    return _sketched_son(
        lambda i: sketch,
        alpha,
        eta=eta,
        curvature=curvature,
        diagonal_rescaling=diagonal_rescaling,
    )


@_leafwise.compiled
def rfd_son(
    sketch_size: int = 10,
    *,
    alpha0: float = 1.0,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    fast: bool = False,
    diagonal_rescaling: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """RFD-SON: RFD paper Alg. 3 (Alg. 6, the doubling buffer, with ``fast=True``).

    Start at ``alpha0=1`` (the default): ``1/alpha0``, its first step outside the sketch, is
    best 30-100x above Adam's best rate on networks (the README's "Choosing a learner").

    ``A_t = B_t^T B_t + alpha_t I`` with the robust-frequent-directions sketch of the to-sketch
    vectors: ``alpha_t = alpha0 + 1/2 * (sum of the shrinkage (sigma_m^{(s)})^2 so far)``, non-
    decreasing. The update is ``-A_t^+ g_t``. While ``alpha_t = 0`` (``alpha0 = 0``, RFD0-SON,
    before the first non-zero shrink) ``A_t^+`` is the Moore-Penrose pseudo-inverse
    ``V Sigma^{-2} V^T`` (RFD paper, appendix A), and :func:`project_bounded_prediction` chooses
    between the appendix's two candidate points.

    Defaults (``m = 10``, ``alpha0 = 1``): those of :func:`fd_son`. The paper's hyperparameter-free
    RFD0-SON is ``alpha0=0``; on networks its first steps are pseudo-inverse Newton steps
    ``-g / (eta |g|^2)`` along each gradient, huge for small gradients (a digits MLP ends at a
    loss of 0.85 against 0.06 with ``alpha0 = 1``, ``experiments/run.py defaults``).

    Args:
      sketch_size: ``m >= 1`` rows including the slot of the incoming row.
      alpha0: ``alpha^{(0)} >= 0``; 0 gives the hyperparameter-free RFD0-SON.
      eta: ``eta_t``; default ``1/t`` (the RFD paper's choice).
      curvature: ``mu_t = sigma_t >= 0`` (Assumption 2), float or schedule.
      fast: Alg. 6 (``2 m``-row buffer shrunk only when full).
      diagonal_rescaling: SON sec. 5.2, see the module docstring.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a :class:`SONState`; ``update``
      returns ``-A_t^{-1} g_t`` per leaf (``params`` are not needed).

    References:
      Luo, Chen, Zhang, Li & Zhang, "Robust Frequent Directions with Application in Online
      Learning" (JMLR 2019), Alg. 3 (RFD-SON), Alg. 6 (fast) and appendix A (RFD0-SON).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.rfd_son(sketch_size=3, alpha0=0.0)  # RFD0-SON: no ridge before a shrink
      >>> state = tx.init(jnp.zeros(2))
      >>> updates, state = tx.update(jnp.array([2.0, 0.0]), state)
      >>> updates[0]  # -(g g^T)^+ g = -g / |g|^2
      Array(-0.5, dtype=float32)
    """
    tau = _validation.size("sketch_size", sketch_size)
    _validation.ridge("alpha0", alpha0)
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_time, curvature, diagonal_rescaling
    )
    fast = _validation.flag("fast", fast)
    # alpha0 is set in init (not passed to the sketch) so that it may be traced (vmap over it).
    sketch = _sketches.robust_frequent_directions(tau, fast=fast)
    return _sketched_son(
        lambda i: sketch,
        0.0,
        eta=eta,
        curvature=curvature,
        diagonal_rescaling=diagonal_rescaling,
        init_alpha=alpha0,
    )


@_leafwise.compiled
def oja_son(
    alpha: float = 1.0,
    sketch_size: int = 10,
    *,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    oja_learning_rate: float | Callable[[jax.Array], jax.Array] | None = None,
    key: jax.Array | None = None,
    diagonal_rescaling: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Oja-SON: SON Alg. 1 with Oja's sketch (Alg. 3, eq. 4).

    Start at ``alpha=1`` (the default), as :func:`fd_son`: ``1/alpha``, its step outside the
    sketch, is best 30-100x above Adam's best rate on networks.

    ``A_t = alpha I + V_t^T (t Lambda_t) V_t`` with Oja's running eigenvectors ``V_t`` (``m x d``,
    orthonormal) and eigenvalues ``Lambda_t`` of the to-sketch vectors; update ``-A_t^{-1} g_t``.
    Defaults (``alpha = 1``, ``m = 10``) and why: as :func:`fd_son`.

    Args:
      alpha: ``alpha >= 0`` (0: pseudo-inverse on the directions with a positive eigenvalue).
      sketch_size: the number ``m >= 1`` of directions.
      eta, curvature: as :func:`fd_son`.
      oja_learning_rate: Oja's ``Gamma_t`` (float in ``(0, 1]`` or schedule of ``t = 1, 2, ...``);
        default ``1/t`` as in the paper's experiments.
      key: PRNG key for the random orthonormal initial directions (default ``PRNGKey(0)``); each
        leaf folds in its index.
      diagonal_rescaling: SON sec. 5.2 (the variant of the paper's real-data experiments).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a :class:`SONState`; ``update``
      returns ``-A_t^{-1} g_t`` per leaf (``params`` are not needed).

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), Alg. 1 with Oja's sketch (Alg. 3, eq. 4).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.oja_son(alpha=1.0, sketch_size=2)
      >>> state = tx.init(jnp.zeros(3))
      >>> updates, state = tx.update(jnp.array([1.0, 0.0, 0.0]), state)
      >>> updates.shape
      (3,)
    """
    _validation.ridge("alpha", alpha)
    m = _validation.size("sketch_size", sketch_size)
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_sqrt_time, curvature, diagonal_rescaling
    )
    key = jax.random.PRNGKey(0) if key is None else key
    _sketches.oja(m, learning_rate=oja_learning_rate, key=key)  # validates the learning rate

    def make(i):
        return _sketches.oja(
            m, learning_rate=oja_learning_rate, key=jax.random.fold_in(key, i) if i else key
        )

    return _sketched_son(
        make, alpha, eta=eta, curvature=curvature, diagonal_rescaling=diagonal_rescaling
    )


# ----------------------------------------------------------------------------------------------
# RP-SON.


def _rp_floor(dtype):
    """Smallest scaled ridge kept for RP-SON: ``eps**2`` relative to ``|S|^2`` (below it the
    paper's form ``(1/alpha)(y - S^T H S y)`` has no correct digit left in this precision)."""
    return jnp.asarray(jnp.finfo(dtype).eps, dtype) ** 2


def _rp_ridge(alpha, e, dtype):
    """``(alpha_s, ridge_mq)``: the ridge in the sketch's scaled units (floored, see
    :func:`_rp_floor`) and the true ridge it stands for, as mantissa/exponent."""
    alpha = jnp.asarray(alpha, dtype)
    scaled = _numerics.ldexp(alpha, -2 * e)
    floor = _rp_floor(dtype)
    floored = scaled < floor
    fm, fq = _numerics.mantissa_exponent(floor)
    am, aq = _numerics.mantissa_exponent(alpha)
    ridge = (jnp.where(floored, fm, am), jnp.where(floored, fq + 2 * e, aq))
    return jnp.where(floored, floor, scaled), ridge


def _rp_inverse(gram, alpha_s):
    """``(alpha_s I + gram)^{-1}`` from an eigendecomposition (the refresh of the Woodbury path)."""
    mu, u = jnp.linalg.eigh(0.5 * (gram + _numerics.conj(gram.T)))  # complex: Hermitian
    mu = jnp.maximum(mu, 0)
    return (u / (alpha_s + mu)) @ _numerics.conj(u.T)


def _rp_paper_regime(ls: RandomProjectionNewtonState):
    """Whether the paper's form ``(1/alpha)(y - S^T H S y)`` is accurate in this precision.

    Its round-off grows like ``eps * kappa^2`` with ``kappa = (alpha + |S|^2) / alpha`` (the
    cancellation is divided by ``alpha``); it is used while ``kappa <= eps**(-1/3)``, beyond that
    the solve goes through the eigendecomposition of the tracked ``m x m`` Gram matrix.
    """
    dtype = ls.inverse.dtype
    alpha_s = _numerics.ldexp(ls.alpha, -2 * ls.sketch.scale_exp)
    limit = jnp.finfo(dtype).eps ** (-1.0 / 3.0)
    trace = jnp.trace(ls.sketch.gram)
    if jnp.iscomplexobj(trace):  # Hermitian: a real trace
        trace = jnp.real(trace)
    return alpha_s * limit >= alpha_s + trace


def _rp_pinv(ls: RandomProjectionNewtonState, y, product=None, root=None, positive=False):
    """``A^{-1} y = 2**k * zhat`` for RP-SON's ``A = alpha I + S^T S``.

    In the well-conditioned regime (:func:`_rp_paper_regime`) with the paper's
    ``A^{-1} = (1/alpha)(I - S^T H S)`` and the maintained ``H``; otherwise like FD-SON through
    the eigendecomposition of ``S S^T`` (:func:`sketchopt.sketches.low_rank`), which stays
    accurate for any ``alpha`` and gradient scale. ``product`` (``S ghat / 4**e`` from the sketch
    update, ``ghat = root * y``) saves the pass ``S y``; ``positive`` (static): ``root > 0`` is
    known (:func:`_always_positive`), and no ``cond`` keeps the pass for ``root = 0``.
    """
    sk = ls.sketch
    e = sk.scale_exp
    hi = jax.lax.Precision.HIGHEST

    def s_times_y():  # S y / 2**e
        def projected():
            return _partitioning.contract_d(sk.rows, _numerics.ldexp(y, -e))

        def fused():
            return _numerics.ldexp(product, e) / root

        if product is None:
            return projected()
        return fused() if positive else jax.lax.cond(root > 0, fused, projected)

    def paper():
        _, (rm, rq) = _rp_ridge(ls.alpha, e, ls.inverse.dtype)
        z = ls.inverse @ s_times_y()
        # S^T z; complex (rows conj(g)): S^H z = conj(S^T conj(z))
        zc = _numerics.conj(_numerics.ldexp(z, -e))
        back = _numerics.conj(jnp.matmul(zc, sk.rows, precision=hi))
        return (y - back) / rm, -rq

    def eigen():
        lr = _sketches.low_rank(sk)
        zhat, k, _ = _lowrank_pinv(lr, ls.alpha, y, lr.coef @ s_times_y())
        return zhat, k

    return jax.lax.cond(_rp_paper_regime(ls), paper, eigen)


def _rp_absorb(sketch, alpha, ls, gz, ghat, c, valid, *, eta=None, curvature=0.0):
    """RP-SON's step on one leaf: ``S_t = S_{t-1} + r_t ghat^T`` and ``H_t`` by the paper's two
    rank-one Woodbury updates (SON sec. 3), refreshed from the tracked Gram matrix every ``m``
    steps or when unsafe; returns the new state and ``A_t^{-1} gz``. ``eta`` and ``curvature``
    say whether ``c > 0`` is known (:func:`_always_positive`)."""
    dtype = ls.alpha.dtype
    a = jnp.asarray(alpha, dtype)
    sk0 = ls.sketch
    root = jnp.sqrt(c)
    # product = S_t ghat / 4**e1; r = the r_t the sketch drew for this update
    sk1, product, _, r = sketch.absorb_solve(sk0, ghat, valid)
    valid = valid & (sk1.count != sk0.count)  # the sketch refuses a row that could overflow S
    e0, e1 = sk0.scale_exp, sk1.scale_exp
    sq = jnp.sum(_numerics.abs2(_numerics.ldexp(ghat, -e1)))
    q = product - 0.5 * sq * r  # (S_{t-1} ghat + |ghat|^2 r / 2) / 4**e1
    h = _numerics.ldexp(ls.inverse, 2 * (e1 - e0))  # the same H in the new scaled units
    # A jump of the scale can leave H = 4**e (alpha I + S S^T)^{-1} unrepresentable (alpha
    # tiny in the new units): then H is rebuilt below, and the Woodbury path must not run
    # on infinities (no NaN, not even transiently).
    h_ok = jnp.all(jnp.isfinite(h))
    h = jnp.where(h_ok, h, 0)
    alpha_s, _ = _rp_ridge(a, e1, dtype)
    h_new, safe = _numerics.rank_two_inverse_update(h, r, q)
    h_new = jnp.where(sq > 0, h_new, h)
    refresh = (
        ~h_ok
        | ~safe
        | ~jnp.all(jnp.isfinite(h_new))
        | (a != ls.alpha)
        | (_numerics.ldexp(a, -2 * e1) < _rp_floor(dtype))
        | (sk1.count % sketch.sketch_size == 0)
    )
    h_new = jax.lax.cond(refresh, lambda: _rp_inverse(sk1.gram, alpha_s), lambda: h_new)
    h_new = jnp.where(valid, h_new, ls.inverse)
    new = ls._replace(sketch=sk1, inverse=h_new, alpha=jnp.where(valid, a, ls.alpha))
    # S gz from the sketch's own product S_t ghat (one pass saved).
    zhat, k = _rp_pinv(new, gz, product, root, _always_positive(eta, curvature, c.dtype))
    return new, _numerics.ldexp(zhat, k)


@_leafwise.compiled
def rp_son(
    alpha: float,
    sketch_size: int,
    key: jax.Array,
    *,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    diagonal_rescaling: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """RP-SON: SON with the Gaussian random-projection sketch (SON sec. 3, Appendix E).

    ``S_t = S_{t-1} + r_t ghat_t^T`` with ``r_t ~ N(0, I/m)`` (so ``E[S^T S] = sum ghat ghat^T``;
    :func:`sketchopt.sketches.random_projection`), ``A_t = alpha I + S_t^T S_t`` and the update
    ``-A_t^{-1} g_t = -(1/alpha)(g_t - S^T H_t S g_t)`` with ``H_t = (alpha I + S S^T)^{-1}``.
    ``H_t`` is kept in the state and updated as in the paper: ``H_t^{-1} = H_{t-1}^{-1} + q r^T +
    r q^T`` (``q = S_{t-1} ghat + |ghat|^2 r / 2``) is two rank-one Sherman-Morrison steps, so a
    step costs ``O(m d)`` passes plus ``O(m^2)``. As a numerical safeguard ``H`` is recomputed
    from the sketch's tracked Gram matrix (``O(m^3)``, amortized ``O(m^2)``) every ``m`` steps,
    when ``alpha`` was changed (e.g. by ``inject_hyperparams``) and whenever a downdate
    denominator is not safely positive.

    Precision: the paper's form divides a cancellation by ``alpha``; its round-off grows like
    ``eps * kappa^2`` with ``kappa = (alpha + |S|^2) / alpha``. It is used while
    ``kappa <= eps**(-1/3)`` (about 200 in float32, 1.6e5 in float64); beyond that (small
    ``alpha`` against the gradient scale, e.g. ``alpha = 1`` with gradients of norm 1e30) the
    solve goes through the eigendecomposition of the tracked ``m x m`` Gram matrix instead, like
    FD-SON (``O(m^3)`` per step, still ``O(m d)`` in ``d``), which stays accurate at any scale.

    Args:
      alpha: ``alpha > 0``.
      sketch_size: ``m >= 1`` random directions.
      key: PRNG key of the projections (each leaf folds in its index); may be traced (``vmap``
        over keys).
      eta, curvature, diagonal_rescaling: as :func:`fd_son`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a :class:`SONState`; ``update``
      returns ``-A_t^{-1} g_t`` per leaf (``params`` are not needed).

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), sec. 3 and Appendix E (random projections).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.rp_son(alpha=1.0, sketch_size=2, key=jax.random.PRNGKey(0))
      >>> state = tx.init(jnp.zeros(3))
      >>> updates, state = tx.update(jnp.array([1.0, 0.0, 0.0]), state)
      >>> bool(updates[0] < 0) and bool(jnp.all(updates[1:] == 0))  # along g only
      True
    """
    _validation.ridge("alpha", alpha, positive=True, why="RP-SON keeps (alpha I + S S^T)^{-1}")
    m = _validation.size("sketch_size", sketch_size)
    key = _validation.prng_key("key", key)
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_sqrt_time, curvature, diagonal_rescaling
    )
    sketch0 = _sketches.random_projection(m, key)

    def init_leaf(i, dim, dtype):
        leaf_key = jax.random.fold_in(key, i) if i else key
        sk_state = _sketches.random_projection(m, leaf_key).init(dim, dtype)
        a = jnp.asarray(alpha, _numerics.real_dtype(dtype))  # complex leaves: a real ridge
        inverse = jnp.eye(m, dtype=dtype) / a
        return RandomProjectionNewtonState(sk_state, inverse, a, None)

    absorb = functools.partial(_rp_absorb, sketch0, alpha, eta=eta, curvature=curvature)

    metric = _newton_metric(
        "newton[random_projection]",
        init_leaf,
        absorb,
        eta=eta,
        curvature=curvature,
        diagonal_rescaling=diagonal_rescaling,
        paddable=sketch0.paddable,
        seeded=True,
    )
    return _son_transform(metric)


# ----------------------------------------------------------------------------------------------
# ONS.


def _ons_recompute(gram, e, a):
    """``(alpha I + 4**e gram)^{-1}`` by an eigendecomposition (never singular: alpha > 0)."""
    mu, u = jnp.linalg.eigh(0.5 * (gram + _numerics.conj(gram.T)))  # complex: Hermitian
    lam = _numerics.ldexp(jnp.maximum(mu, 0), 2 * e)  # may overflow to inf: 1/inf = 0 is right
    return (u / (a + lam)) @ _numerics.conj(u.T)


def _ons_step(ls, gz, ghat, c, valid):
    """ONS's step on one leaf: ``A_t^{-1}`` by Sherman-Morrison (SON eq. 2), with the scaled
    ``A_t - alpha I`` kept for the eigendecomposition safeguard; returns the new state and
    ``A_t^{-1} gz``."""
    hi = jax.lax.Precision.HIGHEST
    m_inv = ls.inverse
    e = _numerics.exponent(jnp.max(jnp.abs(gz), initial=0))
    ys = _numerics.ldexp(gz, -jnp.where(e == _numerics.NO_EXPONENT, 0, e))
    v = jnp.matmul(m_inv, ys, precision=hi)
    cplx = jnp.iscomplexobj(m_inv)  # complex: y^H M y real, outer products v v^H
    p = jnp.maximum(jnp.real(_numerics.conj(ys) @ v) if cplx else ys @ v, 0)
    # A_t^{-1} g = 2**e v / (1 + c 4**e p) and the Sherman-Morrison factor c 4**e / (...),
    # written so that no power of two overflows whatever the sign of e.
    big = e > 0
    one = jnp.ones((), _numerics.real_dtype(m_inv.dtype))
    den = jnp.where(big, _numerics.ldexp(one, -2 * e) + c * p, 1 + c * _numerics.ldexp(p, 2 * e))
    # den == 0 only if A_{t-1}^{-1} g underflowed to 0 (then so does the step).
    safe = jnp.where(den > 0, den, 1)
    fac = jnp.where(den > 0, jnp.where(big, c, c * _numerics.ldexp(one, 2 * e)) / safe, 0)
    sol = jnp.where(
        den > 0, jnp.where(big, _numerics.ldexp(v, -e), _numerics.ldexp(v, e)) / safe, 0
    )
    m_new = m_inv - jnp.outer(v, _numerics.conj(v) * fac)
    m_new = 0.5 * (m_new + _numerics.conj(m_new.T))
    # The scaled A - alpha I (as metrics.full keeps G), for the safeguard.
    e_old = ls.scale_exp
    e_new = _numerics.rescale_exponent(
        e_old, jnp.max(jnp.abs(ghat), initial=0), jnp.max(jnp.diagonal(ls.gram), initial=0)
    )
    e_new = jnp.where(valid, e_new, e_old)
    hs = _numerics.ldexp(ghat, -e_new)
    gram = _numerics.ldexp(ls.gram, 2 * (e_old - e_new)) + jnp.outer(hs, _numerics.conj(hs))
    # Breakdown: the downdate cancelled below the precision (A^{-1} no longer PSD/finite).
    quad = _numerics.conj(ys) @ jnp.matmul(m_new, ys, precision=hi)
    broken = (
        ~jnp.all(jnp.isfinite(m_new))
        | jnp.any(jnp.real(jnp.diagonal(m_new)) < 0 if cplx else jnp.diagonal(m_new) < 0)
        | ((jnp.real(quad) if cplx else quad) < 0)
    )
    m_new = jax.lax.cond(
        broken & valid, lambda: _ons_recompute(gram, e_new, ls.alpha), lambda: m_new
    )
    new = ls._replace(
        inverse=jnp.where(valid, m_new, m_inv),
        gram=jnp.where(valid, gram, ls.gram),
        scale_exp=e_new,
    )
    return new, sol


@_leafwise.compiled
def ons(
    alpha: float,
    *,
    eta: ScalarOrSchedule | None = None,
    curvature: ScalarOrSchedule = 0.0,
    diagonal_rescaling: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Full-matrix Online Newton Step with SON's matrix (SON eq. 2): the baseline of the sketches.

    ``A_t = alpha I + sum_{s<=t} (sigma_s + eta_s) g_s g_s^T`` and the update ``-A_t^{-1} g_t``.
    ``A_t^{-1}`` is kept (``d x d`` per leaf) by Sherman-Morrison, ``O(d^2)`` per step; the solve
    with the new gradient uses ``A_t^{-1} g = A_{t-1}^{-1} g / (1 + c g^T A_{t-1}^{-1} g)``, which
    stays accurate for huge gradients. Safeguard: the (scaled) matrix ``A_t - alpha I`` is kept as
    well, and when a downdate breaks down numerically (``A^{-1}`` would need a condition number
    beyond the precision, e.g. gradients of norm 1e30 against ``alpha = 1`` in float32) the
    inverse is recomputed from it by an eigendecomposition (``O(d^3)``, rare). ``alpha > 0``
    enters only ``A_0 = alpha I`` (changing it later, e.g. through ``inject_hyperparams``, has no
    effect).

    Args:
      alpha: ``alpha > 0``, ``A_0 = alpha I``.
      eta, curvature, diagonal_rescaling: as :func:`fd_son`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose state is a :class:`SONState`; ``update``
      returns ``-A_t^{-1} g_t`` per leaf (``params`` are not needed).

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), eq. 2: the Online Newton Step of Hazan, Agarwal & Kale,
      "Logarithmic Regret Algorithms for Online Convex Optimization" (2007), with SON's steps.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.ons(alpha=1.0)
      >>> state = tx.init(jnp.zeros(2))
      >>> updates, state = tx.update(jnp.array([1.0, 0.0]), state)
      >>> updates[0]  # -(I + g g^T)^{-1} g at t = 1
      Array(-0.5, dtype=float32)
    """
    _validation.ridge("alpha", alpha, positive=True, why="ONS keeps A_t^{-1} from A_0 = alpha I")
    eta, diagonal_rescaling = _check_son_options(
        eta, _numerics.inverse_sqrt_time, curvature, diagonal_rescaling
    )

    def init_leaf(i, dim, dtype):
        a = jnp.asarray(alpha, _numerics.real_dtype(dtype))  # complex leaves: a real ridge
        return ONSLeafState(
            inverse=jnp.eye(dim, dtype=dtype) / a,
            gram=jnp.zeros((dim, dim), dtype),
            scale_exp=jnp.zeros((), jnp.int32),
            alpha=a,
            diag_sqrt=None,
        )

    def absorb(ls, gz, ghat, c, valid):
        if _partitioning.explicit_mesh():
            # An O(d^2) baseline: under an explicit mesh its d x d matrices are gathered for the
            # step and resharded as they came (automatic sharding needs no help).
            new, sol = _ons_step(*(_partitioning.gathered(x) for x in (ls, gz, ghat, c, valid)))
            return _partitioning.like(new, ls), _partitioning.like_last_axis(sol, gz)
        return _ons_step(ls, gz, ghat, c, valid)

    metric = _newton_metric(
        "ons",
        init_leaf,
        absorb,
        eta=eta,
        curvature=curvature,
        diagonal_rescaling=diagonal_rescaling,
    )
    return _son_transform(metric)


# ----------------------------------------------------------------------------------------------
# The bounded-prediction projection (SON eq. 1, Lemma 1; RFD paper appendix A).


def _find_son_state(opt_state) -> SONState:
    found = []

    def visit(node):
        if isinstance(node, SONState):
            found.append(node)
            return True
        return False

    jax.tree_util.tree_flatten(opt_state, is_leaf=visit)
    if not found:
        raise ValueError(
            "project_bounded_prediction: no SON state (sketchopt.SONState) found in opt_state; "
            "pass the state of fd_son/rfd_son/oja_son/rp_son/ons (possibly inside optax.chain, "
            "inject_hyperparams, flatten or MultiSteps)"
        )
    if len(found) > 1:
        raise ValueError(
            f"project_bounded_prediction: found {len(found)} SON states in opt_state; the "
            "projection needs a single SON transform over all parameters (optax.multi_transform "
            "/ partition with several SON transforms is not supported)"
        )
    return found[0]


def project_bounded_prediction(opt_state, params, features, bound):
    r"""SON's projection (eq. 1, Lemma 1): ``argmin_{|w^T x| <= C} ||w - u||_{A_t}``.

    In closed form, ``w = u - tau_C(u^T x) / (x^T A^{-1} x) * A^{-1} x`` with ``tau_C(y) =
    sign(y) max(|y| - C, 0)``; ``A^{-1} x`` goes through the sketch in ``O(m d)`` (SON Alg. 1
    line 5). Call it with the current optimizer state (which holds ``A_{t-1}``) before predicting
    on ``x_t``; the gradient is then taken at the returned point and passed to ``update``.

    When ``A`` is singular (RFD0-SON while ``alpha_t = 0``, or ``alpha = 0`` for FD/Oja-SON) this
    is the RFD paper's appendix-A rule with the pseudo-inverse: of the two candidates
    ``w1 = u - tau/(x^T A^+ x) A^+ x`` and ``w2 = u - tau/|x_perp|^2 x_perp`` (``x_perp`` the part
    of ``x`` in the null space of ``A``, a move that costs nothing in the ``A``-seminorm) it returns
    the one closer to ``u`` in that seminorm (``w2`` unless ``x_perp`` is numerically 0).
    With diagonal rescaling the metric is ``D^{1/2} A D^{1/2}`` (module docstring).

    Args:
      opt_state: an optimizer state containing exactly one :class:`SONState`: the state of a SON
        transform itself, or nested in ``optax.chain``, ``optax.inject_hyperparams`` /
        :func:`sketchopt.inject_hyperparams`, ``optax.MultiSteps`` or ``optax.flatten`` (the
        flattened case is detected and the parameters flattened the same way). Several SON
        states (``optax.multi_transform``) are not supported.
      params: the weights ``u`` (any pytree).
      features: the example ``x`` with the structure of ``params`` (for a linear model
        ``w^T x``, the feature vector itself); the constraint is ``|sum_leaves <w, x>| <= C``.
      bound: ``C >= 0``.

    Returns:
      The projected parameters (same structure and dtypes as ``params``).

    Raises:
      TypeError: for complex ``params`` (the constraint bounds a real prediction ``w^T x``).

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford, "Efficient Second Order Online Learning by
      Sketching" (NeurIPS 2016), eq. 1 and Lemma 1 (Alg. 1 line 5).
      Luo, Chen, Zhang, Li & Zhang, "Robust Frequent Directions with Application in Online
      Learning" (JMLR 2019), appendix A (the singular case).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.fd_son(alpha=1.0, sketch_size=3)
      >>> _, state = tx.update(jnp.array([1.0, 0.0]), tx.init(jnp.zeros(2)))
      >>> x = jnp.array([1.0, 1.0])
      >>> w = sketchopt.project_bounded_prediction(state, jnp.array([3.0, 1.0]), x, bound=1.0)
      >>> w, w @ x  # |w^T x| = 4 > C = 1: moved to the boundary in the A-norm
      (Array([ 2., -1.], dtype=float32), Array(1., dtype=float32))
    """
    if params is None:
        raise ValueError("project_bounded_prediction needs the current params, got None")
    _validation.strength("bound", bound)
    son = _find_son_state(opt_state)
    if son.leaf_state.layout.num_leaves == 0:  # no parameters at all
        return params
    leaf_states = _leafwise.per_leaf(son.leaf_state)
    p_leaves, p_def = jax.tree.flatten(params)
    if any(jnp.iscomplexobj(p) for p in p_leaves):  # SON's bound is on a real prediction
        raise TypeError("project_bounded_prediction: complex parameters are not supported")
    flattened = _covers_flattened(leaf_states, p_leaves)
    dtypes = [ls.alpha.dtype for ls in leaf_states]
    us, xs = (
        _flat_vectors(leaves, dtypes, flattened)
        for leaves in (p_leaves, p_def.flatten_up_to(features))
    )
    # The prediction u^T x and tau_C of it, in true units.
    pred = sum((jnp.sum(u * x) for u, x in zip(us, xs, strict=True)), jnp.zeros((), dtypes[0]))
    tau = jnp.sign(pred) * jnp.maximum(jnp.abs(pred) - bound, 0)
    moves = _projection_moves(leaf_states, xs, tau)
    new = [u + m for u, m in zip(us, moves, strict=True)]
    if flattened:
        sizes = np.cumsum([int(np.size(p)) for p in p_leaves])[:-1]
        new = jnp.split(new[0], sizes)
    out = [
        n.reshape(jnp.shape(p)).astype(jnp.asarray(p).dtype)
        for n, p in zip(new, p_leaves, strict=True)
    ]
    return p_def.unflatten(out)


def _covers_flattened(leaf_states, p_leaves) -> bool:
    """Whether one SON state covers the concatenated parameters (``optax.flatten``) rather than
    each leaf; ``ValueError`` when it covers neither."""
    dims = [ls.dim for ls in leaf_states]
    sizes = [int(np.size(p)) for p in p_leaves]
    if dims == sizes:
        return False
    if len(leaf_states) == 1 and dims[0] == sum(sizes):
        return True
    raise ValueError(
        f"project_bounded_prediction: the SON state covers leaves of sizes {dims}, but "
        f"params has leaves of sizes {sizes}"
    )


def _flat_vectors(leaves, dtypes, flattened):
    """The leaves as flat vectors in their state's dtype, concatenated under ``optax.flatten``."""
    if flattened:
        return [jnp.concatenate([jnp.ravel(x).astype(dtypes[0]) for x in leaves])]
    return [jnp.ravel(x).astype(dt) for x, dt in zip(leaves, dtypes, strict=True)]


def _projection_moves(leaf_states, xs, tau):
    """``w - u`` per leaf for the excess ``tau = tau_C(u^T x)`` (SON Lemma 1; RFD paper
    appendix A where ``A`` is singular), in the parameters' coordinates."""
    # z-coordinates of the diagonal rescaling: x~ = D^{-1/2} x; then normalize by a power of two.
    xt = [
        x if ls.diag_sqrt is None else x / ls.diag_sqrt
        for x, ls in zip(xs, leaf_states, strict=True)
    ]
    kx = jnp.max(
        jnp.stack([_numerics.exponent(jnp.max(jnp.abs(x), initial=0)) for x in xt]),
        initial=_numerics.NO_EXPONENT,
    )
    kx = jnp.where(kx == _numerics.NO_EXPONENT, 0, kx)
    xh = [_numerics.ldexp(x, -kx) for x in xt]

    terms = [
        ls.newton_operator().projection_terms(x) for ls, x in zip(leaf_states, xh, strict=True)
    ]
    # A leaf whose A^+ x vanishes must not set the common scale.
    ks = [jnp.where(jnp.any(t.zhat != 0), t.k, _numerics.NO_EXPONENT) for t in terms]
    big_k = jnp.max(jnp.stack(ks))
    ztil = [_numerics.ldexp(t.zhat, k - big_k) for t, k in zip(terms, ks, strict=True)]
    s1 = sum(jnp.sum(x * z) for x, z in zip(xh, ztil, strict=True))  # 2**-K xhat^T A^+ xhat
    nn = sum(jnp.sum(jnp.square(t.null)) for t in terms)  # |xhat_perp|^2
    null_cost = sum(_numerics.ldexp(t.null_cost, t.null_cost_exp + big_k) for t in terms)
    # cost(w2) < cost(w1)  <=>  ||x_perp||_A^2 (x^T A^+ x) < |x_perp|^4  (tau^2 cancels).
    use_null = (nn > 0) & ((s1 <= 0) | (s1 * null_cost < jnp.square(nn)))
    ok_range = s1 > 0

    moves = []
    for t, z, ls in zip(terms, ztil, leaf_states, strict=True):
        via_null = _numerics.ldexp(t.null / jnp.where(nn > 0, nn, 1), -kx)
        via_range = _numerics.ldexp(z / jnp.where(ok_range, s1, 1), -kx)
        move = -tau * jnp.where(use_null, via_null, jnp.where(ok_range, via_range, 0))
        moves.append(move if ls.diag_sqrt is None else move / ls.diag_sqrt)
    return moves
