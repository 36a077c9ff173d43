#!/bin/bash
# The GPU checks and measurements of issues 28 and 29 on a lent GPU machine (no network), in four
# back-to-back device calls from the project root (the machine stays warm between them).
# ../shared/device/prepare.sh made .device/; DALI's wheel travels in four pieces, one per call:
#   call 1 (carry .device/base): bash benchmarks/device_check.sh 1   build, data, the GPU tests, the hybrid Loader
#                                beside the raw decode, 800x533, train recipe, batch 64 and 256 (MERGE_AB=1: also
#                                without merged engine calls, hybrid.MERGE_IMAGES 0; API_AB=1: also with nvImageCodec's Python
#                                API; SWITCH_AB=1: also with a 0.5 ms GIL switch interval (the engine threads wait less for
#                                the GIL); WHOLE_AB=1: batch 64 also with a chunk's batches augmented one by one, as before
#                                commit 302ac83; ENGINES=1: hybrid_probe --part engines first); PROBE=1: hybrid_probe too (it writes the best
#                                hybrid.ENGINE_HOST_THREADS; later calls use it)
#   call 2 (carry .device/d2):   bash benchmarks/device_check.sh 2   the Loader (backend cpu) vs raw, 800x533, batch 256 and 64
#                                (GPU_CHECK=1: gpu_check --quick first; WHOLE_AB=1 as in call 1)
#   call 3 (carry .device/d3):   bash benchmarks/device_check.sh 3   the same on 1920x1280 photos
#   call 4 (carry .device/d4):   bash benchmarks/device_check.sh 4   DALI installed; hybrid vs raw vs DALI GPU ($BATCHES;
#                                ALONE=1: also gpupipe and DALI each alone in its process; DALI_HW_SETS: DALI alone
#                                with hw_decoder_load=1.0 on those sets)
# (calls 2 and 3 may only carry DALI's pieces: cp .device/d2/* /root/dali/; call 1 takes TEST_FILES, BATCHES1 and
#  SYNC_PROBE=1: benchmarks/sync_probe, whether host -> device copies wait for the stream)
# (TESTS_K="gpu or cuda": call 1 runs only the matching tests, the rest run in CI)
# or, in one call without DALI (carry .device/base/whl, .device/base/debs, .device/base/setup.sh,
# .device/base/install_dali.sh): bash benchmarks/device_check.sh probe   build, GPU tests, hybrid_probe
# (or ... final: the engine tests and hybrid_probe --part final: ROI vs whole images, the default vs the CPU pool;
#  or ... whole, carry .device/base: build, then batch 64 with a chunk's batches augmented whole and one by one;
#  or ... variants, carry .device/base: build, hybrid_probe --part variants, the hybrid Loader with PLAIN=1 and without;
#  or ... scale, carry .device/base: build, issue 28's Loader-vs-raw table on 800x533 and 1920x1280, the Huffman reader;
#  or ... split, carry .device/base: build, the hybrid Loader with hybrid.SPLIT keyed and ranked in turn, and with two
#  calls of the hardware decoder in flight (hybrid.CALLS_IN_FLIGHT; SPLIT_VARIANTS, SPLIT_SETS, SPLIT_ROUNDS))
# Each step's log goes into $OUT/logs-K.tgz (with the bench outputs), its rc and time into $OUT/summary.txt.
set -u
G=${DEVICE_CHECK_ROOT:-/root/g}
PART=${1:-1}
OUT=${OUT:-/tmp/device-check}; L=$G/logs/$PART; mkdir -p "$OUT" "$L" /root/dali
for d in .device/base/dali .device/d2 .device/d3 .device/d4; do [ -d $d ] && cp $d/* /root/dali/; done
if [ "$PART" = 1 ] || [ "$PART" = probe ] || [ "$PART" = final ] || [ "$PART" = whole ] || [ "$PART" = spin ] || [ "$PART" = variants ] || [ "$PART" = scale ] || [ "$PART" = split ]; then bash .device/base/setup.sh > "$L/setup.txt" 2>&1; echo "setup rc $?" | tee -a "$OUT/summary.txt"; tail -3 "$L/setup.txt"; fi
cd $G/proj || { echo "setup failed"; exit 2; }
export PYTHONPATH=$G/site LD_LIBRARY_PATH=$G/jpeg/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS command...: one timed step, its log under $OUT, its rc in summary.txt
  local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$L/$name.txt" 2>&1; local rc=$?
  echo "$name rc $rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}
bench() {  # bench NAME SET BATCH ARGS...: python -m gpupipe bench, $RECIPE (train), 16 threads, CUDA (NOMERGE=1:
  # the GPU engines take one batch's share per call; PYAPI=1: they call nvImageCodec's Python API, not its C API;
  # SWITCH=S: the interpreter's GIL switch interval S seconds, 0.005 by default; PERBATCH=1: no augment is
  # samples-independent, so a chunk's batches are transferred and augmented one by one)
  local name=$1 set=$2 bs=$3; shift 3
  local data=(); [ "$set" = default ] || data=(--data "$(cat $G/set-$set)")
  local run=(python3 -m gpupipe bench) pre=""
  [ "${NOMERGE:-0}" = 1 ] && pre+="from gpupipe._backends import hybrid; hybrid.MERGE_IMAGES = 0; "
  [ "${PYAPI:-0}" = 1 ] && pre+="from gpupipe._backends import nvimgcodec; nvimgcodec.NATIVE = False; "
  [ -n "${SWITCH:-}" ] && pre+="sys.setswitchinterval($SWITCH); "
  # BLOCKING=1: CUDA waits sleep instead of spinning (cudaDeviceScheduleBlockingSync on the primary context,
  # set before torch makes it): how much of the stage threads' host time is spent spinning in CUDA waits
  [ "${BLOCKING:-0}" = 1 ] && pre+="import ctypes, torch; rc = ctypes.CDLL('libcudart.so.13').cudaSetDeviceFlags(4); print('cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync):', rc); "
  [ "${PERBATCH:-0}" = 1 ] && pre+="from gpupipe import keyed; keyed.samples_independent = lambda module: False; "
  # PLAIN=1: the GPU decoders with nvJPEG's plain chroma upsampling (DALI's default), not libjpeg's fancy one
  [ "${PLAIN:-0}" = 1 ] && pre+="from gpupipe._backends import nvimgcodec as nv; o = nv._decoder_options; nv._decoder_options = lambda k, r, f=True: o(k, r, False); "
  # DALI_HW=F: DALI's decoder with hw_decoder_load=F (1.0: every image it can to the hardware decoder)
  [ -n "${DALI_HW:-}" ] && pre+="from gpupipe.bench import recipes; recipes.DALI_DECODER_ARGS['hw_decoder_load'] = $DALI_HW; "
  # SPLIT=ranked: the hybrid backend's ranked split (each batch's cheapest samples for the CPU pool), not the keyed one
  [ -n "${SPLIT:-}" ] && pre+="from gpupipe._backends import hybrid; hybrid.SPLIT = '$SPLIT'; "
  # LANES=N: N calls of the hardware decoder in flight, each on its own decoder (hybrid.CALLS_IN_FLIGHT)
  [ -n "${LANES:-}" ] && pre+="from gpupipe._backends import hybrid; hybrid.CALLS_IN_FLIGHT['hardware'] = $LANES; "
  # CHUNK=N: the Loader's chunks of N images (loader.CHUNK_IMAGES, 256 by default): on 2 cores 512 cut the host
  # time per image from 5.9-7.6 to 4.0-4.9 us (train recipe, CPU output, batch 64 and 256), at twice the buffers
  [ -n "${CHUNK:-}" ] && pre+="import gpupipe.loader as loader_module; loader_module.CHUNK_IMAGES = $CHUNK; "
  [ -n "$pre" ] && run=(python3 -c "import sys; $pre
from gpupipe.bench import main; sys.exit(main(sys.argv[1:]))")
  step "$name" 75 "${run[@]}" --device cuda --threads 16 --recipe "${RECIPE:-train}" --batch-size "$bs" \
    "${data[@]}" --repeats 2 --out "$L/$name-out" "$@"
  # the rows that matter straight into summary.txt: they come back even if the device time ends mid-call
  grep -E "^\| (gpupipe|raw|DALI)|Loader / |host CPU|shares|cudaSetDeviceFlags|^\| (read|plan|decode|collect|transfer|augment|consumer)" \
    "$L/$name.txt" | cut -c1-160 | tee -a "$OUT/summary.txt"
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])).get('loader_stats') or {}; n = max(s.get('images', 0), 1)
print('host us/img by stage:', {k: round(1e6 * v / n, 1) for k, v in s.get('host_s', {}).items()})" \
    "$L/$name-out/results.json" 2>/dev/null | tee -a "$OUT/summary.txt"
}
case $PART in
1)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$L/device.txt" 2>&1
  lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|NUMA node\(s\)" >> "$L/device.txt"; cat "$L/device.txt"
  # The data sets, on the CPU while the GPU tests run: 1024 files each (800x533, 1920x1280, default).
  (python3 -c "
from benchmarks.loader_scale import folder
from gpupipe.bench.dataset import default_set
for n in ('seed', 'hd'): open('$G/set-' + n, 'w').write(str(folder(n)))
folder('seed', 4096)
print(default_set())" > "$L/data.txt" 2>&1) &
  python3 -c "from gpupipe._backends import nvimgcodec as n; print('nvImageCodec C API:', n.native_reason() or 'built')" \
    2>&1 | tail -1 | tee -a "$OUT/summary.txt"
  step tests 240 python3 -m pytest -q -s -p no:cacheprovider -rs ${TEST_FILES:-tests/test_crop_resize.py \
    tests/test_nvimgcodec.py tests/test_hybrid.py tests/test_backends.py tests/test_chunks.py tests/test_loader.py \
    tests/test_reliability3.py::test_exit_while_a_daemon_thread_decodes_never_aborts \
    tests/test_augment.py::test_grayscale_images_as_torchvision_takes_them \
    tests/test_policies.py::test_grayscale_ops_equal_torchvision tests/test_augment_warp.py::test_grayscale_images_warp_as_torchvision_warps_them} \
    ${TESTS_K:+-k "$TESTS_K"}
  tail -3 "$L/tests.txt"; grep -E "^(FAILED|ERROR)" "$L/tests.txt" | head -20
  wait; tail -2 "$L/data.txt"
  # SYNC_PROBE=1: whether host -> device copies (pageable, pinned) and the Loader's next() wait for the stream
  [ "${SYNC_PROBE:-0}" = 1 ] && { step sync_probe 120 python3 -m benchmarks.sync_probe
    grep -E "^\||device" "$L/sync_probe.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"; }
  if [ "${PROBE:-0}" = 1 ]; then step probe 200 python3 -m benchmarks.hybrid_probe --tuned $G/tuned
    grep -E "^\||shares|best|BatchAugment" "$L/probe.txt" | cut -c1-400; fi
  [ "${ENGINES:-0}" = 1 ] && { step engines 120 python3 -m benchmarks.hybrid_probe --part engines
    grep -E "^\|" "$L/engines.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"; }
  for bs in ${BATCHES1:-64 256}; do bench hybrid-seed-$bs seed $bs --methods gpupipe raw
    [ "${API_AB:-0}" = 1 ] && PYAPI=1 bench hybrid-seed-$bs-pyapi seed $bs --methods gpupipe
    [ "${SWITCH_AB:-0}" = 1 ] && SWITCH=0.0005 bench hybrid-seed-$bs-switch seed $bs --methods gpupipe
    [ "${MERGE_AB:-0}" = 1 ] && NOMERGE=1 bench hybrid-seed-$bs-nomerge seed $bs --methods gpupipe
    [ "${WHOLE_AB:-0}" = 1 ] && [ $bs = 64 ] && PERBATCH=1 bench hybrid-seed-$bs-perbatch seed $bs --methods gpupipe; done
  # the later calls run with the best measured threads left to the GPU engines' host side
  [ -s $G/tuned ] && sed -i "s/^ENGINE_HOST_THREADS = .*/ENGINE_HOST_THREADS = $(cat $G/tuned)/" gpupipe/_backends/hybrid.py
  grep -n "^ENGINE_HOST_THREADS" gpupipe/_backends/hybrid.py | tee -a "$OUT/summary.txt" ;;
2)  # issue 28: the Loader (backend cpu, CUDA output) beside its raw decode, 16 threads, train recipe, 800x533
  [ "${GPU_CHECK:-0}" = 1 ] && { step gpu_check 150 python3 -m benchmarks.gpu_check --quick
    grep -E "PASS|FAIL|^\||kernels" "$L/gpu_check.txt" | cut -c1-330 | head -40; }
  for bs in 256 64; do bench cpu-seed-$bs seed $bs --backend cpu --methods gpupipe raw; done
  [ "${WHOLE_AB:-0}" = 1 ] && PERBATCH=1 bench cpu-seed-64-perbatch seed 64 --backend cpu --methods gpupipe ;;
3)  # issue 28, 1920x1280 photos
  for bs in 256 64; do bench cpu-hd-$bs hd $bs --backend cpu --methods gpupipe raw; done
  [ "${WHOLE_AB:-0}" = 1 ] && PERBATCH=1 bench cpu-hd-64-perbatch hd 64 --backend cpu --methods gpupipe ;;
4)  # issue 29: backend hybrid (auto) beside the raw decode and DALI's GPU pipeline, one run each
  bash $G/install_dali.sh > "$L/dali.txt" 2>&1; echo "dali install rc $?" | tee -a "$OUT/summary.txt"; tail -1 "$L/dali.txt"
  for sb in ${BATCHES:-seed:256 default:64 hd:256}; do  # most wanted first
    bench "hybrid-${sb/:/-}" ${sb%:*} ${sb#*:} --methods gpupipe raw dali
    if [ "${ALONE:-0}" = 1 ] || [[ " ${ALONE_SETS:-} " == *" $sb "* ]]; then  # each pipeline alone in its process too
      bench "alone-gpupipe-${sb/:/-}" ${sb%:*} ${sb#*:} --methods gpupipe
      bench "alone-dali-${sb/:/-}" ${sb%:*} ${sb#*:} --methods dali; fi; done
  for sb in ${DALI_HW_SETS:-}; do  # DALI alone with every image it can on the hardware decoder
    DALI_HW=1.0 bench "dali-hw1-${sb/:/-}" ${sb%:*} ${sb#*:} --methods dali; done ;;
spin)  # one call (carry .device/base, .device/tools): build, then the hybrid Loader at batch 64 with CUDA's default
  # waits (spin on a many-core host) and with blocking ones (BLOCKING), then under py-spy and perf where present
  python3 -c "from benchmarks.loader_scale import folder; open('$G/set-seed', 'w').write(str(folder('seed')))" \
    > "$L/data.txt" 2>&1 || { tail -3 "$L/data.txt"; exit 2; }
  for r in 1 2; do bench hybrid-seed-64-r$r seed 64 --methods gpupipe
    BLOCKING=1 bench hybrid-seed-64-blocking-r$r seed 64 --methods gpupipe; done
  # py-spy (carry .device/tools with its wheel too: pip download py-spy --no-deps -d .device/tools): which
  # Python each thread runs, and with --gil who holds the GIL the others wait for
  if ls .device/tools/py_spy-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target $G/tools .device/tools/py_spy-*.whl
    for mode in "" --gil; do tag=pyspy${mode:+-gil}
      timeout 60 $G/tools/bin/py-spy record --threads $mode --rate 250 --format raw -o $L/$tag.raw -- \
        python3 -m gpupipe bench --device cuda --threads 16 --recipe train --batch-size 64 --data "$(cat $G/set-seed)" \
        --repeats 2 --methods gpupipe > "$L/$tag-run.txt" 2>&1
      echo "$tag:" | tee -a "$OUT/summary.txt"
      python3 -m benchmarks.pyspy_summary $L/$tag.raw --top 8 2>&1 | head -70 | cut -c1-170 | tee -a "$OUT/summary.txt"; done
  fi
  if command -v perf > /dev/null; then
    timeout 60 perf record -F 499 -g -o $G/perf.data python3 -m gpupipe bench --device cuda --threads 16 --recipe train \
      --batch-size 64 --data "$(cat $G/set-seed)" --repeats 2 --methods gpupipe > "$L/perf-run.txt" 2>&1
    perf report -i $G/perf.data --no-children --sort comm,dso --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -25 | tee -a "$OUT/summary.txt"
    perf report -i $G/perf.data --no-children --comm python3 --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -40 | tee -a "$OUT/summary.txt"
  else echo "no perf here" | tee -a "$OUT/summary.txt"; fi ;;
whole)  # one call (carry .device/base): build, then batch 64 with a chunk's batches augmented whole (the default)
  # and one by one (PERBATCH), CPU backend then hybrid, 800x533, train recipe; then batch 256 ($WHOLE_SETS)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
  lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/summary.txt"
  python3 -c "from benchmarks.loader_scale import folder; open('$G/set-seed', 'w').write(str(folder('seed')))" \
    > "$L/data.txt" 2>&1 || { tail -3 "$L/data.txt"; exit 2; }
  for b in ${WHOLE_SETS:-cpu:64 hybrid:64 cpu:256 hybrid:256}; do bk=${b%:*} bs=${b#*:}
    bench "$bk-seed-$bs" seed $bs --backend $bk --methods gpupipe raw
    [ $bs = 64 ] && [ "${RECIPE:-train}" != crop ] && PERBATCH=1 bench "$bk-seed-$bs-perbatch" seed $bs --backend $bk \
      --methods gpupipe; done ;;
variants)  # one call (carry .device/base): build, hybrid_probe --part variants (the hardware decoder: ROI, chroma
  # upsampling, two calls at once), then the hybrid Loader with libjpeg's and nvJPEG's plain chroma upsampling
  python3 -c "from benchmarks.loader_scale import folder; open('$G/set-seed', 'w').write(str(folder('seed')))
from gpupipe.bench.dataset import default_set; default_set()" > "$L/data.txt" 2>&1 || { tail -3 "$L/data.txt"; exit 2; }
  timeout 150 python3 -m benchmarks.hybrid_probe --part variants > "$OUT/variants.txt" 2>&1; echo "variants rc $?" | tee -a "$OUT/summary.txt"
  grep -E "^\|" "$OUT/variants.txt" | cut -c1-200
  for sb in ${BATCHES:-seed:64 default:64}; do bench "hybrid-${sb/:/-}" ${sb%:*} ${sb#*:} --methods gpupipe
    PLAIN=1 bench "hybrid-plain-${sb/:/-}" ${sb%:*} ${sb#*:} --methods gpupipe; done ;;
scale)  # one call (carry .device/base): build, then issue 28's table: the CPU backend's Loader beside its raw decode,
  # 16 threads, $SCALE_SETS (800x533 and 1920x1280, batch 64 and 256) with $SCALE_RECIPES (train; "train crop" for both);
  # then the Huffman reader against libjpeg-turbo's decoder on one of this machine's cores
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
  lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/summary.txt"
  python3 -c "from benchmarks.loader_scale import folder
for n in ('seed', 'hd'): open('$G/set-' + n, 'w').write(str(folder(n)))" > "$L/data.txt" 2>&1 || { tail -3 "$L/data.txt"; exit 2; }
  for r in ${SCALE_RECIPES:-train}; do for sb in ${SCALE_SETS:-seed:64 seed:256 hd:64 hd:256}; do
    RECIPE=$r bench "cpu-$r-${sb/:/-}" ${sb%:*} ${sb#*:} --backend cpu --methods gpupipe raw; done; done
  step huffman 120 python3 -m benchmarks.main --quick --workloads huffman --out "$L/huffman-out"
  grep -E "^###|^\| (gpupipe|libjpeg)" "$L/huffman.txt" | cut -c1-160 | tee -a "$OUT/summary.txt" ;;
split)  # one call (carry .device/base): build, the hardware decoder's time per file (hybrid_probe --part costs),
  # then the hybrid Loader with its keyed split and its ranked one (hybrid.SPLIT), in turn, $SPLIT_SETS (default
  # set, 800x533, 1920x1280), train recipe, $SPLIT_ROUNDS rounds
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
  lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/summary.txt"
  python3 -c "from benchmarks.loader_scale import folder
for n in ('seed', 'hd'): open('$G/set-' + n, 'w').write(str(folder(n)))
from gpupipe.bench.dataset import default_set; default_set()" > "$L/data.txt" 2>&1 || { tail -3 "$L/data.txt"; exit 2; }
  # what the hardware decoder's time per file follows (bytes or pixels): the ranked split's GPU model
  step costs 90 python3 -m benchmarks.hybrid_probe --part costs
  grep -E "^\||^fit" "$L/costs.txt" | cut -c1-200 | tee -a "$OUT/summary.txt"
  # $SPLIT_VARIANTS: each a split (keyed, ranked) with "+lanes2" (two calls of the hardware decoder in flight,
  # hybrid.CALLS_IN_FLIGHT), "+chunk512" (loader.CHUNK_IMAGES 512) and/or "+noindex" (the CPU pool without the
  # entropy index, GPUPIPE_ENTROPY_INDEX_MB=0) added
  for r in $(seq ${SPLIT_ROUNDS:-1}); do for sb in ${SPLIT_SETS:-default:64 seed:64 default:256}; do
    for v in ${SPLIT_VARIANTS:-keyed ranked keyed+lanes2 keyed+noindex}; do
      lanes=""; chunk=""; index=256; [[ $v == *+lanes2* ]] && lanes=2; [[ $v == *+chunk512* ]] && chunk=512
      [[ $v == *+noindex* ]] && index=0
      GPUPIPE_ENTROPY_INDEX_MB=$index SPLIT=${v%%+*} LANES=$lanes CHUNK=$chunk \
        bench "hybrid-${v//+/-}-${sb/:/-}-r$r" ${sb%:*} ${sb#*:} --methods gpupipe
    done; done; done ;;
probe)  # build, the GPU tests, then where the hybrid backend's time goes (benchmarks/hybrid_probe.py)
  python3 -c "import PIL, torch; print('Pillow', PIL.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
  step tests 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_crop_resize.py tests/test_nvimgcodec.py \
    tests/test_hybrid.py tests/test_backends.py
  tail -3 "$L/tests.txt"; grep -E "^(FAILED|ERROR)" "$L/tests.txt" | head -20
  step probe 200 python3 -m benchmarks.hybrid_probe
  grep -E "^\||shares|BatchAugment|Name|aten::|gpupipe|best" "$L/probe.txt" | cut -c1-400 ;;
final)  # one call on a fresh machine (carry as for probe): build, the engine tests, hybrid_probe --part final
  step tests 60 python3 -m pytest -q -x -p no:cacheprovider -rs tests/test_nvimgcodec.py tests/test_hybrid.py \
    tests/test_augment.py -k "gpu or cuda or pinned"
  tail -2 "$L/tests.txt"; grep -E "^(FAILED|ERROR)" "$L/tests.txt" | head -5
  # straight into $OUT, row by row: what ran comes back even if the device time runs out mid-way
  timeout 150 python3 -m benchmarks.hybrid_probe --part final > "$OUT/final.txt" 2>&1; echo "final rc $?" | tee -a "$OUT/summary.txt"
  grep -E "^\||shares|BatchAugment" "$OUT/final.txt" | cut -c1-330 ;;
*) echo "usage: bash benchmarks/device_check.sh 1|2|3|4|whole|spin|variants|scale|split|probe|final"; exit 2 ;;
esac
tar -C $G/logs -czf "$OUT/logs-$PART.tgz" $PART; true
