"""The experiment runner (``experiments/run.py``) and the helpers of ``experiments/common.py``.
Each experiment's quick run is tested in its own ``tests/test_experiment_NAME.py``."""

from __future__ import annotations

import pathlib

import pytest
from experiment_support import REPO  # (importing it puts the repository on sys.path)

from experiments import common
from experiments import run as runner

# ------------------------------------------------------------------------------------------------
# The runner.


def test_runner_skips_missing_module_and_rejects_unknown_names(capsys):
    assert runner.load("no_such_experiment_yet") is None
    summary = runner.run_one(
        "no_such_experiment_yet", quick=True, full=False, seed=0, out=pathlib.Path(".")
    )
    assert summary["status"] == "missing"
    assert "does not exist yet" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        runner.main(["not_an_experiment"])
    with pytest.raises(SystemExit):
        runner.main(["regret", "--quick", "--full"])


def test_summary_markdown(tmp_path):
    results = {
        "regret": {"status": "ok", "table": "| a | b |\n| --- | --- |\n| 1 | 2 |", "seconds": 3.0},
        "cnn": {"status": "missing", "table": "*missing*"},
        "speed": {"status": "failed", "error": "Traceback: boom"},
    }
    runner.write_summary(tmp_path, results, size="quick", seconds=5.0)
    text = (tmp_path / "summary.md").read_text()
    assert "## regret (3 s)" in text and "| 1 | 2 |" in text
    assert "*missing*" in text and "boom" in text


def test_json_helpers_are_strict():
    import numpy as np

    assert common.to_jsonable({"a": np.float32(np.nan), "b": np.arange(2)}) == {
        "a": None,
        "b": [0, 1],
    }
    assert common.best_index([np.nan, 3.0, np.inf, 2.0]) == 3
    assert common.neighbourhood(common.decades(-4, 2), 1e-4) == [1e-4, 1e-3]
    assert common.fmt(float("nan")) == "diverged"


def test_claims_and_the_reproductions_table(tmp_path):
    row = common.claim(
        "regret/ada_fd_beats_ada_diag",
        source="Ada-FD Fig. 1",
        claim="ADA-FD's regret is below ADA-DIAG's",
        paper="ADA-FD below ADA-DIAG",
        ours="12.0 vs 15.0",
        verdict=common.verdict(True),
        reason="lower by 20%",
    )
    assert common.verdict(False, partly=True) == "holds partly"
    assert common.verdict(False) == "does not hold"
    with pytest.raises(ValueError, match="verdict"):
        common.claim("a/b", **{**{k: "x" for k in row if k not in ("id",)}, "verdict": "maybe"})
    with pytest.raises(ValueError, match="empty"):
        common.claim(
            "a/b", **{**{k: "x" for k in row if k != "id"}, "verdict": "holds", "reason": " "}
        )
    common.save_json(tmp_path / "regret.json", {"size": "default", "claims": [row]})
    common.save_json(tmp_path / "cnn.json", {"size": "default", "claims": []})
    table = common.reproductions_table(tmp_path, runner.EXPERIMENTS)
    assert table.count("\n") == 2 and "**holds**: lower by 20%" in table
    assert "12.0 vs 15.0 (default size)" in table
    runner.write_reproductions(tmp_path)
    assert table in (tmp_path / "reproductions.md").read_text()
    runner.write_summary(tmp_path, {"regret": {"table": "| a |"}}, size="default", seconds=1.0)
    assert table in (tmp_path / "summary.md").read_text()


def test_readme_reproductions_table_is_the_headline_table():
    """The README's "Reproductions" table has one row per headline claim (``run.HEADLINE``, the
    table ``make run`` writes at the top of ``summary.md``), each with a verdict."""
    text = (REPO / "README.md").read_text()
    start = text.index("<!-- reproductions: start -->")
    end = text.index("<!-- reproductions: end -->")
    table = text[start:end]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    ids = [row.split("`")[-2] for row in rows]
    assert ids == list(runner.HEADLINE)
    for row in rows:
        assert any(f"**{v}**" in row for v in common.VERDICTS), row
