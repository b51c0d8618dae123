# cka-atlas: the API and the Celery workers run from this one image.
#
# BASE is any Debian or Ubuntu image with apt. The default, for a GPU host, is the CUDA runtime
# image: the torch 2.14.1 wheel carries its own CUDA 13 user-space libraries, and this base gives
# the driver-compatible environment that the NVIDIA container toolkit expects (Ubuntu 24.04,
# Python 3.12). `make image-test` builds from a Debian bookworm base made on the machine
# (Python 3.11); requirements.lock installs on both (docs/deploy.md).
ARG BASE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# curl: the healthcheck.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# Never run as root: the service reads user uploads. The code and its environment belong to
# root (the service cannot change them); only the data volume is the service user's.
RUN useradd --create-home --uid 10001 atlas \
    && mkdir -p /app /data \
    && chown atlas:atlas /data
WORKDIR /app

# Locked dependencies first (each file checked against its hash), then the source: a code
# change reuses the cached layer with torch in it.
COPY requirements.lock ./
RUN python3 -m venv .venv && .venv/bin/pip install --upgrade pip && .venv/bin/pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY models ./models
COPY analysis ./analysis
COPY app ./app
COPY migrations ./migrations
# The same install commands as README's "Install without make".
RUN .venv/bin/pip install --no-deps .

# CKA_ALLOWED_HOSTS: the names clients use (the service answers on every interface; any other
# Host header is refused, against DNS rebinding). localhost serves `docker run -p 8000:8000`.
ENV PATH=/app/.venv/bin:$PATH \
    CKA_DATA_DIR=/data \
    CKA_HOST=0.0.0.0 \
    CKA_PORT=8000 \
    CKA_ALLOWED_HOSTS=localhost
USER atlas
VOLUME ["/data"]
EXPOSE 8000

# Kept by `docker build`; podman keeps it with `--format docker` (`make image` passes it).
# The shell form reads the port a container was started with.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${CKA_PORT}/healthz" || exit 1

CMD ["cka-atlas", "serve"]
