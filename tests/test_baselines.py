"""Tests of sketchopt.baselines: the sparse online learners of the slides (papers/001).

The float64 NumPy references below are written from the slides' pseudo-code (Alg. 3-6 and the
simple truncation T_0), independently of the JAX code, and compared step by step.
"""

from __future__ import annotations

import contextlib
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sketchopt as so
from sketchopt import first_order as bl

# --------------------------------------------------------------------------------------------
# NumPy references, from the slides. `grad(w, t)` gives the gradient at step t = 1, 2, ... of the
# flat weight vector w; `lr(count)` the step size eta_t with count = t - 1 (Optax convention).
# Each returns the trajectory w_2, ..., w_{T+1} as a (T, N) array.


def ref_simple_truncation(w, grad, steps, lr, theta, k):
    traj = []
    for t in range(1, steps + 1):
        v = w - lr(t - 1) * grad(w, t)
        if t % k == 0:  # T_0(v_i, theta) = 0 if |v_i| <= theta else v_i, when t/k is an integer
            v = np.where(np.abs(v) <= theta, 0.0, v)
        w = v
        traj.append(w.copy())
    return np.array(traj)


def ref_truncated_gradient(w, grad, steps, lr, gravity, theta, k):  # Alg. 3
    traj = []
    for t in range(1, steps + 1):
        g, eta = grad(w, t), lr(t - 1)
        lam_t = k * gravity if t % k == 0 else 0.0
        v = w - eta * g
        w = np.where(
            (v >= 0) & (v <= theta),
            np.maximum(0.0, v - eta * lam_t),
            np.where((v <= 0) & (v >= -theta), np.minimum(0.0, v + eta * lam_t), v),
        )
        traj.append(w.copy())
    return np.array(traj)


def ref_fobos(w, grad, steps, lr, lam):  # Alg. 4, with eta_{t+1/2} = eta_t
    traj = []
    for t in range(1, steps + 1):
        eta = lr(t - 1)
        v = w - eta * grad(w, t)
        w = np.sign(v) * np.maximum(0.0, np.abs(v) - eta * lam)
        traj.append(w.copy())
    return np.array(traj)


def ref_rda(w, grad, steps, gamma, lam):  # Alg. 5
    G, traj = np.zeros_like(w), []
    for t in range(1, steps + 1):
        G = (t - 1) / t * G + grad(w, t) / t
        w = np.where(np.abs(G) < lam, 0.0, -(np.sqrt(t) / gamma) * (G - lam * np.sign(G)))
        traj.append(w.copy())
    return np.array(traj)


def ref_ftrl(n, grad, steps, alpha, beta, l1, l2):  # Alg. 6, W initialized to 0
    w, z, q, traj = np.zeros(n), np.zeros(n), np.zeros(n), []
    for t in range(1, steps + 1):
        g = grad(w.copy(), t)
        for i in range(n):  # for each coordinate
            sigma = (np.sqrt(q[i] + g[i] ** 2) - np.sqrt(q[i])) / alpha
            q[i] += g[i] ** 2
            z[i] += g[i] - sigma * w[i]
            if abs(z[i]) < l1:
                w[i] = 0.0
            else:
                w[i] = -(z[i] - l1 * np.sign(z[i])) / (l2 + (beta + np.sqrt(q[i])) / alpha)
        traj.append(w.copy())
    return np.array(traj)


def ref_ftrl_scheduled(n, grad, steps, alpha, beta, l1, l2):
    """FTRL-Proximal with alpha_t = alpha(t - 1): sigma_t = 1/eta_t - 1/eta_{t-1}."""
    w, z, q, traj = np.zeros(n), np.zeros(n), np.zeros(n), []
    inv_eta_prev = np.full(n, beta / float(alpha(0)))  # the origin-centered beta/alpha term
    for t in range(1, steps + 1):
        g = grad(w, t)
        q += g**2
        inv_eta = (beta + np.sqrt(q)) / float(alpha(t - 1))
        z += g - (inv_eta - inv_eta_prev) * w
        w = -np.sign(z) * np.maximum(np.abs(z) - l1, 0.0) / (l2 + inv_eta)
        inv_eta_prev = inv_eta
        traj.append(w.copy())
    return np.array(traj)


# --------------------------------------------------------------------------------------------
# Harness: an online least-squares stream whose gradients depend on the current weights.

SHAPES = {"a": (2, 3), "b": (4,)}
N = 10


def x64(dtype):
    """float64 runs enable x64 only inside this context, so other test modules are unaffected."""
    return jax.enable_x64(True) if dtype == np.float64 else contextlib.nullcontext()


def make_stream(steps=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(steps, N))
    w_star = np.where(rng.random(N) < 0.5, rng.normal(size=N), 0.0)
    y = X @ w_star + 0.1 * rng.normal(size=steps)

    def grad(w, t):  # gradient of 1/2 (x_t . w - y_t)^2
        x = X[t - 1]
        return x * (x @ w - y[t - 1])

    return grad


def to_tree(flat, dtype):
    out, i = {}, 0
    for key, shape in SHAPES.items():
        size = math.prod(shape)
        out[key] = jnp.asarray(np.reshape(flat[i : i + size], shape), dtype)
        i += size
    return out


def to_flat(tree):
    return np.concatenate([np.ravel(np.asarray(tree[k], np.float64)) for k in SHAPES])


def run_online(tx, w0, grad, steps, dtype):
    """Run ``tx`` op by op on the stream; return the trajectory (steps, N) and the final state.

    (Op by op is much cheaper than compiling for these short runs; jit is tested separately.)
    """
    params = to_tree(w0, dtype)
    state = tx.init(params)
    update = tx.update
    traj = []
    for t in range(1, steps + 1):
        grads = to_tree(grad(to_flat(params), t), dtype)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        traj.append(to_flat(params))
    return np.array(traj), state


TOLERANCES = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-6)}


def lr_decaying(count):
    return 0.08 / jnp.sqrt(count + 1.0)


STEPS = 30
W0 = np.random.default_rng(1).normal(scale=0.3, size=N)

# name -> (construct from a learning rate, slides reference from (grad, eta(count)))
GD_CASES = {
    "simple_truncation": (
        lambda lr: bl.simple_truncation(lr, theta=0.08, period=3),
        lambda grad, lr: ref_simple_truncation(W0, grad, STEPS, lr, theta=0.08, k=3),
    ),
    "truncated_gradient": (
        lambda lr: bl.truncated_gradient(lr, gravity=0.4, theta=0.3, period=3),
        lambda grad, lr: ref_truncated_gradient(W0, grad, STEPS, lr, 0.4, theta=0.3, k=3),
    ),
    "fobos_l1": (
        lambda lr: bl.fobos_l1(lr, l1=0.3),
        lambda grad, lr: ref_fobos(W0, grad, STEPS, lr, lam=0.3),
    ),
}


@pytest.mark.parametrize(
    ("schedule", "dtype"), [(False, np.float64), (True, np.float64), (True, np.float32)]
)
@pytest.mark.parametrize("name", sorted(GD_CASES))
def test_gradient_learners_match_slides_reference(name, schedule, dtype):
    construct, reference = GD_CASES[name]
    lr = lr_decaying if schedule else 0.05
    grad = make_stream(STEPS)
    with x64(np.float64):  # the reference evaluates the schedule in float64
        rates = [float(lr(jnp.int32(c))) if callable(lr) else lr for c in range(STEPS)]
    expected = reference(grad, rates.__getitem__)
    assert np.count_nonzero(expected == 0) > 0  # the truncation is exercised
    with x64(dtype):
        traj, state = run_online(construct(lr), W0, grad, STEPS, dtype)
    np.testing.assert_allclose(traj, expected, **TOLERANCES[dtype])
    assert state.count.dtype == jnp.int32 and int(state.count) == STEPS
    assert int(state.nonfinite_count) == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rda_matches_slides_reference(dtype):
    grad = make_stream(STEPS)
    expected = ref_rda(np.zeros(N), grad, STEPS, gamma=4.0, lam=0.4)
    assert 0 < np.count_nonzero(expected[-1]) < N
    with x64(dtype):
        traj, state = run_online(bl.rda_l1(gamma=4.0, l1=0.4), np.zeros(N), grad, STEPS, dtype)
        assert all(x.dtype == dtype for x in jax.tree.leaves(state.grad_avg))
    np.testing.assert_allclose(traj, expected, **TOLERANCES[dtype])
    steps = jax.tree.leaves(state.steps)  # per leaf, stacked by leaf shape
    assert sorted(int(s) for x in steps for s in np.ravel(x)) == [STEPS, STEPS]


@pytest.mark.parametrize(
    ("beta", "dtype"), [(0.0, np.float64), (1.0, np.float64), (1.0, np.float32)]
)
def test_ftrl_matches_slides_reference(beta, dtype):
    grad = make_stream(STEPS)
    expected = ref_ftrl(N, grad, STEPS, alpha=0.4, beta=beta, l1=2.0, l2=0.5)
    assert 0 < np.count_nonzero(expected[-1]) < N
    tx = bl.ftrl_proximal(alpha=0.4, beta=beta, l1=2.0, l2=0.5)
    with x64(dtype):
        traj, state = run_online(tx, np.zeros(N), grad, STEPS, dtype)
        assert all(x.dtype == dtype for x in jax.tree.leaves((state.z, state.sqrt_n)))
    np.testing.assert_allclose(traj, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ftrl_alpha_schedule_matches_reference(dtype):
    def alpha(count):
        return 0.5 / jnp.sqrt(count + 1.0)

    grad = make_stream(STEPS)
    with x64(np.float64):  # the reference evaluates the schedule in float64
        expected = ref_ftrl_scheduled(N, grad, STEPS, alpha, beta=1.0, l1=1.0, l2=0.1)
    with x64(dtype):
        tx = bl.ftrl_proximal(alpha, beta=1.0, l1=1.0, l2=0.1)
        traj, _ = run_online(tx, np.zeros(N), grad, STEPS, dtype)
    np.testing.assert_allclose(traj, expected, **TOLERANCES[dtype])


def test_constant_schedule_equals_constant():
    grad = make_stream(STEPS)
    pairs = [
        (bl.fobos_l1(0.05, 0.3), bl.fobos_l1(optax.constant_schedule(0.05), 0.3)),
        (bl.ftrl_proximal(0.4, 1.0, 1.0), bl.ftrl_proximal(optax.constant_schedule(0.4), 1.0, 1.0)),
    ]
    for plain, scheduled in pairs:
        a, _ = run_online(plain, W0, grad, 10, np.float32)
        b, _ = run_online(scheduled, W0, grad, 10, np.float32)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------
# Equivalences stated in the slides.


@pytest.mark.parametrize("lr", [0.05, lr_decaying])
def test_fobos_is_truncated_gradient_with_infinite_theta_and_period_one(lr):
    """Slides: "L1-FOBOS是TG在特定条件下的特殊形式" (L1-FOBOS is a special case of TG).

    Convention pinned down here: TG shrinks by eta_t * lambda_t (slides Alg. 3) and FOBOS by
    eta_{t+1/2} * l1 with eta_{t+1/2} = eta_t, so with the same learning rate (or schedule),
    fobos_l1(lr, l1) == truncated_gradient(lr, gravity=l1, theta=inf, period=1).
    """
    grad = make_stream(STEPS)
    with x64(np.float64):
        fobos, _ = run_online(bl.fobos_l1(lr, l1=0.3), W0, grad, STEPS, np.float64)
        tg = bl.truncated_gradient(lr, gravity=0.3, theta=np.inf, period=1)
        trunc, _ = run_online(tg, W0, grad, STEPS, np.float64)
    assert np.count_nonzero(fobos[-1] == 0) > 0
    np.testing.assert_allclose(trunc, fobos, rtol=1e-12, atol=1e-14)


def identity_metric():
    """``H = I``: a metric written on the public protocol (``sketchopt.operators``), as a user
    would write one; its state is the operator's diagonal."""

    def init(shape, dtype=jnp.float32):
        return jnp.ones((math.prod(shape),), dtype)

    def operator(state):
        return so.operators.DiagonalOperator(state)

    def update(state, g, valid=True):
        return state, operator(state), None

    return so.metrics.Metric(init, update, operator, "identity")


@pytest.mark.parametrize("lr", [0.05, lr_decaying])
def test_fobos_is_mirror_descent_with_the_shared_l1(lr):
    """L1-FOBOS is composite mirror descent with ``H = I`` and ``regularizers.l1`` (Duchi et al.
    eq. 4 with a constant metric): the first-order learner and the architecture agree."""
    grad = make_stream(STEPS)
    with x64(np.float64):
        fobos, _ = run_online(bl.fobos_l1(lr, l1=0.3), W0, grad, STEPS, np.float64)
        md = so.mirror_descent(lr, identity_metric(), so.regularizers.l1(0.3))
        mirror, _ = run_online(md, W0, grad, STEPS, np.float64)
    assert np.count_nonzero(fobos[-1] == 0) > 0
    np.testing.assert_allclose(mirror, fobos, rtol=1e-12, atol=1e-14)


def test_rda_is_dual_averaging_with_the_shared_l1():
    """L1-RDA is dual averaging from 0 with ``H = I``, ``regularizers.l1`` and ``eta_t = 1 /
    (gamma sqrt(t))``: ``prox`` at ``-eta_t t G_t`` with ``c = eta_t t = sqrt(t) / gamma``."""
    gamma = 2.0
    grad = make_stream(STEPS)
    zero = np.zeros_like(W0)
    with x64(np.float64):
        rda, _ = run_online(bl.rda_l1(gamma, l1=0.2), zero, grad, STEPS, np.float64)
        eta = lambda count: 1 / (gamma * jnp.sqrt(count + 1.0))  # noqa: E731
        da = so.dual_averaging(eta, identity_metric(), so.regularizers.l1(0.2))
        dual, _ = run_online(da, zero, grad, STEPS, np.float64)
    assert np.count_nonzero(rda[-1] == 0) > 0
    np.testing.assert_allclose(dual, rda, rtol=1e-12, atol=1e-14)


def test_simple_truncation_is_truncated_gradient_with_infinite_gravity():
    """Slides, "TG与简单截断关系": T_0(v, theta) = T_1(v, inf, theta)."""
    grad = make_stream(STEPS)
    with x64(np.float64):
        simple, _ = run_online(bl.simple_truncation(0.05, 0.08, 3), W0, grad, STEPS, np.float64)
        tg = bl.truncated_gradient(0.05, gravity=1e300, theta=0.08, period=3)
        trunc, _ = run_online(tg, W0, grad, STEPS, np.float64)
    np.testing.assert_allclose(trunc, simple, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kwargs", [dict(gravity=0.0, theta=0.3), dict(gravity=0.4, theta=0.0)])
def test_truncated_gradient_without_truncation_is_sgd(kwargs):
    grad = make_stream(STEPS)
    with x64(np.float64):
        tg, _ = run_online(
            bl.truncated_gradient(0.05, period=2, **kwargs), W0, grad, STEPS, np.float64
        )
        sgd, _ = run_online(optax.sgd(0.05), W0, grad, STEPS, np.float64)
    np.testing.assert_allclose(tg, sgd, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_ftrl_without_regularization_is_per_coordinate_gradient_descent(beta):
    """Slides, Corollary 5: FTRL-Proximal with l1 = l2 = 0 plays the points of gradient descent
    x_{t+1} = x_t - Q_{1:t}^{-1} g_t with per-coordinate rates alpha / (beta + sqrt(n_i))."""
    grad, alpha = make_stream(STEPS), 0.4
    w, n, expected = np.zeros(N), np.zeros(N), []
    for t in range(1, STEPS + 1):
        g = grad(w, t)
        n += g**2
        w = w - alpha / (beta + np.sqrt(n)) * g
        expected.append(w.copy())
    with x64(np.float64):
        tx = bl.ftrl_proximal(alpha, beta=beta, l1=0.0, l2=0.0)
        traj, _ = run_online(tx, np.zeros(N), grad, STEPS, np.float64)
    np.testing.assert_allclose(traj, np.array(expected), rtol=1e-10, atol=1e-12)


def test_rda_without_l1_is_dual_averaging():
    """Slides, Corollary 8 (AOGD = RDA) with sigma_{1:t} = gamma sqrt(t): RDA with l1 = 0 plays
    x_{t+1} = -eta_t g_{1:t} with eta_t = 1 / (gamma sqrt(t)) ("revisionist" gradient descent),
    which is gradient descent on f_t^R(x) = g_t x + sigma_t / 2 ||x||^2 with step eta_t."""
    grad, gamma = make_stream(STEPS), 3.0
    g_sum, x_gd, revisionist, descent = np.zeros(N), np.zeros(N), [], []
    for t in range(1, STEPS + 1):
        eta, sigma = 1 / (gamma * np.sqrt(t)), gamma * (np.sqrt(t) - np.sqrt(t - 1))
        x = revisionist[-1] if revisionist else np.zeros(N)
        g_sum += grad(x, t)
        revisionist.append(-eta * g_sum)
        x_gd = x_gd - eta * (grad(x_gd, t) + sigma * x_gd)
        descent.append(x_gd.copy())
    np.testing.assert_allclose(descent, revisionist, rtol=1e-9, atol=1e-12)
    with x64(np.float64):
        traj, _ = run_online(bl.rda_l1(gamma, l1=0.0), np.zeros(N), grad, STEPS, np.float64)
    np.testing.assert_allclose(traj, np.array(revisionist), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tx", [bl.rda_l1(2.0, 0.1), bl.ftrl_proximal(0.5, 1.0, 0.5, 0.1)])
def test_rda_and_ftrl_weights_come_from_their_sums_not_from_params(tx):
    """The first update moves any initial params to the closed-form weights of the sums."""
    gradients = np.random.default_rng(2).normal(size=(3, N))
    grad = lambda w, t: gradients[t - 1]  # noqa: E731 - the same gradients from any params
    from_zero, _ = run_online(tx, np.zeros(N), grad, 3, np.float32)
    from_w0, _ = run_online(tx, W0, grad, 3, np.float32)
    np.testing.assert_allclose(from_w0, from_zero, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------
# Sparsity on scikit-learn's digits (slides, "Experiments": RDA and FTRL-Proximal are sparser).


def test_rda_and_ftrl_are_sparser_than_fobos_on_digits(record_property):
    """One online pass of logistic regression on digit < 5 vs >= 5 (pixels scaled to [0, 1]).

    Same L1 strength lam per example: FOBOS and RDA take l1 = lam (FOBOS shrinks by eta_t * lam
    each step, RDA thresholds the average gradient at lam, i.e. the sum at t * lam); FTRL-Proximal
    (Alg. 6) thresholds the sum z at a fixed l1, set to T * lam, the RDA threshold at the end of
    the pass. Step sizes are matched: eta_t = 0.5 / sqrt(t) for FOBOS, gamma = 1 / 0.5 for RDA
    (the same eta_t on the gradient sum), alpha = 0.5 and beta = 1 for FTRL.
    """
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X, y = X / 16.0, (y >= 5).astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(y))
    X, y = X[perm].astype(np.float32), y[perm]
    T, lam, eta = 1300, 0.01, 0.5
    (X_train, y_train), (X_test, y_test) = (X[:T], y[:T]), (X[T:], y[T:])

    def loss(params, x, label):
        return optax.sigmoid_binary_cross_entropy(x @ params["w"] + params["b"], label)

    def one_pass(tx):
        @jax.jit
        def run(X, y):
            params = {"w": jnp.zeros(X.shape[1]), "b": jnp.zeros(())}

            def step(carry, example):
                params, state = carry
                updates, state = tx.update(jax.grad(loss)(params, *example), state, params)
                return (optax.apply_updates(params, updates), state), None

            return jax.lax.scan(step, (params, tx.init(params)), (X, y))[0]

        params, state = run(X_train, y_train)
        assert int(state.nonfinite_count) == 0
        w, b = np.asarray(params["w"]), float(params["b"])
        return int(np.count_nonzero(w)), float(np.mean(((X_test @ w + b) > 0) == y_test))

    results = {
        "fobos_l1": one_pass(bl.fobos_l1(lambda c: eta / jnp.sqrt(c + 1.0), lam)),
        "rda_l1": one_pass(bl.rda_l1(1 / eta, lam)),
        "ftrl_proximal": one_pass(bl.ftrl_proximal(eta, 1.0, l1=T * lam)),
        "sgd (fobos, l1=0)": one_pass(bl.fobos_l1(lambda c: eta / jnp.sqrt(c + 1.0), 0.0)),
    }
    print("\nmethod              non-zeros/64  test accuracy")
    for name, (nnz, acc) in results.items():
        print(f"{name:<20}{nnz:>12}  {acc:>13.3f}")
        record_property(f"{name} nonzeros", nnz)
        record_property(f"{name} accuracy", acc)
    fobos, rda, ftrl = results["fobos_l1"][0], results["rda_l1"][0], results["ftrl_proximal"][0]
    assert max(rda, ftrl) < 0.7 * fobos  # measured: rda 20, ftrl 20, fobos 49
    assert fobos < results["sgd (fobos, l1=0)"][0]
    assert all(acc > 0.8 for _, acc in results.values())


# --------------------------------------------------------------------------------------------
# Construction-time validation and missing params.

ALL = {
    "simple_truncation": lambda: bl.simple_truncation(0.1, theta=0.05, period=1),
    "truncated_gradient": lambda: bl.truncated_gradient(0.1, gravity=0.2, theta=0.5, period=1),
    "fobos_l1": lambda: bl.fobos_l1(0.1, l1=0.1),
    "rda_l1": lambda: bl.rda_l1(gamma=2.0, l1=0.1),
    "ftrl_proximal": lambda: bl.ftrl_proximal(alpha=0.5, beta=1.0, l1=0.3, l2=0.1),
}

BAD = [
    (bl.simple_truncation, dict(learning_rate=-1e-3, theta=0.1), "learning_rate"),
    (bl.simple_truncation, dict(learning_rate=np.nan, theta=0.1), "learning_rate"),
    (bl.simple_truncation, dict(learning_rate=np.inf, theta=0.1), "learning_rate"),
    (bl.simple_truncation, dict(learning_rate="0.1", theta=0.1), "learning_rate"),
    (bl.simple_truncation, dict(learning_rate=0.1, theta=-1.0), "theta"),
    (bl.simple_truncation, dict(learning_rate=0.1, theta=np.nan), "theta"),
    (bl.simple_truncation, dict(learning_rate=0.1, theta=0.1, period=0), "period"),
    (bl.simple_truncation, dict(learning_rate=0.1, theta=0.1, period=2.0), "period"),
    (bl.truncated_gradient, dict(learning_rate=-0.1, gravity=0.1, theta=1.0), "learning_rate"),
    (bl.truncated_gradient, dict(learning_rate=0.1, gravity=-0.1, theta=1.0), "gravity"),
    (bl.truncated_gradient, dict(learning_rate=0.1, gravity=np.inf, theta=1.0), "gravity"),
    (bl.truncated_gradient, dict(learning_rate=0.1, gravity=0.1, theta=-1e-3), "theta"),
    (bl.truncated_gradient, dict(learning_rate=0.1, gravity=0.1, theta=1.0, period=True), "period"),
    (bl.truncated_gradient, dict(learning_rate=0.1, gravity=0.1, theta=1.0, period=-3), "period"),
    (bl.fobos_l1, dict(learning_rate=-0.5, l1=0.1), "learning_rate"),
    (bl.fobos_l1, dict(learning_rate=0.1, l1=-1.0), "l1"),
    (bl.fobos_l1, dict(learning_rate=0.1, l1=np.nan), "l1"),
    (bl.rda_l1, dict(gamma=0.0, l1=0.1), "gamma"),
    (bl.rda_l1, dict(gamma=np.inf, l1=0.1), "gamma"),
    (bl.rda_l1, dict(gamma=1.0, l1=-0.1), "l1"),
    (bl.ftrl_proximal, dict(alpha=0.0), "alpha"),
    (bl.ftrl_proximal, dict(alpha=jnp.nan), "alpha"),
    (bl.ftrl_proximal, dict(alpha=0.1, beta=-1.0), "beta"),
    (bl.ftrl_proximal, dict(alpha=0.1, l1=-1.0), "l1"),
    (bl.ftrl_proximal, dict(alpha=0.1, l2=-1.0), "l2"),
    (bl.ftrl_proximal, dict(alpha=0.1, l2=np.inf), "l2"),
]


@pytest.mark.parametrize(("factory", "kwargs", "name"), BAD)
def test_bad_hyperparameters_raise_value_error_naming_the_argument(factory, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        factory(**kwargs)


def test_good_hyperparameters_are_accepted():
    bl.simple_truncation(jnp.asarray(0.1), theta=np.inf, period=np.int64(4))
    bl.truncated_gradient(optax.linear_schedule(0.1, 0.01, 100), 0.0, 0.0, jnp.asarray(2))
    bl.fobos_l1(0.1, 0)
    bl.rda_l1(1, 0.0)
    bl.ftrl_proximal(optax.constant_schedule(0.1), beta=0, l1=0, l2=0)


@pytest.mark.parametrize("name", sorted(ALL))
def test_update_without_params_raises(name):
    tx = ALL[name]()
    params = {"a": jnp.zeros(3)}
    with pytest.raises(ValueError, match="params"):
        tx.update(params, tx.init(params))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
@pytest.mark.parametrize("name", sorted(ALL))
def test_integer_gradients_raise_type_error_at_trace_time(name, dtype):
    tx = ALL[name]()
    params = {"a": jnp.zeros(3), "b": jnp.zeros((2, 2))}
    grads = {"a": jnp.ones(3), "b": jnp.ones((2, 2), dtype)}  # one bad leaf is enough
    with pytest.raises(TypeError, match="floating point"):
        jax.eval_shape(tx.update, grads, tx.init(params), params)


# --------------------------------------------------------------------------------------------
# Bad input: non-finite gradients are skipped per leaf; nothing non-finite enters updates/state.


def per_leaf_state(state, key):
    return [getattr(state, f)[key] for f in state._fields if isinstance(getattr(state, f), dict)]


@functools.partial(jax.jit, static_argnums=0)
def scan_run(tx, params, grads):
    """All steps of ``grads`` (a tree of stacked gradients) under jit + scan; cached per ``tx``."""

    def step(carry, g):
        params, state = carry
        updates, state = tx.update(g, state, params)
        return (optax.apply_updates(params, updates), state), updates

    return jax.lax.scan(step, (params, tx.init(params)), grads)


def run_steps(tx, params, grads):
    """The same as :func:`scan_run`, op by op (cheaper than compiling for a handful of steps)."""
    state, all_updates = tx.init(params), []
    for t in range(jax.tree.leaves(grads)[0].shape[0]):
        updates, state = tx.update(jax.tree.map(lambda g, t=t: g[t], grads), state, params)
        params = optax.apply_updates(params, updates)
        all_updates.append(updates)
    return (params, state), jax.tree.map(lambda *u: jnp.stack(u), *all_updates)


@pytest.mark.parametrize("name", sorted(ALL))
def test_nonfinite_gradient_leaf_is_skipped(name):
    tx = ALL[name]()
    rng = np.random.default_rng(3)
    steps, bad_steps = 8, {2: np.nan, 4: np.inf, 5: -np.inf}
    grads = {"a": rng.normal(size=(steps, 3)), "b": rng.normal(size=(steps, 2, 2))}
    grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grads)
    params0 = {"a": jnp.asarray([0.3, -0.2, 0.05]), "b": jnp.full((2, 2), 0.1)}
    bad_grads = dict(grads)
    for t, bad in bad_steps.items():
        bad_grads["a"] = bad_grads["a"].at[t, 1].set(bad)

    # Step by step (eager): zero update and an unchanged state for leaf "a" on each bad step.
    params, state = params0, tx.init(params0)
    for t in range(steps):
        updates, new_state = tx.update(jax.tree.map(lambda g, t=t: g[t], bad_grads), state, params)
        if t in bad_steps:
            chex.assert_trees_all_equal(updates["a"], jnp.zeros(3))
            chex.assert_trees_all_equal(per_leaf_state(new_state, "a"), per_leaf_state(state, "a"))
            assert bool(jnp.any(updates["b"] != 0))
        chex.assert_tree_all_finite((updates, new_state))
        params, state = optax.apply_updates(params, updates), new_state
    assert int(state.nonfinite_count) == len(bad_steps) and int(state.count) == steps

    # Leaf "a" continues as if the bad steps never reached it, "b" as if nothing had happened.
    (params_jit, state_jit), _ = scan_run(tx, params0, bad_grads)
    chex.assert_trees_all_close((params_jit, state_jit), (params, state), rtol=1e-6, atol=1e-7)
    (params_b, _), _ = scan_run(tx, params0, grads)
    keep = np.asarray([t for t in range(steps) if t not in bad_steps])
    (params_a, _), _ = scan_run(tx, params0, jax.tree.map(lambda g: g[keep], grads))
    chex.assert_trees_all_close(params["a"], params_a["a"], rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(params["b"], params_b["b"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(ALL))
def test_huge_gradients_stay_finite(name):
    tx = ALL[name]()
    rng = np.random.default_rng(4)
    grads = {"a": jnp.asarray(rng.choice([-1e30, 1e30, 3e29], size=(8, 5)), jnp.float32)}
    (params, state), updates = run_steps(tx, {"a": jnp.zeros(5)}, grads)
    chex.assert_tree_all_finite((params, state, updates))
    assert int(state.nonfinite_count) == 0  # FTRL keeps sqrt(n), so g^2 = 1e60 never appears


@pytest.mark.parametrize("name", sorted(ALL))
def test_update_overflowing_the_param_dtype_is_skipped(name):
    """A float16 delta of ~1e6 would be inf: the leaf is skipped instead."""
    tx = {
        "simple_truncation": bl.simple_truncation(100.0, 0.1),
        "truncated_gradient": bl.truncated_gradient(100.0, 0.1, 0.1),
        "fobos_l1": bl.fobos_l1(100.0, 0.1),
        "rda_l1": bl.rda_l1(1e-4, 0.1),
        "ftrl_proximal": bl.ftrl_proximal(1e6),
    }[name]
    params = {"a": jnp.zeros(2, jnp.float16), "b": jnp.zeros(2, jnp.float16)}
    grads = {"a": jnp.asarray([6e4, -1.0], jnp.float16), "b": jnp.asarray([1e-3, 0], jnp.float16)}
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    chex.assert_tree_all_finite((updates, state))
    chex.assert_trees_all_equal(updates["a"], jnp.zeros(2, jnp.float16))
    assert int(state.nonfinite_count) == 1


# --------------------------------------------------------------------------------------------
# jit, vmap, Optax composition, odd leaves, dtypes.


@pytest.mark.parametrize("name", sorted(ALL))
def test_jit_and_eager_agree(name):
    tx = ALL[name]()
    grad = make_stream(8)
    params = to_tree(W0, np.float32)
    state_eager = state_jit = tx.init(params)
    p_eager = p_jit = params
    update = jax.jit(tx.update)
    for t in range(1, 9):
        u, state_eager = tx.update(
            to_tree(grad(to_flat(p_eager), t), np.float32), state_eager, p_eager
        )
        p_eager = optax.apply_updates(p_eager, u)
        u, state_jit = update(to_tree(grad(to_flat(p_jit), t), np.float32), state_jit, p_jit)
        p_jit = optax.apply_updates(p_jit, u)
    chex.assert_trees_all_close((p_eager, state_eager), (p_jit, state_jit), rtol=1e-6, atol=1e-7)


# one vmapped hyperparameter per learner, given to optax.inject_hyperparams
VMAP_CASES = {
    "simple_truncation": (
        bl.simple_truncation, dict(learning_rate=0.1, period=2), "theta", [0.0, 0.05, 0.2]
    ),
    "truncated_gradient": (
        bl.truncated_gradient, dict(learning_rate=0.1, gravity=0.3, theta=0.4), "period", [1, 2, 3]
    ),
    "fobos_l1": (bl.fobos_l1, dict(learning_rate=0.1), "l1", [0.0, 0.1, 0.5]),
    "rda_l1": (bl.rda_l1, dict(l1=0.2), "gamma", [1.0, 2.0, 5.0]),
    "ftrl_proximal": (bl.ftrl_proximal, dict(alpha=0.5, beta=1.0, l2=0.1), "l1", [0.0, 0.5, 2.0]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(VMAP_CASES))
def test_vmap_over_hyperparameters_with_inject_hyperparams(name):
    factory, fixed, swept, values = VMAP_CASES[name]
    rng = np.random.default_rng(5)
    grads = {
        "a": jnp.asarray(rng.normal(size=(7, 4)), jnp.float32),
        "s": jnp.asarray(rng.normal(size=7), jnp.float32),
    }
    params = {"a": jnp.full(4, 0.1), "s": jnp.asarray(-0.2)}

    def final_params(value):
        tx = optax.inject_hyperparams(factory)(**fixed, **{swept: value})
        return scan_run(tx, params, grads)[0][0]

    batched = jax.jit(jax.vmap(final_params))(jnp.asarray(values))
    for i, value in enumerate(values):
        single = run_steps(factory(**fixed, **{swept: value}), params, grads)[0][0]
        chex.assert_trees_all_close(
            jax.tree.map(lambda x, i=i: x[i], batched), single, rtol=1e-6, atol=1e-7
        )


@pytest.mark.parametrize("name", sorted(ALL))
def test_vmap_over_independent_streams(name):
    tx = ALL[name]()
    rng = np.random.default_rng(6)
    grads = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)  # (stream, step, coordinate)
    grads = grads.at[1, 2, 0].set(jnp.nan)
    params = jnp.asarray(rng.normal(scale=0.1, size=(3, 4)), jnp.float32)

    batched = jax.jit(jax.vmap(lambda p, g: scan_run(tx, p, g)[0]))(params, grads)
    assert [int(c) for c in batched[1].nonfinite_count] == [0, 1, 0]
    for i in range(3):
        single = run_steps(tx, params[i], grads[i])[0]
        chex.assert_trees_all_close(
            jax.tree.map(lambda x, i=i: x[i], batched), single, rtol=1e-6, atol=1e-7
        )


@pytest.mark.parametrize("name", sorted(ALL))
def test_optax_composition(name):
    """chain, flatten, multi_transform and MultiSteps all agree with the plain transform."""
    tx = ALL[name]()
    rng = np.random.default_rng(7)
    grads = {
        "a": jnp.asarray(rng.normal(size=(6, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(6, 2)), jnp.float32),
    }
    params = {"a": jnp.asarray([0.2, -0.1, 0.0]), "b": jnp.asarray([0.05, 0.3])}
    final = lambda tx, grads=grads: scan_run(tx, params, grads)[0][0]
    expected = final(tx)

    # chain inside multi_transform: scale(0.5) then tx on doubled gradients for "a", SGD for "b".
    chained = optax.chain(optax.scale(0.5), tx)
    mixed = optax.multi_transform(
        {"sparse": chained, "sgd": optax.sgd(0.1)}, {"a": "sparse", "b": "sgd"}
    )
    mixed = final(mixed, {"a": 2 * grads["a"], "b": grads["b"]})
    chex.assert_trees_all_close(mixed["a"], expected["a"], rtol=1e-6)
    np.testing.assert_allclose(mixed["b"], params["b"] - 0.1 * grads["b"].sum(0), rtol=1e-6)
    chex.assert_trees_all_close(final(optax.flatten(tx)), expected, rtol=1e-6)

    # MultiSteps(every_k=2) on (g, g) pairs is tx on g.
    doubled = jax.tree.map(lambda g: jnp.repeat(g, 2, axis=0), grads)
    chex.assert_trees_all_close(final(optax.MultiSteps(tx, 2), doubled), expected, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(ALL))
def test_scalar_and_size_zero_leaves(name):
    tx = ALL[name]()
    rng = np.random.default_rng(8)
    params = {
        "s": jnp.asarray(0.3),
        "e": jnp.zeros((0,)),
        "e2": jnp.zeros((3, 0)),
        "v": jnp.asarray([0.3]),
    }
    g = rng.normal(size=5).astype(np.float32)
    grads = {
        "s": jnp.asarray(g),
        "e": jnp.zeros((5, 0)),
        "e2": jnp.zeros((5, 3, 0)),
        "v": jnp.asarray(g[:, None]),
    }
    (final, state), updates = scan_run(tx, params, grads)
    chex.assert_trees_all_equal_shapes_and_dtypes(final, params)
    chex.assert_tree_all_finite((final, state, updates))
    assert int(state.nonfinite_count) == 0
    np.testing.assert_allclose(final["s"], final["v"][0], rtol=1e-6)  # a scalar is a 1-vector


@pytest.mark.parametrize("name", sorted(ALL))
def test_bfloat16_params_keep_float32_state(name):
    tx = ALL[name]()
    rng = np.random.default_rng(9)
    grads = jnp.asarray(rng.normal(size=(10, 6)), jnp.float32)
    params = jnp.asarray(rng.normal(scale=0.2, size=6), jnp.float32)
    (p16, s16), u16 = scan_run(tx, params.astype(jnp.bfloat16), grads.astype(jnp.bfloat16))
    (p32, _), _ = scan_run(tx, params, grads.astype(jnp.bfloat16).astype(jnp.float32))
    assert p16.dtype == u16.dtype == jnp.bfloat16
    for leaf in jax.tree.leaves(s16):
        assert leaf.dtype in (jnp.int32, jnp.float32)
    np.testing.assert_allclose(np.asarray(p16, np.float32), p32, rtol=0.05, atol=0.02)


def test_state_survives_orbax_round_trip(tmp_path):
    import orbax.checkpoint as ocp

    tx = bl.ftrl_proximal(0.5, 1.0, 0.3, 0.1)
    grads = {"a": jnp.asarray(np.random.default_rng(10).normal(size=(4, 3)), jnp.float32)}
    (params, state), _ = run_steps(tx, {"a": jnp.zeros(3)}, grads)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "state", state)
    assert isinstance(restored, bl.FTRLProximalState)
    chex.assert_trees_all_equal(restored, state)
    g = {"a": jnp.ones(3)}
    chex.assert_trees_all_equal(tx.update(g, restored, params), tx.update(g, state, params))
