#!/usr/bin/env bash
# Tensor parallelism A/B on one multi-GPU machine (issue 14), from the repository root with .gpu.txz
# beside it (GPU_PACK_BINS="tests/unit/runtime_tp_cuda_test bench/bench_tp" tools/gpu-pack.sh build
# .gpu; more fixtures as .gpu/fixtures.txz, docs/gpu.md): the communicator's tests and the carried
# fixtures over 2 GPUs, then bench_tp on a random-weight Llama-2-7B-shape checkpoint written here:
# TP=1 and TP=2 once, then TP=2 again under each setting of AB (space-separated VAR=value[,VAR=value]
# items), so that every figure comes from the same cards. Logs to $OUT.
#   AB="TEXTGEN_ALL_REDUCE_PROTOCOL=flags TEXTGEN_ALL_REDUCE_BLOCKS=16" bash tools/gpu-tp-ab.sh
#   FIXTURES='*llama_gqa_tp2*'   the fixture tests to run (those carried over); TESTS=0 skips tests
#   BATCHES=64                   bench_tp's batches beside batch 1
#   SHAPES="llama-2-7b llama-2-13b"  the shapes at BASE_TP (default 1,2)
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
[ -d .gpu/bin ] || tar xJf .gpu.txz
# Made from the repository root (tests/reference/models/...) or from tests/ (reference/...).
if [ -f .gpu/fixtures.txz ]; then
  first=$(tar tJf .gpu/fixtures.txz 2>/dev/null | head -1)  # (tar's SIGPIPE ignored)
  case $first in
    reference/*) tar xJf .gpu/fixtures.txz -C tests ;;
    *) tar xJf .gpu/fixtures.txz ;;
  esac
fi
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TEXTGEN_MODEL_FIXTURES=$PWD/tests/reference/models PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.max.sm,temperature.gpu --format=csv,noheader
rc=0
t0=$(date +%s)
if [ "${TESTS:-1}" != 0 ]; then
  timeout "${TEST_TIMEOUT:-240}" .gpu/bin/runtime_tp_cuda_test \
    --gtest_filter="Nccl*:TensorParallelBiases*:${FIXTURES:-*llama_gqa_tp2*}" 2>&1 |
    tee "$OUT/tp_test.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED)|^\[  FAILED|Failure|diverges|^\[       OK" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "== tests: $(( $(date +%s) - t0 )) s"
fi
summary() { grep -E "batch-1|sequences|all-reduce|roofline|^ *tp|TP" "$1" | grep -v '^{' | head -30; }
# SHAPES: the shapes measured at BASE_TP (the first is also the A/B's).
for shape in ${SHAPES:-llama-2-7b}; do
  m=/tmp/$shape
  [ -f $m/model.safetensors.index.json ] ||
    python3 tools/bench/make_random_model.py $m --shape $shape --dtype bfloat16 2>&1 | tail -1
  echo "== $shape: bench_tp --tp ${BASE_TP:-1,2} (defaults) at $(( $(date +%s) - t0 )) s"
  timeout "${BENCH_TIMEOUT:-200}" .gpu/bin/bench_tp --model $m --tp "${BASE_TP:-1,2}" \
    --batches "${BATCHES:-64}" > "$OUT/bench_tp.$shape.log" 2>&1
  summary "$OUT/bench_tp.$shape.log"
done
m=/tmp/$(echo ${SHAPES:-llama-2-7b} | cut -d' ' -f1)
i=0
for setting in ${AB:-}; do
  i=$((i + 1))
  echo "== bench_tp --tp 2 with $setting at $(( $(date +%s) - t0 )) s"
  env ${setting//,/ } timeout "${BENCH_TIMEOUT:-200}" .gpu/bin/bench_tp --model $m --tp 2 \
    --batches "${BATCHES:-64}" > "$OUT/bench_tp.ab$i.log" 2>&1
  summary "$OUT/bench_tp.ab$i.log"
done
echo "== done at $(( $(date +%s) - t0 )) s, rc $rc"
exit $rc
