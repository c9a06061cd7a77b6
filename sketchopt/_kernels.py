r"""Pallas kernels of the accelerator path: the FD family's rotation of its rows, in place.

Every shrink of an FD sketch rotates its ``n x d`` rows, ``B <- R B`` with a small ``R``, and a
per-step Ada-FD update also lifts the residual ``g - c^T B`` from the same rows (RFD paper
Alg. 1/2 lines 4-6; Ada-FD Alg. 1/2 lines 5-8). XLA computes neither in place: a matmul over
its own donated input writes a fresh buffer and copies it back, and the non-finite policy's
select (a skipped step leaves the rows bit-identical) reads both once more. On XLA's TPU count
at ``d = 1e7`` that rotation and its select were about 80 of the 159 ``d``-vectors of one
``ada_fd`` update (``docs/benchmarks/speed.md``). :func:`rotate_rows` is one kernel that reads
each column block of the rows once, writes its rotation over the same buffer
(``input_output_aliases``), selects it against the old tile while both are on chip, and forms
the lift from the same tile: one read and one write of the rows, one of the base.

Where it runs (:func:`sketchopt._solvers.kernel_mode`, ``"on"`` by default): on a TPU,
through Mosaic, for real ``float32`` rows of a program on one device. Updates traced for
another platform keep the FD family's own program (:func:`applies`); for a TPU the choice is
finished when the program is lowered, by the primitive :data:`rotate_p`: on a program over
several devices (a Mosaic call is opaque to XLA's partitioner, which refuses it) it lowers to
the same products in plain XLA (:func:`products`). ``"interpret"`` runs the kernel
through Pallas's interpreter on any backend, which is how the tests check it on a CPU;
``"off"`` never uses it.

XLA's cost model cannot see inside a kernel, so the call states its own cost
(``pl.CostEstimate``): the bytes its blocks stream, counted as XLA counts an array (in the
TPU's ``8 x 128`` tiles of 32-bit words, the rows of a ``10 x d`` sketch stored as 16), and its
multiply-adds.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

from sketchopt import _partitioning, _solvers

__all__ = ["applies", "products", "rotate_p", "rotate_rows"]

HIGHEST = jax.lax.Precision.HIGHEST

# The TPU's tile of a 32-bit array: 8 sublanes x 128 lanes.
_SUBLANES, _LANES = 8, 128
# Bytes of on-chip memory (VMEM) one grid step's blocks may take: every block is double
# buffered, the rows and the base both read and written (the scoped limit is 16 MiB).
_BLOCK_BUDGET = 6 * 2**20


def applies(rows) -> bool:
    """Whether :func:`rotate_rows` takes ``rows`` (static): one sketch's real ``float32`` rows,
    not empty (a zero-width leaf has no column block to stream), outside an explicit mesh
    (whose sharded types a Mosaic call would drop), in an update traced for a TPU
    (:func:`sketchopt._solvers.targets_tpu`; a CPU and a GPU keep the FD family's own program)
    or with the kernels interpreted."""
    mode = _solvers.kernel_mode()
    return (
        (mode == "interpret" or (mode == "on" and _solvers.targets_tpu()))
        and rows.dtype == jnp.float32
        and rows.ndim == 2
        and rows.size > 0
        and not _partitioning.explicit_mesh()
    )


def _tiled(rows: int, cols: int) -> int:
    """The bytes of a ``rows x cols`` float32 array in the TPU's tiled layout: tiles of 8 rows
    (of 1, 2 or 4 for an array of fewer rows) by 128 columns."""
    tile = _SUBLANES if rows >= _SUBLANES else 1 << (rows - 1).bit_length()
    return 4 * (-(-rows // tile) * tile) * (-(-cols // _LANES) * _LANES)


def _block_width(n: int, j: int, d: int) -> int:
    """Columns per grid step: a multiple of 128 that keeps the double-buffered blocks (``n``
    rows in and out, ``j`` more: the lift and the inserted row) within :data:`_BLOCK_BUDGET`;
    the whole row when it is shorter."""
    per_column = 4 * 2 * 2 * (-(-n // _SUBLANES) + -(-j // _SUBLANES)) * _SUBLANES
    width = max(_LANES, _BLOCK_BUDGET // per_column // _LANES * _LANES)
    return d if d <= width else width


def _split(operands, insert: bool, lift: bool, base: bool):
    """``(valid, rot, rows, slot, row, coef, base)`` of the operands as :func:`rotate_rows`
    orders them, ``None`` where absent."""
    it = iter(operands)
    valid, rot, rows = next(it), next(it), next(it)
    slot, row = (next(it), next(it)) if insert else (None, None)
    coef = next(it) if lift else None
    given = next(it) if lift and base else None
    return valid, rot, rows, slot, row, coef, given


def _row_base(row, j: int):
    """The lift's base when the caller gave none: ``[row; 0; ...]``, ``j`` rows."""
    index = jax.lax.broadcasted_iota(jnp.int32, (*row.shape[:-2], j, row.shape[-1]), row.ndim - 2)
    return jnp.where(index == 0, row, 0)


def _kernel(*refs, insert: bool, lift: bool, base: bool):
    """One column block of the rows: with ``insert``, ``row`` first replaces row ``slot`` of the
    tile; then ``rows <- where(valid, rot @ rows, rows)`` and, with ``lift``, ``base - where(
    valid, coef @ rows, 0)``, both from the same tile."""
    count = 3 + 2 * insert + lift + (lift and base)
    valid, rot, rows, slot, row, coef, given = _split(refs[:count], insert, lift, base)
    rows_out, *lift_out = refs[count:]
    old = rows[...]
    tile = old
    if insert:
        index = jax.lax.broadcasted_iota(jnp.int32, tile.shape, 0)
        tile = jnp.where(index == slot[...], row[...], tile)
    ok = valid[...] != 0  # (1, 1): broadcast over the tile
    rotated = jnp.dot(rot[...], tile, precision=HIGHEST, preferred_element_type=jnp.float32)
    rows_out[...] = jnp.where(ok, rotated, old)
    if lift:
        lifted = jnp.dot(coef[...], tile, precision=HIGHEST, preferred_element_type=jnp.float32)
        start = given[...] if base else _row_base(row[...], lifted.shape[0])
        lift_out[0][...] = start - jnp.where(ok, lifted, 0)


def rotate_rows(rot, rows, valid, coef=None, base=None, *, insert=None):
    """``where(valid, rot @ rows, rows)`` for an ``n x n`` ``rot`` (and, with ``coef`` of shape
    ``(j, n)`` and ``base`` of ``(j, d)``, also ``base - where(valid, coef @ rows, 0)``), the
    rows read once and written over their own buffer. ``insert = (row, slot)``: both products
    are taken on the rows with ``row`` (a ``d``-vector) in place of row ``slot``, which the
    caller never wrote (FD's append, RFD paper Alg. 1/2 line 3, folded into the shrink's pass);
    then ``base=None`` with ``coef`` lifts from ``[row; 0; ...]`` (the residual ``g - B^T a``
    and its companions), which is read from the row already in the kernel.

    The choice of program is made when it is lowered (:data:`rotate_p`): the kernel on a TPU
    program of one device, :func:`products` (XLA's own) on every other platform and on a mesh
    (a Mosaic kernel is opaque to XLA's partitioner). ``kernel_mode() == "interpret"`` runs the
    kernel through Pallas's interpreter on every platform. Callers check :func:`applies` first.
    """
    lift = coef is not None
    if lift and base is None and insert is None:
        raise ValueError("rotate_rows: a lift needs a base, or the inserted row as its base")
    operands = (jnp.asarray(valid, jnp.int32).reshape(1, 1), rot.astype(rows.dtype), rows)
    if insert is not None:
        row, slot = insert
        operands += (jnp.asarray(slot, jnp.int32).reshape(1, 1), row.reshape(1, -1))
    if lift:
        operands += (coef.astype(rows.dtype),)
        operands += () if base is None else (base.astype(rows.dtype),)
    params = {"insert": insert is not None, "lift": lift, "base": base is not None}
    out = rotate_p.bind(*operands, **params, interpret=_solvers.kernel_mode() == "interpret")
    return tuple(out) if lift else out[0]


def products(*operands, insert: bool = False, lift: bool = False, base: bool = True):
    """The kernel's results in plain XLA, the program a TPU program over several devices
    compiles (the order the FD family's own had, which XLA runs in place: the row inserted by a
    ``dynamic_update_slice``, one product for the rotation and the lift, the skip's select
    against the buffer the product read); the operands as :func:`rotate_rows` orders them."""
    valid, rot, rows, slot, row, coef, given = _split(operands, insert, lift, base)
    ok = valid[0, 0] != 0
    n = rows.shape[0]
    if insert:
        at = slot[0, 0]
        old = jax.lax.dynamic_slice_in_dim(rows, at, 1, axis=0)
        rows = jax.lax.dynamic_update_slice(rows, jnp.where(ok, row, old), (at, jnp.int32(0)))
    both = jnp.concatenate([rot, coef]) if lift else rot
    out = jnp.matmul(both, rows, precision=HIGHEST)
    result = (jnp.where(ok, out[:n], rows),)
    if lift:
        start = given if base else _row_base(row, coef.shape[0])
        result += (start - jnp.where(ok, out[n:], 0),)
    return result


#: The rotation as one primitive, so that the kernel is chosen where the program's devices are
#: known: its lowering takes the Pallas kernel on a TPU program of one device and
#: :func:`products` elsewhere; vmapped, it runs :func:`products` over the batch.
rotate_p = jex_core.Primitive("sketchopt_rotate_rows")
rotate_p.multiple_results = True


def _abstract(*ops, insert, lift, base, **_):
    """The rows' type, and the lift's (``(j, d)``, as ``coef``'s rows by the rows' columns)."""
    if not lift:
        return [ops[2]]
    coef = _split(ops, insert, lift, base)[5]
    return [ops[2], ops[2].update(shape=(*coef.shape[:-1], ops[2].shape[-1]))]


rotate_p.def_abstract_eval(_abstract)


@functools.cache
def _compiled(**params):
    """The primitive's eager call: a ``jit`` of itself, lowered by :func:`_lowering`."""
    return jax.jit(lambda *ops: rotate_p.bind(*ops, **params))


rotate_p.def_impl(lambda *ops, **params: _compiled(**params)(*ops))


def _batched(args, dims, *, interpret, **params):
    """vmap (a caller's own, over whole updates): XLA's products over the batch. The kernel
    takes one sketch; on a group's stack of them its fixed layout made XLA copy the stack
    (the 4-layer tree: 3.7 GB against XLA's 3.2), so the FD family calls it outside groups."""
    del interpret
    out = jax.vmap(functools.partial(products, **params), in_axes=dims)(*args)
    return out, [0] * len(out)


batching.primitive_batchers[rotate_p] = _batched


def _lowering(ctx, *ops, interpret, **params):
    axes = ctx.module_context.axis_context
    one_device = isinstance(axes, mlir.ShardingContext) and axes.num_devices == 1
    on_tpu = tuple(ctx.module_context.platforms) == ("tpu",)
    empty = ctx.avals_in[2].shape[-1] == 0  # no column block to stream: XLA's no-op
    kernel = not empty and (interpret or (one_device and on_tpu))
    fn = functools.partial(_call, interpret=interpret) if kernel else products
    return mlir.lower_fun(lambda *a: list(fn(*a, **params)), multiple_results=True)(ctx, *ops)


mlir.register_lowering(rotate_p, _lowering)


def _call(*operands, insert: bool, lift: bool, base: bool, interpret: bool):
    """The Pallas kernel over column blocks of one sketch's rows."""
    _, _, rows, _, _, coef, _ = _split(operands, insert, lift, base)
    n, d = rows.shape
    j = coef.shape[0] if lift else 0
    width = _block_width(n, j + insert, d)
    whole = lambda shape: pl.BlockSpec(shape, lambda i: (0, 0))
    columns = lambda m: pl.BlockSpec((m, width), lambda i: (0, i))
    in_specs = [whole((1, 1)), whole((n, n)), columns(n)]
    in_specs += [whole((1, 1)), columns(1)] if insert else []
    in_specs += [whole((j, n))] if lift else []
    in_specs += [columns(j)] if lift and base else []
    out_shape = [jax.ShapeDtypeStruct(rows.shape, rows.dtype)]
    out_shape += [jax.ShapeDtypeStruct((j, d), rows.dtype)] if lift else []
    # the given base is written over (the rows always are)
    aliases = {2: 0, len(operands) - 1: 1} if lift and base else {2: 0}
    streamed = 2 * _tiled(n, d) + (_tiled(1, d) if insert else 0) + (1 + base) * _tiled(j, d)
    cost = pl.CostEstimate(
        flops=2 * (n + j) * n * d,
        transcendentals=0,
        bytes_accessed=streamed + _tiled(n, n) + _tiled(j, n) + 2 * _tiled(1, 1),
    )
    out = pl.pallas_call(
        functools.partial(_kernel, insert=insert, lift=lift, base=base),
        grid=(math.ceil(d / width),),
        in_specs=in_specs,
        out_specs=[columns(n), *([columns(j)] if lift else [])],
        out_shape=out_shape,
        input_output_aliases=aliases,
        cost_estimate=cost,
        interpret=interpret,
        name="sketchopt_rotate_rows",
    )(*operands)
    return tuple(out)
