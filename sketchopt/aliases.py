r"""The named algorithms: one line each on a metric, a rule and an optional regularizer.

Like ``optax.adagrad`` on ``optax.scale_by_rss``, every alias here is the composition of a metric
of :mod:`sketchopt.metrics` with a rule of :mod:`sketchopt.rules` (``docs/design.md``, "The
three axes"):

* ADA-FD (Ada-FD paper Alg. 2 / Alg. 1): :func:`ada_fd`, :func:`ada_fd_dual_averaging`,
  :func:`scale_by_ada_fd`, and S-AdaGrad (:func:`s_adagrad`);
* the AdaGrad baselines (Duchi et al.): :func:`ada_full`, :func:`ada_diag` and their dual
  averaging and ``scale_by_*`` forms;
* the random-projection baselines (Krummenacher et al. 2016): :func:`radagrad`, :func:`ada_lr`;
* network layers: ``kron_fd``, Shampoo's Kronecker-factored metric with FD/RFD sketches: it
  moved to its family's module, :func:`sketchopt.shampoo.kron_fd` (beside its metric
  :func:`sketchopt.shampoo.kron_sketched` and the grafts), and is re-exported here;
* :func:`inject_hyperparams`, ``optax.inject_hyperparams`` for factories with integer sizes.

(Formerly half of ``sketchopt.transforms``; RADAGRAD/ADA-LR were in ``sketchopt.baselines``. Both
modules re-export these names: see ``CHANGELOG.md``.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise
from sketchopt import metrics as _metrics
from sketchopt import sketches as _sketches
from sketchopt.rules import dual_averaging, mirror_descent, scale_by_metric

# Sketched Shampoo's transform, at its old path (the family's module builds on the rules, as this
# one does, and imports nothing of it).
from sketchopt.shampoo import kron_fd as kron_fd

__all__ = [
    "ada_diag",
    "ada_diag_dual_averaging",
    "ada_fd",
    "ada_fd_dual_averaging",
    "ada_full",
    "ada_full_dual_averaging",
    "ada_lr",
    "inject_hyperparams",
    "kron_fd",
    "radagrad",
    "s_adagrad",
    "scale_by_ada_diag",
    "scale_by_ada_fd",
    "scale_by_ada_full",
]


def _fd_metric(sketch_size, delta, robust, fast, alpha_fraction=0.5):
    """ADA-FD's metric ``H_t = delta I + C_t^{1/2}`` on an FD (``robust``: RFD) sketch."""
    if robust:
        sketch = _sketches.robust_frequent_directions(
            sketch_size, fast=fast, alpha_fraction=alpha_fraction
        )
    else:
        sketch = _sketches.frequent_directions(sketch_size, fast=fast)
    return _metrics.sketched(sketch, delta)


@_leafwise.compiled
def ada_fd(
    learning_rate: ScalarOrSchedule,
    sketch_size: int = 10,
    delta: float = 0.1,
    *,
    robust: bool = True,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD with composite mirror descent: Ada-FD paper Alg. 2, eq. (7).

    Start at ``learning_rate=1``: good rates sit 30-100x above Adam's (the step is about ``eta``
    in norm, whatever ``d``), and at Adam's usual ``1e-3`` a digits MLP learns nothing (the
    README's "Choosing a learner", from the defaults page's sweep).

    ``x_{t+1} = x_t - (eta/delta) (g_t - V (delta I + S')^{-1} S' V^T g_t)`` where the
    frequent-directions sketch (``sketch_size = tau`` rows including the slot for ``g_t``) already
    includes ``g_t``; i.e. ``x_{t+1} = x_t - eta H_t^{-1} g_t`` with ``H_t = delta I + C_t^{1/2}``.

    The paper's algorithm is ``robust=False``. The defaults (``tau = 10``, ``delta = 0.1``, RFD)
    are what trains out of the box: with plain FD a direction shrunk out of the sketch keeps the
    step ``eta / delta``, which diverges on badly scaled problems for any small ``delta`` (the
    README's least-squares example ends 12x above its start at ``delta = 1e-3``), while RFD's
    ridge ``alpha_t`` grows with what was shrunk, so the step there is ``eta / (delta +
    sqrt(alpha_t))``, AdaGrad's. ``delta = 0.1`` keeps float32 round-off in the smallest sketched
    directions (about ``sqrt(eps)`` of the largest singular value) from being amplified by
    ``1/delta`` (``delta <= 1e-3`` diverged on the README's example at some ``tau``); on networks
    it trains as well as ``1e-6`` (``experiments/run.py defaults``). The step is about ``eta`` in
    norm whatever ``d`` (full-matrix AdaGrad is rotation invariant), where ADA-DIAG's is about
    ``eta sqrt(d)``: good rates sit higher than AdaGrad's (``eta`` about 1 on small networks).
    Like AdaGrad it does not reach Adam's training loss on networks (no momentum, steps that
    decay as ``1/sqrt(t)``); it is an online convex method first.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      sketch_size: ``tau >= 1``; with ``tau > d`` ADA-FD equals ADA-FULL.
      delta: ``delta > 0``.
      robust: sketch with RFD, ``C_t = B^T B + alpha_t I`` (RFD paper Alg. 2); ``False`` is the
        paper's Ada-FD.
      fast: use the doubling buffer (RFD paper Alg. 4/5), rotating once every ``tau`` rows.
      regularizer: ``None`` or a composite term of :mod:`sketchopt.regularizers`.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params`` only with a
      regularizer.

    References:
      Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via Frequent Directions",
      IJCAI, Alg. 2 and eq. (7); Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent
      Directions with Application in Online Learning", JMLR 20, Alg. 2 (``robust``) and
      Alg. 4/5 (``fast``).

    Examples:
      Step 1: ``H_1 = delta I + |g_1|`` along ``g_1``, so the step is ``-eta g_1 / (delta + 3)``.

      >>> import jax.numpy as jnp, sketchopt as so
      >>> params, grads = {"w": jnp.zeros(3)}, {"w": jnp.array([1.0, 2.0, 2.0])}
      >>> tx = so.ada_fd(learning_rate=0.3, sketch_size=2, delta=1e-3)
      >>> updates, state = tx.update(grads, tx.init(params))
      >>> updates["w"].round(3)
      Array([-0.1, -0.2, -0.2], dtype=float32)
    """
    return mirror_descent(learning_rate, _fd_metric(sketch_size, delta, robust, fast), regularizer)


@_leafwise.compiled
def ada_fd_dual_averaging(
    learning_rate: ScalarOrSchedule,
    sketch_size: int = 10,
    delta: float = 0.1,
    *,
    robust: bool = True,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD with dual averaging: Ada-FD paper Alg. 1, eq. (6).

    Start at ``learning_rate=1``, as :func:`ada_fd`: good rates sit 30-100x above Adam's.

    ``x_{t+1} = x_1 - (eta/delta) (gbar_t - V (delta I + S')^{-1} S' V^T gbar_t)`` with
    ``gbar_t = sum_{s<=t} g_s``, anchored at the initial parameters ``x_1``.

    Defaults as :func:`ada_fd` (the paper's algorithm is ``robust=False``).

    Args:
      learning_rate, sketch_size, delta, robust, fast, regularizer: as :func:`ada_fd`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via Frequent Directions",
      IJCAI, Alg. 1 and eq. (6).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> x1 = jnp.ones(2)
      >>> tx = so.ada_fd_dual_averaging(0.5, sketch_size=3, delta=1.0)
      >>> updates, state = tx.update(jnp.array([3.0, 4.0]), tx.init(x1), x1)
      >>> (x1 + updates).round(4)  # x_1 - eta g / (delta + |g|), anchored at x_1
      Array([0.75  , 0.6667], dtype=float32)
    """
    return dual_averaging(learning_rate, _fd_metric(sketch_size, delta, robust, fast), regularizer)


@_leafwise.compiled
def ada_full(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + G^{1/2}``).

    ``x_{t+1} = x_t - eta (delta I + G_t^{1/2})^{-1} g_t`` (with a regularizer, its proximal step
    in the metric ``H_t``). ``G_t = sum_{s<=t} g_s g_s^T`` is kept exactly: ``O(d^2)`` memory and
    an ``O(d^3)`` eigendecomposition per step, the reference that ADA-FD approximates.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      delta: ``delta > 0``.
      regularizer: ``None`` or a composite term of :mod:`sketchopt.regularizers`.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params`` only with a
      regularizer.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 2 (full matrices) with the composite mirror descent
      update, eq. (4).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.ada_full(1.0, delta=1.0)
      >>> updates, state = tx.update(jnp.array([3.0, 4.0]), tx.init(jnp.zeros(2)))
      >>> updates.round(4)  # -g / (delta + |g|): G_1^{1/2} = g g^T / |g|
      Array([-0.5   , -0.6667], dtype=float32)
    """
    return mirror_descent(learning_rate, _metrics.full(delta), regularizer)


@_leafwise.compiled
def ada_full_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with primal-dual subgradient updates (Duchi et al. eq. 3).

    ``x_{t+1} = x_1 - eta (delta I + G_t^{1/2})^{-1} sum_{s<=t} g_s``, anchored at the initial
    parameters ``x_1`` (with a regularizer, the proximal form of :func:`sketchopt.dual_averaging`).

    Args:
      learning_rate, delta, regularizer: as :func:`ada_full`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 2 (full matrices) with the primal-dual subgradient
      update, eq. (3).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.ada_full_dual_averaging(1.0, delta=1.0)
      >>> x = jnp.zeros(2)
      >>> state = tx.init(x)
      >>> for g in (jnp.array([3.0, 0.0]), jnp.array([0.0, 4.0])):
      ...     updates, state = tx.update(g, state, x)
      ...     x = x + updates
      >>> x  # -(I + diag(3, 4))^{-1} (g_1 + g_2)
      Array([-0.75, -0.8 ], dtype=float32)
    """
    return dual_averaging(learning_rate, _metrics.full(delta), regularizer)


@_leafwise.compiled
def ada_diag(
    learning_rate: ScalarOrSchedule, delta: float = 1e-6, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + diag(G)^{1/2}``).

    Start at ``learning_rate=0.1``: good rates sit about 3x above Adam's (its step decays as
    ``1/sqrt(t)``), a hundred times Adam's usual ``1e-3`` (the README's "Choosing a learner").

    ``x_{t+1,i} = x_{t,i} - eta g_{t,i} / (delta + sqrt(sum_{s<=t} g_{s,i}^2))`` (with a
    regularizer, its closed-form proximal step in the diagonal metric).

    ``delta`` defaults to ``1e-6``, a ridge below any gradient that matters (``optax.adagrad``'s
    ``eps`` is ``1e-7``): the first step is then ``eta sign(g)`` per coordinate, as AdaGrad's.
    With no momentum and a step that decays as ``1/sqrt(t)`` it does not reach Adam's training
    loss on networks (nor does ``optax.adagrad``): it is a method for online convex problems.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      delta: ``delta >= 0`` (``delta = 0`` with the safe ``0/0 = 0``).
      regularizer: ``None`` or a composite term of :mod:`sketchopt.regularizers`.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params`` only with a
      regularizer.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 1 (diagonal matrices) with the composite mirror
      descent update, eq. (4); the proximal steps of sec. 6.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.ada_diag(1.0, delta=0.0)
      >>> updates, state = tx.update(jnp.array([3.0, -4.0]), tx.init(jnp.zeros(2)))
      >>> updates  # -g / |g| per coordinate on the first step
      Array([-1.,  1.], dtype=float32)
    """
    return mirror_descent(learning_rate, _metrics.diagonal(delta), regularizer)


@_leafwise.compiled
def ada_diag_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float = 1e-6, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with primal-dual subgradient updates (Duchi et al. eq. 3).

    ``x_{t+1,i} = x_{1,i} - eta sum_{s<=t} g_{s,i} / (delta + sqrt(sum_{s<=t} g_{s,i}^2))``,
    anchored at the initial parameters ``x_1`` (with a regularizer, its closed-form proximal
    step, e.g. the truncation of Duchi et al. eq. 24 for L1).

    Args:
      learning_rate, delta, regularizer: as :func:`ada_diag`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 1 (diagonal matrices) with the primal-dual subgradient
      update, eq. (3); the proximal steps of sec. 6.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> l1 = so.regularizers.l1(0.5)
      >>> tx = so.ada_diag_dual_averaging(1.0, delta=1.0, regularizer=l1)
      >>> x = jnp.zeros(2)
      >>> updates, state = tx.update(jnp.array([0.2, 3.0]), tx.init(x), x)
      >>> x + updates  # |g_i| <= l1 stays exactly 0 (Duchi et al. eq. 24)
      Array([ 0.   , -0.625], dtype=float32)
    """
    return dual_averaging(learning_rate, _metrics.diagonal(delta), regularizer)


@_leafwise.compiled
def s_adagrad(
    learning_rate: ScalarOrSchedule,
    sketch_size: int = 10,
    delta: float = 0.1,
    *,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """S-AdaGrad (Feinberg et al. 2023, "Sketchy"): robust ADA-FD whose ridge collects the whole
    shrinkage (the "escaped mass"), not half of it: ``C_t = B^T B + (sum of shrinkage) I``.

    Start at ``learning_rate=1``, as :func:`ada_fd`: good rates sit 30-100x above Adam's.

    ``x_{t+1} = x_t - eta (delta I + C_t^{1/2})^{-1} g_t`` as in :func:`ada_fd`, with this
    ``C_t``. Defaults (``sketch_size = 10``, ``delta = 0.1``), the size of the step and why it
    does not reach Adam's training loss on networks: as :func:`ada_fd`.

    Args:
      learning_rate, sketch_size, delta, fast, regularizer: as :func:`ada_fd`.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params`` only with a
      regularizer.

    References:
      Feinberg, Chen, Sun, Anil & Hazan, "Sketchy: Memory-efficient Adaptive Regularization
      with Frequent Directions" (NeurIPS 2023), S-AdaGrad.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> g = jnp.array([1.0, 2.0, 2.0])
      >>> a, b = so.s_adagrad(0.1, 2, 1e-3), so.ada_fd(0.1, 2, 1e-3, robust=True)
      >>> same = jnp.allclose(a.update(g, a.init(g))[0], b.update(g, b.init(g))[0])
      >>> bool(same)  # nothing shrunk yet: no ridge to collect
      True
    """
    metric = _fd_metric(sketch_size, delta, robust=True, fast=fast, alpha_fraction=1.0)
    return mirror_descent(learning_rate, metric, regularizer)


@_leafwise.compiled
def scale_by_ada_fd(
    sketch_size: int = 10, delta: float = 0.1, *, robust: bool = True, fast: bool = False
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD's preconditioner alone: ``g_t -> H_t^{-1} g_t`` (chain with a learning rate).

    Defaults as :func:`ada_fd` (the paper's metric is ``robust=False``).

    Args:
      sketch_size, delta, robust, fast: as :func:`ada_fd`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` giving ``H_t^{-1} g_t``.

    References:
      Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via Frequent Directions",
      IJCAI, Alg. 2 (its preconditioner ``H_t^{-1}``).

    Examples:
      >>> import jax.numpy as jnp, optax, sketchopt as so
      >>> tx = optax.chain(so.scale_by_ada_fd(3, 1.0), optax.scale_by_learning_rate(0.5))
      >>> updates, state = tx.update(jnp.array([3.0, 4.0]), tx.init(jnp.zeros(2)))
      >>> updates.round(4)  # -0.5 g / (1 + |g|)
      Array([-0.25  , -0.3333], dtype=float32)
    """
    return scale_by_metric(_fd_metric(sketch_size, delta, robust, fast))


@_leafwise.compiled
def scale_by_ada_full(delta: float) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL's preconditioner alone: ``g_t -> (delta I + G_t^{1/2})^{-1} g_t``.

    Args:
      delta: ``delta > 0``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` giving ``H_t^{-1} g_t``.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 2 (full matrices), its ``H_t`` without the step.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.scale_by_ada_full(1.0)
      >>> grads = {"a": jnp.array([0.0, 2.0]), "b": jnp.array([4.0])}  # a metric per leaf
      >>> updates, state = tx.update(grads, tx.init(grads))
      >>> updates["a"].round(4), updates["b"]
      (Array([0.    , 0.6667], dtype=float32), Array([0.8], dtype=float32))
    """
    return scale_by_metric(_metrics.full(delta))


@_leafwise.compiled
def scale_by_ada_diag(delta: float = 1e-6) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG's preconditioner alone: ``g_t -> g_t / (delta + sqrt(sum_s g_s^2))``.

    Args:
      delta: ``delta >= 0``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` giving ``H_t^{-1} g_t``.

    References:
      Duchi, Hazan & Singer (2011), "Adaptive Subgradient Methods for Online Learning and
      Stochastic Optimization", JMLR 12, Alg. 1 (diagonal matrices), its ``H_t`` without the step.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.scale_by_ada_diag(1.0)
      >>> updates, state = tx.update(jnp.array([3.0, 4.0]), tx.init(jnp.zeros(2)))
      >>> updates  # g / (delta + |g_i|)
      Array([0.75, 0.8 ], dtype=float32)
    """
    return scale_by_metric(_metrics.diagonal(delta))


@_leafwise.compiled
def radagrad(learning_rate, sketch_size: int, delta: float, key):
    """RADAGRAD (Krummenacher et al. 2016; Ada-FD paper eq. 4) with a randomized DCT projection.

    ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T g_t - eta (g_t - V V^T g_t)`` where
    ``V Sigma W^T`` is the SVD of ``G~_t = sum_s g_s (Pi g_s)^T``. ``key`` draws ``Pi`` (each leaf
    uses the same key; ``vmap`` over keys is supported). Heuristic: no regret guarantee.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      sketch_size: ``tau >= 1``, the rows of the projection ``Pi``.
      delta: ``delta > 0``.
      key: the PRNG key of ``Pi``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (``params`` not needed).

    References:
      Krummenacher, Fung, Bayer, Huang & Roth (2016), "Scalable Adaptive Stochastic
      Optimization Using Random Projections", NeurIPS (RADAGRAD); Wan, Wei & Zhang (2018),
      "Efficient Adaptive Online Learning via Frequent Directions", IJCAI, eq. (4).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}
      >>> tx = so.radagrad(0.1, 2, 1e-3, jax.random.PRNGKey(0))
      >>> updates, state = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params))
      >>> jax.tree.map(jnp.shape, updates)
      {'b': (2,), 'w': (3, 2)}
    """
    return mirror_descent(learning_rate, _metrics.radagrad_metric(sketch_size, delta, key))


@_leafwise.compiled
def ada_lr(learning_rate, sketch_size: int, delta: float, key):
    """ADA-LR (Krummenacher et al. 2016; Ada-FD paper eq. 3) with a randomized DCT projection.

    Keeps the full ``G_t`` (``O(d^2)`` memory, ``O(tau d^2)`` per step): the randomized low-rank
    SVD of ``G_t`` gives ``V, Sigma`` and ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T
    g_t``. Without a regularizer only (see :func:`sketchopt.metrics.ada_lr_metric`).

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      sketch_size: ``tau >= 1``, the rank of the randomized SVD.
      delta: ``delta > 0``.
      key: the PRNG key of the projection.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (``params`` not needed).

    References:
      Krummenacher, Fung, Bayer, Huang & Roth (2016), "Scalable Adaptive Stochastic
      Optimization Using Random Projections", NeurIPS (ADA-LR); Wan, Wei & Zhang (2018),
      "Efficient Adaptive Online Learning via Frequent Directions", IJCAI, eq. (3).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> tx = so.ada_lr(1.0, 1, 1.0, jax.random.PRNGKey(0))
      >>> updates, state = tx.update(jnp.array([3.0, 4.0]), tx.init(jnp.zeros(2)))
      >>> updates.round(4)  # -g / (delta + |g|) on span(g), the rank-1 SVD of G_1
      Array([-0.5   , -0.6667], dtype=float32)
    """
    return mirror_descent(learning_rate, _metrics.ada_lr_metric(sketch_size, delta, key))


def inject_hyperparams(
    inner_factory: Callable[..., optax.GradientTransformation],
    static_args: str | tuple[str, ...] = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., optax.GradientTransformationExtraArgs]:
    """``optax.inject_hyperparams`` that treats Python ``int`` arguments as static.

    Sizes such as ``sketch_size`` fix array shapes and cannot be traced, so with plain
    ``optax.inject_hyperparams`` they must be listed in ``static_args``; this wrapper does that
    automatically for every argument given, or left at its default, as a Python ``int``
    (floats, arrays and schedules are injected as usual). The update rule is
    ``inner_factory``'s, with the injected hyperparameters read from ``state.hyperparams`` at
    every step (so they can be changed between steps).

    Args:
      inner_factory: a transform factory (``sketchopt.ada_fd``, ...).
      static_args: names of further arguments to keep static.
      hyperparam_dtype: the dtype of the injected hyperparameters (as in Optax).

    Returns:
      A factory with ``inner_factory``'s signature whose transforms keep the injected
      hyperparameters in ``state.hyperparams``.

    References:
      Optax documentation, ``optax.inject_hyperparams``.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.inject_hyperparams(so.ada_fd)(learning_rate=0.3, sketch_size=2, delta=1e-3)
      >>> state = tx.init(jnp.zeros(3))
      >>> sorted(state.hyperparams)  # sketch_size, an int, is static
      ['delta', 'learning_rate']
      >>> defaults = so.inject_hyperparams(so.kron_fd)(learning_rate=1e-3)
      >>> sorted(defaults.init({"w": jnp.zeros((3, 2))}).hyperparams)[:3]
      ['delta', 'graft_decay', 'graft_eps']
      >>> state.hyperparams["learning_rate"] = 0.6
      >>> updates, state = tx.update(jnp.array([1.0, 2.0, 2.0]), state)
      >>> updates.round(3)  # -0.6 g / (delta + 3)
      Array([-0.2, -0.4, -0.4], dtype=float32)
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)

    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()  # a size left at its default (``sketch_size=10``) is static too
        ints = {
            name
            for name, value in bound.arguments.items()
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        }
        factory = optax.inject_hyperparams(
            inner_factory, static_args=tuple(static | ints), hyperparam_dtype=hyperparam_dtype
        )
        return factory(*args, **kwargs)

    return wrapped
