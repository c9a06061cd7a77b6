"""Vowpal Wabbit's text outputs, as the command line (``sketchopt-stream``) writes them.

NumPy only (no JAX): the command line imports this module inside the functions that run a job.

* **Progress lines** (VW's ``-P``/``--progress``, :class:`ProgressLines`): VW's two header lines
  and one line per report, ``average loss``, ``since last``, ``example counter``, ``example
  weight``, ``current label``, ``current predict`` and ``current features``, in VW's columns
  (8, 8, 12, 14, 14, 14 and 8 characters; losses with 6 decimals, the weight with 1, the label
  and the prediction with 4). The schedule is VW's: an integer ``N`` (no ``.`` in it) reports
  every ``N`` of example weight (additive), a float ``F`` multiplies the next report's example
  weight by ``F`` (VW adds 1 to an ``F <= 1``), starting at 1; the default of VW, ``2.0``, is
  the doubling table. As VW computes them, the losses are weighted by the examples' importance
  weights (``average loss`` the weighted mean so far, ``since last`` over the weight since the
  previous line) and a report is due when the example weight reaches the next one. With VW's
  ``--binary`` the losses are the 0/1 loss and the predictions their sign (``-1`` for a score
  of 0, as VW's ``--binary``).
* **Predictions** (VW's ``-p``, :func:`format_predictions`): one per example and line, followed
  by the example's tag where it has one (VW's ``prediction tag``).
* **Readable models** (VW's ``--readable_model`` and ``--invert_hash``,
  :func:`readable_model`): VW's header (``Version``, ``Id``, ``Min label``, ``Max label``,
  ``bits``, ``lda``, ``ngram``, ``skip``, ``options``, ``Checksum``), the line ``:0`` (VW's mark
  of a model without its training state, VW 9's ``--predict_only_model`` form), then one line
  ``index:weight`` per non-zero weight in index order, ``name:index:weight`` with
  ``--invert_hash`` where the name is known (weights printed as C++ streams print a float, six
  significant digits). The values are sketchopt's: ``Version`` names sketchopt's version,
  ``options`` the run's learner and hyperparameters, ``Checksum`` is the CRC-32 of the header
  lines above it (VW's is its own hash of its header), and the constant, VW's ``Constant``, has
  the index after the hashed features (``2**bits``; VW hashes it into the table).
"""

from __future__ import annotations

import math
import sys
import zlib
from typing import TextIO

import numpy as np

__all__ = ["PROGRESS_HEADER", "ProgressLines", "format_predictions", "progress_schedule",
           "readable_model"]  # fmt: skip

#: VW's two header lines above its progress lines.
PROGRESS_HEADER = (
    "average  since         example        example        current        current  current\n"
    "loss     last          counter         weight          label        predict features"
)


def progress_schedule(spec: str) -> tuple[bool, float]:
    """VW's ``-P``/``--progress`` argument: ``(additive, step)``. An integer (no ``.``) is
    additive, at least 1; a float multiplicative, 1 added to a factor ``<= 1`` (VW's rules)."""
    try:
        value = float(spec)
    except ValueError:
        raise ValueError(f"-P/--progress {spec!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"-P/--progress {spec!r} is not finite")
    if "." not in spec:
        return True, max(value, 1.0)
    return False, value + 1.0 if value <= 1.0 else value


def _line(avg, since, counter, weight, label, predict, features) -> str:
    return (
        f"{avg:<8.6f} {since:<8.6f} {counter:>12d} {weight:>14.1f} {label:>14.4f} "
        f"{predict:>14.4f} {features:>8d}"
    )


class ProgressLines:
    """VW's progress lines (module docstring), fed chunk by chunk
    (:meth:`~ProgressLines.add`), printed to ``out`` (default ``sys.stderr``, where VW prints
    them) as they fall due."""

    def __init__(self, spec: str = "2.0", *, binary: bool = False, out: TextIO | None = None):
        self.additive, self.step = progress_schedule(spec)
        self.binary = binary
        self.out = sys.stderr if out is None else out
        self.next = self.step if self.additive else 1.0
        self.examples, self.weight, self.loss = 0, 0.0, 0.0
        self.last_weight, self.last_loss = 0.0, 0.0
        self.lines: list[str] = []
        print(PROGRESS_HEADER, file=self.out)

    def add(self, loss, weight, label, predict, features) -> None:
        """The next examples (in stream order): each one's loss, importance weight, label (as
        the learner saw it), prediction and number of features (the constant included)."""
        loss, weight, label, predict = (np.asarray(a, np.float64) for a in
                                        (loss, weight, label, predict))  # fmt: skip
        features = np.asarray(features, np.int64)
        if self.binary:
            predict = np.where(predict > 0, 1.0, -1.0)
            loss = (predict != np.sign(label)).astype(np.float64)
        weights = self.weight + np.cumsum(weight)
        losses = self.loss + np.cumsum(loss * weight)
        j = 0
        while True:
            j = int(np.searchsorted(weights[j:], self.next, side="left")) + j
            if j >= weights.shape[0]:
                break
            since = (losses[j] - self.last_loss) / (weights[j] - self.last_weight)
            line = _line(losses[j] / weights[j], since, self.examples + j + 1, weights[j],
                         label[j], predict[j], features[j])  # fmt: skip
            print(line, file=self.out, flush=True)
            self.lines.append(line)
            self.last_weight, self.last_loss = float(weights[j]), float(losses[j])
            self.next = weights[j] + self.step if self.additive else weights[j] * self.step
            j += 1
        if weights.shape[0]:
            self.weight, self.loss = float(weights[-1]), float(losses[-1])
        self.examples += int(weights.shape[0])


def format_predictions(scores, *, link: str = "identity", binary: bool = False, tags=None) -> str:
    """VW's ``-p`` text of raw scores: one per line, the sigmoid with ``link="logistic"``, the
    sign (``1``/``-1``, ``-1`` for 0) with ``binary``; each example's tag after it, as VW writes
    it, where ``tags`` (one string per score) gives one."""
    scores = np.asarray(scores, np.float64).reshape(-1)
    if binary:
        text = ["1" if s > 0 else "-1" for s in scores.tolist()]
    else:
        if link == "logistic":
            scores = 0.5 * (1.0 + np.tanh(0.5 * scores))  # 1 / (1 + exp(-s)), overflow-free
        text = [f"{s:.9g}" for s in scores.tolist()]
    if tags is not None:
        text = [f"{t} {tag}" if tag else t for t, tag in zip(text, tags, strict=True)]
    return "".join(f"{t}\n" for t in text)


def _float(value: float) -> str:
    """A float as a C++ stream prints it by default (VW's weights): six significant digits."""
    return f"{value:g}"


def readable_model(
    weights, *, version: str, bits: int, labels: tuple[float, float], options: str,
    names: dict[int, str] | None = None,
) -> str:  # fmt: skip
    """VW's ``--readable_model`` text of ``weights`` (``--invert_hash`` with ``names``,
    ``{index: name}``; module docstring). ``labels``: the ``Min label`` and ``Max label``."""
    header = [
        f"Version {version}",
        "Id ",
        f"Min label:{_float(labels[0])}",
        f"Max label:{_float(labels[1])}",
        f"bits:{int(bits)}",
        "lda:0",
        "0 ngram:",
        "0 skip:",
        f"options: {options}",
    ]
    checksum = zlib.crc32("\n".join(header).encode())
    lines = [*header, f"Checksum: {checksum}", ":0"]
    weights = np.asarray(weights, np.float64).reshape(-1)
    for index in np.flatnonzero(weights).tolist():
        value = _float(float(weights[index]))
        name = None if names is None else names.get(index)
        lines.append(f"{index}:{value}" if name is None else f"{name}:{index}:{value}")
    return "\n".join(lines) + "\n"
