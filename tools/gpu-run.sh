#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: every packed GPU test (then again under
# compute-sanitizer memcheck) and every benchmark. Logs and JUnit XML go to $OUT (default ./gpu-out).
# Exits non-zero when any test or memcheck run fails; benchmarks never fail the run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"

for t in "$here"/bin/*_test; do
  name=$(basename "$t")
  echo "== $name"
  "$t" --gtest_output="xml:$out/$name.xml" 2>&1 | tee "$out/$name.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  if command -v compute-sanitizer >/dev/null; then
    echo "== $name (compute-sanitizer memcheck)"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$t" 2>&1 | tail -n 5 | tee "$out/$name.memcheck.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
done

if [ -x "$here/bin/bench_rms_norm" ]; then
  echo "== bench_rms_norm"
  "$here/bin/bench_rms_norm" 2>&1 | tee "$out/bench_rms_norm.log" || true
fi

# Tokenizer encode throughput beside Hugging Face tokenizers on the same documents and machine
# (run from the repository root: it needs the fixtures and tools/reference).
if [ -x "$here/bin/bench_tokenizer" ] && python3 -c "import tokenizers" 2>/dev/null; then
  echo "== bench_tokenizer (with Hugging Face tokenizers)"
  docs=${TMPDIR:-/tmp}/textgen-bench-docs.jsonl
  python3 tools/reference/tokenizer_bench_hf.py tests/reference/tokenizers "$docs" "$out/hf_tokenizers.json" 2>&1 |
    tee "$out/hf_tokenizers.log"
  "$here/bin/bench_tokenizer" --fixtures tests/reference/tokenizers --docs "$docs" \
    --hf "$out/hf_tokenizers.json" 2>&1 | tee "$out/bench_tokenizer.log" || true
fi
echo "gpu-run: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
