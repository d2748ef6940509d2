// clamp (kernels/clamp.h): one grid-stride pass over the rows, in place.
#include <algorithm>

#include "common.cuh"
#include "textgen/kernels/clamp.h"

namespace textgen::kernels {
namespace {

using cuda::Convert;

template <typename T>
__global__ void clampKernel(T* x, int64_t rows, int64_t cols, int64_t rowStride, float limit) {
  using C = Convert<T>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* at = x + (i / cols) * rowStride + i % cols;
    const float v = C::toFloat(*at);
    // Comparisons are false for NaN: it passes through unchanged.
    if (v > limit)
      *at = C::fromFloat(limit);
    else if (v < -limit)
      *at = C::fromFloat(-limit);
  }
}

template <typename T>
Status launchClamp(const ClampParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.cols;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65536));
  return cuda::launch("clamp", clampKernel<T>, blocks, 256, 0, stream, static_cast<T*>(p.x), p.rows,
                      p.cols, p.rowStride, p.limit);
}

}  // namespace

Status invokeClamp(const ClampParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateClamp(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launchClamp, p, stream);
}

}  // namespace textgen::kernels
