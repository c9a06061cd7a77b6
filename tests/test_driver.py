"""The shared per-leaf driver (``sketchopt._leafwise``), family by family.

Every transform goes through one driver; these tests pin what it promises to all of them alike:
Optax's extra arguments, the shape and dtype checks at trace time, the one non-finite policy,
compile-once eager use (no process growth over hundreds of eager steps), grouping of equal-shaped
leaves (the compiled program does not grow with their number), the state layout and the
migration of states saved by 0.1.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxpr_support import all_eqns

import sketchopt as so
from sketchopt import _leafwise, metrics, regularizers, sketches

KEY = jax.random.PRNGKey(0)

FAMILIES = {
    "ada_fd": lambda: so.ada_fd(0.1, 3, 0.1, robust=False),
    "ada_fd_fast_robust": lambda: so.ada_fd(0.1, 3, 0.1, robust=True, fast=True),
    "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, 3, 0.1, robust=False),
    "ada_fd_l1": lambda: so.ada_fd(0.1, 3, 0.1, regularizer=regularizers.l1(1e-3), robust=False),
    "ada_fd_oja": lambda: so.mirror_descent(0.1, metrics.sketched(sketches.oja(3), 0.1)),
    "ada_diag": lambda: so.ada_diag(0.1, 0.1),
    "ada_full": lambda: so.ada_full(0.1, 0.1),
    "scale_by_ada_fd": lambda: so.scale_by_ada_fd(3, 0.1, robust=False),
    "fd_son": lambda: so.fd_son(1.0, 3),
    "rfd_son": lambda: so.rfd_son(3, fast=True, alpha0=0.0),
    "oja_son": lambda: so.oja_son(1.0, 3),
    "rp_son": lambda: so.rp_son(1.0, 3, KEY),
    "ons": lambda: so.ons(1.0),
    "radagrad": lambda: so.radagrad(0.1, 3, 0.1, KEY),
    "ada_lr": lambda: so.ada_lr(0.1, 3, 0.1, KEY),
    "ftrl_proximal": lambda: so.ftrl_proximal(0.1, 1.0, 1e-3, 1e-3),
    "rda_l1": lambda: so.rda_l1(1.0, 1e-3),
    "fobos_l1": lambda: so.fobos_l1(0.1, 1e-3),
    "truncated_gradient": lambda: so.truncated_gradient(0.1, 1e-3, 0.5, 2),
}
NAMES = sorted(FAMILIES)


def _params():
    return {"w": jnp.ones((4, 3)) * 0.5, "b": jnp.zeros((3,)), "c": jnp.zeros((3,))}


def _grads(seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), _params())


@pytest.mark.parametrize("name", NAMES)
def test_extra_args_inside_optax_chain(name):
    """Every family accepts Optax's extra arguments, here the ``value`` Polyak's step needs, both
    eagerly (the family's compiled unit, shared with the other tests of this module) and inside
    an outer ``jit``."""
    tx = optax.chain(FAMILIES[name](), optax.polyak_sgd(1.0))
    params = _params()
    state = tx.init(params)
    updates, state = tx.update(_grads(0), state, params, value=jnp.asarray(2.0))
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))
    jax.jit(tx.update).trace(_grads(1), state, params, value=jnp.asarray(2.0))


@pytest.mark.parametrize("name", NAMES)
def test_a_gradient_of_another_shape_is_rejected_at_trace_time(name):
    tx = FAMILIES[name]()
    params = _params()
    state = tx.init(params)
    grads = {**_grads(0), "w": jnp.ones((3, 4))}  # (3, 4) for a (4, 3) parameter: same size
    with pytest.raises(ValueError, match=r"shape \(3, 4\).*\(4, 3\)"):
        jax.jit(tx.update).trace(grads, state, params)
    with pytest.raises(ValueError, match="leaves"):
        jax.jit(tx.update).trace({"w": grads["w"]}, state, {"w": params["w"]})


@pytest.mark.parametrize("name", NAMES)
def test_one_nonfinite_policy(name):
    """A NaN leaf and a leaf whose finite gradient would overflow its update or state are both
    skipped: zero update, state bit-identical, one count each; the other leaves proceed."""
    tx = FAMILIES[name]()
    params = _params()
    update = tx.update  # one compiled unit (compiled once for this module's tests of the family)
    state = update(_grads(1), tx.init(params), params)[1]
    grads = _grads(2)
    grads["w"] = grads["w"].at[1, 1].set(jnp.nan)
    grads["b"] = jnp.full((3,), 3e38, jnp.float32)  # finite, but its squares and sums overflow
    new_updates, new_state = update(grads, state, params)
    fields = [f for f in state._fields if isinstance(getattr(state, f), so.LeafGroups)]

    def leaf_bytes(st, key):
        per_leaf = [so.per_leaf_states(getattr(st, f), params)[key] for f in fields]
        return [np.asarray(x).tobytes() for x in jax.tree.leaves(per_leaf)]

    np.testing.assert_array_equal(new_updates["w"], 0)
    assert leaf_bytes(new_state, "w") == leaf_bytes(state, "w")
    skipped = int(new_state.nonfinite_count) - int(state.nonfinite_count)
    assert skipped in (1, 2)
    if skipped == 2:  # the overflowing leaf was skipped too ...
        np.testing.assert_array_equal(new_updates["b"], 0)
        guarded = "ada_fd" in name or name in ("fd_son", "rfd_son", "oja_son", "rp_son")
        if not guarded:  # (a sketch's rows are not re-read: see sketchopt._leafwise)
            assert leaf_bytes(new_state, "b") == leaf_bytes(state, "b")
    # ... or its family took 3e38 in its stride (power-of-two scaled states)
    assert bool(jnp.any(new_updates["c"] != 0))
    for x in jax.tree.leaves((new_updates, new_state)):
        assert bool(jnp.all(jnp.isfinite(x)))


def _maps():
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux
        pytest.skip("needs /proc/self/maps")


@pytest.mark.parametrize("name", NAMES)
def test_eager_updates_compile_once(name):
    """Outside jit an update is one compiled unit, cached: a hundred eager steps (the transform
    rebuilt at every step, as optax.inject_hyperparams does) leave the process's memory
    mappings flat after the first steps."""
    params = _params()
    state = FAMILIES[name]().init(params)
    for i in range(3):
        _, state = FAMILIES[name]().update(_grads(i), state, params)
    before = _maps()
    for i in range(100):
        updates, state = FAMILIES[name]().update(_grads(i % 7), state, params)
    jax.block_until_ready(updates)
    assert _maps() - before <= 4, _maps() - before


def test_inject_hyperparams_eager_compiles_once():
    tx = so.inject_hyperparams(so.ada_fd)(learning_rate=0.1, sketch_size=3, delta=0.1)
    params = _params()
    state = tx.init(params)
    for i in range(3):
        _, state = tx.update(_grads(i), state, params)
    before = _maps()
    for i in range(50):
        state.hyperparams["learning_rate"] = jnp.asarray(0.1 / (i + 1))
        _, state = tx.update(_grads(i % 5), state, params)
    assert _maps() - before <= 4


@pytest.mark.parametrize("name", ["ada_fd", "fd_son"])
def test_equal_shaped_leaves_compile_as_one_group(name):
    """The program of 40 equal-shaped leaves is about as large as that of 4, as lowered and as
    compiled: XLA once fused the step's elementwise tail into every leaf's slice of the group's
    update, one copy of it per leaf (FD-SON compiled 7.5k instructions for 4 leaves, 21k for 40)."""
    tx = FAMILIES[name]()

    def sizes(n):
        params = {f"l{i:02d}": jax.ShapeDtypeStruct((6, 5), jnp.float32) for i in range(n)}
        state = jax.eval_shape(tx.init, params)
        lowered = jax.jit(tx.update).trace(params, state, params).lower()
        compiled = lowered.compile().as_text()
        instructions = len(re.findall(r"^\s*(?:ROOT )?%\S+ = ", compiled, re.M))
        return np.array([len(lowered.as_text()), instructions])

    assert np.all(sizes(40) < 1.3 * sizes(4))
    params = {f"l{i}": jnp.ones((6, 5)) * i for i in range(5)}
    state = tx.init(params)
    assert [len(g) for g in state[1].layout.groups] == [5]  # one stacked group of five


def test_groups_match_leaf_by_leaf_transforms():
    """A group of equal-shaped leaves steps exactly like each leaf on its own."""
    tx = so.ada_fd(0.1, 3, 0.1, fast=True, robust=False)
    rng = np.random.default_rng(3)
    params = {k: jnp.asarray(rng.standard_normal((5, 4)), jnp.float32) for k in "abc"}
    state = tx.init(params)
    alone = {k: tx.init(params[k]) for k in params}
    step = jax.jit(tx.update)
    for t in range(9):
        grads = {k: jnp.asarray(rng.standard_normal((5, 4)), jnp.float32) for k in params}
        if t == 4:
            grads["b"] = grads["b"].at[0, 0].set(jnp.inf)  # one leaf falls out of step
        updates, state = step(grads, state, params)
        for k in params:
            want, alone[k] = step(grads[k], alone[k], params[k])
            np.testing.assert_allclose(updates[k], want, rtol=2e-5, atol=1e-6)
    sketched = so.per_leaf_states(state.metric_state, params)
    for k in params:
        np.testing.assert_allclose(
            sketches.covariance(sketched[k]),
            sketches.covariance(alone[k].metric_state.leaf(0)),
            rtol=1e-4,
            atol=1e-5,
        )


PADDED = ["ada_fd", "ada_fd_fast_robust", "ada_fd_dual_averaging", "scale_by_ada_fd", "ada_diag"]
PADDED += ["fd_son", "rfd_son", "rp_son"]


@pytest.mark.parametrize("name", PADDED)
def test_small_leaves_step_as_one_padded_group(name, monkeypatch):
    """Small leaves of different sizes (a network's biases and norms) are stepped as one
    zero-padded group under every rule exact under padding: the same updates and states, in
    float64, as when each size is stepped on its own, with one leaf skipped as non-finite."""
    shapes = {"a": (1,), "b": (3,), "c": (3,), "k": (4, 5), "v": (7,)}
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        params = {k: jnp.asarray(rng.standard_normal(s)) for k, s in shapes.items()}
        stream = [
            {k: jnp.asarray(rng.standard_normal(s)) for k, s in shapes.items()} for _ in range(12)
        ]
        stream[5]["v"] = stream[5]["v"].at[2].set(jnp.nan)
        assert _leafwise.step_plan(_leafwise.Layout.of(params), True) == ((0, 1, 2, 3),)
        runs = []
        for small in (_leafwise.SMALL_LEAF, 0):  # 0: no leaf is small, each size on its own
            monkeypatch.setattr(_leafwise, "SMALL_LEAF", small)
            jax.clear_caches()  # the update is traced anew under this setting
            tx = FAMILIES[name]()
            step = jax.jit(tx.update)
            state, updates = tx.init(params), []
            for grads in stream:
                u, state = step(grads, state, params)
                updates.append(u)
            runs.append((jax.tree.leaves(updates), state))
        (padded, end_padded), (alone, end_alone) = runs
        for u, w in zip(padded, alone, strict=True):
            np.testing.assert_allclose(u, w, rtol=1e-10, atol=1e-13)
        assert end_padded.nonfinite_count == end_alone.nonfinite_count == 1
        for a, b in zip(jax.tree.leaves(end_padded), jax.tree.leaves(end_alone), strict=True):
            assert a.shape == b.shape  # the state keeps each group at its own size


def _large_copies(compiled_text: str, at_least: int) -> list[str]:
    """The ``copy`` instructions of an optimized HLO module of arrays of ``at_least`` entries."""
    shapes = re.findall(r"= \w+\[([\d,]*)\]\S* copy\(", compiled_text)
    return [s for s in shapes if np.prod([int(n) for n in s.split(",") if n]) >= at_least]


IN_PLACE = {  # sketch_size 20: the sketch outweighs the step's d-sized temporaries
    "ada_fd": lambda: so.ada_fd(0.1, 20, 0.1, robust=False),
    "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, 20, 0.1, robust=False),
    "fd_son": lambda: so.fd_son(1.0, 20),
    "oja_son": lambda: so.oja_son(1.0, 20),
    "rp_son": lambda: so.rp_son(1.0, 20, jax.random.PRNGKey(0)),
}


@pytest.mark.parametrize("accelerator", [False, True])
@pytest.mark.parametrize("leaves", [1, 3])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_a_group_is_updated_in_place(name, leaves, accelerator):
    """The compiled, state-donating update writes a group's sketch in place: no copy of it, a
    lone leaf's or a stacked group's (rows long enough for the lazy basis), and on the CPU path
    no temporary its size either (all of them together are smaller than the sketch).

    0.10 stored a lone leaf as ``(1, m, d)`` and stepped it as ``(m, d)``, and XLA copied the
    whole sketch at every step (it shares a buffer only with a result of the very same shape);
    until this release the lazy basis's rank-one update read a row of the buffer it overwrote
    (a stacked group's sketch was copied whole), Oja's rotation was a product into a new buffer
    (a stacked group's still was, as was the lazy basis's write-back), and the random
    projection's rows were checked and selected by the driver. On the accelerator path (what a
    GPU compiles) the rotations are whole products, whose second buffer the accelerators'
    pooling allocators serve: no copy there either, but temporaries the sketch's size."""
    d = 2**16
    tx = IN_PLACE[name]()
    params = {f"w{i}": jax.ShapeDtypeStruct((d,), jnp.float32) for i in range(leaves)}
    state = jax.eval_shape(tx.init, params)
    rows = max(jax.tree.leaves(state), key=lambda x: x.size)
    assert rows.size >= 2 * d * leaves  # the sketch is the largest array of the state
    with so.accelerator_path(accelerator):
        compiled = jax.jit(tx.update, donate_argnums=1).lower(params, state, params).compile()
    assert _large_copies(compiled.as_text(), rows.size) == []
    if not accelerator:
        assert compiled.memory_analysis().temp_size_in_bytes < rows.size * rows.dtype.itemsize


@pytest.mark.parametrize("accelerator", [False, True])
def test_a_skipped_leaf_of_a_group_is_masked(accelerator):
    """A group's leaf whose gradient is not finite gets a zero update while the other steps. The
    stacked updates are masked under a ``cond`` on the CPU (a select fused into every leaf's
    slice made XLA:CPU's compile grow with the leaves) and by a select on the accelerator path
    (there the ``cond``'s materialized result is one more pass over the updates)."""
    tx = so.ada_fd(0.1, 3, 0.1, robust=False)
    params = {"a": jnp.zeros(8), "b": jnp.zeros(8)}
    grads = {"a": jnp.full(8, jnp.nan), "b": jnp.ones(8)}
    state = tx.init(params)
    with so.accelerator_path(accelerator):  # new functions: a trace keeps its first path
        updates, new = jax.jit(lambda *a: tx.update(*a))(grads, state, params)
        jaxpr = jax.make_jaxpr(lambda *a: tx.update(*a))(grads, state, params)
    np.testing.assert_array_equal(updates["a"], 0)
    assert np.all(np.isfinite(updates["b"])) and np.all(updates["b"] != 0)
    assert int(new.nonfinite_count) == 1
    stacked_conds = [
        v
        for e in all_eqns(jaxpr.jaxpr)
        if e.primitive.name == "cond"
        for v in e.outvars
        if v.aval.shape == (2, 8)
    ]
    assert len(stacked_conds) == (0 if accelerator else 1)


def test_state_layout_views():
    params = {"conv": {"kernel": jnp.ones((3, 3, 1, 2))}, "b": jnp.zeros(2), "c": jnp.zeros(2)}
    state = so.ada_fd(0.1, 4, 0.1, robust=False).init(params)
    rows = state.metric_state.rows
    assert isinstance(rows, so.LeafGroups)
    assert {k: v.shape for k, v in rows.as_dict().items()} == {
        "['b']": (4, 2),
        "['c']": (4, 2),
        "['conv']['kernel']": (4, 18),
    }
    per_leaf = so.per_leaf_states(state.metric_state, params)
    assert per_leaf["conv"]["kernel"].rows.shape == (4, 18)
    assert "2 x (2,)" in repr(rows)
    with pytest.raises(AttributeError, match="no field"):
        _ = state.metric_state.no_such_field


def test_one_validation_rule_for_traced_values():
    """Traced hyperparameters are accepted by every constructor alike; concrete invalid ones
    raise ValueError naming the argument (and why, where only one method needs it)."""

    @jax.jit
    def build(x):
        sketches.robust_frequent_directions(4, alpha0=x)
        regularizers.l1(x)
        so.ftrl_proximal(x + 1.0)
        so.fd_son(x, 3, eta=x)
        so.ada_fd(x, 3, x + 1.0, robust=False)
        return x

    build(jnp.asarray(0.5))
    with pytest.raises(ValueError, match="alpha.*divide"):
        so.ftrl_proximal(0.0)
    with pytest.raises(ValueError, match="gamma.*divide"):
        so.rda_l1(0.0, 1e-3)
    with pytest.raises(ValueError, match="delta.*invertible"):
        so.ada_fd(0.1, 3, 0.0, robust=False)
    with pytest.raises(ValueError, match="learning_rate"):
        so.fobos_l1(-1.0, 1e-3)
    with pytest.raises(ValueError, match="learning_rate"):
        so.ada_fd(-1.0, 3, 0.1, robust=False)
    with pytest.raises(ValueError, match="sketch_size"):
        so.fd_son(1.0, 2.5)
    with pytest.raises(ValueError, match="strength"):
        regularizers.l1(-1.0)


def _old_layout(state, params):
    """``state`` as sketchopt 0.1 laid it out: per-leaf fields as trees like the parameters
    (FTRL's and RDA's accumulators in the parameters' shapes)."""
    treedef = jax.tree.structure(params)
    shapes = [np.shape(p) for p in jax.tree.leaves(params)]

    def old(node):
        if not isinstance(node, so.LeafGroups):
            return node
        per_leaf = treedef.flatten_up_to(so.per_leaf_states(node, params))
        if per_leaf and isinstance(per_leaf[0], jax.Array) and per_leaf[0].ndim == 1:
            per_leaf = [x.reshape(s) for x, s in zip(per_leaf, shapes, strict=True)]
        return so.pack_leaf_states(treedef, per_leaf)

    return jax.tree.map(old, state, is_leaf=lambda x: isinstance(x, so.LeafGroups))


@pytest.mark.parametrize("layout", ["0.1", "0.9"])
@pytest.mark.parametrize("name", ["ada_fd_dual_averaging", "rfd_son", "ftrl_proximal"])
def test_a_checkpoint_of_an_earlier_layout_migrates(name, layout, tmp_path):
    """0.1 kept every per-leaf field as trees like the parameters (flat leaves); 0.2-0.9 stacked
    every per-leaf field by group, the parameter-shaped ones (dual averaging's sums and anchor,
    FTRL's ``z`` and ``sqrt(n)``) included. An Orbax checkpoint of either restores without a
    target and migrates exactly; restoring it into the current layout fails on the structure."""
    import orbax.checkpoint as ocp

    old_layout = {"0.1": _old_layout, "0.9": _layout_0_9}[layout]
    tx = optax.chain(optax.clip(10.0), FAMILIES[name]())
    params = _params()
    step = jax.jit(tx.update)
    state = tx.init(params)
    for i in range(4):
        _, state = step(_grads(i), state, params)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "old", old_layout(state, params))
        checkpointer.wait_until_finished()
        raw = checkpointer.restore(tmp_path / "old")
        # (0.9's rfd_son state has today's structure: only its one-leaf group's shape differs)
        if layout == "0.1" or name != "rfd_son":
            with pytest.raises(Exception):  # noqa: B017 - Orbax's own structure-mismatch error
                checkpointer.restore(tmp_path / "old", jax.eval_shape(tx.init, params))
    migrated = so.migrate_state(raw, jax.eval_shape(tx.init, params))
    assert jax.tree.structure(migrated) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(migrated), jax.tree.leaves(state), strict=True):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    u1, _ = step(_grads(9), state, params)
    u2, _ = step(_grads(9), migrated, params)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_without_the_lazy_basis_field_migrates():
    """0.1-0.4 FD states had no ``transform`` (``B`` was the rows): it migrates as the identity."""
    tx = FAMILIES["ada_fd_dual_averaging"]()
    params = _params()
    state = tx.init(params)
    for i in range(3):
        _, state = jax.jit(tx.update)(_grads(i), state, params)
    old = _old_layout(state, params)
    metric = old.metric_state._asdict()
    del metric["transform"]
    old = old._replace(metric_state=metric)
    migrated = so.migrate_state(old, jax.eval_shape(tx.init, params))
    for a, b in zip(jax.tree.leaves(migrated), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)  # per-step FD at these sizes keeps F = I


def _layout_0_9(state, params):
    """``state`` as sketchopt 0.2-0.9 laid it out: every per-leaf field stacked by group
    (``LeafGroups``), the parameter-shaped ones flattened per leaf, and a group of one leaf
    stacked too (``(1, ...)``, as 0.2-0.10 stored it)."""
    from sketchopt import _leafwise

    treedef = jax.tree.structure(params)
    layout = _leafwise.Layout.of(params)

    def stacked(field):
        per_leaf = so.unpack_leaf_states(treedef, field)
        groups = tuple(
            jax.tree.map(
                lambda *xs: jnp.stack([jnp.ravel(x) for x in xs]), *[per_leaf[i] for i in m]
            )
            for m in layout.groups
        )
        return so.LeafGroups(groups, layout)

    def stacked_singletons(field):
        groups = tuple(
            g if field.layout.stacked(j) else jax.tree.map(lambda a: a[None], g)
            for j, g in enumerate(field.groups)
        )
        return so.LeafGroups(groups, field.layout)

    def is_state(node):  # a transform's state: count, nonfinite_count and its per-leaf fields
        return isinstance(node, tuple) and "nonfinite_count" in getattr(node, "_fields", ())

    def old(node):
        if not is_state(node):
            return node
        fields = {
            name: value
            if name in ("count", "nonfinite_count")
            else stacked_singletons(value)
            if isinstance(value, so.LeafGroups)
            else stacked(value)
            for name, value in zip(node._fields, node, strict=True)
        }
        return type(node)(**fields)

    return jax.tree.map(old, state, is_leaf=is_state)


def test_a_0_9_state_object_of_parameter_fields_only_migrates():
    """The in-memory 0.9 objects migrate too; ADA-DIAG's dual averaging holds parameter-shaped
    fields only, so the 0.9 grouping is found from the target's shapes and dtypes."""
    params = _params()
    diag = so.ada_diag_dual_averaging(0.1, 0.1)
    state = diag.init(params)
    _, state = diag.update(_grads(0), state, params)
    back = so.migrate_state(_layout_0_9(state, params), state)
    assert jax.tree.structure(back) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_states_compare_and_print_by_value():
    """Optax's states are NamedTuples, equal by value and printable whatever they hold: so are
    these (``optax.tree.map`` of dtypes, as Optax's float64 test compares them)."""
    tx = so.ada_fd_dual_averaging(0.1, 3, 0.1, robust=False)
    params = _params()
    state = tx.init(params)
    _, new = tx.update(_grads(0), state, params)
    dtypes = jax.tree.map(lambda x: x.dtype, state)
    assert dtypes == jax.tree.map(lambda x: x.dtype, new)
    assert "float32" in repr(dtypes) and "rows" in repr(dtypes)
    shapes = jax.tree.map(lambda x: x.shape, state)
    assert shapes == jax.tree.map(lambda x: x.shape, new)
    assert hash(shapes.metric_state) == hash(jax.tree.map(lambda x: x.shape, new).metric_state)
    other = so.ada_fd_dual_averaging(0.1, 2, 0.1, robust=False).init(params)  # a 2-row sketch
    assert shapes != jax.tree.map(lambda x: x.shape, other)
