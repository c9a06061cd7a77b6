"""Classic first-order sparse online learners as Optax gradient transformations.

The formulas are those of the slides *Online Learning/Optimization: algorithms and analysis*
(poetniu, 2015), written with a time index ``t = 1, 2, 3, ...``:

* :func:`simple_truncation` -- gradient step, then every ``k`` steps the truncation ``T_0``;
* :func:`truncated_gradient` -- truncated gradient, slides Alg. 3 (Langford, Li & Zhang 2009);
* :func:`fobos_l1` -- forward-backward splitting with L1, slides Alg. 4 (Duchi & Singer 2009);
* :func:`rda_l1` -- regularized dual averaging with L1, slides Alg. 5 (Xiao 2009);
* :func:`ftrl_proximal` -- FTRL-Proximal with L1 & L2 and per-coordinate learning rates,
  slides Alg. 6 (McMahan 2011; McMahan et al. 2013);

Their L1 steps are :func:`sketchopt.regularizers.soft_threshold`, the Euclidean proximal map of
:func:`sketchopt.regularizers.l1`: L1-FOBOS is ``mirror_descent`` with the identity metric and
``l1``, L1-RDA ``dual_averaging`` with it (``tests/test_baselines.py`` pins both equivalences).
(Formerly ``sketchopt.baselines``, which re-exports this module: see ``CHANGELOG.md``.)

Conventions shared by all five:

* ``update(updates, state, params)`` returns the *delta* to add to ``params`` (Optax semantics);
  all five need ``params`` and raise ``ValueError`` without it.
* Everything is elementwise: a leaf of any shape (scalar and size-0 included) is a vector of
  independent coordinates.
* Learning-rate schedules follow Optax: ``eta_t = schedule(count)`` where ``count = t - 1`` is the
  number of earlier steps.
* Accumulators and the arithmetic are in ``promote_types(param.dtype, float32)`` (float32 for
  bf16/f16 params, float64 for float64 params under ``jax_enable_x64``); the delta is cast back to
  the param dtype.
* Bad input: if a gradient leaf (or anything computed from it: the new state, the delta in the
  param dtype) is not finite, that leaf is skipped -- zero delta, its state exactly unchanged --
  and ``state.nonfinite_count`` grows by one. Nothing non-finite ever enters updates or state.
  Integer (or boolean) gradients raise ``TypeError`` at trace time.
* Complex parameters (see :mod:`sketchopt.metrics`, "Complex parameters"): the gradient is taken
  as given, learning rates, thresholds and FTRL's ``n`` (a sum of ``|g_i|^2``) and ``sigma`` are
  real, and every L1 step or truncation is the complex soft threshold ``z max(0, 1 - a / |z|)``
  (it shrinks the modulus and keeps the phase; ``T_0`` zeroes a coordinate by its modulus).

The gradient-descent learners (:func:`simple_truncation`, :func:`truncated_gradient`,
:func:`fobos_l1`) keep no per-leaf state: their schedules and truncation periods follow the global
``count``. RDA and FTRL-Proximal are defined by their running sums, not by the current params:
they keep those sums per leaf, together with the number ``steps`` of gradients the leaf has
accepted, so that a skipped leaf continues exactly as if the bad step had never reached it. Their
delta moves ``params`` to the closed-form weights, so they compose with ``optax.apply_updates``.
Like the slides (and McMahan et al. 2013, Alg. 1) their weights are origin-centered: before any
gradient the weights are ``0`` whatever the initial params, and the first update moves the params
there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _numerics, _validation
from sketchopt.regularizers import soft_threshold

__all__ = [
    "FTRLProximalState",
    "RDAState",
    "TruncatedGradientState",
    "fobos_l1",
    "ftrl_proximal",
    "rda_l1",
    "simple_truncation",
    "truncated_gradient",
]


class TruncatedGradientState(NamedTuple):
    """State of :func:`simple_truncation`, :func:`truncated_gradient` and :func:`fobos_l1`.

    These learners keep no per-leaf arrays; ``leaves`` (a :class:`~sketchopt.LeafGroups` of empty
    values) records the leaf shapes the state was built for, so that gradients of other shapes
    are rejected like everywhere else.
    """

    count: jax.Array  # int32: number of update calls so far (t - 1 during step t)
    nonfinite_count: jax.Array  # int32: number of leaf updates skipped for non-finite input
    leaves: Any = None


class RDAState(NamedTuple):
    """State of :func:`rda_l1`: the running average gradient of slides Alg. 5, per leaf."""

    count: jax.Array  # int32: number of update calls so far
    nonfinite_count: jax.Array  # int32: number of leaf updates skipped for non-finite input
    steps: optax.Updates  # per leaf, int32 scalar: gradients averaged so far (t after step t)
    grad_avg: optax.Updates  # per leaf: (1/t) sum_{s<=t} g_s


class FTRLProximalState(NamedTuple):
    """State of :func:`ftrl_proximal`: slides Alg. 6's ``z`` and ``n`` (kept as ``sqrt(n)``)."""

    count: jax.Array  # int32: number of update calls so far
    nonfinite_count: jax.Array  # int32: number of leaf updates skipped for non-finite input
    steps: optax.Updates  # per leaf, int32 scalar: gradients accepted so far
    z: optax.Updates  # per leaf: sum_s (g_s - sigma_s * w_s)
    sqrt_n: optax.Updates  # per leaf: sqrt(n) = sqrt(sum_s g_s^2), overflow-free for huge g


# --------------------------------------------------------------------------------------------
# Shared helpers.


def _learner(fields, init, step, state_class, param_fields=()):
    """A sparse learner on the shared driver (``sketchopt._leafwise``); all of them need params.
    ``param_fields`` are the per-coordinate fields, kept as trees like the parameters."""
    rule = _leafwise.LeafRule(
        fields,
        init,
        step,
        hyper=lambda count: count,
        needs_params="this sparse online learner",
        param_fields=param_fields,
    )
    return _leafwise.leafwise(rule, state_class)


def _zeros(spec, param):
    del param
    return jnp.zeros((spec.size,), spec.dtype)


def _no_steps(spec, param):
    del spec, param
    return jnp.zeros((), jnp.int32)


def _gradient_step_then_truncate(
    learning_rate: ScalarOrSchedule,
    truncate: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
) -> optax.GradientTransformationExtraArgs:
    """``w_{t+1} = truncate(w_t - eta_t g_t, eta_t, t)``, the form shared by T_0, T_1 and FOBOS."""

    def init(spec, param):
        del spec, param
        return ((),)  # no per-leaf arrays: ``leaves`` only records the shapes

    def step(ctx, g, values, w, valid):
        del valid  # no per-leaf state: nothing to keep for a skipped leaf
        count = ctx.hyper
        t = optax.safe_increment(count)  # the slides' t, counted from 1
        # complex g: eta (and every threshold) stays real; the truncations shrink moduli
        eta = _leafwise.at_step(learning_rate, count, _numerics.real_dtype(g.dtype))
        return truncate(w - eta * g, eta, t) - w, values

    return _learner(("leaves",), init, step, TruncatedGradientState)


# --------------------------------------------------------------------------------------------
# The learners.


@_leafwise.compiled
def simple_truncation(
    learning_rate: ScalarOrSchedule, theta: float, period: int = 1
) -> optax.GradientTransformationExtraArgs:
    """Simple truncation (slides, "简单截断法"): ``w_{t+1} = T_0(w_t - eta_t g_t, theta)``.

    On steps ``t`` divisible by ``period`` (``k`` in the slides) every coordinate with
    ``|w_i - eta_t g_i| <= theta`` is set to zero; on the other steps this is plain gradient
    descent. It is :func:`truncated_gradient` with infinite gravity.

    Args:
      learning_rate: ``eta_t``, a float > 0 or an Optax schedule of the step count.
      theta: truncation threshold, ``>= 0`` (``inf`` zeroes everything on truncation steps).
      period: truncate on steps ``period, 2*period, ...``; an int ``>= 1``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Langford, Li & Zhang (2009), "Sparse Online Learning via Truncated Gradient", JMLR 10:
      simple coefficient rounding (the operator ``T_0``); the slides "Online
      Learning/Optimization: algorithms and analysis" (poetniu, 2015), before Alg. 3.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> params = jnp.zeros(3)
      >>> tx = so.simple_truncation(0.5, theta=0.3)
      >>> updates, state = tx.update(jnp.array([0.4, -1.0, 0.2]), tx.init(params), params)
      >>> params + updates  # w - eta g = (-0.2, 0.5, -0.1); |v_i| <= 0.3 set to 0
      Array([0. , 0.5, 0. ], dtype=float32)
    """
    _validation.step_size("learning_rate", learning_rate)
    _validation.strength("theta", theta, allow_inf=True)
    _validation.period("period", period)

    def truncate(v, eta, t):
        del eta
        # T_0(v_i, theta) = 0 if |v_i| <= theta else v_i, applied when t/k is an integer.
        return jnp.where((t % period == 0) & (jnp.abs(v) <= theta), jnp.zeros_like(v), v)

    return _gradient_step_then_truncate(learning_rate, truncate)


@_leafwise.compiled
def truncated_gradient(
    learning_rate: ScalarOrSchedule, gravity: float, theta: float, period: int = 1
) -> optax.GradientTransformationExtraArgs:
    """Truncated gradient, slides Alg. 3: ``w_{t+1} = T_1(w_t - eta_t g_t, eta_t lambda_t, theta)``.

    ``lambda_t = period * gravity`` on steps ``t`` divisible by ``period`` and ``0`` otherwise,
    and ``T_1(v, a, theta)`` shrinks each coordinate with ``|v_i| <= theta`` towards zero by ``a``
    (``max(0, v_i - a)`` for ``v_i in [0, theta]``, ``min(0, v_i + a)`` for ``v_i in [-theta, 0]``)
    and leaves the others alone. The shrinkage is ``eta_t * lambda_t`` as in the slides, so
    :func:`fobos_l1` with ``l1 = lam`` is ``truncated_gradient`` with ``gravity = lam``,
    ``theta = inf`` and ``period = 1`` (same ``learning_rate``).

    Args:
      learning_rate: ``eta_t``, a float > 0 or an Optax schedule of the step count.
      gravity: ``lambda`` of the slides, a finite number ``>= 0``.
      theta: only coordinates with ``|v_i| <= theta`` are shrunk; ``>= 0``, ``inf`` allowed.
      period: ``k`` of the slides, an int ``>= 1``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Langford, Li & Zhang (2009), "Sparse Online Learning via Truncated Gradient", JMLR 10:
      the truncated-gradient update with the operator ``T_1``; the slides "Online
      Learning/Optimization: algorithms and analysis" (poetniu, 2015), Alg. 3.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> params = jnp.zeros(3)
      >>> tx = so.truncated_gradient(0.5, gravity=0.25, theta=1.0)
      >>> updates, state = tx.update(jnp.array([2.0, -1.0, 4.0]), tx.init(params), params)
      >>> params + updates  # v = (-1, 0.5, -2) shrunk by eta * gravity where |v_i| <= theta
      Array([-0.875,  0.375, -2.   ], dtype=float32)
    """
    _validation.step_size("learning_rate", learning_rate)
    _validation.strength("gravity", gravity)
    _validation.strength("theta", theta, allow_inf=True)
    _validation.period("period", period)

    def truncate(v, eta, t):
        lambda_t = jnp.where(t % period == 0, period * gravity, 0)
        lambda_t = lambda_t.astype(_numerics.real_dtype(v.dtype))
        # Alg. 3 line 5: T_1's two shrinking cases are one soft threshold inside [-theta, theta].
        return jnp.where(jnp.abs(v) <= theta, soft_threshold(v, eta * lambda_t), v)

    return _gradient_step_then_truncate(learning_rate, truncate)


@_leafwise.compiled
def fobos_l1(learning_rate: ScalarOrSchedule, l1: float) -> optax.GradientTransformationExtraArgs:
    """Forward-backward splitting with L1 regularization (L1-FOBOS), slides Alg. 4.

    ``w_{t+1} = sgn(w_t - eta_t g_t) max(0, |w_t - eta_t g_t| - eta_{t+1/2} l1)``: a gradient step
    followed by the proximal step of ``eta_{t+1/2} * l1 * ||w||_1``. We take the backward step
    size ``eta_{t+1/2} = eta_t``, the step size of the forward step.

    Args:
      learning_rate: ``eta_t``, a float > 0 or an Optax schedule of the step count.
      l1: the L1 strength ``lambda``, a finite number ``>= 0``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Duchi & Singer (2009), "Efficient Online and Batch Learning Using Forward Backward
      Splitting" (FOBOS), JMLR 10: the forward and backward steps, eqs. (2)-(3), with the L1
      regularizer; the slides "Online Learning/Optimization: algorithms and analysis"
      (poetniu, 2015), Alg. 4.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> params = jnp.zeros(3)
      >>> tx = so.fobos_l1(0.5, l1=0.25)
      >>> updates, state = tx.update(jnp.array([2.0, -1.0, 4.0]), tx.init(params), params)
      >>> params + updates  # soft threshold of w - eta g = (-1, 0.5, -2) at eta * l1
      Array([-0.875,  0.375, -1.875], dtype=float32)
    """
    _validation.step_size("learning_rate", learning_rate)
    _validation.strength("l1", l1)

    def truncate(v, eta, t):
        del t
        return soft_threshold(v, eta * l1)  # Alg. 4 line 5

    return _gradient_step_then_truncate(learning_rate, truncate)


@_leafwise.compiled
def rda_l1(gamma: float, l1: float) -> optax.GradientTransformationExtraArgs:
    """Regularized dual averaging with L1 regularization (L1-RDA), slides Alg. 5.

    With the running average gradient ``G_t = (t-1)/t G_{t-1} + g_t / t`` (Alg. 5 line 4) the
    weights are (line 5)::

        w_{t+1,i} = 0                                        if |G_i| < l1
                  = -(sqrt(t) / gamma) (G_i - l1 sgn(G_i))  otherwise,

    the minimizer of ``<G_t, w> + l1 ||w||_1 + gamma / (2 sqrt(t)) ||w||^2``. (The slides' first
    L1-RDA formula prints ``sqrt(lambda)``; the algorithm box and Xiao's paper have ``sqrt(t)``.)
    With ``l1 = 0`` this is dual averaging ``w_{t+1} = -(1 / (gamma sqrt(t))) sum_{s<=t} g_s``.
    Unlike FOBOS, the truncation threshold ``l1`` does not shrink with ``t``, hence more sparsity.

    Args:
      gamma: ``gamma > 0``, finite; the step on the average gradient is ``sqrt(t) / gamma``.
      l1: the L1 strength ``lambda``, a finite number ``>= 0``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``; ``t`` is
      the number of (finite) gradients the leaf has seen, see the module docstring.

    References:
      Xiao (2010), "Dual Averaging Methods for Regularized Stochastic Learning and Online
      Optimization" (RDA), JMLR 11: Algorithm 1 with ``Psi(w) = l1 ||w||_1`` and
      ``beta_t = gamma sqrt(t)``; the slides "Online Learning/Optimization: algorithms and
      analysis" (poetniu, 2015), Alg. 5.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> w = jnp.zeros(2)
      >>> tx = so.rda_l1(gamma=1.0, l1=0.5)
      >>> state = tx.init(w)
      >>> for g in (jnp.array([1.5, 0.2]), jnp.array([1.5, 0.2])):
      ...     updates, state = tx.update(g, state, w)
      ...     w = w + updates
      >>> w.round(4)  # -(sqrt(t) / gamma) (1.5 - l1) at t = 2; an average 0.2 < l1 stays 0
      Array([-1.4142,  0.    ], dtype=float32)
    """
    _validation.ridge("gamma", gamma, positive=True, why="the weights divide by gamma")
    _validation.strength("l1", l1)

    def init(spec, param):
        return (_no_steps(spec, param), _zeros(spec, param))

    def step(ctx, g, values, w, valid):
        del ctx, valid  # a skipped leaf's steps and average are restored by the driver
        steps, grad_avg = values
        steps = optax.safe_increment(steps)
        t = steps.astype(_numerics.real_dtype(g.dtype))
        grad_avg = (t - 1) / t * grad_avg + g / t  # Alg. 5 line 4
        w_new = -(jnp.sqrt(t) / gamma) * soft_threshold(grad_avg, l1)  # Alg. 5 line 5
        return w_new - w, (steps, grad_avg)

    return _learner(("steps", "grad_avg"), init, step, RDAState, param_fields=("grad_avg",))


@_leafwise.compiled
def ftrl_proximal(
    alpha: ScalarOrSchedule, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0
) -> optax.GradientTransformationExtraArgs:
    """FTRL-Proximal with L1 & L2 regularization and per-coordinate rates, slides Alg. 6.

    Per coordinate, with the learning rate ``eta_i = alpha / (beta + sqrt(n_i))``, ``n_i`` the sum
    of squared gradients::

        sigma_i = 1/eta_i(new n) - 1/eta_i(old n) = (sqrt(n_i + g_i^2) - sqrt(n_i)) / alpha
        n_i    += g_i^2
        z_i    += g_i - sigma_i w_i
        w_i     = 0                                                 if |z_i| < l1
                = -(l2 + (beta + sqrt(n_i)) / alpha)^{-1} (z_i - l1 sgn(z_i))   otherwise,

    the minimizer of ``g_{1:t} w + l1 |w| + l2/2 w^2 + 1/2 sum_s sigma_s (w - w_s)^2 + beta /
    (2 alpha) w^2``. (The slides print ``sigma_i = (1/alpha) sqrt(q_i + g_i^2) - sqrt(q_i)``; the
    comment "equals 1/eta_t - 1/eta_{t-1}" and McMahan et al. 2013 fix the parenthesis.) Here
    ``w_i`` in the ``z`` update is the weight played at this step, recomputed from ``z`` and ``n``
    (not read from ``params``), and ``n`` is stored as ``sqrt(n)`` (updated with ``hypot``) so that
    huge gradients do not overflow. With ``l1 = l2 = 0`` FTRL-Proximal plays the same points as
    per-coordinate gradient descent ``w_i -= eta_i g_i`` started at 0 (slides, Corollary 5).

    ``alpha`` may be an Optax schedule of the leaf's step count; then
    ``1/eta_{t,i} = (beta + sqrt(n_{t,i})) / alpha_t`` and ``sigma_t = 1/eta_t - 1/eta_{t-1}``
    (with ``1/eta_0 = beta / alpha_1``), which reduces to the formula above for constant ``alpha``.
    The regret analysis wants ``alpha_t`` non-increasing (``sigma >= 0``).

    Args:
      alpha: ``alpha > 0`` (finite) or an Optax schedule.
      beta: ``beta >= 0``, finite. With ``beta = 0`` a coordinate whose gradients have all been 0
        has an infinite rate and stays at 0.
      l1: the L1 strength ``lambda_1``, a finite number ``>= 0``.
      l2: the L2 strength ``lambda_2``, a finite number ``>= 0``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      McMahan et al. (2013), "Ad Click Prediction: a View from the Trenches" (KDD 2013),
      Algorithm 1 (per-coordinate FTRL-Proximal with L1 and L2); the slides "Online
      Learning/Optimization: algorithms and analysis" (poetniu, 2015), Alg. 6.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> w = jnp.zeros(2)
      >>> tx = so.ftrl_proximal(alpha=1.0, beta=1.0, l1=0.5)
      >>> updates, state = tx.update(jnp.array([2.0, 0.3]), tx.init(w), w)
      >>> w + updates  # z = g: -(2 - l1) / (beta + |g|) = -0.5; |z_2| < l1 stays 0
      Array([-0.5,  0. ], dtype=float32)
    """
    _validation.step_size(
        "alpha", alpha, positive=True, why="the rates alpha / (beta + sqrt(n)) divide by it"
    )
    _validation.strength("beta", beta)
    _validation.strength("l1", l1)
    _validation.strength("l2", l2)

    def weights(z, inv_eta):
        """Alg. 6 line 8; ``0/0 = 0`` for ``l2 = beta = n_i = 0`` (then ``z_i = 0`` too)."""
        denominator = l2 + inv_eta
        safe = jnp.where(denominator > 0, denominator, jnp.ones_like(denominator))
        return -soft_threshold(z, l1) / safe

    def init(spec, param):
        sqrt_n = jnp.zeros((spec.size,), _numerics.real_dtype(spec.dtype))  # complex: real
        return (_no_steps(spec, param), _zeros(spec, param), sqrt_n)

    def step(ctx, g, values, w_params, valid):
        del ctx, valid  # a skipped leaf's sums are restored by the driver
        steps, z, sqrt_n = values
        rdtype = _numerics.real_dtype(g.dtype)  # complex g: n sums |g|^2, sigma is real
        new_sqrt_n = jnp.hypot(sqrt_n, jnp.abs(g) if jnp.iscomplexobj(g) else g)  # n += g^2
        if callable(alpha):
            alpha_prev = _leafwise.at_step(alpha, jnp.maximum(steps - 1, 0), rdtype)
            alpha_t = _leafwise.at_step(alpha, steps, rdtype)
            # 1/eta_t - 1/eta_{t-1}, written so that beta cancels exactly for constant alpha
            sigma = (
                new_sqrt_n / alpha_t - sqrt_n / alpha_prev + beta * (1 / alpha_t - 1 / alpha_prev)
            )
        else:
            alpha_prev = alpha_t = jnp.asarray(alpha, rdtype)
            sigma = (new_sqrt_n - sqrt_n) / alpha_t  # Alg. 6 line 6
        w = weights(z, (beta + sqrt_n) / alpha_prev)  # the weights played at this step
        z = z + g - sigma * w  # Alg. 6 line 7
        w_new = weights(z, (beta + new_sqrt_n) / alpha_t)  # Alg. 6 line 8
        return w_new - w_params, (optax.safe_increment(steps), z, new_sqrt_n)

    return _learner(
        ("steps", "z", "sqrt_n"), init, step, FTRLProximalState, param_fields=("z", "sqrt_n")
    )
