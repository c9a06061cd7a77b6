"""The ``regret`` experiment at ``--quick`` size: the form of its JSON and the claims
that hold robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def regret(tmp_path_factory):
    return run("regret", tmp_path_factory)


def test_regret_json(regret):
    out, summary = regret
    payload = load(out, "regret")
    algs = payload["algorithms"]
    for name in (
        "ada_fd",
        "ada_full",
        "ada_diag",
        "ada_fd_dual_averaging",
        "ada_diag_dual_averaging",
    ):
        assert name in algs
    T = payload["config"]["T"]
    for name, r in algs.items():
        assert not finite_numbers(r), name
        assert set(r["chosen"]) == {"eta", "delta"}
        assert r["chosen"]["eta"] in r["grid"]["eta"] and r["chosen"]["delta"] in r["grid"]["delta"]
        assert r["curve"]["t"][-1] == T and len(r["curve"]["t"]) == len(r["curve"]["regret"])
        assert r["final_regret"] == pytest.approx(r["curve"]["regret"][-1])
        assert r["final_regret"] > 0 and r["seconds_per_round"] > 0
        assert len(r["grid_final_regret"]) == len(r["grid_points"])
    # Ada-FD paper Fig. 1: ADA-FD beats ADA-DIAG under both rules.
    assert algs["ada_fd"]["final_regret"] < algs["ada_diag"]["final_regret"]
    assert (
        algs["ada_fd_dual_averaging"]["final_regret"]
        < algs["ada_diag_dual_averaging"]["final_regret"]
    )
    assert summary["final_regret"]["ada_fd"] == algs["ada_fd"]["final_regret"]
