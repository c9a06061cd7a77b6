"""sketchopt: full-matrix adaptive online learning at the cost of a diagonal method.

Ada-FD (AdaGrad whose full-matrix proximal term is kept as a frequent-directions sketch), robust
frequent directions, the sketched online Newton family, the AdaGrad baselines and the classic
first-order sparse online learners, all as pure-functional Optax gradient transformations.

The package is laid out along its architecture, metric x rule x regularizer (``DESIGN.md``):

* :mod:`sketchopt.sketches` -- streaming sketches of the gradients (FD, RFD, Oja, random
  projection);
* :mod:`sketchopt.operators` -- the structured ``H_t`` a metric hands to the rules;
* :mod:`sketchopt.metrics` -- the curvature axis: ADA-DIAG, ADA-FULL, ADA-FD (any sketch),
  RADAGRAD, ADA-LR;
* :mod:`sketchopt.rules` -- the rule axis: mirror descent, dual averaging, ``scale_by_metric``;
* :mod:`sketchopt.regularizers` -- the regularizer axis: composite proximal steps in the
  ``H_t``-norm;
* :mod:`sketchopt.aliases` -- the named algorithms, one line each on the three axes;
* :mod:`sketchopt.son` -- the sketched online Newton family (FD-, RFD-, Oja-, RP-SON, ONS): SON's
  metric under the mirror-descent rule, and the bounded-prediction projection;
* :mod:`sketchopt.first_order` -- FOBOS, RDA, FTRL-Proximal, truncated gradient;
* :mod:`sketchopt.sharding` -- state shardings for ``jax.jit`` across devices;
* :mod:`sketchopt.inspection` -- :func:`diagnostics`, what to watch in a running optimizer;
* :mod:`sketchopt.backends` -- the code paths per backend: :func:`accelerator_path`, which runs
  the accelerators' path on the CPU, and :func:`batched_solves`, one solver call per kind and
  level for all shape groups.

Package-internal (underscore) modules hold what the public ones share, each in one place:
``_numerics`` (power-of-two scaling, safe norms, ``eigh``, precision and dtype rules),
``_partitioning`` (sharding helpers), ``_validation`` (argument checks), ``_groups`` (the group
context the sketches consult inside the driver's ``vmap`` over a group of leaves), ``_layouts``
(the state layout rules under a mesh, which :mod:`sketchopt.sharding` publishes), ``_leafwise``
(the one per-leaf driver every transform runs on), ``_solvers`` (the small factorizations,
batched across the driver's groups), ``_arrowhead`` (the arrowhead eigensolver
behind the FD sketches' structured ``eigh``) and ``_dct`` (RADAGRAD's randomized DCT). No module
imports one that imports it back (``tests/test_layout.py``). Every transform is also importable
from the package root.
"""

# ``baselines`` and ``transforms``: the modules of 0.2, kept importable (CHANGELOG.md, 0.3.0).
from sketchopt import aliases as aliases
from sketchopt import backends as backends
from sketchopt import baselines as baselines
from sketchopt import first_order as first_order
from sketchopt import inspection as inspection
from sketchopt import metrics as metrics
from sketchopt import operators as operators
from sketchopt import regularizers as regularizers
from sketchopt import rules as rules
from sketchopt import sharding as sharding
from sketchopt import sketches as sketches
from sketchopt import transforms as transforms
from sketchopt.aliases import *  # noqa: F403
from sketchopt.backends import *  # noqa: F403
from sketchopt.first_order import *  # noqa: F403
from sketchopt.inspection import *  # noqa: F403
from sketchopt.metrics import AdaLRMetricState as AdaLRMetricState
from sketchopt.metrics import RadagradMetricState as RadagradMetricState
from sketchopt.metrics import ada_lr_metric as ada_lr_metric
from sketchopt.metrics import radagrad_metric as radagrad_metric
from sketchopt.rules import *  # noqa: F403
from sketchopt.son import *  # noqa: F403

__version__ = "0.10.0"
