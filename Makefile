# `make demo` and `make test` are all a fresh machine needs: each creates
# .venv when it is missing, installs gpuir with every extra, then runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.gpuir-installed
# Sizes for the main job; override e.g. `make demo DEMO_ARGS="--records 50000"`.
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test setup bench-cpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: left unpinned it drags in gigabytes of CUDA wheels.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[cpu,gpu,dense,routing,service,langchain,llamaindex,mcp,bench,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuir demo $(DEMO_ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

bench-cpu: $(STAMP)
	$(BIN)/python bench/bench_cpu.py

clean:
	rm -rf $(VENV) build *.egg-info
