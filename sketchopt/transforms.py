"""Compatibility module: the rules and the named aliases, as imported before 0.3.0.

``sketchopt.transforms`` held both; they now live in :mod:`sketchopt.rules` (``mirror_descent``,
``dual_averaging``, ``scale_by_metric`` and the state helpers) and :mod:`sketchopt.aliases`
(``ada_fd``, ``ada_full``, ``ada_diag``, ...). Every name keeps working from here
(``CHANGELOG.md``).
"""

from sketchopt import aliases as _aliases
from sketchopt import rules as _rules
from sketchopt.aliases import *  # noqa: F403
from sketchopt.rules import *  # noqa: F403

__all__ = sorted((set(_rules.__all__) | set(_aliases.__all__)) - {"ada_lr", "radagrad"})
