"""The subsampled randomized DCT ``Pi`` of RADAGRAD and ADA-LR (Krummenacher et al. 2016).

``Pi g = sqrt(d / k) * P C (D g)`` (``tau x d``) with ``D`` random signs, ``C`` the orthonormal
DCT-II (a real Fourier transform) and ``P`` ``k = min(tau, d)`` coordinates sampled without
replacement; zero rows pad ``Pi`` up to ``tau``. ``Pi`` is never stored: a state keeps the signs
(int8) and the sampled indices (:func:`init`). RADAGRAD applies it to one vector per step through
the FFT (:func:`apply`, ``O(d log d)``); ADA-LR, which multiplies a ``d x d`` matrix by ``Pi^T``
anyway, builds it explicitly (:func:`matrix`, ``O(tau d)``): no FFT of a large, possibly sharded
matrix. Package-internal: the metrics of :mod:`sketchopt.metrics` use it, the tests pin it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt._partitioning import replicate

__all__ = ["apply", "init", "matrix", "mulmod"]


def init(key, dim, sketch_size):
    """Random signs (int8) and ``min(tau, d)`` sampled coordinates of the randomized DCT."""
    k_signs, k_idx = jax.random.split(key)
    signs = jax.random.rademacher(k_signs, (dim,), jnp.int8)
    idx = jax.random.permutation(k_idx, dim)[: min(sketch_size, dim)]
    return signs, idx.astype(jnp.int32)


def apply(x, signs, idx, sketch_size):
    """``Pi x = sqrt(d / k) P DCT(D x)`` along the last axis (zero-padded to ``tau`` rows)."""
    d = x.shape[-1]
    if d == 0:
        return jnp.zeros(x.shape[:-1] + (sketch_size,), x.dtype)
    # The DCT mixes all of d: under an explicit mesh it runs on the gathered d-vector (the
    # tau x d sketch itself is never gathered), which also lets the take below read any index.
    x = replicate(x) * replicate(signs).astype(x.dtype)
    # The orthonormal DCT-II of length 1 is the identity (and XLA's CPU FFT rejects that size).
    y = x if d == 1 else jax.scipy.fft.dct(x, type=2, norm="ortho", axis=-1)
    # Scale by the number of coordinates actually kept (min(tau, d)): with tau > d the padded
    # rows are zero and Pi must stay an isometry, or RADAGRAD would not reduce to ADA-FULL.
    y = jnp.take(y, idx, axis=-1) * jnp.asarray(np.sqrt(d / idx.shape[0]), x.dtype)
    pad = sketch_size - idx.shape[0]
    if pad:
        y = jnp.concatenate([y, jnp.zeros(y.shape[:-1] + (pad,), y.dtype)], axis=-1)
    return y


def mulmod(a, b, n):
    """``a * b mod n`` for int32 ``0 <= a, b < n <= 2**24``, exact also where ``a b`` overflows.

    The float32 quotient ``q ~ a b / n`` is off by a few units at most, so ``a b - q n`` is small:
    int32 arithmetic, which wraps modulo ``2**32``, gets it exactly, and the final ``mod`` corrects
    ``q``.
    """
    q = jnp.floor(a.astype(jnp.float32) * b.astype(jnp.float32) / n).astype(jnp.int32)
    return jnp.remainder(a * b - q * n, n)


def matrix(signs, idx, sketch_size, dtype):
    """``Pi = sqrt(d / k) P C D`` (``tau x d``, the projection of Ada-FD eq. 3) built explicitly:
    the matrix that :func:`apply` applies through the FFT, with zero rows below the
    ``k = min(tau, d)`` sampled ones.

    Row ``i < k`` is ``sqrt(d / k) C[idx_i, :] * signs`` with the orthonormal DCT-II
    ``C[m, j] = sqrt(2 / d) cos(pi (2j + 1) m / (2d))`` (row ``m = 0`` divided by ``sqrt(2)``).
    The phase ``(2j + 1) m`` is reduced modulo ``4d`` in exact integer arithmetic, so the cosine
    is as accurate for large ``d`` as for small. ``O(tau d)`` work.
    """
    d, k = signs.shape[0], idx.shape[0]
    if d == 0:
        return jnp.zeros((sketch_size, 0), dtype)
    m = idx[:, None]
    phase = mulmod(m, 2 * jnp.arange(d, dtype=jnp.int32)[None, :] + 1, 4 * d)
    cosines = jnp.cos(phase.astype(dtype) * (np.pi / (2 * d)))
    # sqrt(d / k) times C's row scale, sqrt(1 / d) for m = 0 and sqrt(2 / d) otherwise
    scale = jnp.where(m == 0, np.sqrt(1 / k), np.sqrt(2 / k)).astype(dtype)
    pi = scale * cosines * signs.astype(dtype)
    return jnp.pad(pi, ((0, sketch_size - k), (0, 0)))
