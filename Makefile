# `make train` and `make test` do all set-up on a fresh machine: they create .venv,
# install the project (torch pinned through constraints.txt, a local CPU wheel here)
# and then train or test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=
# Test files run on three processes on a 2-core machine: most tests start a training
# process and then wait on it (a signal, a checkpoint, a timeout), so a third keeps the
# cores busy. Measured with two `yes` hogs on both cores (before the warm launcher): 7m09 with 3,
# 8m57 with 2. With it, from a fresh clone: 9m00 idle (10m16 with the install); 13m44 beside the
# two hogs (1308 tests, 3 workers).
PYTEST_WORKERS ?= 3

.PHONY: install train test test-fast bench lint clean gpu-check

# --no-compile, then bytecode for what is really imported (tests/bytecode_cache.py): about
# a minute less than letting pip compile every module of every package.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile -c constraints.txt -e ".[dev]"
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m tests.bytecode_cache
	touch $(STAMP)

# Where PYTHONDONTWRITEBYTECODE is set (as on this machine), no process caches the bytecode
# of this checkout, so each compiles the package from source again: ~1 s of the ~4 s a
# process takes to start, and the tests start well over a hundred. Stale files are ignored.
BYTECODE := $(BIN)/python -m compileall -q -j 0 optimus_preflight tests

install: $(STAMP)

# OPTIMUS_MAKE_DIR: a stopped run prints its resume command as `make -C <here> train ARGS=...`.
train: $(STAMP)
	@$(BYTECODE) > /dev/null
	OPTIMUS_MAKE_DIR="$(CURDIR)" $(BIN)/optimus-train $(ARGS)

test: $(STAMP)
	@$(BYTECODE) > /dev/null
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: everything but the end-to-end runs through subprocesses (@pytest.mark.slow).
test-fast: $(STAMP)
	@$(BYTECODE) > /dev/null
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# Every GPU-only claim checked on this machine's CUDA device, one table in $(GPU_OUT)
# (benchmarks/gpu_validation.py). Not through .venv: constraints.txt pins the CPU wheel. The
# script finds a CUDA build of torch, makes its own venv that reuses it, and installs the rest
# (offline from benchmarks/tmp_gpu_wheels when there is no index). Without CUDA every GPU part
# is reported as skipped. GPU_ARGS=--tiny: a smoke run.
GPU_OUT ?= outputs/gpu_validation
GPU_ARGS ?=
gpu-check:
	$(PYTHON) benchmarks/gpu_validation.py --out $(GPU_OUT) $(GPU_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check optimus_preflight tests benchmarks

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
