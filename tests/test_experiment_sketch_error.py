"""The ``sketch_error`` experiment at ``--quick`` size, through ``experiments/run.py``'s command
line in a subprocess: the form of its JSON, the deterministic error bounds, what holds robustly
on the streams without zero columns, the explanation of RFD's losses, and the verdicts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from experiment_support import REPO, check_claims, finite_numbers, load

from experiments import sketch_error as se

pytestmark = [pytest.mark.slow, pytest.mark.experiments]

SLACK = 1e-4  # float32 sketches against float64 bounds


@pytest.fixture(scope="module")
def sketch_error(tmp_path_factory):
    out = tmp_path_factory.mktemp("sketch_error")
    cmd = [sys.executable, str(REPO / "experiments" / "run.py"), "sketch_error", "--quick"]
    done = subprocess.run(
        cmd + ["--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RFD/FD" in done.stdout  # the table is printed
    return out


def test_sketch_error_json(sketch_error):
    payload = load(sketch_error, "sketch_error")
    assert not finite_numbers(payload)
    algs = payload["algorithms"]
    sizes = payload["config"]["sketch_sizes"]
    for name in (
        "frequent_directions",
        "frequent_directions_fast",
        "robust_frequent_directions",
        "robust_frequent_directions_fast",
        "compensative_frequent_directions",
        "parameterized_frequent_directions_beta0.2",
    ):
        for ds, errs in algs[name]["relative_error"].items():
            assert len(errs) == len(sizes), (name, ds)
            assert all(e is not None and 0 <= e < 10 for e in errs), (name, ds)
    chosen = algs["parameterized_frequent_directions"]["chosen"]
    assert all(b in (0.2, 0.4, 0.6, 0.8) for ds in chosen for b in chosen[ds]["beta"])

    # The stream groups: "RFD ~ 1/2 FD" is built into the zero-column streams; the fair streams
    # (real data standardized or with its zero columns dropped, Liberty's matrix, decaying
    # spectra) have no always-zero column; the flat stream is the stress case.
    datasets = payload["config"]["datasets"]
    roles = {ds: info["role"] for ds, info in datasets.items()}
    assert [ds for ds, r in roles.items() if r == "zero_columns"] == ["mnist", "digits"]
    assert [ds for ds, r in roles.items() if r == "stress"] == ["flat"]
    fair = [ds for ds, r in roles.items() if r == "fair"]
    assert set(fair) >= {"breast_cancer", "wine", "diabetes", "digits_nonzero", "synthetic"}
    assert {"spectrum_1", "spectrum_2", "spectrum_exp"} <= set(fair)
    assert all(datasets[ds]["zero_columns"] == 0 for ds in fair + ["flat"])
    assert all(datasets[ds]["zero_columns"] > 0 for ds in ("mnist", "digits"))

    ratios = {"": payload["rfd_over_fd"], "fast": payload["fast_rfd_over_fast_fd"]}
    fd = {"": "frequent_directions", "fast": "frequent_directions_fast"}
    rfd = {"": "robust_frequent_directions", "fast": "robust_frequent_directions_fast"}
    for ds, bounds in payload["bounds"].items():
        for i in range(len(sizes)):
            # The deterministic guarantees, on every stream: FD's (per-step and doubling buffer)
            # and RFD's, half of it (RFD paper Theorem 3). An RFD whose alpha took the whole
            # shrinkage, or none of it, breaks the second.
            for form in ratios:
                # (Up to the float32 rounding of n steps, se.rounding; with m >= d the bound
                # is 0 and the sketch exact up to it.)
                floor = se.rounding(datasets[ds]["rows"])
                for alg, key in ((fd[form], "fd"), (rfd[form], "rfd")):
                    err = algs[alg]["relative_error"][ds][i]
                    assert err <= bounds[key][i] * (1 + SLACK) + floor, (alg, ds)
                t = payload["diagnostics"][rfd[form]][ds][i]
                fd_err = algs[fd[form]]["relative_error"][ds][i]
                # FD and RFD keep the same B (proof of Theorem 3): FD's error, from its own
                # run, is lambda_max(A^T A - B^T B) of RFD's B (float32 runs, same operations).
                assert abs(t["e_max"] - fd_err) <= 1e-6 * fd_err + 1e-9, (form, ds)
                # Lemma 4: 0 <= E <= Delta = 2 alpha, up to the float32 rounding of B^T B and
                # alpha (measured up to 4e-6 of ||A^T A||_2; allowed 3e-5).
                assert -3e-5 <= t["e_min"] <= t["e_max"] <= 2 * t["alpha"] + 3e-5, (form, ds)
        if roles[ds] == "zero_columns":
            # Along a zero column A^T A - C has the eigenvalue -alpha = -(FD's shrinkage) / 2,
            # and FD's error is at most its shrinkage: RFD/FD >= 1/2 there.
            for ratio in ratios[""][ds] + ratios["fast"][ds]:
                assert ratio >= 0.5 - 1e-4, (ds, ratio)

    # The fair test at quick size (m = 6, seed 0; deterministic): RFD and fast RFD beat FD on
    # every stream without zero columns, near half (measured 0.50-0.51, asserted within the
    # claim's band [0.4, 0.6]).
    judged = payload["config"]["judged"]
    for ds in fair:
        for form in ratios:
            for i, ok in enumerate(judged[ds]):
                if ok:
                    assert se.HALF_BAND[0] <= ratios[form][ds][i] <= se.HALF_BAND[1], (form, ds)

    # The explanation of RFD's losses, on the flat stream (stable rank ~ 50 >> 2 m): alpha exceeds
    # ||A^T A||_2, FD's error cannot (B^T B <= A^T A), so RFD/FD >= alpha - lambda_min(E) > 1
    # (measured 4.2 per-step and 2.8 fast; asserted > 1.5). The error lies in a direction the
    # sketch does not hold (||B u||^2 ~ 0.002 of ||A^T A||_2).
    for form in ratios:
        t = payload["diagnostics"][rfd[form]]["flat"][0]
        assert t["alpha"] > 1 + t["e_min"]
        assert ratios[form]["flat"][0] >= (t["alpha"] - t["e_min"]) * (1 - SLACK)
        assert ratios[form]["flat"][0] > 1.5
        assert t["bottom_sketch_energy"] < 0.05

    # The claims: well formed, every verdict recomputed from the numbers in the JSON by the
    # module's rules, and those that hold robustly at quick size asserted.
    claims = check_claims(payload["claims"], "sketch_error")
    errors = {name: alg["relative_error"] for name, alg in algs.items() if "relative_error" in alg}
    again = {row["id"]: row for row in se._claims(payload, errors)}
    assert again == claims
    for short in (
        "theorem3_bound",
        "half_zero_columns",
        "per_step_rfd_below_fd",
        "fast_rfd_below_fd",
        "rfd_loss_explained",
    ):
        assert claims[f"sketch_error/{short}"]["verdict"] == "holds", short
    fair_cases = [(ds, i) for ds in fair for i, ok in enumerate(judged[ds]) if ok]
    below_cfd = [
        errors["robust_frequent_directions_fast"][ds][i]
        < errors["compensative_frequent_directions"][ds][i]
        for ds, i in fair_cases
    ]
    assert claims["sketch_error/rfd_below_cfd"]["verdict"] == se.always(below_cfd)
