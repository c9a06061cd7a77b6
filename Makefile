# The two commands of the README (`make run`, `make test`); each creates (or reuses) .venv and
# installs what it needs. `make bench` runs the library's own benchmarks (speed, vw, networks,
# defaults), outside `make run`'s time budget. `make ci` is what .ci/run runs on a fresh
# machine: the tests, the conformance battery, the documentation site (`make docs`), then the
# packaging checks (the lowest declared dependency versions; the built wheel against the newest
# JAX, Optax and Flax).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
# XLA's TPU compiler (libtpu, the version the installed JAX names) for make test-accelerators, in
# a folder of its own on PYTHONPATH: in the environment itself every JAX process would look for
# a TPU at start.
LIBTPU := $(VENV)/libtpu
LIBTPU_STAMP := $(LIBTPU)/.installed
DOCS_BUILD := build/docs
CI_DIR := build/ci
# --dist loadgroup: a family's tests are marked to share one worker (tests/conftest.py; not
# honoured by pytest-xdist 3.8 here, see the README).
PYTEST := $(VENV)/bin/python -m pytest -n 2 --dist loadgroup -q
# The modules the packaging checks run: the sketches and the transforms built on them.
SMOKE_TESTS := tests/test_sketches.py tests/test_transforms.py

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The docs extra (Sphinx, MyST-NB, the theme) on top of dev, which the API pages and the guides'
# examples import.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(VENV)/bin/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

.PHONY: venv run bench readme test test-experiments test-robustness test-benchmarks test-devices test-accelerators test-fast conformance docs lint ci smoke-lowest smoke-wheel
venv: $(STAMP)

# Main job: the papers' reproductions at the default size (at most 20 minutes on a 2-core
# machine); plots, JSON and a summary land in results/.
run: $(STAMP)
	$(VENV)/bin/python experiments/run.py all --out results

# The library's own benchmarks (experiments/run.py BENCHMARKS: speed, vw, networks, defaults) at
# the default size, into results/ beside the reproductions (the README's headline table quotes
# speed's claim from there); more than an hour on a 2-core machine.
bench: $(STAMP)
	$(VENV)/bin/python experiments/run.py bench --out results

# The README's headline tables (reproductions, speed, streams, networks) rewritten from the JSON
# in results/ (experiments/readme_tables.py); a table whose JSON is absent stays as it is.
readme: $(STAMP)
	$(VENV)/bin/python experiments/readme_tables.py --results results --readme README.md

# The test suite (lint included, the docstrings' examples run), as CI runs it first; the papers'
# experiments at quick size with the notebooks (test-experiments), the robustness sweep over every
# family (test-robustness; this tier runs its checks on a sample of families), the benchmarks'
# quick runs (test-benchmarks, as `make bench` is outside `make run`'s budget) and the 8-device
# sharding run (test-devices) are tiers of their own, run by CI after it, so that this one keeps
# its budget.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PYTEST) -m "not benchmark and not devices and not experiments and not accelerators" \
		--doctest-modules \
		--durations=15 tests sketchopt

# The reproductions of the papers' experiments (experiments/run.py's IN_ALL, tests marked
# experiments) at their quick size, each with the claims that hold there, and the notebooks
# executed (--nbmake): a CI tier after make test (about 3.5 CPU-minutes, 2 of wall time on a
# 2-core machine).
test-experiments: $(STAMP)
	$(PYTEST) -m experiments --nbmake --durations=10 tests notebooks

# The robustness sweep (tests/test_robustness.py) over every transform family: make test runs each
# of its checks for a sample of the families (tests/conftest.py, ROBUSTNESS_MODULE); a CI tier
# after make test.
test-robustness: $(STAMP)
	SKETCHOPT_TEST_TIER=robustness $(PYTEST) --durations=10 tests/test_robustness.py

# The library's own benchmarks (experiments/run.py BENCHMARKS: speed, vw, networks, defaults) at
# their quick size: the form of their JSON and the claims that hold there. A CI tier after make
# test (about 2.5 minutes of the suite's time on a 2-core machine).
test-benchmarks: $(STAMP)
	$(PYTEST) -m benchmark --durations=10 tests

# The 8-device sharding run (tests/test_sharding.py, marked devices: every family and mode on 8
# host CPU devices in a subprocess, then the orbax restore) and the 2-process run
# (tests/test_multiprocess.py: jax.distributed on localhost, 4 CPU devices each, against one
# device, with an Orbax checkpoint written by both); about three minutes on a 2-core machine:
# a CI tier after make test.
test-devices: $(STAMP)
	$(PYTEST) -m devices --durations=5 tests

# Every public transform's update, the README's Flax step and a 4-device sharded step compiled
# for a TPU v5e slice by XLA's TPU compiler, deviceless (tests/test_accelerators.py; libtpu
# installed first, the version the installed JAX names): a CI tier after make test.
test-accelerators: $(STAMP) $(LIBTPU_STAMP)
	PYTHONPATH=$(LIBTPU) SKETCHOPT_TEST_TIER=accelerators $(PYTEST) -m accelerators \
		--durations=5 tests/test_accelerators.py

$(LIBTPU_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet --upgrade --target $(LIBTPU) \
		"$$($(VENV)/bin/python .ci/libtpu_requirement.py)"
	touch $(LIBTPU_STAMP)

# The development tier: everything but the tests marked slow (experiments, notebooks, the
# 8-device sharding run, the long float32 drift runs), and the per-family tests for a sample of
# the families only (tests/conftest.py, FAST_SAMPLE).
test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	SKETCHOPT_TEST_TIER=fast $(PYTEST) -m "not slow and not accelerators" --doctest-modules \
		--durations=10 tests sketchopt

# The Optax conformance battery over every public transform (tests/test_conformance.py): a CI tier
# of its own, after make test, which runs one sample transform's cases of it.
conformance: $(STAMP)
	SKETCHOPT_TEST_TIER=conformance $(PYTEST) --durations=15 tests/test_conformance.py

# The documentation site (docs/, offline) into build/docs/html, from scratch, with every warning an
# error (a broken cross-reference, a public name missing from the API reference); then the
# doctest builder runs the pages' examples on the environment the first build pickled. The
# experiments' tables come from results/ (make run) when it is there, SKETCHOPT_RESULTS=DIR for
# another folder.
docs: $(DOCS_STAMP)
	rm -rf $(DOCS_BUILD) docs/api/generated
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html -d $(DOCS_BUILD)/doctrees docs \
		$(DOCS_BUILD)/html
	$(VENV)/bin/sphinx-build -W -q -b doctest -d $(DOCS_BUILD)/doctrees docs $(DOCS_BUILD)/doctest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

ci: test test-experiments test-robustness test-benchmarks test-devices test-accelerators conformance docs \
	smoke-lowest smoke-wheel

# The lowest declared versions of every dependency ("lowest direct" resolution, pins written by
# .ci/lowest_requirements.py) in a separate environment, and the smoke subset of the tests. These
# run with XLA's default compiler pipeline (make test compiles the cheap way, tests/conftest.py).
smoke-lowest:
	rm -rf $(CI_DIR)/venv-lowest
	mkdir -p $(CI_DIR)
	$(PYTHON) .ci/lowest_requirements.py dev > $(CI_DIR)/lowest.txt
	$(PYTHON) -m venv $(CI_DIR)/venv-lowest
	$(CI_DIR)/venv-lowest/bin/pip install --quiet --upgrade pip
	$(CI_DIR)/venv-lowest/bin/pip install --quiet -c $(CI_DIR)/lowest.txt -e . \
		pytest pytest-xdist hypothesis chex scipy orbax-checkpoint
	$(CI_DIR)/venv-lowest/bin/pip list 2>/dev/null | grep -iE '^(jax|jaxlib|optax|chex|numpy) '
	SKETCHOPT_TEST_XLA_OPT=default $(CI_DIR)/venv-lowest/bin/python -m pytest -n 2 -q \
		-p no:cacheprovider -m "not slow" \
		$(SMOKE_TESTS)

# The wheel as users install it: built, installed into a clean environment with the newest JAX,
# Optax and Flax the registry serves, and smoke-tested from outside the checkout.
smoke-wheel:
	rm -rf $(CI_DIR)/dist $(CI_DIR)/venv-wheel
	mkdir -p $(CI_DIR)
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(CI_DIR)/dist .
	$(PYTHON) -m venv $(CI_DIR)/venv-wheel
	$(CI_DIR)/venv-wheel/bin/pip install --quiet --upgrade pip
	$(CI_DIR)/venv-wheel/bin/pip install --quiet --upgrade --upgrade-strategy eager \
		$(CI_DIR)/dist/sketchopt-*.whl jax jaxlib optax flax
	cd $(CI_DIR) && venv-wheel/bin/python $(CURDIR)/.ci/smoke.py $(CURDIR)
