r"""The one per-leaf driver under every transform: grouping, bad input, compile-once.

Every ``sketchopt`` transform treats each leaf of the parameter pytree on its own (block-diagonal
AdaGrad, Duchi et al. Cor. 14): a *leaf rule* says how one leaf's state is created and stepped,
and :func:`leafwise` turns it into an Optax ``GradientTransformationExtraArgs``. The driver owns
everything around the arithmetic, once for all families:

**Grouping.** Leaves with the same shape, state dtype (and, under an explicit-sharding mesh, the
same sharding) form a *group*; a group's per-leaf states are stored stacked along a leading axis
in one :class:`LeafGroups` container, and one ``vmap`` of the leaf step runs the whole group. The
compiled program therefore grows with the number of distinct leaf shapes, not of leaves (a
transformer's 24 identical layers compile once). A group of one leaf is stored as that leaf's
value, without the stacking axis, and stepped without ``vmap``, its donated sketch updated in
place: XLA shares a buffer only with a result of the very same shape, so a ``(1, m, d)`` sketch
stepped as ``(m, d)`` was copied whole at every step (0.10 and before; :func:`migrate` reads
those states). (A stacked group's rows may still be copied once per step: inside its ``vmap``
the row insertion becomes a gather and a scatter; ``ada_fd``'s are, ``fd_son``'s are not.)
What remains per leaf is one slice of the group's update, kept a plain copy (see
:func:`_masked_updates`). Under a rule that is exact under zero padding (``LeafRule.paddable``:
the FD-family and random-projection sketches, the diagonal) the groups of *small* leaves
(:data:`SMALL_LEAF`), a network's biases and norms of many sizes, are stepped as one group
zero-padded to the widest of them (:func:`step_plan`); the state keeps each group at its own
size, so only this small slice of it is copied per step.

**Batched factorizations** (on a GPU or TPU; on the CPU with
:func:`sketchopt.batched_solves`). The groups' steps are traced once each and evaluated together
(:func:`sketchopt._solvers.run_lockstep`): the small ``eigh`` and QR calls of all groups run as
one batched call per kind and level of dependence, so the number of solver calls per update does
not grow with the number of groups (a GPU pays a launch for each).

**State layout.** A transform's state is a NamedTuple, equal by value and printable like
Optax's, with the scalars ``count`` and ``nonfinite_count`` and one field per per-leaf value of
the rule, of two kinds (``LeafRule.param_fields`` says which):

* *parameter-shaped* fields -- values with one entry per coordinate of the leaf (the diagonal
  metric's accumulator, dual averaging's gradient sum and anchor, FTRL's ``z`` and ``sqrt(n)``,
  RDA's average) -- are trees with the parameters' structure and shapes (a per-leaf structure
  such as ``DiagonalMetricState`` holds one such tree per array). ``optax.tree.map_params``
  reaches them and maps them with a parameter-shaped ``rest`` (partition specs, casts), and
  under a mesh they are laid out like their parameters. The step stacks a group's leaves for
  its ``vmap`` and writes them back.
* every other field -- sketches, Gram matrices, inverses, per-leaf scalars -- is a
  :class:`LeafGroups` of stacked groups: a *non-parameter* field for ``map_params``
  (``transform_non_params`` receives the whole container), laid out by
  :func:`sketchopt.sharding.state_sharding` (each ``(..., d)`` array split like its flattened
  parameter). Over a tree without leaves it is one empty array (:func:`no_leaves`), the leaf
  ``map_params``'s placeholder needs.

``init`` takes arrays, tracers and ``jax.ShapeDtypeStruct``\ s (an abstract leaf stands for a
zero parameter, as in Optax: the state of ``x_1 = 0``); ``jax.eval_shape(tx.init, params)``
gives the abstract state. :func:`migrate` converts states saved by earlier versions.

**Bad input, one policy.** A leaf update is *skipped* -- its update is zero, its state is left
bit-identical and the transform's ``nonfinite_count`` grows by one -- when its gradient holds NaN
or Inf, or when its step produces a non-finite update or a non-finite state array. The gradient is
checked first and handed to the rule as ``valid`` (a rule returns its state bit-identical for an
invalid, zeroed gradient, by selection rather than ``lax.cond``, so that a donated state is never
copied); the update and the state are checked after the step, except for a rule that keeps
them finite by construction and bounds its update (``LeafRule.update_bound``: ADA-DIAG), whose
step is then one read of the gradient and one fused pass. The one exception is an array a
state class lists in its ``GUARDED`` attribute: the ``m x d`` rows of a sketch, which its family
keeps finite by construction (power-of-two scaled units, see :mod:`sketchopt._numerics`) and whose
re-check, or restoring, would cost a pass over the sketch at every step. Such a sketch is kept or
dropped as a whole (:func:`_commit`): on a step skipped for its result (a finite gradient, a
non-finite update) it keeps the gradient it absorbed, small fields and rows alike, while the
update is zero, the rest of the leaf's state is restored and the skip is counted. Integer
gradients raise ``TypeError`` and a gradient whose shape differs from the one the state was built
for raises ``ValueError``, at trace time.

**Compile once.** :func:`compiled` wraps a transform factory so that its ``init`` and ``update``
each run as one cached, compiled unit: outside ``jit`` an update costs one dispatch and compiles
only the first time, also when the transform is rebuilt with new hyperparameter values
(``optax.inject_hyperparams`` rebuilds it at every step), because the factory's numeric
arguments are passed to the compiled unit as traced values and only the rest (sizes, flags,
schedules, metric objects) keys the cache. Inside an outer ``jit`` the unit is inlined as usual.

**Sharding.** Under an ``AxisType.Explicit`` mesh ``init`` lays each state array out like its
parameter (``(..., d)`` arrays sharded along ``d``, see :mod:`sketchopt.sharding`), so plain
``tx.init(params)`` -- what ``nnx.Optimizer`` and ``TrainState`` call -- never replicates a sketch.
A leaf split along any of its axes is flattened to its sketch's layout with an explicit output
sharding (:func:`sketchopt.sharding.flat_spec`), and its update is shaped back to the leaf's
own: ``init`` and ``update``, eager or jitted, give states of one sharding type.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sketchopt import _groups, _layouts, _numerics, _partitioning, _solvers

__all__ = [
    "GROUP_AXIS",
    "LeafContext",
    "LeafGroups",
    "LeafRule",
    "LeafSpec",
    "Layout",
    "SMALL_LEAF",
    "all_leaves",
    "any_leaf",
    "compiled",
    "grouped",
    "leafwise",
    "per_leaf",
    "require_params",
    "select_leaves",
    "step_plan",
]

# The group context lives below the driver, where the numerics it steps can use it
# (``sketchopt._groups``); its names stay importable from here.
GROUP_AXIS = _groups.GROUP_AXIS
all_leaves = _groups.all_leaves
any_leaf = _groups.any_leaf
grouped = _groups.grouped
select_leaves = _groups.select_leaves


# ----------------------------------------------------------------------------------------------
# Layout and the LeafGroups container.


class LeafSpec(NamedTuple):
    """Static facts about one leaf: its position in the flattened tree, its shape, the dtype its
    state is kept in (at least float32), the parameter's own dtype and its key path in the
    parameter tree (``jax.tree_util.keystr``)."""

    index: int
    shape: tuple[int, ...]
    dtype: np.dtype
    param_dtype: np.dtype
    path: str = ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which leaves form which group: the static part of every :class:`LeafGroups`.

    ``shapes[i]`` and ``dtypes[i]`` are leaf ``i``'s shape and parameter dtype (in the order of
    ``jax.tree.leaves(params)``); ``groups[j]`` lists the leaves of group ``j``, in order;
    ``specs[j]`` is the group's ``PartitionSpec`` under an explicit mesh (``None`` otherwise);
    ``paths[i]`` is leaf ``i``'s key path in the parameter tree (``jax.tree_util.keystr``).
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    specs: tuple[Any, ...]
    paths: tuple[str, ...]

    @property
    def num_leaves(self) -> int:
        return len(self.shapes)

    def stacked(self, j: int) -> bool:
        """Whether group ``j``'s values are stored stacked along a leading axis: for a group of
        several leaves; a group of one stores its leaf's value as it is (the module docstring:
        XLA then updates it in place)."""
        return len(self.groups[j]) > 1

    def leaf(self, i: int) -> LeafSpec:
        param_dtype = jnp.dtype(self.dtypes[i])
        dtype = _numerics.state_dtype(param_dtype)
        return LeafSpec(i, self.shapes[i], dtype, param_dtype, self.paths[i])

    @staticmethod
    def of(
        tree: Any,
        group_key: Callable[[str, tuple[int, ...]], Any] | None = None,
        dtypes: Sequence[Any] | None = None,
    ) -> Layout:
        """The grouping of a parameter tree's leaves (arrays, tracers, ``ShapeDtypeStruct``\\ s).

        ``group_key(path, shape)``, when given, also separates leaves of one shape (a rule whose
        per-leaf state depends on the path: :attr:`LeafRule.group_key`). ``dtypes``, when
        given, are the leaves' dtypes in place of their own.
        """
        with_paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        paths = tuple(jax.tree_util.keystr(path) for path, _ in with_paths)
        if dtypes is None:
            dtypes = [_dtype_of(leaf) for _, leaf in with_paths]
        shapes, names, keys = [], [], []
        for path, (_, leaf), own in zip(paths, with_paths, dtypes, strict=True):
            shape = tuple(int(s) for s in np.shape(leaf))
            dtype = jnp.dtype(own).name
            shapes.append(shape)
            names.append(dtype)
            extra = None if group_key is None else group_key(path, shape)
            keys.append((shape, dtype, _explicit_spec(leaf), extra))
        order: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            order.setdefault(key, []).append(i)
        groups = tuple(tuple(ix) for ix in order.values())
        specs = tuple(key[2] for key in order)
        return Layout(tuple(shapes), tuple(names), groups, specs, paths)


def _dtype_of(leaf):
    dtype = getattr(leaf, "dtype", None)
    return dtype if dtype is not None else jnp.asarray(leaf).dtype


def _explicit_spec(leaf):
    """A parameter's ``PartitionSpec`` when its sharding is part of its type (explicit mesh)."""
    if not _partitioning.explicit_mesh():
        return None
    try:
        spec = jax.typeof(leaf).sharding.spec
    except Exception:  # noqa: BLE001 - e.g. a NumPy array: not sharded
        return None
    spec = tuple(spec)
    return None if all(entry is None for entry in spec) else spec


@jax.tree_util.register_pytree_with_keys_class
class LeafGroups:
    """Per-leaf values of a transform state, stacked by group (see :class:`Layout`).

    ``groups[j]`` holds the values of the leaves ``layout.groups[j]`` stacked along a new leading
    axis (any pytree: a sketch state, a running sum, ...); a group of one leaf holds that leaf's
    value as it is, without the stacking axis (:meth:`Layout.stacked`). The layout is static
    (part of the pytree structure), so a state carries the shapes it was built for;
    :func:`per_leaf` (and the public :func:`sketchopt.per_leaf_states`) unstacks it into a tree
    like the parameters.

    Fields of the stacked values read through: for groups of ``FrequentDirectionsState``\\ s,
    ``groups.rows`` is the :class:`LeafGroups` of their ``rows`` (``(k, n, d)`` per group of
    ``k > 1`` leaves, ``(n, d)`` for a group of one).
    """

    __slots__ = ("groups", "layout")

    def __init__(self, groups: tuple, layout: Layout):
        self.groups = tuple(groups)
        self.layout = layout

    def tree_flatten_with_keys(self):
        keys = [jax.tree_util.SequenceKey(j) for j in range(len(self.groups))]
        return list(zip(keys, self.groups, strict=True)), self.layout

    @classmethod
    def tree_unflatten(cls, layout, groups):
        return cls(tuple(groups), layout)

    def __repr__(self):
        sizes = ", ".join(f"{len(g)} x {self.layout.shapes[g[0]]}" for g in self.layout.groups)
        return f"LeafGroups(leaves=[{sizes}], groups={jax.tree.map(_describe, self.groups)})"

    # Value semantics, as Optax's NamedTuple states have: two containers are equal when they
    # were built for the same layout and their groups compare equal (element by element, as a
    # tuple compares; for arrays that is the same error a NamedTuple state of arrays gives).
    def __eq__(self, other):
        if not isinstance(other, LeafGroups):
            return NotImplemented
        return self.layout == other.layout and self.groups == other.groups

    def __hash__(self):
        return hash((self.layout, self.groups))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            fields = tuple(getattr(g, name) for g in self.groups)
        except AttributeError:
            raise AttributeError(
                f"LeafGroups: the stacked per-leaf values have no field {name!r}"
            ) from None
        return LeafGroups(fields, self.layout)

    def as_dict(self) -> dict[str, Any]:
        """The per-leaf values keyed by each leaf's path in the parameter tree the state was
        built for (``jax.tree_util.keystr``), e.g. ``{"['conv1']['kernel']": rows, ...}``."""
        return dict(zip(self.layout.paths, per_leaf(self), strict=True))

    def leaf(self, i: int):
        """Leaf ``i``'s value (unstacked)."""
        for j, members in enumerate(self.layout.groups):
            if i in members:
                if not self.layout.stacked(j):
                    return self.groups[j]
                k = members.index(i)
                return jax.tree.map(lambda x, k=k: x[k], self.groups[j])
        raise IndexError(f"leaf {i} is not in this state ({self.layout.num_leaves} leaves)")


def _describe(x) -> str:
    """A short description of a state leaf for ``repr``: ``float32[2, 3]`` for an array (or
    ``ShapeDtypeStruct``), ``repr`` for anything else (``optax.tree.map`` results: dtypes,
    shardings, ...)."""
    if hasattr(x, "dtype") and hasattr(x, "shape"):  # (a PRNG key's dtype is no NumPy dtype)
        return f"{x.dtype}{list(np.shape(x))}"
    return repr(x)


#: What a field of stacked groups holds for a parameter tree without leaves: one empty array, a
#: pytree *leaf*. ``optax.tree.map_params`` calls ``init`` on a leafless placeholder and then
#: matches the result against the real state as a prefix: a leaf there stands for the whole
#: ``LeafGroups`` of the real state (handed to ``transform_non_params``), where an empty
#: ``LeafGroups`` (another pytree node) would not match.
def no_leaves() -> jax.Array:
    """The value of a stacked field over a tree without leaves (see above)."""
    return jnp.zeros((0,), jnp.int32)


def pack_leaves(treedef, values):
    """Per-leaf values (one pytree per leaf of ``treedef``, all of one structure) -> that
    structure with, in place of each array, a tree of the parameters' structure."""
    return jax.tree.transpose(treedef, jax.tree.structure(values[0]), treedef.unflatten(values))


def unpack_leaves(treedef, packed, outer=None) -> list:
    """The inverse of :func:`pack_leaves`: one value per leaf of ``treedef``, in leaf order.

    ``outer`` is the per-leaf values' structure when known (then ``packed`` must be exactly
    ``outer`` of ``treedef`` trees, or this raises); otherwise it is read from ``packed``."""
    if treedef.num_leaves == 0:
        return []
    if outer is None:
        outer = jax.tree.structure(packed, is_leaf=lambda n: jax.tree.structure(n) == treedef)
    return treedef.flatten_up_to(jax.tree.transpose(outer, treedef, packed))


def per_leaf(groups: LeafGroups) -> list:
    """The per-leaf values of a :class:`LeafGroups`, in leaf order."""
    return [groups.leaf(i) for i in range(groups.layout.num_leaves)]


def _stack(values: Sequence[Any], layout: Callable[[Any], Any] | None):
    """One group's stored value from its leaves' values: stacked, or for one leaf its value
    (:meth:`Layout.stacked`); ``layout`` lays it out under an explicit mesh."""
    stacked = values[0] if len(values) == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *values)
    return stacked if layout is None else layout(stacked)


# ----------------------------------------------------------------------------------------------
# Leaf rules and the driver.


class LeafContext(NamedTuple):
    """What a leaf step may read besides its own state: the transform's step ``count`` (the
    number of earlier updates, as Optax schedules take it), the leaf's static ``shape``, the
    hyperparameters the rule evaluated once for all leaves (``hyper``) and, for a rule with
    :class:`Phases`, the static variant of this update's branch (``phase``; ``None`` without)."""

    count: jax.Array
    shape: tuple[int, ...]
    hyper: Any
    phase: Any = None


class Phases(NamedTuple):
    """Static variants of a rule's step that follow the step count (``kron_sketched``'s
    sketches absorbing every ``N`` steps and its roots recomputed every ``K``).

    The driver steps the whole update under one ``lax.switch(index(count), ...)`` whose branch
    ``i`` traces every leaf with ``LeafContext.phase = variants[i]``: each branch is one
    straight program whose factorizations join the update's batched calls, and the steps
    between refreshes run none of them. (A ``lax.cond`` per leaf would keep each leaf's
    factorizations out of the batched calls: on a TPU one while loop per leaf group.)

    Attributes:
      variants: the hashable static values, one per branch (each one reachable).
      index: ``index(count) -> int32``, the branch of the update at step ``count``.
    """

    variants: tuple
    index: Callable[[jax.Array], jax.Array]


class LeafTail(NamedTuple):
    """A coordinatewise stage after a rule's step (momentum on its steps), applied to each leaf's
    update in the leaf's own shape and layout: no stacking, flattening or padding copies its
    buffer (a parameter-shaped field of the step would be stacked per group and written back).

    Attributes:
      field: the state field that holds the stage's buffer, a tree like the parameters in
        their state dtype (at least float32), zeros at ``init``.
      step: ``step(ctx, u, buffer, skipped) -> (u, buffer)`` on one leaf's update (state dtype,
        zero where the leaf was ``skipped``) and buffer; with ``skipped`` true it must return a
        zero update and the buffer bit-identical.
    """

    field: str
    step: Callable[..., tuple[jax.Array, jax.Array]]


class LeafRule(NamedTuple):
    """A per-leaf rule for :func:`leafwise`.

    Attributes:
      fields: names of the transform-state fields that hold per-leaf values (each becomes a
        :class:`LeafGroups`).
      init: ``init(spec: LeafSpec, param) -> tuple`` of per-leaf values, one per field (``param``
        is the parameter leaf, for rules that keep an anchor).
      step: ``step(ctx: LeafContext, g, values, x, valid) -> (update, values[, ok])`` on the
        flattened gradient ``g`` (state dtype, zeroed when not ``valid``) and parameter ``x``
        (``None`` unless ``needs_params``); returns the flat update (``x_{t+1} - x_t``) and the
        new values, and optionally ``ok``, false where the rule itself rejects the step (SON's
        to-sketch vector overflowing at a finite gradient): the leaf is then skipped like a
        non-finite one. With ``valid`` false it must return ``values`` bit-identical.
      hyper: ``hyper(count) -> pytree``, evaluated once per update for all leaves (schedules).
      needs_params: ``None``, or the name under which a missing ``params`` is reported.
      paddable: whether the rule is exact under zero padding: coordinates appended to a flat
        leaf, in their initial state with zero gradient and parameter, leave the step of the
        others unchanged. The driver then steps all small leaves as one padded group
        (:data:`SMALL_LEAF`); ``ctx.shape`` is the padded ``(width,)`` there, so a rule whose
        step reads the shape is not paddable.
      group_key: ``None``, or ``group_key(path, shape) -> hashable`` for a rule whose per-leaf
        state depends on the leaf's path (``LeafSpec.path``) and not only on its shape: leaves
        of one shape with different keys form different groups.
      param_fields: the fields (of ``fields``) whose per-leaf value is laid out like the
        parameter: every array in it has the leaf's ``size`` entries for every leaf (a diagonal
        accumulator, dual averaging's gradient sum and anchor). ``init`` and ``step`` see them
        flat, as the other fields; the state stores them as trees with the parameters'
        structure and shapes (module docstring, "State layout").
      coordinatewise: whether every field is parameter-shaped and the step acts coordinate by
        coordinate on arrays of any shape (ADA-DIAG and its dual averaging). The driver then
        steps each leaf in its own shape and layout, as Optax does: no flattening (a relayout
        of a tiled TPU array), no stacking, no padding, no ``vmap``.
      update_bound: ``None``, or ``update_bound(hyper) -> scalar`` for a rule whose step maps
        every finite gradient to a finite state and an update bounded entrywise by that value
        (ADA-DIAG: ``|eta_t|``). The driver then checks the gradient and the bound (a scalar)
        only, not the update and the state after the step, which would take one more pass over
        them and a separate select (module docstring, "Bad input").
      phases: ``None``, or the :class:`Phases` of a step whose program follows the step count:
        the update is one ``lax.switch`` over them, each leaf's step reading ``ctx.phase``.
      tail: ``None``, or a :class:`LeafTail` applied to every leaf's update after the step
        (outside the ``switch`` of ``phases``).
      shaped: whether ``step`` takes ``g`` (and ``x``) in the leaf's own shape and returns the
        update in it: a group's gradients are then stacked as they are, not flattened (on a TPU
        or GPU a tiled matrix's flat vector is a relayout copy, and so is the way back); its
        state fields are laid out as for any rule. Not with ``paddable``; flattened all the same
        under an explicit mesh (:func:`sketchopt.sharding.flat_spec`'s layout).
    """

    fields: tuple[str, ...]
    init: Callable[..., tuple]
    step: Callable[..., tuple[jax.Array, tuple]]
    hyper: Callable[[jax.Array], Any] = lambda count: None
    needs_params: str | None = None
    paddable: bool = False
    group_key: Callable[[str, tuple[int, ...]], Any] | None = None
    param_fields: tuple[str, ...] = ()
    coordinatewise: bool = False
    update_bound: Callable[[Any], jax.Array] | None = None
    phases: Phases | None = None
    tail: LeafTail | None = None
    shaped: bool = False


def at_step(hyperparam, count, dtype=None):
    """A hyperparameter (a constant or an Optax schedule) at step ``count``, the number of
    earlier steps as Optax schedules take it; as a ``dtype`` scalar when ``dtype`` is given."""
    value = hyperparam(count) if callable(hyperparam) else hyperparam
    return value if dtype is None else jnp.asarray(value, dtype)


def require_params(params, name: str) -> None:
    """``ValueError`` for a rule that needs the current parameters when they are missing."""
    if params is None:
        raise ValueError(f"{name} needs the current parameters: call update(grads, state, params)")


def _check_gradient_leaf(i: int, g, layout: Layout) -> None:
    dtype = _dtype_of(g)
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"gradients must be floating point arrays, got dtype {dtype} for leaf {i}; "
            "integer parameters cannot be trained by gradient transformations"
        )
    if tuple(np.shape(g)) != layout.shapes[i]:
        raise ValueError(
            f"gradient leaf {i} has shape {tuple(np.shape(g))}, but the optimizer state was built "
            f"for a parameter of shape {layout.shapes[i]}: pass gradients with the parameters' "
            "structure and shapes (or re-initialize the state)"
        )


def _is_sketch(node) -> bool:
    """Whether ``node`` is a state whose class lists ``GUARDED`` fields (a sketch, or a leaf state
    that keeps one as a unit): the policy reads and restores only its other fields."""
    return isinstance(node, tuple) and bool(getattr(type(node), "GUARDED", ()))


def _small_fields(sketch) -> list:
    """The arrays of a sketch's fields that are not ``GUARDED``, which the policy checks."""
    guarded = type(sketch).GUARDED
    fields = zip(sketch._fields, sketch, strict=True)
    return jax.tree.leaves([v for f, v in fields if f not in guarded])


def _finite(x) -> jax.Array:
    """Whether every entry of ``x`` is finite, as one fused reduction (``max |x|`` is ``inf`` or
    ``nan`` exactly when some entry is): no boolean array is materialized."""
    x = jnp.asarray(x)
    if x.size == 0 or not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.bool_(True)
    return jnp.isfinite(jnp.max(jnp.abs(x)))


def _all_finite(arrays) -> jax.Array:
    checks = [_finite(a) for a in arrays]
    return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def _policy_step(rule: LeafRule, ctx: LeafContext, out_dtype, g, values, x):
    """One leaf under the non-finite policy (module docstring): ``(update, values, skipped)``.

    The update is checked in ``out_dtype``, the parameter's dtype (a bf16 update can overflow
    where its float32 value did not). It is returned *unmasked*: :func:`_masked_updates` zeroes
    the skipped leaves' updates for the whole group.
    """
    valid = _finite(g)
    g = jnp.where(valid, g, jnp.zeros((), g.dtype))
    update, new, *rule_ok = rule.step(ctx, g, values, x, valid)
    new = _partitioning.like(new, values)  # a state keeps its layout from step to step
    if rule.update_bound is None:
        parts = jax.tree.leaves(new, is_leaf=_is_sketch)
        checked = [a for x in parts for a in (_small_fields(x) if _is_sketch(x) else [x])]
        ok = valid & _all_finite([update.astype(out_dtype), *checked])
    else:  # finite by construction, |update| <= bound (rounding is monotone): a scalar check
        bound = jnp.asarray(rule.update_bound(ctx.hyper))
        ok = valid & jnp.isfinite(bound.astype(out_dtype))
    if rule_ok:
        ok = ok & rule_ok[0]
    return update, _commit(new, values, ok), jnp.logical_not(ok)


def _commit(new, old, ok):
    """The state a step leaves under the policy (module docstring): ``new`` where ``ok``, else
    ``old``, except for a sketch -- a state class with ``GUARDED`` fields -- which is kept or
    dropped as a whole, so that its rows and its small fields always describe one matrix.

    A sketch's rows are never selected against their old buffer (that would keep both, a copy of
    the rows per step), and a rule returns them bit-identical for an invalid gradient by itself.
    So the rest of the sketch follows the rows: on a step skipped for its result (a non-finite
    update or state array from a finite gradient) the sketch keeps the gradient it absorbed,
    while the update is zero, the other state fields are the old ones and the skip is counted.
    Only if one of the sketch's own small fields is non-finite -- which its construction rules
    out -- are those fields restored.
    """

    def unit(n, o):
        whole = _all_finite(_small_fields(n))
        guarded = type(n).GUARDED
        fields = zip(n._fields, n, o, strict=True)
        return type(n)(*(v if f in guarded else keep(whole, v, w) for f, v, w in fields))

    def keep(flag, n, o):
        return jax.tree.map(lambda a, b: jnp.where(flag, a, b), n, o)

    def merge(n, o):
        return unit(n, o) if _is_sketch(n) else jnp.where(ok, n, o)

    return jax.tree.map(merge, new, old, is_leaf=_is_sketch)


def _masked_updates(us, skipped):
    """A group's stacked updates with the skipped leaves' set to zero.

    On the CPU, for several leaves, the mask is applied under a ``lax.cond`` (taken only when
    some leaf was skipped), whose result XLA materializes once. A plain select would be fused,
    with the step's whole elementwise tail, into every leaf's slice of the stacked update: one
    large kernel per leaf, so that XLA:CPU's compile time grew with the number of leaves
    (FD-SON on a 24-layer transformer tree: 21 s against 9 s for 4 layers of the same shapes;
    12.6 s with the ``cond``). On the accelerator path the select: there the ``cond``'s copy is
    a whole pass over the updates (``kron_fd``'s step between refreshes on that tree, compiled
    alone for a TPU: 1.91x Adam's bytes with the select, 2.23x with the ``cond``, in the same
    compile time).
    """

    def mask(u):
        return jnp.where(skipped.reshape((-1,) + (1,) * (u.ndim - 1)), jnp.zeros((), u.dtype), u)

    if us.shape[0] == 1 or _solvers.accelerator_path_active():
        return mask(us)
    return jax.lax.cond(jnp.any(skipped), mask, lambda u: u, us)


def _run_group(rule, ctx, out_dtype, gs, values, xs):
    """All leaves of one group: a direct call for one leaf, one ``vmap`` for several. The step
    is traced at a group's top level (:func:`sketchopt._solvers.group_level`), where its
    factorizations join the update's batched calls."""
    step = functools.partial(_policy_step, rule, ctx, out_dtype)

    def traced(g, values, x):
        with _solvers.group_level():
            return step(g, values, x)

    if gs.shape[0] == 1:
        take = functools.partial(jax.tree.map, lambda a: a[0])
        put = functools.partial(jax.tree.map, lambda a: a[None])
        u, new, skipped = traced(gs[0], take(values), None if xs is None else xs[0])
        return _masked_updates(u[None], skipped[None]), put(new), skipped[None]
    with _groups.group_context(True):
        us, new, skipped = jax.vmap(traced, axis_name=GROUP_AXIS)(gs, values, xs)
    return _masked_updates(us, skipped), new, skipped


#: Leaves of at most this many entries are *small*: under a paddable rule (``LeafRule.paddable``)
#: the groups of small leaves of one dtype are stepped together, zero-padded to the widest of
#: them, so that a network's biases and norms compile one step, not one per distinct size.
SMALL_LEAF = 4096


def step_plan(layout: Layout, paddable: bool) -> tuple[tuple[int, ...], ...]:
    """Which groups are stepped together: one tuple of group indices per compiled step.

    Without padding every group is its own step. With it, the groups of small leaves (not laid
    out by an explicit mesh) are merged by parameter dtype; the stored state keeps its layout
    (each group at its own size), only the step runs on the padded stack. Only on one device:
    under ``AxisType.Auto`` sharding a leaf's layout is invisible at trace time, and
    concatenating leaves sharded along ``d`` would make XLA gather them.
    """
    if not paddable or jax.device_count() > 1:
        return tuple((j,) for j in range(len(layout.groups)))
    merged: dict[str, list[int]] = {}
    plan: list[Any] = []
    for j, (members, spec) in enumerate(zip(layout.groups, layout.specs, strict=True)):
        i = members[0]
        if spec is None and math.prod(layout.shapes[i]) <= SMALL_LEAF:
            dtype = layout.dtypes[i]
            if dtype not in merged:
                merged[dtype] = []
                plan.append(merged[dtype])  # the merged step takes its first group's place
            merged[dtype].append(j)
        else:
            plan.append((j,))
    return tuple(tuple(p) for p in plan)


def _padded(values, fresh):
    """Stacked per-leaf ``values`` written into copies of ``fresh``, the initial state of one
    wider leaf: every array keeps its entries at the origin and the initial state beyond."""

    def pad(v, init):
        if v.shape[1:] == init.shape:
            return v
        wide = jnp.broadcast_to(init, (v.shape[0], *init.shape))
        return jax.lax.dynamic_update_slice(wide, v.astype(init.dtype), (0,) * v.ndim)

    return jax.tree.map(pad, values, fresh)


def _unpadded(values, like):
    """Inverse of :func:`_padded`: each array cut back to the shape of ``like``'s."""
    return jax.tree.map(
        lambda v, ref: v if v.shape == ref.shape else jax.lax.slice(v, (0,) * v.ndim, ref.shape),
        values,
        like,
    )


def _flat_spec(spec, shape):
    """Under an explicit mesh, the ``PartitionSpec`` of a leaf's flattened vector, laid out as
    its state's ``(..., d)`` arrays (:func:`sketchopt.sharding.flat_spec`); ``None`` otherwise."""
    if spec is None or not _partitioning.explicit_mesh():
        return None
    return _layouts.flat_spec(spec, shape, jax.sharding.get_abstract_mesh())


def _flatten(x, spec, dtype):
    """A leaf as its flat vector in ``dtype``. Under an explicit mesh the vector is laid out like
    the leaf's sketch; a leaf split along a non-leading axis has no contiguous flat layout, so
    this reshape moves its entries (one ``d``-sized all-to-all) rather than gathering them."""
    target = _flat_spec(spec, tuple(np.shape(x)))
    if target is None:
        return jnp.ravel(x).astype(dtype)
    return jnp.reshape(x, (-1,), out_sharding=target).astype(dtype)


def _shaped(x, spec, dtype):
    """A leaf in its own shape and layout, in ``dtype`` (a shaped rule's :func:`_flatten`)."""
    del spec
    return jnp.asarray(x).astype(dtype)


def _unflatten(u, shape, spec):
    """The inverse of :func:`_flatten`: a flat vector in the leaf's shape and layout (a
    shaped rule's update, already in it, as it is)."""
    if spec is None or not _partitioning.explicit_mesh():
        return u.reshape(shape)
    return jnp.reshape(u, shape, out_sharding=jax.sharding.PartitionSpec(*spec))


class _Fields:
    """A state's per-leaf fields at one update: the stacked values of a group, and the new state
    fields from the stepped groups' values (module docstring, "State layout").

    Fields of stacked groups (:class:`LeafGroups`) are read and written a group at a time;
    parameter-shaped fields (``LeafRule.param_fields``, trees like the parameters) are stacked
    from their leaves for the step and written back to them.
    """

    def __init__(self, rule, layout, treedef, state, leaves):
        self.layout, self.treedef, self.state = layout, treedef, state
        self.names = tuple(rule.fields)
        self.leaves = leaves  # {parameter-shaped field: its per-leaf values}

    def group(self, j):
        """Group ``j``'s values, one per field, stacked along a leading axis (flat leaves)."""
        members, spec = self.layout.groups[j], self.layout.specs[j]
        out = []
        for f in self.names:
            if f not in self.leaves:
                value = getattr(self.state, f).groups[j]
                if not self.layout.stacked(j):  # stored unstacked: one leading axis for the step
                    value = jax.tree.map(lambda a: a[None], value)
                out.append(value)
                continue
            per_leaf = [self.leaves[f][i] for i in members]
            out.append(
                jax.tree.map(
                    lambda *xs: jnp.stack([_flatten(x, spec, x.dtype) for x in xs]), *per_leaf
                )
            )
        return tuple(out)

    def assemble(self, stepped):
        """The new state fields from ``{group: stacked values}``."""
        layout = self.layout
        fields = {}
        for f_index, f in enumerate(self.names):
            if f not in self.leaves:
                groups = tuple(
                    stepped[j][f_index]
                    if layout.stacked(j)
                    else jax.tree.map(lambda a: a[0], stepped[j][f_index])
                    for j in range(len(layout.groups))
                )
                fields[f] = LeafGroups(groups, layout)
                continue
            per_leaf = [None] * layout.num_leaves
            for j, members in enumerate(layout.groups):
                spec = layout.specs[j]
                for k, i in enumerate(members):
                    shape = layout.shapes[i]
                    per_leaf[i] = jax.tree.map(
                        lambda a, k=k, shape=shape, spec=spec: _unflatten(a[k], shape, spec),
                        stepped[j][f_index],
                    )
            fields[f] = pack_leaves(self.treedef, per_leaf)
        return fields


def _group_step(rule, layout, steps, ctx, fields, flat, x_leaves):
    """One step of the group ``steps = (j,)``: ``{j: (us, values, skipped)}``
    (:func:`_run_group`)."""
    (j,) = steps
    members, spec = layout.groups[j], layout.specs[j]
    leaf = layout.leaf(members[0])
    # Under an explicit mesh a shaped rule's leaves are flattened too: its own reshape of a leaf
    # split along a middle axis would need the output's layout, which _flatten gives.
    laid_out = _shaped if rule.shaped and not _partitioning.explicit_mesh() else _flatten
    gs = jnp.stack([laid_out(flat[i], spec, leaf.dtype) for i in members])
    xs = None
    if x_leaves is not None:
        xs = jnp.stack([laid_out(x_leaves[i], spec, leaf.dtype) for i in members])
    ctx = ctx._replace(shape=leaf.shape)
    return {j: _run_group(rule, ctx, _dtype_of(flat[members[0]]), gs, fields.group(j), xs)}


def _merged_step(rule, layout, steps, ctx, fields, flat, x_leaves):
    """One padded step of the groups ``steps`` (see :func:`step_plan`).

    Returns ``{group: (us, values, skipped)}`` as :func:`_run_group` gives them, with each
    group's updates and values cut back to its own leaves' size.
    """
    first = layout.leaf(layout.groups[steps[0]][0])
    width = max(layout.leaf(layout.groups[j][0]).size for j in steps)
    wide = first._replace(shape=(width,))
    fresh = rule.init(wide, jnp.zeros((width,), first.param_dtype))  # a wide leaf's initial state

    def stacked(leaves, members):
        rows = jnp.stack([jnp.ravel(leaves[i]).astype(first.dtype) for i in members])
        return jnp.pad(rows, ((0, 0), (0, width - rows.shape[1])))

    gs, xs, values, own = [], [], [], []
    for j in steps:
        members = layout.groups[j]
        gs.append(stacked(flat, members))
        if x_leaves is not None:
            xs.append(stacked(x_leaves, members))
        own.append(fields.group(j))
        values.append(_padded(own[-1], fresh))
    ctx = ctx._replace(shape=(width,))
    us, new, skip = _run_group(
        rule,
        ctx,
        _dtype_of(flat[layout.groups[steps[0]][0]]),
        jnp.concatenate(gs),
        jax.tree.map(lambda *a: jnp.concatenate(a), *values),
        jnp.concatenate(xs) if xs else None,
    )
    out, start = {}, 0
    for j, values_j in zip(steps, own, strict=True):
        k, size = len(layout.groups[j]), layout.leaf(layout.groups[j][0]).size
        new_j = jax.tree.map(lambda a, s=start, k=k: a[s : s + k], new)
        out[j] = (us[start : start + k, :size], _unpadded(new_j, values_j), skip[start : start + k])
        start += k
    return out


def _step_groups(rule, layout, count, hyper, fields, flat, x_leaves, phase=None):
    """Every group stepped (:func:`step_plan`): ``{group: (us, values, skipped)}``.

    The groups' steps run in lockstep (:func:`sketchopt._solvers.run_lockstep`): each is traced
    once, and their small dense factorizations run as one batched call per kind and level of
    dependence for the whole update, not one per group. Under an explicit mesh (the operands
    keep their own layouts) and with batching off the steps are traced one by one.
    """
    steps = [
        functools.partial(
            _merged_step if len(s) > 1 else _group_step,
            rule,
            layout,
            s,
            LeafContext(count, (), hyper, phase),
            fields,
            flat,
            x_leaves,
        )
        for s in step_plan(layout, rule.paddable)
    ]
    if _partitioning.explicit_mesh() or not _solvers.trace_key()[1]:
        outs = [step() for step in steps]
    else:
        outs = _solvers.run_lockstep(steps)
    return {j: out for stepped in outs for j, out in stepped.items()}


def _layout_of_state(rule, state, treedef, updates, param_leaves) -> Layout:
    """The layout an update steps by: that of the state's stacked fields; for a state of
    parameter-shaped fields only (``param_leaves``: each field's per-leaf values), the grouping
    of those fields' arrays (shape, state dtype and layout: the grouping is then only a plan of
    the step, nothing stored depends on it)."""
    layouts = {
        getattr(state, f).layout for f in rule.fields if isinstance(getattr(state, f), LeafGroups)
    }
    if len(layouts) > 1:
        raise ValueError("inconsistent optimizer state: per-leaf fields with different layouts")
    if layouts:
        return layouts.pop()
    if rule.param_fields and treedef.num_leaves:
        stored = [jax.tree.leaves(v)[0] for v in param_leaves[rule.param_fields[0]]]
        # the step's dtype: the stored state's, widened by the gradient's (a complex gradient of
        # a real accumulator, a float64 one under x64)
        dtypes = [
            jnp.promote_types(x.dtype, _numerics.state_dtype(_dtype_of(g)))
            for x, g in zip(stored, jax.tree.leaves(updates), strict=True)
        ]
        return Layout.of(treedef.unflatten(stored), rule.group_key, dtypes)
    return Layout.of(updates, rule.group_key)


def _materialized(params):
    """``params`` with every ``jax.ShapeDtypeStruct`` leaf replaced by zeros of its shape, dtype
    and sharding: ``init`` on abstract parameters builds the state of zero parameters (the
    papers' ``x_1 = 0`` for the rules that keep an anchor), as Optax's ``init`` does."""

    def one(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        sharding = x.sharding
        if isinstance(sharding, jax.sharding.NamedSharding):
            return jnp.zeros(x.shape, x.dtype, device=sharding)
        return jnp.zeros(x.shape, x.dtype)

    return jax.tree.map(one, params)


def _per_leaf_structure(rule, name):
    """The structure of one leaf's value of the field ``name`` (read from a one-coordinate leaf;
    nothing is computed)."""
    one = LeafSpec(0, (1,), jnp.dtype(jnp.float32), jnp.dtype(jnp.float32))
    f_index = rule.fields.index(name)
    value = jax.eval_shape(lambda: rule.init(one, jnp.zeros((1,), jnp.float32))[f_index])
    return jax.tree.structure(value)


def _param_field_leaves(rule, name, treedef, state) -> list:
    """Each leaf's value of the parameter-shaped field ``name``, for gradients of ``treedef``
    (``ValueError`` when the field was built for parameters of another structure)."""
    field = getattr(state, name)
    try:
        return unpack_leaves(treedef, field, _per_leaf_structure(rule, name))
    except (ValueError, TypeError):
        raise ValueError(
            f"the gradients have {treedef.num_leaves} leaves in the structure {treedef}, but "
            f"the optimizer state was built for parameters of another structure (its field "
            f"{name!r} is {jax.tree.structure(field)})"
        ) from None


def _empty_param_field(rule, name, params):
    """A parameter-shaped field over a tree without leaves: its per-leaf structure holding
    ``params`` itself at every array (``optax.tree.map_params``'s placeholder, or an empty
    container)."""
    structure = _per_leaf_structure(rule, name)
    return structure.unflatten([params] * structure.num_leaves)


def _initial_field(rule, f, params, treedef, layout, leaf_spec, per_leaf_values):
    """The ``f``-th field of a fresh state from each leaf's initial values: a tree like the
    parameters for a parameter-shaped field, else a :class:`LeafGroups` of stacked groups laid
    out like their parameters (module docstring, "State layout")."""
    name = rule.fields[f]
    if name in rule.param_fields:
        if not per_leaf_values:
            return _empty_param_field(rule, name, params)
        shaped = [
            jax.tree.map(lambda a, i=i: _unflatten(a, layout.shapes[i], leaf_spec[i]), values[f])
            for i, values in enumerate(per_leaf_values)
        ]
        return pack_leaves(treedef, shaped)
    if not per_leaf_values:
        return no_leaves()
    groups = []
    for j, (members, spec) in enumerate(zip(layout.groups, layout.specs, strict=True)):
        values = [per_leaf_values[i][f] for i in members]
        shape = layout.shapes[members[0]]
        groups.append(_stack(values, _explicit_layout(spec, shape, int(layout.stacked(j)))))
    return LeafGroups(tuple(groups), layout)


def _leaf_updates(layout, stepped, num_leaves):
    """Each leaf's update from its stepped group, in the leaf's shape and layout (the state
    dtype), and each group's skipped leaves (the policy of the module docstring, "Bad
    input")."""
    out = [None] * num_leaves
    for j, members in enumerate(layout.groups):
        us = stepped[j][0]
        for k, i in enumerate(members):
            out[i] = _unflatten(us[k], layout.shapes[i], layout.specs[j])
    return out, tuple(stepped[j][2] for j in range(len(layout.groups)))


def _tail_step(tail, ctx, out, layout, group_skips, treedef, field):
    """:class:`LeafTail`'s step on every leaf's update: the new updates and the new field."""
    skips = [None] * len(out)
    for members, skip in zip(layout.groups, group_skips, strict=True):
        for k, i in enumerate(members):
            skips[i] = skip[k]
    try:
        buffers = treedef.flatten_up_to(field)
    except (ValueError, TypeError):
        raise ValueError(
            f"the optimizer state's {tail.field!r} was built for parameters of another "
            f"structure ({jax.tree.structure(field)}, the gradients: {treedef})"
        ) from None
    stepped = [
        tail.step(ctx._replace(shape=u.shape), u, b, s)
        for u, b, s in zip(out, buffers, skips, strict=True)
    ]
    return [u for u, _ in stepped], treedef.unflatten([b for _, b in stepped])


def _coordinatewise_step(rule, layout, count, hyper, param_leaves, flat, x_leaves):
    """Every leaf of a coordinatewise rule (``LeafRule.coordinatewise``) stepped in its own shape
    and layout: ``(updates, skipped, {field: per-leaf values})``. Per leaf one read of the
    gradient (its finiteness) and one fused pass over the gradient and the state, which XLA
    updates in place; no flattening, stacking or padding copies the leaves."""
    out, news = [], []
    skipped = jnp.zeros((), jnp.int32)
    for i, g in enumerate(flat):
        leaf = layout.leaf(i)
        values = tuple(param_leaves[f][i] for f in rule.fields)
        x = None if x_leaves is None else jnp.asarray(x_leaves[i]).astype(leaf.dtype)
        ctx = LeafContext(count, leaf.shape, hyper)
        out_dtype = _dtype_of(g)
        u, new, skip = _policy_step(
            rule, ctx, out_dtype, jnp.asarray(g).astype(leaf.dtype), values, x
        )
        out.append(jnp.where(skip, jnp.zeros((), u.dtype), u).astype(out_dtype))
        news.append(new)
        skipped = skipped + skip.astype(jnp.int32)
    per_field = {f: [new[k] for new in news] for k, f in enumerate(rule.fields)}
    return out, skipped, per_field


def _checked_fields(rule: LeafRule) -> tuple[str, ...]:
    """``rule.fields``, after the checks of the flags that go together."""
    fields = tuple(rule.fields)
    unknown = set(rule.param_fields) - set(fields)
    if unknown:
        raise ValueError(f"param_fields {sorted(unknown)} are not fields of the rule {fields}")
    if rule.coordinatewise and set(rule.param_fields) != set(fields):
        raise ValueError("a coordinatewise rule keeps parameter-shaped fields only")
    if rule.coordinatewise and (rule.phases is not None or rule.tail is not None):
        raise ValueError("a coordinatewise rule has no phases and no tail")
    if rule.shaped and rule.paddable:
        raise ValueError("a shaped rule is not paddable (padding flattens the leaves)")
    return fields


def leafwise(rule: LeafRule, state_class: type) -> optax.GradientTransformationExtraArgs:
    """A gradient transformation from a per-leaf rule (module docstring).

    ``state_class`` is a NamedTuple with the fields ``count`` and ``nonfinite_count`` (int32
    scalars) and ``rule.fields``: each a :class:`LeafGroups` of stacked groups, or for the
    ``rule.param_fields`` a tree with the parameters' structure (module docstring, "State
    layout").
    """
    fields = _checked_fields(rule)

    def init_fn(params):
        params = _materialized(params)
        leaves, treedef = jax.tree.flatten(params)
        layout = Layout.of(params, rule.group_key)
        placed = zip(layout.groups, layout.specs, strict=True)
        leaf_spec = {i: spec for members, spec in placed for i in members}
        per_leaf_values = [
            rule.init(layout.leaf(i), _flatten(p, leaf_spec[i], _dtype_of(p)))
            for i, p in enumerate(leaves)
        ]
        columns = {
            name: _initial_field(rule, f, params, treedef, layout, leaf_spec, per_leaf_values)
            for f, name in enumerate(fields)
        }
        if rule.tail is not None:
            zeros = [jnp.zeros_like(p, layout.leaf(i).dtype) for i, p in enumerate(leaves)]
            columns[rule.tail.field] = treedef.unflatten(zeros)
        zero = jnp.zeros((), jnp.int32)
        return state_class(count=zero, nonfinite_count=zero, **columns)

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args  # accepted for GradientTransformationExtraArgs chains (e.g. value=)
        if rule.needs_params is not None:
            require_params(params, rule.needs_params)
        flat, treedef = jax.tree.flatten(updates)
        param_leaves = {f: _param_field_leaves(rule, f, treedef, state) for f in rule.param_fields}
        layout = _layout_of_state(rule, state, treedef, updates, param_leaves)
        if len(flat) != layout.num_leaves:
            raise ValueError(
                f"the gradients have {len(flat)} leaves, but the optimizer state was built for "
                f"{layout.num_leaves}"
            )
        for i, g in enumerate(flat):
            _check_gradient_leaf(i, g, layout)
        x_leaves = None if rule.needs_params is None else treedef.flatten_up_to(params)
        count = state.count
        hyper = rule.hyper(count)
        if rule.coordinatewise:
            out, skipped, per_field = _coordinatewise_step(
                rule, layout, count, hyper, param_leaves, flat, x_leaves
            )
            new_fields = {f: pack_leaves(treedef, v) for f, v in per_field.items()}
        else:

            def stepped_fields(phase=None):
                values = _Fields(rule, layout, treedef, state, param_leaves)
                stepped = _step_groups(rule, layout, count, hyper, values, flat, x_leaves, phase)
                out, skips = _leaf_updates(layout, stepped, len(flat))
                return out, skips, values.assemble({j: stepped[j][1] for j in stepped})

            if rule.phases is None or not layout.groups:
                out, skips, new_fields = stepped_fields()
            else:  # one switch for the whole update (Phases)
                branches = [functools.partial(stepped_fields, v) for v in rule.phases.variants]
                index = rule.phases.index(count)
                out, skips, new_fields = jax.lax.switch(index, branches)
            if rule.tail is not None:
                ctx = LeafContext(count, (), hyper)
                field = getattr(state, rule.tail.field)
                out, new_fields[rule.tail.field] = _tail_step(
                    rule.tail, ctx, out, layout, skips, treedef, field
                )
            out = [u.astype(_dtype_of(g)) for u, g in zip(out, flat, strict=True)]
            skipped = sum((jnp.sum(s, dtype=jnp.int32) for s in skips), jnp.zeros((), jnp.int32))
        if not layout.groups:  # nothing stepped: the fields stay as they are
            tail = () if rule.tail is None else (rule.tail.field,)
            new_fields = {f: getattr(state, f) for f in (*fields, *tail)}
        new_state = state_class(
            count=optax.safe_increment(count),
            nonfinite_count=state.nonfinite_count + skipped,
            **new_fields,
        )
        return treedef.unflatten(out), new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _explicit_layout(spec, shape, stacked: int):
    """Under an explicit mesh, a function resharding a group's stored state value (``stacked``
    leading group axes) like its parameter (:func:`sketchopt.sharding.group_specs`)."""
    if spec is None or not _partitioning.explicit_mesh():
        return None

    def reshard(value):
        mesh = jax.sharding.get_abstract_mesh()
        specs = _layouts.group_specs(value, spec, shape, mesh, stacked=stacked)
        return jax.tree.map(jax.sharding.reshard, value, specs)

    return reshard


# ----------------------------------------------------------------------------------------------
# Compile once.


def _is_dynamic(value) -> bool:
    """Numeric hyperparameter values travel into the compiled unit as traced arguments."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (float, complex, np.floating, np.complexfloating)):
        return True
    return isinstance(value, (jax.Array, np.ndarray, jax.core.Tracer))


class _Static:
    """A hashable stand-in for the static arguments of a factory call (or ``None``)."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Static) and self.key == other.key


def _split(args, kwargs):
    """``(static, dynamic)``: arguments split into a hashable key and a tuple of traced values.

    Returns ``None`` when a static argument is not hashable (then nothing is cached).
    """
    dynamic = []
    static = []
    for name, value in list(enumerate(args)) + sorted(kwargs.items()):
        if _is_dynamic(value):
            static.append((name, _DYNAMIC))
            dynamic.append(value)
        else:
            static.append((name, value))
    static_key = tuple(static)
    try:
        hash(static_key)
    except TypeError:
        return None
    return _Static(static_key), tuple(dynamic)


class _DynamicMarker:
    def __repr__(self):
        return "<dynamic>"


_DYNAMIC = _DynamicMarker()


def _merge(static: _Static, dynamic):
    values = iter(dynamic)
    args, kwargs = [], {}
    for name, value in static.key:
        value = next(values) if value is _DYNAMIC else value
        if isinstance(name, numbers.Integral):
            args.append(value)
        else:
            kwargs[name] = value
    return args, kwargs


_IN_UNIT: contextvars.ContextVar[bool] = contextvars.ContextVar("sketchopt_in_unit", default=False)


def _build(factory, static, dynamic):
    """The transform of ``factory`` rebuilt from its split arguments (inside a compiled unit;
    factories it calls build their plain transforms there, not units of their own)."""
    args, kwargs = _merge(static, dynamic)
    token = _IN_UNIT.set(True)
    try:
        return factory(*args, **kwargs)
    finally:
        _IN_UNIT.reset(token)


# ``path``: how the unit is traced (:func:`sketchopt._solvers.trace_key`: the backend's code path,
# batched factorizations), a key of the cache.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _init_unit(factory, static, path, dynamic, params):
    del path
    return _build(factory, static, dynamic).init(params)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _update_unit(factory, static, path, dynamic, updates, state, params):
    del path
    return _build(factory, static, dynamic).update(updates, state, params)


def compiled(factory: Callable[..., optax.GradientTransformation]):
    """Decorate a transform factory so that its ``init`` and ``update`` run as one compiled unit.

    The factory itself runs eagerly first (it validates its arguments and gives the transform);
    the returned transform's ``init`` and ``update`` then call a cached ``jax.jit`` of the same
    factory, keyed by its non-numeric arguments, with its numeric arguments traced (module
    docstring). Extra keyword arguments of ``update`` (``value=``, ...) are accepted and
    ignored, as every rule here ignores them. Arguments that are neither numeric nor hashable
    disable the cache: the transform then runs as the plain factory gives it.
    """

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        tx = factory(*args, **kwargs)
        split = None if _IN_UNIT.get() else _split(args, kwargs)
        if split is None:
            return tx
        static, dynamic = split

        def init_fn(params):
            path = _solvers.trace_key()
            return _init_unit(factory, static, path, dynamic, _materialized(params))

        def update_fn(updates, state, params=None, **extra_args):
            del extra_args  # see above
            path = _solvers.trace_key()
            return _update_unit(factory, static, path, dynamic, updates, state, params)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)

    return wrapper


# ----------------------------------------------------------------------------------------------
# States saved by sketchopt 0.1.


def _child(node, key):
    """``node``'s child at one key-path entry, in a NamedTuple, a dict (string keys, as an Orbax
    restore without a target gives them) or a sequence."""
    if isinstance(key, jax.tree_util.GetAttrKey):
        name = key.name
    elif isinstance(key, jax.tree_util.DictKey):
        name = key.key
    elif isinstance(key, jax.tree_util.SequenceKey):
        name = key.idx
    else:  # FlattenedIndexKey and friends
        name = getattr(key, "key", key)
    if isinstance(node, dict):
        for candidate in (name, str(name)):
            if candidate in node:
                return node[candidate]
        raise KeyError(f"no {name!r} in the saved state (keys {sorted(node)})")
    if isinstance(name, str):
        return getattr(node, name)
    return node[name]


def _at_path(node, path):
    for key in path:
        node = _child(node, key)
    return node


#: Per-leaf fields added to a state class after 0.1, each with the value a 0.1 state had
#: implicitly: the FD family's ``transform`` (0.5, the lazy basis) is the identity, its
#: ``eigh_fallbacks`` (0.5.1) zero.
_ADDED_FIELDS = ("transform", "eigh_fallbacks")


def _added_since(old_field, value_path) -> bool:
    """Whether ``value_path`` names a field of :data:`_ADDED_FIELDS` that ``old_field`` lacks."""
    last = value_path[-1] if value_path else None
    if getattr(last, "name", None) not in _ADDED_FIELDS:
        return False
    try:
        _at_path(old_field, value_path)
    except (KeyError, AttributeError):
        return True
    return False


def _initial_value(leaf, stacked: bool):
    """What a 0.1 state implied for an added field shaped like ``leaf`` (a group's stored array,
    ``stacked`` or not): identity matrices (``(k, n, n)`` or ``(n, n)``, the transform) or zeros
    (a counter)."""
    if leaf.ndim - int(stacked) < 2:
        return jnp.zeros(leaf.shape, leaf.dtype)
    eye = jnp.eye(leaf.shape[-1], dtype=leaf.dtype)
    return jnp.broadcast_to(eye, leaf.shape)


def _saved_groups(old, layout: Layout | None):
    """The groups of a saved field of stacked groups (a :class:`LeafGroups`, or what an Orbax
    restore without a target makes of one: ``{"0": group, "1": ...}`` or a sequence), or
    ``None`` when ``old`` is laid out otherwise (0.1's trees like the parameters)."""
    if isinstance(old, LeafGroups):
        return old.groups
    if isinstance(old, dict) and old and all(str(k).isdigit() for k in old):
        groups = [old[k] for k in sorted(old, key=int)]
    elif isinstance(old, (list, tuple)) and not hasattr(old, "_fields"):
        groups = list(old)
    else:
        return None
    if layout is not None and len(groups) != len(layout.groups):
        return None
    return groups


def _migrate_groups(path, old_field, node: LeafGroups) -> LeafGroups:
    """A field of stacked groups from a saved one: 0.1's trees like the parameters (stacked
    here), or 0.2-0.10's groups of the same layout (taken as they are; a group of one leaf,
    saved stacked as ``(1, ...)`` before 0.11, loses that axis)."""
    layout = node.layout
    saved = _saved_groups(old_field, layout)
    groups = []
    for j, (members, value) in enumerate(zip(layout.groups, node.groups, strict=True)):

        def stack(value_path, leaf, members=members, j=j):
            if saved is not None:
                old = _at_path(saved[j], value_path)
                return jnp.asarray(old, leaf.dtype).reshape(leaf.shape)
            if _added_since(old_field, value_path):
                return _initial_value(leaf, layout.stacked(j))
            params_tree = _at_path(old_field, value_path)  # a tree like the parameters
            per_leaf_old = jax.tree.leaves(params_tree)
            if len(per_leaf_old) != layout.num_leaves:
                raise ValueError(
                    f"the saved field {jax.tree_util.keystr(path + value_path)} covers "
                    f"{len(per_leaf_old)} parameter leaves, the new state {layout.num_leaves}"
                )
            if not layout.stacked(j):
                return jnp.asarray(per_leaf_old[members[0]], leaf.dtype).reshape(leaf.shape)
            arrays = [
                jnp.asarray(per_leaf_old[i], leaf.dtype).reshape(leaf.shape[1:]) for i in members
            ]
            return jnp.stack(arrays)

        groups.append(jax.tree_util.tree_map_with_path(stack, value))
    return LeafGroups(tuple(groups), layout)


def _migrate_param_field(path, old, node, layout: Layout | None):
    """A parameter-shaped field (a tree like the parameters, per array of its per-leaf
    structure) from a saved one: 0.1's trees (flat leaves, reshaped here) or 0.2-0.9's stacked
    groups, unstacked by the state's layout (or, for a state of parameter-shaped fields only,
    by the grouping 0.9 made: equal shapes and dtypes, in leaf order)."""
    saved = _saved_groups(old, None)
    if saved is None:
        return jax.tree_util.tree_map_with_path(
            lambda p, leaf: jnp.asarray(_at_path(old, p), leaf.dtype).reshape(leaf.shape), node
        )
    leaves, treedef = jax.tree_util.tree_flatten_with_path(node)
    per_group = len(jax.tree.leaves(saved[0]))  # arrays per leaf's value
    n = len(leaves) // max(per_group, 1)
    if layout is None:
        layout = Layout.of([leaf for _, leaf in leaves[:n]])
    position = {i: (j, k) for j, members in enumerate(layout.groups) for k, i in enumerate(members)}
    out = []
    for index, (_, leaf) in enumerate(leaves):
        which, i = divmod(index, n)
        j, k = position[i]
        stacked = jax.tree.leaves(saved[j])[which] if j < len(saved) else None
        if stacked is None or np.shape(stacked)[0] != len(layout.groups[j]):
            raise ValueError(
                f"the saved field {jax.tree_util.keystr(path)} does not hold the stacked groups "
                "this state's parameters make: restore it into the 0.9 state it was saved from "
                "(sketchopt 0.9) and save it again per leaf, or start from tx.init(params)"
            )
        out.append(jnp.asarray(stacked[k], leaf.dtype).reshape(leaf.shape))
    return treedef.unflatten(out)


def _is_driver_state(node) -> bool:
    """A state built by :func:`leafwise` (a NamedTuple with ``count`` and ``nonfinite_count``)."""
    fields = getattr(node, "_fields", ())
    return isinstance(node, tuple) and "count" in fields and "nonfinite_count" in fields


def _migrate_state(path, old, node):
    layouts = [v.layout for v in node if isinstance(v, LeafGroups)]
    values = {}
    for name, value in zip(node._fields, node, strict=True):
        key = jax.tree_util.GetAttrKey(name)
        old_value = _child(old, key)
        if isinstance(value, LeafGroups):
            values[name] = _migrate_groups(path + (key,), old_value, value)
        elif name in ("count", "nonfinite_count") or not jax.tree.leaves(value):
            values[name] = jax.tree.map(
                lambda o, t: jnp.asarray(o, t.dtype).reshape(t.shape), old_value, value
            )
        else:
            layout = layouts[0] if layouts else None
            values[name] = _migrate_param_field(path + (key,), old_value, value, layout)
    return type(node)(**values)


def migrate(restored: Any, target: Any) -> Any:
    """A state saved by an earlier ``sketchopt`` (``restored``) in the layout of ``target`` (see
    :func:`sketchopt.migrate_state`)."""

    def convert(path, node):
        old = _at_path(restored, path)
        if _is_driver_state(node):
            return _migrate_state(path, old, node)
        if isinstance(node, LeafGroups):
            return _migrate_groups(path, old, node)
        return jnp.asarray(old, dtype=node.dtype).reshape(node.shape)

    return jax.tree_util.tree_map_with_path(
        convert, target, is_leaf=lambda x: _is_driver_state(x) or isinstance(x, LeafGroups)
    )
