r"""Streaming covariance sketches as pure JAX functions.

A sketch summarizes a stream of rows ``a_1, a_2, ...`` in ``R^d`` by a small state from which the
covariance ``A^T A = sum_t a_t a_t^T`` is approximated as ``C = V^T diag(lam) V + alpha * I`` with
``V`` having orthonormal rows. Every sketch here is a :class:`Sketch`: a small immutable object of
pure functions in the style of an Optax ``GradientTransformation``::

    sk = frequent_directions(sketch_size=10)
    state = sk.init(dim)                 # NamedTuple of arrays
    state = sk.update(state, row)        # jit-, vmap- and scan-friendly
    state = sk.update_many(state, rows)  # lax.scan over the rows
    V, lam, alpha = factors(state)       # C = V^T diag(lam) V + alpha I, never d x d

Implemented sketches (each constructor's docstring cites its papers):

* :func:`frequent_directions` -- FD (RFD paper Alg. 1; Ada-FD Alg. 1/2 lines 4-6) and, with
  ``fast=True``, the doubling-buffer FD (RFD paper Alg. 4).
* :func:`robust_frequent_directions` -- RFD (RFD paper Alg. 2) and fast RFD (Alg. 5): FD plus the
  ridge ``alpha`` growing by half the shrinkage (``alpha_fraction=1`` gives the S-AdaGrad rule of
  Feinberg et al. 2023).
* :func:`parameterized_frequent_directions` / :func:`compensative_frequent_directions` -- the PFD
  and CFD baselines of Desai, Ghashami & Phillips (2016) used in the RFD paper.
* :func:`oja` -- Oja's streaming eigenvector sketch of Oja-SON (SON paper eq. 4, Alg. 3).
* :func:`random_projection` -- the Gaussian random-projection sketch of RP-SON (SON paper sec. 3).

Conventions (``docs/design.md``, "Exact conventions"): ``sketch_size = tau`` counts the slot for
the incoming row, so after a shrink at most ``tau - 1`` rows are non-zero; FD is exact
(``C = A^T A``) while the rows seen span fewer than ``tau`` dimensions and whenever ``tau > d``.

Implementation notes (the "Speed" and "Bad input" sections of ``docs/design.md``):

* No ``tau x d`` SVD is ever taken. The FD family keeps its rows ``B`` together with their small
  Gram matrix ``K = B B^T``. Appending a row ``g`` adds ``B g`` as a new row and column of ``K``
  (after a shrink ``K`` is diagonal, so it becomes diagonal-plus-arrowhead). A shrink
  eigendecomposes the ``n x n`` matrix ``K = U diag(mu) U^T`` and rotates the rows with one matmul:
  ``B' = diag(sqrt((mu - shrink) / mu)) U^T B``, whose Gram is again diagonal. ``B g`` is the only
  other pass over the ``n x d`` rows.
* On long rows (16384 entries and more) per-step FD keeps ``B = F Z`` instead (the lazy basis,
  see :func:`frequent_directions`): the rotation goes into the small ``F`` and a rank-one update
  of ``Z`` frees the slot for the next row, ``O(n d)`` instead of ``O(n^2 d)`` per step.
* Quadratic quantities (``K``, ``alpha``, eigenvalues) are stored divided by ``4**scale_exp`` for a
  power-of-two scale chosen from the data at every step, so rows of norm ``1e30`` or ``1e-30`` in
  float32 neither overflow nor underflow, and no non-finite matrix ever reaches ``eigh``.
* A row containing NaN or Inf leaves the state exactly unchanged and increments
  ``nonfinite_count``. Sketch arrays are at least float32 (bf16/fp16 rows are upcast).

Complex rows (complex64/complex128; see :mod:`sketchopt.metrics`, "Complex parameters"): every
sketch approximates the Hermitian ``sum_t a_t a_t^H`` as ``C = V^H diag(lam) V + alpha I`` with
``V V^H = I``. The FD family and the random projection store the *conjugate* row ``conj(a_t)``
(so ``B^H B = sum_t a_t a_t^H``, the Gram matrix ``K = B B^H`` is Hermitian, and the product with
the next row stays the plain ``B a``); a shrink rotates by ``U^H`` of ``K = U diag(mu) U^H``;
Oja's update is ``V + Gamma (V a) a^H``. Eigenvalues, ``alpha`` and CFD's compensation are real
(float32/float64). Real rows run exactly the programs they ran before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt import _arrowhead, _groups, _kernels, _solvers, _validation
from sketchopt._numerics import (
    HIGHEST,
    abs2,
    conj,
    eigh_desc,
    flat_size,
    ldexp,
    real_dtype,
    rescale_exponent,
    state_dtype,
)
from sketchopt._partitioning import contract_d, like_last_axis
from sketchopt.operators import LowRankOperator

__all__ = [
    "Absorbed",
    "FrequentDirectionsState",
    "LowRank",
    "OjaState",
    "RandomProjectionState",
    "Sketch",
    "compensative_frequent_directions",
    "covariance",
    "factors",
    "frequent_directions",
    "low_rank",
    "oja",
    "parameterized_frequent_directions",
    "random_projection",
    "reader",
    "robust_frequent_directions",
]


class Sketch(NamedTuple):
    """A streaming sketch: pure ``init``/``update`` functions plus static metadata.

    Attributes:
      init: ``init(dim, dtype=jnp.float32) -> state``.
      update: ``update(state, row) -> state`` for one row of shape ``(dim,)``.
      update_many: ``update_many(state, rows) -> state``, a ``lax.scan`` of ``update``.
      sketch_size: the ``sketch_size`` it was built with.
      name: a short name (``"fd"``, ``"rfd"``, ...), for reports.
      update_with_product: ``(state, row) -> (state, basis @ row)`` with the product taken against
        the *new* basis rows and divided by ``4**scale_exp`` of the new state; the metrics use it
        to get ``V g`` without another pass over the sketch.
      absorb: ``absorb(state, row, valid=True) -> (state, product)``, ``update_with_product``
        without the non-finite check, for callers (the transforms) that check the row themselves:
        with ``valid`` false (and a zero row) the state comes back bit-identical and
        ``nonfinite_count`` is left to the caller. (The ``lift=`` argument of 0.2 still works and
        then returns ``absorb_solve``'s first three fields as a tuple; prefer ``absorb_solve``.)
      spec: what identifies the sketch by value (see :class:`sketchopt.metrics.Metric`).
      absorb_solve: ``absorb_solve(state, row, valid=True, lift=None) -> Absorbed``: ``absorb``
        fused with the residual of a Woodbury solve, and the one entry that returns everything an
        update produced (see :class:`Absorbed`). ``lift(state, product) -> a`` is a function of
        the new state's small fields (it must not read ``state.rows``, which may still hold the
        rows before the shrink's rotation) giving coefficients ``a`` over the rows of
        :func:`low_rank`'s ``basis``; ``residual = row - basis^T a``. A ``(2, n)`` pair ``(a, b)``
        gives the pair ``(row - basis^T a, basis^T b)`` in the same pass (the split solve of
        :class:`sketchopt.operators.LowRankOperator`). The per-step FD family
        computes it inside the pass that rotates the rows, saving a pass over the sketch.
        ``None`` on a ``Sketch`` built by hand with the eight fields of 0.2: then
        :func:`sketchopt.metrics.sketched` calls its ``absorb(..., lift=)`` as 0.2 did.
      paddable: whether zero coordinates appended to the rows change nothing else (the FD family
        and the random projection: their small Gram matrices see only inner products; not Oja,
        whose random initial directions depend on ``dim``). See ``LeafRule.paddable``.
      low_rank_of: ``low_rank_of(state) -> LowRank``, :func:`low_rank` of this sketch's states
        read with what the sketch knows of them: per-step FD and its relatives leave their Gram
        matrix diagonal after every update, which is then read without an eigendecomposition
        (:func:`reader`). ``None`` (a ``Sketch`` built by hand): :func:`low_rank`.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.frequent_directions(sketch_size=3)
      >>> state = sk.update_many(sk.init(4), jnp.eye(4))
      >>> sk.name, state.rows.shape, int(state.count)
      ('fd', (3, 4), 4)
    """

    init: Callable[..., Any]
    update: Callable[[Any, jax.Array], Any]
    update_many: Callable[[Any, jax.Array], Any]
    sketch_size: int
    name: str
    update_with_product: Callable[[Any, jax.Array], tuple[Any, jax.Array]]
    absorb: Callable[[Any, jax.Array], tuple[Any, jax.Array]]
    spec: Any = None
    absorb_solve: Callable[..., Absorbed] | None = None
    paddable: bool = False
    low_rank_of: Callable[[Any], Any] | None = None

    __eq__ = _validation.value_eq
    __hash__ = _validation.value_hash


class Absorbed(NamedTuple):
    """What :attr:`Sketch.absorb_solve` returns, the same fields for every sketch.

    Attributes:
      state: the new sketch state.
      product: ``basis @ row / 4**scale_exp`` against the *new* basis rows (``V g`` for free).
      residual: ``row - basis^T a`` for ``a = lift(state, product)`` (for a pair ``(a, b)`` the
        pair ``(row - basis^T a, basis^T b)``), or ``None`` when no ``lift`` was given.
      drawn: the random vector the update drew (the random projection's ``r_t``), or ``None``
        for the deterministic sketches: a caller that needs ``r_t`` reads it here and never
        draws it again.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.frequent_directions(3)
      >>> out = sk.absorb_solve(sk.init(4), jnp.ones(4))
      >>> out.product.shape, out.residual is None, out.drawn is None
      ((3,), True, True)
    """

    state: Any
    product: jax.Array
    residual: jax.Array | None = None
    drawn: jax.Array | None = None


class FrequentDirectionsState(NamedTuple):
    """State of the frequent-directions family (FD, fast FD, RFD, fast RFD, PFD, CFD).

    The sketched covariance is ``C = B^T B + alpha I`` (CFD adds ``compensation`` to each non-zero
    eigenvalue of ``B^T B``); quadratic fields are stored divided by ``4**scale_exp`` (use
    :func:`factors` or :func:`low_rank` for true values). The sketch ``B = transform @ rows``: with
    the eager basis (the doubling buffer, and per-step FD on short rows) ``transform`` stays the
    identity and ``rows`` is ``B`` itself; with the lazy basis (per-step FD on long rows, see
    :func:`frequent_directions`) a shrink only updates the small ``transform``, and ``rows`` hold
    the stored rows ``Z`` (past gradients, combined by a rank-one update per step), written back
    to ``B`` itself every 32 shrinks.

    Attributes:
      rows: the ``n x d`` buffer (``B``, or ``Z`` with the lazy basis) in true units (``n =
        sketch_size`` per-step, ``2 * sketch_size`` with the doubling buffer); the rows of ``B``
        at index ``>= fill`` are zero.
      gram: ``B B^T / 4**scale_exp`` (``n x n``; diagonal right after a shrink).
      fill: the number of rows of ``B`` in use.
      scale_exp: the power-of-two exponent ``e`` of the quadratic fields.
      alpha: the ridge ``alpha / 4**e``: ``alpha0`` plus ``alpha_fraction`` of every shrinkage
        (RFD; 0 for FD, PFD and CFD).
      compensation: CFD's total shrinkage ``/ 4**e`` (0 otherwise).
      count: the rows absorbed.
      nonfinite_count: the rows rejected for containing NaN/Inf.
      transform: the ``n x n`` matrix ``F`` with ``B = F @ rows`` (the identity unless the basis
        is lazy). A column of zeros marks a free row of ``rows``, where the next row goes.
      eigh_fallbacks: the shrinks whose arrowhead eigen-update did not converge and took
        ``eigh`` instead (int32; see :mod:`sketchopt._arrowhead`). It stays 0 where the
        arrowhead solve is not used: on CPU, whose LAPACK ``eigh`` is faster at these sizes,
        and inside a vmapped group of leaves.
    """

    rows: jax.Array
    gram: jax.Array
    fill: jax.Array
    scale_exp: jax.Array
    alpha: jax.Array
    compensation: jax.Array
    count: jax.Array
    nonfinite_count: jax.Array
    transform: jax.Array
    eigh_fallbacks: jax.Array

    #: Arrays the non-finite policy of the transforms does not re-read after a step (see
    #: ``sketchopt._leafwise``): the rows are rotated and shrunk from finite, power-of-two
    #: scaled quantities only, and a re-check would cost a pass over the sketch per step.
    GUARDED = ("rows",)


class OjaState(NamedTuple):
    """State of Oja's sketch (SON paper eq. 4): ``S_t = (t Lambda_t)^{1/2} V_t``.

    Attributes:
      directions: ``V_t`` (``m x d``) with orthonormal rows.
      eigenvalues: the running estimates ``Lambda_t`` (``m``), stored divided by
        ``4**scale_exp``.
      scale_exp: the power-of-two exponent of ``eigenvalues``.
      count: the step ``t``.
      nonfinite_count: the rows rejected for containing NaN/Inf.
    """

    directions: jax.Array
    eigenvalues: jax.Array
    scale_exp: jax.Array
    count: jax.Array
    nonfinite_count: jax.Array

    #: Orthonormal by construction (see :class:`FrequentDirectionsState`).
    GUARDED = ("directions",)


class RandomProjectionState(NamedTuple):
    """State of the Gaussian random-projection sketch ``S_t = S_{t-1} + r_t g_t^T``.

    Attributes:
      rows: ``S_t`` (``m x d``) in true units.
      gram: ``S S^T / 4**scale_exp`` (``m x m``).
      scale_exp: the power-of-two exponent of ``gram``.
      key: the PRNG key for the next ``r_t``.
      count: the rows absorbed.
      nonfinite_count: the rows rejected for containing NaN/Inf, or refused because they
        could overflow ``S`` (kept in true units).
    """

    rows: jax.Array
    gram: jax.Array
    scale_exp: jax.Array
    key: jax.Array
    count: jax.Array
    nonfinite_count: jax.Array

    #: Finite by construction (see :class:`FrequentDirectionsState`): a row that could overflow
    #: ``S`` is refused by a bound taken from the tracked Gram matrix (:func:`random_projection`).
    GUARDED = ("rows",)


#: The implicit factors of a sketch: ``C = V^T diag(lam) V + alpha I`` with ``V = 2**-e coef @
#: basis`` (``e = scale_exp``), ``lam`` and ``alpha`` stored divided by ``4**e``: since 0.4 the
#: one low-rank type, :class:`sketchopt.operators.LowRankOperator` (``weights = lam``, ``scalar =
#: alpha``, ``value_exp = e``; ``.eigenvalues`` and ``.alpha`` read them as before).
LowRank = LowRankOperator


# ----------------------------------------------------------------------------------------------
# Validation and small numerical helpers.


# Up to this |scale_exp| a product of the rows with the new row needs no pre-scaling: 2**scale_exp
# bounds the rows' norms and the new row's entries, so |B g| <= 2**(2 * 24) * sqrt(d) stays far
# below float32's overflow, and terms that could matter stay far above its underflow. Rows
# shorter than _UNSCALED_MIN_DIM are always pre-scaled (see _scaled_dot).
_UNSCALED_EXP = 24
_UNSCALED_MIN_DIM = 2**15


def _scaled_dot(rows, row, exp):
    """``rows @ row / 4**exp``, overflow- and underflow-free for rows scaled by ``2**exp``.

    The product itself is taken on ``row / 2**exp`` only when ``|exp|`` is large; at ordinary
    magnitudes ``rows @ row`` is scaled afterwards (exactly, by a power of two), which spares
    materializing a scaled copy of the ``d``-vector on a CPU. Short rows always take the first
    form: the copy costs nothing there, and the ``cond`` would cost compile time. So does a
    lone sketch on the accelerator path: XLA's TPU compiler fuses the scaling into the
    product's read, and charges a ``cond`` its costliest branch at every step (``ada_fd`` at
    ``d = 1e7``: 85 ``d``-vectors with the ``cond``, 76 without). In a group's ``vmap`` each
    leaf's exponent makes the scaled gradients a stacked copy (the 4-layer tree: 3.97 GB
    against 2.96 with the ``cond``): groups keep it.
    """

    def prescaled():
        return ldexp(contract_d(rows, ldexp(row, -exp)), -exp)

    lone = _solvers.accelerator_path_active() and not _groups.grouped()
    if row.shape[-1] < _UNSCALED_MIN_DIM or lone:
        return prescaled()
    return jax.lax.cond(
        _groups.all_leaves(jnp.abs(exp) <= _UNSCALED_EXP),
        lambda: ldexp(contract_d(rows, row), -2 * exp),
        prescaled,
    )


def _gram_low_rank(rows, gram, scale_exp, alpha, drop_last, transform=None, diagonal=False):
    """``LowRank`` of ``B`` (``rows``, or ``transform @ rows``) whose (scaled) Gram matrix is
    ``gram``: ``V = diag(mu^-1/2) U^T B``. ``diagonal`` (static): ``gram`` is known to be
    diagonal, and is read by sorting it (no ``eigh``, no run-time check)."""
    if diagonal:
        mu, u = _arrowhead.diagonal_desc(gram)
    else:  # diagonal or an arrowhead where it can be: checked at run time (see _arrowhead)
        mu, u, _ = _arrowhead.eigh_desc_structured(gram, gram.shape[-1] - 1)
    if drop_last:  # the buffer can never hold more than n-1 non-zero directions
        mu, u = mu[:-1], u[:, :-1]
    inv_sqrt = jnp.where(mu > 0, 1 / jnp.sqrt(jnp.where(mu > 0, mu, 1)), 0)
    # V = diag(mu^-1/2) U^T B / 2**scale_exp: the 2**-scale_exp stays outside coef (see LowRank).
    coef = conj(u * inv_sqrt).T  # complex: V = diag(mu^-1/2) U^H B
    if transform is not None:  # B = F Z: V = (diag(mu^-1/2) U^T F) Z
        coef = jnp.matmul(coef, transform, precision=HIGHEST)
    return LowRank(
        scalar=alpha,
        basis=rows,
        coef=coef,
        weights=mu,
        scale_exp=scale_exp,
        value_exp=scale_exp,
    )


def _blocked_passes() -> bool:
    """Whether long passes over the rows run as loops of column blocks: on the CPU code path of
    a single device. Accelerators (and :func:`sketchopt.accelerator_path` on the CPU, which
    tests their program) run whole-buffer products, and on a mesh a loop of slices along ``d``
    would gather it."""
    return not _solvers.accelerator_path_active() and jax.device_count() == 1


def _rotates_in_a_kernel(rows) -> bool:
    """Whether the rotations of ``rows`` go to :func:`sketchopt._kernels.rotate_rows` (static):
    the accelerator path's whole-buffer products, where the kernel takes the rows
    (:func:`sketchopt._kernels.applies`: traced for a TPU), outside a group's ``vmap`` (the
    kernel's fixed layout made XLA copy a group's stacked rows: more bytes than XLA's own
    products). Per-step FD then leaves its append to the rotation's pass (:func:`_fd_append`'s
    ``defer``)."""
    return not _blocked_passes() and not _groups.grouped() and _kernels.applies(rows)


# Column-block width of the in-place rotation (a tau x block tile stays in cache).
_ROTATION_BLOCK = 8192


def _rotate_rows(rot, rows, valid=True, coef=None, base=None, insert=None):
    """``rot @ rows`` for a small ``k x n`` ``rot`` (``k <= n``; output rows past ``k`` are zero),
    computed in place over column blocks.

    With ``coef`` (an ``n``-vector, or a ``(j, n)`` stack) and ``base`` (a ``d``-vector, or
    ``(j, d)``) also returns ``base - coef @ rows`` of the rows *before* the rotation, taken from
    the same tiles while they are in cache (a lift ``V^T a`` of the new basis is ``coef = rot^T
    a`` on the old one), and written over ``base``'s buffer. ``insert = (row, slot)``: the rows
    are taken with ``row`` in place of row ``slot`` (an append left to this pass, see
    :func:`_fd_append`), and ``base`` must then be ``row`` (or ``[row; 0]``, as
    :func:`_residual_terms` builds it): the kernel reads it as the row. With ``valid`` false
    the rows come back bit-identical (an identity ``rot`` alone would turn their ``-0.0``
    entries into ``+0.0``): the blocked loop then runs no iteration (in a group, whose leaves
    skip apart, each tile is selected), and ``base`` comes back unchanged.

    On a CPU a plain ``n x n`` by ``n x d`` matmul needs a second ``n x d`` buffer (a fresh
    allocation, page faults included, every step) and, with ``n`` small, runs far below peak;
    rotating one cache-sized block of columns at a time inside a loop writes back into the
    (donated) sketch buffer instead, about 3x faster at ``d = 1e6``. Accelerators pool their
    memory and run the plain matmul well, and a loop of dynamic slices along ``d`` would defeat
    sharding along ``d``, so they, multi-device runs and narrow sketches use the plain matmul;
    on a TPU a lone sketch's rotation is one in-place kernel (:func:`_rotates_in_a_kernel`).
    All compute the same products.
    """
    n, d = rows.shape
    block = _ROTATION_BLOCK
    blocked = _blocked_passes()
    # Inside the vmap over a group of leaves a per-leaf trip count and the tail's cond would
    # become selects over whole buffers: a group runs every block and selects each tile.
    grouped = _groups.grouped()

    def apply(tile):  # the rows below rot's (all zero) are written as zeros, not multiplied
        out = jnp.matmul(rot, tile, precision=HIGHEST)
        pad = like_last_axis(jnp.zeros((n - rot.shape[0], tile.shape[1]), tile.dtype), tile)
        return jnp.concatenate([out, pad]) if n > rot.shape[0] else out

    def whole():  # XLA's program over the whole buffer
        if coef is None:
            return jnp.where(valid, apply(rows), rows)
        # One product for the rotation and the lift: the sketch is read once for both.
        k = rot.shape[0]
        both = jnp.concatenate([rot, coef.reshape(-1, n)])
        out = jnp.matmul(both, rows, precision=HIGHEST)
        pad = like_last_axis(jnp.zeros((n - k, d), rows.dtype), rows)
        rotated = jnp.where(valid, jnp.concatenate([out[:k], pad]) if n > k else out[:k], rows)
        lifted = out[k:].reshape(coef.shape[:-1] + (d,))
        return rotated, base - jnp.where(valid, lifted, 0)

    if _rotates_in_a_kernel(rows):
        # On a TPU one in-place kernel; XLA's same products elsewhere (sketchopt._kernels).
        square = jnp.zeros((n, n), rows.dtype).at[: rot.shape[0]].set(rot)
        if coef is None:
            return _kernels.rotate_rows(square, rows, valid, insert=insert)
        # The residual's base is the inserted row (and zeros): the kernel has that row already.
        own = None if insert is not None else base.reshape(-1, d)
        out, residual = _kernels.rotate_rows(
            square, rows, valid, coef.reshape(-1, n), own, insert=insert
        )
        return out, residual.reshape(base.shape)
    if insert is not None:  # _fd_append defers only to the kernel's path
        raise ValueError("_rotate_rows: an inserted row needs the kernel's path")
    if d <= 2 * block or not blocked:
        return whole()

    def rotate(tile, base_tile):
        out = apply(tile)
        if coef is not None:
            lifted = base_tile - jnp.matmul(coef, tile, precision=HIGHEST)
            base_tile = jnp.where(valid, lifted, base_tile) if grouped else lifted
        return (jnp.where(valid, out, tile) if grouped else out), base_tile

    def body(i, carry):
        rows, base = carry
        start = i * block
        tile = jax.lax.dynamic_slice_in_dim(rows, start, block, axis=1)
        base_tile = None if coef is None else jax.lax.dynamic_slice_in_dim(base, start, block, -1)
        tile, base_tile = rotate(tile, base_tile)
        rows = jax.lax.dynamic_update_slice_in_dim(rows, tile, start, axis=1)
        if coef is not None:
            base = jax.lax.dynamic_update_slice_in_dim(base, base_tile, start, axis=-1)
        return rows, base

    num_blocks = d // block
    # A skipped row runs no iteration at all: a select per tile cost a third of the rotation
    # (a group, whose leaves skip apart, pays it).
    trips = num_blocks if grouped else jnp.where(valid, num_blocks, 0)
    rows, base = jax.lax.fori_loop(0, trips, body, (rows, base))
    start = num_blocks * block
    if start < d:
        # The ragged tail after the loop, under a cond: a select reading the rows inside the
        # update (or the tail placed before the loop) made XLA copy the whole buffer.
        tails = (rows[:, start:], None if coef is None else base[..., start:])
        if grouped:
            tail, base_tail = rotate(*tails)
        else:
            tail, base_tail = jax.lax.cond(valid, rotate, lambda *t: t, *tails)
        rows = jax.lax.dynamic_update_slice_in_dim(rows, tail, start, axis=1)
        if coef is not None:
            base = jax.lax.dynamic_update_slice_in_dim(base, base_tail, start, axis=-1)
    return rows if coef is None else (rows, base)


# The FD family tracks B B^T through rotations instead of recomputing it (docs/design.md,
# "Speed"). Each rotation leaves an eps-sized mismatch between the tracked Gram matrix and the
# rows, and over 1e5 float32 steps it added up to a 1e-3 loss of orthonormality of the
# directions; recomputing the Gram matrix exactly from the rows every GRAM_REFRESH_PERIOD shrinks
# (one n x n x d product, an amortized 1/32 of a rotation) keeps it near 1e-6. Under vmap the
# lax.cond becomes a select.
GRAM_REFRESH_PERIOD = 32


# Column-block width of the exact Gram matrix's product on a CPU (see _exact_gram).
_GRAM_BLOCK = 32768


def _exact_gram(rows, scale_exp):
    """``B B^T / 4**scale_exp``, overflow-free: the rows are scaled before the product where
    ``|scale_exp|`` is large (as in :func:`_scaled_dot`).

    On the CPU code path of a single device, for long rows, the product is summed over column
    blocks, each scaled in cache: XLA:CPU's one ``n x n`` by ``d`` product ran at a fifth of
    that speed (``n = 10``, ``d = 1e6``: 33 ms against 6.5 ms on the project's CPU), and a
    whole scaled copy, even in a rarely taken branch, sizes every call's scratch memory (above
    the allocator's reuse limit, 32 MB, a fresh mapping whose touched pages fault in again at
    every call). Elsewhere (one product, which accelerators run at full speed; a mesh, whose
    ``d`` a loop of slices would gather) the product at ordinary scales is scaled afterwards.
    """

    def gram(r):
        return contract_d(r, conj(r).T)  # complex: B B^H

    d = rows.shape[-1]
    if d < _UNSCALED_MIN_DIM:
        return gram(ldexp(rows, -scale_exp))
    if _blocked_passes():
        block = min(_GRAM_BLOCK, d)
        tiles = d // block

        def add(i, acc):
            tile = jax.lax.dynamic_slice_in_dim(rows, i * block, block, axis=-1)
            return acc + gram(ldexp(tile, -scale_exp))

        acc = gram(ldexp(rows[..., tiles * block :], -scale_exp))
        return jax.lax.fori_loop(0, tiles, add, acc)
    return jax.lax.cond(
        _groups.all_leaves(jnp.abs(scale_exp) <= _UNSCALED_EXP),
        lambda: ldexp(gram(rows), -2 * scale_exp),
        lambda: gram(ldexp(rows, -scale_exp)),
    )


def _residual_terms(a, row):
    """``(coef, base)`` with ``base - coef @ basis`` the residual :class:`Absorbed` documents."""
    if a.ndim == 1:
        return a, row
    return jnp.stack([a[0], -a[1]]), jnp.stack([row, jnp.zeros_like(row)])


def _conj_residual_terms(a, row):
    """:func:`_residual_terms` for ``row - basis^H a`` (complex rows; the real case is the same
    call): ``basis^H a = conj(basis^T conj(a))``, so the real formula runs on ``conj(a)`` and
    ``conj(row)`` and its result is conjugated back by the caller (:func:`conj`)."""
    return _residual_terms(conj(a), conj(row))


def _make_sketch(init, absorb, sketch_size, name, *, spec=None, paddable=False, low_rank_of=None):
    """Wrap ``absorb(state, row, valid, lift) -> Absorbed`` into a :class:`Sketch`.

    ``absorb`` must leave the state bit-identical when ``valid`` is false (it then receives a zero
    row). It may ignore ``lift`` (returning ``residual=None``): the residual is then taken here,
    after the update, in a pass of its own. Skipping by selection rather than ``lax.cond`` keeps
    XLA from copying the sketch buffer and costs the same under ``vmap``, where a ``cond``
    becomes a select anyway.
    """

    def update_with_product(state, row):
        row = jnp.ravel(row)
        finite = jnp.all(jnp.isfinite(row))
        out = absorb(state, jnp.where(finite, row, 0), finite, None)
        state = out.state._replace(nonfinite_count=out.state.nonfinite_count + (~finite))
        return state, out.product

    def update(state, row):
        return update_with_product(state, row)[0]

    def update_many(state, rows):
        return jax.lax.scan(lambda s, r: (update(s, r), None), state, rows)[0]

    def absorb_solve(state, row, valid=True, lift=None):
        row, valid = jnp.ravel(row), jnp.asarray(valid)
        out = absorb(state, row, valid, lift)
        if lift is None or out.residual is not None:
            return out
        coef, base = _conj_residual_terms(lift(out.state, out.product), row)
        basis = low_rank(out.state).basis
        return out._replace(residual=conj(base - jnp.matmul(coef, basis, precision=HIGHEST)))

    def absorb_pair(state, row, valid=True, lift=None):
        out = absorb_solve(state, row, valid, lift)
        return out[:2] if lift is None else out[:3]

    return Sketch(
        init,
        update,
        update_many,
        sketch_size,
        name,
        update_with_product,
        absorb_pair,
        spec,
        absorb_solve,
        paddable,
        low_rank_of,
    )


# ----------------------------------------------------------------------------------------------
# The frequent-directions family.


def _fd_spectrum(gram, tau, num_shrunk, arrow):
    """Eigenpairs of ``B B^T`` and FD's shrunk spectrum (RFD paper Alg. 1/2 lines 4-5).

    Ada-FD Alg. 1/2 lines 5-6, on the small Gram matrix: returns ``(mu, u, delta, shrunk)`` with
    ``B B^T = U diag(mu) U^T`` (``mu`` descending), ``delta = sigma_tau^2`` and
    ``shrunk = mu - delta`` on the ``num_shrunk`` smallest of the top ``tau`` (all of them for
    FD; PFD of Desai et al. reduces only these), ``mu`` above them and 0 from index ``tau - 1``;
    also whether the arrowhead solve fell back to ``eigh`` (see ``eigh_fallbacks``).
    """
    if _arrowhead.arrowhead_pays():  # an arrowhead after each per-step shrink
        mu, u, fallback = _arrowhead.eigh_desc_structured(gram, arrow)
    else:  # on CPU LAPACK beats the solver: no run-time dispatch at all
        mu, u = eigh_desc(gram)
        fallback = jnp.bool_(False)
    delta = mu[tau - 1]  # (sigma_tau)^2: the tau-th largest squared singular value
    idx = jnp.arange(gram.shape[0])
    shrunk = jnp.where(idx >= tau - num_shrunk, jnp.maximum(mu - delta, 0), mu)
    shrunk = jnp.where(idx < tau - 1, shrunk, 0)  # keep tau - 1 rows
    return mu, u, delta, shrunk, fallback


def _fd_shrunk(state, valid, tau, num_shrunk, alpha_fraction, compensate):
    """The shrink's rotation ``rot`` (``B' = rot B``, see :func:`_fd_spectrum`) and the state with
    its small fields shrunk (RFD paper Alg. 1/2 lines 4-6), shared by both bases; the rows are
    the caller's. With ``valid`` false the small fields are unchanged."""
    arrow = jnp.maximum(state.fill - 1, 0)  # the row just appended: B B^T is an arrowhead
    mu, u, delta, shrunk, fallback = _fd_spectrum(state.gram, tau, num_shrunk, arrow)
    ratio = jnp.where(mu > 0, shrunk / jnp.where(mu > 0, mu, 1), 0)
    rot = conj(u * jnp.sqrt(ratio)).T  # B' = diag(sqrt((mu - delta)/mu)) U^T B (complex: U^H)
    new = state._replace(
        gram=jnp.where(valid, jnp.diag(shrunk), state.gram),
        fill=jnp.where(valid, tau - 1, state.fill).astype(jnp.int32),
        alpha=jnp.where(valid, state.alpha + alpha_fraction * delta, state.alpha),
        compensation=jnp.where(valid & compensate, state.compensation + delta, state.compensation),
        eigh_fallbacks=state.eigh_fallbacks + (valid & fallback),
    )
    return rot, new


def _fd_shrink(
    state,
    product,
    valid,
    lift=None,
    row=None,
    *,
    tau,
    num_shrunk,
    alpha_fraction,
    compensate,
    fold=False,
    insert=None,
):
    """FD's shrink (RFD paper Alg. 1 lines 4-5, Alg. 2 lines 4-6): rotate ``B``, shrink it.

    ``B' = diag(sqrt(shrunk / mu)) U^T B`` (see :func:`_fd_spectrum`) keeps ``tau - 1`` rows;
    ``alpha`` grows by ``alpha_fraction * delta`` (Alg. 2 line 6 with ``1/2``) and, for CFD,
    ``compensation`` by ``delta``; ``product = B g`` becomes ``B' g``. With ``valid`` false the
    rotation is the identity and the state is returned unchanged. With ``lift`` (see
    :class:`Sketch`) also returns ``row - B'^T a``, taken in the pass that rotates the rows.
    ``fold`` (static; the eager basis on the accelerator path): ``B = F Z`` with any ``F`` (a
    state the lazy basis left), rotated as ``B' = (rot F) Z`` in the same one matmul, and
    ``F' = I``. ``insert = (g, slot)``: the append's row, written into the stored rows by the
    rotation's pass (:func:`_fd_append`'s ``defer``).
    """
    n = state.gram.shape[0]
    rot, new = _fd_shrunk(state, valid, tau, num_shrunk, alpha_fraction, compensate)
    rot = jnp.where(valid, rot, jnp.eye(n, dtype=rot.dtype))
    product = rot @ product
    # over the stored rows: B' = rot B = (rot F) Z
    rot_z = jnp.matmul(rot, state.transform, precision=HIGHEST) if fold else rot
    if fold:
        eye = jnp.eye(n, dtype=state.transform.dtype)
        new = new._replace(transform=jnp.where(valid, eye, state.transform))
    kept = rot_z[: tau - 1]  # the rows past tau - 1 of the rotation are zero
    if lift is None:
        return new._replace(rows=_rotate_rows(kept, state.rows, valid, insert=insert)), product
    # new.rows still holds the rows before the rotation: lift reads only the small fields.
    # B'^T a = Z^T ((rot F)^T a); complex: B'^H a = conj(Z^T ((rot F)^T conj(a)))
    coef, base = _residual_terms(conj(lift(new, product)) @ rot_z, conj(row))
    rows, residual = _rotate_rows(kept, state.rows, valid, coef, base, insert)
    return new._replace(rows=rows), product, conj(residual)


def _fd_rescale_exponent(state, row, valid):
    """The next power-of-two ``scale_exp`` for ``row`` and the quadratic fields (no paper step).

    It covers ``row``, ``B B^T``, ``alpha`` and CFD's sum: see the module docstring's
    implementation notes.
    """
    diag = jnp.diagonal(state.gram)
    if jnp.iscomplexobj(diag):  # Hermitian: a real diagonal
        diag = jnp.real(diag)
    # alpha and compensation live under the same scale as the Gram matrix: cover them too, or
    # a large alpha0 followed by tiny rows would be scaled up to overflow.
    quadratic = jnp.maximum(jnp.max(diag, initial=0), jnp.maximum(state.alpha, state.compensation))
    exp = rescale_exponent(state.scale_exp, jnp.max(jnp.abs(row), initial=0), quadratic)
    return jnp.where(valid, exp, state.scale_exp)


def _free_slot(transform, fill):
    """The row of the stored rows the next row goes to: the first all-zero column of ``F``.

    Called with the lazy basis only: its shrink leaves one column of ``F`` zero (see
    :func:`_fd_shrink_lazy`); right after a write-back ``F = I`` and the slot is ``fill``, whose
    row is zero.
    """
    unused = jnp.all(transform == 0, axis=0)
    return jnp.where(jnp.any(unused), jnp.argmax(unused), fill).astype(jnp.int32)


def _fd_append(state, row, valid, lazy=False, defer=False):
    """``(state, B g / 4**exp, rows @ g / 4**exp, slot)`` after inserting ``g`` as row ``fill``
    of ``B`` (RFD paper Alg. 1/2 line 3), stored in row ``slot`` of the rows.

    Ada-FD Alg. 1/2 line 4 ("insert g_t into the last row"). The state is rescaled to the new
    ``scale_exp`` and the Gram matrix gains ``B g`` as row and column ``fill``. With the lazy
    basis ``g`` is stored in a free row ``s`` of ``Z`` and ``F`` gains ``F[fill, s] = 1``: the
    new row of ``B = F Z`` is ``g`` and the others are unchanged (column ``s`` of ``F`` was zero).

    ``defer`` (static; the rotation kernel's path, :func:`_rotates_in_a_kernel`): the rows are
    left as they were, and the shrink's one pass writes ``g`` into row ``slot`` as it rotates
    (its ``insert``). The slot's row is zero (the shrink, or the lazy basis's freed row, left it
    so), so ``rows @ g`` is the old rows' product with ``|g|^2`` at ``slot``, and the exact
    Gram refresh patches that row and column in (:func:`_fd_refresh_gram`'s ``pending``).
    """
    exp = _fd_rescale_exponent(state, row, valid)
    factor = 2 * (state.scale_exp - exp)
    gram = ldexp(state.gram, factor)
    j = state.fill
    slot = _free_slot(state.transform, j) if lazy else j
    # Insert first, then take the one pass over the rows: B g / 4**exp with the new row's own
    # squared norm at position j (the slot was zero). In this order the in-place insertion
    # and the later in-place rotation never race with the read, so XLA copies nothing.
    # A skipped (invalid) row leaves everything bit-identical, signed zeros included: the
    # slot keeps its old contents and the small arrays are selected.
    if defer:  # real float32 rows only (sketchopt._kernels.applies)
        rows = state.rows
        squared = jnp.sum(jnp.square(ldexp(row, -exp)))  # |g|^2 / 4**exp in one fused read
        stored = _scaled_dot(rows, row, exp).at[slot].set(squared)
    else:
        old = jax.lax.dynamic_slice_in_dim(state.rows, slot, 1, axis=0)
        new_row = jnp.where(valid, conj(row)[None, :], old)  # complex: conj(g): B^H B += g g^H
        rows = jax.lax.dynamic_update_slice(state.rows, new_row, (slot, jnp.int32(0)))
        stored = _scaled_dot(rows, row, exp)
    transform = state.transform
    prod = stored
    if lazy:
        transform = jnp.where(valid, transform.at[j, slot].set(1), transform)
        prod = jnp.matmul(transform, stored, precision=HIGHEST)
    # complex: column j of B B^H is B g, row j its conjugate (K_jj = |g|^2 real)
    gram = jnp.where(valid, gram.at[j, :].set(conj(prod)).at[:, j].set(prod), state.gram)
    step = valid.astype(jnp.int32)
    state = state._replace(
        rows=rows,
        gram=gram,
        fill=j + step,
        scale_exp=exp,
        alpha=jnp.where(valid, ldexp(state.alpha, factor), state.alpha),
        compensation=jnp.where(valid, ldexp(state.compensation, factor), state.compensation),
        count=state.count + step,
        transform=transform,
    )
    return state, prod, stored, slot


def _free_rows(rows, h, k, valid, coef=None):
    """``Z' = Z - h z_k^T`` (row ``k`` becomes zero: ``h_k = 1``), written over ``Z``'s buffer.

    With ``coef`` (an ``n``-vector, or a ``(j, n)`` stack, over the rows of ``Z'``) also returns
    ``coef @ Z'``. A skipped row (``valid`` false) leaves every bit, and the product is zero.

    Two passes over ``Z``: one product reads row ``k`` (a one-hot row: exact, one non-zero term
    per sum) and the coefficients' product (``c^T Z' = (c - (h . c) e_k)^T Z``) together, before
    the update; then the update is one elementwise pass over the donated buffer. Read out by a
    slice, or the product taken from ``Z'`` while a later ``cond`` (the write-back) may rewrite
    ``Z'``, the update would overwrite rows still to be read and XLA copies the whole buffer (on a
    CPU a fresh ``n x d`` allocation, page faults included: at ``d = 1e6``, ``n = 10`` 13 ms
    against 3.5 ms). Plain array operations, so the same program on every backend, under a
    group's ``vmap`` and on a mesh (with ``Z`` split along ``d`` every product contracts the
    rows: nothing crosses devices).
    """
    n = rows.shape[0]
    onehot = jax.nn.one_hot(k, n, dtype=rows.dtype)
    if coef is None:
        lhs = onehot[None]
    else:
        coef = coef - (coef @ h)[..., None] * onehot  # over the rows of Z
        lhs = jnp.concatenate([onehot[None], coef.reshape(-1, n)])
    prod = jnp.matmul(lhs, rows, precision=HIGHEST)
    rows = jnp.where(valid, rows - h[:, None] * prod[0], rows)
    if coef is None:
        return rows
    return rows, jnp.where(valid, prod[1:].reshape(coef.shape[:-1] + rows.shape[1:]), 0)


def _fd_shrink_lazy(
    state, stored, valid, lift=None, row=None, *, tau, num_shrunk, alpha_fraction, compensate
):
    """FD's shrink with the lazy basis: the same ``B'`` as :func:`_fd_shrink` (RFD paper Alg. 1/2
    lines 4-6), kept as ``F' Z'`` (the ``V_t = F_t Z_t`` form of the SON paper's sec. 4).

    ``B' = rot B = (rot F) Z`` costs ``O(n^3)``: ``F1 = rot F`` (``rot`` as in
    :func:`_fd_shrink`). Its rows past ``tau - 2`` are zero, so ``F1`` has a unit null vector
    ``q`` (:func:`sketchopt._arrowhead.null_vector`); with ``k = argmax |q_i|`` and
    ``h = q / q_k`` (``|h_i| <= 1``),
    ``F1 Z = F1 (Z - h z_k^T)`` up to ``F1 q = 0``, and row ``k`` of ``Z' = Z - h z_k^T`` is zero:
    ``F' = F1`` with column ``k`` zeroed frees it for the next row. One ``O(n d)`` rank-one update
    of the stored rows replaces the ``O(n^2 d)`` rotation. Returns ``(state, Z' g / 4**e)`` and,
    with ``lift``, the residual ``row - Z'^T a`` (``a`` over the rows of ``Z'``).
    """
    rot, new = _fd_shrunk(state, valid, tau, num_shrunk, alpha_fraction, compensate)
    f1 = jnp.matmul(rot, state.transform, precision=HIGHEST)
    q = _arrowhead.null_vector(f1[: tau - 1])
    k = jnp.argmax(jnp.abs(q)).astype(jnp.int32)
    h = (q / q[k]).at[k].set(1)
    new = new._replace(transform=jnp.where(valid, f1.at[:, k].set(0), state.transform))
    product = jnp.where(valid, stored - h * stored[k], stored)  # Z' g = Z g - h (z_k . g)
    if lift is None:
        return new._replace(rows=_free_rows(state.rows, h, k, valid)), product
    # new.rows are still Z: lift reads the small fields only. Complex: Z'^H a = conj(Z'^T conj(a))
    # (see _conj_residual_terms); a pair (a, b) gives (row - Z'^T a, Z'^T b), formed elementwise
    # from the product (a stacked (row, 0) would be one more pass).
    rows, lifted = _free_rows(state.rows, h, k, valid, conj(lift(new, product)))
    residual = (
        conj(row) - lifted if lifted.ndim == 1 else jnp.stack([conj(row) - lifted[0], lifted[1]])
    )
    return new._replace(rows=rows), product, conj(residual)


def _refresh_due(state, shrank, *, n, tau):
    """Whether this shrink is one of every GRAM_REFRESH_PERIOD (numerics only, no paper step)."""
    index = (state.count - n) // (n - tau + 1)  # 0 for the first shrink with a full buffer
    return shrank & (index % GRAM_REFRESH_PERIOD == GRAM_REFRESH_PERIOD - 1)


def _fd_refresh_gram(state, shrank, *, n, tau, lazy=False, pending=None):
    """``B B^T`` recomputed exactly from the rows every GRAM_REFRESH_PERIOD shrinks (numerics only).

    Replaces the tracked Gram matrix so that round-off cannot accumulate in it (see
    GRAM_REFRESH_PERIOD). Per-step FD refreshes it between the append and the shrink, whose ``eigh``
    then takes the exact matrix and leaves ``diag(shrunk)``: its Gram matrix is diagonal after
    every update (read without ``eigh``, :func:`_fd_low_rank_diagonal`). With the ``lazy``
    basis ``B = F Z`` that is ``F (Z Z^T) F^T`` (complex: ``F (Z Z^H) F^H``). The doubling
    buffer refreshes after its shrink, outside its ``lax.cond``: nested there, reading the rows
    made XLA copy them. ``pending = (g, slot, rows @ g)``: the append left ``g`` out of the
    rows (:func:`_fd_append`'s ``defer``), whose zero row ``slot`` the product then fills in.
    """
    if not _solvers.gram_refreshes_active():  # measuring the steps between refreshes
        return state
    refresh = _refresh_due(state, shrank, n=n, tau=tau)

    def exact():
        gram = _exact_gram(state.rows, state.scale_exp)
        if pending is not None:
            _, slot, stored = pending
            gram = gram.at[slot, :].set(stored).at[:, slot].set(stored)
        if lazy:
            f = state.transform
            gram = jnp.matmul(jnp.matmul(f, gram, precision=HIGHEST), conj(f).T, precision=HIGHEST)
        return _groups.select_leaves(refresh, gram, state.gram)

    gram = jax.lax.cond(_groups.any_leaf(refresh), exact, lambda: state.gram)
    return state._replace(gram=gram)


def _fd_rematerialize(state, product, shrank, *, n, tau):
    """The lazy basis written back, ``Z <- F Z = B`` and ``F <- I``, every
    GRAM_REFRESH_PERIOD shrinks.

    One rotation of the stored rows (what the eager basis pays at every shrink) bounds the
    growth of ``Z`` and the round-off that ``B = F Z`` accumulates; ``product`` follows the new
    rows (``B g``). At the same steps :func:`_fd_refresh_gram` recomputed ``B B^T`` before the
    shrink.
    """
    if not _solvers.gram_refreshes_active():
        return state, product
    due = _refresh_due(state, shrank, n=n, tau=tau)

    def written_back():  # in a group the leaves not due keep their rows (tile by tile)
        rows = _rotate_rows(state.transform[: tau - 1], state.rows, due)
        eye = jnp.eye(n, dtype=state.transform.dtype)
        moved = jnp.matmul(state.transform, product, precision=HIGHEST)
        transform, moved = _groups.select_leaves(due, (eye, moved), (state.transform, product))
        return state._replace(rows=rows, transform=transform), moved

    return jax.lax.cond(_groups.any_leaf(due), written_back, lambda: (state, product))


# From this many columns on, per-step FD keeps a lazy basis (see frequent_directions): its
# rank-one update costs O(n d) against the rotation's O(n^2 d), for an O(n^3) QR per step that
# short rows would notice.
_LAZY_MIN_DIM = 2**14


def _fd_per_step(state, row, valid, lift, shrink, refresh_gram, *, fold):
    """Per-step FD's append, Gram refresh and shrink (RFD paper Alg. 1/2 lines 3-6).

    Where the rows rotate in the TPU's kernel (:func:`_rotates_in_a_kernel`) and the shrink
    also lifts a residual from ``g``, the append of ``g`` is left to the shrink's pass
    (:func:`_fd_append`'s ``defer``): the kernel reads ``g`` as a ``(1, d)`` row, on a TPU a
    relayout of the 1-D gradient (a copy), which only the lift's base needs anyway (``ada_fd``
    at ``d = 1e7``, 32 steps between refreshes: 71 ``d``-vectors deferred, 83 not; ``fd_son``,
    without the lift: 128 deferred, 122 not). On XLA's own products (a CPU's, a GPU's) the
    row's in-place write would then follow reads of the old rows that XLA does not order before
    it, and it copies the sketch (``tests/test_driver.py``).
    """
    defer = lift is not None and _rotates_in_a_kernel(state.rows)
    state, prod, stored, slot = _fd_append(state, row, valid, lazy=fold, defer=defer)
    pending = (row, slot, stored) if defer else None
    state = refresh_gram(state, valid, lazy=fold, pending=pending)  # before the shrink
    insert = pending[:2] if defer else None
    if lift is not None:
        return Absorbed(*shrink(state, prod, valid, lift, row, fold=fold, insert=insert))
    return Absorbed(*shrink(state, prod, valid, fold=fold, insert=insert))


def _lazy_flag(lazy):
    """``None`` (by the row length) or a static bool."""
    return None if lazy is None else _validation.flag("lazy", lazy)


def _fd_family(
    sketch_size: int,
    *,
    fast: bool,
    name: str,
    alpha0: float = 0.0,
    alpha_fraction: float = 0.0,
    compensate: bool = False,
    num_shrunk: int | None = None,
    lazy: bool | None = None,
) -> Sketch:
    """FD and its relatives as one routine: a buffer of ``n`` rows shrunk when full.

    Per-step FD uses ``n = tau`` (the shrink runs at every row, RFD paper Alg. 1/2); the doubling
    form uses ``n = 2 * tau`` (Alg. 4/5). A shrink subtracts the ``tau``-th largest squared
    singular value from the ``num_shrunk`` smallest of the top ``tau`` (all of them for FD, the
    ``floor(beta * tau)`` smallest for PFD), keeps ``tau - 1`` rows, adds ``alpha_fraction`` of
    the shrinkage to ``alpha`` (1/2 for RFD) and, for CFD, all of it to ``compensation``.
    ``lazy`` (per-step only): keep ``B = F Z`` (:func:`_fd_shrink_lazy`); ``None`` chooses it
    for rows of at least _LAZY_MIN_DIM entries.
    """
    tau = sketch_size
    n = 2 * tau if fast else tau
    num_shrunk = tau if num_shrunk is None else num_shrunk
    options = {
        "tau": tau,
        "num_shrunk": num_shrunk,
        "alpha_fraction": alpha_fraction,
        "compensate": compensate,
    }
    shrink = functools.partial(_fd_shrink, **options)
    shrink_lazy = functools.partial(_fd_shrink_lazy, **options)
    refresh_gram = functools.partial(_fd_refresh_gram, n=n, tau=tau)
    rematerialize = functools.partial(_fd_rematerialize, n=n, tau=tau)

    def is_lazy(dim):  # static: from the row length and the code path
        if fast or tau < 2:
            return False
        if lazy is None:  # accelerators: the eager basis, one matmul rotating the whole sketch
            return dim >= _LAZY_MIN_DIM and not _solvers.accelerator_path_active()
        return lazy

    def init(dim, dtype=jnp.float32):
        dim, dtype = flat_size(dim), state_dtype(dtype)
        zero = jnp.zeros((), real_dtype(dtype))  # alpha, compensation: real for complex rows
        return FrequentDirectionsState(
            rows=jnp.zeros((n, dim), dtype),
            gram=jnp.zeros((n, n), dtype),
            fill=jnp.zeros((), jnp.int32),
            scale_exp=jnp.zeros((), jnp.int32),
            alpha=zero + alpha0,
            compensation=zero,
            count=jnp.zeros((), jnp.int32),
            nonfinite_count=jnp.zeros((), jnp.int32),
            transform=jnp.eye(n, dtype=dtype),
            eigh_fallbacks=jnp.zeros((), jnp.int32),
        )

    def absorb_lazy(state, row, valid, lift):
        state, _, stored, _ = _fd_append(state, row, valid, lazy=True)
        state = refresh_gram(state, valid, lazy=True)  # before the shrink (_fd_refresh_gram)
        out = shrink_lazy(state, stored, valid, lift, row)
        state, product = rematerialize(*out[:2], valid)
        return Absorbed(state, product, *out[2:])

    def absorb(state, row, valid, lift=None):
        """Append ``row``, then shrink: at every row (Alg. 1/2) or when the buffer is full (4/5)."""
        row = like_last_axis(row.astype(state.rows.dtype), state.rows)
        if is_lazy(row.shape[-1]):
            return absorb_lazy(state, row, valid, lift)
        # The eager basis on the accelerator path also takes a state the lazy basis left (B = F Z,
        # a checkpoint of the CPU path): the append goes to F's free slot and the shrink folds F.
        fold = not fast and lazy is None and _solvers.accelerator_path_active()
        if not fast:
            return _fd_per_step(state, row, valid, lift, shrink, refresh_gram, fold=fold)
        state, prod, _, _ = _fd_append(state, row, valid)
        full = state.fill == n

        def shrink_full(s, p):  # in a group the leaves not full come back unchanged
            s, q = shrink(s, p, full)
            return s, _groups.select_leaves(full, q, p)

        state, prod = jax.lax.cond(
            _groups.any_leaf(full), shrink_full, lambda s, p: (s, p), state, prod
        )
        return Absorbed(refresh_gram(state, full), prod)  # the residual is taken after the update

    spec = _validation.spec_key(
        "fd_family", tau, fast, name, alpha0, alpha_fraction, compensate, num_shrunk, lazy
    )
    reading = None if fast else _fd_low_rank_diagonal  # per-step: diagonal after every update
    return _make_sketch(init, absorb, tau, name, spec=spec, paddable=True, low_rank_of=reading)


def frequent_directions(
    sketch_size: int, *, fast: bool = False, lazy: bool | None = None
) -> Sketch:
    """Frequent directions (FD): the deterministic sketch ``C = B^T B`` of ``A^T A``.

    Per step the new row ``a_t`` goes into the empty last row of the ``tau x d`` sketch ``B``
    (``tau = sketch_size``) and, with ``B = U Sigma V^T``, every squared singular value is shrunk
    by the smallest one: ``B <- sqrt(Sigma^2 - sigma_tau^2 I) V^T``, which leaves ``tau - 1``
    non-zero rows. With ``fast=True`` rows are appended to a ``2 tau`` buffer and the shrink (by
    the ``tau``-th squared singular value, keeping ``tau - 1`` rows) runs only when it is full:
    ``O(tau d)`` amortized per row instead of ``O(tau^2 d)``. Guarantee: ``0 <= A^T A - B^T B``
    and ``||A^T A - B^T B||_2 <= ||A - A_k||_F^2 / (tau - k)`` for every ``k < tau``.

    Args:
      sketch_size: ``tau >= 1``, the rows of the sketch including the slot for the incoming row
        (the RFD paper's ``m``, Ada-FD's ``tau``).
      fast: use the doubling buffer.
      lazy: keep the per-step sketch as ``B = F Z`` (see below); ``None`` (the default) does so
        for rows of at least 16384 entries. Ignored with ``fast=True``.

    Returns:
      A :class:`Sketch` (``"fd"``, or ``"fast_fd"``) with a :class:`FrequentDirectionsState`.

    The lazy basis: the per-step shrink ``B <- R B`` (``R`` from the ``tau x tau`` Gram matrix)
    rotates all ``tau x d`` numbers. Kept as ``B = F Z`` instead, the shrink updates the small
    ``F <- R F``; ``R`` zeroes one row of ``B``, so ``F`` gains a null vector ``q``, and ``Z <- Z
    - (q / q_k) z_k^T`` (``k = argmax |q_i|``) frees a row of ``Z`` for the next ``g`` without
    changing ``B``: ``O(tau d)`` per step instead of ``O(tau^2 d)``, the same ``B`` to round-off.
    Every 32 shrinks ``Z <- F Z`` and ``F <- I`` (one rotation) bound the drift. This is the
    ``V_t = F_t Z_t`` form of the SON paper's sparse updates (sec. 4), applied to dense FD.

    References:
      Liberty (2013), "Simple and Deterministic Matrix Sketching", KDD. Ghashami, Liberty, Phillips
      & Woodruff (2016), "Frequent Directions: Simple and Deterministic Matrix Sketching", SIAM J.
      Comput. 45: the algorithm and its error bound. Luo, Chen, Zhang, Li & Zhang (2019), "Robust
      Frequent Directions with Application in Online Learning", JMLR 20, Alg. 1 (FD), Alg. 4
      (``fast``) and eq. (1). Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via
      Frequent Directions", IJCAI, Alg. 1/2 lines 4-6.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.frequent_directions(3)
      >>> rows = jnp.array([[3.0, 0, 0], [0, 2, 0], [0, 0, 1]])
      >>> V, lam, alpha = so.sketches.factors(sk.update_many(sk.init(3), rows))
      >>> lam  # squared singular values 9, 4, 1 shrunk by the smallest
      Array([8., 3.], dtype=float32)
    """
    tau = _validation.size("sketch_size", sketch_size)
    fast = _validation.flag("fast", fast)
    return _fd_family(tau, fast=fast, name="fast_fd" if fast else "fd", lazy=_lazy_flag(lazy))


def robust_frequent_directions(
    sketch_size: int,
    *,
    fast: bool = False,
    alpha0: float = 0.0,
    alpha_fraction: float = 0.5,
    lazy: bool | None = None,
) -> Sketch:
    """Robust frequent directions (RFD): FD's ``B`` plus the adaptive ridge ``alpha``.

    ``C = B^T B + alpha I`` with ``B`` exactly FD's (:func:`frequent_directions`) and ``alpha``
    half the cumulative shrinkage: ``alpha_t = alpha_{t-1} + sigma_tau^2 / 2`` at every shrink,
    ``alpha_0 = alpha0``. Guarantee (Theorem 3): ``||A^T A - C||_2 <= ||A - A_k||_F^2 / (2 (tau -
    k))``, half FD's bound; ``C`` is positive definite once a shrink removed mass.

    Args:
      sketch_size: ``tau >= 1``, the rows of the sketch including the slot for the incoming row
        (``m`` in the paper).
      fast: use the doubling buffer (Alg. 5).
      alpha0: initial ridge ``alpha^{(0)} >= 0``; use it to sketch ``A^T A + alpha0 I``.
      alpha_fraction: the fraction of each shrinkage added to ``alpha``. RFD's optimal choice is
        ``1/2`` (Theorem 2); ``1`` adds all the "escaped mass", as S-AdaGrad (Feinberg et al.
        2023) does. Must lie in ``[0, 1]``.
      lazy: the lazy basis, as in :func:`frequent_directions`.

    Returns:
      A :class:`Sketch` (``"rfd"``, or ``"fast_rfd"``) with a :class:`FrequentDirectionsState`.

    References:
      Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions with Application in Online
      Learning", JMLR 20, Alg. 2 (RFD), Alg. 5 (``fast``), Theorems 2 and 3. Feinberg, Chen, Sun,
      Anil & Hazan (2023), "Sketchy: Memory-efficient Adaptive Regularization with Frequent
      Directions", NeurIPS (``alpha_fraction=1``).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.robust_frequent_directions(3)
      >>> rows = jnp.array([[3.0, 0, 0], [0, 2, 0], [0, 0, 1]])
      >>> V, lam, alpha = so.sketches.factors(sk.update_many(sk.init(3), rows))
      >>> lam, alpha  # FD's eigenvalues; alpha = 1/2 of the shrink by 1
      (Array([8., 3.], dtype=float32), Array(0.5, dtype=float32))
    """
    tau = _validation.size("sketch_size", sketch_size)
    _validation.ridge("alpha0", alpha0)
    _validation.fraction("alpha_fraction", alpha_fraction)
    return _fd_family(
        tau,
        fast=_validation.flag("fast", fast),
        name="fast_rfd" if fast else "rfd",
        alpha0=alpha0,
        alpha_fraction=alpha_fraction,
        lazy=_lazy_flag(lazy),
    )


def parameterized_frequent_directions(
    sketch_size: int, beta: float, *, fast: bool = False, lazy: bool | None = None
) -> Sketch:
    """Parameterized FD (PFD): FD that shrinks only its smallest directions.

    At each shrink only the smallest ``max(1, floor(beta * tau))`` of the top ``tau`` squared
    singular values are reduced by ``sigma_tau^2``; the larger ones are kept intact, and
    ``tau - 1`` rows are kept as in FD. ``C = B^T B``; ``beta = 1`` is FD.

    Args:
      sketch_size: ``tau >= 1``, the rows of the sketch including the slot for the incoming row.
      beta: the fraction of the directions a shrink reduces, in ``(0, 1]`` (static).
      fast: use the doubling buffer.
      lazy: the lazy basis, as in :func:`frequent_directions`.

    Returns:
      A :class:`Sketch` named ``"pfd"`` with a :class:`FrequentDirectionsState`.

    References:
      Desai, Ghashami & Phillips (2016), "Improved Practical Matrix Sketching with Guarantees", IEEE
      TKDE 28: Parameterized FD. Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions
      with Application in Online Learning", JMLR 20: PFD as a baseline.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.parameterized_frequent_directions(3, beta=0.7)
      >>> rows = jnp.array([[3.0, 0, 0], [0, 2, 0], [0, 0, 1]])
      >>> so.sketches.factors(sk.update_many(sk.init(3), rows))[1]  # FD: 8, 3
      Array([9., 3.], dtype=float32)
    """
    tau = _validation.size("sketch_size", sketch_size)
    if _validation.is_traced(beta):
        raise ValueError("beta fixes how many directions a shrink reduces: it cannot be traced")
    beta = float(_validation.fraction("beta", beta, low_open=True))
    num_shrunk = max(1, int(np.floor(beta * tau)))
    fast = _validation.flag("fast", fast)
    lazy = _lazy_flag(lazy)
    return _fd_family(tau, fast=fast, name="pfd", num_shrunk=num_shrunk, lazy=lazy)


def compensative_frequent_directions(
    sketch_size: int, *, fast: bool = False, lazy: bool | None = None
) -> Sketch:
    """Compensative FD (CFD): FD with the total shrinkage added back to its directions.

    The FD sketch ``B`` plus the running total ``Delta = sum_t sigma_tau^2`` of all shrink
    amounts, added back to every non-zero eigenvalue: ``C = V^T (diag(lam_FD) + Delta) V`` on
    the span of ``B`` (no ridge outside it, unlike RFD).

    Args:
      sketch_size: ``tau >= 1``, the rows of the sketch including the slot for the incoming row.
      fast: use the doubling buffer.
      lazy: the lazy basis, as in :func:`frequent_directions`.

    Returns:
      A :class:`Sketch` named ``"cfd"`` with a :class:`FrequentDirectionsState`.

    References:
      Desai, Ghashami & Phillips (2016), "Improved Practical Matrix Sketching with Guarantees", IEEE
      TKDE 28: Compensative FD. Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions
      with Application in Online Learning", JMLR 20: CFD as a baseline.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.compensative_frequent_directions(3)
      >>> rows = jnp.array([[3.0, 0, 0], [0, 2, 0], [0, 0, 1]])
      >>> so.sketches.factors(sk.update_many(sk.init(3), rows))[1]  # FD's 8, 3 plus the shrink 1
      Array([9., 4.], dtype=float32)
    """
    tau = _validation.size("sketch_size", sketch_size)
    fast = _validation.flag("fast", fast)
    return _fd_family(tau, fast=fast, name="cfd", compensate=True, lazy=_lazy_flag(lazy))


# ----------------------------------------------------------------------------------------------
# Oja's sketch.


def _orthonormalize_rows(a):
    """Gram-Schmidt orthonormalization of the rows of ``a`` (QR with a positive R diagonal)."""
    m, d = a.shape
    k = min(m, d)
    q, r = _solvers.qr(a.T)  # (d, k), (k, m)
    q = (q * _unit_phase(jnp.diagonal(r))).T
    if k < m:  # more rows than dimensions: the extra rows cannot be orthonormal, keep them zero
        q = jnp.concatenate([q, jnp.zeros((m - k, d), a.dtype)])
    return q


def _unit_phase(r):
    """The unit factor that makes ``r`` (a diagonal of ``R``) positive: its sign, or for complex
    ``r`` its phase ``r / |r|`` (1 where ``r = 0``)."""
    if jnp.iscomplexobj(r):
        mag = jnp.abs(r)
        return jnp.where(mag > 0, r / jnp.where(mag > 0, mag, 1), 1).astype(r.dtype)
    return jnp.where(r < 0, -1, 1).astype(r.dtype)


def _oja_orthonormalize(v, keep, c, u, valid=True, p=None):
    """Gram-Schmidt of the rows of ``a = diag(keep) V + c u^T`` without a QR of size ``d``.

    ``V`` (``m x d``) has orthonormal or zero rows and ``|u| = 1``. With ``u = V^T p + rho w``
    (``w`` a unit vector orthogonal to the rows of ``V``; the projection is repeated once: "twice
    is enough"), ``a = M W`` for ``W = [V; w^T]`` and the small ``M = [diag(keep) + c p^T,
    rho c]``. The QR ``M^T = Q R`` (``R`` with a positive diagonal) gives ``a = R^T (Q^T W)``, so
    the orthonormalized rows are ``Q^T W``: one ``m x m`` rotation of ``V`` plus a rank-one term,
    as for the FD sketches, and only ``m``-sized products cross the (possibly sharded) axis
    ``d``. Zero rows of ``V`` (``m > d``) stay exactly zero. Also returns ``V_new u``.

    Complex rows (``V V^H = I``): ``p = conj(V) u`` are the coefficients of ``u``'s projection
    ``V^T p`` on the rows, the QR is complex and ``R``'s diagonal is made positive by phases;
    the returned product is then ``V_new conj(u)`` (:func:`_oja_absorb` passes ``u = conj(g)``).

    ``p``: ``conj(V) u`` when the caller has it (a pass over ``V`` saved).

    The rotation runs over ``V``'s own buffer (:func:`_rotate_rows`: in place over column blocks
    on a CPU) and the rank-one term is an elementwise pass over the result, so a donated ``V``
    is never copied; with ``valid`` false ``V`` comes back bit-identical.
    """
    m = v.shape[0]
    cv = conj(v)
    if p is None:
        p = contract_d(cv, u)
    w = u - jnp.matmul(p, v, precision=HIGHEST)
    p2 = contract_d(cv, w)
    w = w - jnp.matmul(p2, v, precision=HIGHEST)
    p = p + p2
    rho = jnp.sqrt(jnp.sum(abs2(w)))
    has_w = rho > 0
    w = w / jnp.where(has_w, rho, 1)
    rho = jnp.where(has_w, rho, 0)
    mt = jnp.concatenate([(jnp.diag(keep) + jnp.outer(c, p)).T, (c * rho)[None, :]])
    q, r = _solvers.qr(mt)  # (m + 1, m), (m, m): batched across the groups
    q = q * _unit_phase(jnp.diagonal(r))
    rotated = _rotate_rows(q[:m].T, v, valid)
    new = jnp.where(valid, rotated + jnp.outer(q[m], w), rotated)
    # V_new conj(u) = Q^T W conj(u): W conj(u) = conj(W u) = conj([p; rho]) (rho real)
    return new, q[:m].T @ conj(p) + q[m] * rho


def _oja_absorb(state, row, valid, gamma):
    """One step of Oja's algorithm, SON paper eq. 4: ``Lambda_t`` and ``V_t`` from ``g_t``.

    ``gamma(t)`` is the learning rate ``Gamma_t``. Returns the :class:`Absorbed` of the step, its
    product ``V_t g / 4**exp`` taken without another pass over ``d``.
    """
    v = state.directions
    rdtype = real_dtype(v.dtype)  # complex rows: Gamma, Lambda and the norms are real
    row = like_last_axis(row.astype(v.dtype), v)
    exp = rescale_exponent(
        state.scale_exp,
        jnp.max(jnp.abs(row), initial=0),
        jnp.max(state.eigenvalues, initial=0),
    )
    lam = ldexp(state.eigenvalues, 2 * (state.scale_exp - exp))
    scaled_row = ldexp(row, -exp)
    proj = contract_d(v, scaled_row)  # V g / 2**exp
    t = state.count + 1
    g = jnp.asarray(gamma(t.astype(rdtype)), rdtype)
    lam = (1 - g) * lam + g * abs2(proj)  # complex: |v_i . g|^2 = v_i g g^H v_i^H
    # Row i of V + Gamma (V g) g^T is v_i + f_i g with f_i = Gamma (v_i.g); rescale each row by
    # 1 / (1 + |f_i| |g|) before orthonormalizing (Gram-Schmidt is invariant to positive row
    # scaling), computed in the log domain so that huge rows cannot overflow.
    gnorm = jnp.sqrt(jnp.sum(abs2(scaled_row)))
    log_f = (
        jnp.log(g)
        + jnp.log(jnp.abs(proj))
        + jnp.log(gnorm)
        + 2 * exp.astype(rdtype) * jnp.log(2.0).astype(rdtype)
    )
    keep = jax.nn.sigmoid(-log_f)  # 1 / (1 + |f| |g|)
    take = jax.nn.sigmoid(log_f)  # |f| |g| / (1 + |f| |g|)
    unit_row = scaled_row / jnp.where(gnorm > 0, gnorm, 1)
    # complex: V + Gamma (V g) g^H, the rank-one term's row direction conj(g) and the phase of
    # V g (jnp.sign of a complex number is its phase)
    # conj(V) conj(unit_row) = conj(V g) / |g|: the projection taken above, not another pass
    p = conj(proj) / jnp.where(gnorm > 0, gnorm, 1)
    directions, v_unit = _oja_orthonormalize(
        v, keep, jnp.sign(proj) * take, conj(unit_row), valid, p
    )
    new = state._replace(eigenvalues=lam, scale_exp=exp, count=t)
    new = jax.tree.map(lambda a, b: jnp.where(valid, a, b), new, state)
    # the directions select themselves (a select against the old V would keep it alive: a copy)
    new = new._replace(directions=directions)
    prod = ldexp(gnorm * v_unit, -exp)  # V_t g / 4**exp, without another pass
    return Absorbed(new, jnp.where(valid, prod, 0))


def oja(
    sketch_size: int,
    *,
    learning_rate: float | Callable[[jax.Array], jax.Array] | None = None,
    key: jax.Array | None = None,
) -> Sketch:
    """Oja's streaming principal-subspace sketch of Oja-SON.

    ``Lambda_t = (1 - Gamma_t) Lambda_{t-1} + Gamma_t diag(V_{t-1} g_t)^2`` and
    ``V_t = orth(V_{t-1} + Gamma_t V_{t-1} g_t g_t^T)`` (Gram-Schmidt, as the sparse form's
    ``LQ`` decomposition, Alg. 5). The sketch is ``S_t = (t Lambda_t)^{1/2} V_t``, so
    ``C = S_t^T S_t`` and :func:`factors` returns ``V_t`` and ``t * Lambda_t`` (no ridge).

    Args:
      sketch_size: the number ``m`` of directions tracked (no slot convention here).
      learning_rate: ``Gamma_t`` as a float or a schedule of ``t = 1, 2, ...``; the default is the
        paper's ``1/t``.
      key: PRNG key for the random orthonormal initial directions (default ``PRNGKey(0)``).

    Returns:
      A :class:`Sketch` named ``"oja"`` with an :class:`OjaState`.

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford (2016), "Efficient Second Order Online Learning by
      Sketching", NeurIPS, eq. (4) and Alg. 3 (Oja's sketch), Alg. 5 (its ``LQ`` step). Oja (1982),
      "Simplified Neuron Model as a Principal Component Analyzer", J. Math. Biology 15.

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.oja(2, key=jax.random.PRNGKey(0))
      >>> state = sk.update_many(sk.init(3), jnp.array([[3.0, 0, 0], [0, 2, 0]]))
      >>> V, lam, alpha = so.sketches.factors(state)
      >>> bool(jnp.allclose(V @ V.T, jnp.eye(2), atol=1e-6)), bool(lam.sum() <= 9 + 4)
      (True, True)
    """
    m = _validation.size("sketch_size", sketch_size)
    if learning_rate is not None and not callable(learning_rate):
        _validation.fraction("learning_rate", learning_rate, low_open=True)
    key = jax.random.PRNGKey(0) if key is None else _validation.prng_key("key", key)

    def gamma(t):
        if learning_rate is None:
            return 1.0 / t
        if callable(learning_rate):
            return learning_rate(t)
        return learning_rate

    def init(dim, dtype=jnp.float32):
        dim, dtype = flat_size(dim), state_dtype(dtype)
        gauss = jax.random.normal(key, (m, dim), dtype)
        return OjaState(
            directions=_orthonormalize_rows(gauss),
            eigenvalues=jnp.zeros((m,), real_dtype(dtype)),
            scale_exp=jnp.zeros((), jnp.int32),
            count=jnp.zeros((), jnp.int32),
            nonfinite_count=jnp.zeros((), jnp.int32),
        )

    def absorb(state, row, valid, lift):
        del lift  # the residual is taken after the update
        return _oja_absorb(state, row, valid, gamma)

    spec = _validation.spec_key("oja", m, learning_rate, key)
    return _make_sketch(init, absorb, m, "oja", spec=spec)


# ----------------------------------------------------------------------------------------------
# Gaussian random projection.


def random_projection(sketch_size: int, key: jax.Array) -> Sketch:
    """Gaussian random-projection sketch of RP-SON.

    ``S_t = S_{t-1} + r_t g_t^T`` with ``r_t ~ N(0, I_m / m)``, so that ``C = S^T S`` has
    ``E[C] = A^T A`` (the paper writes ``N(0, 1/sqrt(m))``; variance ``1/m`` is the unbiased
    choice). The Gram matrix ``S S^T`` is tracked with the paper's two rank-one updates
    ``S S^T += r q^T + q r^T``, ``q = S_{t-1} g + |g|^2 r / 2``.

    ``S`` is kept in true units and updated in place; a row for which ``S + r g^T`` could
    overflow (bounded from the tracked Gram matrix, without a pass over ``S``) is refused like a
    non-finite one: the state is left as it was and ``nonfinite_count`` counts it.

    Args:
      sketch_size: the number ``m`` of rows of ``S`` (no slot convention here).
      key: the PRNG key that draws the ``r_t`` (carried in the state).

    Returns:
      A :class:`Sketch` named ``"random_projection"`` with a :class:`RandomProjectionState`;
      its :attr:`Absorbed.drawn` is ``r_t``.

    References:
      Luo, Agarwal, Cesa-Bianchi & Langford (2016), "Efficient Second Order Online Learning by
      Sketching", NeurIPS, sec. 3 ("Random Projection (RP)").

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.random_projection(2, jax.random.PRNGKey(0))
      >>> state = sk.update_many(sk.init(3), jnp.array([[3.0, 0, 0], [0, 2, 0]]))
      >>> S = state.rows
      >>> bool(jnp.allclose(so.sketches.covariance(state), S.T @ S, atol=1e-4))
      True
    """
    m = _validation.size("sketch_size", sketch_size)
    key = _validation.prng_key("key", key)

    def init(dim, dtype=jnp.float32):
        dim = flat_size(dim)
        dtype = state_dtype(dtype)
        return RandomProjectionState(
            rows=jnp.zeros((m, dim), dtype),
            gram=jnp.zeros((m, m), dtype),
            scale_exp=jnp.zeros((), jnp.int32),
            key=jnp.array(key),  # a copy: donating the state must not delete this sketch's key
            count=jnp.zeros((), jnp.int32),
            nonfinite_count=jnp.zeros((), jnp.int32),
        )

    def absorb(state, row, valid, lift):
        del lift  # the residual is taken after the update
        # A zero row changes nothing below (S + r 0^T = S, q = 0) but the key and the scale.
        row = like_last_axis(row.astype(state.rows.dtype), state.rows)
        diag = jnp.diagonal(state.gram)
        if jnp.iscomplexobj(diag):  # Hermitian: a real diagonal
            diag = jnp.real(diag)
        big, top = jnp.max(jnp.abs(row), initial=0), jnp.max(diag, initial=0)
        key, sub = jax.random.split(state.key)
        dtype = state.rows.dtype
        rdtype = real_dtype(dtype)  # complex rows: r_t is a real Gaussian vector
        r = jax.random.normal(sub, (m,), rdtype) * jnp.asarray(1 / np.sqrt(m), rdtype)
        # S is kept in true units: a row that could overflow it is refused and counted (the
        # bound |S_ij + r_i g_j| <= 2**e sqrt(K_ii) + |r_i| |g_j| from the tracked K = S S^T
        # / 4**e, no pass over S), so that the rows stay finite without being re-read. Each
        # term is held below an eighth of the range in its own units (2**e may be far from g).
        room = jnp.asarray(jnp.finfo(rdtype).max / 8, rdtype)
        fits = (jnp.sqrt(top) < ldexp(room, -state.scale_exp)) & (jnp.max(jnp.abs(r)) * big < room)
        fits = valid & fits
        exp = jnp.where(fits, rescale_exponent(state.scale_exp, big, top), state.scale_exp)
        scaled_row = ldexp(row, -exp)
        # S g / 4**exp on the scaled row (not _scaled_dot's cond: the donated rows passed into a
        # conditional made XLA copy them).
        prod = ldexp(contract_d(state.rows, scaled_row), -exp)
        sq = jnp.sum(abs2(scaled_row))
        q = prod + 0.5 * sq * r
        # complex: S += r g^H (rows conj(g)), S S^H += q r^T + r q^H
        gram = ldexp(state.gram, 2 * (state.scale_exp - exp))
        gram = gram + jnp.outer(r, conj(q)) + jnp.outer(q, r)
        # Whether the row is taken also reads the new Gram matrix, so that the one pass that
        # reads the old rows (the product) runs before the one that overwrites them in place:
        # elementwise, a refused row selected in it.
        take = fits & jnp.all(jnp.isfinite(gram))
        rows = jnp.where(take, state.rows + jnp.outer(r, conj(row)), state.rows)
        new = state._replace(
            rows=rows,
            gram=jnp.where(take, gram, state.gram),
            scale_exp=jnp.where(take, exp, state.scale_exp),
            key=jnp.where(take, key, state.key),
            count=state.count + take.astype(jnp.int32),
            nonfinite_count=state.nonfinite_count + (valid & ~take).astype(jnp.int32),
        )
        sq = jnp.where(take, sq, 0)
        return Absorbed(new, prod + sq * r, drawn=r)  # S_t g / 4**exp; r_t handed back

    spec = _validation.spec_key("random_projection", m, key)
    return _make_sketch(init, absorb, m, "random_projection", spec=spec, paddable=True)


# ----------------------------------------------------------------------------------------------
# Queries.


@functools.singledispatch
def low_rank(state) -> LowRank:
    """The implicit factors of a sketch state (``O(n^3)`` small work, no pass over ``d``).

    ``C = V^T diag(lam) V + alpha I`` with ``V = 2**-e coef @ basis`` and ``lam``, ``alpha``
    stored divided by ``4**e`` (``e = scale_exp``). For the FD family ``K = B B^T = U diag(mu)
    U^T`` gives ``V = diag(mu^{-1/2}) U^T B`` and ``lam = mu`` (plus CFD's compensation on the
    non-zero ``mu``), the last, always zero direction dropped; the random projection is read the
    same way from ``S S^T``; Oja's sketch gives ``V_t`` and ``t Lambda_t`` sorted.

    Args:
      state: the state of any sketch of this module.

    Returns:
      A :class:`LowRank` (:class:`sketchopt.operators.LowRankOperator`) with ``weights = lam``,
      ``scalar = alpha`` and ``basis`` the state's rows (no copy).

    Raises:
      TypeError: for anything that is not a sketch state.

    References:
      Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via Frequent Directions", IJCAI,
      sec. 3.1 (``V`` and ``Sigma`` of the sketch, for the Woodbury solve).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> sk = so.sketches.robust_frequent_directions(3)
      >>> rows = jnp.array([[3.0, 0, 0], [0, 2, 0], [0, 0, 1]])
      >>> lr = so.sketches.low_rank(sk.update_many(sk.init(3), rows))
      >>> lr.basis.shape, lr.true_eigenvalues(), lr.true_alpha()  # basis: the buffer B itself
      ((3, 3), Array([8., 3.], dtype=float32), Array(0.5, dtype=float32))
    """
    raise TypeError(f"not a sketch state: {type(state).__name__}")


def _fd_low_rank(state: FrequentDirectionsState, diagonal: bool = False) -> LowRank:
    lr = _gram_low_rank(
        state.rows, state.gram, state.scale_exp, state.alpha, True, state.transform, diagonal
    )
    lam = jnp.where(lr.eigenvalues > 0, lr.eigenvalues + state.compensation, 0)
    return lr._replace(weights=lam)


@low_rank.register
def _(state: FrequentDirectionsState) -> LowRank:
    return _fd_low_rank(state)


def _fd_low_rank_diagonal(state: FrequentDirectionsState) -> LowRank:
    """:func:`low_rank` of a per-step FD state, whose Gram matrix is ``diag(shrunk)`` after every
    update (:func:`_fd_family`): sorted, no ``eigh``."""
    return _fd_low_rank(state, diagonal=True)


def reader(sketch: Sketch) -> Callable[[Any], LowRank]:
    """The function that reads ``sketch``'s states as :func:`low_rank` does, with what the sketch
    knows of them (:attr:`Sketch.low_rank_of`): the metrics call it at every update.

    For per-step FD and its relatives that is the shrunk spectrum itself: after Alg. 1/2 lines
    4-6 of Luo et al. (2019, RFD) the Gram matrix is ``B' B'^T = diag(shrunk)``, so
    ``V = diag(mu^-1/2) U^T B`` (Wan, Wei & Zhang 2018, sec. 3.1) has ``U`` a permutation."""
    return low_rank if sketch.low_rank_of is None else sketch.low_rank_of


@low_rank.register
def _(state: RandomProjectionState) -> LowRank:
    zero = jnp.zeros((), real_dtype(state.gram.dtype))
    return _gram_low_rank(state.rows, state.gram, state.scale_exp, zero, drop_last=False)


@low_rank.register
def _(state: OjaState) -> LowRank:
    m = state.eigenvalues.shape[0]
    dtype = state.eigenvalues.dtype
    lam = state.count.astype(dtype) * state.eigenvalues
    # Keep the directions sorted by eigenvalue like the other sketches.
    order = jnp.argsort(-lam)
    lam = lam[order]
    coef = ldexp(jnp.eye(m, dtype=state.directions.dtype)[order], state.scale_exp)
    coef = jnp.where((lam > 0)[:, None], coef, 0)  # V's rows with a zero eigenvalue are zero
    return LowRank(
        scalar=jnp.zeros((), dtype),
        basis=state.directions,
        coef=coef,
        weights=lam,
        scale_exp=state.scale_exp,
        value_exp=state.scale_exp,
    )


def factors(state) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(V, lam, alpha)`` with the sketched covariance ``C = V^T diag(lam) V + alpha I``.

    ``V`` (``k x d``) has orthonormal rows except rows whose ``lam`` is 0, which are zero;
    ``lam`` is sorted in descending order. For FD-type sketches ``k = n - 1`` for a buffer of
    ``n`` rows (``sketch_size - 1`` per-step, ``2 * sketch_size - 1`` with ``fast=True``).
    Costs ``O(k * n * d)``; the metrics use :func:`low_rank` instead.

    Args:
      state: the state of any sketch of this module.

    Returns:
      ``V`` (``k x d``), ``lam`` (``k``) and the scalar ``alpha``, in true units: for FD
      ``V^T diag(lam) V = B^T B`` (the right singular vectors and squared singular values of
      ``B``), for RFD ``alpha`` is its ridge, for the others 0.

    References:
      Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions with Application in Online
      Learning", JMLR 20: the output ``B^T B + alpha I`` of Alg. 1/2.

    Examples:
      >>> import jax.numpy as jnp, numpy as np, sketchopt as so
      >>> sk = so.sketches.frequent_directions(3)
      >>> V, lam, alpha = so.sketches.factors(sk.update(sk.init(3), jnp.array([0.0, 3, 4])))
      >>> lam, alpha  # exact while fewer than sketch_size directions were seen
      (Array([25.,  0.], dtype=float32), Array(0., dtype=float32))
      >>> np.round(np.abs(np.asarray(V)), 4)  # (0, 3, 4) / 5 up to sign; the unused row is 0
      array([[0. , 0.6, 0.8],
             [0. , 0. , 0. ]], dtype=float32)
    """
    lr = low_rank(state)
    return lr.directions(), lr.true_eigenvalues(), lr.true_alpha()


def covariance(state) -> jax.Array:
    """The dense ``d x d`` sketched covariance ``C = V^T diag(lam) V + alpha I`` (for tests;
    ``V^H diag(lam) V + alpha I``, Hermitian, for complex rows).

    Args:
      state: the state of any sketch of this module.

    Returns:
      ``C`` as a ``d x d`` array (``O(d^2)`` memory: for tests and small ``d`` only).

    References:
      Luo, Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions with Application in Online
      Learning", JMLR 20: ``B^T B + alpha I`` approximating ``A^T A`` (Alg. 2).

    Examples:
      >>> import jax.numpy as jnp, numpy as np, sketchopt as so
      >>> sk = so.sketches.robust_frequent_directions(2)
      >>> state = sk.update_many(sk.init(2), jnp.array([[3.0, 0], [0, 2]]))
      >>> C = np.asarray(so.sketches.covariance(state))
      >>> np.round(C, 4) + 0.0  # diag(9 - 4, 0) + 2 I (+ 0.0 turns a -0. into 0.)
      array([[7., 0.],
             [0., 2.]], dtype=float32)
    """
    v, lam, alpha = factors(state)
    cov = jnp.matmul(conj(v).T * lam, v, precision=HIGHEST)  # complex: V^H diag(lam) V
    return cov + alpha * jnp.eye(v.shape[1], dtype=v.dtype)
