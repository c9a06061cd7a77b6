"""VW's quadratic crosses (``-q ab``) built inside the compiled step from each example's own
features: no crossed pair is ever stored or sent to the device.

A chunk of :class:`CrossedExamples` holds, per example, its *entries* (every feature of every
namespace, in namespace order, and the constant): the index each has as a plain feature, its
32-bit hash and its value, and for every interaction ``(a, b)`` where the entries of the
namespaces starting with ``a`` and with ``b`` lie (``start_a, count_a, start_b, count_b``).
The example's vector is the sum, over its entries and over its crossed pairs, of
``value * e_index``:

* an entry contributes its value at its index;
* a pair of entries ``(u, v)`` of an interaction contributes ``value_u * value_v`` at
  :func:`cross_index` of their hashes: VW's combination ``(hash_u * 16777619) ^ hash_v``
  (FNV's prime times the first hash, exclusive-or the second; uint32 arithmetic), mixed by
  MurmurHash3's finalizer before the mask (where VW masks it directly). An interaction of two
  different letters crosses every entry of ``a`` with every entry of ``b``; a letter with
  itself makes the pairs ``u <= v`` of its entries, the squares included (VW's default,
  :mod:`sketchopt.stream.data`).

On the device (:func:`expand`) the example is a virtual sequence of ``L = entries + sum of the
interactions' pair counts`` positions, generated ``width`` positions at a time from the entries
alone (a position decodes to its pair by a division for a rectangle, or, for a letter with
itself, by one table of the triangle's pairs shared by every example: :func:`pair_table`).
Colliding positions (two pairs, or a pair and a plain feature, hashed to one index: about
``L**2 / 2**(bits + 1)`` per example) are summed, so that the learners see distinct indices
(their invariant, :mod:`sketchopt.stream.examples`): one pass writes each position's number at
its index of a scratch ``(d + 1,)`` table, one reads it back; the position whose number the
table kept carries the sum, the others become padding. The de-duplicated example is written
into a buffer of ``capacity`` entries that the learner's ``step_flat`` then reads in segments of
``width``, so an example costs its own length ``L``, not the longest one's. The scratch table
and the buffers are carried from example to example of a chunk's scan and never cleared: every
index read was written by the same example first.

:func:`dense_reference` builds the same vectors on the host (NumPy): the tests compare the two,
and :func:`sketchopt.stream.data.read_vw` stores crosses with the same indices.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sketchopt.stream.examples import SparseVector

__all__ = [
    "FNV_PRIME",
    "CrossLayout",
    "CrossedExamples",
    "as_vector",
    "cross_index",
    "dense_reference",
    "expand",
    "length",
    "pair_counts",
    "pair_table",
    "scratch",
    "segment",
]

#: The multiplier of VW's quadratic feature index (FNV-1's 32-bit prime).
FNV_PRIME = 16777619
_FMIX1, _FMIX2, _MASK32 = 0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF  # MurmurHash3's fmix32


class CrossLayout(NamedTuple):
    """The static side of a :class:`CrossedExamples` chunk: the weights' dimension ``dim`` (the
    padding index), ``bits`` of the crosses' hash, ``square[p]`` whether interaction ``p``
    crosses a letter with itself, the segment ``width`` and the buffer's ``capacity`` (a
    multiple of ``width`` at least the longest example's ``L``)."""

    dim: int
    bits: int
    square: tuple[bool, ...]
    width: int
    capacity: int


class CrossedExamples(NamedTuple):
    """A chunk of examples whose ``-q`` crosses are built on the device (module docstring).

    ``indices``/``hashes``/``values`` ``(N, K)``: the entries (padding: index ``dim``, hash 0,
    value 0), ``counts`` ``(N,)`` the live entries of each row, ``spans`` ``(N, P, 4)`` int32
    the interactions' ``start_a, count_a, start_b, count_b`` (counts 0 where a namespace is
    missing); ``layout`` the static :class:`CrossLayout`."""

    indices: np.ndarray  # (N, K) int32
    hashes: np.ndarray  # (N, K) uint32
    values: np.ndarray  # (N, K)
    counts: np.ndarray  # (N,) int32
    spans: np.ndarray  # (N, P, 4) int32
    labels: np.ndarray  # (N,)
    mask: np.ndarray  # (N,) bool
    layout: CrossLayout | None = None
    weights: np.ndarray | None = None  # (N,) importance weights; None: 1 for every example

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def entries(self) -> tuple:
        """``(indices, hashes, values, counts, spans)``: what :func:`expand` reads of a row (a
        scan over the chunk hands it one row of each)."""
        return self.indices, self.hashes, self.values, self.counts, self.spans


def cross_index(first, second, bits: int):
    """The index of the quadratic feature of two 32-bit hashes: VW's combination ``(first *
    FNV_PRIME) ^ second``, then MurmurHash3's 32-bit finalizer, masked to ``2**bits`` (uint32
    arithmetic; NumPy or JAX arrays).

    VW masks the combination directly. Its low bits are then the exclusive-or of the low bits
    of ``first * FNV_PRIME`` and of ``second`` (a product's low bits depend only on its
    factors' low bits), so crosses of a few features collide far more often than hashing
    promises (6 of 36 crosses of two 6-feature namespaces in ``2**10`` slots, against 0.6
    expected); the finalizer mixes every bit into the low ones."""
    if isinstance(first, jax.Array) or isinstance(second, jax.Array):
        first, second = jnp.asarray(first, jnp.uint32), jnp.asarray(second, jnp.uint32)
        h = (first * jnp.uint32(FNV_PRIME)) ^ second
        h = (h ^ (h >> 16)) * jnp.uint32(_FMIX1)
        h = (h ^ (h >> 13)) * jnp.uint32(_FMIX2)
        h = h ^ (h >> 16)
        return (h & jnp.uint32(2**bits - 1)).astype(jnp.int32)
    first, second = np.asarray(first, np.uint64), np.asarray(second, np.uint64)
    h = ((first * FNV_PRIME) & _MASK32) ^ second
    h = ((h ^ (h >> 16)) * _FMIX1) & _MASK32
    h = ((h ^ (h >> 13)) * _FMIX2) & _MASK32
    h = h ^ (h >> 16)
    return (h & (2**bits - 1)).astype(np.int64)


def pair_counts(spans, square) -> jax.Array:
    """``(..., P)`` crossed pairs of each interaction: ``n_a n_b``, or ``n (n + 1) / 2`` for a
    letter with itself."""
    na, nb = spans[..., 1], spans[..., 3]
    square = jnp.asarray(square, bool)
    return jnp.where(square, na * (na + 1) // 2, na * nb)


def length(counts, spans, square):
    """``L`` of each example: its entries and its crossed pairs."""
    return counts + jnp.sum(pair_counts(spans, square), axis=-1)


def pair_table(size: int, width: int):
    """The pairs ``(i, j)``, ``i <= j``, in the order ``r = j (j + 1) / 2 + i`` (by ``j``, then
    ``i``): ``(i[r], j[r])`` for ``r < size``, padded with ``width`` zeros at both ends so that
    :func:`segment` reads any segment overlapping ``[0, size)`` with one ``dynamic_slice``. In
    this order the first ``n (n + 1) / 2`` pairs are those of ``n`` entries, for every ``n``:
    one table serves every example (the float root, then one integer correction each way)."""
    r = jnp.arange(size, dtype=jnp.int32)
    j = jnp.floor((jnp.sqrt(8 * r.astype(jnp.float32) + 1) - 1) / 2).astype(jnp.int32)
    j = jnp.where(j * (j + 1) // 2 > r, j - 1, j)
    j = jnp.where((j + 1) * (j + 2) // 2 <= r, j + 1, j)
    i = r - j * (j + 1) // 2
    zeros = jnp.zeros((width,), jnp.int32)
    return jnp.concatenate([zeros, i, zeros]), jnp.concatenate([zeros, j, zeros])


def segment(example, j, layout: CrossLayout, triangle):
    """Positions ``j * width ...`` of one example's virtual sequence (module docstring):
    ``(positions, indices, values)``, past ``L`` padding (index ``dim``, value 0).
    ``example`` is ``(indices, hashes, values, count, spans)`` of one row, ``triangle`` the
    table of :func:`pair_table`."""
    indices, hashes, values, count, spans = example
    k, width = indices.shape[0], layout.width
    begin = j * width
    q = begin + jnp.arange(width, dtype=jnp.int32)

    def take(a, pos):
        return a[jnp.clip(pos, 0, k - 1)]

    plain = q < count
    idx = jnp.where(plain, take(indices, q), layout.dim)
    val = jnp.where(plain, take(values, q), 0)
    offset = count
    for p, square in enumerate(layout.square):
        start_a, n_a, start_b, n_b = spans[p, 0], spans[p, 1], spans[p, 2], spans[p, 3]
        r = q - offset
        if square:
            pairs = n_a * (n_a + 1) // 2
            at = (jnp.clip(begin - offset + width, 0, triangle[0].shape[0] - width),)
            first = start_a + jax.lax.dynamic_slice(triangle[0], at, (width,))
            second = start_a + jax.lax.dynamic_slice(triangle[1], at, (width,))
        else:
            pairs = n_a * n_b
            cols = jnp.maximum(n_b, 1)
            first, second = start_a + r // cols, start_b + r % cols
        inside = (r >= 0) & (r < pairs)
        crossed = cross_index(take(hashes, first), take(hashes, second), layout.bits)
        idx = jnp.where(inside, crossed, idx)
        val = jnp.where(inside, take(values, first) * take(values, second), val)
        offset = offset + pairs
    return q, idx, val


def scratch(layout: CrossLayout, dtype):
    """The carried tables of :func:`expand`: the position kept per index (``(d + 1,)``); the
    buffers of ``capacity`` entries (the de-duplicated indices and values, the generated ones,
    and the position each position's value goes to); the pairs' table of :func:`pair_table`."""
    capacity, pad = layout.capacity, layout.dim
    return (
        jnp.zeros((pad + 1,), jnp.int32),
        jnp.full((capacity,), pad, jnp.int32),
        jnp.zeros((capacity,), dtype),
        jnp.full((capacity,), pad, jnp.int32),
        jnp.zeros((capacity,), dtype),
        jnp.zeros((capacity,), jnp.int32),
        pair_table(capacity, layout.width),
    )


def expand(example, tables, layout: CrossLayout):
    """One example's de-duplicated vector written into the buffer (module docstring):
    ``(L, tables)``, the example being the first ``L`` entries of ``tables[1]`` (indices) and
    ``tables[2]`` (values) (``tables`` from :func:`scratch`, carried from example to example).

    Three loops over the example's segments. The first generates each segment into the raw
    buffers and writes each position's number at its index of the ``(d + 1,)`` table (one
    position per index survives). The second reads the table back: a surviving position keeps
    its entry, another becomes padding and records the survivor's position. The third adds
    those values to the survivors'. Only the first two touch the ``d``-sized table; each loop
    writes buffers it does not read, which XLA updates in place (a buffer read and rewritten in
    one loop was copied whole at every segment)."""
    kept, out_idx, out_val, raw_idx, raw_val, owner, triangle = tables
    total = length(example[3], example[4], layout.square)
    segments = jnp.maximum((total + layout.width - 1) // layout.width, 1)
    pad, width = layout.dim, layout.width

    def positions(j):
        return (j * width,), j * width + jnp.arange(width, dtype=jnp.int32)

    def claim(j, carry):
        kept, raw_idx, raw_val = carry
        q, idx, val = segment(example, j, layout, triangle)
        begin = (j * width,)
        return (
            kept.at[idx].set(q),
            jax.lax.dynamic_update_slice(raw_idx, idx, begin),
            jax.lax.dynamic_update_slice(raw_val, val.astype(raw_val.dtype), begin),
        )

    def keep(j, carry):
        out_idx, out_val, owner = carry
        begin, q = positions(j)
        idx = jax.lax.dynamic_slice(raw_idx, begin, (width,))
        val = jax.lax.dynamic_slice(raw_val, begin, (width,))
        survivor = kept[idx]
        lead = (survivor == q) | (idx == pad)
        return (
            jax.lax.dynamic_update_slice(out_idx, jnp.where(lead, idx, pad), begin),
            jax.lax.dynamic_update_slice(out_val, jnp.where(lead, val, 0), begin),
            jax.lax.dynamic_update_slice(owner, jnp.where(lead, q, survivor), begin),
        )

    def hand_over(j, out_val):
        begin, q = positions(j)
        to = jax.lax.dynamic_slice(owner, begin, (width,))
        val = jax.lax.dynamic_slice(raw_val, begin, (width,))
        return out_val.at[to].add(jnp.where(to == q, 0, val))

    kept, raw_idx, raw_val = jax.lax.fori_loop(0, segments, claim, (kept, raw_idx, raw_val))
    out_idx, out_val, owner = jax.lax.fori_loop(0, segments, keep, (out_idx, out_val, owner))
    out_val = jax.lax.fori_loop(0, segments, hand_over, out_val)
    return total, (kept, out_idx, out_val, raw_idx, raw_val, owner, triangle)


def as_vector(total, tables, layout: CrossLayout) -> SparseVector:
    """The expanded example as one padded :class:`SparseVector` of ``capacity`` entries (the
    buffer past ``L`` read as padding)."""
    _, buf_idx, buf_val, *_ = tables
    live = jnp.arange(layout.capacity) < total
    return SparseVector(jnp.where(live, buf_idx, layout.dim), jnp.where(live, buf_val, 0))


def dense_reference(chunk: CrossedExamples) -> np.ndarray:
    """The chunk's examples as dense ``(N, dim)`` float64 rows, built on the host by the module
    docstring's definition (the tests' reference for :func:`expand`)."""
    layout = chunk.layout
    indices, hashes, values = (np.asarray(a) for a in (chunk.indices, chunk.hashes, chunk.values))
    counts, spans = np.asarray(chunk.counts), np.asarray(chunk.spans)
    out = np.zeros((chunk.size, layout.dim), np.float64)
    for n in range(chunk.size):
        live = slice(0, int(counts[n]))
        np.add.at(out[n], indices[n, live], values[n, live].astype(np.float64))
        for p, square in enumerate(layout.square):
            start_a, n_a, start_b, n_b = (int(v) for v in spans[n, p])
            for i in range(n_a):
                others = range(i, n_a) if square else range(n_b)
                for jj in others:
                    u, v = start_a + i, (start_a if square else start_b) + jj
                    index = int(cross_index(hashes[n, u], hashes[n, v], layout.bits))
                    out[n, index] += float(values[n, u]) * float(values[n, v])
    return out
