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
# needs torch.distributed.set_timeout, which torch 2.13 lacks: a second venv with torch 2.14.1
# installed first, then torchtitan and what it imports, and replicaft editable, every package
# pinned by tests/support/torchtitan_cpu/constraints.txt (~5.4 GB: torch 2.14.1's build here
# carries the CUDA 13 runtime). pip's output goes to a log, shown only if the install fails.
TITAN_VENV := .venv-torchtitan
TITAN_PIP := $(TITAN_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	-c tests/support/torchtitan_cpu/constraints.txt
TITAN_LOG := $(TITAN_VENV)/install.log

$(TITAN_VENV)/.installed: pyproject.toml tests/support/torchtitan_cpu/constraints.txt
	$(PYTHON) -m venv $(TITAN_VENV)
	@echo "installing torch 2.14.1, torchtitan 0.3.0 and replicaft into $(TITAN_VENV) (log: $(TITAN_LOG))"
	@{ $(TITAN_PIP) torch==2.14.1 && $(TITAN_PIP) torchtitan==0.3.0 && $(TITAN_PIP) -e . ; } \
		>$(TITAN_LOG) 2>&1 || { cat $(TITAN_LOG); exit 1; }
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
