"""The ``speed`` experiment at ``--quick`` size: the form of its JSON (speed claims live
in the benchmark output, never in a timed test)."""

from __future__ import annotations

import json

import pytest
from experiment_support import finite_numbers, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def speed(tmp_path_factory):
    return run("speed", tmp_path_factory)


def test_speed_json(speed):
    out, summary = speed
    assert (out / "speed.png").stat().st_size > 10_000
    payload = json.loads((out / "speed.json").read_text())
    assert payload["size"] == "quick"
    rows = payload["rows"]
    keys = {(r["method"], r["d"], r["sketch_size"], r["dtype"]) for r in rows}
    assert len(keys) == len(rows)  # one row per learner and size
    for r in rows:
        assert not finite_numbers(r), r["method"]
        assert r["seconds"] > 0 and r["seconds_warm"] > 0 and r["state_floats_per_param"] > 0
        assert r["ratio_to_adagrad"] > 0 and r["ratio_to_adagrad_warm"] > 0
    methods = {r["method"] for r in rows}
    assert {"optax.adagrad", "ada_diag", "ada_fd", "ada_fd(fast=True)", "fd_son"} <= methods
    for d in payload["config"]["dims"]:
        base = [r for r in rows if r["method"] == "optax.adagrad" and r["d"] == d]
        assert base and all(r["ratio_to_adagrad"] == 1.0 for r in base)
    # Speed claims live in the benchmark's output, never in a timed test: only the form here.
    for target in payload["targets"]:
        assert {"target", "measured", "goal", "met"} <= set(target), target
    assert summary["table"].startswith("| ")
