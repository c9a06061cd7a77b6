"""The ``sparse_drift`` experiment at ``--quick`` size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = [pytest.mark.slow, pytest.mark.experiments]


def test_sparse_drift_json(tmp_path_factory):
    """The float32 drift of the sparse second-order learners' ``F Z`` (the streams benchmark page
    quotes the default size's 10^6 examples): the form, and drift far below float32's round-off
    growth."""
    out, summary = run("sparse_drift", tmp_path_factory)
    payload = load(out, "sparse_drift")
    assert set(payload["algorithms"]) == {"oja_son", "fd_son", "rfd_son", "ada_fd"}
    for name, res in payload["algorithms"].items():
        assert not finite_numbers(res), name
        assert res["skipped"] == 0 and res["examples_per_second"] > 0
        last = res["points"][-1]
        assert last["examples"] == payload["config"]["examples"]  # (all of them at --quick)
        assert last["sketch_drift"] < 1e-2 and last["gram_drift"] < 1e-2, (name, last)
    assert summary["table"].startswith("| ")
