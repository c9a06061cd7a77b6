r"""Preconditioner metrics ``H_t``: the curvature axis of metric x rule x regularizer.

A :class:`Metric` keeps the curvature state of one flat parameter vector and exposes ``H_t`` as a
structured operator (see :mod:`sketchopt.operators`):

* :func:`diagonal` -- ADA-DIAG, ``H_t = delta I + diag(G_t)^{1/2}`` (Duchi et al. eq. 5, Fig. 1);
* :func:`full` -- ADA-FULL, ``H_t = delta I + G_t^{1/2}`` with ``G_t = sum_s g_s g_s^T`` kept
  exactly (Duchi et al. eq. 5, Fig. 2; a ``d x d`` eigendecomposition per step: the baseline, not
  the product);
* :func:`sketched` -- ADA-FD, ``H_t = delta I + C_t^{1/2}`` with ``C_t = V^T diag(lam) V + alpha I``
  from any sketch of :mod:`sketchopt.sketches` (Ada-FD paper sec. 3.1; ``alpha > 0`` for RFD);
* :func:`radagrad_metric` -- RADAGRAD (Ada-FD paper eq. 4), ``H_t = I + V^T diag(Sigma^{1/2} +
  delta - 1) V`` from a randomized-DCT projection of the gradients;
* :func:`ada_lr_metric` -- ADA-LR (Ada-FD paper eq. 3), ``H_t^{-1} = V (Sigma^{1/2} + delta I)^{-1}
  V^T`` from a randomized low-rank SVD of ``G_t`` (a :class:`~sketchopt.operators.SubspaceOperator`:
  no regularizer).

Shampoo's Kronecker-factored metric with FD/RFD sketches of its factors,
:func:`sketchopt.shampoo.kron_sketched`, is a :class:`Metric` too; it lives with its grafts and
its transform in :mod:`sketchopt.shampoo`, above this module (``sketchopt.metrics.kron_sketched``,
``GRAFTS``, ... still work: see the end of this module). Its leaf state :class:`KronMetricState`
keeps this module as its home.

A metric of one's own is a :class:`Metric` too: its operator needs ``solve`` (the
:class:`~sketchopt.operators.Operator` protocol), and to take a regularizer it must be a
:class:`~sketchopt.operators.DiagonalOperator` or :class:`~sketchopt.operators.LowRankOperator`.

``update`` absorbs the gradient ``g_t`` *before* ``H_t`` is used, as in Ada-FD Alg. 1/2 (the
sketch already includes ``g_t``).

Complex parameters. Following Optax (AdaGrad on ``|g|^2``), a complex leaf's gradient ``g`` in
``C^d`` is taken as it is given (for a real loss pass ``conj(jax.grad(loss)(z))``, as Optax's tests
do) and every quadratic form becomes Hermitian: :func:`diagonal` accumulates ``|g|^2`` (real),
:func:`full` keeps ``G_t = sum_s g_s g_s^H`` and roots it through the Hermitian ``eigh``,
:func:`sketched` sketches ``sum_s g_s g_s^H`` with any sketch of :mod:`sketchopt.sketches` (FD and
RFD, per-step and fast, PFD, CFD, Oja, random projection: the conventions are in that module's
docstring) and solves with ``V^H``; the SON family (:mod:`sketchopt.son`: FD-, RFD-, Oja-, RP-SON,
ONS) uses ``A_t = alpha I + S^H S``, and the first-order learners (:mod:`sketchopt.first_order`) and
the separable ``l1`` / ``l2_squared`` regularizers shrink moduli and keep phases. States of
complex64 (complex128) leaves are complex64 (complex128), with their real-valued parts (eigenvalues,
ridges, diagonal accumulators) float32 (float64). Refused with a ``TypeError`` at ``init`` that
names the family: :func:`radagrad_metric` and :func:`ada_lr_metric` (their randomized DCT is real)
and :func:`sketchopt.shampoo.kron_sketched` (``kron_fd`` / ``kron_rfd``); and with a ``TypeError``
when built or traced, the regularizers other than ``l1`` and ``l2_squared`` and SON's
:func:`~sketchopt.son.project_bounded_prediction`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sketchopt import _dct, _numerics, _validation
from sketchopt import kron as _kron
from sketchopt import sketches as _sketches
from sketchopt._numerics import (
    HIGHEST,
    denoise_residual,
    eigh_desc,
    exponent,
    flat_size,
    ldexp,
    rescale_exponent,
    state_dtype,
)
from sketchopt._partitioning import contract_d, replicate
from sketchopt.operators import (
    DiagonalOperator,
    LowRankOperator,
    SubspaceOperator,
)

__all__ = [
    "AdaLRMetricState",
    "DiagonalMetricState",
    "FullMetricState",
    "KronMetricState",
    "Metric",
    "RadagradMetricState",
    "ada_lr_metric",
    "diagonal",
    "full",
    "radagrad_metric",
    "sketched",
]


class Metric(NamedTuple):
    """A preconditioner metric of one flat parameter vector.

    Attributes:
      init: ``init(shape, dtype) -> state`` for a leaf of that shape (a tuple; an ``int`` is
        read as a vector's length), flattened to ``d = prod(shape)`` coordinates; a metric with
        per-axis structure may use the shape itself.
      update: ``update(state, g, valid=True) -> (state, op, solved)``: absorb ``g`` and return
        ``H_t`` as an operator together with ``H_t^{-1} g`` when the update computes it on the
        way (the sketched metrics do, fused into the pass over the sketch), ``None`` otherwise.
        With ``valid`` false (the rules then pass a zero ``g``) the state comes back
        bit-identical: this is how non-finite gradients are skipped without a ``lax.cond``,
        which would make XLA copy large states.
      operator: ``operator(state) -> op``, the current ``H_t``.
      name: a short name for reports.
      spec: what identifies the metric by value (``sketchopt._validation.spec_key`` of its
        constructor's arguments), or ``None``: equal specs make equal metrics, so a transform
        rebuilt with an equal metric reuses its compiled update.
      paddable: whether zero coordinates appended to a leaf change nothing else (the diagonal
        and the FD-family and random-projection sketches; see ``Sketch.paddable``): the rules
        then step a network's small leaves as one padded group.
      hyper: ``None``, or ``hyper(count) -> pytree``: values of the metric that follow the step
        count (SON's ``eta_t`` and ``sigma_t``), evaluated once per update by the rules and
        passed as ``update(state, g, valid, hyper=...)``.
      phases: ``None``, or a ``sketchopt._leafwise.Phases`` for a metric whose update takes
        different static forms by the step count (:func:`sketchopt.shampoo.kron_sketched`'s
        periods): the rules step the whole update under one ``lax.switch`` and pass each
        branch's variant as ``update(..., hyper=..., phase=...)``; called without ``phase``
        (``None``) the update chooses by the count itself.
      seeded: whether ``init`` takes the leaf's index, ``init(shape, dtype, index)``: a metric
        with random state (Oja's initial directions, random projections) draws each leaf's
        randomness from it.

      accepts: ``None``, or ``accepts(state, g, hyper) -> bool`` for a metric that cannot absorb
        every finite ``g`` (SON, whose to-sketch vector ``sqrt(eta_t + sigma_t) g`` can
        overflow): where it is false the rules skip the leaf like a non-finite gradient (zero
        update, state bit-identical, counted) and call ``update`` with ``valid`` false.
      path_key: ``None``, or ``path_key(path, shape) -> hashable`` for a metric whose state
        depends on the leaf's key path (``jax.tree_util.keystr``) and not only on its shape
        (:func:`sketchopt.shampoo.kron_sketched`'s per-path factoring): ``init`` then also takes
        ``path=`` and leaves of one shape with different keys are grouped apart.
      param_shaped: whether every array of a leaf's state has the leaf's ``d`` entries (the
        diagonal): the rules then keep the metric state as trees like the parameters, which
        ``optax.tree.map_params`` reaches, instead of stacked groups.
      absorb: ``None``, or ``absorb(state, g, valid=True) -> (state, op)``: ``update`` without
        the solve with ``g``, for a rule that solves with another vector (dual averaging, with
        the gradients' sum); the sketched metric then skips the lift fused into its pass over
        the sketch. ``None``: such a rule calls ``update`` and drops its ``solved``.
      coordinatewise: whether ``update`` and the operator act coordinate by coordinate, on a
        leaf of any shape (every state array shaped like the leaf: the diagonal). The rules then
        step each leaf in its own shape, with no flattening, stacking or padding, which on a TPU
        or GPU would relayout or copy the leaf (``sketchopt._leafwise.LeafRule.coordinatewise``).
      unit_step: whether a finite ``g`` always gives a finite state and ``|H_t^{-1} g_t| <= 1``
        entrywise (the diagonal: ``s_t >= |g_t|``, its sum of squares saturating at the dtype's
        largest value). The rules then bound the update by ``|eta_t|`` and skip checking it and
        the state after the step: one read of the gradient and one pass, as ``optax.adagrad``.
      shaped: whether ``update`` takes ``g`` in the leaf's own shape as well as flat and its
        operator returns ``H_t^{-1} y`` in ``y``'s shape (:func:`sketchopt.shampoo.kron_sketched`,
        which reshapes ``g`` to its matrix anyway). :func:`sketchopt.rules.mirror_descent`'s
        rule then stacks a group's gradients in their own shape: on a TPU or GPU flattening a
        tiled matrix and shaping it back are a relayout copy each, both ways.

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> metric = so.metrics.diagonal(0.1)
      >>> state, op, solved = metric.update(metric.init((2,)), jnp.array([1.0, -2.0]))
      >>> metric.name, state.rss, solved is None
      ('diag', Array([1., 2.], dtype=float32), True)
    """

    init: Callable[..., Any]
    update: Callable[..., tuple[Any, Any, Any]]
    operator: Callable[[Any], Any]
    name: str
    spec: Any = None
    paddable: bool = False
    hyper: Callable[[jax.Array], Any] | None = None
    seeded: bool = False
    accepts: Callable[..., jax.Array] | None = None
    path_key: Callable[[str, tuple[int, ...]], Any] | None = None
    param_shaped: bool = False
    absorb: Callable[..., tuple[Any, Any]] | None = None
    coordinatewise: bool = False
    unit_step: bool = False
    phases: Any = None
    shaped: bool = False

    __eq__ = _validation.value_eq
    __hash__ = _validation.value_hash


def solve_new_gradient(op, g, solved):
    """``H_t^{-1} g_t``: ``solved`` as returned by ``Metric.update``, or ``op.solve(g)``."""
    return op.solve(g) if solved is None else solved


def refuse_complex(family, dtype):
    """Raise ``TypeError("<family>: complex parameters are not supported")`` for a complex
    ``dtype`` (the families that have no Hermitian form here, see the module docstring)."""
    if jnp.issubdtype(jnp.dtype(dtype), jnp.complexfloating):
        raise TypeError(f"{family}: complex parameters are not supported (got {jnp.dtype(dtype)})")


def check_delta(delta, *, allow_zero=False):
    """Validate ``delta`` at construction (traced values pass, see ``sketchopt._validation``)."""
    if allow_zero:
        return _validation.ridge("delta", delta)
    return _validation.ridge(
        "delta", delta, positive=True, why="H = delta I + ... must be invertible"
    )


# ----------------------------------------------------------------------------------------------
# ADA-DIAG.


class DiagonalMetricState(NamedTuple):
    """State of ADA-DIAG.

    Attributes:
      rss: ``diag(G_t)^{1/2} = sqrt(sum_s g_s^2)`` per coordinate (the root of the sum of
        squares, kept with ``hypot`` so that it cannot overflow where the sum of squares would,
        and saturating at the dtype's largest finite value where the root itself would);
        ``sqrt(sum_s |g_s|^2)``, real (float32/float64), for complex parameters.
    """

    rss: jax.Array


def diagonal(delta: float) -> Metric:
    """ADA-DIAG's metric: ``H_t = delta I + diag(G_t)^{1/2}``, ``G_t = sum_s g_s g_s^T``.

    Only the diagonal ``s_t = sqrt(sum_s g_s^2)`` is kept (``O(d)``), so ``H_t^{-1} g`` is
    ``g / (delta + s_t)`` coordinatewise; with ``delta = 0`` coordinates that have seen only zero
    gradients get a zero step (the safe ``0/0 = 0``). ``s_t`` saturates at the dtype's largest
    finite value (reached only by gradient entries within a factor ``sqrt(2)`` of it, or by
    ``sum_s g_s^2`` beyond it), so that a finite gradient always gives a finite state and a
    step ``|g_t| / (delta + s_t) <= 1``: the rules then need no check after the step. Complex
    ``g``: ``s_t = sqrt(sum_s |g_s|^2)`` (the diagonal of the Hermitian ``sum_s g_s g_s^H``),
    real.

    Args:
      delta: ``delta >= 0``.

    Returns:
      A :class:`Metric` (``"diag"``) with a :class:`DiagonalMetricState`, whose operator is a
      :class:`~sketchopt.operators.DiagonalOperator`.

    References:
      Duchi, Hazan & Singer (2010), "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", Tech. Rep. UCB/EECS-2010-24 (JMLR 12, 2011), eq. (5) and Fig. 1 (AdaGrad with
      diagonal matrices).

    Examples:
      >>> import jax.numpy as jnp, sketchopt as so
      >>> metric = so.metrics.diagonal(1.0)
      >>> state, op, _ = metric.update(metric.init((2,)), jnp.array([3.0, 4.0]))
      >>> op.solve(jnp.array([4.0, 5.0]))  # H = diag(1 + 3, 1 + 4)
      Array([1., 1.], dtype=float32)
    """
    check_delta(delta, allow_zero=True)

    def init(shape, dtype=jnp.float32):
        dtype = _numerics.real_dtype(state_dtype(dtype))  # complex: |g|^2 sums are real
        return DiagonalMetricState(jnp.zeros((flat_size(shape),), dtype))

    def operator(state):
        return DiagonalOperator(delta + state.rss)

    def update(state, g, valid=True):
        del valid  # hypot(rss, 0) == rss exactly
        g = jnp.abs(g) if jnp.iscomplexobj(g) else g  # complex: |g|
        rss = jnp.hypot(state.rss, g)
        state = DiagonalMetricState(jnp.minimum(rss, jnp.finfo(rss.dtype).max))
        return state, operator(state), None

    spec = _validation.spec_key("diagonal", delta)
    return Metric(
        init,
        update,
        operator,
        "diag",
        spec,
        paddable=True,
        param_shaped=True,
        coordinatewise=True,
        unit_step=True,
    )


# ----------------------------------------------------------------------------------------------
# ADA-FULL.


class FullMetricState(NamedTuple):
    """State of ADA-FULL.

    Attributes:
      gram: ``G_t / 4**scale_exp`` (``d x d``), ``G_t = sum_s g_s g_s^T``.
      scale_exp: the power-of-two exponent of ``gram``.
    """

    gram: jax.Array
    scale_exp: jax.Array


def full(delta: float) -> Metric:
    """ADA-FULL's metric: ``H_t = delta I + G_t^{1/2}``, ``G_t = sum_s g_s g_s^T``.

    Keeps ``G_t`` exactly and eigendecomposes it, ``G_t = U diag(mu) U^T``, at every operator
    (``O(d^2)`` memory, ``O(d^3)`` time): ``H_t = U diag(delta + sqrt(mu)) U^T``. The reference
    that ADA-FD approximates. Complex ``g``: ``G_t = sum_s g_s g_s^H`` (Hermitian), ``G_t = U
    diag(mu) U^H`` with real ``mu``, and the operator's rows are ``U^H``.

    Args:
      delta: ``delta > 0``.

    Returns:
      A :class:`Metric` (``"full"``) with a :class:`FullMetricState`, whose operator is a
      :class:`~sketchopt.operators.LowRankOperator` over the complete eigenbasis.

    References:
      Duchi, Hazan & Singer (2010), "Adaptive Subgradient Methods for Online Learning and Stochastic
      Optimization", Tech. Rep. UCB/EECS-2010-24 (JMLR 12, 2011), eq. (5) and Fig. 2 (AdaGrad with
      full matrices).

    Examples:
      >>> import jax.numpy as jnp, numpy as np, sketchopt as so
      >>> metric = so.metrics.full(1.0)
      >>> state, op, _ = metric.update(metric.init((2,)), jnp.array([0.0, 2.0]))
      >>> np.round(np.asarray(op.solve(jnp.array([1.0, 3.0]))), 4) + 0.0  # H = diag(1, 1 + 2)
      array([1., 1.], dtype=float32)
    """
    check_delta(delta)

    def init(shape, dtype=jnp.float32):
        dim, dtype = flat_size(shape), state_dtype(dtype)
        return FullMetricState(jnp.zeros((dim, dim), dtype), jnp.zeros((), jnp.int32))

    def operator(state):
        d = state.gram.shape[0]
        # Round-off eigenvalues of a rank-deficient G_t (~eps * ||G_t||) are zeroed as for the
        # sketches: their square roots (~sqrt(eps) * ||G_t||^{1/2}) would be spurious curvature.
        # The d x d eigendecomposition needs all of G_t on every device (under an explicit
        # mesh this must be said; automatic sharding gathers it by itself).
        mu, u = eigh_desc(replicate(state.gram))
        sqrt_g = ldexp(jnp.sqrt(mu), state.scale_exp)
        eye = jnp.eye(d, dtype=state.gram.dtype)
        # The eigenbasis is complete, so the smallest root (0 while G_t is rank deficient) can sit
        # in the scalar: the Woodbury solve then divides its round-off by delta + min root, not
        # by delta (which was off by eps * max root / delta once G_t had full rank).
        floor = sqrt_g[-1] if d > 0 else jnp.zeros((), sqrt_g.dtype)
        scalar = jnp.asarray(delta, sqrt_g.dtype) + floor  # real also for a Hermitian G_t
        return LowRankOperator(scalar, _numerics.conj(u).T, eye, sqrt_g - floor)

    def update(state, g, valid=True):
        g, gram = replicate(g), replicate(state.gram)  # see operator
        diag = jnp.diagonal(gram)
        if jnp.iscomplexobj(diag):  # Hermitian: a real diagonal
            diag = jnp.real(diag)
        exp = rescale_exponent(
            state.scale_exp, jnp.max(jnp.abs(g), initial=0), jnp.max(diag, initial=0)
        )
        exp = jnp.where(valid, exp, state.scale_exp)
        gram = ldexp(gram, 2 * (state.scale_exp - exp))
        gs = ldexp(g, -exp)
        state = FullMetricState(gram + jnp.outer(gs, _numerics.conj(gs)), exp)  # g g^H
        return state, operator(state), None

    return Metric(init, update, operator, "full", _validation.spec_key("full", delta))


# ----------------------------------------------------------------------------------------------
# ADA-FD.


def _sketched_operator(lr: _sketches.LowRank, delta):
    """``delta I + C^{1/2}`` for ``C = V^T diag(lam) V + alpha I``.

    ``C^{1/2} = sqrt(alpha) I + V^T diag(sqrt(lam + alpha) - sqrt(alpha)) V`` (``V``'s rows are
    eigenvectors of ``C``); the difference is computed as ``lam / (sqrt(lam + alpha) +
    sqrt(alpha))`` in the sketch's scaled units, so nothing cancels or overflows.
    """
    lam, alpha, e = lr.eigenvalues, lr.alpha, lr.scale_exp
    root_alpha = jnp.sqrt(alpha)
    denom = jnp.sqrt(lam + alpha) + root_alpha
    weights = jnp.where(lam > 0, lam / jnp.where(denom > 0, denom, 1), 0)
    k, d = lam.shape[0], lr.basis.shape[-1]
    floor = jnp.zeros((), lam.dtype)
    if 0 < d <= k:
        # When the sketch spans all of R^d (tau > d, or the fast buffer), the smallest weight
        # moves into the scalar as for ADA-FULL, so the Woodbury solve does not divide the
        # round-off of a complete projection by delta.
        spans = jnp.sum(lam > 0) >= d
        floor = jnp.where(spans, jnp.min(jnp.where(lam > 0, weights, jnp.inf)), 0)
        weights = jnp.where(lam > 0, weights - floor, 0)
    scalar = delta + ldexp(root_alpha + floor, e)
    return LowRankOperator(scalar.astype(lam.dtype), lr.basis, lr.coef, ldexp(weights, e), e)


def sketched(sketch: _sketches.Sketch, delta: float) -> Metric:
    """ADA-FD's metric: ``H_t = delta I + C_t^{1/2}`` from a sketch of the gradients.

    ``C_t = V^T diag(lam) V + alpha I`` comes from :func:`sketchopt.sketches.low_rank` of any
    sketch (``alpha = 0`` for FD, RFD's adaptive ridge otherwise), and ``C_t^{1/2} = sqrt(alpha)
    I + V^T diag(sqrt(lam + alpha) - sqrt(alpha)) V``. ``H_t^{-1} v`` is applied by Woodbury in
    ``O(n d)`` without forming a ``d x d`` matrix; the sketch update returns ``B g`` for free,
    and the per-step FD sketches lift the solve's coefficients in the same pass that rotates
    their rows, so solving with the new gradient costs no extra pass. Complex ``g``: ``C_t`` is
    the sketch of ``sum_s g_s g_s^H`` (``V^H diag(lam) V + alpha I``, ``lam`` and ``alpha``
    real) and the Woodbury solve uses ``V^H`` (module docstring, "Complex parameters").

    Args:
      sketch: any :class:`sketchopt.sketches.Sketch` (FD, RFD, their fast forms, PFD, CFD, Oja,
        random projection).
      delta: ``delta > 0``.

    Returns:
      A :class:`Metric` (``"sketched_" + sketch.name``) whose state is the sketch's state and
      whose operator is a :class:`~sketchopt.operators.LowRankOperator`; ``update`` returns
      ``H_t^{-1} g_t`` as well.

    References:
      Wan, Wei & Zhang (2018), "Efficient Adaptive Online Learning via Frequent Directions", IJCAI,
      sec. 3.1 (``H_t = delta I + (S_t^T S_t)^{1/2}`` and its Woodbury inverse), Alg. 1/2. Luo,
      Chen, Zhang, Li & Zhang (2019), "Robust Frequent Directions with Application in Online
      Learning", JMLR 20, Alg. 2 (the ridge ``alpha`` of an RFD sketch).

    Examples:
      >>> import jax.numpy as jnp, numpy as np, sketchopt as so
      >>> metric = so.metrics.sketched(so.sketches.frequent_directions(2), delta=1.0)
      >>> state, op, solved = metric.update(metric.init((3,)), jnp.array([0.0, 3.0, 0.0]))
      >>> np.round(np.asarray(solved), 4) + 0.0  # C = 9 e_2 e_2^T: H_t g = (1 + 3) g
      array([0.  , 0.75, 0.  ], dtype=float32)
    """
    check_delta(delta)
    absorb_solve = sketch.absorb_solve
    if absorb_solve is None:  # a Sketch built by hand with 0.2's fields (see Sketch)

        def absorb_solve(state, g, valid, lift):
            return _sketches.Absorbed(*sketch.absorb(state, g, valid, lift=lift))

    read = _sketches.reader(sketch)  # per-step FD: its diagonal Gram matrix, no eigh

    def init(shape, dtype=jnp.float32):
        return sketch.init(flat_size(shape), state_dtype(dtype))

    def operator(state):
        return _sketched_operator(read(state), delta)

    def lift_coefficients(state, product):
        # The split solve of LowRankOperator: H^{-1} g = V^T diag(1 / (c + w)) V g + (g - P g) / c.
        # V g costs nothing more (``product`` is B g), and the sketch lifts both coefficient
        # vectors in the pass that rotates its rows.
        lr = read(state)
        op = _sketched_operator(lr, delta)
        vg = jnp.where(op.weights != 0, lr.project_product(product), 0)
        pair = jnp.stack([vg, vg / (op.scalar + op.weights)])
        # over the basis rows: V^T a = basis^T (coef^T a); complex: V^H a = basis^H (coef^H a)
        return ldexp(pair, -lr.scale_exp) @ _numerics.conj(lr.coef)

    def update(state, g, valid=True):
        out = absorb_solve(state, g, valid, lift=lift_coefficients)
        op = operator(out.state)
        residual, inside = out.residual
        n = op.weights.shape[0]
        return out.state, op, inside + denoise_residual(residual, g, n) / op.scalar

    def absorb(state, g, valid=True):
        state = absorb_solve(state, g, valid).state
        return state, operator(state)

    spec = _validation.spec_key("sketched", sketch, delta)
    return Metric(
        init, update, operator, f"sketched_{sketch.name}", spec, sketch.paddable, absorb=absorb
    )


# ----------------------------------------------------------------------------------------------
# RADAGRAD and ADA-LR: random-projection approximations of ADA-FULL (Krummenacher et al. 2016),
# the baselines the Ada-FD paper compares against (its eq. 4 and 3). Both project the gradient
# outer products with the subsampled randomized DCT ``Pi`` of ``sketchopt._dct``.
#
# * RADAGRAD (eq. 4): ``G~_t = G~_{t-1} + g_t (Pi g_t)^T`` (``d x tau``); with ``G~_t = V Sigma
#   W^T`` (the paper's ``qr_update`` followed by the SVD of ``B = G~^T Q``, which yields exactly
#   the left singular vectors and singular values of ``G~_t``)
#   ``x_{t+1} = x_t - eta V (Sigma^{1/2} + delta I)^{-1} V^T g_t - eta (g_t - V V^T g_t)``. We keep
#   ``G~_t`` and its small Gram matrix ``G~^T G~`` (updated in ``O(tau d)`` from the one pass
#   ``G~^T g``) and re-orthonormalize through the ``tau x tau`` eigendecomposition of that Gram
#   matrix: the same ``V`` and ``Sigma`` as the rank-one QR update, at the same ``O(tau d)`` cost.
#   In metric form ``H_t = I + V^T diag(Sigma^{1/2} + delta - 1) V``.
# * ADA-LR (eq. 3): keeps ``G_t`` (``d x d``), projects ``G~ = G Pi^T``, orthonormalizes
#   ``Q R = G~``, takes the SVD of ``B = Q^T G = U Sigma V^T``; ``H_t^{-1} = V (Sigma^{1/2} +
#   delta I)^{-1} V^T`` (``O(tau d^2)``; no step outside the sketched subspace, as in the paper).


def _projected_preamble(sketch_size, delta, key):
    """The arguments shared by RADAGRAD and ADA-LR, validated; and their per-leaf projection."""
    tau = _validation.size("sketch_size", sketch_size)
    check_delta(delta)
    key = _validation.prng_key("key", key)

    def leaf_projection(shape, dtype, family):
        """``(d, state dtype, signs, indices)`` of the randomized DCT of a leaf (real only)."""
        refuse_complex(family, dtype)  # a real DCT: no Hermitian form here
        dim = flat_size(shape)
        return (dim, state_dtype(dtype), *_dct.init(key, dim, tau))

    return tau, key, leaf_projection


class RadagradMetricState(NamedTuple):
    """State of RADAGRAD.

    Attributes:
      rows: ``G~_t^T / 4**scale_exp`` (``tau x d``), ``G~_t = sum_s g_s (Pi g_s)^T``.
      gram: ``rows rows^T`` (``tau x tau``).
      scale_exp: the power-of-two exponent ``e`` (it never decreases).
      signs: the random signs of the randomized DCT ``Pi``.
      indices: the coordinates ``Pi`` subsamples.
    """

    rows: jax.Array
    gram: jax.Array
    scale_exp: jax.Array
    signs: jax.Array
    indices: jax.Array


def radagrad_metric(sketch_size: int, delta: float, key) -> Metric:
    """RADAGRAD's metric ``H_t = I + V^T diag(Sigma^{1/2} + delta - 1) V`` (Ada-FD eq. 4).

    ``V Sigma W^T`` is the SVD of ``G~_t = sum_s g_s (Pi g_s)^T`` (``d x tau``) with ``Pi`` the
    subsampled randomized DCT; off ``span(V)`` the step is the plain gradient step.

    Args:
      sketch_size: ``tau >= 1``, the rows of ``Pi``.
      delta: ``delta > 0``.
      key: the PRNG key that draws ``Pi`` (every leaf uses the same key; may be traced).

    Returns:
      A :class:`Metric` whose operator is a :class:`~sketchopt.operators.LowRankOperator`.

    References:
      Krummenacher, Fung, Bayer, Huang & Roth (2016), "Scalable Adaptive Stochastic Optimization
      Using Random Projections", NeurIPS (RADAGRAD); as written in Wan, Wei & Zhang (2018),
      "Efficient Adaptive Online Learning via Frequent Directions", IJCAI, eq. (4).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> metric = so.metrics.radagrad_metric(2, 1e-3, jax.random.PRNGKey(0))
      >>> state, op, _ = metric.update(metric.init((4,)), jnp.array([1.0, 0.0, 0.0, 0.0]))
      >>> op.solve(jnp.array([0.0, 1.0, 0.0, 0.0]))  # off the sketch: H = I
      Array([0., 1., 0., 0.], dtype=float32)
    """
    tau, key, leaf_projection = _projected_preamble(sketch_size, delta, key)

    def init(shape, dtype=jnp.float32):
        dim, dtype, signs, idx = leaf_projection(shape, dtype, "radagrad")
        return RadagradMetricState(
            rows=jnp.zeros((tau, dim), dtype),
            gram=jnp.zeros((tau, tau), dtype),
            scale_exp=jnp.zeros((), jnp.int32),
            signs=signs,
            indices=idx,
        )

    def operator(state):
        kappa, u = eigh_desc(state.gram)
        inv = jnp.where(kappa > 0, 1 / jnp.sqrt(jnp.where(kappa > 0, kappa, 1)), 0)
        coef = (u * inv).T  # V = coef @ rows: the left singular vectors of G~ as rows
        # Singular values of G~ = 4**e sqrt(kappa); their square roots 2**e kappa**(1/4).
        root_sigma = ldexp(jnp.sqrt(jnp.sqrt(kappa)), state.scale_exp)
        # H's eigenvalues on span(V) are Sigma^{1/2} + delta; as weights over the identity they
        # are stored minus 1, which cannot hold values below eps: floor them there (a smaller,
        # finite step) rather than divide by a rounded 0 (delta < eps with tiny gradients).
        floor = jnp.finfo(kappa.dtype).eps
        weights = jnp.where(kappa > 0, jnp.maximum(root_sigma + delta, floor) - 1, 0)
        weights = weights.astype(kappa.dtype)
        return LowRankOperator(jnp.ones((), kappa.dtype), state.rows, coef, weights)

    def update(state, g, valid=True):
        dtype = state.rows.dtype
        # G~ ~ |g|^2: keep rows = G~^T / 4**e with e following the largest |g| seen, so that a
        # 1e30 gradient in float32 neither overflows the rows nor (as |g|^4) the Gram matrix.
        # e never decreases: H = I + V^T diag(Sigma^{1/2} + delta - 1) V cannot represent
        # Sigma^{1/2} + delta below eps (the weight rounds to -1), so for float32 gradients so
        # small that G~ underflows (|g| < ~1e-10) RADAGRAD takes plain gradient steps instead.
        e_g = exponent(jnp.max(jnp.abs(g), initial=0))
        exp = jnp.where(valid, jnp.maximum(state.scale_exp, e_g), state.scale_exp)
        shift = state.scale_exp - exp
        rows = ldexp(state.rows, 2 * shift)
        gram = ldexp(state.gram, 4 * shift)
        gs = ldexp(g, -exp).astype(dtype)
        gt = _dct.apply(gs, state.signs, state.indices, tau)  # Pi g / 2**e
        p = contract_d(rows, gs)  # G~^T g / 8**e (before the update)
        sq = jnp.sum(jnp.square(gs))
        # A skipped step (zero g, unchanged exp) must leave the state bit-identical: adding +0
        # would turn its -0 entries into +0, hence the selects.
        gram = jnp.where(
            valid, gram + jnp.outer(p, gt) + jnp.outer(gt, p) + sq * jnp.outer(gt, gt), gram
        )
        rows = jnp.where(valid, rows + jnp.outer(gt, gs), rows)
        state = state._replace(rows=rows, gram=gram, scale_exp=exp)
        return state, operator(state), None

    spec = _validation.spec_key("radagrad", tau, delta, key)
    return Metric(init, update, operator, "radagrad", spec)


class AdaLRMetricState(NamedTuple):
    """State of ADA-LR.

    Attributes:
      gram: ``G_t / 4**scale_exp`` (``d x d``).
      scale_exp: the power-of-two exponent of ``gram``.
      signs: the random signs of the randomized DCT ``Pi``.
      indices: the coordinates ``Pi`` subsamples.
    """

    gram: jax.Array
    scale_exp: jax.Array
    signs: jax.Array
    indices: jax.Array


def ada_lr_metric(sketch_size: int, delta: float, key) -> Metric:
    """ADA-LR's metric (Ada-FD eq. 3): ``H_t^{-1} = V (Sigma^{1/2} + delta I)^{-1} V^T``.

    Keeps the full ``G_t = sum_s g_s g_s^T`` (``O(d^2)`` memory, ``O(tau d^2)`` per step) and
    takes ``V, Sigma`` from its randomized low-rank SVD: ``Q R = G Pi^T``, ``Q^T G = U Sigma V^T``.
    There is no step outside ``span(V)``, as in the paper.

    Args:
      sketch_size: ``tau >= 1``, the rank of the randomized SVD.
      delta: ``delta > 0``.
      key: the PRNG key that draws ``Pi`` (may be traced).

    Returns:
      A :class:`Metric` whose operator is a :class:`~sketchopt.operators.SubspaceOperator`
      (``solve`` only: the rules refuse a regularizer with it when built).

    References:
      Krummenacher, Fung, Bayer, Huang & Roth (2016), "Scalable Adaptive Stochastic Optimization
      Using Random Projections", NeurIPS (ADA-LR); as written in Wan, Wei & Zhang (2018), "Efficient
      Adaptive Online Learning via Frequent Directions", IJCAI, eq. (3).

    Examples:
      >>> import jax, jax.numpy as jnp, sketchopt as so
      >>> metric = so.metrics.ada_lr_metric(1, 1.0, jax.random.PRNGKey(0))
      >>> state, op, _ = metric.update(metric.init((2,)), jnp.array([3.0, 0.0]))
      >>> op.solve(jnp.array([4.0, 5.0]))  # V = e_1, Sigma^{1/2} = 3: 4 / (3 + 1); no step on e_2
      Array([1., 0.], dtype=float32)
    """
    tau, key, leaf_projection = _projected_preamble(sketch_size, delta, key)

    def init(shape, dtype=jnp.float32):
        dim, dtype, signs, idx = leaf_projection(shape, dtype, "ada_lr")
        return AdaLRMetricState(jnp.zeros((dim, dim), dtype), jnp.zeros((), jnp.int32), signs, idx)

    def operator(state):
        # The d x d decompositions need all of G_t on every device (under an explicit mesh this
        # must be said; automatic sharding gathers it by itself): an O(tau d^2) baseline.
        gram = replicate(state.gram)
        dtype, d = gram.dtype, gram.shape[0]
        if d == 0:  # static: nothing to decompose
            vt, root = jnp.zeros((0, 0), dtype), jnp.zeros((0,), dtype)
            return SubspaceOperator(vt, root + jnp.asarray(delta, dtype))
        pi = _dct.matrix(replicate(state.signs), replicate(state.indices), tau, dtype)
        # Eq. 3: G~ = G Pi^T (d x tau), Q R = G~, B = Q^T G = U Sigma V^T.
        g_tilde = jnp.matmul(gram, pi.T, precision=HIGHEST)
        q, _ = jnp.linalg.qr(g_tilde)  # d x k
        b = jnp.matmul(q.T, gram, precision=HIGHEST)  # k x d
        _, sigma, vt = jnp.linalg.svd(b, full_matrices=False)
        sigma = jnp.where(sigma > sigma[0] * b.shape[0] * jnp.finfo(dtype).eps, sigma, 0)
        root = ldexp(jnp.sqrt(sigma), state.scale_exp)
        return SubspaceOperator(vt, root + jnp.asarray(delta, dtype))

    def update(state, g, valid=True):
        g, gram = replicate(g), replicate(state.gram)  # see operator
        exp = rescale_exponent(
            state.scale_exp,
            jnp.max(jnp.abs(g), initial=0),
            jnp.max(jnp.diagonal(gram), initial=0),
        )
        exp = jnp.where(valid, exp, state.scale_exp)
        gram = ldexp(gram, 2 * (state.scale_exp - exp))
        gs = ldexp(g, -exp)
        gram = jnp.where(valid, gram + jnp.outer(gs, gs), gram)  # bit-identical when skipped
        state = state._replace(gram=gram, scale_exp=exp)
        return state, operator(state), None

    spec = _validation.spec_key("ada_lr", tau, delta, key)
    return Metric(init, update, operator, "ada_lr", spec)


# ----------------------------------------------------------------------------------------------
# Kronecker-factored sketches (Shampoo's statistics, Sketchy's memory).


# The state is defined beside its factors (``sketchopt.kron``), below the layout rules that read it
# (``sketchopt._layouts``); this module stays its public home (same class, same ``__module__``).
KronMetricState = _kron.KronMetricState

# The metric, its grafts and its transform moved up to ``sketchopt.shampoo``, the family's module,
# which imports this one; their old paths here keep working and give the same objects, read from
# there when first asked (PEP 562), so that this module never imports it at import time
# (``tests/test_layout.py``: no import circle, and no other name may be served this way).
_MOVED_TO_SHAMPOO = (
    "DIAGONAL_GRAFTS",
    "GRAFTS",
    "GraftedOperator",
    "NormalizedOperator",
    "check_exponents",
    "kron_sketched",
)


def __getattr__(name):
    if name in _MOVED_TO_SHAMPOO:
        from sketchopt import shampoo

        return getattr(shampoo, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
