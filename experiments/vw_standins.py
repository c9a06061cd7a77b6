"""Generated stand-ins for the public files the real-data issue measured on (issue 41): a9a,
w8a, the URL reputation sample and RCV1 in VW's own text format. The files themselves cannot
ship or download; these streams reproduce the properties that decided the comparison there, so
that ``experiments/run.py vw`` (its "defaults" section, :mod:`experiments.vw_defaults`) keeps
every learner's defaults honest on them:

* ``onehot`` (a9a): 14 categorical fields one-hot over ``d = 123`` binary features, a
  logistic teacher with about 24% positives, ``-1/+1`` labels, the file sorted by label;
* ``rare_positive`` (w8a): ``d = 300`` binary features, about 12 per example, a skewed feature
  frequency, about 3% positives, ``0/1`` labels in the training file and ``-1/+1`` in the
  test file, sorted by label;
* ``wide_scale`` (URL): ``d = 3,231,961``: 64 real-valued features whose scales span six orders
  of magnitude (``1e-2`` to ``1e4``), 18 present per example, beside about 110 binary "lexical"
  features drawn from a Zipf law over the rest of the range (the test file holds features the
  training file never has), about a third positives;
* ``tfidf_vw`` (RCV1): VW text, one namespace of word tokens (strings, hashed by each tool)
  with ``(1 + log tf) idf`` values normalized to unit length, about 50 distinct words per
  document from a Zipf vocabulary of 47,000, about half positives.

Every label comes from a logistic model over the features (so the Bayes error is well above 0);
sizes are ``(train, test)`` examples. Each generator is deterministic in its seed.
"""

from __future__ import annotations

import numpy as np

#: ``(train, test)`` examples per stand-in by benchmark size.
SIZES = {"default": (10_000, 5_000), "full": (30_000, 10_000)}
URL_DIM = 3_231_961


def _labels(rng, margins, positive):
    """``-1/+1`` labels drawn from a logistic model whose offset gives ``positive`` of them."""
    offset = np.quantile(margins, 1 - positive)
    p = 1 / (1 + np.exp(-(margins - offset)))
    return np.where(rng.random(len(p)) < p, 1, -1)


def _svm_line(label, indices, values, zero_one=False):
    y = ("1" if label > 0 else "0") if zero_one else ("+1" if label > 0 else "-1")
    order = np.argsort(indices)
    feats = " ".join(f"{int(indices[k])}:{values[k]:.6g}" for k in order)
    return f"{y} {feats}".rstrip()


def _split(lines, labels, n_train):
    """Training lines sorted by label (as some public files are); test lines as drawn."""
    train = [lines[i] for i in np.argsort(labels[:n_train], kind="stable")]
    return train, lines[n_train:]


def onehot(n_train, n_test, seed=0):
    """a9a's stand-in (module docstring): 14 one-hot categorical fields over ``d = 123``."""
    rng = np.random.default_rng([seed, 123])
    cards = [9, 16, 7, 15, 6, 5, 2, 2, 12, 10, 14, 10, 10, 5]
    offsets = np.cumsum([0, *cards[:-1]]) + 1
    n = n_train + n_test
    teacher = rng.normal(0, 1.2, sum(cards) + 1)
    cols = np.stack(
        [offsets[f] + np.minimum(rng.zipf(1.6, n) - 1, c - 1) for f, c in enumerate(cards)], 1
    )
    y = _labels(rng, 1.5 * teacher[cols].sum(1), 0.24)
    lines = [_svm_line(y[i], cols[i], np.ones(len(cards))) for i in range(n)]
    return (*_split(lines, y, n_train), "svmlight")


def rare_positive(n_train, n_test, seed=0):
    """w8a's stand-in (module docstring): about 3% positives, ``0/1`` training labels."""
    rng = np.random.default_rng([seed, 300])
    n, d = n_train + n_test, 300
    freq = np.arange(1, d + 1) ** -0.8
    freq /= freq.sum()
    teacher = 3 * rng.normal(0, 1, d + 1) * (rng.random(d + 1) < 0.3)
    rows = [np.unique(rng.choice(d, size=max(1, rng.poisson(12)), p=freq) + 1) for _ in range(n)]
    y = _labels(rng, 2 * np.array([teacher[r].sum() for r in rows]), 0.03)
    lines = [
        _svm_line(y[i], rows[i], np.ones(len(rows[i])), zero_one=i < n_train) for i in range(n)
    ]
    return (*_split(lines, y, n_train), "svmlight")


def wide_scale(n_train, n_test, seed=0):
    """The URL file's stand-in (module docstring): six orders of feature scale, ``d = 3.2M``."""
    rng = np.random.default_rng([seed, 3231961])
    n = n_train + n_test
    scales = 10.0 ** rng.uniform(-2, 4, 64)
    real_teacher = rng.normal(0, 1, 64) / scales
    lexical = {}
    lines, margins = [], np.empty(n)
    for i in range(n):
        real = rng.choice(64, 18, replace=False)
        values = np.abs(rng.normal(0, 1, 18)) * scales[real]
        words = np.unique(np.minimum(rng.zipf(1.3, rng.poisson(110)) + 64, URL_DIM))
        margin = 0.3 * float(real_teacher[real] @ values)
        for j in words:
            if j not in lexical:
                lexical[j] = rng.normal(0, 1.5) if rng.random() < 0.2 else 0.0
            margin += lexical[j]
        margins[i] = 2 * margin
        ones = np.ones(len(words))
        lines.append((np.concatenate([real + 1, words]), np.concatenate([values, ones])))
    y = _labels(rng, margins, 0.33)
    lines = [_svm_line(y[i], *lines[i]) for i in range(n)]
    return lines[:n_train], lines[n_train:], "svmlight"


def tfidf_vw(n_train, n_test, seed=0):
    """RCV1's stand-in in VW text (module docstring): unit-norm tf-idf word tokens."""
    rng = np.random.default_rng([seed, 47000])
    n, vocab = n_train + n_test, 47_000
    teacher = 3 * rng.normal(0, 1, vocab) * (rng.random(vocab) < 0.1)
    docs, margins = [], np.empty(n)
    for i in range(n):
        words, counts = np.unique(
            np.minimum(rng.zipf(1.25, rng.poisson(75) + 5), vocab) - 1, return_counts=True
        )
        values = (1 + np.log(counts)) * np.log(vocab / (1 + words))
        values /= np.linalg.norm(values)
        docs.append((words, values))
        margins[i] = 8 * float(teacher[words] @ values)
    y = _labels(rng, margins, 0.47)
    lines = [
        f"{y[i]} |w " + " ".join(f"t{k}:{v:.4f}" for k, v in zip(*docs[i], strict=True))
        for i in range(n)
    ]
    return lines[:n_train], lines[n_train:], "vw"


STANDINS = {
    "onehot": onehot,
    "rare_positive": rare_positive,
    "wide_scale": wide_scale,
    "tfidf_vw": tfidf_vw,
}


def standins(size: str, seed: int = 0) -> list[tuple[str, list[str], list[str], str]]:
    """``(name, train lines, test lines, format)`` of every stand-in at ``size``; none at
    ``quick`` size."""
    if size not in SIZES:
        return []
    n_train, n_test = SIZES[size]
    return [(name, *make(n_train, n_test, seed)) for name, make in STANDINS.items()]
