#!/usr/bin/env bash
# Issue 17's serving workloads on the GPU machine (bench/README.md): a random-weight Llama-2-7B shape served by
# one textgen-launcher, several serve_bench.py runs against it (--url), then bench_cuda_model when packed.
# Pack: GPU_PACK_BINS="textgen-launcher textgen-router textgen-shard [bench/bench_cuda_model]" tools/gpu-pack.sh
# build-gpu .gpu, copy a tokenizer (tokenizer.json, tokenizer_config.json) into .gpu/tok/, tar -cJf .gpu.txz .gpu;
# carry .gpu.txz (with tests/reference/models moved aside, the tree and the pack fit the 64 MiB a call carries).
# WORKLOADS picks runs (prefix64 prefixpoisson single burst64 poisson16 burst200 burst256); LAUNCH_ARGS adds launcher flags;
# OTLP_LEGS=1 measures each step call's request and response legs (bench/serve/otlp_sink.py --legs).
[ -d .gpu/bin ] || tar xJf .gpu.txz
export LD_LIBRARY_PATH=$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
m=/tmp/textgen-llama-2-7b
t0=$(date +%s)
if [ -x .gpu/bin/kernels_cuda_test ]; then
  timeout 200 .gpu/bin/kernels_cuda_test --gtest_filter="${KFILTER:-*PagedAttention*}" > $OUT/kernels.log 2>&1
  echo "kernels_cuda_test rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/kernels.log | tr '\n' ' ')"; grep -E "Failure|FAILED  \]" $OUT/kernels.log | head -10
fi
[ -f $m/model.safetensors.index.json ] || python3 tools/bench/make_random_model.py $m --shape llama-2-7b --dtype bfloat16 2>&1 | tail -n 1
cp .gpu/tok/* $m/
echo "model written in $(( $(date +%s) - t0 )) s"
# OTLP_LEGS=1: the launcher traces every step into bench/serve/otlp_sink.py, which prints after each
# workload where a Prefill or Decode call's time beyond the shard's handler went (request/response).
if [ -n "${OTLP_LEGS:-}" ]; then
  python3 bench/serve/otlp_sink.py --port 4317 --legs > $OUT/otlp.jsonl 2>&1 &
  sinkp=$!
  LAUNCH_ARGS="${LAUNCH_ARGS:-} --otlp-endpoint http://127.0.0.1:4317"
fi
.gpu/bin/textgen-launcher --model-id $m --port 8080 --max-concurrent-requests 512 ${LAUNCH_ARGS:-} > $OUT/launcher.log 2>&1 &
lp=$!
for i in $(seq 1 300); do
  curl -sf -o /dev/null 127.0.0.1:8080/health && break
  kill -0 $lp 2>/dev/null || { echo "launcher exited"; tail -20 $OUT/launcher.log; exit 1; }
  sleep 1
done
echo "serving after $(( $(date +%s) - t0 )) s"
sb() { echo "== $*"; timeout ${SBT:-150} python3 bench/serve/serve_bench.py --url http://127.0.0.1:8080 "$@" 2>&1 | tee -a $OUT/serve.log | grep -v '^{' ; grep '^{' $OUT/serve.log | tail -1 >> $OUT/serve.jsonl; }
for w in ${WORKLOADS:-prefix64 burst64 poisson16 burst200 prefixpoisson}; do
  case $w in
    prefix64) sb --seed 11 --dataset shared-prefix --prefix-len 2048 --input-len 64 --output-len 32 --num-prompts 12 --max-concurrency 1 ;;
    prefixpoisson) sb --seed 12 --arrival poisson --rate 8 --dataset shared-prefix --prefix-len 2048 --input-len 64 --output-len 64 --num-prompts 96 ;;
    single) sb --seed 16 --arrival burst --num-prompts 4 --max-concurrency 1 --input-len 128 --output-len 256 ;;
    burst64) sb --seed 13 --arrival burst --num-prompts 64 --input-len 128 --output-len 256 ;;
    poisson16) sb --seed 14 --arrival poisson --rate 16 --num-prompts 320 --input-len 512 --output-len 128 ;;
    burst256) sb --seed 17 --arrival burst --num-prompts 256 --input-len 128 --output-len 128 ;;
    burst200) sb --seed 15 --arrival burst --num-prompts 200 --input-len 512 --output-len 128 ;;
  esac
  curl -s 127.0.0.1:8080/metrics > $OUT/metrics.$w.txt
  if [ -n "${sinkp:-}" ]; then
    sleep 2.5  # the exporters send every second
    kill -USR1 $sinkp; sleep 0.5; echo "legs $w: $(tail -n 1 $OUT/otlp.jsonl)"
  fi
done
kill $lp; wait $lp 2>/dev/null
[ -n "${sinkp:-}" ] && { kill $sinkp; wait $sinkp 2>/dev/null; }
if [ -x .gpu/bin/bench_cuda_model ]; then
  echo "== bench_cuda_model (engine alone, prompt ${BPROMPT:-256})"
  timeout ${BT:-120} .gpu/bin/bench_cuda_model --model $m --prompt ${BPROMPT:-256} 2>&1 | tee $OUT/bench.log | grep -v '^{' | tail -30
fi
echo "done in $(( $(date +%s) - t0 )) s"
