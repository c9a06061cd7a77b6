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


def test_all_runs_the_reproductions_and_bench_the_benchmarks(tmp_path, monkeypatch, capsys):
    """``all`` (``make run``) is every registered experiment but the benchmarks, ``bench``
    (``make bench``) the benchmarks; a command of several shows where it is, ``[i/n]``."""
    assert runner.BENCHMARKS == ("speed", "vw", "networks", "defaults", "time_to_target")
    assert set(runner.IN_ALL) == set(runner.EXPERIMENTS) - set(runner.BENCHMARKS)
    assert runner.GROUPS == {"all": runner.IN_ALL, "bench": runner.BENCHMARKS}
    # the headline claims all come from registered experiments (speed's from the benchmark)
    assert {claim.split("/")[0] for claim in runner.HEADLINE} <= set(runner.EXPERIMENTS)
    makefile = (REPO / "Makefile").read_text()
    for target, group in (("run", "all"), ("bench", "bench")):
        recipe = makefile.split(f"\n{target}:")[1].split("\n\n")[0]
        assert f"experiments/run.py {group} --out results" in recipe, target

    monkeypatch.setattr(runner, "load", lambda name: None)  # nothing runs: every one is missing
    assert runner.main(["bench", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    n = len(runner.BENCHMARKS)
    for i, name in enumerate(runner.BENCHMARKS):
        assert f"[{i + 1}/{n}] skipping {name!r}" in out


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


def test_learner_factory_passes_the_papers_settings(monkeypatch):
    """Every transform the experiments build goes through ``common.transform``: plain Ada-FD is
    ``robust=False`` whatever the library's default, and a setting a paper fixes is never left
    to a default."""
    import sketchopt as so

    calls = []
    monkeypatch.setattr(so, "ada_fd", lambda **kw: calls.append(kw) or "tx")
    grid = {"eta": [0.1], "delta": [1.0]}
    alg = common.learner(
        "ada_fd", "ADA-FD", grid, learning_rate=common.hp("eta"), delta=common.hp("delta"),
        sketch_size=5,
    )  # fmt: skip
    assert alg.make({"eta": 0.1, "delta": 1.0}, None) == "tx" and not alg.random
    assert calls == [{"robust": False, "learning_rate": 0.1, "delta": 1.0, "sketch_size": 5}]
    with pytest.raises(TypeError, match="sketch_size"):
        common.transform("ada_fd", learning_rate=0.1, delta=1.0)
    with pytest.raises(TypeError, match="curvature"):
        common.transform("fd_son", alpha=1.0, sketch_size=5, eta=0.0)
    # the PRNG key reaches a randomized learner; SON sec. 5's learners project and record
    alg = common.sec5_learner("oja_son", "Oja-SON", name="oja_son/m=5", rescaled=True,
                              sketch_size=5, key=common.KEY)  # fmt: skip
    assert alg.random and alg.project is not None and alg.name == "oja_son/m=5+rescaled"
    assert alg.static == {"curvature": 1 / 8, "eta": 0.0, "bound": 1.0, "sketch_size": 5,
                          "diagonal_rescaling": True}  # fmt: skip


def test_claim_builder():
    rows = common.Claims("son_real", source="SON sec. 5.2")
    row = rows.add("x", [True, False], claim="c", paper="p", ours="o", rule="r")
    assert row == {"id": "son_real/x", "source": "SON sec. 5.2", "claim": "c", "paper": "p",
                   "ours": "o", "reason": "rule: r", "verdict": "holds partly"}  # fmt: skip
    assert rows == [row]
    assert common.tally(True) == "holds" and common.tally(False) == "does not hold"
    assert common.tally([True, True, False], holds="majority") == "holds"
    assert common.tally([True, False, False, False], holds="majority", partly="quarter") == (
        "holds partly"
    )
    assert common.tally([], partly="majority") == "does not hold"  # no setting: no verdict
    assert common.tally([False, False], partly=True) == "holds partly"
    assert list(common.beats([1.0, 2.0], [2.0, 2.05], 0.1)) == [True, False]
    assert common.pct([0.123, 0.2]) == "12.3/20.0"


def test_readme_reproductions_table_is_the_headline_table():
    """The README's "Reproductions" table has one row per headline claim (``run.HEADLINE``, the
    table ``make run`` writes at the top of ``summary.md``), each with a verdict."""
    text = (REPO / "README.md").read_text()
    start = text.index("<!-- reproductions: start -->")
    end = text.index("<!-- reproductions: end -->")
    table = text[start:end]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    ids = [row.split("`")[-2] for row in rows]
    # generated from a `make run` (the reproductions) or also from `make bench` (speed's claim)
    in_run = [i for i in runner.HEADLINE if i.split("/")[0] in runner.IN_ALL]
    assert ids in (list(runner.HEADLINE), in_run)
    for row in rows:
        assert any(f"**{v}**" in row for v in common.VERDICTS), row


def test_the_benchmarks_write_strict_json():
    """Every JSON file an experiment or benchmark writes is strict (``null`` for a non-finite
    figure, never ``NaN`` or ``Infinity``): written by ``common.save_json`` or with
    ``allow_nan=False``, never by a bare ``json.dumps`` into a file."""
    import re

    loose = []
    for path in sorted((REPO / "experiments").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"write_text\(json\.dumps\(", line) and "allow_nan=False" not in line:
                loose.append(f"{path.name}:{number}: {line.strip()}")
    assert not loose, loose
    assert common.to_jsonable({"a": float("nan"), "b": [float("inf"), 1.0]}) == {
        "a": None, "b": [None, 1.0]
    }  # fmt: skip
