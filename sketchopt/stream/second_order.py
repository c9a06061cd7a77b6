r"""Second-order linear learners on sparse examples: SON and Ada-FD in ``O(m^2 + m s)`` per example.

The sketch directions are kept as ``V = F Z`` (SON sec. 4, eq. 5-6): ``Z`` holds ``R`` stored
rows over the ``d`` coordinates (a column of the learner's ``(d, R + k)`` table per row, so an
example reads and writes one contiguous row per non-zero), ``F`` is a small ``m x R`` matrix,
``K = Z Z^T`` is tracked, and the weights are split as ``w = wbar + Z^T b``. Every example changes
``Z`` by a rank-one term ``delta ghat^T`` on its own support, ``wbar`` by a multiple of ``x`` and
everything else is ``m x m`` or ``m x R``; so one step is a gather of the example's rows, small
dense algebra and a scatter-add of ``x`` times one ``(R + k)``-vector. The derivations, the
numerical checks behind them and the cost of every branch are written out in
``docs/sparse_second_order.md``; in brief (``ghat = sqrt(eta_t + sigma_t) g``, ``g = l'(p) x``):

* **Weights** (SON eq. 5): when ``Z`` becomes ``Z + delta ghat^T`` the weights stay the same if
  ``wbar -= (delta . b) ghat``; a step ``w -= f0 g + B^T (c * B g)`` (the solve of each learner's
  metric through the sketch ``B = F Z``, below) is ``wbar -= f0 g`` and ``b -= F^T (c * F Z g)``.
  Bounded-prediction projection (SON Lemma 1): ``w = u - tau_C(u . x) A^{-1} x / (x^T A^{-1} x)``
  in the same split, and the prediction is ``clip(u . x, -C, C)``.
* **Oja-SON** (SON Alg. 4-5): ``delta = A^{-1} Gamma_t F Z ghat`` with ``A = F`` (Oja's step is
  ``F Z + Gamma F Z ghat ghat^T = F (Z + F^{-1} Gamma F Z ghat ghat^T)``; with the scalar
  ``Gamma_t`` of :func:`sketchopt.sketches.oja` this is ``delta = Gamma_t Z ghat``, no solve, which
  is also what Vowpal Wabbit's ``oja_newton.cc`` computes). ``K += delta (Z ghat)^T + (Z ghat)
  delta^T + |ghat|^2 delta delta^T``. ``Decompose`` (the paper's missing Appendix H) must give
  ``L Q Z = F Z`` with ``Q Z`` orthonormal; ``L = R^T`` of the QR of the ``(m + 1) x m`` matrix
  ``M^T``, ``F Z' = M [V; w^T]`` (``ghat = V^T pv + rho w``), equivalently the Cholesky factor of
  ``F K F^T``, and ``F <- L^{-1} F``: ``F Z`` is the Gram-Schmidt of Oja's un-orthonormalized rows,
  as the dense sketch's QR; ``F`` stays lower triangular. A step with ``Gamma_t |ghat|^2`` so large
  that ``Z + delta ghat^T`` would round ``Z`` away (``|F'|^2 tr(K') / m > max_growth``) is taken
  densely, ``O(m^2 d)``, and counted as a compaction.
* **RP-SON** (SON sec. 3): ``S += r_t ghat^T`` is already rank-one on the support (``F = I``);
  ``H = (alpha I + S S^T)^{-1}`` by the paper's two Sherman-Morrison steps, refreshed from the
  tracked ``S S^T`` every ``m`` steps as the dense transform does.
* **FD-SON, RFD-SON, Ada-FD** (FD sketch of ``ghat``, ``m`` rows including the incoming slot;
  after each shrink ``B B^T = diag(lam)``): the new row makes an arrowhead Gram matrix
  ``diag(lam) + border(B ghat, |ghat|^2)``, its ``m x m`` eigendecomposition gives FD's shrink
  ``B' = N [B; ghat^T]``, ``N = diag(sqrt((mu - mu_m) / mu)) U^T``. ``B'`` is reached by a rank-one
  change ``F (Z - h ghat^T / v_m)`` with ``F <- N F`` whenever a vector ``v`` of the null space of
  ``N`` has ``v_m != 0`` (``F h`` = ``v`` without its last entry; we take ``v`` = the projection of
  ``e_m`` on that null space). It has none exactly when the sketch keeps ``ghat`` whole (e.g. a
  gradient on never-seen coordinates): then ``ghat`` is written into a free (zero) stored row,
  ``O(s)``. ``Z`` has ``R = m + spare_rows`` rows for that; when none is left, or when
  ``|F|^2 tr(K) / tr(F K F^T)`` (how much larger the factors are than the sketch they multiply
  to, i.e. the round-off's amplification) exceeds ``max_growth``, the learner **compacts**:
  ``Z <- F Z``, ``F <- I`` (``wbar += Z^T b``, ``b <- 0`` under mirror descent), counted in
  ``compactions``. It maps every row of the table by one small matrix, and a row whose ``Z`` is
  zero keeps every column, so it visits only the coordinates some example has written ``Z``
  on (the state's :class:`Support`, listed as the examples write): ``O(R m n)`` for ``n`` such
  coordinates, not ``O(R m d)``. The exact algebra needs it; how often it happens, and over how
  many coordinates, decides the time per example (``docs/benchmarks/streams.md``).
* **Ada-FD** (Ada-FD paper Alg. 2, mirror descent; Alg. 1, dual averaging), no regularizer:
  ``H_t = delta I + (B^T B + alpha I)^{1/2}`` (``alpha`` RFD's ridge when ``robust``, else 0), so
  ``f0 = 1 / (delta + sqrt(alpha))`` and ``c_i = (1/(delta + sqrt(lam_i + alpha)) - f0)/lam_i``.
  Dual averaging keeps ``gbar`` (a column), ``p = Z gbar`` (``O(m)``: ``p += delta (ghat . gbar)``
  when ``Z`` changes, ``p += Z g`` when ``gbar`` does) and writes ``w = -eta_t f0 gbar + Z^T beta``
  with ``beta = -eta_t F^T (c * F p)`` recomputed each step, so nothing is folded at a compaction.

**Diagonal rescaling** (SON sec. 5.2, ``diagonal_rescaling`` of the SON learners): the
learner is fed ``x / D^{1/2}``, ``D = D_1 + diag(sum g_s^2)`` (``D_1 = diagonal_init I``) kept
as a column ``ds = D^{1/2}`` of the table and grown on each example's own coordinates. Two
forms:

* ``"fed"`` (``True``; the default of ``fd_son``, ``oja_son`` and ``rp_son``): the paper's
  words ("upon seeing example ``x_t``, we feed ``D_t^{-1/2} x_t`` to our algorithm") in the
  order of Vowpal Wabbit's ``--OjaNewton --normalize`` (the SON authors' code, which updates
  its normalizer before it learns): the prediction reads ``x / D_{t-1}^{1/2}``, then ``D_t``
  takes this example's ``g_t^2`` and the learning step sees ``x / D_t^{1/2}``, so that a
  feature met for the first time, at any scale, enters the step with ``|g_i| / D_i^{1/2} < 1``.
  The learner's weights ``u`` stay in its own coordinates (the predictor is
  ``w = D^{-1/2} u``: a coordinate's weight shrinks as its ``D`` grows, as in VW). This equals
  the dense transform without rescaling run on ``u`` with those examples
  (``tests/test_stream_second_order.py``, ``dense_fed_run``). On the parameters ``w`` it
  would also shrink each ``w_i`` by ``sqrt(D_{t-1,i} / D_{t,i})`` at every step; the dense
  transforms do not offer that form, so here the defaults of the stream learners and of the
  dense transforms differ.
* ``"metric"``: the dense transforms' ``diagonal_rescaling=True`` (:mod:`sketchopt.son`), the
  metric ``H_t = D_t^{1/2} A_t D_t^{1/2}`` with ``D_t`` from ``s < t``: the weights are kept in
  parameter space (after each step every ``u_i`` of the example is re-expressed, ``u_i <- u_i
  ds_new / ds_old``); with ``diagonal_init=0.1`` a learner equals its dense transform.

The two differ on features whose scale differs from ``D_1``'s by orders of magnitude. On the
benchmark's stand-in of the URL file (``experiments/vw_standins.py``, ``wide_scale``: real
features of scale ``1e-2`` to ``1e4`` beside binary ones, ``d = 3.2M``) ``oja_son`` at its
defaults errs on 28.76% of the test set fed, 44.74% in the metric form (VW ``--OjaNewton``:
29.24%), ``fd_son`` 27.40% against 39.62%; a NumPy replay of the diagonal step alone gave 28.76%
fed, 44.96% fed with ``D_{t-1}`` and 33.84% re-expressed with ``D_t``: the order and the fixed
coordinates both matter.

**Defaults** (no tuning on real data). ``fd_son``, ``oja_son`` and ``rp_son`` rescale by
default in the fed form, as VW's ``--OjaNewton`` normalizes by default, with its constants. VW
halves the loss's slope (``g = l'/2``, "for half square loss"), keeps per feature
``0.1 + sum (g x_i)^2``, which is ``D / 4`` for ``D_1 = 0.4 I`` in full slopes
(:data:`NORMALIZED_DIAGONAL_INIT`), steps ``w -= g x~ / alpha`` with ``alpha = 1`` and sketches
``(g / 2) x~``. In this module's coordinates (``x^ = x / D^{1/2} = x~ / 2``, weights ``2 w``) that
is SON's step through ``A = (alpha / 2) I + (1/8) sum g g^T``: ``alpha =``
:data:`NORMALIZED_ALPHA` ``= 0.5`` and a constant ``eta =`` :data:`NORMALIZED_ETA` ``= 1/8``
(``ghat = sqrt(eta) g``), the defaults with rescaling. Measured with nothing but ``--learner``
(``experiments/vw_defaults.py``, test error %, VW ``--OjaNewton`` in parentheses) on the MNIST
stream, the Zipf text, digits, agaricus and sofia-ml's demo: ``fd_son`` 14.30 (15.10), 29.34
(29.58), 12.92 (16.48), 0.00 (0.00), 1.60 (1.50) fed, against 15.0, 28.96, 12.69, 0.00, 1.40 in
the metric form; ``oja_son`` 14.50, 29.24, 16.48, 0.00, 2.10 fed against 19.6, 29.08, 19.6,
0.00, 3.1; ``rp_son`` 14.30, 29.58, 13.14, 0.00, 2.30 fed against 19.2, 33.46, 14.03, 0.06, 1.9
without rescaling (its earlier default: rescaled in the metric form its float32 table
overflowed on features of scale ``1e15``, which the fed form's ``x / D_t^{1/2}`` bounds).
Without rescaling (``diagonal_rescaling=False``) ``alpha="auto"`` is ``alpha_scale`` times the
running mean of ``|x|^2`` and ``eta`` SON's ``1/sqrt(t)``. ``rfd_son`` does not rescale by
default (RFD0-SON, ``alpha0 = 0``: fed, it erred 22.1 / 11.6 % on MNIST / sofia-ml's demo, 18.6
/ 4.6 % without); ``ada_fd``'s ``delta="auto"`` is ``delta_scale`` times the root of the running
mean of ``|x|^2``.

Each learner equals its dense counterpart in :mod:`sketchopt` (``fd_son``, ``rfd_son``,
``oja_son``, ``rp_son``, ``ada_fd``, ``ada_fd_dual_averaging``, fed the dense gradients, with
:func:`sketchopt.project_bounded_prediction` for ``bound``) in float64 to round-off:
``tests/test_stream_second_order.py``. Nothing like the sparse Ada-FD exists elsewhere; the sparse
Oja-SON is the SON authors' algorithm, which Vowpal Wabbit ships as ``--OjaNewton``.

**Interface and policies** are those of :mod:`sketchopt.stream.learners` (a
:class:`~sketchopt.stream.learners.LinearLearner`): bad examples are skipped with the state
bit-identical and counted in ``nonfinite_count``, a label 0 of a classification loss is -1, and
1-D arrays of hyperparameters make a grid, here by ``jax.vmap`` over the configurations (the
compaction runs once for the whole grid when any configuration needs it, so that a batched
``cond`` does not turn into an ``O(d)`` select every step). Learners start from ``w = 0``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt import _arrowhead, _validation
from sketchopt import sketches as _sketches
from sketchopt._numerics import (
    eigh_desc,
    inverse_sqrt_time,
    inverse_time,
    rank_two_inverse_update,
    state_dtype,
    zero_round_off_eigenvalues,
)
from sketchopt.stream._base import (
    LinearLearner,
    check_each,
    class_label,
    grid_shape,
    importance,
    loss_function,
    segment_count,
    with_column,
)
from sketchopt.stream.examples import flat_segment

__all__ = [
    "NORMALIZED_ALPHA",
    "NORMALIZED_DIAGONAL_INIT",
    "NORMALIZED_ETA",
    "SECOND_ORDER",
    "SketchedState",
    "Support",
    "ada_fd",
    "fd_son",
    "oja_son",
    "rfd_son",
    "rp_son",
    "support_of",
    "with_support",
    "without_support",
]

_HI = jax.lax.Precision.HIGHEST
_DIAGONAL_INIT = 0.1  # D_1 = 0.1 I (SON sec. 5.2, footnote 6), as sketchopt.son


class SketchedState(NamedTuple):
    """State of a sparse second-order learner.

    Attributes:
      table: ``(d, R + k)``: the stored rows ``Z`` (``R`` columns; a coordinate's numbers are one
        contiguous row), then the learner's per-coordinate columns (``wbar``, or ``gbar`` for
        dual averaging). A grid has a leading configuration axis on every field.
      small: the small arrays by name (``F``, ``K``, ``b``, eigenvalues, ...; module docstring).
      t: the examples learned from (int32).
      nonfinite_count: the examples skipped as bad input (int32).
      compactions: the compactions so far (int32; module docstring).
      support: the FD family's list of the coordinates whose stored rows may be non-zero
        (:class:`Support`), which its compactions visit instead of all ``d`` rows; ``None``
        for Oja-SON and RP-SON, and a state whose ``support`` is ``None`` compacts densely.
        A checkpoint holds it; one saved without it gets it back from the table
        (:func:`with_support`).
    """

    table: jax.Array
    small: dict[str, jax.Array]
    t: jax.Array
    nonfinite_count: jax.Array
    compactions: jax.Array
    support: Support | None = None


class Support(NamedTuple):
    """The coordinates an FD-family learner has written ``Z`` on, each once: a compaction of the
    ``V = F Z`` form (SON sec. 4, eq. 5-6; ``Z <- F Z``, module docstring) maps every row of
    ``Z`` by the same small matrix, and a zero row stays zero, so it visits these rows only
    (``O(R m n)`` for ``n`` coordinates seen, instead of ``O(R m d)``).

    Attributes:
      rows: ``(L,)`` int32, ``L >= d`` a multiple of the compaction's chunk: the listed
        coordinates first, ``d`` (no coordinate) after them.
      count: how many are listed (int32).
      seen: ``(d,)`` int32, 1 where a coordinate is listed, else 0.

    Two int32 per coordinate, beside the table's ``R + k`` floats.
    """

    rows: jax.Array
    count: jax.Array
    seen: jax.Array


class _Spec(NamedTuple):
    """What one family defines; :func:`_learner` builds the rest. ``h`` is the dict of numeric
    hyperparameters of one configuration (batched for a grid)."""

    rows: int  # R, the stored rows of Z
    columns: tuple[str, ...]  # per-coordinate columns after Z
    init: Callable  # (dim, dtype, key, h) -> (Z (R, d) or None, small)
    predict: Callable  # (small, sums, h, t) -> (p, pre): t examples learned so far
    learn: Callable  # (small, sums, slope, pre, h, t) -> (small, coef (R + k,), compact?, aux)
    compact: Callable  # (table, small, h, aux, x) -> (table, small); x() the dense example
    weights: Callable  # (table, small, h) -> (d,)
    # a compaction maps each row of Z alone and Z starts at zero: it visits the Support only,
    # compact(..., support=, chunks=, need=) (FD family; module docstring)
    listed: bool = False


# ----------------------------------------------------------------------------------------------
# The support: the coordinates whose stored rows a compaction must visit.

# The rows a compaction gathers, maps and scatters at a time (fd_son on the URL-like stand-in, one
# setting after another: 1024: 4.0k, 4096: 3.6-3.9k, 16384: 4.6-5.6k, 65536: 2.7-2.9k examples/s).
_CHUNK = 16384


def _chunk(dim: int) -> int:
    return min(_CHUNK, int(dim))


def _length(dim: int) -> int:
    """``Support.rows``'s length: ``dim`` rounded up to whole chunks."""
    chunk = _chunk(dim)
    return -(-dim // chunk) * chunk


def _support_init(dim: int) -> Support:
    """An empty :class:`Support` over ``dim`` coordinates."""
    return Support(
        jnp.full((_length(dim),), dim, jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((dim,), jnp.int32),
    )


def support_of(table: jax.Array, rows: int) -> Support:
    """The :class:`Support` of a table whose first ``rows`` columns are ``Z``: the coordinates
    whose row of ``Z`` is non-zero, in increasing order (how a checkpoint's is rebuilt)."""
    dim = table.shape[0]
    live = jnp.any(table[:, :rows] != 0, axis=1)
    (listed,) = jnp.nonzero(live, size=_length(dim), fill_value=dim)
    return Support(listed.astype(jnp.int32), jnp.sum(live, dtype=jnp.int32), live.astype(jnp.int32))


def without_support(like):
    """The fields of a :class:`SketchedState` (or of its shapes) but its :class:`Support`, as a
    dict (a checkpoint written before the FD family listed its support has these only); ``None``
    for any other state."""
    if not isinstance(like, SketchedState) or like.support is None:
        return None
    return {k: v for k, v in like._asdict().items() if k != "support"}


def with_support(fields, like):
    """The :class:`SketchedState` of ``fields`` (:func:`without_support`'s, restored) with the
    :class:`Support` that ``like`` has, rebuilt from the table (:func:`support_of`: ``Z`` is the
    first ``R`` columns, ``R`` the columns of ``F``)."""
    if not isinstance(like, SketchedState) or like.support is None:
        return fields
    state = SketchedState(**fields)
    rows = state.small["F"].shape[-1]
    if state.table.ndim == 3:  # a grid
        return state._replace(support=jax.vmap(lambda tb: support_of(tb, rows))(state.table))
    return state._replace(support=support_of(state.table, rows))


def _unlisted(support: Support, idx, changed):
    """The entries of ``idx`` where ``changed`` whose coordinate is not listed yet."""
    dim = support.seen.shape[0]
    return changed & (idx < dim) & (support.seen.at[idx].get(mode="fill", fill_value=1) == 0)


def _listed(support: Support, idx, new) -> Support:
    """``support`` with the coordinates ``idx[j]`` where ``new[j]`` (:func:`_unlisted`) listed,
    each once (an example may name a coordinate twice: each entry claims its coordinate with
    its own code in ``seen``, and the entry whose claim stands lists it)."""
    dim = support.seen.shape[0]
    length = support.rows.shape[0]
    code = -1 - jnp.arange(idx.shape[0], dtype=jnp.int32)
    claimed = jnp.where(new, idx, dim)
    seen = support.seen.at[claimed].set(code, mode="drop")
    won = new & (seen.at[idx].get(mode="fill", fill_value=0) == code)
    place = support.count + jnp.cumsum(won, dtype=jnp.int32) - 1
    rows = support.rows.at[jnp.where(won, place, length)].set(idx.astype(jnp.int32), mode="drop")
    seen = seen.at[jnp.where(won, idx, dim)].set(1, mode="drop")  # (one winner a coordinate)
    return Support(rows, support.count + jnp.sum(won, dtype=jnp.int32), seen)


def _chunks(support: Support):
    """How many chunks of :func:`_chunk` rows hold the listed coordinates (of every
    configuration of a grid: the largest count)."""
    chunk = _chunk(support.seen.shape[-1])
    return (jnp.max(support.count) + chunk - 1) // chunk


def _map_rows(table, support: Support, chunks, mix, gram_cols: int):
    """``table[i] <- table[i] @ mix`` for the listed coordinates ``i`` (the others' rows of
    ``Z`` are zero, and ``mix`` keeps a row whose ``Z`` part is zero), in ``chunks`` chunks
    updated in place; and the Gram matrix of the mapped rows' first ``gram_cols`` columns."""
    dim, width = table.shape
    chunk = _chunk(dim)

    def body(i, carry):
        table, gram = carry
        idx = jax.lax.dynamic_slice(support.rows, (i * chunk,), (chunk,))
        got = table.at[idx].get(mode="fill", fill_value=0)
        new = jnp.matmul(got, mix, precision=_HI)
        kept = new[:, :gram_cols]
        gram = gram + jnp.matmul(kept.T, kept, precision=_HI)
        return table.at[idx].set(new, mode="drop"), gram

    gram = jnp.zeros((gram_cols, gram_cols), table.dtype)
    return jax.lax.fori_loop(0, chunks, body, (table, gram))


# ----------------------------------------------------------------------------------------------
# Small helpers.


def _at(schedule, count, dtype):
    """A float or an Optax schedule of the 0-based ``count``."""
    value = schedule(count) if callable(schedule) else schedule
    return jnp.asarray(value, dtype)


def _tau(y, bound):
    """``tau_C(y) = sign(y) max(|y| - C, 0)`` (SON Lemma 1); 0 for ``C = inf``."""
    return jnp.sign(y) * jnp.maximum(jnp.abs(y) - bound, 0)


def _safe_div(a, b):
    return jnp.where(b != 0, a / jnp.where(b != 0, b, 1), 0)


def _default_growth(dtype) -> float:
    """``max_growth`` by precision: the round-off of ``F Z`` grows with it (module docstring)."""
    return 1e3 if jnp.dtype(dtype) == jnp.float32 else 1e6


def _projection(u_x, xx, vx, f0, mul, bound):
    """Lemma 1 in the split: ``(gamma, p)`` with ``w = u - gamma A^{-1} x`` and ``p = w . x``;
    ``A^{-1} x = f0 x + V^T mul(V x)`` (``V x`` given)."""
    quad = f0 * xx + jnp.sum(mul(vx) * vx)
    gamma = _safe_div(_tau(u_x, bound), quad)
    return gamma, u_x - gamma * quad


def _spectral(ev, ridge):
    """``(f0, mul)`` for ``f(A) y = f0 y + V^T mul(V y)`` with ``A = ridge I + V^T diag(ev) V``
    (``V`` orthonormal) and SON's ``f(x) = 1/x``: ``mul(v) = -ev v / (ridge (ridge + ev))``; with
    ``ridge = 0`` the pseudo-inverse, ``f0 = 0`` and ``mul(v) = v / ev``. Divisions, not a
    coefficient, so that ``1/ev`` never overflows where ``v / ev`` does not."""
    pos = ev > 0
    ev_s = jnp.where(pos, ev, 1)
    has = ridge > 0
    r_s = jnp.where(has, ridge, 1)
    f0 = jnp.where(has, 1 / r_s, 0)

    def mul(v):
        out = jnp.where(has, -(v / r_s) * (ev_s / (r_s + ev_s)), v / ev_s)
        return jnp.where(pos, out, 0)

    return f0, mul


# ----------------------------------------------------------------------------------------------
# The FD family: FD-SON, RFD-SON, Ada-FD (both rules).


def _fd_solve_terms(lam, ridge, h, kind):
    """``(f0, mul)`` with the metric's solve ``f0 g + B^T mul(B g)`` (``B B^T = diag(lam)``, so
    ``B = diag(sqrt(lam)) V`` and ``mul(v) = m(v) / lam`` for the orthonormal form ``m``).

    SON: ``A = ridge I + B^T B`` (:func:`_spectral`; ``ridge = 0``: the pseudo-inverse, SON
    Appendix D, RFD paper appendix A). Ada-FD: ``H = delta I + (B^T B + ridge I)^{1/2}``,
    ``mul(v) = (1/(delta + sqrt(lam + ridge)) - f0) v / lam``.
    """
    pos = lam > 0
    lam_s = jnp.where(pos, lam, 1)
    if kind == "son":
        f0, inner = _spectral(lam, ridge)
        return f0, lambda v: jnp.where(pos, inner(v) / lam_s, 0)
    delta = h["delta"]
    ra = jnp.sqrt(ridge)
    rl = jnp.sqrt(lam_s + ridge)
    f0 = 1 / (delta + ra)
    c = -1 / ((rl + ra) * (delta + rl) * (delta + ra))
    return f0, lambda v: jnp.where(pos, c * v, 0)


def _fd_ridge(small, h, kind):
    """The total ridge: SON's ``alpha`` plus RFD's adaptive one; Ada-FD's RFD ``alpha``."""
    if kind == "son":
        return h["alpha"] + small["alpha_rfd"]
    return small["alpha_rfd"]


def _eigh_arrow(gram, j):
    """``eigh_desc`` of the arrowhead ``diag(lam) + border(B ghat, |ghat|^2)`` (row ``j``): the
    arrowhead eigen-update of :mod:`sketchopt._arrowhead` where it pays (GPU, TPU: no solver call
    per example), falling back to ``eigh`` where it does not converge; LAPACK on CPU."""
    if not _arrowhead.arrowhead_pays():
        return eigh_desc(gram)
    mu, u, ok = _arrowhead.eigh_arrow(gram, j)
    mu, u = jax.lax.cond(ok, lambda: (mu, u), lambda: eigh_desc(gram))
    return zero_round_off_eigenvalues(mu, gram.shape[-1]), u


def _fd_absorb(small, zg, gg, *, robust, max_growth):
    """FD's step on ``ghat`` in the ``F Z`` form (module docstring). ``zg = Z ghat``,
    ``gg = |ghat|^2``. Returns the new small fields (``F``, ``K``, ``lam``, ``free``,
    ``alpha_rfd``), ``delta`` (``Z += delta ghat^T``) and whether to compact."""
    f, k, lam, free = small["F"], small["K"], small["lam"], small["free"]
    m, rows = f.shape
    dtype = f.dtype
    eps = jnp.finfo(dtype).eps
    j = m - 1
    bg = jnp.matmul(f, zg, precision=_HI)  # B ghat (last entry 0: B's slot row is empty)
    gram = jnp.diag(lam).at[j, :].set(bg).at[:, j].set(bg).at[j, j].set(gg)
    mu, u = _eigh_arrow(gram, j)  # RFD paper Alg. 1/2 lines 4-5, on the small Gram matrix
    shift = mu[j]
    idx = jnp.arange(m)
    shrunk = jnp.where(idx < j, jnp.maximum(mu - shift, 0), 0)
    ratio = jnp.where(mu > 0, shrunk / jnp.where(mu > 0, mu, 1), 0)
    n = (u * jnp.sqrt(ratio)).T  # B' = N [B; ghat^T]
    # Rank-one path: v = P e_m on the null space of N; F h = v without its last entry.
    v = jnp.matmul(u, jnp.where(ratio == 0, u[j], 0), precision=_HI)
    vm = v[j]
    target = v.at[j].set(0)
    # The minimum-norm solution h = F^T (F F^T)^{-1} target on the live rows (the rows of F
    # with lam = 0 are zero: B's empty rows); the residual below says whether it solves.
    live = lam > 0
    gram_f = jnp.matmul(f, f.T, precision=_HI) + jnp.diag(jnp.where(live, 0, 1).astype(dtype))
    y = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(gram_f), True), jnp.where(live, target, 0))
    hvec = jnp.matmul(jnp.where(live, y, 0), f, precision=_HI)
    hvec = jnp.where(jnp.all(jnp.isfinite(hvec)), hvec, 0)
    residual = jnp.linalg.norm(jnp.matmul(f, hvec, precision=_HI) - target)
    scale = jnp.linalg.norm(f) * jnp.linalg.norm(hvec) + jnp.linalg.norm(target)
    consistent = (residual <= 64 * eps * scale) & (vm > eps)  # |delta| ~ 1/sqrt(vm): growth
    d1 = jnp.where(free, 0, -hvec / jnp.where(consistent, vm, 1))  # (free rows stay zero)
    # Slot path: ghat into the first free stored row k (Z += e_k ghat^T, F[:, k] = e_m).
    e_k = jax.nn.one_hot(jnp.argmax(free), rows, dtype=dtype)

    def after(delta, f_pre):
        k_new = k + jnp.outer(delta, zg) + jnp.outer(zg, delta) + gg * jnp.outer(delta, delta)
        f_new = jnp.matmul(n, f_pre, precision=_HI)
        size = jnp.sum(shrunk)
        growth = jnp.sum(jnp.square(f_new)) * jnp.trace(k_new) / jnp.where(size > 0, size, 1)
        return k_new, f_new, jnp.where(size > 0, growth, 1)

    k1, f1, g1 = after(d1, f)
    k2, f2, g2 = after(e_k, f + jnp.outer(jax.nn.one_hot(j, m, dtype=dtype), e_k))
    rank_one = consistent & jnp.isfinite(g1) & (g1 <= max_growth)
    delta = jnp.where(rank_one, d1, e_k)
    new = dict(
        small,
        F=jnp.where(rank_one, f1, f2),
        K=jnp.where(rank_one, k1, k2),
        lam=shrunk,
        free=jnp.where(rank_one, free, free & (e_k == 0)),
        alpha_rfd=small["alpha_rfd"] + (0.5 * shift if robust else 0),
    )
    growth = jnp.where(rank_one, g1, g2)
    return new, delta, ~jnp.any(new["free"]) | (growth > max_growth)


def _fd_spec(kind, rule, m, spare, *, eta, curvature, robust, max_growth):
    """The FD family's :class:`_Spec`; ``kind`` "son" or "ada_fd", ``rule`` "md" or "da"."""
    fd = _FdFamily(kind, rule, m, spare, eta, curvature, robust, max_growth)
    columns = ("gsum",) if fd.dual else ("w",)
    return _Spec(
        fd.rows, columns, fd.init, fd.predict, fd.learn, fd.compact, fd.weights, listed=True
    )


def _son_root(eta, curvature, t, dtype):
    """``sqrt(eta_t + sigma_t)``: SON's sketched gradient is ``ghat = sqrt(eta_t + sigma_t) g``
    (SON Alg. 1 line 7, with ``t`` the 0-based count of the schedules)."""
    return jnp.sqrt(_at(eta, t, dtype) + _at(curvature, t, dtype))


def _split_weights(table, rows, b):
    """``w = wbar + Z^T b`` (SON eq. 5-6, the split of the module docstring): ``Z`` the first
    ``rows`` columns of the table, ``wbar`` the next one."""
    return table[:, rows] + jnp.matmul(table[:, :rows], b, precision=_HI)


class _FdFamily:
    """FD-SON, RFD-SON and Ada-FD in the ``F Z`` form (module docstring): the functions of their
    :class:`_Spec`, one method each. ``kind`` is ``"son"`` (SON Alg. 1 with the FD sketch of
    Alg. 2; RFD paper Alg. 3 when ``robust``) or ``"ada_fd"`` (Ada-FD paper Alg. 2, mirror
    descent, ``rule="md"``; Alg. 1, dual averaging, ``rule="da"``)."""

    def __init__(self, kind, rule, m, spare, eta, curvature, robust, max_growth):
        self.kind, self.m, self.rows, self.dual = kind, m, m + spare, rule == "da"
        self.eta, self.curvature, self.robust, self.max_growth = eta, curvature, robust, max_growth

    def init(self, dim, dtype, key, h):
        del key
        m, rows = self.m, self.rows
        small = {
            "F": jnp.zeros((m, rows), dtype),
            "K": jnp.zeros((rows, rows), dtype),
            "lam": jnp.zeros((m,), dtype),
            "free": jnp.ones((rows,), bool),
            "alpha_rfd": jnp.asarray(h.get("alpha0", 0.0), dtype),
        }
        if self.dual:
            small |= {"p": jnp.zeros((rows,), dtype), "gam": jnp.zeros((m,), dtype)}
            small["scale"] = jnp.zeros((), dtype)
        else:
            small["b"] = jnp.zeros((rows,), dtype)
        return None, small

    def growth_limit(self, dtype):
        return _default_growth(dtype) if self.max_growth is None else self.max_growth

    def solve_terms(self, small, h):
        """The metric's solve through the sketch in ``small`` (:func:`_fd_solve_terms`)."""
        return _fd_solve_terms(small["lam"], _fd_ridge(small, h, self.kind), h, self.kind)

    def predict(self, small, s, h, t):
        """The prediction; under SON the bounded-prediction projection's (SON Lemma 1)."""
        del t
        if self.dual:
            bx = jnp.matmul(small["F"], s["zx"], precision=_HI)
            return small["scale"] * s["x_gsum"] + jnp.dot(small["gam"], bx), None
        u_x = s["x_w"] + jnp.dot(small["b"], s["zx"])
        if self.kind != "son":
            return u_x, None
        f0, mul = self.solve_terms(small, h)
        bx = jnp.matmul(small["F"], s["zx"], precision=_HI)
        gamma, p = _projection(u_x, s["xx"], bx, f0, mul, h["bound"])
        return p, (gamma, f0, mul, bx)

    def rates(self, h, t, dtype):
        """``(root, step)``: SON sketches ``ghat = sqrt(eta_t + sigma_t) g`` and steps by its
        metric's solve alone; Ada-FD sketches ``g`` and steps by ``eta_t``."""
        if self.kind == "son":
            return _son_root(self.eta, self.curvature, t, dtype), jnp.ones((), dtype)
        step = h["learning_rate"] if "learning_rate" in h else _at(self.eta, t, dtype)
        return jnp.ones((), dtype), step

    def learn(self, small, s, slope, pre, h, t):
        """One example: the projection's move (SON), FD's step on ``ghat`` (:func:`_fd_absorb`),
        then the rule's step through the new sketch (:meth:`mirror_step`, :meth:`dual_step`).
        ``t`` is the number of examples learned before this one, the schedules' count."""
        dtype = small["F"].dtype
        root, step = self.rates(h, t, dtype)
        coef_w = jnp.zeros((), dtype)
        if self.kind == "son" and not self.dual:  # the projection's move: wbar -= gamma f0 x, b
            gamma, f0p, mulp, bxp = pre
            coef_w = -gamma * f0p
            small = dict(small, b=small["b"] - gamma * (small["F"].T @ mulp(bxp)))
        gh = root * slope  # ghat = gh x
        zg, gg = gh * s["zx"], jnp.square(gh) * s["xx"]
        new, delta, compact = _fd_absorb(
            small, zg, gg, robust=self.robust, max_growth=self.growth_limit(dtype)
        )
        zx_new = s["zx"] + delta * gh * s["xx"]  # Z' x
        f0, mul = self.solve_terms(new, h)
        if self.dual:
            new, coef = self.dual_step(small, new, s, slope, gh, delta, zx_new, step, f0, mul)
        else:
            new, coef = self.mirror_step(
                small, new, slope, gh, delta, zx_new, step, f0, mul, coef_w
            )
        return new, coef, compact, ()

    @staticmethod
    def dual_step(small, new, s, slope, gh, delta, zx_new, step, f0, mul):
        """Dual averaging (Ada-FD paper Alg. 1): ``gbar += g``, ``p = Z gbar`` kept, and
        ``w = scale gbar + B^T gam`` with ``gam = -eta_t mul(B p)``, ``scale = -eta_t f0``."""
        p = small["p"] + delta * gh * s["x_gsum"]  # Z += delta g^T (gbar before g)
        p = p + slope * zx_new  # gbar += g
        bp = jnp.matmul(new["F"], p, precision=_HI)
        new |= {"p": p, "gam": -step * mul(bp), "scale": -step * f0}  # w = scale gbar + B^T gam
        return new, jnp.concatenate([delta * gh, slope[None]])

    @staticmethod
    def mirror_step(small, new, slope, gh, delta, zx_new, step, f0, mul, coef_w):
        """Mirror descent (SON Alg. 1, Ada-FD paper Alg. 2): ``w -= eta_t (f0 g + B^T mul(B g))``
        in the split, ``wbar -= eta_t f0 g`` (and ``(delta . b) ghat`` for ``Z``'s change, SON
        eq. 5) and ``b -= eta_t F^T mul(B' g)``."""
        bgrad = jnp.matmul(new["F"], slope * zx_new, precision=_HI)  # B' g
        coef_w = coef_w - jnp.dot(delta, small["b"]) * gh - step * f0 * slope
        new["b"] = small["b"] - step * (new["F"].T @ mul(bgrad))
        return new, jnp.concatenate([delta * gh, coef_w[None]])

    def compact(self, table, small, h, aux, x, *, support=None, chunks=None, need=True):
        """``Z <- [F Z]_{live}`` and, under mirror descent, ``wbar += Z^T b``: each row of the
        table times one small ``(width x width)`` matrix, then the kept rows' Gram matrix.
        With ``support`` (:class:`Support`) only its ``chunks`` chunks of listed rows, in place
        (a row whose ``Z`` is zero keeps every column); where not ``need`` (a grid's other
        configurations) the matrix is the identity and the small fields are kept."""
        del h, aux, x
        m, rows = self.m, self.rows
        f = small["F"]
        dtype = f.dtype
        width = table.shape[1]
        live = small["lam"][: m - 1] > 0
        eye_w = jnp.eye(width, dtype=dtype)
        mix = eye_w.at[:rows, :rows].set(0)
        mix = mix.at[:rows, : m - 1].set(jnp.where(live, f.T[:, : m - 1], 0))
        if not self.dual:
            mix = mix.at[:rows, rows].set(small["b"])  # the fold: wbar += Z^T b
        if support is None:
            table = jnp.matmul(table, mix, precision=_HI)
            kept = table[:, : m - 1]
            gram = jnp.matmul(kept.T, kept, precision=_HI)
        else:
            mix = jnp.where(need, mix, eye_w)
            table, gram = _map_rows(table, support, chunks, mix, m - 1)
        eye = jnp.diag(jnp.concatenate([live, jnp.zeros((1,), bool)]).astype(dtype))
        f_new = jnp.zeros_like(f).at[:, :m].set(eye)
        new = dict(
            small,
            F=f_new,
            K=jnp.zeros_like(small["K"]).at[: m - 1, : m - 1].set(gram),
            free=jnp.concatenate([~live, jnp.ones((rows - m + 1,), bool)]),
        )
        if self.dual:  # B (hence B^T gam) is unchanged; p = Z gbar becomes B gbar = F p
            new["p"] = jnp.matmul(f_new.T, jnp.matmul(f, small["p"], precision=_HI))
        else:
            new["b"] = jnp.zeros_like(small["b"])
        return table, new

    def weights(self, table, small, h):
        del h
        rows = self.rows
        if self.dual:
            beta = small["F"].T @ small["gam"]
            return small["scale"] * table[:, rows] + jnp.matmul(
                table[:, :rows], beta, precision=_HI
            )
        return _split_weights(table, rows, small["b"])


# ----------------------------------------------------------------------------------------------
# Oja-SON.


def _oja_spec(m, *, eta, curvature, gamma, max_growth):
    """Oja-SON's :class:`_Spec` (SON Alg. 4-5 in the ``F Z`` form of the module docstring)."""
    oja = _OjaSon(m, eta, curvature, gamma, max_growth)
    return _Spec(m, ("w",), oja.init, oja.predict, oja.learn, oja.compact, oja.weights)


def _oja_stack(rate, pv, rho, m, dtype):
    """``M^T`` of Oja's step on the orthonormal ``V`` (SON Alg. 5): ``F Z' = M [V; w^T]`` with
    ``[V; w^T]`` orthonormal, ``ghat = V^T pv + rho w`` and ``c = Gamma_t pv``, so
    ``M = [I + c pv^T, rho c]``; its QR is Decompose's Gram-Schmidt (module docstring)."""
    c = rate * pv
    return jnp.concatenate([(jnp.eye(m, dtype=dtype) + jnp.outer(c, pv)).T, (rho * c)[None]])


def _oja_decompose(f, rate, pv, gg):
    """Decompose (SON Alg. 5; the paper's missing Appendix H): ``F <- L^{-1} F`` with ``L`` the
    lower Cholesky factor of ``M M^T`` (``L = R^T`` of the QR of ``M^T``, :func:`_oja_stack`), so
    that ``F Z'`` is the Gram-Schmidt of Oja's un-orthonormalized rows, as the dense sketch's QR.
    ``gg = |ghat|^2``, ``pv = V ghat``.

    No factorization is computed: with ``c = Gamma pv`` and ``|pv|^2 + rho^2 = gg``,
    ``M M^T = I + beta pv pv^T``, ``beta = 2 Gamma + Gamma^2 gg``, whose Cholesky factor is
    known in closed form (the rank-one update of the identity's, Gill, Golub, Murray and
    Saunders 1974): with ``t_i = 1 + beta sum_{j<=i} pv_j^2`` (``t_0 = 1``),
    ``L_ii = sqrt(t_i / t_{i-1})`` and ``L_ij = beta pv_i pv_j / sqrt(t_j t_{j-1})`` below the
    diagonal. Forward substitution then telescopes (the running sum's factors multiply to
    ``t_{j}/t_{i-1}``) to ``(L^{-1} F)_i = (F_i - beta pv_i / t_{i-1} sum_{j<i} pv_j F_j) /
    sqrt(t_i / t_{i-1})``: one cumulative sum, no solver call per example. Against a float64
    reference on random inputs with ``Gamma gg`` up to ``1e7`` its float32 error was at most
    ``9e-7`` (relative to ``max |L^{-1} F|``), where float32's QR and triangular solve erred by
    up to 1.3."""
    beta = 2 * rate + jnp.square(rate) * gg
    t = 1 + beta * jnp.cumsum(jnp.square(pv))
    t_prev = jnp.concatenate([jnp.ones((1,), t.dtype), t[:-1]])
    running = jnp.cumsum(pv[:, None] * f, axis=0)
    before = jnp.concatenate([jnp.zeros_like(running[:1]), running[:-1]])  # sum_{j<i} pv_j F_j
    return (f - (beta * pv / t_prev)[:, None] * before) / jnp.sqrt(t / t_prev)[:, None]


class _OjaSon:
    """Oja-SON's :class:`_Spec` functions, one method each (SON Alg. 4-5): Oja's step on the
    sketch as a rank-one change of ``Z`` and a re-orthonormalization of ``F`` (:meth:`learn`),
    a dense step or a re-basing when ``F`` grows too large (:meth:`compact`)."""

    def __init__(self, m, eta, curvature, gamma, max_growth):
        self.m, self.eta, self.curvature, self.gamma = m, eta, curvature, gamma
        self.max_growth = max_growth

    def init(self, dim, dtype, key, h):
        del h
        m = self.m
        if m > dim:
            raise ValueError(f"sparse oja_son needs sketch_size <= dim, got {m} > {dim}")
        key = jax.random.PRNGKey(0) if key is None else key
        z = _sketches.oja(m, key=key).init(dim, dtype).directions  # the dense V_0
        small = {
            "F": jnp.eye(m, dtype=dtype),
            "K": jnp.matmul(z, z.T, precision=_HI),
            "lam": jnp.zeros((m,), dtype),
            "b": jnp.zeros((m,), dtype),
        }
        return z, small

    @staticmethod
    def terms(lam, t, h):
        """``A^{-1} y = f0 y + V^T mul(V y)`` for ``A = alpha I + V^T diag(t lam) V``."""
        return _spectral(t * lam, h["alpha"])

    def predict(self, small, s, h, t):
        """The bounded-prediction projection's prediction (SON Lemma 1)."""
        dtype = small["F"].dtype
        u_x = s["x_w"] + jnp.dot(small["b"], s["zx"])
        f0, mul = self.terms(small["lam"], t.astype(dtype), h)
        vx = jnp.matmul(small["F"], s["zx"], precision=_HI)
        gamma_p, p = _projection(u_x, s["xx"], vx, f0, mul, h["bound"])
        return p, (gamma_p, f0, mul, vx)

    def limit(self, dtype):
        return _default_growth(dtype) if self.max_growth is None else self.max_growth

    def learn(self, small, s, slope, pre, h, t):
        """One example: the projection's move, Oja's step (SON Alg. 5: ``Z += delta ghat^T``,
        the eigenvalues by SON eq. 4, Decompose), then SON's step through the new sketch; or,
        where ``F`` would grow past :meth:`limit`, only the projection's move here and the
        step densely (:meth:`compact`)."""
        f, k, b = small["F"], small["K"], small["b"]
        dtype = f.dtype
        gamma_p, f0p, mulp, vxp = pre
        b = b - gamma_p * (f.T @ mulp(vxp))  # the projection's move
        coef_w = -gamma_p * f0p
        t1 = (t + 1).astype(dtype)
        gh = _son_root(self.eta, self.curvature, t, dtype) * slope
        zg, gg = gh * s["zx"], jnp.square(gh) * s["xx"]
        rate = jnp.asarray(self.gamma(t1), dtype)  # Gamma_t
        pv = jnp.matmul(f, zg, precision=_HI)  # V ghat
        lam = (1 - rate) * small["lam"] + rate * jnp.square(pv)  # SON eq. 4
        f0, mul = self.terms(lam, t1, h)
        delta = rate * zg  # Alg. 5: A^{-1} Gamma F Z ghat with A = F
        k = k + jnp.outer(delta, zg) + jnp.outer(zg, delta) + gg * jnp.outer(delta, delta)
        f_new = _oja_decompose(f, rate, pv, gg)
        growth = jnp.sum(jnp.square(f_new)) * jnp.trace(k) / self.m
        # A step that would make Z's rows many times larger than the directions they stand
        # for (Gamma_t |ghat|^2 large: e.g. the first steps, Gamma_1 = 1, on unnormalized
        # features) would round Z's information away: it is taken densely instead (compact).
        dense = ~(growth <= self.limit(dtype))
        zx_new = s["zx"] + delta * gh * s["xx"]
        vg = jnp.matmul(f_new, slope * zx_new, precision=_HI)
        b_new = b - f_new.T @ mul(vg)
        coef_w_sparse = coef_w - jnp.dot(delta, b) * gh - f0 * slope
        new = {
            "F": jnp.where(dense, f, f_new),
            "K": jnp.where(dense, small["K"], k),
            "lam": lam,
            "b": jnp.where(dense, b, b_new),
        }
        coef = jnp.where(
            dense,
            jnp.concatenate([jnp.zeros((self.m,), dtype), (coef_w - f0 * slope)[None]]),
            jnp.concatenate([delta * gh, coef_w_sparse[None]]),
        )
        aux = {"dense": dense, "gh": gh, "rate": rate, "slope": slope, "t1": t1}
        return new, coef, dense, aux

    def dense_step(self, v_t, small, h, aux, x):
        """Oja's step on ``V = F Z`` as the dense sketch takes it (SON Alg. 5: Gram-Schmidt of
        ``V + Gamma_t V ghat ghat^T`` by the QR of :func:`_oja_stack`), then ``b``'s step:
        ``(V'^T, b')`` with ``V'`` orthonormal."""
        m, dtype = self.m, v_t.dtype
        xd = x().astype(dtype)
        u = aux["gh"] * xd  # ghat
        p = jnp.matmul(u, v_t, precision=_HI)
        w = u - jnp.matmul(v_t, p, precision=_HI)
        p2 = jnp.matmul(w, v_t, precision=_HI)  # twice is enough
        w = w - jnp.matmul(v_t, p2, precision=_HI)
        p = p + p2
        rho = jnp.linalg.norm(w)
        w = w / jnp.where(rho > 0, rho, 1)
        q, r = jnp.linalg.qr(_oja_stack(aux["rate"], p, rho, m, dtype))
        q = q * jnp.where(jnp.diagonal(r) < 0, -1, 1).astype(dtype)
        v_new = jnp.matmul(v_t, q[:m], precision=_HI) + jnp.outer(w, q[m])
        f0, mul = self.terms(small["lam"], aux["t1"], h)
        vg = jnp.matmul(aux["slope"] * xd, v_new, precision=_HI)
        return v_new, -mul(vg)

    def compact(self, table, small, h, aux, x):
        """The dense step (``aux["dense"]``: :meth:`dense_step`) or a re-basing ``Z <- F Z``
        re-orthonormalized by QR; ``O(m^2 d)`` either way, with ``wbar += Z^T b`` folded."""
        m = self.m
        f, b = small["F"], small["b"]
        dtype = f.dtype
        v_t = jnp.matmul(table[:, :m], f.T, precision=_HI)  # V^T (d, m)
        wbar = _split_weights(table, m, b)

        def rebase():
            q, r = jnp.linalg.qr(v_t)  # V^T = Q R: Z = Q^T orthonormal, F = R^T
            sign = jnp.where(jnp.diagonal(r) < 0, -1, 1).astype(dtype)
            return q * sign, jnp.zeros_like(b)

        dense = functools.partial(self.dense_step, v_t, small, h, aux, x)
        v_new, b_new = jax.lax.cond(aux["dense"], dense, rebase)
        new = dict(small, F=jnp.eye(m, dtype=dtype), K=jnp.eye(m, dtype=dtype), b=b_new)
        return jnp.concatenate([v_new, wbar[:, None], table[:, m + 1 :]], 1), new

    def weights(self, table, small, h):
        del h
        return _split_weights(table, self.m, small["b"])


# ----------------------------------------------------------------------------------------------
# RP-SON.


def _rp_spec(m, *, eta, curvature, auto=False):
    def init(dim, dtype, key, h):
        key = jax.random.PRNGKey(0) if key is None else key
        small = {
            "H": jnp.eye(m, dtype=dtype) / jnp.asarray(h["alpha"], dtype),
            "K": jnp.zeros((m, m), dtype),
            "b": jnp.zeros((m,), dtype),
            "key": jnp.asarray(key),
        }
        return None, small

    def predict(small, s, h, t):
        del t
        u_x = s["x_w"] + jnp.dot(small["b"], s["zx"])
        a = h["alpha"]
        hz = small["H"] @ s["zx"]
        quad = (s["xx"] - jnp.dot(s["zx"], hz)) / a
        gamma_p = _safe_div(_tau(u_x, h["bound"]), quad)
        return u_x - gamma_p * quad, (gamma_p, hz)

    def learn(small, s, slope, pre, h, t):
        hm, k, b = small["H"], small["K"], small["b"]
        dtype = hm.dtype
        a = h["alpha"]
        gamma_p, hz = pre
        coef_w = -gamma_p / a
        b = b + gamma_p * hz / a  # the projection's move
        key, sub = jax.random.split(small["key"])
        r = jax.random.normal(sub, (m,), dtype) * jnp.asarray(1 / np.sqrt(m), dtype)
        gh = _son_root(eta, curvature, t, dtype) * slope
        zg, gg = gh * s["zx"], jnp.square(gh) * s["xx"]
        q = zg + 0.5 * gg * r  # S S^T += r q^T + q r^T (SON sec. 3)
        k = k + jnp.outer(r, q) + jnp.outer(q, r)
        h_new, safe = rank_two_inverse_update(hm, r, q)
        # (an automatic alpha moves with the data: H from K at every step, an m x m eigh)
        refresh = ~safe | ~jnp.all(jnp.isfinite(h_new)) | ((t + 1) % m == 0) | auto

        def rebuild():
            mu, u = jnp.linalg.eigh(0.5 * (k + k.T))
            return (u / (a + jnp.maximum(mu, 0))) @ u.T

        h_new = jax.lax.cond(refresh, rebuild, lambda: h_new)
        coef_w = coef_w - jnp.dot(r, b) * gh - slope / a
        sg = slope * (s["zx"] + r * gh * s["xx"])  # S' g
        b = b + h_new @ sg / a
        new = {"H": h_new, "K": k, "b": b, "key": key}
        return new, jnp.concatenate([r * gh, coef_w[None]]), jnp.bool_(False), ()

    def compact(table, small, h, aux, x):  # never needed: S changes by r ghat^T only
        del h, aux, x
        return table, small

    def weights(table, small, h):
        del h
        return _split_weights(table, m, small["b"])

    return _Spec(m, ("w",), init, predict, learn, compact, weights)


# ----------------------------------------------------------------------------------------------
# The learner around a spec.


def _learner(
    name, loss, spec: _Spec, hyper: dict, grid: tuple[int, ...], rescaled: str | bool = False,
    auto: str | None = None, diagonal_init: float = _DIAGONAL_INIT,
) -> LinearLearner:  # fmt: skip
    """The :class:`LinearLearner` of ``spec``. With ``rescaled`` (``"fed"`` or ``"metric"``: SON
    sec. 5.2, module docstring) the table gains a column ``ds = D^{1/2}`` (``D_1 = diagonal_init
    I``) and the spec sees the example ``x / ds``. Fed, ``ds`` takes the example's ``g^2`` after
    the prediction and before the learning, which re-reads the rows (a second gather of the
    example's rows) and adds its step and the new ``ds`` in one scatter-add; in the metric form
    ``D += g^2`` after the step, each coordinate of the example re-expressed (``u_i`` scales by
    ``ds_new / ds_old``). Either is ``O(s (R + k))``."""
    s = _SketchedLearner(loss, spec, hyper, grid, rescaled, auto, diagonal_init)
    # Compiled once per learner: called outside jit, the conds and loops of the steps would
    # otherwise be traced and compiled again at every call (their branches are fresh closures).
    step, update, predict, weights = map(jax.jit, (s.step, s.update, s.predict, s.weights))
    step_flat = jax.jit(s.step_flat, static_argnames="width")
    columns = s.columns
    return LinearLearner(
        name, loss, s.init, predict, update, step, weights, columns, grid, (columns,), step_flat
    )


class _Flat(NamedTuple):
    """One example of a flat chunk (:class:`~sketchopt.stream.examples.FlatExamples`): its
    non-zeros ``indices[start:stop]``, read and written in ``segments`` segments of ``width``."""

    indices: jax.Array
    values: jax.Array
    start: jax.Array
    stop: jax.Array
    width: int
    dim: int
    segments: jax.Array  # how many (:func:`sketchopt.stream._base.segment_count`)

    def segment(self, j):
        return flat_segment(
            self.indices, self.values, self.start, self.stop, j, self.width, self.dim
        )

    def cleaned(self, j, dtype):
        """Segment ``j`` with a bad example's out-of-range indices dropped (the padding index
        ``dim``) and its non-finite values zeroed, the values as ``dtype``."""
        seg = self.segment(j)
        dim = self.dim
        idx = jnp.where((seg.indices >= 0) & (seg.indices <= dim), seg.indices, dim)
        return idx, jnp.where(jnp.isfinite(seg.values), seg.values, 0).astype(dtype)


class _SketchedLearner:
    """The functions of :func:`_learner`'s learner, one method each: an example's rows are read
    (:meth:`read`), the spec's small ``O(m^2)`` work predicts and learns (:meth:`one`), ``x``
    times one ``(R + k)``-vector is added to its rows (:meth:`scatter`), a compaction runs where
    the spec asks for one (:meth:`settle`) and, with diagonal rescaling, ``D`` grows
    (:meth:`rescale`). A grid runs the configurations by ``vmap`` (module docstring)."""

    def __init__(
        self, loss, spec: _Spec, hyper: dict, grid: tuple[int, ...], rescaled: bool, auto=None,
        diagonal_init: float = _DIAGONAL_INIT,
    ):  # fmt: skip
        self.loss, self.spec, self.hyper = loss, spec, hyper
        self.rescaled = rescaled is not False  # "fed", or "metric" (module docstring)
        self.fed = rescaled == "fed"
        self.diagonal_init = diagonal_init
        self.auto = auto  # "alpha" or "delta": set from the data's running scale (_SCALE_FREE)
        self.derivative = jax.grad(loss_function(loss))
        self.rows = spec.rows
        self.batched = bool(grid)
        self.grid = grid
        self.width = spec.rows + len(spec.columns) + int(self.rescaled)
        self.ds_col = self.width - 1  # (rescaled only)
        zs = tuple(f"z{i}" for i in range(spec.rows))
        self.columns = zs + spec.columns + (("ds",) if rescaled else ())

    def h_of(self, dtype):
        return {k: jnp.asarray(v, dtype) for k, v in self.hyper.items()}

    def effective(self, small, h, xx=None):
        """``h`` with the ridge set from the data's running scale, when it is automatic
        (:data:`_SCALE_FREE`): ``alpha = alpha_scale * r`` (SON) or ``delta = delta_scale *
        sqrt(r)`` (Ada-FD), ``r`` the mean ``|x|^2`` of the examples learned from (``xx``, the
        example's own, before any)."""
        if self.auto is None:
            return h
        count = small["xx_count"]
        r = small["xx_sum"] / jnp.maximum(count, 1)
        if xx is not None:
            r = jnp.where(count > 0, r, xx)
        r = jnp.where(r > 0, r, 1)  # (no example yet, or only empty ones: the unit scale)
        # floored where the metric's products of three ridges would leave the dtype's range
        # (Ada-FD's c ~ 1/delta^3): below it, features of scale ~1e-10 are not scale-free
        r = jnp.maximum(r, jnp.sqrt(jnp.finfo(r.dtype).tiny))
        value = r if self.auto == "alpha" else jnp.sqrt(r)
        return h | {self.auto: h[f"{self.auto}_scale"] * value}

    def init_one(self, dim, dtype, key, h):
        z, small = self.spec.init(dim, dtype, key, h)  # (an automatic alpha: 1 until data)
        if self.auto is not None:
            small = small | {"xx_sum": jnp.zeros((), dtype), "xx_count": jnp.zeros((), dtype)}
        table = jnp.zeros((dim, self.width), dtype)
        if z is not None:
            table = table.at[:, : self.rows].set(z.T)
        if self.rescaled:
            table = table.at[:, self.ds_col].set(jnp.asarray(np.sqrt(self.diagonal_init), dtype))
        # three arrays (not one thrice: a donated state may not hold a buffer twice)
        counts = (jnp.zeros((), jnp.int32) for _ in range(3))
        support = _support_init(dim) if self.spec.listed else None
        return SketchedState(table, small, *counts, support)

    def init(self, dim: int, dtype=jnp.float32, key=None) -> SketchedState:
        dim, dtype = int(dim), state_dtype(dtype)
        if dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim}")
        h = self.h_of(dtype)
        if not self.batched:
            return self.init_one(dim, dtype, key, h)
        keys = key if key is not None else jnp.stack([jax.random.PRNGKey(0)] * self.grid[0])
        return jax.vmap(lambda k, hh: self.init_one(dim, dtype, k, hh))(keys, h)

    def read(self, table, x):
        """One example's rows and the sums every spec reads."""
        dim = table.shape[0]
        indices, values = jnp.asarray(x[0]), jnp.asarray(x[1])
        ok = jnp.all((indices >= 0) & (indices <= dim) & jnp.isfinite(values))
        idx = jnp.where(ok, indices, dim)
        vals = jnp.where(ok, values, 0).astype(table.dtype)
        got = table.at[idx].get(mode="fill", fill_value=0)  # (s, width)
        if self.rescaled:  # the example as the prediction sees it, x / D^{1/2}
            vals = self.over(vals, got[:, self.ds_col])
        return idx, vals, self.sums(vals, got), ok

    def sums(self, vals, got):
        """The sums every spec reads, of the example ``vals`` (as the spec sees it) over its
        rows ``got``."""
        rows = self.rows
        sums = jnp.matmul(vals, got, precision=_HI)
        out = {"zx": sums[:rows], "xx": jnp.dot(vals, vals)}
        return out | {f"x_{c}": sums[rows + i] for i, c in enumerate(self.spec.columns)}

    @staticmethod
    def over(x, ds):
        """``x / ds``, 0 where ``ds`` is 0 (a coordinate never seen: its ``x`` is 0 too)."""
        return jnp.where(ds > 0, x / jnp.where(ds > 0, ds, 1), 0)

    @staticmethod
    def grown(ds, x, slope):
        """The fed form's ``ds`` (SON sec. 5.2 in VW's order) with this example's ``g^2`` in
        ``D`` (``g = slope x``, ``x`` as given; a coordinate whose ``D`` would overflow keeps its
        own) and the example as the learning sees it, ``x / ds``. A step not learned (slope 0)
        keeps ``ds`` to the bit."""
        ds_new = jnp.hypot(ds, slope * x)
        ds_new = jnp.where(jnp.isfinite(ds_new), ds_new, ds)
        return ds_new, _SketchedLearner.over(x, ds_new)

    def fed_sums(self, table, idx, x, slope):
        """The sums of the example as the fed form's learning sees it (:meth:`grown`), from the
        rows as they are before the step."""
        got = table.at[idx].get(mode="fill", fill_value=0)
        return self.sums(self.grown(got[:, self.ds_col], x, slope)[1], got)

    def one(self, state, sums, ok, label, active, h, weight=None, resum=None):
        """The small work of one configuration: prediction, then learning (``weight``, the
        importance weight, scales the gradient; 0 learns nothing). ``resum(table, slope)`` (the
        fed form) gives the sums of the example as the learning sees it, ``x`` over the ``D``
        grown by this example's gradient."""
        spec = self.spec
        scale = {}
        if self.auto is not None:  # the running scale with this example (module docstring)
            scale = {
                "xx_sum": state.small["xx_sum"] + sums["xx"],
                "xx_count": state.small["xx_count"] + 1,
            }
            h = self.effective(scale, h)
        p, pre = spec.predict(state.small, sums, h, state.t)
        y = class_label(self.loss, jnp.asarray(label, p.dtype))
        slope = self.derivative(p, y)
        slope, ok, active = importance(slope, ok, active, weight, p.dtype)
        if resum is not None:
            usable = ok & active & jnp.isfinite(y) & jnp.isfinite(slope)
            sums = resum(state.table, jnp.where(usable, slope, 0))
            pre = spec.predict(state.small, sums, h, state.t)[1]
        small, coef, need, aux = spec.learn(state.small, sums, slope, pre, h, state.t)
        small = small | scale
        fine = jax.tree.reduce(
            lambda acc, a: acc & jnp.all(jnp.isfinite(a)) if jnp.issubdtype(a.dtype, jnp.floating)
            else acc, (small, coef), jnp.bool_(True),
        )  # fmt: skip
        ok = ok & jnp.isfinite(y) & jnp.isfinite(slope) & fine
        learn = ok & active
        small = jax.tree.map(lambda a, b: jnp.where(learn, a, b), small, state.small)
        coef = jnp.where(learn, coef, 0)
        new = state._replace(
            small=small,
            t=jnp.where(learn, state.t + 1, state.t),
            nonfinite_count=state.nonfinite_count + (active & ~ok).astype(jnp.int32),
        )
        if self.rescaled:
            coef = jnp.concatenate([coef, jnp.zeros((1,), coef.dtype)])  # (ds: not additive)
        return new, coef, p, need & learn, aux, jnp.where(learn, slope, 0)

    def compacted(self, state, h, aux, x, chunks, need=True):
        """The spec's compaction of ``state``: over the listed rows where there is a
        :class:`Support` (``chunks`` of them; the identity where not ``need``), else dense."""
        if state.support is None:
            return self.spec.compact(state.table, state.small, h, aux, x)
        return self.spec.compact(
            state.table, state.small, h, aux, x, support=state.support, chunks=chunks, need=need
        )

    def compact_where(self, state, h, need, aux, x, chunks):
        table, small = self.compacted(state, h, aux, x, chunks, need)
        small = jax.tree.map(lambda a, b: jnp.where(need, a, b), small, state.small)
        if state.support is None:  # (the listed form kept the others' rows itself)
            table = jnp.where(need, table, state.table)
        return state._replace(
            table=table, small=small, compactions=state.compactions + need.astype(jnp.int32)
        )

    def compact_one(self, state, h, aux, x, chunks):
        table, small = self.compacted(state, h, aux, x, chunks)
        return state._replace(table=table, small=small, compactions=state.compactions + 1)

    def settle(self, state, need, h, aux, xarg, make_x):
        """The compaction, where needed: one ``cond`` for the whole grid (module docstring).
        ``make_x(xarg)`` builds the example (as the spec saw it) as a dense vector, inside the
        rare branch only; ``xarg`` is per configuration in a grid. (An automatic ridge is the
        one the step used: the running scale in ``state`` includes the example.)"""
        h = (
            jax.vmap(self.effective)(state.small, h)
            if self.batched
            else self.effective(state.small, h)
        )
        # the loop over the listed rows runs as often for every configuration of a grid
        chunks = None if state.support is None else _chunks(state.support)
        if not self.batched:
            return jax.lax.cond(
                need,
                lambda s: self.compact_one(s, h, aux, lambda: make_x(xarg), chunks),
                lambda s: s,
                state,
            )

        def run(s):
            return jax.vmap(
                lambda st, hh, n, a, xa: self.compact_where(
                    st, hh, n, a, lambda: make_x(xa), chunks
                )
            )(s, h, need, aux, xarg)

        return jax.lax.cond(jnp.any(need), run, lambda s: s, state)

    def scatter(self, table, idx, vals, coef):
        """``table[idx] += vals coef^T``: ``x`` times one ``(R + k)``-vector per configuration
        (``vals`` too is per configuration in a grid: ``x / ds`` when rescaled)."""
        if self.batched:
            return jax.vmap(lambda tb, vs, cf: _scatter_one(tb, idx, vs, cf))(table, vals, coef)
        return _scatter_one(table, idx, vals, coef)

    def note(self, support, idx, x, coef):
        """The :class:`Support` after a write of ``x coef^T`` on the rows ``idx``: a coordinate
        is listed where its ``x`` and the coefficients of ``Z`` are non-zero (``x`` and
        ``coef`` per configuration in a grid, or ``x`` shared)."""
        if support is None:
            return None

        def unlisted(sp, xs, cf):
            return _unlisted(sp, idx, (xs != 0) & jnp.any(cf[: self.rows] != 0))

        # the listing only when a coordinate is new: on streams whose features recur, almost
        # never after the first examples (one cond for a whole grid, as the compaction's)
        if self.batched:
            new = jax.vmap(unlisted, in_axes=(0, 0 if x.ndim == 2 else None, 0))(support, x, coef)
            listing = jax.vmap(_listed, in_axes=(0, None, 0))
        else:
            new, listing = unlisted(support, x, coef), _listed
        return jax.lax.cond(jnp.any(new), lambda sp: listing(sp, idx, new), lambda sp: sp, support)

    def rescale_one(self, table, small, idx, xt, slope):
        """``D += g^2`` on the example's coordinates (``g = slope x``, ``x = ds xt``), each
        ``u_i = wbar_i + Z_i . b`` re-expressed: ``u_i <- u_i ds_new / ds_old`` (SON sec. 5.2)."""
        rows, ds_col = self.rows, self.ds_col
        got = table.at[idx].get(mode="fill", fill_value=0)
        ds = got[:, ds_col]
        ds_new = jnp.hypot(ds, slope * xt * ds)
        ratio = jnp.where(ds > 0, ds_new / jnp.where(ds > 0, ds, 1), 1)
        zb = jnp.matmul(got[:, :rows], small["b"], precision=_HI)
        w = got[:, rows]
        w_new = w + (ratio - 1) * (w + zb)  # (ratio = 1, a step not learned: w to the bit)
        # A coordinate whose weight would leave the dtype's range in the new coordinates (an
        # example of scale ~1e15 in float32, met while D is still D_1) keeps its old D and u.
        fits = jnp.isfinite(w_new) & jnp.isfinite(ds_new)
        w_new, ds_new = jnp.where(fits, w_new, w), jnp.where(fits, ds_new, ds)
        table = table.at[idx, rows].set(w_new, mode="drop")
        return table.at[idx, ds_col].set(ds_new, mode="drop")

    def rescale(self, state, idx, xt, slope):
        if not self.rescaled:
            return state
        if self.batched:
            table = jax.vmap(lambda tb, sm, xs, sl: self.rescale_one(tb, sm, idx, xs, sl))(
                state.table, state.small, xt, slope
            )
        else:
            table = self.rescale_one(state.table, state.small, idx, xt, slope)
        return state._replace(table=table)

    def small_work(self, state, sums, ok, label, active, h, weight=None, resum=None):
        one = functools.partial(self.one, resum=resum)
        if self.batched:
            return jax.vmap(one, in_axes=(0, 0, 0, None, None, 0, None))(
                state, sums, ok, label, active, h, weight
            )
        return one(state, sums, ok, label, active, h, weight)

    def fed_write(self, table, idx, x, slope, coef):
        """The fed form's write: ``x / ds`` times ``coef`` added to the rows of ``idx``, their
        ``ds`` moved to the new one (:meth:`grown`) by the same scatter-add (a gather of the
        whole rows and a scatter that sets them cost 4x as much on the CPU)."""

        def one(tb, sl, cf):
            ds = tb.at[idx, self.ds_col].get(mode="fill", fill_value=0)
            ds_new, xt = self.grown(ds, x, sl)
            add = xt[:, None] * cf[None, :].astype(tb.dtype)
            return tb.at[idx].add(with_column(add, self.ds_col, ds_new - ds), mode="drop")

        if self.batched:
            return jax.vmap(one)(table, slope, coef)
        return one(table, slope, coef)

    def step(self, state, x, label, active=True, weight=None):
        h = self.h_of(state.table.dtype)
        if self.batched:
            idx, vals, sums, ok = jax.vmap(lambda tb: self.read(tb, x))(state.table)
            idx = idx[0]  # the same coordinates for every configuration
        else:
            idx, vals, sums, ok = self.read(state.table, x)
        dim = state.table.shape[-2]

        def dense_x(v):  # (the example as the spec saw it: x / ds when rescaled)
            return jnp.zeros((dim,), v.dtype).at[idx].add(v, mode="drop")

        if not self.fed:
            new, coef, p, need, aux, slope = self.small_work(
                state, sums, ok, label, active, h, weight
            )
            new = new._replace(
                table=self.scatter(new.table, idx, vals, coef),
                support=self.note(new.support, idx, vals, coef),
            )
            new = self.settle(new, need, h, aux, vals, dense_x)
            return self.rescale(new, idx, vals, slope), p

        # the fed form: the learning sees x over the D with this example's g^2 (VW's order)
        ok_x = jnp.all(ok) if self.batched else ok
        x_raw = jnp.where(ok_x, jnp.asarray(x[1]), 0).astype(state.table.dtype)

        def resum(table, slope):
            return self.fed_sums(table, idx, x_raw, slope)

        new, coef, p, need, aux, slope = self.small_work(
            state, sums, ok, label, active, h, weight, resum
        )
        table = self.fed_write(state.table, idx, x_raw, slope, coef)
        new = new._replace(table=table, support=self.note(new.support, idx, x_raw, coef))

        def seen(tb):  # x / ds_new of one configuration's written table
            ds = tb.at[idx, self.ds_col].get(mode="fill", fill_value=0)
            return dense_x(self.over(x_raw, ds))

        return self.settle(new, need, h, aux, table, seen), p

    def flat_sums(self, table, flat: _Flat):
        """The sums of :meth:`read` over the segments of a flat example (they are additive),
        from one configuration's ``table``, and whether every segment is fine."""

        def body(j, carry):
            sums, ok = carry
            _, _, s_j, ok_j = self.read(table, flat.segment(j))
            return jax.tree.map(jnp.add, sums, s_j), ok & ok_j

        zero = jax.tree.map(jnp.zeros_like, self.read(table, flat.segment(0))[2])
        return jax.lax.fori_loop(0, flat.segments, body, (zero, jnp.bool_(True)))

    def segment_read(self, table, flat: _Flat, j):
        """Segment ``j`` as the spec saw it, from one configuration's current ``table``
        (``x / ds`` when rescaled: ``ds`` of a segment's coordinates changes only in its own
        rescale, the segments' coordinates being distinct). Never the pre-step table: read
        after the scatter it would make XLA copy the whole table. A bad example's
        out-of-range indices and non-finite values are dropped (it learns nothing)."""
        idx, vals = flat.cleaned(j, table.dtype)
        if self.rescaled:
            vals = self.over(vals, table.at[idx, self.ds_col].get(mode="fill", fill_value=0))
        return idx, vals

    def segment_values(self, table, flat: _Flat, j):
        """``(idx, x / ds per configuration)`` of segment ``j`` (:meth:`segment_read`)."""
        if self.batched:
            idx, xt = jax.vmap(lambda tb: self.segment_read(tb, flat, j))(table)
            return idx[0], xt
        return self.segment_read(table, flat, j)

    def flat_dense_x(self, flat: _Flat, table):
        """The flat example as the spec saw it, dense, from one configuration's table (``ds``
        as before the step)."""

        def add(j, acc):
            idx, xt = self.segment_read(table, flat, j)
            return acc.at[idx].add(xt.astype(acc.dtype), mode="drop")

        return jax.lax.fori_loop(0, flat.segments, add, jnp.zeros((flat.dim,), table.dtype))

    def step_flat(
        self, state, indices, values, start, stop, label, active=True, *, width: int, weight=None
    ):
        """:meth:`step` on one example of a flat chunk: read in segments of ``width`` (the sums
        are additive), the small work once, then the scatter in the same segments."""
        dim = state.table.shape[-2]
        flat = _Flat(indices, values, start, stop, width, dim, segment_count(start, stop, width))
        h = self.h_of(state.table.dtype)
        read = functools.partial(self.flat_sums, flat=flat)
        sums, ok = jax.vmap(read)(state.table) if self.batched else read(state.table)
        if not self.fed:
            new, coef, p, need, aux, slope = self.small_work(
                state, sums, ok, label, active, h, weight
            )

            def write(j, carry):
                table, support = carry
                idx, xt = self.segment_values(table, flat, j)
                return self.scatter(table, idx, xt, coef), self.note(support, idx, xt, coef)

        else:  # the fed form: the learning sees x over the D with this example's g^2

            def resum(table, slope):
                def body(j, acc):
                    idx, x = flat.cleaned(j, table.dtype)
                    sums_j = self.fed_sums(table, idx, x, slope)
                    return jax.tree.map(jnp.add, acc, sums_j)

                zero = jax.tree.map(jnp.zeros_like, sums if not self.batched else
                                    jax.tree.map(lambda a: a[0], sums))  # fmt: skip
                return jax.lax.fori_loop(0, flat.segments, body, zero)

            new, coef, p, need, aux, slope = self.small_work(
                state, sums, ok, label, active, h, weight, resum
            )

            def write(j, carry):
                table, support = carry
                idx, x = flat.cleaned(j, table.dtype)
                table = self.fed_write(table, idx, x, slope, coef)
                return table, self.note(support, idx, x, coef)

        table, support = jax.lax.fori_loop(0, flat.segments, write, (new.table, new.support))
        new = new._replace(table=table, support=support)
        new = self.settle(new, need, h, aux, new.table, functools.partial(self.flat_dense_x, flat))
        if self.rescaled and not self.fed:

            def scale(j, st):
                idx, xt = self.segment_values(st.table, flat, j)
                return self.rescale(st, idx, xt, slope)

            new = jax.lax.fori_loop(0, flat.segments, scale, new)
        return new, p

    def predict(self, state, x):
        h = self.h_of(state.table.dtype)

        def one_p(st, hh):
            _, _, sums, _ = self.read(st.table, x)
            hh = self.effective(st.small, hh, sums["xx"])
            return self.spec.predict(st.small, sums, hh, st.t)[0]  # (projected: clip(u . x))

        if self.batched:
            return jax.vmap(one_p)(state, h)
        return one_p(state, h)

    def update(self, state, x, label):
        return self.step(state, x, label)[0]

    def weights_one(self, table, small, h):
        u = self.spec.weights(table, small, self.effective(small, h))
        return u / table[:, self.ds_col] if self.rescaled else u  # w = D^{-1/2} u

    def weights(self, state):
        h = self.h_of(state.table.dtype)
        if self.batched:
            return jax.vmap(self.weights_one)(state.table, state.small, h).T
        return self.weights_one(state.table, state.small, h)


def _scatter_one(table, idx, vals, coef):
    return table.at[idx].add(vals[:, None] * coef[None, :].astype(table.dtype), mode="drop")


# ----------------------------------------------------------------------------------------------
# The learners.


def _hyper(grid, **values) -> dict:
    """The numeric hyperparameters, broadcast to the grid (float64 NumPy; cast at use)."""
    return {k: np.broadcast_to(np.asarray(v, np.float64), grid) for k, v in values.items()}


#: The default ``alpha_scale`` (SON) and ``delta_scale`` (Ada-FD) of an automatic ridge
#: (module docstring, "Defaults").
ALPHA_SCALE = 1 / 16
DELTA_SCALE = 1.0


#: The defaults of a SON learner with diagonal rescaling (the "Defaults" of the module docstring):
#: Vowpal Wabbit's ``--OjaNewton`` (``--normalize``, ``--alpha 1``) in this module's units.
NORMALIZED_DIAGONAL_INIT = 0.4
NORMALIZED_ALPHA = 0.5
NORMALIZED_ETA = 1 / 8


def _son_defaults(alpha, alpha_scale, eta, diagonal_rescaling, diagonal_init):
    """``(alpha, automatic?, eta, rescaled, diagonal_init)`` of a SON learner's arguments: with
    diagonal rescaling an ``"auto"`` ridge is :data:`NORMALIZED_ALPHA` and ``eta=None``
    :data:`NORMALIZED_ETA`; without it they are the running scale's ridge and ``1/sqrt(t)``."""
    rescaled = _flag(diagonal_rescaling)
    check_each(_validation.ridge, "diagonal_init", diagonal_init, positive=True)
    if rescaled and isinstance(alpha, str) and alpha == "auto":
        alpha, auto = NORMALIZED_ALPHA, False
    else:
        alpha, auto = _automatic("alpha", alpha, alpha_scale)
    if eta is None:
        eta = NORMALIZED_ETA if rescaled else inverse_sqrt_time
    return alpha, auto, eta, rescaled, float(diagonal_init)


def _automatic(name: str, value, scale) -> tuple[Any, bool]:
    """``(numeric value, automatic?)`` of a ridge given as a number or ``"auto"``."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f'{name} must be a number or "auto", got {value!r}')
        check_each(_validation.ridge, f"{name}_scale", scale, positive=True)
        return 1.0, True
    return value, False


def _son_checks(alpha_name, alpha, eta, curvature, bound, sketch_size):
    _validation.size("sketch_size", sketch_size)
    if eta is not None:
        check_each(_validation.step_size, "eta", eta)
    check_each(_validation.step_size, "curvature", curvature)
    check_each(_validation.strength, "bound", bound, allow_inf=True)
    check_each(_validation.ridge, alpha_name, alpha)
    finite = np.isfinite(np.asarray(bound, np.float64))
    if np.any(finite & (np.asarray(alpha, np.float64) <= 0)):
        raise ValueError(
            f"a finite bound (SON's projection, Lemma 1) needs {alpha_name} > 0: with a zero "
            "ridge the metric is singular"
        )


#: The forms of diagonal rescaling (module docstring, "Diagonal rescaling"); ``True`` is the first.
RESCALINGS = ("fed", "metric")


def _flag(diagonal_rescaling) -> str | bool:
    """``False``, ``"fed"`` or ``"metric"`` of a ``diagonal_rescaling`` argument (``True``:
    ``"fed"``)."""
    if isinstance(diagonal_rescaling, str):
        if diagonal_rescaling not in RESCALINGS:
            raise ValueError(
                f"diagonal_rescaling must be a bool or one of {RESCALINGS}, got "
                f"{diagonal_rescaling!r}"
            )
        return diagonal_rescaling
    return "fed" if _validation.flag("diagonal_rescaling", diagonal_rescaling) else False


def _spare(spare_rows, sketch_size) -> int:
    """Stored rows beyond the sketch's (default ``sketch_size``: measured on a stream whose
    gradients the sketch mostly keeps whole, ``m = 10``, ``d = 2^16``: 4 spare rows cost 672 us
    per example in compactions, 16 cost 399, 48 cost 425)."""
    if spare_rows is None:
        return int(sketch_size)
    return _validation.size("spare_rows", spare_rows, low=0)


def fd_son(
    alpha="auto",
    sketch_size: int = 10,
    *,
    alpha_scale=ALPHA_SCALE,
    eta=None,
    curvature=0.0,
    bound=float("inf"),
    diagonal_rescaling: bool | str = True,
    diagonal_init: float = NORMALIZED_DIAGONAL_INIT,
    spare_rows: int | None = None,
    max_growth: float | None = None,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse FD-SON (SON Alg. 1 with the FD sketch of Alg. 2, in the sparse form of sec. 4):
    equals :func:`sketchopt.fd_son` (``alpha``, ``sketch_size`` rows including
    the slot, ``eta`` default ``1/sqrt(t)``, ``curvature``) with SON's projection onto
    ``|w . x| <= bound`` (:func:`sketchopt.project_bounded_prediction`; ``inf``: none), in the
    ``F Z`` form of the module docstring. ``spare_rows`` stored rows beyond ``sketch_size`` take
    gradients the sketch keeps whole (default ``sketch_size``); ``max_growth`` (default ``1e3`` in
    float32, ``1e6`` in float64) bounds the factors' round-off amplification before a compaction;
    ``diagonal_rescaling`` is SON sec. 5.2 with ``D_1 = diagonal_init I``: ``True`` or ``"fed"``
    (the default) VW's form, ``"metric"`` :func:`sketchopt.fd_son`'s (equal to it at
    ``diagonal_init=0.1``), ``False`` none (module docstring). ``alpha="auto"`` and ``eta=None``
    (the defaults): with diagonal rescaling, :data:`NORMALIZED_ALPHA` and the constant
    :data:`NORMALIZED_ETA`; without, ``alpha_scale`` times the running mean of ``|x|^2`` and
    ``1/sqrt(t)`` (module docstring, "Defaults"). A number is the dense transform's fixed
    ``alpha``."""
    alpha, auto, eta, rescaled, d1 = _son_defaults(
        alpha, alpha_scale, eta, diagonal_rescaling, diagonal_init
    )
    _son_checks("alpha", alpha, eta, curvature, bound, sketch_size)
    grid = grid_shape(alpha, bound, alpha_scale)
    spec = _fd_spec(
        "son", "md", int(sketch_size), _spare(spare_rows, sketch_size), eta=eta,
        curvature=curvature, robust=False, max_growth=max_growth,
    )  # fmt: skip
    hyper = _hyper(grid, alpha=alpha, bound=bound, alpha_scale=alpha_scale)
    return _learner("fd_son", loss, spec, hyper, grid, rescaled, "alpha" if auto else None, d1)


def rfd_son(
    sketch_size: int = 10,
    *,
    alpha0=0.0,
    eta=None,
    curvature=0.0,
    bound=float("inf"),
    diagonal_rescaling: bool = False,
    spare_rows: int | None = None,
    max_growth: float | None = None,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse RFD-SON (RFD paper Alg. 3; ``alpha0 = 0``: RFD0-SON): equals
    :func:`sketchopt.rfd_son` (``eta`` default ``1/t``); RFD's ridge grows by half of each shrink,
    a scalar, so it enters only ``f0`` and the coefficients. Options as :func:`fd_son`; a finite
    ``bound`` needs ``alpha0 > 0``."""
    _son_checks("alpha0", alpha0, eta, curvature, bound, sketch_size)
    grid = grid_shape(alpha0, bound)
    eta = inverse_time if eta is None else eta
    spec = _fd_spec(
        "son", "md", int(sketch_size), _spare(spare_rows, sketch_size), eta=eta,
        curvature=curvature, robust=True, max_growth=max_growth,
    )  # fmt: skip
    hyper = _hyper(grid, alpha=0.0, alpha0=alpha0, bound=bound)
    return _learner("rfd_son", loss, spec, hyper, grid, _flag(diagonal_rescaling))


def oja_son(
    alpha="auto",
    sketch_size: int = 10,
    *,
    alpha_scale=ALPHA_SCALE,
    eta=None,
    curvature=0.0,
    oja_learning_rate=None,
    bound=float("inf"),
    diagonal_rescaling: bool | str = True,
    diagonal_init: float = NORMALIZED_DIAGONAL_INIT,
    max_growth: float | None = None,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse Oja-SON (SON Alg. 4-5): equals :func:`sketchopt.oja_son` with the ``key`` given to
    ``init`` (default ``PRNGKey(0)``; ``Z_0`` is the dense sketch's random orthonormal ``V_0``)
    and ``oja_learning_rate`` (``Gamma_t``, default ``1/t``), with SON's projection onto
    ``|w . x| <= bound``. ``O(m s + m^3)`` per example; a compaction (``O(m^2 d)``) re-bases
    ``Z <- F Z`` when ``|F|^2 tr(K) / m`` exceeds ``max_growth``. ``alpha``, ``alpha_scale``,
    ``eta``, ``diagonal_rescaling`` and ``diagonal_init`` as :func:`fd_son`'s."""
    alpha, auto, eta, rescaled, d1 = _son_defaults(
        alpha, alpha_scale, eta, diagonal_rescaling, diagonal_init
    )
    _son_checks("alpha", alpha, eta, curvature, bound, sketch_size)
    if oja_learning_rate is not None and not callable(oja_learning_rate):
        _validation.fraction("oja_learning_rate", oja_learning_rate, low_open=True)

    def gamma(t):
        if oja_learning_rate is None:
            return 1.0 / t
        return oja_learning_rate(t) if callable(oja_learning_rate) else oja_learning_rate

    spec = _oja_spec(
        int(sketch_size), eta=eta, curvature=curvature, gamma=gamma, max_growth=max_growth
    )
    grid = grid_shape(alpha, bound, alpha_scale)
    hyper = _hyper(grid, alpha=alpha, bound=bound, alpha_scale=alpha_scale)
    return _learner("oja_son", loss, spec, hyper, grid, rescaled, "alpha" if auto else None, d1)


def rp_son(
    alpha="auto",
    sketch_size: int = 10,
    *,
    alpha_scale=ALPHA_SCALE,
    eta=None,
    curvature=0.0,
    bound=float("inf"),
    diagonal_rescaling: bool | str = True,
    diagonal_init: float = NORMALIZED_DIAGONAL_INIT,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse RP-SON (SON sec. 3): equals :func:`sketchopt.rp_son` with the ``key`` given to
    ``init`` (default ``PRNGKey(0)``: the same ``r_t``), ``O(m s + m^2)`` per example and no
    compaction ever (``S`` changes by ``r_t ghat^T`` only). ``alpha``, ``alpha_scale``,
    ``eta``, ``diagonal_rescaling`` and ``diagonal_init`` as :func:`fd_son`'s; an automatic
    ``alpha`` of the running scale (without rescaling) recomputes ``H`` from ``S S^T`` at every
    step (an ``m x m`` eigendecomposition; the prediction uses the previous step's ``H``)."""
    alpha, auto, eta, rescaled, d1 = _son_defaults(
        alpha, alpha_scale, eta, diagonal_rescaling, diagonal_init
    )
    _son_checks("alpha", alpha, eta, curvature, bound, sketch_size)
    why = "RP-SON keeps (alpha I + SS^T)^-1"
    check_each(_validation.ridge, "alpha", alpha, positive=True, why=why)
    grid = grid_shape(alpha, bound, alpha_scale)
    spec = _rp_spec(int(sketch_size), eta=eta, curvature=curvature, auto=auto)
    hyper = _hyper(grid, alpha=alpha, bound=bound, alpha_scale=alpha_scale)
    return _learner("rp_son", loss, spec, hyper, grid, rescaled, "alpha" if auto else None, d1)


#: ``rule`` names of :func:`ada_fd`.
RULES = ("mirror_descent", "dual_averaging")


def ada_fd(
    learning_rate=0.5,
    sketch_size: int = 10,
    delta="auto",
    *,
    delta_scale=DELTA_SCALE,
    rule: str = "mirror_descent",
    robust: bool = False,
    spare_rows: int | None = None,
    max_growth: float | None = None,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse ADA-FD, no regularizer: ``rule="mirror_descent"`` equals
    :func:`sketchopt.ada_fd` (Ada-FD paper Alg. 2), ``"dual_averaging"``
    :func:`sketchopt.ada_fd_dual_averaging` (Alg. 1, anchored at ``w_1 = 0``), with ``robust``
    the RFD sketch (RFD paper Alg. 2). ``delta`` is also ``1/`` the step outside the sketch, so
    on sparse data with ``m << d`` it wants to be of the gradients' scale: ``"auto"`` (the
    default) is ``delta_scale`` times the root of the running mean of ``|x|^2`` (module
    docstring, "Defaults"); a number is the dense transform's fixed ``delta``.
    Options as :func:`fd_son`."""
    delta, auto = _automatic("delta", delta, delta_scale)
    check_each(_validation.step_size, "learning_rate", learning_rate, positive=True)
    check_each(_validation.ridge, "delta", delta, positive=True)
    _validation.size("sketch_size", sketch_size)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    robust = _validation.flag("robust", robust)
    grid = grid_shape(learning_rate, delta, delta_scale)
    spec = _fd_spec(
        "ada_fd", "md" if rule == RULES[0] else "da", int(sketch_size),
        _spare(spare_rows, sketch_size), eta=learning_rate, curvature=0.0, robust=robust,
        max_growth=max_growth,
    )  # fmt: skip
    hyper = _hyper(grid, delta=delta, delta_scale=delta_scale)
    if not callable(learning_rate):  # a constant (or a grid of them) is a hyperparameter
        hyper |= _hyper(grid, learning_rate=learning_rate)
    return _learner("ada_fd", loss, spec, hyper, grid, auto="delta" if auto else None)


#: The second-order learners by the CLI's ``--learner`` names.
SECOND_ORDER: dict[str, Callable[..., LinearLearner]] = {
    "oja_son": oja_son,
    "fd_son": fd_son,
    "rfd_son": rfd_son,
    "rp_son": rp_son,
    "ada_fd": ada_fd,
}
