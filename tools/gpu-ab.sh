#!/usr/bin/env bash
# A/B of an environment switch on one GPU machine (bench/README.md, issue 17): the engine's batch sweep
# and, with SERVE=1, tools/gpu-serve.sh's workloads, with AB_VAR set to each of AB_VALUES in turn, so
# that every figure of the comparison comes from the same card (lent cards differ by a few percent).
#   AB_VAR=TEXTGEN_ATTN_LANES16 AB_VALUES="1 0" SERVE=1 bash tools/gpu-ab.sh
# Pack: GPU_PACK_BINS="bench/bench_cuda_model [textgen-launcher textgen-router textgen-shard]" tools/gpu-pack.sh
# build .gpu (plus .gpu/tok/ for serving, as tools/gpu-serve.sh says). Knobs: BATCHES, BPROMPT, BSTEPS,
# REPEAT (sweeps per value, alternated), WORKLOADS (gpu-serve.sh's names).
set -u
[ -d .gpu/bin ] || tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
: "${AB_VAR:?AB_VAR names the environment variable to compare}"
O=${OUT:-gpu-out}
mkdir -p "$O"
t0=$(date +%s)
nvidia-smi --query-gpu=name,temperature.gpu,clocks_event_reasons.active --format=csv,noheader
m=/tmp/textgen-llama-2-7b
[ -f $m/model.safetensors.index.json ] ||
  python3 tools/bench/make_random_model.py $m --shape llama-2-7b --dtype bfloat16 2>&1 | tail -n 1
[ -d .gpu/tok ] && cp .gpu/tok/* $m/
batches=${BATCHES:-1,8,16,24,32,40,48,64,128,256}
for r in $(seq 1 "${REPEAT:-1}"); do
  for v in ${AB_VALUES:-1 0}; do
    echo "== $AB_VAR=$v: bench_cuda_model --prompt ${BPROMPT:-128} --steps ${BSTEPS:-256} (decode ms/step by batch)"
    env "$AB_VAR=$v" timeout 150 .gpu/bin/bench_cuda_model --model $m --prompt "${BPROMPT:-128}" \
      --steps "${BSTEPS:-256}" --batches "$batches" > "$O/bench.$v.$r.log" 2>&1
    grep -E '^ +[0-9]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9]+$' "$O/bench.$v.$r.log" |
      awk '{printf "%s:%s ", $1, $4} END {print ""}'
  done
done
if [ -n "${SERVE:-}" ]; then
  # gpu-serve.sh runs the kernel tests and the engine bench when packed: not again here.
  for b in kernels_cuda_test bench_cuda_model; do [ -x .gpu/bin/$b ] && chmod -x .gpu/bin/$b; done
  for v in ${AB_VALUES:-1 0}; do
    echo "== $AB_VAR=$v: served"
    env "$AB_VAR=$v" OUT="$O/serve.$v" WORKLOADS="${WORKLOADS:-burst64 poisson16}" SBT="${SBT:-100}" \
      bash tools/gpu-serve.sh 2>&1 | grep -E '^==|TPOT|TTFT  |output token|shard forward|per decode'
  done
fi
echo "done in $(( $(date +%s) - t0 )) s"
