"""The ``regret`` experiment at ``--quick`` size: the form of its JSON, its selection rule (every
learner tuned on the same-size grid of a held-out instance), its claims' verdicts recomputed from
its numbers, and the claims that hold robustly at that size."""

from __future__ import annotations

import itertools
import math

import pytest
from experiment_support import check_claims, finite_numbers, load, quick_run, verdict

pytestmark = [pytest.mark.slow, pytest.mark.experiments]

NAMES = (
    "ada_fd",
    "ada_full",
    "ada_diag",
    "radagrad",
    "fd_son",
    "ada_fd_dual_averaging",
    "ada_full_dual_averaging",
    "ada_diag_dual_averaging",
)
CLAIMS = (
    "close_to_full",
    "beats_diag",
    "beats_radagrad",
    "beats_fd_son",
    "time_vs_full",
    "time_vs_radagrad",
    "time_vs_fd_son",
)


regret_run = quick_run("regret")


def test_regret_json(regret):
    out, summary = regret
    payload = load(out, "regret")
    algs, cfg = payload["algorithms"], payload["config"]
    assert set(algs) == set(NAMES)
    T = cfg["T"]
    # Held-out selection: the tuning instance is another draw of the data.
    assert cfg["tuning_seed"] != payload["seed"]
    sizes = set()
    for name, r in algs.items():
        assert not finite_numbers(r), name
        grid = r["grid"]
        if name == "fd_son":  # its own hyperparameters, on a grid of the same size
            assert set(grid) == {"alpha", "eta0"}
            assert grid == {
                "alpha": cfg["fd_son_grid"]["alpha"],
                "eta0": cfg["fd_son_grid"]["eta0"],
            }
        else:  # the same eta x delta grid for everyone: none is reduced or centred
            assert grid == cfg["grid"], name
        sizes.add(math.prod(len(v) for v in grid.values()))
        assert set(r["chosen"]) == set(grid)
        assert all(r["chosen"][k] in grid[k] for k in grid)
        assert len(r["grid_final_regret"]) == len(r["grid_points"])
        assert r["grid_points"] == [
            dict(zip(grid, p, strict=True)) for p in itertools.product(*grid.values())
        ]
        # The chosen pair is the tuning instance's best (diverged points are stored as None).
        tuned = [math.inf if v is None else v for v in r["grid_final_regret"]]
        best = min(range(len(tuned)), key=tuned.__getitem__)
        assert r["grid_points"][best] == r["chosen"]
        assert r["tuning_final_regret"] == pytest.approx(tuned[best])
        # Reported on the evaluation instance: the mean over the keys (5 for RADAGRAD).
        assert len(r["final_regret_per_key"]) == (
            cfg["radagrad_seeds"] if name == "radagrad" else 1
        )
        assert r["final_regret"] == pytest.approx(
            sum(r["final_regret_per_key"]) / len(r["final_regret_per_key"])
        )
        assert r["curve"]["t"][-1] == T and len(r["curve"]["t"]) == len(r["curve"]["regret"])
        assert r["final_regret"] == pytest.approx(r["curve"]["regret"][-1])
        assert r["final_regret"] > 0 and r["seconds_per_round"] > 0
    assert len(sizes) == 1  # equal tuning budgets
    assert summary["final_regret"]["ada_fd"] == algs["ada_fd"]["final_regret"]

    # Every claim present, its verdict recomputed from the JSON's numbers with its stated margin
    # (the timing claims too: this checks the rule, not the timings).
    claims = check_claims(payload["claims"], "regret")
    assert set(claims) == {f"regret/{c}" for c in CLAIMS}
    R = {k: v["final_regret"] for k, v in algs.items()}
    us = {k: v["seconds_per_round"] for k, v in algs.items()}
    m = cfg["margins"]
    close = [
        R["ada_fd"] <= (1 + m["close_to_full"]) * R["ada_full"],
        R["ada_fd_dual_averaging"] <= (1 + m["close_to_full"]) * R["ada_full_dual_averaging"],
    ]
    below = [
        R["ada_fd"] < R["ada_diag"],
        R["ada_fd_dual_averaging"] < R["ada_diag_dual_averaging"],
    ]
    worst_key = max(algs["radagrad"]["final_regret_per_key"])
    fd, full, rad, son = us["ada_fd"], us["ada_full"], us["radagrad"], us["fd_son"]
    expected = {
        "close_to_full": verdict(all(close), any(close)),
        "beats_diag": verdict(all(below), any(below)),
        "beats_radagrad": verdict(R["ada_fd"] < R["radagrad"], R["ada_fd"] < worst_key),
        "beats_fd_son": verdict(R["ada_fd"] < R["fd_son"]),
        "time_vs_full": verdict(full >= m["much_faster"] * fd, full > fd),
        "time_vs_radagrad": verdict(fd < rad, fd <= m["as_fast"] * rad),
        "time_vs_fd_son": verdict(fd <= m["as_fast"] * son, fd <= 2 * m["as_fast"] * son),
    }
    for c, v in expected.items():
        assert claims[f"regret/{c}"]["verdict"] == v, c

    # Robust at quick size (seed 0, T = 1000, d = 30; measured ratios in brackets):
    # Ada-FD Fig. 1(a,b): ADA-FD beats ADA-DIAG under both rules by a wide margin [0.62, 0.64].
    assert R["ada_fd"] < 0.8 * R["ada_diag"]
    assert R["ada_fd_dual_averaging"] < 0.8 * R["ada_diag_dual_averaging"]
    # ... and RADAGRAD, each of its keys [0.37 of the mean, 0.41 of its best key].
    assert R["ada_fd"] < 0.6 * min(algs["radagrad"]["final_regret_per_key"])
    # ADA-FULL, the matrix ADA-FD sketches, also beats ADA-DIAG under both rules [0.49, 0.48].
    assert R["ada_full"] < 0.8 * R["ada_diag"]
    assert R["ada_full_dual_averaging"] < 0.8 * R["ada_diag_dual_averaging"]
    # ADA-FD within 1.5x of ADA-FULL (a loose form of "close to"; [1.28, 1.32] measured: the
    # 1.2x margin of the claim is not met at this size, see the claim's reason).
    assert R["ada_fd"] < 1.5 * R["ada_full"]
    assert R["ada_fd_dual_averaging"] < 1.5 * R["ada_full_dual_averaging"]
