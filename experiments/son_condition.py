"""Progressive error versus condition number: SON paper sec. 5.1, Fig. 1.

Data (SON sec. 5.1): a Gaussian matrix ``Z`` (``T x d``), a random orthonormal basis ``V`` and a
spectrum ``lambda`` whose first ``d - 10`` entries are 1 and whose last 10 rise linearly to
``kappa``; the examples are ``X = Z diag(lambda)^{1/2} V^T``. One online pass with the squared
loss ``(w^T x - y)^2``; the progressive error is the fraction of rounds whose prediction
``sign(w_t^T x_t)`` (made before the update) is wrong.

Labels. The paper writes ``y = sign(theta^T x)`` *and* says the 20 datasets share the same labels
``y`` across ``kappa`` (so that "a truly invariant algorithm would have the same behavior on these
20 datasets"). Both cannot hold: ``theta^T x`` changes with ``kappa``. We keep the reading that
makes the paper's invariance statement true, ``y = sign(theta^T z)`` (labels computed from ``Z``,
shared by every ``kappa``; ``theta^T z = theta'^T x`` with
``theta' = V diag(lambda)^{-1/2} theta``, so each dataset is still linearly separable), as the
default, and run the literal reading ``y = sign(theta^T x)`` (labels per ``kappa``) as the variant
``literal`` for ADA-DIAG, ``m = 0`` and Oja-SON ``m = 10``, reported beside it (claim
``son_condition/literal_labels``).

Units. The paper's Vowpal Wabbit runs search the step parameter over ``2^j``, ``j = -3..6``, for
every learner. Our updates are not normalized, so each dataset's features are divided by
``sqrt(mean_t |x_t|^2)`` (a constant per dataset, computed from ``X`` alone, never from labels
or errors); any linear-invariant learner is unaffected, and the grid then has the units it has
for normalized updates. Every learner searches the same ten values ``alpha in {2^j : j = -3..6}``:
SON's ridge ``alpha`` (step ``1/alpha`` outside the sketch), ADA-DIAG's step size ``1/alpha``
(sec. 5: "1/alpha serves as a stepsize"; ``delta = 1e-6``). The chosen value is the one with the
smallest progressive error, per ``kappa`` and learner (the paper's "report the best results");
the JSON records whether it fell on the grid's edge.

Learners:

* ``ada_diag`` (ADA-DIAG);
* Oja-SON and FD-SON (``oja_son``, ``fd_son``) with ``m in {5, 10}``, and RFD0-SON
  (``rfd_son``, ``alpha0 = 0``, nothing to tune) at default and full size: the Online Newton Step
  for exp-concave losses, ``curvature`` ``sigma = 1/(8 C^2)`` for the squared loss on predictions
  bounded by ``C = 1`` (``eta = 0``), with the bounded-prediction projection ``|w^T x| <= C``
  before every prediction (Alg. 1 line 5); Oja's ``Gamma_t = 1/t`` as in the paper;
* ``m = 0``: SON without a sketch, i.e. projected online gradient descent with step ``1/alpha``
  (``fd_son`` with ``sketch_size = 1``: an FD sketch with one slot keeps no direction, so
  ``A = alpha I``) -- "when m = 0 ... Oja-SON is vanilla gradient descent";
* the controlled test of the small-``kappa`` gap (claim ``son_condition/complement_step``): the
  paper's sec. 5.2 blames SON's plain ``1/alpha`` step outside the sketch for losing to ADAGRAD.
  ``diagonal_rescaling=True`` (SON sec. 5.2) replaces exactly that step by the per-coordinate
  ``(1/alpha) D_t^{-1} g``; we run it for Oja-SON ``m = 10`` and for ``m = 0`` (the complement
  step alone), on the same grid; and the full-matrix ONS (``ons``, ``m = d``: the same Newton
  step with nothing outside the sketch), whose gap to ADA-DIAG isolates the off-sketch step.

Everything for one learner -- all datasets (``kappa`` x labelling) and the whole grid -- is one
``jit(vmap(vmap(scan)))``. Sizes: ``full`` is the paper's (``T = 10000``, ``d = 100``, 20 values
of ``kappa``); ``default`` keeps ``T`` and ``d`` and takes ``kappa in {10, 40, 80, 120, 160,
200}`` (a few minutes on 2 cores); ``quick`` (``T = 1000``, ``d = 40``, ``kappa in {10, 200}``)
runs Oja-SON with ``m = 10`` only (the paper's Fig. 1 shows Oja-SON); ``m = 5``, FD-SON,
RFD0-SON and the rescaled ``m = 0`` run at default and full size. Every size searches the whole
grid.
The verdicts' margin is ``1/sqrt(T)``: twice the largest binomial standard error of a
progressive error over ``T`` rounds (0.01 at ``T = 10000``).
"""

from __future__ import annotations

import pathlib

import numpy as np

from experiments import common

BOUND = common.SEC5_BOUND  # C: predictions are projected onto |w^T x| <= C
CURVATURE = common.SEC5_CURVATURE  # sigma of the squared loss on |prediction| <= C, |y| = 1
ALPHA_EXPONENTS = list(range(-3, 7))  # SON sec. 5: 2^j, j = -3..6, for every learner
LABELINGS = ("shared", "literal")  # y = sign(theta^T z) (default) / y = sign(theta^T x)


def _config(size: str) -> dict:
    base = {"alpha_exponents": ALPHA_EXPONENTS, "sketch_sizes": [5, 10], "rescaled_m0": True}
    if size == "quick":
        return {**base, "T": 1000, "d": 40, "kappas": [10, 200], "families": ["oja_son"],
                "sketch_sizes": [10], "rescaled_m0": False}  # fmt: skip
    families = ["oja_son", "fd_son", "rfd_son"]
    if size == "full":
        return {**base, "T": 10000, "d": 100, "kappas": list(range(10, 201, 10)),
                "families": families}  # fmt: skip
    return {**base, "T": 10000, "d": 100, "kappas": [10, 40, 80, 120, 160, 200],
            "families": families}  # fmt: skip


def margin(T: int) -> float:
    """The verdicts' margin: ``1/sqrt(T)``, twice the largest binomial standard error."""
    return 1.0 / np.sqrt(T)


def make_data(T: int, d: int, kappas, seed: int):
    """``(X (K, T, d), labels {"shared": (T,), "literal": (K, T)})``: one example matrix per
    ``kappa`` (shared ``Z``, ``V``, ``theta``), each divided by ``sqrt(mean_t |x_t|^2)``."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((T, d))
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    theta = rng.standard_normal(d)
    shared = np.where(z @ theta >= 0, 1.0, -1.0)
    xs, literal = [], []
    for kappa in kappas:
        spectrum = np.ones(d)
        spectrum[d - 10 :] = np.linspace(1.0, kappa, 11)[1:]
        x = (z * np.sqrt(spectrum)) @ basis.T
        literal.append(np.where(x @ theta >= 0, 1.0, -1.0))
        xs.append(x / np.sqrt(np.mean(np.sum(x * x, axis=1))))
    labels = {"shared": shared.astype(np.float32), "literal": np.asarray(literal, np.float32)}
    return np.asarray(xs, np.float32), labels


LITERAL = ("ada_diag", "fd_son/m=0", "oja_son/m=10")  # also run on the literal labels


def learners(cfg) -> list[tuple[common.Algorithm, int, bool]]:
    """``(Algorithm, m, rescaled)``; ``Algorithm.name`` is ``API/m=M`` (``+rescaled``)."""
    grid = {"alpha": [float(2.0**j) for j in cfg["alpha_exponents"]]}

    def plain(rescaled):  # m = 0: FD with one slot
        note = {"note": "FD with one slot keeps no direction: A = alpha I"}
        alg = common.sec5_learner(
            "fd_son", "m = 0", name="fd_son/m=0", grid=grid, rescaled=rescaled, static=note,
            sketch_size=1,
        )  # fmt: skip
        return alg, 0, rescaled

    full = {"sketch_size": "d (full matrix: nothing outside the sketch)"}
    out = [
        (common.sec5_learner("ada_diag", "ADA-DIAG", name="ada_diag", grid=grid), -1, False),
        plain(False),
        (common.sec5_learner("ons", "ONS (m = d)", name="ons", grid=grid, static=full),
         cfg["d"], False),
    ]  # fmt: skip
    if cfg["rescaled_m0"]:
        out.append(plain(True))
    labels = {"oja_son": "Oja-SON", "fd_son": "FD-SON"}
    for m in cfg["sketch_sizes"]:
        for api in cfg["families"]:
            if api == "rfd_son":
                alg = common.sec5_learner(
                    api, "RFD0-SON", name=f"rfd_son/m={m}", grid={"alpha0": [0.0]},
                    static={"alpha0": 0.0}, sketch_size=m, alpha0=0.0,
                )  # fmt: skip
                out.append((alg, m, False))
                continue
            for rescaled in (False, True) if (api == "oja_son" and m == 10) else (False,):
                alg = common.sec5_learner(
                    api, labels[api], name=f"{api}/m={m}", grid=grid, rescaled=rescaled,
                    sketch_size=m,
                )  # fmt: skip
                out.append((alg, m, rescaled))
    return out


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    import jax
    import jax.numpy as jnp

    size, cfg = common.begin(_config, quick=quick, full=full)
    T, d, kappas = cfg["T"], cfg["d"], cfg["kappas"]
    K = len(kappas)
    xs, labels = make_data(T, d, kappas, seed)
    # Datasets: K with the shared labels, then K with the literal ones (same X).
    x_all = jnp.asarray(np.concatenate([xs, xs]))
    y_all = jnp.asarray(np.concatenate([np.broadcast_to(labels["shared"], (K, T)),
                                        labels["literal"]]))  # fmt: skip
    order = jnp.arange(T)
    key = jax.random.PRNGKey(seed)

    results = {}
    for alg, m, rescaled in common.progress(learners(cfg), desc="son_condition"):
        run_fn = common.online_linear(alg, None, None, common.squared_loss)
        hyper = common.grid_arrays(alg.grid)
        points = common.grid_points(alg.grid)

        def error(h, x, y, run_fn=run_fn):
            return jnp.mean(run_fn(h, key, order, x, y)["mistake"])

        # dataset outer, grid inner: (2K, G) progressive errors in one call. ONS runs its grid
        # and its datasets with lax.map: under vmap (either one) its rare eigendecomposition
        # fallback (a lax.cond) would run at every step, d^3 per round.
        if alg.name == "ons":

            def batched_fn(h, xs, ys, error=error):
                def one(xy):
                    return jax.lax.map(lambda hi: error(hi, *xy), h)

                return jax.lax.map(one, (xs, ys))

            batched = jax.jit(batched_fn)
        else:
            batched = jax.jit(
                jax.vmap(jax.vmap(error, in_axes=(0, None, None)), in_axes=(None, 0, 0))
            )
        n_sets = 2 * K if alg.name in LITERAL else K
        errors = np.asarray(batched(hyper, x_all[:n_sets], y_all[:n_sets]))
        entry = {
            "label": alg.label,
            "sketch_size": m if m >= 0 else None,
            "diagonal_rescaling": rescaled,
            "static": dict(alg.static),
            "grid": dict(alg.grid),
            "grid_points": points,
        }
        for i, labelling in enumerate(LABELINGS[: n_sets // K]):
            errs = errors[i * K : (i + 1) * K]
            best = [common.best_index(e) for e in errs]
            suffix = "" if labelling == "shared" else "_literal"
            entry[f"grid_error{suffix}"] = errs  # (kappa, grid point)
            entry[f"chosen{suffix}"] = [points[b] for b in best]
            entry[f"chosen_on_edge{suffix}"] = [
                len(points) > 1 and b in (0, len(points) - 1) for b in best
            ]
            entry[f"error{suffix}"] = [float(errs[k, b]) for k, b in enumerate(best)]
        results[alg.name] = entry

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
            "labels": "y = sign(theta^T z), shared by every kappa ('error'); the literal "
            "y = sign(theta^T x) per kappa is 'error_literal'",
            "feature_scale": "each dataset divided by sqrt(mean |x_t|^2)",
            "grid": "alpha = 2^j, j = -3..6, every learner (ADA-DIAG: learning rate 1/alpha)",
            "selection": "per kappa and labelling, smallest progressive error",
            "margin": margin(T),
        },
        "algorithms": results,
    }
    show = sorted({0, K // 2, K - 1})
    rows = [
        [r["label"], "-" if r["sketch_size"] is None else str(r["sketch_size"])]
        + [r["error"][k] for k in show]
        + [r["error_literal"][k] if "error_literal" in r else "-" for k in (0, K - 1)]
        for r in results.values()
    ]
    table = common.markdown_table(
        ["algorithm", "m"]
        + [f"error, kappa={kappas[k]}" for k in show]
        + [f"literal labels, kappa={kappas[k]}" for k in (0, K - 1)],
        rows,
    )
    claims = claim_rows(results, kappas, T, cfg["families"])
    fig = _plot(results, kappas, cfg)
    summary = common.finish_run("son_condition", out, payload, fig, table, claims=claims)
    summary["error"] = {k: v["error"] for k, v in results.items()}
    return summary


def claim_rows(results, kappas, T, families) -> list[dict]:
    """The claims of SON sec. 5.1 / Fig. 1, verdicts computed from the errors (module docstring)."""
    tol = margin(T)
    kappas = list(kappas)
    K = len(kappas)
    top = slice(K - max(1, K // 3), K)  # the largest third of the kappas
    rows = common.Claims("son_condition", source="SON sec. 5.1, Fig. 1")
    pts = f"{100 * tol:.1f} pts"

    def err(name, suffix=""):
        return np.asarray(results[name][f"error{suffix}"])

    pick = sorted({0, K // 2, K - 1})
    at = "kappa=" + "/".join(str(kappas[k]) for k in pick)

    def shown(name_or_values, suffix=""):  # the percentages at the kappas shown
        values = err(name_or_values, suffix) if isinstance(name_or_values, str) else name_or_values
        return common.pct(values[pick])

    # 1. Sketching helps, more as kappa grows (per family, m = 10 against m = 0).
    for api in [f for f in ("oja_son", "fd_son") if f in families]:
        gain = err("fd_son/m=0") - err(f"{api}/m=10")
        label = results[f"{api}/m=10"]["label"]
        sizes = [m for m in (0, 5, 10) if m == 0 or f"{api}/m={m}" in results]
        errs = " / ".join(shown("fd_son/m=0" if m == 0 else f"{api}/m={m}") for m in sizes)
        rows.add(
            f"{api}_vs_m0", gain[top].mean() > tol and gain[-1] > gain[0] + tol,
            partly=gain[top].mean() > tol,
            claim=f"{label} m = 10 beats m = 0 (gradient descent), increasingly with kappa",
            paper="m = 0 worse than ADAGRAD; m = 5 'greatly improves'; m = 10 'hardly worsens "
            "with kappa'",
            ours=f"err % m={'/'.join(map(str, sizes))} at {at}: {errs}",
            rule=f"gain m=0 - m=10 > {pts} on the top third of kappa and grows by > {pts} from "
            "smallest to largest kappa (partly: first only)",
        )  # fmt: skip

    # 2. Oja-SON m = 10 against ADA-DIAG at large kappa, and where it starts to win.
    wins = common.beats(err("oja_son/m=10"), err("ada_diag"))
    cross = next((kappas[k] for k in range(K) if wins[k:].all()), None)
    ahead = common.beats(err("oja_son/m=10"), err("ada_diag"), tol)
    rows.add(
        "large_kappa", ahead[top], partly=ahead[-1],
        claim="Oja-SON m = 10 beats ADA-DIAG on ill-conditioned data (large kappa)",
        paper="ADAGRAD degrades with kappa; Oja-SON m = 10 'substantially better'",
        ours=f"err % ADA-DIAG / Oja m=10 at {at}: {shown('ada_diag')} / {shown('oja_son/m=10')}; "
        + (f"Oja wins from kappa = {cross}" if cross is not None else "Oja wins at no kappa"),
        rule=f"Oja-SON better by > {pts} at every kappa of the top third (partly: at the "
        "largest); equal grids 2^-3..2^6",
    )  # fmt: skip

    # 3. The small-kappa gap: is it the 1/alpha step outside the sketch? Controlled test: ONS
    # (m = d: the same Newton step with nothing outside the sketch) on the same grid; and the
    # paper's own fix, diagonal rescaling (off-sketch step (1/alpha) D_t^{-1} g).
    gap_plain = err("oja_son/m=10") - err("ada_diag")
    gap_ons = err("ons") - err("ada_diag")
    gap_resc = err("oja_son/m=10+rescaled") - err("ada_diag")
    lost = gap_plain > tol
    where = [kappas[k] for k in np.flatnonzero(lost)]
    rows.add(
        "complement_step", (gap_ons <= tol)[lost] if lost.any() else False,
        source="SON sec. 5.1 Fig. 1 and sec. 5.2 discussion",
        claim="Oja-SON's gap to ADA-DIAG at small kappa comes from its plain 1/alpha step outside "
        "the sketch",
        paper="sec. 5.2: off the sketch SON 'is essentially doing vanilla gradient descent'",
        ours=f"err - ADA-DIAG, pts, at {at}: Oja m=10 {shown(gap_plain)}; ONS {shown(gap_ons)}",
        rule=f"Oja m=10 loses by > {pts} at kappa {where}; holds if ONS (nothing off-sketch) is "
        "within that of ADA-DIAG there (partly: somewhere)" if lost.any()
        else f"no gap > {pts} to explain at this size",
    )  # fmt: skip
    rows.add(
        "rescaling", gap_resc <= np.minimum(gap_plain, tol),
        source="SON sec. 5.2 (the fix), on sec. 5.1's data",
        claim="Diagonal rescaling (off-sketch step (1/alpha) D_t^{-1} g) brings Oja-SON m = 10 "
        "level with ADA-DIAG",
        paper="on real data 'Oja-SON outperforms ADAGRAD on most of the datasets'",
        ours=f"err - ADA-DIAG, pts, at {at}: plain {shown(gap_plain)}; rescaled {shown(gap_resc)}",
        rule=f"rescaled within {pts} of ADA-DIAG and no worse than plain at every kappa (partly: "
        "some); rotated data: D_t ~ t I, so the off-sketch step decays as 1/t",
    )  # fmt: skip

    # 4. The literal labels y = sign(theta^T x): Oja m = 10 against m = 0 and ADA-DIAG.
    lit = "_literal"
    oja = err("oja_son/m=10", lit)[-1]
    rows.add(
        "literal_labels", common.beats(oja, [err("fd_son/m=0", lit)[-1], err("ada_diag", lit)[-1]],
                                       tol),
        source="SON sec. 5.1 (y = sign(theta^T x) as written)",
        claim="With y = sign(theta^T x), Oja-SON m = 10 still beats m = 0 and ADA-DIAG at the "
        "largest kappa",
        paper="(the paper's labels are shared across kappa, which the literal formula is not)",
        ours=f"err % m=0 / ADA-DIAG / Oja m=10 at {at}: {shown('fd_son/m=0', lit)} / "
        f"{shown('ada_diag', lit)} / {shown('oja_son/m=10', lit)}",
        rule=f"Oja m=10 better than both by > {pts} at the largest kappa (partly: one); the "
        "default labels sign(theta^T z) are the ones the paper's 'same labels for every kappa' "
        "allows",
    )  # fmt: skip
    return list(rows)


def _plot(results, kappas, cfg):
    plt = common.pyplot()
    names = {"oja_son": "Oja-SON", "fd_son": "FD-SON", "rfd_son": "RFD0-SON"}
    panels = [(api, names[api], "") for api in cfg["families"]]
    panels += [("oja_son", "Oja-SON, literal labels sign(theta^T x)", "_literal")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), sharey=True)
    shades = {0: "0.6", 5: "tab:orange", 10: "tab:red"}
    for ax, (api, title, suffix) in zip(axes, panels, strict=True):
        ax.plot(kappas, results["ada_diag"][f"error{suffix}"], label="ADA-DIAG (tuned)",
                color="tab:blue", linestyle="--")  # fmt: skip
        ax.plot(kappas, results["fd_son/m=0"][f"error{suffix}"], label="m = 0 (gradient)",
                color=shades[0], marker=".")  # fmt: skip
        for m in cfg["sketch_sizes"]:
            r = results[f"{api}/m={m}"]
            if f"error{suffix}" not in r:
                continue
            ax.plot(kappas, r[f"error{suffix}"], label=f"{r['label']}, m = {m}",
                    color=shades.get(m), marker="o")  # fmt: skip
        if api == "oja_son":
            extra = (("ons", "k"), ("fd_son/m=0+rescaled", "0.3"),
                     ("oja_son/m=10+rescaled", "tab:purple"))  # fmt: skip
            for name, color in extra:
                if name not in results or f"error{suffix}" not in results[name]:
                    continue
                r = results[name]
                ax.plot(kappas, r[f"error{suffix}"], label=r["label"],
                        color=color, linestyle=":", marker="s")  # fmt: skip
        ax.set_xlabel("condition number parameter kappa")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("progressive error (one pass)")
    fig.suptitle(
        f"Ill-conditioned synthetic data, T = {cfg['T']}, d = {cfg['d']} (SON paper Fig. 1); "
        "alpha = 2^j, j = -3..6, for every learner"
    )
    fig.tight_layout()
    return fig
