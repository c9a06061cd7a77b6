"""Tests of sketchopt.metrics: the preconditioner ``H_t`` of ADA-DIAG, ADA-FULL and ADA-FD.

Every metric is compared with a float64 NumPy reference written from the papers, independently of
the JAX code:

* ADA-DIAG: ``H_t = delta I + diag(sum_s g_s^2)^{1/2}`` (Duchi et al. eq. 19/20);
* ADA-FULL: ``H_t = delta I + G_t^{1/2}``, the root taken from the SVD of the stacked gradients
  ``[g_1; ...; g_t] = U S V^T`` (``G_t^{1/2} = V S V^T``), which is exact also while ``G_t`` is
  rank deficient (a dense ``eigh`` of ``G_t`` puts ``sqrt(eps)``-sized noise on its null space);
* ADA-FD: ``H_t = delta I + (S_t^T S_t + alpha I)^{1/2}`` from the literal FD / RFD algorithms
  (Ada-FD Alg. 1/2 lines 4-6, RFD paper Alg. 2/4/5) with an SVD of the ``tau x d`` sketch (of the
  ``2 tau`` buffer for the fast forms) at every step.
"""

from __future__ import annotations

import copy
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sketchopt import metrics, sketches
from sketchopt.operators import DiagonalOperator, LowRankOperator

# --------------------------------------------------------------------------------------------
# float64 NumPy references.


class RefDiag:
    def __init__(self, d):
        self.sumsq = np.zeros(d)

    def update(self, g):
        self.sumsq = self.sumsq + g**2

    def spectrum(self, delta):
        return delta + np.sqrt(self.sumsq), np.eye(self.sumsq.size)


class RefFull:
    def __init__(self, d):
        self.d, self.rows = d, np.zeros((0, d))

    def update(self, g):
        self.rows = np.vstack([self.rows, g[None]])

    def spectrum(self, delta):
        """``G_t^{1/2} = V^T diag(s) V`` from the SVD of the stacked gradients."""
        _, s, vt = np.linalg.svd(self.rows, full_matrices=True)
        return delta + np.pad(s, (0, self.d - s.size)), vt


class RefFD:
    """FD (RFD paper Alg. 1), fast FD (Alg. 4), RFD (Alg. 2) and fast RFD (Alg. 5), literally.

    ``B`` holds only the rows that can be non-zero (at most ``tau - 1`` after a shrink). A shrink
    takes the SVD of ``[B; g]``, subtracts ``sigma_tau^2`` (0 while fewer than ``tau`` singular
    values exist: the zero rows of the paper's ``tau x d`` sketch) from the top ``tau - 1``
    squared singular values, and adds ``fraction * sigma_tau^2`` to ``alpha`` (1/2 for RFD).
    """

    def __init__(self, d, tau, *, fast=False, fraction=0.0):
        self.d, self.tau, self.fast, self.fraction = d, tau, fast, fraction
        self.rows, self.alpha, self.shrinkage = np.zeros((0, d)), 0.0, []

    def update(self, g):
        tau = self.tau
        bhat = np.vstack([self.rows, g[None]])
        if self.fast and bhat.shape[0] < 2 * tau:
            self.rows = bhat
            self.shrinkage.append(0.0)
            return
        _, s, vt = np.linalg.svd(bhat, full_matrices=False)
        s2 = np.zeros(max(tau, s.size))
        s2[: s.size] = s**2
        sigma = s2[tau - 1]
        k = min(tau - 1, s.size)
        self.rows = np.sqrt(np.maximum(s2[:k] - sigma, 0))[:, None] * vt[:k]
        self.alpha += self.fraction * sigma
        self.shrinkage.append(sigma)

    def spectrum(self, delta):
        """``delta I + (B^T B + alpha I)^{1/2}`` from the SVD ``B = U diag(s) V^T`` of the
        current sketch (``V`` completed to an orthonormal basis of ``R^d``)."""
        if self.rows.shape[0] == 0:
            s, vt = np.zeros(0), np.eye(self.d)
        else:
            _, s, vt = np.linalg.svd(self.rows, full_matrices=True)
        s = np.pad(s, (0, self.d - s.size))
        return delta + np.sqrt(s**2 + self.alpha), vt


def ref_matrix(ref, delta):
    lam, vt = ref.spectrum(delta)
    return (vt.T * lam) @ vt


def ref_solve(ref, delta, y):
    """``H^{-1} y`` in the eigenbasis: accurate whatever the conditioning of ``H``."""
    lam, vt = ref.spectrum(delta)
    return vt.T @ ((vt @ y) / lam)


def ref_cond(ref, delta):
    lam, _ = ref.spectrum(delta)
    return lam.max() / lam.min()


def fd(tau):
    return sketches.frequent_directions(tau), lambda d: RefFD(d, tau)


def fast_fd(tau):
    return sketches.frequent_directions(tau, fast=True), lambda d: RefFD(d, tau, fast=True)


def rfd(tau, fraction=0.5):
    return (
        sketches.robust_frequent_directions(tau, alpha_fraction=fraction),
        lambda d: RefFD(d, tau, fraction=fraction),
    )


def fast_rfd(tau):
    return (
        sketches.robust_frequent_directions(tau, fast=True),
        lambda d: RefFD(d, tau, fast=True, fraction=0.5),
    )


def metric_case(name, delta):
    """(metric, reference constructor) for a named metric."""
    if name == "diag":
        return metrics.diagonal(delta), RefDiag
    if name == "full":
        return metrics.full(delta), RefFull
    sketch, ref = {
        "fd": fd(3),
        "fast_fd": fast_fd(3),
        "rfd": rfd(3),
        "fast_rfd": fast_rfd(3),
        "s_adagrad": rfd(3, fraction=1.0),
        "fd_tau1": fd(1),
        "fd_tau_gt_d": fd(12),
    }[name]
    return metrics.sketched(sketch, delta), ref


METRICS = ["diag", "full", "fd", "fast_fd", "rfd", "fast_rfd", "s_adagrad", "fd_tau1"]


def dense(op, d, dtype=jnp.float64):
    """The operator materialized column by column through ``matvec``."""
    return jax.vmap(op.matvec, out_axes=1)(jnp.eye(d, dtype=dtype))


def relerr(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


def gradient_stream(steps, d, seed):
    """Correlated gradients with a decaying spectrum (as Ada-FD sec. 4.1), so the sketch shrinks."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) * (0.6 ** np.arange(d))[None, :]
    return rng.normal(size=(steps, d)) @ mix.T + 0.3


# --------------------------------------------------------------------------------------------
# Whole runs, each compiled once (``delta`` is traced so one compilation serves every value).


@functools.partial(jax.jit, static_argnames=("name",))
def run_metric(name, delta, grads, ys):
    """Feed ``grads`` one by one; per step return ``H_t`` (dense), ``H_t^{-1} y_t``,
    ``H_t^{-1} g_t`` as the update returns it, ``operator(state)`` (dense) and the spectrum
    bounds."""
    metric, _ = metric_case(name, delta)
    d = grads.shape[1]

    def body(state, gy):
        g, y = gy
        state, op, solved = metric.update(state, g)
        out = (
            dense(op, d, grads.dtype),
            op.solve(y),
            metrics.solve_new_gradient(op, g, solved),
            dense(metric.operator(state), d, grads.dtype),
            op.lambda_min(),
            op.lambda_max(),
        )
        return state, out

    return jax.lax.scan(body, metric.init(d, grads.dtype), (grads, ys))


def reference_run(name, grads):
    """The reference after each step (``delta`` is applied by ``ref_matrix``/``ref_solve``)."""
    _, make_ref = metric_case(name, 1.0)
    ref = make_ref(grads.shape[1])
    refs = []
    for g in grads:
        ref.update(g)
        refs.append(copy.deepcopy(ref))
    return refs


# --------------------------------------------------------------------------------------------
# Step-by-step agreement with the references.


@pytest.mark.parametrize("name", METRICS + ["fd_tau_gt_d"])
def test_operator_matches_reference_step_by_step(name):
    d, steps, delta = 7, 24, 0.3
    grads = gradient_stream(steps, d, seed=1)
    ys = np.random.default_rng(2).normal(size=(steps, d))
    with jax.enable_x64(True):
        _, (h, sol, sol_g, h_again, lo, hi) = run_metric(name, delta, grads, ys)
    refs = reference_run(name, grads)
    np.testing.assert_array_equal(h_again, h)  # operator(state) is the op update returned
    for t, ref in enumerate(refs):
        h_ref = ref_matrix(ref, delta)
        assert relerr(h[t], h_ref) < 1e-10, (t, relerr(h[t], h_ref))
        assert relerr(sol[t], ref_solve(ref, delta, ys[t])) < 1e-9, t
        assert relerr(sol_g[t], ref_solve(ref, delta, grads[t])) < 1e-9, t
        eig = np.linalg.eigvalsh(h_ref)
        assert float(lo[t]) <= eig[0] * (1 + 1e-10) and float(hi[t]) >= eig[-1] * (1 - 1e-10)
    if isinstance(ref, RefFD) and name != "fd_tau_gt_d":
        assert max(ref.shrinkage) > 0.1  # the sketch did shrink: not the exact regime


def test_full_metric_operator_is_an_exact_eigendecomposition():
    """``H`` of ADA-FULL and its inverse agree as matrices (``H H^{-1} = I``)."""
    d = 5
    with jax.enable_x64(True):
        metric = metrics.full(0.2)
        state = metric.init(d, jnp.float64)
        for g in gradient_stream(8, d, seed=3):
            state = metric.update(state, jnp.asarray(g))[0]
        op = metric.operator(state)
        h = dense(op, d)
        inv = jax.vmap(op.solve, out_axes=1)(jnp.eye(d, dtype=jnp.float64))
        np.testing.assert_allclose(h @ inv, np.eye(d), atol=1e-12)


@pytest.mark.parametrize("name", ["full", "fd_tau_gt_d", "diag"])
@pytest.mark.parametrize("x64", [True, False])
def test_solve_is_as_accurate_as_the_conditioning_of_h_allows(name, x64):
    """Once ``G_t`` (or a sketch with ``tau > d``) has full rank, ``H`` is well conditioned even
    for a tiny ``delta`` or huge gradients, and ``H^{-1} g`` must be accurate to about
    ``eps * cond(H)``. (A Woodbury solve ``(g - V^T diag(w/(delta+w)) V g) / delta`` that divides
    the round-off of a complete projection by ``delta`` is off by ``eps * max(w) / delta``.)"""
    d, steps = 6, 16
    base = gradient_stream(steps, d, seed=4)
    dtype = np.float64 if x64 else np.float32
    eps = float(np.finfo(dtype).eps)
    with jax.enable_x64(x64):
        for delta, scale in [(1e-8 if x64 else 1e-4, 1.0), (0.1, 1e10), (1e-30, 1e-20)]:
            grads = (base * scale).astype(dtype)
            _, (_, _, sol_g, _, _, _) = run_metric(name, delta, grads, grads)
            sol_g = np.asarray(sol_g, np.float64)
            refs = reference_run(name, grads.astype(np.float64))
            for t in range(d, steps):  # before, G_t is rank deficient and cond(H) ~ max(w)/delta
                want = ref_solve(refs[t], delta, grads[t].astype(np.float64))
                err = np.linalg.norm(sol_g[t] - want) / np.linalg.norm(want)
                tol = 30 * d * eps * ref_cond(refs[t], delta)
                assert err < tol, (delta, scale, t, err, tol)


@pytest.mark.parametrize("name", ["fd", "fast_rfd", "full"])
def test_gradient_inside_the_range_is_solved_accurately_in_float32_for_tiny_delta(name):
    """Gradients from a rank-2 subspace (``tau = 3``, ``d = 6``): ``g_t`` lies in the sketch's
    span, so ``H^{-1} g_t`` never divides by ``delta``. The split solve keeps the round-off of
    the projection ``g - P g`` (~eps |g|) out of the ``1/delta`` term; a Woodbury form divided
    it by ``delta = 1e-8`` and was off by orders of magnitude in float32."""
    d, steps, delta = 6, 12, 1e-8
    rng = np.random.default_rng(11)  # small integers: exactly rank 2 in float32 too
    grads = (rng.integers(-9, 10, (steps, 2)) @ rng.integers(-9, 10, (2, d))).astype(np.float32)
    _, (_, _, sol_g, _, _, _) = run_metric(name, delta, grads, grads)
    sol_g = np.asarray(sol_g, np.float64)
    refs = reference_run(name, grads.astype(np.float64))
    for t in range(steps):
        want = ref_solve(refs[t], delta, grads[t].astype(np.float64))
        err = np.linalg.norm(sol_g[t] - want) / np.linalg.norm(want)
        assert err < 1e-3, (t, err)


# --------------------------------------------------------------------------------------------
# Exactness, special cases.


def test_fd_metric_with_tau_above_d_equals_full_metric():
    d, steps = 5, 15
    grads = gradient_stream(steps, d, seed=5)
    with jax.enable_x64(True):
        _, (h_fd, sol_fd, sol_g_fd, *_) = run_metric("fd_tau_gt_d", 0.4, grads, grads)
        _, (h_full, sol_full, sol_g_full, *_) = run_metric("full", 0.4, grads, grads)
    np.testing.assert_allclose(h_fd, h_full, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol_fd, sol_full, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol_g_fd, sol_g_full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", METRICS)
def test_zero_gradients_give_delta_identity(name):
    d, delta = 4, 0.7
    zeros = np.zeros((4, d), np.float32)
    state, (h, _, sol_g, _, _, _) = run_metric(name, delta, zeros, zeros + 1)
    chex.assert_tree_all_finite(state)
    np.testing.assert_allclose(h, np.broadcast_to(delta * np.eye(d), h.shape), rtol=1e-6)
    np.testing.assert_array_equal(sol_g, 0.0)


def test_diagonal_with_zero_delta_is_safe_zero_over_zero():
    metric = metrics.diagonal(0.0)
    state = metric.init(3)
    state, op, solved = metric.update(state, jnp.asarray([2.0, 0.0, -1.0]))
    assert isinstance(op, DiagonalOperator) and solved is None
    np.testing.assert_allclose(op.solve(jnp.asarray([2.0, 0.0, -1.0])), [1.0, 0.0, -1.0])
    np.testing.assert_allclose(op.solve(jnp.asarray([4.0, 5.0, 1.0])), [2.0, 0.0, 1.0])


def test_ada_diag_saturates_at_the_float_range_and_steps_at_most_eta():
    """A gradient entry near the float32 range: the accumulator saturates at the largest finite
    value (no skip, no ``inf`` state), the other coordinates step as before, every step is at
    most ``eta`` per coordinate; a non-finite gradient is still skipped bit-identically."""
    import sketchopt as so

    big = float(jnp.finfo(jnp.float32).max) * 0.9
    tx = so.ada_diag(0.5, delta=1e-6)
    state = tx.init({"w": jnp.zeros(3)})
    for g in ([big, 1.0, -2.0], [big, 3.0, 0.0]):
        updates, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        assert int(state.nonfinite_count) == 0
    rss = np.asarray(state.metric_state.rss["w"])
    assert rss[0] == np.finfo(np.float32).max
    np.testing.assert_allclose(rss[1:], [np.hypot(1.0, 3.0), 2.0], rtol=1e-6)
    assert np.all(np.abs(np.asarray(updates["w"])) <= 0.5)
    np.testing.assert_allclose(updates["w"][1], -0.5 * 3.0 / (1e-6 + np.hypot(1.0, 3.0)), rtol=1e-6)
    skipped, after = tx.update({"w": jnp.asarray([np.nan, 1.0, 1.0], jnp.float32)}, state)
    assert int(after.nonfinite_count) == 1
    np.testing.assert_array_equal(skipped["w"], 0.0)
    np.testing.assert_array_equal(after.metric_state.rss["w"], rss)


@pytest.mark.parametrize("name", ["diag", "full", "fd", "fast_rfd"])
def test_huge_and_tiny_gradients_stay_finite_and_accurate(name):
    """float32 rows of norm 1e30 and 1e-30: finite state, and ``H^{-1} g`` as accurate as the
    conditioning of ``H`` permits."""
    d, steps, delta = 5, 12, 0.1
    base = gradient_stream(steps, d, seed=6)
    eps = float(np.finfo(np.float32).eps)
    for scale in (1e30, 1e-30):
        grads = (base * scale).astype(np.float32)
        state, (_, _, sol_g, _, _, _) = run_metric(name, delta, grads, grads)
        chex.assert_tree_all_finite((state, sol_g))
        sol_g = np.asarray(sol_g, np.float64)
        ref = reference_run(name, grads.astype(np.float64))[-1]
        want = ref_solve(ref, delta, grads[-1].astype(np.float64))
        err = np.linalg.norm(sol_g[-1] - want) / np.linalg.norm(want)
        assert err < max(1e-4, 30 * d * eps * ref_cond(ref, delta)), (scale, err)


# --------------------------------------------------------------------------------------------
# dtypes, validation, jit/vmap.


@pytest.mark.parametrize("name", ["diag", "full", "fd", "fast_rfd"])
def test_state_dtype_is_at_least_float32(name):
    metric, _ = metric_case(name, 0.1)
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        for leaf in jax.tree.leaves(metric.init(3, dtype)):
            assert leaf.dtype in (jnp.float32, jnp.int32)
    with jax.enable_x64(True):
        floats = [
            leaf.dtype
            for leaf in jax.tree.leaves(metric.init(3, jnp.float64))
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        ]
        assert floats and all(dt == jnp.float64 for dt in floats)


@pytest.mark.parametrize(
    "factory, bad",
    [
        (metrics.diagonal, [-1e-3, float("nan"), float("inf")]),
        (metrics.full, [0.0, -1.0, float("nan"), float("inf")]),
        (lambda dl: metrics.sketched(sketches.frequent_directions(2), dl), [0.0, -1.0, np.nan]),
    ],
)
def test_bad_delta_raises_value_error_naming_it(factory, bad):
    for value in bad:
        with pytest.raises(ValueError, match="delta"):
            factory(value)
    factory(0.5)


def test_diagonal_accepts_zero_delta():
    metrics.diagonal(0.0)


@pytest.mark.parametrize("name", ["diag", "full", "fd", "fast_rfd"])
def test_vmap_over_delta_matches_separate_metrics(name):
    d = 4
    grads = gradient_stream(7, d, seed=7).astype(np.float32)
    deltas = np.asarray([0.05, 0.5, 3.0], np.float32)
    batched = jax.vmap(lambda dl: run_metric(name, dl, grads, grads)[1][2])(deltas)
    for i, delta in enumerate(deltas):
        single = run_metric(name, delta, grads, grads)[1][2]
        np.testing.assert_allclose(batched[i], single, rtol=2e-5, atol=1e-6)


def test_operators_solve_shifted_and_products():
    """The two operator classes against dense matrices (``V`` with a zero row, a power-of-two
    scale)."""
    rng = np.random.default_rng(8)
    d, n = 6, 3
    with jax.enable_x64(True):
        q, _ = np.linalg.qr(rng.normal(size=(d, n)))
        basis = q.T * np.asarray([2.0, 3.0, 0.5])[:, None]  # rows orthogonal, not normalized
        coef = np.diag([1 / 2.0, 1 / 3.0, 0.0]) * 2.0**5  # V = 2**-5 coef @ basis; row 3 is zero
        v = np.diag([1 / 2.0, 1 / 3.0, 0.0]) @ basis
        weights = np.asarray([4.0, 0.5, 7.0])
        op = LowRankOperator(jnp.asarray(0.3), jnp.asarray(basis), jnp.asarray(coef), weights, 5)
        h = 0.3 * np.eye(d) + v.T @ np.diag(weights) @ v
        y = rng.normal(size=d)
        np.testing.assert_allclose(dense(op, d), h, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(op.solve(y), np.linalg.solve(h, y), rtol=1e-12)
        np.testing.assert_allclose(
            op.solve_shifted(0.7, y), np.linalg.solve(h + 0.7 * np.eye(d), y), rtol=1e-12
        )
        np.testing.assert_allclose(op.solve_projected(y, op.project(y)), np.linalg.solve(h, y))
        assert float(op.lambda_min()) <= np.linalg.eigvalsh(h)[0] + 1e-12
        assert float(op.lambda_max()) >= np.linalg.eigvalsh(h)[-1] - 1e-12

        diag = DiagonalOperator(jnp.asarray([0.5, 2.0, 0.0]))
        np.testing.assert_allclose(diag.solve_shifted(1.0, jnp.ones(3)), [1 / 1.5, 1 / 3.0, 1.0])
        np.testing.assert_allclose(diag.matvec(jnp.ones(3)), [0.5, 2.0, 0.0])
        assert float(diag.lambda_min()) == 0.0 and float(diag.lambda_max()) == 2.0


@pytest.mark.parametrize("lazy", [False, True])
def test_sketched_absorb_is_update_without_the_solve(lazy):
    """``Metric.absorb`` (what dual averaging calls) leaves the state and operator ``update``
    leaves, bit for bit: skipping the fused lift changes nothing else."""
    metric = metrics.sketched(sketches.frequent_directions(4, lazy=lazy), 0.1)
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        a = b = metric.init((40,), jnp.float64)
        for _ in range(9):
            g = jnp.asarray(rng.standard_normal(40))
            a, op_a, solved = metric.update(a, g)
            b, op_b = metric.absorb(b, g)
            assert solved is not None
            for x, y in zip(jax.tree.leaves((a, op_a)), jax.tree.leaves((b, op_b)), strict=True):
                np.testing.assert_array_equal(x, y)
