"""Progressive validation over a whole stream, one compiled ``lax.scan`` per chunk.

:func:`run_stream` walks a stream of chunks, padded :class:`SparseExamples` (what
:func:`sketchopt.stream.data.iter_svmlight` yields, or :func:`chunked` of an in-memory batch),
:class:`FlatExamples` (:func:`as_flat`, :func:`auto_layout`: each example costs its own length)
or :class:`~sketchopt.stream.crosses.CrossedExamples` (VW's ``-q`` crosses built in the step):
each example is predicted, scored, then learned from (progressive validation, as VW reports it),
the state carried from chunk to chunk, so memory is one chunk and one state whatever the
stream's length. The chunk function is compiled once per chunk shape, outside the timed calls
(compilation and the host's loading are not in the measured ``seconds``). Totals are
accumulated on the host in float64, example by example in stream order (``np.cumsum``), so a run
resumed from a saved :class:`Progress` gives the same numbers, to the bit, as one uninterrupted
run.

:func:`run_grid` runs every point of a hyperparameter grid (times seeds) in the same pass,
one compiled program, through the learners' grid form: every example touches ``O(s)`` rows,
each holding all configurations' numbers of its coordinate.

Rows whose ``mask`` is false (a chunk's padding) and examples skipped as bad input (see
:mod:`sketchopt.stream.learners`) are not scored. Chunks with ``weights`` (importance weights)
pass each example's to the learner's step.

**Holdout** (VW's, for more than one pass: ``holdout_period=k``): the ``k``-th, ``2k``-th, ...
example of every pass (counted from 1 over the real rows of the stream, VW's ``in_pass_counter
% holdout_period == 0``) is predicted and never learned from; its loss and error go to
``StreamResult.holdout`` instead of the progressive totals.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt.stream import crosses
from sketchopt.stream.crosses import CrossedExamples, CrossLayout
from sketchopt.stream.examples import (
    FlatExamples,
    SparseExamples,
    SparseVector,
    pad_rows,
    read_cost,
    rows,
    segment_width,
    to_flat,
)
from sketchopt.stream.learners import LinearLearner, class_label, error, loss_value

__all__ = [
    "GridResult",
    "as_flat",
    "auto_layout",
    "flat_pays",
    "Progress",
    "StreamResult",
    "chunked",
    "evaluate",
    "run_grid",
    "run_stream",
]


class Progress(NamedTuple):
    """Running totals of a progressive validation (float64 on the host; per configuration for
    a grid): examples scored, and the sums of their losses and errors."""

    examples: np.ndarray
    loss_sum: np.ndarray
    error_sum: np.ndarray

    @classmethod
    def zeros(cls, shape=()) -> Progress:
        return cls(np.zeros(shape, np.int64), np.zeros(shape), np.zeros(shape))


def _held(mask: np.ndarray, seen: int, period: int | None) -> np.ndarray:
    """Which rows of a chunk are held out: the real rows whose 1-based position in the pass
    (``seen`` real rows came before the chunk) is a multiple of ``period``."""
    mask = np.asarray(mask, bool)
    if not period:
        return np.zeros_like(mask)
    position = seen + np.cumsum(mask)
    return mask & (position % int(period) == 0)


@dataclasses.dataclass
class StreamResult:
    """What :func:`run_stream` measured.

    ``curve`` lists VW's report at doubling example counts (1, 2, 4, ...): the ``examples``
    scored, the progressive ``average_loss`` and ``average_error`` up to there and the
    ``since_last`` loss over the examples since the previous line. ``seconds`` is the pass
    alone (compiled chunk calls, waited for); ``examples_per_second`` is ``examples / seconds``
    of this call.
    """

    state: Any
    progress: Progress
    curve: list[dict]
    seconds: float
    examples_per_second: float
    holdout: Progress | None = None  # the held-out examples' totals (``holdout_period``)

    @property
    def holdout_loss(self):
        return None if self.holdout is None else _mean(self.holdout.loss_sum, self.holdout.examples)

    @property
    def holdout_error(self):
        return (
            None if self.holdout is None else _mean(self.holdout.error_sum, self.holdout.examples)
        )

    @property
    def examples(self) -> int:
        return int(np.max(self.progress.examples))

    @property
    def progressive_loss(self):
        return _mean(self.progress.loss_sum, self.progress.examples)

    @property
    def progressive_error(self):
        return _mean(self.progress.error_sum, self.progress.examples)


@dataclasses.dataclass
class GridResult(StreamResult):
    """:class:`StreamResult` of a grid: ``points`` holds each configuration's hyperparameters
    (and ``seed``), in the order of the leading axis of ``state`` and of the progress arrays."""

    points: list[dict] = dataclasses.field(default_factory=list)


def _mean(total, count):
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def chunked(
    examples: SparseExamples, chunk_size: int, dim: int, *, flat: bool = False, width=None
) -> Iterator[SparseExamples | FlatExamples]:
    """``examples`` in chunks of ``chunk_size`` rows, the last padded (masked rows); with
    ``flat``, as :class:`FlatExamples` (see :func:`as_flat`)."""
    n = examples.size
    chunks = (
        pad_rows(rows(examples, start, start + chunk_size), chunk_size, dim)
        for start in range(0, max(n, 1), chunk_size)
    )
    yield from (as_flat(chunks, dim, width) if flat else chunks)


def flat_pays(chunk: SparseExamples, dim: int, *, ratio: float = 1.0) -> bool:
    """Whether reading ``chunk`` flat is modelled to cost less than reading it padded, by the
    factor ``ratio``: the choice of :func:`auto_layout`.

    The model is :func:`~sketchopt.stream.examples.read_cost`, in entries read per example:
    padded, the padded width ``W``; flat, ``segments_i (SEGMENT_OVERHEAD + S)`` at the segment
    width ``S`` of :func:`~sketchopt.stream.examples.segment_width`, averaged over the real
    rows. Flat pays where ``W`` is
    more than ``ratio`` times that. A flat segment's fixed cost (its loops, about a thousand
    entries' worth) decides it: on the VW benchmark's MNIST stream (``W = 304``, 152 non-zeros
    on average) padded chunks ran ``oja_son`` at 66k examples/s and flat ones at 44k, and with
    every other example cut to a fifth (``W = 301``, 91 on average) at 70k and 44k; crossed
    MNIST pixels (12k non-zeros on average, 42k at most) still read flat."""
    indices = np.asarray(chunk.indices)
    real = np.asarray(chunk.mask)
    if not real.any():
        return False
    counts = (indices[real] != dim).sum(axis=1)
    flat_cost = float(np.mean(read_cost(counts, segment_width(counts))))
    return bool(indices.shape[1] > ratio * flat_cost)


def auto_layout(
    chunks: Iterable[SparseExamples], dim: int, *, ratio: float = 1.0
) -> Iterator[SparseExamples | FlatExamples]:
    """The chunks as they are, or as :class:`FlatExamples` where the first chunk says flat
    pays (:func:`flat_pays`); the choice holds for the stream.

    Measured on the VW benchmark's streams: on examples of a few hundred non-zeros flat chunks
    cost ``oja_son`` and FTRL 1.4-1.5x more than padded ones (two loops of segments per example,
    whatever their lengths; ``ada_diag`` 12% less), and save 1.5-3x where examples run to
    thousands of non-zeros and their lengths vary (crossed MNIST pixels: 12k non-zeros on
    average, 42k at most)."""
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return
    rest = itertools.chain([first], chunks)
    yield from (as_flat(rest, dim) if flat_pays(first, dim, ratio=ratio) else rest)


def as_flat(
    chunks: Iterable[SparseExamples], dim: int, width: int | None = None
) -> Iterator[FlatExamples]:
    """The chunks as :class:`FlatExamples`, for streams whose examples' lengths vary: the
    runner then costs each example by its own length. ``width`` (the segment a learner reads at
    a time) defaults to the first chunk's choice (:func:`~sketchopt.stream.examples.to_flat`)
    and is kept for the whole stream."""
    for chunk in chunks:
        flat = to_flat(chunk, dim, width)
        width = flat.width
        yield flat


def _scan_chunk(learner: LinearLearner, width: int | CrossLayout | None = None):
    """``(state, chunk, held) -> (state, (loss, error, scored, held_scored, p))`` per example of the
    chunk: a :class:`SparseExamples` chunk, with ``width`` the arrays of a
    :class:`FlatExamples`, with a :class:`~sketchopt.stream.crosses.CrossLayout` those of a
    :class:`~sketchopt.stream.crosses.CrossedExamples`; ``held`` marks the held-out rows
    (predicted, not learned from)."""

    def learned(state, new, p, active, held):
        # what the scan keeps per example: the prediction and whether the step learned from it
        # (a step skipped for a non-finite value counts nowhere); the losses are computed once
        # per chunk, vectorized, in ``scored`` (a scalar op in the scan body is a kernel per
        # example on the CPU)
        return new, (p, active & ~held & (new.nonfinite_count == state.nonfinite_count))

    def scored(run):
        def wrapped(state, chunk, held):
            state, (p, ok) = run(state, chunk, held)
            per_row = (-1,) + (1,) * (p.ndim - 1)  # the rows' values against a grid's axes
            label = class_label(learner.loss, chunk.labels.astype(p.dtype)).reshape(per_row)
            active, held_i = chunk.mask.reshape(per_row), held.reshape(per_row)
            loss = loss_value(learner.loss, p, label)
            held_ok = active & held_i & jnp.isfinite(loss)
            loss = jnp.where(ok | held_ok, loss, 0)
            err = jnp.where(ok | held_ok, error(p, label), 0)
            return state, (loss, err, ok, held_ok, p)

        return wrapped

    def weighted(chunk):
        return {} if chunk.weights is None else {"weight": chunk.weights}

    def run(state, chunk, held):
        def body(state, example):
            idx, val, label, active, held_i, extra = example
            new, p = learner.step(state, SparseVector(idx, val), label, active & ~held_i, **extra)
            return learned(state, new, p, active, held_i)

        xs = (chunk.indices, chunk.values, chunk.labels, chunk.mask, held, weighted(chunk))
        return jax.lax.scan(body, state, xs)

    def run_flat(state, chunk, held):
        def body(state, example):
            start, stop, label, active, held_i, extra = example
            new, p = learner.step_flat(
                state, chunk.indices, chunk.values, start, stop, label, active & ~held_i,
                width=width, **extra,
            )  # fmt: skip
            return learned(state, new, p, active, held_i)

        xs = (chunk.starts, chunk.stops, chunk.labels, chunk.mask, held, weighted(chunk))
        return jax.lax.scan(body, state, xs)

    def run_crossed(state, chunk, held):
        layout = width

        def body(carry, example):
            state, tables = carry
            entries, label, active, held_i, extra = example
            total, tables = crosses.expand(entries, tables, layout)
            new, p = learner.step_flat(
                state, tables[1], tables[2], 0, total, label, active & ~held_i,
                width=layout.width, **extra,
            )  # fmt: skip
            new, out = learned(state, new, p, active, held_i)
            return (new, tables), out

        entries = chunk.entries
        xs = (entries, chunk.labels, chunk.mask, held, weighted(chunk))
        tables = crosses.scratch(layout, chunk.values.dtype)
        (state, _), out = jax.lax.scan(body, (state, tables), xs)
        return state, out

    if isinstance(width, CrossLayout):
        return scored(run_crossed)
    return scored(run if width is None else run_flat)


def _doubling_lines(progress: Progress, loss, err, scored, curve: list[dict]) -> Progress:
    """Adds one chunk's per-example results (``(..., N)``) to ``progress`` in stream order and
    appends VW-style lines at the doubling counts crossed."""
    loss = np.asarray(loss, np.float64) * scored
    err = np.asarray(err, np.float64) * scored
    counts = progress.examples[..., None] + np.cumsum(scored, axis=-1)
    loss_c = np.cumsum(np.concatenate([progress.loss_sum[..., None], loss], axis=-1), axis=-1)
    err_c = np.cumsum(np.concatenate([progress.error_sum[..., None], err], axis=-1), axis=-1)
    new = Progress(counts[..., -1], loss_c[..., -1], err_c[..., -1])
    first = np.reshape(counts, (-1, counts.shape[-1]))[0]  # the grid shares the counts
    flat_loss = np.reshape(loss_c, (-1, loss_c.shape[-1]))
    flat_err = np.reshape(err_c, (-1, err_c.shape[-1]))
    target = 1 if not curve else 2 * curve[-1]["examples"]
    for j in range(first.shape[0]):
        if first[j] == target and (j == 0 or first[j - 1] < target):
            last = curve[-1] if curve else {"examples": 0, "loss_sum": 0.0}
            total = flat_loss[:, j + 1]
            last_sum = np.asarray(last["loss_sum"])
            line = {
                "examples": int(target),
                "average_loss": _squeeze(total / target),
                "average_error": _squeeze(flat_err[:, j + 1] / target),
                "since_last": _squeeze((total - last_sum) / (target - last["examples"])),
                "loss_sum": _squeeze(total),
            }
            curve.append(line)
            target *= 2
    return new


def _squeeze(x):
    x = np.asarray(x)
    return float(x[0]) if x.size == 1 else x.tolist()


_PER_ROW = ("labels", "mask", "weights")
_ROW_FIELDS = {
    SparseExamples: ("indices", "values", *_PER_ROW),
    FlatExamples: ("starts", "stops", *_PER_ROW),
    CrossedExamples: ("indices", "hashes", "values", "counts", "spans", *_PER_ROW),
}


def _trimmed(chunk):
    """``chunk`` without the padding rows after its last real row: a stream's last chunk, or a
    short stream's only one, is padded to the full chunk size by the loaders, and a padding row
    costs a whole step (a 1000-example file in chunks of 4096 ran four times the steps; trimmed
    to the next power of two, still up to twice). One more shape per stream (its last chunk),
    compiled outside the timed calls, as any other length would be; the padding rows never
    change the state, so the numbers are the same."""
    mask = np.asarray(chunk.mask)
    rows = mask.shape[0]
    real = np.flatnonzero(mask)
    keep = int(real[-1]) + 1 if real.size else 1
    if keep >= rows:
        return chunk
    fields = _ROW_FIELDS[type(chunk)]
    return chunk._replace(
        **{k: None if getattr(chunk, k) is None else np.asarray(getattr(chunk, k))[:keep]
           for k in fields}
    )  # fmt: skip


def _on_device(chunk):
    """The chunk's arrays as JAX arrays (an absent ``weights`` kept); its static side (a flat
    chunk's ``width``, a crossed chunk's ``layout``, else ``None``)."""
    if isinstance(chunk, FlatExamples):
        arrays = {k: v for k, v in chunk._asdict().items() if k != "width"}
        width = chunk.width
        chunk = chunk._replace(width=None)
    elif isinstance(chunk, CrossedExamples):
        arrays = {k: v for k, v in chunk._asdict().items() if k != "layout"}
        width = chunk.layout
        chunk = chunk._replace(layout=None)
    else:
        arrays, width = chunk._asdict(), None
    return chunk._replace(
        **{k: None if v is None else jnp.asarray(v) for k, v in arrays.items()}
    ), width


def _drive(
    learner: LinearLearner, state, chunks: Iterable, progress: Progress, curve, bar,
    holdout_period: int | None = None, observe: Callable | None = None,
) -> tuple[Any, Progress, float, Progress]:  # fmt: skip
    """Runs the chunks; each chunk shape compiles once, outside the timed calls."""
    compiled: dict = {}
    seconds, seen = 0.0, 0
    held_totals = Progress.zeros(learner.grid)
    for chunk in chunks:
        chunk, width = _on_device(_trimmed(chunk))
        mask = np.asarray(chunk.mask)
        held = jnp.asarray(_held(mask, seen, holdout_period))
        seen += int(mask.sum())
        key = (width, jax.tree.map(lambda a: a.shape, tuple(chunk)))
        if key not in compiled:
            fn = jax.jit(_scan_chunk(learner, width), donate_argnums=0)
            compiled[key] = fn.lower(state, chunk, held).compile()
        start = time.perf_counter()
        state, (loss, err, scored, held_scored, p) = compiled[key](state, chunk, held)
        jax.block_until_ready((state, loss))
        seconds += time.perf_counter() - start
        loss, err, scored, held_scored, p = (
            np.moveaxis(np.asarray(a), 0, -1) for a in (loss, err, scored, held_scored, p)
        )
        if observe is not None:
            observe(p, loss, scored | held_scored)
        progress = _doubling_lines(progress, loss, err, scored, curve)
        if holdout_period:
            held_totals = Progress(
                held_totals.examples + held_scored.sum(-1),
                held_totals.loss_sum + (np.asarray(loss, np.float64) * held_scored).sum(-1),
                held_totals.error_sum + (np.asarray(err, np.float64) * held_scored).sum(-1),
            )
        if bar is not None:
            bar.update(int(mask.sum()))
    return state, progress, seconds, held_totals


def _bar(progress: bool, total: int | None):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="ex", smoothing=0.1)


def run_stream(
    learner: LinearLearner,
    chunks: Iterable[SparseExamples],
    dim: int,
    *,
    state=None,
    start: Progress | None = None,
    curve: list[dict] | None = None,
    dtype=jnp.float32,
    key=None,
    progress: bool = False,
    total: int | None = None,
    holdout_period: int | None = None,
    observe: Callable | None = None,
) -> StreamResult:
    """One online pass of ``learner`` over ``chunks`` (all of one shape) with progressive
    validation; ``state``/``start``/``curve`` continue an earlier run (see the module
    docstring); ``progress`` shows a ``tqdm`` bar (``total`` examples, when known);
    ``holdout_period`` holds every ``k``-th example out of learning (module docstring).
    ``observe(p, loss, scored)``, when given, is called after each chunk with its rows'
    predictions (made before each row was learned from), losses and whether each was scored
    (learned from or held out), NumPy arrays of the chunk's rows without its trailing padding
    (the command line's progressive ``-p`` and ``-P`` lines)."""
    state = learner.init(dim, dtype, key) if state is None else state
    # init runs asynchronously (Oja-SON's is a QR of d x m): it must not land in the timed pass
    state = jax.block_until_ready(state)
    start = Progress.zeros(learner.grid) if start is None else start
    curve = [] if curve is None else curve
    bar = _bar(progress, total)
    try:
        state, prog, seconds, held = _drive(
            learner, state, chunks, start, curve, bar, holdout_period, observe
        )
    finally:
        if bar is not None:
            bar.close()
    examples = int(np.max(prog.examples - start.examples + held.examples))
    rate = examples / seconds if seconds else 0.0
    return StreamResult(state, prog, curve, seconds, rate, held if holdout_period else None)


def run_grid(
    make: Callable[..., LinearLearner],
    grid: dict[str, Iterable],
    chunks: Iterable[SparseExamples],
    dim: int,
    *,
    seeds: Iterable[int] = (0,),
    dtype=jnp.float32,
    progress: bool = False,
    total: int | None = None,
) -> GridResult:
    """Every configuration of ``grid`` (the product of its values) and of ``seeds`` in one pass
    over ``chunks``: ``make(**point)`` builds the learner, called with 1-D arrays of the ``G``
    configurations' values so that the learner runs them all at once (its grid form, see
    :class:`~sketchopt.stream.learners.LinearLearner`). ``seeds`` are the ``key`` of ``init``
    (one per configuration; the first-order learners have no randomness and ignore it).

    Why not ``jax.vmap`` over a configuration axis: batched in front, each configuration's
    state is its own ``(d, k)`` table and an example touches ``G`` rows far apart (measured at
    ``G = 49``, ``d = 2**20``: 18.6x one configuration's time per example); batched inside
    (``in_axes=1``) XLA:CPU transposes the table at every step. The grid form keeps the ``G``
    configurations of a coordinate in one row (measured: 5.1x for the bare gather and scatter).
    """
    names = list(grid)
    points = [
        dict(zip(names, values, strict=True)) | {"seed": seed}
        for values in itertools.product(*(list(grid[n]) for n in names))
        for seed in seeds
    ]
    learner = make(**{n: np.asarray([p[n] for p in points]) for n in names})
    if learner.grid != (len(points),):
        raise ValueError(f"make(**grid) built a learner of grid {learner.grid}, not {len(points)}")
    keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray([p["seed"] for p in points]))
    state = learner.init(dim, dtype, keys)
    result = run_stream(learner, chunks, dim, state=state, progress=progress, total=total)
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(StreamResult)}
    return GridResult(**fields, points=points)


def evaluate(
    learner: LinearLearner, state, chunks: Iterable[SparseExamples]
) -> tuple[float, float, np.ndarray]:
    """Mean loss, error rate and the predictions of ``state`` (not learning) on ``chunks``."""

    @jax.jit
    def run(state, chunk):
        p = jax.vmap(learner.predict, in_axes=(None, 0))(state, chunk.x)
        labels = class_label(learner.loss, chunk.labels.astype(p.dtype))
        return p, loss_value(learner.loss, p, labels), error(p, labels)

    @functools.partial(jax.jit, static_argnums=2)
    def run_crossed(state, chunk, layout):
        def body(tables, entries):
            total, tables = crosses.expand(entries, tables, layout)
            return tables, learner.predict(state, crosses.as_vector(total, tables, layout))

        entries = chunk.entries
        _, p = jax.lax.scan(body, crosses.scratch(layout, chunk.values.dtype), entries)
        labels = class_label(learner.loss, chunk.labels.astype(p.dtype))
        return p, loss_value(learner.loss, p, labels), error(p, labels)

    preds, losses, errors = [], [], []
    for chunk in chunks:
        if isinstance(chunk, FlatExamples):
            raise TypeError("evaluate takes padded SparseExamples chunks, not FlatExamples")
        chunk, layout = _on_device(chunk)
        p, loss, err = run(state, chunk) if layout is None else run_crossed(state, chunk, layout)
        keep = np.asarray(chunk.mask)
        preds.append(np.asarray(p)[keep])
        losses.append(np.asarray(loss, np.float64)[keep])
        errors.append(np.asarray(err, np.float64)[keep])
    preds = np.concatenate(preds) if preds else np.zeros(0)
    if not preds.size:
        return float("nan"), float("nan"), preds
    return float(np.concatenate(losses).mean()), float(np.concatenate(errors).mean()), preds
