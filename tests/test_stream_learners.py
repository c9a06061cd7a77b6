"""The sparse learners of ``sketchopt.stream`` against their dense counterparts in ``sketchopt``
(float64, to 1e-9 relative on predictions and weights), and their bad-input policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.sparse

import sketchopt as so
from sketchopt.stream import examples as ex
from sketchopt.stream import learners as ln
from sketchopt.stream import runner

DIM = 40


def sparse_stream(n=300, dim=DIM, seed=0, nnz=None, dtype=np.float64):
    """Examples with 1 to ``dim`` non-zeros (a few dense ones), a handful of frequent
    coordinates, coordinates that appear once and never again, and +-1 labels of a teacher."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, dim))
    once = list(rng.permutation(np.arange(dim // 2, dim)))  # each used by one example only
    for i in range(n):
        size = dim if i % 97 == 5 else int(rng.integers(1, 6))
        support = rng.choice(dim // 2, size=min(size, dim // 2), replace=False)
        if size == dim:
            support = np.arange(dim)
        elif once and i % 7 == 3:
            support = np.append(support, once.pop())
        x[i, support] = rng.normal(size=support.size) * rng.choice([0.1, 1.0, 3.0])
    teacher = rng.normal(size=dim)
    y = np.where(x @ teacher + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return ex.from_dense(x, y, nnz=nnz or dim, dtype=dtype), x, y


# name -> (sparse learner kwargs, dense transform factory)
CASES = {
    "ada_diag": (
        dict(learning_rate=0.5, delta=0.1, l1=0.02),
        lambda: so.ada_diag(0.5, 0.1, regularizer=so.regularizers.l1(0.02)),
    ),
    "ada_diag_plain": (dict(learning_rate=0.3, delta=0.0), lambda: so.ada_diag(0.3, 0.0)),
    "ada_diag_schedule": (
        dict(learning_rate=optax.exponential_decay(0.5, 10, 0.9), delta=0.1, l1=0.01),
        lambda: so.ada_diag(
            optax.exponential_decay(0.5, 10, 0.9), 0.1, regularizer=so.regularizers.l1(0.01)
        ),
    ),
    "fobos": (dict(learning_rate=0.05, l1=0.01), lambda: so.fobos_l1(0.05, 0.01)),
    "fobos_schedule": (
        dict(learning_rate=optax.polynomial_schedule(0.1, 0.01, 1.0, 250), l1=0.02),
        lambda: so.fobos_l1(optax.polynomial_schedule(0.1, 0.01, 1.0, 250), 0.02),
    ),
    "truncated_gradient": (
        dict(learning_rate=0.05, gravity=0.05, theta=0.4, period=3),
        lambda: so.truncated_gradient(0.05, 0.05, 0.4, 3),
    ),
    "rda": (dict(learning_rate=2.0, l1=0.05), lambda: so.rda_l1(2.0, 0.05)),
    "ftrl": (
        dict(learning_rate=0.3, beta=1.0, l1=0.5, l2=0.1),
        lambda: so.ftrl_proximal(0.3, 1.0, 0.5, 0.1),
    ),
}


def learner_of(case, loss):
    kwargs, _ = CASES[case]
    name = case.split("_")[0] if case.startswith(("fobos", "rda", "ftrl")) else case
    name = {"ada_diag_plain": "ada_diag", "ada_diag_schedule": "ada_diag"}.get(name, name)
    return ln.make_learner(name, loss=loss, **kwargs)


def dense_run(tx, x, y, loss):
    slope = jax.grad(ln.LOSSES[loss])
    w = jnp.zeros(x.shape[1])
    state = tx.init(w)
    preds = []
    for xi, yi in zip(x, y, strict=True):
        p = jnp.dot(w, xi)
        preds.append(float(p))
        updates, state = tx.update(slope(p, yi) * jnp.asarray(xi), state, w)
        w = w + updates
    return np.array(preds), np.asarray(w)


def sparse_run(learner, stream, dim):
    state = learner.init(dim, stream.values.dtype)

    def body(state, example):
        idx, val, label = example
        return learner.step(state, ex.SparseVector(idx, val), label)

    state, preds = jax.lax.scan(body, state, (stream.indices, stream.values, stream.labels))
    return np.asarray(preds), np.asarray(learner.weights(state)), state


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_sparse_equals_dense(case, loss):
    with jax.enable_x64(True):
        stream, x, y = sparse_stream()
        learner = learner_of(case, loss)
        preds, weights, state = sparse_run(learner, stream, DIM)
        ref_preds, ref_weights = dense_run(CASES[case][1](), x, y, loss)
    assert int(state.t) == len(y) and int(state.nonfinite_count) == 0
    scale = np.abs(ref_weights).max()
    assert 0 < scale < 1e3  # a stream that learns, not one that diverges
    np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-9 * np.abs(ref_preds).max())
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-9, atol=1e-9 * scale)


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_other_losses(loss):
    with jax.enable_x64(True):
        stream, x, y = sparse_stream(n=120, seed=1)
        preds, weights, _ = sparse_run(learner_of("ada_diag", loss), stream, DIM)
        ref_preds, ref_weights = dense_run(CASES["ada_diag"][1](), x, y, loss)
    np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-9, atol=1e-12)


def test_predict_is_the_prediction_step_makes():
    with jax.enable_x64(True):
        stream, _, _ = sparse_stream(n=50, seed=2)
        learner = learner_of("ftrl", "logistic")
        state = learner.init(DIM, jnp.float64)
        for i in range(50):
            xi = ex.SparseVector(stream.indices[i], stream.values[i])
            p = learner.predict(state, xi)
            state, q = learner.step(state, xi, stream.labels[i])
            assert float(p) == float(q)


@pytest.mark.parametrize("case", ["ada_diag", "truncated_gradient", "rda", "ftrl", "nag"])
def test_bad_examples_are_skipped_and_counted(case):
    """NaN values, an index past d, a negative index, a NaN label: state bit-identical, counted;
    an inactive (padding) step leaves it too, uncounted."""
    stream, _, _ = sparse_stream(n=30, seed=3)
    learner = ln.nag() if case == "nag" else learner_of(case, "logistic")
    state = learner.init(DIM)
    for i in range(30):
        state = learner.update(state, ex.SparseVector(stream.indices[i], stream.values[i]), 1.0)
    good_idx, good_val = np.asarray(stream.indices[0]), np.asarray(stream.values[0])
    bad = []
    val = good_val.copy()
    val[0] = np.nan
    bad.append((good_idx, val, 1.0))
    idx = good_idx.copy()
    idx[0] = DIM + 1
    bad.append((idx, good_val, 1.0))
    idx = good_idx.copy()
    idx[0] = -1
    bad.append((idx, good_val, 1.0))
    bad.append((good_idx, good_val, np.nan))
    step = jax.jit(learner.step)
    for k, (idx, val, label) in enumerate(bad):
        new, _ = step(state, ex.SparseVector(idx, val), label)
        assert int(new.nonfinite_count) == k + 1
        assert_identical(new._replace(nonfinite_count=state.nonfinite_count), state)
        state = new
    new, _ = step(state, ex.SparseVector(good_idx, good_val), 1.0, False)
    assert_identical(new, state)


def assert_identical(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


def test_unknown_learners_and_losses():
    assert ln.make_learner("oja_son", sketch_size=3).name == "oja_son"
    with pytest.raises(ValueError, match="unknown learner"):
        ln.make_learner("sgd")
    with pytest.raises(ValueError, match="unknown loss"):
        ln.make_learner("ada_diag", loss="poisson")
    with pytest.raises(ValueError, match="constant alpha"):
        ln.ftrl(optax.constant_schedule(0.1))


def test_runner_scores_progressively_and_resumes_bit_identically():
    """The runner's progressive loss is the mean of the losses of the predictions made before
    each update; a run split in two (state and totals carried) equals one run to the bit."""
    from sketchopt.stream import runner

    stream, _, _ = sparse_stream(n=200, seed=4, dtype=np.float32)
    learner = learner_of("ada_diag", "logistic")
    whole = runner.run_stream(learner, runner.chunked(stream, 64, DIM), DIM)
    preds, _, _ = sparse_run(learner, stream, DIM)
    losses = np.asarray(ln.LOSSES["logistic"](jnp.asarray(preds), stream.labels), np.float64)
    assert whole.examples == 200
    np.testing.assert_allclose(whole.progressive_loss, losses.mean(), rtol=1e-5)
    assert [line["examples"] for line in whole.curve] == [1, 2, 4, 8, 16, 32, 64, 128]
    head = ex.rows(stream, 0, 70)
    tail = ex.rows(stream, 70, stream.size)
    first = runner.run_stream(learner, runner.chunked(head, 64, DIM), DIM)
    second = runner.run_stream(
        learner, runner.chunked(tail, 64, DIM), DIM, state=first.state, start=first.progress
    )
    assert_identical(second.state, whole.state)
    assert second.progressive_loss == whole.progressive_loss
    assert second.progressive_error == whole.progressive_error
    # One chunk of 4096 rows, 200 of them real: the runner steps over 256 (the padding past the
    # power of two holding the real rows is cut), with the same numbers.
    one = runner.run_stream(learner, runner.chunked(stream, 4096, DIM), DIM)
    assert one.examples == 200
    np.testing.assert_allclose(one.progressive_loss, whole.progressive_loss, rtol=1e-6)
    np.testing.assert_allclose(learner.weights(one.state), learner.weights(whole.state), rtol=1e-5)


GRIDS = {
    "ada_diag": ({"learning_rate": [0.1, 0.5], "l1": [0.0, 0.01]}, {"delta": 0.1}),
    "truncated_gradient": ({"learning_rate": [0.05, 0.1], "gravity": [0.0, 0.05]}, {"theta": 0.4}),
    "rda": ({"learning_rate": [1.0, 4.0], "l1": [0.0, 0.05]}, {}),
    "ftrl": ({"learning_rate": [0.1, 0.3], "l1": [0.0, 0.5]}, {"l2": 0.1}),
    "nag": ({"learning_rate": [0.1, 0.3, 1.0]}, {}),
}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_a_grid_in_one_pass_equals_each_configuration(name):
    """The grid form (hyperparameters as arrays) runs each configuration as alone: the same
    weights and totals to float32 round-off (XLA turns a division by a constant hyperparameter
    into a multiplication, one rounding apart from the grid's true division), the same counts."""
    from sketchopt.stream import runner

    stream, _, _ = sparse_stream(n=150, seed=5, dtype=np.float32)
    grid, fixed = GRIDS[name]
    make = ln.LEARNERS[name]
    result = runner.run_grid(
        lambda **h: make(**h, **fixed), grid, runner.chunked(stream, 64, DIM), DIM, seeds=(0, 1)
    )
    assert len(result.points) == 2 * np.prod([len(v) for v in grid.values()])
    grid_learner = make(**{k: np.asarray(v) for k, v in grid.items()}, **fixed)
    for i, point in enumerate(result.points):
        hyper = {k: v for k, v in point.items() if k != "seed"}
        single_learner = make(**hyper, **fixed)
        single = runner.run_stream(single_learner, runner.chunked(stream, 64, DIM), DIM)
        for col in single_learner.columns:
            want = np.asarray(ln.column(single_learner, single.state, col))
            got = np.asarray(ln.column(grid_learner, result.state, col))[:, i]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
        assert int(result.state.t[i]) == int(single.state.t) == 150
        np.testing.assert_allclose(result.progressive_loss[i], single.progressive_loss, rtol=1e-6)
        assert result.progressive_error[i] == single.progressive_error


def nag_reference(x, y, eta, loss):
    """Ross, Mineiro & Langford (2013), Alg. 2 (NAG), dense, float64, line by line."""
    slope = jax.grad(ln.LOSSES[loss])
    d = x.shape[1]
    w, s, big_g, n = np.zeros(d), np.zeros(d), np.zeros(d), 0.0
    preds = []
    for t, (xt, yt) in enumerate(zip(x, y, strict=True), start=1):
        for i in range(d):
            if abs(xt[i]) > s[i]:
                w[i] = w[i] * s[i] ** 2 / xt[i] ** 2
                s[i] = abs(xt[i])
        p = float(w @ xt)
        preds.append(p)
        n += sum(xt[i] ** 2 / s[i] ** 2 for i in range(d) if s[i] > 0)
        g = float(slope(p, yt)) * xt
        big_g += g**2
        for i in range(d):
            if big_g[i] > 0:
                w[i] -= eta * np.sqrt(t / n) * g[i] / (s[i] * np.sqrt(big_g[i]))
    return np.array(preds), w


def test_nag_equals_its_reference_and_is_scale_free():
    with jax.enable_x64(True):
        stream, x, y = sparse_stream(n=150, seed=6)
        preds, weights, _ = sparse_run(ln.nag(0.3), stream, DIM)
        ref_preds, ref_weights = nag_reference(x, y, 0.3, "logistic")
        np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(weights, ref_weights, rtol=1e-9, atol=1e-12)
        scale = 10.0 ** np.random.default_rng(0).integers(-3, 4, DIM)
        scaled = ex.from_dense(x * scale, y, nnz=DIM, dtype=np.float64)
        scaled_preds, _, _ = sparse_run(ln.nag(0.3), scaled, DIM)
    np.testing.assert_allclose(scaled_preds, preds, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("name", ["ada_diag", "truncated_gradient", "rda", "ftrl", "nag"])
@pytest.mark.parametrize("width", [4, 64])
def test_flat_chunks_equal_padded_chunks(name, width):
    """Examples of any length in a flat chunk, read in segments of ``width`` (several per long
    example at 4, one at 64): the same predictions and state as the padded rows (float64), the
    same bad-example skips."""
    from sketchopt.stream import runner

    kwargs = {"ada_diag": dict(learning_rate=0.5, delta=0.1, l1=0.02), "nag": {}}.get(
        name, CASES.get(name, ({},))[0]
    )
    with jax.enable_x64(True):
        stream, _, _ = sparse_stream(n=120, seed=7)
        stream.values[17, 0] = np.nan  # a bad example: skipped alike
        learner = ln.make_learner(name, **kwargs)
        padded = runner.run_stream(learner, runner.chunked(stream, 50, DIM), DIM, dtype=jnp.float64)
        flat = runner.run_stream(
            learner, runner.chunked(stream, 50, DIM, flat=True, width=width), DIM,
            dtype=jnp.float64,
        )  # fmt: skip
        assert int(flat.state.nonfinite_count) == int(padded.state.nonfinite_count) == 1
        for a, b in zip(flat.state.table, padded.state.table, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(flat.progressive_loss, padded.progressive_loss, rtol=1e-12)


def test_auto_layout_goes_flat_where_long_examples_pad_short_ones():
    """Flat where padding to the longest example costs more than the flat segments' fixed cost
    (about a thousand entries each, ``ex.SEGMENT_OVERHEAD``); padded where examples are short,
    however their lengths vary."""
    dim, rng = 20_000, np.random.default_rng(8)
    lengths = np.where(np.arange(60) % 20 == 0, 8_000, rng.integers(1, 7, 60))  # a few long
    rows = [rng.choice(dim, k, replace=False) for k in lengths]
    long_short = ex.from_csr(
        scipy.sparse.csr_matrix(
            (np.ones(lengths.sum()), np.concatenate(rows), np.r_[0, np.cumsum(lengths)]),
            shape=(60, dim),
        ),
        np.ones(60),
        dim=dim,
    )
    chunks = list(runner.auto_layout(runner.chunked(long_short, 30, dim), dim))
    assert all(isinstance(c, ex.FlatExamples) for c in chunks) and len(chunks) == 2
    assert len({c.width for c in chunks}) == 1
    stream, _, _ = sparse_stream(n=60, seed=8)  # mostly 1-6 non-zeros, a few dense: DIM wide
    for short in (stream, ex.from_dense(np.eye(DIM)[:20] + np.eye(DIM)[1:21], np.ones(20))):
        chunks = list(runner.auto_layout(runner.chunked(short, 10, DIM), DIM))
        assert all(isinstance(c, ex.SparseExamples) for c in chunks)


def test_segment_width_reads_typical_examples_in_one_segment():
    """The default width minimizes the modelled cost: lengths around 150 are read in one segment
    of 256 (the nearest power of two, 128, cut half of them in two), short ones in the narrowest,
    very long ones in the widest; padding rows (length 0) do not count in to_flat."""
    lengths = np.random.default_rng(0).integers(100, 220, 500)
    assert ex.segment_width(lengths) == 256
    assert ex.segment_width([3, 5, 7]) == 8
    assert ex.segment_width([12_000, 40_000]) == ex.MAX_SEGMENT
    assert ex.segment_width([150] * 10, overhead=0) == 8  # no per-segment cost: no padding
    dim = 300
    stream = ex.from_dense(np.ones((3, 150)), np.ones(3), nnz=150)
    padded = ex.pad_rows(stream, 8, dim)
    assert ex.to_flat(padded, dim).width == 256


def test_plain_pairs_and_zero_one_labels():
    """``x`` may be any ``(indices, values)`` pair; a classification label 0 is the class -1."""
    learner = ln.ada_diag(0.5, 0.1)
    x = (np.array([3, 7, DIM], np.int32), np.array([1.0, -2.0, 0.0], np.float32))
    a, p = learner.step(learner.init(DIM), x, 0.0)
    b, q = learner.step(learner.init(DIM), ex.SparseVector(*x), -1.0)
    assert float(p) == float(q) == 0.0
    assert_identical(a, b)


def test_a_grid_over_flat_chunks_equals_the_grid_over_padded_chunks():
    from sketchopt.stream import runner

    with jax.enable_x64(True):
        stream, _, _ = sparse_stream(n=90, seed=9)
        grid = {"learning_rate": [0.1, 0.5], "l1": [0.0, 0.02]}

        def make(**h):
            return ln.ada_diag(delta=0.1, **h)

        results = [
            runner.run_grid(
                make, grid, runner.chunked(stream, 40, DIM, flat=flat, width=8), DIM,
                dtype=jnp.float64,
            )
            for flat in (False, True)
        ]  # fmt: skip
    for a, b in zip(results[0].state.table, results[1].state.table, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(results[1].progressive_loss, results[0].progressive_loss, rtol=1e-12)


@pytest.mark.parametrize("name", ["ada_diag", "ftrl", "oja_son", "fd_son"])
def test_importance_weights_scale_the_gradient(name):
    """Weight 1 is no weight, to the bit; weight 0 learns nothing (``t`` stays); on the squared
    loss with a constant rate, weight 2 on one example is the gradient of the loss doubled, as
    for FOBOS, whose step is linear in it: checked through SON/ADA-DIAG's state being finite
    and different from weight 1."""
    stream = sparse_stream(n=20, seed=3, dtype=np.float32)[0]
    learner = ln.make_learner(name)
    step = jax.jit(learner.step)
    state = learner.init(DIM)
    for i in range(10):
        x = ex.SparseVector(stream.indices[i], stream.values[i])
        plain, p0 = step(state, x, stream.labels[i])
        one, p1 = step(state, x, stream.labels[i], True, 1.0)
        zero, _ = step(state, x, stream.labels[i], True, 0.0)
        two, _ = step(state, x, stream.labels[i], True, 2.0)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(one), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(zero), jax.tree.leaves(state), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert float(p0) == float(p1)
        assert int(two.t) == int(plain.t) == int(state.t) + 1
        state = plain
    fobos = ln.fobos(0.1, loss="squared")
    s0 = fobos.init(DIM)
    x = ex.SparseVector(stream.indices[0], stream.values[0])
    w1 = fobos.weights(fobos.step(s0, x, 1.0, True, 1.0)[0])
    w2 = fobos.weights(fobos.step(s0, x, 1.0, True, 2.0)[0])
    np.testing.assert_allclose(w2, 2 * w1, rtol=1e-6)


def test_holdout_keeps_every_kth_example_out_of_learning():
    """VW's holdout (period 3): the run equals learning from the other examples alone, and the
    held-out examples' losses are those of the state they met."""
    stream = sparse_stream(n=90, seed=4)[0]
    learner = ln.ada_diag(0.5)
    held = runner.run_stream(learner, runner.chunked(stream, 25, DIM), DIM, holdout_period=3)
    keep = np.arange(stream.size) % 3 != 2  # the 3rd, 6th, ... (1-based) are held out
    rest = ex.SparseExamples(*(np.asarray(a)[keep] for a in stream[:4]))
    alone = runner.run_stream(learner, runner.chunked(rest, 25, DIM), DIM)
    for a, b in zip(jax.tree.leaves(held.state), jax.tree.leaves(alone.state), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)
    assert int(held.holdout.examples) == 30 and held.examples == 60
    np.testing.assert_allclose(held.progress.loss_sum, alone.progress.loss_sum, rtol=1e-12)
    assert 0 < float(held.holdout_loss) < 1.0
