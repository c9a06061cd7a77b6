"""Bad input, for every transform family (``docs/design.md``, "Bad input"; "Pytrees").

* A gradient leaf holding NaN or Inf: that leaf's state comes back bit-identical, its update is
  exactly zero, ``nonfinite_count`` counts it, and the other leaves proceed.
* Gradients of norm ``1e30`` / ``1e-30`` in float32, all-zero gradients, ``sketch_size > d``,
  ``sketch_size = 1``, scalar and size-0 leaves: no NaN or Inf in updates, state or parameters,
  also under ``jax.debug_nans(True)`` (jitted steps are re-run de-optimized and raise on a NaN
  output; un-jitted steps are checked primitive by primitive).
* bf16 / float16 parameters keep float32 state and get updates in their own dtype; float64 is
  honoured under ``jax.enable_x64(True)`` (a context manager, never the global flag).
* Invalid hyperparameters raise ``ValueError`` naming the argument and its allowed range; wrong
  input at ``update`` (a mismatched tree, integer gradients) fails at trace time.
* Long runs: ``1e5`` float32 steps keep the FD directions orthonormal and the sketched covariance
  close to a float64 run of the same stream.
* Hypothesis fuzzing over magnitudes, step counts and NaN/Inf placements, on three trees that
  between them hold every kind of leaf (scalar, size 0, size 1, vector, matrix, 3-d) and dtype.
* Every state round-trips through ``orbax.checkpoint`` and the restored run continues
  bit-identically.

Every family runs in ``make test-robustness`` (a CI tier); ``make test`` runs each check for the
development tier's sample of families (``tests/conftest.py``, ``ROBUSTNESS_MODULE``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sketchopt as so
from sketchopt import metrics, regularizers, sketches

KEY = jax.random.PRNGKey(3)
TAU = 3  # sketch_size of the standard configuration: smaller than every non-trivial leaf here

# name -> factory(sketch_size): every rule, metric, sketch and SON/baseline family. The regularized
# entries cover the proximal solvers (the l1-ball's, the costliest to compile, is exercised by
# tests/test_regularizers.py and tests/test_sharding.py); s_adagrad and scale_by_ada_fd share
# ada_fd's robust-FD metric and rule code paths.
FACTORIES = {
    "ada_fd": lambda tau: so.ada_fd(0.1, tau, 0.1, robust=False),
    "ada_fd_robust_fast": lambda tau: so.ada_fd(0.1, tau, 0.1, robust=True, fast=True),
    "ada_fd_dual_averaging": lambda tau: so.ada_fd_dual_averaging(0.1, tau, 0.1, robust=False),
    "ada_fd_pfd": lambda tau: so.mirror_descent(
        0.1, metrics.sketched(sketches.parameterized_frequent_directions(tau, 0.5), 0.1)
    ),
    "ada_fd_cfd_fast": lambda tau: so.mirror_descent(
        0.1, metrics.sketched(sketches.compensative_frequent_directions(tau, fast=True), 0.1)
    ),
    "ada_fd_oja": lambda tau: so.mirror_descent(0.1, metrics.sketched(sketches.oja(tau), 0.1)),
    "ada_fd_rp": lambda tau: so.mirror_descent(
        0.1, metrics.sketched(sketches.random_projection(tau, KEY), 0.1)
    ),
    "ada_full": lambda tau: so.ada_full(0.1, 0.1),
    "ada_full_dual_averaging": lambda tau: so.ada_full_dual_averaging(0.1, 0.1),
    "ada_diag": lambda tau: so.ada_diag(0.1, 0.1),
    "ada_diag_dual_averaging": lambda tau: so.ada_diag_dual_averaging(0.1, 0.0),
    "ada_fd_l1": lambda tau: so.ada_fd(
        0.1, tau, 0.1, regularizer=regularizers.l1(1e-2), robust=False
    ),
    "ada_diag_l2": lambda tau: so.ada_diag(0.1, 0.1, regularizer=regularizers.l2(1e-2)),
    "fd_son": lambda tau: so.fd_son(1.0, tau),
    "fd_son_fast_rescaled": lambda tau: so.fd_son(1.0, tau, fast=True, diagonal_rescaling=True),
    "rfd_son": lambda tau: so.rfd_son(tau, alpha0=0.0),
    "rfd_son_fast_alpha0": lambda tau: so.rfd_son(tau, alpha0=1e-3, fast=True),
    "oja_son": lambda tau: so.oja_son(1.0, tau),
    "rp_son": lambda tau: so.rp_son(1.0, tau, KEY),
    "ons": lambda tau: so.ons(1.0),
    "radagrad": lambda tau: so.radagrad(0.1, tau, 0.1, KEY),
    "ada_lr": lambda tau: so.ada_lr(0.1, tau, 0.1, KEY),
    "simple_truncation": lambda tau: so.simple_truncation(0.1, 1e-3, 2),
    "truncated_gradient": lambda tau: so.truncated_gradient(0.1, 1e-2, 1.0, 2),
    "fobos_l1": lambda tau: so.fobos_l1(0.1, 1e-2),
    "rda_l1": lambda tau: so.rda_l1(1.0, 1e-2),
    "ftrl_proximal": lambda tau: so.ftrl_proximal(0.1, 1.0, 1e-2, 1e-2),
    # the factored metric with its cached inverse roots and the Adam graft (its default, a root
    # per step and no graft, is tests/test_kron.py's)
    "kron_fd": lambda tau: so.kron_fd(0.1, tau, delta=0.1, refresh_every=2, graft="adam"),
}
# Families whose state depends on sketch_size (the others ignore it). ada_fd_dual_averaging keeps
# ada_fd's metric; its rule never sees the sketch size.
SKETCHED = [
    "ada_fd",
    "ada_fd_robust_fast",
    "ada_fd_oja",
    "ada_fd_rp",
    "fd_son",
    "rfd_son_fast_alpha0",
    "oja_son",
    "rp_son",
    "radagrad",
    "ada_lr",
    "kron_fd",
]
NAMES = list(FACTORIES)

# Known limitations: (test, family) -> reason, marked as strict xfails so that a fix is noticed.
# Empty: every family passes every check.
KNOWN: dict[tuple[str, str], str] = {}


def _xfail_known(test, name):
    reason = KNOWN.get((test, name))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def _params(names=NAMES, test=None):
    return [pytest.param(n, marks=_xfail_known(test, n)) for n in names]


@functools.cache
def make(name, tau=TAU):
    return FACTORIES[name](tau)


@functools.cache
def jitted_update(name, tau=TAU):
    return jax.jit(make(name, tau).update)


def shapes_params(dtype=jnp.float32, with_empty=True):
    """A matrix, a vector, a scalar and (by default) a size-0 leaf."""
    params = {
        "m": jnp.linspace(-1.0, 2.0, 12).reshape(3, 4),
        "v": jnp.linspace(0.5, -0.5, 5),
        "s": jnp.asarray(0.25),
    }
    if with_empty:
        params["e"] = jnp.zeros((0,))
    return jax.tree.map(lambda x: x.astype(dtype), params)


def random_like(params, seed, scale=1.0):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(params)))
    leaves, treedef = jax.tree.flatten(params)
    out = [
        (scale * jax.random.normal(k, jnp.shape(p), jnp.float32)).astype(jnp.asarray(p).dtype)
        for k, p in zip(keys, leaves, strict=True)
    ]
    return treedef.unflatten(out)


def float_leaves(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]


def assert_finite(tree, what):
    for x in float_leaves(tree):
        assert np.all(np.isfinite(np.asarray(x, np.float64))), what


def per_leaf_states(state, params):
    """Every per-leaf field of ``state`` (a :class:`sketchopt.LeafGroups`, e.g. ``metric_state``,
    ``grad_sum``, ``leaf_state``) and every sub-tree with the structure of ``params``, as lists of
    per-parameter-leaf states."""
    treedef = jax.tree.structure(params)
    found = []

    def visit(node):
        if isinstance(node, so.LeafGroups):
            found.append(treedef.flatten_up_to(so.per_leaf_states(node, params)))
            return
        try:
            found.append(treedef.flatten_up_to(node))
            return
        except (ValueError, TypeError):
            pass
        children, node_def = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        if node_def.num_nodes == 1 and node_def.num_leaves == 1:
            return
        for child in children:
            visit(child)

    visit(state)
    return found


def nonfinite_count(state):
    """The outermost ``nonfinite_count`` of a state."""
    best = None
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if path and getattr(path[-1], "name", None) == "nonfinite_count":
            if best is None or len(path) < best[0]:
                best = (len(path), leaf)
    assert best is not None, "no nonfinite_count in the state"
    return int(best[1])


def same_bits(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if jax.tree.structure(a) != jax.tree.structure(b) or len(la) != len(lb):
        return False
    return all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).shape == np.asarray(y).shape
        and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(la, lb, strict=True)
    )


def run(name, params, grads_list, *, tau=TAU, jit=True):
    """Apply the updates for each gradient tree; returns (params, state, [updates])."""
    tx = make(name, tau)
    update = jitted_update(name, tau) if jit else tx.update
    state = tx.init(params)
    outs = []
    for grads in grads_list:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        outs.append(updates)
    return params, state, outs


# ----------------------------------------------------------------------------------------------
# Non-finite gradient leaves.


@pytest.mark.parametrize("name", _params(test="size0"))
def test_nonfinite_leaf_is_skipped(name):
    _check_nonfinite_leaf_is_skipped(make(name), jitted_update(name))


@pytest.mark.parametrize("name", ["ada_fd", "fd_son", "oja_son", "kron_fd"])
def test_nonfinite_leaf_is_skipped_on_an_accelerators_program(name):
    """The same on the program a GPU or TPU compiles by default: the accelerator code path and
    the factorizations batched across the shape groups (traced here, inside both switches)."""
    tx = make(name)
    with so.accelerator_path(), so.batched_solves():
        _check_nonfinite_leaf_is_skipped(tx, jax.jit(tx.update))


@pytest.mark.parametrize("name", ["ada_fd", "oja_son"])
def test_nonfinite_leaf_is_skipped_through_the_rotation_kernel(name):
    """The same with the rows rotated by the TPU's Pallas kernel (``sketchopt._kernels``, run
    here through Pallas's interpreter): its in-kernel select keeps a skipped leaf's rows."""
    from sketchopt import _solvers

    tx = make(name)
    with so.accelerator_path(), so.batched_solves(), _solvers.kernels("interpret"):
        _check_nonfinite_leaf_is_skipped(tx, jax.jit(tx.update))


def _check_nonfinite_leaf_is_skipped(tx, update):
    params = shapes_params()
    state = tx.init(params)
    updates, state = update(random_like(params, 0), state, params)
    params = optax.apply_updates(params, updates)
    bad_values = [("m", (1, 2), np.nan), ("v", (3,), np.inf), ("s", (), -np.inf)]
    for step, (leaf, index, value) in enumerate(bad_values, start=1):
        grads = random_like(params, step)
        grads[leaf] = grads[leaf].at[index].set(value)
        updates, new_state = update(grads, state, params)
        assert np.all(np.asarray(updates[leaf]) == 0), leaf
        assert nonfinite_count(new_state) == nonfinite_count(state) + 1
        names = sorted(params)  # dict leaves are flattened in sorted-key order
        for before, after in zip(
            per_leaf_states(state, params), per_leaf_states(new_state, params), strict=True
        ):
            i = names.index(leaf)
            assert same_bits(before[i], after[i]), f"the state of leaf {leaf} changed"
        assert_finite(updates, "updates")
        assert_finite(new_state, "state")
        moved = [n for n in ("m", "v", "s") if n != leaf and np.any(np.asarray(updates[n]) != 0)]
        assert moved, "no finite leaf moved"
        state = new_state
        params = optax.apply_updates(params, updates)


# A step skipped for its result: the gradient is finite, the update overflows (a huge step size
# against a tiny ridge, in a direction the shrunk sketch no longer holds).
RESULT_SKIPS = {
    "fd": (so.mirror_descent, sketches.frequent_directions(4, lazy=False)),
    "fd_lazy": (so.mirror_descent, sketches.frequent_directions(4, lazy=True)),
    "oja": (so.mirror_descent, sketches.oja(4)),
    "random_projection": (so.mirror_descent, sketches.random_projection(4, KEY)),
    "fd_dual_averaging": (so.dual_averaging, sketches.frequent_directions(4, lazy=False)),
}


@pytest.mark.parametrize("case", list(RESULT_SKIPS))
def test_a_skip_for_the_result_keeps_each_sketch_whole(case):
    """The sketch's rows are not selected against their old buffer (``GUARDED``), so on such a
    skip the whole sketch keeps the gradient -- its small fields agree with its rows, the state
    the sketch alone reaches -- while the update is zero, the rule's other fields are the old
    ones and the skip is counted (``sketchopt._leafwise``, the policy)."""
    rule, sketch = RESULT_SKIPS[case]
    tx = rule(1e38, metrics.sketched(sketch, 1e-30))
    update = jax.jit(tx.update)
    params = jnp.zeros((64,))
    state = tx.init(params)
    for t in range(60):
        g = jax.random.normal(jax.random.PRNGKey(t), (64,))
        updates, new = update(g, state, params)
        if not np.any(np.asarray(updates)):
            break
        state = new
    else:
        pytest.fail("no step overflowed")
    assert nonfinite_count(new) == nonfinite_count(state) + 1
    before, after = state.metric_state.leaf(0), new.metric_state.leaf(0)
    alone = sketch.update(before, g)
    # Rows and directions are defined up to sign across two programs: compare what they span
    # (the covariance, from the rows and the small fields together) and the counters.
    want = np.asarray(sketches.covariance(alone))
    got = np.asarray(sketches.covariance(after))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert int(after.count) == int(alone.count) == int(before.count) + 1
    for name in set(new._fields) - {"metric_state", "count", "nonfinite_count"}:
        assert same_bits(getattr(state, name), getattr(new, name)), name


# ----------------------------------------------------------------------------------------------
# Extreme magnitudes, zeros, sketch sizes, scalar and size-0 leaves.

CASES = {
    "huge": lambda p, s: random_like(p, s, 1e30),
    "tiny": lambda p, s: random_like(p, s, 1e-30),
    "zero": lambda p, s: jax.tree.map(jnp.zeros_like, p),
    # leaves of very different magnitudes, each jumping by 1e60 from one step to the next
    "mixed": lambda p, s: {k: random_like(v, s, MIXED[k][s % 2]) for k, v in p.items()},
}
MIXED = {"m": (1e30, 1e-30), "v": (1e-30, 1e30), "s": (1.0, 1e10), "e": (1.0, 1.0)}


def _check_steps(name, grads_fn, *, tau=TAU, steps=4, jit=True):
    """Steps that must stay finite. Jitted, the outputs are checked (the compiled step is the one
    the other tests of the family use); un-jitted, every primitive's output is checked under
    ``debug_nans`` with ``jit`` disabled (one op at a time, the compiled units included)."""
    params = shapes_params()
    if not jit:
        # One primitive at a time, each leaf group's primitives compile on their own; the vector
        # leaf takes the matrix leaf's path (both longer than the sketch), so it is left out.
        del params["v"]
    grads = [grads_fn(params, s) for s in range(steps)]
    if jit:
        params, state, outs = run(name, params, grads, tau=tau)
    else:
        with jax.debug_nans(True), jax.disable_jit():
            params, state, outs = run(name, params, grads, tau=tau, jit=False)
    assert_finite(outs, "updates")
    assert_finite(state, "state")
    assert_finite(params, "params")
    assert nonfinite_count(state) == 0


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", _params())
def test_extreme_gradients_stay_finite(name, case, request):
    reason = KNOWN.get((case, name)) or KNOWN.get(("size0", name))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    _check_steps(name, CASES[case])


@pytest.mark.parametrize("name", _params(SKETCHED, "size0"))
@pytest.mark.parametrize("tau", [1, 16])
def test_sketch_size_one_and_larger_than_d(name, tau):
    """``sketch_size = 1`` and ``sketch_size > d`` for every leaf (16 > 12)."""
    _check_steps(name, CASES["mixed"], tau=tau, steps=3)


@pytest.mark.parametrize("name", _params())
def test_no_transient_nan_without_jit(name):
    """One un-jitted step under ``debug_nans`` for huge and for tiny gradients: every primitive's
    output is checked. (One item for both: the second reuses the primitives the first compiled.)
    A case listed in ``KNOWN`` must still fail (``pytest.raises``, so that a fix is noticed), and
    the other case is checked all the same."""
    for case in ("huge", "tiny"):
        reason = KNOWN.get((f"transient-{case}", name)) or KNOWN.get(("size0", name))
        if reason:
            with pytest.raises(Exception):  # noqa: B017 -- whatever the known failure raises
                _check_steps(name, CASES[case], steps=1, jit=False)
        else:
            _check_steps(name, CASES[case], steps=1, jit=False)


# ----------------------------------------------------------------------------------------------
# Dtypes.


def low_precision_params():
    """:func:`shapes_params`'s leaves in bfloat16 and float16, and the leaf shapes that tree lacks
    (size 1, 3-d) in every dtype: a float32 leaf beside low-precision ones takes the same path
    as in an all-float32 tree."""
    other = {"a": ((1,), jnp.bfloat16), "b": ((2, 3), jnp.float32), "c": ((7,), jnp.float16)}
    other["d"] = ((3, 1, 2), jnp.float32)
    return {
        "m": shapes_params(jnp.bfloat16)["m"],
        "v": shapes_params(jnp.float16)["v"],
        "s": jnp.asarray(0.25, jnp.bfloat16),
        "e": jnp.zeros((0,), jnp.float16),
    } | {
        k: (0.1 * jnp.arange(math.prod(s), dtype=jnp.float32).reshape(s)).astype(dtype)
        for k, (s, dtype) in other.items()
    }


@pytest.mark.parametrize("name", _params(test="size0"))
def test_low_precision_params_keep_float32_state(name):
    params = low_precision_params()
    grads = [random_like(params, s) for s in range(3)]
    new_params, state, outs = run(name, params, grads)
    for updates in outs:
        for k in params:
            assert updates[k].dtype == params[k].dtype, k
        assert_finite(updates, "updates")
    for k in params:
        assert new_params[k].dtype == params[k].dtype
    floats = {x.dtype for x in float_leaves(state)}
    assert floats <= {jnp.dtype(jnp.float32)}, floats
    assert_finite(state, "state")


@pytest.mark.parametrize("name", _params(test="size0"))
def test_float64_is_honoured_under_enable_x64(name):
    with jax.enable_x64(True):
        params = shapes_params(jnp.float64)
        tx = make(name)
        state = tx.init(params)
        updates, state = jax.jit(tx.update)(random_like(params, 0), state, params)
        for k in params:
            assert updates[k].dtype == jnp.float64, k
        floats = {x.dtype for x in float_leaves(state)}
        assert floats <= {jnp.dtype(jnp.float64)}, floats
        assert_finite((updates, state), "float64 step")
    assert jnp.zeros(()).dtype == jnp.float32  # the flag did not leak


# ----------------------------------------------------------------------------------------------
# Invalid arguments.

INVALID = [
    # (constructor, argument named in the error)
    (lambda: so.ada_fd(0.1, 0, 0.1, robust=False), "sketch_size"),
    (lambda: so.ada_fd(0.1, -2, 0.1, robust=False), "sketch_size"),
    (lambda: so.ada_fd(0.1, 2.5, 0.1, robust=False), "sketch_size"),
    (lambda: so.ada_fd(0.1, True, 0.1, robust=False), "sketch_size"),
    (lambda: so.ada_fd(0.1, 3, 0.0, robust=False), "delta"),
    (lambda: so.ada_fd(0.1, 3, -1.0, robust=False), "delta"),
    (lambda: so.ada_fd(0.1, 3, float("nan"), robust=False), "delta"),
    (lambda: so.ada_fd(float("nan"), 3, 0.1, robust=False), "learning_rate"),
    (lambda: so.ada_fd(float("inf"), 3, 0.1, robust=False), "learning_rate"),
    (lambda: so.ada_fd(-0.1, 3, 0.1, robust=False), "learning_rate"),
    (lambda: so.ada_full(0.1, float("inf")), "delta"),
    (lambda: so.ada_diag(0.1, -1.0), "delta"),
    (lambda: so.ada_fd_dual_averaging(0.1, 0, 0.1, robust=False), "sketch_size"),
    (lambda: so.s_adagrad(0.1, 3, 0.0), "delta"),
    (lambda: sketches.robust_frequent_directions(3, alpha_fraction=1.5), "alpha_fraction"),
    (lambda: sketches.robust_frequent_directions(3, alpha0=-1.0), "alpha0"),
    (lambda: sketches.parameterized_frequent_directions(3, 0.0), "beta"),
    (lambda: sketches.oja(3, learning_rate=2.0), "learning_rate"),
    (lambda: sketches.frequent_directions(0), "sketch_size"),
    (lambda: regularizers.l1(-1.0), "strength"),
    (lambda: regularizers.l1(1.0, tol=2.0), "tol"),
    (lambda: so.fd_son(-1.0, 3), "alpha"),
    (lambda: so.fd_son(float("nan"), 3), "alpha"),
    (lambda: so.fd_son(1.0, 0), "sketch_size"),
    (lambda: so.fd_son(1.0, 3, eta=-1.0), "eta"),
    (lambda: so.fd_son(1.0, 3, curvature=float("inf")), "curvature"),
    (lambda: so.rfd_son(3, alpha0=-1.0), "alpha0"),
    (lambda: so.rfd_son(0, alpha0=0.0), "sketch_size"),
    (lambda: so.oja_son(1.0, 0), "sketch_size"),
    (lambda: so.rp_son(0.0, 3, KEY), "alpha"),
    (lambda: so.ons(-1.0), "alpha"),
    (lambda: so.radagrad(0.1, 0, 0.1, KEY), "sketch_size"),
    (lambda: so.radagrad(0.1, 3, 0.0, KEY), "delta"),
    (lambda: so.ada_lr(0.1, 3, -1.0, KEY), "delta"),
    (lambda: so.simple_truncation(0.1, -1.0), "theta"),
    (lambda: so.simple_truncation(0.1, 1.0, 0), "period"),
    (lambda: so.truncated_gradient(0.1, -1.0, 1.0), "gravity"),
    (lambda: so.fobos_l1(float("nan"), 0.1), "learning_rate"),
    (lambda: so.fobos_l1(0.1, -0.1), "l1"),
    (lambda: so.rda_l1(0.0, 0.1), "gamma"),
    (lambda: so.ftrl_proximal(0.1, beta=-1.0), "beta"),
    (lambda: so.ftrl_proximal(0.1, l2=float("inf")), "l2"),
]
# The message also states the allowed range ("an integer >= 1", "in (0, 1]", ...).
RANGE = r"(>=|>|<=|<|\(|\[|one of|integer|finite)"


@pytest.mark.parametrize("index", range(len(INVALID)))
def test_invalid_construction_names_the_argument(index):
    build, argument = INVALID[index]
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    assert argument in message, message
    assert any(s in message for s in (">=", ">", "<", "(", "[", "one of", "integer")), message


@pytest.mark.parametrize("name", _params())
def test_mismatched_tree_fails_at_trace_time(name):
    params = shapes_params(with_empty=False)
    tx = make(name)
    state = tx.init(params)
    grads = random_like(params, 0)
    missing = {k: v for k, v in grads.items() if k != "v"}
    with pytest.raises((ValueError, TypeError)):
        jax.eval_shape(tx.update, missing, state, params)
    extra = dict(grads, w=jnp.ones(2))
    with pytest.raises((ValueError, TypeError)):
        jax.eval_shape(tx.update, extra, state, params)


@pytest.mark.parametrize("name", _params(test="int_grads"))
def test_integer_gradients_fail_at_trace_time(name):
    params = shapes_params(with_empty=False)
    tx = make(name)
    state = tx.init(params)
    integers = jax.tree.map(lambda g: jnp.round(g).astype(jnp.int32), random_like(params, 0))
    with pytest.raises((ValueError, TypeError)) as info:
        jax.eval_shape(tx.update, integers, state, params)
    assert any(w in str(info.value).lower() for w in ("dtype", "float", "integer", "int32"))


# ----------------------------------------------------------------------------------------------
# Long runs.

LONG_STEPS = 100_000
LONG_DIM, LONG_TAU, LONG_RANK = 64, 8, 7
ORTHONORMAL_TOL = 1e-4
COVARIANCE_TOL = 1e-2  # relative spectral norm, float32 vs float64 sketch of the same stream
FULL_OPTIMIZATION = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}


def _stream_basis():
    """The stream's fixed rank-7 basis and its decaying scales (float32)."""
    f32 = jnp.float32
    basis = jax.random.normal(jax.random.PRNGKey(12), (LONG_RANK, LONG_DIM), f32)
    return basis, 10.0 ** (-jnp.arange(LONG_RANK, dtype=f32) / 8)


def _stream_row(t, dtype, basis, scales):
    """Row ``t`` of a generated stream: a decaying rank-7 signal (one direction less than the
    sketch keeps) plus isotropic noise, drawn in float32 whatever ``dtype`` is (the float64 run
    must see the very same rows)."""
    f32 = jnp.float32
    k1, k2 = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(11), t))
    z = jax.random.normal(k1, (LONG_RANK,), f32) * scales
    noise = 0.05 * jax.random.normal(k2, (LONG_DIM,), f32)
    return ((z @ basis + noise) / f32(math.sqrt(LONG_DIM))).astype(f32).astype(dtype)


def _long_run(dtype):
    """``ada_fd`` and ``rfd_son`` over the same stream in one ``lax.scan``; their sketches."""
    txs = {
        "ada_fd": so.ada_fd(0.1, LONG_TAU, 1e-3, robust=False),
        "rfd_son": make("rfd_son", LONG_TAU),
        # the lazy basis (B = F Z), written back every 32 shrinks
        "ada_fd_lazy": so.mirror_descent(
            0.1, so.metrics.sketched(sketches.frequent_directions(LONG_TAU, lazy=True), 1e-3)
        ),
    }
    params = jnp.zeros((LONG_DIM,), dtype)

    # A run this long is execution-bound: compile it with XLA's full backend optimization, not
    # the suite's cheap setting (tests/conftest.py).
    @functools.partial(jax.jit, compiler_options=FULL_OPTIMIZATION)
    def scan(states):
        basis, scales = _stream_basis()  # drawn once, outside the loop

        def body(states, t):
            g = _stream_row(t, dtype, basis, scales)
            return {k: txs[k].update(g, s, params)[1] for k, s in states.items()}, None

        return jax.lax.scan(body, states, jnp.arange(LONG_STEPS))[0]

    states = scan({k: tx.init(params) for k, tx in txs.items()})
    out = {k: so.per_leaf_states(states[k].metric_state, params) for k in ("ada_fd", "ada_fd_lazy")}
    out["rfd_son"] = so.per_leaf_states(states["rfd_son"].leaf_state, params).sketch
    return out


@pytest.mark.slow
def test_long_run_keeps_directions_orthonormal(record_property):
    sketched32 = _long_run(jnp.float32)
    with jax.enable_x64(True):
        sketched64 = _long_run(jnp.float64)
        cov64 = {k: np.asarray(sketches.covariance(s)) for k, s in sketched64.items()}
    for name, sk in sketched32.items():
        assert int(sk.count) == LONG_STEPS and int(sk.nonfinite_count) == 0
        v, lam, _ = (np.asarray(x, np.float64) for x in sketches.factors(sk))
        live = v[lam > 0]
        assert live.shape[0] == LONG_TAU - 1
        orth = np.max(np.abs(live @ live.T - np.eye(live.shape[0])))
        cov32 = np.asarray(sketches.covariance(sk), np.float64)
        rel = np.linalg.norm(cov32 - cov64[name], 2) / np.linalg.norm(cov64[name], 2)
        record_property(f"{name}_orthonormality_error", float(orth))
        record_property(f"{name}_covariance_rel_error_vs_float64", float(rel))
        print(f"{name}: max|V V^T - I| = {orth:.2e}, |C32 - C64| / |C64| = {rel:.2e}")
        assert orth <= ORTHONORMAL_TOL, (name, orth)
        assert rel <= COVARIANCE_TOL, (name, rel)


# ----------------------------------------------------------------------------------------------
# Property-based fuzzing.


# The fuzzed trees: the float32 tree of the tests above and their mixed low-precision tree.
# Between them they hold every kind of leaf (scalar, size 0, size 1, vector, matrix, 3-d) and
# every dtype the transforms accept. A fixed set of trees lets each family compile its step once
# per tree (shared with the tests above), so the examples go into what varies the invariants:
# magnitudes per leaf, the number of steps, and where a NaN or Inf lands.
FUZZ_TREES = {
    "float32": shapes_params,
    "low_precision": low_precision_params,
}


@st.composite
def fuzz_cases(draw):
    tree = draw(st.sampled_from(sorted(FUZZ_TREES)))
    params = FUZZ_TREES[tree]()
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        # magnitudes representable in each leaf's dtype (float16 stops at 65504)
        exponents = {
            k: draw(st.integers(-3, 3) if p.dtype == jnp.float16 else st.integers(-30, 30))
            for k, p in params.items()
        }
        bad = draw(st.sampled_from([None, np.nan, np.inf, -np.inf]))
        where = draw(st.sampled_from(sorted(params)))
        position = draw(st.floats(0, 1))
        steps.append((exponents, bad, where, position))
    return tree, steps


@pytest.mark.parametrize("name", _params())
@settings(max_examples=6, deadline=None)
@given(case=fuzz_cases())
def test_fuzz_invariants(name, case):
    tree, steps = case
    tx = make(name)
    params = FUZZ_TREES[tree]()
    state = tx.init(params)
    for seed, (exponents, bad, where, position) in enumerate(steps):
        grads = {k: random_like(params[k], seed, 10.0 ** exponents[k]) for k in params}
        bad_leaf = None
        if bad is not None and grads[where].size:
            bad_leaf = where
            flat = grads[bad_leaf].reshape(-1)
            index = min(int(position * flat.size), flat.size - 1)
            grads[bad_leaf] = flat.at[index].set(bad).reshape(grads[bad_leaf].shape)
        nonfinite_grads = sum(
            not bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads.values()
        )
        before = nonfinite_count(state)
        old_leaves = per_leaf_states(state, params)
        updates, new_state = jitted_update(name)(grads, state, params)
        for k in params:
            assert updates[k].dtype == params[k].dtype
        assert_finite(updates, "updates")
        assert_finite(new_state, "state")
        assert {x.dtype for x in float_leaves(new_state)} <= {jnp.dtype(jnp.float32)}
        # non-finite leaves are skipped and counted; a finite leaf may also be skipped when its
        # step overflows the parameter dtype (float16), and is then counted too
        assert nonfinite_count(new_state) - before >= nonfinite_grads
        if bad_leaf is not None:
            assert np.all(np.asarray(updates[bad_leaf]) == 0)
            i = sorted(params).index(bad_leaf)
            for old, new in zip(old_leaves, per_leaf_states(new_state, params), strict=True):
                assert same_bits(old[i], new[i])
        state = new_state
        params = optax.apply_updates(params, updates)
        assert_finite(params, "params")


# ----------------------------------------------------------------------------------------------
# Checkpoints.


# One family per distinct state structure (the others hold the same state classes and fields).
STATE_KINDS = [
    "ada_fd",
    "ada_fd_dual_averaging",
    "ada_fd_oja",
    "ada_fd_rp",
    "ada_full",
    "ada_diag",
    "fd_son",
    "fd_son_fast_rescaled",
    "oja_son",
    "rp_son",
    "ons",
    "radagrad",
    "ada_lr",
    "truncated_gradient",
    "rda_l1",
    "ftrl_proximal",
]


@pytest.mark.parametrize("name", _params(STATE_KINDS, test="scalar"))
def test_orbax_round_trip_continues_bit_identically(name, tmp_path):
    import orbax.checkpoint as ocp

    params = shapes_params(with_empty=False)  # orbax refuses to save size-0 arrays
    tx, update = make(name), jitted_update(name)
    state = tx.init(params)
    for s in range(3):
        updates, state = update(random_like(params, s), state, params)
        params = optax.apply_updates(params, updates)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, tx.init(params))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(tmp_path / "state", target)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert same_bits(restored, state)

    def continue_from(st, p):
        outs = []
        for s in range(3, 6):
            updates, st = update(random_like(p, s), st, p)
            p = optax.apply_updates(p, updates)
            outs.append(updates)
        return p, st, outs

    assert same_bits(continue_from(restored, params), continue_from(state, params))
