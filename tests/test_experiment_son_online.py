"""The ``son_online`` experiment at ``--quick`` size: the form of its JSON and the claims
that hold robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def son_online(tmp_path_factory):
    return run("son_online", tmp_path_factory)


def test_son_online_json(son_online):
    out, summary = son_online
    payload = load(out, "son_online")
    algs = payload["algorithms"]
    sizes = payload["config"]["sketch_sizes"]
    sketched = (
        "fd_son",
        "rfd_son",
        "rfd0_son",
        "oja_son",
        "rp_son",
        "ada_fd",
        "radagrad",
        "ada_lr",
    )
    assert set(sketched) | {"ada_diag", "ons"} <= set(algs)
    for name, r in algs.items():
        assert not finite_numbers(r), name
        assert r["sketch_sizes"] == (sizes if name in sketched else [None]), name
        assert (
            len(r["online_error"]) == len(r["runs"]) == len(r["chosen"]) == len(r["sketch_sizes"])
        )
        for e in r["runs"]:
            assert 0 <= e["online_error"] <= 1 and 0 <= e["test_error"] <= 1, name
            assert e["online_error_std"] >= 0
            assert len(e["online_error_per_shuffle"]) == payload["config"]["shuffles"]
            assert set(e["chosen"]) == set(r["grid"]), name
            assert all(e["chosen"][k] in r["grid"][k] for k in r["grid"]), name
            assert len(e["grid_online_error"]) == len(e["grid_points"])
            assert len(e["curve"]["examples"]) == len(e["curve"]["online_error_rate"])
    assert algs["rfd0_son"]["chosen"] == [{"alpha0": 0.0}] * len(sizes)
    assert all(c["alpha0"] > 0 for c in algs["rfd_son"]["chosen"])
    for m in sizes:
        d = payload["rfd0_diagnostics"][str(m)]
        # alpha = 0 until the doubling buffer's first shrink (round 2m), positive after it.
        assert d["first_round_with_alpha_positive"] == [2 * m] * payload["config"]["shuffles"]
        assert d["alpha_final"] > 0 and 0 <= d["projection_active_fraction"] <= 1
    assert set(summary["online_error"]) == set(algs)
