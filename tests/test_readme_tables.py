"""``experiments/readme_tables.py``: the README's headline tables come from the results' JSON,
each block between its markers, with the run's provenance; a table without its JSON stays."""

from __future__ import annotations

import json
import pathlib

import pytest

from experiments import readme_tables

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
PROVENANCE = {"date": "2026-11-27", "sketchopt": "9.9.9", "jax": "0", "machine": "2-core CPU"}


def _write(folder: pathlib.Path, name: str, payload: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps({**payload, "provenance": PROVENANCE}))


@pytest.fixture
def results(tmp_path):
    speed = [
        {"method": m, "d": 1000, "sketch_size": 10, "dtype": "float32", "seconds": s,
         "ratio_to_adagrad": s / 1e-3}
        for m, s in (("optax.adagrad", 1e-3), ("ada_fd", 5e-3), ("fd_son", 7e-3))
    ]  # fmt: skip
    _write(tmp_path, "speed", {"size": "default", "rows": speed})
    stream = [
        {"tool": "vw", "learner": "vw_default", "progressive_error": 0.2, "test_error": 0.1,
         "examples_per_second": 5e4},
        {"tool": "sketchopt", "learner": "ftrl", "progressive_error": 0.3, "test_error": 0.05,
         "examples_per_second": 1e4},
        {"tool": "sketchopt", "learner": "nag", "progressive_error": 0.1, "test_error": 0.2,
         "examples_per_second": 2e4},
    ]  # fmt: skip
    defaults = [{
        "stream": "mnist",
        "rows": {"vw_default": {"test_error": 0.159}, "vw_oja_newton": {"test_error": 0.151},
                 "ada_diag": {"test_error": 0.151}, "fd_son": {"test_error": 0.15},
                 "oja_son": {"test_error": 0.17}},
        "verdict": {"best_first_order": "ada_diag", "best_second_order": "fd_son",
                    "oja_son_speed_ratio": 1.104,
                    "counterparts": {"ada_diag": {"vw": "vw_default", "met": True},
                                     "oja_son": {"vw": "vw_oja_newton", "met": False},
                                     "ftrl": {"vw": "vw_ftrl", "met": True}}},
    }]  # fmt: skip
    _write(tmp_path, "vw", {"size": "default", "vw": {"version": "1.0"}, "streams": {"x": stream},
                            "defaults": defaults})  # fmt: skip
    claim = {"id": "regret/close_to_full", "source": "Ada-FD Fig. 1; x", "claim": "a | b",
             "paper": "p", "ours": "o", "reason": "r", "verdict": "holds"}  # fmt: skip
    _write(tmp_path, "regret", {"size": "default", "claims": [claim]})
    return tmp_path


def test_readme_has_every_block():
    text = README.read_text()
    for name in readme_tables.TABLES:
        assert f"<!-- {name}: start -->" in text and f"<!-- {name}: end -->" in text


def test_tables_come_from_the_json(results):
    tables = readme_tables.generate(results)
    assert set(tables) == {"reproductions", "speed", "streams"}  # no networks.json
    assert "sketchopt 9.9.9, 2026-11-27, 2-core CPU" in tables["speed"]
    assert "| 5.0 ms (5.0x) |  |  | 7.0 ms (7.0x) |  |" in tables["speed"]
    # the best of ours by test error, VW's default beside it
    assert "| x | 20.00 / 10.00 %, 50.0k/s |  | ftrl 30.00 / 5.00 %, 10.0k/s |" in tables["streams"]
    # the defaults section first: the best of each kind at the defaults, each counterpart
    # beside VW's (a missed margin in bold, one without both errors left out), oja_son's speed
    assert (
        "| MNIST subset | 15.90 | 15.10 | ada_diag 15.10 | fd_son 15.00 | ada_diag 15.10 / 15.90, "
        "**oja_son 17.00 / 15.10** | 1.10x |" in (tables["streams"])
    )
    assert (
        "| a \\| b (Ada-FD Fig. 1) | **holds** | `regret/close_to_full` |"
        in (tables["reproductions"])
    )


def test_rewrite_replaces_only_the_blocks_it_has(results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text())
    before = readme.read_text()
    assert readme_tables.main(["--results", str(results), "--readme", str(readme), "--check"]) == 1
    assert readme_tables.main(["--results", str(results), "--readme", str(readme)]) == 0
    after = readme.read_text()
    networks = before[before.index("<!-- networks: start -->") :]
    assert networks == after[after.index("<!-- networks: start -->") :]  # left as it was
    assert "sketchopt 9.9.9" in after
    assert readme_tables.main(["--results", str(results), "--readme", str(readme), "--check"]) == 0


def test_aot_table_has_a_column_per_case(tmp_path):
    """The TPU count's table: a column per case (a training step's among them), the ratio over
    the peer where a learner has a row, blank where not, and the guarded floor's row."""

    def row(gb, **extra):
        return {"bytes_accessed": gb * 1e9, "fusions": 2, "while_loops": 0,
                "compile_seconds": 1.0, **extra}  # fmt: skip

    def ours(gb, peer_gb):
        return row(gb, peer="optax.adagrad", bytes_over_peer=gb / peer_gb, compile_over_peer=2.0)

    peers = {"optax.adagrad": row(1.0), "guarded adagrad": row(2.0)}
    cases = {
        "d=1e+06": {**peers, "ada_diag": ours(2.0, 1.0), "ada_fd": ours(40.0, 1.0)},
        "2-layer tree": {**peers, "ada_diag": ours(1.5, 1.0)},
        "2-layer training step": {**peers, "ada_diag": ours(1.7, 1.0)},
    }
    aot = {"topology": "v5e:2x2", "libtpu": "0", "cases": cases, "provenance": PROVENANCE}
    (tmp_path / "aot.json").write_text(json.dumps({"aot": aot}))
    lines = readme_tables.aot(tmp_path).splitlines()
    assert "| 2-layer tree | 2-layer training step |" in lines[4]
    by_name = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert by_name["| `ada_diag` / `optax.adagrad`"].startswith(
        "| `ada_diag` / `optax.adagrad` | 2.00x | 1.50x | 1.70x | 2 / 2 | 0 |"
    )
    assert "| 40.00x |  |  |  |  |" in by_name["| `ada_fd` / `optax.adagrad`"]
    floor = next(line for line in lines if line.startswith("| guarded floor"))
    assert floor.endswith("| 2.00x | 2.00x | 2.00x |  |  |  |")
