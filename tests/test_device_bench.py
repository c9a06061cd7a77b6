"""``experiments/device_bench.py``'s arithmetic on the aot part's rows (no compile)."""

from __future__ import annotations

import pytest

from experiments import device_bench
from sketchopt import shampoo


def test_a_period_amortizes_the_update_and_the_step_in_its_switch():
    """``kron_fd``'s bytes over a refresh period take the refresh step as the whole update
    counts it (XLA's costliest branch) and the step between refreshes as compiled in a switch,
    not the branches compiled alone (XLA fuses those across the switch's boundary)."""
    rows = {
        "optax.adam": {"bytes_accessed": 10.0},
        "kron_fd": {"bytes_accessed": 40.0, "peer": "optax.adam"},
        "kron_fd refresh step": {"bytes_accessed": 41.0},
        "kron_fd between refreshes": {"bytes_accessed": 19.0},
        "kron_fd between refreshes, in the switch": {"bytes_accessed": 21.0},
    }
    device_bench._amortize(rows)
    period = shampoo.PERIOD
    expected = (40.0 + (period - 1) * 21.0) / period
    assert rows["kron_fd"]["amortized_bytes_accessed"] == pytest.approx(expected)
    assert rows["kron_fd"]["amortized_bytes_over_peer"] == pytest.approx(expected / 10.0)
    del rows["kron_fd"]["amortized_bytes_accessed"]
    del rows["kron_fd between refreshes, in the switch"]
    device_bench._amortize(rows)  # without the in-switch step: nothing to amortize
    assert "amortized_bytes_accessed" not in rows["kron_fd"]


def test_the_fd_family_amortizes_its_gram_refresh_over_its_period():
    """An FD learner's bytes over a period take the whole update once (XLA charges the exact
    Gram refresh's ``cond`` at every step) and ``GRAM_REFRESH_PERIOD - 1`` steps compiled
    without that branch; a learner without such a program is left as it is."""
    from experiments import common
    from sketchopt import sketches

    rows = {
        "optax.adagrad": {"bytes_accessed": 4.0},
        "ada_fd": {"bytes_accessed": 100.0, "peer": "optax.adagrad"},
        f"ada_fd{common.BETWEEN_REFRESHES}": {"bytes_accessed": 68.0, "peer": "optax.adagrad"},
        "oja_son": {"bytes_accessed": 200.0, "peer": "optax.adagrad"},
    }
    device_bench._amortize(rows)
    period = sketches.GRAM_REFRESH_PERIOD
    expected = (100.0 + (period - 1) * 68.0) / period
    assert rows["ada_fd"]["amortized_bytes_accessed"] == pytest.approx(expected)
    assert rows["ada_fd"]["amortized_bytes_over_peer"] == pytest.approx(expected / 4.0)
    assert "amortized_bytes_accessed" not in rows["oja_son"]


def test_an_update_traced_without_gram_refreshes_drops_that_branch_only():
    """``aot.between_gram_refreshes`` traces ``ada_fd`` without the exact Gram refresh's
    ``cond`` (one ``cond`` fewer) and leaves the update it computes before the first refresh
    unchanged."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxpr_support import count

    import sketchopt as so
    from experiments import aot

    params = {"w": jnp.zeros(40)}
    grads = {"w": jnp.linspace(-1.0, 1.0, 40)}
    conds = []
    outs = []
    for tx in (so.ada_fd(0.1, sketch_size=4), aot.between_gram_refreshes(so.ada_fd(0.1, 4))):
        state = tx.init(params)
        jaxpr = jax.make_jaxpr(lambda g, s, tx=tx: tx.update(g, s, params))(grads, state)
        conds.append(count(jaxpr.jaxpr, "cond"))
        outs.append(jax.jit(tx.update)(grads, state, params)[0]["w"])
    assert conds[1] == conds[0] - 1, conds
    np.testing.assert_array_equal(outs[0], outs[1])


#: An optimized HLO module's text as XLA's TPU compiler prints it (trimmed): a 10 x 1024 sketch
#: stored in 8-row tiles, a gradient of 1024, a row's read and write, a reduction, a custom call
#: and a conditional.
HLO = """HloModule jit_update, entry_computation_layout={...}

%fused (p: f32[10,1024]) -> f32[10] {
  %p = f32[10,1024]{1,0:T(8,128)} parameter(0)
}

%one_row (p0: f32[10,1024], p1: s32[]) -> f32[1,1024] {
  %p0 = f32[10,1024]{1,0:T(8,128)} parameter(0)
  %p1 = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  ROOT %ds = f32[1,1024]{1,0:T(1,128)} dynamic-slice(%p0, %p1, %zero), dynamic_slice_sizes={1,1024}
}

ENTRY %main (rows: f32[10,1024], g: f32[1024]) -> (f32[1024], f32[10,1024]) {
  %rows = f32[10,1024]{1,0:T(8,128)} parameter(0)
  %g = f32[1024]{0:T(1024)} parameter(1)
  %i = s32[]{:T(128)} parameter(2)
  %old = f32[1,1024]{1,0:T(1,128)} fusion(%rows, %i), kind=kLoop, calls=%one_row
  %put = f32[10,1024]{1,0:T(8,128)} dynamic-update-slice(%rows, %old, %i, %i)
  %product = f32[10]{0:T(128)} fusion(%rows, %g), kind=kOutput, calls=%fused
  %small = f32[10]{0:T(128)} negate(%product)
  %kernel = (f32[10,1024]{1,0:T(8,128)}, f32[1,1024]{1,0:T(1,128)}) custom-call(%rows, %g)
  %new = f32[10,1024]{1,0:T(8,128)} get-tuple-element(%kernel), index=0
  %c = pred[]{:T(128)} constant(true)
  %cond = f32[1024]{0:T(1024)} conditional(%c, %new, %g), true_computation=%a, false_computation=%b
  ROOT %out = (f32[1024]{0:T(1024)}, f32[10,1024]{1,0:T(8,128)}) tuple(%cond, %new)
}
"""


def test_the_passes_count_each_large_array_as_stored():
    """``aot.passes``: each entry instruction's large operands and result in leaf-sized arrays,
    a tiled matrix at its padded size (10 rows stored as 16), a sliced operand at the slice's
    size, an in-place update at its update's, views and small arrays left out."""
    from experiments import aot

    assert aot.stored_elements("f32[10,1024]{1,0:T(8,128)}") == 16 * 1024
    assert aot.stored_elements("f32[1000]{0:T(1024)}") == 1024
    assert aot.stored_elements("(f32[3,5], s32[])") == 15 + 1  # no layout: as written
    assert aot.stored_elements("f32[10,1000]{0,1:T(8,128)}") == 1000 * 128  # column-major
    rows = {name: (op, read, written) for name, op, read, written in aot.passes(HLO, 1024)}
    assert rows == {
        "%old": ("fusion", 1.0, 1.0),  # a fusion that slices one row reads that row
        "%put": ("dynamic-update-slice", 1.0, 1.0),  # in place: the update only
        "%product": ("fusion", 17.0, 0.0),  # the sketch as stored, and g
        "%kernel": ("custom-call", 17.0, 17.0),  # 16 rows and the (1, 1024) residual
        "%cond": ("conditional", 17.0, 1.0),
    }
