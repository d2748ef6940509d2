#!/usr/bin/env bash
# Runs every test of a build tree through ctest, then the sanitizer stage: a clang build of its own
# ($TEXTGEN_FUZZ_BUILD, default build-fuzz: ASan+UBSan, libFuzzer, no CUDA, -O1; only what the
# stage needs) in which ctest runs the labels "sanitize" (tokenizer, loader/runtime and router unit
# tests, and the tokenize-CLI and router integration tests on sanitized binaries) and "fuzz" (each
# fuzz target over its committed corpus plus a short seeded run). docs/fuzzing.md.
# GPU-labelled tests run only where a GPU is visible; elsewhere they are excluded and the script
# says so (they run on the GPU machine: docs/gpu.md).
# TEXTGEN_SKIP_SANITIZE=1 skips the sanitizer stage (and says so in the summary).
set -uo pipefail
build=$(realpath -m "${1:-build}")
fuzz_build=$(realpath -m "${TEXTGEN_FUZZ_BUILD:-build-fuzz}")
cd "$(dirname "$0")/.." || exit 1
jobs=$(nproc)

# "N% tests passed, F tests failed out of T" -> "passed failed"; nothing when ctest did not finish.
counts() {
  sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\2 \1/p' "$1" |
    tail -1 | awk '{print $1 - $2, $2}'
}

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

args=(--test-dir "$build" --output-on-failure -j "$jobs")
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "run-tests: GPU present: running all tests"
else
  echo "run-tests: no GPU here: excluding tests labelled 'gpu' (run them on the GPU machine, docs/gpu.md)"
  args+=(-LE gpu)
fi
start=$SECONDS
ctest "${args[@]}" 2>&1 | tee "$logs/main.log"
main_rc=${PIPESTATUS[0]}
main_time=$((SECONDS - start))
read -r main_pass main_fail < <(counts "$logs/main.log"; echo)
main_line="$build: ${main_pass:-?} passed, ${main_fail:-?} failed (${main_time}s)"
total_pass=${main_pass:-0}
total_fail=${main_fail:-0}
[ -n "${main_pass:-}" ] || total_fail=$((total_fail + 1))  # ctest itself failed: count it

san_rc=0
if [ "${TEXTGEN_SKIP_SANITIZE:-0}" = 1 ]; then
  san_line="$fuzz_build: sanitizer stage SKIPPED (TEXTGEN_SKIP_SANITIZE=1)"
else
  echo "run-tests: sanitizer stage: building $fuzz_build (clang, ASan+UBSan, libFuzzer)"
  start=$SECONDS
  if FUZZ_BUILD=$fuzz_build JOBS=$jobs bash tools/fuzz.sh build fuzzers sanitized_tests \
      >"$logs/san-build.log" 2>&1; then
    build_time=$((SECONDS - start))
    echo "run-tests: $fuzz_build built in ${build_time}s"
    start=$SECONDS
    ctest --test-dir "$fuzz_build" -L '^(sanitize|fuzz)$' --output-on-failure -j "$jobs" 2>&1 |
      tee "$logs/san.log"
    san_rc=${PIPESTATUS[0]}
    run_time=$((SECONDS - start))
    read -r san_pass san_fail < <(counts "$logs/san.log"; echo)
    san_line="$fuzz_build: ${san_pass:-?} passed, ${san_fail:-?} failed (build ${build_time}s, run ${run_time}s)"
    total_pass=$((total_pass + ${san_pass:-0}))
    total_fail=$((total_fail + ${san_fail:-0}))
    [ -n "${san_pass:-}" ] || total_fail=$((total_fail + 1))
  else
    tail -40 "$logs/san-build.log"
    san_rc=1
    total_fail=$((total_fail + 1))
    san_line="$fuzz_build: BUILD FAILED after $((SECONDS - start))s (the sanitizer stage counts as 1 failure)"
  fi
fi

echo "run-tests: $main_line"
echo "run-tests: $san_line"
echo "run-tests: $total_pass passed, $total_fail failed"
[ "$main_rc" -eq 0 ] && [ "$san_rc" -eq 0 ] && [ "$total_fail" -eq 0 ]
