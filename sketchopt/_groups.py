"""The group context: collectives over the leaves of a group the driver steps as one ``vmap``.

The driver (:mod:`sketchopt._leafwise`) stacks the leaves of one shape and dtype into a *group*
and steps them with one ``vmap`` over :data:`GROUP_AXIS`, inside :func:`group_context`. The
numerics below the driver (the FD sketches of :mod:`sketchopt.sketches`, the arrowhead solver of
:mod:`sketchopt._arrowhead`) ask here whether they run inside such a group and combine a per-leaf
predicate over its leaves, so that a rare branch stays one ``lax.cond`` for the whole group. This
module sits below all of them: it imports no other module of the package.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

__all__ = [
    "GROUP_AXIS",
    "all_leaves",
    "any_leaf",
    "group_context",
    "grouped",
    "select_leaves",
]

#: The name of the ``vmap`` axis over the leaves of a group (for collectives over a group).
GROUP_AXIS = "sketchopt_leaves"

_IN_GROUP: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "sketchopt_in_group", default=False
)


@contextlib.contextmanager
def group_context(active: bool):
    """Marks the code traced inside it as running (``active``) or not inside the ``vmap`` over
    a group of several leaves (:func:`grouped`)."""
    token = _IN_GROUP.set(active)
    try:
        yield
    finally:
        _IN_GROUP.reset(token)


def grouped() -> bool:
    """Whether the code is being traced inside the ``vmap`` over a group of several leaves."""
    return _IN_GROUP.get()


def any_leaf(pred):
    """``pred`` (a per-leaf boolean) or-ed over the leaves of the current group.

    Inside the ``vmap`` over a group a ``lax.cond`` on a per-leaf predicate becomes a select that
    computes both branches for every leaf: a shrink or a refresh would then run at every step.
    Gating the ``cond`` on :func:`any_leaf` keeps it a ``cond`` (its predicate is the same for the
    whole group); inside it, :func:`select_leaves` keeps each leaf's own outcome. Outside a group
    this is ``pred`` itself.
    """
    if not grouped():
        return pred
    return jax.lax.psum(jnp.asarray(pred).astype(jnp.int32), GROUP_AXIS) > 0


def all_leaves(pred):
    """``pred`` and-ed over the leaves of the current group (``pred`` itself outside a group)."""
    if not grouped():
        return pred
    return jnp.logical_not(any_leaf(jnp.logical_not(pred)))


def select_leaves(pred, on_true, on_false):
    """``on_true`` where this leaf's ``pred`` holds, else ``on_false`` (pytrees).

    Outside a group the caller is inside ``lax.cond(pred, ...)`` already, so this returns
    ``on_true`` without a select (no copy of a large state).
    """
    if not grouped():
        return on_true
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)
