r"""The update rules: the second axis of metric x rule x regularizer.

Two rules (``docs/design.md``, "The three axes"), each combinable with any metric of
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

The named algorithms built on these rules (ADA-FD, ADA-FULL, ADA-DIAG, ...) are in
:mod:`sketchopt.aliases`. (Rules and aliases were one module, ``sketchopt.transforms``, which
re-exports both: see ``CHANGELOG.md``.)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _numerics, _validation
from sketchopt import metrics as _metrics
from sketchopt import operators as _operators

__all__ = [
    "DualAveragingState",
    "LeafGroups",
    "MirrorDescentState",
    "ScaleByMetricState",
    "dual_averaging",
    "migrate_state",
    "mirror_descent",
    "pack_leaf_states",
    "per_leaf_states",
    "scale_by_metric",
    "unpack_leaf_states",
]

LeafGroups = _leafwise.LeafGroups


class ScaleByMetricState(NamedTuple):
    """State of :func:`scale_by_metric`: ``metric_state`` holds one metric state per leaf,
    stacked by leaf shape (a :class:`~sketchopt._leafwise.LeafGroups`; :func:`per_leaf_states`
    gives them per leaf) -- or, for the diagonal metric, its state with a tree like the
    parameters per array (``metric_state.rss["w"]``); ``nonfinite_count`` counts the skipped
    leaf updates."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class MirrorDescentState(NamedTuple):
    """State of :func:`mirror_descent`: ``metric_state`` holds one metric state per leaf, stacked
    by leaf shape (a :class:`~sketchopt._leafwise.LeafGroups`; :func:`per_leaf_states` gives them
    per leaf) -- or, for the diagonal metric, its state with a tree like the parameters per
    array; ``nonfinite_count`` counts the skipped leaf updates."""

    count: jax.Array
    metric_state: Any
    nonfinite_count: jax.Array


class DualAveragingState(NamedTuple):
    """State of :func:`dual_averaging`: the metric states (as in :class:`MirrorDescentState`),
    the running gradient sum ``sum_{s<=t} g_s`` and the anchor ``x_1`` (the initial parameters),
    the last two trees like the parameters (``optax.tree.map_params`` maps them)."""

    count: jax.Array
    metric_state: Any
    grad_sum: Any
    anchor: Any
    nonfinite_count: jax.Array


# ----------------------------------------------------------------------------------------------
# Helpers.


def _check_learning_rate(learning_rate):
    return _validation.step_size("learning_rate", learning_rate)


def _operator_kind(metric):
    """``(name of the operator type, whether the regularizers accept it)`` of a metric, read by
    tracing its operator on a one-coordinate leaf (no computation)."""
    found = []

    def probe():  # read inside the trace: eval_shape's output would turn static fields abstract
        op = metric.operator(metric.init((1,), jnp.float32))
        found.append((type(op).__name__, _operators.supports_regularizers(op)))

    jax.eval_shape(probe)
    return found[0]


# Transforms are rebuilt at every step under ``optax.inject_hyperparams``: the trace above costs
# milliseconds, so it runs once per metric spec. (Metrics without a spec, e.g. with traced
# arguments, are traced each time rather than kept alive here.)
_cached_operator_kind = functools.lru_cache(maxsize=256)(_operator_kind)


def _check_regularizable(metric, regularizer):
    """A regularizer needs a diagonal or low-rank ``H`` (``sketchopt.operators``): say so now,
    when the transform is built, rather than with a ``TypeError`` from inside the first traced
    update's proximal step (a metric whose operator only solves: ADA-LR)."""
    if regularizer is None:
        return
    kind = _cached_operator_kind if metric.spec is not None else _operator_kind
    name, supported = kind(metric)
    if not supported:
        raise TypeError(
            f"the {metric.name!r} metric gives a {name}, which the regularizers "
            "cannot use: their proximal steps need a DiagonalOperator or a LowRankOperator in "
            "true units (value_exp the static 0; sketchopt.operators); use this metric without "
            "a regularizer"
        )


def pack_leaf_states(treedef, states):
    """Per-leaf states -> one state structure whose leaves are parameter trees.

    ``states`` lists one state per leaf of ``treedef`` (all of the same structure). The result
    has that per-leaf structure with, in place of each array, a pytree of the parameters'
    structure (``state.rows["w"]``): the layout of ``sketchopt`` 0.1 states, and what
    :func:`per_leaf_states` and :func:`sketchopt.migrate_state` read.

    Args:
      treedef: the parameters' tree structure.
      states: one state per leaf of ``treedef``, all of the same structure.

    Returns:
      The packed structure, or ``None`` when the parameters have no leaves.

    References:
      None: a state-layout helper of this package (``CHANGELOG.md``, 0.2.0).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt
      >>> from sketchopt.metrics import DiagonalMetricState
      >>> treedef = jax.tree.structure({"b": 0, "w": 0})
      >>> states = [DiagonalMetricState(jnp.zeros(2)), DiagonalMetricState(jnp.ones(1))]
      >>> sketchopt.pack_leaf_states(treedef, states).rss["w"]
      Array([1.], dtype=float32)
    """
    if not states:
        return None
    return _leafwise.pack_leaves(treedef, states)


def unpack_leaf_states(treedef, packed):
    """The inverse of :func:`pack_leaf_states`: the list of per-leaf states.

    Args:
      treedef: the parameters' tree structure.
      packed: a structure built by :func:`pack_leaf_states` for ``treedef``.

    Returns:
      One state per leaf of ``treedef``, in its leaf order.

    References:
      None: a state-layout helper of this package (``CHANGELOG.md``, 0.2.0).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt
      >>> from sketchopt.metrics import DiagonalMetricState
      >>> treedef = jax.tree.structure({"b": 0, "w": 0})
      >>> packed = DiagonalMetricState({"b": jnp.zeros(2), "w": jnp.ones(1)})
      >>> [s.rss.shape for s in sketchopt.unpack_leaf_states(treedef, packed)]
      [(2,), (1,)]
    """
    return _leafwise.unpack_leaves(treedef, packed)


def per_leaf_states(packed, params):
    """A per-leaf state field as a tree like ``params`` of per-leaf states.

    For inspection: ``per_leaf_states(state.metric_state, params)["conv"]["kernel"]`` is that
    kernel's whole metric state (e.g. a ``FrequentDirectionsState``). ``packed`` is a field of a
    transform state (a :class:`~sketchopt._leafwise.LeafGroups`, which stacks the leaves of equal
    shape) or, for states saved by ``sketchopt`` 0.1, a :func:`pack_leaf_states` structure.
    ``params`` only gives the structure (arrays, ``ShapeDtypeStruct``\\ s or gradients all do).

    Args:
      packed: a per-leaf field of a transform's state.
      params: the parameters (or anything with their tree structure).

    Returns:
      A tree like ``params`` whose leaves are the per-leaf states.

    References:
      None: a state-layout helper of this package (``CHANGELOG.md``, 0.2.0).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((2, 3))}
      >>> state = sketchopt.ada_fd(0.1, 2, 1e-3).init(params)
      >>> sketchopt.per_leaf_states(state.metric_state, params)["w"].rows.shape  # 2 x d rows
      (2, 6)
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
    """A state saved by an earlier ``sketchopt`` (0.1 to 0.9), in the current layout.

    0.1 kept every per-leaf field as a tree like the parameters (flattened leaves); 0.2 to 0.9
    stacked every per-leaf field by leaf shape (:class:`LeafGroups`); 0.10 keeps the
    parameter-shaped fields (diagonal accumulators, dual averaging's sum and anchor, FTRL's and
    RDA's accumulators) as trees like the parameters and stacks the rest (``CHANGELOG.md``).
    An Orbax restore of an older checkpoint into a current target fails on the tree structure.
    Restore it without a target and convert it::

        raw = ocp.StandardCheckpointer().restore(path)             # nested dicts of arrays
        state = sketchopt.migrate_state(raw, tx.init(params))       # or jax.eval_shape(...)

    Args:
      restored: the saved state, as nested dicts (an Orbax restore without a target) or as the
        old state objects themselves.
      target: a state (or ``jax.eval_shape`` of one) of the same transform in the current
        layout; only its structure, shapes and dtypes are read.

    Returns:
      The state in the layout of ``target``, with the values of ``restored``; a run continued
      from it is the run continued from the saved state.

    Raises:
      ValueError: a 0.2-0.9 field of a state of parameter-shaped fields only (ADA-DIAG)
        whose groups do not match the ones this state's parameters make (leaves of one shape
        but different dtypes); the message says how to migrate.

    References:
      None: a state-layout helper of this package (``CHANGELOG.md``, 0.2.0).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> from sketchopt.metrics import DiagonalMetricState
      >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((2, 3))}
      >>> state = sketchopt.ada_diag(0.1, 1e-3).init(params)
      >>> rss = {"b": jnp.ones(2), "w": jnp.ones(6)}  # 0.1's layout: a tree per field
      >>> old = state._replace(metric_state=DiagonalMetricState(rss))
      >>> new = sketchopt.migrate_state(old, state)
      >>> new.metric_state.rss["w"]  # a tree like the parameters, in their shapes
      Array([[1., 1., 1.],
             [1., 1., 1.]], dtype=float32)
    """
    return _leafwise.migrate(restored, target)


# ----------------------------------------------------------------------------------------------
# The rules.


def metric_rule(
    metric: _metrics.Metric,
    learning_rate: ScalarOrSchedule | None,
    regularizer: Any = None,
    *,
    scale_only: bool = False,
    field: str = "metric_state",
) -> _leafwise.LeafRule:
    """The per-leaf rule of :func:`mirror_descent` (and, with ``scale_only``, of
    :func:`scale_by_metric`), for the driver of ``sketchopt._leafwise``.

    Transforms that keep a state class of their own build on it: the SON family is this rule
    with ``learning_rate = 1`` and its Newton metric, stored under ``field = "leaf_state"`` of
    :class:`sketchopt.son.SONState`.

    Args:
      metric: a :class:`sketchopt.metrics.Metric`.
      learning_rate: ``eta_t``, a float or an Optax schedule (``None`` with ``scale_only``).
      regularizer: ``None`` or a regularizer of :mod:`sketchopt.regularizers`.
      scale_only: return ``H_t^{-1} g_t`` itself (a preconditioner, no step).
      field: the name of the state field that holds the per-leaf metric states.

    Returns:
      A ``sketchopt._leafwise.LeafRule``; ``sketchopt._leafwise.leafwise(rule, state_class)``
      makes it a transform.
    """

    def init(spec, param):
        del param
        return (init_metric(metric, spec),)

    def hyper(count):
        metric_hyper = None if metric.hyper is None else metric.hyper(count)
        return _leafwise.at_step(learning_rate, count), metric_hyper

    def step(ctx, g, values, x, valid):
        (ms,) = values
        eta, metric_hyper = ctx.hyper
        if metric.accepts is None:
            return move(ctx, g, ms, x, valid, eta, metric_hyper)
        # A refused g is skipped like a non-finite one: the driver reads the third result.
        valid = valid & metric.accepts(ms, g, metric_hyper)
        g = jnp.where(valid, g, jnp.zeros((), g.dtype))
        return (*move(ctx, g, ms, x, valid, eta, metric_hyper), valid)

    def move(ctx, g, ms, x, valid, eta, metric_hyper):
        if metric.hyper is None:
            ms, op, solved = metric.update(ms, g, valid)
        else:
            ms, op, solved = metric.update(ms, g, valid, hyper=metric_hyper, **_phase(metric, ctx))
        direction = _metrics.solve_new_gradient(op, g, solved)
        if scale_only:
            return direction, (ms,)
        eta = jnp.asarray(eta, _numerics.real_dtype(g.dtype))  # real, also for complex g
        if regularizer is None:
            return -eta * direction, (ms,)
        # The prox at the unregularized point z = x_t - eta H^{-1} g_t in the H-norm: the same
        # problem as u = eta g_t - H x_t, but u would lose the part of x_t on the small
        # eigenvalues of H to rounding once cond(H) passes 1/eps. (No warm start: the solver's
        # own start, x = z, is closer than x_t.)
        z = x - eta * direction
        return regularizer.prox(None, eta, op, shape=ctx.shape, center=z) - x, (ms,)

    needs = None if (regularizer is None or scale_only) else "mirror_descent with a regularizer"
    plain = regularizer is None or scale_only
    bound = None
    if metric.unit_step and metric.accepts is None and plain:  # |H^{-1} g| <= 1 entrywise

        def bound(hyper):
            return jnp.ones(()) if scale_only else jnp.abs(hyper[0])

    return _leafwise.LeafRule(
        (field,),
        init,
        step,
        hyper=hyper,
        needs_params=needs,
        paddable=metric.paddable and regularizer is None,  # a prox may read the leaf's shape
        group_key=metric.path_key,
        param_fields=(field,) if metric.param_shaped else (),
        coordinatewise=metric.coordinatewise and plain,
        update_bound=bound,
        phases=metric.phases,
        shaped=metric.shaped and regularizer is None,  # a prox takes the flat vector
    )


def momentum_rule(
    rule: _leafwise.LeafRule, beta, nesterov: bool, field: str = "momentum"
) -> _leafwise.LeafRule:
    """``rule`` with its steps averaged by momentum, one buffer per parameter in the state field
    ``field`` (a tree like the parameters, in their state dtype: at least float32), so that a
    step ``u`` repeated every round is taken at its own size and a method's learning rate
    carries over:

    * ``nesterov``: ``m'_t = beta m'_{t-1} + u_t``, the step ``(1 - beta) (u_t + beta m'_t)``
      (``optax.trace(beta, nesterov=True)`` scaled by ``1 - beta``: Nesterov's accelerated
      gradient as Optax writes it; Sutskever, Martens, Dahl & Hinton 2013) divided by the sum
      of its weights on the steps so far, ``1 - beta^(t+2)`` with ``t`` the transform's count
      from 0 (the debiasing of Adam's first moment, Kingma & Ba 2015 Alg. 1), so that the first
      steps are not ``1 - beta^2`` of their size;
    * otherwise ``m_t = beta m_{t-1} + (1 - beta) u_t``, the step ``m_t / (1 - beta^(t+1))``
      (``optax.ema(beta, debias=True)``, Adam's first moment; ``t`` the transform's count).

    A stage of the driver (``sketchopt._leafwise.LeafTail``), unlike an ``optax.chain`` after
    the transform: a leaf skipped as non-finite or refused keeps its buffer bit for bit and
    steps zero (``sketchopt._leafwise``, "Bad input"), and the buffer is float32 under bfloat16
    parameters; it runs on each leaf in the leaf's own layout, one fused pass with the update.
    """

    def step(ctx, u, m, skipped):
        b = jnp.asarray(beta, m.dtype)
        if nesterov:
            m_new = b * m + u
            u = (1 - b) * (u + b * m_new) / (1 - b ** (ctx.count + 2).astype(m.dtype))
        else:
            m_new = b * m + (1 - b) * u
            u = m_new / (1 - b ** (ctx.count + 1).astype(m.dtype))
        return jnp.where(skipped, jnp.zeros((), u.dtype), u), jnp.where(skipped, m, m_new)

    return rule._replace(tail=_leafwise.LeafTail(field, step))


def _phase(metric: _metrics.Metric, ctx: _leafwise.LeafContext) -> dict:
    """The keyword that passes the update's branch to a metric with phases (``Metric.phases``)."""
    return {} if metric.phases is None else {"phase": ctx.phase}


def init_metric(metric: _metrics.Metric, spec: _leafwise.LeafSpec):
    """A metric's state for one leaf: ``init(shape, dtype)``, with the leaf's index for a seeded
    metric and its path for a path-aware one (``Metric.seeded``, ``Metric.path_key``)."""
    extra = {} if metric.path_key is None else {"path": spec.path}
    if metric.seeded:
        return metric.init(spec.shape, spec.dtype, spec.index, **extra)
    return metric.init(spec.shape, spec.dtype, **extra)


@_leafwise.compiled
def scale_by_metric(metric: _metrics.Metric) -> optax.GradientTransformationExtraArgs:
    """The preconditioner ``g_t -> H_t^{-1} g_t`` of a metric, leaf by leaf.

    The building block of the ``scale_by_*`` aliases, as ``optax.scale_by_rss`` is of
    ``optax.adagrad``: chain it with ``optax.scale_by_learning_rate``.

    Args:
      metric: a :class:`sketchopt.metrics.Metric`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (state :class:`ScaleByMetricState`).

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization" (JMLR 2011), sec. 1.2 (the preconditioner ``H_t^{-1} g_t``).

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.scale_by_metric(sketchopt.metrics.diagonal(0.0))
      >>> tx.update(jnp.array([2.0, -4.0]), tx.init(jnp.zeros(2)))[0]  # g / sqrt(g^2)
      Array([ 1., -1.], dtype=float32)
    """
    rule = metric_rule(metric, None, None, scale_only=True)
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

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (state :class:`MirrorDescentState`).

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization" (JMLR 2011), eq. 4; Wan, Wei & Zhang, "Efficient Adaptive Online Learning
      via Frequent Directions" (IJCAI 2018), Alg. 2.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.mirror_descent(0.1, sketchopt.metrics.diagonal(0.0))
      >>> tx.update(jnp.array([2.0, -4.0]), tx.init(jnp.zeros(2)))[0]  # -eta g / sqrt(g^2)
      Array([-0.1,  0.1], dtype=float32)
    """
    learning_rate = _check_learning_rate(learning_rate)
    _check_regularizable(metric, regularizer)
    return _leafwise.leafwise(metric_rule(metric, learning_rate, regularizer), MirrorDescentState)


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

    Args:
      learning_rate: ``eta``, a float or an Optax schedule of the step count (from 0).
      metric: a :class:`sketchopt.metrics.Metric`.
      regularizer: ``None`` or a regularizer of :mod:`sketchopt.regularizers`.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (state :class:`DualAveragingState`) whose
      ``update`` needs ``params``.

    References:
      Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization" (JMLR 2011), eq. 3; Xiao, "Dual Averaging Methods for Regularized
      Stochastic Learning and Online Optimization" (JMLR 2010); Wan, Wei & Zhang, "Efficient
      Adaptive Online Learning via Frequent Directions" (IJCAI 2018), Alg. 1 and eq. 6.

    Examples:
      >>> import jax.numpy as jnp, sketchopt
      >>> tx = sketchopt.dual_averaging(0.1, sketchopt.metrics.diagonal(0.0))
      >>> params = jnp.ones(2)
      >>> updates, _ = tx.update(jnp.array([2.0, -4.0]), tx.init(params), params)
      >>> jnp.round(updates, 6)  # x_1 - eta g / sqrt(g^2) - x_1
      Array([-0.1,  0.1], dtype=float32)
    """
    learning_rate = _check_learning_rate(learning_rate)
    _check_regularizable(metric, regularizer)
    if metric.accepts is not None or metric.seeded:
        raise ValueError(
            f"dual_averaging does not take the {metric.name!r} metric: its refusals (accepts) "
            "or per-leaf seeds are read by mirror descent only (metric_rule); use "
            "sketchopt.mirror_descent"
        )

    def init(spec, param):
        anchor = jnp.ravel(param).astype(spec.dtype)
        return (init_metric(metric, spec), jnp.zeros_like(anchor), anchor)

    def hyper(count):
        metric_hyper = None if metric.hyper is None else metric.hyper(count)
        return _leafwise.at_step(learning_rate, count), metric_hyper

    def step(ctx, g, values, x, valid):
        ms, gsum, x1 = values
        eta, metric_hyper = ctx.hyper
        if metric.hyper is not None:  # values that follow the step count (kron_sketched's)
            ms, op, _ = metric.update(ms, g, valid, hyper=metric_hyper, **_phase(metric, ctx))
        elif metric.absorb is not None:  # no solve with g: the step solves with the sum
            ms, op = metric.absorb(ms, g, valid)
        else:
            ms, op, _ = metric.update(ms, g, valid)
        gsum = jnp.where(valid, gsum + g, gsum)
        eta = jnp.asarray(eta, _numerics.real_dtype(g.dtype))
        z = x1 - eta * op.solve(gsum)
        if regularizer is None:
            x_new = z
        else:  # the prox at z in the H-norm (see mirror_descent)
            c = eta * (ctx.count + 1).astype(eta.dtype)
            x_new = regularizer.prox(None, c, op, shape=ctx.shape, center=z)
        return x_new - x, (ms, gsum, x1)

    rule = _leafwise.LeafRule(
        ("metric_state", "grad_sum", "anchor"),
        init,
        step,
        hyper=hyper,
        needs_params="dual_averaging",
        paddable=metric.paddable and regularizer is None,
        group_key=metric.path_key,
        param_fields=("metric_state",) * metric.param_shaped + ("grad_sum", "anchor"),
        coordinatewise=metric.coordinatewise and regularizer is None,
        phases=metric.phases,
    )
    return _leafwise.leafwise(rule, DualAveragingState)
