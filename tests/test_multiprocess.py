"""Two-process training on localhost (``jax.distributed``): 8 CPU devices, one global mesh.

``tests/multiprocess_worker.py`` is started three times: twice as the two processes of a
``jax.distributed`` run (coordinator on ``127.0.0.1`` at a free port, 4 CPU devices per process,
CPU collectives by gloo: 8 global devices), once as a plain single-device run of the same
training (no ``jax.distributed``). All three train the same small tanh network (float32, fixed
NumPy seed, data generated identically in every process) for 20 steps with each of ``ada_fd``,
``ada_fd_dual_averaging``, ``fd_son``, ``kron_fd`` and ``ada_diag``. The 2-process run uses
one ``AxisType.Explicit`` mesh ``("model", "data") = (4, 2)`` (``jax.make_mesh`` puts its
leading axis across the processes): the parameters split along their leading axis over
``model`` -- so across the two processes -- and the batch over ``data``. Each worker writes its
report as JSON; this test asserts on them:

* the distributed run is what was asked for: 2 processes, 8 global devices, 4 local ones, the
  ``model`` axis spanning both processes (else nothing here would cross a process);
* for each optimizer, the 2-process run's loss at every step and its final parameters equal
  the single-device run's within float32 tolerance (the same computation, reduced in another
  order): parameters and losses, not sketch rows, which are defined only up to sign. Both
  processes report the same values, and the loss drops (the learning rates do something);
* the parameters keep their sharding, and every state array has the layout
  ``sketchopt.sharding.state_sharding`` asks for, right after plain ``tx.init`` (Explicit mesh)
  and after training;
* no device -- and no process -- holds a whole sketch: every sketch-shaped state array (a
  ``(..., d)`` array of a leaf of ``d`` entries; ``kron_fd``'s left ``(k, m)`` sides) has
  addressable shards strictly smaller than the global array along ``d``, and each process holds
  only half of its ``d`` entries. ``kron_fd``'s right sides are replicated by design
  (docs/guides/devices.md) and checked to be so;
* an Orbax checkpoint of all trained states, written by both processes into one directory and
  restored into an abstract target carrying the shardings (``sharding.abstract_state``),
  restores every array equal (each process compares its own shards) and with the sharding of
  the target and of the saved array.

The processes run under a deadline (a hang, e.g. one process waiting in a collective for a
crashed peer, fails the test instead of blocking CI). Marked ``devices`` (``make test-devices``)
and ``slow`` (out of ``make test`` and ``make test-fast``): 20-60 s on a 2-core machine,
almost all of it compiling.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("multiprocess_worker.py")
NAMES = ("ada_fd", "ada_fd_dual_averaging", "fd_son", "kron_fd", "ada_diag")
# All three processes together (they take under a minute on an idle 2-core machine); after a
# process fails, the others get GRACE seconds before they are killed (a peer may wait for it).
DEADLINE = 300
GRACE = 30
# |distributed - single device| over 20 float32 steps, parameters O(0.5) and losses O(0.5):
# measured at most 4e-7.
TOLERANCE = 1e-5


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it; the coordinator binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    """The workers' environment: the suite's XLA flags, CPU only, no shared compilation cache
    (two processes of one run writing one cache buys nothing here), collective timeouts raised
    (on a loaded 2-core machine the device threads can be slow to meet), and no device count
    flag (the worker sets 4 devices itself, ``jax_num_cpu_devices``)."""
    env = dict(os.environ)
    for var in list(env):
        if var.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")):
            del env[var]
    flags = [
        flag
        for flag in env.get("XLA_FLAGS", "").split()
        if not flag.startswith("--xla_force_host_platform_device_count")
    ]
    flags += [
        "--xla_cpu_collective_call_terminate_timeout_seconds=600",
        "--xla_cpu_collective_timeout_seconds=600",
    ]
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def _report_ok(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text())["ok"])
    except (OSError, ValueError, KeyError):
        return False


def _run(tmp: Path, port: int) -> dict:
    """Start the two workers and the reference, wait (under DEADLINE), read their reports.

    Returns ``{"reports": {label: report or None}, "logs": {label: stderr tail}, "codes": ...,
    "seconds": wall time}``; a report is None when its process wrote none (it crashed, or was
    killed at the deadline).
    """
    ckpt = tmp / "ckpt"
    commands = {
        f"process {i}": ["worker", str(i), str(port), str(tmp / f"worker{i}.json"), str(ckpt)]
        for i in range(2)
    }
    commands["reference"] = ["reference", str(tmp / "reference.json")]
    outs = {
        "process 0": tmp / "worker0.json",
        "process 1": tmp / "worker1.json",
        "reference": tmp / "reference.json",
    }
    env = _env()
    procs, logs = {}, {}
    start = time.monotonic()
    try:
        for label, args in commands.items():
            logs[label] = open(tmp / f"{label.replace(' ', '')}.log", "w+")
            procs[label] = subprocess.Popen(
                [sys.executable, str(WORKER), *args],
                env=env,
                stdout=logs[label],
                stderr=subprocess.STDOUT,
                cwd=tmp,
            )
        deadline = start + DEADLINE
        while any(p.poll() is None for p in procs.values()):
            if any(p.poll() not in (None, 0) for p in procs.values()) or any(
                not _report_ok(path) for path in outs.values() if path.exists()
            ):  # a failed process (its report written, it may still wait for its peer)
                deadline = min(deadline, time.monotonic() + GRACE)
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs.values():  # only the processes started here, by their handles
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
    seconds = time.monotonic() - start
    tails = {}
    for label, log in logs.items():
        log.seek(0)
        tails[label] = log.read()[-4000:]
        log.close()
    reports = {
        label: json.loads(path.read_text()) if path.exists() else None
        for label, path in outs.items()
    }
    codes = {label: p.returncode for label, p in procs.items()}
    return {"reports": reports, "logs": tails, "codes": codes, "seconds": seconds}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three processes' reports (started again once with a new port when the coordinator's
    port was taken between choosing it and binding it)."""
    for attempt in range(2):
        tmp = tmp_path_factory.mktemp(f"multiprocess{attempt}")
        out = _run(tmp, _free_port())
        logs = " ".join(out["logs"].values()).lower()
        # gRPC's words for a port taken (the coordinator then dies, SIGSEGV)
        if "failed to add port" not in logs and "already in use" not in logs:
            break
    print(f"multiprocess run: {out['seconds']:.1f} s, exit codes {out['codes']}")
    for label, report in out["reports"].items():
        if report is not None:
            print(label, json.dumps({k: v for k, v in report.items() if k != "results"}))
    return out


def _failure(runs, label) -> str:
    report = runs["reports"][label]
    detail = report.get("traceback") if report else "no report written"
    return (
        f"{label}: exit code {runs['codes'][label]} after {runs['seconds']:.0f} s "
        f"(deadline {DEADLINE} s)\n{detail}\n--- log tail ---\n{runs['logs'][label]}"
    )


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.first
@pytest.mark.slow
@pytest.mark.devices  # a tier of its own (make test-devices)
def test_two_processes_match_one_device(runs, subtests):
    """Every check of the module docstring, one subtest per optimizer and one for the checkpoint.

    One test item with subtests rather than parametrized items: the processes behind ``runs``
    take a minute, and each xdist worker that ran one of the items would run them again.
    """
    for label in ("process 0", "process 1", "reference"):
        report = runs["reports"][label]
        assert report is not None and report["ok"] and runs["codes"][label] == 0, _failure(
            runs, label
        )
    workers = [runs["reports"][f"process {i}"] for i in range(2)]
    reference = runs["reports"]["reference"]
    assert reference["device_count"] == 1
    for i, worker in enumerate(workers):
        assert worker["process_index"] == i and worker["process_count"] == 2
        assert worker["device_count"] == 8 and worker["local_device_count"] == 4
        # mesh rows (the model axis) 0-1 on process 0, 2-3 on process 1
        assert worker["mesh_processes"] == [[0, 0], [0, 0], [1, 1], [1, 1]]

    for name in NAMES:
        with subtests.test(optimizer=name):
            ref = reference["results"][name]
            got = [w["results"][name] for w in workers]
            for out in got:
                assert _max_diff(out["losses"], ref["losses"]) <= TOLERANCE, (
                    out["losses"],
                    ref["losses"],
                )
                for key, value in ref["params"].items():
                    assert _max_diff(out["params"][key], value) <= TOLERANCE, key
                assert out["param_shardings_ok"], out["param_specs"]
                assert out["init_layout_ok"] and out["layout_ok"]
            # both processes saw one global computation
            assert got[0]["losses"] == got[1]["losses"] and got[0]["params"] == got[1]["params"]
            assert ref["losses"][-1] < 0.6 * ref["losses"][0], ref["losses"]

            for i, out in enumerate(got):
                sketches = out["sketches"]
                # the (k, d) rows of each leaf (ada_fd, fd_son), dual averaging's too; ada_diag
                # has none (its accumulator is parameter-shaped, checked by layout_ok); kron_fd:
                # each matrix leaf's left sketch and basis, and its (d,) Adam-graft moment
                expected = {"ada_diag": 0, "kron_fd": 6}.get(name, 4)
                assert len(sketches) == expected, [s["path"] for s in sketches]
                for s in sketches:
                    d = s["shape"][-1]
                    assert s["shard_shape"][-1] < d, (i, s)
                    assert len(s["addressable"]) == 4, (i, s)
                    assert all(shape[-1] < d for shape in s["addressable"]), (i, s)
                    # the model axis is 2 devices per process, 4 in all: half of d each
                    assert s["process_columns"] == d // 2, (i, s)
                for s in out["replicated_sides"]:  # kron_fd's right sides, replicated
                    assert name == "kron_fd" and s["shard_shape"] == s["shape"], (i, s)
                assert len(out["replicated_sides"]) == (4 if name == "kron_fd" else 0)

    with subtests.test("orbax checkpoint written by both processes, restored sharded"):
        for worker in workers:
            ckpt = worker["checkpoint"]
            assert ckpt["same_structure"] and ckpt["leaves"] > 0
            assert ckpt["equal"] and ckpt["sharding_ok"], ckpt
            # the restored w1 sketch rows (ada_fd, dual averaging, fd_son) split along d
            assert ckpt["w1_sketch_specs"] == ["P(None, 'model')"], ckpt["w1_sketch_specs"]
