# One venv for everything; every target bootstraps it from nothing and is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m neuron_lab doctor
	$(BIN)/python -m neuron_lab.demo

test: $(STAMP)
	$(BIN)/ruff check neuron_lab tests bench
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check neuron_lab tests bench

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/extension_overhead.py
	$(BIN)/python bench/widgets_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
