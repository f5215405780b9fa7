# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# The virtualenv is created on first use. torch is installed first and pinned to the CPU
# build, so pip never resolves a multi-GB CUDA build by accident.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: venv demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m chaos demo

test: venv
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

bench: venv
	$(PY) -m benchmarks all --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
