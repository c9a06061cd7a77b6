"""``sketchopt-stream`` as Vowpal Wabbit users type it: ``-P``, ``-p`` on a training run,
``--readable_model``, ``--invert_hash``, ``--binary``, ``--random_seed``, VW's flags refused with
their equivalents, ``-b`` over 64-bit indices, ``load_model`` and the compilation cache. The
outputs are checked against VW's own (the ``vowpalwabbit`` package, ``.[bench]``) where VW
defines them."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from sketchopt.stream import cli, data, vw_outputs

pyvw = pytest.importorskip("vowpalwabbit.pyvw")


@pytest.fixture(autouse=True)
def _never_the_users_cache(tmp_path_factory, monkeypatch):
    """The command line's compilation cache in these tests: the suite's (``conftest.py``'s JAX
    cache) or, without one, a folder of the test run; never the user's own."""
    import jax

    if not (os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir):
        monkeypatch.setenv(cli.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "jax-cache"))


def _vw_file(path: pathlib.Path, n: int = 60, seed: int = 0) -> pathlib.Path:
    """VW text with ``-1/1`` labels, importance weights, tags, two namespaces and the default
    one (distinct feature names, no explicit zeros: at ``-b 18`` no two collide)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        a, b = rng.integers(0, 5, 2)
        label = 1 if (a + b) % 2 else -1
        weight = f" {1 + i % 3}" if i % 4 == 0 else ""
        value = round(float(rng.uniform(0.5, 2)), 3)
        lines.append(f"{label}{weight} 'e{i}|a f{a}:{value} g |b h{b} | d{i % 7}\n")
    path.write_text("".join(lines))
    return path


def _vw(args: str) -> None:
    vw = pyvw.Workspace(f"{args} --loss_function logistic")
    vw.finish()


def _progress(text: str) -> list[str]:
    """The progress lines (VW's header and the numeric lines below it) of ``text``."""
    lines = text.splitlines()
    start = lines.index(vw_outputs.PROGRESS_HEADER.splitlines()[0])
    body = [ln for ln in lines[start + 2 :] if re.match(r"^-?\d+\.\d+ ", ln)]
    return lines[start : start + 2] + body


@pytest.mark.parametrize("spec", ["3", "2.0", "1.5"])
def test_progress_lines_are_vws(tmp_path, capfd, spec):
    """VW's header, columns and schedule (additive for an integer, multiplicative for a float,
    over importance-weighted examples): every line at the same example counter, weight, label
    and feature count as VW's, and the first line (both learners start at zero weights:
    log 2 and a prediction of 0) identical to VW's to the character."""
    train = _vw_file(tmp_path / "train.vw")
    capfd.readouterr()
    _vw(f"-d {train} -P {spec} -q ab")
    vw_lines = _progress(capfd.readouterr().err)
    assert cli.main([str(train), "-P", spec, "-q", "ab"]) == 0
    ours = _progress(capfd.readouterr().err)
    assert ours[:2] == vw_lines[:2] == vw_outputs.PROGRESS_HEADER.splitlines()
    assert len(ours) == len(vw_lines) > 4
    if vw_lines[2].split()[2] == "1":  # at the first example: both predict 0, lose log 2
        assert ours[2] == vw_lines[2]
    for mine, theirs in zip(ours[2:], vw_lines[2:], strict=True):
        # counter, weight, label, features: VW's; the losses and predictions are the learner's
        assert [mine.split()[i] for i in (2, 3, 4, 6)] == [theirs.split()[i] for i in (2, 3, 4, 6)]
        assert len(mine) == len(theirs)  # VW's column widths


def test_progressive_predictions_are_vws_and_the_runs_loss(tmp_path):
    """``-p`` (``--predictions``) on a training run: one progressive prediction per example and
    its tag, as VW writes (the first 0, both learners starting at zero weights); their logistic
    loss is
    the run's progressive loss; over three passes every pass's; ``--binary`` writes signs as
    VW's ``--binary`` does."""
    train = _vw_file(tmp_path / "train.vw")
    vw_p, ours, out = tmp_path / "vw.txt", tmp_path / "p.txt", tmp_path / "s.json"
    _vw(f"-d {train} -p {vw_p} --quiet")
    assert cli.main([str(train), "--predictions", str(ours), "--json", str(out), "--quiet"]) == 0
    lines, vw_lines = ours.read_text().splitlines(), vw_p.read_text().splitlines()
    assert [ln.split()[1] for ln in lines] == [ln.split()[1] for ln in vw_lines]  # the tags
    scores = np.asarray([float(ln.split()[0]) for ln in lines])
    assert scores.shape == (60,) and scores[0] == float(vw_lines[0].split()[0]) == 0
    labels = np.asarray([float(ln.split()[0]) for ln in train.read_text().splitlines()])
    summary = json.loads(out.read_text())
    loss = np.mean(np.logaddexp(0.0, -labels * scores))
    assert loss == pytest.approx(summary["progressive_loss"], rel=1e-6)
    signs, vw_signs = tmp_path / "b.txt", tmp_path / "vwb.txt"
    _vw(f"-d {train} -p {vw_signs} --binary --quiet")
    three = ["--passes", "3", "--holdout_off"]  # (VW's holdout would change the first pass)
    assert cli.main([str(train), "-p", str(signs), "--binary", "--quiet", *three]) == 0
    signs_read = np.asarray([float(ln.split()[0]) for ln in signs.read_text().splitlines()])
    assert signs_read.shape == (180,) and set(np.unique(signs_read)) <= {-1.0, 1.0}
    first = float(vw_signs.read_text().split()[0])
    assert signs_read[0] == first == -1  # a score of 0 is -1, as VW's
    np.testing.assert_array_equal(signs_read[:60], np.where(scores > 0, 1, -1))


def _text_model(path: pathlib.Path) -> tuple[list[str], list[str]]:
    """A readable model's header (the keys of its lines) and its weight lines."""
    lines = path.read_text().splitlines()
    cut = lines.index(":0")
    keys = [re.sub(r"[: ].*", "", ln) or ln for ln in lines[: cut + 1]]
    return keys, lines[cut + 1 :]


def test_readable_model_and_invert_hash_are_vws(tmp_path):
    """VW's header lines and ``:0``, ``index:weight`` lines in index order, and
    ``--invert_hash`` naming exactly the features VW names (``namespace^feature``, bare names in
    the default namespace, ``a^x*b^y`` crosses, ``Constant``); the weights are
    ``load_model``'s, which predict ``-t``'s scores."""
    train = _vw_file(tmp_path / "train.vw")
    vw_model, vw_names = tmp_path / "vw_model.txt", tmp_path / "vw_names.txt"
    _vw(f"-d {train} -q ab --readable_model {vw_model} --invert_hash {vw_names} "
        "--predict_only_model --quiet")  # fmt: skip
    model, names, saved = tmp_path / "model.txt", tmp_path / "names.txt", tmp_path / "saved"
    args = [train, "-q", "ab", "--readable_model", model, "--invert_hash", names, "-f", saved]
    assert cli.main([str(a) for a in [*args, "--quiet", "--save_resume"]]) == 0
    assert _text_model(model)[0] == _text_model(vw_model)[0] == _text_model(vw_names)[0]
    assert _text_model(names)[0] == _text_model(vw_model)[0]
    ours = [ln.rsplit(":", 2) for ln in _text_model(names)[1]]
    theirs = [ln.rsplit(":", 2) for ln in _text_model(vw_names)[1]]
    assert {n for n, _, _ in ours} == {n for n, _, _ in theirs}
    assert "a^f1*b^h2" in {n for n, _, _ in ours} and "d3" in {n for n, _, _ in ours}
    plain = [ln.split(":") for ln in _text_model(model)[1]]
    indices = [int(i) for i, _ in plain]
    assert indices == sorted(indices) == [int(i) for _, i, _ in ours]
    loaded = cli.load_model(saved)
    np.testing.assert_allclose([float(w) for _, w in plain], loaded.weights[indices], rtol=1e-5)
    assert np.count_nonzero(loaded.weights) == len(plain)
    assert loaded.config["learner"] == "ada_diag" and loaded.config["quadratic"] == ["ab"]
    # the -t run reads the same weights: its scores are theirs
    scores = tmp_path / "scores.txt"
    again = tmp_path / "again.txt"
    assert cli.main([str(train), "-t", "-i", str(saved), "-p", str(scores),
                     "--readable_model", str(again), "--quiet"]) == 0  # fmt: skip
    assert again.read_text() == model.read_text()
    examples, dim = data.read_vw(train, bits=18, quadratic=["ab"], constant=True)
    assert dim == loaded.weights.shape[0]
    padded = np.append(loaded.weights, 0.0)  # (a padding entry's index may be dim)
    expected = (np.asarray(examples.values) * padded[np.asarray(examples.indices)]).sum(1)
    scored = [float(ln.split()[0]) for ln in scores.read_text().splitlines()]
    np.testing.assert_allclose(scored, expected, rtol=1e-5, atol=1e-6)


def test_load_model_errors_and_export(tmp_path):
    import sketchopt.stream

    assert sketchopt.stream.load_model is cli.load_model
    with pytest.raises(FileNotFoundError, match="no model directory"):
        cli.load_model(tmp_path / "nope")
    with pytest.raises(ValueError, match="is not a model directory"):
        cli.load_model(tmp_path)


def test_bits_hashes_indices_above_two_to_the_31(tmp_path, capsys):
    """A LIBSVM file of 64-bit feature ids: without ``-b`` refused with the fix, with ``-b``
    hashed into ``2**b`` (``--invert_hash`` names them by the file's ids); the indices below
    ``2**31`` hash as before, the wide ones by all their bits; a bad line is still named."""
    wide = [2**31, 2**31 + 1, 2**32, 2**40, 9_000_000_000]
    train = tmp_path / "wide.svm"
    lines = [f"{1 if i % 2 else -1} 3:1 {wide[i % 5]}:0.5\n" for i in range(40)]
    train.write_text("".join(lines))
    assert cli.main([str(train), "--quiet"]) == 2
    assert "above 2**31 - 1: hash the features" in capsys.readouterr().err
    out, names = tmp_path / "s.json", tmp_path / "names.txt"
    assert cli.main([str(train), "-b", "12", "--json", str(out), "--invert_hash", str(names),
                     "--quiet"]) == 0  # fmt: skip
    summary = json.loads(out.read_text())
    assert summary["dim"] == 4096 and summary["examples"] == 40
    named = {ln.split(":")[0] for ln in names.read_text().splitlines()[11:]}
    assert {str(w) for w in wide} | {"3", "Constant"} >= named >= {"3", "Constant"}
    hashed = data.hash_any(np.asarray([5, 77, *wide]), 20)
    np.testing.assert_array_equal(hashed[:2], data.hash_indices(np.asarray([5, 77]), 20))
    assert len(set(hashed[2:].tolist())) == len(wide)
    examples, dim = data.load_svmlight(train, bits=12)
    assert dim == 4096 and examples.indices.max() < 4096
    train.write_text("1 3:1 9000000000:1 5:1\n")  # not increasing
    with pytest.raises(ValueError, match=r"line 1: .*sorted and unique"):
        data.scan_svmlight(train)


def test_vw_flags_accepted_or_refused_with_the_equivalent(tmp_path, capsys):
    train = _vw_file(tmp_path / "train.vw", n=20)
    refused = [
        (["--OjaNewton"], "--learner oja_son"),
        (["--ftrl"], "--learner ftrl"),
        (["--power_t", "1"], "0.5 only"),
        (["--initial_t", "3"], "0 only"),
        (["--l2", "0.1"], "--learner ftrl --l2"),
        (["--binary", "--link", "logistic"], "--binary"),
        (["-P", "often"], "-P/--progress 'often' is not a number"),
    ]
    for flags, message in refused:
        assert cli.main([str(train), *flags, "--quiet"]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (flags, err)
    out = tmp_path / "s.json"
    summaries = []
    for flags in (["--random_seed", "3"], ["--seed", "3"], ["--seed", "0"]):
        base = [str(train), "--learner", "rp_son", "-b", "8", "--json", str(out), "--quiet"]
        assert cli.main([*base, "--power_t", "0.5", "--initial_t", "0", *flags]) == 0
        summaries.append(json.loads(out.read_text()))
    assert summaries[0]["progressive_loss"] == summaries[1]["progressive_loss"]
    assert summaries[0]["progressive_loss"] != summaries[2]["progressive_loss"]
    help_text = "".join(cli.build_parser().format_help().split())  # (argparse's line breaks)
    for flag, vw in cli.VW_ONLY.items():
        assert "".join(f"VW's {flag}: {vw.meaning}".split()) in help_text


def test_the_compilation_cache_is_the_command_lines_only(tmp_path, monkeypatch):
    """``main`` keeps every program in its cache folder (``--no-cache``: none) and puts JAX's
    settings back; importing the package switches nothing on; the folder follows
    ``$XDG_CACHE_HOME``."""
    import jax

    train = _vw_file(tmp_path / "train.vw", n=10)
    before = jax.config.jax_compilation_cache_dir
    folder = tmp_path / "jax-cache"
    monkeypatch.setenv(cli.CACHE_ENV, str(folder))
    assert cli.main([str(train), "--quiet"]) == 0
    assert any(p.name.startswith("jit_") for p in folder.iterdir())
    assert jax.config.jax_compilation_cache_dir == before
    (tmp_path / "off").mkdir()  # where the programs would go without --no-cache
    monkeypatch.setenv(cli.CACHE_ENV, str(tmp_path / "off"))
    assert cli.main([str(train), "--quiet", "--no-cache"]) == 0
    assert not list((tmp_path / "off").iterdir())
    monkeypatch.delenv(cli.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.cache_folder() == tmp_path / "xdg" / "sketchopt" / "jax"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    probe = "import sketchopt.stream.cli, jax; print(jax.config.jax_compilation_cache_dir)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr[-1000:]
