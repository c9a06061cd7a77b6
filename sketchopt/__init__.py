"""sketchopt: full-matrix adaptive online learning at the cost of a diagonal method.

Ada-FD (AdaGrad whose full-matrix proximal term is kept as a frequent-directions sketch), robust
frequent directions, the sketched online Newton family, the AdaGrad baselines and the classic
first-order sparse online learners, all as pure-functional Optax gradient transformations.

The package is laid out along its architecture, metric x rule x regularizer (``docs/design.md``):

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
behind the FD sketches' structured ``eigh``), ``_dct`` (RADAGRAD's randomized DCT) and ``_lazy``
(the lazy package roots, this one's and :mod:`sketchopt.stream`'s). No module
imports one that imports it back (``tests/test_layout.py``). Every transform is also importable
from the package root.

The root imports nothing at first (PEP 562): ``import sketchopt`` and ``sketchopt.__version__``
load no JAX, so a command line built on the package (``sketchopt-stream --help``) answers at
once. A name of the root (``sketchopt.ada_fd``) or a submodule (``sketchopt.son``) imports its
module on first use; ``__all__``, ``dir(sketchopt)`` and ``from sketchopt import *`` hold the
names the root held when it imported every module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sketchopt import _lazy

__version__ = "0.10.0"

if TYPE_CHECKING:  # what type checkers and editors read; at run time, ``__getattr__`` below
    from sketchopt import aliases as aliases
    from sketchopt import backends as backends
    from sketchopt import baselines as baselines
    from sketchopt import first_order as first_order
    from sketchopt import inspection as inspection
    from sketchopt import kron as kron
    from sketchopt import metrics as metrics
    from sketchopt import operators as operators
    from sketchopt import regularizers as regularizers
    from sketchopt import rules as rules
    from sketchopt import shampoo as shampoo
    from sketchopt import sharding as sharding
    from sketchopt import sketches as sketches
    from sketchopt import son as son
    from sketchopt import transforms as transforms
    from sketchopt.aliases import (
        ada_diag,
        ada_diag_dual_averaging,
        ada_fd,
        ada_fd_dual_averaging,
        ada_full,
        ada_full_dual_averaging,
        ada_lr,
        inject_hyperparams,
        kron_fd,
        radagrad,
        s_adagrad,
        scale_by_ada_diag,
        scale_by_ada_fd,
        scale_by_ada_full,
    )
    from sketchopt.backends import (
        accelerator_path,
        batched_solves,
        uses_accelerator_path,
    )
    from sketchopt.first_order import (
        FTRLProximalState,
        RDAState,
        TruncatedGradientState,
        fobos_l1,
        ftrl_proximal,
        rda_l1,
        simple_truncation,
        truncated_gradient,
    )
    from sketchopt.inspection import diagnostics
    from sketchopt.metrics import (
        AdaLRMetricState,
        RadagradMetricState,
        ada_lr_metric,
        radagrad_metric,
    )
    from sketchopt.rules import (
        DualAveragingState,
        LeafGroups,
        MirrorDescentState,
        ScaleByMetricState,
        dual_averaging,
        migrate_state,
        mirror_descent,
        pack_leaf_states,
        per_leaf_states,
        scale_by_metric,
        unpack_leaf_states,
    )
    from sketchopt.son import (
        DenseInverseOperator,
        ONSLeafState,
        RandomProjectionNewtonOperator,
        RandomProjectionNewtonState,
        RescaledOperator,
        SketchedNewtonOperator,
        SketchedNewtonState,
        SONState,
        fd_son,
        newton_metric,
        oja_son,
        ons,
        project_bounded_prediction,
        rfd_son,
        rp_son,
    )

# Each root name's module: the ``__all__`` of aliases, backends, first_order, inspection, rules
# and son, and RADAGRAD's and ADA-LR's metrics (``tests/test_import_time.py`` holds the table to
# those modules).
_HOMES = {
    "aliases": (
        "ada_diag",
        "ada_diag_dual_averaging",
        "ada_fd",
        "ada_fd_dual_averaging",
        "ada_full",
        "ada_full_dual_averaging",
        "ada_lr",
        "inject_hyperparams",
        "kron_fd",
        "radagrad",
        "s_adagrad",
        "scale_by_ada_diag",
        "scale_by_ada_fd",
        "scale_by_ada_full",
    ),
    "backends": (
        "accelerator_path",
        "batched_solves",
        "uses_accelerator_path",
    ),
    "first_order": (
        "FTRLProximalState",
        "RDAState",
        "TruncatedGradientState",
        "fobos_l1",
        "ftrl_proximal",
        "rda_l1",
        "simple_truncation",
        "truncated_gradient",
    ),
    "inspection": ("diagnostics",),
    "metrics": (
        "AdaLRMetricState",
        "RadagradMetricState",
        "ada_lr_metric",
        "radagrad_metric",
    ),
    "rules": (
        "DualAveragingState",
        "LeafGroups",
        "MirrorDescentState",
        "ScaleByMetricState",
        "dual_averaging",
        "migrate_state",
        "mirror_descent",
        "pack_leaf_states",
        "per_leaf_states",
        "scale_by_metric",
        "unpack_leaf_states",
    ),
    "son": (
        "DenseInverseOperator",
        "ONSLeafState",
        "RandomProjectionNewtonOperator",
        "RandomProjectionNewtonState",
        "RescaledOperator",
        "SONState",
        "SketchedNewtonOperator",
        "SketchedNewtonState",
        "fd_son",
        "newton_metric",
        "oja_son",
        "ons",
        "project_bounded_prediction",
        "rfd_son",
        "rp_son",
    ),
}
# A new public name: its module's entry above, ``__all__`` below and the ``TYPE_CHECKING`` import.

__all__ = [
    "AdaLRMetricState",
    "DenseInverseOperator",
    "DualAveragingState",
    "FTRLProximalState",
    "LeafGroups",
    "MirrorDescentState",
    "ONSLeafState",
    "RDAState",
    "RadagradMetricState",
    "RandomProjectionNewtonOperator",
    "RandomProjectionNewtonState",
    "RescaledOperator",
    "SONState",
    "ScaleByMetricState",
    "SketchedNewtonOperator",
    "SketchedNewtonState",
    "TruncatedGradientState",
    "accelerator_path",
    "ada_diag",
    "ada_diag_dual_averaging",
    "ada_fd",
    "ada_fd_dual_averaging",
    "ada_full",
    "ada_full_dual_averaging",
    "ada_lr",
    "ada_lr_metric",
    "batched_solves",
    "diagnostics",
    "dual_averaging",
    "fd_son",
    "fobos_l1",
    "ftrl_proximal",
    "inject_hyperparams",
    "kron_fd",
    "migrate_state",
    "mirror_descent",
    "newton_metric",
    "oja_son",
    "ons",
    "pack_leaf_states",
    "per_leaf_states",
    "project_bounded_prediction",
    "radagrad",
    "radagrad_metric",
    "rda_l1",
    "rfd_son",
    "rp_son",
    "s_adagrad",
    "scale_by_ada_diag",
    "scale_by_ada_fd",
    "scale_by_ada_full",
    "scale_by_metric",
    "simple_truncation",
    "truncated_gradient",
    "unpack_leaf_states",
    "uses_accelerator_path",
]


__getattr__, __dir__ = _lazy.attach(__name__, _HOMES, __all__)
