"""The ``defaults`` experiment (issue 43) at ``--quick`` size: the form of its JSON, every derived
number (best rate, band, divergences) and every verdict recomputed from the per-rate numbers, and
Adam training the quick MLP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from experiment_support import load, quick_run, verdict

from experiments.defaults import EXEMPT

pytestmark = [pytest.mark.slow, pytest.mark.benchmark]


defaults_run = quick_run("defaults")


def _loss(value) -> float:
    return math.inf if value is None else value  # None: a non-finite loss in strict JSON


def _check_summary(s: dict, rates: list[float], initial: float, metric: str) -> None:
    """Best rate, band and divergences follow from the per-seed runs."""
    assert len(s["runs"]) == len(rates)
    for i, per_seed in enumerate(s["runs"]):
        finals = [_loss(r["final_train_loss"]) for r in per_seed]
        for r, f in zip(per_seed, finals, strict=True):
            want = (
                "non-finite loss"
                if math.isinf(f)
                else "above initial loss"
                if f > initial
                else None
            )
            assert r["diverged"] == want
            assert metric in r and len(r["curve"]) > 0
        mean = np.mean(finals) if all(map(math.isfinite, finals)) else math.inf
        assert math.isclose(_loss(s["final_train_loss"][i]), mean, rel_tol=1e-9)
        assert (s["diverged"][i] is None) == all(r["diverged"] is None for r in per_seed)
    finals = [_loss(f) for f in s["final_train_loss"]]
    best = int(np.argmin(finals))
    assert s["best"] == {
        "learning_rate": rates[best],
        "final_train_loss": s["final_train_loss"][best],
    }
    band = [
        lr
        for lr, f, d in zip(rates, finals, s["diverged"], strict=True)
        if d is None and f <= 1.1 * finals[best]
    ]
    assert s["band"]["rates"] == band and s["band"]["count"] == len(band)
    assert (s["band"]["lo"], s["band"]["hi"]) == ((band[0], band[-1]) if band else (None, None))
    assert [d["learning_rate"] for d in s["divergences"]] == [
        lr for lr, d in zip(rates, s["diverged"], strict=True) if d
    ]


def _expected_verdicts(algs: dict, models: dict, rates: list[float]) -> dict[str, str]:
    """The five targets' verdicts, recomputed from the summaries by the rules in the reasons."""
    s = lambda name, model: algs[name]["models"][model]
    at = lambda summary, lr, key: summary[key][rates.index(lr)]
    adam_best = {m: s("adam", m)["best"] for m in models}
    passes = []
    for m in models:
        adam_band = s("adam", m)["band"]["rates"]
        for name, alg in algs.items():
            if alg["library"] != "sketchopt" or name in EXEMPT:  # reported, not counted
                continue
            ratio = _loss(s(name, m)["best"]["final_train_loss"]) / adam_best[m]["final_train_loss"]
            ok = ratio <= 1.05 and all(at(s(name, m), lr, "diverged") is None for lr in adam_band)
            passes.append(ok)
    kron = {
        m: (
            adam_best[m]["learning_rate"] in s("kron_fd", m)["band"]["rates"],
            s("kron_fd", m)["band"]["count"] >= s("adam", m)["band"]["count"],
        )
        for m in models
    }
    acc = [
        100 * (at(s("adam", m), lr, "test_accuracy") - at(s("kron_fd", m), lr, "test_accuracy"))
        <= 1.0
        for m in models
        if models[m]["metric"] == "test_accuracy"
        for lr in [adam_best[m]["learning_rate"]]
    ]
    div = [len(s("ada_fd", m)["divergences"]) for m in models]
    wide = [s("ada_fd", m)["band"]["count"] >= s("adagrad", m)["band"]["count"] for m in models]
    return {
        "defaults/within_5pct_of_adam": verdict(all(passes), 2 * sum(passes) > len(passes)),
        "defaults/kron_band_contains_adam_best": verdict(
            all(a and b for a, b in kron.values()), all(a for a, _ in kron.values())
        ),
        "defaults/kron_accuracy_at_adam_best": verdict(all(acc) and acc, any(acc)),
        "defaults/ada_fd_no_divergence": verdict(sum(div) == 0, all(d <= 1 for d in div)),
        "defaults/ada_fd_band_vs_adagrad": verdict(all(wide), any(wide)),
    }


def test_defaults(defaults):
    import inspect

    from experiments import defaults as module

    out, summary = defaults
    payload = load(out, "defaults")
    rates = payload["config"]["rates"]
    assert len(rates) == 3 and rates == sorted(rates)
    assert module.LEARNING_RATES == pytest.approx([1e-4 * 10 ** (k / 2) for k in range(9)])
    models, algs = payload["models"], payload["algorithms"]
    assert set(models) == {"mlp", "cnn", "transformer"}
    assert set(algs) == set(module.QUICK_TRANSFORMS)
    assert {m["metric"] for m in models.values()} == {"test_accuracy", "held_out_loss"}
    for name, alg in algs.items():
        # Every argument but the swept one at its default: the JSON says what was passed.
        factory = {t.name: t for t in module.transforms()}[name].factory
        params = inspect.signature(factory).parameters
        assert alg["passed"] == ({"robust": not params["robust"].default} if "(" in name else {})
        assert set(alg["defaults"]) == {
            n for n, p in params.items() if p.default is not inspect.Parameter.empty
        }
        assert set(alg["models"]) == set(models)
        for model, info in models.items():
            _check_summary(alg["models"][model], rates, info["initial_loss"], info["metric"])
            assert alg["compile_seconds"][model] > 0
    # Adam trains the quick MLP: at its best rate the final loss is well below the initial.
    mlp = algs["adam"]["models"]["mlp"]
    assert mlp["best"]["final_train_loss"] < 0.5 * models["mlp"]["initial_loss"]
    assert mlp["test_accuracy"][rates.index(mlp["best"]["learning_rate"])] > 0.8
    # Every verdict follows from the numbers.
    claims = {row["id"]: row["verdict"] for row in payload["claims"]}
    assert claims == _expected_verdicts(algs, models, rates)
    assert summary["table"].startswith("| model | transform |")
