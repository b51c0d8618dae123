# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

# Below this (percent of models, analysis and app lines run), `make test` fails. Estimated:
# the whole suite ran 83 % before the last merges (the browser tests run the server in a
# subprocess, which coverage does not see); the floor leaves room for that.
COVERAGE_FLOOR ?= 80

.PHONY: run test lint typecheck pytest chromium bench clean install lock image image-test

# Dependencies come from the lock (every file checked against its hash: the libraries, the
# `service` and `dev` extras), then the project itself, whose dependencies the lock already holds.
$(STAMP): requirements-dev.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps -e ".[service,dev]"
	touch $(STAMP)

install: $(STAMP)

# Resolve pyproject.toml's ranges into the two lock files of exact pins (libraries + service for
# the image, + dev for `make install`), for every platform, with the hashes of every file. uv
# keeps the versions already in a lock file that still fit the ranges (`make lock` after a range
# changed moves only what must move); uv is pinned in pyproject's `lock` extra.
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --quiet
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv==0.13.8"
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) --extra service -o requirements.lock
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) --extra service --extra dev \
		-o requirements-dev.lock

# Serve http://127.0.0.1:8000 at once, with the demo queued (found on a later run): the in-process
# worker trains the zoo's six models one by one (checkpoints in ./zoo are reused), then computes
# their atlas over digits; the home page shows the progress.
run: $(STAMP)
	$(PY) -m app.cli serve --demo --zoo zoo

lint: $(STAMP)
	$(VENV)/bin/ruff check models analysis app migrations tests bench
	$(VENV)/bin/ruff format --check models analysis app migrations tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The suite runs on PYTEST_WORKERS processes (pytest-xdist; each starts with its share of the
# tests and takes over another's when it runs out): much of the suite waits on servers,
# workers and subprocesses, so two processes on two cores finish it sooner than one.
# PYTEST_WORKERS=0: one process.
# The 25 slowest tests are listed at the end: where the suite's time goes (it should stay
# within 15 minutes on a 2-core machine).
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	$(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25 \
		--cov=models --cov=analysis --cov=app --cov-report=term:skip-covered \
		--cov-fail-under=$(COVERAGE_FLOOR)

# The browser test drives Debian's Chromium through Playwright; Playwright never downloads one.
chromium:
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium)

test: lint typecheck chromium pytest

# The image (Dockerfile) for the API and the workers, built with docker where a Docker daemon
# answers, else with podman (`--format docker` keeps the healthcheck). IMAGE_BASE: another base
# than the Dockerfile's CUDA runtime image (any Debian or Ubuntu image with apt).
IMAGE ?= cka-atlas:latest
IMAGE_BASE ?=
IMAGE_BUILD_FLAGS ?=
CONTAINER_ENGINE ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
image:
	@command -v $(CONTAINER_ENGINE) >/dev/null || { echo "make image: no Docker daemon answers \
	and $(CONTAINER_ENGINE) is not installed; install podman (apt-get install podman) or start Docker"; exit 2; }
	@echo "make image: $(CONTAINER_ENGINE) builds $(IMAGE) from $(or $(IMAGE_BASE),the Dockerfile's base)"
	$(CONTAINER_ENGINE) build $(if $(filter podman,$(CONTAINER_ENGINE)),--format docker) \
		$(IMAGE_BUILD_FLAGS) $(if $(IMAGE_BASE),--build-arg BASE=$(IMAGE_BASE)) -t $(IMAGE) .

# The image built from a Debian base made here and run end to end with podman, as root
# (tests/image/run.sh says what it checks). Not part of `make test`: it installs the CUDA build
# of torch into the image (several GB).
image-test:
	bash tests/image/run.sh

clean:
	rm -rf $(VENV) var zoo .pytest_cache .mypy_cache .ruff_cache
