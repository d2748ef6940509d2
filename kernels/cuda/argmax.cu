// Arg-max and its log-probability per row (see argmax.h): one block per row, two passes over the
// row (max with its lowest index, then the sum of exp(x - max)), fp32.
#include <cfloat>

#include "common.cuh"
#include "textgen/kernels/argmax.h"

namespace textgen::kernels {
namespace {

constexpr int kThreads = 512;

// Calls f(index, value) for the row's elements this thread owns, in increasing index order:
// 16-byte vectors (kVec elements) when the row allows, single elements otherwise.
template <typename T, int kVec, typename F>
__device__ __forceinline__ void forEachOwned(const T* row, int64_t vocab, F&& f) {
  using C = cuda::Convert<T>;
  using V = cuda::Vec<T, kVec>;
  const int64_t vecs = vocab / kVec;
  const V* rowV = reinterpret_cast<const V*>(row);
  constexpr int kLoads = 4;  // vectors in flight per thread
  for (int64_t v0 = threadIdx.x; v0 < vecs; v0 += kLoads * kThreads) {
    V buf[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t v = v0 + u * kThreads;
      if (v < vecs) buf[u] = rowV[v];
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t v = v0 + u * kThreads;
      if (v >= vecs) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) f(v * kVec + e, C::toFloat(buf[u].v[e]));
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) argmaxKernel(ArgmaxParams p) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(p.logits) + r * p.vocab;
  float best = -INFINITY;
  int64_t bestId = p.vocab;
  forEachOwned<T, kVec>(row, p.vocab, [&](int64_t i, float v) {
    if (v > best) {  // increasing order: the first hit per thread is its lowest index
      best = v;
      bestId = i;
    }
  });
  __shared__ float sBest[kThreads / 32];
  __shared__ int64_t sId[kThreads / 32];
  __shared__ float sSum[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bestId, o);
    if (ov > best || (ov == best && oi < bestId)) {
      best = ov;
      bestId = oi;
    }
  }
  if (lane == 0) {
    sBest[warp] = best;
    sId[warp] = bestId;
  }
  __syncthreads();
  best = sBest[0];
  bestId = sId[0];
  for (int w = 1; w < kThreads / 32; ++w) {
    if (sBest[w] > best || (sBest[w] == best && sId[w] < bestId)) {
      best = sBest[w];
      bestId = sId[w];
    }
  }
  float sum = 0.0f;
  forEachOwned<T, kVec>(row, p.vocab, [&](int64_t, float v) { sum += __expf(v - best); });
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) sSum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) total += sSum[w];
    p.ids[r] = static_cast<int32_t>(bestId < p.vocab ? bestId : 0);
    p.logprobs[r] = -logf(total);
  }
}

template <typename T>
Status launch(const ArgmaxParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = p.vocab % kVec == 0 && cuda::aligned16(p.logits);
  return cuda::launch("argmax", vec ? argmaxKernel<T, kVec> : argmaxKernel<T, 1>,
                      static_cast<unsigned>(p.rows), kThreads, 0, stream, p);
}

}  // namespace

Status invokeArgmax(const ArgmaxParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateArgmax(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launch, p, stream);
}

}  // namespace textgen::kernels
