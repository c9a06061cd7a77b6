"""Tests of ``sketchopt.son`` (SON, RFD-SON, ONS and the bounded-prediction projection).

The float64 NumPy references follow the papers literally, with dense ``d x d`` matrices:

* SON paper (``shared/papers/004``) Alg. 1 with the FD sketch of Alg. 2 (one SVD per row), Oja's
  sketch of eq. 4 / Alg. 3 (Gram-Schmidt, ``Gamma_t = 1/t``), the Gaussian random projection of
  sec. 3 (the same ``r_t`` draws as the transform), the projection of Lemma 1 and the diagonal
  rescaling of sec. 5.2 (``D_1 = 0.1 I``);
* RFD paper (``shared/papers/002``) Alg. 3 (RFD-SON, one SVD per row) and Alg. 6 (fast RFD-SON, a
  ``2m``-row buffer shrunk when full), with the pseudo-inverse and the two candidate points
  ``w1``/``w2`` of appendix A while ``alpha = 0``;
* the full Online Newton Step ``A_t = alpha I + sum (sigma + eta_s) g_s g_s^T``.

Each online run is a ``lax.scan`` compiled once per transform (squared loss, labels +-1, the
projection with ``C = 1`` before every prediction, as in the RFD paper's experiments).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sketchopt as so
from sketchopt import sketches as sk


def x64():
    """Float64 inside a ``with`` block only (never the global config)."""
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    from jax.experimental import enable_x64  # older JAX

    return enable_x64()


def eta_fn(count):
    return 1.0 / jnp.sqrt(count + 1.0)


def eta_np(t):  # t = 1, 2, ...
    return 1.0 / np.sqrt(t)


BOUND = 1.0


def make_data(seed=0, dim=7, steps=30):
    """Ill-conditioned Gaussian examples (as SON sec. 5.1) and +-1 labels."""
    rng = np.random.default_rng(seed)
    spectrum = np.linspace(1.0, 6.0, dim)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    x = rng.standard_normal((steps, dim)) * np.sqrt(spectrum) @ basis.T
    y = np.sign(x @ rng.standard_normal(dim))
    return x, y


# ----------------------------------------------------------------------------------------------
# Float64 NumPy references.


class FDRef:
    """FD / RFD (RFD paper Alg. 2 and 3; SON Alg. 2) and fast FD/RFD (Alg. 5/6)."""

    def __init__(self, dim, m, alpha=0.0, robust=False, fast=False, alpha0=0.0):
        self.m, self.alpha, self.robust, self.fast = m, alpha, robust, fast
        self.rows = np.zeros((0, dim))
        self.ridge = alpha0
        self.shrinkage = []

    def absorb(self, g):
        rows = np.vstack([self.rows, g[None]])
        n_max = 2 * self.m if self.fast else self.m
        if rows.shape[0] < n_max:
            self.rows = rows
            return
        _, s, vt = np.linalg.svd(rows, full_matrices=False)
        s2 = np.zeros(rows.shape[0])
        s2[: len(s)] = s**2
        s2[s2 <= rows.shape[0] * 1e-14 * s2[0]] = 0  # round-off rank, as the sketch's eigh
        delta = s2[self.m - 1]
        keep = self.m - 1
        self.rows = np.sqrt(np.maximum(s2[:keep] - delta, 0))[:, None] * vt[:keep]
        self.shrinkage.append(delta)
        if self.robust:
            self.ridge += delta / 2

    def matrix(self):
        dim = self.rows.shape[1]
        return self.rows.T @ self.rows + (self.alpha + self.ridge) * np.eye(dim)

    def singular(self):
        return self.alpha + self.ridge == 0


class OjaRef:
    """Oja's sketch (SON eq. 4, Alg. 3) from given initial directions, ``Gamma_t = 1/t``."""

    def __init__(self, directions, alpha):
        self.v = np.array(directions, np.float64)
        self.lam = np.zeros(self.v.shape[0])
        self.t = 0
        self.alpha = alpha

    def absorb(self, g):
        self.t += 1
        gamma = 1.0 / self.t
        p = self.v @ g
        self.lam = (1 - gamma) * self.lam + gamma * p**2
        a = self.v + gamma * np.outer(p, g)
        q, r = np.linalg.qr(a.T)
        self.v = (q * np.where(np.diag(r) < 0, -1, 1)).T

    def matrix(self):
        dim = self.v.shape[1]
        return self.alpha * np.eye(dim) + self.v.T @ (self.t * self.lam[:, None] * self.v)

    def singular(self):
        return self.alpha == 0


class RPRef:
    """``S_t = S_{t-1} + r_t g_t^T`` with the transform's own ``r_t`` draws (SON sec. 3)."""

    def __init__(self, dim, m, alpha, key):
        self.s = np.zeros((m, dim))
        self.key, self.m, self.alpha = key, m, alpha

    def absorb(self, g):
        self.key, sub = jax.random.split(self.key)
        r = np.asarray(jax.random.normal(sub, (self.m,), jnp.float64)) / np.sqrt(self.m)
        self.s = self.s + np.outer(r, g)

    def matrix(self):
        return self.alpha * np.eye(self.s.shape[1]) + self.s.T @ self.s

    def singular(self):
        return False


class ONSRef:
    def __init__(self, dim, alpha):
        self.a = alpha * np.eye(dim)

    def absorb(self, g):
        self.a = self.a + np.outer(g, g)

    def matrix(self):
        return self.a

    def singular(self):
        return False


def tau_c(z, bound):
    return np.sign(z) * max(abs(z) - bound, 0.0)


def ref_project(a, singular, u, x, bound, log=None):
    """Lemma 1; with a singular ``A`` the RFD paper's appendix-A choice between w1 and w2."""
    tau = tau_c(u @ x, bound)
    if tau == 0:
        return u
    if not singular:
        z = np.linalg.solve(a, x)
        return u - tau / (x @ z) * z
    ap = np.linalg.pinv(a, rcond=1e-10, hermitian=True)
    z = ap @ x
    perp = x - a @ z  # the part of x in the null space of A
    candidates = {}
    if x @ z > 1e-300:
        candidates["w1"] = u - tau / (x @ z) * z
    if perp @ perp > 1e-20 * (x @ x):
        candidates["w2"] = u - tau / (perp @ perp) * perp
    best = min(candidates, key=lambda k: (candidates[k] - u) @ a @ (candidates[k] - u))
    if log is not None:
        log.append(best)
    return candidates[best]


def ref_solve(a, singular, g):
    if singular:
        return np.linalg.pinv(a, rcond=1e-10, hermitian=True) @ g
    return np.linalg.solve(a, g)


def reference_run(model, x, y, *, eta=eta_np, sigma=0.0, diagonal=False, bound=BOUND, log=None):
    """SON Alg. 1 (projection, prediction, gradient of the squared loss, sketch, Newton step)."""
    steps, dim = x.shape
    w = np.zeros(dim)
    d_diag = np.full(dim, 0.1)
    preds, weights = [], []
    for t in range(1, steps + 1):
        xt = x[t - 1]
        a, sing = model.matrix(), model.singular()
        if diagonal:
            root = np.sqrt(d_diag)
            w = ref_project(a, sing, root * w, xt / root, bound, log) / root
        else:
            w = ref_project(a, sing, w, xt, bound, log)
        pred = w @ xt
        preds.append(pred)
        g = 2 * (pred - y[t - 1]) * xt
        gz = g / np.sqrt(d_diag) if diagonal else g
        model.absorb(np.sqrt(sigma + eta(t)) * gz)
        sol = ref_solve(model.matrix(), model.singular(), gz)
        w = w - (sol / np.sqrt(d_diag) if diagonal else sol)
        weights.append(w.copy())
        if diagonal:
            d_diag = d_diag + g**2
    return np.array(preds), np.array(weights)


# ----------------------------------------------------------------------------------------------
# The transform side: a whole projected online run as one compiled scan, compiled once per kind
# (hyperparameters are traced arguments) and shared between tests.

DIM, STEPS = 7, 40
KEY = jax.random.PRNGKey(3)


def build(kind, h):
    """The transform of ``kind`` with (possibly traced) hyperparameters ``h``."""
    eta = lambda c: h["eta0"] * jax.lax.rsqrt(c + 1.0)  # noqa: E731
    if kind == "fd":  # curvature as a schedule, eta as a schedule
        return so.fd_son(h["alpha"], 4, eta=eta, curvature=lambda c: h["sigma"])
    if kind == "fd_fast":  # the default eta = 1/sqrt(t)
        return so.fd_son(h["alpha"], 3, fast=True)
    if kind == "rfd":
        return so.rfd_son(4, alpha0=h["alpha"], eta=eta)
    if kind == "rfd_fast":  # the default eta = 1/t
        return so.rfd_son(3, alpha0=h["alpha"], fast=True)
    if kind == "rfd_diag":
        return so.rfd_son(4, alpha0=h["alpha"], eta=eta, diagonal_rescaling=True)
    if kind == "oja":
        return so.oja_son(h["alpha"], 3, key=KEY)
    if kind == "rp":
        return so.rp_son(h["alpha"], DIM, KEY)
    if kind == "ons":
        return so.ons(h["alpha"], eta=eta)
    if kind == "fd_big":  # sketch_size > d: no shrink
        return so.fd_son(h["alpha"], DIM + 1, eta=eta)
    if kind == "rfd_big":
        return so.rfd_son(DIM + 1, alpha0=h["alpha"], eta=eta)
    raise KeyError(kind)


def hyper(alpha, eta0=1.0, sigma=0.0):
    return {"alpha": alpha, "eta0": eta0, "sigma": sigma}


@functools.cache
def runner(kind):
    """``run(h, state, x, y, warm_g, warm) -> (preds, weights, alphas, state)``.

    Rounds flagged ``warm`` feed the gradient ``warm_g`` to ``update`` and discard the update
    (no projection, no prediction): a curvature warm-up and a way to feed fixed gradients.
    ``alphas`` is the ridge of the sketch after each round (RFD kinds; 0 otherwise).
    """

    @jax.jit
    def run(h, state, x, y, warm_g, warm):
        tx = build(kind, h)

        def body(carry, inp):
            w, state = carry
            xt, yt, gt, is_warm = inp
            wp = so.project_bounded_prediction(state, w, xt, BOUND)
            pred = wp @ xt
            g = jnp.where(is_warm, gt, 2 * (pred - yt) * xt)
            updates, state = tx.update(g, state)
            w = jnp.where(is_warm, w, wp + updates)
            if kind.startswith("rfd"):
                alpha = sk.low_rank(so.per_leaf_states(state.leaf_state, w).sketch).true_alpha()
            else:
                alpha = jnp.zeros((), w.dtype)
            return (w, state), (pred, w, alpha)

        w0 = jnp.zeros(x.shape[1], x.dtype)
        (_, state), (preds, weights, alphas) = jax.lax.scan(body, (w0, state), (x, y, warm_g, warm))
        return preds, weights, alphas, state

    return run


def online_run(kind, h, x, y, warm_g=None, warm=None):
    """Run ``kind`` (float64) on the stream; ``warm`` flags warm-up rounds (see ``runner``)."""
    x = jnp.asarray(x, jnp.float64)
    y = jnp.asarray(y, jnp.float64)
    warm_g = jnp.zeros_like(x) if warm_g is None else jnp.asarray(warm_g, jnp.float64)
    warm = jnp.zeros(x.shape[0], bool) if warm is None else jnp.asarray(warm)
    h = {k: jnp.asarray(v, jnp.float64) for k, v in h.items()}
    state = build(kind, h).init(jnp.zeros(x.shape[1], jnp.float64))
    return runner(kind)(h, state, x, y, warm_g, warm)


def stream(seed=0):
    """The test stream: ill-conditioned examples where x_3 and x_5 are multiples of earlier ones,
    so that RFD0-SON's pseudo-inverse phase meets both of the appendix's candidates."""
    x, y = make_data(seed=seed, dim=DIM, steps=STEPS)
    x[1] = 3 * x[0] + x[1]  # |u_2^T x_2| > C with x_2 outside range(A_1): candidate w2
    x[2] = -4 * x[0]  # inside range(A_2) with |u_3^T x_3| > C: candidate w1
    x[4] = 3 * x[3]
    return x, y


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def reference_model(kind, h):
    m = {"fd": 4, "fd_fast": 3, "rfd": 4, "rfd_fast": 3, "rfd_diag": 4}.get(kind)
    if kind in ("fd", "fd_fast"):
        return FDRef(DIM, m, alpha=h["alpha"], fast=kind == "fd_fast")
    if kind.startswith("rfd"):
        return FDRef(DIM, m, robust=True, fast=kind == "rfd_fast", alpha0=h["alpha"])
    if kind == "oja":
        w0 = jnp.zeros(DIM, jnp.float64)
        init = so.per_leaf_states(build("oja", h).init(w0).leaf_state, w0).sketch.directions
        return OjaRef(np.asarray(init), h["alpha"])
    if kind == "rp":
        return RPRef(DIM, DIM, h["alpha"], KEY)
    if kind == "ons":
        return ONSRef(DIM, h["alpha"])
    raise KeyError(kind)


REFERENCE_CASES = [
    ("fd", hyper(0.5)),
    ("fd", hyper(0.0)),  # alpha = 0: the pseudo-inverse throughout (SON Appendix D)
    ("fd", hyper(0.5, eta0=0.0, sigma=0.3)),  # exp-concave setting: eta = 0, sigma > 0
    ("fd_fast", hyper(0.5)),
    ("rfd", hyper(0.0)),  # RFD0-SON
    ("rfd", hyper(0.3)),
    ("rfd_fast", hyper(0.0)),  # Alg. 6 with alpha0 = 0
    ("rfd_fast", hyper(0.3)),
    ("rfd_diag", hyper(0.0)),
    ("rfd_diag", hyper(0.3)),
    ("oja", hyper(0.5)),
    ("rp", hyper(0.5)),
    ("ons", hyper(0.5)),
]


@pytest.mark.parametrize(("kind", "h"), REFERENCE_CASES, ids=lambda v: str(v))
def test_matches_reference_float64(kind, h):
    x, y = stream()
    with x64():
        preds, weights, _, state = online_run(kind, h, x, y)
        model = reference_model(kind, h)
    if kind in ("fd_fast", "oja", "rp"):  # the defaults
        eta = eta_np
    elif kind == "rfd_fast":
        eta = lambda t: 1.0 / t  # noqa: E731
    else:
        eta = lambda t: h["eta0"] * eta_np(t)  # noqa: E731
    log = []
    with x64():  # RPRef draws the transform's r_t in float64
        ref_preds, ref_weights = reference_run(
            model, x, y, eta=eta, sigma=h["sigma"], diagonal=kind.endswith("diag"), log=log
        )
    assert int(state.nonfinite_count) == 0
    # The projection was active (|u^T x| > C) on a good share of the rounds.
    assert np.mean(np.abs(ref_preds) >= BOUND - 1e-9) > 0.15
    assert rel(preds, ref_preds) < 1e-8, rel(preds, ref_preds)
    assert rel(weights, ref_weights) < 1e-8, rel(weights, ref_weights)
    if kind in ("rfd", "rfd_fast") and h["alpha"] == 0:
        # RFD0-SON met both candidate points of the appendix while alpha_t = 0.
        assert "w1" in log and "w2" in log, log


def test_fd_son_equals_ons_without_shrink():
    """With sketch_size > d, FD never shrinks and FD-SON is the Online Newton Step (so is RFD-SON
    with alpha0 = alpha: its alpha never moves)."""
    x, y = stream(seed=2)
    with x64():
        p_ons, w_ons, _, _ = online_run("ons", hyper(1.0), x, y)
        p_fd, w_fd, _, _ = online_run("fd_big", hyper(1.0), x, y)
        p_rfd, w_rfd, alphas, _ = online_run("rfd_big", hyper(1.0), x, y)
    assert rel(p_fd, p_ons) < 1e-9 and rel(w_fd, w_ons) < 1e-9
    assert rel(p_rfd, p_ons) < 1e-9 and rel(w_rfd, w_ons) < 1e-9
    np.testing.assert_array_equal(alphas, 1.0)


@pytest.mark.parametrize(
    ("transform", "metric"),
    [
        (
            lambda: so.fd_son(0.5, 3, fast=True),
            lambda: so.son.newton_metric(sk.frequent_directions(3, fast=True), 0.5),
        ),
        (
            lambda: so.fd_son(0.0, 3, diagonal_rescaling=True),
            lambda: so.son.newton_metric(sk.frequent_directions(3), diagonal_rescaling=True),
        ),
        (
            lambda: so.oja_son(0.5, 2),  # one leaf: its key is oja_son's key itself
            lambda: so.son.newton_metric(sk.oja(2, key=jax.random.PRNGKey(0)), 0.5),
        ),
    ],
    ids=["fd_fast", "fd_alpha0_rescaled", "oja"],
)
def test_son_is_mirror_descent_in_the_newton_metric(transform, metric):
    """FD/Oja-SON are the mirror-descent rule with step 1 in SON's metric (newton_metric): the
    same updates step by step, a skipped non-finite gradient included."""
    rng = np.random.default_rng(3)
    tx, md = transform(), so.mirror_descent(1.0, metric())
    with x64():
        s1, s2 = tx.init(jnp.zeros(6)), md.init(jnp.zeros(6))
        for t in range(12):
            g = jnp.asarray(rng.normal(size=6) * 10.0 ** rng.integers(-2, 3))
            if t == 4:
                g = g.at[1].set(jnp.nan)
            u1, s1 = tx.update(g, s1)
            u2, s2 = md.update(g, s2)
            np.testing.assert_allclose(u2, u1, rtol=1e-12, atol=0)
        assert int(s1.nonfinite_count) == int(s2.nonfinite_count) == 1


@pytest.mark.parametrize(
    ("kind", "alpha", "tol"),
    [("fd_big", 0.0, 1e-10), ("rfd_big", 0.0, 1e-10), ("fd_big", 1e-6, 1e-4), ("ons", 1e-7, 1e-6)],
)
def test_invariance_to_linear_transformations(kind, alpha, tol):
    """SON sec. 2: with alpha -> 0 and a sketch larger than d, the projected run on x_t and on
    M x_t (M invertible) gives the same predictions: exactly with alpha = 0 (the pseudo-inverse,
    SON Appendix D; RFD0-SON), up to the alpha I term and round-off for a tiny alpha > 0.

    Exact invariance needs A_t of full rank: while the gradients seen span fewer than d
    dimensions, ``(M G M^T)^+ M g`` and ``M^{-T} G^+ g`` differ by a null-space vector that shows
    in later predictions (true of ONS itself, checked below). So the curvature is first warmed up
    with d + 2 gradients (``g`` in one run, ``M g`` in the other; updates discarded).

    A tiny alpha > 0 cannot go below ~1e-7 in float64: ``A^{-1} = (I - P)/alpha + ...`` needs
    the projector ``P`` on the sketch to ``alpha / lambda`` accuracy (and RP-SON's Woodbury form
    ``(1/alpha)(g - S^T H S g)`` is worse still, so RP-SON is left out here).
    """
    x, y = stream(seed=4)
    rng = np.random.default_rng(5)
    mat = rng.standard_normal((DIM, DIM)) + 3 * np.eye(DIM)
    warm = np.zeros(STEPS, bool)
    warm[: DIM + 2] = True
    warm_g = np.zeros((STEPS, DIM))
    warm_g[: DIM + 2] = rng.standard_normal((DIM + 2, DIM))
    runs, cold = [], []
    with x64():
        for m in (np.eye(DIM), mat):
            runs.append(online_run(kind, hyper(alpha), x @ m.T, y, warm_g @ m.T, warm)[0])
            cold.append(online_run(kind, hyper(alpha), x @ m.T, y)[0])
    live = ~warm
    assert rel(runs[1][live], runs[0][live]) < tol, rel(runs[1][live], runs[0][live])
    # Without the warm-up the runs do differ (the rank-deficient phase is not invariant).
    assert rel(cold[1], cold[0]) > 1e-3


@pytest.mark.parametrize("kind", ["rfd", "rfd_fast"])
@pytest.mark.parametrize("alpha0", [0.0, 0.2])
def test_rfd_alpha_is_half_the_cumulative_shrinkage(kind, alpha0):
    """alpha_t = alpha0 + 1/2 (sum of the shrinkage so far), non-decreasing (RFD paper Alg. 3)."""
    rng = np.random.default_rng(6)
    grads = rng.standard_normal((STEPS, DIM)) * np.linspace(0.2, 3.0, DIM)
    x, y = stream()
    with x64():
        _, _, alphas, _ = online_run(kind, hyper(alpha0), x, y, grads, np.ones(STEPS, bool))
    m = 4 if kind == "rfd" else 3
    model = FDRef(DIM, m, robust=True, fast=kind == "rfd_fast", alpha0=alpha0)
    expected = []
    for t, g in enumerate(grads, 1):
        model.absorb(np.sqrt(eta_np(t) if kind == "rfd" else 1.0 / t) * g)
        expected.append(alpha0 + 0.5 * sum(model.shrinkage))
    alphas = np.asarray(alphas)
    assert np.all(np.diff(alphas) >= 0) and alphas[-1] > alpha0 + 0.1
    np.testing.assert_allclose(alphas, expected, rtol=1e-10, atol=1e-14)


def test_rp_inverse_tracking_float64():
    """RP-SON's H (two rank-one Woodbury updates per step, refreshed every m steps) stays
    ``4**e (alpha I + S S^T)^{-1}``; checked after a run ending 5 updates past a refresh."""
    x, y = stream()
    with x64():
        *_, state = online_run("rp", hyper(0.5), x, y)
    leaf = state.leaf_state.leaf(0)  # the one parameter leaf
    e = int(leaf.sketch.scale_exp)
    m = DIM
    assert int(leaf.sketch.count) % m == 5
    direct = np.linalg.inv(0.5 * 4.0**-e * np.eye(m) + np.asarray(leaf.sketch.gram))
    assert rel(leaf.inverse, direct) < 1e-8


def test_rp_sketch_is_unbiased_over_keys():
    """E[S^T S] = sum ghat ghat^T over keys (vmap over the key; within 6 standard errors for
    every entry with 4096 keys: a false alarm has probability < 1e-8 per entry), and the
    maintained H matches a direct inverse in float32."""
    dim, m, steps = 4, 3, 6
    rng = np.random.default_rng(7)
    grads = jnp.asarray(rng.standard_normal((steps, dim)), jnp.float32)

    def final_state(key):
        tx = so.rp_son(1.0, m, key, eta=1.0)
        state = tx.init(jnp.zeros(dim))
        state = jax.lax.scan(lambda s, g: (tx.update(g, s)[1], None), state, grads)[0]
        return state.leaf_state.leaf(0)

    keys = jax.random.split(jax.random.PRNGKey(8), 4096)
    leaf = jax.jit(jax.vmap(final_state))(keys)
    s = np.asarray(leaf.sketch.rows, np.float64)
    covs = np.swapaxes(s, -1, -2) @ s
    exact = np.asarray(grads, np.float64).T @ np.asarray(grads, np.float64)
    se = covs.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(covs.mean(0) - exact) <= 6 * se + 1e-5 * np.abs(exact).max())
    e = np.asarray(leaf.sketch.scale_exp)[:, None, None]
    direct = np.linalg.inv(np.ldexp(1.0, -2 * e) * np.eye(m) + np.asarray(leaf.sketch.gram))
    err = np.abs(np.asarray(leaf.inverse) - direct) / np.abs(direct).max((1, 2), keepdims=True)
    assert err.max() < 1e-4


@pytest.mark.slow  # vmapped and separate float64 runs, each compiled
def test_vmap_over_hyperparameters_and_keys():
    """A grid of alphas / alpha0s (traced, so validation is skipped) and a batch of keys, each in
    one vmapped run, equal the separate runs."""
    x, y = stream()
    with x64():
        h = hyper(jnp.asarray([0.0, 0.5, 2.0]), jnp.ones(3), jnp.zeros(3))
        h = {k: jnp.asarray(v, jnp.float64) for k, v in h.items()}
        x64_ = jnp.asarray(x, jnp.float64)
        y64 = jnp.asarray(y, jnp.float64)
        zeros = (jnp.zeros_like(x64_), jnp.zeros(STEPS, bool))

        def run(kind, hh):
            state = build(kind, hh).init(jnp.zeros(DIM, jnp.float64))
            return runner(kind)(hh, state, x64_, y64, *zeros)[0]

        batched = jax.vmap(lambda hh: run("rfd", hh))(h)
        for i, a in enumerate([0.0, 0.5, 2.0]):
            single = online_run("rfd", hyper(a), x, y)[0]
            assert rel(batched[i], single) < 1e-10

    def run_rp(key):
        tx = so.rp_son(1.0, 3, key)
        w0 = jnp.zeros(DIM)
        state = tx.init(w0)

        def body(carry, xy):
            w, state = carry
            w = so.project_bounded_prediction(state, w, xy[0], BOUND)
            pred = w @ xy[0]
            updates, state = tx.update(2 * (pred - xy[1]) * xy[0], state)
            return (w + updates, state), pred

        return jax.lax.scan(body, (w0, state), (jnp.asarray(x, jnp.float32), y))[1]

    keys = jax.random.split(jax.random.PRNGKey(17), 3)
    batched = jax.jit(jax.vmap(run_rp))(keys)
    assert batched.shape == (3, STEPS) and np.all(np.isfinite(batched))
    assert not np.allclose(batched[0], batched[1])  # the keys give different sketches


# ----------------------------------------------------------------------------------------------
# Optax integration, pytrees and bad input (float32; one compiled update and projection per
# transform, shared by the tests below).

FACTORIES = {
    "fd_diag": lambda: so.fd_son(1.0, 3, diagonal_rescaling=True),
    "rfd0_fast": lambda: so.rfd_son(3, fast=True, alpha0=0.0),
    "oja": lambda: so.oja_son(1.0, 3),
    "rp": lambda: so.rp_son(1.0, 3, jax.random.key(3)),  # a new-style typed key
    "ons": lambda: so.ons(1.0),
}
NAMES = list(FACTORIES)


@functools.cache
def compiled(name):
    tx = FACTORIES[name]()
    return tx, jax.jit(tx.update), jax.jit(so.project_bounded_prediction)


def tree_params(dtype=jnp.float32):
    return {"w": jnp.zeros((2, 3), dtype), "b": jnp.zeros((), dtype)}


def tree_like(rng, scale=1.0, dtype=jnp.float32):
    return {
        "w": jnp.asarray(rng.standard_normal((2, 3)) * scale, dtype),
        "b": jnp.asarray(rng.standard_normal() * scale, dtype),
    }


def flat(tree):
    return np.concatenate([np.ravel(np.asarray(tree[k], np.float64)) for k in ("b", "w")])


def dense_metric(name, leaf, dim):
    """The dense ``A`` (parameter space, diagonal rescaling included) of one leaf, in float64
    NumPy from the raw state arrays."""
    sketch = leaf.sketch if name != "ons" else None
    if name == "ons":
        a = np.linalg.inv(np.asarray(leaf.inverse, np.float64))
    elif name == "oja":
        v = np.asarray(sketch.directions, np.float64)
        lam = int(sketch.count) * np.asarray(sketch.eigenvalues, np.float64)
        a = v.T @ (lam[:, None] * v) * 4.0 ** int(sketch.scale_exp)
        a += float(leaf.alpha) * np.eye(dim)
    else:  # FD family (the buffer holds the sketch rows B) and RP (S): rows^T rows + ridge
        s = np.asarray(sketch.rows, np.float64)
        ridge = float(leaf.alpha)
        if name != "rp":
            ridge += float(sketch.alpha) * 4.0 ** int(sketch.scale_exp)
        a = s.T @ s + ridge * np.eye(dim)
    if leaf.diag_sqrt is not None:
        root = np.asarray(leaf.diag_sqrt, np.float64)
        a = root[:, None] * a * root[None, :]
    return a


@pytest.mark.parametrize("name", NAMES)
def test_pytrees_projection_and_nonfinite_skipping(name):
    """A matrix and a scalar leaf (one sketch each); the projection couples the leaves
    through the single constraint and equals the dense block-diagonal Lemma 1 (appendix-A rule
    while RFD0's A is singular); a NaN/Inf leaf is skipped and counted, leaving its state
    bit-identical while the other leaves proceed."""
    tx, update, project = compiled(name)
    rng = np.random.default_rng(11)
    params = tree_params()
    state = tx.init(params)
    for step in range(3):
        updates, state = update(tree_like(rng), state)
        assert updates["b"].shape == () and updates["w"].shape == (2, 3)
        assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
        u = tree_like(rng, 3.0)
        feats = tree_like(rng)
        w = project(state, u, feats, BOUND)
        assert w["w"].shape == (2, 3) and w["w"].dtype == jnp.float32
        blocks = {
            k: dense_metric(name, so.per_leaf_states(state.leaf_state, updates)[k], n)
            for k, n in (("b", 1), ("w", 6))
        }
        a = np.zeros((7, 7))
        a[:1, :1], a[1:, 1:] = blocks["b"], blocks["w"]
        # RFD0: A of the "w" leaf is singular while its alpha is 0 (rank <= 3 < 6).
        singular = (
            name == "rfd0_fast"
            and float(so.per_leaf_states(state.leaf_state, updates)["w"].sketch.alpha) == 0
        )
        expected = ref_project(a, singular, flat(u), flat(feats), BOUND)
        assert rel(flat(w), expected) < 1e-4, (step, flat(w), expected)
        assert abs(flat(w) @ flat(feats)) <= BOUND * (1 + 1e-5)
    assert int(state.count) == 3 and int(state.nonfinite_count) == 0

    bad = tree_like(rng)
    bad["w"] = bad["w"].at[0, 1].set(jnp.nan)
    updates, new = update(bad, state)
    np.testing.assert_array_equal(updates["w"], 0)
    assert np.isfinite(float(updates["b"])) and float(updates["b"]) != 0
    old_w = jax.tree.leaves(so.per_leaf_states(state.leaf_state, updates)["w"])
    for a_, b_ in zip(
        old_w, jax.tree.leaves(so.per_leaf_states(new.leaf_state, updates)["w"]), strict=True
    ):
        if jnp.issubdtype(a_.dtype, jax.dtypes.prng_key):
            a_, b_ = jax.random.key_data(a_), jax.random.key_data(b_)
        np.testing.assert_array_equal(a_, b_)
    assert int(new.nonfinite_count) == 1 and int(new.count) == 4
    bad["b"] = jnp.asarray(jnp.inf)
    updates, new = update(bad, new)
    assert int(new.nonfinite_count) == 3
    assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))


def first_step_reference(name, leaf, g):
    """``-A_1^{-1} g`` of the first step in float64 (alpha = 1, c = eta_1 = 1); ``leaf`` is the
    leaf's state before the step."""
    g = np.asarray(g, np.float64)
    if name == "fd_diag":
        gz = g / np.sqrt(0.1)
        return -(gz / (1.0 + gz @ gz)) / np.sqrt(0.1)
    if name == "rfd0_fast":
        return -g / (g @ g)
    if name == "ons":
        return -g / (1.0 + g @ g)
    if name == "rp":
        # the r_t the sketch draws for this step, as the sketch hands it back
        sketch = so.sketches.random_projection(3, leaf.sketch.key)
        drawn = sketch.absorb_solve(leaf.sketch, jnp.zeros(g.shape, jnp.float32)).drawn
        r = np.asarray(drawn, np.float64)
        return -g / (1.0 + (r @ r) * (g @ g))
    raise KeyError(name)


@pytest.mark.parametrize("name", NAMES)
def test_extreme_gradients_float32(name):
    """Gradients of scale 1e30, 1e-30 and 0 in float32: finite updates, states and projections;
    the first Newton step (about -v/(s |v|^2) resp. -s v) is accurate, not flushed to 0."""
    tx, update, project = compiled(name)
    for scale in (1e30, 1e-30, 0.0):
        rng = np.random.default_rng(14)
        state = tx.init(tree_params())
        for i in range(5):
            g = tree_like(rng, scale)
            before = so.per_leaf_states(state.leaf_state, g)["w"]
            updates, state = update(g, state)
            assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates)), (scale, i)
            if i == 0 and name != "oja" and scale:
                got = np.asarray(updates["w"], np.float64).ravel()
                want = first_step_reference(name, before, np.ravel(g["w"]))
                assert rel(got, want) < 1e-4, (scale, got, want)
            if scale == 0:
                assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))
            feats = tree_like(rng, scale if scale else 1.0)
            w = project(state, tree_like(rng), feats, BOUND)
            assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(w)), (scale, i)
        floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
        assert all(np.all(np.isfinite(x)) for x in floats)
        assert int(state.nonfinite_count) == 0


@pytest.mark.slow  # an integration test: five optax wrappers, each compiled
def test_chain_flatten_multisteps_inject_and_eager():
    """The SON state works (and is found by the projection) inside optax.chain, optax.flatten,
    optax.MultiSteps and inject_hyperparams (eager: these share the primitives compiled once)."""
    rng = np.random.default_rng(12)
    params = tree_params()
    grads = [tree_like(rng) for _ in range(2)]
    u = tree_like(rng, 5.0)
    feats = tree_like(rng)
    base = so.fd_son(1.0, 3)
    state = base.init(params)
    for g in grads:
        _, state = base.update(g, state)
    expected = so.project_bounded_prediction(state, u, feats, BOUND)
    wrapped = [
        optax.chain(optax.clip(100.0), so.fd_son(1.0, 3)),
        so.inject_hyperparams(so.fd_son)(alpha=1.0, sketch_size=3),
        optax.MultiSteps(so.fd_son(1.0, 3), every_k_schedule=1),
    ]
    for tx in wrapped:
        wstate = tx.init(params)
        for g in grads:
            _, wstate = tx.update(g, wstate, params)
        got = so.project_bounded_prediction(wstate, u, feats, BOUND)
        assert rel(flat(got), flat(expected)) < 1e-6

    # optax.flatten: one sketch over the concatenated parameters, equal to fd_son on the flat
    # vector; the projection flattens params and features the same way.
    ftx = optax.flatten(so.fd_son(1.0, 3))
    fstate = ftx.init(params)
    vec = so.fd_son(1.0, 3)
    vstate = vec.init(jnp.zeros(7))
    for g in grads:
        fu, fstate = ftx.update(g, fstate)
        vu, vstate = vec.update(jnp.asarray(flat(g), jnp.float32), vstate)
        assert rel(flat(fu), vu) < 1e-6
    got = so.project_bounded_prediction(fstate, u, feats, BOUND)
    want = so.project_bounded_prediction(
        vstate, jnp.asarray(flat(u), jnp.float32), jnp.asarray(flat(feats), jnp.float32), BOUND
    )
    assert rel(flat(got), want) < 1e-6

    with pytest.raises(ValueError, match="no SON state"):
        so.project_bounded_prediction(optax.adam(1.0).init(params), u, feats, BOUND)
    two = optax.chain(so.fd_son(1.0, 3), so.ons(1.0))
    with pytest.raises(ValueError, match="2 SON states"):
        so.project_bounded_prediction(two.init(params), u, feats, BOUND)
    with pytest.raises(ValueError, match="bound"):
        so.project_bounded_prediction(state, u, feats, -1.0)
    with pytest.raises(ValueError, match="params"):
        so.project_bounded_prediction(state, None, feats, BOUND)
    with pytest.raises(ValueError, match="sizes"):
        so.project_bounded_prediction(state, {"a": jnp.zeros(3)}, {"a": jnp.zeros(3)}, BOUND)


def test_inject_hyperparams_alpha_change_is_used():
    """An injected alpha is used from the next step on (RP-SON then refreshes its H; FD- and
    Oja-SON read alpha at every step anyway)."""
    rng = np.random.default_rng(13)
    grads = jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)

    @jax.jit
    def run(grads):
        tx = so.inject_hyperparams(so.rp_son)(1.0, 3, KEY, eta=1.0)
        plain = so.rp_son(1.0, 3, KEY, eta=1.0)
        state, pstate = tx.init(jnp.zeros(5)), plain.init(jnp.zeros(5))
        for g in grads[:3]:
            _, state = tx.update(g, state)
            _, pstate = plain.update(g, pstate)
        state.hyperparams["alpha"] = jnp.asarray(0.25)
        got, new = tx.update(grads[3], state)
        want, _ = so.rp_son(0.25, 3, KEY, eta=1.0).update(grads[3], pstate)
        old, _ = plain.update(grads[3], pstate)
        return got, want, old, new.inner_state.leaf_state.leaf(0)

    got, want, old, leaf = run(grads)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert not np.allclose(got, old, rtol=1e-3)
    e = int(leaf.sketch.scale_exp)
    direct = np.linalg.inv(0.25 * 4.0**-e * np.eye(3) + np.asarray(leaf.sketch.gram, np.float64))
    assert rel(leaf.inverse, direct) < 1e-4


def test_bf16_params_keep_float32_state():
    tx = so.fd_son(1.0, 3)
    params = jnp.zeros(5, jnp.bfloat16)
    state = tx.init(params)
    assert so.per_leaf_states(state.leaf_state, params).sketch.rows.dtype == jnp.float32
    updates, state = tx.update(jnp.ones(5, jnp.bfloat16), state)
    assert updates.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(updates, np.float32)))
    w = so.project_bounded_prediction(state, params + 3, jnp.ones(5, jnp.bfloat16), 1.0)
    assert w.dtype == jnp.bfloat16
    assert abs(float(jnp.sum(w.astype(jnp.float32)))) == pytest.approx(1.0, rel=1e-2)


def test_diagonal_rescaling_state_and_off_sketch_step():
    """D_1 = 0.1 I, D_{t+1} = D_t + g_t^2; outside the sketch the step is -(1/alpha) D_t^{-1} g_t
    (sketch_size 1 keeps no direction)."""
    tx = so.fd_son(2.0, 1, eta=1.0, diagonal_rescaling=True)
    state = tx.init(jnp.zeros(3))
    g1 = jnp.asarray([1.0, 2.0, 0.0])
    u, state = tx.update(g1, state)
    np.testing.assert_allclose(u, -g1 / (2.0 * 0.1), rtol=1e-6)
    diag_sqrt = so.per_leaf_states(state.leaf_state, g1).diag_sqrt
    np.testing.assert_allclose(diag_sqrt**2, 0.1 + g1**2, rtol=1e-6)
    g2 = jnp.asarray([1.0, 0.0, 3.0])
    u, state = tx.update(g2, state)
    np.testing.assert_allclose(u, -g2 / (2.0 * (0.1 + g1**2)), rtol=1e-6)


def test_size_zero_and_scalar_leaves():
    tx = so.fd_son(1.0, 3)
    params = {"e": jnp.zeros((0,)), "s": jnp.zeros(())}
    state = tx.init(params)
    for g in (1.5, -2.0):
        updates, state = tx.update({"e": jnp.zeros((0,)), "s": jnp.asarray(g)}, state)
        assert updates["e"].shape == (0,) and updates["s"].shape == ()
        assert np.isfinite(float(updates["s"])) and float(updates["s"]) != 0
    w = so.project_bounded_prediction(
        state, {"e": jnp.zeros((0,)), "s": jnp.asarray(5.0)}, {"e": jnp.zeros((0,)), "s": 2.0}, 1.0
    )
    assert float(w["s"]) == pytest.approx(0.5) and w["e"].shape == (0,)


def test_orbax_round_trip(tmp_path):
    """SON states (no zero-size placeholders; RP's typed key) survive an orbax save/restore."""
    import orbax.checkpoint as ocp

    params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(())}
    for i, tx in enumerate((so.fd_son(1.0, 3), so.rp_son(1.0, 3, jax.random.key(0)))):
        state = tx.init(params)
        _, state = tx.update(jax.tree.map(jnp.ones_like, params), state)
        path = tmp_path / f"ckpt{i}"
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(path, state)
            ckptr.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        with ocp.StandardCheckpointer() as ckptr:
            restored = ckptr.restore(path, abstract)
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
            if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            np.testing.assert_array_equal(a, b)


def test_validation():
    key = jax.random.PRNGKey(0)
    bad = [
        (lambda: so.fd_son(-1.0, 3), "alpha"),
        (lambda: so.fd_son(float("nan"), 3), "alpha"),
        (lambda: so.fd_son(1.0, 0), "sketch_size"),
        (lambda: so.fd_son(1.0, 2.5), "sketch_size"),
        (lambda: so.fd_son(1.0, 3, eta=-1.0), "eta"),
        (lambda: so.fd_son(1.0, 3, curvature=float("inf")), "curvature"),
        (lambda: so.fd_son(1.0, 3, fast=1), "fast"),
        (lambda: so.fd_son(1.0, 3, diagonal_rescaling="yes"), "diagonal_rescaling"),
        (lambda: so.rfd_son(3, alpha0=-0.1), "alpha0"),
        (lambda: so.rfd_son(-3, alpha0=0.0), "sketch_size"),
        (lambda: so.oja_son(1.0, 3, oja_learning_rate=2.0), "learning_rate"),
        (lambda: so.rp_son(0.0, 3, key), "alpha"),
        (lambda: so.rp_son(1.0, 3, None), "key"),
        (lambda: so.ons(0.0), "alpha"),
        (lambda: so.ons(1.0, curvature=-1.0), "curvature"),
    ]
    for make, name in bad:
        with pytest.raises(ValueError, match=name):
            make()
    tx = so.fd_son(1.0, 3)
    with pytest.raises(TypeError, match="floating"):
        tx.update(jnp.zeros(3, jnp.int32), tx.init(jnp.zeros(3)))


def _conds(tx, params, grads) -> int:
    from jaxpr_support import count

    return count(jax.make_jaxpr(tx.update)(grads, tx.init(params), params).jaxpr, "cond")


#: SON transforms by name, with their other arguments: ``name -> (**kwargs) -> transform``.
WEIGHTED = {
    "fd_son": lambda **kw: so.fd_son(sketch_size=3, **kw),
    "rfd_son": lambda **kw: so.rfd_son(sketch_size=3, **kw),
    "rp_son": lambda **kw: so.rp_son(1.0, 3, jax.random.PRNGKey(0), **kw),
}


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_a_weight_known_positive_takes_v_g_from_the_sketch_without_a_cond(name):
    """Where ``c_t = eta_t + sigma_t`` is positive at every step (the default schedules, a
    positive ``eta`` or ``sigma``), ``V g`` comes from the sketch's ``B ghat`` with no
    ``cond`` (a TPU's compiler charges that ``cond`` a pass over the sketch at every step); a
    user's schedule keeps it, for ``c = 0``. The updates agree in float64 over 5 steps."""
    make = WEIGHTED[name]
    params = jnp.zeros(6)
    g = jnp.arange(1.0, 7.0)
    user = lambda t: 0.5 / (t + 1.0)  # noqa: E731 - a user's schedule: c may be 0
    known, kept = make(), make(eta=user)
    removed = 2 if name == "rp_son" else 1  # RP-SON takes S g in both of its regimes
    assert _conds(known, params, g) == _conds(kept, params, g) - removed
    if name == "rfd_son":
        known = make(eta=0.5, curvature=0.0)  # a positive float
        kept = make(eta=lambda t: 0.5 + 0.0 * t)
    else:  # the default 1/sqrt(t) against a user's schedule equal to it
        kept = make(eta=lambda t: 1.0 / jnp.sqrt(t + 1.0))
    with x64():
        rng = np.random.default_rng(0)
        p = jnp.zeros(6, jnp.float64)
        sa, sb = known.init(p), kept.init(p)
        for _ in range(5):
            grad = jnp.asarray(rng.normal(size=6))
            ua, sa = known.update(grad, sa, p)
            ub, sb = kept.update(grad, sb, p)
            np.testing.assert_allclose(ua, ub, rtol=1e-12, atol=1e-15)


def test_a_zero_weight_solves_with_the_ridge_alone():
    """``eta = 0`` and ``sigma = 0``: ``c = 0``, the sketch absorbs a zero row, and the step is
    ``-(alpha I)^{-1} g`` (the cond's projection of ``g`` on an empty sketch)."""
    tx = so.fd_son(alpha=2.0, sketch_size=3, eta=0.0)
    params = jnp.zeros(4)
    g = jnp.array([1.0, -2.0, 0.0, 4.0])
    updates, state = tx.update(g, tx.init(params), params)
    np.testing.assert_allclose(updates, -g / 2.0, rtol=1e-6)
    updates, _ = tx.update(g, state, params)
    np.testing.assert_allclose(updates, -g / 2.0, rtol=1e-6)
