"""The device benchmark (issue "On the accelerators people train on"): what one update costs on
whatever device JAX finds, side by side with Optax in one process.

    python experiments/device_bench.py [--parts proxy,steps,networks,compile,aot] [--dims 1e6,1e7]
                                       [--widths 128,256,1024] [--steps 30] [--paths P,...]
                                       [--sketch-size K] [--out FILE.json]

(``experiments/device_run.sh`` runs every part in its own process under its own time limit, as
one call of a lent GPU.) ``--paths`` picks the proxy's code paths (``PROXY_PATHS``: on a GPU the
per-group programs compile slowly, so ``backend`` alone measures the batched program there).
The JSON records whether the batched factorizations were on (``batched_solves``).

Parts (each printed as it finishes and written to ``--out`` after every part, so a run cut short
keeps what it measured):

* ``proxy``: the optimized program of one ``update`` over the speed benchmark's 24-layer
  transformer-shaped tree (193 leaves, ``experiments.speed._transformer_tree``) for ``ada_fd``,
  ``fd_son``, ``kron_fd(k=32)``, ``ada_diag`` and ``optax.adam``: its dense linear-algebra
  library calls (``solver_calls``: eigendecomposition, QR factor and form, Cholesky, triangular
  solve, SVD, LU, as LAPACK or cuSOLVER/cuBLAS custom calls), while loops and fusions; and the
  seconds to trace and compile it; on the backend's own code path and on the accelerator path
  (``sketchopt.accelerator_path``: what a GPU or TPU compiles, measurable on the CPU), each
  batched (one factorization call per kind and level for all shape groups) and per group (the
  program before it, ``sketchopt._solvers.batching(False)``).
* ``steps``: one jitted, state-donating step (cold cache, ``experiments.speed._time_step``) of
  ``ada_fd`` (plain, ``fast=True``, dual averaging), ``fd_son`` and ``oja_son`` at
  ``sketch_size = 10``, and of ``optax.adagrad`` and ``optax.adam``, at each ``--dims``; ratios
  to ``optax.adagrad``.
* ``networks``: the ``networks`` transformer's training step (``experiments.network_steps``'s
  measurement: forward, backward and update; the update alone) of ``kron_fd`` in the
  ``networks`` configuration (RFD, decay, roots every 10 steps, Adam graft) and of Adam, at each
  ``--widths`` (128: the default size; 256: the full size; other widths: the default size at
  that width).
* ``compile``: the trace and compile seconds of one ``kron_fd`` update over the 24-layer
  width-1536 model (``experiments.networks.scale_part``).
* ``aot`` (any machine, with libtpu installed: ``make test-accelerators`` puts it in
  ``.venv/libtpu``, ``PYTHONPATH=.venv/libtpu``): one update of every learner compiled for a TPU
  v5e by XLA's TPU compiler, deviceless, at each ``--dims`` and on the 24-layer tree, side by
  side with ``optax.adagrad``, ``optax.adam`` and the guarded floor program, and the diagonal
  ones as a training step's optimizer part on the tree (:func:`aot_part`,
  ``experiments/aot.py``); ``--learners`` picks some. Not in the default
  ``--parts``: on a GPU it compiles for a TPU all the same.

The device, JAX's version and (on a GPU) CUDA's are recorded beside the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
import time

import jax
import numpy as np

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402
from sketchopt import _solvers  # noqa: E402

#: Custom-call targets that are dense linear-algebra library calls (LAPACK on the CPU, cuSOLVER
#: and cuBLAS's solvers on a GPU): eigendecomposition, QR (factor and form), Cholesky, triangular
#: solve, SVD, LU.
SOLVER_PATTERN = re.compile(
    r"(syevd|syev|heevd|heev|syevj|geqrf|orgqr|ungqr|householder_product|potrf|cholesky|trsm|"
    r"triangular_solve|gesvd|gesdd|getrf|lu_pivots|eigh|qr)",
    re.IGNORECASE,
)


def device_info() -> dict:
    device = jax.devices()[0]
    info = {"platform": device.platform, "device": device.device_kind, "jax": jax.__version__}
    try:
        import jaxlib

        info["jaxlib"] = jaxlib.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.platform == "gpu":
        try:
            from jax._src.lib import cuda_versions  # private: only for the record

            if cuda_versions is not None:
                info["cuda_runtime"] = cuda_versions.cuda_runtime_get_version()
                info["cusolver"] = cuda_versions.cusolver_get_version()
        except Exception:  # noqa: BLE001 - a version we cannot read is left out
            pass
    return info


def program_counts(compiled_text: str) -> dict:
    """Solver calls, while loops and fusions of an optimized HLO module's text."""
    targets = re.findall(r'custom_call_target="([^"]+)"', compiled_text)
    solvers = [t for t in targets if SOLVER_PATTERN.search(t)]
    kinds: dict[str, int] = {}
    for t in solvers:
        kinds[t] = kinds.get(t, 0) + 1
    from experiments import aot

    fusions, while_loops = aot.kernel_counts(compiled_text)
    return {
        "solver_calls": len(solvers),
        "solver_targets": kinds,
        "while_loops": while_loops,
        "fusions": fusions,
    }


#: The code paths and programs the proxy compiles: ``(name, accelerator path, batched)``. On the
#: CPU ``accelerator`` forces the path a GPU or TPU takes (:func:`sketchopt.accelerator_path`);
#: ``per_group`` is the program before the batched factorizations (one call per shape group).
PROXY_PATHS = (
    ("backend", None, True),
    ("backend_per_group", None, False),
    ("accelerator", True, True),
    ("accelerator_per_group", True, False),
)


def proxy_part(paths: tuple = PROXY_PATHS) -> dict:
    """The proxy on the given ``PROXY_PATHS`` entries."""
    import optax

    import sketchopt as so
    from experiments import speed

    params = speed._transformer_tree(24)
    learners = (
        ("ada_fd", lambda: so.ada_fd(0.1, 10, 1.0, robust=False)),
        ("fd_son", lambda: so.fd_son(1.0, 10)),
        ("kron_fd", lambda: so.kron_fd(1e-3, 32)),
        ("ada_diag", lambda: so.ada_diag(0.1, 1e-3)),
        ("optax.adam", lambda: optax.adam(1e-3)),
    )
    out = {}
    for path, accelerator, batched in paths:
        rows = {}
        for name, make in learners:
            if name in ("ada_diag", "optax.adam") and path != "backend":
                continue  # no factorization: one program whatever the path
            with so.accelerator_path(accelerator), _solvers.batching(batched):
                _, compiled, trace, compile_ = common.compile_update(make(), params)
            row = {"trace_seconds": trace, "compile_seconds": compile_}
            row.update(program_counts(compiled.as_text()))
            rows[name] = row
            print(
                f"[proxy] {path:21s} {name:11s} solver calls {row['solver_calls']:3d} "
                f"{row['solver_targets']}, while {row['while_loops']}, fusions "
                f"{row['fusions']}, trace {row['trace_seconds']:.1f} s, compile "
                f"{row['compile_seconds']:.1f} s",
                flush=True,
            )
        out[path] = rows
    return {"tree": "speed._transformer_tree(24)", "paths": out}


def steps_part(dims: list[int], repeats: int = 7) -> dict:
    import jax.numpy as jnp
    import optax

    import sketchopt as so
    from experiments import speed

    tau = 10
    learners = (
        ("optax.adagrad", lambda: optax.adagrad(0.1)),
        ("optax.adam", lambda: optax.adam(1e-3)),
        ("ada_fd", lambda: so.ada_fd(0.1, tau, 1.0, robust=False)),
        ("ada_fd(fast=True)", lambda: so.ada_fd(0.1, tau, 1.0, robust=False, fast=True)),
        ("ada_fd_dual_averaging", lambda: so.ada_fd_dual_averaging(0.1, tau, 1.0, robust=False)),
        ("fd_son", lambda: so.fd_son(1.0, tau)),
        ("oja_son", lambda: so.oja_son(1.0, tau)),
    )
    out = {}
    for dim in dims:
        rows = {}
        for name, make in learners:
            inner = max(1, min(50, 200_000 // dim))
            cycle = speed._shrink_period(name, tau)
            cold, warm, floats = speed._time_step(
                make(), "tx", dim, jnp.float32, repeats, inner, cycle
            )
            rows[name] = {"cold_seconds": cold, "warm_seconds": warm, "state_floats": floats}
        base = rows["optax.adagrad"]
        for name, row in rows.items():
            row["cold_over_adagrad"] = row["cold_seconds"] / base["cold_seconds"]
            row["warm_over_adagrad"] = row["warm_seconds"] / base["warm_seconds"]
            print(
                f"[steps] d={dim:.0e} {name:22s} {1e3 * row['cold_seconds']:8.3f} ms cold "
                f"({row['cold_over_adagrad']:5.1f}x adagrad), {1e3 * row['warm_seconds']:8.3f} "
                f"ms warm ({row['warm_over_adagrad']:5.1f}x)",
                flush=True,
            )
        out[str(dim)] = rows
    return {"sketch_size": tau, "dims": out}


def networks_part(widths: list[int], steps: int, save=None, sketch_size: int | None = None) -> dict:
    """The transformer step at each width; ``save(out)`` after each (a run cut short keeps
    the widths it measured). ``sketch_size`` replaces the networks configuration's (32): at
    12 or less every small ``eigh`` of ``kron_fd`` is at most 32 x 32 (``k + r = 2k + 8``),
    the size up to which a GPU's batched ``eigh`` is one cuSOLVER launch (``syevjBatched``)."""
    from experiments import network_steps
    from experiments import networks as nw

    out = {}
    for width in widths:
        size = "full" if width == nw.config("full").width else "default"
        cfg = nw.config(size)
        if sketch_size is not None:
            cfg = dataclasses.replace(cfg, sketch_size=sketch_size)
        if width != cfg.width:
            cfg = dataclasses.replace(cfg, width=width, heads=max(1, width // 64))
        res = network_steps.measure_config(cfg, steps, ("adam", "kron_rfd"))
        for name, row in res["learners"].items():
            print(
                f"[networks] width {width:5d} {name:13s} step {1e3 * row['step_seconds']:8.2f} ms "
                f"({row['step_over_adam']:.2f}x Adam), update {1e3 * row['update_seconds']:8.2f} "
                f"ms ({row['update_over_adam']:.1f}x), compile {row['compile_seconds']:.1f} s",
                flush=True,
            )
        out[str(width)] = res
        if save is not None:
            save(out)
    return out


def compile_part() -> dict:
    from experiments import networks as nw

    res = nw.scale_part(nw.config("default"), quick=True)
    kron = res["variants"]["kron_fd"]
    print(
        f"[compile] 24-layer width-1536 kron_fd: trace {kron['trace_seconds']:.1f} s, compile "
        f"{kron['compile_seconds']:.1f} s; state {100 * kron['state_over_adam']:.2f}% of Adam's",
        flush=True,
    )
    return res


def _aot_programs() -> tuple:
    """The ``aot`` part's programs: ``(name, factory, peer)``; ``peer`` is the Optax optimizer
    its bytes are compared with. The learners at their defaults but for the sketch size, given
    (``sketch_size = 10``, the defaults' own value); ``kron_fd`` on the tree only (a vector is
    no Kronecker layer)."""
    import optax

    import sketchopt as so
    from experiments import aot

    fd_family = (
        ("ada_fd", lambda: so.ada_fd(0.1, sketch_size=10)),
        ("ada_fd(fast=True)", lambda: so.ada_fd(0.1, sketch_size=10, fast=True)),
        ("ada_fd_dual_averaging", lambda: so.ada_fd_dual_averaging(0.1, sketch_size=10)),
        ("fd_son", lambda: so.fd_son(1.0, sketch_size=10)),
        ("rfd_son", lambda: so.rfd_son(sketch_size=10)),
    )
    between = tuple(
        (f"{name}{common.BETWEEN_REFRESHES}", lambda make=make: aot.between_gram_refreshes(make()))
        for name, make in fd_family
    )
    return (
        ("optax.adagrad", lambda: optax.adagrad(0.1), None),
        ("optax.adam", lambda: optax.adam(1e-3), None),
        ("guarded adagrad", lambda: aot.guarded_adagrad(0.1), None),
        ("ada_diag", lambda: so.ada_diag(0.1), "optax.adagrad"),
        *((name, make, "optax.adagrad") for name, make in fd_family + between),
        ("oja_son", lambda: so.oja_son(1.0, sketch_size=10), "optax.adagrad"),
        ("kron_fd", lambda: so.kron_fd(1e-3), "optax.adam"),
        ("kron_fd refresh step", lambda: aot.kron_fd_branch(True), "optax.adam"),
        ("kron_fd between refreshes", lambda: aot.kron_fd_branch(False), "optax.adam"),
        (
            "kron_fd between refreshes, in the switch",
            lambda: aot.kron_fd_branch(False, switched=True),
            "optax.adam",
        ),
    )


#: The ``aot`` part's programs compiled as a training step's optimizer part as well
#: (``experiments.aot.compile_step``: the update and the parameters' write, both donated), on
#: the tree: a diagonal update's passes fuse with the write there.
STEP_PROGRAMS = ("optax.adagrad", "optax.adam", "guarded adagrad", "ada_diag")


def aot_part(dims: list[int], layers: int = 24, names: tuple[str, ...] | None = None) -> dict:
    """One update of each of :func:`_aot_programs` compiled for a TPU v5e by XLA's TPU compiler on
    this machine (``experiments/aot.py``: deviceless, the state donated, on the accelerator code
    path), at each ``dims`` (one float32 leaf) and on the speed benchmark's ``layers``-layer
    tree (and :data:`STEP_PROGRAMS` in a training step on that tree), with JAX's persistent
    compilation cache off: XLA's bytes accessed, flops, roofline
    seconds, fusions, while loops and compile seconds, and the bytes over the peer's; at each
    ``dims`` also the passes over the leaf's arrays (:func:`experiments.aot.passes`)."""
    import jax.numpy as jnp

    from experiments import aot, speed

    jax.config.update("jax_enable_compilation_cache", False)
    cases = {
        f"d={d:.0e}": ({"w": jax.ShapeDtypeStruct((d,), jnp.float32)}, aot.compile_update, None)
        for d in dims
    }
    if layers:
        tree = speed._transformer_tree(layers)
        cases[f"{layers}-layer tree"] = (tree, aot.compile_update, None)
        cases[f"{layers}-layer training step"] = (tree, aot.compile_step, STEP_PROGRAMS)
    out = {
        "provenance": common.provenance(),
        "topology": aot.TOPOLOGY,
        "libtpu": _version("libtpu"),
        "cases": {},
    }
    for case, (params, compile_, only) in cases.items():
        rows = {}
        for name, make, peer in _aot_programs():
            if (
                (names and name.split(" ")[0] not in names and peer is not None)
                or (name.startswith("kron_fd") and "tree" not in case)
                or (only is not None and name not in only)
            ):
                continue
            compiled = compile_(make(), params)
            row = compiled.row()
            if case.startswith("d="):  # where a leaf's traffic goes, in d-vectors
                d = params["w"].shape[0]
                row["passes"] = [list(p) for p in aot.passes(compiled.text, d)]
            if peer in rows:
                row["bytes_over_peer"] = row["bytes_accessed"] / rows[peer]["bytes_accessed"]
                row["fusions_over_peer"] = row["fusions"] / max(1, rows[peer]["fusions"])
                row["compile_over_peer"] = row["compile_seconds"] / rows[peer]["compile_seconds"]
                row["peer"] = peer
            rows[name] = row
            ratio = f"{row['bytes_over_peer']:6.2f}x {peer}" if peer in rows else ""
            print(
                f"[aot] {case:14s} {name:22s} {row['bytes_accessed'] / 1e9:8.3f} GB {ratio:22s} "
                f"fusions {row['fusions']:4d}, while {row['while_loops']}, compile "
                f"{row['compile_seconds']:6.1f} s",
                flush=True,
            )
        _amortize(rows)
        out["cases"][case] = rows
    return out


def _amortize(rows: dict) -> None:
    """Each rare branch's bytes amortized over its period: ``kron_fd``'s refresh
    (:func:`_amortize_kron`) and the FD family's exact Gram refresh, ``(whole + (P - 1)
    between) / P`` with ``P = sketchopt.sketches.GRAM_REFRESH_PERIOD`` shrinks (one a step for
    per-step FD; the doubling buffer's shrinks, every ``tau + 1`` steps, make its period
    longer, so this is its bound)."""
    from sketchopt import sketches

    _amortize_kron(rows)
    period = sketches.GRAM_REFRESH_PERIOD
    for name, between in rows.items():
        row = rows.get(name.removesuffix(common.BETWEEN_REFRESHES))
        if not name.endswith(common.BETWEEN_REFRESHES) or row is None or "peer" not in row:
            continue
        amortized = (row["bytes_accessed"] + (period - 1) * between["bytes_accessed"]) / period
        row["amortized_bytes_accessed"] = amortized
        row["amortized_bytes_over_peer"] = amortized / rows[row["peer"]]["bytes_accessed"]
        print(
            f"[aot] {name.removesuffix(common.BETWEEN_REFRESHES)} over {period} Gram refreshes: "
            f"{row['amortized_bytes_over_peer']:.2f}x {row['peer']}",
            flush=True,
        )


def _amortize_kron(rows: dict) -> None:
    """``kron_fd``'s bytes over a refresh period, ``(refresh + (PERIOD - 1) between) / PERIOD``,
    each step as the update compiles it: the refresh step the whole update's count (XLA counts
    its ``switch`` at the costliest branch, the refresh), the step between refreshes the one
    compiled in a switch (alone, XLA fuses it with the momentum across what in the update is the
    switch's boundary)."""
    from sketchopt import shampoo

    row, between = rows.get("kron_fd"), rows.get("kron_fd between refreshes, in the switch")
    if row is None or between is None:
        return
    period = shampoo.PERIOD
    amortized = (row["bytes_accessed"] + (period - 1) * between["bytes_accessed"]) / period
    row["amortized_bytes_accessed"] = amortized
    row["amortized_bytes_over_peer"] = amortized / rows[row["peer"]]["bytes_accessed"]
    print(f"[aot] kron_fd over a period of {period}: {row['amortized_bytes_over_peer']:.2f}x "
          f"{row['peer']}", flush=True)  # fmt: skip


def _version(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="proxy,steps,networks,compile")
    parser.add_argument("--dims", default="1e6,1e7")
    parser.add_argument("--widths", default="128,256,1024")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--sketch-size", type=int, default=None, help="kron_fd's k in the networks part"
    )
    parser.add_argument(
        "--paths",
        default=",".join(p[0] for p in PROXY_PATHS),
        help="the proxy's code paths (a GPU compiles the per-group programs slowly: "
        "'backend' alone measures the batched program there)",
    )
    parser.add_argument("--layers", type=int, default=24, help="the aot part's tree (0: none)")
    parser.add_argument(
        "--learners", default="", help="the aot part's learners (default: all of _aot_programs)"
    )
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    common.limit_blas_threads()
    out: dict = {"device": device_info()}
    print(f"[device] {out['device']}", flush=True)
    out["batched_solves"] = _solvers.batching_active()

    def save(name=None, part=None):
        if name is not None:
            out[name] = part
        if args.out is not None:
            common.save_json(args.out, out)

    paths = tuple(p for p in PROXY_PATHS if p[0] in args.paths.split(","))
    parts = {
        "proxy": lambda: proxy_part(paths),
        "steps": lambda: steps_part([int(float(d)) for d in args.dims.split(",")]),
        "networks": lambda: networks_part(
            [int(w) for w in args.widths.split(",")],
            args.steps,
            save=lambda part: save("networks", part),
            sketch_size=args.sketch_size,
        ),
        "compile": compile_part,
        "aot": lambda: aot_part(
            [int(float(d)) for d in args.dims.split(",") if d],  # --dims '': the tree alone
            layers=args.layers,
            names=tuple(args.learners.split(",")) if args.learners else None,
        ),
    }
    for name in args.parts.split(","):
        start = time.perf_counter()
        part = parts[name]()
        part["seconds"] = time.perf_counter() - start
        save(name, part)
    return out


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
