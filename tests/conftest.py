"""Shared test configuration: Hypothesis profiles.

``ci`` (the default) keeps property tests modest and reproducible so the suite stays fast on a
2-core CPU machine: no deadline (the first example of a shape pays for JIT compilation), a fixed
derandomized example sequence, and at most 30 examples per test unless a test asks for fewer.
``dev`` explores more and randomly; select it with ``HYPOTHESIS_PROFILE=dev``.
"""

import os
import shutil
import tempfile

# JAX's CPU eigh/qr go through LAPACK; a multi-threaded BLAS pool spins on a busy 2-core machine
# (a 100x100 eigh took ~80x longer), and pytest-xdist already uses both cores. Set before any
# test module imports jax.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# The suite's wall time is mostly XLA:CPU compiling thousands of small programs. Tests check
# values, not speed, so they compile the cheap way: at backend optimization level 0 (a third of
# the compile time was LLVM's backend optimizations) and with XLA:CPU's classic elemental fusion
# emitters instead of its newer MLIR fusion emitters (which took 40% of what was left: 41 s ->
# 24 s for one step of each of the 27 families of tests/test_robustness.py). Fast-math stays off
# either way: only the speed of the compiled code and the last bits of transcendental functions
# can differ.
# Subprocesses (the sharding test, the experiments' CLI runs) inherit the flags. Timings are
# measured by the benchmark scripts, in their own processes, with the default pipeline. Set
# SKETCHOPT_TEST_XLA_OPT=default to test the default pipeline.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
if os.environ.get("SKETCHOPT_TEST_XLA_OPT", "0") != "default":
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *TEST_XLA_FLAGS]).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# One run compiles many identical programs in different tests, workers and subprocesses (the same
# family on the same tree, the experiments' CLI runs). JAX's persistent compilation cache, in a
# directory made for this run and removed after it, lets them compile once (test_son and
# test_regularizers: 3m39 -> 3m05 wall from a cold cache). The directory is created by the
# controlling process and handed on through JAX's own environment variables, which the xdist
# workers and every subprocess inherit. SKETCHOPT_TEST_JAX_CACHE=off compiles everything afresh.
_CACHE_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}

settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Every compiled XLA:CPU program keeps a few memory mappings alive while JAX caches it. One xdist
# worker compiles thousands of programs over the suite (op-by-op debug_nans runs, hypothesis
# shapes, x64 variants) and approached Linux's vm.max_map_count (65530 by default), where the next
# compilation's mmap fails and XLA segfaults. Drop JAX's caches when the count gets within 10k of
# the machine's limit (55.5k by default), ten times what the costliest test adds (about 1k: a
# hypothesis run or an op-by-op step of one family), and at 55.5k at most (a machine with a higher
# limit keeps the memory the cached programs hold bounded as here). Each drop costs seconds and
# the programs compiled again after it (a bound of 40k dropped twice per run, ~15 s of the suite's
# wall time), so the bound is not set lower than it needs to be.
_MAPS = "/proc/self/maps"
_MAPS_MARGIN = 10_000
_DEFAULT_MAP_COUNT = 65_530  # Linux's default vm.max_map_count


def _max_maps() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            count = int(limit.read())
    except (OSError, ValueError):  # not Linux
        count = _DEFAULT_MAP_COUNT
    return min(count, _DEFAULT_MAP_COUNT) - _MAPS_MARGIN


_MAX_MAPS = _max_maps()


@pytest.fixture(autouse=True)
def _bound_compiled_program_mappings():
    yield
    try:
        with open(_MAPS, "rb") as maps:
            count = sum(1 for _ in maps)
    except OSError:  # not Linux
        return
    if count > _MAX_MAPS:
        jax.clear_caches()


def pytest_configure(config):
    if os.environ.get("SKETCHOPT_TEST_JAX_CACHE") == "off":
        # the command line's own cache (on by default there) in a folder of the run's, never
        # the user's ~/.cache/sketchopt/jax
        config._sketchopt_jax_cache = tempfile.mkdtemp(prefix="sketchopt-cli-cache-")
        os.environ.setdefault("SKETCHOPT_JAX_CACHE_DIR", config._sketchopt_jax_cache)
        return
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the controller (or a plain run)
        config._sketchopt_jax_cache = tempfile.mkdtemp(prefix="sketchopt-jax-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config._sketchopt_jax_cache
        os.environ.update(_CACHE_ENV)
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def pytest_unconfigure(config):
    cache = getattr(config, "_sketchopt_jax_cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)


# The development tier (``make test-fast``, SKETCHOPT_TEST_TIER=fast): the tests parametrized by a
# transform family, sketch, metric or regularizer (``name``) run for this sample only, one of each
# kind of state and code path; a test none of whose names is sampled runs for its first one, so
# every check still runs once. ``make test`` (CI) runs every name.
FAST_SAMPLE = frozenset(
    {
        # transform families: a sketch under each rule, the diagonal metric, SON, a sparse learner
        "ada_fd",
        "ada_fd_dual_averaging",
        "ada_diag",
        "fd_son",
        "ftrl_proximal",
        # sketches and metrics
        "fd",
        "fast_rfd",
        "oja",
        "rp",
        "diag",
        "full",
        # regularizers: the separable prox (the l1-ball's constrained solver, the costliest to
        # compile, is left to make test)
        "l1",
        # test_son's SON variants
        "fd_diag",
        "ons",
    }
)


# The Optax conformance battery (tests/test_conformance.py, marked ``conformance``) is a CI tier of
# its own, ``make conformance`` (SKETCHOPT_TEST_TIER=conformance); the other tiers run the cases of
# this one sample transform only, so that every check still runs in ``make test``.
CONFORMANCE_SAMPLE = "ada_fd"

# The robustness sweep over every family (tests/test_robustness.py: extreme and non-finite
# gradients, eager steps, low precision, fuzzing, checkpoints) is a CI tier of its own too, ``make
# test-robustness`` (SKETCHOPT_TEST_TIER=robustness); the other tiers run each of its checks for
# the families of FAST_SAMPLE only (about 130 of its 400 cases), so that ``make test`` keeps its
# time budget and still makes every check.
ROBUSTNESS_MODULE = "test_robustness"


def _conformance_sample(items, config):
    drop = [
        item
        for item in items
        if item.get_closest_marker("conformance") is not None
        and _family(item) != CONFORMANCE_SAMPLE
    ]
    if drop:
        dropped = set(map(id, drop))
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if id(item) not in dropped]


def _family(item):
    name = getattr(getattr(item, "callspec", None), "params", {}).get("name")
    return name if isinstance(name, str) else None


def _in(item, module):
    return module is None or item.module.__name__.rpartition(".")[2] == module


def _fast_tier_sample(items, config, module=None):
    """Keep the FAST_SAMPLE families of every per-family test (of ``module`` only, when given),
    or the first family collected where a test has none of them."""
    seen: dict[tuple, str] = {}  # (module, test function) -> the first name collected
    sampled: set[tuple] = set()
    for item in items:
        if (name := _family(item)) is not None and _in(item, module):
            key = (item.module.__name__, item.originalname)
            seen.setdefault(key, name)
            if name in FAST_SAMPLE:
                sampled.add(key)
    keep, drop = [], []
    for item in items:
        if (name := _family(item)) is not None and _in(item, module):
            key = (item.module.__name__, item.originalname)
            if name not in FAST_SAMPLE and (key in sampled or seen[key] != name):
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Mark the notebooks ``experiments`` (their tier, ``make test-experiments``; this hook runs
    before ``-m`` deselects), and start the tests marked ``first`` (the minutes-long 8-device
    sharding subprocess) before the others: pytest-xdist hands out items in collection order,
    and a long item collected last leaves the other worker idle while it runs.

    The tests of one module parametrized by a transform family (``name``) run on one worker
    (``--dist loadgroup``, set in the Makefile): they share the family's compiled step, which
    each worker would otherwise compile again.
    """
    for item in items:  # the notebooks (nbmake's items) run in the experiments' tier
        if str(getattr(item, "path", "")).endswith(".ipynb"):
            item.add_marker(pytest.mark.experiments)
    tier = os.environ.get("SKETCHOPT_TEST_TIER")
    if tier != "conformance":
        _conformance_sample(items, config)
    if tier != "robustness":
        _fast_tier_sample(items, config, ROBUSTNESS_MODULE)
    if tier == "fast":
        _fast_tier_sample(items, config)
    for item in items:
        if (family := _family(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{family}"))
    items.sort(key=lambda item: item.get_closest_marker("first") is None)
