# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# The virtualenv is created on first use. torch is installed first and pinned to the CPU
# build, so pip never resolves a multi-GB CUDA build by accident.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: venv venv-torchtitan demo test lint bench docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# torchtitan 0.3.0's torchft experiment on replicaft (tests/replicaft/compat/test_torchtitan.py)
# needs torch.distributed.set_timeout, which torch 2.13 lacks: a second venv with torch 2.14.1,
# pinned first (from this machine's local index) so pip resolves no other build, then torchtitan
# and the packages it imports at pinned versions, and replicaft editable.
TITAN_VENV := .venv-torchtitan
TITAN_PY := $(TITAN_VENV)/bin/python
TITAN_TORCH_VERSION ?= 2.14.1

$(TITAN_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TITAN_VENV)
	$(TITAN_PY) -m pip install -q --disable-pip-version-check torch==$(TITAN_TORCH_VERSION)
	$(TITAN_PY) -m pip install -q --disable-pip-version-check torch==$(TITAN_TORCH_VERSION) torchtitan==0.3.0 \
		torchdata==0.11.0 datasets==4.7.0 tokenizers==0.22.1
	$(TITAN_PY) -m pip install -q --disable-pip-version-check torch==$(TITAN_TORCH_VERSION) -e .
	touch $@

venv-torchtitan: $(TITAN_VENV)/.installed

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
	rm -rf $(VENV) $(TITAN_VENV) .pytest_cache .ruff_cache docs/_build
