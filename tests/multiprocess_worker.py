"""Worker of ``tests/test_multiprocess.py``: one training process, multi-process or single-device.

``python tests/multiprocess_worker.py worker PROCESS_ID PORT OUT CKPT`` is one of the 2
processes of a ``jax.distributed`` run on localhost (4 CPU devices each, CPU collectives by
gloo, 8 global devices); ``python tests/multiprocess_worker.py reference OUT`` is the same
training on one device, without ``jax.distributed``. Both write what they measured as JSON to
``OUT`` (``{"ok": true, ...}``, or ``{"ok": false, "error": ...}`` with the traceback); the
test asserts on it. Nothing here asserts, and importing this module runs nothing (the suite's
``--doctest-modules`` imports every module of ``tests/``).

The model, its data and the optimizers are defined here once, so that the two kinds of run
train exactly the same problem: a one-hidden-layer tanh network ``16 -> 20 -> 12`` regressed on
a fixed teacher's outputs, full float32, every array drawn from a fixed NumPy seed (identically
in every process), ``STEPS`` steps of a ``BATCH``-row batch each.

The global mesh is ``jax.make_mesh((4, 2), ("model", "data"))`` with ``AxisType.Explicit`` axes
(as ``docs/guides/devices.md`` does). ``jax.make_mesh`` puts its leading axis across the
processes (process 0 holds mesh rows 0-1, process 1 rows 2-3), so the parameters, split along
their leading axis over ``model``, and their sketches, split along ``d``, are split across the
two processes as well as across devices: every sketch reduction of a step is a cross-process
collective. The batch is split over ``data`` (within each process). The loss gathers the
parameters for the forward pass (FSDP style: ``jax.sharding.reshard`` to replicated); its
gradient comes back with the parameters' sharding.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

STEPS = 20
BATCH = 32
IN, HIDDEN, OUT = 16, 20, 12
NUM_PROCESSES = 2
LOCAL_DEVICES = 4
MESH_SHAPE = (4, 2)
MESH_AXES = ("model", "data")
# every leaf split along its leading axis over "model" (all leading sizes divisible by 4)
PARAM_SPECS = {
    "w1": ("model", None),
    "b1": ("model",),
    "w2": ("model", None),
    "b2": ("model",),
}
# name -> factory source (evaluated with ``so`` = sketchopt); small sketches, learning rates
# under which the loss drops over STEPS steps.
OPTIMIZERS = {
    "ada_fd": "so.ada_fd(0.2, 4, 0.1)",
    "ada_fd_dual_averaging": "so.ada_fd_dual_averaging(0.2, 4, 0.1)",
    "fd_son": "so.fd_son(1.0, 4, eta=0.05)",
    # Under an Explicit mesh kron_fd compresses the stream of a side whose vectors are split
    # across devices (w's right stream, its m rows split) to r = min(k + 8, m, n) vectors entering
    # the sketch in one block, where one device streams them exactly, block_size at a time
    # (sketchopt/kron.py, "Under a mesh"). The two sketches agree only when that range holds the
    # gradient's rank (k = 8: r = 16 = m for w1, r = 12 = n for w2) and one device absorbs the
    # stream in one block too (block_size >= m); otherwise the runs differ by more than rounding
    # (in float64 too). refresh_every=2 refreshes the inverse roots within the 20 steps; the Adam
    # graft keeps a (d,) second moment per matrix leaf, split like the sketches.
    "kron_fd": (
        "so.kron_fd(0.02, 8, delta=0.1, block_size=32, refresh_every=2, refresh_tolerance=1e-3,"
        " graft='adam')"
    ),
    "ada_diag": "so.ada_diag(0.1, 0.1)",
}


def problem():
    """``(params, xs, ys)`` as NumPy float32 arrays: the initial parameters and the ``STEPS``
    batches, ``xs`` of shape ``(STEPS, BATCH, IN)`` and ``ys`` ``(STEPS, BATCH, OUT)``."""
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(IN, HIDDEN)) / np.sqrt(IN),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(size=(HIDDEN, OUT)) / np.sqrt(HIDDEN),
        "b2": np.zeros(OUT),
    }
    teacher_1 = rng.normal(size=(IN, HIDDEN)) / np.sqrt(IN)
    teacher_2 = rng.normal(size=(HIDDEN, OUT)) / np.sqrt(HIDDEN)
    xs = rng.normal(size=(STEPS, BATCH, IN))
    ys = np.tanh(xs @ teacher_1) @ teacher_2 + 0.01 * rng.normal(size=(STEPS, BATCH, OUT))
    as32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return {k: as32(v) for k, v in params.items()}, as32(xs), as32(ys)


def train(tx, params, state, xs, ys, gather):
    """``STEPS`` jitted steps of ``tx`` on the squared loss; returns ``(params, state, losses)``.

    ``gather`` maps the parameters to what the forward pass multiplies with (replicated copies
    on the mesh, the identity on one device). ``xs[i]``, ``ys[i]`` are the step's batch.
    """
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(p, x, y):
        p = gather(p)
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    losses = []
    for i in range(STEPS):
        params, state, loss = step(params, state, xs[i], ys[i])
        losses.append(loss)
    return params, state, [float(loss) for loss in losses]


def _sketch_report(name, state, params):
    """What this process holds of each sketch-shaped state array.

    A sketch-shaped array is a floating state array whose last axis is a parameter leaf's
    flattened size ``d`` (``(k, d)`` sketch rows, ``kron_fd``'s ``(d,)`` grafting diagonal of a
    matrix leaf) and which is not parameter-shaped (those, dual
    averaging's sums and ADA-DIAG's accumulator, are laid out like their parameter, which
    ``layout_ok`` checks); for ``kron_fd``, whose sketches are ``(k, m)`` and ``(k, n)`` per
    ``m x n`` leaf, the left sides (``left.rows``, ``roots[0].basis``), split along ``m`` by
    design. ``kron_fd``'s right sides (``right.rows``, ``roots[1].basis``), replicated by design
    (docs/guides/devices.md), are reported apart. Per array: its path, global shape, its
    sharding's shard shape, the shapes of this process's addressable shards and how many of the
    last axis's entries this process holds at all.
    """
    import jax
    import jax.numpy as jnp

    param_shapes = {tuple(v.shape) for v in params.values()}
    d_of_leaves = {int(np.prod(v.shape)) for v in params.values()}
    sketches, replicated_sides = [], []
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        key = jax.tree_util.keystr(path)
        if not (x.ndim >= 1 and jnp.issubdtype(x.dtype, jnp.floating)):
            continue
        if name == "kron_fd" and key.endswith((".right.rows", ".roots[1].basis")):
            target = replicated_sides
        elif name == "kron_fd" and key.endswith((".left.rows", ".roots[0].basis")):
            target = sketches
        elif x.shape[-1] in d_of_leaves and tuple(x.shape) not in param_shapes:
            target = sketches
        else:
            continue
        columns = set()
        for shard in x.addressable_shards:
            columns.update(range(x.shape[-1])[shard.index[-1]])
        target.append(
            {
                "path": key,
                "shape": list(x.shape),
                "shard_shape": list(x.sharding.shard_shape(x.shape)),
                "addressable": [list(s.data.shape) for s in x.addressable_shards],
                "process_columns": len(columns),
            }
        )
    return sketches, replicated_sides


def _layout_ok(state, params):
    """Every state array has the sharding :func:`sketchopt.sharding.state_sharding` asks for."""
    import jax

    from sketchopt import sharding

    wanted = sharding.state_sharding(state, params)
    return all(
        x.sharding.is_equivalent_to(s, x.ndim)
        for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(wanted), strict=True)
    )


def _local_equal(a, b):
    """``a`` and ``b`` (global arrays) hold the same values on this process's devices."""
    by_index = {str(s.index): np.asarray(s.data) for s in b.addressable_shards}
    return all(
        np.array_equal(np.asarray(s.data), by_index[str(s.index)]) for s in a.addressable_shards
    )


def run_worker(process_id, port, out_path, ckpt_path):
    """One process of the 2-process run (see the module docstring); its report to ``out_path``."""
    import jax

    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the default; explicit
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        coordinator_bind_address=f"127.0.0.1:{port}",  # localhost only (default: every address)
        num_processes=NUM_PROCESSES,
        process_id=process_id,
        initialization_timeout=120,
    )
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import sketchopt as so
    from sketchopt import sharding

    report = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
    }
    mesh = jax.make_mesh(MESH_SHAPE, MESH_AXES, axis_types=(AxisType.Explicit,) * 2)
    report["mesh_processes"] = [[d.process_index for d in row] for row in mesh.devices]
    shardings = {k: NamedSharding(mesh, P(*v)) for k, v in PARAM_SPECS.items()}
    batch_sharding = NamedSharding(mesh, P("data", None))
    params0, xs, ys = problem()

    def global_array(value, sharding_):
        # every process builds its own shards from the (identical) global NumPy value
        return jax.make_array_from_callback(value.shape, sharding_, lambda index: value[index])

    def gather(p):
        return jax.tree.map(lambda a: jax.sharding.reshard(a, P()), p)

    results, states = {}, {}
    with jax.set_mesh(mesh):
        params_init = {k: global_array(v, shardings[k]) for k, v in params0.items()}
        batches = [
            (global_array(xs[i], batch_sharding), global_array(ys[i], batch_sharding))
            for i in range(STEPS)
        ]
        bx = [b[0] for b in batches]
        by = [b[1] for b in batches]
        for name, source in OPTIMIZERS.items():
            start = time.perf_counter()
            tx = eval(source, {"so": so})
            # under an Explicit mesh plain init lays the state out (docs/guides/devices.md)
            state = tx.init(params_init)
            init_layout_ok = _layout_ok(state, params_init)
            params, state, losses = train(tx, params_init, state, bx, by, gather)
            sketches, replicated_sides = _sketch_report(name, state, params0)
            results[name] = {
                "losses": losses,
                "params": {
                    k: np.asarray(v).tolist()
                    for k, v in multihost_utils.process_allgather(params, tiled=True).items()
                },
                "param_specs": {k: str(v.sharding.spec) for k, v in params.items()},
                "param_shardings_ok": all(
                    params[k].sharding.is_equivalent_to(shardings[k], params[k].ndim)
                    for k in params
                ),
                "init_layout_ok": init_layout_ok,
                "layout_ok": _layout_ok(state, params),
                "sketches": sketches,
                "replicated_sides": replicated_sides,
                "seconds": time.perf_counter() - start,
            }
            states[name] = (tx, params, state)

        # Orbax: every process writes its shards of the trained states (one checkpoint), then
        # restores them into their sharded layout (an abstract target carrying the shardings).
        start = time.perf_counter()
        saved = {name: {"params": p, "state": s} for name, (_, p, s) in states.items()}
        with ocp.StandardCheckpointer() as ckpt:
            ckpt.save(ckpt_path, saved)
            ckpt.wait_until_finished()
        target = {
            name: {
                "params": {
                    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
                    for k, v in p.items()
                },
                "state": sharding.abstract_state(tx, p),
            }
            for name, (tx, p, _) in states.items()
        }
        with ocp.StandardCheckpointer() as ckpt:
            restored = ckpt.restore(ckpt_path, target)
        leaves = jax.tree.leaves(saved)
        back = jax.tree.leaves(restored)
        wanted = jax.tree.leaves(target)
        report["checkpoint"] = {
            "same_structure": jax.tree.structure(restored) == jax.tree.structure(saved),
            "leaves": len(leaves),
            "equal": all(_local_equal(a, b) for a, b in zip(back, leaves, strict=True)),
            "sharding_ok": all(
                a.sharding.is_equivalent_to(t.sharding, a.ndim)
                and a.sharding.is_equivalent_to(b.sharding, a.ndim)
                for a, b, t in zip(back, leaves, wanted, strict=True)
            ),
            # the restored (k, d) sketch rows of w1 (d = IN * HIDDEN), every optimizer's
            "w1_sketch_specs": sorted(
                {str(a.sharding.spec) for a in back if a.ndim == 2 and a.shape[-1] == IN * HIDDEN}
            ),
            "seconds": time.perf_counter() - start,
        }
    report["results"] = results
    return report


def run_reference(out_path):
    """The same training on one device, no mesh and no ``jax.distributed``."""
    import jax

    import sketchopt as so

    params0, xs, ys = problem()
    results = {}
    for name, source in OPTIMIZERS.items():
        start = time.perf_counter()
        tx = eval(source, {"so": so})
        params = jax.tree.map(jax.numpy.asarray, params0)
        params, _, losses = train(tx, params, tx.init(params), xs, ys, lambda p: p)
        results[name] = {
            "losses": losses,
            "params": {k: np.asarray(v).tolist() for k, v in params.items()},
            "seconds": time.perf_counter() - start,
        }
    return {"device_count": jax.device_count(), "results": results}


def main(argv):
    mode = argv[1]
    out_path = argv[4] if mode == "worker" else argv[2]
    started = time.perf_counter()
    try:
        if mode == "worker":
            report = run_worker(int(argv[2]), int(argv[3]), argv[4], argv[5])
        else:
            report = run_reference(out_path)
        report["ok"] = True
    except Exception as err:  # reported to the test, which fails with it
        report = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}"[:3000],
            "traceback": traceback.format_exc()[-6000:],
        }
    report["seconds"] = time.perf_counter() - started
    tmp = f"{out_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, out_path)  # the test never reads a half-written report
    sys.stdout.flush()
    return 0 if report["ok"] else 1  # a failed process ends the test's wait for its peer


if __name__ == "__main__":
    sys.exit(main(sys.argv))
