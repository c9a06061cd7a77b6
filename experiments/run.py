"""Run the experiments: ``python experiments/run.py NAME [--quick|--full] [--out DIR]``.

``NAME`` is one or more of the registered experiments, ``all`` (the papers' reproductions:
``make run``) or ``bench`` (the library's own benchmarks: ``make bench``):

==================  ================================================================  =========
name                what                                                              in
==================  ================================================================  =========
``regret``          Ada-FD paper sec. 4.1 / Fig. 1: online regression regret          ``all``
``sketch_error``    RFD paper sec. 6.1 / Fig. 1-2: covariance sketch error            ``all``
``son_condition``   SON paper sec. 5.1 / Fig. 1: error versus condition number        ``all``
``classification``  Ada-FD sec. 4.2 / Fig. 2-3, RFD paper sec. 6.2: online mistakes   ``all``
``son_online``      RFD paper sec. 6.2 / Fig. 5-11: SON online error vs sketch size   ``all``
``cnn``             Ada-FD paper sec. 4.3: CNN training                               ``all``
``sparse_drift``    float32 drift of the sparse second-order learners' ``F Z``        ``all``
``son_real``        SON paper sec. 5.2 / Fig. 3: real data, sketch and rescaling      ``all``
``first_order``     slides Table 2, AdaGrad paper Tables 1, 3, 4: sparse learners     ``all``
``speed``           per-step cost against optax.adagrad and ADA-FULL                  ``bench``
``vw``              sparse streams: Vowpal Wabbit vs sketchopt.stream's learners      ``bench``
``networks``        network layers: kron_fd vs Adam, Shampoo, PSGD; transformer, CNN  ``bench``
``defaults``        the library's defaults (the defaults issue's sweeps)              ``bench``
``time_to_target``  steps and seconds to AdamW's loss: kron_fd, Muon, Shampoo, PSGD   ``bench``
==================  ================================================================  =========

``all`` runs the reproductions (``IN_ALL``) and ``bench`` the library's own benchmarks
(``BENCHMARKS``), each by name too. The benchmarks measure the library against its peers and its
own targets rather than a paper, and their default sizes alone take more than an hour on this
CPU (``networks`` about 40 minutes with the peers' compilation, ``vw`` about 11, ``speed``
about 7, ``time_to_target`` about 21), so they stay outside ``make run``'s budget. The
README's "Reproductions" table quotes ``speed/faster_than_radagrad`` (the Ada-FD paper's
Fig. 1(c) claim, measured side by side by the speed benchmark): it comes from
``OUT/speed.json`` when that is there (``make bench`` writes it into the same ``results/``).

A command of several experiments shows one overall progress bar on a terminal, the experiment in
progress in its description, above each experiment's own bars; in a log, the ``[run.py] [i/n]``
lines say where it is.

Sizes: ``--quick`` is a reduced size, well under a minute per experiment alone (what the tests
run); ``--full`` is the papers' size (hours). At the default size ``all`` takes at most 20
minutes on the 2-core machine (issue 42). What changed for it (0.10 -> issue 42):

* ``speed`` and ``vw`` left ``all`` for ``bench`` (414 and about 660 CPU seconds);
* wasted work removed, the numbers unchanged: ``sparse_drift`` compiled its chunk program once
  per chunk (99 compilations, 63 s), now once per measurement; ``cnn``'s selection runs no longer
  evaluate the test and training sets they do not use; ``first_order``'s Table 3 searches
  ``eta`` up to 1 (the larger two were chosen nowhere, and took a third of its time);
* ``classification``'s SON learners run their grid in a ``lax.map``: ``vmap`` made their
  doubling buffer rotate at every step (about half their time). The same runs, with single
  rather than batched linear algebra, so their last bits differ;
* smaller default sizes for the two slowest: ``cnn`` 4 epochs (was 5), ``classification`` 4
  permutations (was 5). Cuts that moved a headline verdict were not kept: ``cnn`` with 3 seeds
  (``cnn/train_loss`` lost its one significant comparison, p = 0.051 against ADA-DIAG),
  ``first_order`` with 2 reported orders (``first_order/adagrad_t1_l1`` crossed its threshold,
  4 of 8 pairs against 3); ``son_real`` with 2 orders saved 7 s only.

Measured (2026-11-27, the 2-core machine shared with other jobs, load 1-4): ``all`` took 961 s
of wall time (16 minutes), 1128 s of CPU time; per experiment, wall (CPU) seconds: regret 136
(130), sketch_error 78 (74), son_condition 150 (129), classification 155 (150), son_online 121
(150), cnn 158 (231), sparse_drift 42 (74), son_real 57 (81), first_order 63 (108). Under a
steady load of 4 it takes about 19.5 minutes (a run at that load took 1097 s for 1065 s of CPU
time). ``all`` writes ``OUT/summary.md``, which opens with the "Reproductions" table, then every
experiment's own.

The contract for an experiment module (how ``cnn`` and ``speed`` plug in)
-------------------------------------------------------------------------
``experiments/NAME.py`` defines::

    def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict: ...

which

* writes ``out/NAME.json``: the configuration (sizes, seed, grids), and per algorithm -- keyed by
  its public API name (``ada_fd``, ``ada_fd_dual_averaging``, ``fd_son``, ...) -- the curves,
  the final metrics and the chosen hyperparameters;
* writes ``out/NAME.png``: the figure;
* shows ``tqdm`` progress for anything longer than a few seconds and prints a short table;
* returns a small summary dict, at least ``{"table": markdown_str}``, which goes into
  ``summary.md``;
* states the papers' claims it tests as rows of ``common.claim`` (passed to
  ``common.finish_run(..., claims=...)``, stored under ``"claims"`` in the JSON): the paper's
  number, ours, and a verdict computed from ours by a rule in the code.

After every command, ``OUT/reproductions.md`` is rewritten from the claims of every
``OUT/NAME.json`` present (so running one experiment updates its rows), and ``summary.md`` opens
with the same table: the README's "Reproductions" table condenses its headline rows at the
default size.

Modules are imported lazily, one at a time, so an experiment that is not written yet (or whose
algorithms have not landed) does not stop the others: a registered module that does not exist is
skipped with a printed note, and with ``all`` an experiment that fails is reported in
``summary.md`` and makes the command exit non-zero after the others have run. Helpers shared by
the experiments live in ``experiments/common.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pathlib
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make ``experiments`` and ``sketchopt`` importable
    sys.path.insert(0, str(REPO))

EXPERIMENTS = (
    "regret",
    "sketch_error",
    "son_condition",
    "classification",
    "son_online",
    "cnn",
    "sparse_drift",
    "son_real",
    "first_order",
    "speed",
    "vw",
    "networks",
    "defaults",
    "time_to_target",
)
#: The library's own benchmarks (``make bench``): run by name or together as ``bench``, outside
#: ``all``'s time budget.
BENCHMARKS = ("speed", "vw", "networks", "defaults", "time_to_target")
#: What ``all`` (``make run``) runs: the papers' reproductions, every registered experiment that
#: is not a benchmark.
IN_ALL = tuple(name for name in EXPERIMENTS if name not in BENCHMARKS)
#: The command-line names that stand for several experiments.
GROUPS = {"all": IN_ALL, "bench": BENCHMARKS}
#: The headline claims (the README's "Reproductions" table condenses them): one or two claims
#: per finding of the claims issue (every claim is in ``OUT/reproductions.md`` below it, and in
#: each ``NAME.json``).
HEADLINE = (
    "regret/close_to_full",
    "regret/time_vs_radagrad",
    "sketch_error/per_step_rfd_below_fd",
    "sketch_error/rfd_loss_explained",
    "son_condition/large_kappa",
    "son_condition/complement_step",
    "son_condition/literal_labels",
    "classification/ada_fd_vs_diag_md",
    "classification/rotated_control",
    "son_online/alpha0_sensitivity",
    "son_online/rfd0_ridge_explanation",
    "son_real/sketch_plain",
    "son_real/rescaled_vs_adagrad_mnist",
    "cnn/train_loss",
    "cnn/test_accuracy",
    "speed/faster_than_radagrad",
    "first_order/slides_t2_sparsity",
    "first_order/adagrad_t1_l1",
)


def load(name: str):
    """The module ``experiments.NAME``, or ``None`` if it does not exist (yet)."""
    try:
        return importlib.import_module(f"experiments.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"experiments.{name}":
            return None
        raise


def run_one(
    name: str, *, quick: bool, full: bool, seed: int, out: pathlib.Path, step: str = ""
) -> dict:
    """Import and run one experiment; returns its summary dict plus ``seconds`` and ``status``.
    ``step`` (``"[3/9] "``) starts its lines in a command of several experiments."""
    module = load(name)
    if module is None:
        print(f"[run.py] {step}skipping {name!r}: experiments/{name}.py does not exist yet")
        return {"status": "missing", "table": f"*experiments/{name}.py does not exist yet.*"}
    print(f"[run.py] {step}running {name} ({_size(quick, full)} size) -> {out}")
    start, cpu = time.perf_counter(), time.process_time()
    summary = dict(module.run(quick=quick, full=full, seed=seed, out=out) or {})
    summary["seconds"] = time.perf_counter() - start
    summary["cpu_seconds"] = time.process_time() - cpu
    summary.setdefault("status", "ok")
    print(
        f"[run.py] {step}{name} finished in {summary['seconds']:.1f} s "
        f"({summary['cpu_seconds']:.1f} s of CPU time)"
    )
    return summary


@contextlib.contextmanager
def overall_progress(names: list[str], label: str):
    """One progress bar over a command's experiments, the one in progress in its description.

    Drawn on a terminal only (``disable=None``: in a log the ``[run.py] [i/n]`` lines say where
    the command is, and the experiments' own bars are quiet there too, ``common.progress``). While
    it is drawn, standard output goes above the bars (``tqdm.write``); the experiments' own bars
    sit below it and vanish when done.
    """
    from tqdm import tqdm
    from tqdm.contrib import DummyTqdmFile

    class AboveBars(DummyTqdmFile):
        """Standard output written with ``tqdm.write``, which clears the bars first: it must
        compare equal to the stream it wraps for ``tqdm.write`` to see that it shares the
        terminal with the bars (``DummyTqdmFile`` does not)."""

        def __eq__(self, other):
            return self._wrapped == getattr(other, "_wrapped", other)

        __hash__ = None

    bar = tqdm(total=len(names), desc=label, unit="experiment", dynamic_ncols=True, disable=None)
    stdout = sys.stdout
    if not bar.disable:
        sys.stdout = AboveBars(stdout)
    try:
        yield bar
    finally:
        sys.stdout.flush()
        sys.stdout = stdout
        bar.close()


def _size(quick: bool, full: bool) -> str:
    return "quick" if quick else "full" if full else "default"


def write_summary(out: pathlib.Path, results: dict[str, dict], *, size: str, seconds: float):
    lines = [
        "# sketchopt experiments: summary",
        "",
        f"Size: **{size}**. Total wall time: **{seconds:.0f} s** "
        f"({os.cpu_count()} CPU cores). "
        "Each section is the headline table of `NAME.json` / `NAME.png` in this folder.",
        "",
    ]
    lines += reproductions_lines(out)
    for name, summary in results.items():
        status = summary.get("status", "ok")
        head = f"## {name}"
        if "seconds" in summary:
            head += f" ({summary['seconds']:.0f} s"
            if "cpu_seconds" in summary:
                head += f", {summary['cpu_seconds']:.0f} s CPU"
            head += ")"
        lines += [head, ""]
        if status == "failed":
            lines += ["**Failed:**", "", "```", summary.get("error", "").strip(), "```", ""]
            continue
        if status == "ok" and (out / f"{name}.png").exists():
            lines += [f"![{name}]({name}.png)", ""]
        lines += [summary.get("table", ""), ""]
        for note in summary.get("notes", []):
            lines += [f"- {note}"]
        if summary.get("notes"):
            lines += [""]
    (out / "summary.md").write_text("\n".join(lines))


def reproductions_lines(out: pathlib.Path) -> list[str]:
    """The headline "Reproductions" table (the README's) and every claim, from ``out``'s JSON."""
    from experiments import common

    headline = common.reproductions_table(out, EXPERIMENTS, only=HEADLINE)
    every = common.reproductions_table(out, EXPERIMENTS)
    if every is None:
        return []
    lines = ["## Reproductions", ""]
    if headline is not None:
        lines += [headline, ""]
    return lines + ["### Every claim", "", every, ""]


def write_reproductions(out: pathlib.Path) -> None:
    """``OUT/reproductions.md``: the claims of every experiment whose JSON is in ``out``."""
    if lines := reproductions_lines(out):
        (out / "reproductions.md").write_text("# " + "\n".join(lines)[3:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run sketchopt's paper reproductions.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="experiments: "
        + ", ".join(IN_ALL)
        + " (all of them: all); benchmarks: "
        + ", ".join(BENCHMARKS)
        + " (all of them: bench)",
    )
    parser.add_argument(
        "names", nargs="+", metavar="NAME", help="experiment name(s), 'all' or 'bench'"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="reduced size (seconds each)")
    group.add_argument("--full", action="store_true", help="the papers' size (slow)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    names = list(dict.fromkeys(n for a in args.names for n in GROUPS.get(a, (a,))))
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; choose from {EXPERIMENTS}, all or bench")

    from experiments import common

    common.limit_blas_threads()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict[str, dict] = {}
    with overall_progress(names, " ".join(args.names)) as bar:
        for i, name in enumerate(names):
            bar.set_description(f"{' '.join(args.names)}: {name}")
            step = f"[{i + 1}/{len(names)}] " if len(names) > 1 else ""
            try:
                results[name] = run_one(
                    name, quick=args.quick, full=args.full, seed=args.seed, out=args.out, step=step
                )
            except Exception:  # noqa: BLE001 - report and go on with the other experiments
                if len(names) == 1:
                    raise
                error = traceback.format_exc()
                bar.write(f"[run.py] {name} FAILED:\n{error}", file=sys.stderr)
                results[name] = {"status": "failed", "error": error}
            bar.update()
    total = time.perf_counter() - start
    write_reproductions(args.out)
    if "all" in args.names:
        write_summary(args.out, results, size=_size(args.quick, args.full), seconds=total)
        print(f"[run.py] all done in {total:.0f} s; summary: {args.out / 'summary.md'}")
    elif len(names) > 1:
        print(f"[run.py] {len(names)} experiments done in {total:.0f} s")
    return 1 if any(r.get("status") == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
