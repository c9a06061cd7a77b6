# The two commands of the README. Each creates (or reuses) .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

.PHONY: venv run test lint
venv: $(STAMP)

# Main job: the default experiment suite; plots, JSON and a summary land in results/.
run: $(STAMP)
	$(VENV)/bin/python experiments/run.py all --out results

# The whole test suite (lint included, notebooks executed), as CI runs it.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -n 2 -q --nbmake tests notebooks

lint: $(STAMP)
	$(VENV)/bin/ruff check .
