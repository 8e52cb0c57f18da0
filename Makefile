# One venv for everything; every target bootstraps it from nothing and is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo lab test lint bench readme clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# The quickstart notebook, executed headless on whatever backend this machine has; the summary is printed and
# the executed notebook and its HTML land in out/. tests/test_make.py runs this exact command.
DEMO := $(BIN)/neuron-lab run notebooks/01_quickstart.ipynb --output out/01_quickstart.ipynb \
	--html out/01_quickstart.html --json out/01_quickstart.json

demo: $(STAMP)
	$(DEMO)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

test: $(STAMP)
	$(BIN)/ruff check neuron_lab tests bench
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check neuron_lab tests bench

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/extension_overhead.py
	$(BIN)/python bench/widgets_overhead.py
	$(BIN)/python bench/checks_overhead.py --steps 50

# Regenerates README.md's reference blocks (magics, settings, environment) from the code.
readme: $(STAMP)
	$(BIN)/python -m neuron_lab.reference --write README.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info out
