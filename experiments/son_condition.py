"""Progressive error versus condition number: SON paper sec. 5.1, Fig. 1.

Data (SON sec. 5.1): a Gaussian matrix ``Z`` (``T x d``), a random orthonormal basis ``V`` and a
spectrum ``lambda`` whose first ``d - 10`` entries are 1 and whose last 10 rise linearly to
``kappa``; the examples are ``X = Z diag(lambda)^{1/2} V^T``, the labels ``y = sign(theta^T z)``
for a random ``theta`` -- the same ``Z``, ``V`` and labels for every ``kappa in {10, 20, ...,
200}``, so an invariant learner behaves identically on all of them. One online pass with the
squared loss ``(w^T x - y)^2``; the progressive error is the fraction of rounds whose prediction
``sign(w_t^T x_t)`` (made before the update) is wrong.

Learners:

* ``ada_diag`` (ADA-DIAG, ``delta = 1e-6``) with ``learning_rate`` tuned per ``kappa`` on a grid
  of powers of 2;
* SON (``fd_son``, ``oja_son``, ``rfd_son`` with ``alpha0 = 0``, i.e. RFD0-SON) with sketch
  size ``m in {5, 10}``: the Online Newton Step for exp-concave losses, ``curvature`` ``sigma =
  1/(8 C^2)`` for the squared loss on predictions bounded by ``C = 1`` (``eta = 0``), with the
  bounded-prediction projection ``|w^T x| <= C`` before every prediction (Alg. 1 line 5);
  ``alpha`` is tuned per ``kappa`` over powers of 2 (RFD0-SON has nothing to tune);
* ``m = 0``: SON without a sketch, i.e. projected online gradient descent with step ``1/alpha``
  (``fd_son`` with ``sketch_size = 1``: an FD sketch with one slot keeps no direction, so
  ``A = alpha I``), tuned the same way.

Everything for one learner -- all ``kappa`` and the whole grid -- is one ``jit(vmap(vmap(scan)))``.
The paper searches ``2^j``, ``j = -3..6``, for the step parameter of its Vowpal Wabbit
implementation, whose updates are normalized; with our unnormalized features (``|x|^2 ~ d``, up
to ``~10 kappa`` along the ill-conditioned directions) the useful ``1/alpha`` and learning rates
are far smaller, so the grids are ``alpha = 2^j, j = 2..16`` and ``learning_rate = 2^j,
j = -10..1``. Sizes: ``full`` is the paper's (``T = 10000``, ``d = 100``, 20 values of ``kappa``,
the whole grids); ``default`` keeps ``T`` and ``d`` and takes every other ``kappa`` and every
other grid value; ``quick`` is small.
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments import common

BOUND = 1.0  # C: predictions are projected onto |w^T x| <= C
CURVATURE = 1.0 / (8 * BOUND**2)  # sigma of the squared loss on |prediction| <= C, |y| = 1


def _config(size: str) -> dict:
    if size == "quick":
        return {
            "T": 1500,
            "d": 40,
            "kappas": [10, 100, 200],
            "alpha_exponents": [6, 10, 14],
            "lr_exponents": [-8, -5, -2],
            "sketch_sizes": [5],
        }
    if size == "full":
        return {
            "T": 10000,
            "d": 100,
            "kappas": list(range(10, 201, 10)),
            "alpha_exponents": list(range(2, 17)),
            "lr_exponents": list(range(-10, 2)),
            "sketch_sizes": [5, 10],
        }
    return {
        "T": 10000,
        "d": 100,
        "kappas": list(range(20, 201, 20)),
        "alpha_exponents": list(range(2, 17, 2)),
        "lr_exponents": list(range(-10, 1, 2)),
        "sketch_sizes": [5, 10],
    }


def make_data(T: int, d: int, kappas, seed: int):
    """``(X (K, T, d), y (T,))``: one example matrix per ``kappa``, shared ``Z``, ``V``, labels."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((T, d))
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    theta = rng.standard_normal(d)
    y = np.where(z @ theta >= 0, 1.0, -1.0)
    xs = []
    for kappa in kappas:
        spectrum = np.ones(d)
        spectrum[d - 10 :] = np.linspace(1.0, kappa, 11)[1:]
        xs.append((z * np.sqrt(spectrum)) @ basis.T)
    return np.asarray(xs, np.float32), y.astype(np.float32)


def learners(cfg) -> list[tuple[common.Algorithm, int]]:
    """``(Algorithm, m)`` pairs; ``Algorithm.name`` is ``API/m=M``."""
    import sketchopt as so

    alphas = [float(2.0**j) for j in cfg["alpha_exponents"]]
    lrs = [float(2.0**j) for j in cfg["lr_exponents"]]

    def project(state, w, x):
        return so.project_bounded_prediction(state, w, x, BOUND)

    son = {"curvature": CURVATURE, "eta": 0.0, "bound": BOUND}
    out = [
        (
            common.Algorithm(
                "ada_diag",
                "ADA-DIAG",
                lambda h, k: so.ada_diag(h["learning_rate"], 1e-6),
                {"learning_rate": lrs},
                {"delta": 1e-6},
            ),
            -1,
        ),
        (
            common.Algorithm(
                "fd_son/m=0",
                "gradient (m=0)",
                lambda h, k: so.fd_son(h["alpha"], 1, eta=0.0, curvature=CURVATURE),
                {"alpha": alphas},
                {
                    **son,
                    "sketch_size": 1,
                    "note": "FD with one slot keeps no direction: A = alpha I",
                },
                project=project,
            ),
            0,
        ),
    ]
    for m in cfg["sketch_sizes"]:
        out += [
            (
                common.Algorithm(
                    f"oja_son/m={m}",
                    "Oja-SON",
                    lambda h, k, m=m: so.oja_son(h["alpha"], m, eta=0.0, curvature=CURVATURE),
                    {"alpha": alphas},
                    {**son, "sketch_size": m},
                    project=project,
                ),
                m,
            ),
            (
                common.Algorithm(
                    f"fd_son/m={m}",
                    "FD-SON",
                    lambda h, k, m=m: so.fd_son(h["alpha"], m, eta=0.0, curvature=CURVATURE),
                    {"alpha": alphas},
                    {**son, "sketch_size": m},
                    project=project,
                ),
                m,
            ),
            (
                common.Algorithm(
                    f"rfd_son/m={m}",
                    "RFD0-SON",
                    lambda h, k, m=m: so.rfd_son(m, alpha0=0.0, eta=0.0, curvature=CURVATURE),
                    {"alpha0": [0.0]},
                    {**son, "sketch_size": m, "alpha0": 0.0},
                    project=project,
                ),
                m,
            ),
        ]
    return out


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    import jax
    import jax.numpy as jnp

    common.limit_blas_threads()
    size = common.size_name(quick=quick, full=full)
    cfg = _config(size)
    T, d, kappas = cfg["T"], cfg["d"], cfg["kappas"]
    xs, y = make_data(T, d, kappas, seed)
    xs, y = jnp.asarray(xs), jnp.asarray(y)
    order = jnp.arange(T)
    key = jax.random.PRNGKey(seed)

    results = {}
    for alg, m in common.progress(learners(cfg), desc="son_condition"):
        run_fn = common.online_linear(alg, None, None, common.squared_loss)
        hyper = common.grid_arrays(alg.grid)
        points = common.grid_points(alg.grid)

        def error(h, x, run_fn=run_fn):
            return jnp.mean(run_fn(h, key, order, x, y)["mistake"])

        # kappa outer, grid inner: (K, G) progressive errors in one call.
        batched = jax.jit(jax.vmap(jax.vmap(error, in_axes=(0, None)), in_axes=(None, 0)))
        errors = np.asarray(batched(hyper, xs))
        best = [common.best_index(errors[k]) for k in range(len(kappas))]
        results[alg.name] = {
            "label": alg.label,
            "sketch_size": m if m >= 0 else None,
            "static": dict(alg.static),
            "grid": dict(alg.grid),
            "grid_points": points,
            "grid_error": errors,  # (kappa, grid point)
            "chosen": [points[b] for b in best],
            "error": [float(errors[k, b]) for k, b in enumerate(best)],
        }

    payload = {
        "experiment": "son_condition",
        "paper": "Luo et al., Efficient Second Order Online Learning by Sketching, sec. 5.1",
        "size": size,
        "seed": seed,
        "config": {
            **cfg,
            "loss": "squared (w^T x - y)^2",
            "bound": BOUND,
            "curvature": CURVATURE,
            "selection": "per kappa, smallest progressive error",
        },
        "algorithms": results,
    }
    show = [k for k in (0, len(kappas) // 2, len(kappas) - 1)]
    rows = [
        [r["label"], "-" if r["sketch_size"] is None else str(r["sketch_size"])]
        + [r["error"][k] for k in show]
        for r in results.values()
    ]
    table = common.markdown_table(
        ["algorithm", "m"] + [f"error, kappa={kappas[k]}" for k in show], rows
    )
    fig = _plot(results, kappas, cfg)
    summary = common.finish_run("son_condition", out, payload, fig, table)
    summary["error"] = {k: v["error"] for k, v in results.items()}
    return summary


def _plot(results, kappas, cfg):
    plt = common.pyplot()
    families = [("oja_son", "Oja-SON"), ("fd_son", "FD-SON"), ("rfd_son", "RFD0-SON")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    shades = {0: "0.6", 5: "tab:orange", 10: "tab:red"}
    for ax, (api, label) in zip(axes, families, strict=True):
        diag = results["ada_diag"]
        ax.plot(kappas, diag["error"], label="ADA-DIAG (tuned)", color="tab:blue", linestyle="--")
        plain = results["fd_son/m=0"]
        ax.plot(kappas, plain["error"], label="m = 0 (gradient)", color=shades[0], marker=".")
        for m in cfg["sketch_sizes"]:
            r = results[f"{api}/m={m}"]
            ax.plot(kappas, r["error"], label=f"{label}, m = {m}", color=shades.get(m), marker="o")
        ax.set_xlabel("condition number parameter kappa")
        ax.set_title(label)
        ax.legend()
    axes[0].set_ylabel("progressive error (one pass)")
    fig.suptitle(
        f"Ill-conditioned synthetic data, T = {cfg['T']}, d = {cfg['d']} (SON paper Fig. 1)"
    )
    fig.tight_layout()
    return fig
