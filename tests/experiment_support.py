"""What the experiments' tests share (``tests/test_experiment_NAME.py``): run one experiment at
``--quick`` size into a temporary folder, load its JSON strictly, check its claims' form.

One experiment's tests live in one file and, as a rule, in one test function that uses one
module-scoped run (:func:`quick_run`): under ``pytest-xdist`` each test of a file may land on
another worker, which would run the experiment again.
"""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments import common  # noqa: E402


def finite_numbers(obj, path="$"):
    """The paths of the non-finite numbers in ``obj`` (``None`` stands for a non-finite value)."""
    bad = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad += finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += finite_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, float) and not math.isfinite(obj):
        bad.append(path)
    return bad


def load(out: pathlib.Path, name: str) -> dict:
    """``out/NAME.json`` of a quick run, with its figure and its claims checked for form."""
    assert (out / f"{name}.png").stat().st_size > 10_000
    payload = json.loads((out / f"{name}.json").read_text())
    assert payload["experiment"] == name
    assert payload["size"] == "quick"
    assert "config" in payload and payload["algorithms"]
    check_claims(payload.get("claims", []), name)
    return payload


def check_claims(claims, name: str) -> dict[str, dict]:
    """Every claim row well formed (re-validated by ``common.claim``); returns them by id."""
    by_id = {}
    for row in claims:
        fields = ("source", "claim", "paper", "ours", "verdict", "reason")
        again = common.claim(row["id"], **{k: row[k] for k in fields})
        assert again == row
        assert row["id"].startswith(f"{name}/") and row["id"] not in by_id
        by_id[row["id"]] = row
    return by_id


def run(name: str, tmp_path_factory):
    """Run ``experiments.NAME`` at quick size; returns ``(out, summary)``."""
    common.limit_blas_threads()
    out = tmp_path_factory.mktemp(name)
    module = importlib.import_module(f"experiments.{name}")
    summary = module.run(quick=True, full=False, seed=0, out=out)
    assert isinstance(summary, dict) and summary["table"].startswith("| ")
    return out, summary


def quick_run(name: str, *, fixture: str | None = None):
    """A module-scoped fixture named ``fixture`` (default ``name``): :func:`run`'s ``(out,
    summary)`` of the quick run (``regret_run = quick_run("regret")`` in the module; tests ask
    for ``regret``)."""

    @pytest.fixture(scope="module", name=fixture or name)
    def quick(tmp_path_factory):
        return run(name, tmp_path_factory)

    return quick


def verdict(holds, partly=False) -> str:
    """The verdict of a rule recomputed by a test (``common.verdict`` of plain bools)."""
    return common.verdict(bool(holds), partly=bool(partly))
