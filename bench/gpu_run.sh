#!/usr/bin/env bash
# On a lent GPU machine, from the repository root with .whl carried (bench/gpu_wheels.sh .whl):
# install the wheels into /tmp/site ($SITE), run bench/bench_gpu_host.py into $OUT (gpu_host.json,
# gpu_host.md, bench.log), then the CUDA tests of training on a device (pytest.log).
#
#   bash bench/gpu_run.sh [bench_gpu_host.py options]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-var/gpu-host}
site=${SITE:-/tmp/site}
mkdir -p "$out"
began=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .whl/*.whl || { echo "the wheels in .whl did not install"; exit 1; }
export PYTHONPATH=$site:$PWD PYTHONUNBUFFERED=1
echo "wheels installed in $((SECONDS - began)) s"
nvidia-smi -L || true
python3 bench/bench_gpu_host.py --out "$out" "$@" 2>&1 | tee "$out/bench.log"
status=${PIPESTATUS[0]}
python3 -m pytest -q -p no:cacheprovider tests/models/test_devices.py 2>&1 | tee "$out/pytest.log"
tests=${PIPESTATUS[0]}
echo "bench exit $status, CUDA tests exit $tests, $((SECONDS - began)) s in all"
exit $((status || tests))
