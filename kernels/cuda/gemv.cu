// Small-batch GEMM (rows <= 8) for 16-bit weights: decode is weight-streaming bound, and warps
// reading W's contiguous rows with 16-byte loads (several in flight) keep more of the memory
// bandwidth busy than a tiled GEMM does at this shape. x is re-read from L1/L2.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "activation.cuh"
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

// A block computes kBlockRows output rows (kWarps / kSplit; 2 where a gated row needs its pair),
// each row's dot product split over kSplit warps (interleaved 512-byte pieces of the row), summed
// through shared memory in a fixed order. Splitting shortens each warp's chain of dependent loads:
// with a whole row a warp (kSplit 1), a 4096-wide row takes 4 rounds of loads and an 11008-wide one
// 11, and the kernel's last blocks, alone on the GPU, stream at a fraction of the bandwidth for
// that long. With 8 warps a row, every load of a 4096-wide row is issued at once, before the
// dependency wait (launch.h), so blocks launched early stream their weights while the kernel ahead
// ends.
//
// kGated: W is [gate; up] stacked ([2n, in]) and y [rows, n] = act(gate) * up. A block computes
// kBlockRows / 2 pairs: row-groups [0, pairs) the gates of outputs j0.., the others their ups.
// Each product is rounded to T, then the gated activation kernel's formula applies: bit for bit the
// plain kernel followed by it (a row's sums do not depend on its neighbours).
constexpr int blockRowsOf(int split, bool gated) {
  return gated && kWarps / split < 2 ? 2 : kWarps / split;
}

template <typename T, int kRows, int kSplit, bool kGated, Activation A>
__global__ void __launch_bounds__(blockRowsOf(kSplit, kGated) * kSplit * 32)
    gemvKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows,
               int in, int out, bool weightsFromPrimary) {
  static_assert(kWarps % kSplit == 0);
  constexpr int kBlockRows = blockRowsOf(kSplit, kGated);
  constexpr int kPairs = kBlockRows / 2;
  constexpr int kStride = 32 * kSplit;  // vectors between one lane's loads
  constexpr int kStep = kStride * kUnroll;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % kSplit, group = warp / kSplit;
  const int n = kGated ? out / 2 : out;  // outputs
  const int j = blockIdx.x * (kGated ? kPairs : kBlockRows) + (kGated ? group % kPairs : group);
  const int o = kGated && group >= kPairs ? n + j : j;  // this row-group's row of W
  const int vecs = j < n ? in / 8 : 0;
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
  using C = cuda::Convert<T>;
  if constexpr (kSplit == 1 && !kGated) {
    if (lane == 0 && j < n) {
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < rows) y[static_cast<int64_t>(r) * n + j] = C::fromFloat(acc[r]);
    }
  } else {
    __shared__ float partial[kBlockRows * kSplit][kRows];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();
    // Lane r of a row-group's first warp sums row r's parts in order (gated: the gates' groups,
    // each also summing its pair's up).
    const auto sum = [&](int w0, int r) {
      float a = partial[w0][r];
#pragma unroll
      for (int s = 1; s < kSplit; ++s) a += partial[w0 + s][r];
      return a;
    };
    if (part != 0 || lane >= kRows || lane >= rows || j >= n) return;
    const int64_t at = static_cast<int64_t>(lane) * n + j;
    if constexpr (kGated) {
      if (group >= kPairs) return;
      const float gate = C::toFloat(C::fromFloat(sum(warp, lane)));
      const float up = C::toFloat(C::fromFloat(sum(warp + kPairs * kSplit, lane)));
      y[at] = C::fromFloat(cuda::roundTo<T>(cuda::activate<A>(gate)) * up);
    } else {
      y[at] = C::fromFloat(sum(warp, lane));
    }
  }
}

// Warps a row: the fewest that load it in at most 2 vectors a lane, at most kWarps (H100,
// Llama-2-7B batch 1: 4 vectors a lane at 4096 wide gave 5.10 ms/token, 2 gave 5.04, one warp a
// row 5.32). It depends on the row's width alone, so every row count computes a row the same way
// (gemv.h). TEXTGEN_GEMV_SPLIT=N forces N warps a row (1, 2, 4, 8; 0 as 1), for comparison.
int splitFor(int64_t in) {
  static const int forced = [] {
    const char* v = std::getenv("TEXTGEN_GEMV_SPLIT");
    const int n = v ? std::atoi(v) : -1;
    return n == 0 ? 1 : n == 1 || n == 2 || n == 4 || n == 8 ? n : 0;
  }();
  if (forced > 0) return forced;
  const int64_t vecs = in / 8;
  int split = 1;
  while (split < kWarps && vecs > int64_t{64} * split) split *= 2;
  return split;
}

template <typename T, int kRows, int kSplit, bool kGated, Activation A>
Status launchAs(const GemmParams& p, cudaStream_t stream) {
  constexpr int kBlockRows = blockRowsOf(kSplit, kGated);
  const int64_t outputs = kGated ? p.out / 2 : p.out;
  const int64_t perBlock = kGated ? kBlockRows / 2 : kBlockRows;
  const dim3 grid(static_cast<unsigned>((outputs + perBlock - 1) / perBlock));
  return cuda::launch(kGated ? "gemv (gated)" : "gemv", gemvKernel<T, kRows, kSplit, kGated, A>,
                      grid, kBlockRows * kSplit * 32, 0, stream, static_cast<const T*>(p.x),
                      static_cast<const T*>(p.weight), static_cast<T*>(p.y),
                      static_cast<int>(p.rows), static_cast<int>(p.in), static_cast<int>(p.out),
                      p.weightsFromPrimary);
}

template <typename T, int kRows, bool kGated, Activation A>
Status launchSplit(const GemmParams& p, cudaStream_t stream) {
  switch (splitFor(p.in)) {
    case 1: return launchAs<T, kRows, 1, kGated, A>(p, stream);
    case 2: return launchAs<T, kRows, 2, kGated, A>(p, stream);
    case 4: return launchAs<T, kRows, 4, kGated, A>(p, stream);
    default: return launchAs<T, kRows, 8, kGated, A>(p, stream);
  }
}

template <typename T, bool kGated, Activation A>
Status launchRows(const GemmParams& p, cudaStream_t stream) {
  static_assert(kMaxGemvRows == 8);
  if (p.rows == 1) return launchSplit<T, 1, kGated, A>(p, stream);
  return launchSplit<T, 8, kGated, A>(p, stream);
}

template <typename T>
Status launch(const GemmParams& p, cudaStream_t stream) {
  return launchRows<T, false, Activation::kSilu>(p, stream);
}

template <typename T>
Status launchGated(const GemmParams& p, Activation a, cudaStream_t stream) {
  switch (a) {
    case Activation::kSilu: return launchRows<T, true, Activation::kSilu>(p, stream);
    case Activation::kGelu: return launchRows<T, true, Activation::kGelu>(p, stream);
    case Activation::kGeluTanh: return launchRows<T, true, Activation::kGeluTanh>(p, stream);
    case Activation::kRelu: return launchRows<T, true, Activation::kRelu>(p, stream);
  }
  return invalidArgumentError("gemv: unknown activation");
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

Status invokeGemvGated(const GemmParams& p, Activation a, Stream stream) {
  if (p.out % 2 != 0) return invalidArgumentError("gemv (gated): an odd number of rows in W");
  if (p.dtype == DType::kF16) return launchGated<__half>(p, a, stream);
  return launchGated<__nv_bfloat16>(p, a, stream);
}

}  // namespace textgen::kernels
