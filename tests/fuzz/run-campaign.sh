#!/usr/bin/env bash
# run-campaign.sh — a long fuzzing campaign from a folder made by `tools/fuzz.sh pack` (docs/
# fuzzing.md), on any x86-64 Linux (glibc 2.36 or newer): every target runs at the same time for
# SECONDS, each with WORKERS processes (libFuzzer's fork mode: it goes on after a crash and keeps
# every distinct crash file). Pick WORKERS so that 7 x WORKERS is about the number of cores.
#
#   run-campaign.sh [-t SECONDS] [-w WORKERS] [-o OUTDIR] [TARGET...]
#
# OUTDIR/<target>/: log.txt, crashes/ (crash-*, timeout-*, oom-*, leak-* inputs), corpus/ (new
# inputs: `tools/fuzz.sh merge OUTDIR` folds them into the committed corpus); OUTDIR/summary.txt.
# Bring OUTDIR back and run `tools/fuzz.sh triage OUTDIR` in the checkout for symbolized stacks.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=3600 workers=2 out=fuzz-out
while getopts "t:w:o:" o; do
  case $o in
    t) seconds=$OPTARG ;; w) workers=$OPTARG ;; o) out=$OPTARG ;;
    *) echo "usage: run-campaign.sh [-t SECONDS] [-w WORKERS] [-o OUTDIR] [TARGET...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for b in "$here"/bin/fuzz_*; do targets+=("$(basename "$b" | sed 's/^fuzz_//')"); done
fi
declare -A dicts=([safetensors]=safetensors.dict [model_config]=model_config.dict
                  [tokenizer_json]=tokenizer_json.dict [tokenizer_slow]=tokenizer_slow.dict
                  [router_request]=router.dict
                  [router_routes]=router.dict)
export TEXTGEN_FUZZ_FIXTURES="$here/fixtures"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
symbolizer=$(command -v llvm-symbolizer || ls /usr/bin/llvm-symbolizer-* 2>/dev/null | tail -1 || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p "$out"
echo "run-campaign: ${targets[*]}: ${seconds}s each, $workers worker(s) each, $(nproc) cores; output in $out"
pids=()
for t in "${targets[@]}"; do
  [ -x "$here/bin/fuzz_$t" ] || { echo "run-campaign: no target $t" >&2; exit 2; }
  mkdir -p "$out/$t/corpus" "$out/$t/crashes"
  dict=()
  [ -n "${dicts[$t]:-}" ] && dict=(-dict="$here/dict/${dicts[$t]}")
  "$here/bin/fuzz_$t" -fork="$workers" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$out/$t/crashes/" \
    "${dict[@]}" "$out/$t/corpus" "$here/corpus/$t" >"$out/$t/log.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
{
  echo "campaign: ${seconds}s x $workers worker(s) per target on $(nproc) cores, $(date -u +%FT%TZ)"
  for t in "${targets[@]}"; do
    n=$(find "$out/$t/crashes" -type f | wc -l)
    last=$(grep -aE '#[0-9]+.*(cov|ft):' "$out/$t/log.txt" | tail -1 | cut -c1-110)
    printf '%-18s crash files: %-3s corpus: %-5s %s\n' "$t" "$n" "$(ls "$out/$t/corpus" | wc -l)" "$last"
  done
} | tee "$out/summary.txt"
