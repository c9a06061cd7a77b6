"""Sparse high-dimensional streams: sparse examples, linear learners in ``O(s)`` per example, a
stream runner and a command line (``python -m sketchopt.stream``; see the streams guide,
``docs/guides/streams.md``).

* :mod:`sketchopt.stream.examples` -- :class:`SparseExamples`, padded ``(indices, values)``;
* :mod:`sketchopt.stream.data` -- LIBSVM/svmlight files in chunks, VW's text format, hashing;
* :mod:`sketchopt.stream.learners` -- the first-order learners and their losses;
* :mod:`sketchopt.stream.second_order` -- SON (Oja, FD, RFD, RP) and Ada-FD in ``O(m^2 + m s)``;
* :mod:`sketchopt.stream.runner` -- progressive validation over a stream, grids by ``vmap``;
* :mod:`sketchopt.stream.cli` -- the command line.
"""

from sketchopt.stream.examples import SparseExamples, SparseVector, from_csr, from_dense
from sketchopt.stream.learners import (
    LEARNERS,
    LOSSES,
    LinearLearner,
    LinearState,
    ada_diag,
    fobos,
    ftrl,
    make_learner,
    rda,
    truncated_gradient,
)
from sketchopt.stream.second_order import SECOND_ORDER, SketchedState

__all__ = [
    "LEARNERS",
    "LOSSES",
    "LinearLearner",
    "SECOND_ORDER",
    "SketchedState",
    "LinearState",
    "SparseExamples",
    "SparseVector",
    "ada_diag",
    "fobos",
    "from_csr",
    "from_dense",
    "ftrl",
    "make_learner",
    "rda",
    "truncated_gradient",
]
