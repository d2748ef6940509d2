#!/usr/bin/env bash
# Packs the GPU tests and benchmarks of a build tree, with their non-CUDA shared libraries, into DEST
# (default .gpu/, ignored by git) for the GPU machine, plus tools/gpu-run.sh. See docs/gpu.md.
set -euo pipefail
build=${1:-build}
dest=${2:-.gpu}
cd "$(dirname "$0")/.."
pack=../shared/tools/device-pack
[ -x "$pack" ] || { echo "gpu-pack: $pack not found (it lives in ../shared beside the checkout)" >&2; exit 1; }
bins=()
for b in tests/kernels/kernels_cuda_test tests/unit/runtime_cuda_test tests/unit/runtime_tp_cuda_test \
  tests/integration/shard_grpc_test textgen-shard textgen-router \
  bench/bench_rms_norm bench/bench_tokenizer bench/bench_cuda_model; do
  [ -x "$build/$b" ] || { echo "gpu-pack: $build/$b missing: build with nvcc present (make build)" >&2; exit 1; }
  bins+=("$build/$b")
done
# Packed when built (newer benchmarks).
for b in bench/bench_tp textgen-launcher; do
  [ -x "$build/$b" ] && bins+=("$build/$b")
done
rm -rf "$dest"
"$pack" "$dest" "${bins[@]}"
strip --strip-unneeded "$dest"/bin/* "$dest"/lib/* 2>/dev/null || true
cp tools/gpu-run.sh "$dest/"
du -sh "$dest"
# Carried as one compressed file (the libraries alone pass the 64 MiB a call may carry):
#   tar xJf .gpu.txz && bash .gpu/gpu-run.sh (xz: the tracked tree and the pack must fit in 64 MiB)
tar -cJf "$dest.txz" "$dest"
du -sh "$dest.txz"
