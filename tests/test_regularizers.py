"""Tests of :mod:`sketchopt.regularizers`: closed forms, the low-rank inner solver, JAX transforms.

References are written independently in float64 NumPy: a restarted accelerated proximal gradient
(FISTA) solver with bisection-based Euclidean proxes, and ``scipy.optimize.minimize`` for l1.
Every jitted function is compiled once per (regularizer, operator kind, shape) and applied to a
batch of random problems through ``jax.vmap`` to keep the module fast.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import hadamard
from scipy.optimize import minimize

import sketchopt as so
from sketchopt import regularizers as R
from sketchopt.operators import DiagonalOperator, LowRankOperator

NAMES = ["l1", "l2_squared", "l2", "linf", "l1_ball", "mixed_l1_l2", "mixed_l1_linf"]
HOMOGENEOUS = [n for n in NAMES if n != "l1_ball"]
STRENGTH = 0.7

x64 = functools.partial(jax.enable_x64, True)


def make(name, strength=STRENGTH, **kw):
    return getattr(R, name)(strength, **kw)


def shape_for(name):
    return (2, 4) if name.startswith("mixed") else (8,)


# --------------------------------------------------------------------------------------------------
# float64 NumPy references


def _groups(name, shape):
    d = int(np.prod(shape))
    if name.startswith("mixed") and len(shape) == 2:
        return [np.arange(r * shape[1], (r + 1) * shape[1]) for r in range(shape[0])]
    return [np.arange(d)]


def np_phi(name, s, x, shape):
    if name == "l1":
        return s * np.abs(x).sum()
    if name == "l2_squared":
        return 0.5 * s * x @ x
    if name == "l1_ball":
        return 0.0 if np.abs(x).sum() <= s * (1 + 1e-9) + 1e-12 else np.inf
    tot = 0.0
    for g in _groups(name, shape):
        if name in ("l2", "mixed_l1_l2"):
            tot += np.linalg.norm(x[g])
        else:
            tot += np.abs(x[g]).max(initial=0.0)
    return s * tot


def np_proj_l1(v, r):
    """Projection onto the l1 ball by bisection on the threshold (independent of Fig. 3)."""
    a = np.abs(v)
    if a.sum() <= r:
        return v.copy()
    lo, hi = 0.0, a.max()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(a - mid, 0).sum() > r:
            lo = mid
        else:
            hi = mid
    return np.sign(v) * np.maximum(a - hi, 0)


def np_prox_euclid(name, s, v, t, shape):
    if name == "l1":
        return np.sign(v) * np.maximum(np.abs(v) - t * s, 0)
    if name == "l2_squared":
        return v / (1 + t * s)
    if name == "l1_ball":
        return np_proj_l1(v, s)
    x = np.zeros_like(v)
    for g in _groups(name, shape):
        if name in ("l2", "mixed_l1_l2"):
            n = np.linalg.norm(v[g])
            x[g] = v[g] * max(0.0, 1 - t * s / n) if n > 0 else 0
        else:  # Moreau: prox of t s ||.||_inf = id - projection onto the l1 ball of radius t s
            x[g] = v[g] - np_proj_l1(v[g], t * s)
    return x


def np_reference(name, s, u, c, hm, shape, iters=200_000):
    """argmin <u,x> + c phi(x) + 1/2 x'Hx by FISTA with gradient restart, to ~1e-13."""
    lip = np.linalg.eigvalsh(hm).max()
    x = y = np.zeros_like(u)
    tk = 1.0
    for _ in range(iters):
        x_new = np_prox_euclid(name, s, y - (u + hm @ y) / lip, c / lip, shape)
        if (y - x_new) @ (x_new - x) > 0:  # restart
            tk = 1.0
            y = x
            continue
        t_new = 0.5 * (1 + np.sqrt(1 + 4 * tk * tk))
        y = x_new + (tk - 1) / t_new * (x_new - x)
        done = np.linalg.norm(x_new - x) <= 1e-14 * (1 + np.linalg.norm(x_new))
        x, tk = x_new, t_new
        if done:
            break
    return x


def np_objective(name, s, u, c, hm, shape, x):
    phi = np_phi(name, s, x, shape)
    return u @ x + 0.5 * x @ hm @ x + (phi if name == "l1_ball" else c * phi)


def scipy_l1(s, u, c, hm):
    """l1 with scipy: smooth bound-constrained split x = p - n, p, n >= 0 (L-BFGS-B)."""
    d = u.size

    def fg(z):
        x = z[:d] - z[d:]
        g = u + hm @ x
        val = u @ x + 0.5 * x @ hm @ x + c * s * z.sum()
        return val, np.concatenate([g + c * s, -g + c * s])

    res = minimize(
        fg,
        np.zeros(2 * d),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0, None)] * 2 * d,
        options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 10_000},
    )
    return res.x[:d] - res.x[d:]


# --------------------------------------------------------------------------------------------------
# random problems


def random_lowrank(rng, d, k, cond, *, n_extra=1, zero_row=True, scalar=0.5):
    """``H = scalar I + V^T diag(w) V`` with ``V = coef @ basis`` (k orthonormal rows + a zero row).

    ``basis`` is a random invertible mix of orthonormal rows so that ``coef`` is not trivial.
    Returns numpy (scalar, basis, coef, weights, dense H).
    """
    n = k + n_extra
    q, _ = np.linalg.qr(rng.normal(size=(d, n)))
    vfull = q.T  # (n, d) orthonormal rows
    a = rng.normal(size=(n, n)) + 3 * np.eye(n)
    basis = a @ vfull
    coef = np.linalg.inv(a)[:k]  # coef @ basis = first k rows of vfull
    weights = scalar * (cond - 1) * np.geomspace(1.0, 1e-2, k)
    rng.shuffle(weights)
    if zero_row:
        coef = np.vstack([coef, np.zeros((1, n))])
        weights = np.append(weights, 3.0)  # weight on an exactly-zero row: no effect
    v = coef @ basis
    hm = scalar * np.eye(d) + v.T @ (weights[:, None] * v)
    return scalar, basis, coef, weights, hm


def stack_ops(ops, dtype):
    fields = [jnp.asarray(np.stack(f), dtype) for f in zip(*ops, strict=True)]
    zeros = jnp.zeros(len(ops), jnp.int32)  # batched, like every field (vmap over the operator)
    return LowRankOperator(*fields, scale_exp=zeros, value_exp=zeros)


@functools.cache
def batched_prox(reg, shape, kind):
    """jit(vmap(prox)) over (u, c, op) -- exercises vmap over batched operators too."""

    def one(u, c, op, x0):
        return reg.prox_with_info(u, c, op, shape=shape, x0=x0)

    if kind == "cold":
        return jax.jit(jax.vmap(lambda u, c, op: one(u, c, op, None)))
    return jax.jit(jax.vmap(one))


def diag_problems(rng, d, m):
    u = rng.normal(size=(m, d)) * 2
    h = np.exp(rng.normal(size=(m, d)))
    c = rng.uniform(0.2, 2.0, size=m)
    c[0] = 0.0  # the unregularized minimizer is part of every batch
    return u, h, c


def lr_op(fields, dtype):
    """A single LowRankOperator from numpy fields (call inside ``x64()`` for float64)."""
    s, basis, coef, w = fields[:4]
    return LowRankOperator(
        jnp.asarray(s, dtype),
        jnp.asarray(basis, dtype),
        jnp.asarray(coef, dtype),
        jnp.asarray(w, dtype),
    )


# --------------------------------------------------------------------------------------------------
# closed forms (diagonal H) versus float64 references


@pytest.mark.parametrize("name", NAMES)
def test_diagonal_closed_forms_match_reference(name):
    rng = np.random.default_rng(0)
    shape = shape_for(name)
    d = int(np.prod(shape))
    u, h, c = diag_problems(rng, d, 7)
    # last problem: ADA-DIAG with delta = 0, h_i = 0 (and then u_i = 0) -> x_i = 0, never NaN
    h[-1, ::3] = 0.0
    u[-1, ::3] = 0.0
    reg = make(name)
    with x64():
        f = batched_prox(reg, shape, "cold")
        xs, info = f(jnp.asarray(u), jnp.asarray(c), DiagonalOperator(jnp.asarray(h)))
        xs = np.asarray(xs)
    assert xs.dtype == np.float64 and np.all(np.isfinite(xs))
    assert np.all(np.asarray(info.iterations) == 0)
    assert np.all(xs[-1, ::3] == 0.0)
    for i in range(len(c) - 1):
        hm = np.diag(h[i])
        ref = np_reference(name, STRENGTH, u[i], c[i], hm, shape)
        np.testing.assert_allclose(xs[i], ref, atol=1e-9, rtol=1e-9, err_msg=f"problem {i}")
        f_mine = np_objective(name, STRENGTH, u[i], c[i], hm, shape, xs[i])
        f_ref = np_objective(name, STRENGTH, u[i], c[i], hm, shape, ref)
        assert f_mine <= f_ref + 1e-12 * (1 + abs(f_ref))
    if name != "l1_ball":  # c = 0: the unregularized minimizer -H^{-1} u
        np.testing.assert_allclose(xs[0], -u[0] / h[0], rtol=1e-14)


def test_diagonal_l1_exact_zeros_and_scipy():
    rng = np.random.default_rng(1)
    d = 8
    u = rng.normal(size=d)
    u[:3] = [0.5, -0.7, 0.69999]  # |u_i| <= c * strength = 0.7 for these
    h = np.exp(rng.normal(size=d))
    with x64():
        op = DiagonalOperator(jnp.asarray(h))
        x = np.asarray(R.l1(STRENGTH).prox(jnp.asarray(u), 1.0, op, shape=(d,)))
        # eq. 24 of Duchi et al. with u = eta g - H x_t, c = eta.
        eta, xt, g = 0.3, rng.normal(size=d), rng.normal(size=d)
        x24 = R.l1(STRENGTH).prox(jnp.asarray(eta * g - h * xt), eta, op, shape=(d,))
    zero = np.abs(u) <= STRENGTH
    assert np.all(x[zero] == 0.0)
    assert np.all(x[~zero] != 0.0)
    np.testing.assert_allclose(x, scipy_l1(STRENGTH, u, 1.0, np.diag(h)), atol=1e-8)
    z = xt - eta * g / h
    np.testing.assert_allclose(
        x24, np.sign(z) * np.maximum(np.abs(z) - STRENGTH * eta / h, 0), rtol=1e-13, atol=1e-15
    )


def test_diagonal_l2_squared_is_eq25():
    """phi = s/2 ||x||^2 is the paper's convention: its sec. 6.2 objective gives eq. 25."""
    rng = np.random.default_rng(2)
    d, eta, delta = 6, 0.4, 0.1
    st, xt, g = np.exp(rng.normal(size=d)), rng.normal(size=d), rng.normal(size=d)
    # sec. 6.2: eta<g,x> + eta*s/2||x||^2 + delta/2||x||^2 + 1/2<x - x_t, diag(s_t)(x - x_t)>
    # = <eta g - s_t x_t, x> + eta * phi(x) + 1/2 <x, (delta I + diag(s_t)) x> + const.
    with x64():
        x = R.l2_squared(STRENGTH).prox(
            jnp.asarray(eta * g - st * xt),
            eta,
            DiagonalOperator(jnp.asarray(delta + st)),
            shape=(d,),
        )
    eq25 = (st * xt - eta * g) / (eta * STRENGTH + delta + st)
    np.testing.assert_allclose(x, eq25, rtol=1e-13)


# --------------------------------------------------------------------------------------------------
# the low-rank inner solver


@pytest.mark.parametrize("name", NAMES)
def test_lowrank_matches_reference(name):
    """Random k << d problems (kappa 10..1e3) against FISTA in float64; c = 0 and u = 0 included."""
    rng = np.random.default_rng(3)
    shape = shape_for(name)
    d, k = int(np.prod(shape)), 2
    conds = [10, 100, 1e3, 30, 300, 50]
    problems = [random_lowrank(rng, d, k, cond=cd) for cd in conds]
    u = rng.normal(size=(len(conds), d)) * 2
    u[-1] = 0.0
    c = rng.uniform(0.3, 2.0, size=len(conds))
    c[0] = 0.0
    reg = make(name, tol=1e-10)
    with x64():
        xs, info = batched_prox(reg, shape, "cold")(
            jnp.asarray(u), jnp.asarray(c), stack_ops([p[:4] for p in problems], jnp.float64)
        )
        xs, res, its = np.asarray(xs), np.asarray(info.residual), np.asarray(info.iterations)
    assert xs.dtype == np.float64
    assert np.all(res <= 1e-10), res
    assert np.all(its <= 30), its
    assert np.all(xs[-1] == 0.0)
    n_zero = 0
    for i in range(len(conds) - 1):
        hm = problems[i][4]
        ref = np_reference(name, STRENGTH, u[i], c[i], hm, shape)
        np.testing.assert_allclose(xs[i], ref, atol=1e-8, rtol=1e-8, err_msg=f"problem {i}")
        f_mine = np_objective(name, STRENGTH, u[i], c[i], hm, shape, xs[i])
        f_ref = np_objective(name, STRENGTH, u[i], c[i], hm, shape, ref)
        assert f_mine <= f_ref + 1e-11 * (1 + abs(f_ref))
        if name == "l1":  # exact zeros wherever optimality says so (|u + Hx|_i < c * strength)
            g = u[i] + hm @ xs[i]
            clearly_zero = np.abs(g) < c[i] * STRENGTH * (1 - 1e-6)
            assert np.all(xs[i][clearly_zero] == 0.0)
            n_zero += clearly_zero.sum()
        if name == "l1_ball":
            assert np.abs(xs[i]).sum() <= STRENGTH * (1 + 1e-12)
    if name == "l1":
        assert n_zero >= 5
    if name != "l1_ball":
        np.testing.assert_allclose(
            xs[0], -np.linalg.solve(problems[0][4], u[0]), rtol=1e-10, atol=1e-12
        )


def _kkt_hinv(name, s, u, c, hm, x, tol=1e-9):
    """Independent optimality check: an element of the subdifferential, in the H^{-1} norm."""
    g = u + hm @ x
    e = np.zeros_like(x)
    if name == "l1_ball":  # -(u + Hx) = theta * sign(x) on the support, |.| <= theta off it
        assert np.abs(x).sum() <= s * (1 + 1e-12)
        nz = x != 0
        theta = max(0.0, np.mean(-g[nz] * np.sign(x[nz]))) if nz.any() else 0.0
        if np.abs(x).sum() < s * (1 - 1e-9):
            theta = 0.0
        name, c, s = "l1", 1.0, theta
    if name == "l1":
        nz = x != 0
        e[nz] = g[nz] + c * s * np.sign(x[nz])
        e[~nz] = np.sign(g[~nz]) * np.maximum(np.abs(g[~nz]) - c * s, 0)
    else:  # linf
        if np.abs(x).max() == 0:
            e = g * max(0.0, 1 - c * s / np.abs(g).sum())
        else:
            top = np.abs(x) >= np.abs(x).max() * (1 - tol)
            e[~top] = g[~top]
            # on the maximal coordinates -g must be c * s * (a convex combination of sign(x))
            gt = -g[top] * np.sign(x[top])
            e[top] = np.where(gt < 0, g[top], 0)
            e[top] += (np.sum(np.maximum(gt, 0)) - c * s) / top.sum() * np.sign(x[top])
    hinv = np.linalg.inv(hm)
    return np.sqrt(e @ hinv @ e) / max(np.sqrt(u @ hinv @ u), np.sqrt(x @ hm @ x))


@pytest.mark.parametrize("name", ["l1", "linf", "l1_ball"])
def test_lowrank_badly_conditioned(name):
    """lambda_max / lambda_min = 1e6: Newton still converges in a handful of iterations."""
    rng = np.random.default_rng(4)
    d, k = 60, 5
    problems = [random_lowrank(rng, d, k, cond=1e6, scalar=sc) for sc in (1.0, 1e-3, 1e2)]
    ops = [p[:4] for p in problems]
    u = rng.normal(size=(3, d)) * np.array([1.0, 1e-2, 1e3])[:, None]
    c = np.array([1.0, 1e-2, 1e3]) * 0.5
    with x64():
        xs, info = batched_prox(make(name, tol=1e-9), (d,), "cold")(
            jnp.asarray(u), jnp.asarray(c), stack_ops(ops, jnp.float64)
        )
        xs, res, its = np.asarray(xs), np.asarray(info.residual), np.asarray(info.iterations)
    assert np.all(res <= 1e-9), res
    assert np.all(its <= (150 if name == "l1_ball" else 20)), its
    for i in range(3):
        assert _kkt_hinv(name, STRENGTH, u[i], c[i], problems[i][4], xs[i]) < 1e-7
    if name == "l1":  # float32 on the same problems: finite, and as accurate as float32 allows
        x32, info32 = batched_prox(make(name), (d,), "cold")(
            jnp.asarray(u, jnp.float32), jnp.asarray(c, jnp.float32), stack_ops(ops, jnp.float32)
        )
        assert x32.dtype == jnp.float32 and np.all(np.isfinite(x32))
        assert np.all(np.asarray(info32.iterations) <= 20), info32
        for i in range(3):
            err = np.linalg.norm(np.asarray(x32[i], np.float64) - xs[i])
            assert err <= 1e-4 * np.linalg.norm(xs[i])


def test_lowrank_strength_zero_gives_unregularized():
    rng = np.random.default_rng(6)
    d = 8
    op = lr_op(random_lowrank(rng, d, 3, cond=1e4), jnp.float32)
    u = jnp.asarray(rng.normal(size=d), jnp.float32)
    x = jax.jit(lambda u: R.l1(0.0).prox(u, 2.0, op, shape=(d,)))(u)
    # A jitted and an eager program may round differently (fused or reordered products): agree
    # to float32 round-off, not bit for bit.
    np.testing.assert_allclose(x, -op.solve(u), rtol=1e-6, atol=1e-6 * float(jnp.abs(x).max()))


def test_warm_start_reduces_iterations():
    rng = np.random.default_rng(8)
    d, k = 200, 6
    fields = random_lowrank(rng, d, k, cond=1e4)
    u = rng.normal(size=d)
    u2 = u + 1e-3 * rng.normal(size=d)
    reg = R.l1(STRENGTH, tol=1e-10)
    with x64():
        op = lr_op(fields, jnp.float64)
        f = jax.jit(lambda u, x0: reg.prox_with_info(u, 1.0, op, shape=(d,), x0=x0))
        x_cold, info_cold = f(jnp.asarray(u), jnp.zeros(d))
        # the previous solution as warm start for a slightly perturbed problem
        x_warm, info_warm = f(jnp.asarray(u2), x_cold)
        x_cold2, info_cold2 = f(jnp.asarray(u2), jnp.zeros(d))
        _, info_exact = f(jnp.asarray(u), x_cold)
    assert int(info_warm.iterations) < int(info_cold2.iterations)
    assert int(info_exact.iterations) <= 1
    assert float(info_warm.residual) <= 1e-10
    np.testing.assert_allclose(x_warm, x_cold2, atol=1e-9)


def test_lowrank_scale_exp_huge_sketch_float32():
    """V = 2**-e coef @ basis with a basis of 1e30-sized rows (float32): same answer as unscaled."""
    rng = np.random.default_rng(14)
    d = 24
    op = lr_op(random_lowrank(rng, d, 3, cond=1e3), jnp.float32)
    op_big = op._replace(basis=jnp.ldexp(op.basis, 100), scale_exp=100)
    both = jax.tree.map(lambda a, b: jnp.stack([jnp.asarray(a), jnp.asarray(b)]), op, op_big)
    u = jnp.tile(jnp.asarray(rng.normal(size=d), jnp.float32), (2, 1))
    for name in ("l2", "mixed_l1_linf"):  # the exact path and the Newton matrix (both terms)
        xs, _ = batched_prox(make(name), (4, 6), "cold")(u, jnp.ones(2, jnp.float32), both)
        assert np.all(np.isfinite(xs)), name
        np.testing.assert_allclose(xs[1], xs[0], rtol=1e-4, atol=1e-5, err_msg=name)


def test_admm_solver_agrees_with_newton():
    rng = np.random.default_rng(9)
    d = 30
    fields = random_lowrank(rng, d, 3, cond=50)
    u = rng.normal(size=d)
    with x64():
        op = lr_op(fields, jnp.float64)
        reg_n = R.l1(STRENGTH, tol=1e-10, solver="newton")
        reg_a = R.l1(STRENGTH, tol=1e-10, solver="admm")
        fn = jax.jit(lambda u, x0: reg_n.prox_with_info(u, 1.0, op, shape=(d,), x0=x0))
        fa = jax.jit(lambda u, x0: reg_a.prox_with_info(u, 1.0, op, shape=(d,), x0=x0))
        xn, _ = fn(jnp.asarray(u), jnp.zeros(d))
        xa, info = fa(jnp.asarray(u), jnp.zeros(d))
        _, info_w = fa(jnp.asarray(u), xn)
    assert float(info.residual) <= 1e-10
    assert int(info_w.iterations) < int(info.iterations)
    np.testing.assert_allclose(xa, xn, atol=1e-8)
    np.testing.assert_allclose(xn, np_reference("l1", STRENGTH, u, 1.0, fields[4], (d,)), atol=1e-8)


def test_lowrank_full_eigenbasis_like_ada_full():
    """ADA-FULL hands over V = the full d x d eigenbasis (k = n = d)."""
    rng = np.random.default_rng(10)
    d = 12
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    w = np.geomspace(1e2, 1e-2, d)
    hm = 0.1 * np.eye(d) + q @ np.diag(w) @ q.T
    u = rng.normal(size=d) * 3
    for name in ("l1", "l2"):
        with x64():
            op = LowRankOperator(jnp.asarray(0.1), jnp.asarray(q.T), jnp.eye(d), jnp.asarray(w))
            reg = make(name, tol=1e-11)
            x = np.asarray(
                jax.jit(lambda u, reg=reg, op=op: reg.prox(u, 1.0, op, shape=(d,)))(jnp.asarray(u))
            )
        ref = np_reference(name, STRENGTH, u, 1.0, hm, (d,))
        np.testing.assert_allclose(x, ref, atol=1e-8, rtol=1e-8, err_msg=name)


# --------------------------------------------------------------------------------------------------
# center form: argmin c phi(x) + 1/2 ||x - z||_H^2 with cond(H) beyond 1/eps of float32


def orthogonal_dyadic(rng, d=16):
    """An exactly orthogonal ``d x d`` matrix (d = 16) with dyadic entries, exact in float32:
    a product of signed row permutations of normalized Hadamard matrices."""
    mats = (hadamard(16) / 4.0, np.kron(np.eye(4), hadamard(4) / 2.0))
    q = np.eye(d)
    for m in mats + mats:
        q = (m[rng.permutation(d)] * rng.choice([-1.0, 1.0], d)) @ q
    return q


def ill_conditioned_center_problem(rng, cond, d=16, k=3, scalar=0.5):
    """``H = scalar I + V^T diag(w) V`` with ``cond(H) ~ cond`` whose float32 fields are exact and
    whose ``V`` is *exactly* orthonormal, so float32 and float64 solve the very same problem;
    a float32 center ``z`` with parts of similar size on the rows of ``V`` and off them.
    Returns (fields, z, v (k+1 x d, last row zero), w)."""
    v = orthogonal_dyadic(rng, d)[:k]
    p2 = 2.0 ** rng.integers(-3, 4, size=k)
    basis = np.vstack([v * p2[:, None], np.zeros((1, d))])  # coef @ basis = V, exactly
    coef = np.diag(np.append(1 / p2, 0.0))
    w = scalar * (cond - 1) * np.geomspace(1.0, 1e-2, k)
    rng.shuffle(w)
    w = np.append(w, 3.0)  # weight on the exactly-zero row: no effect
    perp = rng.normal(size=d)
    perp -= v.T @ (v @ perp)
    z = (v.T @ rng.normal(size=k) + perp).astype(np.float32)
    fields = (np.float32(scalar), basis, coef, w)
    assert all(np.all(np.asarray(f, np.float32) == f) for f in fields[1:3])
    return fields, z, np.vstack([v, np.zeros((1, d))]), w


def np_h_norm(scalar, v, w, x):
    p = v @ x
    return np.sqrt(scalar * (x @ x) + np.sum(w * p * p))


def np_center_error_bound(name, s, c, z, scalar, v, w, x, shape):
    """A float64 upper bound of ``||x - x*||_H`` for ``argmin c phi(x) + 1/2 ||x - z||_H^2``.

    Penalties: the duality gap ``F(x) - D(g)`` at ``g = B (x - z)`` (``B = W^{1/2} V``), whose
    inner minimizer is the Euclidean prox ``x' = prox_{(c/s) phi}(z - B^T g / s)``; written as
    ``c (phi(x) - phi(x')) + s/2 <x - x', x + x' - 2 z> + <g, B (x - x')>`` it does not cancel,
    and ``||x - x*||_H^2 <= 2 gap`` (1-strong convexity in the H-norm). ``l1_ball``: an element
    ``e`` of the subdifferential at ``x`` (gradient plus normal cone), ``||x - x*||_H <=
    ||e||_{H^{-1}}``; both evaluated spectrally (V has orthonormal rows).
    """
    d = z.size
    if name == "l1_ball":
        assert np.abs(x).sum() <= s * (1 + 1e-12)
        g = scalar * (x - z) + v.T @ (w * (v @ (x - z)))
        nz = x != 0
        theta = max(0.0, np.mean(-g[nz] * np.sign(x[nz]))) if nz.any() else 0.0
        if np.abs(x).sum() < s * (1 - 1e-9):
            theta = 0.0
        e = np.where(nz, g + theta * np.sign(x), np.sign(g) * np.maximum(np.abs(g) - theta, 0))
        p = v @ e
        perp = e - v.T @ p
        return np.sqrt(np.sum(p * p / (scalar + w)) + perp @ perp / scalar)
    b = np.sqrt(w)[:, None] * v
    gam = b @ (x - z)
    xp = np_prox_euclid(name, s, z - b.T @ gam / scalar, c / scalar, shape)
    gap = (
        c * (np_phi(name, s, x, shape) - np_phi(name, s, xp, shape))
        + 0.5 * scalar * (x - xp) @ (x + xp - 2 * z)
        + gam @ (b @ (x - xp))
    )
    assert gap >= -1e-12 * np_h_norm(scalar, v, w, z) ** 2 - 1e-300 * d
    return np.sqrt(2 * max(gap, 0.0))


@functools.cache
def batched_center_prox(reg, shape):
    """jit(vmap(prox)) over (z, c, op) in center form."""
    return jax.jit(
        jax.vmap(lambda z, c, op: reg.prox_with_info(None, c, op, shape=shape, center=z))
    )


CENTER_CONDS = (1e3, 1e8, 1e12)


@pytest.mark.parametrize("name", NAMES)
def test_center_form_float32_matches_float64_when_ill_conditioned(name):
    """cond(H) = 1e3, 1e8, 1e12 in float32: the center form matches float64 to rounding level.

    The problem is the prox of mirror descent, ``z`` = the unregularized step. ``u = -H z``
    loses the part of ``z`` off the rows of ``V`` to rounding once cond(H) > 1/eps (checked
    below, so the problems are hard enough); the center form never forms ``H z``.

    Tolerance: rounding ``z`` to float32 alone moves ``x*`` by up to ``eps |z| sqrt(lambda_max)``
    in the H-norm (the prox is 1-Lipschitz in the H-norm), and the solver's relative KKT
    tolerance (1e-6 by default) bounds ``||x - x*||_H <= 1e-6 ||z||_H <= 1e-6 sqrt(lambda_max)
    |z|``; we allow ``1e-5 sqrt(lambda_max) |z|`` (~80 eps; measured <= 3e-7) and, as the step
    of mirror descent is read in the Euclidean norm, ``1e-5 |z|`` there too (measured <= 5e-7;
    the u-form, having lost the part of ``z`` off the rows, is off by more than ``1e-2 |z|`` at
    1e12). The float64 reference itself is certified to
    ``1e-7 sqrt(lambda_max) |z|`` by an independent duality gap / KKT bound (the gap is known to
    rounding, so its square root resolves ~sqrt(eps64) = 1e-8, 100x below the tolerance).
    """
    rng = np.random.default_rng(20)
    shape = (4, 4) if name.startswith("mixed") else (16,)
    problems = [ill_conditioned_center_problem(rng, cd) for cd in CENTER_CONDS]
    scalar = 0.5
    c = np.full(len(CENTER_CONDS), scalar * 0.5 / STRENGTH)  # a threshold t = c/s of 0.5 / 0.7
    z32 = np.stack([p[1] for p in problems])
    reg32 = make(name)
    op32 = stack_ops([p[0] for p in problems], jnp.float32)
    x32, info32 = batched_center_prox(reg32, shape)(
        jnp.asarray(z32), jnp.asarray(c, jnp.float32), op32
    )
    u32 = jax.vmap(lambda op, z: -op.matvec(z))(op32, jnp.asarray(z32))  # the old way
    x32_u, _ = batched_prox(reg32, shape, "cold")(u32, jnp.asarray(c, jnp.float32), op32)
    with x64():
        x64_, info64 = batched_center_prox(make(name, tol=1e-12), shape)(
            jnp.asarray(z32, jnp.float64),
            jnp.asarray(c),
            stack_ops([p[0] for p in problems], jnp.float64),
        )
        x64_ = np.asarray(x64_)
    assert x32.dtype == jnp.float32 and np.all(np.isfinite(x32))
    assert np.all(np.asarray(info32.iterations) <= 30), info32.iterations
    for i, cd in enumerate(CENTER_CONDS):
        (_, _, v, w), z = problems[i], z32[i].astype(np.float64)
        ref = np.sqrt(scalar + w[:-1].max()) * np.linalg.norm(z)  # sqrt(lambda_max) |z|
        bound = np_center_error_bound(name, STRENGTH, c[i], z, scalar, v, w, x64_[i], shape)
        assert bound <= 1e-7 * ref, (cd, bound / ref)
        err = np.asarray(x32[i], np.float64) - x64_[i]
        assert np_h_norm(scalar, v, w, err) <= 1e-5 * ref, (cd, np_h_norm(scalar, v, w, err) / ref)
        assert np.linalg.norm(err) <= 1e-5 * np.linalg.norm(z), (cd, np.linalg.norm(err))
        assert np.linalg.norm(x64_[i] - z) > 0.05 * np.linalg.norm(z)  # phi matters here
        if name == "l1_ball":
            assert np.abs(np.asarray(x32[i], np.float64)).sum() <= STRENGTH * (1 + 1e-6)
        elif cd == 1e12:  # the u-form cannot be accurate here (not l1_ball: its KKT polish
            # recovers from u, as the support is tiny): u = -H z has lost the part of z off the
            # rows of V, so its step is off by about that part (small only in the H-norm).
            err_u = np.asarray(x32_u[i], np.float64) - x64_[i]
            assert np.linalg.norm(err_u) > 1e-2 * np.linalg.norm(z), np.linalg.norm(err_u)


@pytest.mark.slow  # some ten prox solves, each compiled: half a minute
def test_center_form_api():
    """center= alone, with u, on a diagonal operator; phi = 0; bad warm starts; validation."""
    rng = np.random.default_rng(21)
    fields, z, _, _ = ill_conditioned_center_problem(rng, 1e4)
    d = z.size
    u = rng.normal(size=d)
    with x64():
        op = lr_op(fields, jnp.float64)
        zz = jnp.asarray(z, jnp.float64)
        for name in NAMES:
            reg = make(name, tol=1e-12)
            shape = (4, 4) if name.startswith("mixed") else (16,)

            # A bad warm start must not matter: checked on the two Newton paths (generic and
            # l1-ball). The u/center fold happens before the dispatch, shared by every
            # regularizer: checked on the generic path.
            warm = name in ("l1", "l1_ball")
            fold = name == "l1"

            @jax.jit
            def variants(zz, u, op, reg=reg, shape=shape, warm=warm, fold=fold):
                def prox(**kw):
                    kw.setdefault("u", None)
                    return reg.prox(kw.pop("u"), 0.3, op, shape=shape, **kw)

                out = (prox(center=zz), prox(u=-op.matvec(zz)))  # u = -H z: fine in float64 here
                if warm:
                    x0 = zz + 1e6 * op.lift(jnp.ones(4, zz.dtype))  # far off, large eigenvalues
                    out += (prox(center=zz, x0=x0),)
                if fold:
                    out += (
                        prox(u=u, center=zz),  # <u, x> + c phi + 1/2 ||x - z||_H^2 ...
                        prox(center=zz - op.solve(u)),  # ... is the prox at z - H^{-1} u
                    )
                return out

            xs = variants(zz, jnp.asarray(u), op)
            np.testing.assert_allclose(xs[0], xs[1], atol=1e-8, err_msg=name)
            if warm:
                np.testing.assert_allclose(xs[2], xs[0], atol=1e-9, err_msg=name)
            if fold:
                np.testing.assert_allclose(xs[3], xs[4], atol=1e-12, err_msg=name)
        # phi switched off: exactly the center
        np.testing.assert_array_equal(R.l1(0.0).prox(None, 2.0, op, shape=(d,), center=zz), zz)
        np.testing.assert_array_equal(
            R.l2_squared(0.5).prox(None, 0.0, op, shape=(d,), center=zz), zz
        )
        # diagonal operator: u = -h z per coordinate
        h = jnp.asarray(np.exp(rng.normal(size=d)))
        for name in NAMES:
            reg = make(name)
            shape = (4, 4) if name.startswith("mixed") else (16,)
            diag = DiagonalOperator(h)
            both = jax.jit(
                lambda zz, reg=reg, shape=shape, diag=diag: (
                    reg.prox(None, 0.3, diag, shape=shape, center=zz),
                    reg.prox(-diag.diag * zz, 0.3, diag, shape=shape),
                )
            )
            np.testing.assert_allclose(*both(zz), rtol=1e-14, atol=1e-15, err_msg=name)
    # float32 in, float32 out; shape of the center is kept
    x = R.l1(0.1).prox(None, 1.0, lr_op(fields, jnp.float32), shape=(4, 4), center=z.reshape(4, 4))
    assert x.dtype == jnp.float32 and x.shape == (4, 4)
    with pytest.raises(ValueError, match="center"):
        R.l1(0.1).prox(None, 1.0, DiagonalOperator(jnp.ones(3)), shape=(3,))
    with pytest.raises(ValueError, match="center has 4"):
        R.l1(0.1).prox(None, 1.0, DiagonalOperator(jnp.ones(3)), shape=(3,), center=jnp.ones(4))


@pytest.mark.parametrize("solver", ["admm", "newton"])
def test_center_form_admm_and_warm_start(solver):
    """ADMM solves the center form without forming H z, and agrees with Newton."""
    rng = np.random.default_rng(22)
    fields, z, v, w = ill_conditioned_center_problem(rng, 1e3)
    with x64():
        op = lr_op(fields, jnp.float64)
        zz = jnp.asarray(z, jnp.float64)
        reg = R.l1(STRENGTH, tol=1e-11, solver=solver)
        x, info = reg.prox_with_info(None, 0.3, op, shape=(16,), center=zz)
        assert float(info.residual) <= 1e-11
        _, info_w = reg.prox_with_info(None, 0.3, op, shape=(16,), center=zz, x0=x)
    assert int(info_w.iterations) <= (10 if solver == "admm" else 1)
    x = np.asarray(x)
    bound = np_center_error_bound("l1", STRENGTH, 0.3, z.astype(np.float64), 0.5, v, w, x, (16,))
    assert bound <= 1e-8 * np_h_norm(0.5, v, w, z.astype(np.float64))


@pytest.mark.parametrize("rule", ["mirror_descent", "dual_averaging"])
def test_ada_fd_l1_step_stays_bounded_at_huge_gradient_scales(rule):
    """ADA-FD + l1 with gradients of size 1, 1e10, 1e20, 1e30 (float32): cond(H) ~ |g| / delta.

    The regularized step may differ from the unregularized one (same metric state, same params)
    only by the prox's shrinkage ``x* - z = -c H^{-1} xi`` (``|xi|_inf <= strength``), i.e. by at
    most ``c * strength * sqrt(d) / delta`` in the Euclidean norm, plus rounding of the
    parameters themselves. Forming ``u = eta g - H x_t`` broke this by 1e19x at 1e10 and gave
    NaN beyond. (The unregularized float32 step itself is only accurate to ``~eps eta |g| /
    delta`` here, and FD's dropped directions get steps ``eta / delta * g_perp``: neither is
    O(eta) at these scales, even in float64 for the latter.)
    """
    eta, delta, lam, tau = 0.1, 0.1, 1e-2, 3
    if rule == "mirror_descent":
        tx = so.ada_fd(eta, tau, delta, regularizer=R.l1(lam), robust=False)
        tx0 = so.ada_fd(eta, tau, delta, robust=False)
    else:
        tx = so.ada_fd_dual_averaging(eta, tau, delta, regularizer=R.l1(lam), robust=False)
        tx0 = so.ada_fd_dual_averaging(eta, tau, delta, robust=False)
    update, update0 = jax.jit(tx.update), jax.jit(tx0.update)
    eps = float(jnp.finfo(jnp.float32).eps)
    for scale in (1.0, 1e10, 1e20, 1e30):
        params = {"m": jnp.linspace(-1.0, 2.0, 12).reshape(3, 4), "v": jnp.linspace(0.5, -0.5, 5)}
        state, state0 = tx.init(params), tx0.init(params)
        for step in range(4):
            keys = jax.random.split(jax.random.PRNGKey(step), 2)
            leaves, treedef = jax.tree.flatten(params)
            grads = treedef.unflatten(
                [
                    scale * jax.random.normal(k, jnp.shape(p))
                    for k, p in zip(keys, leaves, strict=True)
                ]
            )
            with jax.debug_nans(True):
                upd, state = update(grads, state, params)
                upd0, state0 = update0(grads, state0, params)
            new = jax.tree.map(lambda a, b: a + b, params, upd)
            c = eta * (1 if rule == "mirror_descent" else step + 1)
            for key in params:
                a, a0 = (np.asarray(t[key], np.float64).ravel() for t in (upd, upd0))
                xs = (np.asarray(t[key], np.float64) for t in (params, new))
                assert np.all(np.isfinite(a)), (scale, step, key)
                size = a.size
                rounding = 64 * eps * np.sqrt(size) * sum(np.max(np.abs(x)) for x in xs)
                bound = 1.01 * c * lam * np.sqrt(size) / delta + rounding
                assert np.linalg.norm(a - a0) <= bound, (scale, step, key, np.linalg.norm(a - a0))
            params = new
        assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves((params, state)))


# --------------------------------------------------------------------------------------------------
# Euclidean proxes and values


@pytest.mark.parametrize("name", NAMES)
def test_prox_euclidean(name):
    rng = np.random.default_rng(11)
    shape = shape_for(name)
    v = rng.normal(size=shape) * 2
    t = 0.6
    with x64():
        x = np.asarray(make(name).prox_euclidean(jnp.asarray(v), t, shape=shape))
    assert x.shape == shape
    ref = np_prox_euclid(name, STRENGTH, v.ravel(), t, shape).reshape(shape)
    np.testing.assert_allclose(x, ref, atol=1e-12)


def test_prox_euclidean_special_cases():
    v = jnp.array([3.0, -1.0, 0.5, -0.2])
    mat = jnp.array([[3.0, 4.0], [0.3, 0.4]])

    @jax.jit
    def all_cases(v, mat):
        return (
            R.l1(1.0).prox_euclidean(v, 0.5, shape=(4,)),
            R.l2(1.0).prox_euclidean(v, 10.0, shape=(4,)),
            R.l1_ball(2.0).prox_euclidean(v, 1.0, shape=(4,)),
            R.linf(1.0).prox_euclidean(v, 2.0, shape=(4,)),
            R.linf(1.0).prox_euclidean(v, 10.0, shape=(4,)),
            R.mixed_l1_l2(1.0).prox_euclidean(mat, 1.0, shape=(2, 2)),
            R.mixed_l1_l2(1.0).prox_euclidean(mat.ravel(), 1.0, shape=(2, 2)),
        )

    soft, group, ball, linf, linf0, mixed, mixed_flat = all_cases(v, mat)
    np.testing.assert_allclose(soft, [2.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(group, 0.0)
    np.testing.assert_allclose(ball, [2.0, 0.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(linf + ball, v, atol=1e-6)  # Moreau: prox_{t linf} + P_{l1(t)} = id
    np.testing.assert_allclose(linf0, 0.0)
    # mixed norms work row by row; a flat v with a 2-D shape is returned flat
    np.testing.assert_allclose(mixed, [[2.4, 3.2], [0.0, 0.0]], atol=1e-6)
    assert mixed_flat.shape == (4,)


def test_values():
    x = jnp.array([[3.0, -4.0], [0.0, 1.0]])
    np.testing.assert_allclose(R.l1(2.0).value(x), 16.0)
    np.testing.assert_allclose(R.l2_squared(2.0).value(x), 26.0)
    np.testing.assert_allclose(R.l2(2.0).value(x), 2 * np.sqrt(26.0), rtol=1e-6)
    np.testing.assert_allclose(R.linf(2.0).value(x), 8.0)
    np.testing.assert_allclose(R.mixed_l1_l2(2.0).value(x), 12.0)
    np.testing.assert_allclose(R.mixed_l1_linf(2.0).value(x), 10.0)
    # not 2-D: one row
    np.testing.assert_allclose(R.mixed_l1_l2(2.0).value(x.ravel()), 2 * np.sqrt(26.0), rtol=1e-6)
    np.testing.assert_allclose(R.mixed_l1_linf(2.0).value(x.ravel()), 8.0)
    assert R.l1_ball(8.0).value(x) == 0.0
    assert R.l1_ball(7.9).value(x) == np.inf
    for name in NAMES:
        assert make(name).value(jnp.zeros((0,))) == 0.0
        if name not in ("l2_squared", "l1_ball"):  # (1e30)^2 overflows float32 by definition
            assert np.isfinite(make(name).value(jnp.full((3,), 1e30, jnp.float32)))


# --------------------------------------------------------------------------------------------------
# JAX transforms, robustness, API


def test_jit_vmap_over_u_and_c_with_shared_operator():
    rng = np.random.default_rng(12)
    d = 16
    op = lr_op(random_lowrank(rng, d, 3, cond=100), jnp.float32)
    u = jnp.asarray(rng.normal(size=(4, d)), jnp.float32)
    c = jnp.asarray([0.0, 0.5, 1.0, 2.0], jnp.float32)
    reg = R.l1(STRENGTH)
    xs = jax.jit(jax.vmap(lambda u, c: reg.prox(u, c, op, shape=(4, 4))))(u, c)
    assert xs.shape == (4, d) and xs.dtype == jnp.float32
    single = jax.jit(lambda u, c: reg.prox(u, c, op, shape=(4, 4)))
    for i in range(4):
        np.testing.assert_allclose(xs[i], single(u[i], c[i]), atol=1e-5)


def _degenerate_ops(rng, d):
    """A well-posed low-rank operator and an all-zero sketch (batched), and two diagonals."""
    n = min(d, 2)
    basis = np.linalg.qr(rng.normal(size=(d, n)))[0].T if d else np.zeros((n, 0))
    lowrank = LowRankOperator(
        jnp.asarray([0.5, 1e-3], jnp.float32),
        jnp.asarray(np.stack([basis, np.zeros_like(basis)]), jnp.float32),
        jnp.asarray(np.stack([np.eye(n), np.zeros((n, n))]), jnp.float32),
        jnp.asarray([np.full(n, 1e3), np.zeros(n)], jnp.float32),
        scale_exp=jnp.zeros(2, jnp.int32),
        value_exp=jnp.zeros(2, jnp.int32),
    )
    diag = DiagonalOperator(jnp.asarray([np.zeros(d), np.full(d, 1e-3)], jnp.float32))
    return lowrank, diag


@pytest.mark.parametrize("name", NAMES)
def test_no_nan_on_degenerate_inputs(name):
    """Zero u, zero operators, size-0 and scalar leaves, 1e30 magnitudes: finite outputs."""
    reg = make(name)
    rng = np.random.default_rng(13)
    us_all = np.stack([np.zeros(6), np.full(6, 1e30), np.full(6, -1e-30), rng.normal(size=6)])
    cs = jnp.asarray([0.0, 1.0, 1e30, 1.0], jnp.float32)
    for shape in [(0,), (), (2, 3)]:
        d = int(np.prod(shape))
        lowrank, diag = _degenerate_ops(rng, d)
        # every (operator, u, c) combination as one flat batch
        # the low-rank path: once per code path of the Euclidean prox (l2, l2_squared are exact)
        lr_names = ("l1", "l2", "l2_squared", "l1_ball", "mixed_l1_linf")
        ops = [lowrank, diag] if d == 6 and name in lr_names else [diag]
        for op in ops:
            ob = jax.tree.map(lambda a: jnp.repeat(a, 4, axis=0), op)
            ub = jnp.asarray(np.tile(us_all[:, :d], (2, 1)), jnp.float32)
            if isinstance(op, DiagonalOperator):
                ub = ub * (ob.diag > 0)  # the contract: u = 0 where h = 0
            f = jax.jit(jax.vmap(lambda u, c, op, shape=shape: reg.prox(u, c, op, shape=shape)))
            xs = f(ub, jnp.tile(cs, 2), ob)
            assert xs.shape == (8, d) and xs.dtype == jnp.float32
            assert np.all(np.isfinite(xs)), (shape, type(op).__name__)
            if isinstance(op, DiagonalOperator):
                assert np.all(xs[:4] == 0.0)
        assert np.all(np.isfinite(reg.prox_euclidean(jnp.zeros(shape), 0.0, shape=shape)))


def test_dtype_follows_u():
    op = DiagonalOperator(jnp.ones(3))
    u = jnp.ones(3, jnp.bfloat16)
    assert R.l1(0.1).prox(u, 1.0, op, shape=(3,)).dtype == jnp.bfloat16
    with x64():
        u64 = jnp.ones(3, jnp.float64)
        lr = LowRankOperator(
            jnp.float32(1.0),
            jnp.eye(3, dtype=jnp.float32)[:1],
            jnp.ones((1, 1), jnp.float32),
            jnp.ones(1, jnp.float32),
        )
        assert R.l2_squared(0.1).prox(u64, 1.0, lr, shape=(3,)).dtype == jnp.float64


@pytest.mark.parametrize(
    "ctor, args, kwargs, match",
    [
        (R.l1, (-1.0,), {}, "strength"),
        (R.l2, (float("nan"),), {}, "strength"),
        (R.linf, (float("inf"),), {}, "strength"),
        (R.l2_squared, (True,), {}, "strength"),
        (R.mixed_l1_l2, ("a",), {}, "strength"),
        (R.l1_ball, (-2.0,), {}, "radius"),
        (R.l1, (1.0,), {"tol": 0.0}, "tol"),
        (R.l1, (1.0,), {"tol": 1.0}, "tol"),
        (R.l1, (1.0,), {"max_iter": 0}, "max_iter"),
        (R.l1, (1.0,), {"max_iter": 2.5}, "max_iter"),
        (R.mixed_l1_linf, (1.0,), {"solver": "lbfgs"}, "solver"),
    ],
)
def test_validation(ctor, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ctor(*args, **kwargs)


def test_immutable_hashable_and_api():
    reg = R.l1(0.5, tol=1e-7, max_iter=10)
    assert reg == R.l1(0.5, tol=1e-7, max_iter=10)
    hash(reg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        reg.strength = 1.0
    assert R.l1_ball(3.0).radius == 3.0
    assert set(R.__all__) >= {
        "l1",
        "l2_squared",
        "l2",
        "linf",
        "l1_ball",
        "mixed_l1_l2",
        "mixed_l1_linf",
    }
    with pytest.raises(TypeError):
        reg.prox(jnp.ones(2), 1.0, jnp.eye(2), shape=(2,))
    with pytest.raises(ValueError, match="entries"):
        reg.prox(jnp.ones(3), 1.0, DiagonalOperator(jnp.ones(3)), shape=(2,))
