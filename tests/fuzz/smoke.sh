#!/usr/bin/env bash
# smoke.sh FUZZER CORPUS_DIR ARTIFACT_DIR [DICT] — the short run `make test` does of one fuzz target:
# every committed input of CORPUS_DIR, then mutations of them with a fixed seed, bounded by a run
# count and a time limit (TEXTGEN_FUZZ_SMOKE_RUNS, TEXTGEN_FUZZ_SMOKE_SECONDS). Inputs it finds go
# to a temporary directory (the committed corpus is never written); a crash is saved in
# ARTIFACT_DIR and fails the test. Long campaigns: tools/fuzz.sh (docs/fuzzing.md).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: smoke.sh FUZZER CORPUS_DIR ARTIFACT_DIR [DICT]" >&2; exit 2; }
fuzzer=$1 corpus=$2 artifacts=$3 dict=${4:-}
runs=${TEXTGEN_FUZZ_SMOKE_RUNS:-4000}
seconds=${TEXTGEN_FUZZ_SMOKE_SECONDS:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
args=(-seed=1 -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
      -artifact_prefix="$artifacts/" -print_final_stats=1)
[ -n "$dict" ] && args+=(-dict="$dict")
symbolizer=$(command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
"$fuzzer" "${args[@]}" "$work" "$corpus"
