"""The ``cnn`` experiment at ``--quick`` size: the form of its JSON and the claims
that hold robustly at that size."""

from __future__ import annotations

import pytest
from experiment_support import finite_numbers, load, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return run("cnn", tmp_path_factory)


def test_cnn_json(cnn):
    out, summary = cnn
    payload = load(out, "cnn")
    algs = payload["algorithms"]
    assert {"ada_diag", "ada_fd", "radagrad", "fd_son", "sgd", "adam"} <= set(algs)
    seeds = payload["config"]["seeds"]
    for name, r in algs.items():
        assert not finite_numbers(r), name
        final = r["final"]
        for key in ("final_train_loss", "final_test_accuracy"):
            assert len(final[key]["per_seed"]) == len(seeds), (name, key)
        for key in ("train_loss", "test_accuracy"):
            curve = r["curves"][key]
            assert len(curve["per_seed"]) == len(seeds) and len(curve["mean"]) > 0, (name, key)
        # Every optimizer trains: from ln(10) = 2.30 at the start to well below 1 in two epochs.
        assert all(0 < v < 1.0 for v in final["final_train_loss"]["per_seed"]), name
        assert all(v > 0.8 for v in final["final_test_accuracy"]["per_seed"]), name
        if name != "ada_diag" and r["ada_diag_on_other_parameters"] is not None:
            assert r["ada_diag_on_other_parameters"] == algs["ada_diag"]["chosen"], name
    # The training-loss claim that holds robustly at the quick size (paired seeds): ADA-FD on the
    # conv kernels beats ADA-DIAG on them, seed by seed. (The paper's full claim, ADA-FD below
    # RADAGRAD and FD-SON too, is reported in the JSON whichever way it falls.)
    against = payload["claim"]["against"]["ada_diag"]
    assert against["ada_fd_lower_on_every_seed"], against
    assert isinstance(payload["claim"]["holds"], bool) and payload["claim"]["text"]
    assert set(summary["final"]) == set(algs)
