"""The arrowhead eigensolver (``sketchopt._arrowhead``) against LAPACK's ``eigh``.

Eigenvectors are compared through what is unique: ``U diag(lam) U^T`` (the matrix itself) and
``U^T U = I``, never raw columns (signs, and rotations inside repeated eigenvalues, are free).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sketchopt import _arrowhead
from sketchopt import sketches as sk

pytestmark = pytest.mark.xdist_group("arrowhead")


def arrow_matrix(d, z, alpha):
    a = np.diag(np.append(d, alpha))
    a[-1, :-1] = z
    a[:-1, -1] = z
    return a


def solve(d, z, alpha, dtype):
    with jax.enable_x64(dtype == np.float64):
        lam, u, ok = jax.jit(_arrowhead.arrowhead_eigh)(
            jnp.asarray(d, dtype), jnp.asarray(z, dtype), jnp.asarray(alpha, dtype)
        )
        return np.asarray(lam, np.float64), np.asarray(u, np.float64), bool(ok)


def errors(a, lam, u):
    scale = np.abs(np.linalg.eigvalsh(a)).max()
    ref = np.linalg.eigvalsh(a)[::-1]
    return (
        np.abs(lam - ref).max() / scale,
        np.abs(u.T @ u - np.eye(len(lam))).max(),
        np.abs(u @ np.diag(lam) @ u.T - a).max() / scale,
    )


def cases():
    rng = np.random.default_rng(0)
    k = 9
    out = {"random": (np.sort(rng.random(k))[::-1] * 10, rng.normal(size=k), 3.0)}
    # clustered poles, tiny arrow entries (deflated), zero poles of a rank-deficient sketch
    out["clustered"] = (
        np.array([5, 5 - 1e-9, 5 - 2e-9, 1, 1e-8, 0, 0, 0, 0.0]),
        np.array([1, 1, 1, 0.5, 1e-3, 0, 0, 0, 0.0]),
        0.7,
    )
    out["zero"] = (np.zeros(k), np.zeros(k), 2.0)
    out["first_row"] = (np.array([4.0] + [0.0] * (k - 1)), np.array([1e-3] + [0.0] * (k - 1)), 1e-6)
    # an FD step: orthogonal rows diag(s) Q^T, a new row g (a PSD arrowhead)
    q, _ = np.linalg.qr(rng.normal(size=(50, k)))
    rows = np.diag(np.linspace(9, 1, k)) @ q.T
    g = rng.normal(size=50)
    out["fd_step"] = (np.sum(rows**2, 1), rows @ g, g @ g)
    # poles over ten orders of magnitude, arrow entries over nine
    out["wide"] = (
        np.sort(rng.random(k) * 10.0 ** rng.integers(-5, 5, k))[::-1],
        rng.normal(size=k) * 10.0 ** rng.integers(-6, 3, k),
        1.0,
    )
    return out


@pytest.mark.parametrize("name", sorted(cases()))
@pytest.mark.parametrize(("dtype", "tol"), [(np.float64, 1e-13), (np.float32, 2e-5)])
def test_matches_eigh(name, dtype, tol):
    d, z, alpha = cases()[name]
    if dtype is np.float32:
        d, z, alpha = (np.asarray(v, np.float32).astype(np.float64) for v in (d, z, alpha))
    lam, u, ok = solve(d, z, alpha, dtype)
    if not ok:  # allowed only where the caller's eigh fall-back is meant to take over
        assert name in ("wide", "clustered") and dtype is np.float32, name
        return
    e_lam, e_orth, e_rec = errors(arrow_matrix(d, z, alpha), lam, u)
    assert e_lam < tol and e_orth < 10 * tol and e_rec < 10 * tol, (e_lam, e_orth, e_rec)


def test_coinciding_active_poles_ask_for_the_fallback():
    """Two equal poles with non-zero arrow entries need a Givens deflation this solver does not
    do: it must say so (and stay finite), so the caller uses eigh."""
    d = np.array([3.0, 3.0, 2.0, 0.0])
    z = np.array([1.0, 1.0, 0.5, 0.0])
    lam, u, ok = solve(d, z, 1.0, np.float64)
    assert not ok
    assert np.all(np.isfinite(lam)) and np.all(np.isfinite(u))


def test_random_arrowheads_float64():
    """Over many random arrowheads with wide ranges, every reported success is accurate, and the
    fall-back is rare."""
    rng = np.random.default_rng(1)
    k, fails = 7, 0
    for _ in range(100):
        d = rng.random(k) * 10.0 ** rng.integers(-4, 4, k)
        z = rng.normal(size=k) * 10.0 ** rng.integers(-4, 2, k)
        lam, u, ok = solve(d, z, 1.0, np.float64)
        if not ok:
            fails += 1
            continue
        e_lam, e_orth, e_rec = errors(arrow_matrix(d, z, 1.0), lam, u)
        assert e_lam < 1e-13 and e_orth < 1e-12 and e_rec < 1e-12, (d, z, e_lam, e_orth, e_rec)
    assert fails <= 10, fails


def test_eigh_arrow_in_the_matrix_index_order():
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        check_orders(rng)


def check_orders(rng):
    for j in range(5):
        g = np.diag(np.append(np.sort(rng.random(4))[::-1], 0.0))
        col = rng.normal(size=5)
        g[j, :], g[:, j] = col, col
        mu, u, ok = jax.jit(_arrowhead.eigh_arrow)(jnp.asarray(g), jnp.int32(j))
        assert bool(ok)
        np.testing.assert_allclose(np.asarray(u) @ np.diag(mu) @ np.asarray(u).T, g, atol=1e-14)


@pytest.mark.parametrize("force", [False, True])
def test_structured_eigh_dispatch(monkeypatch, force):
    """Diagonal matrices are sorted, arrowheads solved (where that pays: forced here), anything
    else goes to eigh; all agree with eigh_desc."""
    monkeypatch.setattr(_arrowhead, "arrowhead_pays", lambda: force)
    jax.clear_caches()
    rng = np.random.default_rng(3)
    diag = np.diag([0.0, 3.0, 1.0, 2.0])
    arrow = np.diag([4.0, 3.0, 0.0, 1.0])
    arrow[2, :] = arrow[:, 2] = [0.5, -0.2, 2.0, 0.3]
    general = rng.normal(size=(4, 4))
    with jax.enable_x64(True):
        check_dispatch([diag, arrow, general @ general.T])


def check_dispatch(matrices):
    for g in matrices:
        mu, u, fallback = jax.jit(_arrowhead.eigh_desc_structured)(jnp.asarray(g), jnp.int32(2))
        assert not bool(fallback)
        assert np.all(np.diff(np.asarray(mu)) <= 0)
        np.testing.assert_allclose(np.asarray(u) @ np.diag(mu) @ np.asarray(u).T, g, atol=1e-13)


@pytest.mark.parametrize("fast", [False, True])
def test_fd_through_the_arrowhead_path_equals_eigh(monkeypatch, fast):
    """FD with its shrink's eigendecomposition by the arrowhead solver (the accelerator path)
    keeps the same sketched covariance as with LAPACK's eigh (float64)."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(60, 12)) * rng.random((60, 1)) * 10.0 ** rng.integers(-2, 3, (60, 1))
    covs = []
    with jax.enable_x64(True):
        for force in (False, True):
            covs.append(fd_covariance(monkeypatch, force, fast, rows))
    np.testing.assert_allclose(covs[1], covs[0], rtol=1e-10, atol=1e-10 * np.abs(covs[0]).max())


def fd_covariance(monkeypatch, force, fast, rows):
    monkeypatch.setattr(_arrowhead, "arrowhead_pays", lambda: force)
    traced = []  # the solver's traces: proof that the forced path is the one compiled
    solver = _arrowhead.eigh_arrow
    monkeypatch.setattr(_arrowhead, "eigh_arrow", lambda *a: traced.append(1) or solver(*a))
    jax.clear_caches()
    sketch = sk.frequent_directions(4, fast=fast)
    state = jax.jit(sketch.update_many)(sketch.init(12, jnp.float64), jnp.asarray(rows))
    assert bool(traced) == force, traced
    return np.asarray(sk.covariance(state))


def test_fd_counts_its_eigh_fallbacks(monkeypatch):
    """Two equal kept directions, then a row touching both: coinciding active poles, which the
    arrowhead solve hands to eigh; the state counts it and the covariance matches eigh's."""
    rows = np.array([[3.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 1.0, 0], [1.0, 1.0, 0, 1.0]])
    states = []
    with jax.enable_x64(True):
        for force in (False, True):
            monkeypatch.setattr(_arrowhead, "arrowhead_pays", lambda force=force: force)
            jax.clear_caches()
            sketch = sk.frequent_directions(3)
            state = jax.jit(sketch.update_many)(sketch.init(4, jnp.float64), rows)
            states.append((int(state.eigh_fallbacks), np.asarray(sk.covariance(state))))
    assert [count for count, _ in states] == [0, 1]
    np.testing.assert_allclose(states[1][1], states[0][1], atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_householder_null_vector(dtype):
    """The plain-array null vector (the lazy basis's on accelerators) is a unit vector orthogonal
    to every row, for full-rank, rank-deficient, zero-column and zero matrices."""
    rng = np.random.default_rng(5)
    full = rng.normal(size=(6, 7))
    deficient = rng.normal(size=(6, 3)) @ rng.normal(size=(3, 7))
    zero_col = full.copy()
    zero_col[:, 2] = 0
    tiny = full * 1e-20
    tol = 1e-13 if dtype == "float64" else 3e-6
    with jax.enable_x64(dtype == "float64"):
        for a in (full, deficient, zero_col, np.zeros((6, 7)), tiny, full[:1]):
            q = np.asarray(jax.jit(_arrowhead.householder_null_vector)(jnp.asarray(a, dtype)))
            assert abs(np.linalg.norm(q) - 1) < tol
            assert np.abs(a @ q).max() <= tol * max(np.abs(a).max(), 1e-300) * 4


def test_lazy_fd_through_the_accelerator_path(monkeypatch):
    """Forced onto the accelerator path (arrowhead eigen-update, Householder null vector), the
    lazy FD keeps the eager basis's covariance (float64), and its compiled step calls no QR."""
    rng = np.random.default_rng(6)
    rows = rng.normal(size=(80, 12)) * 10.0 ** rng.integers(-2, 3, (80, 1))
    covs = []
    with jax.enable_x64(True):
        for force, lazy in ((False, False), (True, True)):
            monkeypatch.setattr(_arrowhead, "arrowhead_pays", lambda force=force: force)
            jax.clear_caches()
            sketch = sk.frequent_directions(5, lazy=lazy)
            run = jax.jit(sketch.update_many)
            state0 = sketch.init(12, jnp.float64)
            if force:
                hlo = run.lower(state0, rows).compile().as_text()
                targets = set(re.findall(r'custom_call_target="([^"]*)"', hlo))
                assert not [t for t in targets if "geqrf" in t or "orgqr" in t], targets
            covs.append(np.asarray(sk.covariance(run(state0, rows))))
    np.testing.assert_allclose(covs[1], covs[0], rtol=1e-9, atol=1e-9 * np.abs(covs[0]).max())
