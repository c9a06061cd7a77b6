"""Where each learner starts (issue 62): one source, ``experiments.defaults``'
``RECOMMENDED_LEARNING_RATES``, and the places that state it.

* the README's "Choosing a learner" table (right after its example) and the table of
  ``docs/guides/choosing.md`` give every learner they name the mapping's argument and value, and
  the guide names every learner of the mapping;
* the first lines of each factory's docstring give the same ``argument=value``;
* on the recorded defaults sweep's digits MLP (the newest ``docs/benchmarks/recorded/
  defaults_DATE.json``, run at the factories' current defaults) each starting rate's final loss is
  within the sweep's band (10%) of the learner's own best over the grid, without diverging;
* the guide's table of numbers is that JSON's, and the README shows that sweep's plot.

Fast: Markdown, docstrings and one JSON file; nothing is trained.
"""

from __future__ import annotations

import inspect
import json
import math
import pathlib
import re

import pytest

import sketchopt
from experiments import defaults

REPO = pathlib.Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GUIDE = REPO / "docs" / "guides" / "choosing.md"
RECORDED_DIR = REPO / "docs" / "benchmarks" / "recorded"
RECOMMENDED = defaults.RECOMMENDED_LEARNING_RATES


def _recorded() -> pathlib.Path:
    runs = sorted(
        p for p in RECORDED_DIR.glob("defaults_*.json") if re.fullmatch(r"defaults_[\d-]+", p.stem)
    )
    assert runs, "no recorded defaults sweep"
    return runs[-1]


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def _table(section: str, *columns: str) -> list[dict[str, str]]:
    """The rows (header -> cell) of the first table of ``section`` with these columns."""
    lines = section.splitlines() + [""]
    for i, line in enumerate(lines):
        header = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and set(columns) <= set(header):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                assert len(cells) == len(header), row
                rows.append(dict(zip(header, cells, strict=True)))
            return rows
    raise AssertionError(f"no table with columns {columns}")


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _learners(cell: str) -> list[str]:
    names = [s.removeprefix("sketchopt.") for s in _spans(cell)]
    return [n for n in names if n in RECOMMENDED]


def _arguments(cell: str) -> dict[str, float]:
    pairs = (re.fullmatch(r"(\w+)=([-+.e\d]+)", s) for s in _spans(cell))
    return {m.group(1): float(m.group(2)) for m in pairs if m}


def _table_rows(page: pathlib.Path) -> list[dict[str, str]]:
    heading = "Choosing a learner" if page == README else "The table"
    return _table(_section(page.read_text(), heading), "learner", "start at")


def test_the_readme_section_follows_the_example():
    headings = re.findall(r"^## (.+)$", README.read_text(), re.M)
    assert headings[headings.index("Example") + 1] == "Choosing a learner"


@pytest.mark.parametrize("page", [README, GUIDE], ids=["README", "guide"])
def test_a_table_gives_each_learner_its_recommended_rate(page):
    shown = set()
    for row in _table_rows(page):
        learners, given = _learners(row["learner"]), _arguments(row["start at"])
        if not learners:  # the command line's row: its learners keep their own defaults
            assert "sketchopt-stream" in row["learner"] and not given, row
            continue
        for name in learners:
            argument, value = defaults.recommended_argument(name)
            assert given == {argument: value}, (page.name, name, row["start at"])
        shown |= set(learners)
    if page == GUIDE:
        assert shown == set(RECOMMENDED)
    else:
        assert {"ada_fd", "ada_diag", "fd_son", "kron_fd"} <= shown


@pytest.mark.parametrize("name", sorted(RECOMMENDED))
def test_a_docstring_gives_the_rate_in_its_first_lines(name):
    argument, value = defaults.recommended_argument(name)
    paragraphs = inspect.getdoc(getattr(sketchopt, name)).split("\n\n")
    first = " ".join(" ".join(paragraphs[:2]).split())
    assert f"``{argument}={value:g}``" in first, (name, first)


def _mlp(payload: dict, name: str) -> tuple[float, float, str | None]:
    """``(final loss at the recommended rate, best final loss over the grid, divergence)``."""
    summary = payload["algorithms"][name]["models"]["mlp"]
    i = defaults.grid_index(RECOMMENDED[name], payload["config"]["rates"])
    finals = [math.inf if f is None else f for f in summary["final_train_loss"]]
    return finals[i], min(finals), summary["diverged"][i]


def _same_defaults(recorded: dict, current: dict) -> bool:
    """The sweep ran at today's defaults (an argument added since must be ``None``: off)."""
    current = json.loads(json.dumps(current))  # tuples as JSON lists
    return all(recorded[k] == v if k in recorded else v is None for k, v in current.items())


@pytest.mark.parametrize("name", sorted(RECOMMENDED))
def test_the_recommended_rate_is_within_the_band_on_the_recorded_mlp(name):
    payload = json.loads(_recorded().read_text())
    entry = payload["algorithms"][name]
    factory = getattr(sketchopt, name)
    assert _same_defaults(entry["defaults"], defaults._defaults(factory)), (
        f"{name}'s defaults changed since {_recorded().name}: sweep again "
        "(experiments/run.py defaults) before trusting its recommended rate"
    )
    at, best, diverged = _mlp(payload, name)
    assert diverged is None and at <= (1 + payload["config"]["band"]) * best, (name, at, best)


def _ratio(payload: dict, name: str, model: str) -> float:
    summary = payload["algorithms"][name]["models"][model]
    i = defaults.grid_index(RECOMMENDED[name], payload["config"]["rates"])
    finals = [math.inf if f is None else f for f in summary["final_train_loss"]]
    return finals[i] / min(finals)


def _number(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group())


def test_the_guides_numbers_are_the_recorded_sweeps():
    path = _recorded()
    text = GUIDE.read_text()
    assert f"(../benchmarks/recorded/{path.name})" in text
    assert f"(../benchmarks/recorded/{path.stem}.png)" in text
    payload = json.loads(path.read_text())
    rows = _table(_section(text, "The numbers"), "learner", "start at", "ratio")
    assert sorted(n for row in rows for n in _learners(row["learner"])) == sorted(RECOMMENDED)
    for row in rows:
        (name,) = _learners(row["learner"])
        at, best, _ = _mlp(payload, name)
        i = defaults.grid_index(RECOMMENDED[name], payload["config"]["rates"])
        accuracy = payload["algorithms"][name]["models"]["mlp"]["test_accuracy"][i]
        shown = [_number(row[k]) for k in row if k not in ("learner", "start at")]
        want = [at, best, at / best, 100 * accuracy]
        want += [_ratio(payload, name, "cnn"), _ratio(payload, name, "transformer")]
        assert shown == pytest.approx(want, rel=6e-3, abs=6e-3), (name, shown, want)


def test_the_readme_shows_the_sweeps_plot():
    plot = f"docs/benchmarks/recorded/{_recorded().stem}.png"
    assert (REPO / plot).is_file()
    assert re.search(
        rf"!\[[^\]]+\]\({re.escape(plot)}\)", _section(README.read_text(), "Choosing a learner")
    )
