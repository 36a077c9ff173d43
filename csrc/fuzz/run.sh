#!/usr/bin/env bash
# Builds the libFuzzer harness with ASan + UBSan (clang), makes the seed corpus (every JPEG
# variant of the test suite, plus restart-marker files), replays it, then fuzzes for N seconds.
#   csrc/fuzz/run.sh [seconds=60] [extra libFuzzer flags...]
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, out-of-memory).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TO_RUN=${1:-60}
shift || true
CXX=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
[ -n "$CXX" ] || { echo "clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 3; }
OUT=build/fuzz
mkdir -p "$OUT/corpus" "$OUT/findings"
SRC="csrc/jpeg_decoder.cpp csrc/resize.cpp csrc/thread_pool.cpp csrc/batch_decode.cpp csrc/restart.cpp"
if [ ! -x "$OUT/fuzz_decode" ] || [ -n "$(find csrc -name '*.cpp' -newer "$OUT/fuzz_decode" -o -name '*.h' -newer "$OUT/fuzz_decode" -o -name '*.cc' -newer "$OUT/fuzz_decode")" ]; then
  echo "[fuzz] building with $CXX (ASan + UBSan + libFuzzer)"
  $CXX -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -Icsrc csrc/fuzz/fuzz_decode.cc $SRC -ljpeg -lpthread -o "$OUT/fuzz_decode"
fi
PY=${PYTHON:-.venv/bin/python}
if [ -z "$(ls -A "$OUT/corpus")" ]; then
  echo "[fuzz] writing the seed corpus"
  "$PY" csrc/fuzz/make_corpus.py "$OUT/corpus"
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "[fuzz] replaying the corpus, then fuzzing for ${SECONDS_TO_RUN}s"
"$OUT/fuzz_decode" -runs=0 "$OUT/corpus"
"$OUT/fuzz_decode" "$OUT/corpus" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$OUT/findings/" -print_final_stats=1 "$@"
