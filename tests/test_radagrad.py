"""RADAGRAD and ADA-LR (sketchopt.baselines) against float64 NumPy references.

The references follow the Ada-FD paper's eq. (3) and (4) literally (QR and SVD every step).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import sketchopt as so
from sketchopt import _dct, sharding


def _stream(d=8, T=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, d)) * np.linspace(2.0, 0.2, d)
    w_star = rng.normal(size=d)
    return x, x @ w_star


def _run(tx, x, y):
    """Online absolute-loss regression; returns the iterates."""
    w = jnp.zeros(x.shape[1], x.dtype)
    state = tx.init(w)
    update = jax.jit(tx.update)
    out = []
    for t in range(len(x)):
        g = jnp.sign(w @ x[t] - y[t]) * x[t]
        u, state = update(g, state, w)
        w = optax.apply_updates(w, u)
        out.append(np.asarray(w))
    return np.array(out), state


def _projection_matrix(key, d, tau):
    # Under x64, as the runs below: the random streams of permutation depend on the mode.
    with jax.enable_x64(True):
        signs, idx = _dct.init(key, d, tau)
        eye = jnp.eye(d, dtype=jnp.float64)
        return np.asarray(_dct.apply(eye, signs, idx, tau)).T  # Pi: tau x d


def _radagrad_reference(x, y, eta, tau, delta, pi):
    """Eq. (4) literally: G~ += g (Pi g)^T, QR, SVD of B = G~^T Q, V = Q W."""
    d = x.shape[1]
    w = np.zeros(d)
    g_tilde = np.zeros((d, tau))
    out = []
    for t in range(len(x)):
        g = np.sign(w @ x[t] - y[t]) * x[t]
        g_tilde += np.outer(g, pi @ g)
        q, _ = np.linalg.qr(g_tilde)
        _, sigma, wt = np.linalg.svd(g_tilde.T @ q)
        v = q @ wt.T
        keep = sigma > sigma[0] * 1e-10
        v, sigma = v[:, keep], sigma[keep]
        vg = v.T @ g
        w = w - eta * v @ (vg / (np.sqrt(sigma) + delta)) - eta * (g - v @ vg)
        out.append(w.copy())
    return np.array(out)


def _ada_lr_reference(x, y, eta, tau, delta, pi):
    """Eq. (3) literally: G += g g^T, G~ = G Pi^T, QR, SVD of Q^T G."""
    d = x.shape[1]
    w = np.zeros(d)
    gram = np.zeros((d, d))
    out = []
    for t in range(len(x)):
        g = np.sign(w @ x[t] - y[t]) * x[t]
        gram += np.outer(g, g)
        q, _ = np.linalg.qr(gram @ pi.T)
        _, sigma, vt = np.linalg.svd(q.T @ gram, full_matrices=False)
        keep = sigma > sigma[0] * 1e-10
        v, sigma = vt[keep].T, sigma[keep]
        w = w - eta * v @ ((v.T @ g) / (np.sqrt(sigma) + delta))
        out.append(w.copy())
    return np.array(out)


@pytest.mark.parametrize("tau", [3, 8])
def test_radagrad_matches_reference(tau):
    x, y = _stream()
    key = jax.random.PRNGKey(3)
    pi = _projection_matrix(key, x.shape[1], tau)
    ref = _radagrad_reference(x, y, 0.3, tau, 0.5, pi)
    with jax.enable_x64(True):
        ours, _ = _run(so.radagrad(0.3, tau, 0.5, key), jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("tau", [3, 8])
def test_ada_lr_matches_reference(tau):
    x, y = _stream()
    key = jax.random.PRNGKey(4)
    pi = _projection_matrix(key, x.shape[1], tau)
    ref = _ada_lr_reference(x, y, 0.3, tau, 0.5, pi)
    with jax.enable_x64(True):
        ours, _ = _run(so.ada_lr(0.3, tau, 0.5, key), jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("tau", [16, 24])
def test_projection_is_an_isometry_when_it_keeps_every_coordinate(tau):
    pi = _projection_matrix(jax.random.PRNGKey(0), 16, tau)  # tau > d pads zero rows
    np.testing.assert_allclose(pi.T @ pi, np.eye(16), atol=1e-12)


def test_radagrad_with_sketch_larger_than_d_is_ada_full():
    x, y = _stream(d=6, T=30, seed=2)
    with jax.enable_x64(True):
        x, y = jnp.asarray(x), jnp.asarray(y)
        full, _ = _run(so.ada_full(0.3, 0.5), x, y)
        ours, _ = _run(so.radagrad(0.3, 10, 0.5, jax.random.PRNGKey(5)), x, y)
    np.testing.assert_allclose(ours, full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("make", [so.radagrad, so.ada_lr])
def test_approaches_ada_full_as_the_sketch_grows(make):
    x, y = _stream(d=10, T=60, seed=1)
    with jax.enable_x64(True):
        x, y = jnp.asarray(x), jnp.asarray(y)
        full, _ = _run(so.ada_full(0.3, 0.5), x, y)
        errors = []
        for tau in (2, 5, 10):
            ours, _ = _run(make(0.3, tau, 0.5, jax.random.PRNGKey(2)), x, y)
            errors.append(np.abs(ours - full).max())
    assert errors[-1] < 1e-10  # tau = d: the projection is orthogonal and nothing is lost
    assert errors[0] > errors[-1]


def test_extreme_and_bad_gradients_keep_the_state_finite():
    tx = so.radagrad(0.1, 4, 1.0, jax.random.PRNGKey(0))
    p = jnp.zeros(300)
    state = tx.init(p)
    update = jax.jit(tx.update)
    for scale in (1e30, 1e-30, 0.0, 1.0):
        u, state = update(jnp.full(300, scale) * jnp.linspace(-1, 1, 300), state, p)
        assert bool(jnp.all(jnp.isfinite(u)))
        assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(state))
    before = state
    u, state = update(jnp.full(300, jnp.nan), state, p)
    assert int(state.nonfinite_count) == 1
    assert not np.any(np.asarray(u))
    for a, b in zip(
        jax.tree.leaves(before.metric_state), jax.tree.leaves(state.metric_state), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_vmap_over_keys_equals_separate_runs():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    p = jnp.zeros(20)
    g = jnp.linspace(-1.0, 1.0, 20)

    def one(key):
        tx = so.radagrad(0.1, 4, 1.0, key)
        state = tx.init(p)
        u, state = tx.update(g, state, p)
        u, state = tx.update(g[::-1], state, p)
        return u

    batched = jax.vmap(one)(keys)
    for i, key in enumerate(keys):
        np.testing.assert_allclose(batched[i], one(key), rtol=1e-5, atol=1e-6)


def test_validation():
    with pytest.raises(ValueError, match="sketch_size"):
        so.radagrad(0.1, 0, 1.0, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="delta"):
        so.ada_lr(0.1, 3, 0.0, jax.random.PRNGKey(0))


# ----------------------------------------------------------------------------------------------
# ADA-LR's explicit projection matrix (no FFT), degenerate leaves, skipped steps, explicit meshes.


@pytest.mark.parametrize(
    ("d", "tau"), [(1, 1), (1, 4), (2, 3), (8, 3), (16, 16), (16, 24), (257, 5)]
)
def test_explicit_projection_matrix_equals_the_fft_projection(d, tau):
    with jax.enable_x64(True):
        signs, idx = _dct.init(jax.random.PRNGKey(d), d, tau)
        fft = _dct.apply(jnp.eye(d, dtype=jnp.float64), signs, idx, tau).T
        explicit = _dct.matrix(signs, idx, tau, jnp.float64)
    assert explicit.shape == (tau, d) and explicit.dtype == jnp.float64
    np.testing.assert_allclose(explicit, fft, rtol=0, atol=1e-13)
    if d == 1:  # the orthonormal DCT-II of length 1 is the identity: Pi = the sign, then zeros
        expected = np.zeros((tau, 1))
        expected[0, 0] = signs[0]
        np.testing.assert_array_equal(explicit, expected)


@pytest.mark.slow  # a float64 DCT of the d x d identity, d = 5003
def test_explicit_projection_matrix_is_accurate_in_float32_for_large_d():
    # (2j + 1) k reaches ~5e7 > 2**24 here: unreduced, the float32 cosine argument would be off.
    d, tau = 5003, 4
    signs, idx = _dct.init(jax.random.PRNGKey(1), d, tau)
    explicit = _dct.matrix(signs, idx, tau, jnp.float32)
    with jax.enable_x64(True):
        fft = _dct.apply(jnp.eye(d, dtype=jnp.float64), signs, idx, tau).T
    assert explicit.dtype == jnp.float32
    np.testing.assert_allclose(explicit, fft, rtol=0, atol=1e-6)


def test_mulmod_is_exact_where_the_product_overflows_int32():
    rng = np.random.default_rng(0)
    for n in (12, 4 * 5003, 4 * 1_000_003, 2**24):
        a, b = rng.integers(0, n, size=(2, 10_000))
        a[:2], b[:2] = n - 1, [n - 1, 0]
        got = _dct.mulmod(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32), n)
        np.testing.assert_array_equal(got, a * b % n)


def test_ada_lr_on_size_zero_and_scalar_leaves_under_jit():
    params = {
        "e": jnp.zeros((0,)),
        "e2": jnp.zeros((3, 0)),
        "s": jnp.asarray(0.3),
        "v": jnp.asarray([0.3]),
    }
    tx = so.ada_lr(0.1, 3, 0.5, jax.random.PRNGKey(0))
    full = so.ada_full(0.1, 0.5)  # on a 1-vector Pi = +-1 spans everything: ADA-LR is ADA-FULL
    update, full_update = jax.jit(tx.update), jax.jit(full.update)
    state, full_state, p_full = tx.init(params), full.init(params["s"]), params["s"]
    for g in (0.0, 0.7, -1.2, 2.5):
        grads = {
            "e": jnp.zeros((0,)),
            "e2": jnp.zeros((3, 0)),
            "s": jnp.asarray(g),
            "v": jnp.asarray([g]),
        }
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        u_full, full_state = full_update(jnp.asarray(g), full_state, p_full)
        p_full = optax.apply_updates(p_full, u_full)
        for k in params:
            assert updates[k].shape == params[k].shape and updates[k].dtype == params[k].dtype
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((updates, state)))
        np.testing.assert_allclose(params["v"][0], params["s"], rtol=1e-6)
        np.testing.assert_allclose(params["s"], p_full, rtol=1e-6)
    assert int(state.nonfinite_count) == 0


@pytest.mark.parametrize("make", [so.radagrad, so.ada_lr])
def test_skipped_step_leaves_the_state_bit_identical(make):
    tx = make(0.1, 3, 0.5, jax.random.PRNGKey(3))
    p = jnp.zeros(4)
    update = jax.jit(tx.update)
    _, state = update(jnp.asarray([1.0, 0.0, -2.0, 0.5]), tx.init(p), p)
    # Zeros stored as -0 (underflow produces them): adding the skipped step's +0 would flip them.
    negative_zeros = jax.tree.map(
        lambda x: jnp.where(x == 0, -0.0, x) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        state.metric_state,
    )
    state = state._replace(metric_state=negative_zeros)
    u, new = update(jnp.asarray([1.0, jnp.nan, 0.0, 0.0]), state, p)
    assert int(new.nonfinite_count) == 1 and not np.any(np.asarray(u))
    for a, b in zip(
        jax.tree.leaves(state.metric_state), jax.tree.leaves(new.metric_state), strict=True
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("make", [so.radagrad, so.ada_lr])
def test_runs_under_an_explicit_sharding_mesh(make):
    """One device, but explicit-mode sharding types: every d-contraction and gather must say
    its output sharding (the 8-device layout checks are in ``test_sharding.py``)."""
    tx = make(0.1, 3, 0.5, jax.random.PRNGKey(0))
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "s": jnp.asarray(0.5)}
    grads = jax.tree.map(jnp.cos, params)
    expected, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        shard = {"w": NamedSharding(mesh, P("model")), "s": NamedSharding(mesh, P())}
        params, grads = jax.device_put(params, shard), jax.device_put(grads, shard)
        updates, _ = jax.jit(tx.update)(grads, sharding.init(tx, params), params)
    for k in params:
        np.testing.assert_allclose(updates[k], expected[k], rtol=1e-5, atol=1e-7)


def test_ada_lr_with_a_regularizer_is_refused_when_built():
    """ADA-LR's operator only solves (no step off the sketched subspace): a regularizer needs a
    diagonal or low-rank ``H``, and the rules say so at construction, not inside a trace."""
    key = jax.random.PRNGKey(0)
    with pytest.raises(TypeError, match="DiagonalOperator or a LowRankOperator"):
        so.mirror_descent(0.1, so.ada_lr_metric(3, 0.1, key), so.regularizers.l1(0.1))
    with pytest.raises(TypeError, match="ada_lr"):
        so.dual_averaging(0.1, so.ada_lr_metric(3, 0.1, key), so.regularizers.l1(0.1))
    # RADAGRAD's H is low rank plus identity: it combines with any regularizer.
    tx = so.mirror_descent(0.1, so.radagrad_metric(3, 0.1, key), so.regularizers.l1(0.1))
    params = {"w": jnp.ones(5)}
    updates, _ = tx.update({"w": jnp.arange(5.0)}, tx.init(params), params)
    assert np.all(np.isfinite(updates["w"]))
