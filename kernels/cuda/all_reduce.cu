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
// The Lamport protocol (all_reduce.h) needs no pairing of blocks: each element is its own signal,
// so a block may push one part of the message and read another; only its per-block state (call
// number, previous size) must advance in every call, which every block of both kernels does.
#include <algorithm>

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

// The Lamport protocol (all_reduce.h). Loads and stores of the exchanged data are volatile: a
// reader's poll must reach memory each time. A 16-byte access may be split into 32-bit ones; a
// reader accepts a unit only when none of its 16-bit halves is empty, so it never takes a torn one.
__device__ __forceinline__ uint4 loadVolatile(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void storeVolatile(uint4* p, const uint4& v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ bool holdsEmpty(uint32_t w) {
  return (w & 0xFFFFu) == 0x8000u || (w >> 16) == 0x8000u;
}

__device__ __forceinline__ bool holdsEmpty(const uint4& v) {
  return holdsEmpty(v.x) || holdsEmpty(v.y) || holdsEmpty(v.z) || holdsEmpty(v.w);
}

// -0.0 (the empty pattern) sent as +0.0.
__device__ __forceinline__ uint32_t sendable(uint32_t w) {
  if ((w & 0xFFFFu) == 0x8000u) w &= 0xFFFF0000u;
  if ((w >> 16) == 0x8000u) w &= 0x0000FFFFu;
  return w;
}

__device__ __forceinline__ uint4* lamportSlot(const OneShotAllReduceParams& p, int owner,
                                              int buffer, int slot) {
  return reinterpret_cast<uint4*>(
      static_cast<char*>(p.peers[owner]) +
      LamportPeerLayout::slotOffset(p.capacityBytes, p.worldSize, buffer, slot));
}

struct LamportCall {
  int buffer;         // this call's receiving buffer
  int64_t prevUnits;  // 16-byte units per slot that the previous call filled
  uint32_t sequence;  // this call's number (wraps; compared between ranks for equality only)
};

// Block b's state for this call, read once by the block and advanced at once (the next call
// reads it only after this kernel completed). The buffer index is kept modulo 3 rather than
// derived from a call counter, which would repeat a buffer where it wraps (2^32 is not a
// multiple of 3).
__device__ __forceinline__ LamportCall lamportBegin(const OneShotAllReduceParams& p, int b) {
  __shared__ uint32_t state[3];
  if (threadIdx.x < 3) state[threadIdx.x] = p.counters[threadIdx.x * kAllReduceMaxBlocks + b];
  __syncthreads();
  const int buffer = static_cast<int>(state[0] % 3);
  if (threadIdx.x == 0) {
    p.counters[b] = static_cast<uint32_t>((buffer + 1) % 3);
    p.counters[kAllReduceMaxBlocks + b] = static_cast<uint32_t>(p.count);
    p.counters[2 * kAllReduceMaxBlocks + b] = state[2] + 1;
  }
  return {buffer, static_cast<int64_t>(state[1]) * 2 / 16, state[2]};
}

// A slot: its header in its first 16-byte unit, the data from byte kLamportHeaderBytes (so data
// stays 128-byte aligned, in the same pages and lines as the header).
__device__ __forceinline__ uint4* lamportData(const OneShotAllReduceParams& p, int owner,
                                              int buffer, int slot) {
  return lamportSlot(p, owner, buffer, slot) + kLamportHeaderBytes / 16;
}

// A call's header: the count and the sequence number in 15-bit halves (none of them is ever the
// empty pattern).

__device__ __forceinline__ uint4 lamportHeader(const OneShotAllReduceParams& p,
                                               const LamportCall& c) {
  const uint32_t n = static_cast<uint32_t>(p.count);
  return make_uint4((n & 0x7FFFu) | (((n >> 15) & 0x7FFFu) << 16),
                    (c.sequence & 0x7FFFu) | (((c.sequence >> 15) & 0x7FFFu) << 16),
                    (n >> 30) | 0x00010000u, 0x00010001u);
}

// Unit i of my data into slot `rank` of this call's buffer on every rank (mine included).
__device__ __forceinline__ void lamportPush(const OneShotAllReduceParams& p, const LamportCall& c,
                                            int64_t i, uint4 v) {
  v = make_uint4(sendable(v.x), sendable(v.y), sendable(v.z), sendable(v.w));
  for (int r = 0; r < p.worldSize; ++r) storeVolatile(lamportData(p, r, c.buffer, p.rank) + i, v);
}

// Block 0 of every rank: my header into every rank's slot (with the data pushes); then, at the end
// of the call (off the data's path: headers arrive with the data), in one thread, every rank's
// header polled and compared with mine. A difference means the ranks are out of step (one missed a
// call, or their sizes differ): trap, so the rank fails before anything reads this call's result.
__device__ __forceinline__ void lamportPushHeader(const OneShotAllReduceParams& p,
                                                  const LamportCall& c, int b) {
  if (b == 0 && threadIdx.x < p.worldSize)
    storeVolatile(lamportSlot(p, threadIdx.x, c.buffer, p.rank), lamportHeader(p, c));
}

__device__ __forceinline__ void lamportCheckHeaders(const OneShotAllReduceParams& p,
                                                    const LamportCall& c, int b) {
  if (b == 0 && threadIdx.x == 0) {
    const uint4 mine = lamportHeader(p, c);
    for (int r = 0; r < p.worldSize; ++r) {
      const uint4* src = lamportSlot(p, p.rank, c.buffer, r);
      uint4 v = loadVolatile(src);
      while (holdsEmpty(v)) v = loadVolatile(src);
      if (v.x != mine.x || v.y != mine.y || v.z != mine.z || v.w != mine.w) __trap();
    }
  }
}

// Block b's share of refilling the previous call's buffer (here, after the pushes: it overlaps
// the wait for the peers' data), headers included (block 0).
__device__ __forceinline__ void lamportRefill(const OneShotAllReduceParams& p, const LamportCall& c,
                                              int b) {
  const int prev = (c.buffer + 2) % 3;
  const int64_t total = c.prevUnits * p.worldSize;
  const uint4 empty =
      make_uint4(kLamportEmptyWord, kLamportEmptyWord, kLamportEmptyWord, kLamportEmptyWord);
  for (int64_t j = static_cast<int64_t>(b) * blockDim.x + threadIdx.x; j < total;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int slot = static_cast<int>(j / c.prevUnits);
    lamportData(p, p.rank, prev, slot)[j - slot * c.prevUnits] = empty;
  }
  if (b == 0 && threadIdx.x < p.worldSize) *lamportSlot(p, p.rank, prev, threadIdx.x) = empty;
}

// Unit i summed over every rank's slot in rank order, each polled until it arrived.
template <typename T>
__device__ __forceinline__ void lamportSumUnit(const OneShotAllReduceParams& p,
                                               const LamportCall& c, int64_t i,
                                               float (&acc)[Vec<T>::kN]) {
#pragma unroll
  for (int k = 0; k < Vec<T>::kN; ++k) acc[k] = 0.0f;
  for (int r = 0; r < p.worldSize; ++r) {
    const uint4* src = lamportData(p, p.rank, c.buffer, r) + i;
    uint4 v = loadVolatile(src);
    while (holdsEmpty(v)) v = loadVolatile(src);
    Vec<T>::add(acc, v);
  }
}

template <typename T, AllReduceProtocol P>
__global__ void __launch_bounds__(kThreads) oneShotAllReduceKernel(OneShotAllReduceParams p) {
  cuda::waitForPrimary();
  cuda::allowDependents();  // as in the RMSNorm variant below
  using V = Vec<T>;
  constexpr bool kLamport = P == AllReduceProtocol::kLamport;
  const int b = blockIdx.x;
  const int64_t units = p.count * static_cast<int64_t>(sizeof(T)) / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(b) * blockDim.x + threadIdx.x;
  const auto* in = static_cast<const uint4*>(p.data);
  auto* out = static_cast<uint4*>(p.data);

  if constexpr (kLamport) {
    // 1. Push my slice to every rank; 2. refill the previous buffer; 3. poll and sum.
    const LamportCall c = lamportBegin(p, b);
    for (int64_t i = first; i < units; i += stride) lamportPush(p, c, i, in[i]);
    lamportPushHeader(p, c, b);
    lamportRefill(p, c, b);
    for (int64_t i = first; i < units; i += stride) {
      float acc[V::kN];
      lamportSumUnit<T>(p, c, i, acc);
      out[i] = V::pack(acc);
    }
    lamportCheckHeaders(p, c, b);
  } else {
    const uint32_t call = nextCall(p, b);
    const size_t half = (call & 1) * p.capacityBytes;
    // 1. Stage my slice, then tell every peer; 2. wait for every peer's block b.
    auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(p.peers[p.rank]) + half);
    for (int64_t i = first; i < units; i += stride) mine[i] = in[i];
    exchangeSignals(p, b, call);
    // 3. Sum in rank order.
    for (int64_t i = first; i < units; i += stride) {
      float acc[V::kN];
      sumUnit<T>(p, half, i, acc);
      out[i] = V::pack(acc);
    }
    if (threadIdx.x == 0) p.counters[b] = call;
  }
}

__global__ void lamportResetKernel(uint4* region, int64_t units) {
  cuda::waitForPrimary();
  const uint4 empty =
      make_uint4(kLamportEmptyWord, kLamportEmptyWord, kLamportEmptyWord, kLamportEmptyWord);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < units;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    region[i] = empty;
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
template <typename T, AllReduceProtocol P>
__global__ void __launch_bounds__(kThreads)
    oneShotAllReduceRmsNormKernel(OneShotAllReduceRmsNormParams q) {
  using V = Vec<T>;
  using C = cuda::Convert<T>;
  constexpr bool kLamport = P == AllReduceProtocol::kLamport;
  const OneShotAllReduceParams& p = q.allReduce;
  // Weights no kernel writes: requested before the wait, they stream in while the GEMV ahead ends
  // and while this kernel waits for its peers (memory is otherwise idle then).
  if (q.prefetchBytes > 0 && threadIdx.x == 0)
    cuda::prefetchL2Part(q.prefetch, q.prefetchBytes, blockIdx.x, gridDim.x);
  cuda::waitForPrimary();
  // The next kernel may start now (its blocks wait in waitForPrimary, but a GEMV requests its
  // weights meanwhile, so they stream while this kernel waits on NVLink).
  cuda::allowDependents();
  const int b = blockIdx.x;
  const int64_t rowUnits = q.hidden * static_cast<int64_t>(sizeof(T)) / 16;
  const auto* in = static_cast<const uint4*>(p.data);
  uint32_t call = 0;
  size_t half = 0;
  LamportCall lamport{};
  if constexpr (kLamport) {
    lamport = lamportBegin(p, b);
    for (int64_t row = b; row < q.rows; row += gridDim.x) {
      for (int64_t u = threadIdx.x; u < rowUnits; u += kThreads)
        lamportPush(p, lamport, row * rowUnits + u, in[row * rowUnits + u]);
    }
    lamportPushHeader(p, lamport, b);
    lamportRefill(p, lamport, b);
  } else {
    call = nextCall(p, b);
    half = (call & 1) * p.capacityBytes;
    auto* mine = reinterpret_cast<uint4*>(static_cast<char*>(p.peers[p.rank]) + half);
    for (int64_t row = b; row < q.rows; row += gridDim.x) {
      for (int64_t u = threadIdx.x; u < rowUnits; u += kThreads)
        mine[row * rowUnits + u] = in[row * rowUnits + u];
    }
    exchangeSignals(p, b, call);
  }

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
      if constexpr (kLamport) {
        lamportSumUnit<T>(p, lamport, i, acc);
      } else {
        sumUnit<T>(p, half, i, acc);
      }
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
  if constexpr (kLamport) {
    lamportCheckHeaders(p, lamport, b);
  } else {
    if (threadIdx.x == 0) p.counters[b] = call;
  }
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
  if (p.protocol == AllReduceProtocol::kLamport &&
      !lamportAllReduceTakes(p.count, p.dtype, p.capacityBytes))
    return invalidArgumentError(
        "one-shot all-reduce: the Lamport protocol takes 16-bit types within its slot");
  if (p.protocol != AllReduceProtocol::kLamport && p.protocol != AllReduceProtocol::kFlags)
    return invalidArgumentError("one-shot all-reduce: unknown protocol");
  return okStatus();
}

bool lamportAllReduceTakes(int64_t count, DType dtype, size_t slotBytes) {
  return (dtype == DType::kF16 || dtype == DType::kBF16) && count >= 0 && slotBytes % 16 == 0 &&
         slotBytes >= kLamportHeaderBytes &&
         static_cast<size_t>(count) * 2 <= slotBytes - kLamportHeaderBytes && count * 2 % 16 == 0;
}

Status invokeLamportReset(void* region, size_t bytes, Stream stream) {
  if (!region || !cuda::aligned16(region) || bytes % 16 != 0)
    return invalidArgumentError("Lamport reset: a 16-byte aligned region of 16-byte units");
  if (bytes == 0) return okStatus();
  const int64_t units = static_cast<int64_t>(bytes / 16);
  const int blocks = static_cast<int>(std::min<int64_t>((units + 255) / 256, 1024));
  return cuda::launch("lamport_reset", lamportResetKernel, blocks, 256, 0, stream,
                      static_cast<uint4*>(region), units);
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
  constexpr auto kFlags = AllReduceProtocol::kFlags;
  constexpr auto kLamport = AllReduceProtocol::kLamport;
  const int blocks = q.allReduce.blocks;
  const bool lamport = q.allReduce.protocol == kLamport;  // validated: 16-bit types only
  switch (q.allReduce.dtype) {
    case DType::kF32:
      return cuda::launch(name, oneShotAllReduceRmsNormKernel<float, kFlags>, blocks, kThreads, 0,
                          stream, q);
    case DType::kF16:
      return cuda::launch(name,
                          lamport ? oneShotAllReduceRmsNormKernel<__half, kLamport>
                                  : oneShotAllReduceRmsNormKernel<__half, kFlags>,
                          blocks, kThreads, 0, stream, q);
    case DType::kBF16:
      return cuda::launch(name,
                          lamport ? oneShotAllReduceRmsNormKernel<__nv_bfloat16, kLamport>
                                  : oneShotAllReduceRmsNormKernel<__nv_bfloat16, kFlags>,
                          blocks, kThreads, 0, stream, q);
  }
  return invalidArgumentError("one-shot all-reduce + RMSNorm: unsupported dtype");
}

Status invokeOneShotAllReduce(const OneShotAllReduceParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateOneShotAllReduce(p));
  constexpr auto name = "one_shot_all_reduce";
  constexpr auto kFlags = AllReduceProtocol::kFlags;
  constexpr auto kLamport = AllReduceProtocol::kLamport;
  const bool lamport = p.protocol == kLamport;  // validated: 16-bit types only
  switch (p.dtype) {
    case DType::kF32:
      return cuda::launch(name, oneShotAllReduceKernel<float, kFlags>, p.blocks, kThreads, 0,
                          stream, p);
    case DType::kF16:
      return cuda::launch(name,
                          lamport ? oneShotAllReduceKernel<__half, kLamport>
                                  : oneShotAllReduceKernel<__half, kFlags>,
                          p.blocks, kThreads, 0, stream, p);
    case DType::kBF16:
      return cuda::launch(name,
                          lamport ? oneShotAllReduceKernel<__nv_bfloat16, kLamport>
                                  : oneShotAllReduceKernel<__nv_bfloat16, kFlags>,
                          p.blocks, kThreads, 0, stream, p);
  }
  return invalidArgumentError("one-shot all-reduce: unsupported dtype");
}

}  // namespace textgen::kernels
