# Two commands for a fresh machine (see README.md):
#   make demo   install into .venv, then run the whole pipeline on built-in data (scripts/demo.sh)
#   make test   install into .venv (and the reference environments, .venv-refs/), then lint, type-check and run
#               the test suite
# PyTorch is pinned to 2.13.0 here; pyproject.toml states the supported range.
#
# Which build of torch: `make install` takes torch==2.13.0 from pip's configured index. On this project's CI and
# dev machines that index holds the CPU wheel. On a machine that reaches only the public index (PyPI), the same
# pin resolves to the CUDA build plus about 20 nvidia-* packages: several GB that a CPU machine does not need.
# For the CPU build there, take torch (and only torch) from PyTorch's CPU wheel index:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (an existing .venv is kept: `rm -rf .venv` first to switch builds). Everything else still comes from pip's
# configured index, and the project's own install then finds torch satisfied and leaves it.

VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?= --durations=25  # the slowest tests, listed at the end: the suite is kept under ~15 minutes on 2 cores

.PHONY: install demo test test-quick lint refs

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(PY) -m pip install --quiet -e ".[dev]"
	# the project's own bytecode, which an editable install leaves to the first import (never written where
	# PYTHONDONTWRITEBYTECODE is set: every command then compiles ~65 modules, ~0.2 s; benchmarks/trace_latency.py)
	$(PY) -m compileall -q olmo_data cli olmo_train olmo_view
	touch $@

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# the reference libraries the tests compare with that cannot share .venv (ai2-olmo ships a package named
# olmo_data): each in a venv of its own under .venv-refs/; its tests skip, saying why, when it could not be made
refs:
	bash scripts/ai2_olmo_env.sh || echo "note: the ai2-olmo reference environment could not be made; the reference tests of tests/convert/test_hf_olmo.py skip (.venv-refs/ai2-olmo.failed says why)"

test: lint refs
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-quick: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)
