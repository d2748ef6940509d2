// Small-batch GEMM (rows <= 8) for 16-bit weights: decode is weight-streaming bound, and warps
// reading W's contiguous rows with 16-byte loads (several in flight) keep more of the memory
// bandwidth busy than a tiled GEMM does at this shape. x is re-read from L1/L2.
#include <algorithm>
#include <cstdlib>
#include <string_view>
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

// kUnroll 16-byte weight loads of one lane, kStride vectors apart from vector v0 (zeros past the
// row's end).
template <int kStride>
__device__ __forceinline__ void loadWeights(const uint4* __restrict__ wRow, int v0, int vecs,
                                            uint4 (&wv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = v0 + kStride * u;
    wv[u] = v < vecs ? __ldcs(wRow + v) : make_uint4(0, 0, 0, 0);  // streamed once: evict first
  }
}

// One block of kWarps warps computes kWarps / kSplit output rows, each row's dot product split over
// kSplit warps (interleaved 512-byte pieces of the row), summed through shared memory in a fixed
// order. Splitting shortens each warp's chain of dependent loads: with a whole row a warp (kSplit
// 1), a 4096-wide row takes 4 rounds of loads and an 11008-wide one 11, and the kernel's last
// blocks, alone on the GPU, stream at a fraction of the bandwidth for that long. With kSplit warps
// a row, every load of a 4096-wide row is issued at once, before the dependency wait (launch.h), so
// blocks launched early stream their weights while the kernel ahead ends.
template <typename T, int kRows, int kSplit>
__global__ void __launch_bounds__(kWarps * 32)
    gemvKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows,
               int in, int out, bool weightsFromPrimary) {
  static_assert(kWarps % kSplit == 0);
  constexpr int kRowsPerBlock = kWarps / kSplit;
  constexpr int kStride = 32 * kSplit;  // vectors between one lane's loads
  constexpr int kStep = kStride * kUnroll;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % kSplit;
  const int o = blockIdx.x * kRowsPerBlock + warp / kSplit;
  const int vecs = o < out ? in / 8 : 0;
  const uint4* wRow = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(o) * in);
  const int first = part * 32 + lane;
  // The first weights are requested before waiting for the kernel that writes x: model weights
  // are written by no kernel, and their latency then overlaps that kernel's end (launch.h).
  // Weights a kernel just dequantized are loaded after the wait (reading them early read the
  // previous layer's: TP=2 GPT-Q act-order decodes diverged at their first token).
  uint4 cur[kUnroll];
  if (!weightsFromPrimary) loadWeights<kStride>(wRow, first, vecs, cur);
  cuda::waitForPrimary();
  if (weightsFromPrimary) loadWeights<kStride>(wRow, first, vecs, cur);
  cuda::allowDependents();
  float acc[kRows] = {};
  for (int v0 = first; v0 < vecs; v0 += kStep) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (v0 + kStride * u >= vecs) break;
      accumulate<T, kRows>(cur[u], x, in, v0 + kStride * u, rows, acc);
    }
    if (v0 + kStep < vecs) loadWeights<kStride>(wRow, v0 + kStep, vecs, cur);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if constexpr (kSplit == 1) {
    if (lane == 0 && o < out) {
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < rows) y[static_cast<int64_t>(r) * out + o] = cuda::Convert<T>::fromFloat(acc[r]);
    }
  } else {
    __shared__ float partial[kWarps][kRows];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    // Lane r of each row's first warp sums row r's parts in order.
    if (part == 0 && lane < kRows && lane < rows && o < out) {
      float a = partial[warp][lane];
#pragma unroll
      for (int s = 1; s < kSplit; ++s) a += partial[warp + s][lane];
      y[static_cast<int64_t>(lane) * out + o] = cuda::Convert<T>::fromFloat(a);
    }
  }
}

// Warps a row: the fewest that load a row in one round (kUnroll vectors a lane), at most kWarps.
// It depends on the row's width alone, so every row count computes a row the same way (gemv.h).
// TEXTGEN_GEMV_SPLIT=0 keeps one warp a row (for comparison).
int splitFor(int64_t in) {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_GEMV_SPLIT");
    return !(v && std::string_view(v) == "0");
  }();
  if (!on) return 1;
  const int64_t vecs = in / 8;
  int split = 1;
  while (split < kWarps && vecs > int64_t{32} * kUnroll * split) split *= 2;
  return split;
}

template <typename T, int kRows>
Status launchRows(const GemmParams& p, cudaStream_t stream) {
  const auto* x = static_cast<const T*>(p.x);
  const auto* w = static_cast<const T*>(p.weight);
  auto* y = static_cast<T*>(p.y);
  const int rows = static_cast<int>(p.rows), in = static_cast<int>(p.in),
            out = static_cast<int>(p.out);
  const int split = splitFor(p.in);
  const auto grid = [&](int perBlock) {
    return dim3(static_cast<unsigned>((p.out + perBlock - 1) / perBlock));
  };
  switch (split) {
    case 1:
      return cuda::launch("gemv", gemvKernel<T, kRows, 1>, grid(kWarps), kWarps * 32, 0, stream, x,
                          w, y, rows, in, out, p.weightsFromPrimary);
    case 2:
      return cuda::launch("gemv", gemvKernel<T, kRows, 2>, grid(kWarps / 2), kWarps * 32, 0, stream,
                          x, w, y, rows, in, out, p.weightsFromPrimary);
    case 4:
      return cuda::launch("gemv", gemvKernel<T, kRows, 4>, grid(kWarps / 4), kWarps * 32, 0, stream,
                          x, w, y, rows, in, out, p.weightsFromPrimary);
    default:
      return cuda::launch("gemv", gemvKernel<T, kRows, 8>, grid(1), kWarps * 32, 0, stream, x, w, y,
                          rows, in, out, p.weightsFromPrimary);
  }
}

template <typename T>
Status launch(const GemmParams& p, cudaStream_t stream) {
  static_assert(kMaxGemvRows == 8);
  if (p.rows == 1) return launchRows<T, 1>(p, stream);
  return launchRows<T, 8>(p, stream);
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
