"""The sparse second-order learners of ``sketchopt.stream.second_order`` against their dense
counterparts in ``sketchopt`` (float64, to 1e-9 relative on predictions and weights, with SON's
projection), their grids, flat layout, bad-input policy, resume and float32 drift."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sketchopt as so
from sketchopt.stream import cli, runner
from sketchopt.stream import examples as ex
from sketchopt.stream import learners as ln
from sketchopt.stream import second_order as so2

DIM = 30
KEY = 7


def sparse_stream(n=240, dim=DIM, seed=0, dtype=np.float64):
    """1 to 7 non-zeros (every 50th example dense: ``s = d``) among 20 recurring coordinates,
    plus coordinates that appear once and never again; mixed feature scales; labels of a
    teacher."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, dim))
    once = list(rng.permutation(np.arange(20, dim)))
    for i in range(n):
        size = dim if i % 50 == 7 else int(rng.integers(1, 8))
        support = np.arange(dim) if size == dim else rng.choice(20, size=size, replace=False)
        if size < dim and once and rng.random() < 0.1:
            support = np.append(support, once.pop())
        x[i, support] = rng.normal(size=support.size) * rng.choice([0.3, 1.0, 3.0], support.size)
    teacher = rng.normal(size=dim)
    y = np.where(x @ teacher + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return ex.from_dense(x, y, nnz=dim, dtype=dtype), x, y


# name -> (sparse learner, dense transform, bound of SON's projection, dense update takes params)
def cases():
    key = jax.random.PRNGKey(KEY)
    return {
        "oja_son": (
            lambda: so2.oja_son(5.0, 4, bound=2.0, diagonal_rescaling=False),
            lambda: so.oja_son(5.0, 4, key=key),
            2.0,
            False,
        ),
        "oja_son_gamma": (
            lambda: so2.oja_son(2.0, 6, oja_learning_rate=0.3, eta=0.5, diagonal_rescaling=False),
            lambda: so.oja_son(2.0, 6, key=key, oja_learning_rate=0.3, eta=0.5),
            np.inf,
            False,
        ),
        "oja_son_dense_steps": (  # every step through the dense path (compaction)
            lambda: so2.oja_son(5.0, 4, bound=2.0, max_growth=1.0, diagonal_rescaling=False),
            lambda: so.oja_son(5.0, 4, key=key),
            2.0,
            False,
        ),
        "oja_son_rescaled": (  # SON sec. 5.2, diagonal rescaling in the dense metric's form
            lambda: so2.oja_son(
                5.0, 4, bound=2.0, eta=0.5, diagonal_rescaling="metric", diagonal_init=0.1
            ),
            lambda: so.oja_son(5.0, 4, key=key, eta=0.5, diagonal_rescaling=True),
            2.0,
            False,
        ),
        "fd_son_rescaled": (
            lambda: so2.fd_son(2.0, 4, eta=0.5, diagonal_rescaling="metric", diagonal_init=0.1),
            lambda: so.fd_son(2.0, 4, eta=0.5, diagonal_rescaling=True),
            np.inf,
            False,
        ),
        "rp_son_rescaled": (
            lambda: so2.rp_son(
                2.0, 4, bound=2.0, eta=0.5, diagonal_rescaling="metric", diagonal_init=0.1
            ),
            lambda: so.rp_son(2.0, 4, key, eta=0.5, diagonal_rescaling=True),
            2.0,
            False,
        ),
        "rp_son": (
            lambda: so2.rp_son(5.0, 4, bound=2.0, diagonal_rescaling=False),
            lambda: so.rp_son(5.0, 4, key),
            2.0,
            False,
        ),
        "fd_son": (
            lambda: so2.fd_son(5.0, 4, bound=2.0, diagonal_rescaling=False),
            lambda: so.fd_son(5.0, 4),
            2.0,
            False,
        ),
        "fd_son_wide": (  # m larger than most examples' s, no spare row
            lambda: so2.fd_son(1.0, 9, spare_rows=0, diagonal_rescaling=False),
            lambda: so.fd_son(1.0, 9),
            np.inf,
            False,
        ),
        "rfd_son": (
            lambda: so2.rfd_son(4, alpha0=1.0, bound=2.0),
            lambda: so.rfd_son(4, alpha0=1.0),
            2.0,
            False,
        ),
        "rfd0_son": (
            lambda: so2.rfd_son(4, alpha0=0.0),
            lambda: so.rfd_son(4, alpha0=0.0),
            np.inf,
            False,
        ),
        "ada_fd": (
            lambda: so2.ada_fd(0.3, 4, 1.0, robust=False),
            lambda: so.ada_fd(0.3, 4, 1.0, robust=False),
            np.inf,
            False,
        ),
        "ada_fd_robust": (
            lambda: so2.ada_fd(0.3, 5, 0.5, robust=True),
            lambda: so.ada_fd(0.3, 5, 0.5, robust=True),
            np.inf,
            False,
        ),
        "ada_fd_dual": (
            lambda: so2.ada_fd(0.3, 4, 1.0, rule="dual_averaging", robust=False),
            lambda: so.ada_fd_dual_averaging(0.3, 4, 1.0, robust=False),
            np.inf,
            True,
        ),
    }


def dense_run(tx, x, y, bound, with_params, loss="logistic"):
    slope = jax.grad(ln.LOSSES[loss])

    @jax.jit
    def step(u, state, xi, yi):
        w = so.project_bounded_prediction(state, u, xi, bound) if np.isfinite(bound) else u
        p = jnp.dot(w, xi)
        g = slope(p, yi) * xi
        updates, state = tx.update(g, state, w) if with_params else tx.update(g, state)
        return w + updates, state, p

    u = jnp.zeros(x.shape[1])
    state = tx.init(u)
    preds, weights = [], []
    for xi, yi in zip(x, y, strict=True):
        u, state, p = step(u, state, jnp.asarray(xi), yi)
        preds.append(float(p))
        weights.append(np.asarray(u))
    return np.array(preds), np.array(weights)


def sparse_run(learner, stream, dim, key=KEY):
    state = learner.init(dim, stream.values.dtype, jax.random.PRNGKey(key))

    def body(state, example):
        idx, val, label = example
        state, p = learner.step(state, ex.SparseVector(idx, val), label)
        return state, (p, learner.weights(state))

    xs = (stream.indices, stream.values, stream.labels)
    state, (preds, weights) = jax.jit(lambda s: jax.lax.scan(body, s, xs))(state)
    return np.asarray(preds), np.asarray(weights), state


@pytest.mark.parametrize("case", sorted(cases()))
def test_sparse_equals_dense(case):
    make, dense, bound, with_params = cases()[case]
    with jax.enable_x64(True):
        stream, x, y = sparse_stream(seed=1 + len(case))
        preds, weights, state = sparse_run(make(), stream, DIM)
        ref_preds, ref_weights = dense_run(dense(), x, y, bound, with_params)
    assert int(state.t) == len(y) and int(state.nonfinite_count) == 0
    scale = np.abs(ref_weights).max()
    assert 0 < scale < 1e3  # a stream that learns, not one that diverges
    np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-9 * np.abs(ref_preds).max())
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-9, atol=1e-9 * scale)
    if np.isfinite(bound):  # Lemma 1: the projected prediction is clipped to the bound
        assert np.abs(preds).max() <= bound * (1 + 1e-12)
        assert np.abs(ref_preds).max() > bound / 2  # (and the projection was active)


def dense_fed_run(tx, x, y, bound, diagonal_init):
    """The fed form of diagonal rescaling (VW's ``--OjaNewton --normalize``) from the dense
    transform without rescaling, run in the learner's coordinates ``z``: the prediction is the
    projected ``z`` against ``x / sqrt(n)``, then ``n += (slope x)^2`` on the example's own
    coordinates, and the step learns from ``slope x / sqrt(n)`` with the new ``n`` (the
    projection too); the weights are ``z / sqrt(n)``."""
    slope = jax.grad(ln.LOSSES["logistic"])

    def project(state, z, xi):
        return so.project_bounded_prediction(state, z, xi, bound) if np.isfinite(bound) else z

    @jax.jit
    def step(z, state, n, xi, yi):
        before = xi / jnp.sqrt(n)
        p = jnp.dot(project(state, z, before), before)
        s = slope(p, yi)
        n = n + jnp.square(s * xi)
        seen = xi / jnp.sqrt(n)
        z = project(state, z, seen)
        updates, state = tx.update(s * seen, state)
        return z + updates, state, n, p

    z = jnp.zeros(x.shape[1])
    n = jnp.full(x.shape[1], diagonal_init)
    state = tx.init(z)
    preds, weights = [], []
    for xi, yi in zip(x, y, strict=True):
        z, state, n, p = step(z, state, n, jnp.asarray(xi), yi)
        preds.append(float(p))
        weights.append(np.asarray(z / jnp.sqrt(n)))
    return np.array(preds), np.array(weights)


@pytest.mark.parametrize(
    "case",
    [
        ("oja_son", 2.0),
        ("fd_son", np.inf),
        ("fd_son", 2.0),
        ("rp_son", 2.0),
    ],
)
def test_fed_rescaling_equals_dense_in_its_coordinates(case):
    """The default rescaling of the stream's SON learners (``"fed"``): the learner fed
    ``x / D_t^{1/2}`` with ``D_t`` grown by the example's own gradient (VW's order), its weights
    staying in those coordinates. Float64, to round-off, against :func:`dense_fed_run`."""
    name, bound = case
    key = jax.random.PRNGKey(KEY)
    make = {
        "oja_son": lambda: so2.oja_son(5.0, 4, bound=bound, eta=0.5),
        "fd_son": lambda: so2.fd_son(2.0, 4, bound=bound, eta=0.5),
        "rp_son": lambda: so2.rp_son(2.0, 4, bound=bound, eta=0.5, diagonal_rescaling=True),
    }[name]
    dense = {
        "oja_son": lambda: so.oja_son(5.0, 4, key=key, eta=0.5),
        "fd_son": lambda: so.fd_son(2.0, 4, eta=0.5),
        "rp_son": lambda: so.rp_son(2.0, 4, key, eta=0.5),
    }[name]
    learner = make()
    with jax.enable_x64(True):
        stream, x, y = sparse_stream(seed=21)
        preds, weights, state = sparse_run(learner, stream, DIM)
        ref_preds, ref_weights = dense_fed_run(dense(), x, y, bound, so2.NORMALIZED_DIAGONAL_INIT)
    assert int(state.t) == len(y) and int(state.nonfinite_count) == 0
    scale = np.abs(ref_weights).max()
    assert 0 < scale < 1e3
    np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-9 * np.abs(ref_preds).max())
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-9, atol=1e-9 * scale)
    if np.isfinite(bound):
        assert np.abs(ref_preds).max() > bound / 2  # (the projection was active)


@pytest.mark.parametrize("case", ["fd_son", "ada_fd_dual"])
def test_accelerator_path_equals_dense(case, monkeypatch):
    """The arrowhead eigen-update (what GPU and TPU run instead of ``eigh``), forced on CPU."""
    from sketchopt import _arrowhead

    monkeypatch.setattr(_arrowhead, "arrowhead_pays", lambda: True)
    make, dense, bound, with_params = cases()[case]
    with jax.enable_x64(True):
        stream, x, y = sparse_stream(n=120, seed=11)
        preds, weights, _ = sparse_run(make(), stream, DIM)
        ref_preds, ref_weights = dense_run(dense(), x, y, bound, with_params)
    np.testing.assert_allclose(preds, ref_preds, rtol=1e-9, atol=1e-9 * np.abs(ref_preds).max())
    np.testing.assert_allclose(
        weights, ref_weights, rtol=1e-9, atol=1e-9 * np.abs(ref_weights).max()
    )


def test_fd_takes_both_paths_and_compacts():
    """The FD family's stream above exercises the rank-one path, the slot path (coordinates seen
    once are kept whole) and the compaction."""
    with jax.enable_x64(True):
        stream, _, _ = sparse_stream(seed=3)
        learner = so2.fd_son(5.0, 4, spare_rows=1, diagonal_rescaling=False)
        state = learner.init(DIM, jnp.float64)
        step = jax.jit(learner.step)
        slots = rank_one = 0
        for i in range(stream.size):
            x = ex.SparseVector(stream.indices[i], stream.values[i])
            new, _ = step(state, x, stream.labels[i])
            used = int(jnp.sum(state.small["free"])) - int(jnp.sum(new.small["free"]))
            compacted = int(new.compactions) > int(state.compactions)
            slots += used > 0 or compacted
            rank_one += used == 0 and not compacted
            state = new
    assert slots > 5 and rank_one > 50 and int(state.compactions) > 3


def with_repeats(stream):
    """``stream`` with each example's first coordinate named twice (its value split in two
    entries), as hashed features collide: one coordinate, two entries of one example."""
    idx, vals = np.asarray(stream.indices), np.asarray(stream.values)
    idx = np.concatenate([idx, idx[:, :1]], axis=1)
    vals = np.concatenate([vals, vals[:, :1] / 2], axis=1)
    vals[:, 0] /= 2
    return stream._replace(indices=idx, values=vals)


@pytest.mark.parametrize("flat", [False, True])
def test_compaction_over_the_listed_rows_equals_the_dense_one(flat):
    """The FD family's compactions visit only the coordinates written on (its support), each
    listed once though an example names it twice; the same run with a dense compaction (a state
    without support) gives the same weights and sketch; the support lists every non-zero
    row of ``Z`` and only coordinates the stream names, and rebuilt from the table it lists the
    non-zero rows."""
    dim = DIM + 10  # coordinates no example names: the listed rows fill part of a chunk
    with jax.enable_x64(True):
        stream, _, _ = sparse_stream(seed=3)
        stream = with_repeats(stream)
        stream = stream._replace(indices=np.where(stream.indices == DIM, dim, stream.indices))
        learner = so2.fd_son(5.0, 4, spare_rows=1)  # (rescaled: the fed form's write)

        def run(listed):  # (a state each: the runner donates it)
            state = learner.init(dim, jnp.float64)
            state = state if listed else state._replace(support=None)
            chunks = runner.chunked(stream, 64, dim, flat=flat, width=4)
            return runner.run_stream(learner, chunks, dim, state=state, dtype=jnp.float64).state

        listed, dense = run(True), run(False)
        assert dense.support is None and int(listed.compactions) > 3
        assert int(listed.compactions) == int(dense.compactions)
        # what both programs define alike (F and Z only up to the eigenvectors' signs): the
        # weights, the sketch's covariance B^T B (B = F Z), its eigenvalues and D's column
        np.testing.assert_allclose(
            learner.weights(listed), learner.weights(dense), rtol=1e-10, atol=1e-12
        )

        def covariance(state):
            b = np.asarray(state.small["F"]) @ np.asarray(state.table)[:, :5].T
            return b.T @ b

        np.testing.assert_allclose(covariance(listed), covariance(dense), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(listed.small["lam"], dense.small["lam"], atol=1e-10)
        np.testing.assert_allclose(listed.table[:, -1], dense.table[:, -1], rtol=1e-12)
        support = listed.support
        count = int(support.count)
        rows = np.asarray(support.rows)
        assert len(set(rows[:count])) == count and np.all(rows[count:] == dim)
        live = np.flatnonzero(np.any(np.asarray(listed.table)[:, :5] != 0, axis=1))
        assert (
            set(live) <= set(rows[:count]) <= set(np.unique(stream.indices[stream.indices < DIM]))
        )
        np.testing.assert_array_equal(
            np.flatnonzero(np.asarray(support.seen)), np.sort(rows[:count])
        )
        rebuilt = so2.with_support(so2.without_support(listed), listed).support
        np.testing.assert_array_equal(np.asarray(rebuilt.rows)[: int(rebuilt.count)], live)


@pytest.mark.parametrize("name", ["oja_son", "rp_son", "fd_son", "ada_fd"])
def test_grid_runs_each_configuration_as_alone(name):
    stream, _, _ = sparse_stream(n=120, seed=5, dtype=np.float32)
    values = np.array([0.5, 4.0])
    field = "learning_rate" if name == "ada_fd" else "alpha"
    grid = runner.run_grid(
        lambda **kw: ln.make_learner(name, **kw),
        {field: values},
        runner.chunked(stream, 64, DIM),
        DIM,
        seeds=(3,),
    )
    for j, value in enumerate(values):
        alone = runner.run_stream(
            ln.make_learner(name, **{field: value}),
            runner.chunked(stream, 64, DIM),
            DIM,
            key=jax.random.PRNGKey(3),
        )
        np.testing.assert_allclose(
            grid.progress.loss_sum[j], alone.progress.loss_sum, rtol=2e-5, atol=1e-5
        )


@pytest.mark.parametrize("name", ["oja_son", "fd_son", "ada_fd"])
def test_flat_layout_equals_padded(name):
    stream, _, _ = sparse_stream(n=150, seed=6, dtype=np.float32)
    learner = ln.make_learner(name)
    padded = runner.run_stream(learner, runner.chunked(stream, 64, DIM), DIM)
    flat = runner.run_stream(learner, runner.chunked(stream, 64, DIM, flat=True, width=4), DIM)
    np.testing.assert_allclose(flat.progress.loss_sum, padded.progress.loss_sum, rtol=1e-5)
    # (float32 sums in another order; the defaults' automatic ridge, mean |x|^2 / 16, is small)
    np.testing.assert_allclose(
        learner.weights(flat.state), learner.weights(padded.state), rtol=1e-4, atol=1e-4
    )


def assert_identical(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("name", [*so2.SECOND_ORDER, "oja_son_rescaled", "rp_son_rescaled"])
def test_bad_examples_are_skipped_and_counted(name):
    """NaN values, an index past d, a negative index, a NaN label: state bit-identical, counted;
    an inactive (padding) step leaves it too, uncounted."""
    stream, _, _ = sparse_stream(n=30, seed=3, dtype=np.float32)
    if name.endswith("_rescaled"):  # the dense metric's form (the defaults are the fed form)
        learner = ln.make_learner(name.removesuffix("_rescaled"), diagonal_rescaling="metric")
    else:
        learner = ln.make_learner(name)
    state = learner.init(DIM)
    step = jax.jit(learner.step)
    for i in range(30):
        state, _ = step(state, ex.SparseVector(stream.indices[i], stream.values[i]), 1.0)
    good_idx, good_val = np.asarray(stream.indices[0]), np.asarray(stream.values[0])
    bad = []
    val = good_val.copy()
    val[0] = np.nan
    bad.append((good_idx, val, 1.0))
    for index in (DIM + 1, -1):
        idx = good_idx.copy()
        idx[0] = index
        bad.append((idx, good_val, 1.0))
    bad.append((good_idx, good_val, np.nan))
    for k, (idx, val, label) in enumerate(bad):
        new, _ = step(state, ex.SparseVector(idx, val), label)
        assert int(new.nonfinite_count) == k + 1
        assert_identical(new._replace(nonfinite_count=state.nonfinite_count), state)
        state = new
    new, _ = step(state, ex.SparseVector(good_idx, good_val), 1.0, False)
    assert_identical(new, state)


def test_huge_and_tiny_values_give_finite_steps():
    """Features scaled by 1e-15 or 1e6 are learned from, with finite weights; at 1e15 (squares
    near float32's range) the state stays finite whatever is skipped
    (docs/sparse_second_order.md)."""
    stream, _, _ = sparse_stream(n=40, seed=8, dtype=np.float32)
    for name in so2.SECOND_ORDER:
        learner = ln.make_learner(name)
        for scale in (1e-15, 1e6, 1e15):
            scaled = stream._replace(values=stream.values * np.float32(scale))
            result = runner.run_stream(learner, runner.chunked(scaled, 64, DIM), DIM)
            for leaf in jax.tree.leaves(result.state):
                assert np.all(np.isfinite(np.asarray(leaf))), (name, scale)
            if scale < 1e10:
                assert int(result.state.nonfinite_count) == 0, (name, scale)
                weights = np.asarray(learner.weights(result.state))
                assert np.all(np.isfinite(weights)) and np.any(weights != 0), (name, scale)


def test_options_are_validated():
    with pytest.raises(ValueError, match="bound"):
        so2.fd_son(0.0, 4, bound=1.0, diagonal_rescaling=False)
    with pytest.raises(ValueError, match="bound"):
        so2.rfd_son(4, bound=1.0, alpha0=0.0)  # RFD0-SON: no ridge before the first shrink
    with pytest.raises(ValueError, match="alpha"):
        so2.rp_son(0.0, 4, diagonal_rescaling=False)
    with pytest.raises(ValueError, match="rule"):
        so2.ada_fd(rule="adam", robust=False)
    with pytest.raises(ValueError, match="sketch_size"):
        so2.oja_son(1.0, 0, diagonal_rescaling=False)
    with pytest.raises(ValueError, match="sketch_size <= dim"):
        so2.oja_son(1.0, 8, diagonal_rescaling=False).init(5)
    with pytest.raises(ValueError, match="delta"):
        so2.ada_fd(0.1, 4, -1.0, robust=False)
    with pytest.raises(ValueError, match="diagonal_init"):
        so2.fd_son(diagonal_init=0.0)
    with pytest.raises(ValueError, match="diagonal_rescaling"):
        so2.oja_son(diagonal_rescaling="vw")


@pytest.mark.parametrize("name", ["oja_son", "fd_son"])
def test_cli_resume_continues_bit_identically(tmp_path, name):
    import orbax.checkpoint as ocp
    from sklearn.datasets import dump_svmlight_file

    stream, x, y = sparse_stream(n=400, seed=9, dtype=np.float32)
    dump_svmlight_file(x[:250], y[:250], str(tmp_path / "a.svm"), zero_based=True)
    dump_svmlight_file(x[250:], y[250:], str(tmp_path / "b.svm"), zero_based=True)
    dump_svmlight_file(x, y, str(tmp_path / "ab.svm"), zero_based=True)
    flags = ["--learner", name, "--sketch-size", "5", "--alpha", "2", "--chunk-size", "64"]
    flags += ["--quiet", "--seed", "4"]

    def run(*args):
        assert cli.main([str(a) for a in args]) == 0

    run(tmp_path / "a.svm", *flags, "--save", tmp_path / "first")
    run(tmp_path / "b.svm", "--resume", tmp_path / "first", "--chunk-size", "64", "--quiet",
        "--save", tmp_path / "second", "--json", tmp_path / "second.json")  # fmt: skip
    run(tmp_path / "ab.svm", *flags, "--save", tmp_path / "whole", "--json", tmp_path / "w.json")
    resumed = json.loads((tmp_path / "second.json").read_text())
    at_once = json.loads((tmp_path / "w.json").read_text())
    assert resumed["hyperparameters"]["sketch_size"] == 5
    assert resumed["hyperparameters"]["alpha"] == 2.0
    assert resumed["progressive_loss"] == at_once["progressive_loss"]
    with ocp.StandardCheckpointer() as checkpointer:
        a = checkpointer.restore((tmp_path / "second" / "state").resolve())
        b = checkpointer.restore((tmp_path / "whole" / "state").resolve())
    assert_identical(a["state"], b["state"])


def test_cli_resumes_a_checkpoint_without_support(tmp_path):
    """A checkpoint saved before the FD family listed its support (the state's five fields)
    resumes: the support is rebuilt from the table and the run continues as the one saved
    with it (to round-off: the rebuilt list visits the rows in another order)."""
    import orbax.checkpoint as ocp
    from sklearn.datasets import dump_svmlight_file

    _, x, y = sparse_stream(n=300, seed=9, dtype=np.float32)
    dump_svmlight_file(x[:150], y[:150], str(tmp_path / "a.svm"), zero_based=True)
    dump_svmlight_file(x[150:], y[150:], str(tmp_path / "b.svm"), zero_based=True)
    flags = ["--learner", "fd_son", "--sketch-size", "3", "--chunk-size", "64", "--quiet"]

    def run(*args):
        assert cli.main([str(a) for a in args]) == 0

    run(tmp_path / "a.svm", *flags, "--save", tmp_path / "new")
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text((tmp_path / "new" / "config.json").read_text())
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.restore((tmp_path / "new" / "state").resolve())
        del saved["state"]["support"]
        checkpointer.save((old / "state").resolve(), saved)
    for name in ("new", "old"):
        run(tmp_path / "b.svm", "--resume", tmp_path / name, "--chunk-size", "64", "--quiet",
            "--json", tmp_path / f"{name}.json")  # fmt: skip
    new, old = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("new", "old"))
    assert new["examples"] == old["examples"] == 300
    assert old["progressive_loss"] == pytest.approx(new["progressive_loss"], rel=1e-5)


def drift(learner, state):
    """How far ``F Z`` is from the sketch the small state claims: ``|F K F^T - diag|`` relative
    (Oja: orthonormal rows, ``diag = I``; FD: ``B B^T = diag(lam)``), and ``|K - Z Z^T|``."""
    f, k = np.asarray(state.small["F"], np.float64), np.asarray(state.small["K"], np.float64)
    z = np.asarray(state.table[:, : f.shape[1]], np.float64).T
    claimed = np.eye(f.shape[0]) if learner.name == "oja_son" else np.diag(state.small["lam"])
    top = max(np.abs(claimed).max(), 1e-30)
    fzzf = f @ z @ z.T @ f.T
    return np.abs(fzzf - claimed).max() / top, np.abs(k - z @ z.T).max() / np.abs(k).max()


@pytest.mark.parametrize("name", ["oja_son", "fd_son"])
def test_float32_drift_stays_small(name):
    """A longer float32 stream (the streams benchmark page reports the 1e6-example run): ``F Z``
    stays what the small state says it is."""
    rng = np.random.default_rng(10)
    n, dim, s = 6000, 2000, 12
    indices = np.stack([rng.choice(dim, s, replace=False) for _ in range(n)]).astype(np.int32)
    indices[:, 0] = 0  # a bias-like feature every example shares
    values = (rng.normal(size=(n, s)) / np.sqrt(s)).astype(np.float32)
    values[:, 0] = 1.0
    labels = np.sign(values[:, 1] + 0.1 * rng.normal(size=n)).astype(np.float32)
    stream = ex.SparseExamples(indices, values, labels, np.ones(n, bool))
    learner = ln.make_learner(name)
    result = runner.run_stream(learner, runner.chunked(stream, 2000, dim), dim)
    sketch_err, gram_err = drift(learner, result.state)
    assert sketch_err < 1e-3 and gram_err < 1e-3, (sketch_err, gram_err)


def test_float32_state_under_x64():
    """A float32 state keeps float32 when ``jax_enable_x64`` is on (no NumPy scalar promotes)."""
    stream, _, _ = sparse_stream(n=20, seed=12, dtype=np.float32)
    with jax.enable_x64(True):
        for name in so2.SECOND_ORDER:
            learner = ln.make_learner(name, sketch_size=3)
            result = runner.run_stream(learner, runner.chunked(stream, 16, DIM), DIM)
            assert result.state.table.dtype == jnp.float32, name
            assert int(result.state.nonfinite_count) == 0, name


@pytest.mark.parametrize("name", ["oja_son", "fd_son"])
def test_rescaled_grid_and_flat_layout(name):
    """Diagonal rescaling keeps ``D`` per configuration in a grid, and reads the flat layout's
    segments as the padded layout."""
    stream, _, _ = sparse_stream(n=120, seed=13, dtype=np.float32)
    make = functools.partial(ln.make_learner, name, diagonal_rescaling=True)
    chunks = functools.partial(runner.chunked, stream, 64, DIM)
    grid = runner.run_grid(make, {"alpha": np.array([0.5, 4.0])}, chunks(), DIM, seeds=(2,))
    for j, alpha in enumerate([0.5, 4.0]):
        alone = runner.run_stream(make(alpha=alpha), chunks(), DIM, key=jax.random.PRNGKey(2))
        np.testing.assert_allclose(
            grid.progress.loss_sum[j], alone.progress.loss_sum, rtol=2e-5, atol=1e-5
        )
    learner = make(alpha=1.0)
    padded = runner.run_stream(learner, chunks(), DIM)
    flat = runner.run_stream(learner, chunks(flat=True, width=4), DIM)
    np.testing.assert_allclose(flat.progress.loss_sum, padded.progress.loss_sum, rtol=1e-5)


_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"  # jax.monitoring: one per trace


@pytest.mark.parametrize("name", ["oja_son", "fd_son"])
def test_eager_calls_compile_once(name):
    """Called outside jit, a learner's step (whose compaction is a ``cond``) compiles once: the
    first call traces, the next ones trace nothing (counted by ``jax.monitoring``'s trace
    events, not by a jitted function's cache, which a long test process may evict)."""
    stream, _, _ = sparse_stream(n=6, seed=14, dtype=np.float32)
    learner = ln.make_learner(name, sketch_size=3)
    state = learner.init(DIM)
    traces = []

    def listen(event, duration, **kwargs):
        del duration, kwargs
        if event == _TRACE_EVENT:
            traces.append(len(traces))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for i in range(6):
            if i == 1:
                first, traces[:] = len(traces), []
            x = ex.SparseVector(stream.indices[i], stream.values[i])
            state = learner.update(state, x, float(stream.labels[i]))
            learner.predict(state, x)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert first > 0  # the first step was traced (the event is still JAX's)
    assert traces == []


@pytest.mark.parametrize("name", ["fd_son", "rp_son"])
def test_son_defaults_are_scale_free(name):
    """SON without diagonal rescaling (``alpha`` from the running mean ``|x|^2``): features
    scaled by 1000 give the same predictions (``A`` scales by ``c^2``, the step by ``1/c``), in
    float64, to the round-off of the compactions, which happen at other steps. (Not Oja-SON:
    Oja's rule ``V + Gamma_t V ghat ghat^T`` moves its directions by an amount that scales
    with ``ghat``.)"""
    stream, _, _ = sparse_stream(n=80, seed=9)
    learner = ln.make_learner(name, sketch_size=4, diagonal_rescaling=False)
    with jax.enable_x64(True):
        runs = [
            runner.run_stream(
                learner,
                runner.chunked(stream._replace(values=stream.values * c), 40, DIM),
                DIM,
                dtype=jnp.float64,
            )  # fmt: skip
            for c in (1.0, 1000.0)
        ]
        w0, w1 = (np.asarray(learner.weights(r.state)) for r in runs)  # (float64 states)
    np.testing.assert_allclose(runs[1].progress.loss_sum, runs[0].progress.loss_sum, rtol=1e-8)
    np.testing.assert_allclose(w1 * 1000.0, w0, rtol=1e-4, atol=1e-5)


def test_automatic_ridge_is_the_fixed_one_at_the_same_value():
    """With every example of squared norm ``r``, ``alpha="auto"`` is the fixed ``alpha =
    r / 16``: the same steps as the dense-equivalent learner."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(60, DIM)) * (rng.random((60, DIM)) < 0.2)
    x[:, 0] += 1.0  # no empty row
    x /= np.linalg.norm(x, axis=1, keepdims=True) / 2.0  # |x|^2 = 4
    y = np.where(x @ rng.normal(size=DIM) > 0, 1.0, -1.0)
    stream = ex.from_dense(x, y, nnz=DIM)
    with jax.enable_x64(True):
        auto, fixed = (
            runner.run_stream(
                so2.fd_son(a, 4, diagonal_rescaling=False),
                runner.chunked(stream, 60, DIM),
                DIM,
                dtype=jnp.float64,
            )  # fmt: skip
            for a in ("auto", 4.0 / 16)
        )
    np.testing.assert_allclose(auto.progress.loss_sum, fixed.progress.loss_sum, rtol=1e-7)
