"""The ``son_real`` experiment at ``--quick`` size: the form of its JSON, the claims' verdicts
recomputed from the JSON's numbers, and what holds robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import check_claims, finite_numbers, load, quick_run

from experiments import son_real as sr

pytestmark = [pytest.mark.slow, pytest.mark.experiments]


son_real_run = quick_run("son_real")


def test_son_real(son_real):
    out, summary = son_real
    payload = load(out, "son_real")
    cfg = payload["config"]
    datasets = cfg["datasets"]
    algs = payload["algorithms"]
    assert set(algs) == set(sr.NAMES)
    for name, r in algs.items():
        assert not finite_numbers(r), name
        # Equal grids: alpha = 2^j, j = -3..6 for every learner (SON sec. 5).
        assert r["grid"] == {"alpha": [2.0**j for j in range(-3, 7)]}, name
        assert set(r["datasets"]) == set(datasets)
        for d, res in r["datasets"].items():
            online = res["grid_online_error"]
            assert len(online) == len(res["grid_test_error"]) == 10
            # Selection by online error only: the chosen point is the online minimum.
            assert res["online_error"] == min(online), (name, d)
            # Breast cancer is nearly separable: quick run 4.4-6.6% online, 4.4-6.1% test for
            # every learner; asserted with a wide margin (12%).
            assert 0 <= res["online_error"] < 0.12 and 0 <= res["test_error"] < 0.12, (name, d)

    claims = check_claims(payload["claims"], "son_real")
    again = sr.claim_rows(algs, cfg["data"], datasets)
    assert claims == {row["id"]: row for row in again}
    assert {"son_real/sketch_plain", "son_real/adagrad_beats_plain",
            "son_real/sketch_rescaled"} <= set(claims)  # fmt: skip
    assert all(f"son_real/rescaled_vs_adagrad_{d}" in claims for d in datasets)
    assert summary["table"].startswith("| algorithm")
