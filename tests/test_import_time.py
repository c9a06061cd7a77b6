"""The lazy package roots (issue 62, "seconds, not minutes"): ``import sketchopt``,
``sketchopt.__version__`` and the command line's ``--help`` and argument errors load no JAX, and
every name the roots held when they imported every module is still there, the same object.

Tested on the modules a fresh process holds, not on the time it takes (the time is measured by
``experiments/first_step.py --help-time``; docs/benchmarks/speed.md).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest
from experiment_support import REPO

import sketchopt as so
import sketchopt.stream as stream

# The names of the root of 0.10.0, when it imported every module (``from sketchopt.aliases import
# *`` and the others): the contract that the lazy root keeps.
ROOT_NAMES_0_10 = (
    "AdaLRMetricState DenseInverseOperator DualAveragingState FTRLProximalState LeafGroups "
    "MirrorDescentState ONSLeafState RDAState RadagradMetricState RandomProjectionNewtonOperator "
    "RandomProjectionNewtonState RescaledOperator SONState ScaleByMetricState "
    "SketchedNewtonOperator SketchedNewtonState TruncatedGradientState accelerator_path ada_diag "
    "ada_diag_dual_averaging ada_fd ada_fd_dual_averaging ada_full ada_full_dual_averaging ada_lr "
    "ada_lr_metric batched_solves diagnostics dual_averaging fd_son fobos_l1 ftrl_proximal "
    "inject_hyperparams kron_fd migrate_state mirror_descent newton_metric oja_son ons "
    "pack_leaf_states per_leaf_states project_bounded_prediction radagrad radagrad_metric rda_l1 "
    "rfd_son rp_son s_adagrad scale_by_ada_diag scale_by_ada_fd scale_by_ada_full scale_by_metric "
    "simple_truncation truncated_gradient unpack_leaf_states uses_accelerator_path"
).split()
# The modules whose ``__all__`` the eager root star-imported, and the four names it took from
# ``metrics``.
STAR_MODULES = ("aliases", "backends", "first_order", "inspection", "rules", "son")
METRICS_NAMES = ("AdaLRMetricState", "RadagradMetricState", "ada_lr_metric", "radagrad_metric")
# The modules the eager roots bound (the lazy ones bind every public module at its first use).
SUBMODULES_0_10 = (
    "aliases backends baselines first_order inspection kron metrics operators regularizers "
    "rules sharding sketches son transforms"
).split()
STREAM_SUBMODULES_0_10 = ("examples", "learners", "second_order")


def _public_modules(package) -> dict:
    prefix = package.__name__ + "."
    return {
        info.name.removeprefix(prefix): importlib.import_module(info.name)
        for info in pkgutil.iter_modules(package.__path__, prefix)
        if not info.name.removeprefix(prefix).startswith("_")
    }


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_and_the_cli_loads_no_jax():
    found = _fresh(
        "import json, sys\n"
        "import sketchopt, sketchopt.stream.cli\n"
        "names = dir(sketchopt) + dir(sketchopt.stream)\n"
        "print(json.dumps({'version': sketchopt.__version__, 'all': len(sketchopt.__all__),\n"
        "                  'jax': sorted(m for m in sys.modules if m.split('.')[0] == 'jax')}))"
    )
    assert found == {"version": so.__version__, "all": len(so.__all__), "jax": []}


# ``python -m sketchopt.stream`` runs ``__main__``, the ``sketchopt-stream`` script ``cli.main``.
_CLI = (
    "import json, runpy, sys\n"
    "sys.argv = ['sketchopt-stream', *{argv!r}]\n"
    "try:\n"
    "    {call}\n"
    "    status = 0\n"
    "except SystemExit as stop:\n"
    "    status = stop.code\n"
    "print(json.dumps({{'status': status, 'jax': 'jax' in sys.modules}}))"
)
_CALLS = {
    "script": "from sketchopt.stream.cli import main; sys.exit(main())",
    "module": "runpy.run_module('sketchopt.stream', run_name='__main__')",
}


@pytest.mark.parametrize("entry", sorted(_CALLS))
@pytest.mark.parametrize(
    ("argv", "status"),
    [(["--help"], 0), (["--no-such-flag"], 2), (["--passes", "two", "x.svm"], 2)],
)
def test_help_and_argument_errors_answer_without_jax(entry, argv, status):
    found = _fresh(_CLI.format(argv=argv, call=_CALLS[entry]))
    assert found == {"status": status, "jax": False}


def test_every_root_name_of_0_10_is_the_same_object_as_in_its_module():
    modules = _public_modules(so)
    del modules["stream"]  # its own learners (``sketchopt.stream.ada_diag``), not the root's
    star = {n for m in STAR_MODULES for n in modules[m].__all__} | set(METRICS_NAMES)
    # exact: the old names and whatever the star-imported modules export now, nothing else
    assert sorted(so.__all__) == sorted(set(ROOT_NAMES_0_10) | star)
    assert len(so.__all__) == len(set(so.__all__))
    for name in so.__all__:
        obj = getattr(so, name)
        listed = [m for m, module in modules.items() if name in getattr(module, "__all__", ())]
        assert listed, f"sketchopt.{name}: no public module lists it"
        for module in listed:
            assert getattr(modules[module], name) is obj, (name, module)
    namespace: dict = {}
    exec("from sketchopt import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(so.__all__)


@pytest.mark.parametrize(
    ("package", "old"), [(so, SUBMODULES_0_10), (stream, STREAM_SUBMODULES_0_10)]
)
def test_submodules_dir_and_unknown_names(package, old):
    modules = _public_modules(package)
    assert set(old) <= set(modules)
    for name, module in modules.items():
        assert getattr(package, name) is module
    assert [n for n in dir(package) if not n.startswith("_")] == sorted(
        {*package.__all__, *modules}
    )
    with pytest.raises(AttributeError, match=f"{package.__name__!r} has no attribute 'ada_fdd'"):
        _ = package.ada_fdd
    with pytest.raises(ImportError):
        exec(f"from {package.__name__} import no_such_name", {})
    assert "__version__" in dir(so)


def test_the_stream_package_keeps_its_names():
    modules = _public_modules(stream)
    for name in stream.__all__:
        obj = getattr(stream, name)
        assert any(getattr(m, name, None) is obj for m in modules.values()), name
    namespace: dict = {}
    exec("from sketchopt.stream import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(stream.__all__)
