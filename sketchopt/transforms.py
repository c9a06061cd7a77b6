r"""The update rules and the named aliases: ADA-FD, ADA-FULL, ADA-DIAG, S-AdaGrad.

Two rules (``DESIGN.md``, "The three axes"), each combinable with any metric of
:mod:`sketchopt.metrics` and any regularizer of :mod:`sketchopt.regularizers`:

* :func:`mirror_descent` -- composite mirror descent (Duchi et al. eq. 4; Ada-FD Alg. 2):
  ``x_{t+1} = argmin_x eta <g_t, x> + eta phi(x) + 1/2 <x - x_t, H_t (x - x_t)>``;
* :func:`dual_averaging` -- primal-dual subgradient / RDA (Duchi et al. eq. 3; Ada-FD Alg. 1),
  anchored at the initial parameters ``x_1`` (kept in the state; the papers take ``x_1 = 0``):
  ``x_{t+1} = argmin_x eta <sum_{s<=t} g_s, x> + eta t phi(x) + 1/2 <x - x_1, H_t (x - x_1)>``.

Both reduce to one proximal step ``argmin_x <u, x> + c phi(x) + 1/2 <x, H_t x>`` (Duchi et al.
sec. 6); without a regularizer they are ``x_t - eta H_t^{-1} g_t`` and ``x_1 - eta H_t^{-1}
sum_s g_s``. Every transform returns the *delta* to add to the parameters (Optax semantics).

Per-leaf semantics: every leaf of the parameter pytree is flattened and gets its own metric
(block-diagonal, Duchi et al. Cor. 14); wrap a transform in ``optax.flatten`` for one metric over
all parameters. A leaf whose gradient holds NaN or Inf is skipped: its state is left exactly as
it was, its update is zero, and ``nonfinite_count`` counts it. Metric states are at least float32;
updates come back in each parameter's dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sketchopt import metrics as _metrics
from sketchopt import sketches as _sketches

__all__ = [
    "DualAveragingState",
    "MirrorDescentState",
    "ScaleByMetricState",
    "ada_diag",
    "ada_diag_dual_averaging",
    "ada_fd",
    "ada_fd_dual_averaging",
    "ada_full",
    "ada_full_dual_averaging",
    "dual_averaging",
    "inject_hyperparams",
    "mirror_descent",
    "pack_leaf_states",
    "per_leaf_states",
    "s_adagrad",
    "scale_by_ada_diag",
    "scale_by_ada_fd",
    "scale_by_ada_full",
    "scale_by_metric",
    "unpack_leaf_states",
]

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


class ScaleByMetricState(NamedTuple):
    """State of :func:`scale_by_metric`: one metric state per leaf, packed (see
    :func:`pack_leaf_states`: ``metric_state.sketch.rows["w"]`` is leaf ``w``'s sketch)."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class MirrorDescentState(NamedTuple):
    """State of :func:`mirror_descent`: one metric state per leaf, packed (see
    :func:`pack_leaf_states`: ``metric_state.sketch.rows["w"]`` is leaf ``w``'s sketch)."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class DualAveragingState(NamedTuple):
    """State of :func:`dual_averaging`: per leaf a metric state (packed, see
    :func:`pack_leaf_states`), the running gradient sum ``sum_{s<=t} g_s`` and the anchor ``x_1``
    (the initial parameters), both flattened per leaf."""

    count: jax.Array
    metric_state: Any
    grad_sum: Any
    anchor: Any
    nonfinite_count: jax.Array


# ----------------------------------------------------------------------------------------------
# Helpers.


def _check_learning_rate(learning_rate):
    if callable(learning_rate):
        return learning_rate
    if _metrics._is_concrete(learning_rate):
        value = float(learning_rate)
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"learning_rate must be a finite number >= 0, got {value}")
    return learning_rate


def _learning_rate_at(learning_rate, count):
    return learning_rate(count) if callable(learning_rate) else learning_rate


def _leaf_dtype(leaf):
    return _metrics.state_dtype(jnp.asarray(leaf).dtype)


def _check_gradient_leaf(g):
    if not jnp.issubdtype(jnp.asarray(g).dtype, jnp.inexact):
        raise TypeError(
            f"gradients must be floating point arrays, got dtype {jnp.asarray(g).dtype}; "
            "integer parameters cannot be trained by gradient transformations"
        )


def _metric_init(metric, params):
    leaves, treedef = jax.tree.flatten(params)
    return pack_leaf_states(treedef, [metric.init(jnp.size(p), _leaf_dtype(p)) for p in leaves])


def pack_leaf_states(treedef, states):
    """Per-leaf states -> the Optax layout: one state structure whose leaves are parameter trees.

    ``states`` lists one state per leaf of ``treedef`` (all of the same structure). The result
    has that per-leaf structure with, in place of each array, a pytree of the parameters'
    structure -- as ``optax.ScaleByAdamState.mu`` is -- so ``state.metric_state.sketch.rows``
    is a tree like the params. This is what Flax's ``nnx.Optimizer`` (which wraps the
    parameter-structured parts of a state in variables) and :mod:`sketchopt.sharding` rely on.
    ``None`` when the parameters have no leaves.
    """
    if not states:
        return None
    return jax.tree.transpose(treedef, jax.tree.structure(states[0]), treedef.unflatten(states))


def unpack_leaf_states(treedef, packed):
    """The inverse of :func:`pack_leaf_states`: the list of per-leaf states."""
    if treedef.num_leaves == 0:
        return []
    inner = jax.tree.structure(packed, is_leaf=lambda n: jax.tree.structure(n) == treedef)
    return treedef.flatten_up_to(jax.tree.transpose(inner, treedef, packed))


def per_leaf_states(packed, params):
    """A packed state (:func:`pack_leaf_states`) as a tree like ``params`` of per-leaf states.

    For inspection: ``per_leaf_states(state.metric_state, params)["conv"]["kernel"]`` is that
    kernel's whole metric state (e.g. a ``FrequentDirectionsState``). ``params`` only gives the
    structure (arrays, ``ShapeDtypeStruct``\\ s or gradients all do).
    """
    treedef = jax.tree.structure(params)
    return treedef.unflatten(unpack_leaf_states(treedef, packed))


def _map_leaves(fn, updates, leaf_states, *trees, num_outs=1):
    """Apply ``fn(g, state, *leaves) -> (update, state, *outs)`` (``num_outs`` outs) leaf by leaf.

    ``leaf_states`` are packed per-leaf states (:func:`pack_leaf_states`), handed to ``fn`` one
    leaf at a time and packed again on the way out. Each of ``trees`` has the structure of
    ``updates`` or is ``None`` (then ``fn`` receives ``None`` for it). Returns the updates, the
    packed states and one tree per further output.
    """
    flat_updates, treedef = jax.tree.flatten(updates)
    flat_trees = [unpack_leaf_states(treedef, leaf_states)] + [
        [None] * len(flat_updates) if tree is None else treedef.flatten_up_to(tree)
        for tree in trees
    ]
    outs = [fn(g, *args) for g, *args in zip(flat_updates, *flat_trees, strict=True)]
    if not outs:  # no leaves at all
        return (treedef.unflatten([]), leaf_states) + (treedef.unflatten([]),) * num_outs
    columns = [list(col) for col in zip(*outs, strict=True)]
    return (
        treedef.unflatten(columns[0]),
        pack_leaf_states(treedef, columns[1]),
        *(treedef.unflatten(col) for col in columns[2:]),
    )


def _sanitize(g):
    """``(g with non-finite leaves zeroed, finite flag)``.

    A non-finite leaf is then processed as a zero gradient with ``valid=False``, for which every
    metric returns its state bit-identical, and its update is masked to zero. Selection instead
    of ``lax.cond`` keeps XLA from copying large states (under ``vmap`` a ``cond`` would be a
    select anyway).
    """
    finite = jnp.all(jnp.isfinite(g))
    return jnp.where(finite, g, 0), finite


def _count_skipped(finite_flags):
    skipped = [(~f).astype(jnp.int32) for f in jax.tree.leaves(finite_flags)]
    return sum(skipped, jnp.zeros((), jnp.int32))


def _require_params(params, name):
    if params is None:
        raise ValueError(f"{name} needs the current parameters: call update(grads, state, params)")


def _flat(x, dtype):
    return jnp.ravel(x).astype(dtype)


# ----------------------------------------------------------------------------------------------
# The preconditioner alone.


def scale_by_metric(metric: _metrics.Metric) -> optax.GradientTransformationExtraArgs:
    """The preconditioner ``g_t -> H_t^{-1} g_t`` of a metric, leaf by leaf.

    The building block of the ``scale_by_*`` aliases, as ``optax.scale_by_rss`` is of
    ``optax.adagrad``: chain it with ``optax.scale_by_learning_rate``.
    """

    def init_fn(params):
        return ScaleByMetricState(
            jnp.zeros((), jnp.int32), _metric_init(metric, params), jnp.zeros((), jnp.int32)
        )

    def update_fn(updates, state, params=None):
        del params

        def leaf(g, ms):
            _check_gradient_leaf(g)
            gf, finite = _sanitize(_flat(g, ms_dtype(ms)))
            ms, op, solved = metric.update(ms, gf, finite)
            u = jnp.where(finite, _metrics.solve_new_gradient(op, gf, solved), 0)
            return u.reshape(jnp.shape(g)).astype(jnp.asarray(g).dtype), ms, finite

        new_updates, ms, finite = _map_leaves(leaf, updates, state.metric_state)
        return new_updates, ScaleByMetricState(
            optax.safe_increment(state.count), ms, state.nonfinite_count + _count_skipped(finite)
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def ms_dtype(metric_state):
    """The floating dtype a metric state works in (that of its first floating leaf)."""
    for leaf in jax.tree.leaves(metric_state):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return jnp.float32


# ----------------------------------------------------------------------------------------------
# The rules.


def mirror_descent(
    learning_rate: ScalarOrSchedule,
    metric: _metrics.Metric,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """Composite mirror descent with an adaptive metric (Duchi et al. eq. 4; Ada-FD Alg. 2).

    ``x_{t+1} = argmin_x eta_t <g_t, x> + eta_t phi(x) + 1/2 <x - x_t, H_t (x - x_t)>`` where
    ``H_t`` already includes ``g_t``. Without a regularizer this is ``-eta_t H_t^{-1} g_t`` and
    ``params`` are not needed; with one, ``update`` needs ``params`` (``ValueError`` otherwise)
    and the step is the regularizer's proximal map ``argmin <u, x> + c phi(x) + 1/2 <x, H x>`` with
    ``u = eta_t g_t - H_t x_t`` and ``c = eta_t``, solved in the equivalent center form
    ``argmin c phi(x) + 1/2 ||x - z||_H^2`` at ``z = x_t - eta_t H_t^{-1} g_t`` (``u = -H z``
    is never formed: it would lose ``x_t`` off the sketch to rounding when ``cond(H_t)`` is
    beyond ``1/eps``).

    Args:
      learning_rate: ``eta``, a float or an Optax schedule of the step count (from 0).
      metric: a :class:`sketchopt.metrics.Metric` (``diagonal``, ``full``, ``sketched``).
      regularizer: ``None`` or a regularizer of :mod:`sketchopt.regularizers`.
    """
    learning_rate = _check_learning_rate(learning_rate)

    def init_fn(params):
        return MirrorDescentState(
            jnp.zeros((), jnp.int32), _metric_init(metric, params), jnp.zeros((), jnp.int32)
        )

    def update_fn(updates, state, params=None):
        if regularizer is not None:
            _require_params(params, "mirror_descent with a regularizer")
        eta = _learning_rate_at(learning_rate, state.count)

        def leaf(g, ms, x):
            _check_gradient_leaf(g)
            dtype = ms_dtype(ms)
            gf, finite = _sanitize(_flat(g, dtype))
            ms, op, solved = metric.update(ms, gf, finite)
            if regularizer is None:
                delta = -eta * _metrics.solve_new_gradient(op, gf, solved)
            else:
                # The prox at the unregularized point z = x_t - eta H^{-1} g_t in the H-norm:
                # the same problem as u = eta g_t - H x_t, but u would lose the part of x_t on
                # the small eigenvalues of H to rounding once cond(H) passes 1/eps. (No warm
                # start: the solver's own start, x = z, is closer than x_t.)
                xf = _flat(x, dtype)
                z = xf - eta * _metrics.solve_new_gradient(op, gf, solved)
                x_new = regularizer.prox(None, eta, op, shape=jnp.shape(g), center=z)
                delta = x_new - xf
            delta = jnp.where(finite, delta, 0)
            return delta.reshape(jnp.shape(g)).astype(jnp.asarray(g).dtype), ms, finite

        new_updates, ms, finite = _map_leaves(leaf, updates, state.metric_state, params)
        return new_updates, MirrorDescentState(
            optax.safe_increment(state.count), ms, state.nonfinite_count + _count_skipped(finite)
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def dual_averaging(
    learning_rate: ScalarOrSchedule,
    metric: _metrics.Metric,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """Adaptive primal-dual subgradient / dual averaging (Duchi et al. eq. 3; Ada-FD Alg. 1).

    ``x_{t+1} = argmin_x eta_t <sum_{s<=t} g_s, x> + eta_t t phi(x) + 1/2 <x - x_1, H_t (x - x_1)>``
    anchored at the initial parameters ``x_1`` (stored by ``init``; the papers use ``x_1 = 0``).
    Without a regularizer ``x_{t+1} = x_1 - eta_t H_t^{-1} sum_s g_s`` (Ada-FD eq. 6). The rule is
    defined by its running sums, so ``update`` needs ``params`` to return the delta
    ``x_{t+1} - x_t`` (``ValueError`` when it is missing). ``t`` is the step count; a leaf whose
    gradient was skipped as non-finite keeps its sum unchanged. With a regularizer the step is
    the prox ``argmin eta_t t phi(x) + 1/2 ||x - z||_H^2`` at
    ``z = x_1 - eta_t H_t^{-1} sum_s g_s``.
    """
    learning_rate = _check_learning_rate(learning_rate)

    def init_fn(params):
        anchor = jax.tree.map(lambda p: _flat(p, _leaf_dtype(p)), params)
        return DualAveragingState(
            count=jnp.zeros((), jnp.int32),
            metric_state=_metric_init(metric, params),
            grad_sum=jax.tree.map(jnp.zeros_like, anchor),
            anchor=anchor,
            nonfinite_count=jnp.zeros((), jnp.int32),
        )

    def update_fn(updates, state, params=None):
        _require_params(params, "dual_averaging")
        t = optax.safe_increment(state.count)
        eta = _learning_rate_at(learning_rate, state.count)

        def leaf(g, ms, gsum, x1, x):
            _check_gradient_leaf(g)
            dtype = gsum.dtype
            gf, finite = _sanitize(_flat(g, dtype))
            xf = _flat(x, dtype)
            ms, op, _ = metric.update(ms, gf, finite)
            gsum = gsum + gf  # exact no-op for a skipped (zeroed) leaf
            if regularizer is None:
                x_new = x1 - eta * op.solve(gsum)
            else:
                # The prox at z = x_1 - eta H^{-1} sum_s g_s in the H-norm (see mirror_descent).
                z = x1 - eta * op.solve(gsum)
                c = eta * t.astype(dtype)
                x_new = regularizer.prox(None, c, op, shape=jnp.shape(g), center=z)
            delta = jnp.where(finite, x_new - xf, 0)
            out = delta.reshape(jnp.shape(g)).astype(jnp.asarray(g).dtype)
            return out, ms, gsum, finite

        new_updates, ms, gsum, finite = _map_leaves(
            leaf, updates, state.metric_state, state.grad_sum, state.anchor, params, num_outs=2
        )
        return new_updates, DualAveragingState(
            count=t,
            metric_state=ms,
            grad_sum=gsum,
            anchor=state.anchor,
            nonfinite_count=state.nonfinite_count + _count_skipped(finite),
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# ----------------------------------------------------------------------------------------------
# Named aliases.


def _fd_sketch(sketch_size, robust, fast, alpha_fraction=0.5):
    if robust:
        return _sketches.robust_frequent_directions(
            sketch_size, fast=fast, alpha_fraction=alpha_fraction
        )
    return _sketches.frequent_directions(sketch_size, fast=fast)


def ada_fd(
    learning_rate: ScalarOrSchedule,
    sketch_size: int,
    delta: float,
    *,
    robust: bool = False,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD with composite mirror descent: Ada-FD paper Alg. 2, eq. (7).

    ``x_{t+1} = x_t - (eta/delta) (g_t - V (delta I + S')^{-1} S' V^T g_t)`` where the
    frequent-directions sketch (``sketch_size = tau`` rows including the slot for ``g_t``) already
    includes ``g_t``; i.e. ``x_{t+1} = x_t - eta H_t^{-1} g_t`` with ``H_t = delta I + C_t^{1/2}``.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      sketch_size: ``tau >= 1``; with ``tau > d`` ADA-FD equals ADA-FULL.
      delta: ``delta > 0``.
      robust: sketch with RFD, ``C_t = B^T B + alpha_t I`` (RFD paper Alg. 2).
      fast: use the doubling buffer (RFD paper Alg. 4/5), rotating once every ``tau`` rows.
      regularizer: ``None`` or a composite term of :mod:`sketchopt.regularizers`.
    """
    sketch = _fd_sketch(sketch_size, robust, fast)
    return mirror_descent(learning_rate, _metrics.sketched(sketch, delta), regularizer)


def ada_fd_dual_averaging(
    learning_rate: ScalarOrSchedule,
    sketch_size: int,
    delta: float,
    *,
    robust: bool = False,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD with dual averaging: Ada-FD paper Alg. 1, eq. (6).

    ``x_{t+1} = x_1 - (eta/delta) (gbar_t - V (delta I + S')^{-1} S' V^T gbar_t)`` with
    ``gbar_t = sum_{s<=t} g_s``; arguments as :func:`ada_fd`.
    """
    sketch = _fd_sketch(sketch_size, robust, fast)
    return dual_averaging(learning_rate, _metrics.sketched(sketch, delta), regularizer)


def ada_full(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + G^{1/2}``)."""
    return mirror_descent(learning_rate, _metrics.full(delta), regularizer)


def ada_full_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with primal-dual subgradient updates (Duchi et al. eq. 3)."""
    return dual_averaging(learning_rate, _metrics.full(delta), regularizer)


def ada_diag(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + diag(G)^{1/2}``).

    ``delta >= 0`` (``delta = 0`` with the safe ``0/0 = 0``).
    """
    return mirror_descent(learning_rate, _metrics.diagonal(delta), regularizer)


def ada_diag_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with primal-dual subgradient updates (Duchi et al. eq. 3)."""
    return dual_averaging(learning_rate, _metrics.diagonal(delta), regularizer)


def s_adagrad(
    learning_rate: ScalarOrSchedule,
    sketch_size: int,
    delta: float,
    *,
    fast: bool = False,
    regularizer: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """S-AdaGrad (Feinberg et al. 2023, "Sketchy"): robust ADA-FD whose ridge collects the whole
    shrinkage (the "escaped mass"), not half of it: ``C_t = B^T B + (sum of shrinkage) I``."""
    sketch = _fd_sketch(sketch_size, True, fast, alpha_fraction=1.0)
    return mirror_descent(learning_rate, _metrics.sketched(sketch, delta), regularizer)


def scale_by_ada_fd(
    sketch_size: int, delta: float, *, robust: bool = False, fast: bool = False
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD's preconditioner alone: ``g_t -> H_t^{-1} g_t`` (chain with a learning rate)."""
    return scale_by_metric(_metrics.sketched(_fd_sketch(sketch_size, robust, fast), delta))


def scale_by_ada_full(delta: float) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL's preconditioner alone: ``g_t -> (delta I + G_t^{1/2})^{-1} g_t``."""
    return scale_by_metric(_metrics.full(delta))


def scale_by_ada_diag(delta: float) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG's preconditioner alone: ``g_t -> g_t / (delta + sqrt(sum_s g_s^2))``."""
    return scale_by_metric(_metrics.diagonal(delta))


def inject_hyperparams(
    inner_factory: Callable[..., optax.GradientTransformation],
    static_args: str | tuple[str, ...] = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., optax.GradientTransformationExtraArgs]:
    """``optax.inject_hyperparams`` that treats Python ``int`` arguments as static.

    Sizes such as ``sketch_size`` fix array shapes and cannot be traced, so with plain
    ``optax.inject_hyperparams`` they must be listed in ``static_args``; this wrapper does that
    automatically for every argument given as a Python ``int`` (floats, arrays and schedules are
    injected as usual)::

        tx = sketchopt.inject_hyperparams(sketchopt.ada_fd)(learning_rate=0.1, sketch_size=10,
                                                            delta=1e-3)
        state.hyperparams["learning_rate"] = 0.05
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)

    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
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
