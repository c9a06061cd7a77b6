"""The ``son_condition`` experiment at ``--quick`` size: the form of its JSON and the claims
that hold robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def son_condition(tmp_path_factory):
    return run("son_condition", tmp_path_factory)


def test_son_condition_json(son_condition):
    out, summary = son_condition
    payload = load(out, "son_condition")
    kappas = payload["config"]["kappas"]
    algs = payload["algorithms"]
    assert {"ada_diag", "fd_son/m=0"} <= set(algs)
    assert any(k.startswith("oja_son/") for k in algs)
    assert any(k.startswith("rfd_son/") for k in algs)
    for name, r in algs.items():
        assert not finite_numbers(r), name
        assert len(r["error"]) == len(kappas) == len(r["chosen"])
        assert all(0 <= e <= 1 for e in r["error"]), name
        assert all(set(c) == set(r["grid"]) for c in r["chosen"])
    # Better than chance everywhere (labels are balanced by construction).
    assert max(algs["ada_diag"]["error"]) < 0.45
    assert set(summary["error"]) == set(algs)
