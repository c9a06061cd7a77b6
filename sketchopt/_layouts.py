"""The layout rules of a parameter's state under a mesh, shared by the driver and the sharding
module.

:mod:`sketchopt.sharding` states them for users (:func:`sketchopt.sharding.state_sharding`) and
the driver (:mod:`sketchopt._leafwise`) follows them to lay a state out under an explicit mesh and
to flatten a leaf into its sketch's layout. They live here, below both, so that neither imports
the other for them; :mod:`sketchopt.sharding` re-exports the public ones (:func:`flat_axes`,
:func:`flat_spec`, :func:`factor_axes`, :func:`group_specs`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from sketchopt.kron import KronMetricState

__all__ = [
    "array_spec",
    "factor_axes",
    "flat_axes",
    "flat_spec",
    "group_specs",
]


def _axis_names(entry):
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def flat_axes(spec: PartitionSpec, ndim: int) -> tuple[str, ...]:
    """The mesh axes of a parameter's ``spec``, in order: those of its flattened vector.

    ``P("model", None)`` gives ``("model",)``; ``P("data", "model")`` gives
    ``("data", "model")`` (the flattened vector then has a different layout than the parameter,
    see the module docstring). A parameter of shape ``(n_1, ..., n_k)`` flattens row-major to
    ``d = n_1 ... n_k`` entries, so its ``(..., d)`` state arrays are split over the product of
    these axes' sizes.

    Args:
      spec: the parameter's ``PartitionSpec``; an entry is ``None``, an axis name or a tuple of
        names.
      ndim: the parameter's number of dimensions (``spec`` may not have more entries).

    Returns:
      The axis names, in the order of ``spec``'s entries (a tuple entry in its own order).

    Raises:
      ValueError: ``spec`` has more than ``ndim`` entries.

    References:
      JAX documentation, "Distributed arrays and automatic parallelization" (the
      ``NamedSharding`` / ``PartitionSpec`` model of the layouts).

    Examples:
      >>> from jax.sharding import PartitionSpec as P
      >>> from sketchopt import sharding
      >>> sharding.flat_axes(P(("data", "model"), None), 2), sharding.flat_axes(P(), 3)
      (('data', 'model'), ())
    """
    spec = tuple(spec)
    if len(spec) > ndim:
        raise ValueError(f"a PartitionSpec of {len(spec)} entries for a {ndim}-d parameter")
    axes: list[str] = []
    for entry in spec:
        axes.extend(_axis_names(entry))
    return tuple(axes)


def array_spec(spec, shape, x_shape, dtype, mesh, stacked=0) -> PartitionSpec:
    """The spec of one state array of a parameter leaf (``stacked`` leading group axes).

    Arrays with the parameter's shape take its spec, floating ``(..., d)`` arrays are sharded
    along ``d`` like the flattened parameter (when ``d`` divides evenly), the rest is replicated.
    """
    ndim = len(shape)
    d = math.prod(shape)
    axes = flat_axes(spec, ndim)
    devices = math.prod(mesh.shape[a] for a in axes) if axes else 1
    flat = axes[0] if len(axes) == 1 else axes
    rest = x_shape[stacked:]
    if rest == tuple(shape) and ndim > 0 and axes:
        return PartitionSpec(*([None] * stacked), *tuple(spec))
    floating = jnp.issubdtype(dtype, jnp.inexact)
    if axes and d > 0 and d % devices == 0 and floating and rest and rest[-1] == d:
        return PartitionSpec(*([None] * (len(x_shape) - 1)), flat)
    return PartitionSpec()


def flat_spec(spec, shape, mesh) -> PartitionSpec:
    """The ``PartitionSpec`` of a parameter's flattened vector: that of its state's ``(..., d)``
    arrays (:func:`state_sharding`'s rule), split along :func:`flat_axes` when ``d`` divides
    evenly over them and replicated otherwise.

    A parameter split along its leading axis flattens in place; one split along another axis
    (``P(None, "x")``) has no contiguous flat layout, and reshaping it to this spec moves its
    entries (an all-to-all of ``d`` entries) instead of gathering them.

    Args:
      spec: the parameter's ``PartitionSpec`` (or its tuple of entries).
      shape: the parameter's shape.
      mesh: the mesh (concrete or abstract) the axes belong to.

    Returns:
      A one-entry ``PartitionSpec`` (or ``P()``).

    References:
      JAX documentation, "Explicit sharding" (``jnp.reshape(..., out_sharding=)``).

    Examples:
      >>> import jax
      >>> from jax.sharding import AxisType, PartitionSpec as P
      >>> from sketchopt import sharding
      >>> mesh = jax.sharding.AbstractMesh((2,), ("x",), axis_types=(AxisType.Explicit,))
      >>> tuple(sharding.flat_spec(P(None, "x"), (3, 4), mesh))  # d = 12 splits over 2 devices
      ('x',)
      >>> tuple(sharding.flat_spec(P(None, "x"), (3, 3), mesh))  # d = 9 does not: replicated
      ()
    """
    shape = tuple(shape)
    return array_spec(tuple(spec), shape, (math.prod(shape),), jnp.float32, mesh)


def factor_axes(spec, shape, rows: int, cols: int, layered: bool, mesh) -> tuple[tuple, tuple]:
    """The mesh axes of the row side and the column side of a leaf seen as ``rows x cols``
    matrices (after a leading layer axis when ``layered``): ``()`` for a side kept replicated.

    A side is the product of consecutive axes of the leaf (C order); it is split along the mesh
    axes of its *first* axis when that is the side's only sharded axis and its length divides
    evenly (a contiguous split of the flattened side), and replicated otherwise.
    """
    spec = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
    lead = 1 if layered else 0
    dims, entries = tuple(shape[lead:]), spec[lead:]
    splits = [j for j in range(len(dims) + 1) if math.prod(dims[:j]) == rows]
    if not splits or rows * cols != math.prod(dims):
        return (), ()
    j = splits[-1]

    def side(ents, sizes):
        axes = _axis_names(ents[0]) if ents else ()
        if not axes or any(_axis_names(e) for e in ents[1:]):
            return ()
        return axes if sizes[0] % math.prod(mesh.shape[a] for a in axes) == 0 else ()

    return side(entries[:j], dims[:j]), side(entries[j:], dims[j:])


def group_specs(value, spec, shape, mesh, stacked: int = 0) -> Any:
    """The ``PartitionSpec`` of every array of one leaf's state ``value`` (``stacked`` leading
    group axes), for a parameter of ``shape`` and ``spec``.

    The arrays follow :func:`state_sharding`'s rule, except a Kronecker-factored metric's
    (:class:`sketchopt.metrics.KronMetricState`): each side's sketch rows and inverse-root basis
    (``k x m`` and ``k x n``) are split along that side's own axes (:func:`factor_axes`), their
    scalars replicated, so neither side's sketch is ever whole on one device.
    """

    def default(x):
        return array_spec(tuple(spec), tuple(shape), tuple(np.shape(x)), x.dtype, mesh, stacked)

    if not isinstance(value, KronMetricState) or value.left is None:
        return jax.tree.map(default, value)
    m, n = value.left.rows.shape[-1], value.right.rows.shape[-1]
    layered = value.left.rows.ndim - stacked == 3
    rows_axes, cols_axes = factor_axes(spec, shape, m, n, layered, mesh)

    def along(axes, x):
        entry = (axes[0] if len(axes) == 1 else axes) if axes else None
        return PartitionSpec(*([None] * (x.ndim - 1)), entry)

    def factor(f, axes):  # kron.FactorState(rows, alpha, exp)
        return type(f)(along(axes, f.rows), PartitionSpec(), PartitionSpec())

    def root(r, axes):  # kron.InverseRoot(basis, coef, tail)
        return type(r)(along(axes, r.basis), PartitionSpec(), PartitionSpec())

    roots = value.roots
    if roots is not None:
        roots = (root(roots[0], rows_axes), root(roots[1], cols_axes))
    diag = None if value.diag is None else default(value.diag)
    left, right = factor(value.left, rows_axes), factor(value.right, cols_axes)
    kept = None if value.kept is None else PartitionSpec()  # two counts (per layer): replicated
    return KronMetricState(left, right, diag, roots, kept)
