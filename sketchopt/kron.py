r"""Kronecker-factored sketches of matrix gradients: Shampoo's statistics as FD/RFD sketches.

For a matrix-shaped leaf with gradient ``G_t`` (``m x n``), full-matrix Shampoo (Gupta, Koren &
Singer 2018, Alg. 1) keeps the left and right statistics ``L_t = sum_s G_s G_s^T`` (``m x m``) and
``R_t = sum_s G_s^T G_s`` (``n x n``) and steps ``-eta (L_t + eps I)^{-1/4} G_t (R_t + eps
I)^{-1/4}``. Sketchy (Feinberg et al. 2023) keeps each statistic as a frequent-directions sketch
of ``k`` rows instead, ``O(k (m + n))`` memory per layer. This module holds the factor sketch and
its inverse roots, below the driver; the family's module :mod:`sketchopt.shampoo` makes them a
metric (:func:`sketchopt.shampoo.kron_sketched`), grafts its step and names the transform
(:func:`sketchopt.shampoo.kron_fd`).

**One factor.** The left statistic is the sum of the outer products of ``G``'s ``n`` columns (and
the right one of its ``m`` rows): a stream of ``n`` vectors of length ``m`` per step, which an FD
sketch ``B`` (``k x m``, ``B^T B ~ L``) absorbs. :func:`absorb` takes them in blocks of ``b``
vectors (``block_size``, default ``k``): the block ``X`` is stacked under ``B``, the
``(k + b) x (k + b)`` Gram matrix ``Z Z^T`` of ``Z = [B; X]`` is eigendecomposed (``mu``
descending, vectors ``u``) and the new sketch is ``B' = diag(sqrt((mu_i - mu_{k+1}) / mu_i))
u_{1..k}^T Z``: FD with a buffer of ``k + b`` rows (Liberty 2013; Ghashami et al. 2016, the
block form), shrinking by the ``(k+1)``-th eigenvalue. With RFD (``robust``) the ridge ``alpha``
grows by half of each shrinkage (RFD paper Alg. 2), so the factor is ``B^T B + alpha I``. The
usual FD guarantee holds per factor over the whole stream of columns: ``0 <= L - B^T B <= Delta I``
with ``Delta``, the summed shrinkage, at most ``(|A|_F^2 - |B|_F^2) / (k + 1)`` (and ``|L - B^T B
- alpha I| <= Delta / 2`` for RFD, RFD paper Theorem 3): blocks change the buffer's length, not the
argument. Cost per step and side: ``ceil(n / b)`` Gram matrices of ``(k + b) x (k + b)``
(``O((k + b)^2 m)`` each), as many small ``eigh`` calls and rotations: ``O(m n (k + b))`` flops,
the cost of one ``(k + b)``-column product with the gradient. No ``m x n`` SVD, no ``m x m``
matrix.

**Compression** (:func:`streams`). The ``ceil(n / b)`` small ``eigh`` calls run one after the
other; for a wide layer (``n = 6144``, ``k = 32``: 192 of them per step) that latency, not the
flops, is the cost. Beyond :data:`EXACT_BLOCKS` blocks (``compress="auto"``) the gradient is
first compressed by a randomized range finder with one power iteration (Halko, Martinsson &
Tropp 2011, Alg. 4.3) to ``r = k + 8`` vectors per side, chosen so that each compressed statistic
is a lower bound of the true one (``G P P^T G^T <= G G^T``, ``G^T Q Q^T G <= G^T G``), as FD's own
shrinkage is: the sketch still never over-estimates, and the FD bound holds with each step's
residual ``|G - Q Q^T G|_2^2`` added to the shrinkage. That residual is estimated by two power
iterations and RFD's ridge takes half of it too, as it takes half of each shrinkage. Cost per
step: ``O(m n r)`` flops (five products with ``G``) and one ``(k + r)`` ``eigh`` per side; a
gradient of rank at most ``r`` is compressed exactly.

*Where this differs from Sketchy* (``precondition/tearfree/sketchy.py``): Sketchy stacks the whole
gradient next to the sketch, ``[B^T, G]`` (``m x (k + n)``), takes its QR and an SVD of the
``(k + n)``-column factor: ``O(m (k + n)^2)`` per step, which for a wide layer (``n = 4 m``) is
``16 m^3``, a full Shampoo eigendecomposition's order. Streaming the columns in blocks keeps the
small matrices at ``(k + b)`` whatever ``n`` is. Sketchy's ridge is the whole escaped mass
(``tail += mu_{k+1}``) and its complement gets ``tail^{-1/4}`` only once a shrink happened (zero
before); here the ridge is RFD's half shrinkage (or none, FD) and ``eps`` is added to every
eigenvalue, so an exact sketch is exactly Shampoo with that epsilon. Sketchy's sketch turns into
NaN after one non-finite gradient; here a non-finite gradient leaves the state bit-identical
(the rules' policy), and every quadratic quantity is stored divided by ``4**exp`` for a
power-of-two ``exp`` chosen from the data (:mod:`sketchopt._numerics`), so gradients of ``1e30``
or ``1e-30`` neither overflow nor underflow in float32.

**Under a mesh** each side's sketch is split along its own side's mesh axes
(:func:`sketchopt.sharding.group_specs`). With an explicit mesh every product here names its
output sharding (``_dot``): a contraction over a split side is all-reduced into an ``r``- or
``k``-sized result, the rest stays split. A side whose *stream* would cross devices (the right
stream's ``m`` rows when ``G``'s rows are split) is compressed, with the range found on the
replicated side by QR and the split basis orthonormalized through its ``r x r`` Gram matrix
(``_range_split_rows``), so no device gathers a sketch-sized array. A compressed stream enters the
sketch in one block; a single device compresses the same stream only when it has more than
``EXACT_BLOCKS`` blocks, and otherwise absorbs its vectors exactly, ``block_size`` at a time. The
two runs then give the same sketch up to rounding where the stream fits one block (``block_size
>= m``) and its rank is at most ``r`` (``k + 8``); elsewhere FD's shrinks, which depend on how the
vectors are split into blocks, make them differ by more (measured: ``2e-3`` of the parameters
after 20 steps of a 16 x 20 leaf at ``k = 4``, in float64 as in float32;
``tests/multiprocess_worker.py`` runs the configuration that matches).

**Inverse roots.** The rows of a freshly shrunk ``B`` are orthogonal (``B' B'^T`` is diagonal by
construction), so ``B^T B = V^T diag(lam) V`` with ``V`` the normalized rows and ``lam`` their
squared norms, and ``(B^T B + alpha I + eps I)^{-p} = tail I + V^T diag(coef) V`` with ``tail =
(alpha + eps)^{-p}`` and ``coef_i = (lam_i + alpha + eps)^{-p} - tail`` (:func:`inverse_root`):
the preconditioned step ``tail_L tail_R G + ...`` costs a few ``k``-row products with ``G``
(:class:`sketchopt.operators.KroneckerOperator`). Computed in the log domain, so ``eps`` and the
sketch's scale may differ by any power of two.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt import _groups, _partitioning, _solvers
from sketchopt._numerics import (
    HIGHEST,
    eigh_desc,
    exponent,
    ldexp,
    rescale_exponent,
)

__all__ = [
    "Factoring",
    "FactorState",
    "InverseRoot",
    "Stream",
    "absorb",
    "absorb_lazily",
    "absorb_sides",
    "apply_left",
    "apply_right",
    "default_factoring",
    "factor_init",
    "inverse_root",
    "inverse_roots",
    "match_sides",
    "streams",
]

#: The longest side the default factoring sketches (an embedding table's vocabulary axis is
#: longer and falls back to the diagonal).
MAX_SIDE = 16384


class Factoring(NamedTuple):
    """How a leaf is seen as a matrix: ``rows x cols`` after flattening in C order, or, with
    ``layers > 0``, a stack of ``layers`` such matrices along a leading axis."""

    rows: int
    cols: int
    layers: int = 0


def default_factoring(
    path: str,
    shape: tuple[int, ...],
    *,
    stacked: tuple[str, ...] = (),
    max_side: int = MAX_SIDE,
) -> Factoring | None:
    """The default rule: a leaf of two or more axes is ``prod(shape[:-1]) x shape[-1]`` (a dense
    kernel ``(in, out)`` as it is; a conv kernel ``(kh, kw, cin, cout)`` as ``(kh*kw*cin) x cout``;
    a ``DenseGeneral`` kernel as all input axes by the output axis); vectors, scalars, leaves with a
    side of length 1 or a side longer than ``max_side`` are not factored (``None``: the caller's
    fallback, the diagonal). A leaf whose ``path`` starts with one of ``stacked`` has a leading
    layer axis: its other axes are factored so, one matrix per layer."""
    shape = tuple(int(s) for s in shape)
    layers = 0
    if any(path.startswith(prefix) for prefix in stacked) and len(shape) >= 1:
        layers, shape = shape[0], shape[1:]
    if len(shape) < 2:
        return None
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if min(rows, cols) <= 1 or max(rows, cols) > max_side:
        return None
    return Factoring(rows, cols, layers)


class FactorState(NamedTuple):
    """One side's sketch: ``B^T B + alpha I ~ 4**exp (rows^T rows + alpha I)``.

    Attributes:
      rows: ``(k, dim)``; orthogonal rows (a shrink leaves them so), ``B = 2**exp rows``.
      alpha: the RFD ridge in the same units (0 for FD).
      exp: the int32 power-of-two exponent.
    """

    rows: jax.Array
    alpha: jax.Array
    exp: jax.Array


def factor_init(sketch_size: int, dim: int, dtype) -> FactorState:
    """An empty factor of ``min(sketch_size, dim)`` rows (``dim`` rows already sketch exactly):
    FD's ``B = 0`` (Liberty 2013, Alg. 1) and RFD's ``alpha = 0`` (RFD paper Alg. 2)."""
    k = min(int(sketch_size), int(dim))
    return FactorState(jnp.zeros((k, dim), dtype), jnp.zeros((), dtype), jnp.zeros((), jnp.int32))


class Stream(NamedTuple):
    """What one gradient hands a factor: ``vectors * 2**exp`` (``(N, dim)``) whose outer
    products sum to the gradient's statistic (or, ``compressed``, to a lower bound of it), and
    ``residual * 4**exp``, an estimate of the spectral norm of what compression left out. A
    compressed stream (``N = r`` vectors) enters the sketch whole, in one block: the sketch then
    depends on the vectors' Gram sum only, not on which basis the range finder returned."""

    vectors: jax.Array
    exp: jax.Array
    residual: jax.Array
    compressed: bool = False


#: Extra columns of the randomized range finder beyond the sketch size (Halko et al. 2011).
OVERSAMPLING = 8


def streams(
    mat: jax.Array, *, sketch_size: int, block_size: int, compress: str, key: jax.Array
) -> tuple[Stream, Stream]:
    """The left and right streams of an ``m x n`` gradient ``G`` (module docstring).

    Exact (``compress="blocks"``, or ``"auto"`` for a side whose stream has at most
    :data:`EXACT_BLOCKS` blocks): the left stream is ``G``'s ``n`` columns, the right one its
    ``m`` rows. Compressed (``"range"``, or ``"auto"`` for a side beyond that): randomized range
    finders with one power iteration (Halko, Martinsson & Tropp 2011, Alg. 4.3) give ``Q``
    (``m x r``, ``r = min(k + OVERSAMPLING, m, n)``) and ``Q^T G`` (``r x n``), whose rows are
    the right stream (``G^T Q Q^T G <= G^T G``), and independently ``P`` (``n x r``), the
    columns of ``G P`` being the left stream (``G P P^T G^T <= G G^T``). Each residual's
    spectral norm (``|G - Q Q^T G|_2^2``, ``|G - G P P^T|_2^2``) is estimated by two power
    iterations. Cost ``O(m n r)``; the factor then takes one block of ``r`` vectors.
    """
    m, n = mat.shape
    dtype = mat.dtype
    top = jnp.max(jnp.abs(mat), initial=0)
    exp = jnp.where(top > 0, exponent(top), 0).astype(jnp.int32)
    unit = ldexp(mat, -exp)  # entries below 1: no product below overflows or underflows
    zero = jnp.zeros((), dtype)

    def exact(count):
        return compress == "blocks" or (
            compress == "auto" and -(-count // max(1, min(block_size, count))) <= EXACT_BLOCKS
        )

    # Under an explicit mesh a side whose stream's *count* axis is split across devices (the
    # right stream's m rows when G's rows are split) is compressed: its vectors would otherwise
    # have to meet on one device, block by block.
    rows_split, cols_split = (axis is not None for axis in _matrix_spec(mat))
    exact_left = exact(n) and not cols_split  # (the left stream has n vectors)
    exact_right = exact(m) and not rows_split
    if exact_left and exact_right:
        return Stream(unit.T, exp, zero), Stream(unit, exp, zero)
    # r = min(m, n) keeps everything (the range is exact); a side with many short vectors (a
    # 12 x 10000 leaf's 10000 columns) is then compressed exactly to r of them.
    r = min(sketch_size + OVERSAMPLING, m, n)
    if cols_split and not rows_split:  # the transposed problem has its rows split
        right, left, res_right, res_left = _range_split_rows(unit.T, r, key)
    elif rows_split:
        left, right, res_left, res_right = _range_split_rows(unit, r, key)
    else:
        left, right, res_left, res_right = _range(unit, r, key)
    left_stream = Stream(unit.T, exp, zero) if exact_left else Stream(left, exp, res_left, True)
    right_stream = Stream(unit, exp, zero) if exact_right else Stream(right, exp, res_right, True)
    return left_stream, right_stream


def _range(unit, r, key):
    """The range finder of :func:`streams` on one device (or with automatic sharding): ``Q`` from
    ``G G^T G Omega_1`` and ``P`` from ``G^T G G^T Omega_2``, two independent randomized range
    finders with one power iteration each (Halko et al. 2011, Alg. 4.3), orthonormalized by QR
    (independent of each other: one batched call with every other group's, their rows
    zero-padded to a common length, :mod:`sketchopt._solvers`). Returns the left stream's vectors
    ``(G P)^T``, the right one's ``Q^T G`` and the two residuals' squared spectral norms.

    ``P`` spans (an approximation of) ``G``'s top right singular subspace on its own, not the
    span of ``G^T Q``: each compressed statistic is still a lower bound of the true one (any
    projector gives one), a gradient of rank at most ``r`` is still compressed exactly, and the
    two factorizations no longer wait on each other (one level of the batched calls, not two).
    The power iteration is not re-orthonormalized in between (one QR level, not two): a
    direction whose singular value is below ``eps**(1/3)`` of the largest (float32: ``5e-3``;
    its share of the step's statistic below ``3e-5``) is then resolved only to that accuracy,
    and what the range misses enters the residual, which RFD's ridge takes half of.
    """
    m, n = unit.shape
    # Gaussian test matrices (Halko et al. 2011 sec. 4.1; a small Rademacher one is singular
    # with a probability that matters, and a singular draw would lose a direction for good); two
    # more columns start the residuals' power iterations (independent of the ranges found).
    k_left, k_right = jax.random.split(key)
    draws = jax.random.normal(k_left, (n, r + 2), unit.dtype)
    omega = jax.random.normal(k_right, (m, r), unit.dtype)
    wanted = []  # a side of length r keeps everything: its basis is the identity
    if r < m:
        wanted.append(_dot(unit, _dot(unit.T, _unit_columns(_dot(unit, draws[:, :r])))))
    if r < n:
        wanted.append(_dot(unit.T, _dot(unit, _unit_columns(_dot(unit.T, omega)))))
    bases = iter(_solvers.qr(y)[0] for y in wanted)  # independent: one batched call
    q = next(bases) if r < m else jnp.eye(m, dtype=unit.dtype)  # m x r
    p = next(bases) if r < n else jnp.eye(n, dtype=unit.dtype)  # n x r
    right = _dot(q.T, unit)  # r x n
    left = _dot(unit, p).T  # r x m
    return (left, right, *_residuals(unit, q, p, draws[:, r:]))


def _unit_columns(a):
    """``a``'s columns scaled to unit norm (a zero column stays zero): the power iteration's
    products then stay at the scale of ``G``'s entries."""
    norms = jnp.linalg.norm(a, axis=0)
    return a / jnp.where(norms > 0, norms, 1)


def _range_split_rows(unit, r, key):
    """The range finder of :func:`streams` when ``G``'s rows are split across devices (explicit
    mesh): ``P`` (``n x r``, replicated) from ``G^T G G^T Omega`` by QR, ``Q`` the columns of ``G
    P`` orthonormalized through their ``r x r`` Gram matrix (twice), so every product contracts
    the split ``m`` into an ``r``-sized all-reduced result or keeps ``m`` split: no device
    gathers a sketch-sized array. Returns what :func:`_range` returns."""
    m, n = unit.shape
    dtype = unit.dtype
    k_omega, k_start = jax.random.split(key)
    omega = jax.random.rademacher(k_omega, (m, r), dtype)
    omega = jax.sharding.reshard(omega, jax.sharding.PartitionSpec(_matrix_spec(unit)[0], None))
    p, _ = _solvers.qr(_dot(unit.T, omega))
    p, _ = _solvers.qr(_dot(unit.T, _dot(unit, p)))  # n x r
    gp = _dot(unit, p)  # m x r, split along m
    q = _orthonormalize(_orthonormalize(gp))
    right = _dot(q.T, unit)  # r x n
    starts = jax.random.rademacher(k_start, (n, 2), dtype)
    return (gp.T, right, *_residuals(unit, q, p, starts))


def _orthonormalize(a):
    """An orthonormal basis of ``a``'s columns (``m x r``, ``m`` possibly split) from the
    eigendecomposition of its ``r x r`` Gram matrix; directions below ``r eps`` of the largest
    eigenvalue are dropped (zero columns: still ``Q Q^T <= I``). Applied twice, as CholeskyQR2
    (Fukaya et al. 2014), it is orthonormal to rounding."""
    gram = _dot(a.T, a)
    mu, v = _solvers.eigh(0.5 * (gram + gram.T))
    floor = a.shape[1] * jnp.finfo(a.dtype).eps * jnp.max(mu, initial=0)
    keep = mu > floor
    return _dot(a, v * jnp.where(keep, jax.lax.rsqrt(jnp.where(keep, mu, 1)), 0))


def _residuals(unit, q, p, starts):
    """The squared spectral norms of the right residual ``(I - Q Q^T) G`` and the left one ``G (I
    - P P^T)``, by two power iterations on ``E^T E`` side by side from the columns of ``starts``
    (``n x 2``): one product with ``G`` and one with ``G^T`` per iteration."""

    def off(basis, u):  # (I - B B^T) u for the columns of u
        return u - _dot(basis, _dot(basis.T, u))

    v = starts
    for _ in range(2):
        v = v / jnp.maximum(jnp.linalg.norm(v, axis=0), jnp.finfo(unit.dtype).tiny)
        # column 0: E^T E v = G^T (I - Q Q^T) G v; column 1: (I - P P^T) G^T G (I - P P^T) v
        v = jnp.concatenate([v[:, :1], off(p, v[:, 1:])], axis=1)
        u = _dot(unit, v)
        u = jnp.concatenate([off(q, u[:, :1]), u[:, 1:]], axis=1)
        v = _dot(unit.T, u)
        v = jnp.concatenate([v[:, :1], off(p, v[:, 1:])], axis=1)
    res_right, res_left = jnp.linalg.norm(v, axis=0)  # v was unit before the last E^T E
    return res_left, res_right


def match_sides(mat: jax.Array, left: jax.Array, right: jax.Array) -> jax.Array:
    """``mat`` (``(..., m, n)``) resharded, under an explicit mesh, so that its rows are split like
    the last axis of ``left`` (a ``(..., k, m)`` factor array) and its columns like that of
    ``right``: the layout every product of a step expects (a no-op when they agree already, and
    without an explicit mesh)."""
    if not _partitioning.explicit_mesh():
        return mat

    lead = (None,) * (mat.ndim - 2)
    target = (*lead, _partitioning.spec_of(left)[-1], _partitioning.spec_of(right)[-1])
    if _partitioning.spec_of(mat) == target:
        return mat
    return jax.sharding.reshard(mat, jax.sharding.PartitionSpec(*target))


def _matrix_spec(mat) -> tuple:
    """``(rows, cols)`` mesh axes of a matrix's sharding under an explicit mesh (``None`` for an
    axis not split; both ``None`` otherwise)."""
    spec = _partitioning.spec_of(mat)
    return (None, None) if spec is None else spec[-2:]


def _dot(a, b):
    """``a @ b`` (2-D); under an explicit mesh its result is split like ``a``'s rows and ``b``'s
    columns, and a split contraction is all-reduced (an ``r``- or ``k``-sized result here)."""
    if not _partitioning.explicit_mesh():
        return jnp.matmul(a, b, precision=HIGHEST)
    out = jax.sharding.PartitionSpec(_matrix_spec(a)[0], _matrix_spec(b)[1])
    return jnp.matmul(a, b, precision=HIGHEST, out_sharding=out)


#: ``compress="auto"`` streams a side exactly while it takes at most this many blocks.
EXACT_BLOCKS = 4


def absorb(
    state: FactorState,
    stream: Stream,
    *,
    block_size: int,
    robust: bool,
    decay: float | jax.Array | None = None,
) -> FactorState:
    """Absorb a :class:`Stream` into the factor, ``block_size`` vectors at a time (a compressed
    stream in one block; the module docstring: block FD, or RFD with ``robust``, whose ridge also
    takes half the stream's residual). With ``decay = beta`` the current statistic is first
    multiplied by ``beta`` (rows by ``sqrt(beta)``, the ridge by ``beta``).

    A stream of at most :data:`EXACT_BLOCKS` blocks is unrolled, so that its ``eigh`` calls join
    the driver's batched ones (:mod:`sketchopt._solvers`); a longer one (``compress="blocks"``)
    is scanned, one ``eigh`` per block.

    Returns the new state; the caller selects the old one where the input was invalid.
    """
    return _absorbed(state, stream, block_size, robust, decay, None)[0]


def absorb_lazily(
    state: FactorState,
    stream: Stream,
    *,
    tolerance: float | jax.Array,
    block_size: int,
    robust: bool,
    decay: float | jax.Array | None = None,
) -> tuple[FactorState, jax.Array]:
    r""":func:`absorb`, but a block whose statistic the sketch's present basis still diagonalizes
    to ``tolerance`` is taken in that basis, without an eigendecomposition (Shampoo's and SOAP's
    rule of refreshing a preconditioner's eigenbasis only when it has drifted).

    With ``Z = [B; X]`` (the sketch's ``k`` orthogonal rows ``B = diag(sigma) V`` and a block
    ``X``) FD decomposes ``M = Z Z^T``; the statistic ``Z^T Z`` in the basis ``V`` has the
    diagonal ``s_i = sigma_i^2 + |X v_i|^2`` (``v_i`` a row of ``V``). Keeping the basis means
    ``B' = diag(sqrt(s)) V``, whose statistic differs from ``Z^T Z`` by exactly
    ``|Z^T Z|_F^2 - sum_i s_i^2 = |M|_F^2 - |s|^2`` in squared Frobenius norm (the mass off the
    diagonal and out of the basis's span), computed from ``M`` alone. A block is taken so when
    that is at most ``tolerance**2 |M|_F^2`` (a zero row of ``B`` has no direction: its
    ``s_i = 0`` and the block's mass there counts as error, so an empty sketch refreshes unless
    the block is zero); otherwise FD's shrink runs as in :func:`absorb`.
    A kept block shrinks nothing and leaves RFD's ridge as it was: its error is the relative
    ``tolerance`` per block, in place of FD's shrinkage. ``tolerance = 0`` keeps only blocks
    that the basis diagonalizes exactly (to rounding), which FD would also have left in it.

    The ``eigh`` is skipped only where nothing needs it: under the driver's batched calls
    (:mod:`sketchopt._solvers`) when no leaf of its batch refreshes, else (a ``lax.cond`` per
    block) for a leaf stepped on its own; a group's leaves stepped by one ``vmap`` compute it and
    select. Returns the new state and how many of the stream's blocks kept the basis (int32).
    """
    return _absorbed(state, stream, block_size, robust, decay, tolerance)


#: :func:`absorb_sides` and :func:`inverse_roots` step a leaf's sides as one ``vmap`` while the
#: padded sides' absorption costs at most this many flops (about a millisecond of one core), or
#: at most twice the sides' own: for a small layer the compile time is the cost, for a large one
#: the step's.
SHARED_FLOPS = 2**24


def absorb_sides(
    states: tuple[FactorState, ...],
    streams: tuple[Stream, ...],
    *,
    block_size: int,
    robust: bool,
    decay: float | jax.Array | None = None,
) -> tuple[FactorState, ...]:
    """:func:`absorb` of each side's stream into its factor: ``(absorb(s, t) for s, t in zip(
    states, streams))``, to rounding. On one device and where it is cheap (:data:`SHARED_FLOPS`)
    every side is first zero-padded to one common shape, so that XLA compiles one side's kernels
    for all of them (it reuses a kernel for an identical fusion: a first step's compile is mostly
    XLA:CPU's code generation, kernel by kernel), and on the CPU, where no batched factorization
    across groups is there to join (:mod:`sketchopt._solvers`), the blocks are scanned: one
    block's kernels for all of them. The padding leaves FD's and RFD's sketch unchanged: zero
    columns (a longer ``dim``) add nothing to the Gram matrix ``Z Z^T``; zero vectors in a block
    and zero blocks after the stream add zero eigenvalues below the spectrum, so the ``(k+1)``-th
    eigenvalue a block shrinks by is unchanged, and a zero block shrinks nothing; zero rows (a
    larger ``k`` for a side of ``dim < k``, which FD sketches exactly) leave a statistic of rank
    at most ``dim < k``, so its ``(k+1)``-th eigenvalue is round-off (zeroed) and the padded rows
    stay zero. Each result is cut back to its side's shape.
    """
    states, streams = tuple(states), tuple(streams)
    shape = _shared_shape(states, streams, block_size)
    if shape is None:
        return tuple(
            absorb(s, t, block_size=block_size, robust=robust, decay=decay)
            for s, t in zip(states, streams, strict=True)
        )
    k, dim, blocks, b = shape
    scan = not _solvers.batching_active()
    out = []
    for state, stream in zip(states, streams, strict=True):
        rows, count = state.rows, stream.vectors.shape[0]
        own = count if stream.compressed else max(1, min(int(block_size), count))
        vectors = stream.vectors.astype(rows.dtype)
        vectors = jnp.pad(vectors, ((0, -(-count // own) * own - count), (0, 0)))
        vectors = vectors.reshape(-1, own, vectors.shape[1])
        vectors = jnp.pad(
            vectors, ((0, blocks - vectors.shape[0]), (0, b - own), (0, dim - vectors.shape[2]))
        )
        padded = Stream(vectors.reshape(blocks * b, dim), stream.exp, stream.residual)
        rows = jnp.pad(rows, ((0, k - rows.shape[0]), (0, dim - rows.shape[1])))
        new = _absorbed(state._replace(rows=rows), padded, b, robust, decay, None, scan)[0]
        out.append(new._replace(rows=_cut(new.rows, state.rows.shape)))
    return tuple(out)


def _cut(a, shape):
    """``a`` cut back to ``shape`` (its leading corner), ``a`` itself when it has that shape."""
    return a if a.shape == tuple(shape) else a[tuple(slice(0, n) for n in shape)]


def _shared_shape(states, streams, block_size):
    """``(k, dim, blocks, b)`` that every side of :func:`absorb_sides` is padded to, or ``None``
    where the sides are stepped one by one: one side, an explicit mesh, differing dtypes or a
    padded cost above :data:`SHARED_FLOPS` and twice the sides' own."""
    if len(states) < 2 or _partitioning.explicit_mesh():
        return None
    if len({s.rows.dtype for s in states}) > 1:
        return None
    sizes = []
    for state, stream in zip(states, streams, strict=True):
        count = stream.vectors.shape[0]
        b = count if stream.compressed else max(1, min(int(block_size), count))
        sizes.append((state.rows.shape[0], state.rows.shape[1], -(-count // b), b))
    k, dim, blocks, b = (max(size[i] for size in sizes) for i in range(4))

    def flops(k, dim, blocks, b):  # Gram matrices, eigh calls and rotations of one side
        return blocks * ((k + b) ** 2 * dim * 2 + (k + b) ** 3)

    shared = len(sizes) * flops(k, dim, blocks, b)
    if shared > max(SHARED_FLOPS, 2 * sum(flops(*size) for size in sizes)):
        return None
    return k, dim, blocks, b


def _absorbed(state, stream, block_size, robust, decay, tolerance, scan=False):
    p = _prepared(state, stream, block_size, decay)
    k = p.rows.shape[0]

    def step(carry, block):
        rows, alpha, kept = carry
        z = jnp.concatenate([rows, block])
        gram = _dot(z, z.T)
        if tolerance is None:
            return (*_shrunk(z, eigh_desc(gram), alpha, robust, k), kept), None
        keep, kept_rows = _in_basis(gram, rows, tolerance)
        refresh = functools.partial(_shrunk, z, alpha=alpha, robust=robust, k=k)
        if _solvers.batchable() or _groups.grouped():
            # batched: the call is skipped when no leaf refreshes; inside a group's vmap a cond
            # would run both branches anyway
            when = ~keep if _solvers.batchable() else None
            new_rows, new_alpha = refresh(eigh_desc(gram, when=when))
            rows, alpha = jnp.where(keep, kept_rows, new_rows), jnp.where(keep, alpha, new_alpha)
        else:
            rows, alpha = jax.lax.cond(
                keep, lambda: (kept_rows, alpha), lambda: refresh(eigh_desc(gram))
            )
        return (rows, alpha, kept + keep.astype(jnp.int32)), None

    carry = (p.rows, p.alpha, jnp.zeros((), jnp.int32))
    if p.vectors.shape[0] <= EXACT_BLOCKS and not scan:
        for block in p.vectors:
            carry, _ = step(carry, block)
    else:
        carry, _ = jax.lax.scan(step, carry, p.vectors)
    rows, alpha, kept = carry
    if robust:
        alpha = alpha + p.residual / 2
    return FactorState(rows, alpha, p.exp), kept


def _in_basis(gram, rows, tolerance):
    """Whether the sketch's basis still diagonalizes ``Z^T Z`` to ``tolerance``, and the rows
    it keeps then (:func:`absorb_lazily`), from ``gram = Z Z^T`` with ``Z = [rows; X]``."""
    k = rows.shape[0]
    dtype = gram.dtype
    sigma2 = jnp.diagonal(gram)[:k]
    full = sigma2 > 0
    safe = jnp.where(full, sigma2, 1)
    # s_i = sigma_i^2 + |X v_i|^2 with X v_i = (X B^T)_i / sigma_i
    s = sigma2 + jnp.sum(jnp.square(gram[k:, :k]), axis=0) / safe
    total = jnp.sum(jnp.square(gram))
    off = total - jnp.sum(jnp.square(s))  # |Z^T Z - V^T diag(s) V|_F^2, >= 0 up to rounding
    tol2 = jnp.square(jnp.asarray(tolerance, dtype))
    keep = off <= tol2 * total
    return keep, rows * jnp.sqrt(jnp.where(full, s / safe, 0))[:, None]


class _Prepared(NamedTuple):
    rows: jax.Array
    alpha: jax.Array
    exp: jax.Array
    vectors: jax.Array  # (blocks, b, dim)
    residual: jax.Array


def _prepared(state, stream, block_size, decay) -> _Prepared:
    """The factor and the stream in one power-of-two unit, the stream cut into blocks."""
    rows, alpha, exp = state
    dim = rows.shape[1]
    dtype = rows.dtype
    if decay is not None:
        beta = jnp.asarray(decay, dtype)
        rows, alpha = rows * jnp.sqrt(beta), alpha * beta
    vectors, vec_exp, residual, compressed = stream
    vectors = vectors.astype(dtype)
    top = jnp.max(jnp.abs(vectors), initial=0)
    lam_max = jnp.max(jnp.sum(jnp.square(rows), axis=1), initial=0)
    # The shared rule for a sketch plus a row, in the units of the vectors' own exponent.
    quadratic = jnp.maximum(lam_max, alpha)
    new_exp = (rescale_exponent(exp - vec_exp, top, quadratic) + vec_exp).astype(jnp.int32)
    shift = exp - new_exp  # <= 0
    rows, alpha = ldexp(rows, shift), ldexp(alpha, 2 * shift)
    vectors = ldexp(vectors, vec_exp - new_exp)
    residual = ldexp(jnp.asarray(residual, dtype), 2 * (vec_exp - new_exp))
    count = vectors.shape[0]
    b = count if compressed else max(1, min(int(block_size), count))
    blocks = -(-count // b)
    pad = blocks * b - count
    if pad:
        vectors = jnp.pad(vectors, ((0, pad), (0, 0)))  # (keeps a split dim split)
    return _Prepared(rows, alpha, new_exp, vectors.reshape(blocks, b, dim), residual)


def _shrunk(z, spectrum, alpha, robust, k):
    """Block FD's shrink of the stacked ``z = [B; X]`` (``B``: ``k`` rows; module docstring)
    from the eigenpairs ``(mu, u)`` of ``z z^T``: ``B' = diag(sqrt((mu_i - mu_{k+1}) / mu_i))
    u_{1..k}^T z``, and RFD's ridge grows by half the shrinkage."""
    mu, u = spectrum
    shrink = mu[k]
    keep = mu[:k]
    scale = jnp.where(
        keep > 0, jnp.sqrt(jnp.maximum(keep - shrink, 0) / jnp.where(keep > 0, keep, 1)), 0
    )
    rows = _dot((u[:, :k] * scale).T, z)
    if robust:
        alpha = alpha + shrink / 2
    return rows, alpha


class InverseRoot(NamedTuple):
    """``(C + eps I)^{-p} = tail I + basis^T diag(coef) basis`` in true units."""

    basis: jax.Array  # (k, dim), orthonormal or zero rows
    coef: jax.Array  # (k,)
    tail: jax.Array  # ()


class KronMetricState(NamedTuple):
    """State of :func:`sketchopt.shampoo.kron_sketched` for one leaf.

    Attributes:
      left: the sketch of ``sum G G^T`` (:class:`sketchopt.kron.FactorState`, ``k x m``
        rows), ``None`` for a leaf that is not factored.
      right: the sketch of ``sum G^T G`` (``k x n`` rows), ``None`` likewise.
      diag: the diagonal method's root statistic, ``d`` floats: the fallback of a leaf that is
        not factored, and the grafted method's (``graft``, ``start_step``) of a factored one:
        ``sqrt(sum g^2)`` (AdaGrad) or ``sqrt(EMA of g^2)`` (RMSProp, Adam); ``None`` when a
        factored leaf needs none.
      roots: with ``refresh_every > 1``, the inverse roots of both sides as last computed
        (:class:`sketchopt.kron.InverseRoot` pair), reused in between; ``None`` otherwise.
      kept: with ``refresh_tolerance``, int32 ``(2,)`` (``(layers, 2)`` for a stacked leaf):
        how many blocks the left and the right sketch took in their old basis, without an
        eigendecomposition (:func:`absorb_lazily`); ``None`` otherwise.
    """

    left: Any
    right: Any
    diag: Any
    roots: Any
    kept: Any = None


# Its public home is :mod:`sketchopt.metrics` (documented and pickled under that name, as before
# it moved here, below the layout rules of ``sketchopt._layouts`` that read it).
KronMetricState.__module__ = "sketchopt.metrics"


def inverse_root(
    state: FactorState, power: float, eps: float | jax.Array, *, relative: bool = False
) -> InverseRoot:
    """``(B^T B + alpha I + eps I)^{-power}`` of a factor (``eps`` times the largest eigenvalue
    with ``relative``): Shampoo's ``(L_t + eps I)^{-1/4}`` (Gupta et al. 2018, Alg. 1) on the
    sketch. With ``eps = 0`` directions of a zero eigenvalue get 0 (pseudo-inverse)."""
    rows, alpha, exp = state
    dtype = rows.dtype
    lam = jnp.sum(jnp.square(rows), axis=1)
    basis = rows / jnp.where(lam > 0, jnp.sqrt(lam), 1)[:, None]
    # log of a scaled value v * 4**exp; log(0) = -inf is what logaddexp needs.
    log_scale = exp.astype(dtype) * jnp.asarray(2 * np.log(2.0), dtype)

    def log_true(v):
        safe = jnp.where(v > 0, v, 1)
        return jnp.where(v > 0, jnp.log(safe) + log_scale, -jnp.inf)

    eps = jnp.asarray(eps, dtype)
    log_eps = jnp.where(eps > 0, jnp.log(jnp.where(eps > 0, eps, 1)), -jnp.inf)
    if relative:
        log_eps = log_eps + log_true(jnp.maximum(jnp.max(lam, initial=0) + alpha, 0))
    power = jnp.asarray(power, dtype)

    def root(log_v):
        log_total = jnp.logaddexp(log_v, log_eps)
        return jnp.where(log_total > -jnp.inf, jnp.exp(-power * log_total), 0)

    tail = root(log_true(alpha))
    coef = jnp.where(lam > 0, root(log_true(lam + alpha)) - tail, 0)
    return InverseRoot(basis, coef, tail)


def inverse_roots(
    states: tuple[FactorState, ...],
    powers: tuple[float, ...],
    eps: float | jax.Array,
    *,
    relative: bool = False,
) -> tuple[InverseRoot, ...]:
    """:func:`inverse_root` of each side at its power (Shampoo's ``L^{-p}`` and ``R^{-q}``,
    Gupta et al. 2018, Alg. 1 line 6); on one device each side zero-padded to one common shape
    first (zero rows and columns add only zero eigenvalues, whose coefficients are 0), so that
    XLA compiles one side's kernels for all of them, as :func:`absorb_sides` does, and each
    result cut back to its side's shape."""
    states = tuple(states)
    if len(states) < 2 or _partitioning.explicit_mesh():
        return tuple(
            inverse_root(s, p, eps, relative=relative) for s, p in zip(states, powers, strict=True)
        )
    k = max(s.rows.shape[0] for s in states)
    dim = max(s.rows.shape[1] for s in states)
    out = []
    for state, power in zip(states, powers, strict=True):
        rows = jnp.pad(state.rows, ((0, k - state.rows.shape[0]), (0, dim - state.rows.shape[1])))
        root = inverse_root(state._replace(rows=rows), power, eps, relative=relative)
        basis = _cut(root.basis, state.rows.shape)
        out.append(InverseRoot(basis, _cut(root.coef, state.rows.shape[:1]), root.tail))
    return tuple(out)


def apply_left(root: InverseRoot, y: jax.Array) -> jax.Array:
    """``root @ y`` for ``y`` of shape ``(dim, n)``: Shampoo's left preconditioning ``L^{-p} G``
    (Gupta et al. 2018, Alg. 1) in ``O(k dim n)``."""
    proj = _dot(root.basis, y)
    return root.tail * y + _dot(root.basis.T, root.coef[:, None] * proj)


def apply_right(root: InverseRoot, y: jax.Array) -> jax.Array:
    """``y @ root`` for ``y`` of shape ``(m, dim)``: Shampoo's right preconditioning
    ``G R^{-q}`` (Gupta et al. 2018, Alg. 1) in ``O(k m dim)``."""
    proj = _dot(y, root.basis.T)
    return root.tail * y + _dot(proj * root.coef[None, :], root.basis)
