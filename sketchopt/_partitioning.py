"""Sharding helpers of the numerics: contractions along a sharded ``d``, explicit-mesh reshards.

Every state array of a leaf is either ``(..., d)``-shaped (sketch rows, Oja directions, running
sums: sharded along ``d`` like the flattened parameter) or small (Gram matrices, eigenvalues,
scalars: replicated). A step only contracts ``d`` into small results, so under a mesh it moves
``sketch_size``-sized reductions between devices, never the sketch. With automatic sharding the
compiler propagates these layouts by itself; under an ``AxisType.Explicit`` mesh (``jax.set_mesh``)
the sharding is part of every array's type and the library spells it out with the helpers here.
The user-facing layouts of whole optimizer states live in :mod:`sketchopt.sharding`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from sketchopt._numerics import HIGHEST

__all__ = [
    "contract_d",
    "explicit_mesh",
    "gathered",
    "like",
    "like_last_axis",
    "replicate",
    "spec_of",
]


def explicit_mesh() -> bool:
    """Whether the current mesh (``jax.set_mesh``) has an axis in explicit-sharding mode."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and bool(mesh.explicit_axes)


def spec_of(x) -> tuple | None:
    """The entries of the ``PartitionSpec`` in ``x``'s type under an explicit mesh, one per axis
    (``None`` for an axis not split), else ``None``."""
    if not explicit_mesh():
        return None
    spec = tuple(jax.typeof(x).sharding.spec)
    return spec + (None,) * (x.ndim - len(spec))


def contract_d(a, b):
    """``a @ b`` contracting the long axis ``d`` (possibly sharded) into a small result.

    Every such product here is sketch-sized (``n`` or ``n x n``), so it is asked for replicated:
    each device contracts its slice of ``d`` and only the small result is all-reduced. Under an
    explicit-sharding mesh JAX requires that output sharding to be spelled out.
    """
    if explicit_mesh():
        return jnp.matmul(a, b, precision=HIGHEST, out_sharding=PartitionSpec())
    return jnp.matmul(a, b, precision=HIGHEST)


def replicate(x):
    """``x`` resharded to replicated under an explicit mesh (a no-op otherwise)."""
    if not explicit_mesh():
        return x
    if all(entry is None for entry in jax.typeof(x).sharding.spec):
        return x
    return jax.sharding.reshard(x, PartitionSpec())


def like_last_axis(x, ref):
    """``x`` resharded, under an explicit mesh, to the sharding of ``ref``'s last axis (``d``).

    A no-op otherwise (and when the shardings already agree): with automatic sharding the
    compiler propagates the shardings of the state and the gradient by itself.
    """
    if not explicit_mesh():
        return x
    spec = tuple(jax.typeof(ref).sharding.spec)
    last = spec[ref.ndim - 1] if 0 < ref.ndim <= len(spec) else None
    target = PartitionSpec(*([None] * (x.ndim - 1) + [last]))
    if tuple(jax.typeof(x).sharding.spec) == tuple(target):
        return x
    return jax.sharding.reshard(x, target)


def gathered(tree):
    """Every array of ``tree`` replicated (explicit mesh; a no-op otherwise)."""
    return jax.tree.map(replicate, tree)


def like(tree, ref):
    """``tree`` resharded to the shardings of ``ref`` (explicit mesh; a no-op otherwise, and for
    arrays whose sharding already agrees)."""
    if not explicit_mesh():
        return tree

    def one(x, r):
        target = jax.typeof(r).sharding.spec
        if tuple(jax.typeof(x).sharding.spec) == tuple(target):
            return x
        return jax.sharding.reshard(x, target)

    return jax.tree.map(one, tree, ref)
