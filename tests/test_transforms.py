"""Tests of sketchopt.transforms: the mirror-descent and dual-averaging rules and their aliases.

The float64 NumPy references below are written from the papers, independently of the JAX code:

* composite mirror descent without a regularizer, ``x_{t+1} = x_t - eta H_t^{-1} g_t`` (Duchi et
  al. eq. 4; Ada-FD Alg. 2, eq. 7), and dual averaging anchored at ``x_1``,
  ``x_{t+1} = x_1 - eta H_t^{-1} sum_{s<=t} g_s`` (Duchi et al. eq. 3; Ada-FD Alg. 1, eq. 6);
* ``H_t`` of ADA-DIAG / ADA-FULL from the gradients (ADA-FULL's root from the SVD of the stacked
  gradients), and of ADA-FD from the literal FD / RFD algorithms with an SVD of the sketch at every
  step (RFD paper Alg. 1/2/4/5), applied as in Ada-FD eq. 6/7:
  ``H^{-1} y = (y - V (c I + S')^{-1} S' V^T y) / c`` with ``c = delta (+ sqrt(alpha))``.

The regret bounds of Ada-FD Theorems 1-3 (= Duchi et al. Theorem 8 for ADA-FULL) are checked on an
online absolute-loss regression stream (Ada-FD sec. 4.1, small), with every quantity in them
computed from the run.
"""

from __future__ import annotations

import contextlib
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sketchopt as so
from sketchopt import metrics, sketches

# --------------------------------------------------------------------------------------------
# float64 NumPy references.


class RefDiag:
    """ADA-DIAG: ``H = delta I + diag(sum_s g_s^2)^{1/2}``."""

    def __init__(self, d):
        self.sumsq = np.zeros(d)

    def update(self, g):
        self.sumsq = self.sumsq + g**2

    def solve(self, delta, y):
        return y / (delta + np.sqrt(self.sumsq))

    def matrix(self, delta):
        return np.diag(delta + np.sqrt(self.sumsq))


class RefFull:
    """ADA-FULL: ``H = delta I + G^{1/2}``, ``G^{1/2} = V^T diag(s) V`` from ``svd([g_1; ...])``."""

    def __init__(self, d):
        self.d, self.rows = d, np.zeros((0, d))

    def update(self, g):
        self.rows = np.vstack([self.rows, g[None]])

    def solve(self, delta, y):
        _, s, vt = np.linalg.svd(self.rows, full_matrices=True)  # complete eigenbasis of G
        lam = delta + np.pad(s, (0, self.d - s.size))
        return vt.T @ ((vt @ y) / lam)

    def matrix(self, delta):
        _, s, vt = np.linalg.svd(self.rows, full_matrices=True)
        return (vt.T * (delta + np.pad(s, (0, self.d - s.size)))) @ vt


class RefFD:
    """FD (RFD paper Alg. 1; Ada-FD Alg. 1/2 lines 4-6), fast FD (Alg. 4), RFD (Alg. 2), fast
    RFD (Alg. 5); ``fraction`` of each shrinkage goes to ``alpha`` (1/2 RFD, 1 S-AdaGrad).

    ``rows`` are the rows of the sketch that can be non-zero. A shrink takes the SVD of
    ``[rows; g]`` and subtracts ``sigma_tau^2`` (0 while there are fewer than ``tau`` singular
    values: the zero rows of the paper's ``tau x d`` sketch) from the top ``tau - 1`` squared
    singular values.
    """

    def __init__(self, d, tau, *, fast=False, fraction=0.0):
        self.d, self.tau, self.fast, self.fraction = d, tau, fast, fraction
        self.rows, self.alpha, self.shrinkage = np.zeros((0, d)), 0.0, []

    def update(self, g):
        tau = self.tau
        bhat = np.vstack([self.rows, g[None]])  # insert g_t as the last row
        if self.fast and bhat.shape[0] < 2 * tau:
            self.rows = bhat
            self.shrinkage.append(0.0)
            return
        _, s, vt = np.linalg.svd(bhat, full_matrices=False)
        s2 = np.zeros(max(tau, s.size))
        s2[: s.size] = s**2
        sigma = s2[tau - 1]  # sigma_t = Sigma_{tau tau}^2
        k = min(tau - 1, s.size)
        self.rows = np.sqrt(np.maximum(s2[:k] - sigma, 0))[:, None] * vt[:k]  # S_t = Sigma' V^T
        self.alpha += self.fraction * sigma
        self.shrinkage.append(sigma)

    def solve(self, delta, y):
        """Ada-FD eq. 6/7: ``(y - V (c I + S')^{-1} S' V^T y) / c`` from the sketch's SVD, with
        ``S' = (Sigma^2 + alpha)^{1/2} - alpha^{1/2}`` and ``c = delta + alpha^{1/2}`` for RFD."""
        if self.rows.shape[0] == 0:
            return y / (delta + np.sqrt(self.alpha))
        _, s, vt = np.linalg.svd(self.rows, full_matrices=False)
        root = np.sqrt(self.alpha)
        c, w = delta + root, np.sqrt(s**2 + self.alpha) - root
        return (y - vt.T @ (w / (c + w) * (vt @ y))) / c

    def matrix(self, delta):
        """``delta I + (S^T S + alpha I)^{1/2}`` from the sketch's SVD."""
        root = np.sqrt(self.alpha)
        if self.rows.shape[0] == 0:
            return (delta + root) * np.eye(self.d)
        _, s, vt = np.linalg.svd(self.rows, full_matrices=False)
        w = np.sqrt(s**2 + self.alpha) - root
        return (delta + root) * np.eye(self.d) + (vt.T * w) @ vt


# Regularizers phi and their proximal steps ``argmin_x <u, x> + c phi(x) + 1/2 <x, H x>``.


def _rows_view(x, shape):
    """Rows of a 2-D leaf; any other leaf is one row (the mixed norms of Duchi et al. sec. 6.6)."""
    return x.reshape(shape if len(shape) == 2 else (1, -1))


def project_l1_ball(v, radius):
    """Euclidean projection onto ``{||x||_1 <= radius}`` (sort-based, Duchi et al. 2008)."""
    if np.sum(np.abs(v)) <= radius:
        return v.copy()
    a = np.sort(np.abs(v))[::-1]
    cums = np.cumsum(a) - radius
    k = np.nonzero(a - cums / np.arange(1, a.size + 1) > 0)[0][-1]
    theta = cums[k] / (k + 1)
    return np.sign(v) * np.maximum(np.abs(v) - theta, 0)


def _prox_l2(v, t):
    n = np.linalg.norm(v)
    return v * max(0.0, 1 - t / n) if n > 0 else v * 0


def _prox_linf(v, t):
    return v - project_l1_ball(v, t)  # Moreau: the dual norm's ball


class RefReg:
    """A regularizer by its value and Euclidean prox ``prox_{t phi}`` (from the definitions)."""

    def __init__(self, name, strength):
        self.name, self.s = name, strength

    def value(self, x, shape):
        s, rows = self.s, _rows_view(x, shape)
        return {
            "l1": lambda: s * np.sum(np.abs(x)),
            "l2_squared": lambda: s / 2 * np.sum(x**2),
            "l2": lambda: s * np.linalg.norm(x),
            "linf": lambda: s * np.max(np.abs(x), initial=0),
            "l1_ball": lambda: 0.0 if np.sum(np.abs(x)) <= s * (1 + 1e-12) else np.inf,
            "mixed_l1_l2": lambda: s * np.sum(np.linalg.norm(rows, axis=1)),
            "mixed_l1_linf": lambda: s * np.sum(np.max(np.abs(rows), axis=1)),
        }[self.name]()

    def euclid(self, v, t, shape):
        ts = t * self.s
        if self.name == "l1":
            return np.sign(v) * np.maximum(np.abs(v) - ts, 0)
        if self.name == "l2_squared":
            return v / (1 + ts)
        if self.name == "l2":
            return _prox_l2(v, ts)
        if self.name == "linf":
            return _prox_linf(v, ts)
        if self.name == "l1_ball":
            return project_l1_ball(v, self.s)
        rows = _rows_view(v, shape)
        row_prox = _prox_l2 if self.name == "mixed_l1_l2" else _prox_linf
        return np.concatenate([row_prox(r, ts) for r in rows])

    def prox(self, u, c, h, shape):
        """``argmin_x <u, x> + c phi(x) + 1/2 <x, H x>`` by restarted FISTA run to machine
        precision (the problem is ``lambda_min(H)``-strongly convex, so it converges
        linearly); the closed forms of Duchi et al. eq. 22/24/25 for a diagonal ``H``."""
        if self.name == "l1" and np.count_nonzero(h - np.diag(np.diag(h))) == 0:
            hd = np.diag(h)  # eq. (22) / (24): x_i = -sign(u_i) [|u_i| - c s]_+ / H_ii
            return -np.sign(u) * np.maximum(np.abs(u) - c * self.s, 0) / hd
        if self.name == "l2_squared":  # eq. (25) generalized: (H + c s I) x = -u
            return np.linalg.solve(h + c * self.s * np.eye(u.size), -u)
        step = 1 / np.linalg.eigvalsh(h)[-1]
        x = y = self.euclid(np.linalg.solve(h, -u), c * step, shape)
        momentum, res = 1.0, np.inf
        for _ in range(20000):
            x_new = self.euclid(y - step * (u + h @ y), c * step, shape)
            res = np.linalg.norm(x_new - x)
            if (x_new - x) @ (y - x_new) > 0:  # restart (O'Donoghue & Candes)
                momentum, y = 1.0, x_new
            else:
                m_new = (1 + np.sqrt(1 + 4 * momentum**2)) / 2
                y = x_new + (momentum - 1) / m_new * (x_new - x)
                momentum = m_new
            x = x_new
            if res <= 1e-15 * max(1.0, np.linalg.norm(x)):
                break
        assert res <= 1e-13 * max(1.0, np.linalg.norm(x)), res
        return x


REFERENCES = {
    "diag": RefDiag,
    "full": RefFull,
    "fd": lambda d, tau: RefFD(d, tau),
    "fast_fd": lambda d, tau: RefFD(d, tau, fast=True),
    "rfd": lambda d, tau: RefFD(d, tau, fraction=0.5),
    "fast_rfd": lambda d, tau: RefFD(d, tau, fast=True, fraction=0.5),
    "s_adagrad": lambda d, tau: RefFD(d, tau, fraction=1.0),
}


def make_ref(kind, d, tau):
    return REFERENCES[kind](d) if kind in ("diag", "full") else REFERENCES[kind](d, tau)


def make_tx(kind, rule, lr, delta, tau=3, regularizer=None):
    """The named alias for (metric kind, rule)."""
    kw = {} if regularizer is None else {"regularizer": regularizer}
    if kind == "diag":
        f = so.ada_diag if rule == "md" else so.ada_diag_dual_averaging
        return f(lr, delta, **kw)
    if kind == "full":
        f = so.ada_full if rule == "md" else so.ada_full_dual_averaging
        return f(lr, delta, **kw)
    if kind == "s_adagrad":
        if rule == "md":
            return so.s_adagrad(lr, tau, delta, **kw)
        sketch = sketches.robust_frequent_directions(tau, alpha_fraction=1.0)
        return so.dual_averaging(lr, metrics.sketched(sketch, delta), regularizer)
    f = so.ada_fd if rule == "md" else so.ada_fd_dual_averaging
    return f(lr, tau, delta, robust="rfd" in kind, fast=kind.startswith("fast"), **kw)


KINDS = ["diag", "full", "fd", "fast_fd", "rfd", "fast_rfd", "s_adagrad"]
RULES = ["md", "da"]

# --------------------------------------------------------------------------------------------
# Harness: online least squares on a two-leaf pytree; the gradient depends on the parameters.

SHAPES = {"b": (3,), "w": (2, 4)}  # flat order: b then w (the pytree's leaf order)
DIM = 11


def x64(enabled):
    """float64 runs enable x64 only inside this context, so other tests are unaffected."""
    return jax.enable_x64(True) if enabled else contextlib.nullcontext()


def make_stream(steps, seed=0, dim=DIM):
    """Rows with a decaying spectrum and a non-zero mean (as Ada-FD sec. 4.1), so that the FD
    sketches do shrink; targets from a fixed regressor plus noise."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(dim, dim)) * (0.55 ** np.arange(dim))[None, :]
    z = rng.normal(size=(steps, dim)) @ mix.T + 0.5
    y = z @ rng.normal(size=dim) + 0.1 * rng.normal(size=steps)
    return z, y


def to_tree(flat, dtype=None):
    out, i = {}, 0
    for key, shape in SHAPES.items():
        size = int(np.prod(shape))
        out[key] = jnp.asarray(np.reshape(flat[i : i + size], shape), dtype)
        i += size
    return out


def split(flat):
    out, i = {}, 0
    for key, shape in SHAPES.items():
        size = int(np.prod(shape))
        out[key] = flat[i : i + size]
        i += size
    return out


def flat_of(tree):
    return jnp.concatenate([jnp.ravel(tree[k]) for k in SHAPES])


def lsq_grad(flat, z, y):
    """Gradient of ``1/2 (z . x - y)^2`` (works on NumPy and JAX arrays)."""
    return z * (z @ flat - y)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _scan(tx, params, z, y, repeat=1, hook=None):
    """The whole online run in one compiled scan. Each step feeds the same gradient ``repeat``
    times (for ``MultiSteps``); ``hook(state, t)`` may edit the state before the step."""

    def body(carry, tzy):
        params, state = carry
        t, zt, yt = tzy
        if hook is not None:
            state = hook(state, t)
        grads = to_tree(lsq_grad(flat_of(params), zt, yt))
        for _ in range(repeat):
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        return (params, state), flat_of(params)

    return jax.lax.scan(body, (params, tx.init(params)), (jnp.arange(len(y)), z, y))


def run_tx(tx, x0, z, y, dtype=None, repeat=1, hook=None):
    """Jitted run of ``tx`` on the stream; returns ``(trajectory (T, DIM), final state)``."""
    params = to_tree(x0, dtype)
    z, y = jnp.asarray(z, dtype), jnp.asarray(y, dtype)
    (params, state), traj = _scan(tx, params, z, y, repeat, hook)
    return np.asarray(traj, np.float64), state


def reference_run(
    kind, rule, x0, z, y, lr, delta, tau=3, *, clip=None, flat=False, per_leaf=None, reg=None
):
    """Float64 reference run, block-diagonal over the leaves ``b`` and ``w`` (one block over the
    whole vector with ``flat=True``); ``lr(count)`` with ``count = t - 1``. ``clip`` scales each
    gradient to global norm at most ``clip`` first. ``per_leaf`` maps a leaf to its own
    ``(kind, lr, delta)`` (mirror descent, as ``optax.partition``)."""
    x0 = np.array(x0, np.float64)
    blocks = {"all": x0} if flat else split(x0)
    specs = {k: per_leaf[k] if per_leaf else (kind, lr, delta) for k in blocks}
    refs = {k: make_ref(specs[k][0], v.size, tau) for k, v in blocks.items()}
    anchor = {k: v.copy() for k, v in blocks.items()}
    gsum = {k: np.zeros_like(v) for k, v in blocks.items()}
    traj, problems, last_prox = [], [], {}
    for t in range(len(y)):
        x = np.concatenate(list(blocks.values()))
        g = lsq_grad(x, z[t], y[t])
        if clip is not None:
            g = g * min(1.0, clip / np.linalg.norm(g))
        g = {"all": g} if flat else split(g)
        for k in blocks:
            _, lr_k, delta_k = specs[k]
            eta = lr_k(t)
            refs[k].update(g[k])
            if reg is not None:  # Duchi et al. sec. 6, eq. (21)
                h = refs[k].matrix(delta_k)
                if rule == "md":
                    u, c = eta * g[k] - h @ blocks[k], eta
                else:
                    gsum[k] = gsum[k] + g[k]
                    u, c = eta * gsum[k] - h @ anchor[k], eta * (t + 1)
                blocks[k] = reg.prox(u, c, h, SHAPES[k])
                last_prox[k] = (u, c, h)
            elif rule == "md":
                blocks[k] = blocks[k] - eta * refs[k].solve(delta_k, g[k])
            else:
                gsum[k] = gsum[k] + g[k]
                blocks[k] = anchor[k] - eta * refs[k].solve(delta_k, gsum[k])
        traj.append(np.concatenate(list(blocks.values())))
        problems.append(dict(last_prox))
    if reg is not None:
        return np.array(traj), problems
    return np.array(traj), refs


def relerr(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


X0 = np.random.default_rng(100).normal(scale=0.5, size=DIM)  # a non-zero x_1

# --------------------------------------------------------------------------------------------
# Step-by-step agreement with the float64 references.


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_float64_reference_step_by_step(kind, rule):
    steps, lr, delta = 40, 0.1, 0.5
    z, y = make_stream(steps, seed=1)
    with x64(True):
        traj, state = run_tx(make_tx(kind, rule, lr, delta), X0, z, y, jnp.float64)
    want, refs = reference_run(kind, rule, X0, z, y, lambda c: lr, delta)
    assert np.max(np.abs(want)) < 20  # a stable run: the comparison is meaningful
    for t in range(steps):
        assert relerr(traj[t], want[t]) < 1e-9, (t, relerr(traj[t], want[t]))
    assert int(state.nonfinite_count) == 0
    if isinstance(refs["w"], RefFD):  # the sketch shrank (not the exact regime)
        assert max(refs["w"].shrinkage) > 1e-2 and max(refs["b"].shrinkage) > 1e-2


@pytest.mark.parametrize("kind, rule", [("fd", "md"), ("full", "da")])
def test_matches_reference_with_a_schedule(kind, rule):
    steps = 30

    def schedule(count):  # any callable of the step count (int32 / 5 would be float32)
        return 0.2 * 0.7 ** (count.astype(jnp.float64) / 5)

    z, y = make_stream(steps, seed=2)
    with x64(True):
        traj, _ = run_tx(make_tx(kind, rule, schedule, 0.5), X0, z, y, jnp.float64)
    want, _ = reference_run(kind, rule, X0, z, y, lambda c: 0.2 * 0.7 ** (c / 5), 0.5)
    assert relerr(traj, want) < 1e-9


@pytest.mark.parametrize("rule", ["da"])
def test_matches_reference_in_float32(rule):
    steps = 30
    z, y = make_stream(steps, seed=3)
    traj, _ = run_tx(make_tx("fd", rule, 0.1, 0.5), X0, z, y, jnp.float32)
    want, _ = reference_run("fd", rule, X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj, want) < 1e-4


def test_dual_averaging_is_anchored_at_the_initial_params():
    """``x_{t+1} = x_1 - eta H_t^{-1} sum g``: with zero gradients the params return to ``x_1``
    whatever they were moved to, and the update never depends on the current params."""
    tx = so.ada_fd_dual_averaging(0.1, 3, 0.5, robust=False)
    x1 = jnp.asarray([1.0, -2.0, 0.5])
    state = tx.init(x1)
    g = jnp.asarray([0.3, 0.1, -0.2])
    update = jax.jit(tx.update)
    u1, s1 = update(g, state, x1)
    u2, s2 = update(g, state, x1 + 7.0)  # different current params, same state
    np.testing.assert_allclose(x1 + u1, x1 + 7.0 + u2, rtol=1e-6)
    chex.assert_trees_all_equal(s1, s2)
    u3, _ = update(jnp.zeros(3), s1, jnp.asarray([5.0, 5.0, 5.0]))
    np.testing.assert_allclose(5.0 + u3, x1 + u1, rtol=1e-6)  # zero g: x_{t+1} = x_{t}'s target


# --------------------------------------------------------------------------------------------
# Exactness: ADA-FD with tau > d is ADA-FULL.


@pytest.mark.parametrize("rule, variant", [("md", {}), ("da", {"robust": True, "fast": True})])
def test_ada_fd_with_tau_above_d_equals_ada_full(rule, variant):
    """Against the ADA-FULL reference (and ADA-FULL itself matches it, see above)."""
    steps, lr, delta = 30, 0.1, 0.5
    z, y = make_stream(steps, seed=4)
    fd = so.ada_fd if rule == "md" else so.ada_fd_dual_averaging
    with x64(True):
        traj_fd, state = run_tx(fd(lr, DIM + 1, delta, **variant), X0, z, y, jnp.float64)
    traj_full, _ = reference_run("full", rule, X0, z, y, lambda c: lr, delta)
    assert relerr(traj_fd, traj_full) < 1e-9
    if variant.get("robust"):  # no shrinkage ever happens, so alpha stays 0
        assert all(np.all(np.asarray(a) == 0.0) for a in jax.tree.leaves(state.metric_state.alpha))


def test_ada_fd_equals_ada_full_until_the_sketch_fills():
    """FD is exact while fewer than ``tau`` rows have arrived (``tau - 1`` per step kept)."""
    tau, steps = 6, 5  # the 8-dim leaf w sees 5 < tau rows; b (3-dim) has tau > d
    z, y = make_stream(steps, seed=5)
    with x64(True):
        traj_fd, _ = run_tx(
            so.ada_fd_dual_averaging(0.1, tau, 0.5, robust=False), X0, z, y, jnp.float64
        )
    traj_full, _ = reference_run("full", "da", X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj_fd, traj_full) < 1e-9


def test_generic_rules_with_the_metrics_are_the_aliases():
    """``mirror_descent``/``dual_averaging`` with a metric follow the references the aliases do."""
    z, y = make_stream(12, seed=6)
    fd3 = sketches.frequent_directions(3)
    cases = [
        ("fd", "md", so.mirror_descent(0.1, metrics.sketched(fd3, 0.5))),
        ("diag", "da", so.dual_averaging(0.1, metrics.diagonal(0.5))),
    ]
    for kind, rule, generic in cases:
        with x64(True):
            traj, _ = run_tx(generic, X0, z, y, jnp.float64)
        want, _ = reference_run(kind, rule, X0, z, y, lambda c: 0.1, 0.5)
        assert relerr(traj, want) < 1e-9


@pytest.mark.parametrize(
    "kind, scale_by",
    [
        ("fast_rfd", lambda: so.scale_by_ada_fd(3, 0.5, robust=True, fast=True)),
        ("full", lambda: so.scale_by_ada_full(0.5)),
        ("diag", lambda: so.scale_by_ada_diag(0.5)),
    ],
)
def test_scale_by_preconditioner_with_learning_rate_is_the_alias(kind, scale_by):
    """``chain(scale_by_ada_*, scale_by_learning_rate(lr))`` is mirror descent with ``lr``."""
    z, y = make_stream(15, seed=7)
    with x64(True):
        chained = optax.chain(scale_by(), optax.scale_by_learning_rate(0.1))
        traj, state = run_tx(chained, X0, z, y, jnp.float64)
    want, _ = reference_run(kind, "md", X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj, want) < 1e-9
    assert int(state[0].count) == 15


# --------------------------------------------------------------------------------------------
# Regret bounds (Ada-FD Theorems 1-3; Duchi et al. Theorem 8) on online absolute-loss regression.


def regression_stream(steps, d, seed):
    """Ada-FD sec. 4.1, small: ``x_t ~ N(1, Sigma)``, ``lambda_j(Sigma) = j^-2``,
    ``y_t = beta*^T x_t`` with a unit-norm ``beta*``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov_root = q * (np.arange(1, d + 1) ** -1.0)[None, :]
    x = 1.0 + rng.normal(size=(steps, d)) @ cov_root.T
    beta = rng.normal(size=d)
    beta /= np.linalg.norm(beta)
    return x, x @ beta, beta


REGRESSION_TXS = {
    "ada_fd_dual_averaging": lambda eta, delta: so.ada_fd_dual_averaging(
        eta, 4, delta, robust=False
    ),
    "ada_fd": lambda eta, delta: so.ada_fd(eta, 4, delta, robust=False),
    "ada_full_dual_averaging": so.ada_full_dual_averaging,
    "ada_full": so.ada_full,
}


@functools.partial(jax.jit, static_argnums=0)
def _regression_run(name, eta, delta, x, y, flip):
    """Online absolute loss ``|beta^T x_t - y_t|`` from ``beta_1 = 0``; the learner sees
    ``flip * g_t``. ``eta`` and ``delta`` are traced: one compilation per learner."""
    tx = REGRESSION_TXS[name](eta, delta)

    def body(carry, xy):
        beta, state = carry
        xt, yt = xy
        resid = beta @ xt - yt
        g = jnp.sign(resid) * xt  # a subgradient of |beta^T x_t - y_t|
        updates, state = tx.update(flip * g, state, beta)
        new = beta + updates
        return (new, state), (beta, new, g, jnp.abs(resid))

    beta0 = jnp.zeros(x.shape[1], x.dtype)
    return jax.lax.scan(body, (beta0, tx.init(beta0)), (x, y))[1]


def regression_run(name, eta, delta, x, y, flip=1.0):
    """``(beta_t, beta_{t+1}, g_t, f_t(beta_t))`` for t = 1..T, in float64."""
    with x64(True):
        out = _regression_run(name, eta, delta, jnp.asarray(x), jnp.asarray(y), flip)
        return tuple(np.asarray(a) for a in out)


def trace_sqrt_g(g):
    """``tr(G_T^{1/2})`` = the sum of the singular values of ``[g_1; ...; g_T]``."""
    return float(np.sum(np.linalg.svd(g, compute_uv=False)))


def fd_shrinkage(g, tau):
    """``sigma_t`` of the FD sketch of the run's gradients: the literal reference, cross-checked
    against sketchopt's RFD with ``alpha_fraction=1`` (whose ``alpha`` accumulates them)."""
    ref = RefFD(g.shape[1], tau)
    for row in g:
        ref.update(row)
    sigma = np.array(ref.shrinkage)
    with x64(True):
        sk = sketches.robust_frequent_directions(tau, alpha_fraction=1.0)

        def body(state, row):
            state = sk.update(state, row)
            return state, sketches.factors(state)[2]

        _, alphas = jax.lax.scan(body, sk.init(g.shape[1], jnp.float64), jnp.asarray(g))
    np.testing.assert_allclose(np.diff(np.asarray(alphas), prepend=0.0), sigma, atol=1e-9)
    return sigma


REGRET_D, REGRET_T = 10, 300


@pytest.mark.parametrize("eta", [0.05, 0.5])
@pytest.mark.parametrize("delta_factor", [0.1, 1.0])
def test_ada_fd_regret_bounds_theorems_1_and_2(eta, delta_factor):
    x, y, beta_star = regression_stream(REGRET_T, REGRET_D, seed=11)
    tau = 4
    delta = delta_factor * np.max(np.linalg.norm(x, axis=1))  # no precondition on delta here
    b2 = float(beta_star @ beta_star)
    for theorem, name in [(1, "ada_fd_dual_averaging"), (2, "ada_fd")]:
        beta_t, beta_next, g, loss = regression_run(name, eta, delta, x, y)
        regret = float(np.sum(loss))  # f_t(beta*) = 0
        tr = trace_sqrt_g(g)
        sigma = fd_shrinkage(g, tau)
        big_delta = float(np.sum(sigma))
        assert big_delta > 0  # the sketch is not exact: the extra terms matter
        gmax = float(np.max(np.linalg.norm(g, axis=1)))
        if theorem == 1:
            bound = (
                delta / (2 * eta) * b2
                + tr * b2 / (2 * eta)
                + 2 * eta * max(1.0, (gmax + np.sqrt(big_delta)) / delta) * tr
                + np.sum(np.sqrt(sigma)) / (2 * eta) * np.max(np.sum(beta_next**2, axis=1))
            )
        else:
            dist = float(np.max(np.sum((beta_star - beta_t) ** 2, axis=1)))
            bound = (
                delta / (2 * eta) * b2
                + dist * tr / (2 * eta)
                + 2 * eta * max(1.0, np.sqrt(big_delta) / delta) * tr
                + tau * np.sum(np.sqrt(sigma)) / (2 * eta) * dist
            )
        assert regret <= bound, (theorem, regret, bound)
        assert regret < np.sum(np.abs(y))  # it learned something (vs. beta = 0)


@pytest.mark.parametrize("eta", [0.05, 0.5])
@pytest.mark.parametrize("delta_factor", [1.0, 3.0])
def test_ada_full_regret_bounds_theorem_3(eta, delta_factor):
    """Ada-FD Theorem 3 and the (differently scaled) Duchi et al. Theorem 8, both of which hold
    for ``psi_t = 1/2 <x, H_t x>``."""
    x, y, beta_star = regression_stream(REGRET_T, REGRET_D, seed=12)
    delta = delta_factor * np.max(np.linalg.norm(x, axis=1))
    b2 = float(beta_star @ beta_star)

    # Primal-dual (dual averaging): needs delta >= max_t ||g_t||.
    _, _, g, loss = regression_run("ada_full_dual_averaging", eta, delta, x, y)
    regret, tr = float(np.sum(loss)), trace_sqrt_g(g)
    assert delta >= np.max(np.linalg.norm(g, axis=1))  # the theorem's precondition
    assert regret <= delta / (2 * eta) * b2 + tr * b2 / (2 * eta) + 2 * eta * tr
    assert regret <= delta / eta * b2 + tr * b2 / eta + eta * tr  # Duchi et al. eq. (18)

    # Composite mirror descent (any delta >= 0).
    beta_t, _, g, loss = regression_run("ada_full", eta, delta, x, y)
    regret, tr = float(np.sum(loss)), trace_sqrt_g(g)
    dist = float(np.max(np.sum((beta_star - beta_t) ** 2, axis=1)))
    assert regret <= delta / (2 * eta) * b2 + dist * tr / (2 * eta) + 2 * eta * tr
    assert regret <= delta / eta * b2 + dist * tr / (2 * eta) + eta * tr  # Duchi et al. eq. (19)


def test_regret_bound_is_not_vacuous():
    """A learner stepping the wrong way breaks the Theorem 3 bound on the same stream."""
    x, y, beta_star = regression_stream(REGRET_T, REGRET_D, seed=12)
    eta, delta = 0.5, np.max(np.linalg.norm(x, axis=1))
    _, _, g, loss = regression_run("ada_full_dual_averaging", eta, delta, x, y, flip=-1.0)
    tr, b2 = trace_sqrt_g(g), float(beta_star @ beta_star)
    assert np.sum(loss) > delta / (2 * eta) * b2 + tr * b2 / (2 * eta) + 2 * eta * tr


# --------------------------------------------------------------------------------------------
# Validation.

ALL = {
    "ada_fd": lambda: so.ada_fd(0.1, 3, 0.5, robust=False),
    "ada_fd_fast_robust": lambda: so.ada_fd(0.1, 3, 0.5, robust=True, fast=True),
    "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, 3, 0.5, robust=False),
    "ada_fd_dual_averaging_fast": lambda: so.ada_fd_dual_averaging(
        0.1, 3, 0.5, fast=True, robust=False
    ),
    "s_adagrad": lambda: so.s_adagrad(0.1, 3, 0.5),
    "ada_full": lambda: so.ada_full(0.1, 0.5),
    "ada_full_dual_averaging": lambda: so.ada_full_dual_averaging(0.1, 0.5),
    "ada_diag": lambda: so.ada_diag(0.1, 0.5),
    "ada_diag_dual_averaging": lambda: so.ada_diag_dual_averaging(0.1, 0.5),
    "scale_by_ada_fd": lambda: so.scale_by_ada_fd(3, 0.5, robust=False),
    "scale_by_ada_full": lambda: so.scale_by_ada_full(0.5),
    "scale_by_ada_diag": lambda: so.scale_by_ada_diag(0.5),
}
NEEDS_PARAMS = {k for k in ALL if "dual_averaging" in k}


@pytest.mark.parametrize(
    "factory, kwargs, name",
    [
        (so.ada_fd, dict(learning_rate=0.1, sketch_size=0, delta=0.5), "sketch_size"),
        (so.ada_fd, dict(learning_rate=0.1, sketch_size=-2, delta=0.5), "sketch_size"),
        (so.ada_fd, dict(learning_rate=0.1, sketch_size=2.5, delta=0.5), "sketch_size"),
        (so.ada_fd_dual_averaging, dict(learning_rate=1, sketch_size=0, delta=1), "sketch_size"),
        (so.s_adagrad, dict(learning_rate=0.1, sketch_size=0, delta=0.5), "sketch_size"),
        (so.scale_by_ada_fd, dict(sketch_size=0, delta=0.5), "sketch_size"),
        (so.ada_fd, dict(learning_rate=0.1, sketch_size=3, delta=0.0), "delta"),
        (so.ada_fd, dict(learning_rate=0.1, sketch_size=3, delta=-1.0), "delta"),
        (so.ada_fd_dual_averaging, dict(learning_rate=0.1, sketch_size=3, delta=0.0), "delta"),
        (so.scale_by_ada_fd, dict(sketch_size=3, delta=float("nan")), "delta"),
        (so.ada_full, dict(learning_rate=0.1, delta=0.0), "delta"),
        (so.ada_full_dual_averaging, dict(learning_rate=0.1, delta=-0.5), "delta"),
        (so.scale_by_ada_full, dict(delta=0.0), "delta"),
        (so.ada_diag, dict(learning_rate=0.1, delta=-1e-3), "delta"),
        (so.ada_diag_dual_averaging, dict(learning_rate=0.1, delta=float("inf")), "delta"),
        (so.scale_by_ada_diag, dict(delta=-1.0), "delta"),
        (so.ada_fd, dict(learning_rate=float("nan"), sketch_size=3, delta=0.5), "learning_rate"),
        (so.ada_fd, dict(learning_rate=float("inf"), sketch_size=3, delta=0.5), "learning_rate"),
        (so.ada_full, dict(learning_rate=float("-inf"), delta=0.5), "learning_rate"),
        (so.ada_diag_dual_averaging, dict(learning_rate=np.nan, delta=0.5), "learning_rate"),
        (so.s_adagrad, dict(learning_rate=jnp.inf, sketch_size=3, delta=0.5), "learning_rate"),
    ],
)  # fmt: skip
def test_bad_hyperparameters_raise_value_error_naming_the_argument(factory, kwargs, name):
    with pytest.raises(ValueError, match=name):
        factory(**kwargs)


def test_good_hyperparameters_are_accepted():
    so.ada_diag(0.1, 0.0)  # delta = 0 is allowed for the diagonal metric
    so.ada_diag_dual_averaging(0.0, 0.0)
    so.ada_fd(0.1, 1, 1e-8, robust=False)
    so.ada_fd(jnp.asarray(0.1), np.int64(4), np.float32(0.5), robust=True, fast=True)
    so.ada_full(optax.constant_schedule(0.1), 1e-6)


@pytest.mark.parametrize("name", sorted(NEEDS_PARAMS))
def test_rules_that_need_params_raise_without_them(name):
    tx = ALL[name]()
    state = tx.init(jnp.zeros(3))
    with pytest.raises(ValueError, match="params"):
        tx.update(jnp.ones(3), state)


@pytest.mark.parametrize(
    "name", ["ada_fd_fast_robust", "ada_full", "s_adagrad", "scale_by_ada_diag"]
)
def test_unregularized_mirror_descent_needs_no_params(name):
    tx = ALL[name]()
    updates, _ = jax.jit(tx.update)(jnp.ones(3), tx.init(jnp.zeros(3)))
    assert np.all(np.isfinite(updates)) and np.all(updates != 0)


@pytest.mark.parametrize("name", ["ada_fd", "ada_fd_dual_averaging", "ada_full", "ada_diag"])
def test_integer_gradients_raise_a_clear_error_at_trace_time(name):
    tx = ALL[name]()
    params = jnp.zeros(3, jnp.int32)
    state = tx.init(params)
    with pytest.raises((TypeError, ValueError), match="floating"):
        jax.jit(tx.update).trace(jnp.ones(3, jnp.int32), state, params)


# --------------------------------------------------------------------------------------------
# Bad and odd inputs: non-finite leaves, zero gradients, scalar and empty leaves, bf16.

ODD = ["ada_fd", "ada_fd_fast_robust", "ada_fd_dual_averaging", "ada_full"]
ODD += ["ada_diag_dual_averaging", "scale_by_ada_fd"]


def _restrict(state, params, keys):
    """A per-leaf transform's state restricted to some leaves: every per-leaf field (stacked
    groups, :class:`sketchopt.LeafGroups`, or a tree like the parameters) as the per-leaf values
    of those leaves."""

    def cut(node):
        if isinstance(node, so.LeafGroups):
            per_leaf = so.per_leaf_states(node, params)
            return {k: per_leaf[k] for k in keys}
        if isinstance(node, dict) and set(node) == set(params):
            return {k: node[k] for k in keys}
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            return type(node)(*map(cut, node))
        return node

    return cut(state)


@pytest.mark.parametrize("name", ODD)
def test_odd_inputs(name):
    """Zero gradients, scalar and size-0 leaves, and NaN/Inf leaves: a non-finite leaf keeps its
    state bit-identical, gets a zero update and is counted; the other leaves proceed exactly as
    without it."""
    tx = ALL[name]()
    rng = np.random.default_rng(20)

    def f32(tree):  # strong float32 leaves throughout, so the update compiles once
        return {k: jnp.asarray(np.asarray(v, np.float32)) for k, v in tree.items()}

    params = f32({"a": rng.normal(size=4), "b": [0.5, -0.2], "e": np.zeros((3, 0)), "s": 0.3})
    update = jax.jit(tx.update)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(2):  # zero gradients: no movement, no NaN
        u, state = update(zeros, state, params)
        chex.assert_trees_all_equal(u, zeros)
    for _ in range(3):  # some history
        g = f32(jax.tree.map(lambda p: rng.normal(size=p.shape), params))
        u, state = update(g, state, params)
        params = f32(optax.apply_updates(params, u))
    assert float(u["s"]) != 0.0 and float(jnp.min(jnp.abs(u["a"]))) > 0
    chex.assert_tree_all_finite((params, state))
    assert int(state.nonfinite_count) == 0

    for count, bad in enumerate((jnp.nan, jnp.inf, -jnp.inf), start=1):
        g = f32({"a": [1.0, bad, 0.0, 2.0], "b": [0.3, -1.0], "e": np.zeros((3, 0)), "s": bad})
        u, new_state = update(g, state, params)
        for k in ("a", "s"):  # the skipped leaves
            np.testing.assert_array_equal(u[k], np.zeros_like(params[k]))
            chex.assert_trees_all_equal(
                so.per_leaf_states(new_state.metric_state, params)[k],
                so.per_leaf_states(state.metric_state, params)[k],
            )
            for field in ("grad_sum", "anchor"):
                if hasattr(state, field):
                    chex.assert_trees_all_equal(
                        so.per_leaf_states(getattr(new_state, field), params)[k],
                        so.per_leaf_states(getattr(state, field), params)[k],
                    )
        assert int(new_state.nonfinite_count) == int(state.nonfinite_count) + 2
        assert int(new_state.nonfinite_count) == 2 * count
        chex.assert_tree_all_finite((u, new_state))
        # the finite leaf proceeds exactly as with finite gradients on the other leaves
        u_ok, s_ok = update({**g, **f32({"a": np.ones(4), "s": 1.0})}, state, params)
        np.testing.assert_array_equal(u["b"], u_ok["b"])
        chex.assert_trees_all_equal(
            _restrict(new_state, params, ["b"])[:-1], _restrict(s_ok, params, ["b"])[:-1]
        )
        state = new_state


@pytest.mark.parametrize("name", ["ada_fd_dual_averaging", "ada_full"])
def test_huge_gradients_stay_finite(name):
    tx = ALL[name]()
    rng = np.random.default_rng(22)
    params = jnp.zeros(4)
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(6):
        u, state = update(jnp.asarray(rng.normal(size=4) * 1e30, jnp.float32), state, params)
        chex.assert_tree_all_finite((u, state))


@pytest.mark.parametrize("name", ["ada_fd", "ada_diag_dual_averaging"])
def test_bfloat16_params_keep_a_float32_state(name):
    """State in float32, updates in bf16 and equal to the float32 transform's on the same
    (bf16-representable) inputs up to bf16 rounding."""
    tx = ALL[name]()
    rng = np.random.default_rng(21)
    grads = jnp.asarray(rng.normal(size=(6, 5)), jnp.bfloat16)
    x0 = jnp.asarray(rng.normal(size=5), jnp.bfloat16)

    def run(params, grads):
        def body(state, g):
            u, state = tx.update(g, state, params)
            return state, u

        return jax.lax.scan(body, tx.init(params), grads)

    state16, u16 = jax.jit(run)(x0, grads)
    _, u32 = jax.jit(run)(x0.astype(jnp.float32), grads.astype(jnp.float32))
    assert u16.dtype == jnp.bfloat16
    for leaf in jax.tree.leaves(state16):
        assert leaf.dtype in (jnp.int32, jnp.float32), leaf.dtype
    np.testing.assert_allclose(np.asarray(u16, np.float32), u32, rtol=2e-2, atol=1e-3)


# --------------------------------------------------------------------------------------------
# Optax composition, jit and vmap (float64 runs against the references where possible).


@pytest.mark.parametrize("rule", RULES)
def test_inside_chain_with_clipping_and_a_schedule(rule):
    steps = 15
    z, y = make_stream(steps, seed=30)
    want, _ = reference_run(
        "fd", rule, X0, z, y, lambda c: 0.2 - 0.15 * min(c, 8) / 8, 0.5, clip=1.0
    )
    with x64(True):
        # float64 end points and a power-of-two horizon keep optax's schedule exact in float64
        schedule = optax.linear_schedule(jnp.float64(0.2), jnp.float64(0.05), transition_steps=8)
        chained = optax.chain(optax.clip_by_global_norm(1.0), make_tx("fd", rule, schedule, 0.5))
        traj, _ = run_tx(chained, X0, z, y, jnp.float64)
    assert relerr(traj, want) < 1e-9
    if rule == "md":  # and in the default float32
        schedule = optax.linear_schedule(0.2, 0.05, transition_steps=8)
        chained = optax.chain(optax.clip_by_global_norm(1.0), make_tx("fd", rule, schedule, 0.5))
        assert relerr(run_tx(chained, X0, z, y)[0], want) < 1e-4


@pytest.mark.parametrize("rule", ["da"])
def test_optax_inject_hyperparams_with_static_sketch_size(rule):
    factory = so.ada_fd if rule == "md" else so.ada_fd_dual_averaging
    z, y = make_stream(12, seed=31)
    injected = optax.inject_hyperparams(factory, static_args=("sketch_size",))(
        learning_rate=0.1, sketch_size=3, delta=0.5, robust=False
    )
    with x64(True):
        traj, state = run_tx(injected, X0, z, y, jnp.float64)
    want, _ = reference_run("fd", rule, X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj, want) < 1e-9
    assert set(state.hyperparams) == {"learning_rate", "delta"}


def _lower_lr_from_step_5(state, t):
    lr = jnp.where(t >= 5, 0.03, state.hyperparams["learning_rate"])
    return state._replace(hyperparams={**state.hyperparams, "learning_rate": lr})


@pytest.mark.parametrize(
    "kind, rule, factory, kwargs",
    [
        ("fast_rfd", "md", so.ada_fd, dict(sketch_size=3, delta=0.5, robust=True, fast=True)),
        ("fd", "da", so.ada_fd_dual_averaging, dict(sketch_size=3, delta=0.5, robust=False)),
        ("full", "md", so.ada_full, dict(delta=0.5)),
    ],
)
def test_sketchopt_inject_hyperparams_changes_the_learning_rate_mid_run(
    kind, rule, factory, kwargs
):
    """Ints are static automatically; setting ``hyperparams['learning_rate']`` mid-run acts
    from that step on."""
    z, y = make_stream(10, seed=32)
    tx = so.inject_hyperparams(factory)(learning_rate=0.1, **kwargs)
    with x64(True):
        traj, state = run_tx(tx, X0, z, y, jnp.float64, hook=_lower_lr_from_step_5)
    want, _ = reference_run(kind, rule, X0, z, y, lambda c: 0.1 if c < 5 else 0.03, 0.5)
    assert relerr(traj, want) < 1e-9
    assert "sketch_size" not in state.hyperparams


@pytest.mark.parametrize("rule", ["da"])
def test_flatten_is_one_metric_over_the_concatenated_vector(rule):
    z, y = make_stream(15, seed=33)
    with x64(True):
        traj, state = run_tx(optax.flatten(make_tx("fd", rule, 0.1, 0.5)), X0, z, y, jnp.float64)
    want, _ = reference_run("fd", rule, X0, z, y, lambda c: 0.1, 0.5, flat=True)
    assert relerr(traj, want) < 1e-9
    # one sketch of width 11, not one per leaf
    assert jax.tree.leaves(state.metric_state.rows) == [state.metric_state.rows.groups[0]]
    assert state.metric_state.rows.groups[0].shape == (3, DIM)  # one leaf: stored unstacked
    per_leaf, _ = reference_run("fd", rule, X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj, per_leaf) > 1e-3  # and that is a different learner


def test_partition_and_multi_transform_mix_metrics_per_leaf():
    z, y = make_stream(15, seed=34)
    labels = {"b": "diag", "w": "fd"}
    txs = {"fd": so.ada_fd(0.1, 3, 0.5, robust=False), "diag": so.ada_diag(0.2, 0.1)}
    per_leaf = {"b": ("diag", lambda c: 0.2, 0.1), "w": ("fd", lambda c: 0.1, 0.5)}
    want, _ = reference_run(None, "md", X0, z, y, None, None, per_leaf=per_leaf)
    with x64(True):
        traj_part, _ = run_tx(optax.partition(txs, labels), X0, z, y, jnp.float64)
        traj_multi, _ = run_tx(optax.multi_transform(txs, labels), X0, z, y, jnp.float64)
    assert relerr(traj_part, want) < 1e-9
    np.testing.assert_array_equal(traj_part, traj_multi)


@pytest.mark.parametrize("rule", ["da"])
def test_multisteps_accumulates_then_steps(rule):
    """``MultiSteps(every_k=2)`` fed each gradient twice steps once with it (their mean)."""
    z, y = make_stream(10, seed=35)
    with x64(True):
        multi = optax.MultiSteps(
            make_tx("fd", rule, 0.1, 0.5), every_k_schedule=2, accumulator_dtype=jnp.float64
        )
        traj, state = run_tx(multi, X0, z, y, jnp.float64, repeat=2)
    want, _ = reference_run("fd", rule, X0, z, y, lambda c: 0.1, 0.5)
    assert relerr(traj, want) < 1e-9
    assert int(state.gradient_step) == 10


@pytest.mark.parametrize("rule", ["md"])
def test_apply_if_finite(rule):
    tx = optax.apply_if_finite(make_tx("fd", rule, 0.1, 0.5), max_consecutive_errors=3)
    bare = make_tx("fd", rule, 0.1, 0.5)
    params = to_tree(X0)
    update = jax.jit(tx.update)
    s, s_bare = tx.init(params), bare.init(params)
    g = to_tree(np.linspace(-1, 1, DIM))
    u, s = update(g, s, params)
    bare_update = jax.jit(bare.update)
    u_bare, s_bare = bare_update(g, s_bare, params)
    chex.assert_trees_all_close(u, u_bare, rtol=1e-6)
    bad = {"b": g["b"].at[1].set(jnp.nan), "w": g["w"]}
    u, s2 = update(bad, s, params)
    chex.assert_trees_all_equal(u, jax.tree.map(jnp.zeros_like, u))
    chex.assert_trees_all_equal(s2.inner_state, s.inner_state)
    assert int(s2.notfinite_count) == 1 and int(s2.total_notfinite) == 1
    u, s3 = update(g, s2, params)
    chex.assert_trees_all_close(u, bare_update(g, s_bare, params)[0], rtol=1e-6)
    assert int(s3.notfinite_count) == 0


class JitVariantsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_agrees_with_the_reference(self):
        z, y = make_stream(4, seed=36)
        for rule in ["da"]:
            tx = make_tx("fast_rfd", rule, 0.1, 0.5, tau=2)  # the 4-row buffer shrinks at step 4
            update = self.variant(tx.update)
            params = to_tree(X0)
            state = tx.init(params)
            for t in range(4):
                g = to_tree(lsq_grad(flat_of(params), jnp.asarray(z[t], jnp.float32), y[t]))
                u, state = update(g, state, params)
                params = optax.apply_updates(params, u)
            want, _ = reference_run("fast_rfd", rule, X0, z, y, lambda c: 0.1, 0.5, tau=2)
            assert relerr(np.asarray(flat_of(params)), want[-1]) < 1e-4


@pytest.mark.parametrize("kind, rule", [("fd", "da"), ("full", "md")])
def test_vmap_over_learning_rates_and_deltas(kind, rule):
    z, y = make_stream(10, seed=37)
    lrs = [0.05, 0.1, 0.3]
    deltas = [0.2, 0.5, 2.0]
    with x64(True):

        def final(lr, delta):
            return _scan(make_tx(kind, rule, lr, delta), to_tree(X0), z, y)[1]

        batched = jax.jit(jax.vmap(final))(jnp.asarray(lrs), jnp.asarray(deltas))
    for i in range(3):
        want, _ = reference_run(kind, rule, X0, z, y, lambda c, i=i: lrs[i], deltas[i])
        assert relerr(np.asarray(batched[i]), want) < 1e-9


# --------------------------------------------------------------------------------------------
# Checkpointing.


@pytest.mark.parametrize("name", ["ada_fd_fast_robust", "ada_fd_dual_averaging"])
def test_orbax_round_trip_continues_bit_identically(name, tmp_path):
    import orbax.checkpoint as ocp

    tx = ALL[name]()
    z, y = make_stream(12, seed=40)
    params = to_tree(X0)
    state = tx.init(params)
    update = jax.jit(tx.update)

    def steps(params, state, lo, hi):
        for t in range(lo, hi):
            g = to_tree(lsq_grad(flat_of(params), jnp.asarray(z[t], jnp.float32), y[t]))
            u, state = update(g, state, params)
            params = optax.apply_updates(params, u)
        return params, state

    params, state = steps(params, state, 0, 5)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "state", state)
    restored = jax.tree.unflatten(jax.tree.structure(state), jax.tree.leaves(restored))
    chex.assert_trees_all_equal(restored, state)
    chex.assert_trees_all_equal_dtypes(restored, state)
    chex.assert_trees_all_equal(steps(params, state, 5, 12), steps(params, restored, 5, 12))


# --------------------------------------------------------------------------------------------
# Composite steps with a regularizer (Duchi et al. sec. 6): references solve the prox problem.

REG_NAMES = ["l1", "l2_squared", "l2", "linf", "l1_ball", "mixed_l1_l2", "mixed_l1_linf"]
HAVE_REGULARIZERS = all(hasattr(so.regularizers, n) for n in REG_NAMES)
needs_regularizers = pytest.mark.skipif(
    not HAVE_REGULARIZERS, reason="sketchopt.regularizers is not available yet"
)


def make_reg(name, strength, **kw):
    return getattr(so.regularizers, name)(strength, tol=1e-12, **kw)


REG_CASES = [  # (regularizer, strength, metric, rule): closed forms, exact and inner solves
    ("l1", 3.0, "diag", "md"),  # eq. (24)
    ("l1", 3.0, "diag", "da"),  # eq. (22), anchored at x_1
    ("l1", 0.6, "fd", "md"),
    ("l1", 0.6, "full", "da"),
    ("l2_squared", 0.5, "diag", "md"),  # eq. (25)
    ("l2", 0.5, "fd", "da"),
    ("linf", 0.5, "fast_rfd", "md"),
    ("l1_ball", 1.5, "rfd", "da"),
    ("mixed_l1_l2", 0.5, "full", "md"),
    ("mixed_l1_linf", 0.5, "diag", "da"),
]


@needs_regularizers
@pytest.mark.parametrize("name, strength, kind, rule", REG_CASES)
def test_regularized_step_matches_float64_reference(name, strength, kind, rule):
    steps, lr, delta = 15, 0.1, 0.5
    z, y = make_stream(steps, seed=50)
    tx = make_tx(kind, rule, lr, delta, regularizer=make_reg(name, strength))
    with x64(True):
        traj, _ = run_tx(tx, X0, z, y, jnp.float64)
    ref_reg = RefReg(name, strength)
    want, problems = reference_run(kind, rule, X0, z, y, lambda c: lr, delta, reg=ref_reg)
    assert relerr(traj, want) < 1e-9, relerr(traj, want)
    plain, _ = reference_run(kind, rule, X0, z, y, lambda c: lr, delta)
    assert relerr(want, plain) > 1e-2  # the regularizer matters in this run
    if name == "l1_ball":
        for t in range(steps):
            for x in split(traj[t]).values():
                assert np.sum(np.abs(x)) <= strength * (1 + 1e-12)
    if name == "l1":  # exact zeros exactly where the optimality conditions force them
        zeros = 0
        for t in range(steps):
            got, ref_x = split(traj[t]), split(want[t])
            for k, (u, c, h) in problems[t].items():
                slack = np.abs(u + h @ ref_x[k]) - c * strength  # < 0: x_i = 0 strictly
                forced = (ref_x[k] == 0) & (slack < -1e-8 * c * strength)
                np.testing.assert_array_equal(got[k][forced], 0.0)
                assert np.all(got[k][np.abs(ref_x[k]) > 1e-8] != 0)
                zeros += int(np.sum(forced))
        assert 0 < zeros < steps * DIM


ZERO_CASES = [
    ("l1", 0.0, {"solver": "admm"}, "fd", "da"),
    ("l2_squared", 0.0, {}, "full", "md"),
    ("mixed_l1_linf", 0.0, {}, "diag", "da"),
    ("l1_ball", 1e6, {}, "fast_rfd", "md"),  # an inactive constraint
]


@needs_regularizers
@pytest.mark.parametrize("name, strength, kw, kind, rule", ZERO_CASES)
def test_zero_regularizer_equals_the_unregularized_rule(name, strength, kw, kind, rule):
    steps, lr, delta = 15, 0.1, 0.5
    z, y = make_stream(steps, seed=51)
    tx = make_tx(kind, rule, lr, delta, regularizer=make_reg(name, strength, **kw))
    with x64(True):
        traj, _ = run_tx(tx, X0, z, y, jnp.float64)
    want, _ = reference_run(kind, rule, X0, z, y, lambda c: lr, delta)
    assert relerr(traj, want) < 1e-9


@needs_regularizers
def test_regularized_mirror_descent_needs_params():
    tx = so.ada_fd(0.1, 3, 0.5, regularizer=so.regularizers.l1(0.1), robust=False)
    state = tx.init(jnp.zeros(3))
    with pytest.raises(ValueError, match="params"):
        tx.update(jnp.ones(3), state)
