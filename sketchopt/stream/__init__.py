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

import importlib
from typing import TYPE_CHECKING, Any

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
_HOME = {name: module for module, names in _HOMES.items() for name in names}
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


def _submodules() -> list[str]:
    """The public modules of ``sketchopt.stream``."""
    import pkgutil

    return [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]


def __getattr__(name: str) -> Any:
    """A name of the package or one of its modules, imported at its first use (PEP 562)."""
    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value  # the next use is a plain attribute
        return value
    if not name.startswith("_") and name in _submodules():
        return importlib.import_module(f"{__name__}.{name}")  # which binds it here
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's own dunder names, ``__all__`` and the public modules."""
    return sorted({*(n for n in globals() if n.startswith("__")), *__all__, *_submodules()})
