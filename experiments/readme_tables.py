"""The README's headline tables, generated from a results folder (``make readme``).

    python experiments/readme_tables.py [--results results] [--readme README.md] [--check]

Each table sits in the README between ``<!-- NAME: start -->`` and ``<!-- NAME: end -->``
(``NAME`` one of :data:`TABLES`) and is rewritten, with a line saying where its numbers come from
(the command, ``sketchopt``'s version, the date and the machine, from the JSON's
``provenance``), from the JSON that ``experiments/run.py`` wrote: ``reproductions`` from every
paper reproduction's claims (``make run``), ``speed``, ``streams``, ``networks`` and
``time_to_target`` from the benchmarks' (``make bench``). A table whose JSON is not in the
folder is left as it is. ``--check`` rewrites nothing and exits 1 if the README differs from what
the results give.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments import common, run  # noqa: E402

TABLES = ("reproductions", "speed", "aot", "streams", "networks", "time_to_target")

#: The per-step learners of the speed table, as ``speed.json`` names them.
SPEED_COLUMNS = (
    ("ada_fd", "ADA-FD"),
    ("ada_fd(fast=True)", "ADA-FD `fast=True`"),
    ("ada_fd_dual_averaging", "ADA-FD dual averaging"),
    ("fd_son", "FD-SON"),
    ("rfd_son", "RFD-SON"),
)
STREAM_NAMES = {
    "mnist": "MNIST subset",
    "mnist_cross": "MNIST pixel pairs",
    "text": "Zipf text",
    "digits": "digits",
    "sofia_demo": "sofia-ml demo",
    "onehot": "one-hot (a9a-like)",
    "rare_positive": "rare positives (w8a-like)",
    "wide_scale": "wide scales, d = 3.2M (URL-like)",
    "tfidf_vw": "tf-idf VW text (RCV1-like)",
}


def _load(out: pathlib.Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _source(payload: dict, command: str) -> str:
    """``(command, sketchopt 0.x, date, machine)`` from a JSON's provenance."""
    p = payload.get("provenance") or {}
    parts = [f"`{command}`", f"{payload.get('size', 'default')} size"]
    if p:
        parts += [f"sketchopt {p['sketchopt']}", p["date"], p["machine"]]
    else:
        parts += ["written before the results recorded their provenance"]
    return "*Generated from " + ", ".join(parts) + ".*"


def reproductions(out: pathlib.Path) -> str | None:
    """The headline claims (``run.HEADLINE``), one short row each: the claim, its verdict and
    id (the numbers are on the reproductions page and in ``OUT/reproductions.md``)."""
    claims, _ = common.collect_claims(out, run.EXPERIMENTS)
    by_id = {c["id"]: c for c in claims}
    shown = [by_id[i] for i in run.HEADLINE if i in by_id]
    if not shown:
        return None

    def cell(text: str) -> str:  # a "|" in a claim would split the row
        return text.replace("|", "\\|")

    rows = [
        [cell(f"{c['claim']} ({c['source'].split(';')[0]})"), f"**{c['verdict']}**", f"`{c['id']}`"]
        for c in shown
    ]
    table = common.markdown_table(["claim (paper)", "verdict", "id"], rows)
    sources = [p for name in run.IN_ALL if (p := _load(out, name))]
    return _source(sources[0], "make run") + "\n\n" + table


def speed(out: pathlib.Path) -> str | None:
    payload = _load(out, "speed")
    if payload is None:
        return None
    rows = [r for r in payload["rows"] if r["dtype"] == "float32"]
    d = max(r["d"] for r in rows)
    tau = min((r["sketch_size"] for r in rows if r["d"] == d), key=lambda t: abs(t - 10))
    at = {r["method"]: r for r in rows if r["d"] == d and r["sketch_size"] == tau}
    base = at["optax.adagrad"]["seconds"]
    cells = [
        f"{1e3 * at[m]['seconds']:.1f} ms ({at[m]['ratio_to_adagrad']:.1f}x)" if m in at else ""
        for m, _ in SPEED_COLUMNS
    ]
    head = (
        f"One jitted step at `d = {d:.0e}`, `sketch_size = {tau}`, float32, cold cache, against "
        f"`optax.adagrad`'s {1e3 * base:.2f} ms in the same process."
    )
    table = common.markdown_table([label for _, label in SPEED_COLUMNS], [cells])
    return "\n\n".join([_source(payload, "experiments/run.py speed"), head, table])


def aot(out: pathlib.Path) -> str | None:
    """XLA's TPU count of one donated update (``experiments/device_bench.py --parts aot``):
    bytes over the Optax peer's at each size, and the tree's fusions, loops and compile time."""
    payload = _load(out, "aot")
    if payload is None or "aot" not in payload:
        return None
    payload = payload["aot"]  # device_bench.py's JSON holds each part under its name
    cases = payload["cases"]
    tree = next((c for c in cases if "tree" in c), None)
    # the FD family's steps between Gram refreshes enter their rows' figure over a period
    names = [
        n
        for rows in cases.values()
        for n, r in rows.items()
        if "peer" in r and not n.endswith(common.BETWEEN_REFRESHES)
    ]
    names = list(dict.fromkeys(names))

    def ratio(case, name):
        row = cases[case].get(name)
        if row is None:
            return ""
        over_period = row.get("amortized_bytes_over_peer")
        amortized = "" if over_period is None else f" ({over_period:.2f}x over a period)"
        return f"{row['bytes_over_peer']:.2f}x{amortized}"

    rows = []
    for name in names:
        any_row = next(case[name] for case in cases.values() if name in case)
        cells = [f"`{name}` / `{any_row['peer']}`", *(ratio(c, name) for c in cases)]
        if tree is not None:
            t = cases[tree].get(name)
            peer = cases[tree][any_row["peer"]] if t else None
            cells += (
                [f"{t['fusions']} / {peer['fusions']}", str(t["while_loops"]),
                 f"{t['compile_seconds']:.0f} s ({t['compile_over_peer']:.1f}x)"]
                if t else ["", "", ""]
            )  # fmt: skip
        rows.append(cells)
    floor = [
        f"{r['guarded adagrad']['bytes_accessed'] / r['optax.adagrad']['bytes_accessed']:.2f}x"
        for r in cases.values()
    ]
    label = "guarded floor (a finiteness read, one pass, the skip count) / `optax.adagrad`"
    rows.append([label, *floor])
    rows[-1] += [""] * (len(rows[0]) - len(rows[-1]))
    headers = ["bytes accessed, donated update", *cases]
    if tree is not None:
        headers += [f"fusions ({tree})", "while loops", "compile (over the peer's)"]
    p = payload.get("provenance", {})
    head = (
        f"One update compiled for a TPU {payload['topology']} by XLA's TPU compiler on this "
        f"machine (deviceless; jax {p.get('jax', '?')}, libtpu {payload.get('libtpu')}), the "
        "state donated, on the accelerator code path: XLA's bytes accessed over the Optax "
        "peer's, float32, `sketch_size = 10`; a training step's column is the update with the "
        "parameters' write (both donated), where a diagonal update's passes fuse with it. "
        "`kron_fd`'s update is a switch, counted at its costliest branch (the refresh); its "
        "branches are compiled alone as well, and the step between refreshes in a switch of "
        "two copies (what its boundary costs; fusions and loops count twice there); its "
        "figure over a period is the whole update's refresh and 9 steps in the switch. The "
        "FD family's exact Gram refresh, a `cond` taken at one shrink in 32, is so charged at "
        "every step too: its figure over a period is the whole update once and 31 steps "
        "compiled without that branch."
    )
    table = common.markdown_table(headers, rows)
    return "\n\n".join([_source(payload, "experiments/device_bench.py --parts aot"), head, table])


def _stream_cell(row: dict | None, name: bool = False) -> str:
    if row is None:
        return ""
    err = f"{100 * row['progressive_error']:.2f}"
    if row.get("test_error") is not None:
        err += f" / {100 * row['test_error']:.2f}"
    cell = f"{err} %, {row['examples_per_second'] / 1e3:.1f}k/s"
    return f"{row['learner']} {cell}" if name else cell


def streams(out: pathlib.Path) -> str | None:
    payload = _load(out, "vw")
    if payload is None:
        return None
    version = (payload.get("vw") or {}).get("version", "?")
    rows = []
    for stream, results in payload["streams"].items():
        by = {r["learner"]: r for r in results if r["tool"] == "vw"}
        ours = [r for r in results if r["tool"] == "sketchopt"]

        def score(r):
            test = r.get("test_error")
            return (r["progressive_error"] if test is None else test, r["progressive_error"])

        best = min(ours, key=score) if ours else None
        rows.append(
            [
                STREAM_NAMES.get(stream, stream),
                _stream_cell(by.get("vw_default")),
                _stream_cell(by.get("vw_oja_newton")),
                _stream_cell(best, name=True),
            ]
        )
    head = (
        f"Progressive / test error and examples per second of one logistic pass, against Vowpal "
        f"Wabbit {version}, each configuration chosen from its grid."
    )
    table = common.markdown_table(
        ["stream", "VW default", "VW `--OjaNewton`", "best `sketchopt.stream`"], rows
    )
    parts = [_source(payload, "experiments/run.py vw"), *_defaults_table(payload), head, table]
    return "\n\n".join(parts)


def _defaults_table(payload: dict) -> list[str]:
    """The run's defaults section (``experiments/vw_defaults.py``): test error % with nothing
    but ``--learner`` chosen, the best of each kind against its VW reference, and ``oja_son``'s
    examples/s against VW ``--OjaNewton``'s (best of the section's runs)."""
    results = payload.get("defaults")
    if not results:
        return []

    def err(row):
        return "" if row is None or "test_error" not in row else f"{100 * row['test_error']:.2f}"

    rows = []
    for r in results:
        got, v = r["rows"], r["verdict"]
        speed = v.get("oja_son_speed_ratio")
        rows.append([
            STREAM_NAMES.get(r["stream"], r["stream"]),
            err(got.get("vw_default")),
            err(got.get("vw_oja_newton")),
            f"{v['best_first_order']} {err(got.get(v['best_first_order']))}",
            f"{v['best_second_order']} {err(got.get(v['best_second_order']))}",
            _counterparts(got, v.get("counterparts", {})),
            "" if speed is None else f"{speed:.2f}x",
        ])  # fmt: skip
    head = (
        "Test error % with nothing but `--learner` chosen (both tools at their defaults, one "
        "pass over the same files, the real ones and the stand-ins both as downloaded and "
        "shuffled; the real files are `../shared/data/`'s, the "
        'rows named "-like" generated stand-ins of public files, '
        "`experiments/vw_standins.py`); `ada_diag`, `ftrl` and `oja_son` against VW default, "
        "`--ftrl` and `--OjaNewton` (margin max(1 point, 3 test examples)), and "
        "`oja_son`'s examples/s over VW `--OjaNewton`'s:"
    )
    header = ["stream", "VW default", "VW `--OjaNewton`", "best first-order",
              "best second-order", "counterparts: ours / VW's", "`oja_son` speed"]  # fmt: skip
    return [head, common.markdown_table(header, rows)]


def _counterparts(rows: dict, verdicts: dict) -> str:
    """``ada_diag 5.59 / 5.09, ...``: each counterpart's test error % beside VW's, bold where
    the margin is missed."""
    cells = []
    for ours, v in verdicts.items():
        a, b = (rows.get(k, {}).get("test_error") for k in (ours, v["vw"]))
        if None in (a, b):
            continue
        text = f"{ours} {100 * a:.2f} / {100 * b:.2f}"
        cells.append(text if v["met"] else f"**{text}**")
    return ", ".join(cells)


def networks(out: pathlib.Path) -> str | None:
    payload = _load(out, "networks")
    if payload is None:
        return None
    rows = []
    for name, r in payload["algorithms"].items():
        loss = r["final_train_loss"]["mean"]
        rows.append(
            [
                r.get("label", name),
                f"{loss:.3f}",
                f"{r['step_time_over_adam']:.2f}x",
                f"{r['state_bytes_per_param']:.2f}",
            ]
        )
    cfg = payload.get("config", {})
    head = (
        f"The byte-level transformer ({cfg.get('layers', '?')} layers, width "
        f"{cfg.get('width', '?')}, {cfg.get('steps', '?')} steps), each learner's rate from its "
        "own grid."
    )
    table = common.markdown_table(
        ["learner", "final train loss", "step / Adam's", "state bytes / param"], rows
    )
    return "\n\n".join([_source(payload, "experiments/run.py networks"), head, table])


def time_to_target(out: pathlib.Path) -> str | None:
    """The time-to-target headline: per learner and workload, steps to AdamW's final loss over
    its N, and (in brackets) the seconds over AdamW's N steps; ``-`` not reached within N."""
    payload = _load(out, "time_to_target")
    if payload is None:
        return None
    parts = payload["algorithms"]
    names = list(dict.fromkeys(n for part in parts.values() for n in part["algorithms"]))
    rows = []
    for name in names:
        label, cells = name, []
        for part in parts.values():
            r = part["algorithms"].get(name)
            if r is None:
                cells.append("not run")
                continue
            label = r["label"]
            cells.append(f"{common.fmt(r['steps_ratio'], 2)} ({common.fmt(r['wall_ratio'], 2)})")
        rows.append([label, *cells])
    head = (
        "Steps to AdamW's final training loss (20-step mean at step N) over N, and in brackets "
        "wall-clock seconds over AdamW's N steps (median of the seeds; - : not reached by N)."
    )
    header = ["learner"] + [f"{w} (N = {p['steps']})" for w, p in parts.items()]
    table = common.markdown_table(header, rows)
    return "\n\n".join([_source(payload, "experiments/run.py time_to_target"), head, table])


def generate(out: pathlib.Path) -> dict[str, str]:
    """The tables the results in ``out`` give (a table without its JSON is left out)."""
    makers = {
        "reproductions": reproductions,
        "speed": speed,
        "aot": aot,
        "streams": streams,
        "networks": networks,
        "time_to_target": time_to_target,
    }
    return {name: text for name, make in makers.items() if (text := make(out)) is not None}


def rewrite(readme: str, tables: dict[str, str]) -> str:
    """``readme`` with each marked block replaced by its table."""
    for name, text in tables.items():
        pattern = re.compile(rf"(<!-- {name}: start -->\n).*?(\n<!-- {name}: end -->)", re.S)
        if not pattern.search(readme):
            raise ValueError(f"the README has no <!-- {name}: start/end --> block")
        readme = pattern.sub(lambda m, text=text: m.group(1) + text + m.group(2), readme)
    return readme


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=REPO / "results")
    parser.add_argument("--readme", type=pathlib.Path, default=REPO / "README.md")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    tables = generate(args.results)
    before = args.readme.read_text()
    after = rewrite(before, tables)
    print(f"[readme] tables from {args.results}: {', '.join(tables) or 'none'}")
    if args.check:
        return int(after != before)
    args.readme.write_text(after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
