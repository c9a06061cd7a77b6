"""Per-row update time of every sketch, side by side with one ``optax.adagrad`` step.

``python experiments/sketch_speed.py [--quick] [--all] [--out FILE.json]``

For each ``dim`` (default 1e4, 1e5, 1e6; ``--quick``: 1e3, 1e4) and ``sketch_size`` (10, 20) it
times, in one process and in float32:

* the sketches of ``sketchopt.sketches`` -- FD, fast FD, RFD, fast RFD, Oja, random projection
  (``--all`` adds PFD and CFD, which cost the same as FD) -- absorbing one row of size ``dim``;
* one ``optax.adagrad`` step (update + ``apply_updates``) on a parameter vector of size ``dim``,
  the reference every ratio is taken against.

Two timings per entry, every call ``jax.jit``-ed with the state donated (``donate_argnums=0``)
and synchronized with ``jax.block_until_ready``; the compiling call and one more are excluded:

* ``scan``: one call runs ``lax.scan`` over ``--rows`` (20) different rows, so dispatch is amortized
  (``update_many`` for the sketches); reported per row;
* ``single``: one call per row (``update``), dispatch included -- what a Python training loop pays.

The entries of one ``(dim, sketch_size)`` block are timed round-robin for ``--repeats`` rounds
(one scan call and ``rows / 4`` single calls each per round), so that a change in the machine's
load hits all of them alike; the table reports medians (the JSON also has minima).

The table prints microseconds per row and the ratio to AdaGrad in the same mode; ``--out`` writes
the rows and the environment as JSON. Timings on a shared machine are noisy: the ratios, measured
side by side in one process, are the meaningful part.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from experiments import common  # noqa: E402
from sketchopt import sketches  # noqa: E402

BASELINE = "adagrad"


def _sketches(tau: int, include_all: bool) -> dict:
    key = jax.random.PRNGKey(0)
    out = {
        "fd": sketches.frequent_directions(tau),
        "fast_fd": sketches.frequent_directions(tau, fast=True),
        "rfd": sketches.robust_frequent_directions(tau),
        "fast_rfd": sketches.robust_frequent_directions(tau, fast=True),
        "oja": sketches.oja(tau, key=key),
        "random_projection": sketches.random_projection(tau, key),
    }
    if include_all:
        out["pfd"] = sketches.parameterized_frequent_directions(tau, 0.2)
        out["cfd"] = sketches.compensative_frequent_directions(tau)
    return out


def _adagrad_fns(dim: int):
    """``(init, scan_fn, single_fn)`` for AdaGrad: the carried state is ``(params, opt_state)``."""
    tx = optax.adagrad(learning_rate=0.1)

    def step(carry, g):
        params, opt_state = carry
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def init():
        params = jnp.zeros((dim,), jnp.float32)
        return params, tx.init(params)

    def many(carry, rows):
        return jax.lax.scan(lambda c, g: (step(c, g), None), carry, rows)[0]

    return init, many, step


def _sketch_fns(sketch, dim: int):
    return (lambda: sketch.init(dim, jnp.float32)), sketch.update_many, sketch.update


class _Timer:
    """One entry's two jitted, state-donating functions, its two states and its timings."""

    def __init__(self, name: str, fns, rows: jax.Array):
        init, many, single = fns
        self.name = name
        self.rows = rows
        self.many = jax.jit(many, donate_argnums=0)
        self.single = jax.jit(single, donate_argnums=0)
        self.batches = [rows, rows[::-1]]  # alternate so that the data changes between calls
        self.scan_state = init()
        self.single_state = init()
        self.scan_times: list[float] = []
        self.single_times: list[float] = []
        # compile and warm up (excluded from the timings): the compiling call and one more
        start = time.perf_counter()
        self.scan_state = jax.block_until_ready(self.many(self.scan_state, rows))
        self.single_state = jax.block_until_ready(self.single(self.single_state, rows[0]))
        self.compile_seconds = time.perf_counter() - start
        self.scan_state = jax.block_until_ready(self.many(self.scan_state, self.batches[1]))
        self.single_state = jax.block_until_ready(self.single(self.single_state, rows[1]))

    def time_scan(self, r: int):
        start = time.perf_counter()
        self.scan_state = jax.block_until_ready(self.many(self.scan_state, self.batches[r % 2]))
        self.scan_times.append((time.perf_counter() - start) / self.rows.shape[0])

    def time_single(self, r: int, calls: int):
        for i in range(calls):
            row = self.rows[(r * calls + i) % self.rows.shape[0]]
            start = time.perf_counter()
            self.single_state = jax.block_until_ready(self.single(self.single_state, row))
            self.single_times.append(time.perf_counter() - start)

    def result(self) -> dict:
        leaves = jax.tree.leaves(self.scan_state) + jax.tree.leaves(self.single_state)
        return {
            "name": self.name,
            "scan_seconds_per_row": statistics.median(self.scan_times),
            "scan_min_seconds_per_row": min(self.scan_times),
            "single_seconds_per_row": statistics.median(self.single_times),
            "single_min_seconds_per_row": min(self.single_times),
            "compile_seconds": self.compile_seconds,
            "state_bytes": int(
                sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.scan_state))
            ),
            "finite": bool(all(np.all(np.isfinite(np.asarray(x))) for x in leaves)),
        }


def run(dims, sizes, *, num_rows: int, repeats: int, include_all: bool, seed: int = 0) -> list:
    """Time every entry of every ``(dim, sketch_size)`` block. Within a block the entries are
    timed round-robin (one scan call and a few single calls each, ``repeats`` rounds), so that a
    change in the machine's load hits them all alike."""
    results = []
    for dim in dims:
        key = jax.random.PRNGKey(seed + dim)
        rows = jax.random.normal(key, (num_rows, dim), jnp.float32)
        rows = rows * jnp.geomspace(1.0, 0.01, num_rows, dtype=jnp.float32)[:, None]
        for tau in sizes:
            entries = {BASELINE: _adagrad_fns(dim)}
            entries.update({k: _sketch_fns(v, dim) for k, v in _sketches(tau, include_all).items()})
            timers = [_Timer(name, fns, rows) for name, fns in entries.items()]
            single_calls = max(1, num_rows // 4)
            for r in range(repeats):
                for timer in timers:
                    timer.time_scan(r)
                    timer.time_single(r, single_calls)
            block = [dict(t.result(), dim=dim, sketch_size=tau) for t in timers]
            del timers
            base = block[0]
            for entry in block:
                for mode in ("scan", "single"):
                    entry[f"{mode}_ratio_to_adagrad"] = (
                        entry[f"{mode}_seconds_per_row"] / base[f"{mode}_seconds_per_row"]
                    )
                print(
                    f"  d={dim:>8} tau={tau:>3} {entry['name']:<18} "
                    f"scan {entry['scan_seconds_per_row'] * 1e6:10.1f} us/row "
                    f"(x{entry['scan_ratio_to_adagrad']:.1f})  "
                    f"single {entry['single_seconds_per_row'] * 1e6:10.1f} us/row "
                    f"(x{entry['single_ratio_to_adagrad']:.1f})",
                    flush=True,
                )
            results.extend(block)
    return results


def table(results) -> str:
    head = (
        f"{'dim':>8} {'tau':>4} {'sketch':<18} {'scan us/row':>12} {'x adagrad':>10} "
        f"{'single us/row':>14} {'x adagrad':>10}"
    )
    lines = [head, "-" * len(head)]
    for e in results:
        lines.append(
            f"{e['dim']:>8} {e['sketch_size']:>4} {e['name']:<18} "
            f"{e['scan_seconds_per_row'] * 1e6:>12.1f} {e['scan_ratio_to_adagrad']:>10.1f} "
            f"{e['single_seconds_per_row'] * 1e6:>14.1f} {e['single_ratio_to_adagrad']:>10.1f}"
        )
    return "\n".join(lines)


def environment() -> dict:
    return {
        "jax": jax.__version__,
        "optax": optax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small dims (1e3, 1e4), 3 repeats")
    parser.add_argument("--all", action="store_true", help="also time PFD and CFD")
    parser.add_argument("--out", type=pathlib.Path, help="write the results as JSON")
    parser.add_argument("--rows", type=int, default=20, help="rows per scan call (default 20)")
    parser.add_argument("--repeats", type=int, help="timed rounds (default 15, quick 5)")
    parser.add_argument("--dims", type=int, nargs="+", help="override the dims")
    parser.add_argument("--sizes", type=int, nargs="+", help="override the sketch sizes")
    args = parser.parse_args(argv)

    dims = args.dims or ([1000, 10000] if args.quick else [10000, 100000, 1000000])
    sizes = args.sizes or [10, 20]
    repeats = args.repeats or (5 if args.quick else 15)
    print(f"sketch speed: dims {dims}, sketch sizes {sizes}, float32, {jax.devices()}")
    results = run(dims, sizes, num_rows=args.rows, repeats=repeats, include_all=args.all)
    print()
    print(table(results))
    report = {
        "config": {"dims": dims, "sizes": sizes, "rows_per_call": args.rows, "repeats": repeats},
        "environment": environment(),
        "results": results,
    }
    if args.out is not None:
        common.save_json(args.out, report)
        print(f"\nwrote {args.out}")
    return report


if __name__ == "__main__":
    main()
