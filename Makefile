# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest chromium bench clean install

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Train the demo zoo if missing, register it, queue one atlas of it over digits, then serve
# http://127.0.0.1:8000 (the in-process worker computes the atlas). Idempotent.
run: $(STAMP)
	$(PY) -m app.cli demo --zoo zoo
	$(PY) -m app.cli serve

lint: $(STAMP)
	$(VENV)/bin/ruff check models analysis app migrations tests bench
	$(VENV)/bin/ruff format --check models analysis app migrations tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -q

# The browser test drives Debian's Chromium through Playwright; Playwright never downloads one.
chromium:
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)

test: lint typecheck chromium pytest

clean:
	rm -rf $(VENV) var zoo .pytest_cache .mypy_cache .ruff_cache
