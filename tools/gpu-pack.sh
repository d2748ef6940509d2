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
# GPU_PACK_BINS="a b ...": only these (paths in the build tree), e.g. to fit one device call.
for b in ${GPU_PACK_BINS:-}; do
  [ -x "$build/$b" ] || { echo "gpu-pack: $build/$b missing" >&2; exit 1; }
  bins+=("$build/$b")
done
[ ${#bins[@]} -gt 0 ] || for b in tests/kernels/kernels_cuda_test tests/unit/runtime_cuda_test tests/unit/runtime_tp_cuda_test \
  tests/integration/shard_grpc_test textgen-shard textgen-router \
  bench/bench_rms_norm bench/bench_tokenizer bench/bench_cuda_model; do
  [ -x "$build/$b" ] || { echo "gpu-pack: $build/$b missing: build with nvcc present (make build)" >&2; exit 1; }
  bins+=("$build/$b")
done
# Packed when built (newer benchmarks).
[ -n "${GPU_PACK_BINS:-}" ] || for b in bench/bench_tp textgen-launcher; do
  [ -x "$build/$b" ] && bins+=("$build/$b")
done
rm -rf "$dest"
"$pack" "$dest" "${bins[@]}"
strip --strip-unneeded "$dest"/bin/* "$dest"/lib/* 2>/dev/null || true
# textgen calls OpenBLAS for one routine (cblas_sgemm, the CPU backend's GEMM) plus
# openblas_set_num_threads, and on the GPU machine only for tiny fixtures. A shim library of that name
# over the reference BLAS (Debian's libblas3, 0.4 MB, no Fortran runtime) stands in for OpenBLAS
# (36 MB with libgfortran), keeping the pack plus the tree within the device tool's 64 MiB.
ref_blas=/usr/lib/x86_64-linux-gnu/blas/libblas.so.3
blas_defs=$(nm -D "$ref_blas" 2>/dev/null || true)  # whole outputs: grep -q under pipefail races
blas_uses=$(nm -D --undefined-only "$dest"/bin/* 2>/dev/null || true)
if [ -f "$dest/lib/libopenblas.so.0" ] && grep -q ' T cblas_sgemm$' <<<"$blas_defs" &&
  [ -z "$(grep -v 'cblas_sgemm\|openblas_set_num_threads' <<<"$blas_uses" | grep -i 'openblas\|cblas_\| [sdcz]gemm_' || true)" ]; then
  shim=$(mktemp -d)
  echo 'void openblas_set_num_threads(int n) { (void)n; }' >"$shim/shim.c"
  cp -L "$ref_blas" "$dest/lib/libblas.so.3"
  cc -shared -fPIC -O2 -o "$dest/lib/libopenblas.so.0" -Wl,-soname,libopenblas.so.0 "$shim/shim.c" \
    -Wl,--no-as-needed "$dest/lib/libblas.so.3"
  rm -rf "$shim"
  for lib in libgfortran.so.5 libquadmath.so.0; do  # OpenBLAS's; dropped if nothing else needs them
    needed=0
    for f in "$dest"/bin/* "$dest"/lib/*; do
      [ "$(basename "$f")" = "$lib" ] && continue
      readelf -d "$f" 2>/dev/null | grep -q "NEEDED.*\[$lib\]" && needed=1
    done
    [ "$needed" = 1 ] || rm -f "$dest/lib/$lib"
  done
fi
cp tools/gpu-run.sh "$dest/"
du -sh "$dest"
# Carried as one compressed file (the libraries alone pass the 64 MiB a call may carry):
#   tar xJf .gpu.txz && bash .gpu/gpu-run.sh (xz: the tracked tree and the pack must fit in 64 MiB)
tar -cJf "$dest.txz" "$dest"
du -sh "$dest.txz"
