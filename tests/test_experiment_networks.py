"""The ``networks`` experiment at ``--quick`` size: the form of its JSON (the transformer, the
CNN and the scale parts), the claims' verdicts recomputed from the JSON's numbers, and what holds
robustly at that size."""

from __future__ import annotations

import math

import pytest
from experiment_support import check_claims, finite_numbers, load, quick_run

from experiments import networks as nw

pytestmark = [pytest.mark.slow, pytest.mark.benchmark]


networks_run = quick_run("networks")


def test_networks(networks):
    out, summary = networks
    payload = load(out, "networks")
    cfg = payload["config"]
    assert cfg["sketch_size"] == 8 and cfg["steps"] == 20
    for model, results, skipped in (
        ("transformer", payload["algorithms"], payload["skipped"]),
        ("cnn", payload["cnn"]["algorithms"], payload["cnn"]["skipped"]),
    ):
        # the quick sample runs; every other learner is recorded as skipped, with why
        assert set(results) == set(nw.QUICK[model]), model
        assert set(results) | set(skipped) >= {"adam", "kron_fd", "kron_rfd", *nw.PEERS}
        for name, r in results.items():
            assert not finite_numbers(r), (model, name)
            assert r["grid"] == [r["chosen"]["learning_rate"]]  # quick: the middle point only
            assert r["step_seconds"] > 0 and r["compile_seconds"] > 0
            assert len(r["curves"]["loss"]) == len(r["curves"]["seconds"])
            # every learner trains: the last loss is below the first (ln 256 = 5.5 for the
            # LM: quick runs end at 3.1-4.1; the CNN's 14x14 single epoch barely moves, so it
            # is only held to stay finite and below ln 10 + 0.2)
            loss = r["curves"]["loss"]
            if model == "transformer":
                assert loss[-1] < loss[0] - 0.5, name
            else:
                assert r["final_train_loss"]["mean"] < math.log(10) + 0.2, name
        assert results["adam"]["step_time_over_adam"] == 1.0
    # the paper's ADA-FD runs ADA-DIAG at ADA-DIAG's own chosen pair off the conv kernels
    cnn_algs = payload["cnn"]["algorithms"]
    assert cnn_algs["ada_fd"]["ada_diag_off_conv"] == {
        "eta": cnn_algs["ada_diag"]["chosen"]["learning_rate"],
        "delta": nw.DIAG_DELTA,
    }
    # state: the factored sketch keeps its sides, not the gradient's square; Adam 8 bytes/param
    lm = payload["algorithms"]
    assert lm["adam"]["state_bytes_per_param"] == 8.0
    scale = payload["scale"]
    kron = scale["variants"]["kron_fd"]
    assert kron["state_bytes"] <= scale["bound_bytes"]
    assert kron["state_over_adam"] < 0.5
    assert scale["model"]["leaves"] == 6 * scale["model"]["layers"] + 4

    claims = check_claims(payload["claims"], "networks")
    assert claims == {row["id"]: row for row in nw.claim_rows(payload)}
    assert {"networks/state", "networks/compile_time", "networks/step_time",
            "networks/transformer_kron_rfd_final_loss",
            "networks/cnn_kron_fd_final_loss"} <= set(claims)  # fmt: skip
    assert summary["table"].startswith("| learner")
