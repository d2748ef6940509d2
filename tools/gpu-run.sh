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

for b in "$here"/bin/bench_*; do
  name=$(basename "$b")
  echo "== $name"
  "$b" 2>&1 | tee "$out/$name.log" || true
done
echo "gpu-run: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
