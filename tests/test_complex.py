"""Complex parameters (issue 39): every family with a Hermitian form against a complex128 NumPy
reference written from its paper, the Optax parabola with complex64, and the refusals.

The references use the Hermitian forms of ``sketchopt.metrics``' "Complex parameters": the
gradient ``g`` in ``C^d`` as given (Optax's convention: ``conj`` of ``jax.grad`` of a real loss),
``g g^H`` for every outer product, ``|g|^2`` for squares. Sketches are compared through what is
unique -- the updates and the covariance ``B^H B + alpha I`` -- never through raw rows or
eigenvectors (defined up to a phase each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sketchopt as so
from sketchopt import sketches

D, TAU, STEPS = 6, 3, 6
ETA, DELTA = 0.3, 0.2


def complex_stream(steps=STEPS, d=D, seed=0):
    """Correlated complex gradients with a decaying spectrum, so that the sketches shrink."""
    rng = np.random.default_rng(seed)
    mix = (rng.normal(size=(d, d)) + 1j * rng.normal(size=(d, d))) * (0.6 ** np.arange(d))
    z = rng.normal(size=(steps, d)) + 1j * rng.normal(size=(steps, d))
    return z @ mix.T + (0.3 - 0.2j)


def herm_fn(c, fn):
    """``fn`` of a Hermitian PSD matrix through its eigendecomposition, its round-off eigenvalues
    (below ``d eps mu_max``, as ``sketchopt._numerics.eigh_desc``) zeroed: their square roots
    would be spurious ``1e-8`` curvature."""
    mu, u = np.linalg.eigh(0.5 * (c + c.conj().T))
    mu = np.where(mu > len(mu) * np.finfo(float).eps * max(mu.max(), 0), mu, 0)
    return (u * fn(mu)) @ u.conj().T


def relerr(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# --------------------------------------------------------------------------------------------
# References (complex128 NumPy).


class RefFD:
    """FD / RFD (RFD paper Alg. 1/2) on rows ``conj(g)``: ``C = B^H B + alpha I``; ``fraction``
    of each shrinkage goes to ``alpha`` (0: FD, 1/2: RFD, 1: S-AdaGrad)."""

    def __init__(self, d, tau, fraction=0.0, alpha=0.0, fast=False):
        self.b = np.zeros((0, d), complex)
        self.tau, self.fraction, self.alpha = tau, fraction, alpha
        self.n = 2 * tau if fast else tau  # the doubling buffer (RFD paper Alg. 4/5)
        self.shrinkage = []

    def update(self, g):
        b = np.vstack([self.b, np.conj(g)[None]])
        if len(b) < self.n:  # no shrink yet (per-step FD: shrinking by 0)
            self.b = b
            return
        _, s, vh = np.linalg.svd(b, full_matrices=False)
        s2 = s**2
        shrink = s2[self.tau - 1] if len(s2) >= self.tau else 0.0
        s2 = np.maximum(s2 - shrink, 0)[: self.tau - 1]
        self.b = np.sqrt(s2)[:, None] * vh[: self.tau - 1]
        self.alpha += self.fraction * shrink
        self.shrinkage.append(shrink)

    def cov(self):
        d = self.b.shape[1]
        return self.b.conj().T @ self.b + self.alpha * np.eye(d)


class RefFull:
    """``G = sum g g^H`` kept exactly."""

    def __init__(self, d, alpha=0.0):
        self.c = alpha * np.eye(d, dtype=complex)

    def update(self, g):
        self.c = self.c + np.outer(g, g.conj())

    def cov(self):
        return self.c


def adagrad_run(cov_ref, grads, dual=False):
    """Composite mirror descent / dual averaging with ``H = delta I + C^{1/2}`` (Duchi et al.
    eq. 3-4, Ada-FD Alg. 1/2; ``phi = 0``): the updates ``x_{t+1} - x_t`` from ``x_1 = 0``."""
    d = grads.shape[1]
    x, total, out = np.zeros(d, complex), np.zeros(d, complex), []
    for g in grads:
        cov_ref.update(g)
        h = DELTA * np.eye(d) + herm_fn(cov_ref.cov(), np.sqrt)
        total = total + g
        new = -ETA * np.linalg.solve(h, total) if dual else x - ETA * np.linalg.solve(h, g)
        out.append(new - x)
        x = new
    return np.array(out)


def diag_run(grads):
    acc, out = np.zeros(grads.shape[1]), []
    for g in grads:
        acc = acc + np.abs(g) ** 2
        out.append(-ETA * g / (DELTA + np.sqrt(acc)))
    return np.array(out)


def run_tx(tx, grads, dtype=jnp.complex128, params=None):
    """Feed ``grads`` to ``tx`` (params start at 0, updates applied); the updates per step."""
    params = jnp.zeros(grads.shape[1], dtype) if params is None else jnp.asarray(params, dtype)
    state = tx.init(params)
    out = []
    for g in grads:
        u, state = tx.update(jnp.asarray(g, dtype), state, params)
        params = params + u
        out.append(np.asarray(u))
    return np.array(out), state


ADAGRAD_CASES = {
    "ada_diag": (lambda: so.ada_diag(ETA, DELTA), lambda g: diag_run(g)),
    "ada_full": (lambda: so.ada_full(ETA, DELTA), lambda g: adagrad_run(RefFull(D), g)),
    "ada_fd": (
        lambda: so.ada_fd(ETA, TAU, DELTA, robust=False),
        lambda g: adagrad_run(RefFD(D, TAU), g),
    ),
    "ada_fd_robust": (
        lambda: so.ada_fd(ETA, TAU, DELTA, robust=True),
        lambda g: adagrad_run(RefFD(D, TAU, 0.5), g),
    ),
    "ada_fd_fast_robust": (
        lambda: so.ada_fd(ETA, 2, DELTA, fast=True, robust=True),
        lambda g: adagrad_run(RefFD(D, 2, 0.5, fast=True), g),
    ),
    "ada_fd_dual_averaging": (
        lambda: so.ada_fd_dual_averaging(ETA, TAU, DELTA, robust=False),
        lambda g: adagrad_run(RefFD(D, TAU), g, dual=True),
    ),
    "s_adagrad": (
        lambda: so.s_adagrad(ETA, TAU, DELTA),
        lambda g: adagrad_run(RefFD(D, TAU, 1.0), g),
    ),
}


@pytest.mark.parametrize("name", [k for k, v in ADAGRAD_CASES.items() if v[1] is not None])
def test_adagrad_family_matches_hermitian_reference(name):
    make, ref = ADAGRAD_CASES[name]
    grads = complex_stream()
    with jax.enable_x64(True):
        got, state = run_tx(make(), grads)
    want = ref(grads)
    assert relerr(got, want) < 1e-10, relerr(got, want)
    for leaf in jax.tree.leaves(state):
        assert np.all(np.isfinite(np.asarray(leaf)))


# --------------------------------------------------------------------------------------------
# The SON family (Luo et al. 2016, Alg. 1): A_t = alpha I + S^H S, update -A_t^{-1} g_t, the
# to-sketch vector sqrt(eta_t) g_t (sigma = 0).

ALPHA = 0.7


class RefOja:
    """Oja's sketch (SON eq. 4) for ``sum g g^H``: ``Lambda <- (1 - G) Lambda + G |V g|^2``,
    ``V <- orth(V + G (V g) g^H)`` by Gram-Schmidt of the rows, ``C = V^H diag(t Lambda) V``."""

    def __init__(self, v0):
        self.v, self.lam, self.t = np.asarray(v0), np.zeros(v0.shape[0]), 0

    def update(self, g):
        self.t += 1
        gam = 1.0 / self.t
        p = self.v @ g
        self.lam = (1 - gam) * self.lam + gam * np.abs(p) ** 2
        a = self.v + gam * np.outer(p, g.conj())
        q, _ = np.linalg.qr(a.T)  # rows of q.T orthonormal: q^T conj(q) = I
        self.v = q.T

    def cov(self):
        return (self.v.conj().T * (self.t * self.lam)) @ self.v


class RefRP:
    """The random projection ``S += r_t g^H`` (SON sec. 3), ``r_t`` drawn as the sketch draws it
    (``key, sub = split(key)``, ``N(0, I/m)``)."""

    def __init__(self, d, m, key):
        self.s, self.key, self.m = np.zeros((m, d), complex), key, m

    def update(self, g):
        self.key, sub = jax.random.split(self.key)
        r = np.asarray(jax.random.normal(sub, (self.m,), jnp.float64)) / np.sqrt(self.m)
        self.s = self.s + np.outer(r, g.conj())

    def cov(self):
        return self.s.conj().T @ self.s


def son_run(cov_ref, grads, alpha, eta):
    """The updates ``-A_t^{-1} g_t`` with ``A_t = alpha I + C_t`` (``C_t`` sketching
    ``sqrt(eta_t) g_t``, ``alpha=None``: the RFD sketch's own ridge)."""
    d, out = grads.shape[1], []
    for t, g in enumerate(grads, start=1):
        cov_ref.update(np.sqrt(eta(t)) * g)
        a = cov_ref.cov() + (alpha or 0.0) * np.eye(d)
        out.append(-np.linalg.solve(a, g))
    return np.array(out)


def inv_sqrt(t):
    return 1 / np.sqrt(t)


def inv_t(t):
    return 1 / t


KEY = jax.random.PRNGKey(3)


def _oja_start():
    return np.asarray(sketches.oja(TAU, key=KEY).init(D, jnp.complex128).directions)


SON_CASES = {
    "fd_son": (
        lambda: so.fd_son(ALPHA, TAU),
        lambda g: son_run(RefFD(D, TAU), g, ALPHA, inv_sqrt),
    ),
    "fd_son_fast": (
        lambda: so.fd_son(ALPHA, 2, fast=True),
        lambda g: son_run(RefFD(D, 2, fast=True), g, ALPHA, inv_sqrt),
    ),
    "rfd_son": (
        lambda: so.rfd_son(TAU, alpha0=0.5),
        lambda g: son_run(RefFD(D, TAU, 0.5, alpha=0.5), g, None, inv_t),
    ),
    "oja_son": (
        lambda: so.oja_son(ALPHA, TAU, key=KEY),
        lambda g: son_run(RefOja(_oja_start()), g, ALPHA, inv_sqrt),
    ),
    "rp_son": (
        lambda: so.rp_son(ALPHA, TAU, KEY),
        lambda g: son_run(RefRP(D, TAU, KEY), g, ALPHA, inv_sqrt),
    ),
    "ons": (lambda: so.ons(ALPHA), lambda g: son_run(RefFull(D), g, ALPHA, inv_sqrt)),
}


@pytest.mark.parametrize("name", [k for k, v in SON_CASES.items() if v[1] is not None])
def test_son_family_matches_hermitian_reference(name):
    make, ref = SON_CASES[name]
    grads = complex_stream(seed=1)
    with jax.enable_x64(True):
        got, state = run_tx(make(), grads)
        want = ref(grads)
    assert relerr(got, want) < 1e-10, relerr(got, want)
    for leaf in jax.tree.leaves(state):
        assert np.all(np.isfinite(np.asarray(leaf)))


# --------------------------------------------------------------------------------------------
# First-order learners (the slides' Alg. 3-6) and the separable regularizers: complex L1 steps
# are the complex soft threshold, which shrinks the modulus and keeps the phase.


def cst(z, a):
    """``z max(0, 1 - a / |z|)``: the prox of ``a sum |z_i|`` on ``C^d``."""
    mag = np.abs(z)
    return np.where(mag > a, z * (1 - a / np.where(mag > 0, mag, 1)), 0)


def gradient_then(truncate, lr, w0, grads):
    w, out = w0.copy(), []
    for t, g in enumerate(grads, start=1):
        new = truncate(w - lr * g, t)
        out.append(new - w)
        w = new
    return np.array(out)


def rda_ref(gamma, l1, w0, grads):
    avg, w, out = np.zeros_like(w0), w0.copy(), []
    for t, g in enumerate(grads, start=1):
        avg = (t - 1) / t * avg + g / t
        new = -(np.sqrt(t) / gamma) * cst(avg, l1)
        out.append(new - w)
        w = new
    return np.array(out)


def ftrl_ref(alpha, beta, l1, l2, w0, grads):
    z, n, w, out = np.zeros_like(w0), np.zeros(len(w0)), w0.copy(), []
    for g in grads:
        played = -cst(z, l1) / (l2 + (beta + np.sqrt(n)) / alpha)
        sigma = (np.sqrt(n + np.abs(g) ** 2) - np.sqrt(n)) / alpha
        z = z + g - sigma * played
        n = n + np.abs(g) ** 2
        new = -cst(z, l1) / (l2 + (beta + np.sqrt(n)) / alpha)
        out.append(new - w)
        w = new
    return np.array(out)


def diag_prox_run(grads, w0, prox):
    """Composite mirror descent with ADA-DIAG (Duchi et al. eq. 4): the prox at the center
    ``z = x_t - eta H^{-1} g_t`` in the ``H``-norm, ``prox(z, h)``."""
    acc, w, out = np.zeros(len(w0)), w0.copy(), []
    for g in grads:
        acc = acc + np.abs(g) ** 2
        h = DELTA + np.sqrt(acc)
        new = prox(w - ETA * g / h, h)
        out.append(new - w)
        w = new
    return np.array(out)


def fd_prox_run(grads, w0, mu):
    """ADA-FD with ``l2_squared(mu)``: ``x = (H + eta mu I)^{-1} H z``."""
    ref, w, out = RefFD(D, TAU), w0.copy(), []
    for g in grads:
        ref.update(g)
        h = DELTA * np.eye(D) + herm_fn(ref.cov(), np.sqrt)
        z = w - ETA * np.linalg.solve(h, g)
        new = np.linalg.solve(h + ETA * mu * np.eye(D), h @ z)
        out.append(new - w)
        w = new
    return np.array(out)


LR, L1 = 0.2, 0.3
SPARSE_CASES = {
    "fobos_l1": (
        lambda: so.fobos_l1(LR, L1),
        lambda w0, g: gradient_then(lambda v, t: cst(v, LR * L1), LR, w0, g),
    ),
    "truncated_gradient": (
        lambda: so.truncated_gradient(LR, L1, 1.5, 2),
        lambda w0, g: gradient_then(
            lambda v, t: np.where((np.abs(v) <= 1.5), cst(v, LR * 2 * L1 * (t % 2 == 0)), v),
            LR,
            w0,
            g,
        ),
    ),
    "simple_truncation": (
        lambda: so.simple_truncation(LR, 1.0, 2),
        lambda w0, g: gradient_then(
            lambda v, t: np.where((t % 2 == 0) & (np.abs(v) <= 1.0), 0, v), LR, w0, g
        ),
    ),
    "rda_l1": (lambda: so.rda_l1(2.0, L1), lambda w0, g: rda_ref(2.0, L1, w0, g)),
    "ftrl_proximal": (
        lambda: so.ftrl_proximal(0.5, 1.0, L1, 0.1),
        lambda w0, g: ftrl_ref(0.5, 1.0, L1, 0.1, w0, g),
    ),
    "ada_diag_l1": (
        lambda: so.ada_diag(ETA, DELTA, regularizer=so.regularizers.l1(L1)),
        lambda w0, g: diag_prox_run(g, w0, lambda z, h: cst(z, ETA * L1 / h)),
    ),
    "ada_diag_l2_squared": (
        lambda: so.ada_diag(ETA, DELTA, regularizer=so.regularizers.l2_squared(L1)),
        lambda w0, g: diag_prox_run(g, w0, lambda z, h: h * z / (h + ETA * L1)),
    ),
    "ada_fd_l2_squared": (
        lambda: so.ada_fd(
            ETA, TAU, DELTA, regularizer=so.regularizers.l2_squared(L1), robust=False
        ),
        lambda w0, g: fd_prox_run(g, w0, L1),
    ),
}


@pytest.mark.parametrize("name", list(SPARSE_CASES))
def test_first_order_and_regularizers_match_complex_soft_threshold(name):
    make, ref = SPARSE_CASES[name]
    grads = 0.5 * complex_stream(seed=2)
    rng = np.random.default_rng(5)
    w0 = 0.6 * (rng.normal(size=D) + 1j * rng.normal(size=D))
    with jax.enable_x64(True):
        got, _ = run_tx(make(), grads, params=w0)
    want = ref(w0, grads)
    assert relerr(got, want) < 1e-10, relerr(got, want)
    if name in ("rda_l1", "simple_truncation"):
        w = w0 + np.cumsum(want, axis=0)
        assert np.any(w == 0)  # the thresholds did act on this stream


# --------------------------------------------------------------------------------------------
# Refusals and the Optax parabola.


@pytest.mark.parametrize(
    "make, family",
    [
        (lambda: so.radagrad(0.1, 2, 1e-3, jax.random.PRNGKey(0)), "radagrad"),
        (lambda: so.ada_lr(0.1, 2, 1e-3, jax.random.PRNGKey(0)), "ada_lr"),
        (lambda: so.kron_fd(0.1, 2, graft=None), "kron_"),
    ],
)
def test_families_without_hermitian_form_refuse_at_init(make, family):
    tx = make()
    with pytest.raises(TypeError, match=f"{family}.*complex parameters are not supported"):
        tx.init({"w": jnp.zeros((3, 4), jnp.complex64)})


def test_regularizers_without_hermitian_form_refuse_when_traced():
    params = jnp.zeros(D, jnp.complex64)
    g = jnp.ones(D, jnp.complex64)
    for tx, name in (
        (so.ada_diag(0.1, 1e-3, regularizer=so.regularizers.l2(0.1)), "l2"),
        (
            so.ada_fd(0.1, 3, 1e-3, regularizer=so.regularizers.l1(0.1), robust=False),
            "l1 with a low-rank",
        ),
    ):
        with pytest.raises(TypeError, match=f"{name}.*complex parameters are not supported"):
            tx.update(g, tx.init(params), params)


def test_son_projection_refuses_complex():
    params = jnp.zeros(D, jnp.complex64)
    tx = so.fd_son(1.0, TAU)
    with pytest.raises(TypeError, match="complex parameters are not supported"):
        so.project_bounded_prediction(tx.init(params), params, jnp.ones(D, jnp.complex64), 1.0)


def test_ada_fd_complex64_parabola_converges():
    """Optax's alias test with complex parameters: ``sum |p - target|^2`` from ``[-1, 10, 1]``,
    the update fed ``conj(grad)``; states are complex64 with float32 real parts."""
    target = (1 + 1j) * jnp.array([1.0, -1.0, 1.0], jnp.complex64)
    params = jnp.array([-1.0, 10.0, 1.0], jnp.complex64)
    # sketch_size 2 < d shrinks at every step; a small delta diverges here as it does for real
    # float32 parameters (the step off the one-row sketch is g / delta)
    tx = so.ada_fd(1.0, 2, 1.0, robust=False)

    def loss(p):
        return jnp.sum(jnp.abs(p - target) ** 2)

    @jax.jit
    def step(p, state):
        u, state = tx.update(jnp.conj(jax.grad(loss)(p)), state, p)
        return optax.apply_updates(p, u), state

    state = tx.init(params)
    for _ in range(300):
        params, state = step(params, state)
    assert params.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(params), np.asarray(target), atol=1e-2)
    real_parts = [x for x in jax.tree.leaves(state) if x.dtype == jnp.float32]
    assert real_parts  # alpha, compensation: real


def test_lazy_basis_fd_matches_hermitian_reference():
    """The lazy basis ``B = F Z`` (long rows; forced here) with complex rows: its null vector is
    the conjugate of LAPACK's last ``Q`` column, and the solve and covariance match."""
    from sketchopt import metrics

    grads = complex_stream(steps=8)
    with jax.enable_x64(True):
        metric = metrics.sketched(sketches.frequent_directions(TAU, lazy=True), DELTA)
        state, ref = metric.init(D, jnp.complex128), RefFD(D, TAU)
        for g in grads:
            state, _, solved = metric.update(state, jnp.asarray(g))
            ref.update(g)
            h = DELTA * np.eye(D) + herm_fn(ref.cov(), np.sqrt)
            assert relerr(solved, np.linalg.solve(h, g)) < 1e-10
            assert relerr(sketches.covariance(state), ref.cov()) < 1e-10
