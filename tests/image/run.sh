#!/usr/bin/env bash
# `make image-test`: build the image from a Debian base made on this machine, then run it end to
# end with podman, as root, without a Docker daemon and without pulling any image:
#   1. one container (SQLite, in-process worker) on a named volume: `cka-atlas db upgrade`,
#      /healthz and /readyz, a checkpoint and a dataset uploaded over REST with a write token, a
#      comparison, its heatmap PNG; the container replaced by a new one on the same volume still
#      serves the comparison; the server runs as the image's non-root user;
#   2. the compose file's shape: the API and a worker container (`cka-atlas worker`, CPU) with
#      docker-compose.yml's own commands and environment, on this machine's PostgreSQL (a
#      database of their own) and Redis (a db number of their own); one comparison, done by
#      the worker container.
# Idempotent: it installs podman, runc and debootstrap when missing, makes the base once, and
# the build reuses podman's layer cache. It prints its time and the image's size.
#
# Settings (environment): CKA_IMAGE_TEST_DIR (work folder, default /var/tmp/cka-atlas-image-test),
# CKA_IMAGE_TEST_POSTGRES (a PostgreSQL server URL whose user may create databases, default
# postgresql://postgres@127.0.0.1:5432), CKA_IMAGE_TEST_REDIS (default redis://127.0.0.1:6379/11:
# that db is flushed).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${CKA_IMAGE_TEST_DIR:-/var/tmp/cka-atlas-image-test}
POSTGRES=${CKA_IMAGE_TEST_POSTGRES:-postgresql://postgres@127.0.0.1:5432}
REDIS=${CKA_IMAGE_TEST_REDIS:-redis://127.0.0.1:6379/11}
BASE=localhost/debian-base
IMAGE=localhost/cka-atlas:debian
DATABASE=cka_image_test
started=$(date +%s)
shopt -s inherit_errexit

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "image-test: FAILED: $*" >&2
    exit 1
}

if [ "$(id -u)" != 0 ]; then
    fail "this test builds and runs containers as root (podman without a daemon); run it as root"
fi

# This sandbox refuses podman's default runtime (crun) and its default limits, and gives
# containers no network of their own: every container runs with these. Without systemd
# podman has no timer for the healthcheck (it says so on every start and removal; those lines
# are dropped): the test runs it by hand (`podman healthcheck run`).
podman() {
    command podman --cgroup-manager cgroupfs --runtime runc "$@" \
        2> >(grep -v 'unable to get systemd connection' >&2)
}
RUN=(run --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
# in_image [OPTIONS...] -- COMMAND...: a throwaway container of the image.
in_image() {
    local options=()
    while [ "$1" != -- ]; do
        options+=("$1")
        shift
    done
    shift
    podman "${RUN[@]}" --rm -e "POSTGRES=$POSTGRES" -e "REDIS=$REDIS" "${options[@]}" "$IMAGE" "$@"
}

step "tools: podman, runc, debootstrap"
missing=()
for tool in podman runc debootstrap; do
    type -P "$tool" >/dev/null || missing+=("$tool")  # the binary, not the function above
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
podman --version
mkdir -p "$WORK"

step "base: $BASE (Debian bookworm, debootstrap --variant=minbase)"
if podman image exists "$BASE"; then
    echo "present"
else
    # The first Debian mirror the machine's apt sources name (deb822 or one-line format).
    mirror=$({ cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
        | sed -nE 's/^URIs: *([^ ]+).*/\1/p; s/^deb( \[[^]]*\])? +([^ ]+).*/\2/p' \
        | awk '!/security/ { print; exit }')
    [ -n "$mirror" ] || fail "no Debian mirror in /etc/apt/sources.list{,.d}"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" \
        || fail "debootstrap from $mirror failed (log: $WORK/debootstrap.log)"
    # The base trusts what this machine trusts (a TLS-inspecting proxy's authority, say): the
    # image's `apt-get install ca-certificates` adds it to the bundle that pip is pointed at.
    mkdir -p "$WORK/rootfs/usr/local/share/ca-certificates"
    cp /etc/ssl/certs/ca-certificates.crt "$WORK/rootfs/usr/local/share/ca-certificates/machine.crt"
    tar -C "$WORK/rootfs" -c . \
        | podman import --change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt" - "$BASE"
    rm -rf "$WORK/rootfs"
fi

step "build: $IMAGE from $BASE (make image)"
make -C "$ROOT" image CONTAINER_ENGINE=podman IMAGE="$IMAGE" IMAGE_BASE="$BASE" \
    IMAGE_BUILD_FLAGS="--isolation chroot --network host"

size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "image: $IMAGE, $((size / 1000000)) MB"

step "lock: every pin of requirements.lock has a wheel for the CUDA base's Python 3.12"
# The image above installs the lock on Debian's Python 3.11; the default base (Ubuntu 24.04)
# has Python 3.12 and glibc 2.39. uv (the lock's own tool, pinned in pyproject) resolves it
# for that interpreter and platform, wheels only, inside the image.
in_image -e UV_NATIVE_TLS=1 -- sh -ec '
    python -m venv /tmp/uv && /tmp/uv/bin/pip install --quiet "uv==0.13.8"
    /tmp/uv/bin/uv pip install --dry-run --only-binary :all: --require-hashes \
        --python-version 3.12 --python-platform x86_64-manylinux_2_39 \
        --target /tmp/py312 -r /app/requirements.lock >/tmp/uv.log 2>&1 || { cat /tmp/uv.log; exit 1; }
    grep -E "^(Resolved|Would install)" /tmp/uv.log
' || fail "requirements.lock does not install on Python 3.12 (the CUDA base)"

# ---------------------------------------------------------------------------------------------
TOKEN=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
FILES=$WORK/files
LOGS=$WORK/logs
CONTAINERS=(cka-image-test-api cka-image-test-worker)
VOLUMES=(cka-image-test-data cka-image-test-shared)

remove_containers() {
    local name
    for name in "${CONTAINERS[@]}"; do
        podman rm -f -t 5 "$name" >/dev/null 2>&1 || true
    done
}
cleanup() {
    local status=$?
    if [ $status -ne 0 ]; then
        for name in "${CONTAINERS[@]}"; do
            if podman container exists "$name"; then
                echo "--- last lines of $name's log (all of it: $LOGS/$name.log)" >&2
                podman logs "$name" >"$LOGS/$name.log" 2>&1 || true
                tail -n 30 "$LOGS/$name.log" >&2
            fi
        done
    fi
    remove_containers
    podman volume rm -f "${VOLUMES[@]}" >/dev/null 2>&1 || true
    if [ -n "${sql_ready:-}" ]; then
        in_image -- python -c "$DROP_DATABASE" >/dev/null 2>&1 || true
        in_image -- python -c "$FLUSH_REDIS" >/dev/null 2>&1 || true
    fi
    exit $status
}
trap cleanup EXIT
remove_containers  # of a run that was interrupted
mkdir -p "$LOGS"

json() {  # json FIELD < body: one field of a JSON object
    python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"
}
wait_ready() {  # wait_ready CONTAINER: until /readyz answers 200 (database reachable)
    for _ in $(seq 120); do
        if curl -fsS "$URL/readyz" >/dev/null 2>&1; then
            return 0
        fi
        if [ "$(podman inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" != true ]; then
            fail "$1 exited before it answered /readyz"
        fi
        sleep 1
    done
    fail "$1 did not answer /readyz within 120 s"
}
wait_comparison() {  # wait_comparison ID: until it succeeded (fails on failed/cancelled)
    local status
    for _ in $(seq 600); do
        status=$(curl -fsS "$URL/v1/comparisons/$1" | json status)
        case $status in
            succeeded) return 0 ;;
            failed | cancelled) fail "comparison $1 $status: $(curl -fsS "$URL/v1/comparisons/$1")" ;;
        esac
        sleep 1
    done
    fail "comparison $1 still $status after 600 s"
}
# upload_and_compare: a checkpoint and a dataset over REST with a write token made in the API
# container, then one comparison of the model's layers over that dataset; prints its id.
upload_and_compare() {
    local model dataset token auth
    token=$(podman exec cka-image-test-api cka-atlas token create --name image-test --scope write)
    auth=(-H "Authorization: Bearer $token")
    model=$(curl -fsS "${auth[@]}" -F "weights=@$FILES/mlp_digits.safetensors" \
        -F "sidecar=@$FILES/mlp_digits.json" "$URL/v1/models" | json id)
    dataset=$(curl -fsS "${auth[@]}" -F "file=@$FILES/digits.npz" "$URL/v1/datasets" | json id)
    curl -fsS "${auth[@]}" -H 'content-type: application/json' \
        -d "{\"model_ids\": [$model], \"dataset_id\": $dataset, \"batch_size\": 100}" \
        "$URL/v1/comparisons" | json id
}

step "files: a checkpoint trained in the image, a dataset (.npz)"
rm -rf "$FILES"
mkdir -p "$FILES"
chown 10001 "$FILES"
in_image -v "$FILES:/out" -- sh -ec '
    cd /out
    cka-atlas train --arch mlp_digits --epochs 1 --out . --no-progress
    python -c "import analysis, numpy as np; d = analysis.load_dataset(\"digits\"); np.savez(\"digits.npz\", x=d.x[:300], y=d.y[:300])"
'
ls -l "$FILES"

# ---------------------------------------------------------------------------------------------
step "one container: SQLite and the in-process worker on volume ${VOLUMES[0]}"
podman volume rm -f "${VOLUMES[0]}" >/dev/null
podman volume create "${VOLUMES[0]}" >/dev/null
podman "${RUN[@]}" --rm -v "${VOLUMES[0]}:/data" "$IMAGE" cka-atlas db upgrade
start_api() {
    podman "${RUN[@]}" -d --name cka-image-test-api -v "${VOLUMES[0]}:/data" \
        -e "CKA_PORT=$PORT" -e "CKA_API_TOKENS=$TOKEN" "$IMAGE" >/dev/null
    wait_ready cka-image-test-api
}
start_api
curl -fsS "$URL/healthz"
echo
curl -fsS "$URL/readyz"
echo
# The server is pid 1: its real, effective, saved and file-system user ids.
uids=$(podman exec cka-image-test-api awk '/^Uid:/ { print $2, $3, $4, $5 }' /proc/1/status)
echo "server (pid 1) user ids: $uids; $(podman exec cka-image-test-api id)"
[ "$uids" = "10001 10001 10001 10001" ] || fail "the server does not run as the image's user 10001"
podman exec cka-image-test-api sh -c 'touch /app/x' 2>/dev/null \
    && fail "the service user can write its own code (/app)"
podman healthcheck run cka-image-test-api >/dev/null || fail "the image's HEALTHCHECK fails"
echo "healthcheck: healthy"
code=$(curl -s -o /dev/null -w '%{http_code}' -F "file=@$FILES/digits.npz" "$URL/v1/datasets")
[ "$code" = 401 ] || fail "an upload without the token answered $code, not 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: evil.example' "$URL/v1/models")
[ "$code" = 400 ] || fail "Host: evil.example answered $code, not 400"
echo "refused: an upload without the token (401), Host: evil.example (400)"
comparison=$(upload_and_compare)
wait_comparison "$comparison"
curl -fsS -o "$WORK/heatmap.png" "$URL/v1/comparisons/$comparison/heatmap.png"
[ "$(head -c 8 "$WORK/heatmap.png" | od -An -tx1 | tr -d ' ')" = 89504e470d0a1a0a ] \
    || fail "the heatmap is not a PNG"
matrix=$(curl -fsS "$URL/v1/comparisons/$comparison/matrix" | sha256sum)
echo "comparison $comparison succeeded; heatmap.png $(stat -c %s "$WORK/heatmap.png") bytes"
owners=$(podman exec cka-image-test-api find /data ! -user 10001 | head -n 5)
[ -z "$owners" ] || fail "files on the volume not owned by the service user: $owners"

step "the container replaced by a new one on the same volume"
podman stop -t 10 cka-image-test-api >/dev/null
podman rm cka-image-test-api >/dev/null
start_api
[ "$(curl -fsS "$URL/v1/comparisons/$comparison" | json status)" = succeeded ] \
    || fail "comparison $comparison is gone after the restart"
[ "$(curl -fsS "$URL/v1/comparisons/$comparison/matrix" | sha256sum)" = "$matrix" ] \
    || fail "comparison $comparison's matrix changed across the restart"
curl -fsS -o /dev/null "$URL/v1/comparisons/$comparison/heatmap.png"
echo "comparison $comparison still there: same matrix, heatmap served"
podman rm -f -t 10 cka-image-test-api >/dev/null

# ---------------------------------------------------------------------------------------------
step "the compose file's shape: API + worker containers, PostgreSQL, Redis (this machine's)"
# docker-compose.yml's services `api` and `worker`: their commands and environment, with the
# database, broker and port of this machine instead of the compose file's own containers.
DROP_DATABASE="
import os, psycopg
with psycopg.connect(os.environ['POSTGRES'] + '/postgres', autocommit=True) as c:
    c.execute('DROP DATABASE IF EXISTS $DATABASE WITH (FORCE)')
"
FLUSH_REDIS="
import os, redis
redis.Redis.from_url(os.environ['REDIS']).flushdb()
"
in_image -- python -c "$DROP_DATABASE
with psycopg.connect(os.environ['POSTGRES'] + '/postgres', autocommit=True) as c:
    c.execute('CREATE DATABASE $DATABASE')
$FLUSH_REDIS" || fail "no PostgreSQL at $POSTGRES or no Redis at $REDIS (CKA_IMAGE_TEST_POSTGRES, CKA_IMAGE_TEST_REDIS)"
sql_ready=1
database_url="postgresql+psycopg://${POSTGRES#*://}/$DATABASE"
compose() {  # compose SERVICE env|command [KEY=VALUE...]
    podman "${RUN[@]}" --rm -e "CKA_API_TOKENS=$TOKEN" \
        -v "$ROOT/docker-compose.yml:/tmp/docker-compose.yml:ro" \
        -v "$ROOT/tests/image/compose.py:/tmp/compose.py:ro" \
        "$IMAGE" python /tmp/compose.py /tmp/docker-compose.yml "$@"
}
compose api env "CKA_DATABASE_URL=$database_url" "CKA_BROKER_URL=$REDIS" "CKA_PORT=$PORT" \
    >"$WORK/api.env"
compose worker env "CKA_DATABASE_URL=$database_url" "CKA_BROKER_URL=$REDIS" CKA_DEVICE=cpu \
    CKA_WORKER_NAME=image-test >"$WORK/worker.env"
command=$(compose api command)
mapfile -t api_command <<<"$command"
command=$(compose worker command)
mapfile -t worker_command <<<"$command"
echo "api: ${api_command[*]}; worker: ${worker_command[*]}"
podman volume rm -f "${VOLUMES[1]}" >/dev/null
podman volume create "${VOLUMES[1]}" >/dev/null
podman "${RUN[@]}" -d --name cka-image-test-api --env-file "$WORK/api.env" \
    -v "${VOLUMES[1]}:/data" "$IMAGE" "${api_command[@]}" >/dev/null
wait_ready cka-image-test-api
podman "${RUN[@]}" -d --name cka-image-test-worker --env-file "$WORK/worker.env" --no-healthcheck \
    -v "${VOLUMES[1]}:/data" "$IMAGE" "${worker_command[@]}" >/dev/null
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: evil.example' "$URL/v1/models")
[ "$code" = 400 ] || fail "the compose API answered Host: evil.example with $code, not 400"
comparison=$(upload_and_compare)
wait_comparison "$comparison"
worker=$(curl -fsS "$URL/v1/jobs?kind=comparison" | python3 -c '
import json, sys
(job,) = json.load(sys.stdin)["items"]
print(job["worker"])')
case $worker in
    celery-image-test:*) ;;
    *) fail "comparison $comparison was run by $worker, not by the worker container" ;;
esac
curl -fsS -o /dev/null "$URL/v1/comparisons/$comparison/heatmap.png"
echo "comparison $comparison succeeded on PostgreSQL, run by the worker container ($worker)"

# ---------------------------------------------------------------------------------------------
elapsed=$(($(date +%s) - started))
printf '\nimage-test: passed in %d min %02d s; image %s: %s.%02d GB (%s bytes)\n' \
    $((elapsed / 60)) $((elapsed % 60)) "$IMAGE" $((size / 10**9)) $((size / 10**7 % 100)) "$size"
