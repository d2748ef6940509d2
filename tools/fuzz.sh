#!/usr/bin/env bash
# tools/fuzz.sh — the fuzz targets of tests/fuzz: build them, run long campaigns here, merge what a
# campaign found into the committed corpora, reproduce and triage crashes, and pack everything for a
# bigger Linux machine. docs/fuzzing.md says when to use which.
#
#   tools/fuzz.sh build                      configure + build the fuzzers in $FUZZ_BUILD (build-fuzz)
#   tools/fuzz.sh list                       the target names
#   tools/fuzz.sh run [-t S] [-w W] [T...]   a campaign here: each target S seconds with W workers
#   tools/fuzz.sh merge [DIR] [T...]         add a campaign's new-coverage inputs to tests/fuzz/corpus
#   tools/fuzz.sh repro TARGET FILE...       run inputs once, symbolized stack on a crash
#   tools/fuzz.sh triage DIR                 repro every crash file of a campaign's output
#   tools/fuzz.sh regress                    replay tests/fuzz/crashes/<target>/* (saved reproducers)
#   tools/fuzz.sh pack [DEST]               binaries + libraries + corpora + fixtures + run script
#
# Environment: FUZZ_BUILD (build-fuzz), CC/CXX (clang-16/clang++-16), JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${FUZZ_BUILD:-build-fuzz}
targets=(safetensors model_config shard_rpc tokenizer_encode tokenizer_json tokenizer_slow
         router_request router_routes speculation chat_template grammar docs_page tracing)
declare -A dicts=([safetensors]=safetensors.dict [model_config]=model_config.dict
                  [tokenizer_json]=tokenizer_json.dict [tokenizer_slow]=tokenizer_slow.dict
                  [router_request]=router.dict
                  [router_routes]=router.dict)

die() { echo "fuzz.sh: $*" >&2; exit 1; }
symbolizer() { command -v llvm-symbolizer-16 || command -v llvm-symbolizer || true; }
check_target() {
  local t
  for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  die "unknown target '$1' (tools/fuzz.sh list)"
}
binary() { echo "$build/fuzz/fuzz_$1"; }
dict_args() { [ -n "${dicts[$1]:-}" ] && echo "-dict=$root/tests/fuzz/dict/${dicts[$1]}" || true; }

# Configures the clang build directory (ASan+UBSan, libFuzzer coverage, no CUDA, -O1 with line
# tables, assertions on) and builds `$@` (default: the fuzzers).
cmd_build() {
  local what=("$@")
  [ ${#what[@]} -gt 0 ] || what=(fuzzers)
  if [ ! -f "$build/build.ninja" ]; then
    CC=${CC:-clang-16} CXX=${CXX:-clang++-16} cmake -S . -B "$build" -G Ninja \
      -DTEXTGEN_FUZZ=ON -DTEXTGEN_CUDA=OFF -DTEXTGEN_BUILD_BENCH=OFF -DTEXTGEN_WERROR=OFF \
      -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" \
      "-DCMAKE_C_FLAGS_DEBUG=-O1 -gline-tables-only" >"$build-configure.log" 2>&1 ||
      { cat "$build-configure.log" >&2; die "configure failed"; }
    rm -f "$build-configure.log"
  fi
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${what[@]}"
}

cmd_list() { printf '%s\n' "${targets[@]}"; }

# A campaign on this machine: every target at once, each with W workers (libFuzzer's fork mode,
# which goes on after a crash and keeps every distinct one). Output in .fuzz/<target>/.
cmd_run() {
  local seconds=600 workers=1 out=.fuzz
  while getopts "t:w:o:" o; do
    case $o in
      t) seconds=$OPTARG ;; w) workers=$OPTARG ;; o) out=$OPTARG ;;
      *) die "usage: fuzz.sh run [-t SECONDS] [-w WORKERS] [-o OUTDIR] [TARGET...]" ;;
    esac
  done
  shift $((OPTIND - 1))
  local run=("$@")
  [ ${#run[@]} -gt 0 ] || run=("${targets[@]}")
  cmd_build fuzzers
  local t pids=()
  for t in "${run[@]}"; do
    check_target "$t"
    mkdir -p "$out/$t/corpus" "$out/$t/crashes"
    echo "fuzz.sh: $t for ${seconds}s with $workers worker(s): $out/$t/log.txt"
    # shellcheck disable=SC2046
    ASAN_SYMBOLIZER_PATH=$(symbolizer) "$(binary "$t")" -fork="$workers" -ignore_crashes=1 \
      -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$out/$t/crashes/" $(dict_args "$t") "$out/$t/corpus" \
      "tests/fuzz/corpus/$t" >"$out/$t/log.txt" 2>&1 &
    pids+=($!)
  done
  local p
  for p in "${pids[@]}"; do wait "$p" || true; done
  summary "$out" "${run[@]}"
}

# One line per target: executions, coverage, crash files.
summary() {
  local out=$1 t
  shift
  for t in "$@"; do
    local log="$out/$t/log.txt" crashes
    crashes=$(find "$out/$t/crashes" -type f 2>/dev/null | wc -l)
    local last
    last=$(grep -aE '#[0-9]+.*(cov|ft):' "$log" 2>/dev/null | tail -1 | cut -c1-110)
    printf '%-18s crash files: %-3s %s\n' "$t" "$crashes" "${last:-(no progress line)}"
  done
}

# Merges inputs with new coverage from a campaign's corpus (default .fuzz) into the committed one.
cmd_merge() {
  local from=.fuzz
  if [ $# -gt 0 ] && [ -d "$1" ]; then from=$1; shift; fi
  local run=("$@") t
  [ ${#run[@]} -gt 0 ] || run=("${targets[@]}")
  cmd_build fuzzers
  for t in "${run[@]}"; do
    check_target "$t"
    [ -d "$from/$t/corpus" ] || { echo "fuzz.sh: no $from/$t/corpus, skipped"; continue; }
    local before after
    before=$(ls "tests/fuzz/corpus/$t" | wc -l)
    "$(binary "$t")" -merge=1 -timeout=10 -rss_limit_mb=2048 "tests/fuzz/corpus/$t" \
      "$from/$t/corpus" >"$from/$t/merge.log" 2>&1 || { tail "$from/$t/merge.log"; die "merge of $t"; }
    after=$(ls "tests/fuzz/corpus/$t" | wc -l)
    echo "fuzz.sh: $t: $before -> $after committed inputs ($(du -sh "tests/fuzz/corpus/$t" | cut -f1))"
  done
  echo "fuzz.sh: review and commit tests/fuzz/corpus (keep the total well under 2 MB)"
}

cmd_repro() {
  [ $# -ge 2 ] || die "usage: fuzz.sh repro TARGET FILE..."
  local t=$1
  shift
  check_target "$t"
  cmd_build "fuzz_$t" >/dev/null
  ASAN_SYMBOLIZER_PATH=$(symbolizer) UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$(binary "$t")" -runs=1 -timeout=30 -rss_limit_mb=2048 "$@"
}

cmd_triage() {
  [ $# -eq 1 ] || die "usage: fuzz.sh triage CAMPAIGN_OUTPUT_DIR"
  local dir=$1 t f any=0
  for t in "${targets[@]}"; do
    for f in "$dir/$t/crashes"/*; do
      [ -f "$f" ] || continue
      any=1
      echo "==== $t: $f ($(stat -c %s "$f") bytes)"
      cmd_repro "$t" "$f" 2>&1 | grep -E 'ERROR:|runtime error|SUMMARY|fuzz invariant|^    #[0-9]+ ' |
        head -25 || true
    done
  done
  [ $any -eq 1 ] || echo "fuzz.sh: no crash files under $dir/*/crashes"
}

# The saved reproducers: each should no longer crash once its bug is fixed (then move it into
# corpus/<target>/, where every `make test` replays it).
cmd_regress() {
  local t f rc=0
  cmd_build fuzzers >/dev/null
  for t in "${targets[@]}"; do
    for f in tests/fuzz/crashes/"$t"/*; do
      [ -f "$f" ] || continue
      if "$(binary "$t")" -runs=1 -timeout=30 "$f" >/dev/null 2>&1; then
        echo "fixed      $t/$(basename "$f")"
      else
        echo "CRASHES    $t/$(basename "$f")"
        rc=1
      fi
    done
  done
  return $rc
}

# DEST/: bin/ + lib/ (device-pack: the fuzzers and their non-system libraries), corpus/, dict/,
# fixtures/ (what the targets load), run-campaign.sh; and DEST.txz to carry.
cmd_pack() {
  [ $# -le 1 ] || die "usage: fuzz.sh pack [DEST] (a git-ignored folder; default .fuzz-pack)"
  local dest=${1:-.fuzz-pack} pack=../shared/tools/device-pack
  [ -x "$pack" ] || die "$pack not found (it lives in ../shared beside the checkout)"
  cmd_build fuzzers
  rm -rf "$dest"
  local bins=() t
  for t in "${targets[@]}"; do bins+=("$(binary "$t")"); done
  "$pack" "$dest" "${bins[@]}"
  # Function names stay for the stack traces; file:line comes from `fuzz.sh triage` here.
  strip --strip-debug "$dest"/bin/* 2>/dev/null || true
  strip --strip-unneeded "$dest"/lib/* 2>/dev/null || true
  cp -r tests/fuzz/corpus tests/fuzz/dict "$dest/"
  mkdir -p "$dest/fixtures/models/llama-gqa" "$dest/fixtures/tokenizers"
  cp tests/reference/models/llama-gqa/{config.json,generation_config.json,model.safetensors} \
    tests/reference/models/llama-gqa/{tokenizer.json,tokenizer_config.json} \
    "$dest/fixtures/models/llama-gqa/"
  for t in tests/reference/tokenizers/*/; do
    [ -f "$t"tokenizer.json ] || continue  # opt-slow: tokenizer_slow needs no fixture
    mkdir -p "$dest/fixtures/tokenizers/$(basename "$t")"
    cp "$t"tokenizer*.json "$dest/fixtures/tokenizers/$(basename "$t")/"
  done
  cp tests/fuzz/run-campaign.sh "$dest/"
  chmod +x "$dest/run-campaign.sh"
  local parent base
  parent=$(dirname "$dest")
  base=$(basename "$dest")
  # xz: with a checkout beside it, the archive must stay well under what a device run carries.
  XZ_OPT="-T0 -6" tar -C "$parent" -cJf "$dest.txz" "$base"
  du -sh "$dest" "$dest.txz"
  echo "fuzz.sh: carry $dest.txz; there: tar xJf $base.txz && $base/run-campaign.sh -t SECONDS -w WORKERS -o OUTDIR"
}

[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
command=$1
shift
case $command in
  build) cmd_build "$@" ;;
  list) cmd_list ;;
  run) cmd_run "$@" ;;
  merge) cmd_merge "$@" ;;
  repro) cmd_repro "$@" ;;
  triage) cmd_triage "$@" ;;
  regress) cmd_regress "$@" ;;
  pack) cmd_pack "$@" ;;
  *) sed -n '2,16p' "$0"; exit 2 ;;
esac
