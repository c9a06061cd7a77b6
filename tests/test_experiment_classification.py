"""The ``classification`` experiment at ``--quick`` size: the form of its JSON and the claims
that hold robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def classification(tmp_path_factory):
    return run("classification", tmp_path_factory)


def test_classification_json(classification):
    out, summary = classification
    payload = load(out, "classification")
    algs = payload["algorithms"]
    for name in ("ada_fd", "ada_fd_dual_averaging", "ada_diag", "ada_diag_dual_averaging"):
        assert name in algs
    for name, r in algs.items():
        assert not finite_numbers(r), name
        for ds, e in r["datasets"].items():
            assert set(e["chosen"]) == set(r["grid"]), (name, ds)
            assert 0 <= e["test_accuracy"] <= 1 and 0 <= e["online_error_rate"] <= 1
            assert 0 <= e["sparsity"] <= 1
            assert len(e["test_curve"]["accuracy"]) == len(e["test_curve"]["examples"])
    # A linear model separates these digits far better than chance.
    assert algs["ada_fd"]["datasets"]["digits"]["test_accuracy"] > 0.7
    assert set(summary["test_accuracy"]) == set(algs)
