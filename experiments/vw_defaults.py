"""Every ``sketchopt-stream`` learner at its defaults against Vowpal Wabbit at its own, as a new
user would run both: the section "defaults" of ``experiments/run.py vw`` (issue 41).

Each stream is a training file and a test file on disk, read by the command line itself
(``sketchopt.stream.cli``, nothing but ``--learner`` chosen, besides the file's ``-b``/``-q``
for VW text files) and by VW (``pyvw``, ``--loss_function logistic`` with the stream's ``-b`` /
``-q``: the default learner, ``--ftrl`` and ``--OjaNewton`` at their defaults, ``m = 10``),
one pass each, in the same order: the benchmark's streams shuffled with a fixed seed, each real
file and stand-in twice, as downloaded (some public files are sorted by label) and shuffled
(:data:`ORDERS`). Streams: the benchmark's generated and bundled ones, as VW text files
(the form VW reads them in; the command line reads the same files), the generated stand-ins of
the public files the issue measured on (:mod:`experiments.vw_standins`: one-hot categories, rare
positives with ``0/1`` labels, features of six orders of scale over ``d = 3.2M``, tf-idf VW
text), and every real file in ``../shared/data/`` or in the folder ``SKETCHOPT_DATA`` names
(:func:`data_files`: LIBSVM/svmlight or VW text, ``.gz``/``.bz2`` too, a training file with its
test file or alone; VW gets an svmlight file as ``label |f index:value ...``, with its labels as
``-1/1``; the command line reads the file itself, so each tool hashes in its own way). Where a
file has no test file the comparison is on the progressive error (each result's ``metric``
names the error compared).

The counterparts' target (issue 62): ``ada_diag``, ``ftrl`` and ``oja_son`` at their defaults
each at most 1 point (or 3 test examples, whichever is larger) worse than VW default, VW
``--ftrl`` and VW ``--OjaNewton`` (:data:`COUNTERPARTS`), on every real file in both orders.
The targets of issue 41: with defaults only, the best second-order learner's test error at
most VW ``--OjaNewton``'s + 0.5 points (or 3 test examples, whichever is larger), the best
first-order learner's at most VW default's + the same margin; ``oja_son``'s examples/s at least
VW ``--OjaNewton``'s (VW's clock counts its parse, ours the compiled pass: both as the main
benchmark times them); on a ``-q`` stream the default learner's examples/s, its crosses built
inside the compiled step, at least VW default's; on the MNIST stream (``passes_stream``) three
passes with VW's holdout lower the test error of one, VW and the command line holding out the
same examples per pass (:func:`passes`). The passes whose speed is a target (``oja_son`` and VW
``--OjaNewton``; on a ``-q`` stream ``ada_diag`` and VW default) run :data:`SPEED_REPEATS` times,
alternating, and report their best examples/s (every run's figure is kept in the JSON): on the
shared 2-core machine one pass's rate moved by up to 2x between runs minutes apart.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
import pathlib
import re
import tempfile
import time

import numpy as np

FIRST_ORDER = ("ada_diag", "nag", "ftrl", "fobos", "rda", "truncated_gradient")
SECOND_ORDER = ("oja_son", "fd_son", "rfd_son", "rp_son", "ada_fd")
DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
SEED = 0
MARGIN_POINTS = 0.005
MARGIN_EXAMPLES = 3
#: Each default learner of the command line's three kinds against its VW counterpart at VW's
#: defaults (issue 62), within max(COUNTERPART_POINTS, MARGIN_EXAMPLES test examples).
COUNTERPARTS = {"ada_diag": "vw_default", "ftrl": "vw_ftrl", "oja_son": "vw_oja_newton"}
COUNTERPART_POINTS = 0.01
#: The orders a real file or stand-in is read in: as downloaded (some public files are sorted
#: by label) and shuffled with :data:`SEED`.
ORDERS = ("as downloaded", "shuffled")
#: How many times a pass whose speed is a target runs (its best examples/s is reported).
SPEED_REPEATS = 3


def data_root() -> pathlib.Path:
    """The folder of real files: ``SKETCHOPT_DATA`` if set, else ``../shared/data/``."""
    return pathlib.Path(os.environ.get("SKETCHOPT_DATA") or DATA)


#: Names that are not data files (documentation, checksums, code, archives, images).
_NOT_DATA = re.compile(
    r"(^readme|^license|^notice|^\.|^(sha\d*|md5|check)sums?\b"
    r"|\.(md|rst|json|py|sh|sha\d*|md5|zip|tar|tgz|png|pdf|html|csv)$)",
    re.I,
)
_COMPRESSED = (".gz", ".bz2")


def _bare(name: str) -> str:
    for ext in _COMPRESSED:
        name = name.removesuffix(ext)
    return name


def _test_names(name: str) -> list[str]:
    """The names a training file's test file may have: a ``train`` word of the name (split at
    ``.``, ``_``, ``-``) as ``test`` (``a.train.svm``, ``rcv1_train.binary``,
    ``agaricus.txt.train``, ``rcv1.train.vw``), or LIBSVM's ``NAME.t`` (``a9a``, ``a9a.t``)."""
    words = re.split(r"([._-])", name)
    names = [
        "".join(words[:i] + [words[i].replace("train", "test")] + words[i + 1 :])
        for i, word in enumerate(words)
        if word.lower() in ("train", "training")
    ]
    return names + [f"{name}.t"]


def data_files(root: pathlib.Path | None = None):
    """``(name, train, test)`` for every real file of ``root`` (default :func:`data_root`):
    each training file with its test file (:func:`_test_names`, compressed or not), and each
    file that is neither a test file nor paired with ``test = None`` (progressive only)."""
    root = data_root() if root is None else root
    if not root.is_dir():
        return []
    files = {
        _bare(p.name): p
        for p in sorted(root.iterdir())
        if p.is_file() and not _NOT_DATA.search(_bare(p.name))
    }
    tests = {t for name in files for t in _test_names(name) if t in files and t != name}
    jobs = []
    for name, path in files.items():
        if name in tests:
            continue
        test = next((files[t] for t in _test_names(name) if t in files and t != name), None)
        jobs.append((_stream_name(name), path, test))
    return jobs


def _stream_name(name: str) -> str:
    """A file's name in the tables: up to a ``train`` word, without a data extension."""
    stem = re.split(r"[._-](?:train|training)(?:[._-]|$)", name, maxsplit=1)[0] or name
    return re.sub(r"\.(txt|svm|svmlight|libsvm|vw|dat|data)$", "", stem, flags=re.I) or stem


def _open_text(path: pathlib.Path):
    name = str(path)
    if name.endswith(".gz"):
        return gzip.open(name, "rt")
    if name.endswith(".bz2"):
        return bz2.open(name, "rt")
    return open(name)


def _labels(lines: list[str]) -> list[float]:
    """The distinct labels of svmlight or VW text lines (unreadable ones left to the command
    line, which names the line)."""
    labels = set()
    for line in lines:
        words = line.split("#", 1)[0].split("|", 1)[0].split()
        try:
            labels.add(float(words[0]))
        except (IndexError, ValueError):
            continue
    return sorted(labels)


def _lines(path: pathlib.Path) -> list[str]:
    with _open_text(path) as f:
        return [line.strip() for line in f if line.strip()]


def _shuffled(lines: list[str], seed: int = SEED) -> list[str]:
    order = np.random.default_rng(seed).permutation(len(lines))
    return [lines[i] for i in order]


def _sign(label: str, classes) -> int:
    """A label as VW's logistic loss wants it, ``-1/1``: ``0/1`` and ``-1/1`` by their sign,
    any other two (``classes``, :func:`~sketchopt.stream.examples.binary_classes`) by order."""
    if classes is not None:
        return 1 if float(label) == classes[1] else -1
    return 1 if float(label) > 0 else -1


def svmlight_to_vw(line: str, classes=None) -> str:
    """``label index:value ...`` as VW's ``label |f index:value ...`` (labels as ``-1/1``,
    :func:`_sign`; ``qid:`` fields and a trailing ``# comment`` dropped)."""
    label, *features = line.split("#", 1)[0].split()
    features = [f for f in features if not f.startswith("qid:")]
    return f"{_sign(label, classes)} |f " + " ".join(features)


def vw_signed(line: str, classes=None) -> str:
    """A VW text line with its label as ``-1/1`` (:func:`_sign`), the rest as it is."""
    head, bar, rest = line.partition("|")
    label, *others = head.split(" ", 1)
    return " ".join([str(_sign(label, classes)), *others]) + bar + rest


def _vw_pass(pyvw, args: str, train: list[str], test: list[str] | None) -> dict:
    """VW over ``train`` (progressive error, examples/s) and, when given, ``test``; a file VW
    refuses is a row with its ``error``, as the command line's are."""
    try:
        return _vw_run(pyvw, args, train, test)
    except Exception as error:  # pyvw raises plain RuntimeErrors for bad input
        return {"error": f"{type(error).__name__}: {error}"}


def _vw_run(pyvw, args: str, train: list[str], test: list[str] | None) -> dict:
    model = pyvw.Workspace(f"{args} --loss_function logistic --quiet")
    try:
        errors = 0
        start = time.perf_counter()
        for line in train:
            ex = model.parse(line)
            model.learn(ex)
            p = ex.get_simplelabel_prediction()
            model.finish_example(ex)
            errors += (p > 0) != (not line.startswith("-"))
        seconds = time.perf_counter() - start
        if test is not None:
            wrong = sum((model.predict(line) > 0) != (not line.startswith("-")) for line in test)
    finally:
        model.finish()
    out = {"progressive_error": errors / len(train), "examples_per_second": len(train) / seconds}
    return out | ({} if test is None else {"test_error": wrong / len(test)})


def _cli_pass(learner: str, train, test, flags: list[str], work: pathlib.Path) -> dict:
    from sketchopt.stream import cli

    out = work / f"{learner}.json"
    tested = [] if test is None else ["--test", str(test)]
    code = cli.main([str(train), *tested, "--learner", learner, "--quiet",
                     "--json", str(out), *flags])  # fmt: skip
    if code != 0:
        return {"error": f"exit code {code}"}
    summary = json.loads(out.read_text())
    keys = ("progressive_error", "test_error", "examples_per_second")
    return {k: summary[k] for k in keys if k in summary}


def _best(runs: list[dict]) -> dict:
    """The run with the most examples/s (the errors are the same in every run: both tools are
    deterministic), with every run's rate beside it."""
    rates = [r.get("examples_per_second") for r in runs]
    if any(rate is None for rate in rates):
        return runs[0]
    best = max(runs, key=lambda r: r["examples_per_second"])
    return {**best, "examples_per_second_runs": rates}


def compare(
    name, train, test, vw_args: str, cli_flags, vw_train, vw_test, pyvw, learners,
    repeats: int = SPEED_REPEATS,
):  # fmt: skip
    """One stream: every learner at its defaults, VW default and ``--OjaNewton``, the verdicts."""
    crossed = "-q" in vw_args.split()
    timed = {"oja_son", "ada_diag"} if crossed else {"oja_son"}
    vw_timed = {"vw_oja_newton", "vw_default"} if crossed else {"vw_oja_newton"}
    vw_runs = {"vw_default": vw_args, "vw_ftrl": f"{vw_args} --ftrl",
               "vw_oja_newton": f"{vw_args} --OjaNewton"}  # fmt: skip
    runs: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="vw-defaults-") as work:
        work = pathlib.Path(work)
        for repeat in range(repeats):  # alternating: both tools see the same hour
            for k in learners:
                if repeat == 0 or k in timed:
                    runs.setdefault(k, []).append(_cli_pass(k, train, test, cli_flags, work))
            for k, args in vw_runs.items() if pyvw is not None else ():
                if repeat == 0 or k in vw_timed:
                    runs.setdefault(k, []).append(_vw_pass(pyvw, args, vw_train, vw_test))
    rows = {k: _best(v) for k, v in runs.items()}
    # the test error, or the progressive one where the file has no test file
    metric = "progressive_error" if vw_test is None else "test_error"
    evaluated = len(vw_train if vw_test is None else vw_test)
    margin = max(MARGIN_POINTS, MARGIN_EXAMPLES / evaluated)

    def best(names):
        scored = [(rows[k][metric], k) for k in names if metric in rows.get(k, {})]
        return min(scored) if scored else (None, None)

    first, second = best(FIRST_ORDER), best(SECOND_ORDER)
    verdict = {"margin": margin, "best_first_order": first[1], "best_second_order": second[1]}
    if pyvw is not None:
        vw, oja = (rows[k].get(metric) for k in ("vw_default", "vw_oja_newton"))
        verdict["first_order_met"] = None not in (first[0], vw) and first[0] <= vw + margin
        verdict["second_order_met"] = None not in (second[0], oja) and second[0] <= oja + margin
        verdict["counterparts"] = _counterparts(rows, metric, evaluated)

        def rate(k):
            return rows.get(k, {}).get("examples_per_second")

        if None not in (rate("oja_son"), rate("vw_oja_newton")):
            verdict["oja_son_speed_ratio"] = rate("oja_son") / rate("vw_oja_newton")
        if crossed and None not in (rate("ada_diag"), rate("vw_default")):
            # the crosses built inside the compiled step (-q on the fly) against VW's own
            verdict["crossed_speed_ratio"] = rate("ada_diag") / rate("vw_default")
    return {"stream": name, "metric": metric, "test_examples": evaluated, "rows": rows,
            "verdict": verdict}  # fmt: skip


def _counterparts(rows: dict, metric: str, evaluated: int) -> dict:
    """Each of :data:`COUNTERPARTS` run here: whether its error is at most its VW
    counterpart's plus max(:data:`COUNTERPART_POINTS`, :data:`MARGIN_EXAMPLES` examples)."""
    margin = max(COUNTERPART_POINTS, MARGIN_EXAMPLES / evaluated)
    out = {}
    for ours, theirs in COUNTERPARTS.items():
        a, b = (rows.get(k, {}).get(metric) for k in (ours, theirs))
        if ours in rows:
            out[ours] = {"vw": theirs, "margin": margin,
                         "met": None not in (a, b) and a <= b + margin}  # fmt: skip
    return out


def _ordered(name: str, lines: list[str], order: str) -> tuple[str, list[str]]:
    """A file's name and training lines in ``order`` (:data:`ORDERS`): shuffled keeps the
    name, as downloaded adds ``" (as downloaded)"``."""
    if order == "shuffled":
        return name, _shuffled(lines)
    return f"{name} ({order})", lines


def stream_files(stream, work: pathlib.Path):
    """A benchmark stream (``experiments.vw.Stream``) as shuffled VW text files; the arguments
    of :func:`compare`. The command line gets the stream's ``-b``/``-q``."""
    train, test = _shuffled(stream.vw_train), stream.vw_test
    (work / f"{stream.name}.train.vw").write_text("\n".join(train) + "\n")
    (work / f"{stream.name}.test.vw").write_text("\n".join(test) + "\n")
    flags = stream.vw_args.split()
    return (stream.name, work / f"{stream.name}.train.vw", work / f"{stream.name}.test.vw",
            stream.vw_args, flags, train, test)  # fmt: skip


def real_files(name, train_path, test_path, work: pathlib.Path, order: str = "shuffled"):
    """A real file (:func:`data_files`; ``test_path`` may be ``None``), LIBSVM or VW text: the
    training lines in ``order`` (:func:`_ordered`, both tools), written uncompressed for the
    command line, and as VW reads them (svmlight as ``label |f ...``, labels ``-1/1`` by the
    training file's classes)."""
    from sketchopt.stream import data
    from sketchopt.stream.examples import binary_classes

    fmt = data.detect_format(str(train_path))
    name, train = _ordered(name, _lines(train_path), order)
    test = _lines(test_path) if test_path is not None else None
    ext = "vw" if fmt == "vw" else "svm"
    path = work / f"{name.replace(' ', '_')}.train.{ext}"
    path.write_text("\n".join(train) + "\n")
    classes = binary_classes(_labels(train), "logistic")
    convert = vw_signed if fmt == "vw" else svmlight_to_vw
    vw_train = [convert(x, classes) for x in train]
    vw_test = None if test is None else [convert(x, classes) for x in test]
    return (name, path, test_path, "-b 18", [], vw_train, vw_test)


def standin_files(
    name, train: list[str], test: list[str], fmt: str, work: pathlib.Path, order="shuffled"
):  # fmt: skip
    """A generated stand-in (:mod:`experiments.vw_standins`) written as files: an svmlight pair
    as :func:`real_files` takes one, a VW text pair as :func:`stream_files` writes one (both
    tools hash its string features, ``-b 18``, the command line's default too)."""
    ext = "svm" if fmt == "svmlight" else "vw"
    paths = [work / f"{name}.{part}.{ext}.in" for part in ("train", "test")]
    for path, lines in zip(paths, (train, test), strict=True):
        path.write_text("\n".join(lines) + "\n")
    if fmt == "svmlight":
        return real_files(name, *paths, work, order)
    name, train = _ordered(name, train, order)
    path = work / f"{name.replace(' ', '_')}.train.vw"
    path.write_text("\n".join(train) + "\n")
    return (name, path, paths[1], "-b 18", [], train, test)


PASSES = 3
PASSES_STREAM = "mnist"


def passes(
    name, train, test, vw_args: str, cli_flags, pyvw, work: pathlib.Path, one: dict | None = None
) -> dict:
    """VW's multi-pass protocol on one stream: the command line's default learner over
    ``PASSES`` passes with VW's holdout (every 10th example of each pass held out) against one
    pass, and VW default over the same file with ``--passes`` (its cache, its holdout): whether
    the passes lower the test error, and whether both tools held out the same number of examples
    per pass (VW counts the examples it trained on; the held-out ones are the rest). ``one``:
    the default learner's one-pass row when :func:`compare` already ran it."""
    if one is None or "test_error" not in one:
        one = _cli_pass("ada_diag", train, test, cli_flags, work)
    out = work / "passes.json"
    from sketchopt.stream import cli

    code = cli.main([str(train), "--test", str(test), "--quiet", "--json", str(out),
                     "--passes", str(PASSES), *cli_flags])  # fmt: skip
    if code != 0:
        return {"error": f"exit code {code}"}
    ours = json.loads(out.read_text())
    examples = ours["examples"] // PASSES + ours["holdout_examples"]  # the file's examples
    row = {
        "passes": PASSES,
        "one_pass_test_error": one["test_error"],
        "test_error": ours["test_error"],
        "holdout_error": ours["holdout_error"],
        "holdout_loss": ours["holdout_loss"],
        "held_out_per_pass": ours["holdout_examples"],
        "improves": ours["test_error"] < one["test_error"],
    }
    if pyvw is not None:
        cache = work / f"{name}.cache"
        model = pyvw.Workspace(
            f"{vw_args} -d {train} --passes {PASSES} -c -k --cache_file {cache} "
            "--loss_function logistic --quiet"
        )
        model.run_parser()
        trained = model.get_weighted_examples() / PASSES
        held = examples - int(round(trained))
        model.finish()
        row |= {"vw_held_out_per_pass": held, "same_holdout": held == ours["holdout_examples"]}
    return row


def run(
    streams: dict, pyvw, learners=FIRST_ORDER + SECOND_ORDER, skip=(), passes_stream=PASSES_STREAM,
    speed_repeats: int = SPEED_REPEATS, standins: list | tuple = (),
) -> list[dict]:  # fmt: skip
    """The comparison on every benchmark stream (but ``skip``), every generated stand-in of the
    public files (``standins``: :func:`experiments.vw_standins.standins`) and every real file
    (:func:`data_files`); on ``passes_stream`` also the multi-pass protocol (:func:`passes`).
    ``speed_repeats``: how many times the passes whose speed is a target run (the quick run:
    once)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="vw-defaults-files-") as work:
        work = pathlib.Path(work)
        jobs = [stream_files(s, work) for k, s in streams.items() if k not in skip]
        jobs += [standin_files(*standin, work, order) for standin in standins for order in ORDERS]
        jobs += [real_files(*found, work, order) for found in data_files() for order in ORDERS]
        for job in jobs:
            result = compare(*job, pyvw, learners, speed_repeats)
            if job[0] == passes_stream:
                name, train, test, vw_args, flags, *_ = job
                one = result["rows"].get("ada_diag")
                result["passes"] = passes(name, train, test, vw_args, flags, pyvw, work, one)
            results.append(result)
    return results


def table(results: list[dict]) -> str:
    """The markdown table: each stream's test errors (%) at the defaults, the best of each kind
    against its VW reference, and the verdicts."""
    from experiments import common

    names = [k for k in (*FIRST_ORDER, *SECOND_ORDER) if any(k in r["rows"] for r in results)]
    header = ["stream", "VW default", "VW --ftrl", "VW --OjaNewton", *names, "first-order",
              "second-order", "counterparts (1 point)"]  # fmt: skip
    body = []
    for r in results:
        rows, v = r["rows"], r["verdict"]
        metric = r.get("metric", "test_error")

        def cell(k, rows=rows, metric=metric):
            row = rows.get(k, {})
            return f"{100 * row[metric]:.2f}" if metric in row else "-"

        met = {True: "met", False: "**not met**", None: "-"}
        progressive = " (progressive)" if r.get("metric") == "progressive_error" else ""
        body.append([
            r["stream"] + progressive, cell("vw_default"), cell("vw_ftrl"), cell("vw_oja_newton"),
            *map(cell, names),
            f"{v['best_first_order']} ({met[v.get('first_order_met')]})",
            f"{v['best_second_order']} ({met[v.get('second_order_met')]})",
            ", ".join(f"{k} {met[c['met']]}" for k, c in v.get("counterparts", {}).items()) or "-",
        ])  # fmt: skip
    return common.markdown_table(header, body) + _speed_lines(results)


def _speed_lines(results: list[dict]) -> str:
    """The speed targets: ``oja_son`` against VW ``--OjaNewton``; on ``-q`` streams the command
    line's default learner (its crosses built in the compiled step) against VW default."""
    lines = []
    for r in results:
        rows, v = r["rows"], r["verdict"]
        for key, ours, theirs in (
            ("oja_son_speed_ratio", "oja_son", "vw_oja_newton"),
            ("crossed_speed_ratio", "ada_diag", "vw_default"),
        ):
            if key in v:
                lines.append(
                    f"- {r['stream']}: `{ours}` {rows[ours]['examples_per_second']:,.0f} "
                    f"examples/s, {theirs} {rows[theirs]['examples_per_second']:,.0f} "
                    f"({v[key]:.2f}x, target 1x: {'met' if v[key] >= 1 else '**not met**'})"
                )
    text = "\n\nExamples/s (the pass alone):\n\n" + "\n".join(lines) if lines else ""
    for r in results:
        p = r.get("passes")
        if not p or "test_error" not in p:
            continue
        verdict = "improves" if p["improves"] else "**does not improve**"
        text += (
            f"\n\n{r['stream']}, {p['passes']} passes with VW's holdout: test error "
            f"{100 * p['test_error']:.2f} % against {100 * p['one_pass_test_error']:.2f} % after "
            f"one ({verdict}); {p['held_out_per_pass']} examples held out per pass"
        )
        if "same_holdout" in p:
            same = "the same" if p["same_holdout"] else "**not the same**"
            text += f", VW {p['vw_held_out_per_pass']} ({same})"
    return text
