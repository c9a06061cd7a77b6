r"""Linear online learners on sparse examples, ``O(s)`` per example with lazy, exact catch-up.

Each learner is a :class:`LinearLearner`: ``init(dim)``, ``predict(state, x)``,
``update(state, x, label)``, ``step`` (both at once: the prediction made on ``x`` and the state
after learning from it) and ``weights(state)`` (the dense weights, on request). ``x`` is a
:class:`~sketchopt.stream.examples.SparseVector`. The loss is a parameter of the learner
(:data:`LOSSES`); its derivative in the prediction ``p`` makes the gradient ``loss'(p, y) x``.

**Lazy catch-up.** Each learner equals its dense counterpart in :mod:`sketchopt` fed the dense
gradients ``loss'(p_t, y_t) x_t`` (``tests/test_stream_learners.py`` pins it in float64). A
coordinate absent from ``x_t`` has gradient 0 there, and what the dense learner does to it on
such a step composes into one closed form, applied when the coordinate next appears (and by
``weights``):

* ADA-DIAG with L1 (Duchi et al. 2011, eq. 4 in the diagonal metric ``h_i = delta + s_i``) and
  FOBOS-L1 (Duchi & Singer 2009): a zero-gradient step is the soft threshold
  ``st(w, eta_u l1 / h_i)``, and soft thresholds compose, ``st(st(w, a), b) = st(w, a + b)``, with
  ``h_i`` fixed while the coordinate is absent: the catch-up is one soft threshold at
  ``(E_{t-1} - E_{last}) l1 / h_i``, ``E_t = sum_{u <= t} eta_u`` (a running scalar; the
  coordinate keeps ``E`` of its last step).
* Truncated gradient (Langford, Li & Zhang 2009, the operator ``T_1`` every ``K`` steps): a
  coordinate with ``|w| <= theta`` stays inside ``[-theta, theta]`` once shrunk, and one outside
  is never shrunk, so the skipped truncations are one soft threshold at the sum of their
  ``K eta_u gravity`` where ``|w| <= theta`` -- their lazy truncation, exact.
* L1-RDA (Xiao 2010) and FTRL-Proximal (McMahan et al. 2013) are closed forms of per-coordinate
  sums that a zero gradient leaves alone (FTRL's ``sigma`` is 0 then, for a constant ``alpha``):
  the weights are computed from the sums when needed, nothing to catch up.

**Labels.** The classification losses (logistic, hinge, squared hinge) take labels in
``{-1, +1}``; a label 0 is read as -1, as the loaders map ``{0, 1}`` labels.

**Bad input.** An example with a non-finite value or label, an index below 0 or above ``d``, or
a non-finite loss derivative is skipped: state unchanged (every array bit-identical), ``t`` not
advanced, ``nonfinite_count`` incremented. Only ``O(s)`` entries are ever selected, never whole
arrays, so the step stays ``O(s)`` also when it is batched (``vmap``, or the grid form below).

* NAG (Ross, Mineiro & Langford 2013) changes only ``x``'s coordinates: nothing to catch up.

**Grids.** Built with 1-D arrays of hyperparameter values, a learner runs all those
configurations at once (:class:`LinearLearner`'s ``grid``): each of its columns keeps a
coordinate's numbers for every configuration in one contiguous row (:class:`LinearState`), so a
grid of ``G`` costs ``k`` gathers and scatters of ``s`` rows of ``G`` numbers per example.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt import _validation
from sketchopt._numerics import state_dtype
from sketchopt.regularizers import soft_threshold
from sketchopt.stream._base import LOSSES as _SHARED_LOSSES
from sketchopt.stream._base import (
    LinearLearner,
    LinearState,
    check_each,
    class_label,
    column,
    error,
    grid_shape,
    importance,
    loss_function,
    loss_value,
    segment_count,
    with_column,
)
from sketchopt.stream.examples import flat_segment
from sketchopt.stream.second_order import SECOND_ORDER

#: The losses by name, ``loss(prediction, label)``: Optax's where it has one. Logistic and the
#: hinges take labels in ``{-1, +1}``; squared takes any real label and is ``(p - y)^2`` (VW's
#: squared loss). (Defined in the base module the first- and second-order learners share.)
LOSSES = _SHARED_LOSSES

__all__ = [
    "LEARNERS",
    "LOSSES",
    "LinearLearner",
    "SECOND_ORDER_NAMES",
    "LinearState",
    "ada_diag",
    "check_each",
    "class_label",
    "column",
    "error",
    "fobos",
    "ftrl",
    "grid_shape",
    "loss_value",
    "make_learner",
    "nag",
    "rda",
    "truncated_gradient",
]


class _Rule(NamedTuple):
    """What one first-order learner defines; :func:`_linear` builds the rest.

    ``coords``/``scalars``: names and initial values (scalars as floats); ``current(scalars,
    cols, t)`` the weights of the gathered coordinates caught up to before step ``t``;
    ``advance(scalars, cols, w, g, t)`` the new gathered columns and scalars after step ``t``
    (``w`` the weights played, ``g`` the gradient on the gathered coordinates); ``project``, if
    any, what the learner changes on ``x``'s coordinates before it predicts (NAG's rescaling).
    """

    coords: tuple[str, ...]
    scalars: dict[str, float]
    current: Callable
    advance: Callable
    project: Callable | None = None  # (cols, values) -> cols: a change made before predicting
    sums: tuple[str, ...] = ()  # columns of project summed over the example (advance: "<n>_sum")


def _linear(name: str, loss: str, rule: _Rule, grid: tuple[int, ...] = ()) -> LinearLearner:
    """The :class:`LinearLearner` of a first-order ``rule``: ``O(s)`` per example, lazy
    catch-up by ``rule.current``, bad examples skipped and counted (module docstring)."""
    s = _LinearSteps(name, loss, rule, grid)
    return LinearLearner(
        name, loss, s.init, s.predict, s.update, s.step, s.weights, rule.coords, grid, s.blocks,
        s.step_flat,
    )  # fmt: skip


class _LinearSteps:
    """The functions of :func:`_linear`'s learner, one method each: an example's rows are
    gathered (:meth:`look`), the loss's slope decides whether it is learned (:meth:`learn_from`),
    the rule advances the gathered columns and they are written back (:meth:`write`)."""

    def __init__(self, name: str, loss: str, rule: _Rule, grid: tuple[int, ...]):
        self.name, self.loss, self.rule, self.grid = name, loss, rule, grid
        loss_fn = loss_function(loss)
        # Elementwise losses: the gradient of the sum is the derivative of each configuration's.
        self.derivative = jax.grad(lambda p, y: jnp.sum(loss_fn(p, y)))
        self.lanes = (1,) * len(grid)  # broadcasts an (s,) vector against (s, *grid) columns
        self.blocks = tuple((c,) for c in rule.coords) if grid else (rule.coords,)  # LinearState

    def width(self, block):  # a grid's one-column blocks are (d, G): no axis of length 1 to gather
        return () if self.grid else (len(block),)

    def init(self, dim: int, dtype=jnp.float32, key=None) -> LinearState:
        del key
        dim, dtype = int(dim), state_dtype(dtype)
        if dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim}")
        grid = self.grid
        return LinearState(
            table=tuple(jnp.zeros((dim, *self.width(b), *grid), dtype) for b in self.blocks),
            scalars={k: jnp.full(grid, v, dtype) for k, v in self.rule.scalars.items()},
            t=jnp.zeros(grid, jnp.int32),
            nonfinite_count=jnp.zeros(grid, jnp.int32),
        )

    def split(self, rows):
        blocks = self.blocks
        if self.grid:
            return {b[0]: r for r, b in zip(rows, blocks, strict=True)}
        return {c: r[:, j] for r, b in zip(rows, blocks, strict=True) for j, c in enumerate(b)}

    def gather(self, state, x):
        dim = state.table[0].shape[0]
        indices, values = x  # a SparseVector, or any (indices, values) pair
        indices, values = jnp.asarray(indices), jnp.asarray(values)
        ok = jnp.all((indices >= 0) & (indices <= dim) & jnp.isfinite(values))
        idx = jnp.where(ok, indices, dim)  # a bad example reads and writes padding only
        rows = tuple(b.at[idx].get(mode="fill", fill_value=0) for b in state.table)
        vals = jnp.where(ok, values, 0).astype(state.table[0].dtype)
        return idx, vals.reshape(vals.shape + self.lanes), rows, ok

    def columns(self, rows, vals):
        cols = self.split(rows)
        return cols if self.rule.project is None else self.rule.project(cols, vals)

    def look(self, state, x, table=None):
        """One example's (or one segment's) rows, caught-up weights and prediction share."""
        state = state if table is None else state._replace(table=table)
        idx, vals, rows, ok = self.gather(state, x)
        cols = self.columns(rows, vals)
        w = self.rule.current(state.scalars, cols, state.t + 1)
        sums = {n: jnp.sum(cols[n], axis=0) for n in self.rule.sums}
        return idx, vals, rows, cols, w, jnp.sum(w * vals, axis=0), ok, sums

    def learn_from(self, state, p, label, ok, active, weight=None):
        dtype = state.table[0].dtype
        label = class_label(self.loss, jnp.asarray(label, dtype))
        slope = self.derivative(p, label)
        slope, ok, active = importance(slope, ok, active, weight, dtype)
        ok = ok & jnp.isfinite(label) & jnp.isfinite(slope)
        return slope, ok, ok & active

    def write(self, table, idx, rows, new_cols, learn):
        grid = self.grid
        keep = jnp.reshape(learn, (1, *learn.shape) if grid else (1, 1))

        def block_rows(b, r):
            if grid:
                return jnp.where(keep, new_cols[b[0]].astype(r.dtype), r)
            out = r
            for j, c in enumerate(b):  # a column at a time, not stacked (with_column)
                out = with_column(out, j, new_cols[c])
            return jnp.where(keep, out, r)

        return tuple(
            block.at[idx].set(block_rows(b, r), mode="drop")
            for block, r, b in zip(table, rows, self.blocks, strict=True)
        )

    def close(self, state, table, new_scalars, ok, learn, active):
        scalars = {
            k: jnp.where(learn, new_scalars[k], v).astype(v.dtype) for k, v in state.scalars.items()
        }
        return LinearState(
            table,
            scalars,
            jnp.where(learn, state.t + 1, state.t),
            state.nonfinite_count + (active & ~ok).astype(jnp.int32),
        )

    def advance(self, state, cols, sums, w, g):
        cols = {**cols, **{f"{n}_sum": v for n, v in sums.items()}}
        return self.rule.advance(state.scalars, cols, w, g, state.t + 1)

    def predict(self, state, x):
        return self.look(state, x)[5]

    def step(self, state, x, label, active=True, weight=None):
        idx, vals, rows, cols, w, p, ok, sums = self.look(state, x)
        slope, ok, learn = self.learn_from(state, p, label, ok, active, weight)
        new_cols, new_scalars = self.advance(state, cols, sums, w, slope * vals)
        table = self.write(state.table, idx, rows, new_cols, learn)
        return self.close(state, table, new_scalars, ok, learn, active), p

    def step_flat(
        self, state, indices, values, start, stop, label, active=True, *, width: int, weight=None
    ):
        """:meth:`step` on one example of a flat chunk (:class:`FlatExamples`): its non-zeros
        ``indices[start:stop]`` in segments of ``width``, read once for the prediction and once
        for the update (the segments' coordinates are distinct, so the order is free). The same
        numbers as ``step`` on the example padded to one row; its cost follows the example's own
        length, not the longest's."""
        dim = state.table[0].shape[0]
        count = segment_count(start, stop, width)

        def segment(j):
            return flat_segment(indices, values, start, stop, j, width, dim)

        def read(j, carry):
            p, ok, sums = carry
            *_, p_j, ok_j, sums_j = self.look(state, segment(j))
            return p + p_j, ok & ok_j, {n: sums[n] + sums_j[n] for n in sums}

        zero = jnp.zeros(self.grid, state.table[0].dtype)
        start_sums = {n: zero for n in self.rule.sums}
        p, ok, sums = jax.lax.fori_loop(0, count, read, (zero, jnp.bool_(True), start_sums))
        slope, ok, learn = self.learn_from(state, p, label, ok, active, weight)

        def update_segment(j, carry):
            table, _ = carry
            idx, vals, rows, cols, w, *_ = self.look(state, segment(j), table)
            new_cols, new_scalars = self.advance(state, cols, sums, w, slope * vals)
            new_scalars = {k: v.astype(state.scalars[k].dtype) for k, v in new_scalars.items()}
            return self.write(table, idx, rows, new_cols, learn), new_scalars

        # every segment gives the same new scalars (they follow from the old ones and the sums)
        table, new_scalars = jax.lax.fori_loop(
            0, count, update_segment, (state.table, dict(state.scalars))
        )
        return self.close(state, table, new_scalars, ok, learn, active), p

    def update(self, state, x, label):
        return self.step(state, x, label)[0]

    def weights(self, state):
        return self.rule.current(state.scalars, self.split(state.table), state.t + 1)


def _static_zero(value) -> bool:
    """Whether a hyperparameter is a plain number equal to 0 (known when the step is traced; a
    grid's array is not)."""
    return isinstance(value, (int, float, np.number)) and value == 0


def _eta(learning_rate, t, dtype):
    """``eta_t`` of a float or an Optax schedule of ``count = t - 1`` (as in :mod:`optax`)."""
    if callable(learning_rate):
        return jnp.asarray(learning_rate(t - 1), dtype)
    return jnp.asarray(learning_rate, dtype)


_RATE = "the steps scale by it"


def ada_diag(
    learning_rate=0.5, delta: float = 1e-6, *, l1: float = 0.0, loss: str = "logistic"
) -> LinearLearner:
    """Sparse ADA-DIAG, composite mirror descent (Duchi et al. 2011, eq. 4, diagonal ``H``):
    ``s_i = sqrt(sum g_i^2)``, ``h_i = delta + s_i``,
    ``w_i <- st(w_i - eta_t g_i / h_i, eta_t l1 / h_i)``; equals
    ``sketchopt.ada_diag(learning_rate, delta, regularizer=sketchopt.regularizers.l1(l1))``.

    Coordinates: ``w``, ``s`` and ``mark`` (``E`` at the coordinate's last step); scalar ``E``,
    the sum of the learning rates so far (module docstring).
    """
    check_each(_validation.step_size, "learning_rate", learning_rate, positive=True, why=_RATE)
    check_each(_validation.ridge, "delta", delta)
    check_each(_validation.strength, "l1", l1)

    # Without L1 (a plain 0, not a grid) no threshold is ever applied: the catch-up and the
    # proximal step are the identity, left out of the compiled step (the same arithmetic).
    plain = _static_zero(l1)

    def shrink(scalars, cols):
        h = delta + cols["s"]
        return jnp.where(h > 0, (scalars["E"] - cols["mark"]) * l1 / jnp.where(h > 0, h, 1), 0)

    def current(scalars, cols, t):
        del t
        return cols["w"] if plain else soft_threshold(cols["w"], shrink(scalars, cols))

    def advance(scalars, cols, w, g, t):
        eta = _eta(learning_rate, t, w.dtype)
        s = jnp.hypot(cols["s"], g)
        h = delta + s
        inv = jnp.where(h > 0, 1 / jnp.where(h > 0, h, 1), 0)  # the safe 0/0 = 0 of delta = 0
        w = w - eta * g * inv
        if not plain:
            w = soft_threshold(w, eta * l1 * inv)
        total = scalars["E"] + eta
        return {"w": w, "s": s, "mark": jnp.broadcast_to(total, w.shape)}, {"E": total}

    rule = _Rule(("w", "s", "mark"), {"E": 0.0}, current, advance)
    return _linear("ada_diag", loss, rule, grid_shape(learning_rate, delta, l1))


def truncated_gradient(
    learning_rate=0.1,
    gravity: float = 0.0,
    theta: float = float("inf"),
    period: int = 1,
    *,
    loss: str = "logistic",
) -> LinearLearner:
    """Sparse truncated gradient (Langford, Li & Zhang 2009; slides Alg. 3): ``v = w - eta_t g``,
    then on steps ``t`` divisible by ``period`` (``K``) the coordinates with ``|v_i| <= theta``
    shrink by ``eta_t K gravity``; equals ``sketchopt.truncated_gradient`` with the same
    arguments. The skipped truncations of an absent coordinate are its lazy truncation
    (module docstring): coordinates ``w``, ``mark``; scalar ``C``, the shrinkage so far.
    """
    check_each(_validation.step_size, "learning_rate", learning_rate, positive=True, why=_RATE)
    check_each(_validation.strength, "gravity", gravity)
    check_each(_validation.strength, "theta", theta, allow_inf=True)
    if int(period) != period or period < 1:
        raise ValueError(f"period must be an integer >= 1, got {period}")
    return _truncating("truncated_gradient", learning_rate, gravity, theta, int(period), loss)


def fobos(learning_rate=0.1, l1: float = 0.0, *, loss: str = "logistic") -> LinearLearner:
    """Sparse FOBOS-L1 (Duchi & Singer 2009; slides Alg. 4): ``w <- st(w - eta_t g, eta_t l1)``;
    equals ``sketchopt.fobos_l1(learning_rate, l1)``: :func:`truncated_gradient` with
    ``gravity = l1``, ``theta = inf``, ``period = 1``."""
    check_each(_validation.step_size, "learning_rate", learning_rate, positive=True, why=_RATE)
    check_each(_validation.strength, "l1", l1)
    return _truncating("fobos", learning_rate, l1, float("inf"), 1, loss)


def _truncating(name, learning_rate, gravity, theta, period, loss) -> LinearLearner:
    def current(scalars, cols, t):
        del t
        w = cols["w"]
        return jnp.where(jnp.abs(w) <= theta, soft_threshold(w, scalars["C"] - cols["mark"]), w)

    def advance(scalars, cols, w, g, t):
        eta = _eta(learning_rate, t, w.dtype)
        amount = jnp.where(t % period == 0, eta * period * gravity, 0).astype(w.dtype)
        v = w - eta * g
        w = jnp.where(jnp.abs(v) <= theta, soft_threshold(v, amount), v)  # Alg. 3 line 5
        total = scalars["C"] + amount
        return {"w": w, "mark": jnp.broadcast_to(total, w.shape)}, {"C": total}

    rule = _Rule(("w", "mark"), {"C": 0.0}, current, advance)
    return _linear(name, loss, rule, grid_shape(learning_rate, gravity, theta))


def rda(learning_rate=1.0, l1: float = 0.0, *, loss: str = "logistic") -> LinearLearner:
    """Sparse L1-RDA (Xiao 2010; slides Alg. 5) with ``gamma = learning_rate``:
    ``w_{t+1} = -(sqrt(t) / gamma) st(G_t / t, l1)`` from the gradient sum ``G`` (coordinate
    ``gsum``); equals ``sketchopt.rda_l1(gamma, l1)``."""
    check_each(
        _validation.step_size, "learning_rate (gamma)", learning_rate, positive=True, why=_RATE
    )
    check_each(_validation.strength, "l1", l1)
    gamma = learning_rate

    def current(scalars, cols, t):
        del scalars
        seen = (t - 1).astype(cols["gsum"].dtype)  # gradients summed before step t
        safe = jnp.maximum(seen, 1)
        w = -(jnp.sqrt(safe) / gamma) * soft_threshold(cols["gsum"] / safe, l1)
        return jnp.where(seen > 0, w, 0)

    def advance(scalars, cols, w, g, t):
        del w, t
        return {"gsum": cols["gsum"] + g}, scalars

    return _linear("rda", loss, _Rule(("gsum",), {}, current, advance), grid_shape(gamma, l1))


def ftrl(
    learning_rate=0.5, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0, *, loss="logistic"
) -> LinearLearner:
    """Sparse FTRL-Proximal (McMahan et al. 2013, Alg. 1; slides Alg. 6) with
    ``alpha = learning_rate`` (a constant: a schedule would move absent coordinates' ``z``):
    coordinates ``z`` and ``sqrt_n``, weights
    ``-st(z, l1) / (l2 + (beta + sqrt_n) / alpha)``; equals
    ``sketchopt.ftrl_proximal(alpha, beta, l1, l2)``. The defaults ``alpha = 0.5, beta = 1``
    made the same test errors as VW ``--ftrl`` at its defaults on the streams benchmark's
    files, as downloaded and shuffled (``alpha = 0.1`` made up to 3 points more)."""
    if callable(learning_rate):
        raise ValueError("sparse FTRL-Proximal takes a constant alpha (learning_rate)")
    check_each(
        _validation.step_size, "learning_rate (alpha)", learning_rate, positive=True, why=_RATE
    )
    check_each(_validation.strength, "beta", beta)
    check_each(_validation.strength, "l1", l1)
    check_each(_validation.strength, "l2", l2)
    alpha = learning_rate

    def weights(z, sqrt_n):
        denominator = l2 + (beta + sqrt_n) / alpha
        return -soft_threshold(z, l1) / jnp.where(denominator > 0, denominator, 1)

    def current(scalars, cols, t):
        del scalars, t
        return weights(cols["z"], cols["sqrt_n"])

    def advance(scalars, cols, w, g, t):
        del t
        sqrt_n = jnp.hypot(cols["sqrt_n"], g)  # Alg. 1: n_i += g_i^2
        sigma = (sqrt_n - cols["sqrt_n"]) / alpha
        return {"z": cols["z"] + g - sigma * w, "sqrt_n": sqrt_n}, scalars

    rule = _Rule(("z", "sqrt_n"), {}, current, advance)
    return _linear("ftrl", loss, rule, grid_shape(alpha, beta, l1, l2))


def nag(learning_rate=0.5, *, loss: str = "logistic") -> LinearLearner:
    """Sparse NAG, normalized adaptive gradient (Ross, Mineiro & Langford 2013, "Normalized
    online learning", Alg. 2), the update behind VW's default ``--adaptive --normalized``.

    Per coordinate the largest magnitude seen ``s_i``; before predicting, a coordinate of ``x``
    above it rescales its weight, ``w_i <- w_i s_i^2 / x_i^2``, ``s_i <- |x_i|`` (line 5-6);
    then ``N <- N + sum_i x_i^2 / s_i^2``, ``G_i <- G_i + g_i^2`` and
    ``w_i <- w_i - eta sqrt(t / N) g_i / (s_i sqrt(G_i))`` (lines 8-10). Scale-free: multiplying
    a feature by a constant does not change the predictions. Only ``x``'s coordinates change,
    so the step is ``O(s)`` with nothing to catch up. No dense counterpart exists in
    :mod:`sketchopt`: the tests compare it with a float64 NumPy loop over all coordinates.

    Coordinates ``w``, ``s``, ``sqrt_g`` (``sqrt(G)``); scalar ``N``.
    """
    check_each(_validation.step_size, "learning_rate", learning_rate, positive=True, why=_RATE)

    def safe_div(a, b):
        return jnp.where(b > 0, a / jnp.where(b > 0, b, 1), 0)

    def project(cols, vals):
        big = jnp.abs(vals)
        grow = big > cols["s"]
        w = jnp.where(grow, cols["w"] * jnp.square(safe_div(cols["s"], big)), cols["w"])
        s = jnp.maximum(cols["s"], big)
        return {**cols, "w": w, "s": s, "ratio": jnp.square(safe_div(big, s))}

    def current(scalars, cols, t):
        del scalars, t
        return cols["w"]

    def advance(scalars, cols, w, g, t):
        n = scalars["N"] + cols["ratio_sum"]
        sqrt_g = jnp.hypot(cols["sqrt_g"], g)
        rate = _eta(learning_rate, t, w.dtype) * jnp.sqrt(safe_div(t.astype(w.dtype), n))
        w = w - rate * safe_div(g, cols["s"] * sqrt_g)
        return {"w": w, "s": cols["s"], "sqrt_g": sqrt_g}, {"N": n}

    rule = _Rule(("w", "s", "sqrt_g"), {"N": 0.0}, current, advance, project, ("ratio",))
    return _linear("nag", loss, rule, grid_shape(learning_rate))


#: The learners by the CLI's ``--learner`` names.
LEARNERS: dict[str, Callable[..., LinearLearner]] = {
    "ada_diag": ada_diag,
    "fobos": fobos,
    "truncated_gradient": truncated_gradient,
    "rda": rda,
    "ftrl": ftrl,
    "nag": nag,
}

#: The second-order learners' names (:data:`sketchopt.stream.second_order.SECOND_ORDER`).
SECOND_ORDER_NAMES = tuple(SECOND_ORDER)


def make_learner(name: str, **options) -> LinearLearner:
    """The learner ``name`` of :data:`LEARNERS` or of
    :data:`sketchopt.stream.second_order.SECOND_ORDER` with ``options`` (its keyword
    arguments)."""
    if name in SECOND_ORDER:
        return SECOND_ORDER[name](**options)
    if name not in LEARNERS:
        names = ", ".join([*LEARNERS, *SECOND_ORDER_NAMES])
        raise ValueError(f"unknown learner {name!r}; use one of {names}")
    return LEARNERS[name](**options)
