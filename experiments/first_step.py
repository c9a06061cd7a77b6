"""Time to a first step (issue 62, "seconds, not minutes"): the first jitted training step of the
README's Flax MLP and of a small CNN, cold, for ``optax.adam`` and the sketchopt learners, and
where the compile time goes.

    python experiments/first_step.py [--models mlp,cnn] [--learners adam,kron_fd,ada_fd,ada_diag]
                                     [--repeats 3] [--out FILE.json] [--help-time]

Every figure comes from a fresh interpreter (``--child``), with JAX's persistent compilation cache
off and the default XLA pipeline (the test suite's ``XLA_FLAGS`` are dropped), as a new user's
first run has them. Per model and learner:

* ``readme``: the README's path -- ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` (``init``), then
  the first call of the ``nnx.jit`` training step (``first``: trace, lower, compile and run) and
  a second call (``steady``);
* ``stages``: the same step as a pure function of ``nnx.split``'s state, through
  ``jax.jit(step).trace(...).lower().compile()``, each stage timed; the step's jaxpr equations
  (nested ones included), its StableHLO operations, the optimized HLO's instructions and
  fusions; and the optimizer's ``update`` alone: its jaxpr equations, with each equation
  charged to the innermost ``sketchopt`` function on its traceback (what dominates the trace).

Ratios are to Adam's figure on the same model. ``--help-time``: the median of 5 wall times of
``sketchopt-stream --help`` (as ``python -c`` of its entry point). Results:
docs/benchmarks/speed.md, "First step: where compile time goes".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(ROOT))
MODELS = ("mlp", "cnn")
LEARNERS = ("adam", "kron_fd", "ada_fd", "ada_diag")
BATCH = 64
#: Compiles of the same step per ``stages`` child (the least is reported beside the first).
COMPILES = 3


def _env() -> dict[str, str]:
    """A new user's environment: no persistent cache, the default XLA pipeline, the CPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    return env


# ------------------------------------------------------------------------------------------------
# The child: one model, one learner, one mode, in a fresh interpreter.


def transform(name: str):
    """A learner by name, ``NAME[:key=value,...]`` with keyword arguments (Python literals) for
    the sketchopt ones: ``kron_fd:block_size=128,graft=None``. ``scan=True`` (a measurement hook,
    not an argument) scans every stream's blocks instead of unrolling them (``compress="blocks"``
    with ``sketchopt.kron.EXACT_BLOCKS = 0``)."""
    import ast

    import optax

    import sketchopt

    base, _, spec = name.partition(":")
    kwargs = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = ast.literal_eval(value)
    if kwargs.pop("scan", False):
        import sketchopt.kron

        sketchopt.kron.EXACT_BLOCKS = 0
        kwargs["compress"] = "blocks"
    if base == "adam":
        return optax.adam(1e-3, **kwargs)
    rates = {"kron_fd": 1e-2, "ada_fd": 1.0, "ada_diag": 1.0}  # kron_fd: the README's
    if base not in rates:
        raise ValueError(f"unknown learner {base!r}; choose from {LEARNERS}")
    return getattr(sketchopt, base)(rates[base], **kwargs)


def _model(name: str):
    """The README's MLP on digits-shaped input, or a small CNN (the Keras MNIST example's layers
    of ``experiments/cnn.py`` on 14x14 images, without dropout), with a batch of random data."""
    import jax
    import numpy as np
    from flax import nnx

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    if name == "mlp":
        model = nnx.Sequential(
            nnx.Linear(64, 128, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(128, 10, rngs=nnx.Rngs(1))
        )
        return model, rng.random((BATCH, 64), np.float32), labels
    if name == "cnn":
        rngs = nnx.Rngs(0)
        model = nnx.Sequential(
            nnx.Conv(1, 32, (3, 3), padding="VALID", rngs=rngs),
            nnx.relu,
            nnx.Conv(32, 64, (3, 3), padding="VALID", rngs=rngs),
            nnx.relu,
            lambda x: nnx.max_pool(x, (2, 2), strides=(2, 2)),
            lambda x: x.reshape(x.shape[0], -1),
            nnx.Linear(5 * 5 * 64, 128, rngs=rngs),
            nnx.relu,
            nnx.Linear(128, 10, rngs=rngs),
        )
        del jax
        return model, rng.random((BATCH, 14, 14, 1), np.float32), labels
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def _loss(model, x, labels):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()


def _readme(model_name: str, learner: str) -> dict:
    import jax
    from flax import nnx

    model, x, labels = _model(model_name)
    start = time.perf_counter()
    optimizer = nnx.Optimizer(model, transform(learner), wrt=nnx.Param)
    jax.block_until_ready(nnx.state(optimizer))
    init = time.perf_counter() - start

    @nnx.jit
    def train_step(model, optimizer, x, labels):
        loss, grads = nnx.value_and_grad(_loss)(model, x, labels)
        optimizer.update(model, grads)
        return loss

    times = []
    for _ in range(2):
        start = time.perf_counter()
        float(train_step(model, optimizer, x, labels))
        times.append(time.perf_counter() - start)
    return {"init": init, "first": times[0], "steady": times[1]}


def count_eqns(jaxpr, owners: collections.Counter | None = None, parent: str = "") -> int:
    """Equations of a (closed) jaxpr, those of nested jaxprs (``pjit``, ``cond``, ``while``, custom
    derivatives) included; with ``owners``, each is counted to the innermost ``sketchopt``
    function on its traceback, else to its enclosing equation's (a nested jaxpr that JAX traced
    once and cached may carry another caller's traceback, or none)."""
    import jax.extend

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        owner = ""
        if owners is not None:
            owner = _owner(getattr(getattr(eqn.source_info, "traceback", None), "frames", ()))
            owner = owner or parent or "(outside sketchopt)"
            owners[owner] += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr | jax.extend.core.Jaxpr):
                    total += count_eqns(sub, owners, owner)
    return total


def _owner(frames) -> str:
    """The innermost ``sketchopt`` function among traceback frames (``module.function``)."""
    package = str(ROOT / "sketchopt")
    for frame in frames:  # innermost first
        if frame.file_name.startswith(package):
            module = pathlib.Path(frame.file_name).relative_to(package).with_suffix("")
            return f"{'.'.join(module.parts)}.{frame.function_name}"
    return ""


def instructions(hlo: str) -> int:
    """The instructions of an optimized HLO module's text, those of fused computations included."""
    return sum(" = " in line for line in hlo.splitlines())


_TABLE_ROW = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


def _tables(hlo: str) -> dict[str, dict[int, str]]:
    """The stack-frame tables at the head of an HLO module's text (``FileNames``,
    ``FunctionNames``, ``FileLocations``, ``StackFrames``): per table, id -> its row."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in hlo.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
        elif current is not None and (row := _TABLE_ROW.match(line)):
            current[int(row.group(1))] = row.group(2)
        elif current is not None and line.strip():
            current = None
    return tables


def fusion_owners(hlo: str) -> collections.Counter:
    """The optimized HLO's fusions and custom calls (the kernels XLA:CPU compiles or calls one
    by one) counted to the innermost ``sketchopt`` function of their stack frame."""
    tables = _tables(hlo)
    files = {k: v.strip('"') for k, v in tables.get("FileNames", {}).items()}
    functions = {k: v.strip('"') for k, v in tables.get("FunctionNames", {}).items()}
    locations = {k: dict((a, int(b)) for a, b in _FIELD.findall(v))
                 for k, v in tables.get("FileLocations", {}).items()}  # fmt: skip
    frames = {k: dict((a, int(b)) for a, b in _FIELD.findall(v))
              for k, v in tables.get("StackFrames", {}).items()}  # fmt: skip
    package = str(ROOT / "sketchopt")

    def owner(frame_id: int) -> str:
        for _ in range(len(frames) + 1):  # innermost frame first, then its callers
            frame = frames.get(frame_id)
            if frame is None:
                break
            location = locations[frame["file_location_id"]]
            path = files[location["file_name_id"]]
            if path.startswith(package):
                module = ".".join(pathlib.Path(path).relative_to(package).with_suffix("").parts)
                return f"{module}.{functions[location['function_name_id']]}"
            if frame["parent_frame_id"] == frame_id:
                break
            frame_id = frame["parent_frame_id"]
        return "(outside sketchopt)"

    owners: collections.Counter = collections.Counter()
    for line in hlo.splitlines():
        if " = " not in line or not (" fusion(" in line or " custom-call(" in line):
            continue
        found = _FRAME_ID.search(line)
        owners[owner(int(found.group(1))) if found else "(no stack frame)"] += 1
    return owners


def _timed(fn, *args):
    """``fn(*args)`` with its wall and process CPU seconds (CPU: the machine is shared)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _stages(model_name: str, learner: str) -> dict:
    import jax
    import optax
    from flax import nnx

    from experiments.aot import kernel_counts

    model, x, labels = _model(model_name)
    tx = transform(learner)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)

    def step(params, rest, opt_state, x, labels):
        def loss_of(p):
            return _loss(nnx.merge(graphdef, p, rest), x, labels)

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # The step traced, lowered and compiled COMPILES times, each from a new function (so nothing
    # is reused but the jaxprs JAX caches for nested ``jit``s): the first pass is what a fresh
    # process pays; the least compile time of all is XLA's own cost, least disturbed by the
    # other processes of a shared machine.
    passes = []
    for _ in range(COMPILES):
        jitted = jax.jit(lambda *args: step(*args), donate_argnums=(0, 2))
        traced, trace, trace_cpu = _timed(jitted.trace, params, rest, opt_state, x, labels)
        lowered, lower, lower_cpu = _timed(traced.lower)
        compiled, compile_wall, compile_cpu = _timed(lowered.compile)
        passes.append((trace, lower, compile_wall, trace_cpu, lower_cpu, compile_cpu))
    trace, lower, compile_seconds, trace_cpu, lower_cpu, compile_cpu = passes[0]
    hlo = compiled.as_text()
    fusions, loops = kernel_counts(hlo)
    grads = jax.tree.map(lambda p: p * 0.0 + 1.0, params)
    # the update alone, compiled as a program of its own
    update_passes = []
    for _ in range(COMPILES):
        update = jax.jit(lambda *args: tx.update(*args)).trace(grads, opt_state, params).lower()
        update_compiled, _, update_cpu = _timed(update.compile)
        update_passes.append(update_cpu)
    update_hlo = update_compiled.as_text()
    owners: collections.Counter = collections.Counter()
    update_eqns = count_eqns(jax.make_jaxpr(tx.update)(grads, opt_state, params), owners)
    return {
        "trace": trace,
        "lower": lower,
        "compile": compile_seconds,
        "trace_cpu": trace_cpu,
        "lower_cpu": lower_cpu,
        "compile_cpu": compile_cpu,
        "compile_cpu_least": min(p[5] for p in passes),
        "compile_least": min(p[2] for p in passes),
        "step_eqns": count_eqns(traced.jaxpr),
        "stablehlo_ops": sum(" = " in line for line in lowered.as_text().splitlines()),
        "hlo_instructions": instructions(hlo),
        "fusions": fusions,
        "while_loops": loops,
        "update_compile_cpu_least": min(update_passes),
        "update_hlo_instructions": instructions(update_hlo),
        "update_fusions": kernel_counts(update_hlo)[0],
        "update_fusions_by_function": dict(fusion_owners(update_hlo).most_common(16)),
        "update_eqns": update_eqns,
        "update_eqns_by_function": dict(owners.most_common(16)),
    }


def child(model_name: str, learner: str, mode: str) -> dict:
    clock = time.perf_counter()
    import jax
    import optax  # noqa: F401
    from flax import nnx  # noqa: F401

    import sketchopt  # noqa: F401

    imports = time.perf_counter() - clock
    jax.config.update("jax_enable_compilation_cache", False)
    found = _readme(model_name, learner) if mode == "readme" else _stages(model_name, learner)
    return {"imports": imports, **found, "jax": jax.__version__}


# ------------------------------------------------------------------------------------------------
# The parent: every child in its own interpreter, medians, ratios to Adam.


def run_child(model_name: str, learner: str, mode: str, xla_flags: str = "") -> dict:
    command = [sys.executable, __file__, "--child", model_name, learner, mode]
    env = _env()
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(models, learners, repeats: int, xla_flags: str = "") -> dict:
    """Per model and learner: the README path's medians over ``repeats`` fresh processes (the
    learners taking turns, so that they share the machine's load) and one ``stages`` process."""
    results: dict = {}
    for model_name in models:
        runs: dict = collections.defaultdict(list)
        for _ in range(repeats):
            for learner in learners:
                runs[learner].append(run_child(model_name, learner, "readme", xla_flags))
        for learner in learners:
            row = {
                key: statistics.median(r[key] for r in runs[learner])
                for key in ("imports", "init", "first", "steady")
            }
            row.update(run_child(model_name, learner, "stages", xla_flags))
            results.setdefault(model_name, {})[learner] = row
            print(f"{model_name} {learner}: first step {row['first']:.2f} s", file=sys.stderr)
    return results


def help_time(repeats: int = 5) -> float:
    """The median wall seconds of ``sketchopt-stream --help`` (its entry point, fresh each)."""
    code = "import sys; from sketchopt.stream.cli import main; sys.exit(main(['--help']))"
    times = []
    for _ in range(repeats):
        clock = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, check=True)
        times.append(time.perf_counter() - clock)
    return statistics.median(times)


def table(results: dict) -> str:
    """The Markdown table of docs/benchmarks/speed.md (XLA's compile in process CPU seconds, the
    figure least moved by other processes on a shared machine)."""
    head = [
        "model",
        "learner",
        "first step s",
        "x Adam",
        "init s",
        "trace s",
        "lower s",
        "XLA compile CPU s",
        "x Adam",
        "step eqns",
        "HLO instr.",
        "fusions",
        "update: eqns / instr. / fusions",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for model_name, rows in results.items():
        adam = rows.get("adam")
        for learner, r in rows.items():
            first = f"{r['first'] / adam['first']:.1f}x" if adam else ""
            xla = f"{r['compile_cpu'] / adam['compile_cpu']:.1f}x" if adam else ""
            cells = [
                model_name,
                f"`{learner}`",
                f"{r['first']:.2f}",
                first,
                f"{r['init']:.2f}",
                f"{r['trace']:.2f}",
                f"{r['lower']:.2f}",
                f"{r['compile_cpu']:.2f}",
                xla,
                str(r["step_eqns"]),
                str(r["hlo_instructions"]),
                str(r["fusions"]),
                f"{r['update_eqns']} / {r['update_hlo_instructions']} / {r['update_fusions']}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def owners_table(results: dict, top: int = 8) -> str:
    """Per sketchopt learner, the functions the update's fusions and equations come from."""
    lines = []
    for model_name, rows in results.items():
        for learner, r in rows.items():
            if learner.startswith("adam"):
                continue
            for what, key in (("fusions", "update_fusions_by_function"),
                              ("eqns", "update_eqns_by_function")):  # fmt: skip
                parts = ", ".join(f"`{k}` {v}" for k, v in list(r[key].items())[:top])
                lines.append(f"* {model_name} `{learner}`, update {what}: {parts}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--learners", default=",".join(LEARNERS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs of the README path")
    parser.add_argument("--out", type=pathlib.Path, help="write the results as JSON")
    parser.add_argument("--help-time", action="store_true", help="time --help only")
    parser.add_argument("--xla-flags", default="", help="XLA_FLAGS for every child (default none)")
    parser.add_argument("--table", type=pathlib.Path, help="print the tables of a JSON written")
    parser.add_argument(
        "--child", nargs=3, metavar=("MODEL", "LEARNER", "MODE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if args.table:
        results = json.loads(args.table.read_text())["results"]
        print(table(results) + "\n\n" + owners_table(results))
        return 0
    if args.help_time:
        print(f"sketchopt-stream --help: {help_time():.3f} s (median of 5)")
        return 0
    learners = args.learners.split(";" if ":" in args.learners else ",")
    results = measure(args.models.split(","), learners, args.repeats, args.xla_flags)
    print(table(results))
    print()
    print(owners_table(results))
    if args.out:
        payload = {"results": results, "xla_flags": args.xla_flags, "repeats": args.repeats}
        args.out.write_text(json.dumps(payload, indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
