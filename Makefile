# One venv for everything; every target bootstraps it from nothing and is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo lab test test-fast lint bench readme docs core wheel wheel-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build. The package is then installed
# without build isolation, so the compiled core is built against this torch (never a second one).
$(STAMP): $(BIN)/python pyproject.toml setup.py
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0 ninja 'setuptools>=77' wheel
	NEURON_LAB_BUILD_CORE=0 $(BIN)/pip install -q --disable-pip-version-check --no-build-isolation -e '.[test,lab,docs]'
	touch $(STAMP)

# The emulator's compiled core, built in place by the package's own setup.py (ninja, both cores of the machine).
CORE := $(VENV)/.core
$(CORE): $(STAMP) setup.py $(wildcard neuron_lab/backend/emulator/csrc/*.cpp neuron_lab/backend/emulator/csrc/*/*)
	MAX_JOBS=2 $(BIN)/python setup.py -q build_ext --inplace
	touch $(CORE)

core: $(CORE)

# A wheel that carries the compiled core, built against this venv's pinned torch (no build isolation: pip would fetch
# a second torch to build against) and requiring that torch minor, then given its manylinux tag by `auditwheel repair`
# into dist/: torch's own libraries are excluded, never vendored (they come from the torch wheel the pin requires).
# wheel-check installs it into a fresh venv with no compiler on PATH (the dependencies lent by this venv) and checks
# it: `auditwheel show`, %load_ext, an op on neuron served by the compiled core, `neuron-lab doctor` there, and
# the pure-Python core under a core record naming another torch minor.
WHEEL_BUILD := build/wheel
wheel: $(STAMP)
	rm -f dist/neuron_lab-*.whl $(WHEEL_BUILD)/neuron_lab-*.whl
	MAX_JOBS=2 $(BIN)/pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w $(WHEEL_BUILD) .
	PATH=$(BIN):$$PATH $(BIN)/auditwheel repair --exclude 'libtorch*.so' --exclude libc10.so -w dist \
		$(WHEEL_BUILD)/neuron_lab-*.whl

wheel-check: wheel
	PYTHON=$(BIN)/python tools/check_wheel.sh dist/neuron_lab-*.whl

# The quickstart notebook, executed headless on whatever backend this machine has; the summary is printed and
# the executed notebook and its HTML land in out/. tests/test_make.py runs this exact command.
DEMO := $(BIN)/neuron-lab run notebooks/01_quickstart.ipynb --output out/01_quickstart.ipynb \
	--html out/01_quickstart.html --json out/01_quickstart.json

demo: $(CORE)
	$(DEMO)

lab: $(CORE)
	$(BIN)/jupyter lab notebooks/

# Everything on the compiled core, then the backend tests and the OpInfo sweep again on the pure-Python core.
BACKEND_TESTS := tests/test_device.py tests/test_memory.py tests/test_op_reporting.py tests/test_serialization.py \
	tests/test_training.py tests/test_opinfo_conformance.py tests/test_cores.py tests/test_compile.py \
	tests/test_torch_neuronx.py tests/test_compile_cells.py tests/test_distributed.py tests/test_memory_snapshot.py \
	tests/test_conformance_bugs.py tests/test_moduleinfo_conformance.py tests/test_out_conformance.py tests/test_syncs.py \
	tests/test_opinfo64_conformance.py tests/test_aborts.py tests/test_int64_rule.py tests/test_checkup.py \
	tests/test_attention.py
# speedscope (MIT, from npm): the offline viewer tools/render_trace.py shows exported traces in; its test needs it.
# Installed where npm is (CI installs npm); elsewhere that test skips and says how to install it.
SPEEDSCOPE := $(VENV)/speedscope/node_modules/speedscope/package.json
$(SPEEDSCOPE): | $(BIN)/python
	npm install --prefix $(VENV)/speedscope --no-audit --no-fund --ignore-scripts --silent speedscope@1.25.0

# The two passes run side by side (make -j2): a third of a pass's time is spent waiting on kernels, ranks, browsers
# and subprocesses, which the other pass fills. The pure-Python pass writes its log to out/ and prints it whole when it
# ends, so the two never interleave line by line. loadgroup hands each worker the next test (or the next group of
# tests that share one start of ranks, a kernel or JupyterLab: tests/conftest.py) whenever it runs low, in the order
# conftest sorts them (the slowest first; --no-loadscope-reorder keeps that order).
test: $(CORE) $(if $(shell command -v npm),$(SPEEDSCOPE))
	$(BIN)/ruff check neuron_lab tests bench tools setup.py _neuron_lab_torch_neuronx.py _neuron_lab_cli.py
	$(BIN)/lint-imports --no-logo
	$(MAKE) --no-print-directory -j2 -k test-compiled-core test-python-core

.PHONY: test-compiled-core test-python-core
test-compiled-core: $(CORE)
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=15 tests

test-python-core: $(CORE)
	@mkdir -p out
	NEURON_LAB_CORE=python $(BIN)/python -m pytest -n 1 -p no:cacheprovider --durations=15 $(BACKEND_TESTS) \
		> out/pytest-python-core.log 2>&1; status=$$?; cat out/pytest-python-core.log; exit $$status

# A quick loop: no kernels, browsers or `make demo`, compiled core only.
test-fast: $(CORE)
	$(BIN)/python -m pytest -n 2 -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check neuron_lab tests bench tools setup.py _neuron_lab_torch_neuronx.py _neuron_lab_cli.py
	$(BIN)/lint-imports --no-logo

# bench/all.py runs every bench script, each timed, in two lanes side by side (the timed scripts one after another;
# the counted ones, instructions under callgrind and device syncs, which no load moves, beside them), then prints
# every figure in one table (target, holds) and writes out/bench.json: `bench/table.py --compare old.json new.json`.
# A script that fails is said in the log and leaves its figures out; the others and the table still run.
# BENCH_CALLGRIND_ROUNDS: rounds of the extension's cells counted in instructions under valgrind (the counts vary by
# well under 1% between rounds; 0: none). BENCH_COMPARE: an earlier run's out/bench.json (main's) to set this one beside.
BENCH_CALLGRIND_ROUNDS ?= 2
BENCH_COMPARE ?=
bench: $(CORE)
	$(BIN)/python bench/all.py --callgrind-rounds $(BENCH_CALLGRIND_ROUNDS) $(if $(BENCH_COMPARE),--compare $(BENCH_COMPARE))

# Regenerates the reference blocks of docs/notebook.md (magics) and docs/configuration.md (settings,
# environment) from the code.
readme: $(STAMP)
	$(BIN)/python tools/readme_reference.py --write docs/notebook.md docs/configuration.md docs/torchneuron.md docs/headless.md

# The documentation site (mkdocs.yml), into out/site: every notebook executed afresh by `neuron-lab run` (two at a
# time; each one's log in out/docs/notebooks/), then `mkdocs build --strict`, which fails on an internal link or
# anchor that resolves nowhere and on a page missing from the nav. tools/docs_site.py reads the executed copies there.
DOCS_RUN := out/docs/notebooks
DOCS_NOTEBOOKS := $(patsubst notebooks/%,$(DOCS_RUN)/%,$(wildcard notebooks/*.ipynb))

$(DOCS_RUN)/%.ipynb: notebooks/%.ipynb  # made by `docs` below, once the venv and the core are
	@mkdir -p $(@D)
	@$(BIN)/neuron-lab run $< --output $@ > $(DOCS_RUN)/$*.log 2>&1 \
		&& echo "$<: $$(grep -m1 '^summary:' $(DOCS_RUN)/$*.log)" \
		|| { cat $(DOCS_RUN)/$*.log; rm -f $@; exit 1; }

docs: $(CORE)
	rm -rf out/docs out/site
	$(MAKE) --no-print-directory -j2 --always-make $(DOCS_NOTEBOOKS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache build dist *.egg-info out neuron_lab/backend/emulator/_core*.so
