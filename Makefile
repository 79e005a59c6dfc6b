# `make demo` and `make test` are all a fresh machine needs: each creates
# .venv when it is missing, installs gpuir with every extra, then runs.
# What gets installed, and how large it is: docs/install.md.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.gpuir-installed
# Sizes for the main job; override e.g. `make demo DEMO_ARGS="--records 50000"`.
DEMO_ARGS ?=
PYTEST_ARGS ?=
# The extras `make setup` installs (all of them).
EXTRAS := cpu,gpu,dense,dense-torch,routing,service,ray,langchain,llamaindex,mcp,bench,dev

.PHONY: demo test setup browser bench-cpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install_torch.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 first, the build this machine needs: without an NVIDIA driver a CPU
	# build (PyTorch's CPU index when reachable); the script says what and why.
	sh scripts/install_torch.sh $(BIN)/python
	@echo "make setup: installing gpuir (editable) with the extras $(EXTRAS)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	sh scripts/install_browser.sh
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuir demo $(DEMO_ARGS)

# Debian's Chromium for the browser tests of the memory inspector page (installed when missing, as root).
browser:
	sh scripts/install_browser.sh

test: $(STAMP) browser
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

bench-cpu: $(STAMP)
	$(BIN)/python bench/bench_cpu.py

clean:
	rm -rf $(VENV) build *.egg-info
