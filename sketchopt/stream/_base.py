r"""What every sparse linear learner shares: the losses, the learner interface and state, the
hyperparameter grids and checks, on which :mod:`sketchopt.stream.learners` and
:mod:`sketchopt.stream.second_order` both build (neither imports the other for them).

The public names are re-exported from :mod:`sketchopt.stream.learners`, their documented home;
the policies (lazy catch-up, labels, bad input, grids) are written out in its docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sketchopt import _validation
from sketchopt.stream.examples import CLASSIFICATION_LOSSES, SparseVector

__all__ = [
    "LOSSES",
    "LinearLearner",
    "LinearState",
    "check_each",
    "class_label",
    "column",
    "error",
    "grid_shape",
    "importance",
    "loss_function",
    "loss_value",
    "segment_count",
    "with_column",
]


def _squared_hinge(p, y):
    return jnp.square(jnp.maximum(0.0, 1.0 - y * p))


#: ``loss(prediction, label)``: Optax's where it has one. Logistic and the hinges take labels
#: in ``{-1, +1}``; squared takes any real label and is ``(p - y)^2`` (VW's squared loss).
LOSSES: dict[str, Callable] = {
    "squared": optax.losses.squared_error,
    "logistic": lambda p, y: optax.losses.sigmoid_binary_cross_entropy(p, (y + 1) / 2),
    "hinge": optax.losses.hinge_loss,
    "squared_hinge": _squared_hinge,
}


def loss_value(loss: str, prediction, label):
    """The loss ``loss`` of ``prediction`` at ``label``."""
    return loss_function(loss)(prediction, label)


def class_label(loss: str, label):
    """``label`` as the loss reads it: for the classification losses a 0 is the negative class
    -1 (as the loaders map ``{0, 1}`` labels); other labels unchanged."""
    label = jnp.asarray(label)
    if loss in CLASSIFICATION_LOSSES:
        return jnp.where(label == 0, -1, label).astype(label.dtype)
    return label


def error(prediction, label):
    """0/1 error of the sign of ``prediction`` (``p > 0`` predicts ``+1``); for real labels (the
    squared loss) the sign disagreement."""
    return (jnp.where(prediction > 0, 1.0, -1.0) != jnp.sign(label)).astype(prediction.dtype)


def loss_function(loss: str) -> Callable:
    """The function ``loss(prediction, label)`` of :data:`LOSSES` named ``loss``."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {sorted(LOSSES)}")
    return LOSSES[loss]


def importance(slope, ok, active, weight, dtype):
    """An example's importance weight applied to its loss's slope: ``(slope * weight, ok,
    active)`` with a non-finite or negative weight a bad example (``ok`` false) and a zero
    weight not learned from (``active`` false); ``weight=None`` changes nothing (weight 1). The
    gradient scales by the weight, as VW's non-invariant updates."""
    if weight is None:
        return slope, ok, active
    weight = jnp.asarray(weight, dtype)
    finite = jnp.isfinite(weight)
    ok = ok & finite & (weight >= 0)
    return slope * jnp.where(finite, weight, 0), ok, active & (weight > 0)


def with_column(rows, j: int, values):
    """``rows`` (``(s, k)``, an example's gathered rows) with column ``j`` replaced by
    ``values`` (``(s,)``), as a select on the column's number. The form matters inside a
    scatter's operand: XLA:CPU fused a stack of the columns, or a dynamic-update-slice of one,
    into the scatter as a per-entry branch (padded MNIST-shaped chunks ran the first-order
    learners 1.7-2x slower, ``oja_son``'s fed write 1.2x; ``docs/benchmarks/streams.md``)."""
    column = jnp.arange(rows.shape[-1]) == j
    return jnp.where(column, values[:, None].astype(rows.dtype), rows)


def segment_count(start, stop, width: int):
    """How many segments of ``width`` entries one example of a flat chunk
    (``indices[start:stop]``) is read in: at least one (an empty example reads one of
    padding)."""
    return jnp.maximum((stop - start + width - 1) // width, 1)


class LinearState(NamedTuple):
    """State of a sparse linear learner.

    Attributes:
      table: the per-coordinate numbers: one ``(d, k)`` block, or for a grid one ``(d, G)``
        block per column (the learner's ``blocks`` name their columns, e.g.
        ``("w", "s", "mark")`` for ADA-DIAG; read one with :func:`column`). One configuration
        keeps all ``k`` columns in one block, so that an
        example reads one contiguous row per non-zero (at ``d = 2**20``: 3.3 us per example of
        100 non-zeros against 7.9 for three separate arrays); a grid keeps one block per column,
        each row a contiguous ``G``-vector (23 us against 38 for one ``(d, k, G)`` block at
        ``G = 49``, where splitting and restacking the columns of a row costs more than the
        extra cache lines).
      scalars: running scalars, by name (e.g. ``E_t``, the learning rates' sum).
      t: the examples learned from (int32).
      nonfinite_count: the examples skipped as bad input (int32).
    """

    table: tuple[jax.Array, ...]
    scalars: dict[str, jax.Array]
    t: jax.Array
    nonfinite_count: jax.Array


class LinearLearner(NamedTuple):
    """A linear online learner on sparse examples (see the module docstring).

    ``init(dim, dtype=float32, key=None)`` (``key`` for learners with random state; ignored by
    the first-order ones), ``predict(state, x) -> p``, ``update(state, x, label) -> state``,
    ``step(state, x, label, active=True, weight=None) -> (state, p)`` (``p`` is
    ``predict(state, x)``; an inactive step, a chunk's padding row or a held-out example, leaves
    the state as it is; ``weight`` the example's importance weight, which scales its gradient,
    0 not learning from it), ``step_flat(state, indices, values, start, stop, label,
    active=True, *, width, weight=None)`` (the same on an example of a flat chunk,
    :class:`~sketchopt.stream.examples.FlatExamples`) and
    ``weights(state) -> (d, *grid)``; ``columns`` names the per-coordinate numbers and
    ``blocks`` how ``state.table`` stores them (:class:`LinearState`, :func:`column`).

    ``grid`` is ``()``, or ``(G,)`` for a learner built with 1-D arrays of ``G`` hyperparameter
    values: it runs the ``G`` configurations at once, and its predictions, ``t`` and counters
    are ``(G,)``.
    """

    name: str
    loss: str
    init: Callable[..., LinearState]
    predict: Callable[[LinearState, SparseVector], jax.Array]
    update: Callable[[LinearState, SparseVector, Any], LinearState]
    step: Callable[..., tuple[LinearState, jax.Array]]
    weights: Callable[[LinearState], jax.Array]
    columns: tuple[str, ...]
    grid: tuple[int, ...] = ()
    blocks: tuple[tuple[str, ...], ...] = ()
    step_flat: Callable[..., tuple[LinearState, jax.Array]] | None = None


# Their public home is sketchopt.stream.learners (documented and pickled under that name, as
# before they moved here, below both kinds of learners).
LinearState.__module__ = LinearLearner.__module__ = "sketchopt.stream.learners"


def column(learner: LinearLearner, state: LinearState, name: str) -> jax.Array:
    """The ``(d, *grid)`` column ``name`` of ``state.table`` (e.g. ``"w"``, ``"z"``, ``"gsum"``)."""
    for block, names in zip(state.table, learner.blocks, strict=True):
        if name in names:
            return block if learner.grid else block[:, names.index(name)]
    raise KeyError(f"{learner.name} has no column {name!r}; it has {learner.columns}")


def grid_shape(*hyperparameters) -> tuple[int, ...]:
    """``()`` for scalar hyperparameters, ``(G,)`` when some are arrays of ``G`` values (a grid
    of configurations, :func:`sketchopt.stream.runner.run_grid`)."""
    shapes = [np.shape(h) for h in hyperparameters if not callable(h)]
    shape = np.broadcast_shapes(*shapes) if shapes else ()
    if len(shape) > 1:
        raise ValueError(f"hyperparameters must be scalars or 1-D grids, got shape {shape}")
    return tuple(shape)


def check_each(check, name, value, **options):
    """``check`` (a :mod:`sketchopt._validation` function, as the dense learners use) on a
    hyperparameter, or on each value of a 1-D grid of them; schedules and traced values pass."""
    if callable(value) or _validation.is_traced(value):
        return
    for each in np.ravel(np.asarray(value)):
        check(name, each.item(), **options)
