# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# The virtualenv is created on first use. torch is installed first and pinned to the CPU
# build, so pip never resolves a multi-GB CUDA build by accident.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: venv demo test lint bench docs clean

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
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest

bench: venv
	$(PY) -m benchmarks all --quick

# The docs site (docs/, Sphinx + MyST): warnings are errors, then every internal link and
# anchor of the built pages is checked (docs/check_links.py). Open docs/_build/html/index.html.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	rm -rf docs/_build
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	$(PY) docs/check_links.py docs/_build/html

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache docs/_build
