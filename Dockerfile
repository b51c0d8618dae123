# cka-atlas for a GPU host: the API and the Celery workers run from this one image.
#
# The torch 2.14.1 wheel carries its own CUDA 13 user-space libraries; the CUDA runtime base
# gives the driver-compatible environment that the NVIDIA container toolkit expects.
FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv make curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# Never run as root: the service reads user uploads.
RUN useradd --create-home --uid 10001 atlas \
    && mkdir -p /app /data \
    && chown atlas:atlas /app /data
WORKDIR /app
USER atlas

# Locked dependencies first (each file checked against its hash), then the source: a code
# change reuses the cached layer with torch in it.
COPY --chown=atlas:atlas requirements.lock ./
RUN python3 -m venv .venv && .venv/bin/pip install --upgrade pip && .venv/bin/pip install --require-hashes -r requirements.lock
COPY --chown=atlas:atlas pyproject.toml README.md ./
COPY --chown=atlas:atlas models ./models
COPY --chown=atlas:atlas analysis ./analysis
COPY --chown=atlas:atlas app ./app
COPY --chown=atlas:atlas migrations ./migrations
# The same install commands as README's "Install without make".
RUN .venv/bin/pip install --no-deps .

ENV PATH=/app/.venv/bin:$PATH \
    CKA_DATA_DIR=/data \
    CKA_HOST=0.0.0.0 \
    CKA_PORT=8000
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8000/healthz || exit 1

CMD ["cka-atlas", "serve"]
