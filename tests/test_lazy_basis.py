"""The lazy basis of per-step FD (``B = F Z``, ``sketchopt.sketches.frequent_directions``).

The sketches themselves are checked against the float64 references with every test of
``tests/test_sketches.py`` (its ``*_lazy`` entries). Here: the updates of the metrics built on them
(the fused Woodbury residual of the Ada-FD metric, SON's Newton metric) equal the eager basis's in
float64 across several write-backs, the default switches to the lazy basis at long rows only, and
a skipped row leaves the lazy state bit-identical inside a transform.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sketchopt as so
from sketchopt import sketches, son

DIM, TAU, STEPS = 24, 5, 150  # 150 shrinks: four write-backs of the lazy basis (every 32)


def _stream(dtype):
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((STEPS, DIM)) * np.geomspace(3, 0.05, DIM)
    rows[::9] = 0  # zero rows
    rows[40:45] = rows[39]  # a repeated row: the buffer loses rank
    rows[100:] *= 1e-3  # a fall in scale (the power-of-two units move)
    return jnp.asarray(rows, dtype)


METRICS = {
    "ada_fd": lambda lazy: so.metrics.sketched(sketches.frequent_directions(TAU, lazy=lazy), 1e-3),
    "ada_rfd": lambda lazy: so.metrics.sketched(
        sketches.robust_frequent_directions(TAU, lazy=lazy), 1e-3
    ),
    "fd_son": lambda lazy: son.newton_metric(
        sketches.frequent_directions(TAU, lazy=lazy), 0.5, eta=0.3
    ),
}


def _updates(metric, rows):
    tx = so.mirror_descent(0.1, metric)
    params = jnp.zeros((DIM,), rows.dtype)

    def step(state, g):
        update, state = tx.update(g, state, params)
        return state, update

    state, updates = jax.jit(lambda s, r: jax.lax.scan(step, s, r))(tx.init(params), rows)
    return np.asarray(updates), state


@pytest.mark.parametrize("name", sorted(METRICS))
def test_lazy_updates_equal_eager_float64(name):
    with jax.enable_x64(True):
        rows = _stream(jnp.float64)
        eager, _ = _updates(METRICS[name](False), rows)
        lazy, state = _updates(METRICS[name](True), rows)
    scale = np.max(np.abs(eager), axis=1)
    assert np.all(lazy[scale == 0] == 0)  # the zero rows
    rel = np.max(np.abs(lazy - eager), axis=1)[scale > 0] / scale[scale > 0]
    assert rel.max() <= 1e-9, rel.max()
    sketch = so.per_leaf_states(state.metric_state, jnp.zeros(DIM))
    sketch = getattr(sketch, "sketch", sketch)
    assert not np.allclose(sketch.transform, np.eye(TAU))  # the basis was lazy


def test_default_is_lazy_for_long_rows_only():
    """``lazy=None`` keeps ``F = I`` below 16384 entries per row and a lazy ``F`` from there on;
    both give the same sketch (float32, across the write-back at the 32nd shrink)."""
    tau, steps = 4, 40
    for dim, lazy in ((2**14 - 1, False), (2**14, True)):
        rows = jax.random.normal(jax.random.PRNGKey(dim), (steps, dim)) * jnp.geomspace(
            1, 0.01, dim
        )
        auto = sketches.frequent_directions(tau)
        forced = sketches.frequent_directions(tau, lazy=not lazy)
        states = [jax.jit(sk.update_many)(sk.init(dim), rows[:34]) for sk in (auto, forced)]
        assert np.array_equal(states[0].transform, np.eye(tau)) != lazy
        covs = [np.asarray(sketches.low_rank(s).project(rows[36]), np.float64) for s in states]
        lams = [np.asarray(sketches.factors(s)[1]) for s in states]
        np.testing.assert_allclose(lams[0], lams[1], rtol=1e-4)
        # V g agrees up to the sign of each direction
        np.testing.assert_allclose(np.abs(covs[0]), np.abs(covs[1]), rtol=1e-3, atol=1e-3)


def test_skipped_row_keeps_lazy_state_bit_identical():
    tx = so.mirror_descent(0.1, METRICS["ada_rfd"](True))
    params = jnp.zeros((DIM,))
    rows = _stream(jnp.float32)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g in rows[:12]:
        state = update(g, state, params)[1]
    before = jax.tree.leaves(state.metric_state)
    _, after_state = update(rows[12].at[3].set(jnp.nan), state, params)
    after = jax.tree.leaves(after_state.metric_state)
    for old, new in zip(before, after, strict=True):
        assert np.asarray(old).tobytes() == np.asarray(new).tobytes()
