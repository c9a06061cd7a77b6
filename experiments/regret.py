"""Online regression regret: Ada-FD paper sec. 4.1, Fig. 1.

``f_t(beta) = |beta^T x_t - y_t|`` with ``y_t = beta_*^T x_t``, ``beta_*`` a normalized Gaussian
vector and ``x_t ~ N(1, Sigma)``, ``Sigma`` with eigenvalues ``100 j^-2`` in a random eigenbasis
(approximately low rank, as ADA-FD needs). Since ``f_t(beta_*) = 0`` the regret against
``beta_*`` is the cumulative loss ``sum_{s<=t} |beta_s^T x_s - y_s|``.

Learners (``tau = 10`` rows for the sketched ones):

* dual averaging (primal-dual subgradient): ``ada_full_dual_averaging``,
  ``ada_fd_dual_averaging``, ``ada_diag_dual_averaging``;
* composite mirror descent: ``ada_full``, ``ada_fd``, ``ada_diag``, ``radagrad`` (averaged over
  5 seeds, as in the paper) and ``fd_son`` (the SON update ``w - A^{-1} g`` with ``A = alpha I +
  eta * (sketched sum of g g^T)``: its ``alpha`` is searched on the ``delta`` grid and its ``eta``
  on the ``eta`` grid; no projection, the problem is unconstrained).

``eta`` and ``delta`` are searched over ``{1e-4, 1e-3, ..., 100}`` in one vmapped call per
learner; each learner is reported at the pair with the smallest final regret.

Sizes. ``full``: the paper's ``T = 10000, d = 500`` and the whole 7 x 7 grid for everyone (ADA-FULL
then needs a 500 x 500 ``eigh`` per step and per grid point: hours). ``default``:
``T = 10000, d = 100``; ADA-FULL is searched on the 3 ``eta`` values nearest ADA-FD's chosen
``eta`` at ADA-FD's chosen ``delta`` (ADA-FD approximates it; recorded in the JSON), everything
else on the whole grid. ``quick``: ``T = 1000, d = 30``, grid ``{1e-3, ..., 10}``.
The running time is measured for one hyperparameter pair per learner, after compilation, over
the first ``min(T, 2000)`` rounds and reported per round and extrapolated to ``T`` rounds.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments import common

SKETCH_SIZE = 10
RADAGRAD_SEEDS = 5


def _config(size: str) -> dict:
    grid = common.decades(-4, 2)
    if size == "quick":
        return {"T": 1000, "d": 30, "grid": common.decades(-3, 1), "full_grid": "neighbourhood"}
    if size == "full":
        return {"T": 10000, "d": 500, "grid": grid, "full_grid": "whole"}
    return {"T": 10000, "d": 100, "grid": grid, "full_grid": "neighbourhood"}


def make_problem(T: int, d: int, seed: int):
    """``(X, y, beta_*)`` of sec. 4.1: ``x_t ~ N(1, Q diag(100 j^-2) Q^T)``, ``y = beta_*^T x``."""
    rng = np.random.default_rng(seed)
    eig = 100.0 * np.arange(1, d + 1, dtype=np.float64) ** -2.0
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    z = rng.standard_normal((T, d))
    x = 1.0 + (z * np.sqrt(eig)) @ basis.T
    beta = rng.standard_normal(d)
    beta /= np.linalg.norm(beta)
    return x.astype(np.float32), (x @ beta).astype(np.float32), beta


def algorithms(grid: list[float]) -> list[common.Algorithm]:
    """The learners of Fig. 1."""
    import sketchopt as so

    g = {"eta": grid, "delta": grid}
    tau = SKETCH_SIZE
    return [
        common.Algorithm(
            "ada_fd_dual_averaging",
            "ADA-FD",
            lambda h, k: so.ada_fd_dual_averaging(h["eta"], tau, h["delta"]),
            g,
            {"sketch_size": tau},
            rule="dual_averaging",
        ),
        common.Algorithm(
            "ada_full_dual_averaging",
            "ADA-FULL",
            lambda h, k: so.ada_full_dual_averaging(h["eta"], h["delta"]),
            g,
            rule="dual_averaging",
        ),
        common.Algorithm(
            "ada_diag_dual_averaging",
            "ADA-DIAG",
            lambda h, k: so.ada_diag_dual_averaging(h["eta"], h["delta"]),
            g,
            rule="dual_averaging",
        ),
        common.Algorithm(
            "ada_fd",
            "ADA-FD",
            lambda h, k: so.ada_fd(h["eta"], tau, h["delta"]),
            g,
            {"sketch_size": tau},
        ),
        common.Algorithm("ada_full", "ADA-FULL", lambda h, k: so.ada_full(h["eta"], h["delta"]), g),
        common.Algorithm("ada_diag", "ADA-DIAG", lambda h, k: so.ada_diag(h["eta"], h["delta"]), g),
        common.Algorithm(
            "radagrad",
            "RADAGRAD",
            lambda h, k: so.radagrad(h["eta"], tau, h["delta"], k),
            g,
            {"sketch_size": tau, "seeds": RADAGRAD_SEEDS},
            random=True,
        ),
        common.Algorithm(
            "fd_son",
            "FD-SON",
            lambda h, k: so.fd_son(h["delta"], tau, eta=h["eta"], curvature=0.0),
            g,
            {"sketch_size": tau, "curvature": 0.0, "alpha": "searched on the delta grid"},
        ),
    ]


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    import jax
    import jax.numpy as jnp

    common.limit_blas_threads()
    size = common.size_name(quick=quick, full=full)
    cfg = _config(size)
    T, d = cfg["T"], cfg["d"]
    x, y, _ = make_problem(T, d, seed)
    order = jnp.arange(T)[None]
    key = jax.random.PRNGKey(seed)
    idx = common.subsample(T)
    n_time = min(T, 2000)

    results: dict[str, dict] = {}
    chosen: dict[str, dict] = {}
    algs = algorithms(cfg["grid"])
    for alg in common.progress(algs, desc="regret"):
        grid = dict(alg.grid)
        grid_note = "whole grid"
        if alg.label == "ADA-FULL" and cfg["full_grid"] == "neighbourhood":
            fd_name = "ada_fd_dual_averaging" if alg.rule == "dual_averaging" else "ada_fd"
            ref = chosen[fd_name]
            grid = {
                "eta": common.neighbourhood(alg.grid["eta"], ref["eta"]),
                "delta": [ref["delta"]],
            }
            grid_note = (
                f"reduced for cost (d x d eigh per step): the eta values nearest {fd_name}'s "
                f"chosen eta, at its chosen delta"
            )
        run_fn = common.online_linear(alg, x, y, common.absolute_loss, record_mistakes=False)
        keys = jax.random.split(key, RADAGRAD_SEEDS if alg.random else 1)
        tune_keys = keys[:1]
        out_grid, points, seconds = common.run_grid(
            alg, run_fn, keys=tune_keys, orders=order, grid=grid
        )
        regret = np.cumsum(out_grid["loss"].astype(np.float64), axis=-1)  # (G, 1, T)
        final = regret[:, :, -1].mean(axis=1)
        best = common.best_index(final)
        hyper = points[best]
        curve = regret[best].mean(axis=0)
        if alg.random:  # tuned on one seed, reported as the mean over RADAGRAD_SEEDS seeds
            out_seeds, _, extra = common.run_grid(
                alg,
                run_fn,
                keys=keys,
                orders=jnp.broadcast_to(order, (len(keys), T)),
                grid={k: [v] for k, v in hyper.items()},
            )
            seconds += extra
            per_seed = np.cumsum(out_seeds["loss"][0].astype(np.float64), axis=-1)
            curve = per_seed.mean(axis=0)
        # Running time of one hyperparameter pair over the first n_time rounds.
        single = jax.jit(
            lambda h, k, o, run_fn=run_fn: run_fn(h, k, o)["loss"],
        )
        h = {k_: jnp.float32(v) for k_, v in hyper.items()}
        _, t_run = common.timed(single, h, keys[0], jnp.arange(n_time))
        chosen[alg.name] = hyper
        results[alg.name] = {
            "label": alg.label,
            "rule": alg.rule,
            "static": dict(alg.static),
            "grid": grid,
            "grid_note": grid_note,
            "grid_points": points,
            "grid_final_regret": final,
            "chosen": hyper,
            "final_regret": float(curve[-1]),
            "curve": {"t": idx + 1, "regret": curve[idx]},
            "seconds_per_round": t_run / n_time,
            "seconds_T_rounds": t_run / n_time * T,
            "grid_search_seconds": seconds,
        }

    payload = {
        "experiment": "regret",
        "paper": "Wan, Wei & Zhang, Ada-FD, sec. 4.1, Fig. 1",
        "size": size,
        "seed": seed,
        "config": {
            "T": T,
            "d": d,
            "loss": "absolute |beta^T x - y|",
            "x": "N(1, Q diag(100 j^-2) Q^T), Q random orthogonal",
            "beta_star": "normalized Gaussian",
            "sketch_size": SKETCH_SIZE,
            "grid": {"eta": cfg["grid"], "delta": cfg["grid"]},
            "selection": "smallest final regret",
            "timing_rounds": n_time,
            "radagrad_seeds": RADAGRAD_SEEDS,
        },
        "algorithms": results,
    }
    rows = []
    for rule in ("dual_averaging", "mirror_descent"):
        ranked = sorted(
            (r for r in results.values() if r["rule"] == rule), key=lambda r: r["final_regret"]
        )
        for r in ranked:
            rows.append(
                [
                    rule.replace("_", " "),
                    r["label"],
                    r["final_regret"],
                    common.hyper_str(r["chosen"]),
                    f"{r['seconds_per_round'] * 1e6:.0f}",
                ]
            )
    table = common.markdown_table(
        ["rule", "algorithm", f"regret at T={T}", "chosen", "us / round"], rows
    )
    fig = _plot(results, T, d)
    summary = common.finish_run("regret", out, payload, fig, table)
    summary["final_regret"] = {k: v["final_regret"] for k, v in results.items()}
    return summary


def _plot(results, T, d):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    titles = {"dual_averaging": "dual averaging (PDS)", "mirror_descent": "mirror descent (CMD)"}
    for ax, rule in zip(axes[:2], ("dual_averaging", "mirror_descent"), strict=True):
        for r in results.values():
            if r["rule"] != rule:
                continue
            ax.plot(
                r["curve"]["t"],
                r["curve"]["regret"],
                label=f"{r['label']} ({common.fmt(r['final_regret'])})",
                **common.style(r["label"]),
            )
        ax.set_xlabel("t (rounds)")
        ax.set_ylabel("regret (cumulative absolute loss)")
        ax.set_yscale("log")
        ax.set_title(titles[rule])
        ax.legend(title="final regret")
    md = [r for r in results.values() if r["rule"] == "mirror_descent"]
    ax = axes[2]
    labels = [r["label"] for r in md]
    secs = [r["seconds_T_rounds"] for r in md]
    ax.bar(labels, secs, color=[common.style(lb).get("color", "gray") for lb in labels])
    ax.set_yscale("log")
    ax.set_ylabel(f"seconds for T = {T} rounds (one pair)")
    ax.set_title("running time, mirror descent")
    ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Online regression, absolute loss, T = {T}, d = {d} (Ada-FD paper Fig. 1)")
    fig.tight_layout()
    return fig
