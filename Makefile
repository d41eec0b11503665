# Two commands for a fresh machine (see README.md):
#   make demo   install into .venv, then run the whole pipeline on built-in data (scripts/demo.sh)
#   make test   install into .venv, then lint, type-check and run the test suite
# PyTorch is pinned to 2.13.0 here for the CPU set-up; pyproject.toml states the supported range.

VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install demo test test-quick lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-quick: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)
