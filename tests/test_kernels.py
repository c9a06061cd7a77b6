"""The accelerator path's Pallas kernel (``sketchopt._kernels``), run on this CPU through Pallas's
interpreter (``sketchopt._solvers.kernels("interpret")``), against the plain array operations
the other platforms compile and against float64 updates. Its TPU compile (and its choice of
XLA's products on a program over several devices) is checked by the accelerators tier
(``tests/test_accelerators.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sketchopt as so
from sketchopt import _kernels, _solvers


def _operands(rng, n, j, d, batch=()):
    f32 = lambda *shape: jnp.asarray(rng.standard_normal((*batch, *shape)), jnp.float32)
    rows = f32(n, d).at[..., 1, :3].set(-0.0)  # signed zeros a skipped rotation must keep
    return f32(n, n), rows, f32(j, n), f32(j, d)


@pytest.mark.parametrize("insert", [False, True])
@pytest.mark.parametrize("lift", [False, True])
def test_the_kernel_rotates_in_place_and_a_skipped_call_keeps_every_bit(monkeypatch, lift, insert):
    """Over several column blocks and a ragged last one, on each of three sketches (and vmapped
    over them, where XLA's products run): with ``row`` put in place of row ``slot``
    (``insert``, the append the shrink's pass takes over), the rows are ``rot @ rows`` and the
    base ``base - coef @ rows`` (float64 NumPy, to float32 rounding), and where ``valid`` is
    false both come back bit for bit, the slot's old row included."""
    monkeypatch.setattr(_kernels, "_BLOCK_BUDGET", 2**13)  # 128 columns a block: 3 blocks at 300
    rng = np.random.default_rng(0)
    n, d = 5, 300
    rot, rows, coef, base = _operands(rng, n, 2, d, batch=(3,))
    row = jnp.asarray(rng.standard_normal((3, d)), jnp.float32).at[1, 7].set(jnp.nan)
    slot = jnp.array([4, 1, 0])
    valid = jnp.array([True, False, True])
    lifted = (coef, base) if lift else ()

    def kernel(v, r, b, g, s, *extra):
        if insert and extra:  # the lift's base is the inserted row and a zero row
            extra = (extra[0], None)
        return _kernels.rotate_rows(r, b, v, *extra, insert=(g, s) if insert else None)

    with so.accelerator_path(), _solvers.kernels("interpret"):
        calls = [
            kernel(valid[i], rot[i], rows[i], row[i], slot[i], *(x[i] for x in lifted))
            for i in range(3)
        ]
        group = jax.jit(jax.vmap(kernel))(valid, rot, rows, row, slot, *lifted)
    one = tuple(map(jnp.stack, zip(*calls, strict=True))) if lift else (jnp.stack(calls),)
    group = group if lift else (group,)
    full = np.asarray(rows, np.float64).copy()
    if insert:
        full[np.arange(3), np.asarray(slot)] = np.asarray(row, np.float64)
    want = [np.asarray(rot, np.float64) @ full]
    if insert:  # the base the kernel lifts from: the row and a zero row
        base = jnp.stack([row, jnp.zeros_like(row)], axis=1)
    if lift:
        want.append(np.asarray(base, np.float64) - np.asarray(coef, np.float64) @ full)
    scale = float(np.max(np.abs(want[0][0::2])))
    skipped = (rows, base)[: len(want)]
    for outs in (one, group):  # the kernel on each sketch; XLA's products over the vmap
        for got, ref, old in zip(outs, want, skipped, strict=True):
            np.testing.assert_allclose(got[0::2], ref[0::2], rtol=0, atol=1e-5 * scale)
            assert np.asarray(got[1]).tobytes() == np.asarray(old[1]).tobytes()


def _trajectory(tx, params, grads, mode):
    with so.accelerator_path(mode is not None), _solvers.kernels(mode or "off"):
        step = jax.jit(tx.update)
        state, updates = tx.init(params), []
        for g in grads:
            u, state = step(g, state, params)
            updates.append(u)
    return updates, state


def test_ada_fd_through_the_kernel_matches_float64():
    """``ada_fd``'s update with its rotation in the kernel, over 12 steps of a tree whose two
    equal leaves are stepped as one group (the kernel vmapped) and a NaN gradient at step 5:
    within 1e-4 relative of the float64 update (the issue's bound for the accelerator path) and
    the same as XLA's program to float32 rounding. (A skipped leaf's state keeps every bit
    through the kernel: ``tests/test_robustness.py``.)"""
    params = {"a": jnp.zeros((6, 40)), "b": jnp.zeros((6, 40)), "c": jnp.zeros(70)}
    rng = np.random.default_rng(1)
    grads = [
        {
            k: rng.standard_normal(p.shape) * np.geomspace(1, 0.05, p.size).reshape(p.shape)
            for k, p in params.items()
        }
        for _ in range(12)
    ]
    grads[5]["c"][3] = np.nan
    tx = so.ada_fd(0.1, sketch_size=4)
    f32 = [jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g) for g in grads]
    kernel, _ = _trajectory(tx, params, f32, "interpret")
    xla, _ = _trajectory(tx, params, f32, "off")
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
        ref, _ = _trajectory(tx, p64, [jax.tree.map(jnp.asarray, g) for g in grads], None)
    for t, (k, x, r) in enumerate(zip(kernel, xla, ref, strict=True)):
        for name in params:
            scale = float(np.max(np.abs(r[name])))
            np.testing.assert_allclose(k[name], r[name], rtol=0, atol=1e-4 * scale, err_msg=t)
            np.testing.assert_allclose(k[name], x[name], rtol=0, atol=1e-6 * scale, err_msg=t)


def test_a_zero_width_sketch_is_left_to_xla():
    """A zero-width leaf's rows have no column block to stream: the kernel declines them
    (:func:`sketchopt._kernels.applies`), and a direct call lowers to XLA's empty products."""
    rows = jnp.zeros((3, 0), jnp.float32)
    with so.accelerator_path(), _solvers.kernels("interpret"):
        assert not _kernels.applies(rows)
        assert jax.jit(_kernels.rotate_rows)(jnp.eye(3), rows, True).shape == (3, 0)
