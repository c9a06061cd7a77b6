"""Sparse high-dimensional streams: sparse examples, linear learners in ``O(s)`` per example, a
stream runner and a command line (``python -m sketchopt.stream``; see the streams guide,
``docs/guides/streams.md``).

* :mod:`sketchopt.stream.examples` -- :class:`SparseExamples`, padded ``(indices, values)``;
* :mod:`sketchopt.stream.data` -- LIBSVM/svmlight files in chunks, VW's text format, hashing;
* :mod:`sketchopt.stream.learners` -- the first-order learners and their losses;
* :mod:`sketchopt.stream.second_order` -- SON (Oja, FD, RFD, RP) and Ada-FD in ``O(m^2 + m s)``;
* :mod:`sketchopt.stream.runner` -- progressive validation over a stream, grids by ``vmap``;
* :mod:`sketchopt.stream.cli` -- the command line.

Like the package root, this package imports its modules at the first use of one of its names
(PEP 562): ``import sketchopt.stream.cli`` loads no JAX, so ``sketchopt-stream --help`` answers
at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sketchopt import _lazy

if TYPE_CHECKING:  # what type checkers and editors read; at run time, ``__getattr__`` below
    from sketchopt.stream import examples as examples
    from sketchopt.stream import learners as learners
    from sketchopt.stream import second_order as second_order
    from sketchopt.stream.cli import load_model
    from sketchopt.stream.examples import (
        SparseExamples,
        SparseVector,
        from_csr,
        from_dense,
    )
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
    from sketchopt.stream.second_order import (
        SECOND_ORDER,
        SketchedState,
    )

# Each name's module (``tests/test_import_time.py`` holds the table to those modules).
_HOMES = {
    "cli": ("load_model",),
    "examples": (
        "SparseExamples",
        "SparseVector",
        "from_csr",
        "from_dense",
    ),
    "learners": (
        "LEARNERS",
        "LOSSES",
        "LinearLearner",
        "LinearState",
        "ada_diag",
        "fobos",
        "ftrl",
        "make_learner",
        "rda",
        "truncated_gradient",
    ),
    "second_order": (
        "SECOND_ORDER",
        "SketchedState",
    ),
}
# A new public name: its module's entry above, ``__all__`` below and the ``TYPE_CHECKING`` import.

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
    "load_model",
    "make_learner",
    "rda",
    "truncated_gradient",
]


__getattr__, __dir__ = _lazy.attach(__name__, _HOMES, __all__)
