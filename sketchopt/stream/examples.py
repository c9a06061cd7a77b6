"""Sparse examples: padded ``(indices, values)`` rows with a static bound on the non-zeros.

A stream of ``N`` examples over ``d`` features with at most ``s`` non-zeros each is
:class:`SparseExamples` ``(indices (N, s) int32, values (N, s), labels (N,), mask (N,))``. The
layout is the one XLA handles best: every example has the same static shape, so a chunk is one
array that ``lax.scan`` walks and ``vmap`` batches, and an update gathers and scatters ``s``
entries of the ``d``-vectors of the state, ``O(s)`` whatever ``d``. (``BCOO`` stores the same
arrays with its own ``nse`` bound; a scan over its rows would unpack them to exactly this.)

Invariants, which :func:`from_csr` and the loaders of :mod:`sketchopt.stream.data` establish:

* the non-padding indices of one example are distinct (duplicates, as feature hashing produces
  them, are summed) and lie in ``[0, d)``;
* padding entries have index ``d`` (one past the end) and value 0: gathers read them as 0
  (``mode="fill"``) and scatters drop them (``mode="drop"``);
* values and labels are finite; labels lie in the loss's domain (:func:`check_labels`);
* ``mask`` is false for the rows that only pad a chunk to its static length;
* ``weights``, when present, are the examples' importance weights (finite, ``>= 0``; ``None``
  means 1 for every example): an example of weight ``h`` is learned as if its loss were ``h``
  times larger (its gradient scaled by ``h``, as VW's non-invariant updates; weight 0 is
  predicted and not learned from).

**The constant feature** (VW's, on by default in the command line): :func:`with_constant` adds
feature ``d`` with value 1 to every example of a ``d``-feature stream, a slot of its own outside
the data's (or the hash's) range, so the weights have dimension ``d + 1`` and each learner learns
the bias by its own rule, as any other feature.

An example that breaks them anyway (an index below 0 or above ``d``, a NaN value) reaching a
learner is skipped and counted, never learned from (:mod:`sketchopt.stream.learners`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CLASSIFICATION_LOSSES",
    "FlatExamples",
    "SparseExamples",
    "SparseVector",
    "binary_classes",
    "check_labels",
    "flat_segment",
    "from_csr",
    "from_dense",
    "hash_indices",
    "pad_rows",
    "read_cost",
    "rows",
    "segment_width",
    "to_dense",
    "to_flat",
    "with_constant",
]

#: Losses whose labels are classes ``{-1, +1}`` (``{0, 1}`` is accepted and mapped).
CLASSIFICATION_LOSSES = ("logistic", "hinge", "squared_hinge")


class SparseVector(NamedTuple):
    """One example's features: ``indices (s,)`` int32 (padding: ``d``) and ``values (s,)``."""

    indices: jax.Array
    values: jax.Array


class SparseExamples(NamedTuple):
    """A batch (chunk) of examples; see the module docstring for the invariants."""

    indices: jax.Array  # (N, s) int32
    values: jax.Array  # (N, s)
    labels: jax.Array  # (N,)
    mask: jax.Array  # (N,) bool: false for padding rows
    weights: jax.Array | None = None  # (N,) importance weights; None: 1 for every example

    @property
    def x(self) -> SparseVector:
        return SparseVector(self.indices, self.values)

    @property
    def size(self) -> int:
        """The number of rows (padding included)."""
        return int(self.labels.shape[0])


def binary_classes(labels, loss: str) -> tuple[float, float] | None:
    """The pair ``(negative, positive)`` that :func:`check_labels` maps to ``{-1, +1}`` for a
    file whose distinct labels are ``labels``, or ``None`` where no mapping beyond
    :func:`check_labels`' own is needed or possible.

    LIBSVM's binary problems also come with two other labels (``1/2`` in ``mushrooms``,
    ``covtype.binary`` and ``skin_nonskin``, ``2/4`` in ``breast-cancer``): for a classification
    loss a file of exactly two distinct labels that are neither ``{-1, +1}`` nor ``{0, 1}``
    gets the smaller as the negative class and the larger as the positive one (scikit-learn's
    ``LabelBinarizer`` order, independent of the file's order), except ``{-1, 0}``, whose 0
    could be either class. A test file is read with its training file's pair, which it may
    hold only one of.
    """
    values = sorted(set(np.asarray(labels, np.float64).reshape(-1).tolist()))
    if loss not in CLASSIFICATION_LOSSES or len(values) != 2 or not all(map(np.isfinite, values)):
        return None
    # {-1, 0} mixes the two conventions (0 is the negative class of one): refused as {-1, 0, 1}
    if set(values) <= {-1.0, 1.0} or set(values) <= {0.0, 1.0} or values == [-1.0, 0.0]:
        return None
    return values[0], values[1]


#: The most label values an error message lists (then their count).
_LISTED_LABELS = 20


def _listed(values: list) -> str:
    """``values`` as a list: the first ``_LISTED_LABELS``, and the count when there are more."""
    if len(values) <= _LISTED_LABELS:
        return str(values)
    shown = ", ".join(str(v) for v in values[:_LISTED_LABELS])
    return f"[{shown}, ...] ({len(values)} distinct)"


def _found(values: set, allowed: set) -> str:
    """The labels outside ``allowed`` and, when other labels came with them, every distinct
    label (``found [2.0] among the labels [-1.0, 1.0, 2.0]``): a file of three labels says
    which three."""
    bad = sorted(values - allowed)
    if len(bad) == len(values):
        return f"found {_listed(bad)}"
    return f"found {_listed(bad)} among the labels {_listed(sorted(values))}"


def check_labels(labels, loss: str, *, source=None, classes=None) -> np.ndarray:
    """Labels as float64 in the domain of ``loss``, or a ``ValueError`` naming the bad ones.

    Classification losses (:data:`CLASSIFICATION_LOSSES`) take ``{-1, +1}``, or ``{0, 1}``
    (mapped to ``{-1, +1}``, as LIBSVM files of binary problems often hold them); ``squared``
    takes any finite number. A file mixing the two conventions (``{-1, 0, 1}``) is refused: its
    0 could mean either. ``classes`` (a pair ``(negative, positive)``, :func:`binary_classes`)
    maps those two labels to ``-1`` and ``+1`` instead and refuses any other. ``source`` (a
    file's name), when given, heads the error.
    """
    labels = np.asarray(labels, np.float64).reshape(-1)

    def refuse(message):
        return ValueError(message if source is None else f"{os.fspath(source)}: {message}")

    finite = np.isfinite(labels)
    if not np.all(finite):
        raise refuse(f"labels must be finite; found {labels[~finite][:5]}")
    if loss in CLASSIFICATION_LOSSES and classes is not None:
        negative, positive = (float(c) for c in classes)
        values = set(np.unique(labels).tolist())
        if not values <= {negative, positive}:
            found = _found(values, {negative, positive})
            raise refuse(
                f"labels must be the classes {negative:g} (-1) and {positive:g} (+1); {found}"
            )
        return np.where(labels == positive, 1.0, -1.0)
    if loss in CLASSIFICATION_LOSSES:
        values = set(np.unique(labels).tolist())
        if values <= {0.0, 1.0}:
            return np.where(labels > 0, 1.0, -1.0)
        if not values <= {-1.0, 1.0}:
            found = _found(values, {-1.0, 1.0})
            raise refuse(f"the {loss} loss takes labels in {{-1, +1}} (or {{0, 1}}); {found}")
    elif loss != "squared":
        raise ValueError(f"unknown loss {loss!r}; use squared or one of {CLASSIFICATION_LOSSES}")
    return labels


def hash_indices(indices, bits: int, seed: int = 0) -> np.ndarray:
    """Feature indices hashed into ``[0, 2**bits)`` by scikit-learn's MurmurHash3 (32 bit), the
    hash VW and ``FeatureHasher`` use; colliding features are then summed by :func:`from_csr`."""
    from sklearn.utils import murmurhash3_32

    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= 2**31):
        raise ValueError("feature indices to hash must lie in [0, 2**31)")
    hashed = murmurhash3_32(indices.astype(np.int32), seed=seed, positive=True)
    return (np.asarray(hashed, np.uint32) & np.uint32((1 << bits) - 1)).astype(np.int64)


def from_csr(
    matrix, labels, *, dim: int | None = None, nnz: int | None = None, dtype=np.float32
) -> SparseExamples:
    """:class:`SparseExamples` of the rows of a SciPy CSR matrix (duplicates summed, explicit
    zeros dropped), padded to ``nnz`` non-zeros per row (default: the most any row has).

    Raises ``ValueError`` for an index outside ``[0, dim)``, a non-finite value, or a row with
    more than ``nnz`` non-zeros. Labels are taken as given (see :func:`check_labels`).
    """
    import scipy.sparse

    matrix = scipy.sparse.csr_matrix(matrix, dtype=np.float64, copy=True)
    dim = matrix.shape[1] if dim is None else int(dim)
    if matrix.shape[1] > dim:
        raise ValueError(f"the data has {matrix.shape[1]} features, more than dim = {dim}")
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    if matrix.nnz and not np.all(np.isfinite(matrix.data)):
        rows = np.repeat(np.arange(matrix.shape[0]), np.diff(matrix.indptr))
        bad = rows[~np.isfinite(matrix.data)]
        raise ValueError(f"non-finite feature values in examples {np.unique(bad)[:5].tolist()}")
    counts = np.diff(matrix.indptr)
    most = int(counts.max(initial=0))
    nnz = max(most, 1) if nnz is None else int(nnz)
    if most > nnz:
        raise ValueError(f"an example has {most} non-zeros, more than nnz = {nnz}")
    n = matrix.shape[0]
    indices = np.full((n, nnz), dim, np.int32)
    values = np.zeros((n, nnz), dtype)
    rows = np.repeat(np.arange(n), counts)
    cols = np.arange(matrix.nnz) - np.repeat(matrix.indptr[:-1], counts)
    indices[rows, cols] = matrix.indices
    values[rows, cols] = matrix.data
    labels = np.asarray(labels, dtype).reshape(-1)
    if labels.shape[0] != n:
        raise ValueError(f"{labels.shape[0]} labels for {n} examples")
    return SparseExamples(indices, values, labels, np.ones((n,), bool))


def from_dense(x, labels, *, nnz: int | None = None, dtype=np.float32) -> SparseExamples:
    """:class:`SparseExamples` of the rows of a dense ``(N, d)`` array (zeros left out)."""
    import scipy.sparse

    x = np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("non-finite feature values")
    return from_csr(scipy.sparse.csr_matrix(x), labels, dim=x.shape[1], nnz=nnz, dtype=dtype)


def to_dense(examples: SparseExamples, dim: int) -> np.ndarray:
    """The ``(N, d)`` dense rows of ``examples`` (padding dropped), float64: for tests and
    references."""
    indices, values = np.asarray(examples.indices), np.asarray(examples.values, np.float64)
    out = np.zeros((indices.shape[0], dim + 1))
    np.add.at(out, (np.arange(indices.shape[0])[:, None], indices), values)
    return out[:, :dim]


def pad_rows(examples: SparseExamples, length: int, dim: int) -> SparseExamples:
    """``examples`` padded with masked rows to ``length`` rows (a chunk's static length)."""
    n = examples.size
    if n > length:
        raise ValueError(f"{n} examples do not fit a chunk of {length}")
    extra = length - n
    nnz = examples.indices.shape[1]
    weights = examples.weights
    if weights is not None:
        weights = np.concatenate([weights, np.zeros((extra,), np.asarray(weights).dtype)])
    return SparseExamples(
        np.concatenate([examples.indices, np.full((extra, nnz), dim, np.int32)]),
        np.concatenate([examples.values, np.zeros((extra, nnz), examples.values.dtype)]),
        np.concatenate([examples.labels, np.zeros((extra,), examples.labels.dtype)]),
        np.concatenate([examples.mask, np.zeros((extra,), bool)]),
        weights,
    )


def rows(examples: SparseExamples, start: int, stop: int) -> SparseExamples:
    """Rows ``[start, stop)`` of ``examples`` (host arrays)."""
    return SparseExamples(*(None if a is None else np.asarray(a)[start:stop] for a in examples))


def with_constant(examples: SparseExamples, dim: int) -> SparseExamples:
    """``examples`` of a ``dim``-feature stream with VW's constant feature (module docstring):
    index ``dim``, value 1, in every real row (padding rows get padding); the result is over
    ``dim + 1`` features, its padding index ``dim + 1``."""
    indices, values = np.asarray(examples.indices), np.asarray(examples.values)
    real = np.asarray(examples.mask)[:, None]
    return examples._replace(
        indices=np.concatenate(
            [np.where(indices == dim, dim + 1, indices), np.where(real, dim, dim + 1)], axis=1
        ).astype(np.int32),
        values=np.concatenate([values, real.astype(values.dtype)], axis=1),
    )


class FlatExamples(NamedTuple):
    """A chunk of examples of any lengths: their non-zeros concatenated (``indices``,
    ``values``, ``(T,)``, padded at the end with index ``d`` and value 0), example ``i`` being
    ``[starts[i], stops[i])``; ``width`` (static) the segment a learner reads at a time
    (:func:`to_flat`). The cost of an example follows its own length: for streams whose lengths
    vary (text, crossed features), where :class:`SparseExamples` pads every example to the
    longest."""

    indices: np.ndarray  # (T,) int32
    values: np.ndarray  # (T,)
    starts: np.ndarray  # (N,) int32
    stops: np.ndarray  # (N,) int32
    labels: np.ndarray  # (N,)
    mask: np.ndarray  # (N,) bool
    width: int
    weights: np.ndarray | None = None  # (N,) importance weights; None: 1 for every example

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


#: What reading one more segment of a flat example costs a learner beyond its entries, in
#: entries (:func:`segment_width`). Measured on the VW benchmark's MNIST stream (2-core CPU,
#: examples of 60 to 300 non-zeros): ``oja_son`` spends about 20 us per segment and 0.02 us per
#: entry, ``ada_diag`` 10 us and 0.009 us: about a thousand entries either way.
SEGMENT_OVERHEAD = 1024
#: The widest default segment (:func:`segment_width`).
MAX_SEGMENT = 4096


def segment_width(counts, *, overhead: int = SEGMENT_OVERHEAD) -> int:
    """The default segment width of a flat chunk whose examples have ``counts`` non-zeros: the
    power of two from 8 to :data:`MAX_SEGMENT` that minimizes the modelled cost of reading them,
    ``sum_i segments_i (overhead + width)`` with ``segments_i = max(1, ceil(counts_i /
    width))`` (every segment is read whole; ties go to the narrower width).

    The rule it replaces, the power of two nearest the mean length, cut a stream of lengths
    around the mean in two segments each half of the time (MNIST's 150 non-zeros at width 128:
    ``oja_son`` 24k examples/s, at 256 37k)."""
    counts = np.asarray(counts, np.int64).ravel()
    if counts.size == 0:
        return 8
    widths = 1 << np.arange(3, int(np.log2(MAX_SEGMENT)) + 1)
    cost = read_cost(counts[None, :], widths[:, None], overhead=overhead).sum(axis=1)
    return int(widths[int(np.argmin(cost))])


def read_cost(counts, width, *, overhead: int = SEGMENT_OVERHEAD):
    """The modelled cost, in entries, of reading examples of ``counts`` non-zeros flat in
    segments of ``width``: ``max(1, ceil(count / width)) (overhead + width)`` each (every segment
    is read whole and pays ``overhead``; :func:`segment_width` minimizes its sum, and
    :func:`sketchopt.stream.runner.flat_pays` weighs it against the padded width)."""
    counts = np.asarray(counts, np.int64)
    return np.maximum(-(-counts // width), 1) * (overhead + width)


def to_flat(examples: SparseExamples, dim: int, width: int | None = None) -> FlatExamples:
    """:class:`FlatExamples` of the (padded) ``examples``: padding dropped, each example's
    non-zeros kept in order. ``width`` defaults to :func:`segment_width` of the real examples'
    lengths; the capacity ``T`` is rounded up to a power of two, so that a stream
    of chunks compiles for a few shapes only."""
    indices, values = np.asarray(examples.indices), np.asarray(examples.values)
    keep = indices != dim
    counts = keep.sum(axis=1).astype(np.int64)
    if width is None:
        width = segment_width(counts[np.asarray(examples.mask)])
    stops = np.cumsum(counts)
    starts = stops - counts
    total = int(stops[-1]) if stops.size else 0
    capacity = 1 << int(np.ceil(np.log2(max(total, 1) + width)))
    flat_idx = np.full((capacity,), dim, np.int32)
    flat_val = np.zeros((capacity,), values.dtype)
    flat_idx[:total] = indices[keep]
    flat_val[:total] = values[keep]
    return FlatExamples(
        flat_idx,
        flat_val,
        starts.astype(np.int32),
        stops.astype(np.int32),
        np.asarray(examples.labels),
        np.asarray(examples.mask),
        int(width),
        None if examples.weights is None else np.asarray(examples.weights),
    )


def flat_segment(indices, values, start, stop, j, width: int, dim: int) -> SparseVector:
    """Segment ``j`` (``width`` entries from ``start + j * width``) of one example of a flat
    chunk (:class:`FlatExamples`: its non-zeros are ``indices[start:stop]``), the entries past
    ``stop`` as padding (index ``dim``, value 0): what a learner's ``step_flat`` reads and
    writes at a time. ``jax.lax.dynamic_slice`` clamps a segment that would run past the
    chunk's end, whose padding tail makes that safe."""
    begin = start + j * width
    live = begin + jnp.arange(width) < stop
    idx = jax.lax.dynamic_slice(indices, (begin,), (width,))
    val = jax.lax.dynamic_slice(values, (begin,), (width,))
    return SparseVector(jnp.where(live, idx, dim), jnp.where(live, val, 0))
