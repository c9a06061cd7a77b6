"""The ``time_to_target`` benchmark: its tuning rule (the grid grows off its edge) and the first
step at the target, on stand-ins without training; then the ``--quick`` run (marked
``benchmark``): the form of its JSON, every number re-derived from the curves it stores, and its
summary and claims recomputed from the JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from experiment_support import check_claims, load, quick_run

from experiments import common, readme_tables
from experiments import time_to_target as ttt


def test_the_grid_grows_by_half_decades_until_the_best_rate_is_off_its_edge(monkeypatch):
    """A learner whose loss falls to the grid's top edge gets one more half-decade there per
    round, at most ``MAX_EXTEND``; an interior optimum leaves the grid as it is."""
    best = {"inside": 1e-3, "above": 1.0, "below": 1e-9}

    def score(steppers, points, work, cfg, seed):  # a parabola in log lr around each best
        return [math.log10(lr / best[name]) ** 2 for name, lr in points]

    monkeypatch.setattr(ttt, "_score_grid", score)
    grid = list(ttt.GRID)
    out = ttt.tune_lr({}, list(best), grid, None, None, 0)
    assert out["inside"]["grid"] == grid and out["inside"]["lr"] == pytest.approx(1e-3)
    assert not out["inside"]["on_edge"]
    up, down = out["above"], out["below"]
    assert len(up["grid"]) == len(down["grid"]) == len(grid) + ttt.MAX_EXTEND
    assert up["grid"][: len(grid)] == grid and down["grid"][-len(grid) :] == grid
    for g in (up["grid"], down["grid"]):
        assert np.allclose(np.diff(np.log10(g)), 0.5)
    assert up["lr"] == up["grid"][-1] and up["on_edge"]  # still at the edge: flagged
    assert down["lr"] == down["grid"][0] and down["on_edge"]
    # a best point one half-decade past the edge: one extension, then off the edge
    best["above"] = ttt.GRID[-1] * math.sqrt(10)
    out = ttt.tune_lr({}, ["above"], grid, None, None, 0)["above"]
    assert len(out["grid"]) == len(grid) + 2  # grown twice: the new point was the edge once
    assert out["lr"] == pytest.approx(best["above"]) and not out["on_edge"]


def _run_with(losses):
    run = ttt.Run.__new__(ttt.Run)  # the running mean needs the losses only
    run.losses, run.steps = list(losses), len(losses)
    return run


def test_the_first_step_at_the_target_reads_the_running_mean():
    losses = np.r_[np.full(30, 2.0), np.full(30, 1.0)]
    run = _run_with(losses)
    # the 20-step mean is 2 up to step 30, then falls by 1/20 per step: 1.5 at step 40
    assert ttt.first_reached(run, 2.01) == ttt.WINDOW
    assert ttt.first_reached(run, 1.51) == 40 and ttt.first_reached(run, 1.49) == 41
    assert ttt.first_reached(run, 0.5) is None
    assert run.final() == pytest.approx(1.0)
    diverged = _run_with([*losses[:-1], float("nan")])
    assert diverged.final() == math.inf


time_to_target_run = quick_run("time_to_target")


def _strict(path):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.benchmark
def test_time_to_target(time_to_target):
    out, summary = time_to_target
    payload = load(out, "time_to_target")
    _strict(out / "time_to_target.json")
    cfg = payload["config"]
    assert set(payload["algorithms"]) == set(ttt.WORKLOADS)
    assert cfg["kron_fd_defaults"]["sketch_size"] >= 1 and "graft" in cfg["kron_fd_defaults"]
    for name, part in payload["algorithms"].items():
        assert (out / f"time_to_target_{name}.png").stat().st_size > 10_000
        _check_workload(name, part, cfg)
    # the summary and the claims follow from the JSON's numbers
    again = common.to_jsonable(ttt.summary(payload["algorithms"]))
    assert again == payload["summary"]
    claims = check_claims(payload["claims"], "time_to_target")
    assert [c["id"] for c in ttt.claim_rows(payload)] == list(claims)
    assert {c["verdict"] for c in claims.values()} <= set(common.VERDICTS)
    # the README's headline renderer reads the same JSON: one row per learner, one column each
    table = readme_tables.time_to_target(out).split("\n\n")[-1].splitlines()
    assert table[0].count("(N = ") == len(ttt.WORKLOADS) and len(table) == 2 + 3
    kron = next(line for line in table if line.startswith("| kron_fd (defaults)"))
    ratio = payload["algorithms"]["cnn"]["algorithms"]["kron_fd"]["steps_ratio"]
    assert kron.split(" | ")[2].startswith(common.fmt(ratio, 2))


def _check_workload(name: str, part: dict, cfg: dict) -> None:
    algs, n = part["algorithms"], part["steps"]
    assert set(algs) == {"adamw", "kron_fd", "kron_fd_tuned"}, name
    assert set(part["skipped"]) == set(ttt.QUICK_SKIP)
    adam = algs["adamw"]
    grid = adam["tuning"]["grid"]
    base = cfg["grid"]
    # AdamW's grid: the base half-decades, grown on one side while the best was on its edge
    assert len(base) <= len(grid) <= len(base) + ttt.MAX_EXTEND
    assert np.allclose(np.diff(np.log10(grid)), 0.5)
    assert not adam["tuning"]["on_edge"] or len(grid) == len(base) + ttt.MAX_EXTEND
    assert adam["lr"] == grid[common.best_index(adam["tuning"]["scores"])]
    kron_grid = algs["kron_fd"]["tuning"]["grid"]  # AdamW's grid, grown by the same rule
    assert all(any(math.isclose(a, b) for b in kron_grid) for a in grid)
    tuned = algs["kron_fd_tuned"]["tuning"]
    assert tuned["lr"] == adam["lr"] and tuned["budget"] == 1  # quick: one configuration
    assert [c["name"] for c in tuned["configurations"]] == [ttt.TUNED[0][0]]
    assert adam["state_bytes_per_param"] == 8.0 and adam["step_time_over_adamw"] == 1.0
    # TUNED[0] is the defaults with the Adam graft: one float more per parameter of the factored
    # leaves (the vectors keep their diagonal statistic under either graft), most of them here
    extra = (
        algs["kron_fd_tuned"]["state_bytes_per_param"] - algs["kron_fd"]["state_bytes_per_param"]
    )
    assert 3.5 < extra <= 4.0
    for learner, r in algs.items():
        _check_learner(name, learner, r, n, adam)


def _check_learner(name: str, learner: str, r: dict, n: int, adam: dict) -> None:
    (seed,) = r["per_seed"]  # quick: one seed, so the stored curve is that seed's
    curve = np.asarray(r["curves"]["running_mean"])
    assert r["curves"]["steps"][0] == ttt.WINDOW and len(curve) == n - ttt.WINDOW + 1
    assert np.all(np.diff(r["curves"]["seconds"]) > 0)
    target = adam["per_seed"][0]["final_running_mean"]
    assert seed["target"] == pytest.approx(target)
    hits = np.nonzero(curve <= target)[0]
    step = int(hits[0]) + ttt.WINDOW if len(hits) else None
    assert seed["reached_step"] == step, (name, learner)
    if learner == "adamw":
        assert step is not None and step <= n and seed["wall_ratio"] <= 1.0
    if step is None:
        assert r["steps_ratio"] is None and r["wall_ratio"] is None
        assert seed["held_out_at_target"] is None
        return
    assert r["steps_ratio"] == pytest.approx(step / n)
    wall = seed["seconds_to_target"] / adam["per_seed"][0]["seconds_n"]
    assert r["wall_ratio"] == pytest.approx(wall)
    assert step <= seed["held_out_step"] < step + 5  # parameters kept every 5 steps
    if name == "cnn":
        assert 0.1 < seed["held_out_at_target"]["test_accuracy"] <= 1.0
    # every learner that reaches AdamW's loss has trained: below the start of its curve
    assert curve[step - ttt.WINDOW] < curve[0] or step == ttt.WINDOW
    assert r["compile_seconds"] > 0 and r["step_seconds"] > 0


@pytest.mark.benchmark
def test_the_defaults_screen(tmp_path, monkeypatch):
    """``time_to_target.py screen`` at the quick size, one workload and one departure: strict
    JSON, AdamW at the target by definition, the medians and the running mean at ``SCREEN_AT *
    N`` re-derived from the stored curves and seeds, and a table row per learner."""
    monkeypatch.setattr(ttt, "DEPARTURES", {"momentum=0.8": {"momentum": 0.8}})
    assert ttt.screen_main(["autoencoder", "--quick", "--out", str(tmp_path)]) == 0
    payload = _strict(tmp_path / "time_to_target_screen.json")
    assert list(payload["workloads"]) == ["autoencoder"]
    part = payload["workloads"]["autoencoder"]
    assert list(part["learners"]) == ["adamw", "defaults", "momentum=0.8"]
    assert part["learners"]["momentum=0.8"]["kron_fd"] == {"momentum": 0.8}
    adam = part["learners"]["adamw"]
    assert adam["final_over_target"] == 1.0 and adam["step_over_adamw"] == 1.0
    at = int(ttt.SCREEN_AT * part["steps"])
    for r in part["learners"].values():
        seeds = r["per_seed"]
        ratios = [math.inf if s["steps_ratio"] is None else s["steps_ratio"] for s in seeds]
        median = float(np.median(ratios))
        assert r["steps_ratio"] == (median if math.isfinite(median) else None)
        early = r["curves"]["running_mean"][r["curves"]["steps"].index(at)] / seeds[0]["target"]
        assert early == pytest.approx(r["early_over_target"], rel=1e-12)  # one seed at --quick
        if r["early_over_target"] <= 1.0:  # the running mean is at the target by then
            assert r["steps_ratio"] is not None and r["steps_ratio"] <= ttt.SCREEN_AT
    table = ttt.screen_table(payload).splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| autoencoder | adamw |")
