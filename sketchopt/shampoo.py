r"""Sketched Shampoo: the Kronecker-factored family in one module.

Shampoo (Gupta, Koren & Singer 2018, "Shampoo: Preconditioned Stochastic Tensor Optimization", ICML,
Alg. 1) preconditions a matrix-shaped leaf with gradient ``G_t`` (``m x n``) by two statistics, the
left ``L_t = sum_s G_s G_s^T`` (``m x m``) and the right ``R_t = sum_s G_s^T G_s`` (``n x n``), each
started at ``delta I``, and steps ``-eta L_t^{-1/4} G_t R_t^{-1/4}``. Its memory, ``m^2 + n^2``
floats per layer, is what Sketchy (Feinberg, Chen, Sun, Anil & Hazan 2023, "Sketchy:
Memory-efficient Adaptive Regularization with Frequent Directions", NeurIPS) removes: each statistic
is kept as a frequent-directions sketch of ``k`` rows, ``O(k (m + n))`` memory, and its inverse root
is read off the sketch's orthogonal rows, with no ``m x m`` factorization. Here each side is an FD
sketch or, by default, an RFD sketch (Luo, Chen, Zhang, Li & Zhang 2019, ``shared/papers/002``, Alg.
2: FD plus the ridge ``alpha I`` that takes half of each shrinkage), so that the preconditioner is
``(B^T B + alpha I + delta I)^{-p}`` on each side. With both sketches exact (``sketch_size >= max(m,
n)``) and no ``decay`` the step is full-matrix Shampoo's, Alg. 1, with epsilon ``delta``.

The ICML 2025 paper of Yang, Wan et al., "Dimension-Free Adaptive Subgradient Methods with
Frequent Directions", analyses an FD-Shampoo of the same shape (an FD sketch per Kronecker
factor) with a dimension-free regret and a fast FD at ``O(tau d)`` per round. Its text is not
among the project's papers, and nothing here is checked against its algorithms: the way a
gradient enters a sketch (in blocks of columns, or through a randomized range finder) is this
package's own, described in :mod:`sketchopt.kron`.

What the family is made of, and where (the layers of ``tests/test_layout.py``):

* :mod:`sketchopt.kron`, below the driver -- the factor sketches and their inverse roots:
  ``FactorState``, how a gradient's columns and rows enter a sketch (``streams``, ``absorb``,
  ``absorb_lazily``), ``inverse_root``, ``default_factoring`` and the leaf state
  :class:`KronMetricState` (documented and pickled as ``sketchopt.metrics.KronMetricState``);
* :class:`sketchopt.operators.KroneckerOperator` -- ``H^{-1} y = vec(L^{-p} Y R^{-q})``;
* this module, above :mod:`sketchopt.metrics` and :mod:`sketchopt.rules` (as
  :mod:`sketchopt.son` is) -- the metric :func:`kron_sketched` (a
  :class:`sketchopt.metrics.Metric`), the grafts that set its step's size
  (:data:`GRAFTS`: :class:`GraftedOperator`, the norm of a diagonal method's step, Agarwal, Anil,
  Hazan, Koren & Zhang 2020; :class:`NormalizedOperator`, a fixed root-mean-square per layer,
  Distributed Shampoo's ``SQRT_N`` grafting) and the named transform :func:`kron_fd`, composite
  mirror descent (:func:`sketchopt.rules.mirror_descent`) on that metric.

A network's optimizer, at AdamW's learning rate (Nesterov momentum 0.9 included, sketches and
roots refreshed every 10 steps; ``kron_fd(..., momentum=None, graft=None, update_every=1,
refresh_every=1)`` is Shampoo's sketched step alone)::

    tx = sketchopt.kron_fd(1e-3)

Old import paths keep working and give the same objects: ``sketchopt.kron_fd`` and
``sketchopt.aliases.kron_fd`` (re-exports: :mod:`sketchopt.aliases` builds on the rules as this
module does); ``sketchopt.metrics.kron_sketched``, ``GRAFTS``, ``DIAGONAL_GRAFTS``,
``NormalizedOperator``, ``GraftedOperator`` and ``check_exponents``: :mod:`sketchopt.metrics` sits
below this module, so it reads them from here when first asked (a module ``__getattr__``, PEP
562), never at import.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax import ScalarOrSchedule

from sketchopt import _leafwise, _numerics, _validation
from sketchopt import kron as _kron
from sketchopt import rules as _rules
from sketchopt._numerics import flat_size, state_dtype
from sketchopt.metrics import KronMetricState, Metric, check_delta, refuse_complex
from sketchopt.operators import DiagonalOperator, KroneckerOperator
from sketchopt.rules import mirror_descent

__all__ = [
    "GRAFTS",
    "GraftedOperator",
    "KronFDState",
    "KronMetricState",
    "NormalizedOperator",
    "kron_fd",
    "kron_sketched",
]


# ----------------------------------------------------------------------------------------------
# The grafts: how large a factored step is.


GRAFTS = ("adagrad", "rmsprop", "adam", "rms")
#: ``kron_fd``'s default ``update_every`` and ``refresh_every``: its sketches absorb a gradient,
#: and its inverse roots are recomputed, every this many steps (chosen by the time-to-target
#: benchmark, ``experiments/time_to_target.py``).
PERIOD = 10
#: The grafts that keep a diagonal statistic of every parameter (``"rms"`` keeps none).
DIAGONAL_GRAFTS = ("adagrad", "rmsprop", "adam")


class NormalizedOperator(NamedTuple):
    """``H^{-1} y``: the direction of ``inner.solve(y)`` at the root-mean-square ``rms`` per
    layer (``layers`` rows of a stacked leaf, else the whole leaf): ``rms sqrt(n) s / |s|`` for
    ``s = inner.solve(y)`` of ``n`` entries, and ``0`` where ``s = 0``. Distributed Shampoo's
    ``SQRT_N`` grafting scaled by ``rms``, the way Muon-style optimizers set their step to
    AdamW's update size (Liu et al. 2025, "Muon is Scalable for LLM Training", sec. 2.2)."""

    inner: Any
    rms: Any  # a scalar
    layers: int  # static: 0 for a leaf that is not stacked

    def solve(self, y):
        s = self.inner.solve(y)
        # A leaf in its own shape is normed over its axes (a stacked one's layers along the
        # first) without the reshape, which on a TPU or GPU would relayout a tiled matrix.
        stacked = self.layers and s.ndim > 1 and s.shape[0] == self.layers
        rows = s if stacked or not self.layers else jnp.reshape(s, (self.layers, -1))
        axes = tuple(range(1 if self.layers else 0, rows.ndim))
        norm = _numerics.safe_norm(rows, axis=axes, keepdims=True)
        size = math.prod(rows.shape[a] for a in axes)
        target = jnp.asarray(self.rms, s.dtype) * jnp.sqrt(jnp.asarray(size, s.dtype))
        scale = jnp.where(norm > 0, target / jnp.where(norm > 0, norm, 1), 0)
        return jnp.reshape(rows * scale, s.shape)


class GraftedOperator(NamedTuple):
    """``H^{-1} y``: the factored direction ``K y`` rescaled to the norm of the diagonal method's
    ``D y`` (with ``graft``: layer-wise grafting, Agarwal, Anil, Hazan, Koren & Zhang 2020), or
    ``D y`` itself before the start step (``use_factored`` false; Shampoo's
    ``start_preconditioning_step``)."""

    factored: Any  # KroneckerOperator
    diagonal: Any  # DiagonalOperator
    use_factored: Any  # bool scalar
    graft: bool

    def solve(self, y):
        d = self.diagonal.solve(y)
        k = self.factored.solve(y)
        if self.graft:
            norm_k, norm_d = _numerics.safe_norm(k), _numerics.safe_norm(d)
            k = k * jnp.where(norm_k > 0, norm_d / jnp.where(norm_k > 0, norm_k, 1), 0)
        return jnp.where(self.use_factored, k, d)


# ----------------------------------------------------------------------------------------------
# The metric: Shampoo's two statistics, each an FD/RFD sketch.


def check_exponents(exponents):
    """The pair ``(p, q)`` of inverse-root powers, each a positive number (traced values pass)."""
    if len(exponents) != 2:
        raise ValueError(f"exponents must be a pair (p, q), got {exponents!r}")
    return tuple(
        _validation.scalar(f"exponents[{i}]", e, low_open=True, why="an inverse root")
        for i, e in enumerate(exponents)
    )


def kron_sketched(
    sketch_size: int,
    delta: float = 1e-6,
    *,
    robust: bool = True,
    exponents: tuple[float, float] = (0.25, 0.25),
    decay: float | None = None,
    update_every: int = 1,
    refresh_every: int = 1,
    start_step: int = 0,
    graft: str | None = None,
    graft_decay: float = 0.999,
    graft_eps: float = 1e-8,
    block_size: int | None = None,
    compress: str = "auto",
    relative_delta: bool = False,
    stacked: str | tuple[str, ...] = (),
    factoring: Callable[[str, tuple[int, ...]], Any] | None = None,
    graft_rms: float = 0.35,
    refresh_tolerance: float | None = None,
) -> Metric:
    r"""Shampoo's Kronecker-factored metric with each factor kept as an FD/RFD sketch.

    For a leaf that ``factoring`` sees as an ``m x n`` matrix ``G``: one sketch of the left
    statistic ``L_t = sum_s G_s G_s^T`` and one of the right ``R_t = sum_s G_s^T G_s``, each of
    ``min(sketch_size, side)`` rows, and ``H_t^{-1} g = vec((L_t + delta I)^{-p} G (R_t + delta
    I)^{-q})`` with ``(p, q) = exponents``, ``L_t, R_t`` the sketches (plus RFD's ridge with
    ``robust``). State ``O(k (m + n))`` per layer. How a whole gradient enters a sketch without an
    ``m x n`` SVD, and what differs from Sketchy, is in :mod:`sketchopt.kron`. While both sketches
    are exact (``sketch_size >= max(m, n)``) and without ``decay``, this is full-matrix Shampoo
    (Gupta et al. 2018, Alg. 1) with epsilon ``delta``. A leaf that is not factored (vectors,
    scalars, a side longer than :data:`sketchopt.kron.MAX_SIDE`) gets the diagonal method:
    ``(sum g^2 + delta)^{-1/2} g``, Shampoo's rule for a vector, or the ``graft`` method.

    Conventions that differ from :func:`sketchopt.metrics.sketched` (ADA-FD): the ridge is inside
    the root, as in Shampoo (``(C + delta I)^{-1/4}``, not ``delta I + C^{1/2}``), and
    ``robust=True`` is the default (RFD's ridge stands in for Sketchy's escaped-mass tail).

    Args:
      sketch_size: ``k >= 1`` rows per side.
      delta: ``delta >= 0``, added to every eigenvalue of each side before the root (0: the
        pseudo-inverse on each side's range).
      robust: sketch with RFD (ridge ``alpha``, half of each shrinkage) rather than FD.
      exponents: ``(p, q) > 0``, the powers of the left and right inverse roots (Shampoo:
        ``1/4`` each for a matrix).
      decay: ``None`` (sums, as Shampoo and AdaGrad) or ``beta2`` in ``(0, 1]``: the statistics
        are multiplied by ``beta2`` before each update, as Sketchy's ``second_moment_decay``.
      update_every: the statistics absorb the gradient at steps ``0, N, 2N, ...`` only.
      refresh_every: the inverse roots are recomputed at steps ``0, K, 2K, ...`` and reused in
        between (Shampoo's ``preconditioning_compute_steps``).
      start_step: before this step the diagonal method steps (the statistics accumulate from
        step 0, as Shampoo's ``start_preconditioning_step``).
      graft: ``None``, ``"adagrad"``, ``"rmsprop"``, ``"adam"`` or ``"rms"``: each factored
        step is rescaled to the norm of that diagonal method's step ``g / (sqrt(v) + graft_eps)``,
        with ``v`` the sum of ``g^2`` (AdaGrad), its EMA with ``graft_decay`` (RMSProp) or that
        EMA bias-corrected (Adam's second moment; momentum is left to ``optax.chain``). The same
        method is then the fallback of the leaves that are not factored and the step before
        ``start_step``. ``"rms"`` keeps no per-parameter statistic: every step (the factored
        one, and Shampoo's vector rule on the leaves that are not factored) is rescaled to the
        root-mean-square ``graft_rms`` per layer (:class:`NormalizedOperator`).
      graft_decay: ``beta2`` of the RMSProp/Adam graft.
      graft_eps: the graft's ``eps`` (outside the square root, as Optax's Adam).
      block_size: how many of ``G``'s columns (rows) enter a sketch per small ``eigh``
        (default ``k``; :mod:`sketchopt.kron`).
      compress: how a gradient enters the sketches (:func:`sketchopt.kron.streams`):
        ``"blocks"`` (exact: all columns and rows, ``ceil(n / block_size)`` small ``eigh`` calls
        per side), ``"range"`` (a randomized range finder to ``k + 8`` vectors per side, one
        ``eigh``; RFD's ridge takes half the estimated residual) or ``"auto"`` (exact while a
        side takes at most :data:`sketchopt.kron.EXACT_BLOCKS` blocks).
      relative_delta: ``delta`` is relative to each side's largest eigenvalue.
      stacked: key-path prefixes (``jax.tree_util.keystr`` form, e.g. ``"['layers']"``) whose
        leaves carry a leading layer axis (scanned layers): each layer gets its own pair of
        sketches, stepped by one ``vmap``, not one sketch across layers.
      factoring: ``factoring(path, shape) -> Factoring(rows, cols, layers) | None``, how a leaf
        is seen as a matrix (or a stack of ``layers`` matrices); ``None`` for the diagonal
        fallback. Default :func:`sketchopt.kron.default_factoring` (with ``stacked``):
        ``prod(shape[:-1]) x shape[-1]``. Override it per leaf by a callable that reads the
        path, e.g. ``lambda path, shape: None if "embed" in path else default(path, shape)``.
      graft_rms: the root-mean-square of each layer's step with ``graft="rms"`` (``> 0``).
      refresh_tolerance: ``None`` (every block refreshes the sketch's basis by FD's
        eigendecomposition) or ``tol >= 0``: a block whose statistic the present basis still
        diagonalizes to the relative Frobenius error ``tol`` is taken in that basis without
        one (:func:`sketchopt.kron.absorb_lazily`; Shampoo's and SOAP's lazy refresh), counted
        in the state's ``kept``. The inverse roots need no factorization either way (the
        sketch's rows are orthogonal). ``1e-2`` to ``1e-1`` skips most refreshes once the
        statistic has settled; the batched solver call is then skipped on the steps where no
        leaf needs it (batched factorizations: :func:`sketchopt.batched_solves`).

    Returns:
      A :class:`Metric` (``"kron_fd"`` or ``"kron_rfd"``) with a :class:`KronMetricState`;
      its operator is a :class:`~sketchopt.operators.KroneckerOperator` (a
      :class:`GraftedOperator` with ``graft`` or ``start_step``, a
      :class:`~sketchopt.operators.DiagonalOperator` for a leaf that is not factored): no
      regularizer.

    References:
      Gupta, Koren & Singer (2018), "Shampoo: Preconditioned Stochastic Tensor Optimization",
      ICML, Alg. 1; Feinberg, Chen, Sun, Anil & Hazan (2023), "Sketchy: Memory-efficient Adaptive
      Regularization with Frequent Directions", NeurIPS; Luo et al. (2019), "Robust Frequent
      Directions with Application in Online Learning", JMLR 20, Alg. 2; Agarwal, Anil, Hazan,
      Koren & Zhang (2020), "Disentangling Adaptive Gradient Methods from Learning Rates"
      (grafting).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> from sketchopt import shampoo
      >>> tx = so.mirror_descent(1.0, shampoo.kron_sketched(4, delta=0.0))
      >>> g = jnp.array([[4.0, 0.0], [0.0, 0.0]])  # L = R = diag(16, 0): 16^-1/4 4 16^-1/4 = 1
      >>> tx.update(g, tx.init(jnp.zeros((2, 2))))[0]
      Array([[-1., -0.],
             [-0., -0.]], dtype=float32)
    """
    k = _validation.size("sketch_size", sketch_size)
    delta = check_delta(delta, allow_zero=True)
    robust = _validation.flag("robust", robust)
    p, q = check_exponents(exponents)
    update_every = _validation.size("update_every", update_every)
    refresh_every = _validation.size("refresh_every", refresh_every)
    start_step = _validation.size("start_step", start_step, low=0)
    if graft not in (None, *GRAFTS):
        raise ValueError(f"graft must be None or one of {GRAFTS}, got {graft!r}")
    graft_decay = _validation.fraction("graft_decay", graft_decay, low_open=True)
    graft_eps = _validation.ridge("graft_eps", graft_eps)
    graft_rms = _validation.scalar("graft_rms", graft_rms, low_open=True, why="a step size")
    block = k if block_size is None else _validation.size("block_size", block_size)
    if compress not in ("auto", "blocks", "range"):
        raise ValueError(f"compress must be 'auto', 'blocks' or 'range', got {compress!r}")
    if decay is not None:
        decay = _validation.fraction("decay", decay, low_open=True)
    relative_delta = _validation.flag("relative_delta", relative_delta)
    if refresh_tolerance is not None:
        refresh_tolerance = _validation.scalar("refresh_tolerance", refresh_tolerance)
    stacked = (stacked,) if isinstance(stacked, str) else tuple(stacked)
    given_factoring = factoring  # the spec keys on it (a fresh partial would never compare equal)
    if factoring is None:
        factoring = functools.partial(_kron.default_factoring, stacked=stacked)
    elif stacked:
        raise ValueError("give stacked to the default factoring only (a factoring decides itself)")

    kron = _KronSketched(
        k, delta, robust, (p, q), decay, update_every, refresh_every, start_step, graft,
        graft_decay, graft_eps, block, compress, relative_delta, factoring, graft_rms,
        refresh_tolerance,
    )  # fmt: skip
    spec = _validation.spec_key(
        "kron_sketched",
        k,
        delta,
        robust,
        (p, q),
        decay,
        update_every,
        refresh_every,
        start_step,
        graft,
        graft_decay,
        graft_eps,
        block,
        compress,
        relative_delta,
        stacked,
        given_factoring,
        graft_rms,
        refresh_tolerance,
    )
    name = "kron_rfd" if robust else "kron_fd"
    return Metric(
        kron.init, kron.update, kron.operator, name, spec, hyper=kron.hyper,
        path_key=kron.factored_as, phases=kron.phases(), shaped=True,
    )  # fmt: skip


#: ``(absorb, refresh)`` in the order of :meth:`_KronSketched.phases`'s branch code.
_PHASE_CODES = ((False, False), (False, True), (True, False), (True, True))


class _KronSketched:
    """The functions of :func:`kron_sketched`'s metric, one method each, on its checked
    arguments: the sketches of both sides (:meth:`init`, :meth:`step_one`: Shampoo's
    statistics, Gupta et al. 2018 Alg. 1 lines 4-5, as FD/RFD sketches), their inverse roots
    (:meth:`roots_of`, Alg. 1 line 6) and the diagonal method of the leaves not factored and of
    the graft (:meth:`diagonal_update`, :meth:`diagonal_operator`)."""

    def __init__(
        self, k, delta, robust, exponents, decay, update_every, refresh_every, start_step, graft,
        graft_decay, graft_eps, block, compress, relative_delta, factoring, graft_rms,
        refresh_tolerance=None,
    ):  # fmt: skip
        self.refresh_tolerance = refresh_tolerance
        self.k, self.delta, self.robust, self.exponents = k, delta, robust, exponents
        self.decay, self.update_every, self.refresh_every = decay, update_every, refresh_every
        self.start_step, self.graft, self.graft_decay = start_step, graft, graft_decay
        self.graft_eps, self.block, self.compress = graft_eps, block, compress
        self.relative_delta, self.factoring = relative_delta, factoring
        self.graft_rms = graft_rms
        self.needs_diag = graft in DIAGONAL_GRAFTS or start_step > 0

    def factored_as(self, path, shape):
        shape = (shape,) if isinstance(shape, int) else tuple(int(x) for x in shape)
        out = self.factoring(path, shape)
        if out is not None and max(out.layers, 1) * out.rows * out.cols != flat_size(shape):
            raise ValueError(f"factoring({path!r}, {shape}) = {out}: not {shape}'s size")
        return out

    def init(self, shape, dtype=jnp.float32, *, path=""):
        refuse_complex("kron_rfd" if self.robust else "kron_fd", dtype)
        dtype = state_dtype(dtype)
        factored = self.factored_as(path, shape)
        diag = jnp.zeros((flat_size(shape),), dtype)
        if factored is None:
            return KronMetricState(None, None, diag, None)

        def one(_):
            left = _kron.factor_init(self.k, factored.rows, dtype)
            right = _kron.factor_init(self.k, factored.cols, dtype)
            roots = None if self.refresh_every == 1 else self.roots_of(left, right)
            kept = None if self.refresh_tolerance is None else jnp.zeros((2,), jnp.int32)
            return left, right, roots, kept

        if factored.layers:  # one sketch per layer of a stacked leaf
            left, right, roots, kept = jax.vmap(one)(jnp.arange(factored.layers))
        else:
            left, right, roots, kept = one(None)
        return KronMetricState(left, right, diag if self.needs_diag else None, roots, kept)

    def root_of(self, side, power):
        return _kron.inverse_root(side, power, self.delta, relative=self.relative_delta)

    def roots_of(self, left, right):
        """The inverse roots ``((L + delta I)^{-p}, (R + delta I)^{-q})`` of both sides."""
        return _kron.inverse_roots(
            (left, right), self.exponents, self.delta, relative=self.relative_delta
        )

    def diagonal_update(self, v, g, count):
        """The diagonal method's root statistic after ``g`` (overflow-free ``hypot`` forms)."""
        if self.graft in ("rmsprop", "adam"):
            beta = jnp.asarray(self.graft_decay, g.dtype)
            return jnp.hypot(jnp.sqrt(beta) * v, jnp.sqrt(1 - beta) * g)
        if self.decay is not None:
            v = v * jnp.sqrt(jnp.asarray(self.decay, g.dtype))
        return jnp.hypot(v, g)

    def normalized(self, op, layers=0):
        """``op`` at the step size ``graft_rms`` with ``graft="rms"``, else ``op`` itself."""
        return NormalizedOperator(op, self.graft_rms, layers) if self.graft == "rms" else op

    def fallback_operator(self, v, count):
        """The step of a leaf that is not factored: the diagonal method, normalized."""
        return self.normalized(self.diagonal_operator(v, count))

    def diagonal_operator(self, v, count):
        if self.graft not in DIAGONAL_GRAFTS:  # Shampoo's vector rule, (sum g^2 + delta)^{-1/2}
            return DiagonalOperator(jnp.hypot(v, jnp.sqrt(jnp.asarray(self.delta, v.dtype))))
        if self.graft == "adam":  # sqrt of the bias-corrected second moment
            t = jnp.asarray(count, v.dtype) + 1
            v = v / jnp.sqrt(1 - jnp.asarray(self.graft_decay, v.dtype) ** t)
        return DiagonalOperator(v + jnp.asarray(self.graft_eps, v.dtype))

    def combine(self, kron_op, diag, count):
        layers = kron_op.left.basis.shape[0] if kron_op.left.basis.ndim == 3 else 0
        kron_op = self.normalized(kron_op, layers)
        if not self.needs_diag:
            return kron_op
        use = jnp.asarray(count, jnp.int32) >= self.start_step
        op = self.fallback_operator(diag, count)
        return GraftedOperator(kron_op, op, use, self.graft in DIAGONAL_GRAFTS)

    def operator(self, state, count=0):
        """``H`` as ``update`` returned it at step ``count`` (the state does not keep the step:
        only the Adam graft's bias correction and ``start_step`` read it)."""
        if state.left is None:
            return self.fallback_operator(state.diag, count)
        roots = state.roots
        if roots is None:
            roots = self.roots_of(state.left, state.right)
        return self.combine(KroneckerOperator(*roots), state.diag, count)

    def absorbed(self, mat, count, sides):
        """Both sides' sketches after the gradient ``mat`` (:func:`sketchopt.kron.streams`,
        :func:`sketchopt.kron.absorb_sides`)."""
        key = jax.random.fold_in(jax.random.PRNGKey(0), count)
        streams = _kron.streams(
            mat, sketch_size=self.k, block_size=self.block, compress=self.compress, key=key
        )
        opts = dict(block_size=self.block, robust=self.robust, decay=self.decay)
        if self.refresh_tolerance is None:
            return _kron.absorb_sides(tuple(sides), tuple(streams), **opts), None
        pairs = zip(sides, streams, strict=True)
        tol = self.refresh_tolerance
        out = [_kron.absorb_lazily(side, stream, tolerance=tol, **opts) for side, stream in pairs]
        return tuple(side for side, _ in out), jnp.stack([n for _, n in out])

    def phases(self):
        """The update's static forms, ``(absorb, refresh)`` at step ``t``: ``t % update_every
        == 0`` and ``t % refresh_every == 0`` (:class:`sketchopt._leafwise.Phases`; ``None``
        when every step does both). Step 0 does both; neither, when both periods exceed 1
        (step 1); only one, when the other's period does not divide its own (step ``N`` or
        ``K``)."""
        n, k = self.update_every, self.refresh_every
        if n == k == 1:
            return None
        reachable = [(True, True), (False, False) if min(n, k) > 1 else None]
        reachable += [(True, False) if n % k else None, (False, True) if k % n else None]
        variants = tuple(v for v in reachable if v is not None)
        code = [variants.index(v) if v in variants else 0 for v in _PHASE_CODES]

        def index(count):
            absorb, refresh = count % n == 0, count % k == 0
            return jnp.asarray(code, jnp.int32)[2 * absorb.astype(jnp.int32) + refresh]

        return _leafwise.Phases(variants, index)

    def step_one(self, left, right, roots, kept, mat, valid, count, phase=None):
        """One matrix's sketches after ``mat``, the inverse roots to step with, and the count of
        blocks taken in the old basis (``refresh_tolerance``). ``phase``, the driver's static
        ``(absorb, refresh)`` (:meth:`phases`), or ``None``: a ``lax.cond`` on the count."""
        sides = (left, right), kept
        absorbed = functools.partial(self.absorbed, mat, count)

        def counted(carry):
            new, n = absorbed(carry[0])
            return new, None if carry[1] is None else carry[1] + n

        if self.update_every == 1 or (phase is not None and phase[0]):
            new = counted(sides)  # no cond: its factorizations join the batched calls
        elif phase is not None:
            new = sides
        else:
            new = jax.lax.cond(count % self.update_every == 0, counted, lambda s: s, sides)
        (left, right), kept = jax.tree.map(lambda a, b: jnp.where(valid, a, b), new, sides)
        if self.refresh_every == 1:
            return left, right, None, kept, self.roots_of(left, right)
        if phase is None:
            fresh = jax.lax.cond(
                count % self.refresh_every == 0,
                lambda: self.roots_of(left, right),
                lambda: roots,
            )
        elif phase[1]:
            fresh = self.roots_of(left, right)
        else:
            return left, right, roots, kept, roots
        roots = jax.tree.map(lambda a, b: jnp.where(valid, a, b), fresh, roots)
        return left, right, roots, kept, roots

    def update(self, state, g, valid=True, *, hyper, phase=None):
        count = hyper
        diag = state.diag
        if diag is not None:  # stored flat; g comes in the leaf's shape (Metric.shaped) or flat
            diag = jnp.where(
                valid, self.diagonal_update(diag, jnp.reshape(g, diag.shape), count), diag
            )
        shaped_diag = None if diag is None else jnp.reshape(diag, g.shape)
        if state.left is None:
            return state._replace(diag=diag), self.fallback_operator(shaped_diag, count), None
        m, n = state.left.rows.shape[-1], state.right.rows.shape[-1]
        dtype = state.left.rows.dtype
        stacked = state.left.rows.ndim == 3
        # Under a mesh each side's sketch is split along its own axis (sharding.group_specs); the
        # gradient is laid out to match (a no-op for a leaf split along its leading axis).
        mat = jnp.reshape(g, (-1, m, n) if stacked else (m, n)).astype(dtype)
        mat = _kron.match_sides(mat, state.left.rows, state.right.rows)
        step = functools.partial(self.step_one, valid=valid, count=count, phase=phase)
        if stacked:
            step = jax.vmap(step)
        left, right, roots, kept, current = step(
            state.left, state.right, state.roots, state.kept, mat
        )
        op = self.combine(KroneckerOperator(*current), shaped_diag, count)
        return KronMetricState(left, right, diag, roots, kept), op, None

    @staticmethod
    def hyper(count):
        return jnp.asarray(count, jnp.int32)


# ----------------------------------------------------------------------------------------------
# The named transform.


@_leafwise.compiled
def kron_fd(
    learning_rate: ScalarOrSchedule,
    sketch_size: int = 32,
    *,
    delta: float = 1e-6,
    robust: bool = True,
    exponents: tuple[float, float] = (0.25, 0.25),
    decay: float | None = None,
    update_every: int | None = None,
    refresh_every: int | None = None,
    start_step: int | None = None,
    graft: str | None = "rms",
    graft_decay: float = 0.999,
    graft_eps: float = 1e-8,
    block_size: int | None = None,
    compress: str = "auto",
    relative_delta: bool = False,
    stacked: str | tuple[str, ...] = (),
    factoring: Any = None,
    graft_rms: float = 1.0,
    refresh_tolerance: float | None = None,
    momentum: float | None = 0.9,
    nesterov: bool = True,
) -> optax.GradientTransformationExtraArgs:
    """Sketched Shampoo for network layers: ``-eta (L_t + delta I)^{-1/4} G_t (R_t + delta
    I)^{-1/4}`` per matrix-shaped leaf, ``L_t`` and ``R_t`` RFD (``robust``) or FD sketches of
    ``sum G G^T`` and ``sum G^T G`` with ``sketch_size`` rows each, with Nesterov momentum.

    Start at AdamW's learning rate or half a decade lower (``learning_rate=0.01`` on the digits
    MLP of the defaults page, where Adam's best is 0.03; on its CNN and transformer the best rate
    is Adam's): the default RMS graft gives each layer Adam's update size and the momentum is an
    average, so AdamW's rates carry over (the README's "Choosing a learner").

    Composite mirror descent on :func:`kron_sketched`, then momentum on its steps; with both
    sketches exact (``sketch_size >= max(m, n)``), no ``decay``, ``update_every=1`` and
    ``refresh_every=1`` the mirror-descent step is full-matrix Shampoo's with epsilon ``delta``
    (Gupta et al. 2018, Alg. 1), and ``momentum=None, graft=None, update_every=1,
    refresh_every=1`` is that step alone: Sketchy's sketched Shampoo. Conv kernels ``(kh, kw,
    cin, cout)`` are ``(kh*kw*cin) x cout``; vectors and scalars take the diagonal step
    (``factoring``).

    The defaults were chosen by the time-to-target benchmark (``python experiments/run.py
    time_to_target``: steps and seconds to AdamW's final loss on a byte-level transformer, the
    Ada-FD paper's MNIST CNN and a deep autoencoder, against AdamW, Muon, Shampoo and PSGD; the
    networks benchmark page). ``momentum=0.9`` with ``nesterov`` averages the steps (one buffer
    per parameter, Muon's class: 0.53x Adam's state on a 24-layer width-1536 transformer with
    the sketches); without it ``kron_fd`` did not reach AdamW's loss on the transformer in the
    same steps. ``update_every=10`` and ``refresh_every=10`` (``PERIOD``): the sketches and roots
    every step took 1.6-10x AdamW's step time on a CPU (small ``eigh`` calls per layer and side),
    every 10 steps 1.2-2.7x, for a few percent more final loss (the update is one
    ``lax.switch`` between a refresh step and a step with the stored roots, so that the
    refresh's factorizations stay batched on an accelerator). ``graft="rms"`` sets
    every layer's step to the root-mean-square ``graft_rms * learning_rate`` (Distributed
    Shampoo's ``SQRT_N`` grafting, Muon-style optimizers' matched update RMS), with no
    per-parameter state; ``graft_rms = 1.0`` puts the best rate with momentum on AdamW's (0.35,
    the size without momentum, put it half a decade above). Shampoo's step, whose size follows
    the gradients' scale, is ``graft=None``, and ``graft="adam"`` takes the norm of Adam's step
    (one float per parameter more: the best tuned configuration, beyond the state budget of the
    defaults). Evidence: the networks and defaults pages of the documentation.

    Args:
      learning_rate: ``eta``, a float or an Optax schedule.
      sketch_size: ``k >= 1`` rows per side (default 32: under 2% of Adam's state on a 24-layer
        width-1536 transformer).
      delta: the epsilon inside each root (``>= 0``).
      robust: RFD's ridge (default) or plain FD.
      exponents, decay, start_step, graft: see the next entry.
      update_every, refresh_every: the sketches absorb the gradient, and the roots are
        recomputed, every this many steps; ``None`` (default): :data:`PERIOD`, 10 (``1``: every
        step, as :func:`kron_sketched`'s defaults and Shampoo's Alg. 1).
      graft_decay, graft_eps, graft_rms, block_size, compress, relative_delta, stacked: options
        of :func:`kron_sketched`, each off by default (``graft_rms = 1.0`` is
        the size of the default graft's step).
      refresh_tolerance: ``None`` (default) or ``tol >= 0``: a sketch skips its
        eigendecomposition while its basis still diagonalizes the statistic to the relative
        error ``tol``, counted in the state (:func:`kron_sketched`).
      momentum: ``None`` (no momentum: the mirror-descent step itself) or ``0 <= beta < 1``
        (default 0.9): the steps averaged (:func:`sketchopt.rules.momentum_rule`), one
        float32 buffer per parameter, inside the non-finite guard (state :class:`KronFDState`).
      nesterov: Nesterov's form of that average (default ``True``; read only with a
        ``momentum``), debiased as the other form is: a repeated step is taken at its size
        from the first round.
      factoring: as :func:`kron_sketched`. The three step counts
        ``update_every``, ``refresh_every`` and ``start_step`` fix the compiled program, so they
        must be static: their default ``None`` (10, 10 and ``kron_sketched``'s 0) is, and so under
        ``optax.inject_hyperparams(sketchopt.kron_fd, static_args=("sketch_size",))``
        the defaults work as in every other transform; a value given there must be named in
        ``static_args`` too (or use :func:`sketchopt.inject_hyperparams`, which keeps every
        ``int`` static).

    Returns:
      An ``optax.GradientTransformationExtraArgs``.

    References:
      Gupta, Koren & Singer (2018), "Shampoo", ICML, Alg. 1; Feinberg et al. (2023), "Sketchy",
      NeurIPS; Luo et al. (2019), "Robust Frequent Directions", JMLR 20, Alg. 2.

    Examples:
      Shampoo's own step (``momentum=None, graft=None``):

      >>> import jax.numpy as jnp, sketchopt as so
      >>> tx = so.kron_fd(0.1, sketch_size=8, delta=0.0, graft=None, momentum=None)
      >>> params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
      >>> grads = {"w": jnp.array([[4.0, 0], [0, 0], [0, 0]]), "b": jnp.array([3.0, -4.0])}
      >>> updates, state = tx.update(grads, tx.init(params))
      >>> updates["w"][0, 0], updates["b"]  # 16^-1/4 4 16^-1/4 = 1; g / |g| per coordinate
      (Array(-0.1, dtype=float32), Array([-0.1,  0.1], dtype=float32))

      At the defaults every layer's step has the root-mean-square ``learning_rate``, and the
      debiased Nesterov average of a repeated step is that step from the first round:

      >>> tx = so.kron_fd(1e-3)
      >>> updates, state = tx.update(grads, tx.init(params))
      >>> jnp.sqrt(jnp.mean(updates["w"] ** 2)).round(6)
      Array(0.001, dtype=float32)
      >>> for _ in range(50):
      ...     updates, state = tx.update(grads, state)
      >>> jnp.sqrt(jnp.mean(updates["w"] ** 2)).round(6)
      Array(0.001, dtype=float32)
    """
    nesterov = _validation.flag("nesterov", nesterov)
    if momentum is not None:
        momentum = _validation.scalar("momentum", momentum, high=1.0, high_open=True)
    update_every = PERIOD if update_every is None else update_every
    refresh_every = PERIOD if refresh_every is None else refresh_every
    counts = dict(update_every=update_every, refresh_every=refresh_every, start_step=start_step)
    metric = kron_sketched(
        sketch_size,
        delta,
        robust=robust,
        exponents=exponents,
        decay=decay,
        graft=graft,
        graft_decay=graft_decay,
        graft_eps=graft_eps,
        block_size=block_size,
        compress=compress,
        relative_delta=relative_delta,
        stacked=stacked,
        factoring=factoring,
        graft_rms=graft_rms,
        refresh_tolerance=refresh_tolerance,
        **{name: value for name, value in counts.items() if value is not None},
    )
    if momentum is None:
        return mirror_descent(learning_rate, metric)
    return with_momentum(learning_rate, metric, momentum, nesterov)


def with_momentum(learning_rate, metric: Metric, momentum, nesterov: bool):
    """Composite mirror descent on ``metric`` (:func:`sketchopt.rules.mirror_descent`, Duchi et
    al. 2011 eq. 4) with its steps averaged by momentum inside the driver
    (:func:`sketchopt.rules.momentum_rule`): :func:`kron_fd`'s transform (state
    :class:`KronFDState`)."""
    rule = _rules.metric_rule(metric, _validation.step_size("learning_rate", learning_rate))
    return _leafwise.leafwise(_rules.momentum_rule(rule, momentum, nesterov), KronFDState)


class KronFDState(NamedTuple):
    """State of :func:`kron_fd` with ``momentum``: the metric states of
    :class:`sketchopt.MirrorDescentState` and the momentum buffer, a tree like the parameters
    (float32 under lower-precision parameters; a skipped leaf's buffer is kept as it was)."""

    count: jax.Array
    metric_state: Any
    momentum: Any
    nonfinite_count: jax.Array
