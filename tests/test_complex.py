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

    def __init__(self, d, tau, fraction=0.0, alpha=0.0):
        self.b = np.zeros((0, d), complex)
        self.tau, self.fraction, self.alpha = tau, fraction, alpha
        self.shrinkage = []

    def update(self, g):
        b = np.vstack([self.b, np.conj(g)[None]])
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


def run_tx(tx, grads, dtype=jnp.complex128):
    """Feed ``grads`` to ``tx`` (params start at 0, updates applied); the updates per step."""
    params = jnp.zeros(grads.shape[1], dtype)
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
    "ada_fd": (lambda: so.ada_fd(ETA, TAU, DELTA), lambda g: adagrad_run(RefFD(D, TAU), g)),
    "ada_fd_robust": (
        lambda: so.ada_fd(ETA, TAU, DELTA, robust=True),
        lambda g: adagrad_run(RefFD(D, TAU, 0.5), g),
    ),
    "ada_fd_fast": (
        lambda: so.ada_fd(ETA, 2, DELTA, fast=True),
        None,  # the doubling buffer: checked against its own covariance below
    ),
    "ada_fd_dual_averaging": (
        lambda: so.ada_fd_dual_averaging(ETA, TAU, DELTA),
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
        None,  # the doubling buffer: checked through its covariance below
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
