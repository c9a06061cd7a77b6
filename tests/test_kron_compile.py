"""A leaf's sides stepped as one ``vmap`` (``sketchopt.kron.absorb_sides``,
``sketchopt.kron.inverse_roots``): the same sketches and inverse roots as side by side (float64,
to rounding), and fewer kernels in the compiled program (a structural check, not a timing)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sketchopt import kron


def _gram(state):
    """The factor's statistic in true units, ``4**exp (rows^T rows + alpha I)``: rows are
    defined only up to sign and rotation, their statistic is not."""
    rows = np.asarray(state.rows, np.float64)
    dim = rows.shape[1]
    return 4.0 ** int(state.exp) * (rows.T @ rows + float(state.alpha) * np.eye(dim))


def _root_matrix(root):
    basis = np.asarray(root.basis, np.float64)
    return float(root.tail) * np.eye(basis.shape[1]) + basis.T @ (
        np.asarray(root.coef)[:, None] * basis
    )


def _sides(shape, steps, *, robust, decay, compress, dtype, seed=0):
    """Both sides after ``steps`` gradients of ``shape``, stepped one by one and as one vmap."""
    rng = np.random.default_rng(seed)
    m, n = shape
    one = (kron.factor_init(8, m, dtype), kron.factor_init(8, n, dtype))
    both = one
    opts = dict(block_size=3, robust=robust, decay=decay)

    @jax.jit
    def step(one, both, g, key):
        streams = kron.streams(g, sketch_size=8, block_size=3, compress=compress, key=key)
        one = tuple(kron.absorb(s, st, **opts) for s, st in zip(one, streams, strict=True))
        return one, kron.absorb_sides(both, streams, **opts)

    for t in range(steps):
        # a low-rank part and a changing scale, so that blocks shrink and exponents move
        g = rng.standard_normal((m, 2)) @ rng.standard_normal((2, n)) * 10.0 ** (t - 2)
        g = jnp.asarray(g + 0.1 * rng.standard_normal((m, n)), dtype)
        one, both = step(one, both, g, jax.random.PRNGKey(t))
    return one, both


@pytest.mark.parametrize(
    "shape, robust, decay, compress",
    [
        ((6, 20), True, None, "auto"),  # 7 blocks (scanned) beside 2
        ((20, 5), False, 0.9, "auto"),  # a side of dim 5 < k: zero rows padded
        ((9, 9), True, None, "range"),  # compressed streams, one block each
    ],
)
def test_absorb_sides_matches_side_by_side_float64(shape, robust, decay, compress):
    with jax.enable_x64(True):
        one, both = _sides(shape, 3, robust=robust, decay=decay, compress=compress,
                           dtype=jnp.float64)  # fmt: skip
        for a, b in zip(one, both, strict=True):
            assert b.rows.shape == a.rows.shape and b.rows.dtype == a.rows.dtype
            assert int(b.exp) == int(a.exp)
            ga, gb = _gram(a), _gram(b)
            np.testing.assert_allclose(gb, ga, rtol=0, atol=1e-10 * np.abs(ga).max())
            np.testing.assert_allclose(float(b.alpha), float(a.alpha), rtol=1e-10, atol=1e-300)
        roots_one = [kron.inverse_root(s, p, 1e-3) for s, p in zip(one, (0.25, 0.5), strict=True)]
        roots_both = kron.inverse_roots(both, (0.25, 0.5), 1e-3)
        for a, b in zip(roots_one, roots_both, strict=True):
            assert b.basis.shape == a.basis.shape and b.coef.shape == a.coef.shape
            ra, rb = _root_matrix(a), _root_matrix(b)
            np.testing.assert_allclose(rb, ra, rtol=0, atol=1e-9 * np.abs(ra).max())


def test_inverse_roots_relative_and_empty():
    """``relative`` reads each side's own largest eigenvalue; an empty factor's root is
    ``eps**-p I`` on both paths."""
    with jax.enable_x64(True):
        _, (left, right) = _sides((7, 4), 2, robust=True, decay=None, compress="auto",
                                  dtype=jnp.float64)  # fmt: skip
        empty = kron.factor_init(8, 3, jnp.float64)
        states = (left, right, empty)
        powers = (0.25, 0.25, 0.5)
        for a, b in zip(
            [
                kron.inverse_root(s, p, 1e-2, relative=True)
                for s, p in zip(states, powers, strict=True)
            ],
            kron.inverse_roots(states, powers, 1e-2, relative=True),
            strict=True,
        ):
            ra, rb = _root_matrix(a), _root_matrix(b)
            np.testing.assert_allclose(rb, ra, rtol=1e-10, atol=1e-12 * np.abs(ra).max())
        np.testing.assert_allclose(
            _root_matrix(kron.inverse_root(empty, 0.5, 1e-2)), 10 * np.eye(3)
        )


def test_absorb_sides_float32():
    """float32: the sides' sketches agree with side by side to float32 rounding."""
    one, both = _sides((12, 30), 3, robust=True, decay=None, compress="auto", dtype=jnp.float32)
    for a, b in zip(one, both, strict=True):
        ga, gb = _gram(a), _gram(b)
        np.testing.assert_allclose(gb, ga, rtol=0, atol=1e-4 * np.abs(ga).max())


def _sides_program_eigh_sites(dims, counts):
    """Eigensolver call sites of ``absorb_sides`` for empty factors of sides ``dims`` (sketch
    size 32) taking ``counts`` zero vectors each, in blocks of 32."""
    states = tuple(kron.factor_init(32, d, jnp.float32) for d in dims)
    vectors = tuple(jnp.zeros((c, d), jnp.float32) for c, d in zip(counts, dims, strict=True))

    def absorbed(states, vectors):
        streams = tuple(kron.Stream(v, jnp.int32(0), jnp.float32(0)) for v in vectors)
        return kron.absorb_sides(states, streams, block_size=32, robust=True)

    return _compiled_eigh_sites(absorbed, states, vectors)


def test_a_costly_padding_is_stepped_side_by_side():
    """A leaf whose padded sides would cost far more than its own (a long side beside a short
    one) is absorbed as by :func:`absorb`, one solver call per block of each side (1 + 2); a
    small one is padded and its blocks scanned (one call per side: 2); a single side is
    :func:`absorb` (its 2 blocks unrolled: 2)."""
    assert _sides_program_eigh_sites((4096, 8), (8, 64)) == 3
    assert _sides_program_eigh_sites((64, 40), (40, 64)) == 2
    assert _sides_program_eigh_sites((64,), (40,)) == 2


def _compiled(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def _compiled_eigh_sites(fn, *args) -> int:
    """How many places of the compiled program call LAPACK's symmetric eigensolver."""
    return len(
        re.findall(r"custom-call\(.*?custom_call_target=\"[^\"]*syevd", _compiled(fn, *args))
    )


def test_sides_share_one_sides_kernels():
    """The README MLP's first kernel (64 x 128, sketch size 32): side by side, the update's
    program calls the eigensolver once per block of each side (4 + 2); padded to one shape and
    scanned (the CPU), once per side, and it has fewer kernels."""
    mat = jnp.asarray(np.random.default_rng(0).standard_normal((64, 128)), jnp.float32)
    sides = (kron.factor_init(32, 64, jnp.float32), kron.factor_init(32, 128, jnp.float32))
    opts = dict(block_size=32, robust=True)

    def step(sides, mat, together):
        streams = kron.streams(
            mat, sketch_size=32, block_size=32, compress="auto", key=jax.random.PRNGKey(0)
        )
        if together:
            new = kron.absorb_sides(sides, streams, **opts)
            return kron.inverse_roots(new, (0.25, 0.25), 1e-6)
        new = tuple(kron.absorb(s, t, **opts) for s, t in zip(sides, streams, strict=True))
        return tuple(kron.inverse_root(s, 0.25, 1e-6) for s in new)

    apart = _compiled(lambda s, g: step(s, g, False), sides, mat)
    together = _compiled(lambda s, g: step(s, g, True), sides, mat)
    sites = [len(re.findall(r"custom_call_target=\"[^\"]*syevd", t)) for t in (apart, together)]
    assert sites == [6, 2]
    fusions = [len(re.findall(r" fusion\(", t)) for t in (apart, together)]
    assert fusions[1] < 0.8 * fusions[0]  # measured 74 -> 52
