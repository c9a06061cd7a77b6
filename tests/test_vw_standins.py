"""The generated stand-ins of the public files (``experiments/vw_standins.py``): each has the
property it stands in for, and the command line reads its files as the benchmark writes them
(the benchmarks' tier, ``make test-benchmarks``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from experiment_support import REPO  # noqa: F401  (puts the repository on sys.path)

from experiments import vw_defaults, vw_standins

pytestmark = pytest.mark.benchmark


def _labels(lines):
    return np.array([float(line.split()[0]) for line in lines])


def test_each_standin_has_its_property():
    rows = {name: make(600, 300, seed=1) for name, make in vw_standins.STANDINS.items()}
    train, test, fmt = rows["rare_positive"]
    assert fmt == "svmlight" and set(_labels(train)) == {0.0, 1.0}  # 0/1 train, -1/+1 test
    assert set(_labels(test)) == {-1.0, 1.0} and np.mean(_labels(test) > 0) < 0.1
    assert list(_labels(train)) == sorted(_labels(train))  # sorted by label, as some files are
    train, _, _ = rows["wide_scale"]
    values = [float(f.split(":")[1]) for line in train for f in line.split()[1:]]
    indices = [int(f.split(":")[0]) for line in train for f in line.split()[1:]]
    real = [v for v in values if v != 1.0]
    assert max(real) / min(real) > 1e6 and max(indices) > 2**20
    train, _, fmt = rows["tfidf_vw"]
    assert fmt == "vw" and all("|w t" in line for line in train)
    train, _, _ = rows["onehot"]
    assert {len(line.split()) for line in train} == {15}  # a label and 14 one-hot fields
    assert vw_standins.standins("quick") == []


def test_the_command_line_reads_every_standin(tmp_path):
    from sketchopt.stream import cli

    for name, make in vw_standins.STANDINS.items():
        job = vw_defaults.standin_files(name, *make(200, 100, seed=2), tmp_path)
        _, train, test, *_ = job
        out = tmp_path / f"{name}.json"
        args = [str(train), "--test", str(test), "--learner", "oja_son", "--quiet"]
        assert cli.main([*args, "--json", str(out)]) == 0, name
        summary = json.loads(out.read_text())
        assert summary["test_examples"] == 100 and summary["skipped"] == 0, name


def test_real_files_are_found_in_their_usual_names(tmp_path, monkeypatch):
    """The benchmark takes every real file of the data folder (``SKETCHOPT_DATA``): LIBSVM's
    ``NAME``/``NAME.t``, ``train``/``test`` words anywhere in the name, compressed files, a file
    alone (progressive only); documentation and checksums are not data. VW gets each file's
    labels as ``-1/1``: ``1/2`` by their order, ``0/1`` by their sign, VW text lines kept."""
    names = ["README.md", "SHA256SUMS", "sha256sums.txt", "NOTICE", "x.sha1", "a9a", "a9a.t",
             "mushrooms", "rcv1_train.binary", "rcv1_test.binary", "agaricus.txt.train",
             "agaricus.txt.test", "x.train.vw.gz", "x.test.vw.gz", ".hidden"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_text("")
    monkeypatch.setenv("SKETCHOPT_DATA", str(tmp_path))
    found = {name: (train.name, test and test.name) for name, train, test in
             vw_defaults.data_files()}  # fmt: skip
    assert found == {
        "a9a": ("a9a", "a9a.t"),
        "agaricus": ("agaricus.txt.train", "agaricus.txt.test"),
        "mushrooms": ("mushrooms", None),
        "rcv1": ("rcv1_train.binary", "rcv1_test.binary"),
        "x": ("x.train.vw.gz", "x.test.vw.gz"),
    }
    (tmp_path / "mushrooms").write_text("2 1:1 3:1\n1 2:1 # comment\n2 qid:4 3:1\n")
    job = vw_defaults.real_files("mushrooms", tmp_path / "mushrooms", None, tmp_path)
    assert job[2] is None and job[6] is None
    assert sorted(job[5]) == ["-1 |f 2:1", "1 |f 1:1 3:1", "1 |f 3:1"]
    (tmp_path / "v.vw").write_text("0 2.0 'a|f x y:2\n1 |f z\n")
    job = vw_defaults.real_files("v", tmp_path / "v.vw", None, tmp_path)
    assert job[1].name == "v.train.vw" and sorted(job[5]) == ["-1 2.0 'a|f x y:2", "1 |f z"]
