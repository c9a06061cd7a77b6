"""Per-step cost of the sketched learners, side by side with ``optax.adagrad`` (issue: speed).

``python experiments/run.py speed [--quick|--full]`` (or ``python experiments/speed.py``) measures,
in one process, jitted update steps with donated state (``jax.block_until_ready``, warm-up
excluded, median of repeated calls), each from a cold cache (a 64 MB scratch buffer is rewritten
before the call, as a training step's forward and backward passes would evict the optimizer's
state) and back to back, with the cache as the previous call left it (warm); the doubling
buffer's steps are averaged over whole shrink periods:

* ``ada_fd`` (per-step and ``fast=True``), ``ada_fd_dual_averaging``, ``ada_fd(robust=True)``,
  ``fd_son``, ``rfd_son``, ``radagrad`` (Krummenacher et al.'s projected AdaGrad, the Ada-FD
  paper's other baseline), the sketches alone, ``ada_diag``, ``optax.adagrad``, ``ada_full``
  (small ``d`` only) and ``naive_ada_fd``: the textbook Ada-FD of the paper, written here, with an
  SVD of the ``tau x d`` sketch every step;
* the ratio of each to ``optax.adagrad`` at the same ``d`` (cold and warm) and the optimizer
  state in floats per parameter;
* the jit compile time of one ``ada_fd`` update over the parameter tree of the CNN experiment,
  and the trace and compile time of one update over a transformer-shaped tree (24 layers of
  ``qkv 256x768``, ``o 256x256``, ``ff1 256x1024``, ``ff2 1024x256``, two norms and two biases:
  193 leaves, 19M parameters; 4 layers at ``--quick``) for ``ada_fd``, ``fd_son``, ``ada_diag``
  and ``optax.adam``: the shared driver compiles one step per distinct leaf shape;
* every family's update called eagerly (outside ``jit``, at ``d = 16``) against the same update
  jitted, and the growth of the process's memory mappings per eager step (0: nothing is
  recompiled); at ``--quick`` one family per driver path (``QUICK_EAGER``);
* the wall time of the ``regret`` experiment's 49-point ``eta x delta`` grid as one vmapped call
  versus one configuration alone.

Claims (``speed/...`` rows of the Reproductions table): the Ada-FD paper's sec. 4.1 / Fig. 1(c)
sentence "ADA-FD is faster than RADAGRAD and as fast as FD-SON", checked on the ratios
RADAGRAD / ADA-FD and FD-SON / ADA-FD (cold cache) at every float32 ``(d, sketch_size)`` of the
benchmark and per round of the ``regret`` pass (stored under ``paper_ratios``): "faster" is a
ratio above 1, "as fast" a ratio in ``AS_FAST_BAND = [0.67, 1.5]``; a claim holds when it holds
at every setting and holds partly when at some. They are timings on whatever machine runs them,
so they stay in the benchmark's output: the test checks only that each verdict follows from the
ratios in the JSON.

It prints the table and the targets, writes ``speed.json`` and a log-log plot ``speed.png`` of
time per step versus ``d``. Sizes: ``--quick`` d in {1e3, 1e4} (without the sketches of
``QUICK_SKIP``); default d in {1e4, 1e5, 1e6} with
sketch sizes {10, 20}; ``--full`` d in {1e3, ..., 1e6} with sketch sizes {5, 10, 20, 40} and a
float64 row. Timings on a shared machine are noisy; the ratios are measured side by side in one
process, which is what the targets are about.
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments import common  # noqa: E402

NAME = "speed"


def _config(size: str) -> dict:
    if size == "quick":
        return {"dims": [1000, 10000], "sizes": [5], "repeats": 3, "f64": None, "full_dim": 1000}
    if size == "full":
        return {
            "dims": [1000, 10000, 100000, 1000000],
            "sizes": [5, 10, 20, 40],
            "repeats": 15,
            "f64": (100000, 10),
            "full_dim": 2000,
        }
    return {
        "dims": [10000, 100000, 1000000],
        "sizes": [10, 20],
        "repeats": 9,
        "f64": (100000, 10),
        "full_dim": 2000,
    }


def naive_ada_fd(learning_rate: float, sketch_size: int, delta: float):
    """The literal Ada-FD Alg. 2: an SVD of the ``tau x d`` sketch at every step (baseline)."""
    import jax.numpy as jnp
    import optax

    def init(params):
        return jnp.zeros((sketch_size, params.size), params.dtype)

    def update(g, sketch, params=None):
        del params
        sketch = sketch.at[-1].set(g)
        _, s, vt = jnp.linalg.svd(sketch, full_matrices=False)
        s_new = jnp.sqrt(jnp.maximum(s**2 - s[-1] ** 2, 0))
        sketch = s_new[:, None] * vt
        step = g - vt.T @ (s_new / (delta + s_new) * (vt @ g))
        return -(learning_rate / delta) * step, sketch

    return optax.GradientTransformation(init, update)


def _learners(tau: int, dim: int, full_dim: int, quick: bool = False):
    """(name, transform or sketch, kind) for one sketch size and dimension."""
    import jax
    import optax

    import sketchopt as so
    from sketchopt import sketches

    learners = [
        ("optax.adagrad", optax.adagrad(0.1), "tx"),
        ("ada_diag", so.ada_diag(0.1, 1e-3), "tx"),
        ("ada_fd", so.ada_fd(0.1, tau, 1e-3, robust=False), "tx"),
        ("ada_fd(fast=True)", so.ada_fd(0.1, tau, 1e-3, robust=False, fast=True), "tx"),
        ("ada_fd(robust=True)", so.ada_fd(0.1, tau, 1e-3, robust=True), "tx"),
        ("ada_fd_dual_averaging", so.ada_fd_dual_averaging(0.1, tau, 1e-3, robust=False), "tx"),
        ("naive_ada_fd", naive_ada_fd(0.1, tau, 1e-3), "tx"),
        ("sketch:frequent_directions", sketches.frequent_directions(tau), "sketch"),
        (
            "sketch:frequent_directions(fast)",
            sketches.frequent_directions(tau, fast=True),
            "sketch",
        ),
        ("sketch:robust_frequent_directions", sketches.robust_frequent_directions(tau), "sketch"),
        ("sketch:oja", sketches.oja(tau), "sketch"),
        (
            "sketch:random_projection",
            sketches.random_projection(tau, jax.random.PRNGKey(0)),
            "sketch",
        ),
    ]
    learners += [
        ("fd_son", so.fd_son(1.0, tau), "tx"),
        ("rfd_son", so.rfd_son(tau, alpha0=0.0), "tx"),
        ("radagrad", so.radagrad(0.1, tau, 1e-3, jax.random.PRNGKey(0)), "tx"),
    ]
    if dim <= full_dim:
        learners.append(("ada_full", so.ada_full(0.1, 1e-3), "tx"))
    if quick:
        learners = [entry for entry in learners if entry[0] not in QUICK_SKIP]
    return learners


# Left out at --quick (which checks the plumbing): sketches timed on their own whose code paths the
# learners' rows already cover; this keeps the quick run from growing with the RADAGRAD rows.
QUICK_SKIP = ("sketch:frequent_directions(fast)", "sketch:oja", "sketch:random_projection")


# Bytes rewritten before each cold-cache call: twice the 32 MB last-level cache of the machine the
# targets were set on (more than most CPUs have), so that nothing of a step's state stays cached.
_FLUSH_BYTES = 64 * 2**20


def _flusher():
    """A jitted, donating pass over a scratch buffer that evicts the caches, and the buffer."""
    import jax
    import jax.numpy as jnp

    scratch = jnp.zeros((_FLUSH_BYTES // 4,), jnp.float32)
    return jax.jit(lambda x: x + 1, donate_argnums=0), scratch


def _shrink_period(name: str, tau: int) -> int:
    """Steps between two shrinks of the doubling buffer (1 for the learners without one)."""
    return tau + 1 if "fast" in name else 1


def _time_step(
    obj, kind: str, dim: int, dtype, repeats: int, inner: int, cycle: int = 1
) -> tuple[float, float, float]:
    """Median seconds per step of a jitted, state-donating update, with cold and with warm caches;
    and the state's floats per parameter.

    ``cycle > 1`` is for learners whose steps differ in cost with a period (the doubling buffer
    shrinks once every ``sketch_size + 1`` rows): the repeats then cover whole periods and the
    mean is reported, the amortized cost, where a median would report only the cheap steps.

    Cold: the caches are flushed before every timed call, as a training step's forward and
    backward passes would evict the optimizer's state. Warm: back-to-back calls, each finding
    what the previous one left in cache; at ``d = 1e6`` the 16 MB that ``optax.adagrad`` touches
    fits in a 32 MB cache and the sketch does not, so warm ratios are the harsher ones.
    """
    import jax
    import jax.numpy as jnp

    params = jnp.zeros((dim,), dtype)
    grads = [jax.random.normal(jax.random.PRNGKey(i), (dim,), dtype) for i in range(2)]
    if kind == "tx":
        state = obj.init(params)

        def step(state, g):
            updates, state = obj.update(g, state, params)
            return state, updates

    else:
        state = obj.init(dim, dtype)

        def step(state, g):
            return obj.update(state, g), g[:1]

    floats = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / 4 / dim

    def many(state, g):
        def body(_, carry):
            state, _ = carry
            return step(state, g)

        return jax.lax.fori_loop(1, inner, body, step(state, g))

    fn = jax.jit(many, donate_argnums=0)
    flush, scratch = _flusher()
    scratch = flush(scratch)
    state = jax.block_until_ready(fn(state, grads[0]))[0]  # compile and warm up
    cold, warm = [], []
    if cycle > 1:  # consecutive calls then cover every step of the period equally often
        repeats = -(-repeats // cycle) * cycle
    for times in (cold, warm):
        for r in range(repeats):
            if times is cold:
                scratch = jax.block_until_ready(flush(scratch))
            start = time.perf_counter()
            state = jax.block_until_ready(fn(state, grads[r % 2]))[0]
            times.append(time.perf_counter() - start)
    stat = np.mean if cycle > 1 else np.median
    return float(stat(cold)) / inner, float(stat(warm)) / inner, float(floats)


def _cnn_param_shapes():
    """The parameter tree of the CNN experiment (Keras MNIST example), as shapes."""
    return {
        "conv1": {"kernel": (3, 3, 1, 32), "bias": (32,)},
        "conv2": {"kernel": (3, 3, 32, 64), "bias": (64,)},
        "dense1": {"kernel": (12 * 12 * 64, 128), "bias": (128,)},
        "dense2": {"kernel": (128, 10), "bias": (10,)},
    }


def _compile_time() -> float:
    import jax
    import jax.numpy as jnp

    import sketchopt as so

    params = jax.tree.map(
        lambda s: jnp.zeros(s, jnp.float32),
        _cnn_param_shapes(),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    tx = so.ada_fd(0.01, 20, 1e-3, robust=False)
    state = tx.init(params)
    start = time.perf_counter()
    jax.jit(tx.update).lower(params, state, params).compile()
    return time.perf_counter() - start


def _transformer_tree(layers: int):
    """The transformer-shaped tree of the module docstring, as ShapeDtypeStructs."""
    import jax
    import jax.numpy as jnp

    layer = {
        "qkv": (256, 768),
        "o": (256, 256),
        "ff1": (256, 1024),
        "ff2": (1024, 256),
        "norm1": (256,),
        "norm2": (256,),
        "bias_qkv": (768,),
        "bias_ff1": (1024,),
    }
    tree = {
        f"layer{i:02d}": {k: jax.ShapeDtypeStruct(v, jnp.float32) for k, v in layer.items()}
        for i in range(layers)
    }
    tree["final_norm"] = jax.ShapeDtypeStruct((256,), jnp.float32)
    return tree


def _tree_compile(layers: int) -> dict:
    """Trace (and lower) and compile seconds of one update over the transformer-shaped tree."""
    import jax
    import optax

    import sketchopt as so

    params = _transformer_tree(layers)
    out = {
        "layers": layers,
        "leaves": len(jax.tree.leaves(params)),
        "parameters": int(sum(np.prod(x.shape) for x in jax.tree.leaves(params))),
    }
    for name, tx in (
        ("ada_fd", so.ada_fd(0.1, 10, 1e-3, robust=False)),
        ("fd_son", so.fd_son(1.0, 10)),
        ("ada_diag", so.ada_diag(0.1, 1e-3)),
        ("optax.adam", optax.adam(1e-3)),
    ):
        _, _, trace, compile_ = common.compile_update(tx, params)
        out[name] = {"trace_seconds": trace, "compile_seconds": compile_}
    return out


def _eager_families():
    import jax
    import optax

    import sketchopt as so

    key = jax.random.PRNGKey(0)
    return {
        "optax.adagrad": lambda: optax.adagrad(0.1),
        "ada_diag": lambda: so.ada_diag(0.1, 1e-3),
        "ada_fd": lambda: so.ada_fd(0.1, 4, 1e-3, robust=False),
        "ada_fd_dual_averaging": lambda: so.ada_fd_dual_averaging(0.1, 4, 1e-3, robust=False),
        "ada_full": lambda: so.ada_full(0.1, 1e-3),
        "fd_son": lambda: so.fd_son(1.0, 4),
        "rfd_son": lambda: so.rfd_son(4, alpha0=0.0),
        "oja_son": lambda: so.oja_son(1.0, 4),
        "rp_son": lambda: so.rp_son(1.0, 4, key),
        "ons": lambda: so.ons(1.0),
        "radagrad": lambda: so.radagrad(0.1, 4, 1e-3, key),
        "ada_lr": lambda: so.ada_lr(0.1, 4, 1e-3, key),
        "ftrl_proximal": lambda: so.ftrl_proximal(0.1, 1.0, 1e-3, 1e-3),
        "fobos_l1": lambda: so.fobos_l1(0.1, 1e-3),
    }


def _memory_mappings() -> int | None:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return None


# The families timed eagerly at --quick (each costs two compilations): one per driver path.
QUICK_EAGER = ("optax.adagrad", "ada_diag", "ada_fd", "fd_son", "ftrl_proximal")


def _eager_timing(names=None, dim: int = 16, steps: int = 40) -> dict:
    """Per family (all by default): median ms of an eager update and of the jitted one, and
    mappings per step."""
    import jax
    import jax.numpy as jnp

    out = {}
    rng = np.random.default_rng(0)
    grads = [jnp.asarray(rng.standard_normal(dim), jnp.float32) for _ in range(8)]
    params = jnp.zeros((dim,))
    families = _eager_families()
    for name in names or families:
        tx = families[name]()
        timings = {}
        for mode, update in (("eager", tx.update), ("jit", jax.jit(tx.update))):
            state = tx.init(params)
            for g in grads[:5]:  # warm-up (compilation included)
                state = jax.block_until_ready(update(g, state, params))[1]
            before = _memory_mappings()
            times = []
            for i in range(steps):
                start = time.perf_counter()
                state = jax.block_until_ready(update(grads[i % 8], state, params))[1]
                times.append(time.perf_counter() - start)
            after = _memory_mappings()
            timings[mode] = float(np.median(times)) * 1e3
            if mode == "eager" and before is not None:
                timings["mappings_per_step"] = (after - before) / steps
        timings["ratio"] = timings["eager"] / timings["jit"]
        out[name] = {
            "eager_ms": timings["eager"],
            "jit_ms": timings["jit"],
            "ratio": timings["ratio"],
            "mappings_per_step": timings.get("mappings_per_step"),
        }
    return out


def _grid_timing(size: str, seed: int) -> dict:
    """Wall time of the regret experiment's eta x delta grid in one vmapped call vs one point."""
    import jax

    from experiments import regret

    T, d = (500, 30) if size == "quick" else (2000, 100)
    x, y, _ = regret.make_problem(T, d, seed)
    grid = common.decades(-4, 2)
    alg = next(a for a in regret.algorithms(grid) if a.name == "ada_fd")
    run = common.online_linear(alg, x, y, common.absolute_loss, record_mistakes=False)
    keys = jax.random.split(jax.random.PRNGKey(seed), 1)
    orders = np.arange(T)[None]
    one = {"eta": [0.1], "delta": [1.0]}
    full = {"eta": grid, "delta": grid}
    timings = {}
    for label, g in (("one", one), ("grid", full)):
        common.run_grid(alg, run, keys=keys, orders=orders, grid=g)  # compile
        _, _, seconds = common.run_grid(alg, run, keys=keys, orders=orders, grid=g)
        timings[label] = seconds
    return {
        "T": T,
        "d": d,
        "points": len(grid) ** 2,
        "one_config_seconds": timings["one"],
        "grid_seconds": timings["grid"],
        "ratio": timings["grid"] / timings["one"],
    }


def _regret_pass(size: str, seed: int) -> dict:
    """Seconds per round of one jitted online pass (the ``regret`` experiment's shape: ``T``
    rounds of absolute loss at ``d``, one ``lax.scan``) for ADA-FD and its peers of the Ada-FD
    paper's Fig. 1(c), at the first point of each one's grid; best of three calls after
    compiling."""
    import jax

    from experiments import regret

    T, d = (2000, 100) if size == "quick" else (10_000, 100)
    x, y, _ = regret.make_problem(T, d, seed)
    algs = {a.name: a for a in regret.algorithms(common.decades(-1, 0))}
    keys = jax.random.split(jax.random.PRNGKey(seed), 1)
    orders = np.arange(T)[None]
    out = {"T": T, "d": d}
    for name in ("ada_diag", "ada_fd", "radagrad", "fd_son"):
        alg = algs[name]
        run = common.online_linear(alg, x, y, common.absolute_loss, record_mistakes=False)
        hyper = common.grid_arrays({k: list(v[:1]) for k, v in alg.grid.items()})
        # jitted once here (common.run_grid builds a new function, and compiles, at every call)
        fn = jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, 0, 0)), in_axes=(0, None, None)))
        jax.block_until_ready(fn(hyper, keys, orders))
        best = np.inf
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(fn(hyper, keys, orders))
            best = min(best, time.perf_counter() - start)
        out[name] = best / T
    return out


def run(*, quick: bool = False, full: bool = False, seed: int = 0, out: pathlib.Path) -> dict:
    import jax
    import jax.numpy as jnp

    size, cfg = common.begin(_config, quick=quick, full=full)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)

    jobs = [(tau, dim, jnp.float32) for tau in cfg["sizes"] for dim in cfg["dims"]]
    if cfg["full_dim"] not in cfg["dims"]:
        jobs += [(tau, cfg["full_dim"], jnp.float32) for tau in cfg["sizes"][:1]]
    rows = []
    for tau, dim, dtype in common.progress(jobs, desc="speed"):
        for name, obj, kind in _learners(tau, dim, cfg["full_dim"], size == "quick"):
            # Several steps per call at small d so that dispatch does not dominate; one for the
            # O(d^3) and O(tau^2 d)-with-SVD baselines.
            inner = 1 if name in ("ada_full", "naive_ada_fd") else max(1, min(50, 200_000 // dim))
            cycle = _shrink_period(name, tau)
            seconds, warm, floats = _time_step(obj, kind, dim, dtype, cfg["repeats"], inner, cycle)
            rows.append(
                {
                    "method": name,
                    "d": dim,
                    "sketch_size": tau,
                    "dtype": "float32",
                    "seconds": seconds,
                    "seconds_warm": warm,
                    "state_floats_per_param": floats,
                }
            )
    if cfg["f64"] is not None:
        dim, tau = cfg["f64"]
        with jax.enable_x64(True):
            for name, obj, kind in _learners(tau, dim, 0):
                if name in ("optax.adagrad", "ada_fd", "ada_fd(fast=True)", "ada_diag"):
                    cycle = _shrink_period(name, tau)
                    seconds, warm, floats = _time_step(
                        obj, kind, dim, jnp.float64, cfg["repeats"], 1, cycle
                    )
                    rows.append(
                        {
                            "method": name,
                            "d": dim,
                            "sketch_size": tau,
                            "dtype": "float64",
                            "seconds": seconds,
                            "seconds_warm": warm,
                            "state_floats_per_param": floats,
                        }
                    )
    base = {
        (r["d"], r["sketch_size"], r["dtype"]): r for r in rows if r["method"] == "optax.adagrad"
    }
    for r in rows:
        ref = base[(r["d"], r["sketch_size"], r["dtype"])]
        r["ratio_to_adagrad"] = r["seconds"] / ref["seconds"]
        r["ratio_to_adagrad_warm"] = r["seconds_warm"] / ref["seconds_warm"]

    compile_seconds = _compile_time()
    grid = _grid_timing(size, seed)
    regret_pass = _regret_pass(size, seed)
    tree = _tree_compile(4 if size == "quick" else 24)
    eager = _eager_timing(QUICK_EAGER if size == "quick" else None)
    targets = _targets(rows, cfg, compile_seconds, grid, tree, eager, regret_pass)

    table = _table(rows, cfg)
    payload = {
        "size": size,
        "config": {**cfg, "f64": cfg["f64"], "size": size, "backend": jax.default_backend()},
        "rows": rows,
        "compile_seconds_cnn_ada_fd": compile_seconds,
        "regret_grid": grid,
        "regret_pass_seconds_per_round": regret_pass,
        "tree_compile": tree,
        "eager": eager,
        "targets": [
            dict(zip(("target", "measured", "goal", "met"), t, strict=True)) for t in targets
        ],
    }
    fig = _plot(rows, cfg)
    payload["paper_ratios"] = _paper_ratios(rows, regret_pass)
    summary_table = (
        table + "\n\n" + common.markdown_table(["target", "measured", "goal", "met"], targets)
    )
    claims = _claims(payload["paper_ratios"])
    return common.finish_run(NAME, out, payload, fig, summary_table, claims=claims)


# "As fast as" (Ada-FD paper sec. 4.1): a per-step time ratio within this band counts as equal.
AS_FAST_BAND = (0.67, 1.5)


def _paper_ratios(rows, regret_pass) -> list[dict]:
    """The Ada-FD paper's Fig. 1(c) comparison, per measured setting: FD-SON / ADA-FD and
    RADAGRAD / ADA-FD time per step (cold cache), at every float32 ``(d, sketch_size)`` of the
    benchmark, and per round of the ``regret`` pass (``"setting": "regret pass"``)."""
    out = []
    for r in rows:
        if r["method"] != "ada_fd" or r["dtype"] != "float32":
            continue
        son, rad = (_lookup(rows, m, r["d"], r["sketch_size"]) for m in ("fd_son", "radagrad"))
        if son is None or rad is None:
            continue
        out.append(
            {
                "setting": "per-step benchmark",
                "d": r["d"],
                "sketch_size": r["sketch_size"],
                "fd_son_over_ada_fd": son["seconds"] / r["seconds"],
                "radagrad_over_ada_fd": rad["seconds"] / r["seconds"],
            }
        )
    from experiments import regret

    p = regret_pass
    out.append(
        {
            "setting": "regret pass",
            "d": p["d"],
            "sketch_size": regret.SKETCH_SIZE,  # the regret experiment's tau (Ada-FD sec. 4.1)
            "fd_son_over_ada_fd": p["fd_son"] / p["ada_fd"],
            "radagrad_over_ada_fd": p["radagrad"] / p["ada_fd"],
        }
    )
    return out


def _claims(ratios: list[dict]) -> list[dict]:
    """The Ada-FD paper's running-time claim (sec. 4.1, Fig. 1(c)): "ADA-FD is faster than
    RADAGRAD and as fast as FD-SON", each half a verdict over every measured setting: holds when
    it holds at every setting, partly when at some. Timings come from this run on a shared CPU;
    the tests check only that the verdicts follow from the ratios in the JSON."""
    lo, hi = AS_FAST_BAND
    bench = [r for r in ratios if r["setting"] != "regret pass"]
    regret = next(r for r in ratios if r["setting"] == "regret pass")

    def ours(key):
        xs = [r[key] for r in bench]
        return (
            f"{min(xs):.2f}-{max(xs):.2f}x over {len(xs)} (d, tau) of the benchmark; "
            f"{regret[key]:.2f}x per round of the regret pass (d = {regret['d']})"
        )

    faster = [r["radagrad_over_ada_fd"] > 1 for r in ratios]
    equal = [lo <= r["fd_son_over_ada_fd"] <= hi for r in ratios]
    shared = "cold-cache median time per step on a shared CPU"
    claims = common.Claims("speed", source="Ada-FD sec. 4.1, Fig. 1(c)")
    for name, hits, other, claim, paper, rule in (
        ("faster_than_radagrad", faster, "RADAGRAD", "takes less time per step than RADAGRAD",
         '"ADA-FD is faster than RADAGRAD"',
         f"ratio > 1 at {sum(faster)}/{len(faster)} settings ({shared}; holds if at all, partly "
         "if at some)"),
        ("as_fast_as_fd_son", equal, "FD-SON", "is as fast per step as FD-SON",
         '"... and as fast as FD-SON"',
         f"ratio in [{lo}, {hi}] at {sum(equal)}/{len(equal)} settings (holds if at all, partly "
         f"if at some; {shared})"),
    ):  # fmt: skip
        key = "radagrad_over_ada_fd" if other == "RADAGRAD" else "fd_son_over_ada_fd"
        claims.add(
            name,
            hits,
            claim=f"ADA-FD {claim}",
            paper=f"{paper} (Fig. 1(c), d = 500, tau = 10)",
            ours=f"{other} / ADA-FD time: " + ours(key),
            reason=rule,
        )
    return list(claims)


def _lookup(rows, method, d, tau, dtype="float32"):
    for r in rows:
        if (r["method"], r["d"], r["sketch_size"], r["dtype"]) == (method, d, tau, dtype):
            return r
    return None


def _targets(rows, cfg, compile_seconds, grid, tree, eager, regret_pass):
    """The issue's targets, each ``(what, measured, goal, met)``; missing sizes are reported."""
    d_big = max(cfg["dims"])
    tau = 10 if 10 in cfg["sizes"] else cfg["sizes"][0]
    out = []

    def ratio_target(method, goal):
        r = _lookup(rows, method, d_big, tau)
        if r is None:
            return
        out.append(
            (
                f"{method} / optax.adagrad at d={d_big:g}, sketch_size={tau} (cold cache; warm)",
                f"{r['ratio_to_adagrad']:.1f}x; {r['ratio_to_adagrad_warm']:.1f}x",
                f"<= {goal}x",
                r["ratio_to_adagrad"] <= goal,
            )
        )

    ratio_target("ada_fd(fast=True)", 6)  # the per-step-cost issue's targets
    ratio_target("ada_fd", 10)
    p = regret_pass
    us = {k: v * 1e6 for k, v in p.items() if k not in ("T", "d")}
    out.append(
        (
            f"regret pass T={p['T']}, d={p['d']}: ADA-FD / ADA-DIAG per round (us: ADA-FD, "
            "ADA-DIAG, RADAGRAD, FD-SON)",
            f"{us['ada_fd'] / us['ada_diag']:.1f}x ({us['ada_fd']:.1f}, {us['ada_diag']:.1f}, "
            f"{us['radagrad']:.1f}, {us['fd_son']:.1f})",
            "<= 6x, ADA-FD < RADAGRAD, ADA-FD <= FD-SON",
            us["ada_fd"] <= 6 * us["ada_diag"]
            and us["ada_fd"] < us["radagrad"]
            and us["ada_fd"] <= us["fd_son"],
        )
    )
    fd, full = (_lookup(rows, m, cfg["full_dim"], cfg["sizes"][0]) for m in ("ada_fd", "ada_full"))
    if fd and full:
        speedup = full["seconds"] / fd["seconds"]
        out.append(
            (
                f"ada_full / ada_fd at d={cfg['full_dim']}",
                f"{speedup:.0f}x",
                ">= 100x",
                speedup >= 100,
            )
        )
    for method, extra in (("ada_fd", 3), ("ada_fd(fast=True)", 3)):
        for r in rows:
            if r["method"] == method and r["d"] == d_big and r["dtype"] == "float32":
                cap = (2 * r["sketch_size"] if "fast" in method else r["sketch_size"]) + extra
                out.append(
                    (
                        f"{method} state floats/param, sketch_size={r['sketch_size']}",
                        f"{r['state_floats_per_param']:.2f}",
                        f"<= {cap}",
                        r["state_floats_per_param"] <= cap,
                    )
                )
    out.append(
        (
            f"{grid['points']}-point grid / one config (regret, T={grid['T']}, d={grid['d']})",
            f"{grid['ratio']:.1f}x",
            "<= 5x",
            grid["ratio"] <= 5,
        )
    )
    out.append(
        (
            "compile time, ada_fd over the CNN tree",
            f"{compile_seconds:.2f} s",
            "< 5 s",
            compile_seconds < 5,
        )
    )
    for name in ("ada_fd", "fd_son"):
        t = tree[name]
        total = t["trace_seconds"] + t["compile_seconds"]
        out.append(
            (
                f"trace + compile, {name} over the {tree['layers']}-layer tree "
                f"({tree['leaves']} leaves)",
                f"{t['trace_seconds']:.1f} + {t['compile_seconds']:.1f} s",
                "< 10 s",
                total < 10,
            )
        )
    worst = max(eager, key=lambda k: eager[k]["ratio"])
    out.append(
        (
            "eager update / jitted update at d=16, worst family",
            f"{eager[worst]['ratio']:.1f}x ({worst})",
            "<= 20x",
            eager[worst]["ratio"] <= 20,
        )
    )
    growth = [v["mappings_per_step"] for v in eager.values() if v["mappings_per_step"] is not None]
    if growth:
        out.append(
            (
                "memory mappings added per eager step, worst family",
                f"{max(growth):.2f}",
                "0 (compiled once)",
                max(growth) <= 0.1,
            )
        )
    return out


def _table(rows, cfg):
    headers = [
        "method",
        "d",
        "sketch_size",
        "dtype",
        "ms/step",
        "x adagrad",
        "ms/step warm",
        "x adagrad warm",
        "floats/param",
    ]
    body = [
        [
            r["method"],
            f"{r['d']:g}",
            r["sketch_size"],
            r["dtype"],
            f"{1e3 * r['seconds']:.3f}",
            f"{r['ratio_to_adagrad']:.1f}",
            f"{1e3 * r['seconds_warm']:.3f}",
            f"{r['ratio_to_adagrad_warm']:.1f}",
            f"{r['state_floats_per_param']:.2f}",
        ]
        for r in rows
    ]
    return common.markdown_table(headers, body)


def _plot(rows, cfg):
    import jax

    plt = common.pyplot()
    sizes = cfg["sizes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.8), squeeze=False)
    for ax, tau in zip(axes[0], sizes, strict=True):
        methods = sorted({r["method"] for r in rows if r["sketch_size"] == tau})
        for m in methods:
            pts = sorted(
                (r["d"], r["seconds"])
                for r in rows
                if r["method"] == m and r["sketch_size"] == tau and r["dtype"] == "float32"
            )
            if len(pts) < 1:
                continue
            d, s = zip(*pts, strict=True)
            style = {"lw": 2.5, "color": "black"} if m == "optax.adagrad" else {}
            ax.plot(d, np.asarray(s) * 1e3, marker="o", label=m, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("dimension d")
        ax.set_ylabel("time per step (ms)")
        ax.set_title(f"sketch_size = {tau} (float32, {jax.default_backend()})")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def main(argv=None):
    return common.script(run, __doc__, argv, full="more dimensions, sketch sizes and repeats")


if __name__ == "__main__":
    main()
