"""Updates compiled for a TPU on any machine: XLA's TPU compiler through libtpu's deviceless
ahead-of-time compile, and what its own cost model counts.

``pip install "jax[tpu]==<the installed jax>"`` (or ``make test-accelerators``, which installs
the ``libtpu`` that the installed JAX names) brings the compiler; no TPU is needed.
:func:`topology` gives a TPU slice's devices to place ``jax.ShapeDtypeStruct``\\ s on,
:func:`compile_update` compiles one optimizer ``update`` for it (the state donated, as a
training step donates it), :func:`compile_step` a training step's optimizer part (the update
and the parameters' write), and :class:`Program` holds XLA's figures: bytes accessed and flops
(``cost_analysis()``: a loop body counted once, a ``cond`` at its costliest branch), the
fusions and while loops of the optimized HLO, and the seconds the compile took.

An optimizer step is bandwidth-bound, so its bytes are its time on the accelerator. One thing
to know when reading them: XLA's TPU compiler prefetches an array that two kernels read into the
chip's on-chip memory when it fits there (a ``copy-start`` into memory space ``S(1)``), and
counts that copy and the reads from it. A guarded update (one read of the gradient for its
finiteness, then one fused pass) is so counted at 9 arrays, not 5, for leaves of up to some
100 MB, and at 5 above: :func:`guarded_adagrad` is that floor program, compiled beside the
learners (``experiments/device_bench.py --parts aot``).

:func:`compile_fn` traces on the code path a TPU user's update takes (the accelerator path, the
batched factorizations and the TPU as the target, ``sketchopt.accelerator_path``,
``sketchopt.batched_solves`` and ``sketchopt._solvers.tpu_target``): on this CPU the backend's
own choice would be the CPU's. Importing this module changes nothing
in the process but libtpu's lock (below).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from typing import Any

# libtpu takes a per-machine lock: processes that compile at once (pytest-xdist workers, a
# benchmark beside the tests) each need this to load it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

#: The TPU slice compiled for: a v5e with 4 chips (a TPU user's common small slice).
TOPOLOGY = "v5e:2x2"


def available() -> bool:
    """Whether libtpu (XLA's TPU compiler) is installed."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def topology(name: str = TOPOLOGY):
    """The devices of a TPU slice, for deviceless compiles (``jax.experimental.topologies``)."""
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name=name, platform="tpu")


def device(index: int = 0):
    """One TPU device of :func:`topology`."""
    return topology().devices[index]


def placed(tree: Any, sharding=None) -> Any:
    """``tree``'s arrays as ``jax.ShapeDtypeStruct``\\ s on ``sharding`` (one TPU device when
    ``None``)."""
    sharding = sharding or jax.sharding.SingleDeviceSharding(device())
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype, sharding=sharding), tree
    )


_FUSION = re.compile(r"^\s*(?:ROOT )?%\S+ = (?:\([^=]*?\)|\S+) fusion\(", re.M)
_WHILE = re.compile(r"\bwhile\(")


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
_ARRAY = re.compile(r"\b[a-z]+\d*\[([\d,]*)\](?:\{([\d,]*)(?::T\(([\d,]+)\))?)?")
#: What moves no array of its own: views, tuples, the ends of asynchronous copies.
_NO_PASS = ("parameter", "constant", "get-tuple-element", "bitcast", "tuple", "copy-done")


def stored_elements(shape: str) -> int:
    """The elements an HLO shape (or tuple of shapes) occupies in memory: each array's dims in
    its layout's physical order (``{minor_to_major}``), the trailing ones padded to the layout's
    first tile (``T(8,128)``: a TPU stores a 10-row float32 matrix as 16 rows)."""
    total = 0
    for dims, order, tile in _ARRAY.findall(shape):
        sizes = [int(x) for x in dims.split(",") if x]
        if order:
            sizes = [sizes[int(i)] for i in reversed(order.split(","))]  # major to minor
        if tile:
            tiles = [int(x) for x in tile.split(",")]
            for i, t in enumerate(tiles, start=len(sizes) - len(tiles)):
                if i >= 0:
                    sizes[i] = -(-sizes[i] // t) * t
        total += functools.reduce(lambda a, b: a * b, sizes, 1)
    return total


def _computations(text: str) -> dict[str, list[tuple]]:
    """An optimized HLO module's computations: ``name -> [(instruction, shape, opcode,
    operands, called computation or None, parameter index or None)]``, the entry computation
    under ``"ENTRY"``."""
    out = {}
    for block in re.split(r"\n(?=\S)", text):
        head = block.split(" ", 2)[0]
        body = []
        for line in block.splitlines()[1:]:
            match = _INSTRUCTION.match(line)
            if match:
                name, shape, opcode, rest = match.groups()
                calls = re.search(r"calls=(%[\w.\-]+)", rest)
                index = re.match(r"(\d+)\)", rest) if opcode == "parameter" else None
                operands = re.findall(r"%[\w.\-]+", rest.split("), ")[0])
                body.append((name, shape, opcode, operands, calls and calls.group(1),
                             index and int(index.group(1))))  # fmt: skip
        out["ENTRY" if head == "ENTRY" else head] = body
    return out


def _sliced_reads(computation: list[tuple]) -> dict[int, int]:
    """``parameter index -> elements read`` of a fused computation's parameters that it only
    slices (``dynamic-slice``, ``slice``): a kernel that reads one row of the sketch takes the
    whole array as its operand."""
    users: dict[str, list[tuple[str, str, int]]] = {}
    for _, shape, opcode, operands, *_ in computation:
        for position, o in enumerate(operands):
            users.setdefault(o, []).append((opcode, shape, position))
    out = {}
    for name, _, opcode, _, _, index in computation:
        uses = users.get(name, [])
        if (
            opcode == "parameter"
            and uses
            and all(op in ("dynamic-slice", "slice") and at == 0 for op, _, at in uses)
        ):
            out[index] = sum(stored_elements(shape) for _, shape, _ in uses)
    return out


def passes(text: str, elements: int) -> list[tuple[str, str, float, float]]:
    """Where an update's traffic goes: for each instruction of an optimized HLO module's entry
    computation that reads or writes an array of at least half of ``elements`` (a leaf's
    size), ``(instruction, opcode, read, written)``, the last two in arrays of ``elements``
    (as stored, :func:`stored_elements`): its large operands and its result. An operand that a
    fusion only slices counts the slice, an in-place ``dynamic-update-slice`` its update; a
    ``conditional`` or ``while`` counts its operands in full, which its branches or body read
    (their own passes are not split out, so a rare branch counts whole). The sum approximates
    XLA's bytes accessed over ``4 * elements`` for float32; it says which kernels read the
    sketch and how often."""
    computations = _computations(text)
    sizes, out = {}, []
    for name, shape, opcode, operands, calls, _ in computations["ENTRY"]:
        sizes[name] = stored_elements(shape)
        if opcode in _NO_PASS:
            continue
        reads, written = [sizes.get(o, 0) for o in operands], sizes[name]
        if opcode == "dynamic-update-slice":  # in place: the update is read, then written
            reads = reads[1:2]
            written = sum(reads)
        elif calls in computations:
            sliced = _sliced_reads(computations[calls])
            reads = [sliced.get(k, r) for k, r in enumerate(reads)]
        large = [r for r in reads if 2 * r >= elements]
        written = written if 2 * written >= elements else 0
        if large or written:
            out.append((name, opcode, sum(large) / elements, written / elements))
    return out


def kernel_counts(text: str) -> tuple[int, int]:
    """``(fusions, while loops)`` of an optimized HLO module's text; a fusion with a tuple
    result (several outputs) counts too."""
    return len(_FUSION.findall(text)), len(_WHILE.findall(text))


@dataclasses.dataclass(frozen=True)
class Program:
    """XLA's figures of one compiled program (module docstring)."""

    bytes_accessed: float
    flops: float
    optimal_seconds: float | None
    fusions: int
    while_loops: int
    compile_seconds: float
    text: str = dataclasses.field(repr=False, default="")
    output_shardings: Any = dataclasses.field(repr=False, default=None)

    def row(self) -> dict:
        """The figures as a JSON row (the HLO text and the shardings left out)."""
        skip = ("text", "output_shardings")
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }


def program(compiled, compile_seconds: float) -> Program:
    """:class:`Program` of a ``jax.stages.Compiled``."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    text = compiled.as_text()
    fusions, while_loops = kernel_counts(text)
    return Program(
        bytes_accessed=float(cost.get("bytes accessed", float("nan"))),
        flops=float(cost.get("flops", float("nan"))),
        # XLA's roofline estimate; it comes out negative for programs with loops or conds
        optimal_seconds=_positive(cost.get("optimal_seconds")),
        fusions=fusions,
        while_loops=while_loops,
        compile_seconds=compile_seconds,
        text=text,
        output_shardings=compiled.output_shardings,
    )


def _positive(value) -> float | None:
    return float(value) if value is not None and value > 0 else None


def compile_fn(fn, *args, donate_argnums=(), **jit_kwargs) -> Program:
    """``fn`` traced on ``args`` (``ShapeDtypeStruct``\\ s placed on TPU devices) on the
    accelerator code path, lowered and compiled for the TPU."""
    import sketchopt
    from sketchopt import _solvers

    start = time.perf_counter()
    with sketchopt.accelerator_path(), sketchopt.batched_solves(), _solvers.tpu_target(True):
        jitted = jax.jit(fn, donate_argnums=donate_argnums, **jit_kwargs)
        compiled = jitted.trace(*args).lower().compile()
    return program(compiled, time.perf_counter() - start)


def compile_update(tx, params, *, donate: bool = True) -> Program:
    """One ``tx.update(grads, state, params)`` over abstract ``params`` compiled for one TPU
    device, the state donated (``donate``)."""
    params = placed(params)
    state = placed(jax.eval_shape(tx.init, params))
    return compile_fn(tx.update, params, state, params, donate_argnums=(1,) if donate else ())


def guarded_adagrad(learning_rate: float = 0.1, eps: float = 1e-7):
    """``optax.adagrad``'s step behind the least guard of the non-finite policy: per leaf, one
    read of the gradient for its finiteness, then one fused pass that steps the leaf or leaves
    it (its accumulator bit-identical, a zero update), and the count of skipped leaves that the
    policy keeps in the state. The floor of a guarded diagonal method as XLA counts it (module
    docstring), compiled beside ``optax.adagrad``.

    The count is a scalar, but it joins every leaf's flag: on a tree of many leaves that one
    dependency changes how XLA's TPU compiler schedules and prefetches the leaves' passes (on
    the speed benchmark's 24-layer tree the same program without it counts 0.53x the bytes,
    and in a training step, :func:`compile_step`, the same bytes as with it)."""
    import optax

    def init(params):  # optax.adagrad's start, and the count
        return jax.tree.map(lambda p: jnp.full_like(p, 0.1), params), jnp.zeros((), jnp.int32)

    def one(g, acc):
        ok = jnp.isfinite(jnp.max(jnp.abs(g)))
        new = jnp.where(ok, acc + g * g, acc)
        step = jnp.where(new > 0, jax.lax.rsqrt(new + eps), 0) * g
        return jnp.where(ok, -learning_rate * step, 0), new, ok

    def update(grads, state, params=None):
        del params
        accumulators, skipped = state
        leaves, treedef = jax.tree.flatten(grads)
        pairs = zip(leaves, treedef.flatten_up_to(accumulators), strict=True)
        steps = [one(g, a) for g, a in pairs]
        skipped = sum(((~ok).astype(jnp.int32) for *_, ok in steps), skipped)
        unflatten = lambda k: treedef.unflatten([s[k] for s in steps])  # noqa: E731
        return unflatten(0), (unflatten(1), skipped)

    return optax.GradientTransformation(init, update)


def compile_step(tx, params, *, donate: bool = True) -> Program:
    """One training step's optimizer part, ``optax.apply_updates(params, tx.update(grads,
    state, params))``, over abstract ``params`` compiled for one TPU device, the parameters and
    the state donated (``donate``): the update as it runs inside a training step, where XLA
    may fuse it with the parameters' write."""
    import optax

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = placed(params)
    state = placed(jax.eval_shape(tx.init, params))
    return compile_fn(step, params, state, params, donate_argnums=(0, 1) if donate else ())


def between_gram_refreshes(tx):
    """``tx`` traced without the FD family's exact Gram refresh
    (``sketchopt._solvers.gram_refreshes``), the ``lax.cond`` branch one shrink in
    ``sketchopt.sketches.GRAM_REFRESH_PERIOD`` takes: the program of the steps between
    refreshes, which with the whole update's count (the branch charged at every step) gives a
    period's amortized bytes."""
    import optax

    from sketchopt import _solvers

    def update(updates, state, params=None):
        with _solvers.gram_refreshes(False):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(tx.init, update)


def kron_fd_branch(
    refresh: bool,
    learning_rate: float = 1e-3,
    sketch_size: int | None = None,
    *,
    shaped: bool = True,
    switched: bool = False,
):
    """``sketchopt.kron_fd(learning_rate)`` at its defaults with its update's ``lax.switch``
    (``sketchopt._leafwise.Phases``) over one branch only: the step that absorbs the gradient
    and recomputes the roots (``refresh``), or a step between refreshes. XLA counts the switch
    at its costliest branch; these two give a period's amortized bytes,
    ``(refresh + (PERIOD - 1) between) / PERIOD``.

    ``switched`` keeps a switch (over two copies of the branch, so that XLA keeps it), whose
    boundary costs what it costs in the real update: compiled alone (``False``) XLA fuses the
    branch's end with the momentum after it (the step between refreshes on the 24-layer tree:
    1.91x Adam's bytes alone, 2.10x in the switch; its fusions and loops count twice there,
    one per copy). ``sketch_size``: ``None`` (the default's) or another ``k``;
    ``shaped=False`` stacks a group's gradients flat, as every other metric
    (``sketchopt.Metric.shaped``), to compare."""
    import inspect

    from sketchopt import _leafwise, shampoo

    defaults = {
        name: p.default
        for name, p in inspect.signature(shampoo.kron_fd).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    own = inspect.signature(shampoo.kron_sketched).parameters
    skip = ("sketch_size", "delta")
    options = {k: v for k, v in defaults.items() if k in own and k not in skip and v is not None}
    options.update(update_every=shampoo.PERIOD, refresh_every=shampoo.PERIOD)
    k = defaults["sketch_size"] if sketch_size is None else sketch_size
    metric = shampoo.kron_sketched(k, defaults["delta"], **options)
    copies = 2 if switched else 1
    phases = _leafwise.Phases(
        ((refresh, refresh),) * copies, lambda count: (count % copies).astype(jnp.int32)
    )
    metric = metric._replace(phases=phases, shaped=shaped)
    return shampoo.with_momentum(learning_rate, metric, defaults["momentum"], defaults["nesterov"])
