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

Per-leaf semantics (the driver of ``sketchopt._leafwise``): every leaf of the parameter pytree is
flattened and gets its own metric (block-diagonal, Duchi et al. Cor. 14); wrap a transform in
``optax.flatten`` for one metric over all parameters. A leaf whose gradient holds NaN or Inf, or
whose step would give a non-finite update or state, is skipped: its state is left exactly as it
was, its update is zero, and ``nonfinite_count`` counts it. Metric states are at least float32;
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
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _validation
from sketchopt import metrics as _metrics
from sketchopt import sketches as _sketches

__all__ = [
    "DualAveragingState",
    "LeafGroups",
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
    "migrate_state",
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

LeafGroups = _leafwise.LeafGroups


class ScaleByMetricState(NamedTuple):
    """State of :func:`scale_by_metric`: ``metric_state`` holds one metric state per leaf,
    stacked by leaf shape (a :class:`~sketchopt._leafwise.LeafGroups`; :func:`per_leaf_states`
    gives them per leaf); ``nonfinite_count`` counts the skipped leaf updates."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class MirrorDescentState(NamedTuple):
    """State of :func:`mirror_descent`: ``metric_state`` holds one metric state per leaf, stacked
    by leaf shape (a :class:`~sketchopt._leafwise.LeafGroups`; :func:`per_leaf_states` gives them
    per leaf); ``nonfinite_count`` counts the skipped leaf updates."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class DualAveragingState(NamedTuple):
    """State of :func:`dual_averaging`: per leaf a metric state, the running gradient sum
    ``sum_{s<=t} g_s`` and the anchor ``x_1`` (the initial parameters, flattened), each stacked
    by leaf shape (:class:`~sketchopt._leafwise.LeafGroups`; see :func:`per_leaf_states`)."""

    count: jax.Array
    metric_state: Any
    grad_sum: Any
    anchor: Any
    nonfinite_count: jax.Array


# ----------------------------------------------------------------------------------------------
# Helpers.


def _check_learning_rate(learning_rate):
    return _validation.step_size("learning_rate", learning_rate)


def _learning_rate_at(learning_rate, count):
    return learning_rate(count) if callable(learning_rate) else learning_rate


def pack_leaf_states(treedef, states):
    """Per-leaf states -> one state structure whose leaves are parameter trees.

    ``states`` lists one state per leaf of ``treedef`` (all of the same structure). The result
    has that per-leaf structure with, in place of each array, a pytree of the parameters'
    structure (``state.rows["w"]``): the layout of ``sketchopt`` 0.1 states, and what
    :func:`per_leaf_states` and :func:`sketchopt.migrate_state` read. ``None`` when the
    parameters have no leaves.
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
    """A per-leaf state field as a tree like ``params`` of per-leaf states.

    For inspection: ``per_leaf_states(state.metric_state, params)["conv"]["kernel"]`` is that
    kernel's whole metric state (e.g. a ``FrequentDirectionsState``). ``packed`` is a field of a
    transform state (a :class:`~sketchopt._leafwise.LeafGroups`, which stacks the leaves of equal
    shape) or, for states saved by ``sketchopt`` 0.1, a :func:`pack_leaf_states` structure.
    ``params`` only gives the structure (arrays, ``ShapeDtypeStruct``\\ s or gradients all do).
    """
    treedef = jax.tree.structure(params)
    if isinstance(packed, _leafwise.LeafGroups):
        if packed.layout.num_leaves != treedef.num_leaves:
            raise ValueError(
                f"the state covers {packed.layout.num_leaves} leaves, params has "
                f"{treedef.num_leaves}"
            )
        return treedef.unflatten(_leafwise.per_leaf(packed))
    return treedef.unflatten(unpack_leaf_states(treedef, packed))


def migrate_state(restored, target):
    """A state saved by ``sketchopt`` 0.1, in the current layout (``CHANGELOG.md``, 0.2.0).

    0.1 kept every per-leaf field as a tree like the parameters; 0.2 stacks the leaves of equal
    shape (:class:`LeafGroups`), so an Orbax restore of a 0.1 checkpoint into a 0.2 target fails
    on the tree structure. Restore it without a target and convert it::

        raw = ocp.StandardCheckpointer().restore(path)             # nested dicts of arrays
        state = sketchopt.migrate_state(raw, tx.init(params))       # or jax.eval_shape(...)

    Args:
      restored: the 0.1 state, as nested dicts (an Orbax restore without a target) or as the
        0.1 state objects themselves.
      target: a state (or ``jax.eval_shape`` of one) of the same transform in the 0.2 layout;
        only its structure, shapes and dtypes are read.

    Returns:
      The state in the layout of ``target``, with the values of ``restored``; a run continued
      from it is the run continued from the 0.1 state.
    """
    return _leafwise.migrate(restored, target)


# ----------------------------------------------------------------------------------------------
# The rules.


def _metric_rule(metric, learning_rate, regularizer, *, scale_only=False):
    """The per-leaf rule of :func:`mirror_descent` (and of :func:`scale_by_metric`)."""

    def init(spec, param):
        del param
        return (metric.init(spec.shape, spec.dtype),)

    def step(ctx, g, values, x, valid):
        (ms,) = values
        ms, op, solved = metric.update(ms, g, valid)
        direction = _metrics.solve_new_gradient(op, g, solved)
        if scale_only:
            return direction, (ms,)
        eta = jnp.asarray(ctx.hyper, g.dtype)
        if regularizer is None:
            return -eta * direction, (ms,)
        # The prox at the unregularized point z = x_t - eta H^{-1} g_t in the H-norm: the same
        # problem as u = eta g_t - H x_t, but u would lose the part of x_t on the small
        # eigenvalues of H to rounding once cond(H) passes 1/eps. (No warm start: the solver's
        # own start, x = z, is closer than x_t.)
        z = x - eta * direction
        return regularizer.prox(None, eta, op, shape=ctx.shape, center=z) - x, (ms,)

    needs = None if (regularizer is None or scale_only) else "mirror_descent with a regularizer"
    return _leafwise.LeafRule(
        ("metric_state",),
        init,
        step,
        hyper=lambda count: _learning_rate_at(learning_rate, count),
        needs_params=needs,
    )


@_leafwise.compiled
def scale_by_metric(metric: _metrics.Metric) -> optax.GradientTransformationExtraArgs:
    """The preconditioner ``g_t -> H_t^{-1} g_t`` of a metric, leaf by leaf.

    The building block of the ``scale_by_*`` aliases, as ``optax.scale_by_rss`` is of
    ``optax.adagrad``: chain it with ``optax.scale_by_learning_rate``.
    """
    rule = _metric_rule(metric, None, None, scale_only=True)
    return _leafwise.leafwise(rule, ScaleByMetricState)


@_leafwise.compiled
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
    return _leafwise.leafwise(_metric_rule(metric, learning_rate, regularizer), MirrorDescentState)


@_leafwise.compiled
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

    def init(spec, param):
        anchor = jnp.ravel(param).astype(spec.dtype)
        return (metric.init(spec.shape, spec.dtype), jnp.zeros_like(anchor), anchor)

    def step(ctx, g, values, x, valid):
        ms, gsum, x1 = values
        ms, op, _ = metric.update(ms, g, valid)
        gsum = jnp.where(valid, gsum + g, gsum)
        eta = jnp.asarray(ctx.hyper, g.dtype)
        z = x1 - eta * op.solve(gsum)
        if regularizer is None:
            x_new = z
        else:  # the prox at z in the H-norm (see mirror_descent)
            c = eta * (ctx.count + 1).astype(g.dtype)
            x_new = regularizer.prox(None, c, op, shape=ctx.shape, center=z)
        return x_new - x, (ms, gsum, x1)

    rule = _leafwise.LeafRule(
        ("metric_state", "grad_sum", "anchor"),
        init,
        step,
        hyper=lambda count: _learning_rate_at(learning_rate, count),
        needs_params="dual_averaging",
    )
    return _leafwise.leafwise(rule, DualAveragingState)


# ----------------------------------------------------------------------------------------------
# Named aliases.


def _fd_sketch(sketch_size, robust, fast, alpha_fraction=0.5):
    if robust:
        return _sketches.robust_frequent_directions(
            sketch_size, fast=fast, alpha_fraction=alpha_fraction
        )
    return _sketches.frequent_directions(sketch_size, fast=fast)


@_leafwise.compiled
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


@_leafwise.compiled
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


@_leafwise.compiled
def ada_full(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + G^{1/2}``)."""
    return mirror_descent(learning_rate, _metrics.full(delta), regularizer)


@_leafwise.compiled
def ada_full_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL with primal-dual subgradient updates (Duchi et al. eq. 3)."""
    return dual_averaging(learning_rate, _metrics.full(delta), regularizer)


@_leafwise.compiled
def ada_diag(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with composite mirror descent (Duchi et al. eq. 4, ``H = delta I + diag(G)^{1/2}``).

    ``delta >= 0`` (``delta = 0`` with the safe ``0/0 = 0``).
    """
    return mirror_descent(learning_rate, _metrics.diagonal(delta), regularizer)


@_leafwise.compiled
def ada_diag_dual_averaging(
    learning_rate: ScalarOrSchedule, delta: float, *, regularizer: Any = None
) -> optax.GradientTransformationExtraArgs:
    """ADA-DIAG with primal-dual subgradient updates (Duchi et al. eq. 3)."""
    return dual_averaging(learning_rate, _metrics.diagonal(delta), regularizer)


@_leafwise.compiled
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


@_leafwise.compiled
def scale_by_ada_fd(
    sketch_size: int, delta: float, *, robust: bool = False, fast: bool = False
) -> optax.GradientTransformationExtraArgs:
    """ADA-FD's preconditioner alone: ``g_t -> H_t^{-1} g_t`` (chain with a learning rate)."""
    return scale_by_metric(_metrics.sketched(_fd_sketch(sketch_size, robust, fast), delta))


@_leafwise.compiled
def scale_by_ada_full(delta: float) -> optax.GradientTransformationExtraArgs:
    """ADA-FULL's preconditioner alone: ``g_t -> (delta I + G_t^{1/2})^{-1} g_t``."""
    return scale_by_metric(_metrics.full(delta))


@_leafwise.compiled
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
