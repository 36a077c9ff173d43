#!/usr/bin/env bash
# Builds the libFuzzer harnesses with ASan + UBSan (clang), makes the seed corpora
# (tests/fuzz/make_corpus.py: every JPEG variant of the test suite, restart-marker files, the crafted
# files of tests/crafted.py), replays each corpus, then fuzzes each harness for N seconds.
#   csrc/fuzz/run.sh [seconds=60] [harness ...] [-- extra libFuzzer flags]
#   harnesses: decode (header, crops, resizes, batch engine), transcode (prepare + verification),
#              restart (the restart-marker index with hostile layouts), routes (the hybrid backend's
#              routing over hostile header tables); default: all four, sharing the seconds
#              (decode 3/7, transcode 2/7, restart and routes 1/7 each).
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TO_RUN=${1:-60}
shift || true
HARNESSES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do HARNESSES+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#HARNESSES[@]} -gt 0 ] || HARNESSES=(decode transcode restart routes)
CXX=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
[ -n "$CXX" ] || { echo "clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 3; }
OUT=build/fuzz
mkdir -p "$OUT/obj" "$OUT/findings"
FLAGS="-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -Icsrc"
# the core's sources the harnesses use, under csrc/
CORE="decode/jpeg_decoder decode/jpeg_error decode/resize decode/batch_decode decode/restart decode/huffman_reader
      decode/entropy_index decode/scaled_idct decode/header_table decode/decode_args
      decode/gpu_routes common/thread_pool common/multiversion"
objs=()
for f in $CORE; do
  o="$OUT/obj/${f##*/}.o"
  if [ ! -f "$o" ] || [ -n "$(find csrc/common csrc/decode -maxdepth 1 \( -path "csrc/$f.cpp" -o -name '*.h' \) -newer "$o")" ]; then
    echo "[fuzz] compiling $f.cpp (ASan + UBSan)"
    $CXX $FLAGS -fsanitize=fuzzer-no-link -c "csrc/$f.cpp" -o "$o"
  fi
  objs+=("$o")
done
for h in "${HARNESSES[@]}"; do
  bin="$OUT/fuzz_$h"
  if [ ! -x "$bin" ] || [ -n "$(find csrc/fuzz/fuzz_$h.cc "${objs[@]}" -newer "$bin")" ]; then
    echo "[fuzz] linking $bin"
    $CXX $FLAGS -fsanitize=fuzzer "csrc/fuzz/fuzz_$h.cc" "${objs[@]}" -ljpeg -lpthread -o "$bin"
  fi
done
PY=${PYTHON:-.venv/bin/python}
if [ ! -d "$OUT/corpus/decode" ] || [ tests/fuzz/make_corpus.py -nt "$OUT/corpus/decode" ] || [ tests/crafted.py -nt "$OUT/corpus/decode" ]; then
  echo "[fuzz] writing the seed corpora"
  rm -rf "$OUT/corpus"
  "$PY" tests/fuzz/make_corpus.py "$OUT/corpus"
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
share_of() { case "$1" in decode) echo 3 ;; transcode) echo 2 ;; *) echo 1 ;; esac; }
total=0; for h in "${HARNESSES[@]}"; do total=$(( total + $(share_of "$h") )); done
for h in "${HARNESSES[@]}"; do
  secs=$(( SECONDS_TO_RUN * $(share_of "$h") / total )); [ "$secs" -ge 1 ] || secs=1
  echo "[fuzz] $h: replaying the corpus, then fuzzing for ${secs}s"
  regressions=(); [ -d "csrc/fuzz/regressions/$h" ] && regressions=("csrc/fuzz/regressions/$h")
  mkdir -p "$OUT/corpus/$h"  # (routes: no seed files, libFuzzer starts from nothing)
  "$OUT/fuzz_$h" -runs=0 "$OUT/corpus/$h" "${regressions[@]}"  # the findings of earlier runs too
  "$OUT/fuzz_$h" "$OUT/corpus/$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$OUT/findings/$h-" -print_final_stats=1 "$@"
done
