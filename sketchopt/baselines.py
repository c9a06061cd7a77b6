"""Compatibility module: the first-order learners and RADAGRAD/ADA-LR, as imported before 0.3.0.

The sparse first-order learners now live in :mod:`sketchopt.first_order`, the RADAGRAD and ADA-LR
metrics in :mod:`sketchopt.metrics` (beside the other metrics) and their aliases in
:mod:`sketchopt.aliases`. Every name keeps working from here (``CHANGELOG.md``).
"""

from sketchopt import first_order as _first_order
from sketchopt.aliases import ada_lr as ada_lr
from sketchopt.aliases import radagrad as radagrad
from sketchopt.first_order import *  # noqa: F403
from sketchopt.metrics import AdaLRMetricState as AdaLRMetricState
from sketchopt.metrics import RadagradMetricState as RadagradMetricState
from sketchopt.metrics import ada_lr_metric as ada_lr_metric
from sketchopt.metrics import radagrad_metric as radagrad_metric

__all__ = sorted(
    [
        *_first_order.__all__,
        "AdaLRMetricState",
        "RadagradMetricState",
        "ada_lr",
        "ada_lr_metric",
        "radagrad",
        "radagrad_metric",
    ]
)
