#!/usr/bin/env bash
# T5 on the GPU machine (docs/t5.md), from the repository root with .gpu.txz beside it (make gpu-pack
# with GPU_PACK_BINS="tests/unit/runtime_cuda_test textgen-launcher textgen-shard textgen-router
# bench/bench_t5"): records the bfloat16 references with transformers, runs the T5 CUDA tests and
# the served test in bfloat16, then bench_t5 on a random FLAN-T5-XL-shape checkpoint. Logs to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TEXTGEN_MODEL_FIXTURES=$PWD/tests/reference/models PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 tools/reference/make_t5_dtype_references.py tests/reference/models 2>&1 | grep -v Warning | tail -5
for d in tests/reference/models/t5-*; do cp $d/reference-bfloat16.json $OUT/$(basename $d).reference-bfloat16.json; done
.gpu/bin/runtime_cuda_test --gtest_filter='*T5*:CudaEngine*:*llama_gqa*' 2>&1 | grep -E "^\[  |bf16|FAIL|Failure|error" | tail -40 | tee $OUT/cuda_test.log
timeout 300 python3 tests/integration/t5_serve_test.py .gpu/bin/textgen-launcher tests/reference/models cuda 2>&1 | tee $OUT/serve.log | grep -E "FAIL|passed" | head -20
(python3 tools/bench/make_random_model.py /tmp/flan-t5-xl --shape flan-t5-xl 2>&1 | tail -2) && timeout 240 .gpu/bin/bench_t5 --model /tmp/flan-t5-xl 2>&1 | tee $OUT/bench.log | tail -30
