r"""Shardings for optimizer states: keep every sketch sharded along ``d`` like its parameter.

Every transform of ``sketchopt`` treats a parameter leaf of any shape as its flattened vector of
length ``d`` and keeps, per leaf, arrays of three kinds:

* ``(..., d)`` arrays -- the ``sketch_size x d`` sketch rows, Oja's directions, SON's diagonal
  rescaling, ...;
* arrays with the parameter's own shape -- the parameter-shaped fields, trees like the
  parameters (ADA-DIAG's accumulator, dual averaging's gradient sum and anchor, FTRL's and
  RDA's accumulators; ``docs/design.md``, "State layout");
* small arrays -- Gram matrices (``sketch_size x sketch_size``), eigenvalues, ``alpha``, scale
  exponents, counters, PRNG keys.

A parameter sharded along its *leading* axis flattens to a contiguously sharded vector, so the
sketch can be sharded the same way: each device keeps the ``sketch_size x (d / devices)`` block
of the columns of its own slice of the parameter, and a step only moves ``sketch_size``-sized
reductions (``B g``, the Gram matrix's new row) between devices -- never the sketch.
:func:`state_sharding` gives exactly that layout for any optimizer state (``optax.chain``,
``inject_hyperparams``, ``MultiSteps``, ``partition`` ... included):

====================================  ========================================================
state array                           sharding
====================================  ========================================================
``(..., d)`` floating                 ``P(None, ..., None, axes)`` where ``axes`` are the mesh
                                      axes of the parameter (in order)
the parameter's shape                 the parameter's own sharding
anything else                         replicated, ``P()``
====================================  ========================================================

It is replicated as well when ``d`` is not divisible by the number of devices along ``axes``,
or when the parameter is replicated. The Kronecker-factored metric (``kron_fd``) keeps a
``k x m`` and a ``k x n`` sketch per ``m x n`` leaf instead: each is split along its own side's
mesh axes (:func:`factor_axes`: the side's leading axis, when it is the side's only split one),
so a leaf split along its rows has its left sketch split and its right one replicated
(:func:`group_specs`). Typical use::

    from sketchopt import sharding

    params = jax.device_put(params, params_shardings)          # e.g. P("model", None)
    tx = sketchopt.ada_fd(0.1, sketch_size=32, delta=1e-3)
    opt_state = sharding.init(tx, params)                       # sharded from the start
    state_shardings = sharding.state_sharding(opt_state, params)

    @functools.partial(jax.jit, out_shardings=(params_shardings, state_shardings),
                       donate_argnums=(1,))
    def step(grads, opt_state, params):
        return tx.update(grads, opt_state, params)

    # orbax: restore straight into the sharded layout
    target = sharding.abstract_state(tx, params)
    opt_state = ocp.StandardCheckpointer().restore(path, target)

Both ``AxisType.Auto`` and ``AxisType.Explicit`` meshes work (with an explicit mesh, build and
step under ``jax.set_mesh(mesh)``): the library asks for its ``d``-contractions to be replicated
``sketch_size``-sized results, and reshards an incoming gradient to the sketch's layout if it
differs.

Limits. A parameter sharded along a non-leading axis (``P(None, "model")``) flattens to a
non-contiguous layout: its flattened gradient and update are redistributed (one ``d``-sized
all-to-all per step) while the state stays sharded. ``optax.flatten`` concatenates all leaves into
one vector whose layout is not that of any parameter: its state is replicated. The ``d x d``
baselines (``ada_full``, ``ons``) shard their matrix along its columns but ADA-FULL's
eigendecomposition gathers it (an ``O(d^3)`` baseline is not meant for sharded sizes).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from sketchopt import _layouts, _leafwise

# The layout rules live below the driver, which follows them too (``sketchopt._layouts``); they
# are this module's public API.
from sketchopt._layouts import factor_axes, flat_axes, flat_spec, group_specs

__all__ = [
    "abstract_state",
    "constrain",
    "factor_axes",
    "flat_axes",
    "flat_spec",
    "group_specs",
    "init",
    "state_sharding",
]


def _leaf_sharding_info(ref, shape, mesh):
    """``(mesh, spec, shape)`` of one parameter leaf from what the user gave."""
    if isinstance(ref, NamedSharding):
        return ref.mesh, ref.spec, shape
    if isinstance(ref, PartitionSpec):
        if mesh is None:
            mesh = jax.sharding.get_abstract_mesh()
            if mesh.empty:
                raise ValueError(
                    "state_sharding: PartitionSpec shardings need a mesh: pass mesh= or call it "
                    "under jax.set_mesh(mesh)"
                )
        return mesh, ref, shape
    try:
        sharding = ref.sharding
    except Exception:  # noqa: BLE001 - e.g. a tracer under automatic sharding
        sharding = None
    ref_shape = tuple(np.shape(ref)) if shape is None else shape
    if isinstance(sharding, NamedSharding):
        return sharding.mesh, sharding.spec, ref_shape
    if sharding is None or isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None, PartitionSpec(), ref_shape
    raise ValueError(
        f"state_sharding: cannot read a NamedSharding from {type(ref).__name__} with sharding "
        f"{sharding!r}; pass NamedShardings or PartitionSpecs"
    )


def _is_sharding(x):
    return isinstance(x, (NamedSharding, PartitionSpec))


def state_sharding(
    state: Any,
    params_shardings: Any,
    params: Any = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> Any:
    """The sharding of every array of an optimizer state, given the parameters' shardings.

    The rule, for a state array ``x`` of a parameter leaf of shape ``s``, spec ``S``, ``d =
    prod(s)`` and mesh axes ``A = flat_axes(S)`` (a stacked group array has one more leading
    axis, left unsharded)::

        spec(x) = S                          if x.shape == s
                = P(None, ..., None, A)      if x is floating, x.shape[-1] == d and
                                             d % prod(mesh.shape[a] for a in A) == 0
                = P()                        otherwise (and when the leaf is replicated)

    Args:
      state: an optimizer state of any ``sketchopt`` (or Optax) transform, concrete or abstract
        (``jax.eval_shape(tx.init, params)``), or tracers inside ``jit``.
      params_shardings: the parameters' shardings, as a pytree with the parameters' structure of
        ``NamedSharding``\\ s or ``PartitionSpec``\\ s -- or the sharded parameters themselves
        (``jax.Array``\\ s or ``jax.ShapeDtypeStruct``\\ s with a ``sharding``), which also give
        the shapes.
      params: the parameters (arrays or ``ShapeDtypeStruct``\\ s) for their shapes, needed when
        ``params_shardings`` holds shardings rather than arrays.
      mesh: the mesh for ``PartitionSpec`` shardings (default: the one of ``jax.set_mesh``).

    Returns:
      A pytree with the structure of ``state`` whose leaves are ``NamedSharding``\\ s (or
      ``PartitionSpec``\\ s when given ``PartitionSpec``\\ s without a concrete mesh): the per-leaf
      ``(..., d)`` arrays sharded along their last axis like the flattened parameter, arrays
      with the parameter's shape like the parameter, everything else replicated. Usable as
      ``out_shardings`` of ``jax.jit``, with ``jax.device_put`` or as the ``sharding`` of the
      ``ShapeDtypeStruct``\\ s of an orbax restore target.

    References:
      JAX documentation, "Distributed arrays and automatic parallelization" (the
      ``NamedSharding`` / ``PartitionSpec`` model of the layouts).

    Examples:
      The ``2 x 12`` sketch (a group of one leaf, stored unstacked) is split along ``d = 12``,
      the rest replicated:

      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> from jax.sharding import AxisType, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
      >>> params, tx = jnp.zeros((4, 3)), so.ada_fd(0.1, sketch_size=2, delta=1e-3)
      >>> state = jax.eval_shape(tx.init, params)
      >>> shardings = so.sharding.state_sharding(state, P("model", None), params, mesh=mesh)
      >>> sorted({tuple(s.spec) for s in jax.tree.leaves(shardings)}, key=len)
      [(), (None, 'model')]
    """
    treedef, infos = _param_leaf_infos(params_shardings, params, mesh)
    return _StateLayout(treedef, infos, mesh).assign(state)


def _param_leaf_infos(params_shardings, params, mesh):
    """``(treedef, infos)``: the parameters' structure and each leaf's ``(mesh, spec, shape)``."""
    ref_leaves, treedef = jax.tree.flatten(params_shardings, is_leaf=_is_sharding)
    if params is not None:
        shapes = [tuple(np.shape(p)) for p in treedef.flatten_up_to(params)]
    else:
        if any(_is_sharding(r) for r in ref_leaves):
            raise ValueError(
                "state_sharding: params_shardings holds shardings without shapes; pass "
                "params= (arrays or ShapeDtypeStructs) or the sharded parameters themselves"
            )
        shapes = [None] * len(ref_leaves)
    infos = [_leaf_sharding_info(r, s, mesh) for r, s in zip(ref_leaves, shapes, strict=True)]
    return treedef, infos


class _StateLayout:
    """Assigns a sharding to every array of an optimizer state (:func:`state_sharding`).

    ``infos`` holds one ``(mesh, spec, shape)`` per parameter leaf, in the order of ``treedef``
    (the parameters' structure). Shardings are ``NamedSharding``\\ s on a concrete mesh and
    ``PartitionSpec``\\ s otherwise.
    """

    def __init__(self, treedef, infos, mesh):
        self.treedef, self.infos = treedef, infos
        meshes = [m for m, _, _ in infos if m is not None]
        self.mesh = mesh if mesh is not None else (meshes[0] if meshes else None)
        self.as_specs = self.mesh is None or isinstance(self.mesh, jax.sharding.AbstractMesh)
        self.assigners = [self.per_leaf(info) for info in infos]

    def make(self, spec, leaf_mesh=None):
        m = leaf_mesh if leaf_mesh is not None else self.mesh
        if self.as_specs or m is None or isinstance(m, jax.sharding.AbstractMesh):
            return spec
        return NamedSharding(m, spec)

    def replicated(self, _):
        return self.make(PartitionSpec())

    def per_leaf(self, info, stacked=0):
        """The sharding of a state array of the parameter leaf of ``info``."""
        leaf_mesh, spec, shape = info

        def assign(x):
            if leaf_mesh is None:
                return self.replicated(x)
            target = _layouts.array_spec(
                spec, shape, tuple(np.shape(x)), x.dtype, leaf_mesh, stacked
            )
            return self.make(target, leaf_mesh)

        return assign

    def group_shardings(self, members, group, stacked: bool):
        """One group of a LeafGroups (``stacked`` along a leading axis or, for one leaf, not:
        ``Layout.stacked``): the members' common layout (:func:`group_specs`), or replicated."""
        layouts = {(self.infos[i][0], tuple(self.infos[i][1])) for i in members}
        leaf_mesh, spec, shape = self.infos[members[0]]
        if len(layouts) != 1 or leaf_mesh is None:  # members sharded differently: replicated
            return jax.tree.map(self.replicated, group)
        specs = group_specs(group, spec, shape, leaf_mesh, stacked=int(stacked))
        return jax.tree.map(lambda _, sp: self.make(sp, leaf_mesh), group, specs)

    def leaf_groups(self, node):
        """A :class:`~sketchopt.LeafGroups` of stacked per-group arrays."""
        if node.layout.num_leaves != len(self.infos):
            raise ValueError(
                f"state_sharding: the state covers {node.layout.num_leaves} parameter leaves, "
                f"params_shardings has {len(self.infos)}"
            )
        layout = node.layout
        groups = [
            self.group_shardings(members, group, layout.stacked(j))
            for j, (members, group) in enumerate(zip(layout.groups, node.groups, strict=True))
        ]
        return _leafwise.LeafGroups(tuple(groups), node.layout)

    def assign(self, node):
        """The shardings of a state (sub)tree: per-leaf fields like their parameter leaves."""
        if isinstance(node, _leafwise.LeafGroups):
            return self.leaf_groups(node)
        try:
            subtrees = self.treedef.flatten_up_to(node)
        except (ValueError, TypeError):
            subtrees = None
        if subtrees is not None:  # a tree like the parameters: one assigner per leaf
            mapped = [jax.tree.map(a, sub) for a, sub in zip(self.assigners, subtrees, strict=True)]
            return self.treedef.unflatten(mapped)
        children, node_def = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        if node_def.num_nodes == 1 and node_def.num_leaves == 1:  # an array leaf
            return self.replicated(node)
        return node_def.unflatten([self.assign(c) for c in children])


def _shardings_of(params, params_shardings):
    if params_shardings is not None:
        return params_shardings, params
    return params, None


def abstract_state(tx: Any, params: Any, params_shardings: Any = None, **kwargs) -> Any:
    """``jax.eval_shape(tx.init, params)`` with the :func:`state_sharding` of every array.

    The result (``jax.ShapeDtypeStruct``\\ s carrying shardings) is what ``jax.jit(...).lower``
    and an orbax restore (``ocp.StandardCheckpointer().restore(path, target)``) take to build
    the state directly in its sharded layout. ``params`` may be sharded arrays (then
    ``params_shardings`` defaults to theirs) or ``ShapeDtypeStruct``\\ s.

    Args:
      tx: the optimizer (any ``optax.GradientTransformation``).
      params: the parameters: sharded arrays or ``ShapeDtypeStruct``\\ s.
      params_shardings: the parameters' shardings (default: those of ``params``).
      **kwargs: passed on to :func:`state_sharding` (``mesh=``).

    Returns:
      The state's ``jax.ShapeDtypeStruct``\\ s, each with its :func:`state_sharding`; nothing is
      computed or allocated.

    References:
      JAX documentation, "Distributed arrays and automatic parallelization" (the
      ``NamedSharding`` / ``PartitionSpec`` model of the layouts).

    Examples:
      ADA-DIAG's accumulator (a tree like the parameters) is split like the parameter:

      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
      >>> sharding = NamedSharding(mesh, P("model", None))
      >>> params = jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=sharding)
      >>> target = so.sharding.abstract_state(so.ada_diag(0.1, 1e-3), params)
      >>> [(x.shape, tuple(x.sharding.spec)) for x in jax.tree.leaves(target) if x.ndim]
      [((4, 3), ('model', None))]
    """
    shape = jax.eval_shape(tx.init, params)
    refs, shape_params = _shardings_of(params, params_shardings)
    shardings = state_sharding(shape, refs, shape_params, **kwargs)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shape, shardings
    )


def init(tx: Any, params: Any, params_shardings: Any = None, **kwargs) -> Any:
    """``tx.init(params)`` under ``jax.jit`` with the state laid out by :func:`state_sharding`.

    ``params`` are the (sharded) parameters; ``params_shardings`` default to theirs. The sketch
    is created sharded: no device ever holds a whole ``sketch_size x d`` array.

    Args:
      tx: the optimizer (any ``optax.GradientTransformation``).
      params: the (sharded) parameters.
      params_shardings: the parameters' shardings (default: those of ``params``).
      **kwargs: passed on to :func:`state_sharding` (``mesh=``).

    Returns:
      ``tx.init(params)``, each array laid out by :func:`state_sharding`.

    References:
      JAX documentation, "Distributed arrays and automatic parallelization" (the
      ``NamedSharding`` / ``PartitionSpec`` model of the layouts).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
      >>> params = jax.device_put(jnp.zeros((4, 3)), NamedSharding(mesh, P("model", None)))
      >>> tx = so.ada_fd(0.1, sketch_size=2, delta=1e-3)
      >>> state = so.sharding.init(tx, params)
      >>> [tuple(x.sharding.spec) for x in jax.tree.leaves(state) if x.ndim == 2]
      [(None, 'model'), (), ()]
    """
    refs, shape_params = _shardings_of(params, params_shardings)
    shardings = state_sharding(jax.eval_shape(tx.init, params), refs, shape_params, **kwargs)
    return jax.jit(tx.init, out_shardings=shardings)(params)


def constrain(state: Any, params_shardings: Any, params: Any = None, **kwargs) -> Any:
    """``jax.lax.with_sharding_constraint`` of a state to its :func:`state_sharding`.

    For use inside a jitted training step when the step's ``out_shardings`` are not given
    (e.g. a state nested in a larger train state): ``opt_state = constrain(opt_state,
    params_shardings, params)``. Inside ``jit`` the parameters are tracers, so pass the
    shardings as ``NamedSharding``\\ s (or ``PartitionSpec``\\ s under ``jax.set_mesh``) and the
    parameters (tracers are fine) for their shapes. It needs ``AxisType.Auto`` mesh axes (with
    ``AxisType.Explicit`` the shardings are part of the types already).

    Args:
      state: the optimizer state (tracers inside ``jit``).
      params_shardings: the parameters' shardings, as for :func:`state_sharding`.
      params: the parameters for their shapes (tracers are fine).
      **kwargs: passed on to :func:`state_sharding` (``mesh=``).

    Returns:
      ``state``, its arrays constrained to their :func:`state_sharding`.

    References:
      JAX documentation, "Distributed arrays and automatic parallelization"
      (``jax.lax.with_sharding_constraint``).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Auto,))
      >>> sharding = NamedSharding(mesh, P("model", None))
      >>> tx = so.ada_diag(0.1, 1e-3)
      >>> @jax.jit
      ... def step(grads, state, params):
      ...     updates, state = tx.update(grads, state, params)
      ...     return so.sharding.constrain(state, sharding, params)
      >>> params = jnp.zeros((4, 3))
      >>> state = tx.init(params)
      >>> jax.tree.structure(step(params + 1.0, state, params)) == jax.tree.structure(state)
      True
    """
    shardings = state_sharding(state, params_shardings, params, **kwargs)
    return jax.lax.with_sharding_constraint(state, shardings)
