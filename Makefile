# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest bench clean install

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m app.cli zoo --out zoo

lint: $(STAMP)
	$(VENV)/bin/ruff check models analysis app migrations tests bench
	$(VENV)/bin/ruff format --check models analysis app migrations tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) var zoo .pytest_cache .mypy_cache .ruff_cache
