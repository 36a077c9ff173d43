#!/bin/bash
# The GPU checks and measurements of issues 28 and 29 on a lent GPU machine (no network), in four
# back-to-back device calls from the project root (each < 6 min; the machine stays warm between them).
# ../shared/device/prepare.sh made .device/; DALI's wheel travels in four pieces, one per call:
#   call 1 (carry .device/base): bash benchmarks/device_check.sh 1   build, data, the GPU tests
#   call 2 (carry .device/d2):   bash benchmarks/device_check.sh 2   gpu_check --quick, compute-sanitizer
#   call 3 (carry .device/d3):   bash benchmarks/device_check.sh 3   the Loader (backend cpu) vs its raw decode
#   call 4 (carry .device/d4):   bash benchmarks/device_check.sh 4   DALI installed; hybrid vs raw vs DALI GPU
# or, in one call without DALI (carry .device/base/whl, .device/base/debs, .device/base/setup.sh,
# .device/base/install_dali.sh): bash benchmarks/device_check.sh probe   build, GPU tests, hybrid_probe
# Each step's log goes into $OUT/logs-K.tgz (with the bench outputs), its rc and time into $OUT/summary.txt.
set -u
G=${DEVICE_CHECK_ROOT:-/root/g}
PART=${1:-1}
OUT=${OUT:-/tmp/device-check}; L=$G/logs/$PART; mkdir -p "$OUT" "$L" /root/dali
for d in .device/base/dali .device/d2 .device/d3 .device/d4; do [ -d $d ] && cp $d/* /root/dali/; done
if [ "$PART" = 1 ] || [ "$PART" = probe ]; then bash .device/base/setup.sh > "$L/setup.txt" 2>&1; echo "setup rc $?" | tee -a "$OUT/summary.txt"; tail -3 "$L/setup.txt"; fi
cd $G/proj || { echo "setup failed"; exit 2; }
export PYTHONPATH=$G/site LD_LIBRARY_PATH=$G/jpeg/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS command...: one timed step, its log under $OUT, its rc in summary.txt
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$L/$name.txt" 2>&1; local rc=$?
  echo "$name rc $rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}
bench() {  # bench NAME SET BATCH ARGS...: python -m gpupipe bench, train recipe, 16 threads, CUDA
  local name=$1 set=$2 bs=$3; shift 3
  local data=(); [ "$set" = default ] || data=(--data "$(cat $G/set-$set)")
  step "$name" 75 python3 -m gpupipe bench --device cuda --threads 16 --recipe train --batch-size "$bs" \
    "${data[@]}" --repeats 2 --out "$L/$name-out" "$@"
  grep -E "^\|" "$L/$name.txt" | head -8
}
case $PART in
1)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$L/device.txt" 2>&1
  lscpu | grep -E -m2 "Model name|^CPU\(s\)" >> "$L/device.txt"; cat "$L/device.txt"
  # The data sets, on the CPU while the GPU tests run: 1024 files each (800x533, 1920x1280, default).
  (python3 -c "
from benchmarks.loader_scale import folder
from gpupipe.bench.dataset import default_set
for n in ('seed', 'hd'): open('$G/set-' + n, 'w').write(str(folder(n)))
print(default_set())" > "$L/data.txt" 2>&1) &
  step tests 200 python3 -m pytest -q -p no:cacheprovider -rs -x tests/test_crop_resize.py tests/test_nvimgcodec.py \
    tests/test_hybrid.py tests/test_backends.py
  tail -4 "$L/tests.txt"; grep -E "FAILED|Error" "$L/tests.txt" | head -20
  wait; tail -2 "$L/data.txt" ;;
2)
  step gpu_check 200 python3 -m benchmarks.gpu_check --quick
  grep -E "PASS|FAIL|^\||kernels" "$L/gpu_check.txt" | cut -c1-330 | head -60
  if command -v compute-sanitizer >/dev/null; then  # the crop kernels' memory accesses, checked by the device
    step sanitizer 90 compute-sanitizer --error-exitcode=1 python3 -m pytest -q -p no:cacheprovider -x \
      tests/test_crop_resize.py -k "cuda and not skip_a_launch"
    tail -3 "$L/sanitizer.txt"
  fi ;;
3)  # issue 28: the Loader (backend cpu, CUDA output) beside its raw decode, 16 threads
  for s in seed hd; do for bs in 64 256; do bench "cpu-$s-$bs" $s $bs --backend cpu --methods gpupipe raw; done; done ;;
4)  # issue 29: backend hybrid (auto) beside the raw decode and DALI's GPU pipeline, one run each
  bash $G/install_dali.sh > "$L/dali.txt" 2>&1; echo "dali install rc $?" | tee -a "$OUT/summary.txt"; tail -1 "$L/dali.txt"
  for sb in default:64 seed:256 hd:256 default:256 seed:64 hd:64; do  # most wanted first
    bench "hybrid-${sb/:/-}" ${sb%:*} ${sb#*:} --methods gpupipe raw dali; done ;;
probe)  # build, the GPU tests, then where the hybrid backend's time goes (benchmarks/hybrid_probe.py)
  python3 -c "import PIL, torch; print('Pillow', PIL.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
  step tests 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_crop_resize.py tests/test_nvimgcodec.py \
    tests/test_hybrid.py tests/test_backends.py
  tail -3 "$L/tests.txt"; grep -E "^(FAILED|ERROR)" "$L/tests.txt" | head -20
  step probe 170 python3 -m benchmarks.hybrid_probe
  grep -E "^\||shares|BatchAugment|Name|aten::|gpupipe" "$L/probe.txt" | cut -c1-220 ;;
*) echo "usage: bash benchmarks/device_check.sh 1|2|3|4|probe"; exit 2 ;;
esac
tar -C $G/logs -czf "$OUT/logs-$PART.tgz" $PART; true
