#!/usr/bin/env bash
# Speculative decoding and the watermark on the GPU machine (docs/speculation.md), from the
# repository root with .gpu.txz beside it (make gpu-pack with GPU_PACK_BINS="tests/kernels/
# kernels_cuda_test tests/unit/runtime_cuda_test textgen-launcher textgen-shard textgen-router
# textgen-watermark bench/bench_speculation"): torch's seeded CPU randperm recorded for the green-list
# test (tests/reference/watermark/torch_randperm.json), the sampling kernel's tests (watermarked
# rows among them), the engine's speculation and watermark tests on CUDA with graphs, the served
# test on the GPU, then bench_speculation on the demo model in bfloat16 and float32 (BENCH_SPECULATE: the
# values to compare, e.g. 2,4,6; not SPECULATE, which the launcher reads as TGI does), with the
# demo's Medusa heads (BENCH_MEDUSA: how many of them propose, e.g. 1,2,3,4), and with
# --llama7b on a random Llama-2-7B shape. Logs to $OUT.
set -o pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TEXTGEN_MODEL_FIXTURES=$PWD/tests/reference/models \
  TEXTGEN_DEMO_MODEL=$PWD/models/demo PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 tools/watermark/record_torch_randperm.py "$OUT/torch_randperm.json" 2>&1 | tail -2
rc=0
.gpu/bin/kernels_cuda_test 2>&1 | tee $OUT/kernels.log | grep -E "^\[  (PASSED|FAILED)|Failure" | tail -15 || rc=1
grep -q "FAILED" $OUT/kernels.log && rc=1
# FIXTURES='*llama_gqa*:...': the fixture tests to run besides speculation's (those carried over).
.gpu/bin/runtime_cuda_test --gtest_filter="Speculation*:ProposeNgram*:*Medusa*:CudaEngine*:${FIXTURES:-*llama_gqa*}" 2>&1 | tee $OUT/cuda_test.log | grep -E "^\[  (PASSED|FAILED)|Failure|Which is|^  " | tail -30 || rc=1
grep -q "FAILED" $OUT/cuda_test.log && rc=1
timeout 400 python3 tests/integration/speculation_serve_test.py .gpu/bin/textgen-launcher .gpu/bin/textgen-watermark models/demo cuda 2>&1 | tee $OUT/serve.log | grep -E "FAIL|passed" | head -20 || rc=1
for dt in bfloat16 float32; do
  timeout 200 .gpu/bin/bench_speculation --model models/demo --dtype $dt --speculate ${BENCH_SPECULATE:-4} \
    --repeat 5 2>&1 | tee $OUT/bench-$dt.log | grep -v '^{'
done
# Medusa: the demo model's trained heads (models/demo-medusa), 1 to 4 of them proposing.
timeout 200 .gpu/bin/bench_speculation --medusa models/demo-medusa --dtype bfloat16 \
  --speculate ${BENCH_MEDUSA:-1,2,3,4} --repeat 5 2>&1 | tee $OUT/bench-medusa.log | grep -v '^{'
# --llama7b: the cost of verification on a Llama-2-7B shape (random weights, the demo's tokenizer:
# proposals come from the prompt's and the output's repeats, whatever the weights).
if [[ " $* " == *" --llama7b "* ]]; then
  python3 tools/bench/make_random_model.py /tmp/llama-2-7b --shape llama-2-7b 2>&1 | tail -1
  cp models/demo/tokenizer.json models/demo/tokenizer_config.json /tmp/llama-2-7b/
  timeout 300 .gpu/bin/bench_speculation --model /tmp/llama-2-7b --speculate 4 --tokens 64 \
    --repeat 2 2>&1 | tee $OUT/bench-llama-2-7b.log | grep -v '^{'
fi
exit $rc
