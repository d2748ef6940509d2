// Small-batch GEMM (rows <= 8) for 16-bit weights: decode is weight-streaming bound, and one warp
// per output row reading W's contiguous row with 16-byte loads (several in flight) keeps more of
// the memory bandwidth busy than a tiled GEMM does at this shape. x is re-read from L1/L2.
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "gemv.h"

namespace textgen::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads per lane and step (8 measured no better)

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __half>) {
      __half2 h;
      memcpy(&h, &words[i], 4);
      const float2 p = __half22float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    } else {
      __nv_bfloat162 h;
      memcpy(&h, &words[i], 4);
      const float2 p = __bfloat1622float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
}

template <typename T, int kRows>
__device__ __forceinline__ void accumulate(const uint4& wv, const T* __restrict__ x, int in, int v,
                                           int rows, float (&acc)[kRows]) {
  float wf[8];
  unpack8<T>(wv, wf);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= rows) break;
    const uint4 xv = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * in)[v];
    float xf[8];
    unpack8<T>(xv, xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r] += wf[e] * xf[e];
  }
}

// kUnroll 16-byte weight loads of one lane starting at vector v0 (zeros past the row's end).
__device__ __forceinline__ void loadWeights(const uint4* __restrict__ wRow, int v0, int vecs,
                                            uint4 (&wv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = v0 + 32 * u;
    wv[u] = v < vecs ? __ldcs(wRow + v) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
  }
}

template <typename T, int kRows>
__global__ void __launch_bounds__(kWarps * 32)
    gemvKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows,
               int in, int out, bool weightsFromPrimary) {
  constexpr int kStep = 32 * kUnroll;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int o = blockIdx.x * kWarps + warp;
  const int vecs = o < out ? in / 8 : 0;
  const uint4* wRow = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(o) * in);
  // The first weights are requested before waiting for the kernel that writes x: model weights
  // are written by no kernel, and their latency then overlaps that kernel's end (launch.h).
  // Weights a kernel just dequantized are loaded after the wait (reading them early read the
  // previous layer's: TP=2 GPT-Q act-order decodes diverged at their first token).
  uint4 cur[kUnroll];
  if (!weightsFromPrimary) loadWeights(wRow, lane, vecs, cur);
  cuda::waitForPrimary();
  if (weightsFromPrimary) loadWeights(wRow, lane, vecs, cur);
  cuda::allowDependents();
  if (o >= out) return;
  float acc[kRows] = {};
  for (int v0 = lane; v0 < vecs; v0 += kStep) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v0 + 32 * u >= vecs) break;
      accumulate<T, kRows>(cur[u], x, in, v0 + 32 * u, rows, acc);
    }
    if (v0 + kStep < vecs) loadWeights(wRow, v0 + kStep, vecs, cur);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float a = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0 && r < rows)
      y[static_cast<int64_t>(r) * out + o] = cuda::Convert<T>::fromFloat(a);
  }
}

template <typename T>
Status launch(const GemmParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out + kWarps - 1) / kWarps));
  const auto* x = static_cast<const T*>(p.x);
  const auto* w = static_cast<const T*>(p.weight);
  auto* y = static_cast<T*>(p.y);
  const int rows = static_cast<int>(p.rows), in = static_cast<int>(p.in),
            out = static_cast<int>(p.out);
  static_assert(kMaxGemvRows == 8);
  if (rows == 1)
    return cuda::launch("gemv", gemvKernel<T, 1>, grid, kWarps * 32, 0, stream, x, w, y, rows, in,
                        out, p.weightsFromPrimary);
  return cuda::launch("gemv", gemvKernel<T, 8>, grid, kWarps * 32, 0, stream, x, w, y, rows, in,
                      out, p.weightsFromPrimary);
}

}  // namespace

bool gemvApplies(const GemmParams& p, int64_t maxRows) {
  return p.dtype != DType::kF32 && p.rows >= 1 && p.rows <= std::min(maxRows, kMaxGemvRows) &&
         p.in % 8 == 0 && p.in < (int64_t{1} << 30) && p.out < (int64_t{1} << 31) &&
         cuda::aligned16(p.x) && cuda::aligned16(p.weight);
}

Status invokeGemv(const GemmParams& p, Stream stream) {
  if (p.dtype == DType::kF16) return launch<__half>(p, stream);
  return launch<__nv_bfloat16>(p, stream);
}

}  // namespace textgen::kernels
