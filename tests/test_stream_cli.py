"""``python -m sketchopt.stream``: the JSON contract, test predictions, bit-identical resume and
its errors."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse
from sklearn.datasets import dump_svmlight_file

from sketchopt.stream import cli, data, learners, runner


@pytest.fixture(autouse=True)
def _never_the_users_cache(tmp_path_factory, monkeypatch):
    """The command line's compilation cache in these tests: the suite's (``conftest.py``'s JAX
    cache) or, without one, a folder of the test run; never the user's own."""
    import jax

    if not (os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir):
        monkeypatch.setenv(cli.CACHE_ENV, str(tmp_path_factory.getbasetemp() / "jax-cache"))


def write_stream(path, n, seed, dim=300, nnz=8):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), nnz)
    cols = rng.integers(0, dim, n * nnz)
    x = scipy.sparse.csr_matrix((rng.normal(size=n * nnz), (rows, cols)), shape=(n, dim))
    x.sum_duplicates()
    teacher = np.random.default_rng(99).normal(size=dim)  # one teacher for every file
    y = np.where(x @ teacher > 0, 1, 0)  # {0, 1}: mapped to {-1, +1}
    dump_svmlight_file(x, y, str(path), zero_based=True)
    return x, y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    write_stream(root / "a.svm", 700, 0)
    write_stream(root / "b.svm", 500, 1)
    write_stream(root / "test.svm", 200, 2)
    whole = (root / "a.svm").read_bytes() + (root / "b.svm").read_bytes()
    (root / "ab.svm").write_bytes(whole)
    return root


def run_cli(*args):
    return cli.main([str(a) for a in args] + ["--quiet"])


def test_json_contract_and_the_runner_agree(files):
    out = files / "ftrl.json"
    flags = ["--learner", "ftrl", "--learning-rate", "0.2", "--l1", "0.1", "--json", out]
    flags += ["--noconstant"]  # (the runner below learns without VW's constant feature)
    code = run_cli(
        files / "a.svm", *flags, "--test", files / "test.svm", "--predict", files / "p.txt"
    )
    assert code == 0
    summary = json.loads(out.read_text())
    for key in ("examples", "progressive_loss", "progressive_error", "test_error",
                "examples_per_second"):  # fmt: skip
        assert key in summary, key
    assert summary["examples"] == 700 and summary["examples_per_second"] > 0
    assert 0 <= summary["test_error"] < 0.5 and 0 <= summary["progressive_error"] < 0.5
    assert len(np.loadtxt(files / "p.txt")) == 200
    examples, dim = data.load_svmlight(files / "a.svm")
    learner = learners.ftrl(0.2, 1.0, 0.1, 0.0)
    result = runner.run_stream(learner, runner.chunked(examples, 4096, dim), dim)
    assert summary["progressive_loss"] == pytest.approx(float(result.progressive_loss), rel=1e-6)


@pytest.mark.parametrize("layout", ["auto", "flat"])
def test_resume_continues_bit_identically(files, layout):
    import orbax.checkpoint as ocp

    # a rate given: ada_diag's default is set by the file a run starts on (the resumed half
    # keeps the first file's, a run over both files would take both files')
    flags = ["--learner", "ada_diag", "--learning-rate", "0.5", "--l1", "0.01", "--chunk-size",
             "256", "--layout", layout]  # fmt: skip
    first, second, whole = (files / f"{name}-{layout}" for name in ("first", "second", "whole"))
    assert run_cli(files / "a.svm", *flags, "--save", first) == 0
    resume = ["--resume", first, "--chunk-size", "256", "--save", second]
    assert run_cli(files / "b.svm", *resume, "--json", files / "second.json") == 0
    assert run_cli(files / "ab.svm", *flags, "--save", whole, "--json", files / "w.json") == 0
    resumed = json.loads((files / "second.json").read_text())
    at_once = json.loads((files / "w.json").read_text())
    assert resumed["examples"] == at_once["examples"] == 1200
    assert resumed["layout"] == at_once["layout"] == ("padded" if layout == "auto" else "flat")
    assert resumed["progressive_loss"] == at_once["progressive_loss"]
    assert resumed["progressive_error"] == at_once["progressive_error"]
    with ocp.StandardCheckpointer() as checkpointer:
        a = checkpointer.restore((second / "state").resolve())
        b = checkpointer.restore((whole / "state").resolve())
    for x, y in zip(a["state"]["table"], b["state"]["table"], strict=True):
        assert x.dtype == y.dtype and np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_errors_are_clear(files, capsys, tmp_path):
    assert run_cli(files / "a.svm", "--learner", "oja_son", "--l1", "0.1") == 2
    assert "do not apply to oja_son" in capsys.readouterr().err
    assert run_cli(files / "a.svm", "--learner", "fd_son", "--alpha", "0", "--bound", "1") == 2
    assert "bound" in capsys.readouterr().err
    assert run_cli(files / "a.svm", "--learner", "ada_fd", "--alpha", "2") == 2
    assert "--alpha do(es) not apply to ada_fd" in capsys.readouterr().err
    assert run_cli(files / "a.svm", "--learner", "rp_son", "--robust") == 2
    assert "--robust do(es) not apply to rp_son" in capsys.readouterr().err
    assert run_cli(files / "a.svm", "--learner", "fobos", "--l2", "0.1") == 2
    assert "--l2 applies to ftrl only" in capsys.readouterr().err
    bad = tmp_path / "bad.svm"
    bad.write_text("2 1:0.5\n1 3:1.0\n-1 2:1\n")  # three labels (two would be the classes)
    assert run_cli(bad) == 2
    assert "labels" in capsys.readouterr().err
    assert run_cli(files / "a.svm", "--save", tmp_path / "ck") == 0
    assert run_cli(files / "b.svm", "--resume", tmp_path / "ck", "--learner", "ftrl") == 2
    assert "differs from the checkpoint" in capsys.readouterr().err


def test_module_entry_point_answers_help():
    out = subprocess.run(
        [sys.executable, "-m", "sketchopt.stream", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for flag in ("--learner", "--loss", "--bits", "--sketch-size", "--learning-rate", "--alpha",
                 "--delta", "--l1", "--l2", "--test", "--predict", "--save", "--resume",
                 "--json"):  # fmt: skip
        assert flag in out.stdout, flag
    # the usage line names the program as it was called
    python = pathlib.Path(sys.executable).name
    assert out.stdout.startswith(f"usage: {python} -m sketchopt.stream "), out.stdout[:80]


def test_console_script_names_itself_in_its_usage():
    script = pathlib.Path(sys.executable).with_name("sketchopt-stream")
    if not script.exists():
        pytest.skip("the console script is not installed next to this interpreter")
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: sketchopt-stream "), out.stdout
    out = subprocess.run([str(script), "--learner", "nope"], capture_output=True, text=True)
    assert out.returncode == 2 and "sketchopt-stream: error: argument --learner" in out.stderr
    assert cli.build_parser("sketchopt-stream").format_usage().startswith("usage: sketchopt-st")


# cli.py loaded on its own, with JAX, optax and the package's modules made unimportable: --help
# and argparse's errors must answer without them.
_NO_JAX_PROBE = """
import importlib.abc, importlib.util, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "optax", "numpy", "sketchopt", "orbax"):
            raise ImportError(f"imported {name}")
sys.meta_path.insert(0, Refuse())
spec = importlib.util.spec_from_file_location("cli_probe", sys.argv[1])
cli = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cli)
for argv, status in ((["--help"], 0), (["--learner", "nope"], 2), (["a.svm", "--bits"], 2)):
    try:
        cli.main(argv)
    except SystemExit as exit:
        assert exit.code == status, (argv, exit.code)
    else:
        raise AssertionError(argv)
assert not [m for m in sys.modules if m.split(".")[0] in ("jax", "numpy")], "imported"
print("parsed without jax")
"""


def test_help_and_argument_errors_import_no_jax():
    """The parser is built and parses before any import of JAX (``--help`` at once)."""
    path = pathlib.Path(cli.__file__)
    out = subprocess.run(
        [sys.executable, "-c", _NO_JAX_PROBE, str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0 and "parsed without jax" in out.stdout, out.stderr[-2000:]
    assert "usage: sketchopt-stream" in out.stdout  # main(argv) from Python: the script's name


def test_the_parsers_names_are_the_learners_and_losses():
    """The parser's choices and the defaults its help quotes, written out in cli.py so that
    building it imports no JAX module, are the modules' own."""
    from sketchopt.stream import second_order

    parser = cli.build_parser()
    actions = {a.dest: a for a in parser._actions}
    assert list(actions["learner"].choices) == list(learners.LEARNERS) + list(
        learners.SECOND_ORDER_NAMES
    )
    assert list(actions["loss"].choices) == sorted(learners.LOSSES)
    text = parser.format_help().replace("\n", " ")
    assert f"{second_order.NORMALIZED_ALPHA:g} in rescaled" in text
    assert f"{second_order.ALPHA_SCALE:g} x the running mean" in " ".join(text.split())
    assert f"{second_order.DELTA_SCALE:g} x the root" in " ".join(text.split())


def test_bits_hashes_a_wider_stream_into_two_to_the_b(files):
    out = files / "bits.json"
    assert run_cli(files / "a.svm", "--bits", "6", "--learner", "rda", "--json", out) == 0
    summary = json.loads(out.read_text())
    assert summary["dim"] == 64 and summary["examples"] == 700
    assert run_cli(files / "a.svm", "--bits", "10", "--json", out) == 0
    assert json.loads(out.read_text())["dim"] == 1024  # wider than the data: no hashing needed


def test_the_test_file_is_read_with_the_training_files_index_base(tmp_path):
    """A zero-based training file, a test file without an index 0: its indices are not shifted
    (a separate "auto" would read it as one-based)."""
    train, test = tmp_path / "train.svm", tmp_path / "test.svm"
    train.write_text("1 0:1 2:1\n-1 1:1\n1 0:1\n-1 1:1 2:-1\n" * 20)
    test.write_text("1 2:1\n-1 1:1\n")
    out = tmp_path / "s.json"
    assert run_cli(train, "--test", test, "--predict", tmp_path / "p.txt", "--json", out) == 0
    predictions = np.loadtxt(tmp_path / "p.txt")
    assert predictions[0] > 0 > predictions[1]  # feature 2 positive, feature 1 negative
    assert json.loads(out.read_text())["test_error"] == 0.0


def test_vw_text_passes_holdout_and_aliases(tmp_path):
    """A VW text file (auto-detected, ``-q`` crosses, importance weights, tags, ``0/1`` labels)
    over three passes with VW's holdout; ``-f``/``-i`` save and resume; a ``-1/+1`` test file,
    also scored alone with ``-t -i`` (VW's test-only run, also as ``-d``, with ``--link``)."""
    rng = np.random.default_rng(7)
    lines = []
    for i in range(300):
        a, b = rng.integers(0, 6, 2)
        y = int((a + b) % 2 == 0)  # needs the cross of the two namespaces
        weight = " 2" if i % 7 == 0 else ""
        lines.append(f"{y}{weight} 'ex{i}|a f{a} |b g{b}:1\n")
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_text("".join(lines))
    test.write_text("".join(("-1" if ln_[0] == "0" else "1") + ln_[1:] for ln_ in lines[:60]))
    out, model = tmp_path / "s.json", tmp_path / "model"
    flags = ["-q", "ab", "-b", "10", "--test", test, "--json", out]
    assert run_cli(train, *flags, "--passes", "3", "-f", model) == 0
    summary = json.loads(out.read_text())
    assert summary["format"] == "vw" and summary["constant"] and summary["dim"] == 1024
    assert summary["holdout_examples"] == 30 and summary["examples"] == 3 * 270
    assert summary["test_error"] == 0.0 and summary["holdout_error"] == 0.0
    assert run_cli(train, *flags, "--holdout_off") == 0
    assert "holdout_error" not in json.loads(out.read_text())
    predictions = tmp_path / "p.txt"
    assert run_cli(train, *flags, "-f", model, "-p", predictions) == 0
    assert predictions.read_text().split("\n")[0].endswith(" ex0")  # VW's "score tag"
    tested = json.loads(out.read_text())
    scores = np.loadtxt(predictions, usecols=0)
    # VW's -t -i: the test file scored with the saved weights (the crosses on the fly), as --test
    assert run_cli(test, "-t", "-i", model, "-p", predictions, "--json", out) == 0
    alone = json.loads(out.read_text())
    assert alone["test_examples"] == 60 and "progressive_error" not in alone
    assert (alone["test_error"], alone["test_loss"]) == (tested["test_error"], tested["test_loss"])
    np.testing.assert_array_equal(np.loadtxt(predictions, usecols=0), scores)
    assert run_cli(test, "-t", "-i", model, "--test", test) == 2  # nothing to learn from
    # VW's spelling of the same: -d, -c -k accepted, --link logistic for probabilities
    probabilities = tmp_path / "prob.txt"
    args = ["-t", "-i", model, "-p", probabilities, "--link", "logistic", "-c", "-k"]
    assert run_cli("-d", test, *args) == 0
    np.testing.assert_allclose(
        np.loadtxt(probabilities, usecols=0), 1 / (1 + np.exp(-scores)), rtol=1e-6
    )
    assert run_cli("--json", out) == 2  # no training file at all
    assert run_cli(train, "-i", model, "--json", out) == 0  # one more pass from the model
    assert json.loads(out.read_text())["examples"] == 300 + 300
    assert run_cli(train, "--noconstant", "--json", out) == 0  # no -q: the cross is missing
    assert json.loads(out.read_text())["progressive_error"] > 0.3


def test_real_test_file_with_unseen_features(capsys):
    """sofia-ml's demo pair (``../shared/data``): its test file has 32,883 feature ids the
    training file never had; they are ignored."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (root / "sofia_demo.train.svm").exists():
        pytest.skip("../shared/data is absent")
    code = cli.main([str(root / "sofia_demo.train.svm"), "--test",
                     str(root / "sofia_demo.test.svm"), "--learner", "fd_son"])  # fmt: skip
    assert code == 0
    report = capsys.readouterr().out
    assert "test: 1000 examples" in report


def test_second_order_defaults_are_recorded_and_can_be_turned_off(files):
    """``fd_son`` and ``rp_son`` rescale by default in VW's form (its --OjaNewton constants),
    ``rfd_son`` does not; the JSON records what ran, by the form's name, and
    ``--no-diagonal-rescaling`` gives the running-scale ridge back."""
    out = files / "son.json"
    runs = {
        "fd_son": [],
        "rp_son": [],
        "rfd_son": [],
        "fd_son_plain": ["--no-diagonal-rescaling"],
    }
    summaries = {}
    for key, extra in runs.items():
        name = key.removesuffix("_plain")
        assert run_cli(files / "a.svm", "--learner", name, "--json", out, *extra) == 0
        summaries[key] = json.loads(out.read_text())
    assert summaries["fd_son"]["hyperparameters"]["diagonal_rescaling"] == "fed"
    assert summaries["rp_son"]["hyperparameters"]["diagonal_rescaling"] == "fed"
    assert summaries["rfd_son"]["hyperparameters"]["diagonal_rescaling"] is False
    assert summaries["fd_son_plain"]["hyperparameters"]["diagonal_rescaling"] is False
    assert summaries["fd_son"]["progressive_loss"] != summaries["fd_son_plain"]["progressive_loss"]
    assert run_cli(files / "a.svm", "--learner", "ada_fd", "--no-diagonal-rescaling") == 2


def test_oja_son_at_defaults_fits_its_sketch_to_a_small_dimension(tmp_path, capsys):
    """Oja's ``m`` orthonormal directions need ``m <= d``: on a file of fewer features than the
    default ``m = 10`` (a LIBSVM file of 5, with Windows line ends and the constant: ``d = 6``)
    ``oja_son`` at its defaults runs with ``m = d``; an explicit ``--sketch-size`` above ``d``
    stays an error that names it, and the other learners keep the default."""
    train = tmp_path / "small.svm"
    pairs = [sorted((i % 5 + 1, (i + 2) % 5 + 1)) for i in range(40)]
    lines = [f"{(-1) ** i:+d} {a}:{0.5 + i % 3} {b}:1\r\n" for i, (a, b) in enumerate(pairs)]
    train.write_text("".join(lines), newline="")
    out = tmp_path / "small.json"
    assert run_cli(train, "--learner", "oja_son", "--json", out) == 0
    summary = json.loads(out.read_text())
    assert summary["dim"] == 5 and summary["examples"] == 40
    assert summary["hyperparameters"]["sketch_size"] == 6
    assert run_cli(train, "--learner", "fd_son", "--json", out) == 0
    assert json.loads(out.read_text())["hyperparameters"]["sketch_size"] == 10
    capsys.readouterr()
    assert run_cli(train, "--learner", "oja_son", "--sketch-size", "7") == 2
    assert "sketch_size <= dim, got 7 > 6" in capsys.readouterr().err


def test_a_file_of_labels_one_and_two_learns_and_tests(tmp_path, capsys):
    """A LIBSVM ``1/2`` training file (mushrooms' convention): 2 is the positive class, the JSON
    says so, a test file of one class is read with the training file's pair (also when a run
    resumes), and a test file with a third label is refused by name."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(200):
        label = int(rng.integers(1, 3))
        lines.append(f"{label} 1:{rng.random() + 2 * (label - 1.5):.4f} 2:{rng.random():.4f}\n")
    train, test = tmp_path / "train.svm", tmp_path / "test.svm"
    train.write_text("".join(lines))
    test.write_text("".join(line for line in lines[:50] if line.startswith("2 ")))
    out = tmp_path / "out.json"
    args = ["--learner", "oja_son", "--test", test, "--json", out]
    assert run_cli(train, *args, "--save", tmp_path / "ck") == 0
    summary = json.loads(out.read_text())
    assert summary["classes"] == [1.0, 2.0]
    assert summary["progressive_error"] < 0.2 and summary["test_error"] < 0.2
    assert run_cli(train, *args, "--resume", tmp_path / "ck") == 0
    assert json.loads(out.read_text())["classes"] == [1.0, 2.0]
    test.write_text("3 1:1\n")
    capsys.readouterr()
    assert run_cli(train, "--test", test) == 2
    assert "labels must be the classes 1 (-1) and 2 (+1); found [3.0]" in capsys.readouterr().err


def _strict_json(text):
    """``text`` parsed as strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` refused."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
def test_the_json_is_strict_null_for_non_finite_figures(tmp_path):
    """A loss that overflows (squared loss of a label 1e20 in float32) and an infinite
    ``--bound``: ``null`` in ``--json`` and in the checkpoint's config, never ``NaN`` or
    ``Infinity``; the resumed run reads them back (the bound infinite again)."""
    train = tmp_path / "inf.svm"
    train.write_text("1e20 1:1\n-1 2:1\n1 1:1\n1 2:1\n")
    out, model = tmp_path / "s.json", tmp_path / "model"
    assert run_cli(train, "--loss", "squared", "--json", out, "--save", model) == 0
    summary = _strict_json(out.read_text())
    assert summary["progressive_loss"] is None and summary["curve"][0]["average_loss"] is None
    assert summary["examples"] == 4 and summary["progressive_error"] is not None
    config = _strict_json((model / "config.json").read_text())
    assert config["curve"][0]["loss_sum"] is None
    assert run_cli(train, "-i", model, "--json", out) == 0  # resumes from the null figures
    assert _strict_json(out.read_text())["examples"] == 8
    son, son_model = ["--learner", "fd_son", "--json", out], tmp_path / "son"
    assert run_cli(tmp_path / "inf.svm", *son, "--loss", "squared", "--save", son_model) == 0
    assert _strict_json(out.read_text())["hyperparameters"]["bound"] is None  # none: infinite
    assert _strict_json((son_model / "config.json").read_text())["hyperparameters"]["bound"] is None
    assert run_cli(train, "-i", son_model, "--json", out) == 0
    assert _strict_json(out.read_text())["hyperparameters"]["bound"] is None


def test_an_empty_file_is_an_error_that_names_it(tmp_path, capsys, files):
    empty = tmp_path / "empty.svm"
    empty.write_text("")
    out = tmp_path / "s.json"
    assert run_cli(empty, "--json", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{empty}: no examples" in err and "nan" not in err
    assert not out.exists()
    empty.write_text("# a comment, no example\n\n")
    assert run_cli(files / "a.svm", "--test", empty) == 2
    assert f"{empty}: no examples" in capsys.readouterr().err


def test_label_errors_name_every_label(tmp_path, capsys):
    """A binary run on a file of labels 0, 1 and 2 names all three, not only those outside
    {-1, +1}."""
    three = tmp_path / "three.svm"
    three.write_text("0 1:1\n1 2:1\n2 1:1\n1 1:1\n")
    assert run_cli(three) == 2
    err = capsys.readouterr().err
    assert "found [0.0, 2.0] among the labels [0.0, 1.0, 2.0]" in err and str(three) in err
    many = tmp_path / "many.svm"
    many.write_text("".join(f"{k} 1:1\n" for k in range(30)))
    assert run_cli(many, "--loss", "hinge") == 2
    err = capsys.readouterr().err
    assert "among the labels [0.0, 1.0, 2.0," in err and "...] (30 distinct)" in err


def test_missing_files_and_model_directories_are_named(tmp_path, capsys, files):
    """No ``[Errno 2]``, no ``config.json`` the user never named: one line saying what is
    missing."""
    missing = tmp_path / "nope.svm"
    cases = [
        ([missing], f"no such training file: {missing}"),
        ([files / "a.svm", "--test", missing], f"no such --test file: {missing}"),
        ([files / "a.svm", "-t", "-i", tmp_path / "nomodel"], "-t/--testonly: no model directory"),
        ([files / "a.svm", "-i", tmp_path / "nomodel"], "no model directory"),
        ([files / "a.svm", "-i", tmp_path], "is not a --save directory (-i/--resume)"),
        ([files / "a.svm", "--json", tmp_path / "no" / "s.json"], "no directory"),
    ]
    for args, message in cases:
        assert run_cli(*args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (args, err)
        assert "Errno" not in err and len(err.strip().splitlines()) == 1, err


def test_ada_diags_default_rate_is_vws_normalized_one(tmp_path):
    """Without ``--learning-rate``, ``ada_diag`` takes ``0.5 / sqrt(N)``, ``N`` the training
    file's mean normalized squared norm, the constant included (VW default's rate in ADA-DIAG's
    units), written into the run's configuration so that a resume keeps it; a given rate is
    kept as given."""
    path = tmp_path / "b.svm"
    path.write_text("1 1:1 3:1\n-1 2:1\n1 1:1 2:1 3:1\n" * 4)  # mean non-zeros 2
    out = tmp_path / "s.json"
    assert cli.main([str(path), "--quiet", "--json", str(out)]) == 0
    hyper = json.loads(out.read_text())["hyperparameters"]
    assert hyper["learning_rate"] == pytest.approx(0.5 / np.sqrt(2 + 1))
    assert cli.main([str(path), "--quiet", "--noconstant", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["hyperparameters"]["learning_rate"] == pytest.approx(
        0.5 / np.sqrt(2)
    )
    assert cli.main([str(path), "--quiet", "-l", "0.3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["hyperparameters"]["learning_rate"] == 0.3
