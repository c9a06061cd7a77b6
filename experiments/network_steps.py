"""Step time of the ``networks`` transformer on whatever device JAX finds (CPU or a GPU): Adam and
the factored sketches (``kron_fd`` with FD and RFD, the networks configuration), side by side in
one process, at the ``networks`` experiment's default and full sizes.

    python experiments/network_steps.py [--steps 60] [--sizes default,full] [--out FILE.json]

For each size and learner: the median training-step seconds (forward, backward, update) over
the steps after the first fifth, the mean over all of them, the update alone (5 calls on the final
state, a root-refresh step when ``--steps`` is a multiple of 10) and the compile seconds, with
every ratio to Adam's on the same device; then the scale part of ``networks`` (the 24-layer
width-1536 model's state and one update's trace and compile seconds). Training is from the same
initialization and batches for every learner, at each learner's grid middle.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import jax
import numpy as np

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402
from experiments import networks as nw  # noqa: E402

LEARNERS = ("adam", "kron_fd", "kron_rfd")


def measure(size: str, steps: int) -> dict:
    return measure_config(nw.config(size), steps)


def measure_config(cfg: nw.Config, steps: int, learners=LEARNERS) -> dict:
    """``measure`` for any configuration (``experiments/device_bench.py`` varies the width)."""
    cfg = dataclasses.replace(cfg, steps=steps)
    train_tokens, held_out = nw.corpus(cfg.corpus_bytes)
    table = nw.learners(cfg.sketch_size)
    rows = {}
    for name in learners:
        make, grid, _ = table[name]
        r = nw.train(nw.Trainer(make, cfg), grid[len(grid) // 2], train_tokens, held_out, 0, steps)
        rows[name] = {
            "step_seconds": r["step_seconds"],
            "mean_step_seconds": r["seconds"][-1] / len(r["seconds"]),
            "update_seconds": r["update_seconds"],
            "compile_seconds": r["compile_seconds"],
            "final_train_loss": r["final_train_loss"],
            "parameters": r["parameters"],
        }
    for key in ("step_seconds", "mean_step_seconds", "update_seconds"):
        for row in rows.values():
            row[key.replace("seconds", "over_adam")] = row[key] / rows["adam"][key]
    return {"config": dataclasses.asdict(cfg), "learners": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sizes", default="default,full")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    common.limit_blas_threads()
    device = jax.devices()[0]
    out = {
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "sizes": {size: measure(size, args.steps) for size in args.sizes.split(",")},
        "scale": nw.scale_part(nw.config("default")),
    }
    for size, res in out["sizes"].items():
        for name, row in res["learners"].items():
            print(
                f"[{out['device']}] {size:8s} {name:9s} step {1e3 * row['step_seconds']:8.2f} ms "
                f"({row['step_over_adam']:.2f}x Adam; mean {row['mean_step_over_adam']:.2f}x), "
                f"update {1e3 * row['update_seconds']:8.2f} ms ({row['update_over_adam']:.1f}x), "
                f"compile {row['compile_seconds']:.1f} s, loss {row['final_train_loss']:.3f}"
            )
    kron = out["scale"]["variants"]["kron_fd"]
    print(
        f"[{out['device']}] scale: kron_fd state {100 * kron['state_over_adam']:.2f}% of Adam's, "
        f"trace {kron['trace_seconds']:.1f} s, compile {kron['compile_seconds']:.1f} s"
    )
    if args.out is not None:
        common.save_json(args.out, out)
    return out


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
