# Two commands do everything on a fresh machine: `make bench` and `make test`.
# torch is installed first, pinned to the local CPU build: a bare `torch` requirement
# would otherwise pull several GB of CUDA wheels.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

# `make test-verl VERL_SRC=/path/to/verl` runs the suite against a verl checkout (e.g. verl's main
# branch) in its own virtualenv: torch first, then that verl (editable), then this package without
# its verl pin and its other requirements. VERL_VENV (default .venv-verl) keeps the environment.
VERL_SRC  ?=
VERL_VENV ?= .venv-verl

.PHONY: install test test-fast test-verl bench bench-full lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# scripts/install_venv.py installs with uv when it can (33 s against pip's 78 s here, the same versions;
# pip's settings passed along), else with pip: torch first, then this package with its extras.
$(STAMP): $(BIN)/python pyproject.toml scripts/install_venv.py
	$(BIN)/python scripts/install_venv.py torch==2.13.0 -- -e ".[test,bench,dev]"
	touch $(STAMP)

install: $(STAMP)

# `make test` spreads the test files over TEST_WORKERS pytest processes (pytest-xdist, one file per
# process at a time, so a module's fixtures stay in one process; the in-process verl v1 files go
# together, so their warm actors start once: tests/conftest.py's V1_WARM_FILES). Each process starts
# its own local Ray cluster when its first Ray test needs one. The suite is CPU-bound on two cores; three processes were
# the fastest (2026-11-27, same tree: two 707 s of pytest, three 657 s; another tree: three 628 s,
# four 735 s; 2026-11-29, one unit per file: two 863 s, three 682 s), so three stays; TEST_WORKERS=0
# runs it in one.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# `make test-fast`: the inner loop (aimed at under 2 minutes on a 2-core machine), not the gate. It
# leaves out the tests marked `ray` (they use the session's Ray cluster; set automatically from the
# fixture), `subprocess` (they start a Python interpreter: the CLI, verl's main_ppo; tests/conftest.py
# fails an unmarked one) and `slow` (a learning run, a large sweep), and runs each property test on at
# most 25 examples instead of 300-400. `make test` runs everything, at full strength.
test-fast: $(STAMP)
	ASYNC_REWARD_TEST_EXAMPLES=25 $(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not ray and not subprocess and not slow" $(PYTEST_ARGS)

test-verl:
	@test -n "$(VERL_SRC)" || { echo "usage: make test-verl VERL_SRC=/path/to/verl/checkout [VERL_VENV=dir]"; exit 2; }
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0
	$(VERL_VENV)/bin/pip install --quiet -e "$(VERL_SRC)"
	$(VERL_VENV)/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	print('\n'.join([d for d in p['dependencies'] if not d.startswith('verl')] + p['optional-dependencies']['test'] + p['optional-dependencies']['bench']))" \
	> $(VERL_VENV)/async-reward-requirements.txt
	$(VERL_VENV)/bin/pip install --quiet -r $(VERL_VENV)/async-reward-requirements.txt
	$(VERL_VENV)/bin/pip install --quiet --no-deps -e .
	$(VERL_VENV)/bin/python -c "import verl; print('verl', verl.__version__, 'from', verl.__file__)"
	$(VERL_VENV)/bin/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/async-reward bench --quick

bench-full: $(STAMP)
	$(BIN)/async-reward bench

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy src

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks scripts
	$(BIN)/ruff check --fix src tests benchmarks scripts

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache bench_out

# The docs site (mkdocs.yml, docs/) into site/, every warning an error; tests/project/test_docs.py builds it too.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
