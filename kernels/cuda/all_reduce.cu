// One-shot all-reduce over NVLink peer memory (see all_reduce.h). A fixed grid of
// kAllReduceBlocks blocks; block b of every rank handles the same slice of the message, so block b
// only waits for block b of each peer:
//   1. copy my slice into my staging half (call parity), fence, store my flag into every peer's
//      flag slot [b][me] with release semantics at system scope;
//   2. wait until my own flag slots [b][p] reached this call's number, for every peer p;
//   3. sum every rank's staging slice in rank order (float accumulation) into my output.
// A peer is at most one call ahead (it cannot finish call n+1 before my signal of n+1), so a flag
// may already hold the next number: waits compare wrap-safely (>=). Staging halves alternate, so a
// peer still reading my half of call n is never overwritten by my call n+1, and my call n+2 waits
// for its signal of n+1, given only once it finished call n.
#include "common.cuh"
#include "textgen/kernels/all_reduce.h"

namespace textgen::kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void storeRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t loadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// 16 bytes of T, summed in float.
template <typename T>
struct Vec {
  static constexpr int kN = 16 / sizeof(T);
  __device__ static void add(float (&acc)[kN], const uint4& v) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] += cuda::Convert<T>::toFloat(e[i]);
  }
  __device__ static uint4 pack(const float (&acc)[kN]) {
    uint4 out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = cuda::Convert<T>::fromFloat(acc[i]);
    return out;
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads) oneShotAllReduceKernel(OneShotAllReduceParams p) {
  cuda::waitForPrimary();
  using V = Vec<T>;
  const int world = p.worldSize, me = p.rank, b = blockIdx.x;
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = p.counters[b] + 1;
  __syncthreads();
  const uint32_t call = epoch;
  const size_t half = (call & 1) * p.capacityBytes;
  const int64_t units = p.count * static_cast<int64_t>(sizeof(T)) / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;

  // 1. Stage my slice, then tell every peer.
  auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(p.peers[me]) + half);
  const auto* in = static_cast<const uint4*>(p.data);
  for (int64_t i = first; i < units; i += stride) mine[i] = in[i];
  __syncthreads();
  if (threadIdx.x < world) {
    char* peer = static_cast<char*>(p.peers[threadIdx.x]);
    auto* counts =
        reinterpret_cast<uint32_t*>(peer + AllReducePeerLayout::countsOffset(p.capacityBytes));
    counts[b * kAllReduceMaxRanks + me] = static_cast<uint32_t>(p.count);
    __threadfence_system();
    auto* flags =
        reinterpret_cast<uint32_t*>(peer + AllReducePeerLayout::flagsOffset(p.capacityBytes));
    storeRelease(flags + b * kAllReduceMaxRanks + me, call);
  }
  // 2. Wait for every peer's block b.
  if (threadIdx.x < world) {
    const auto* flags = reinterpret_cast<const uint32_t*>(
        static_cast<const char*>(p.peers[me]) + AllReducePeerLayout::flagsOffset(p.capacityBytes));
    while (static_cast<int32_t>(loadAcquire(flags + b * kAllReduceMaxRanks + threadIdx.x) - call) <
           0) {
    }
    // Ranks out of step (one missed a call): their counts differ, most likely. Fail loudly.
    const auto* counts = reinterpret_cast<const uint32_t*>(
        static_cast<const char*>(p.peers[me]) + AllReducePeerLayout::countsOffset(p.capacityBytes));
    if (__ldcg(counts + b * kAllReduceMaxRanks + threadIdx.x) != static_cast<uint32_t>(p.count))
      __trap();
  }
  __syncthreads();
  // 3. Sum in rank order (the same order, so the same bits, on every rank).
  auto* out = static_cast<uint4*>(p.data);
  for (int64_t i = first; i < units; i += stride) {
    float acc[V::kN] = {};
    for (int r = 0; r < world; ++r) {
      const auto* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.peers[r]) + half);
      V::add(acc, __ldcg(src + i));  // L2, not L1: peers rewrite these addresses
    }
    out[i] = V::pack(acc);
  }
  if (threadIdx.x == 0) p.counters[b] = call;
}

}  // namespace

Status validateOneShotAllReduce(const OneShotAllReduceParams& p) {
  if (p.worldSize < 2 || p.worldSize > kAllReduceMaxRanks || p.rank < 0 || p.rank >= p.worldSize)
    return invalidArgumentError("one-shot all-reduce: 2 to 8 ranks");
  const size_t bytes = static_cast<size_t>(p.count) * dtypeSize(p.dtype);
  if (p.count < 0 || bytes > p.capacityBytes || bytes % 16 != 0 || !cuda::aligned16(p.data))
    return invalidArgumentError("one-shot all-reduce: message too large or not 16-byte aligned");
  for (int r = 0; r < p.worldSize; ++r) {
    if (!p.peers[r] || !cuda::aligned16(p.peers[r]))
      return invalidArgumentError("one-shot all-reduce: missing peer buffer");
  }
  if (!p.counters) return invalidArgumentError("one-shot all-reduce: counters required");
  return okStatus();
}

Status invokeOneShotAllReduce(const OneShotAllReduceParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateOneShotAllReduce(p));
  switch (p.dtype) {
    case DType::kF32:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<float>, kAllReduceBlocks,
                          kThreads, 0, stream, p);
    case DType::kF16:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<__half>, kAllReduceBlocks,
                          kThreads, 0, stream, p);
    case DType::kBF16:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<__nv_bfloat16>,
                          kAllReduceBlocks, kThreads, 0, stream, p);
  }
  return invalidArgumentError("one-shot all-reduce: unsupported dtype");
}

}  // namespace textgen::kernels
