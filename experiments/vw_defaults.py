"""Every ``sketchopt-stream`` learner at its defaults against Vowpal Wabbit at its own, as a new
user would run both: the section "defaults" of ``experiments/run.py vw`` (issue 41).

Each stream is a training file and a test file on disk, read by the command line itself
(``sketchopt.stream.cli``, nothing but ``--learner`` chosen, besides the file's ``-b``/``-q``
for VW text files) and by VW (``pyvw``, ``--loss_function logistic`` with the stream's ``-b`` /
``-q``: the default learner, and ``--OjaNewton`` at its defaults, ``m = 10``), one pass each,
in the same order: the training lines are shuffled with a fixed seed first (some public files
are sorted by label). Streams: the benchmark's generated and bundled ones, as VW text files
(the form VW reads them in; the command line reads the same files), the generated stand-ins of
the public files the issue measured on (:mod:`experiments.vw_standins`: one-hot categories, rare
positives with ``0/1`` labels, features of six orders of scale over ``d = 3.2M``, tf-idf VW
text), and every LIBSVM pair in ``../shared/data/`` (VW gets an svmlight file as ``label |f
index:value ...``; the command line reads the svmlight file, so each tool hashes in its own
way).

The targets (the issue's): with defaults only, the best second-order learner's test error at
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

import json
import pathlib
import tempfile
import time

import numpy as np

FIRST_ORDER = ("ada_diag", "nag", "ftrl", "fobos", "rda", "truncated_gradient")
SECOND_ORDER = ("oja_son", "fd_son", "rfd_son", "rp_son", "ada_fd")
DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
SEED = 0
MARGIN_POINTS = 0.005
MARGIN_EXAMPLES = 3
#: How many times a pass whose speed is a target runs (its best examples/s is reported).
SPEED_REPEATS = 3


def real_pairs(root: pathlib.Path = DATA) -> list[tuple[str, pathlib.Path, pathlib.Path]]:
    """``(name, train, test)`` of every ``NAME.train.svm`` with its ``NAME.test.svm``."""
    if not root.is_dir():
        return []
    pairs = []
    for train in sorted(root.glob("*.train.svm")):
        name = train.name.removesuffix(".train.svm")
        test = root / f"{name}.test.svm"
        if test.exists():
            pairs.append((name, train, test))
    return pairs


def _lines(path: pathlib.Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _shuffled(lines: list[str], seed: int = SEED) -> list[str]:
    order = np.random.default_rng(seed).permutation(len(lines))
    return [lines[i] for i in order]


def svmlight_to_vw(line: str) -> str:
    """``label index:value ...`` as VW's ``label |f index:value ...`` (labels ``0/1`` as
    ``-1/1``, which VW's logistic loss wants)."""
    label, *features = line.split()
    y = 1 if float(label) > 0 else -1
    return f"{y} |f " + " ".join(features)


def _vw_pass(pyvw, args: str, train: list[str], test: list[str]) -> dict:
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
        wrong = sum((model.predict(line) > 0) != (not line.startswith("-")) for line in test)
    finally:
        model.finish()
    return {
        "progressive_error": errors / len(train),
        "test_error": wrong / len(test),
        "examples_per_second": len(train) / seconds,
    }


def _cli_pass(learner: str, train, test, flags: list[str], work: pathlib.Path) -> dict:
    from sketchopt.stream import cli

    out = work / f"{learner}.json"
    code = cli.main([str(train), "--test", str(test), "--learner", learner, "--quiet",
                     "--json", str(out), *flags])  # fmt: skip
    if code != 0:
        return {"error": f"exit code {code}"}
    summary = json.loads(out.read_text())
    keys = ("progressive_error", "test_error", "examples_per_second")
    return {k: summary[k] for k in keys}


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
    vw_runs = {"vw_default": vw_args, "vw_oja_newton": f"{vw_args} --OjaNewton"}
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
    margin = max(MARGIN_POINTS, MARGIN_EXAMPLES / len(vw_test))

    def best(names):
        scored = [(rows[k]["test_error"], k) for k in names if "test_error" in rows.get(k, {})]
        return min(scored) if scored else (None, None)

    first, second = best(FIRST_ORDER), best(SECOND_ORDER)
    verdict = {"margin": margin, "best_first_order": first[1], "best_second_order": second[1]}
    if pyvw is not None:
        vw, oja = rows["vw_default"]["test_error"], rows["vw_oja_newton"]["test_error"]
        verdict["first_order_met"] = first[0] is not None and first[0] <= vw + margin
        verdict["second_order_met"] = second[0] is not None and second[0] <= oja + margin
        if "examples_per_second" in rows.get("oja_son", {}):
            verdict["oja_son_speed_ratio"] = (
                rows["oja_son"]["examples_per_second"]
                / rows["vw_oja_newton"]["examples_per_second"]
            )
        if crossed and "examples_per_second" in rows.get("ada_diag", {}):
            # the crosses built inside the compiled step (-q on the fly) against VW's own
            verdict["crossed_speed_ratio"] = (
                rows["ada_diag"]["examples_per_second"] / rows["vw_default"]["examples_per_second"]
            )
    return {"stream": name, "test_examples": len(vw_test), "rows": rows, "verdict": verdict}


def stream_files(stream, work: pathlib.Path):
    """A benchmark stream (``experiments.vw.Stream``) as shuffled VW text files; the arguments
    of :func:`compare`. The command line gets the stream's ``-b``/``-q``."""
    train, test = _shuffled(stream.vw_train), stream.vw_test
    (work / f"{stream.name}.train.vw").write_text("\n".join(train) + "\n")
    (work / f"{stream.name}.test.vw").write_text("\n".join(test) + "\n")
    flags = stream.vw_args.split()
    return (stream.name, work / f"{stream.name}.train.vw", work / f"{stream.name}.test.vw",
            stream.vw_args, flags, train, test)  # fmt: skip


def real_files(name, train_path, test_path, work: pathlib.Path):
    """A LIBSVM pair of ``../shared/data/``: the training lines shuffled (both tools)."""
    train, test = _shuffled(_lines(train_path)), _lines(test_path)
    (work / f"{name}.train.svm").write_text("\n".join(train) + "\n")
    vw_train, vw_test = [svmlight_to_vw(x) for x in train], [svmlight_to_vw(x) for x in test]
    return (name, work / f"{name}.train.svm", test_path, "-b 18", [], vw_train, vw_test)


def standin_files(name, train: list[str], test: list[str], fmt: str, work: pathlib.Path):
    """A generated stand-in (:mod:`experiments.vw_standins`) written as files: an svmlight pair
    as :func:`real_files` takes one, a VW text pair as :func:`stream_files` writes one (both
    tools hash its string features, ``-b 18``, the command line's default too)."""
    ext = "svm" if fmt == "svmlight" else "vw"
    paths = [work / f"{name}.{part}.{ext}.in" for part in ("train", "test")]
    for path, lines in zip(paths, (train, test), strict=True):
        path.write_text("\n".join(lines) + "\n")
    if fmt == "svmlight":
        return real_files(name, *paths, work)
    train = _shuffled(train)
    (work / f"{name}.train.vw").write_text("\n".join(train) + "\n")
    return (name, work / f"{name}.train.vw", paths[1], "-b 18", [], train, test)


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
    public files (``standins``: :func:`experiments.vw_standins.standins`) and every real pair;
    on ``passes_stream`` also the multi-pass protocol (:func:`passes`). ``speed_repeats``: how
    many times the passes whose speed is a target run (the quick run: once)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="vw-defaults-files-") as work:
        work = pathlib.Path(work)
        jobs = [stream_files(s, work) for k, s in streams.items() if k not in skip]
        jobs += [standin_files(*standin, work) for standin in standins]
        jobs += [real_files(*pair, work) for pair in real_pairs()]
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
    header = ["stream", "VW default", "VW --OjaNewton", *names, "first-order", "second-order"]
    body = []
    for r in results:
        rows, v = r["rows"], r["verdict"]

        def cell(k, rows=rows):
            row = rows.get(k, {})
            return f"{100 * row['test_error']:.2f}" if "test_error" in row else "-"

        met = {True: "met", False: "**not met**", None: "-"}
        body.append([
            r["stream"], cell("vw_default"), cell("vw_oja_newton"), *map(cell, names),
            f"{v['best_first_order']} ({met[v.get('first_order_met')]})",
            f"{v['best_second_order']} ({met[v.get('second_order_met')]})",
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
