// One-shot all-reduce over NVLink peer memory (see all_reduce.h). A fixed grid of p.blocks
// blocks; block b of every rank handles the same slice of the message, so block b
// only waits for block b of each peer:
//   1. copy my slice into my staging half (call parity), fence, store my flag into every peer's
//      flag slot [b][me] with release semantics at system scope;
//   2. wait until my own flag slots [b][p] reached this call's number, for every peer p;
//   3. sum every rank's staging slice in rank order (float accumulation) into my output.
// A peer is at most one call ahead (it cannot finish call n+1 before my signal of n+1), so a flag
// may already hold the next number: waits compare wrap-safely (>=). Staging halves alternate, so a
// peer still reading my half of call n is never overwritten by my call n+1, and my call n+2 waits
// for its signal of n+1, given only once it finished call n. The fused RMSNorm variant stages and
// signals the same way with whole rows as block b's slice; every block of either kernel takes part
// in every call, so the blocks' call numbers (and staging parity) never drift apart.
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

// Steps 1b and 2 for block b: tell every peer that my slice of this call is staged (with the
// call's element count), then wait until every peer's block b has said the same.
__device__ __forceinline__ void exchangeSignals(const OneShotAllReduceParams& p, int b,
                                                uint32_t call) {
  const int world = p.worldSize, me = p.rank;
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
}

// This call's number for block b (its previous one + 1), read once by the block.
__device__ __forceinline__ uint32_t nextCall(const OneShotAllReduceParams& p, int b) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = p.counters[b] + 1;
  __syncthreads();
  return epoch;
}

// Unit i of the message, summed over every rank's staging in rank order (the same order, so the
// same bits, on every rank), in float.
template <typename T>
__device__ __forceinline__ void sumUnit(const OneShotAllReduceParams& p, size_t half, int64_t i,
                                        float (&acc)[Vec<T>::kN]) {
#pragma unroll
  for (int k = 0; k < Vec<T>::kN; ++k) acc[k] = 0.0f;
  for (int r = 0; r < p.worldSize; ++r) {
    const auto* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.peers[r]) + half);
    Vec<T>::add(acc, __ldcg(src + i));  // L2, not L1: peers rewrite these addresses
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) oneShotAllReduceKernel(OneShotAllReduceParams p) {
  cuda::waitForPrimary();
  cuda::allowDependents();  // as in the RMSNorm variant below
  using V = Vec<T>;
  const int b = blockIdx.x;
  const uint32_t call = nextCall(p, b);
  const size_t half = (call & 1) * p.capacityBytes;
  const int64_t units = p.count * static_cast<int64_t>(sizeof(T)) / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;

  // 1. Stage my slice, then tell every peer; 2. wait for every peer's block b.
  auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(p.peers[p.rank]) + half);
  const auto* in = static_cast<const uint4*>(p.data);
  for (int64_t i = first; i < units; i += stride) mine[i] = in[i];
  exchangeSignals(p, b, call);
  // 3. Sum in rank order.
  auto* out = static_cast<uint4*>(p.data);
  for (int64_t i = first; i < units; i += stride) {
    float acc[V::kN];
    sumUnit<T>(p, half, i, acc);
    out[i] = V::pack(acc);
  }
  if (threadIdx.x == 0) p.counters[b] = call;
}

// Sum over the block (every thread gets it); `scratch` holds one float per warp. The order is
// rms_norm.cu's blockReduceSum (a butterfly in each warp, then one over the warps' sums, zero
// past the last), so a row of at most kThreads units gets that kernel's bits.
__device__ __forceinline__ float blockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < kThreads / 32 ? scratch[lane] : 0.0f;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
  __syncthreads();  // scratch is reused by the next row
  return total;
}

constexpr int kMaxUnitsPerThread = static_cast<int>(kAllReduceRmsNormMaxUnits / kThreads);

// The same staging and signals as oneShotAllReduceKernel, but block b owns whole rows (b, b +
// grid, ...) so it can normalise them: every block takes part in every call, rows or not, so that
// every block's call number, hence the staging parity, stays the same across blocks and calls.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    oneShotAllReduceRmsNormKernel(OneShotAllReduceRmsNormParams q) {
  using V = Vec<T>;
  using C = cuda::Convert<T>;
  const OneShotAllReduceParams& p = q.allReduce;
  cuda::waitForPrimary();
  // The next kernel may start now (its blocks wait in waitForPrimary, but a GEMV requests its
  // weights meanwhile, so they stream while this kernel waits on NVLink).
  cuda::allowDependents();
  const int b = blockIdx.x;
  const uint32_t call = nextCall(p, b);
  const size_t half = (call & 1) * p.capacityBytes;
  const int64_t rowUnits = q.hidden * static_cast<int64_t>(sizeof(T)) / 16;

  auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(p.peers[p.rank]) + half);
  const auto* in = static_cast<const uint4*>(p.data);
  for (int64_t row = b; row < q.rows; row += gridDim.x) {
    for (int64_t u = threadIdx.x; u < rowUnits; u += kThreads)
      mine[row * rowUnits + u] = in[row * rowUnits + u];
  }
  exchangeSignals(p, b, call);

  __shared__ float scratch[kThreads / 32];
  const auto* residual = static_cast<const uint4*>(q.residual);
  auto* residualOut = static_cast<uint4*>(q.residualOut);
  auto* reduced = static_cast<uint4*>(p.data);
  const auto* weight = static_cast<const uint4*>(q.weight);
  auto* output = static_cast<uint4*>(q.output);
  for (int64_t row = b; row < q.rows; row += gridDim.x) {
    float vals[kMaxUnitsPerThread][V::kN];
    float sumSq = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxUnitsPerThread; ++k) {
      const int64_t u = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (u >= rowUnits) break;
      const int64_t i = row * rowUnits + u;
      float acc[V::kN];
      sumUnit<T>(p, half, i, acc);
      uint4 s = V::pack(acc);  // the all-reduce's result, rounded
      if (residual) {
        const uint4 r = residual[i];
        const T* se = reinterpret_cast<const T*>(&s);
        const T* re = reinterpret_cast<const T*>(&r);
        float sum[V::kN];
#pragma unroll
        for (int e = 0; e < V::kN; ++e) sum[e] = C::toFloat(se[e]) + C::toFloat(re[e]);
        s = V::pack(sum);
        residualOut[i] = s;
      } else {
        reduced[i] = s;
      }
      const T* se = reinterpret_cast<const T*>(&s);
#pragma unroll
      for (int e = 0; e < V::kN; ++e) {
        vals[k][e] = C::toFloat(se[e]);
        sumSq += vals[k][e] * vals[k][e];
      }
    }
    const float inv = rsqrtf(blockSum(sumSq, scratch) / static_cast<float>(q.hidden) + q.eps);
#pragma unroll
    for (int k = 0; k < kMaxUnitsPerThread; ++k) {
      const int64_t u = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (u >= rowUnits) break;
      const uint4 w = weight[u];
      const T* we = reinterpret_cast<const T*>(&w);
      float o[V::kN];
#pragma unroll
      for (int e = 0; e < V::kN; ++e) {
        const T normed = C::fromFloat(vals[k][e] * inv);
        o[e] = C::toFloat(we[e]) * C::toFloat(normed);
      }
      output[row * rowUnits + u] = V::pack(o);
    }
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
  if (p.blocks < 1 || p.blocks > kAllReduceMaxBlocks)
    return invalidArgumentError("one-shot all-reduce: 1 to 128 blocks");
  return okStatus();
}

bool oneShotAllReduceRmsNormFits(int64_t rows, int64_t hidden, DType dtype, size_t capacityBytes,
                                 int blocks) {
  const int64_t size = static_cast<int64_t>(dtypeSize(dtype));
  return rows > 0 && rows <= blocks && hidden > 0 && hidden * size % 16 == 0 &&
         hidden * size / 16 <= kAllReduceRmsNormMaxUnits &&
         rows <= static_cast<int64_t>(capacityBytes) / (hidden * size);
}

Status validateOneShotAllReduceRmsNorm(const OneShotAllReduceRmsNormParams& q) {
  TG_RETURN_IF_ERROR(validateOneShotAllReduce(q.allReduce));
  const OneShotAllReduceParams& p = q.allReduce;
  if (!oneShotAllReduceRmsNormFits(q.rows, q.hidden, p.dtype, p.capacityBytes, p.blocks) ||
      q.rows * q.hidden != p.count)
    return invalidArgumentError(
        "one-shot all-reduce + RMSNorm: rows * hidden must be the count, "
        "and a row at most " +
        std::to_string(kAllReduceRmsNormMaxUnits * 16) + " bytes");
  if (!q.output || !q.weight || !cuda::aligned16(q.output) || !cuda::aligned16(q.weight))
    return invalidArgumentError(
        "one-shot all-reduce + RMSNorm: output and weight required, "
        "16-byte aligned");
  if ((q.residual == nullptr) != (q.residualOut == nullptr))
    return invalidArgumentError(
        "one-shot all-reduce + RMSNorm: residual and residualOut go "
        "together");
  if (q.residual && (!cuda::aligned16(q.residual) || !cuda::aligned16(q.residualOut)))
    return invalidArgumentError("one-shot all-reduce + RMSNorm: residual not 16-byte aligned");
  if (!q.residual && q.output == p.data)
    return invalidArgumentError(
        "one-shot all-reduce + RMSNorm: without a residual the output "
        "may not alias the data (which receives the reduced sum)");
  return okStatus();
}

Status invokeOneShotAllReduceRmsNorm(const OneShotAllReduceRmsNormParams& q, Stream stream) {
  TG_RETURN_IF_ERROR(validateOneShotAllReduceRmsNorm(q));
  constexpr auto name = "one_shot_all_reduce_rms_norm";
  switch (q.allReduce.dtype) {
    case DType::kF32:
      return cuda::launch(name, oneShotAllReduceRmsNormKernel<float>, q.allReduce.blocks, kThreads,
                          0, stream, q);
    case DType::kF16:
      return cuda::launch(name, oneShotAllReduceRmsNormKernel<__half>, q.allReduce.blocks, kThreads,
                          0, stream, q);
    case DType::kBF16:
      return cuda::launch(name, oneShotAllReduceRmsNormKernel<__nv_bfloat16>, q.allReduce.blocks,
                          kThreads, 0, stream, q);
  }
  return invalidArgumentError("one-shot all-reduce + RMSNorm: unsupported dtype");
}

Status invokeOneShotAllReduce(const OneShotAllReduceParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateOneShotAllReduce(p));
  switch (p.dtype) {
    case DType::kF32:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<float>, p.blocks, kThreads,
                          0, stream, p);
    case DType::kF16:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<__half>, p.blocks, kThreads,
                          0, stream, p);
    case DType::kBF16:
      return cuda::launch("one_shot_all_reduce", oneShotAllReduceKernel<__nv_bfloat16>, p.blocks,
                          kThreads, 0, stream, p);
  }
  return invalidArgumentError("one-shot all-reduce: unsupported dtype");
}

}  // namespace textgen::kernels
