#!/usr/bin/env bash
# T5 on the GPU machine (docs/t5.md), from the repository root with .gpu.txz beside it (make gpu-pack
# with GPU_PACK_BINS="tests/kernels/kernels_cuda_test tests/unit/runtime_cuda_test textgen-launcher
# textgen-shard textgen-router bench/bench_t5"): the paged-attention kernel tests (T5's modes among
# them), the T5 CUDA tests against the committed bfloat16 references (--record: recorded again
# with transformers first), the served test in bfloat16, then bench_t5 on a random FLAN-T5-XL-shape
# checkpoint (--profile: its kernel tables). Logs to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
record=0 profile=
for a in "$@"; do
  case $a in
    --record) record=1 ;;
    --profile) profile=--profile ;;
  esac
done
tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TEXTGEN_MODEL_FIXTURES=$PWD/tests/reference/models PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
if [ $record = 1 ]; then
  python3 tools/reference/make_t5_dtype_references.py tests/reference/models 2>&1 | grep -v Warning | tail -5
  for d in tests/reference/models/t5-*; do cp $d/reference-bfloat16.json $OUT/$(basename $d).reference-bfloat16.json; done
fi
rc=0
[ -x .gpu/bin/kernels_cuda_test ] && { .gpu/bin/kernels_cuda_test 2>&1 | tee $OUT/kernels.log | grep -E "^\[  (PASSED|FAILED)|Failure" | tail -15 || rc=1; }
.gpu/bin/runtime_cuda_test --gtest_filter='*T5*:CudaEngine*:*llama_gqa*' 2>&1 | tee $OUT/cuda_test.log | grep -E "^\[  (PASSED|FAILED)|bf16|Failure" | tail -20 || rc=1
timeout 300 python3 tests/integration/t5_serve_test.py .gpu/bin/textgen-launcher tests/reference/models cuda 2>&1 | tee $OUT/serve.log | grep -E "FAIL|passed" | head -20 || rc=1
(python3 tools/bench/make_random_model.py /tmp/flan-t5-xl --shape flan-t5-xl 2>&1 | tail -1) &&
  timeout 300 .gpu/bin/bench_t5 --model /tmp/flan-t5-xl $profile 2>&1 | tee $OUT/bench.log | tail -45
exit $rc
