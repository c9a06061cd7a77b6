"""Every update compiled for a TPU, on any machine (``make test-accelerators``).

XLA's TPU compiler (libtpu) compiles without a TPU for a topology's devices
(``experiments/aot.py``). This tier compiles, on the code path a TPU user's update takes
(``sketchopt.accelerator_path``, batched factorizations on), and fails on any that does not:

* the ``update`` of every public transform factory, at the Optax conformance battery's
  hyperparameters (``tests/test_conformance.py``'s ``CASES``), on a small tree of a matrix and
  a vector; a factory without a case fails :func:`test_every_public_factory_is_compiled`;
* the README's Flax training step (the digits MLP under ``kron_fd``), forward, backward and
  update in one program;
* ADA-DIAG's update at the bytes of the guarded floor program (XLA's count);
* ``ada_fd``'s update between Gram refreshes reading its sketch twice (``aot.passes``);
* one step sharded over the topology's 4 devices (the parameters split along a mesh axis, as
  the devices guide lays them out), whose compiled state keeps every large array split.

``make test`` deselects it (marker ``accelerators``); ``make test-accelerators`` installs the
``libtpu`` that the installed JAX names and runs it. Elsewhere it is skipped when libtpu is
missing, except under ``SKETCHOPT_TEST_TIER=accelerators``, where that is an error.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import sketchopt as so
from experiments import aot, speed
from sketchopt import sharding

pytestmark = pytest.mark.accelerators

if not aot.available():
    if os.environ.get("SKETCHOPT_TEST_TIER") == "accelerators":
        raise RuntimeError("libtpu is not installed: make test-accelerators installs it")
    pytest.skip("libtpu is not installed (make test-accelerators)", allow_module_level=True)

from test_conformance import CASES, _build, public_factories  # noqa: E402

PARAMS = {
    "w": jax.ShapeDtypeStruct((16, 8), jnp.float32),
    "b": jax.ShapeDtypeStruct((8,), jnp.float32),
}


def test_every_public_factory_is_compiled():
    """The compiled cases are the public factories: a new one without a case fails here."""
    assert set(CASES) == public_factories()


@pytest.mark.parametrize("name", sorted(CASES))
def test_update_compiles_for_tpu(name):
    """One update of the transform, the state donated, compiles for a TPU v5e."""
    program = aot.compile_update(_build(name), PARAMS)
    assert program.bytes_accessed > 0
    assert "ENTRY" in program.text


def test_ada_diag_moves_the_bytes_of_the_guarded_floor():
    """ADA-DIAG's update is the least guarded diagonal step as XLA's TPU compiler counts it
    (``experiments/aot.py``'s ``guarded_adagrad``: one finiteness read of the gradient, one
    fused pass, the count of skipped leaves), on one leaf and on a tree of equal leaves, and
    in a training step (the parameters' write fused in) on a tree of mixed shapes: no
    flattening, stacking or second check adds a pass."""
    mixed = {
        "w": jax.ShapeDtypeStruct((256, 768), jnp.float32),
        "v": jax.ShapeDtypeStruct((1024, 256), jnp.float32),
        "b": jax.ShapeDtypeStruct((768,), jnp.float32),
    }
    for compile_, params in (
        (aot.compile_update, {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}),
        (
            aot.compile_update,
            {f"w{i}": jax.ShapeDtypeStruct((256, 1024), jnp.float32) for i in range(8)},
        ),
        (aot.compile_step, {f"layer{i}": mixed for i in range(3)}),
    ):
        ours = compile_(so.ada_diag(0.1), params).bytes_accessed
        floor = compile_(aot.guarded_adagrad(0.1), params).bytes_accessed
        assert ours <= 1.01 * floor, (ours, floor)


def _mosaic_calls(program) -> int:
    return program.text.count('custom_call_target="tpu_custom_call"')


@pytest.mark.parametrize("name", ["ada_fd", "oja_son"])
def test_fd_rotations_run_in_place_in_a_kernel_on_one_device(name):
    """On a TPU program of one device a lone sketch's rotation is the Pallas kernel
    (``sketchopt._kernels``: one Mosaic call; the group of two equal leaves keeps XLA's
    products, into which a Mosaic call's fixed layout would copy the stacked rows), and the
    update moves less than with XLA's products (the kernel off: a fresh buffer, a copy back and
    the skip's select; 35% less for ``ada_fd`` at ``d = 1e7``, on one leaf); over
    the 4 devices of a mesh the same update takes XLA's products (a Mosaic call cannot be
    partitioned), and it still compiles. The lone leaf has ``d = 1e7``: at ``1e6`` its sketch
    fits the TPU's on-chip memory, and XLA's count then includes the prefetch copies its
    scheduler picks, which move with unrelated changes to the program (``oja_son`` without
    SON's ``c = 0`` branch: 736 MB against XLA's products' 636 MB there, less at ``1e7``; the
    speed page)."""
    from sketchopt import _solvers

    make = {
        "ada_fd": lambda: so.ada_fd(0.1, sketch_size=8),
        "oja_son": lambda: so.oja_son(1.0, sketch_size=8),
    }[name]
    params = {
        "a": jax.ShapeDtypeStruct((64, 512), jnp.float32),
        "b": jax.ShapeDtypeStruct((64, 512), jnp.float32),
        "c": jax.ShapeDtypeStruct((10**7,), jnp.float32),
    }
    kernel = aot.compile_update(make(), params)  # a new transform each: a trace keeps its path
    with _solvers.kernels("off"):
        xla = aot.compile_update(make(), params)
    assert _mosaic_calls(kernel) == 1 and _mosaic_calls(xla) == 0  # the group keeps XLA's
    assert kernel.bytes_accessed < xla.bytes_accessed, (kernel, xla)
    mesh = jax.sharding.Mesh(np.array(aot.topology().devices), ("model",))
    split = NamedSharding(mesh, P(None, "model"))
    sharded = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=split)
        for k, v in params.items()
        if len(v.shape) == 2
    }
    tx = make()
    state = sharding.abstract_state(tx, sharded)
    program = aot.compile_fn(
        lambda g, s, p: tx.update(g, s, p),
        sharded,
        state,
        sharded,
        out_shardings=(split, sharding.state_sharding(state, sharded)),
        donate_argnums=(1,),
    )
    assert _mosaic_calls(program) == 0


def test_kron_fd_refresh_period_keeps_two_while_loops():
    """``kron_fd`` at its defaults (roots every 10 steps, ``k = 32``: each side's sketch takes a
    gradient in one block) over layers of four shapes: one
    ``switch`` between the refresh step and the step between refreshes, the refresh's ``eigh``
    batched across the shape groups, so at most 2 while loops on the TPU (a ``cond`` per group
    made one loop per group and side); the step between refreshes moves less than the switch's
    costliest branch."""
    shapes = [(48, 32), (32, 48), (32, 32), (64, 32)]
    params = {f"w{i}": jax.ShapeDtypeStruct(s, jnp.float32) for i, s in enumerate(shapes * 2)}
    program = aot.compile_update(so.kron_fd(1e-3), params)
    assert program.while_loops <= 2, program.while_loops
    between = aot.compile_update(aot.kron_fd_branch(False), params)
    assert between.while_loops == 0
    assert between.bytes_accessed < program.bytes_accessed


def test_kron_fd_steps_its_leaves_in_their_own_shape():
    """Between refreshes ``kron_fd`` stacks a group's gradients in the leaves' own shape
    (``Metric.shaped``): on the TPU's tiled arrays it moves less than the same step stacking them
    flat (a relayout copy each way), within 1.45x ``optax.adam``'s bytes over two layers of the
    benchmark's transformer (1.36x measured, in the update's switch; flat 1.60x)."""
    params = speed._transformer_tree(2)
    adam = aot.compile_update(optax.adam(1e-3), params).bytes_accessed
    shaped, flat = (
        aot.compile_update(aot.kron_fd_branch(False, shaped=s, switched=True), params)
        for s in (True, False)
    )
    shaped, flat = shaped.bytes_accessed, flat.bytes_accessed
    assert shaped < 0.95 * flat, (shaped, flat)
    assert shaped <= 1.45 * adam, (shaped, adam)


def test_readme_flax_step_compiles_for_tpu():
    """The README's Flax MLP on the digits: loss, gradients and the ``kron_fd`` update as one
    TPU program (the functional form of its ``nnx.Optimizer`` step)."""
    from flax import nnx

    model = nnx.Sequential(
        nnx.Linear(64, 128, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(128, 10, rngs=nnx.Rngs(1))
    )
    graphdef, params = nnx.split(model, nnx.Param)
    tx = so.kron_fd(learning_rate=1e-2)

    def train_step(params, opt_state, x, labels):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = aot.placed(params)
    opt_state = aot.placed(jax.eval_shape(tx.init, params))
    x = aot.placed(jax.ShapeDtypeStruct((64, 64), jnp.float32))
    labels = aot.placed(jax.ShapeDtypeStruct((64,), jnp.int32))
    program = aot.compile_fn(train_step, params, opt_state, x, labels, donate_argnums=(0, 1))
    assert program.flops > 2 * 64 * 64 * 128  # the forward pass at least


SHARDED = {
    "ada_fd": lambda: so.ada_fd(0.1, sketch_size=4, delta=1.0),
    "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, sketch_size=4, delta=1.0),
    "fd_son": lambda: so.fd_son(1.0, sketch_size=4),
    "kron_fd": lambda: so.kron_fd(1e-3, sketch_size=4),
    "ada_diag": lambda: so.ada_diag(0.1),
}


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sharded_step_compiles_for_tpu(name):
    """One step over the 4 devices of the v5e slice, ``w`` split along its rows (the devices
    guide's layout, ``sharding.state_sharding`` as the step's output): it compiles, and every
    state array of ``w``'s (a sketch, an accumulator, a factor sketch) stays split."""
    mesh = jax.sharding.Mesh(np.array(aot.topology().devices), ("model",))
    shardings = {"w": NamedSharding(mesh, P("model", None)), "b": NamedSharding(mesh, P())}
    params = {
        "w": jax.ShapeDtypeStruct((64, 32), jnp.float32, sharding=shardings["w"]),
        "b": jax.ShapeDtypeStruct((32,), jnp.float32, sharding=shardings["b"]),
    }
    tx = SHARDED[name]()
    state = sharding.abstract_state(tx, params)
    state_shardings = sharding.state_sharding(state, params)

    def step(grads, opt_state, params):
        return tx.update(grads, opt_state, params)

    program = aot.compile_fn(
        step, params, state, params, out_shardings=(shardings, state_shardings), donate_argnums=(1,)
    )
    leaves = jax.tree.leaves(state)
    out = jax.tree.leaves(program.output_shardings[1])
    split = [sh.shard_shape(s.shape) != tuple(s.shape) for s, sh in zip(leaves, out, strict=True)]
    assert any(split), "no state array is split"
    for s, is_split in zip(leaves, split, strict=True):
        if s.shape[-1:] == (64 * 32,) or s.shape == (64, 32):  # w's sketch rows, accumulators
            assert is_split, f"a {s.shape} state array of w is whole on every device"


def test_ada_fd_reads_its_sketch_twice_between_gram_refreshes():
    """``aot.passes`` on ``ada_fd``'s update without its exact Gram refresh at ``d = 1e7``: two
    instructions read the sketch (``B g`` and the rotation kernel, each its 10 rows stored as
    16 and the gradient), the kernel writes it once, and the passes sum to XLA's own count within
    10% (the speed page's table reads them so)."""
    d = 10**7
    params = {"w": jax.ShapeDtypeStruct((d,), jnp.float32)}
    program = aot.compile_update(aot.between_gram_refreshes(so.ada_fd(0.1, sketch_size=10)), params)
    rows = aot.passes(program.text, d)
    sketch = [(op, read, written) for _, op, read, written in rows if max(read, written) >= 10]
    assert [round(read) for _, read, _ in sketch] == [17, 17], sketch  # (and small arrays)
    assert [op for op, *_ in sketch] == ["fusion", "custom-call"], sketch
    assert sketch[1][2] >= 16, sketch  # the rows written back (and the lift's residual)
    total = sum(read + written for _, _, read, written in rows)
    assert total == pytest.approx(program.bytes_accessed / (4 * d), rel=0.1)
