"""Shared numerics: power-of-two scaling, exponents, safe norms, small eigendecompositions, dtypes.

Every quadratic quantity of a sketch (Gram matrices, eigenvalues, ridges) is stored divided by
``4**e`` for a power-of-two scale ``e`` chosen from the data, so that rows of norm ``1e30`` or
``1e-30`` in float32 neither overflow nor underflow and no non-finite matrix ever reaches an
eigendecomposition (``docs/design.md``, "Bad input"). This module holds the few primitives that make
that possible, used by every family:

* :func:`ldexp` -- ``x * 2**e``, exact and cheap for one integer exponent;
* :func:`exponent`, :func:`rescale_exponent` -- the scale of a number and of a sketch plus a row;
* :func:`mantissa_exponent`, :func:`mantissa_exponent_add` -- non-negative numbers as
  ``(m, q)`` pairs, for sums of terms whose powers of two differ by more than the range;
* :func:`safe_norm` -- a Euclidean norm that neither overflows nor underflows;
* :func:`denoise_residual` -- a projection's residual with its round-off removed;
* :func:`eigh_desc` -- a small symmetric PSD eigendecomposition, descending, round-off zeroed;
* :func:`state_dtype` -- states are at least float32 (float64 when enabled and asked for).

Complex states (complex64/complex128 parameters, see :mod:`sketchopt.metrics`, "Complex
parameters"): :func:`ldexp` scales the real and imaginary parts by the same real power of two,
:func:`exponent` and :func:`mantissa_exponent` read the modulus, :func:`safe_norm` is the
Hermitian norm, :func:`eigh_desc` takes the Hermitian part (``(G + G^H) / 2``) and returns real
eigenvalues, and :func:`conj` / :func:`abs2` / :func:`real_dtype` are the three small helpers the
families use to write their Hermitian forms. Every branch on complex input is static (decided by
the dtype at trace time): real programs are unchanged.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt import _solvers

__all__ = [
    "BIG_EXPONENT",
    "HIGHEST",
    "NO_EXPONENT",
    "abs2",
    "conj",
    "eigh_desc",
    "zero_round_off_eigenvalues",
    "exponent",
    "flat_size",
    "ldexp",
    "mantissa_exponent",
    "mantissa_exponent_add",
    "real_dtype",
    "rescale_exponent",
    "denoise_residual",
    "safe_norm",
    "state_dtype",
]

#: Matmul precision of every contraction in the library: float32 products at full precision on
#: accelerators (TPU and GPU default to bf16/tf32 passes), a no-op on CPU.
HIGHEST = jax.lax.Precision.HIGHEST
#: The exponent of "no scale information yet" (an all-zero sketch, a zero row, a zero mantissa):
#: so negative that ``ldexp`` by it gives 0 for every finite number.
NO_EXPONENT = -(2**20)
#: An exponent larger than any a finite number of any dtype has (the identity of ``min``).
BIG_EXPONENT = 2**20


def state_dtype(dtype) -> jnp.dtype:
    """The dtype a state is kept in: at least float32 (bf16/fp16 parameters keep a float32
    sketch), float64 when ``jax_enable_x64`` is on and ``dtype`` is float64."""
    return jnp.promote_types(jnp.dtype(dtype), jnp.float32)


def real_dtype(dtype) -> jnp.dtype:
    """The real dtype of ``dtype``: float32 for complex64, float64 for complex128, else itself
    (the dtype of a complex state's real-valued parts: eigenvalues, ridges, accumulators)."""
    dtype = jnp.dtype(dtype)
    return jnp.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.complexfloating) else dtype


def conj(x):
    """``conj(x)`` for complex ``x``, ``x`` itself (no operation at all) for real ``x``: the one
    place a Hermitian form (``g g^H``, ``V^H``) differs from its real one."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def abs2(x):
    """``|x|^2`` elementwise, real: ``square(x)`` for real ``x`` (the same program as before),
    ``re^2 + im^2`` for complex ``x``."""
    if jnp.iscomplexobj(x):
        return jnp.square(jnp.real(x)) + jnp.square(jnp.imag(x))
    return jnp.square(x)


def flat_size(shape_or_dim) -> int:
    """The flattened size of a leaf given its shape (a tuple) or its size (an int)."""
    if isinstance(shape_or_dim, (tuple, list)):
        return math.prod(int(s) for s in shape_or_dim)
    return int(shape_or_dim)


def _pow2(e, dtype):
    """``2**e`` in ``dtype`` for an int32 ``e`` in the normal range, built from its bits: the
    biased exponent shifted into place. ``jnp.ldexp`` takes a ``frexp`` and a floating ``pow``
    instead; at some twenty calls per sketch step that was a third of the step's compiled
    program."""
    info = jnp.finfo(dtype)
    bits = np.dtype(f"int{info.bits}")
    biased = jax.lax.convert_element_type(jax.lax.add(e, np.int32(1 - int(info.minexp))), bits)
    shifted = jax.lax.shift_left(biased, bits.type(info.nmant))
    return jax.lax.bitcast_convert_type(shifted, dtype)


def ldexp(x, e):
    """``x * 2**e`` exactly, as ``jnp.ldexp``, but cheap when ``e`` is one integer.

    ``jnp.ldexp`` decomposes every element (a ``frexp`` and a ``pow`` each): over a ``d``-sized
    gradient that cost about 5x a multiply, and the sketches rescale ``g`` at every step. With a
    scalar ``e`` the power of two is formed once, as (at most) three normal powers of two
    multiplied in one after the other: exact wherever the result is a normal number, and never
    ``0 * inf`` (``e`` is first clipped to where the result is already ``0`` or ``inf`` for every
    ``x``). An array of exponents falls back to ``jnp.ldexp``. Written in ``lax`` primitives with
    NumPy constants: it runs some twenty times per sketch step, and every ``jnp`` call costs
    trace time of its own.

    Complex ``x``: the real and imaginary parts are scaled by the same power of two (exact
    wherever each part is a normal number).
    """
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x):
        return jax.lax.complex(ldexp(jnp.real(x), e), ldexp(jnp.imag(x), e))
    if jnp.ndim(e) != 0 or not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.ldexp(x, e)
    info = jnp.finfo(x.dtype)
    lo, hi = np.int32(info.minexp), np.int32(int(info.maxexp) - 1)
    span = np.int32(hi - lo + int(info.nmant) + 2)  # |e| beyond this leaves only 0 or +-inf
    # Two clipped parts leave a remainder within [lo, hi] for every IEEE format (at most
    # nmant + 3 away from 0), so the third part needs no clip.
    assert span - 2 * min(-lo, hi) <= min(-lo, hi)
    rest = jax.lax.clamp(-span, jax.lax.convert_element_type(e, np.int32), span)
    first = jax.lax.clamp(lo, rest, hi)
    rest = jax.lax.sub(rest, first)
    second = jax.lax.clamp(lo, rest, hi)
    for part in (first, second, jax.lax.sub(rest, second)):
        x = jax.lax.mul(x, jax.lax.broadcast(_pow2(part, x.dtype), x.shape))
    return x


def exponent(x):
    """The power-of-two exponent ``e`` with ``2**(e-1) <= x < 2**e`` (:data:`NO_EXPONENT` for 0);
    of the modulus ``|x|`` for complex ``x``."""
    if jnp.iscomplexobj(x):
        x = jnp.abs(x)
    _, e = jnp.frexp(x)
    return jnp.where(x > 0, e, NO_EXPONENT).astype(jnp.int32)


def rescale_exponent(old_exp, row_max, quadratic_max):
    """The new scale exponent covering an incoming row and the current (scaled) state.

    ``row_max`` is the largest ``|entry|`` of the row; ``quadratic_max`` the largest quadratic
    quantity of the state in its scaled units (a Gram diagonal, an eigenvalue, a ridge), stored
    divided by ``4**old_exp``. Returns ``old_exp`` when neither carries any scale (all zero).
    Complex arguments (a Hermitian Gram diagonal, a complex row maximum) are read by modulus.
    """
    if jnp.iscomplexobj(row_max):
        row_max = jnp.abs(row_max)
    if jnp.iscomplexobj(quadratic_max):
        quadratic_max = jnp.real(quadratic_max)  # a Hermitian diagonal: real up to round-off
    e_row = exponent(row_max)
    e_state = jnp.where(quadratic_max > 0, exponent(jnp.sqrt(quadratic_max)) + old_exp, NO_EXPONENT)
    new = jnp.maximum(e_row, e_state)
    return jnp.where(new == NO_EXPONENT, old_exp, new).astype(jnp.int32)


def mantissa_exponent(x):
    """``x >= 0`` as ``(m, q)`` with ``x = m 2**q``, ``m in [1/2, 1)`` (0 gives ``(0, NO)``);
    a complex ``x`` (real-valued up to round-off) is read by its real part."""
    if jnp.iscomplexobj(x):
        x = jnp.real(x)
    m, q = jnp.frexp(x)
    return m, jnp.where(x > 0, q, NO_EXPONENT).astype(jnp.int32)


def mantissa_exponent_add(a, b):
    """The sum of two non-negative ``(m, q)`` numbers (the result's mantissa is in ``[1/2, 2)``)."""
    (ma, qa), (mb, qb) = a, b
    q = jnp.maximum(qa, qb)
    return ldexp(ma, qa - q) + ldexp(mb, qb - q), q


def safe_norm(v, axis=None, keepdims=False):
    """The Euclidean norm without overflow or underflow (the entries are scaled by the largest);
    for complex ``v`` the Hermitian norm ``sqrt(sum |v_i|^2)``, real."""
    top = jnp.max(jnp.abs(v), axis=axis, keepdims=True, initial=0)
    safe = jnp.where(top > 0, top, 1)
    norm = top * jnp.sqrt(jnp.sum(abs2(v / safe), axis=axis, keepdims=True))
    return norm if keepdims else jnp.squeeze(norm, axis=axis)


def denoise_residual(r, y, n):
    """``r = y - P y`` with its round-off removed: zero when ``|r| <= 4 n eps |y|``.

    ``P`` (a projector onto ``n`` orthonormal rows) is exact only to about ``n eps``, so a vector
    inside its range leaves a residual of that relative size in arbitrary directions. Divided by a
    ridge much smaller than the eigenvalues on the range (``delta = 1e-8`` against gradients of
    norm 1, or norm 1e30 against ``alpha = 1``) that noise would dominate ``H^{-1} y`` by orders of
    magnitude; a residual below the noise floor is not resolvable in this precision anyway. A
    genuine residual is kept as it is (a soft threshold would bias every one of them by the
    floor, which in float32 is larger than the round-off it removes).
    """
    eps = jnp.finfo(jnp.real(r).dtype).eps
    # |r| > 4 n eps |y| with both squared norms taken in units of max |y_i|: no overflow (a
    # projection's residual is no longer than y, so |r_i| / max |y_i| <= sqrt(d)), no sqrt, and
    # three passes over the d entries (max |y_i|, then both sums) instead of safe_norm's four.
    top = jnp.max(jnp.abs(y), initial=0)
    unit = jnp.where(top > 0, top, 1)
    floor = (4 * max(n, 1) * eps) ** 2 * jnp.sum(abs2(y / unit))
    return jnp.where(jnp.sum(abs2(r / unit)) > floor, r, 0)


def eigh_desc(gram, *, zero_round_off=True, when=None):
    """Eigendecomposition of a small symmetric PSD matrix, descending, with round-off zeroed.

    Returns ``(mu, u)`` with ``gram = u diag(mu) u^T``, ``mu`` descending and every eigenvalue
    below ``n * eps * mu_max`` (round-off of a rank-deficient matrix) set to exactly 0 (with
    ``zero_round_off=False`` only clipped at 0, for a caller that tells round-off apart itself).
    Eigenvectors are defined only up to sign (and rotation within a repeated eigenvalue): compare
    products such as ``u diag(mu) u^T``, never ``u`` itself, across programs.

    A complex ``gram`` is Hermitian: its Hermitian part is decomposed, ``gram = u diag(mu) u^H``
    with real ``mu`` (eigenvectors then defined up to a phase each).

    The call joins the update's batched factorizations where it can
    (:func:`sketchopt._solvers.eigh`); ``when``, false where the result is not used, lets the
    batched call be skipped when no leaf needs it (the result is then zero).
    """
    mu, u = _solvers.eigh(_hermitian_part(gram), when=when)
    return _descending(mu, u, gram.shape[-1], zero_round_off)


def _hermitian_part(gram):
    return 0.5 * (gram + conj(jnp.swapaxes(gram, -1, -2)))


def _descending(mu, u, n, zero_round_off):
    mu, u = mu[..., ::-1], u[..., ::-1]
    if not zero_round_off:
        return jnp.maximum(mu, 0), u
    return zero_round_off_eigenvalues(mu, n), u


def zero_round_off_eigenvalues(mu, n):
    """``mu`` (eigenvalues of an ``n x n`` PSD matrix) with every value below ``n * eps *
    mu_max``, round-off of a rank-deficient matrix, set to exactly 0."""
    top = jnp.max(mu, axis=-1, keepdims=True, initial=0)
    return jnp.where(mu > top * n * jnp.finfo(mu.dtype).eps, mu, 0)


def inverse_sqrt_time(count):
    """``eta_t = 1/sqrt(t)`` with ``t = count + 1`` (SON, general convex losses)."""
    return 1.0 / jnp.sqrt(jnp.asarray(count) + 1.0)  # the default float (float64 under x64)


def inverse_time(count):
    """``eta_t = 1/t`` with ``t = count + 1`` (RFD paper, RFD-SON)."""
    return 1.0 / (jnp.asarray(count) + 1.0)


def rank_two_inverse_update(h, r, q):
    """``(M + r q^T + q r^T)^{-1}`` from ``h = M^{-1}`` by two rank-one Sherman-Morrison steps
    (RP-SON's update of ``H_t``, SON sec. 3).

    ``r q^T + q r^T = a a^T - b b^T`` with ``a, b = (q/c +- c r)/sqrt(2)``, ``c^2 = |q|/|r|``
    (balanced so that neither term is much larger than the update). Returns the new inverse and
    whether the second (downdating) denominator stayed safely positive. Computed in ``h``'s
    dtype (no NumPy scalar promotes it under x64).

    Complex (Hermitian ``M``): the update is ``r q^H + q r^H = a a^H - b b^H``, each step
    ``h - (h a)(h a)^H / (1 + a^H h a)`` with the real denominator ``1 + a^H h a``.
    """
    dtype = h.dtype
    nq = jnp.sqrt(jnp.sum(abs2(q)))
    nr = jnp.sqrt(jnp.sum(abs2(r)))
    c = jnp.sqrt(jnp.where((nq > 0) & (nr > 0), nq / jnp.where(nr > 0, nr, 1), 1))
    half = jnp.asarray(np.sqrt(0.5), real_dtype(dtype))
    a = (q / c + c * r) * half
    b = (q / c - c * r) * half
    ha = h @ a
    if jnp.iscomplexobj(h):
        h = h - jnp.outer(ha, conj(ha) / (1 + jnp.real(conj(a) @ ha)))
        hb = h @ b
        den = 1 - jnp.real(conj(b) @ hb)
        safe = den > jnp.sqrt(jnp.finfo(dtype).eps)
        h = h + jnp.outer(hb, conj(hb) / jnp.where(safe, den, 1))
        return 0.5 * (h + conj(h.T)), safe
    h = h - jnp.outer(ha, ha / (1 + a @ ha))
    hb = h @ b
    den = 1 - b @ hb
    safe = den > jnp.sqrt(jnp.finfo(dtype).eps)
    h = h + jnp.outer(hb, hb / jnp.where(safe, den, 1))
    return 0.5 * (h + h.T), safe
