"""Classic first-order sparse online learners as Optax gradient transformations.

The formulas are those of the slides *Online Learning/Optimization: algorithms and analysis*
(``papers/001_32e89dace837cb89.txt``), written with a time index ``t = 1, 2, 3, ...``:

* :func:`simple_truncation` -- gradient step, then every ``k`` steps the truncation ``T_0``;
* :func:`truncated_gradient` -- truncated gradient, slides Alg. 3 (Langford, Li & Zhang 2009);
* :func:`fobos_l1` -- forward-backward splitting with L1, slides Alg. 4 (Duchi & Singer 2009);
* :func:`rda_l1` -- regularized dual averaging with L1, slides Alg. 5 (Xiao 2009);
* :func:`ftrl_proximal` -- FTRL-Proximal with L1 & L2 and per-coordinate learning rates,
  slides Alg. 6 (McMahan 2011; McMahan et al. 2013);

and, at the end of the module, the random-projection approximations of ADA-FULL that the Ada-FD
paper compares against: :func:`radagrad` (its eq. 4) and :func:`ada_lr` (eq. 3).

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
import numpy as np
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _numerics, _partitioning, _validation
from sketchopt import metrics as _metrics
from sketchopt import transforms as _transforms
from sketchopt._operators import LowRankOperator

__all__ = [
    "AdaLRMetricState",
    "FTRLProximalState",
    "RadagradMetricState",
    "ada_lr",
    "ada_lr_metric",
    "radagrad",
    "radagrad_metric",
    "RDAState",
    "TruncatedGradientState",
    "fobos_l1",
    "ftrl_proximal",
    "rda_l1",
    "simple_truncation",
    "truncated_gradient",
]


_NO_PARAMS_MSG = (
    "this sparse online learner needs the current params: call update(updates, state, params)"
)


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


def _value(hyperparam, count, dtype):
    """A hyperparameter (a constant or an Optax schedule of ``count``) as a ``dtype`` scalar."""
    if callable(hyperparam):
        hyperparam = hyperparam(count)
    return jnp.asarray(hyperparam, dtype)


def _soft_threshold(v, threshold):
    """``sgn(v) * max(0, |v| - threshold)``: the L1 proximal step (slides, L1-FOBOS)."""
    return jnp.sign(v) * jnp.maximum(jnp.abs(v) - threshold, 0)


def _learner(fields, init, step, state_class):
    """A sparse learner on the shared driver (``sketchopt._leafwise``); all of them need params."""
    rule = _leafwise.LeafRule(
        fields, init, step, hyper=lambda count: count, needs_params="this sparse online learner"
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
        eta = _value(learning_rate, count, g.dtype)
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
    """
    _validation.step_size("learning_rate", learning_rate)
    _validation.strength("gravity", gravity)
    _validation.strength("theta", theta, allow_inf=True)
    _validation.period("period", period)

    def truncate(v, eta, t):
        lambda_t = jnp.where(t % period == 0, period * gravity, 0).astype(v.dtype)
        # Alg. 3 line 5: T_1's two shrinking cases are one soft threshold inside [-theta, theta].
        return jnp.where(jnp.abs(v) <= theta, _soft_threshold(v, eta * lambda_t), v)

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
    """
    _validation.step_size("learning_rate", learning_rate)
    _validation.strength("l1", l1)

    def truncate(v, eta, t):
        del t
        return _soft_threshold(v, eta * l1)  # Alg. 4 line 5

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
    """
    _validation.ridge("gamma", gamma, positive=True, why="the weights divide by gamma")
    _validation.strength("l1", l1)

    def init(spec, param):
        return (_no_steps(spec, param), _zeros(spec, param))

    def step(ctx, g, values, w, valid):
        del ctx, valid  # a skipped leaf's steps and average are restored by the driver
        steps, grad_avg = values
        steps = optax.safe_increment(steps)
        t = steps.astype(g.dtype)
        grad_avg = (t - 1) / t * grad_avg + g / t  # Alg. 5 line 4
        w_new = -(jnp.sqrt(t) / gamma) * _soft_threshold(grad_avg, l1)  # Alg. 5 line 5
        return w_new - w, (steps, grad_avg)

    return _learner(("steps", "grad_avg"), init, step, RDAState)


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
        return -_soft_threshold(z, l1) / safe

    def init(spec, param):
        return (_no_steps(spec, param), _zeros(spec, param), _zeros(spec, param))

    def step(ctx, g, values, w_params, valid):
        del ctx, valid  # a skipped leaf's sums are restored by the driver
        steps, z, sqrt_n = values
        new_sqrt_n = jnp.hypot(sqrt_n, g)  # Alg. 6 line 6: n_i += g_i^2
        if callable(alpha):
            alpha_prev = _value(alpha, jnp.maximum(steps - 1, 0), g.dtype)
            alpha_t = _value(alpha, steps, g.dtype)
            # 1/eta_t - 1/eta_{t-1}, written so that beta cancels exactly for constant alpha
            sigma = (
                new_sqrt_n / alpha_t - sqrt_n / alpha_prev + beta * (1 / alpha_t - 1 / alpha_prev)
            )
        else:
            alpha_prev = alpha_t = jnp.asarray(alpha, g.dtype)
            sigma = (new_sqrt_n - sqrt_n) / alpha_t  # Alg. 6 line 6
        w = weights(z, (beta + sqrt_n) / alpha_prev)  # the weights played at this step
        z = z + g - sigma * w  # Alg. 6 line 7
        w_new = weights(z, (beta + new_sqrt_n) / alpha_t)  # Alg. 6 line 8
        return w_new - w_params, (optax.safe_increment(steps), z, new_sqrt_n)

    return _learner(("steps", "z", "sqrt_n"), init, step, FTRLProximalState)


# ------------------------------------------------------------------------------------------------
# RADAGRAD and ADA-LR: random-projection approximations of ADA-FULL.
#
# "Random-projection approximations of ADA-FULL: RADAGRAD and ADA-LR (Krummenacher et al. 2016).
#
# The baselines the Ada-FD paper compares against (its eq. 3 and 4). Both project the gradient
# outer products with a subsampled randomized Fourier-type transform ``Pi`` (``tau x d``):
# ``Pi g = sqrt(d / k) * P C (D g)`` with ``D`` random signs, ``C`` the orthonormal DCT-II (a real
# Fourier transform) and ``P`` ``k = min(tau, d)`` coordinates sampled without replacement (zero
# rows pad ``Pi`` up to ``tau``). ``Pi`` is never stored: the state keeps the signs (int8) and the
# sampled indices. RADAGRAD applies it to one vector per step through the FFT (``O(d log d)``);
# ADA-LR, which multiplies a ``d x d`` matrix by ``Pi^T`` anyway (``O(tau d^2)``), builds ``Pi``
# explicitly in ``O(tau d)`` -- no FFT of a large, possibly sharded matrix.
#
# * :func:`radagrad` (eq. 4): ``G~_t = G~_{t-1} + g_t (Pi g_t)^T`` (``d x tau``); with
#   ``G~_t = V Sigma W^T`` (the paper's ``qr_update`` followed by the SVD of ``B = G~^T Q``, which
#   yields exactly the left singular vectors and singular values of ``G~_t``)
#   ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T g_t - eta (g_t - V V^T g_t)``.
#   We keep ``G~_t`` and its small Gram matrix ``G~^T G~`` (updated in ``O(tau d)`` from the one
#   pass ``G~^T g``) and re-orthonormalize through the ``tau x tau`` eigendecomposition of that Gram
#   matrix: the same ``V`` and ``Sigma`` as the rank-one QR update, at the same ``O(tau d)`` cost.
#   In metric form ``H_t = I + V^T diag(Sigma^{1/2} + delta - 1) V`` and the step is
#   :func:`sketchopt.mirror_descent` with it.
# * :func:`ada_lr` (eq. 3): keeps ``G_t`` (``d x d``), projects ``G~ = G Pi^T``, orthonormalizes
#   ``Q R = G~``, takes the SVD of ``B = Q^T G = U Sigma V^T`` and steps
#   ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T g_t`` (``O(tau d^2)``; no step outside
#   the sketched subspace, as in the paper).


def _projection_init(key, dim, sketch_size):
    """Random signs (int8) and ``min(tau, d)`` sampled coordinates of the randomized DCT."""
    k_signs, k_idx = jax.random.split(key)
    signs = jax.random.rademacher(k_signs, (dim,), jnp.int8)
    idx = jax.random.permutation(k_idx, dim)[: min(sketch_size, dim)]
    return signs, idx.astype(jnp.int32)


def _project(x, signs, idx, sketch_size):
    """``Pi x = sqrt(d / k) P DCT(D x)`` along the last axis (zero-padded to ``tau`` rows)."""
    d = x.shape[-1]
    if d == 0:
        return jnp.zeros(x.shape[:-1] + (sketch_size,), x.dtype)
    # The DCT mixes all of d: under an explicit mesh it runs on the gathered d-vector (the
    # tau x d sketch itself is never gathered), which also lets the take below read any index.
    x = _partitioning.replicate(x) * _partitioning.replicate(signs).astype(x.dtype)
    # The orthonormal DCT-II of length 1 is the identity (and XLA's CPU FFT rejects that size).
    y = x if d == 1 else jax.scipy.fft.dct(x, type=2, norm="ortho", axis=-1)
    # Scale by the number of coordinates actually kept (min(tau, d)): with tau > d the padded
    # rows are zero and Pi must stay an isometry, or RADAGRAD would not reduce to ADA-FULL.
    y = jnp.take(y, idx, axis=-1) * jnp.asarray(np.sqrt(d / idx.shape[0]), x.dtype)
    pad = sketch_size - idx.shape[0]
    if pad:
        y = jnp.concatenate([y, jnp.zeros(y.shape[:-1] + (pad,), y.dtype)], axis=-1)
    return y


def _mulmod(a, b, n):
    """``a * b mod n`` for int32 ``0 <= a, b < n <= 2**24``, exact also where ``a b`` overflows.

    The float32 quotient ``q ~ a b / n`` is off by a few units at most, so ``a b - q n`` is small:
    int32 arithmetic, which wraps modulo ``2**32``, gets it exactly, and the final ``mod`` corrects
    ``q``.
    """
    q = jnp.floor(a.astype(jnp.float32) * b.astype(jnp.float32) / n).astype(jnp.int32)
    return jnp.remainder(a * b - q * n, n)


def _projection_matrix(signs, idx, sketch_size, dtype):
    """``Pi = sqrt(d / k) P C D`` (``tau x d``, the projection of Ada-FD eq. 3) built explicitly:
    the matrix that :func:`_project` applies through the FFT, with zero rows below the
    ``k = min(tau, d)`` sampled ones.

    Row ``i < k`` is ``sqrt(d / k) C[idx_i, :] * signs`` with the orthonormal DCT-II
    ``C[m, j] = sqrt(2 / d) cos(pi (2j + 1) m / (2d))`` (row ``m = 0`` divided by ``sqrt(2)``).
    The phase ``(2j + 1) m`` is reduced modulo ``4d`` in exact integer arithmetic, so the cosine
    is as accurate for large ``d`` as for small. ``O(tau d)`` work.
    """
    d, k = signs.shape[0], idx.shape[0]
    if d == 0:
        return jnp.zeros((sketch_size, 0), dtype)
    m = idx[:, None]
    phase = _mulmod(m, 2 * jnp.arange(d, dtype=jnp.int32)[None, :] + 1, 4 * d)
    cosines = jnp.cos(phase.astype(dtype) * (np.pi / (2 * d)))
    # sqrt(d / k) times C's row scale, sqrt(1 / d) for m = 0 and sqrt(2 / d) otherwise
    scale = jnp.where(m == 0, np.sqrt(1 / k), np.sqrt(2 / k)).astype(dtype)
    pi = scale * cosines * signs.astype(dtype)
    return jnp.pad(pi, ((0, sketch_size - k), (0, 0)))


class RadagradMetricState(NamedTuple):
    """``rows = G~_t^T / 4**scale_exp`` (``tau x d``), ``gram = rows rows^T``, the projection."""

    rows: jax.Array
    gram: jax.Array
    scale_exp: jax.Array
    signs: jax.Array
    indices: jax.Array


def radagrad_metric(sketch_size: int, delta: float, key) -> _metrics.Metric:
    """RADAGRAD's metric ``H_t = I + V^T diag(Sigma^{1/2} + delta - 1) V`` (Ada-FD eq. 4)."""
    tau = _validation.size("sketch_size", sketch_size)
    _metrics.check_delta(delta)
    key = _validation.prng_key("key", key)

    def init(shape, dtype=jnp.float32):
        dim, dtype = _numerics.flat_size(shape), _numerics.state_dtype(dtype)
        signs, idx = _projection_init(key, dim, tau)
        return RadagradMetricState(
            rows=jnp.zeros((tau, dim), dtype),
            gram=jnp.zeros((tau, tau), dtype),
            scale_exp=jnp.zeros((), jnp.int32),
            signs=signs,
            indices=idx,
        )

    def operator(state):
        kappa, u = _numerics.eigh_desc(state.gram)
        inv = jnp.where(kappa > 0, 1 / jnp.sqrt(jnp.where(kappa > 0, kappa, 1)), 0)
        coef = (u * inv).T  # V = coef @ rows: the left singular vectors of G~ as rows
        # Singular values of G~ = 4**e sqrt(kappa); their square roots 2**e kappa**(1/4).
        root_sigma = _numerics.ldexp(jnp.sqrt(jnp.sqrt(kappa)), state.scale_exp)
        # H's eigenvalues on span(V) are Sigma^{1/2} + delta; as weights over the identity they
        # are stored minus 1, which cannot hold values below eps: floor them there (a smaller,
        # finite step) rather than divide by a rounded 0 (delta < eps with tiny gradients).
        floor = jnp.finfo(kappa.dtype).eps
        weights = jnp.where(kappa > 0, jnp.maximum(root_sigma + delta, floor) - 1, 0)
        weights = weights.astype(kappa.dtype)
        return LowRankOperator(jnp.ones((), kappa.dtype), state.rows, coef, weights)

    def update(state, g, valid=True):
        dtype = state.rows.dtype
        # G~ ~ |g|^2: keep rows = G~^T / 4**e with e following the largest |g| seen, so that a
        # 1e30 gradient in float32 neither overflows the rows nor (as |g|^4) the Gram matrix.
        # e never decreases: H = I + V^T diag(Sigma^{1/2} + delta - 1) V cannot represent
        # Sigma^{1/2} + delta below eps (the weight rounds to -1), so for float32 gradients so
        # small that G~ underflows (|g| < ~1e-10) RADAGRAD takes plain gradient steps instead.
        e_g = _numerics.exponent(jnp.max(jnp.abs(g), initial=0))
        exp = jnp.where(valid, jnp.maximum(state.scale_exp, e_g), state.scale_exp)
        shift = state.scale_exp - exp
        rows = _numerics.ldexp(state.rows, 2 * shift)
        gram = _numerics.ldexp(state.gram, 4 * shift)
        gs = _numerics.ldexp(g, -exp).astype(dtype)
        gt = _project(gs, state.signs, state.indices, tau)  # Pi g / 2**e
        p = _partitioning.contract_d(rows, gs)  # G~^T g / 8**e (before the update)
        sq = jnp.sum(jnp.square(gs))
        # A skipped step (zero g, unchanged exp) must leave the state bit-identical: adding +0
        # would turn its -0 entries into +0, hence the selects.
        gram = jnp.where(
            valid, gram + jnp.outer(p, gt) + jnp.outer(gt, p) + sq * jnp.outer(gt, gt), gram
        )
        rows = jnp.where(valid, rows + jnp.outer(gt, gs), rows)
        state = state._replace(rows=rows, gram=gram, scale_exp=exp)
        return state, operator(state), None

    spec = _validation.spec_key("radagrad", tau, delta, key)
    return _metrics.Metric(init, update, operator, "radagrad", spec)


@_leafwise.compiled
def radagrad(learning_rate, sketch_size: int, delta: float, key):
    """RADAGRAD (Krummenacher et al. 2016; Ada-FD paper eq. 4) with a randomized DCT projection.

    ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T g_t - eta (g_t - V V^T g_t)`` where
    ``V Sigma W^T`` is the SVD of ``G~_t = sum_s g_s (Pi g_s)^T``. ``key`` draws ``Pi`` (each leaf
    uses the same key; ``vmap`` over keys is supported). Heuristic: no regret guarantee.
    """
    return _transforms.mirror_descent(learning_rate, radagrad_metric(sketch_size, delta, key))


class AdaLRMetricState(NamedTuple):
    """``gram = G_t / 4**scale_exp`` (``d x d``) and the projection."""

    gram: jax.Array
    scale_exp: jax.Array
    signs: jax.Array
    indices: jax.Array


def ada_lr_metric(sketch_size: int, delta: float, key) -> _metrics.Metric:
    """ADA-LR's metric (Ada-FD eq. 3): ``H_t^{-1} = V (Sigma^{1/2} + delta I)^{-1} V^T``."""
    tau = _validation.size("sketch_size", sketch_size)
    _metrics.check_delta(delta)
    key = _validation.prng_key("key", key)

    def init(shape, dtype=jnp.float32):
        dim, dtype = _numerics.flat_size(shape), _numerics.state_dtype(dtype)
        signs, idx = _projection_init(key, dim, tau)
        return AdaLRMetricState(jnp.zeros((dim, dim), dtype), jnp.zeros((), jnp.int32), signs, idx)

    def operator(state):
        # The d x d decompositions need all of G_t on every device (under an explicit mesh this
        # must be said; automatic sharding gathers it by itself): an O(tau d^2) baseline.
        gram = _partitioning.replicate(state.gram)
        dtype, d = gram.dtype, gram.shape[0]
        if d == 0:  # static: nothing to decompose
            vt, root = jnp.zeros((0, 0), dtype), jnp.zeros((0,), dtype)
            return _AdaLROperator(vt, root, jnp.asarray(delta, dtype))
        pi = _projection_matrix(
            _partitioning.replicate(state.signs), _partitioning.replicate(state.indices), tau, dtype
        )
        # Eq. 3: G~ = G Pi^T (d x tau), Q R = G~, B = Q^T G = U Sigma V^T.
        g_tilde = jnp.matmul(gram, pi.T, precision=_numerics.HIGHEST)
        q, _ = jnp.linalg.qr(g_tilde)  # d x k
        b = jnp.matmul(q.T, gram, precision=_numerics.HIGHEST)  # k x d
        _, sigma, vt = jnp.linalg.svd(b, full_matrices=False)
        sigma = jnp.where(sigma > sigma[0] * b.shape[0] * jnp.finfo(dtype).eps, sigma, 0)
        root = _numerics.ldexp(jnp.sqrt(sigma), state.scale_exp)
        return _AdaLROperator(vt, root, jnp.asarray(delta, dtype))

    def update(state, g, valid=True):
        g, gram = _partitioning.replicate(g), _partitioning.replicate(state.gram)  # see operator
        exp = _numerics.rescale_exponent(
            state.scale_exp,
            jnp.max(jnp.abs(g), initial=0),
            jnp.max(jnp.diagonal(gram), initial=0),
        )
        exp = jnp.where(valid, exp, state.scale_exp)
        gram = _numerics.ldexp(gram, 2 * (state.scale_exp - exp))
        gs = _numerics.ldexp(g, -exp)
        gram = jnp.where(valid, gram + jnp.outer(gs, gs), gram)  # bit-identical when skipped
        state = state._replace(gram=gram, scale_exp=exp)
        return state, operator(state), None

    spec = _validation.spec_key("ada_lr", tau, delta, key)
    return _metrics.Metric(init, update, operator, "ada_lr", spec)


class _AdaLROperator(NamedTuple):
    """``H^{-1} y = V (root + delta)^{-1} V^T y`` on the sketched subspace only (eq. 3)."""

    vt: jax.Array  # (k, d) orthonormal rows
    root: jax.Array  # (k,)
    delta: jax.Array

    def solve(self, y):
        coef = _partitioning.contract_d(self.vt, y) / (self.root + self.delta)
        return jnp.matmul(coef, self.vt, precision=_numerics.HIGHEST)


@_leafwise.compiled
def ada_lr(learning_rate, sketch_size: int, delta: float, key):
    """ADA-LR (Krummenacher et al. 2016; Ada-FD paper eq. 3) with a randomized DCT projection.

    Keeps the full ``G_t`` (``O(d^2)`` memory, ``O(tau d^2)`` per step): the randomized low-rank
    SVD of ``G_t`` gives ``V, Sigma`` and ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T
    g_t``. Without a regularizer only.
    """
    return _transforms.mirror_descent(learning_rate, ada_lr_metric(sketch_size, delta, key))
