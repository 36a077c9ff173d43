#!/bin/bash
# The GPU checks of the decode engines in two calls on a lent GPU machine (no network), after
# `bash .device/base/setup.sh` (made by ../shared/device/prepare.sh; DALI's parts optional):
#   bash benchmarks/device_check.sh checks   (from the project root; writes under $OUT; < 8 min)
#   bash benchmarks/device_check.sh bench    (< 6 min; each part fits one 10-minute device call)
# checks: the GPU tests of the crop kernel, the nvImageCodec engines and the hybrid backend (and the
#   crop kernels under compute-sanitizer where it is installed); benchmarks.gpu_check --quick:
#   every GPU route against the CPU core, and its speed;
# bench: python -m gpupipe bench --device cuda --threads 16 --recipe train at batch 64 and 256, the
#   Loader on backend hybrid beside its raw decode and DALI's GPU pipeline (when installed).
set -u
G=/root/g
cd $G/proj || { echo "run bash .device/base/setup.sh first"; exit 2; }
export PYTHONPATH=$G/site LD_LIBRARY_PATH=$G/jpeg/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/device-check}; mkdir -p "$OUT"
PART=${1:-checks}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/device.txt" 2>&1; lscpu | grep -m1 "Model name" >> "$OUT/device.txt"
if [ "$PART" = checks ]; then
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_crop_resize.py tests/test_nvimgcodec.py \
  tests/test_hybrid.py tests/test_backends.py > "$OUT/tests.txt" 2>&1; echo "tests rc $?" | tee -a "$OUT/summary.txt"
tail -3 "$OUT/tests.txt"
if command -v compute-sanitizer >/dev/null; then  # the crop kernels' memory accesses, checked by the device
  timeout 120 compute-sanitizer --error-exitcode=1 python3 -m pytest -q -p no:cacheprovider -x tests/test_crop_resize.py \
    -k cuda > "$OUT/sanitizer.txt" 2>&1; echo "compute-sanitizer rc $?" | tee -a "$OUT/summary.txt"
fi
timeout 150 python3 -m benchmarks.gpu_check --quick > "$OUT/gpu_check.txt" 2>&1; echo "gpu_check rc $?" | tee -a "$OUT/summary.txt"
grep -E "PASS|FAIL|^\|" "$OUT/gpu_check.txt" | tail -30
else
for bs in 64 256; do
  timeout 150 python3 -m gpupipe bench --device cuda --threads 16 --recipe train --batch-size $bs \
    --methods gpupipe raw dali --repeats 2 --out "$OUT/bench-$bs" > "$OUT/bench-$bs.txt" 2>&1
  echo "bench $bs rc $?" | tee -a "$OUT/summary.txt"; grep -E "^\||hybrid shares" "$OUT/bench-$bs.txt" | head -12
done
fi
