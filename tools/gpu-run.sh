#!/usr/bin/env bash
# Runs on the GPU machine from the repository root (docs/gpu.md). Logs and JUnit XML go to $OUT
# (default ./gpu-out). Exits non-zero when any test or memcheck run fails; benchmarks never fail it.
#
#   bash .gpu/gpu-run.sh [--tests] [--bench] [--tp-bench] [--no-memcheck] [--record]
#   (default: tests and benchmarks; --bench includes --tp-bench where nvidia-smi lists 2+ GPUs)
#
# Tests: every packed *_test against the committed fixtures (the shard's gRPC integration test on
# the CUDA backend among them), then the kernel tests again under compute-sanitizer memcheck. With
# --record, the half-precision references are first recorded again with transformers
# (tools/reference/make_dtype_references.py) and the tests read those; they come back in
# $OUT/recorded-references.tgz, to be committed under tests/reference/models (TEXTGEN_RECORD_NAMES,
# comma-separated, records only those fixtures). Benchmarks: bench_rms_norm, bench_tokenizer beside HF tokenizers,
# and bench_cuda_model on a random-weight Llama-2-7B-shape checkpoint written by
# tools/bench/make_random_model.py, then on Falcon-7B and StarCoder-15B shapes (TEXTGEN_BENCH_SHAPES
# overrides the list). --tp-bench: bench_tp (TP=1 beside TP=2) on random-weight
# Llama-2-7B and Llama-2-13B-shape checkpoints (TEXTGEN_TP_SHAPES overrides the list);
# TEXTGEN_CUSTOM_ALL_REDUCE=0 in the environment gives NCCL's all-reduce alone.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# Never NVLink multicast (NVLS): it can take the host's shared GPUs out of service (../shared notes).
export NCCL_NVLS_ENABLE=0
tests=0 bench=0 tpbench=0 memcheck=1 record=0
for a in "$@"; do
  case $a in
    --tests) tests=1 ;;
    --bench) bench=1 ;;
    --tp-bench) tpbench=1 ;;
    --no-memcheck) memcheck=0 ;;
    --record) record=1 ;;
    *) echo "gpu-run: unknown option $a" >&2; exit 2 ;;
  esac
done
[ $tests -eq 0 ] && [ $bench -eq 0 ] && [ $tpbench -eq 0 ] && tests=1 bench=1
[ $bench -eq 1 ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && tpbench=1
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"

if [ $tests -eq 1 ]; then
  # The fixtures with the references recorded here; what was recorded comes back as one archive
  # (reference-*.json and any new fixture) to be committed under tests/reference/models.
  models=${TMPDIR:-/tmp}/textgen-models
  rm -rf "$models"
  cp -rp tests/reference/models "$models"  # -p: only what is recorded here is newer than device.txt
  if [ $record -eq 1 ] && python3 -c "import transformers, torch" 2>/dev/null; then
    echo "== half-precision references (transformers)"
    python3 tools/reference/make_dtype_references.py "$models" tests/reference/tokenizers/llama2 ${TEXTGEN_RECORD_NAMES:-} 2>&1 |
      grep -v "Warning\|Loading weights\|Writing model" | tee "$out/dtype_references.log"
    (cd "$models" && find . -newer "$out/device.txt" -type f | tar -czf "$out/recorded-references.tgz" -T -)
  fi
  export TEXTGEN_MODEL_FIXTURES="$models"
  export TEXTGEN_SHARD_BINARY="$here/bin/textgen-shard" TEXTGEN_TEST_DEVICE=cuda
  for t in "$here"/bin/*_test; do
    name=$(basename "$t")
    echo "== $name"
    "$t" --gtest_output="xml:$out/$name.xml" 2>&1 | tee "$out/$name.log" | grep -v "^\[       OK\|^\[ RUN"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  # Every fixture served by the launcher on the GPU: the whole model on one GPU, and --num-shard 2
  # where there are two.
  if [ -x "$here/bin/textgen-launcher" ]; then
    worlds=1
    [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && worlds=1,2
    echo "== tp_fixtures (textgen-launcher --num-shard $worlds on the GPU, float32, against transformers)"
    python3 tests/integration/tp_fixtures_test.py "$here/bin/textgen-launcher" "$models" cuda $worlds 2>&1 |
      tee "$out/tp_fixtures.log" | grep -v "^ok: "
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
  if [ $memcheck -eq 1 ] && command -v compute-sanitizer >/dev/null; then
    echo "== kernels_cuda_test (compute-sanitizer memcheck)"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$here/bin/kernels_cuda_test" 2>&1 |
      tail -n 5 | tee "$out/kernels_cuda_test.memcheck.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi

if [ $bench -eq 1 ]; then
  if [ -x "$here/bin/bench_rms_norm" ]; then
    echo "== bench_rms_norm"
    "$here/bin/bench_rms_norm" 2>&1 | tee "$out/bench_rms_norm.log" || true
  fi
  if [ -x "$here/bin/bench_cuda_model" ] && python3 -c "import torch, safetensors" 2>/dev/null; then
    model=${TMPDIR:-/tmp}/textgen-llama-2-7b
    [ -f "$model/model.safetensors.index.json" ] ||
      python3 tools/bench/make_random_model.py "$model" --shape llama-2-7b --dtype bfloat16
    echo "== bench_cuda_model (Llama-2-7B shape, bfloat16)"
    "$here/bin/bench_cuda_model" --model "$model" 2>&1 | tee "$out/bench_cuda_model.log" || true
    # The same without programmatic dependent launch, and kernel timelines of one decode step (CUPTI;
    # without it, since kernels launched early count their wait as running time).
    echo "== bench_cuda_model --no-pdl"
    "$here/bin/bench_cuda_model" --model "$model" --no-pdl 2>&1 | tee "$out/bench_cuda_model.no-pdl.log" || true
    for args in "--profile 1 --no-pdl" "--profile 64 --no-pdl"; do
      echo "== bench_cuda_model $args"
      "$here/bin/bench_cuda_model" --model "$model" $args 2>&1 | tee -a "$out/bench_cuda_profile.log" || true
    done
    # The other families' benchmark shapes (issue 15), each written, measured and removed in turn
    # (StarCoder-15B alone is 31 GB of disk).
    for shape in ${TEXTGEN_BENCH_SHAPES:-falcon-7b starcoder-15b}; do
      fmodel=${TMPDIR:-/tmp}/textgen-$shape
      python3 tools/bench/make_random_model.py "$fmodel" --shape "$shape" --dtype bfloat16 2>&1 | tail -n 1
      echo "== bench_cuda_model ($shape shape, bfloat16)"
      "$here/bin/bench_cuda_model" --model "$fmodel" 2>&1 | tee "$out/bench_cuda_model.$shape.log" || true
      rm -rf "$fmodel"
    done
  fi
  # Tokenizer encode throughput beside Hugging Face tokenizers on the same documents and machine.
  if [ -x "$here/bin/bench_tokenizer" ] && python3 -c "import tokenizers" 2>/dev/null &&
     [ -n "${TEXTGEN_BENCH_TOKENIZER:-}" ]; then
    echo "== bench_tokenizer (with Hugging Face tokenizers)"
    docs=${TMPDIR:-/tmp}/textgen-bench-docs.jsonl
    python3 tools/reference/tokenizer_bench_hf.py tests/reference/tokenizers "$docs" "$out/hf_tokenizers.json" 2>&1 |
      tee "$out/hf_tokenizers.log"
    "$here/bin/bench_tokenizer" --fixtures tests/reference/tokenizers --docs "$docs" \
      --hf "$out/hf_tokenizers.json" 2>&1 | tee "$out/bench_tokenizer.log" || true
  fi
fi
# Tensor parallelism: the same random-weight model at TP=1 and TP=2 (one process per GPU).
if [ $tpbench -eq 1 ]; then
  if [ -x "$here/bin/bench_tp" ] && python3 -c "import torch, safetensors" 2>/dev/null; then
    nvidia-smi topo -m 2>&1 | tee "$out/topology.txt"
    for shape in ${TEXTGEN_TP_SHAPES:-llama-2-7b llama-2-13b}; do
      model=${TMPDIR:-/tmp}/textgen-$shape
      [ -f "$model/model.safetensors.index.json" ] ||
        python3 tools/bench/make_random_model.py "$model" --shape "$shape" --dtype bfloat16
      echo "== bench_tp ($shape shape, bfloat16)"
      "$here/bin/bench_tp" --model "$model" --tp 1,2 2>&1 | tee "$out/bench_tp.$shape.log" || true
    done
  else
    echo "== bench_tp skipped: not packed, or torch/safetensors missing"
  fi
fi
echo "gpu-run: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
