"""Tests of ``sketchopt.sketches`` against literal float64 NumPy references.

The references take one SVD (or Gram-Schmidt) per row, exactly as the papers write the algorithms:

* FD family -- RFD paper (``shared/papers/002``) Alg. 1 (FD), Alg. 2 (RFD), Alg. 4 (fast FD),
  Alg. 5 (fast RFD); PFD shrinks only the smallest ``max(1, floor(beta * tau))`` of the top ``tau``
  squared singular values; CFD adds the running total of the shrink amounts back to every non-zero
  sketched squared singular value.
* Oja -- SON paper (``shared/papers/004``) eq. 4 with Gram-Schmidt and ``Gamma_t = 1/t``, started
  from the initial directions of ``init``.
* Random projection -- ``S_t = S_{t-1} + r_t g_t^T`` (SON paper sec. 3).

Compilation dominates the cost of this module, so every compiled function is compiled once per
(sketch, shape, dtype) and shared between tests: all streams are padded to ``(BATCH, T, dim)`` for
one of the three ``CONFIGS`` and run through the cached ``_trajectory_fn``.
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchopt import sketches as sk


def x64():
    """Float64 inside a ``with`` block only (never the global config)."""
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    from jax.experimental import enable_x64  # older JAX

    return enable_x64()


# ----------------------------------------------------------------------------------------------
# The sketches under test.

BETA = 0.5  # PFD's beta
ALPHA0 = 0.25  # RFD's initial ridge in the "rfd" spec


def _num_shrunk(tau):
    return max(1, math.floor(BETA * tau))


# name -> (factory(tau), keyword arguments of ref_fd_family, or None for Oja / RP)
SPECS = {
    "fd": (lambda tau: sk.frequent_directions(tau), {}),
    "fast_fd": (lambda tau: sk.frequent_directions(tau, fast=True), {"fast": True}),
    "rfd": (
        lambda tau: sk.robust_frequent_directions(tau, alpha0=ALPHA0),
        {"alpha0": ALPHA0, "alpha_fraction": 0.5},
    ),
    "fast_rfd": (
        lambda tau: sk.robust_frequent_directions(tau, fast=True),
        {"fast": True, "alpha_fraction": 0.5},
    ),
    "rfd_all_mass": (  # alpha_fraction = 1: the S-AdaGrad rule
        lambda tau: sk.robust_frequent_directions(tau, alpha_fraction=1.0),
        {"alpha_fraction": 1.0},
    ),
    "pfd": (lambda tau: sk.parameterized_frequent_directions(tau, BETA), {"pfd": True}),
    "fast_pfd": (
        lambda tau: sk.parameterized_frequent_directions(tau, BETA, fast=True),
        {"pfd": True, "fast": True},
    ),
    "cfd": (lambda tau: sk.compensative_frequent_directions(tau), {"compensate": True}),
    "fast_cfd": (
        lambda tau: sk.compensative_frequent_directions(tau, fast=True),
        {"compensate": True, "fast": True},
    ),
    # The lazy basis (B = F Z, a rank-one update of Z per shrink), forced at these short rows: the
    # same references, every 32 shrinks written back.
    "fd_lazy": (lambda tau: sk.frequent_directions(tau, lazy=True), {}),
    "rfd_lazy": (
        lambda tau: sk.robust_frequent_directions(tau, alpha0=ALPHA0, lazy=True),
        {"alpha0": ALPHA0, "alpha_fraction": 0.5},
    ),
    "cfd_lazy": (
        lambda tau: sk.compensative_frequent_directions(tau, lazy=True),
        {"compensate": True},
    ),
    "oja": (lambda tau: sk.oja(tau, key=jax.random.PRNGKey(7)), None),
    "rp": (lambda tau: sk.random_projection(tau, jax.random.PRNGKey(11)), None),
}
ALL = [name for name in SPECS if name != "rfd_all_mass"]
FD_FAMILY = [name for name in ALL if SPECS[name][1] is not None]
# One sketch per code path (per-step / doubling FD family, Oja, RP) for the costlier checks.
CODE_PATHS = ["fd", "fast_rfd", "cfd", "oja", "rp"]
CFD = ("cfd", "fast_cfd", "cfd_lazy")

T = 256  # rows per stream
BATCH = 3  # streams per run
CONFIGS = {"generic": (10, 4), "small_dim": (3, 5), "size_one": (4, 1)}  # name -> (dim, tau)


@functools.cache
def make(name, tau):
    return SPECS[name][0](tau)


@functools.cache
def _trajectory_fn(name, tau):
    """jit(scan) of ``update_with_product`` over one stream: the state and the product after
    every row."""
    sketch = make(name, tau)

    def step(state, row):
        state, product = sketch.update_with_product(state, row)
        return state, (state, product)

    return jax.jit(lambda state, rows: jax.lax.scan(step, state, rows)[1])


@jax.jit
def _queries(states):
    """``(low_rank, covariance, factors)`` of a ``(B, T)`` stack of states. Compiled once per state
    shape, so it is shared by every FD-family sketch with the same buffer size."""
    lead = jax.tree.leaves(states)[0].shape[:2]
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), states)
    out = jax.vmap(lambda s: (sk.low_rank(s), sk.covariance(s), sk.factors(s)))(flat)
    return jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), out)


@functools.cache
def _update_fn(name, tau):
    return jax.jit(make(name, tau).update)


@functools.cache
def _batched_update_many_fn(name, tau):
    return jax.jit(jax.vmap(make(name, tau).update_many))


def _to_numpy(tree):
    return jax.tree.map(np.asarray, tree)


def _pick(tree, index):
    return jax.tree.map(lambda x: x[index], tree)


def pad_streams(streams, dim):
    """Pad to the shared ``(BATCH, T, dim)`` shape (zero rows at the end, repeated streams)."""
    streams = np.asarray(streams)
    b, t, d = streams.shape
    assert d == dim and b <= BATCH and t <= T
    padded = np.zeros((BATCH, T, dim), streams.dtype)
    padded[:b, :t] = streams
    padded[b:, :t] = streams[0]
    return padded


def run_batch(name, config, streams, dtype):
    """Run the sketch over each stream (``(B, T', dim)``, ``B <= BATCH``, ``T' <= T``).

    Returns NumPy ``(low_rank, covariance, factors, states, products)`` after every row, with
    leading axes ``(B, T')``. Streams are padded to the shared shape so that nothing recompiles;
    the padding never influences the returned (earlier) steps."""
    dim, tau = CONFIGS[config]
    b, t = np.shape(streams)[:2]
    rows = jnp.asarray(pad_streams(streams, dim), dtype)
    init = make(name, tau).init(dim, dtype)
    runs = [_trajectory_fn(name, tau)(init, rows[i]) for i in range(BATCH)]
    states, products = jax.tree.map(lambda *x: np.stack(x), *runs)
    lr, cov, fac = _to_numpy(_queries(states))
    return jax.tree.map(lambda x: x[:b, :t], (lr, cov, fac, states, products))


def assemble(lr):
    """``V^T diag(lam) V + alpha I`` in float64 NumPy from (batched) ``LowRank`` factors.

    Works from the scaled quantities, so it is exact even when the true covariance overflows the
    sketch's dtype (rows of norm 1e30 in float32)."""
    e = np.asarray(lr.scale_exp, np.float64)
    coef = np.asarray(lr.coef, np.float64) * (2.0 ** (-e))[..., None, None]
    v = coef @ np.asarray(lr.basis, np.float64)
    lam = np.asarray(lr.eigenvalues, np.float64) * (4.0**e)[..., None]
    alpha = np.asarray(lr.alpha, np.float64) * 4.0**e
    eye = np.eye(v.shape[-1])
    return np.einsum("...ki,...k,...kj->...ij", v, lam, v) + alpha[..., None, None] * eye


def rel_err(c, ref):
    """Relative Frobenius error per matrix (absolute where the reference is zero)."""
    c, ref = np.asarray(c, np.float64), np.asarray(ref, np.float64)
    num = np.linalg.norm(c - ref, axis=(-2, -1))
    den = np.linalg.norm(ref, axis=(-2, -1))
    return np.where(den > 0, num / np.where(den > 0, den, 1), num)


# ----------------------------------------------------------------------------------------------
# Literal float64 NumPy references.


def ref_fd_family(
    rows,
    tau,
    *,
    fast=False,
    pfd=False,
    alpha0=0.0,
    alpha_fraction=0.0,
    compensate=False,
):
    """RFD paper Alg. 1/2 (per-step) and Alg. 4/5 (``fast``), one SVD per shrink.

    Returns per-row ``(covariance, alpha, cumulative shrinkage)``. The SVD step runs when
    ``B-hat`` has ``tau`` rows (``2 tau`` with ``fast``); before that the rows are just stacked
    (the papers' ``B^(m-1) = [a_1, ..., a_{m-1}]``)."""
    rows = np.asarray(rows, np.float64)
    t_len, d = rows.shape
    num_shrunk = _num_shrunk(tau) if pfd else tau
    full = 2 * tau if fast else tau
    b = np.zeros((0, d))
    alpha, total = float(alpha0), 0.0
    covs, alphas, totals = np.zeros((t_len, d, d)), np.zeros(t_len), np.zeros(t_len)
    for t, a in enumerate(rows):
        b_hat = np.vstack([b, a[None, :]])
        if b_hat.shape[0] < full:
            b = b_hat
        else:
            _, s, vt = np.linalg.svd(b_hat, full_matrices=False)
            sq = np.zeros(full)
            sq[: s.size] = s**2
            v = np.zeros((full, d))
            v[: vt.shape[0]] = vt
            shrink = sq[tau - 1]  # (sigma_tau)^2
            # the num_shrunk smallest of the top tau are reduced; the tau-th (-> 0) is dropped
            reduced = np.arange(tau - 1) >= tau - num_shrunk
            kept = np.where(reduced, sq[: tau - 1] - shrink, sq[: tau - 1])
            b = np.sqrt(np.maximum(kept, 0))[:, None] * v[: tau - 1]
            alpha += alpha_fraction * shrink
            total += shrink
        cov = b.T @ b
        if compensate and b.shape[0] and total > 0:
            _, s, vt = np.linalg.svd(b, full_matrices=False)
            nonzero = s**2 > 1e-10 * np.max(s**2, initial=0)
            cov = cov + total * vt[nonzero].T @ vt[nonzero]
        covs[t], alphas[t], totals[t] = cov + alpha * np.eye(d), alpha, total
    return covs, alphas, totals


def gram_schmidt_rows(a):
    """Classical Gram-Schmidt (with re-orthogonalization) of the rows; dependent rows -> 0."""
    q = np.zeros_like(a)
    for i, row in enumerate(a):
        r = row.copy()
        for _ in range(2):
            r = r - q[:i].T @ (q[:i] @ r)
        norm = np.linalg.norm(r)
        if norm > 1e-10 * np.linalg.norm(row):
            q[i] = r / norm
    return q


def ref_oja(rows, v0):
    """SON paper eq. 4: ``Lambda_t = (1 - 1/t) Lambda + (1/t) (V g)^2``,
    ``V_t = GS(V + (1/t) (V g) g^T)``; covariance ``V^T (t Lambda) V``."""
    v = gram_schmidt_rows(np.asarray(v0, np.float64))
    lam = np.zeros(v.shape[0])
    covs = []
    for t, g in enumerate(np.asarray(rows, np.float64), start=1):
        gamma = 1.0 / t
        p = v @ g
        lam = (1 - gamma) * lam + gamma * p**2
        v = gram_schmidt_rows(v + gamma * np.outer(p, g))
        covs.append((v.T * (t * lam)) @ v)
    return np.array(covs)


def rp_vectors(keys, m, dtype):
    """The ``r_t ~ N(0, I/m)`` a random-projection state with ``key`` draws next."""

    def draw(key):
        sub = jax.random.split(key)[1]
        return jax.random.normal(sub, (m,), dtype) * jnp.asarray(1 / np.sqrt(m), dtype)

    return np.asarray(jax.vmap(draw)(jnp.asarray(keys)), np.float64)


def ref_rp(rows, r):
    """``S_t = S_{t-1} + r_t g_t^T``; covariance ``S_t^T S_t`` (float64)."""
    s = np.cumsum(r[:, :, None] * np.asarray(rows, np.float64)[:, None, :], axis=0)
    return np.einsum("tki,tkj->tij", s, s), s


def reference(name, tau, stream, states, init_state):
    """Per-row reference covariance of one stream (``states``: the per-row JAX states of it)."""
    kwargs = SPECS[name][1]
    if kwargs is not None:
        return ref_fd_family(stream, tau, **kwargs)[0]
    if name == "oja":
        return ref_oja(stream, init_state.directions)
    keys = np.concatenate([np.asarray(init_state.key)[None], states.key[:-1]])
    return ref_rp(stream, rp_vectors(keys, tau, init_state.rows.dtype))[0]


# ----------------------------------------------------------------------------------------------
# Streams.


def _orthonormal(rng, k, d):
    q, _ = np.linalg.qr(rng.standard_normal((d, k)))
    return q.T


def fixed_streams(config, seed=0):
    """Three streams per config: full rank, rank < tau, and rank-deficient with zero rows."""
    dim, tau = CONFIGS[config]
    rng = np.random.default_rng(seed)
    out = np.zeros((BATCH, T, dim))
    scale = np.exp(rng.normal(0, 0.5, (T, 1)))  # row norms vary
    # full rank, mildly decaying spectrum
    out[0] = rng.standard_normal((T, dim)) * np.geomspace(1, 0.1, dim) * scale
    # rank below tau (FD is exact on it) and below dim, with some zero rows
    r = max(1, min(tau - 1, dim - 1))
    out[1] = rng.standard_normal((T, r)) @ _orthonormal(rng, r, dim) * scale
    out[1, 5::9] = 0
    # rank between tau and dim (or dim - 1), leading zero rows, every 4th row zero
    r = max(1, dim - 2 if dim > tau else dim - 1)
    out[2] = rng.standard_normal((T, r)) @ _orthonormal(rng, r, dim) * scale
    out[2, :7] = 0
    out[2, ::4] = 0
    return out


@st.composite
def stream_params(draw):
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "kind": draw(st.sampled_from(["gaussian", "low_rank", "integers", "spiky"])),
        "rank": draw(st.integers(1, 12)),
        "decay": draw(st.sampled_from([0.0, 1.0, 3.0])),
        "zero_fraction": draw(st.sampled_from([0.0, 0.25, 0.7])),
        "length": draw(st.integers(1, T // 2)),
        "log_scale": draw(st.integers(-3, 3)),
    }


def make_stream(p, dim):
    """A stream of ``T`` rows: rank-limited, decaying, integer, heavy-tailed, with zero rows and
    zero padding after ``length`` rows, as the Hypothesis parameters say."""
    rng = np.random.default_rng(p["seed"])
    rank = min(p["rank"], dim)
    if p["kind"] == "integers":  # exact ties and repeated rows
        a = rng.integers(-2, 3, (T, rank)).astype(np.float64)
        a = a @ (np.eye(dim)[:rank] if rng.random() < 0.5 else rng.integers(-1, 2, (rank, dim)))
    else:
        spectrum = np.logspace(0, -p["decay"], rank)
        a = (rng.standard_normal((T, rank)) * spectrum) @ _orthonormal(rng, rank, dim)
        if p["kind"] == "spiky":
            a *= np.exp(rng.normal(0, 2, (T, 1)))
        elif p["kind"] == "gaussian":
            a += 1e-3 * rng.standard_normal((T, dim))  # full rank, ill-conditioned
    a[rng.random(T) < p["zero_fraction"]] = 0
    a[p["length"] :] = 0
    return a * 10.0 ** p["log_scale"]


def batches():
    """``(config, [stream parameters] * BATCH)``; build the streams with :func:`build`."""
    return st.tuples(
        st.sampled_from(["generic", "small_dim"]),
        st.lists(stream_params(), min_size=BATCH, max_size=BATCH),
    )


def build(batch):
    """``(config, streams)``; the streams are cut after the longest non-padding part."""
    config, params = batch
    dim, _ = CONFIGS[config]
    length = max(p["length"] for p in params)
    return config, np.stack([make_stream(p, dim)[:length] for p in params])


def gram_prefixes(streams):
    """``A_t^T A_t`` for every prefix (``(B, T, d, d)``)."""
    return np.cumsum(np.einsum("bti,btj->btij", streams, streams), axis=1)


def tail_mass(gram, k):
    """``||A - A_k||_F^2`` = sum of all but the ``k`` largest eigenvalues of ``A^T A``."""
    eig = np.clip(np.linalg.eigvalsh(gram), 0, None)  # ascending
    return eig[..., : max(eig.shape[-1] - k, 0)].sum(-1)


def spectral_norm_sym(m):
    return np.max(np.abs(np.linalg.eigvalsh(m)), axis=-1)


# ----------------------------------------------------------------------------------------------
# Step-by-step agreement with the references.


def expected_products(name, states, streams):
    """What ``update_with_product`` must return: ``basis @ g / 4**scale_exp`` of the new state."""
    basis = states.directions if name == "oja" else states.rows
    tiny = np.finfo(basis.dtype).tiny  # (parts of) products far below the scale underflow
    basis = basis.astype(np.float64)
    half = 2.0 ** -states.scale_exp.astype(np.float64)
    g = np.asarray(streams, np.float64)
    product = np.einsum("btkd,btd->btk", basis, g) * (half**2)[..., None]
    size = np.linalg.norm(basis, axis=(-2, -1)) * half
    return product, size * np.linalg.norm(g, axis=-1) * half, 1e3 * tiny * (1 + size)


def check_against_reference(name, config, streams, dtype, tol, *, check=None, covariance=True):
    """After every row, the covariance rebuilt from ``low_rank``'s scaled factors (and, with
    ``covariance``, the one ``covariance`` returns) matches the reference for the streams
    ``check`` (default all), and ``update_with_product``'s product is ``basis @ g``."""
    dim, tau = CONFIGS[config]
    lr, cov, fac, states, products = run_batch(name, config, streams, dtype)
    init = _to_numpy(make(name, tau).init(dim, dtype))
    floats = {x.dtype for x in jax.tree.leaves(states) if x.dtype.kind == "f"}
    assert cov.dtype == np.dtype(dtype) and floats == {np.dtype(dtype)}
    assert np.all(states.count[:, -1] == np.shape(streams)[1])
    for b in range(len(streams)) if check is None else check:
        ref = reference(name, tau, streams[b], _pick(states, b), init)
        err = rel_err(assemble(_pick(lr, b)), ref)
        assert np.max(err) <= tol, (b, int(np.argmax(err)), np.max(err))
        if covariance:
            err = rel_err(cov[b], ref)
            assert np.max(err) <= tol, (b, int(np.argmax(err)), np.max(err))
    product, bound, floor = expected_products(name, states, streams)
    prod_tol = 1e-12 if dtype == jnp.float64 else 1e-5
    assert np.all(np.abs(products - product) <= (prod_tol * bound + floor)[..., None])
    return lr, cov, fac, states


@pytest.mark.parametrize(
    ("name", "config"),
    [(name, config) for name in ALL for config in ("generic", "small_dim")]
    + [("rfd_all_mass", "generic")],
)
def test_matches_reference_float64(name, config):
    """Every sketch equals its literal reference after every row to 1e-9 (relative), on a
    full-rank stream, a stream of rank < tau and a rank-deficient one with zero rows, for
    ``dim > tau`` and ``dim < tau``."""
    with x64():
        check_against_reference(name, config, fixed_streams(config), jnp.float64, 1e-9)


@pytest.mark.parametrize("name", ALL)
def test_matches_reference_float32(name):
    streams = fixed_streams("generic", seed=1).astype(np.float32)
    # CFD adds the total shrinkage (of the order of the top eigenvalue) to every kept direction,
    # including directions with a tiny FD eigenvalue; from the tau x tau Gram matrix such a
    # direction is only accurate to ~eps32 * sqrt(lam_max / lam_i) (1e-3 here), so CFD's
    # covariance is held to 1e-3 in float32 (the FD part of it is checked to 1e-4 as "fd").
    tol = 1e-3 if name in CFD else 1e-4
    check_against_reference(name, "generic", streams, jnp.float32, tol)


@pytest.mark.parametrize("name", ["fd", "fast_rfd", "oja", "rp"])
def test_sketch_size_one(name):
    """``sketch_size = 1``: FD keeps no row at all (RFD keeps everything in alpha), the doubling
    buffer two; Oja and RP track one direction."""
    with x64():
        _, _, fac, states = check_against_reference(
            name, "size_one", fixed_streams("size_one"), jnp.float64, 1e-9
        )
    if name == "fd":
        assert fac[0].shape[-2] == 0
        np.testing.assert_array_equal(states.rows, 0)


@pytest.mark.parametrize("config", ["generic", "small_dim"])
@pytest.mark.parametrize("name", FD_FAMILY)
def test_fd_family_exact_below_rank_tau(name, config):
    """FD (and every relative) is exact while the rows seen span fewer than tau dimensions, and
    always when tau > dim: ``C = A^T A (+ alpha0 I)``, nothing is ever shrunk."""
    dim, tau = CONFIGS[config]
    streams = fixed_streams(config)
    rows = streams if dim < tau else streams[1:2]  # stream 1 has rank tau - 1
    with x64():
        _, cov, _, states, _ = run_batch(name, config, rows, jnp.float64)
    alpha0 = SPECS[name][1].get("alpha0", 0.0)
    assert np.max(rel_err(cov, gram_prefixes(rows) + alpha0 * np.eye(dim))) <= 1e-12
    assert np.all(states.compensation == 0)
    assert np.all(states.alpha * 4.0**states.scale_exp == alpha0)


@pytest.mark.parametrize("name", ["fd", "rfd", "pfd", "cfd"])
def test_sketch_size_counts_the_incoming_slot(name):
    """``sketch_size = tau`` rows include the slot for the incoming row: tau - 1 independent rows
    are kept exactly, the tau-th triggers the first shrink (by its tau-th squared singular value),
    and after every row the last buffer row is empty again."""
    dim, tau = CONFIGS["generic"]
    rows = np.random.default_rng(3).standard_normal((1, tau + 2, dim))
    with x64():
        _, cov, (v, lam, alpha), states, _ = run_batch(name, "generic", rows, jnp.float64)
    alpha0 = SPECS[name][1].get("alpha0", 0.0)
    gram = gram_prefixes(rows)[0]
    exact = gram + alpha0 * np.eye(dim)
    assert np.max(rel_err(cov[0, : tau - 1], exact[: tau - 1])) <= 1e-12
    assert rel_err(cov[0, tau - 1], exact[tau - 1]) > 1e-3
    assert states.rows.shape[-2:] == (tau, dim)
    np.testing.assert_array_equal(states.rows[0, :, tau - 1], 0)
    assert v.shape[-2] == tau - 1 and lam.shape[-1] == tau - 1
    eig = np.linalg.eigvalsh(gram[tau - 1])[::-1]  # descending, tau non-zero values
    shrunk = eig[: tau - 1] - eig[tau - 1]
    if name in ("fd", "rfd"):
        np.testing.assert_allclose(lam[0, tau - 1], shrunk, rtol=1e-9)
    if name == "rfd":
        np.testing.assert_allclose(alpha[0, tau - 1], alpha0 + eig[tau - 1] / 2, rtol=1e-12)
    if name == "cfd":  # the shrink amount is added back to the kept directions
        np.testing.assert_allclose(lam[0, tau - 1], shrunk + eig[tau - 1], rtol=1e-9)
    if name == "pfd":  # only the floor(beta tau) smallest of the top tau are reduced
        kept = eig[: tau - 1].copy()
        kept[tau - _num_shrunk(tau) :] -= eig[tau - 1]
        np.testing.assert_allclose(lam[0, tau - 1], kept, rtol=1e-9)


@pytest.mark.parametrize("name", ["fast_fd", "fast_rfd"])
def test_fast_buffer_convention(name):
    """The doubling buffer holds 2 tau rows, shrinks when full and keeps tau - 1 of them;
    ``factors`` has 2 tau - 1 rows; exact until the first shrink."""
    dim, tau = CONFIGS["generic"]
    rows = np.random.default_rng(4).standard_normal((1, 3 * tau, dim))
    with x64():
        _, cov, fac, states, _ = run_batch(name, "generic", rows, jnp.float64)
    assert states.rows.shape[-2:] == (2 * tau, dim) and fac[0].shape[-2] == 2 * tau - 1
    fill = [t + 1 if t + 1 < 2 * tau else t + 1 - 2 * tau + tau - 1 for t in range(3 * tau)]
    assert states.fill[0].tolist() == fill
    gram = gram_prefixes(rows)[0]
    assert np.max(rel_err(cov[0, : 2 * tau - 1], gram[: 2 * tau - 1])) <= 1e-12
    assert rel_err(cov[0, 2 * tau - 1], gram[2 * tau - 1]) > 1e-3
    assert np.linalg.matrix_rank(states.rows[0, 2 * tau - 1]) == tau - 1


def test_random_projection_gram_tracking_and_unbiasedness():
    """``gram`` tracks ``S S^T`` and ``covariance`` is ``S^T S`` after every row; every row adds a
    rank-one ``r g^T``; ``E[S^T S] = A^T A`` over keys."""
    dim, tau = CONFIGS["generic"]
    streams = fixed_streams("generic")
    with x64():
        _, cov, _, states, _ = run_batch("rp", "generic", streams, jnp.float64)
    s = states.rows
    gram = states.gram * (4.0**states.scale_exp)[..., None, None]
    assert np.max(rel_err(gram, s @ np.swapaxes(s, -1, -2))) <= 1e-10
    assert np.max(rel_err(cov, np.swapaxes(s, -1, -2) @ s)) <= 1e-10
    ds = np.diff(s, axis=1, prepend=0)
    sq = np.maximum(np.sum(streams**2, -1), 1e-300)[..., None]
    r = np.einsum("btkd,btd->btk", ds, streams) / sq
    assert np.allclose(ds, r[..., :, None] * streams[..., None, :], atol=1e-12 * np.abs(s).max())

    sketch = make("rp", tau)
    rows = jnp.asarray(streams[0, :6], jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(5), 2048)

    def final_cov(key):
        return sk.covariance(sketch.update_many(sketch.init(dim)._replace(key=key), rows))

    covs = np.asarray(jax.jit(jax.vmap(final_cov))(keys), np.float64)
    exact = np.asarray(rows, np.float64).T @ np.asarray(rows, np.float64)
    se = covs.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(covs.mean(0) - exact) <= 6 * se + 1e-5 * np.abs(exact).max())


# ----------------------------------------------------------------------------------------------
# Hypothesis properties (random integer / tied / rank-deficient / heavy-tailed / decaying streams
# with zero rows, in float64, checked after every row).


def _tol(gram):
    return 1e-10 * np.trace(gram, axis1=-2, axis2=-1) + 1e-300


@given(batch=batches())
@pytest.mark.parametrize("name", ["fd", "fast_fd"])
def test_fd_error_bound_and_underestimate(name, batch):
    """||A^T A - B^T B||_2 <= ||A - A_k||_F^2 / (tau - k) for every k < tau; B^T B <= A^T A."""
    config, streams = build(batch)
    _, tau = CONFIGS[config]
    with x64():
        _, cov, _, _, _ = run_batch(name, config, streams, jnp.float64)
    gram = gram_prefixes(streams)
    err = spectral_norm_sym(gram - cov)
    for k in range(tau):
        assert np.all(err <= tail_mass(gram, k) / (tau - k) + _tol(gram)), k
    assert np.all(np.linalg.eigvalsh(gram - cov)[..., 0] >= -_tol(gram))


@given(batch=batches())
@pytest.mark.parametrize("name", ["pfd", "fast_pfd"])
def test_pfd_underestimates(name, batch):
    config, streams = build(batch)
    with x64():
        _, cov, _, _, _ = run_batch(name, config, streams, jnp.float64)
    gram = gram_prefixes(streams)
    assert np.all(np.linalg.eigvalsh(gram - cov)[..., 0] >= -_tol(gram))


@given(batch=batches())
@pytest.mark.parametrize("name", ["rfd", "fast_rfd"])
def test_rfd_error_bound(name, batch):
    """RFD paper Theorem 3: ||A^T A + alpha0 I - (B^T B + alpha I)||_2 <=
    ||A - A_k||_F^2 / (2 (tau - k)) for every k < tau."""
    config, streams = build(batch)
    dim, tau = CONFIGS[config]
    with x64():
        _, cov, _, _, _ = run_batch(name, config, streams, jnp.float64)
    gram = gram_prefixes(streams)
    err = spectral_norm_sym(gram + SPECS[name][1].get("alpha0", 0.0) * np.eye(dim) - cov)
    for k in range(tau):
        assert np.all(err <= tail_mass(gram, k) / (2 * (tau - k)) + _tol(gram)), k


@settings(max_examples=20)
@given(batch=batches())
@pytest.mark.parametrize("name", ["fd", "fast_fd", "rfd", "fast_rfd", "rfd_all_mass"])
def test_fd_rfd_match_reference_and_alpha_rule(name, batch):
    """FD and RFD match the literal SVD reference after every row; alpha never decreases and
    equals ``alpha0 + alpha_fraction * (cumulative shrinkage of the reference)``."""
    config, streams = build(batch)
    _, tau = CONFIGS[config]
    kwargs = SPECS[name][1]
    with x64():
        _, cov, (_, _, alpha), _, _ = run_batch(name, config, streams, jnp.float64)
    assert np.all(np.diff(alpha, axis=1) >= 0)
    scale = np.trace(gram_prefixes(streams), axis1=-2, axis2=-1)
    for b in range(BATCH):
        ref_cov, ref_alpha, shrinkage = ref_fd_family(streams[b], tau, **kwargs)
        assert np.max(rel_err(cov[b], ref_cov)) <= 1e-9
        expected = kwargs.get("alpha0", 0.0) + kwargs.get("alpha_fraction", 0.0) * shrinkage
        np.testing.assert_allclose(ref_alpha, expected, rtol=1e-12)
        assert np.all(np.abs(alpha[b] - expected) <= 1e-9 * expected + 1e-12 * scale[b])


@settings(max_examples=12)
@given(batch=batches())
@pytest.mark.parametrize("name", ALL)
def test_factors_orthonormal(name, batch):
    """``factors``: V has orthonormal rows where lam > 0 and exactly-zero rows where lam = 0;
    lam is non-negative and sorted; alpha >= 0; V^T diag(lam) V + alpha I is ``covariance``.

    The FD-type sketches get V from the small Gram matrix (``V = mu^-1/2 U^T B``), which makes
    ``<v_i, v_j>`` accurate to ``~eps * mu_max / sqrt(mu_i mu_j)`` (``mu``: the sketched
    eigenvalues before CFD's compensation), not to ``eps``: the tolerance says exactly that."""
    config, streams = build(batch)
    with x64():
        _, cov, (v, lam, alpha), states, _ = run_batch(name, config, streams, jnp.float64)
    assert np.all(lam >= 0) and np.all(alpha >= 0)
    assert np.all(np.diff(lam, axis=-1) <= 0)
    zero = lam == 0
    assert np.all(v[zero] == 0)
    comp = getattr(states, "compensation", np.zeros(lam.shape[:2])) * 4.0**states.scale_exp
    mu = np.where(zero, 0, lam - comp[..., None])
    n = v.shape[-2]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.max(mu, -1)[..., None, None] / np.sqrt(mu[..., :, None] * mu[..., None, :])
    live = ~zero[..., :, None] & ~zero[..., None, :]
    gap = np.abs(v @ np.swapaxes(v, -1, -2) - np.eye(n))
    eps = np.finfo(np.float64).eps
    assert np.all(np.where(live, gap <= 1e-12 + 10 * n * eps * scale, True))
    rebuilt = np.einsum("...ki,...k,...kj->...ij", v, lam, v)
    rebuilt += alpha[..., None, None] * np.eye(v.shape[-1])
    assert np.max(rel_err(rebuilt, cov)) <= 1e-12


# ----------------------------------------------------------------------------------------------
# jit, vmap, scan.


def summary(state):
    """A float64 summary of one state that two equivalent runs must agree on (independent of
    eigenvector signs and rotations): the sketched Gram ``basis^T W basis`` and the scalars."""
    s = _to_numpy(state)
    scale = 4.0 ** np.float64(s.scale_exp)
    if isinstance(state, sk.OjaState):
        d = s.directions.astype(np.float64)
        quad = (d.T * (s.eigenvalues * scale)) @ d
    else:
        r = s.rows.astype(np.float64)
        quad = r.T @ r
    out = {"quad": quad}
    for field in ("alpha", "compensation"):
        if hasattr(s, field):
            out[field] = np.float64(getattr(s, field)) * scale
    ints = {f: int(getattr(s, f)) for f in ("count", "nonfinite_count", "fill") if hasattr(s, f)}
    return out, ints


def assert_same_sketch(a, b, rtol, where=None):
    """``a`` and ``b`` are the same sketch (their :func:`summary`, relative to ``rtol``), whatever
    signs or rotations the two programs that made them chose for the rows; ``where`` labels a
    failure."""
    (fa, ia), (fb, ib) = summary(a), summary(b)
    assert ia == ib, (where, ia, ib)
    for key in fa:
        scale = max(np.abs(fb[key]).max(), np.abs(fb["quad"]).max() * 1e-6, 1e-300)
        assert np.max(np.abs(fa[key] - fb[key])) <= rtol * scale, (where, key)


@pytest.mark.parametrize("name", CODE_PATHS)
def test_vmap_and_update_many_equal_separate_updates(name):
    """A vmapped ``update_many`` over a batch of different streams equals separate jitted scans,
    which equal repeated jitted ``update`` calls (float32; one stream has NaN/Inf rows)."""
    dim, tau = CONFIGS["generic"]
    streams = fixed_streams("generic", seed=2).astype(np.float32)
    streams[2, [3, 50, 51]] = np.nan
    streams[2, 60, 4] = np.inf
    *_, states, _ = run_batch(name, "generic", streams, jnp.float32)
    separate = _pick(states, (slice(None), -1))
    init = make(name, tau).init(dim)
    batched_init = jax.tree.map(lambda x: np.broadcast_to(x, (BATCH, *x.shape)), init)
    batched = _batched_update_many_fn(name, tau)(batched_init, jnp.asarray(streams))
    for b in range(BATCH):
        assert_same_sketch(_pick(batched, b), _pick(separate, b), 1e-5)
    state, update = init, _update_fn(name, tau)
    for row in streams[2]:
        state = update(state, row)
    assert_same_sketch(state, _pick(separate, 2), 1e-6)
    assert int(state.nonfinite_count) == 4 and int(state.count) == T - 4
    assert jax.tree.map(lambda x: x.dtype, state) == jax.tree.map(lambda x: x.dtype, init)


@pytest.mark.parametrize("name", ["fd", "rp"])
def test_state_can_be_donated(name):
    """A state from ``init`` can be donated to a jitted update (docs/design.md, "Speed") without
    invalidating the sketch: a second ``init`` afterwards still works."""
    dim, tau = CONFIGS["generic"]
    sketch = make(name, tau)
    step = jax.jit(sketch.update, donate_argnums=0)
    row = jnp.asarray(fixed_streams("generic")[0, 0], jnp.float32)
    first = step(sketch.init(dim), row)
    second = step(sketch.init(dim), row)  # would fail if init handed out a donated buffer
    assert_same_sketch(first, second, 0)


# ----------------------------------------------------------------------------------------------
# Bad input.


@pytest.mark.parametrize(
    ("factory", "argument"),
    [
        (lambda: sk.frequent_directions(0), "sketch_size"),
        (lambda: sk.frequent_directions(-3, fast=True), "sketch_size"),
        (lambda: sk.frequent_directions(2.5), "sketch_size"),
        (lambda: sk.frequent_directions(4.0), "sketch_size"),
        (lambda: sk.frequent_directions("4"), "sketch_size"),
        (lambda: sk.frequent_directions(None), "sketch_size"),
        (lambda: sk.frequent_directions(True), "sketch_size"),
        (lambda: sk.robust_frequent_directions(0), "sketch_size"),
        (lambda: sk.robust_frequent_directions(4, alpha0=-1e-3), "alpha0"),
        (lambda: sk.robust_frequent_directions(4, alpha0=float("nan")), "alpha0"),
        (lambda: sk.robust_frequent_directions(4, alpha0=float("inf")), "alpha0"),
        (lambda: sk.robust_frequent_directions(4, alpha_fraction=-0.1), "alpha_fraction"),
        (lambda: sk.robust_frequent_directions(4, alpha_fraction=1.5), "alpha_fraction"),
        (lambda: sk.robust_frequent_directions(4, alpha_fraction=float("nan")), "alpha_fraction"),
        (lambda: sk.parameterized_frequent_directions(4, 0.0), "beta"),
        (lambda: sk.parameterized_frequent_directions(4, -0.5), "beta"),
        (lambda: sk.parameterized_frequent_directions(4, 1.01), "beta"),
        (lambda: sk.parameterized_frequent_directions(4, float("nan")), "beta"),
        (lambda: sk.parameterized_frequent_directions(0.5, 0.5), "sketch_size"),
        (lambda: sk.compensative_frequent_directions(0, fast=True), "sketch_size"),
        (lambda: sk.oja(0), "sketch_size"),
        (lambda: sk.oja(3, learning_rate=0.0), "learning_rate"),
        (lambda: sk.oja(3, learning_rate=1.5), "learning_rate"),
        (lambda: sk.random_projection(0, jax.random.PRNGKey(0)), "sketch_size"),
        (lambda: sk.random_projection(1.5, jax.random.PRNGKey(0)), "sketch_size"),
    ],
)
def test_invalid_hyperparameters_raise(factory, argument):
    with pytest.raises(ValueError, match=argument):
        factory()


def test_valid_edge_hyperparameters():
    assert sk.frequent_directions(np.int64(3)).sketch_size == 3
    assert sk.robust_frequent_directions(1, alpha0=0.0, alpha_fraction=0.0).name == "rfd"
    assert sk.robust_frequent_directions(2, alpha_fraction=1.0, fast=True).name == "fast_rfd"
    assert sk.parameterized_frequent_directions(2, 1.0).sketch_size == 2
    assert sk.parameterized_frequent_directions(2, 1e-6).sketch_size == 2  # max(1, floor(.))
    with pytest.raises(TypeError):
        sk.low_rank(np.zeros(3))


@pytest.mark.parametrize("name", ALL)
def test_nonfinite_rows_leave_state_unchanged(name):
    """A row with NaN/Inf leaves every state array bit-identical, increments ``nonfinite_count``
    and returns a zero product; the stream then continues as if the row had not been there."""
    dim, tau = CONFIGS["generic"]
    clean = fixed_streams("generic", seed=3)[0, :60].astype(np.float32)
    bad = np.tile(clean[20], (4, 1))
    bad[0, 3], bad[1, 0], bad[2, -1], bad[3] = np.nan, np.inf, -np.inf, np.nan
    k = 2 * tau + 1
    dirty = np.concatenate([clean[:k], bad, clean[k:]])
    streams = np.stack([dirty, np.concatenate([clean, np.zeros((4, dim), np.float32)])])
    *_, states, products = run_batch(name, "generic", streams, jnp.float32)
    before = _pick(states, (0, k - 1))
    for i in range(len(bad)):
        after = _pick(states, (0, k + i))
        for field, old, new in zip(before._fields, before, after, strict=True):
            assert old.dtype == new.dtype, field
            if field == "nonfinite_count":
                assert new == old + i + 1
            else:
                assert old.tobytes() == new.tobytes(), field
        assert np.all(products[0, k + i] == 0)
    final_dirty, final_clean = (
        _pick(states, (0, len(dirty) - 1)),
        _pick(states, (1, len(clean) - 1)),
    )
    assert int(final_dirty.nonfinite_count) == 4
    assert_same_sketch(final_dirty._replace(nonfinite_count=0), final_clean, 1e-6)


def _extreme_streams(dim, seed):
    """Rows of norm ~1e30, ~1e-30 and of norms spread log-uniformly over [1e-30, 1e30]."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((BATCH, T, dim)) * np.geomspace(1, 0.1, dim)
    base /= np.linalg.norm(base, axis=-1, keepdims=True)
    base[:, 9::11] = 0  # zero rows too
    norms = np.stack(
        [
            1e30 * np.exp(rng.normal(0, 0.3, T)),
            1e-30 * np.exp(rng.normal(0, 0.3, T)),
            10.0 ** rng.uniform(-30, 30, T),
        ]
    )
    return (base * norms[..., None]).astype(np.float32)


@pytest.mark.parametrize("name", ALL)
def test_extreme_magnitudes_float32(name):
    """Rows of norm 1e30 and 1e-30 in float32: the state stays finite and the covariance, rebuilt
    from ``low_rank``'s scaled factors (the true one over/underflows float32), matches the float64
    reference relatively after every row.

    Oja's rule is not scale-invariant: with ``Gamma_t |g|^2 ~ 1e60`` the matrix
    ``V + Gamma V g g^T`` is rank-one to 60 digits and its orthonormalization is arbitrary in any
    precision, so for the 1e30 streams Oja is held to what stays well defined: orthonormal
    directions and ``trace C_t <= trace A_t^T A_t``. CFD's "non-zero" eigenvalue is a threshold
    decision: with norms spread over 60 orders of magnitude (stream 2) some sketched eigenvalues
    fall between float32's and float64's resolution and get the compensation in the reference
    only, so CFD is compared on streams 0 and 1."""
    dim, _ = CONFIGS["generic"]
    streams = _extreme_streams(dim, seed=4)
    tol = 1e-3 if name in CFD else 1e-4  # see test_matches_reference_float32
    check = {"oja": [1], **dict.fromkeys(CFD, [0, 1])}.get(name)
    lr, _, _, states = check_against_reference(
        name, "generic", streams, jnp.float32, tol, check=check, covariance=False
    )
    for field, x in zip(states._fields, states, strict=True):
        if np.issubdtype(x.dtype, np.floating):
            assert np.all(np.isfinite(x)), field
    for x in (lr.eigenvalues, lr.alpha, lr.coef):
        assert np.all(np.isfinite(x))
    assert np.all(states.nonfinite_count == 0)
    assert states.scale_exp[0, -1] > 90  # the scale was needed
    assert states.scale_exp[1, -1] < -90 or name in ("rfd", "rfd_lazy")  # (alpha0 = 0.25 rules)
    if name == "oja":
        d = states.directions.astype(np.float64)
        assert np.max(np.abs(d @ np.swapaxes(d, -1, -2) - np.eye(d.shape[-2]))) <= 1e-5
        trace = np.trace(assemble(lr), axis1=-2, axis2=-1)
        exact = np.trace(gram_prefixes(streams.astype(np.float64)), axis1=-2, axis2=-1)
        assert np.all(trace <= exact * (1 + 1e-4))


@pytest.mark.parametrize("name", ALL)
def test_zero_rows(name):
    """An all-zero stream: finite state, covariance ``alpha0 I``, every eigenvalue 0 and every
    ``factors`` row exactly zero."""
    dim, _ = CONFIGS["generic"]
    streams = np.zeros((1, 20, dim), np.float32)
    _, cov, (v, lam, _), states, _ = run_batch(name, "generic", streams, jnp.float32)
    alpha0 = (SPECS[name][1] or {}).get("alpha0", 0.0)
    np.testing.assert_array_equal(cov, np.broadcast_to(alpha0 * np.eye(dim), cov.shape))
    np.testing.assert_array_equal(lam, 0)
    np.testing.assert_array_equal(v, 0)
    assert int(states.count[0, -1]) == 20 and int(states.nonfinite_count[0, -1]) == 0


@pytest.mark.parametrize("name", ["fast_rfd", "oja", "rp"])
def test_size_zero_rows(name):
    sketch = make(name, 3)
    state = sketch.update_many(sketch.init(0), jnp.zeros((5, 0)))
    v, lam, _ = sk.factors(state)
    assert int(state.count) == 5 and v.shape[1] == 0 and np.all(np.asarray(lam) == 0)
    assert sk.covariance(state).shape == (0, 0)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state) if x.dtype.kind == "f")


@pytest.mark.parametrize("name", ["fast_rfd", "oja"])
def test_low_precision_rows_give_float32_state(name):
    """bf16 rows (and a bf16/fp16 ``init`` dtype) keep a float32 sketch; the result equals feeding
    the same rows upcast to float32."""
    dim, tau = CONFIGS["generic"]
    sketch = make(name, tau)
    for dtype in (jnp.bfloat16, jnp.float16):
        floats = {x.dtype for x in jax.tree.leaves(sketch.init(dim, dtype)) if x.dtype.kind == "f"}
        assert floats == {np.dtype(np.float32)}
    rows = jnp.asarray(fixed_streams("generic", seed=5)[0, :12], jnp.bfloat16)
    state_bf16 = state32 = sketch.init(dim, jnp.bfloat16)
    update_bf16 = jax.jit(sketch.update)
    for row in rows:
        state_bf16 = update_bf16(state_bf16, row)
        state32 = _update_fn(name, tau)(state32, row.astype(jnp.float32))
    assert jax.tree.map(lambda x: x.dtype, state_bf16) == jax.tree.map(lambda x: x.dtype, state32)
    assert_same_sketch(state_bf16, state32, 1e-6)


def test_no_nan_op_by_op():
    """Op by op (``disable_jit``) under ``debug_nans``: zero, repeated (rank-deficient) and
    ordinary rows never produce a NaN in the per-step FD update (which includes the shrink) or in
    ``factors``, not even in an intermediate. (Op by op is slow: every primitive compiles on its
    own, so this runs for one sketch.)"""
    dim, tau = 5, 2
    sketch = make("fd", tau)
    rng = np.random.default_rng(6)
    g, h = rng.standard_normal((2, dim)).astype(np.float32)
    rows = [np.zeros(dim), g, g, 2 * g, np.zeros(dim), h, -g]
    with jax.debug_nans(True), jax.disable_jit():
        state = sketch.init(dim)
        for row in rows:
            state = sketch.update(state, jnp.asarray(row, jnp.float32))
            sk.factors(state)
    assert int(state.count) == len(rows)


@pytest.mark.parametrize("name", ["fd", "oja"])
def test_no_nan_with_extreme_rows(name):
    """Under ``debug_nans`` with the un-jitted update (every ``jnp`` call's result is checked):
    rows of norm 1e30 and 1e-30 and zero rows in float32 never produce a NaN.

    (Inside ``jnp.ldexp`` itself JAX forms ``0 * 2**e = 0 * inf`` for a zero input and
    ``e > 128`` before masking it, so ``disable_jit`` would flag JAX's ldexp, not the sketch.)"""
    dim, tau = 5, 2
    sketch = make(name, tau)
    rng = np.random.default_rng(7)
    g, h = rng.standard_normal((2, dim)).astype(np.float32)
    rows = [g, 1e30 * h, np.zeros(dim), -1e-30 * g, 1e-30 * h, 1e30 * g, g]
    with jax.debug_nans(True):
        state = sketch.init(dim)
        for row in rows:
            state = sketch.update(state, jnp.asarray(row, jnp.float32))
            lr = sk.low_rank(state)
            sk.factors(state)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state) if x.dtype.kind == "f")
    assert np.all(np.isfinite(np.asarray(lr.eigenvalues))) and int(state.count) == len(rows)


@pytest.mark.parametrize("fast", [False, True])
def test_blocked_rotation_matches_the_plain_matmul(monkeypatch, fast):
    """On one CPU device a wide sketch is rotated in place over column blocks (with the Woodbury
    residual of ADA-FD's solve taken from the same tiles), and ``B g`` of a long row is taken
    unscaled at ordinary magnitudes; narrow sketches use one matmul and a pre-scaled row.
    Lowering both thresholds runs the wide paths (ragged tail, and huge and tiny rows, included)
    at a small ``dim``: they must give the same sketch and ADA-FD updates, and a NaN row must
    leave the sketch bit-identical (signed zeros too).

    The two paths are different programs, and the rows after a shrink are eigenvectors of the
    small Gram matrix, each defined only up to its sign (and up to a rotation within a repeated
    eigenvalue): the paths are free to choose differently (a plain ``eigh`` on two CPUs may too).
    So the sketches are compared through what is unique, ``B^T B``, ``alpha``, the compensation
    and the counters (:func:`assert_same_sketch`); only the NaN step, within one program, is
    checked bit for bit."""
    import sketchopt as so

    dim, tau = 70, 4  # 4 blocks of 16 columns and a tail of 6
    rng = np.random.default_rng(11)
    grads = rng.standard_normal((9, dim))
    grads[3] = 0.0
    grads[5, 7] = np.nan
    grads[6, :5] = -0.0
    grads[7] *= 1e30
    grads[8] *= 1e-30

    def run(block, min_dim):
        monkeypatch.setattr(sk, "_ROTATION_BLOCK", block)
        monkeypatch.setattr(sk, "_GRAM_BLOCK", block)
        monkeypatch.setattr(sk, "_UNSCALED_MIN_DIM", min_dim)
        tx = so.ada_fd(0.5, tau, 0.1, fast=fast, robust=False)
        params = jnp.zeros((dim,), jnp.float64)
        state = tx.init(params)
        step = jax.jit(tx.update)  # traced anew for each block width
        updates, states = [], []
        for g in grads:
            u, state = step(jnp.asarray(g), state, params)
            updates.append(np.asarray(u))
            states.append(_to_numpy(state.metric_state.leaf(0)))  # the one leaf
        return np.array(updates), states

    with x64():
        u_blocked, s_blocked = run(16, 0)
        u_plain, s_plain = run(8192, 2**15)
    for t in range(len(grads)):  # per step: the updates and sketches span 60 orders of magnitude
        scale = np.abs(u_plain[t]).max()
        assert np.max(np.abs(u_blocked[t] - u_plain[t])) <= 1e-12 * scale, t
        assert_same_sketch(s_blocked[t], s_plain[t], 1e-12, where=t)
    np.testing.assert_array_equal(u_blocked[5], 0)  # the NaN step is skipped ...
    for states in (s_blocked, s_plain):  # ... bit for bit, -0.0 included, by either program
        for field, old, new in zip(states[4]._fields, states[4], states[5], strict=True):
            assert old.dtype == new.dtype and old.tobytes() == new.tobytes(), field


@pytest.mark.parametrize("accelerator", [False, True])
@pytest.mark.parametrize("exp", [0, 70, -70])
def test_exact_gram_refresh_on_both_paths(monkeypatch, exp, accelerator):
    """The Gram matrix's exact refresh (every 32 shrinks), summed over column blocks on the CPU
    path (ragged tail included) or taken in one product on the accelerator path, matches the
    float64 Gram matrix of the rows, at ordinary scales and where an unscaled product would
    overflow or underflow float32."""
    import sketchopt as so

    monkeypatch.setattr(sk, "_GRAM_BLOCK", 16)  # 4 blocks and a tail of 6 at dim 70
    monkeypatch.setattr(sk, "_UNSCALED_MIN_DIM", 0)
    tau, dim = 4, 70
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((tau + 31, dim)) * np.geomspace(1, 0.1, dim) * 2.0**exp
    sketch = sk.frequent_directions(tau, lazy=False)
    with so.accelerator_path(accelerator):  # a new function: JAX's cache does not key on it
        state = jax.jit(lambda s, r: sketch.update_many(s, r))(
            sketch.init(dim), jnp.asarray(rows, jnp.float32)
        )
    b = np.asarray(state.rows, np.float64) / 2.0 ** int(state.scale_exp)
    np.testing.assert_allclose(np.asarray(state.gram, np.float64), b @ b.T, rtol=1e-5, atol=1e-5)


PER_STEP_FD = [name for name in FD_FAMILY if not SPECS[name][1].get("fast")]


@pytest.mark.parametrize("name", PER_STEP_FD)
def test_per_step_fd_leaves_its_gram_matrix_diagonal_and_reads_it_so(name):
    """Per-step FD refreshes its Gram matrix from the rows before the shrink, whose ``eigh``
    then leaves ``diag(shrunk)``: after every update, refreshes included (every 32 shrinks), the
    matrix is exactly diagonal, and the sketch's own reading (``reader``, no ``eigh``) gives
    ``low_rank``'s covariance. The doubling buffer's is not diagonal between shrinks: it keeps
    ``low_rank``."""
    tau, dim = 4, 10
    rows = np.random.default_rng(5).standard_normal((80, dim)) * np.geomspace(1, 0.05, dim)
    sketch = make(name, tau)
    states, _ = _trajectory_fn(name, tau)(sketch.init(dim), jnp.asarray(rows, jnp.float32))
    gram = np.asarray(states.gram)
    off = ~np.eye(tau, dtype=bool)
    np.testing.assert_array_equal(gram[:, off], 0)

    def dense(lr):  # the covariance a LowRank reading gives
        v = lr.directions()
        return (v.T * lr.true_eigenvalues()) @ v + lr.true_alpha() * jnp.eye(dim)

    read = jax.jit(jax.vmap(lambda s: dense(sk.reader(sketch)(s))))
    general = jax.jit(jax.vmap(lambda s: dense(sk.low_rank(s))))
    # two programs: equal up to float32 rounding of the products (XLA fuses them differently)
    np.testing.assert_allclose(read(states), general(states), rtol=1e-4, atol=1e-4)
    assert sk.reader(sk.frequent_directions(tau, fast=True)) is sk.low_rank


def test_a_vmapped_per_step_fd_solve_makes_one_eigendecomposition():
    """Under ``vmap`` (a grid of learning rates, say) every ``lax.cond`` runs both branches: a
    run-time check for a diagonal Gram matrix would still call ``eigh``. The metric reads per-step
    FD's diagonal without one, so its update makes the shrink's ``eigh`` only."""
    import sketchopt as so

    metric = so.metrics.sketched(sk.frequent_directions(4), delta=1.0)
    states = jax.vmap(lambda _: metric.init((10,)))(jnp.arange(3))
    grads = jnp.ones((3, 10))
    update = jax.jit(jax.vmap(lambda s, g: metric.update(s, g)[2]))
    program = update.lower(states, grads).compile().as_text()
    calls = [line for line in program.splitlines() if "custom-call(" in line]
    assert sum("syevd" in line or "heevd" in line for line in calls) == 1


# ----------------------------------------------------------------------------------------------
# The protocol: fixed return shapes, the fused entry, the random projection's draw.


@pytest.mark.parametrize("name", CODE_PATHS + ["fast_fd"])
def test_absorb_solve_is_absorb_plus_the_woodbury_residual(name):
    """``absorb_solve`` returns the same ``Absorbed`` fields for every sketch; its state and
    product are ``absorb``'s, and its residual is ``row - basis^T lift(...)`` whether the sketch
    fuses it into its rotation (per-step FD) or takes it afterwards (doubling FD, Oja, RP)."""
    sketch, d = make(name, 3), 7
    rng = np.random.default_rng(0)
    with x64():
        state = sketch.init(d, jnp.float64)
        for _ in range(4):  # past the first shrink
            state = sketch.update(state, jnp.asarray(rng.normal(size=d)))
        row = jnp.asarray(rng.normal(size=d))
        a = jnp.asarray(rng.normal(size=sk.low_rank(state).basis.shape[0]))
        plain = sketch.absorb(state, row)
        out = sketch.absorb_solve(state, row)
        lifted = sketch.absorb_solve(state, row, True, lambda s, p: a)
        assert isinstance(out, sk.Absorbed) and len(plain) == 2 and out.residual is None
        assert (out.drawn is not None) == (name == "rp")
        chex.assert_trees_all_close(out.state, plain[0], rtol=0, atol=0)  # the same program
        # The fused rotation is another program: compare what is unique, not the raw rows.
        np.testing.assert_allclose(
            sk.covariance(lifted.state), sk.covariance(out.state), rtol=1e-12, atol=1e-12
        )
        np.testing.assert_array_equal(out.product, plain[1])
        basis = np.asarray(sk.low_rank(lifted.state).basis)
        np.testing.assert_allclose(lifted.residual, row - a @ basis, rtol=1e-12, atol=1e-12)


def test_random_projection_hands_back_the_direction_it_drew():
    """``S_t - S_{t-1} = r_t g_t^T`` with ``r_t`` the ``drawn`` vector: RP-SON reads it there."""
    sketch = sk.random_projection(4, jax.random.PRNGKey(3))
    with x64():
        state = sketch.init(6, jnp.float64)
        g = jnp.arange(1.0, 7.0)
        out = sketch.absorb_solve(state, g)
        np.testing.assert_allclose(out.state.rows - state.rows, np.outer(out.drawn, g), rtol=1e-14)


def test_random_projection_refuses_a_row_that_could_overflow_its_rows():
    """``S`` is kept in true units and never re-read for finiteness (``GUARDED``): a finite row
    that could take an entry past float32's range is refused, the state bit-identical but for
    ``nonfinite_count``; rows that fit are still taken at any scale."""
    sketch = sk.random_projection(4, jax.random.PRNGKey(3))
    state = sketch.update(sketch.init(6), jnp.full(6, 3e37))  # |S| up to ~3e37 |r|
    assert int(state.count) == 1 and np.all(np.isfinite(state.rows))
    after = sketch.update(state, jnp.full(6, 3e38))
    for field, old, new in zip(state._fields, state, after, strict=True):
        if field == "nonfinite_count":
            assert int(new) == int(old) + 1
        else:
            assert np.asarray(old).tobytes() == np.asarray(new).tobytes(), field
    tiny = sketch.update(sketch.init(6), jnp.full(6, 1e-30))
    huge = sketch.update(tiny, jnp.full(6, 1e30))
    assert int(huge.count) == 2 and int(huge.nonfinite_count) == 0


def test_a_sketch_built_with_the_fields_of_0_2_still_drives_a_metric():
    """``Sketch(...)`` with 0.2's eight fields has no ``absorb_solve``: ``metrics.sketched``
    falls back on ``absorb(..., lift=)`` and solves exactly as with the full sketch."""
    from sketchopt import metrics

    full = sk.frequent_directions(3)
    legacy = sk.Sketch(*full[:8])
    assert legacy.absorb_solve is None
    rng = np.random.default_rng(1)
    with x64():
        results = []
        for sketch in (full, legacy):
            metric = metrics.sketched(sketch, 0.1)
            state = metric.init((5,), jnp.float64)
            for _ in range(4):
                state, op, solved = metric.update(state, jnp.asarray(rng.normal(size=5)))
            results.append(solved)
            rng = np.random.default_rng(1)
        np.testing.assert_allclose(results[0], results[1], rtol=1e-12, atol=0)
