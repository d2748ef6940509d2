// Paged attention on CUDA (see paged_attention.h). The kernels:
//  - splitKernel: one block per (row, tile of up to 8 query heads sharing a KV head, split of the
//    context), each key and value loaded once for the tile's heads; each warp walks keys with an
//    online softmax and the block merges its warps. With more than one split the partial
//    (max, sum, unnormalised output) go to the workspace and the last split block of each
//    (row, head) to finish combines them ("flash-decoding", without a second kernel). Used for
//    decode rows and whatever the tensor-core kernels do not cover.
//  - mmaDecodeKernel: decode rows of 1 to 8 query heads of 128 a KV head (multi-head and grouped
//    attention over a cache of T or fp8 codes, no bias) on tensor cores, the group's heads the rows
//    of the mma tiles; same splits, partials and merge as splitKernel.
//  - flashKernel: prefill tiles of 64 rows of one sequence and one head on tensor cores (WMMA):
//    S = Q·Kᵀ and O += P·V per 64-key tile of the paged cache, online softmax in shared memory.
//    T5's encoder (no causal mask) and decoder prompts (causal) with the relative bias run here
//    too: each key tile's 127 relative positions take their bias from a table built per tile.
//  - mmaFlashKernel: the same tiles, splits and partials for the common case (a cache of T or of
//    fp8 codes, no bias) in flash-attention-2's form: mma.sync with everything of a warp's 16 rows
//    in registers, K/V tiles in two cp.async stages (fp8 codes widened into one stage of T).
// Both are templated on the bias (Bias: none, ALiBi's or T5's relative bias): it joins the scores
// only in the instantiations launched with one, so the kernels without it are the same code as
// before. Cross-attention (contextLens) takes the decode kernels alone (its rows are decode rows);
// and on kCache, the cache's element type (kv_cache.cuh): T, or fp8 codes widened to float as they
// are loaded (into T for the tensor cores, exactly).
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "common.cuh"
#include "kv_cache.cuh"
#include "mma.cuh"
#include "textgen/kernels/fast_div.h"
#include "textgen/kernels/paged_attention.h"
#include "textgen/kernels/relative_position.h"

namespace textgen::kernels {
namespace {

using cuda::CacheOf;
using cuda::Convert;

constexpr int kWarps = 4;
// Fewest keys per split (minPartition()). H100, Llama-2-7B batch-1 decode over 128-256 keys (2 to
// 8 splits of 32 heads, each split one round of loads a warp): 32 gave 4.88 ms/token, 64 4.94,
// 128 5.14; 8 and 32 sequences and 2048 keys unchanged.
constexpr int kMinPartition = 32;
// The split-K workspace starts with one arrival counter per (row, head) (zero at rest: the merging
// block resets its own), then the partial results.
constexpr size_t kCounterBytes = 1u << 20;

__device__ __forceinline__ int sequenceOf(const int32_t* seqStarts, int numSeqs, int row) {
  int lo = 0, hi = numSeqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (seqStarts[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ALiBi's bias of key position j for query position pos: slope * (j - pos), or Falcon's
// bf16(slope * j) / divisor (paged_attention.h).
__device__ __forceinline__ float alibiBias(float slope, int j, int pos, float divisor) {
  if (divisor > 0.0f)
    return __bfloat162float(__float2bfloat16_rn(slope * static_cast<float>(j))) / divisor;
  return slope * static_cast<float>(j - pos);
}

// The split kernel's bias: none, ALiBi's, or T5's relative bias table (paged_attention.h).
enum class Bias { kNone, kAlibi, kRelative };

__device__ __forceinline__ int64_t slotOf(const int32_t* blocks, int blockSize, int pos) {
  return static_cast<int64_t>(blocks[pos / blockSize]) * blockSize + pos % blockSize;
}

// The end of a split block whose partials [max, sum, unnormalised output] per head are written:
// the last split of this (row, tile of heads) to finish merges them all (no second kernel), then
// resets the counter (the tile's first head's) for the next call. kStaged: the merge's L2 loads
// issued many at a time (below); kMaxDim: the widest head.
template <typename T, bool kStaged, int kMaxDim>
__device__ __forceinline__ void finishSplits(const PagedAttentionParams& p, int64_t rowHead0,
                                             int nHeads, int numSplits, int last) {
  using C = Convert<T>;
  constexpr int first = 0;
  const int hd = static_cast<int>(p.headDim);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* partials =
      reinterpret_cast<const float*>(static_cast<const char*>(p.workspace) + kCounterBytes);
  // Every thread's partial stores are fenced before thread 0 announces the block: without the
  // barrier it could arrive while other warps' stores were still in flight, and the merging block
  // read stale partials.
  __threadfence();
  __syncthreads();
  __shared__ bool isLast;
  unsigned int* counter = static_cast<unsigned int*>(p.workspace) + rowHead0;
  if (threadIdx.x == 0) isLast = atomicAdd(counter, 1u) == static_cast<unsigned>(last - first);
  __syncthreads();
  if (!isLast) return;
  __threadfence();
  // The merge. On the 16-lane kernels of heads of 128 without a bias (the decode kernels of most
  // models), its L2 loads are issued many at a time: the max over the splits by every thread, then
  // kWarps * 32 splits at a time their weights exp(m - mMax) and sums staged in shared memory by
  // every thread, and the output's sums taken over them four loads at a time, in split order (the
  // same bits as one split after another: max is exact). H200, Llama-2-7B shape, batch-1 decode
  // at 2k context (33 splits a head): 4.83 -> 4.72-4.75 ms. On the other kernels it cost
  // registers, up to a block a multiprocessor (hd 256, ALiBi, T5's bias; not measured), so they
  // keep loading one split after another.
  if constexpr (kStaged) {
    constexpr int kStage = kWarps * 32, kDims = (kMaxDim + kStage - 1) / kStage;
    __shared__ float sW[kStage], sLp[kStage], sMax[kWarps];
    for (int t = 0; t < nHeads; ++t) {
      const float* mine = partials + (rowHead0 + t) * numSplits * (hd + 2);
      float mMax = -INFINITY;
      for (int sp = first + static_cast<int>(threadIdx.x); sp <= last; sp += kStage)
        mMax = fmaxf(mMax, __ldcg(mine + sp * (hd + 2)));
#pragma unroll
      for (int o = 16; o > 0; o /= 2) mMax = fmaxf(mMax, __shfl_xor_sync(0xffffffffu, mMax, o));
      if (lane == 0) sMax[warp] = mMax;
      __syncthreads();
      mMax = sMax[0];
      for (int w = 1; w < kWarps; ++w) mMax = fmaxf(mMax, sMax[w]);
      float lSum = 0.0f;
      T* out = static_cast<T*>(p.out) + (rowHead0 + t) * hd;
      float o[kDims] = {};  // dimensions threadIdx.x, + kStage (heads up to kEpl * kLanes)
      for (int base = first; base <= last; base += kStage) {
        const int n = min(kStage, last + 1 - base);
        if (static_cast<int>(threadIdx.x) < n) {
          const float* at = mine + (base + threadIdx.x) * (hd + 2);
          sW[threadIdx.x] = __expf(__ldcg(at) - mMax);
          sLp[threadIdx.x] = __ldcg(at + 1);
        }
        __syncthreads();
        for (int i = 0; i < n; ++i) lSum += sLp[i] * sW[i];
#pragma unroll
        for (int k = 0; k < kDims; ++k) {
          const int d = static_cast<int>(threadIdx.x) + k * kStage;
          if (d >= hd) break;
          const float* col = mine + base * (hd + 2) + 2 + d;
          int i = 0;
          for (; i + 4 <= n; i += 4) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = __ldcg(col + (i + u) * (hd + 2));
#pragma unroll
            for (int u = 0; u < 4; ++u) o[k] += v[u] * sW[i + u];
          }
          for (; i < n; ++i) o[k] += __ldcg(col + i * (hd + 2)) * sW[i];
        }
        __syncthreads();  // the stage is read before the next is written
      }
#pragma unroll
      for (int k = 0; k < kDims; ++k) {
        const int d = static_cast<int>(threadIdx.x) + k * kStage;
        if (d < hd) out[d] = C::fromFloat(lSum > 0.0f ? o[k] / lSum : 0.0f);
      }
    }
  } else {
    for (int t = 0; t < nHeads; ++t) {
      const float* mine = partials + (rowHead0 + t) * numSplits * (hd + 2);
      float mMax = -INFINITY;
      for (int sp = first; sp <= last; ++sp) mMax = fmaxf(mMax, __ldcg(mine + sp * (hd + 2)));
      float lSum = 0.0f;
      for (int sp = first; sp <= last; ++sp)
        lSum += __ldcg(mine + sp * (hd + 2) + 1) * __expf(__ldcg(mine + sp * (hd + 2)) - mMax);
      T* out = static_cast<T*>(p.out) + (rowHead0 + t) * hd;
      for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int sp = first; sp <= last; ++sp)
          o += __ldcg(mine + sp * (hd + 2) + 2 + d) * __expf(__ldcg(mine + sp * (hd + 2)) - mMax);
        out[d] = C::fromFloat(lSum > 0.0f ? o / lSum : 0.0f);
      }
    }
  }
  if (threadIdx.x == 0) *counter = 0;
}

// A row's keys and its split's share of them. Keys [lo, keyEnd): causal up to the row's own
// position; else the sequence's whole context, or contextLens[s] (cross-attention). They are cut
// into at most numSplits parts of whole minPartition multiples, sized from the row's own keys alone
// (not the batch's or a graph's longest context): split i takes keys [lo + i * partition, ...). A
// row's sums so depend on its keys and numSplits only, whatever else runs beside it, eagerly or in
// a graph. With no keys (contextLens 0) split 0 writes zeros. last: the last split holding keys.
struct KeySplit {
  int begin, end, last;
};

__device__ __forceinline__ KeySplit keySplit(const PagedAttentionParams& p, int s, int pos,
                                             int numSplits, int minPartition, int split) {
  int lo = 0, keyEnd = pos + 1;
  if (p.contextLens) {
    keyEnd = p.contextLens[s];
  } else if (!p.causal) {
    keyEnd = p.startPos[s] + (p.seqStarts[s + 1] - p.seqStarts[s]);
  } else if (p.slidingWindow > 0) {
    lo = max(0, pos - static_cast<int>(p.slidingWindow) + 1);
  }
  const int span = max(keyEnd - lo, 0);
  int partition = max(span, 1);
  if (numSplits > 1) {
    partition = (span + numSplits - 1) / numSplits;
    partition = max(minPartition, (partition + minPartition - 1) / minPartition * minPartition);
  }
  const int begin = lo + split * partition;
  return {begin, min(keyEnd, begin + partition), span == 0 ? 0 : (span - 1) / partition};
}

// Lane l owns dimensions [l*kEpl, l*kEpl + kEpl) of a head (kEpl = elements per lane). A block
// serves up to kHeads query heads of one KV head (blockIdx.y: the KV head's tile of its group), so
// grouped- and multi-query attention load each key and value once for all of them: Falcon-7B's 71
// heads over one KV head read it 71 times from L2 with one head per block. Each head's arithmetic
// is the same, in the same order, as with kHeads = 1.
// kLanes < 32 (heads of 64 with 8 elements a lane: kLanes = 8): a warp holds 32 / kLanes groups of
// kLanes lanes, each walking its own keys with 16-byte loads and a kLanes-lane reduction, merged
// at the end; one key a warp with two elements a lane read T5's multi-head cross-attention at about
// 1.4 TB/s on an H100.
// kKeys: keys in flight per lane group. kEarly: the first keys loaded before the dependency wait
// (below; it costs registers, so only the split kernel of few rows has it).
// kPipe (16-byte loads, no kEarly): each iteration requests the next one's keys and values
// before computing on its own, so a warp's loads stay in flight through its arithmetic (the same
// sums in the same order as without kPipe at the same kKeys; a kernel of another kKeys gives
// groups other keys, so its low bits differ).
template <typename T, KvCacheDType kCache, int kEpl, int kHeads, Bias kBias, int kLanes = 32,
          int kKeys = 4, bool kEarly = false, bool kPipe = false>
__global__ void __launch_bounds__(kWarps * 32)
    splitKernel(PagedAttentionParams p, int numSplits, int tilesPerKv, int flashMinRows,
                int minPartition, bool earlyKeys) {
  using C = Convert<T>;
  using K = CacheOf<T, kCache>;
  using E = typename K::Elem;
  // Before the dependency wait this kernel reads only the step's metadata (copied before its first
  // kernel) and, below, keys written by earlier steps: those steps' kernels have completed (the
  // step's metadata copy comes after them, and every kernel since waits for its primary).
  cuda::allowDependents();
  // blockIdx.x: (row, tile of heads), the tiles of a row adjacent, so that the blocks running
  // together read the neighbouring heads of the same cache slots (one slot's keys are contiguous
  // over the KV heads); blockIdx.y: the split.
  const int rowTiles = static_cast<int>(p.numKvHeads) * tilesPerKv;
  const int row = static_cast<int>(blockIdx.x) / rowTiles, split = static_cast<int>(blockIdx.y);
  const int tile = static_cast<int>(blockIdx.x) % rowTiles;
  constexpr int kGroups = 32 / kLanes;  // key groups of a warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane % kLanes, keyGroup = lane / kLanes;
  const int hd = static_cast<int>(p.headDim);
  const int group = static_cast<int>(p.numHeads / p.numKvHeads);
  const int kvh = tile / tilesPerKv;
  const int head0 = kvh * group + (tile % tilesPerKv) * kHeads;
  const int nHeads = min(kHeads, (kvh + 1) * group - head0);  // a group's last tile may be short
  const int s = sequenceOf(p.seqStarts, static_cast<int>(p.numSeqs), row);
  // A mixed batch: the tensor-core kernel takes the sequences of flashMinRows rows or more.
  if (flashMinRows > 0 && p.seqStarts[s + 1] - p.seqStarts[s] >= flashMinRows) {
    cuda::waitForPrimary();  // (a kernel completes only after its primary: launch.h)
    return;
  }
  const int pos = p.startPos[s] + (row - p.seqStarts[s]);
  const KeySplit ks = keySplit(p, s, pos, numSplits, minPartition, split);
  const int first = 0, last = ks.last;
  if (split > last) {  // nothing here: the merge skips this split
    cuda::waitForPrimary();
    return;
  }
  const int begin = ks.begin, end = ks.end;
  const int32_t* blocks = p.blockTables + s * p.maxBlocksPerSeq;
  const int64_t kvWidth = p.numKvHeads * p.headDim;
  const int d0 = sub * kEpl;
  const E* kBase = static_cast<const E*>(p.kCache) + kvh * p.headDim;
  const E* vBase = static_cast<const E*>(p.vCache) + kvh * p.headDim;
  // The warp's first keys, where earlier steps wrote them (self-attention, before the row's
  // sequence's first new position), are loaded before the wait: their latency then overlaps the
  // kernel before this one (H100, Llama-2-7B batch-1 decode 5.00 -> 4.94 ms/token;
  // TEXTGEN_ATTN_EARLY=0 turns it off, for comparison).
  const int jwFirst = begin + warp * kGroups * kKeys;
  using EV = cuda::Vec<E, kEpl>;
  EV kPre[kKeys], vPre[kKeys];
  bool early[kKeys];
  const int written = earlyKeys && p.causal && !p.contextLens ? p.startPos[s] : 0;  // before: old
#pragma unroll
  for (int u = 0; u < kKeys; ++u) {
    const int j = jwFirst + keyGroup * kKeys + u;
    early[u] = kEarly && kLanes < 32 && j < end && j < written;
    if (early[u]) {
      const int64_t off = slotOf(blocks, static_cast<int>(p.blockSize), j) * kvWidth + d0;
      kPre[u] = *reinterpret_cast<const EV*>(kBase + off);
      vPre[u] = *reinterpret_cast<const EV*>(vBase + off);
    }
  }
  cuda::waitForPrimary();
  float slope[kHeads] = {};
  if constexpr (kBias == Bias::kAlibi) {
#pragma unroll
    for (int t = 0; t < kHeads; ++t) slope[t] = t < nHeads ? p.alibiSlopes[head0 + t] : 0.0f;
  }

  float q[kHeads][kEpl];
#pragma unroll
  for (int t = 0; t < kHeads; ++t) {
    const T* qRow = static_cast<const T*>(p.q) + row * p.qRowStride + (head0 + t) * p.headDim;
#pragma unroll
    for (int e = 0; e < kEpl; ++e)
      q[t][e] = t < nHeads && d0 + e < hd ? C::toFloat(qRow[d0 + e]) * p.scale : 0.0f;
  }

  float m[kHeads], l[kHeads], acc[kHeads][kEpl] = {};
#pragma unroll
  for (int t = 0; t < kHeads; ++t) {
    m[t] = -INFINITY;
    l[t] = 0.0f;
  }
  static_assert(!kPipe || (kLanes < 32 && !kEarly));
  constexpr int kWarpStride = kWarps * kGroups * kKeys;  // keys between a warp's iterations
  // kPipe: the keys and values of the warp's next iteration, requested one iteration ahead.
  EV kNext[kPipe ? kKeys : 1]{}, vNext[kPipe ? kKeys : 1]{};
  const auto fetch = [&](int jw) {
#pragma unroll
    for (int u = 0; u < (kPipe ? kKeys : 0); ++u) {
      const int j = jw + keyGroup * kKeys + u;
      if (j < end) {
        const int64_t off = slotOf(blocks, static_cast<int>(p.blockSize), j) * kvWidth + d0;
        kNext[u] = *reinterpret_cast<const EV*>(kBase + off);
        vNext[u] = *reinterpret_cast<const EV*>(vBase + off);
      }
    }
  };
  if constexpr (kPipe) fetch(jwFirst);
  // The warp's iterations are uniform over its groups (their shuffles need every lane): group g
  // takes keys [jw + g * kKeys, jw + (g + 1) * kKeys) of the warp's run, masked past the end.
  for (int jw = jwFirst; jw < end; jw += kWarpStride) {
    const int j0 = jw + keyGroup * kKeys;
    EV kCur[kPipe ? kKeys : 1], vCur[kPipe ? kKeys : 1];
    if constexpr (kPipe) {
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        kCur[u] = kNext[u];
        vCur[u] = vNext[u];
      }
      if (jw + kWarpStride < end) fetch(jw + kWarpStride);
    }
    // Keys and values of kKeys positions loaded together: one memory round trip per iteration.
    // kPipe converts them where they are used instead (registers: the raw vectors of two
    // iterations are live): a key past the end only meets a score of -inf, a value past it a
    // weight of 0 (its vector holds zeros or an earlier key's finite values), as the zeros below.
    float kv[kPipe ? 1 : kKeys][kEpl], vv[kPipe ? 1 : kKeys][kEpl];
#pragma unroll
    for (int u = 0; u < (kPipe ? 0 : kKeys); ++u) {
      const int j = j0 + u;
      const bool loaded = kEarly && jw == jwFirst && early[u];
      const int64_t off =
          (j < end && !loaded ? slotOf(blocks, static_cast<int>(p.blockSize), j) : 0) * kvWidth +
          d0;
      if constexpr (kLanes < 32) {  // whole rows of kEpl: 16-byte (fp8: 8-byte) loads
        EV ke{}, ve{};
        if (loaded) {
          ke = kPre[u];
          ve = vPre[u];
        } else if (j < end) {
          ke = *reinterpret_cast<const EV*>(kBase + off);
          ve = *reinterpret_cast<const EV*>(vBase + off);
        }
#pragma unroll
        for (int e = 0; e < kEpl; ++e) {
          kv[u][e] = j < end ? K::toFloat(ke.v[e]) : 0.0f;
          vv[u][e] = j < end ? K::toFloat(ve.v[e]) : 0.0f;
        }
      } else {
#pragma unroll
        for (int e = 0; e < kEpl; ++e) {
          const bool in = j < end && d0 + e < hd;
          kv[u][e] = in ? K::toFloat(kBase[off + e]) : 0.0f;
          vv[u][e] = in ? K::toFloat(vBase[off + e]) : 0.0f;
        }
      }
    }
    // T5: each key's row of the bias table, shared by the tile's heads.
    int64_t biasRow[kKeys] = {};
    if constexpr (kBias == Bias::kRelative) {
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        biasRow[u] =
            static_cast<int64_t>(relativePositionBucketInline(
                j0 + u - pos, p.relativeBidirectional, p.relativeBuckets, p.relativeMaxDistance)) *
            p.numHeads;
      }
    }
#pragma unroll
    for (int t = 0; t < kHeads; ++t) {
      if (t >= nHeads) break;  // uniform over the block
      float score[kKeys];
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) {
          if constexpr (kPipe) {
            dot += q[t][e] * K::toFloat(kCur[u].v[e]);
          } else {
            dot += q[t][e] * kv[u][e];
          }
        }
#pragma unroll
        for (int o = kLanes / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if constexpr (kBias == Bias::kAlibi) {
          dot += alibiBias(slope[t], j0 + u, pos, p.alibiBf16Divisor);
        } else if constexpr (kBias == Bias::kRelative) {
          dot += __ldg(p.relativeBias + biasRow[u] + head0 + t);
        }
        score[u] = j0 + u < end ? dot : -INFINITY;
      }
      float mNew = m[t];
#pragma unroll
      for (int u = 0; u < kKeys; ++u) mNew = fmaxf(mNew, score[u]);
      // A lane group whose keys all lie past the end (kLanes < 32) has mNew = -inf: exponents
      // taken against 0 then, so that nothing becomes NaN (-inf - -inf).
      const float mUse = mNew == -INFINITY ? 0.0f : mNew;
      const float corr = __expf(m[t] - mUse);  // m = -inf on the first keys: 0
      l[t] *= corr;
#pragma unroll
      for (int e = 0; e < kEpl; ++e) acc[t][e] *= corr;
#pragma unroll
      for (int u = 0; u < kKeys; ++u) {
        const float w = __expf(score[u] - mUse);  // 0 past the end
        l[t] += w;
#pragma unroll
        for (int e = 0; e < kEpl; ++e) {
          if constexpr (kPipe) {
            acc[t][e] += w * K::toFloat(vCur[u].v[e]);
          } else {
            acc[t][e] += w * vv[u][e];
          }
        }
      }
      m[t] = mNew;
    }
  }

  // Merge a warp's key groups (the lanes holding the same dimensions), then the warps.
  if constexpr (kLanes < 32) {
#pragma unroll
    for (int t = 0; t < kHeads; ++t) {
#pragma unroll
      for (int o = kLanes; o < 32; o *= 2) {
        const float mO = __shfl_xor_sync(0xffffffffu, m[t], o);
        const float lO = __shfl_xor_sync(0xffffffffu, l[t], o);
        const float mN = fmaxf(m[t], mO);
        const float a = m[t] == -INFINITY ? 0.0f : __expf(m[t] - mN);
        const float b = mO == -INFINITY ? 0.0f : __expf(mO - mN);
        l[t] = l[t] * a + lO * b;
#pragma unroll
        for (int e = 0; e < kEpl; ++e)
          acc[t][e] = acc[t][e] * a + __shfl_xor_sync(0xffffffffu, acc[t][e], o) * b;
        m[t] = mN;
      }
    }
  }
  __shared__ float sM[kWarps][kHeads], sL[kWarps][kHeads], sAcc[kWarps][kHeads][kEpl * kLanes];
#pragma unroll
  for (int t = 0; t < kHeads; ++t) {
    if (lane == 0) {
      sM[warp][t] = m[t];
      sL[warp][t] = l[t];
    }
    if (keyGroup == 0) {
#pragma unroll
      for (int e = 0; e < kEpl; ++e) sAcc[warp][t][d0 + e] = acc[t][e];
    }
  }
  __syncthreads();
  float lAll[kHeads], scaleOf[kHeads][kWarps], mAll[kHeads];
#pragma unroll
  for (int t = 0; t < kHeads; ++t) {
    mAll[t] = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mAll[t] = fmaxf(mAll[t], sM[w][t]);
    lAll[t] = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      scaleOf[t][w] = sM[w][t] == -INFINITY ? 0.0f : __expf(sM[w][t] - mAll[t]);
      lAll[t] += sL[w][t] * scaleOf[t][w];
    }
  }
  const int64_t rowHead0 = static_cast<int64_t>(row) * p.numHeads + head0;
  // Splits holding this row's keys (the others returned above). A lone one writes the output
  // itself: merging one partial would give the same bits after two more round trips.
  if (first == last) {
#pragma unroll
    for (int t = 0; t < kHeads; ++t) {
      if (t >= nHeads) break;
      T* out = static_cast<T*>(p.out) + (rowHead0 + t) * hd;
      for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < kWarps; ++w) o += sAcc[w][t][d] * scaleOf[t][w];
        out[d] = C::fromFloat(lAll[t] > 0.0f ? o / lAll[t] : 0.0f);
      }
    }
    return;
  }
  // Partial results of this split, per head: [max, sum, unnormalised output].
  float* partials = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kCounterBytes);
#pragma unroll
  for (int t = 0; t < kHeads; ++t) {
    if (t >= nHeads) break;
    float* ws = partials + ((rowHead0 + t) * numSplits + split) * (hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kWarps; ++w) o += sAcc[w][t][d] * scaleOf[t][w];
      ws[2 + d] = o;
    }
    if (threadIdx.x == 0) {
      ws[0] = mAll[t];
      ws[1] = lAll[t];
    }
  }
  finishSplits<T, kLanes == 16 && kBias == Bias::kNone, kEpl * kLanes>(p, rowHead0, nHeads,
                                                                       numSplits, last);
}

// Decode rows on the tensor cores (groups of 1 to 8 query heads of 128 a KV head over a cache of T
// or of fp8 codes widened to T, no bias): one block per (row, KV head, split), the group's heads
// the rows of m16n8k16 tiles (rows past the group zero), as FlashInfer's decode for groups does.
// Each warp takes 16 keys at a time, loaded straight into registers (no shared memory): lane (g, c)
// loads dimensions [32c, 32c + 32) of keys g and g + 8 (four 16-byte vectors of T, two of fp8
// codes). The dot product
// does not depend on the order of its terms, so Q's fragments take the same permutation of the
// dimensions: S = Q Kᵀ is 8 mmas a half of 16 keys with no shuffle. P (rounded to T, as the prefill
// kernel's) is the A fragment of P V as FlashAttention-2 reuses it; V's B fragments come from each
// lane's vectors of chunks c + 4r (r < 4) of its keys, transposed by movmatrix, so lane (g, c) ends
// with dimensions 8 (c + 4r) + [0, 8) of head g. The warps' results merge in shared memory, the
// splits as the split kernel's (finishSplits). Same key ranges and partials as splitKernel, other
// arithmetic: the 4-head tiles of the CUDA cores ran at about a third of copy bandwidth (H200, 32
// over 8, 64 x 2048 keys: 389 µs, 1.38 TB/s), limited by their per-key shuffles and fp32 products.
// Multi-head attention (a group of one, 15 of a tile's 16 rows idle: the products are not what
// bounds it) runs here too: its 16-lane kernel read the cache at about 3.3 TB/s (H200, 32 over 32,
// 64 x 2048 keys: 659 µs; here 486, 4.4 TB/s; one sequence of 2048 keys 23.5 -> 11.7 µs, of 128 5.5
// -> 5.4).
constexpr int kMmaDecodeDim = 128, kMmaDecodeKeys = 16;

// Each lane's next chunk is held in registers, requested a chunk ahead, and the cache offsets of
// the chunk after it are looked up then (251 registers, two blocks a multiprocessor). A ring of 2
// or 3 chunks in shared memory filled by cp.async, each lane reading back what it copied (158-165
// registers, three blocks a multiprocessor with 2), was slower everywhere: H200, 32 over 8, µs,
// registers / ring of 2 / ring of 3: 8 x 2048 27.4 / 38.6 / 36.3, 64 x 2048 130.7 / 226.1 /
// 189.3, 256 x 2048 510.8 / 721.4 / 736.1.
// Two fp8 codes (the low 16 bits of `bits`) as a pair of T, exactly (every e4m3fn and e5m2 value is
// a float16 and a bfloat16 value).
template <typename T, KvCacheDType kCache>
__device__ __forceinline__ uint32_t widenFp8Pair(uint32_t bits) {
  constexpr __nv_fp8_interpretation_t kFormat =
      kCache == KvCacheDType::kFp8E5M2 ? __NV_E5M2 : __NV_E4M3;
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits & 0xFFFFu), kFormat);
  if constexpr (std::is_same_v<T, __half>) {
    uint32_t r;
    memcpy(&r, &h, 4);
    return r;
  } else {
    __half2 hh;
    memcpy(&hh, &h, 4);
    const float2 f = __half22float2(hh);
    return cuda::pack2<T>(f.x, f.y);
  }
}

template <typename T, KvCacheDType kCache>
__global__ void __launch_bounds__(kWarps * 32)
    mmaDecodeKernel(PagedAttentionParams p, int numSplits, int tilesPerKv, int flashMinRows,
                    int minPartition, bool earlyKeys) {
  static_assert(sizeof(T) == 2);
  constexpr int kD = kMmaDecodeDim, kChunk = kMmaDecodeKeys, kMaxGroup = 8;
  // An fp8 cache's codes stay as loaded (half the registers) until their chunk is multiplied, then
  // widen to T exactly: kRaw 32-bit words hold a lane's 32 elements of a key or a value.
  constexpr bool kFp8 = kCache != KvCacheDType::kAuto;
  constexpr int kRaw = kFp8 ? 8 : 16;
  using E = typename CacheOf<T, kCache>::Elem;
  cuda::allowDependents();
  const int kvHeads = static_cast<int>(p.numKvHeads);
  const int row = static_cast<int>(blockIdx.x) / kvHeads,
            kvh = static_cast<int>(blockIdx.x) % kvHeads;
  const int split = static_cast<int>(blockIdx.y);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int group = static_cast<int>(p.numHeads / p.numKvHeads);
  const int head0 = kvh * group;
  const int s = sequenceOf(p.seqStarts, static_cast<int>(p.numSeqs), row);
  if (flashMinRows > 0 && p.seqStarts[s + 1] - p.seqStarts[s] >= flashMinRows) {
    cuda::waitForPrimary();
    return;
  }
  const int pos = p.startPos[s] + (row - p.seqStarts[s]);
  const KeySplit ks = keySplit(p, s, pos, numSplits, minPartition, split);
  if (split > ks.last) {
    cuda::waitForPrimary();
    return;
  }
  const int end = ks.end;
  const int32_t* blocks = p.blockTables + s * p.maxBlocksPerSeq;
  const int64_t kvWidth = p.numKvHeads * kD;
  const E* kBase = static_cast<const E*>(p.kCache) + kvh * kD;
  const E* vBase = static_cast<const E*>(p.vCache) + kvh * kD;
  // Lane (g, c)'s vectors of key j at cache offset off (zeros past the end: a weight of 0 must
  // meet finite values).
  const auto load = [&](int j, int64_t off, uint32_t(&kw)[kRaw], uint32_t(&vw)[kRaw]) {
    if constexpr (kFp8) {
      // Key dimensions [32c, 32c + 32) as two 16-byte vectors; value dimensions 8 (c + 4i) + [0,
      // 8) as four 8-byte ones.
      uint4 kv[2] = {};
      uint2 vv[4] = {};
      if (j < end) {
        const uint4* kp = reinterpret_cast<const uint4*>(kBase + off + 32 * c);
        const E* vp = vBase + off + 8 * c;
#pragma unroll
        for (int i = 0; i < 2; ++i) kv[i] = kp[i];
#pragma unroll
        for (int i = 0; i < 4; ++i) vv[i] = *reinterpret_cast<const uint2*>(vp + 32 * i);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        kw[4 * i] = kv[i].x;
        kw[4 * i + 1] = kv[i].y;
        kw[4 * i + 2] = kv[i].z;
        kw[4 * i + 3] = kv[i].w;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        vw[2 * i] = vv[i].x;
        vw[2 * i + 1] = vv[i].y;
      }
    } else {
      uint4 kv[4], vv[4];
      if (j < end) {
        const uint4* kp = reinterpret_cast<const uint4*>(kBase + off + 32 * c);
        const E* vp = vBase + off + 8 * c;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          kv[i] = kp[i];
          vv[i] = *reinterpret_cast<const uint4*>(vp + 32 * i);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) kv[i] = vv[i] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kw[4 * i] = kv[i].x;
        kw[4 * i + 1] = kv[i].y;
        kw[4 * i + 2] = kv[i].z;
        kw[4 * i + 3] = kv[i].w;
        vw[4 * i] = vv[i].x;
        vw[4 * i + 1] = vv[i].y;
        vw[4 * i + 2] = vv[i].z;
        vw[4 * i + 3] = vv[i].w;
      }
    }
  };
  // Cache offsets of a chunk's keys g and g + 8, looked up a chunk before their loads are issued,
  // so that a load waits on no block-table read of its own.
  const auto offsets = [&](int j0, int64_t(&off)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = j0 + 8 * h + g;
      off[h] = j < end ? slotOf(blocks, static_cast<int>(p.blockSize), j) * kvWidth : 0;
    }
  };
  constexpr int kStride = kWarps * kChunk;
  const int jFirst = ks.begin + warp * kChunk;
  // The next chunk's keys and values, requested a chunk ahead (halves: keys g and g + 8), and the
  // cache offsets of the chunk after it. A warp's first chunk, where earlier steps wrote all of it
  // (self-attention, before the sequence's first new position), is requested before the
  // dependency wait, its latency overlapping the kernel before this one (as the split kernel's
  // early keys: the step's metadata is copied before its first kernel).
  uint32_t kNext[2][kRaw], vNext[2][kRaw];
  int64_t offNext[2];
  const int written = p.causal && !p.contextLens ? p.startPos[s] : 0;
  const auto first = [&] {
    int64_t off[2];
    offsets(jFirst, off);
    load(jFirst + g, off[0], kNext[0], vNext[0]);
    load(jFirst + 8 + g, off[1], kNext[1], vNext[1]);
    offsets(jFirst + kStride, offNext);
  };
  const bool early = earlyKeys && jFirst + kChunk <= min(written, end);
  if (early) first();
  cuda::waitForPrimary();
  if (!early && jFirst < end) first();

  // Q's fragments of head g (the tile's row g): dimensions [32c, 32c + 32) as 16 pairs, pair 2i of
  // a k16 step i's columns 2c..2c+1 and pair 2i + 1 its columns 2c + 8..
  uint32_t qf[16];
  {
    const bool ok = g < group;
    const uint4* qv = reinterpret_cast<const uint4*>(
        static_cast<const T*>(p.q) + row * p.qRowStride + (head0 + g) * kD + 32 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = ok ? qv[i] : make_uint4(0, 0, 0, 0);
      qf[4 * i] = v.x;
      qf[4 * i + 1] = v.y;
      qf[4 * i + 2] = v.z;
      qf[4 * i + 3] = v.w;
    }
  }
  // o[4r + j]: head g's dimensions 8 (c + 4r) + 2j..+1 in [0], [1] ([2], [3]: the idle rows).
  float o[16][4] = {};
  float m = -INFINITY, l = 0.0f;  // head g's; l this lane's share of the sum
  for (int j0 = jFirst; j0 < end; j0 += kStride) {
    // Pair i of a lane's 32 elements: word i, or an fp8 cache's codes 2i, 2i + 1 widened.
    uint32_t kw[2][16], vw[2][16];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if constexpr (kFp8) {
          kw[h][i] = widenFp8Pair<T, kCache>(kNext[h][i / 2] >> (16 * (i % 2)));
          vw[h][i] = widenFp8Pair<T, kCache>(vNext[h][i / 2] >> (16 * (i % 2)));
        } else {
          kw[h][i] = kNext[h][i];
          vw[h][i] = vNext[h][i];
        }
      }
    if (j0 + kStride < end) {
      load(j0 + kStride + g, offNext[0], kNext[0], vNext[0]);
      load(j0 + kStride + 8 + g, offNext[1], kNext[1], vNext[1]);
      offsets(j0 + 2 * kStride, offNext);
    }
    // S: [2h], [2h + 1] head g's scores of keys j0 + 8h + 2c..+1.
    float sc[2][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        cuda::mmaK16<T>(sc[h], qf[2 * i], 0u, qf[2 * i + 1], 0u, kw[h][2 * i], kw[h][2 * i + 1]);
    float sv[4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        sv[2 * h + e] = j0 + 8 * h + 2 * c + e < end ? sc[h][e] * p.scale : -INFINITY;
    float mx = fmaxf(fmaxf(sv[0], sv[1]), fmaxf(sv[2], sv[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mNew = fmaxf(m, mx);      // finite: key j0 < end is the quad's
    const float corr = __expf(m - mNew);  // 0 on the first chunk (m = -inf)
    float pr[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) pr[k] = __expf(sv[k] - mNew);
    l = l * corr + ((pr[0] + pr[1]) + (pr[2] + pr[3]));
    m = mNew;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= corr;
      o[n][1] *= corr;
    }
    const uint32_t a0 = cuda::pack2<T>(pr[0], pr[1]), a2 = cuda::pack2<T>(pr[2], pr[3]);
#pragma unroll
    for (int n = 0; n < 16; ++n)
      cuda::mmaK16<T>(o[n], a0, 0u, a2, 0u, cuda::movmatrixTrans(vw[0][n]),
                      cuda::movmatrixTrans(vw[1][n]));
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // The warps' results: head g's max, sum and unnormalised output, merged per head.
  __shared__ float sM[kWarps][kMaxGroup], sL[kWarps][kMaxGroup];
  __shared__ __align__(16) float sO[kWarps][kMaxGroup][kD];
  if (g < group) {
    if (c == 0) {
      sM[warp][g] = m;
      sL[warp][g] = l;
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float* dst = &sO[warp][g][8 * (c + 4 * r)];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        dst[2 * j] = o[4 * r + j][0];
        dst[2 * j + 1] = o[4 * r + j][1];
      }
    }
  }
  __syncthreads();
  const int64_t rowHead0 = static_cast<int64_t>(row) * p.numHeads + head0;
  const bool lone = ks.last == 0;
  float* partials = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kCounterBytes);
  for (int idx = threadIdx.x; idx < group * kD; idx += kWarps * 32) {
    const int t = idx / kD, d = idx % kD;
    float mAll = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mAll = fmaxf(mAll, sM[w][t]);
    float lAll = 0.0f, out = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sM[w][t] == -INFINITY ? 0.0f : __expf(sM[w][t] - mAll);
      lAll += sL[w][t] * f;
      out += sO[w][t][d] * f;
    }
    if (lone) {
      static_cast<T*>(p.out)[(rowHead0 + t) * kD + d] =
          Convert<T>::fromFloat(lAll > 0.0f ? out / lAll : 0.0f);
    } else {
      float* ws = partials + ((rowHead0 + t) * numSplits + split) * (kD + 2);
      ws[2 + d] = out;
      if (d == 0) {
        ws[0] = mAll;
        ws[1] = lAll;
      }
    }
  }
  if (lone) return;
  finishSplits<T, true, kD>(p, rowHead0, group, numSplits, ks.last);
}

int multiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 1;
  }();
  return count;
}

// Query heads per block, for a group of `group` query heads a KV head and `rowHeads` = sequences x
// query heads, where one head a block would give the device enough blocks without splitting the
// context (rowHeads >= target, 8 blocks a multiprocessor); else 1:
// - 8 where a KV head serves at least that many and heads are 33 to 128 wide (Falcon, StarCoder,
//   grouped models of 8 or more heads a group). With fewer rows the tiles leave SMs idle:
//   Falcon-7B's batch-1 decode took 6.19 ms with them against 5.55 ms without (H100), while 256
//   sequences went from 12.8k to 18.9k tokens/s.
// - 4 for groups of 2 to 7 with heads of 128 on the 16-lane pipelined kernel (fourHeads: it
//   applies to the cache and the bias), each key and value load shared by the tile. With one head
//   a block each key was read once a query head: 64 sequences x 2048 keys of Llama-3-8B's 32 heads
//   over 8 took 605 µs against 646 for Llama-2's 32 KV heads (H200), a quarter of the cache at the
//   same cost. H200, bench_attention --decode, µs, one head a block -> 4-head tiles: 32 over 8
//   (Llama-3-8B, Mistral-7B) 64 x 512 156 -> 126, 64 x 2048 606 -> 389, 128 x 1024 569 -> 359,
//   256 x 512 560 -> 371, 256 x 2048 2156 -> 1401; 28 over 4 (Qwen2.5-7B, a group's second tile of
//   3) 64 x 2048 514 -> 345; 32 over 16 64 x 2048 615 -> 553. Two keys a lane group were slower
//   (64 x 2048 389 -> 439). The 8-head tiles of 32 lanes, half idle, were slower for groups of 4
//   than one head a block (64 x 512: 157 -> 196). TEXTGEN_ATTN_GQA4=0 keeps one head a block (for
//   comparison).
// Groups of 1 to 8 over a cache of T or fp8 codes take the tensor-core decode kernel
// (mmaDecodeKernel) instead, where it applies; these tiles and the 16-lane kernel remain for the
// rest (ALiBi, T5's bias, q rows not 16-byte aligned, fewer than 8 sequences x KV heads) and its
// comparison (TEXTGEN_ATTN_MMA_DECODE=0). Measured with
// it off and not enabled: 4-head tiles for groups of 8 and up instead of the 8-head ones (64 over
// 8: 32 x 2048 516 -> 374 µs, 64 x 2048 856 -> 682), and from an eighth of the target on (32 over
// 8: 8 x 2048 85 -> 77, 32 x 2048 326 -> 208; but 1 and 2 sequences 21.1 -> 22.1 and 27.5 ->
// 31.5). The tensor-core kernel took those shapes to 33-133 µs (bench/README.md).
// Each instantiation costs pack size (device code of every binary), so only these.
int headsPerBlock(int64_t group, int64_t headDim, int64_t rowHeads, int64_t target,
                  bool fourHeads) {
  if (rowHeads < target) return 1;
  if (group >= 8 && headDim > 32 && headDim <= 128) return 8;
  return fourHeads && group >= 2 && headDim == 128 ? 4 : 1;
}

bool gqa4On() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_GQA4");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

template <typename T, KvCacheDType kCache, int kEpl, Bias kBias>
auto splitKernelHeads(int heads) {
  if constexpr (kEpl == 2 || kEpl == 4) {
    if (heads == 8) return splitKernel<T, kCache, kEpl, 8, kBias>;
  }
  return splitKernel<T, kCache, kEpl, 1, kBias>;
}

using SplitKernel = void (*)(PagedAttentionParams, int, int, int, int, bool);

// Unsplit heads of 128 (decode batches of 24 sequences and up on an H100): two groups of 16 lanes
// a warp with 16-byte loads (until the change below, two keys each in flight), rather than 32
// lanes with 8 bytes and four keys: half the loads, reductions and slot look-ups per key. H100,
// Llama-2-7B shape, 128-token prompts and 256 steps, ms a step: 24 sequences 7.62 -> 7.10, 48:
// 9.38 -> 8.46, 128: 14.39 -> 13.13, 256: 23.24 -> 20.61. It took 68 registers against 64 (7
// blocks a multiprocessor, not 8), so 32 sequences of 32 heads, one wave of the 32-lane kernel on
// 132 SMs and 1.1 of this one, lost (7.77 -> 8.03 ms). Choosing by waves would make the kernel,
// and so the bits, differ between an eager call and a graph padded to another sequence count: the
// choice depends on the split alone. (launchSplit's split of a partial second wave in two is
// chosen by waves; an eager call and a graph padded across the band's edge differ in it.)
// TEXTGEN_ATTN_LANES16=0 keeps 32 lanes (for comparison).
//
// Now each 16-lane group takes one key an iteration and requests the next iteration's key and
// value before computing on its own (kPipe): 64 registers, 8 blocks a multiprocessor again, and
// loads in flight through the arithmetic. H100, 512-token prompts, 64 steps, ms a step: 32
// sequences 10.28 -> 8.93, 64: 13.44 -> 12.29, 48: 11.12 -> 11.28, 16 (then split on the kernel of
// few rows) unchanged. Two keys a group pipelined took 88 registers (5 blocks): 32 sequences 10.0,
// 48 12.1, 64 14.3.
//
// Fewest keys a split takes: kMinPartition, or TEXTGEN_ATTN_PARTITION (16, 32, 64 or 128) for
// comparison.
int minPartition() {
  static const int keys = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_PARTITION");
    const int n = v ? std::atoi(v) : 0;
    return n == 16 || n == 32 || n == 64 || n == 128 ? n : kMinPartition;
  }();
  return keys;
}

// TEXTGEN_ATTN_EARLY=0: no keys loaded before the dependency wait (for comparison).
bool earlyKeysOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_EARLY");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

bool lanes16On() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_LANES16");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// TEXTGEN_ATTN_PIPE=0: unsplit heads of 128 take two keys a group an iteration, loaded in it, not
// one key a group requested an iteration ahead (for comparison).
bool pipeOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_PIPE");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// Blocks (a percentage of the target) under which decode rows' keys are split: 50, or
// TEXTGEN_ATTN_SPLIT_BELOW (1 to 400), for comparison.
int64_t splitBelowPercent() {
  static const int64_t percent = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_SPLIT_BELOW");
    const int n = v ? std::atoi(v) : 0;
    return n >= 1 && n <= 400 ? n : 50;
  }();
  return percent;
}

// TEXTGEN_ATTN_FEW_PIPE=0: 2 to 16 sequences (heads of 128) split on the split kernel of few rows,
// into about the target's blocks, as one sequence is (for comparison).
bool fewPipeOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_FEW_PIPE");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// TEXTGEN_ATTN_TAIL_SPLIT=0: decode blocks a little over one wave stay unsplit (for comparison).
bool tailSplitOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_TAIL_SPLIT");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// The 4-head tiles' kernel exists for 16-bit models with a 16-bit cache and no bias (pack size; an
// fp8 cache's would take 181-183 registers, two blocks a multiprocessor, and was not measured).
template <typename T, KvCacheDType kCache, Bias kBias>
constexpr bool kFourHeads = sizeof(T) == 2 && (kCache == KvCacheDType::kAuto) &&
                            (kBias == Bias::kNone);

// The kernel for a head size and tile. pipelined: split keys go to the pipelined kernel of many
// rows rather than the split kernel of few (launchSplit: two or more sequences, or a partial
// second wave split in two).
template <typename T, KvCacheDType kCache, Bias kBias>
SplitKernel splitKernelFor(int64_t headDim, int heads, bool vectorLoads, bool split,
                           bool pipelined) {
  // Heads of exactly 64, one a block (multi-head attention: T5, GPT-2-style models): four groups
  // of 8 lanes a warp, 8 elements a lane (kLanes above), when the cache allows their vector loads.
  if (headDim == 64 && heads == 1 && vectorLoads) return splitKernel<T, kCache, 8, 1, kBias, 8>;
  // Heads of 128 whose keys are split (few rows: bound by the latency of each block's serial key
  // loads, not bandwidth): two groups of 16 lanes, 16-byte loads, half the iterations. H100,
  // Llama-2-7B shape, batch-1 decode 5.51 -> 5.37 ms. The first keys loaded before the wait
  // (kEarly: 5.00 -> 4.94 ms; 8 sequences 6.31 -> 6.20, before they moved to the pipelined
  // kernel: launchSplit), which costs registers the unsplit kernels below would pay in blocks a
  // multiprocessor.
  if (split && !pipelined && headDim == 128 && heads == 1 && vectorLoads)
    return splitKernel<T, kCache, 8, 1, kBias, 16, 4, true>;
  if (headDim == 128 && heads == 1 && vectorLoads && lanes16On())
    return pipeOn() ? splitKernel<T, kCache, 8, 1, kBias, 16, 1, false, true>
                    : splitKernel<T, kCache, 8, 1, kBias, 16, 2>;
  // Tiles of 4 heads (headsPerBlock: groups of 2 to 7), the same pipelined kernel (kFourHeads).
  // Nothing else serves 4 heads a block: none (launchSplit's error) rather than a kernel of other
  // tiles that would leave heads unwritten, should launchSplit's choice and this one part.
  if (heads == 4) {
    if constexpr (kFourHeads<T, kCache, kBias>) {
      if (headDim == 128 && vectorLoads)
        return splitKernel<T, kCache, 8, 4, kBias, 16, 1, false, true>;
    }
    return nullptr;
  }
  return headDim <= 32    ? splitKernelHeads<T, kCache, 1, kBias>(heads)
         : headDim <= 64  ? splitKernelHeads<T, kCache, 2, kBias>(heads)
         : headDim <= 128 ? splitKernelHeads<T, kCache, 4, kBias>(heads)
                          : splitKernelHeads<T, kCache, 8, kBias>(heads);
}

// Splits are cut to what the workspace holds: partials and counters are per (row, query head).
int64_t splitsTheWorkspaceHolds(const PagedAttentionParams& p, int64_t splits) {
  const int64_t rowHeads = p.rows * p.numHeads;
  const int64_t perSplit = rowHeads * (p.headDim + 2) * static_cast<int64_t>(sizeof(float));
  if (p.workspace && p.workspaceBytes > kCounterBytes &&
      rowHeads * 4 <= static_cast<int64_t>(kCounterBytes)) {
    splits = std::min<int64_t>(splits,
                               static_cast<int64_t>(p.workspaceBytes - kCounterBytes) / perSplit);
  } else {
    splits = 1;
  }
  return std::clamp<int64_t>(splits, 1, 65535);
}

// TEXTGEN_ATTN_MMA_DECODE=0: multi-head and grouped heads of 128 keep the CUDA-core kernels (for
// comparison).
bool mmaDecodeOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_MMA_DECODE");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// Waves of the device's resident blocks that the tensor-core decode kernel's splits aim at: 1, or
// TEXTGEN_ATTN_MMA_WAVES (1 to 16), for comparison. H200, 32 over 8 heads, µs, 2 waves -> 1: 64 x
// 512 keys 66.6 -> 41.1, 64 x 2048 157.5 -> 129.8, 2 x 2048 19.9 -> 16.4 (4 waves: slower still).
int64_t mmaDecodeWaves() {
  static const int64_t waves = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_MMA_WAVES");
    const int n = v ? std::atoi(v) : 0;
    return n >= 1 && n <= 16 ? n : 1;
  }();
  return waves;
}

// Blocks of a call's sequences before any split (sequences x KV heads) from which the tensor-core
// decode kernel is taken: 8, or TEXTGEN_ATTN_MMA_MIN_BLOCKS (1 to 64), for comparison.
int64_t mmaDecodeMinBlocks() {
  static const int64_t n = [] {
    const char* v = std::getenv("TEXTGEN_ATTN_MMA_MIN_BLOCKS");
    const int b = v ? std::atoi(v) : 0;
    return b >= 1 && b <= 64 ? b : 8;
  }();
  return n;
}

// The tensor-core decode kernel: one block a (row, KV head); the keys split while the blocks of
// the call's sequences fill fewer than mmaDecodeWaves() waves of what the device holds at once.
template <typename T, KvCacheDType kCache>
Status launchMmaDecode(const PagedAttentionParams& p, cudaStream_t stream, int flashMinRows,
                       int64_t seqs) {
  static const int64_t resident = [] {
    int perSm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, mmaDecodeKernel<T, kCache>,
                                                      kWarps * 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // not left for an unrelated check to find
      perSm = 1;
    }
    perSm = std::max(perSm, 1);
    return static_cast<int64_t>(perSm) * multiprocessorCount();
  }();
  // Whole splits a block, at most the waves' blocks: a wave and a fifth ran as two.
  const int64_t blocks = seqs * p.numKvHeads, want = mmaDecodeWaves() * resident;
  int64_t splits = std::max<int64_t>(1, want / blocks);
  splits = splitsTheWorkspaceHolds(p, splits);
  const int64_t rowBlocks = p.rows * p.numKvHeads;
  if (rowBlocks > INT32_MAX) return invalidArgumentError("paged_attention: too many rows x heads");
  const dim3 grid(static_cast<unsigned>(rowBlocks), static_cast<unsigned>(splits));
  return cuda::launch("paged_attention (mma decode)", mmaDecodeKernel<T, kCache>, grid, kWarps * 32,
                      0, stream, p, static_cast<int>(splits), 1, flashMinRows,
                      std::max(minPartition(), kWarps * kMmaDecodeKeys), earlyKeysOn());
}

template <typename T, KvCacheDType kCache>
Status launchSplit(const PagedAttentionParams& p, cudaStream_t stream, int flashMinRows = 0) {
  // With (rows x heads) blocks too few to keep eight per SM busy (decode is bound by the loads
  // in flight), every row's keys are split among about enough blocks to reach that, each of
  // at least kMinPartition keys (splitKernel sizes a row's parts from its own keys, so a decode
  // graph, whose maxContext is the model's whole context, runs no empty blocks but those past a
  // row's last part, which return at once). The shape (heads per block, splits) is chosen from the
  // sequences, not the rows: a sequence's few rows (speculative decoding's verification, 1 +
  // speculate rows) are then computed exactly as one decode row of it is, and verified tokens keep
  // plain decoding's logits bit for bit. Nor does it depend on maxContext (a graph's is the model's
  // whole context); a graph's padded sequence count can still choose other splits than an eager
  // call of fewer sequences (below half the target, and across the partial second wave's edges).
  const int64_t target = 8 * static_cast<int64_t>(multiprocessorCount());
  const int64_t group = p.numHeads / p.numKvHeads;
  // (Up to 8 rows a sequence; longer chunks keep sizing by rows, as splits help them little.)
  const bool bySeqs = p.numSeqs > 0 && p.maxNewRows <= 8;
  const int64_t seqs = bySeqs ? std::min(p.numSeqs, p.rows) : p.rows;
  // The 8-lane groups load 8 cache elements at once: both caches aligned to that (every layer's
  // cache is an allocation of its own; a view at another offset takes the scalar loads).
  const auto alignedTo = [](const void* ptr, size_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  const size_t vecBytes = 8 * sizeof(typename CacheOf<T, kCache>::Elem);
  const bool vec = alignedTo(p.kCache, vecBytes) && alignedTo(p.vCache, vecBytes);
  // Groups of 1 to 8 heads of 128, a cache of T or fp8 codes, no bias, at least 8 KV heads' blocks
  // before any split: the tensor-core decode kernel. Fewer (a KV head or two of one sequence:
  // batch-1 decode of a TP=8 shard) split the keys too finely for its 16 keys a warp (H200, 8 over
  // 1, one sequence of 2048 keys: 21.2 µs against 10.6 on the CUDA cores). The kernel, not only the
  // splits, then depends on the sequence count: a graph padded past 8 blocks and an eager call of
  // fewer sequences compute with other arithmetic (their low bits differ), as the heads per block
  // above already could.
  if constexpr (sizeof(T) == 2) {
    if (vec && alignedTo(p.kCache, 16) && alignedTo(p.vCache, 16) && p.headDim == 128 &&
        group >= 1 && group <= 8 && seqs * p.numKvHeads >= mmaDecodeMinBlocks() && !p.alibiSlopes &&
        !p.relativeBias && mmaDecodeOn() && alignedTo(p.q, 16) && p.qRowStride % 8 == 0)
      return launchMmaDecode<T, kCache>(p, stream, flashMinRows, seqs);
  }
  const bool fourHeads =
      vec && !p.alibiSlopes && !p.relativeBias && gqa4On() && kFourHeads<T, kCache, Bias::kNone>;
  const int heads = headsPerBlock(group, p.headDim, seqs * p.numHeads, target, fourHeads);
  const int64_t tilesPerKv = (group + heads - 1) / heads;
  const int64_t blocks = seqs * p.numKvHeads * tilesPerKv;
  // Split only under half the target, into about the target's blocks: at 32 sequences of 256
  // keys (1024 blocks on an H100) splitting them in three cost more in merges than it gained
  // (7.74 -> 8.11 ms a Llama-2-7B step), and aiming at twice the target gained nothing measurable
  // on the split kernel of few rows (two or more sequences now aim at twice it on another, below).
  int64_t splits =
      blocks * 100 >= target * splitBelowPercent() ? 1 : (target + blocks - 1) / blocks;
  // Blocks past one wave of the target, up to one and a half (heads of 128, one a block): the
  // second wave's few blocks, each walking a whole context alone, took about as long as the first
  // wave (H100, Llama-2-7B shape, 512-token prompts: 32 sequences decoded in 8.9-9.0 ms a step,
  // 36 in 10.7-10.75). Keys split in two on the same pipelined kernel make every block half as
  // long: 36 sequences 10.17-10.21 ms, 40 10.41-10.45 (10.86-10.90), 48 10.88-10.99
  // (11.20-11.23). Past 1.5 waves (64 sequences, 1.94) it cost more than it gained (12.29 ->
  // 12.73), and the split kernel of few rows was slower than no split at all (36: 12.0 ms).
  // Only on the kernel it was measured with (the 16-lane pipelined one, also the 4-head tiles').
  const bool pipeKernel =
      p.headDim == 128 && vec && ((heads == 1 && lanes16On() && pipeOn()) || heads == 4);
  const bool tail =
      splits == 1 && blocks > target && 2 * blocks <= 3 * target && pipeKernel && tailSplitOn();
  if (tail) splits = 2;
  // Two or more sequences under half the target (2 to 16 of 32 heads on an H100, 2 to 32 of
  // TP=2's 16; measured at the former only): the pipelined kernel too, its keys split into about
  // twice the target's blocks. The split kernel of few rows keeps one sequence (batch-1 decode, and
  // speculation's verification of one sequence), whose first keys it loads before the wait. H100,
  // Llama-2-7B shape, 512-token prompts, 64 steps, ms a step, few-rows kernel -> pipelined: 2
  // sequences 6.06 -> 5.97-5.99, 4: 6.42 -> 6.27, 8: 7.12-7.14 -> 6.73-6.78, 12: 7.77-7.80 -> 7.16,
  // 16: 8.48-8.51 -> 7.54-7.55 (into the target's blocks rather than twice: 12 took 7.37-7.41,
  // 16 7.67-7.72). Splitting 17-32 sequences (unsplit blocks in [0.5, 1) of the target) the same
  // way lost up to 4% from 24 on (24: 8.48-8.52 -> 8.75), though 20 gained 3% at two waves.
  // Sequences counted as sequences only (up to 8 rows each): one sequence of 9-15 rows (a short
  // prompt chunk) keeps the kernel of few rows. TEXTGEN_ATTN_FEW_PIPE=0 keeps the split kernel of
  // few rows (for comparison).
  const bool fewPipe = splits > 1 && bySeqs && seqs >= 2 && pipeKernel && fewPipeOn();
  if (fewPipe) splits = (2 * target + blocks - 1) / blocks;
  splits = splitsTheWorkspaceHolds(p, splits);
  const int64_t rowBlocks = p.rows * p.numKvHeads * tilesPerKv;
  if (rowBlocks > INT32_MAX) return invalidArgumentError("paged_attention: too many rows x heads");
  const dim3 grid(static_cast<unsigned>(rowBlocks), static_cast<unsigned>(splits));
  const int s = static_cast<int>(splits);
  const bool split = splits > 1;
  const bool pipelined = tail || fewPipe;
  const SplitKernel kernel =
      p.alibiSlopes
          ? splitKernelFor<T, kCache, Bias::kAlibi>(p.headDim, heads, vec, split, pipelined)
      : p.relativeBias
          ? splitKernelFor<T, kCache, Bias::kRelative>(p.headDim, heads, vec, split, pipelined)
          : splitKernelFor<T, kCache, Bias::kNone>(p.headDim, heads, vec, split, pipelined);
  if (!kernel) return internalError("paged_attention: no split kernel for tiles of 4 heads");
  return cuda::launch("paged_attention (split)", kernel, grid, kWarps * 32, 0, stream, p, s,
                      static_cast<int>(tilesPerKv), flashMinRows, minPartition(), earlyKeysOn());
}

// ---- Tensor-core prefill ----

constexpr int kTileRows = 64, kTileKeys = 64;
constexpr int kMaxFlashSplits = 32;  // key splits of a tensor-core tile (flashSplits)

template <typename T, int kD>
struct FlashSmem {
  static constexpr int kDp = kD + 8;         // row pitch of Q, K, V (elements of T)
  static constexpr int kSp = kTileKeys + 4;  // S (float)
  static constexpr int kPp = kTileKeys + 8;  // P (T)
  static constexpr int kOp = kD + 4;         // O (float)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(T) * kTileRows * kDp;
  static constexpr size_t kV = kK + sizeof(T) * kTileKeys * kDp;
  static constexpr size_t kS = kV + sizeof(T) * kTileKeys * kDp;
  static constexpr size_t kP = kS + sizeof(float) * kTileRows * kSp;
  static constexpr size_t kO = kP + sizeof(T) * kTileRows * kPp;
  static constexpr size_t kStats = kO + sizeof(float) * kTileRows * kOp;  // m, l, alpha per row
  static constexpr size_t kSlots = kStats + sizeof(float) * 3 * kTileRows;
  // T5: the relative bias of a key tile's relative positions, [kTileRows + kTileKeys - 1].
  static constexpr size_t kBias = kSlots + sizeof(int64_t) * kTileKeys;
  static constexpr size_t kBytes = kBias + sizeof(float) * (kTileRows + kTileKeys);
  static_assert(kSp >= 2 * kMaxFlashSplits && kO % 16 == 0 && kOp % 4 == 0,
                "S holds the merge's scratch; O rows are read as float4");
};

// The end of a tensor-core tile: its unnormalised output O (float rows oPitch apart in shared
// memory, 16-byte aligned, oPitch a multiple of 4) and each row's max (sM) and sum (sL) become the
// tile's output rows (one split), or this split's partials in the workspace, the last split of the
// (tile, head) to finish merging them all. sW: 2 * kMaxFlashSplits * kTileRows floats of shared
// scratch; sL is overwritten by the merge.
//
// The merge reads every split's partials from L2, one block per (tile, head): its loads are
// issued many at a time (each split's stats by every thread at once, then four splits' float4s of
// O a thread), not one dependent load after another. With the loads serial it took about as long
// as the splits' own walks over 2k keys (64 rows, 9 splits).
template <typename T, int kD>
__device__ void flashFinish(const PagedAttentionParams& p, const float* sO, int oPitch,
                            const float* sM, float* sL, float* sW, int rowBegin, int numRows,
                            int head, int numSplits) {
  static_assert(kD % 4 == 0);
  using C = Convert<T>;
  T* out = static_cast<T*>(p.out);
  constexpr int kQuads = kD / 4;
  if (numSplits == 1) {
    for (int i = threadIdx.x; i < numRows * kD; i += blockDim.x) {
      const int r = i / kD, d = i % kD;
      const float l = sL[r];
      out[(static_cast<int64_t>(rowBegin + r) * p.numHeads + head) * kD + d] =
          C::fromFloat(l > 0.0f ? sO[r * oPitch + d] / l : 0.0f);
    }
    return;
  }
  // Partials of this (tile, head, split): [max per row | sum per row | unnormalised O per row]
  // (a multiple of 4 floats, and the workspace 16-byte aligned: flashSplits checks).
  constexpr int kPartial = kTileRows * (kD + 2);
  static_assert(kPartial % 4 == 0 && (2 * kTileRows) % 4 == 0);
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * p.numHeads + head;
  float* partials = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kCounterBytes) +
                    unit * numSplits * kPartial;
  float* mine = partials + static_cast<int64_t>(blockIdx.z) * kPartial;
  for (int r = threadIdx.x; r < numRows; r += blockDim.x) {
    mine[r] = sM[r];
    mine[kTileRows + r] = sL[r];
  }
  float4* mineO = reinterpret_cast<float4*>(mine + 2 * kTileRows);
  for (int q = threadIdx.x; q < numRows * kQuads; q += blockDim.x)
    mineO[q] = *reinterpret_cast<const float4*>(sO + (q / kQuads) * oPitch + q % kQuads * 4);
  // The last split of this (tile, head) to finish merges them all, then resets the counter.
  __threadfence();
  __syncthreads();
  __shared__ bool isLast;
  unsigned int* counter = static_cast<unsigned int*>(p.workspace) + unit;
  if (threadIdx.x == 0) isLast = atomicAdd(counter, 1u) == static_cast<unsigned>(numSplits - 1);
  __syncthreads();
  if (!isLast) return;
  __threadfence();
  // Every split's max and sum per row ([split][row]), then each split's weight per row,
  // exp(m_split - m_max), in place of its max.
  float* sMaxW = sW;
  float* sSum = sW + kMaxFlashSplits * kTileRows;
  for (int i = threadIdx.x; i < numSplits * kTileRows; i += blockDim.x) {
    const int sp = i / kTileRows, r = i % kTileRows;
    if (r >= numRows) continue;
    sMaxW[i] = __ldcg(partials + sp * kPartial + r);
    sSum[i] = __ldcg(partials + sp * kPartial + kTileRows + r);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < numRows; r += blockDim.x) {
    float mMax = -INFINITY;
    for (int sp = 0; sp < numSplits; ++sp) mMax = fmaxf(mMax, sMaxW[sp * kTileRows + r]);
    float lSum = 0.0f;
    for (int sp = 0; sp < numSplits; ++sp) {
      const float m = sMaxW[sp * kTileRows + r];
      const float w = m == -INFINITY ? 0.0f : __expf(m - mMax);
      sMaxW[sp * kTileRows + r] = w;
      lSum += w * sSum[sp * kTileRows + r];
    }
    sL[r] = lSum;
  }
  __syncthreads();
  // O, four elements a thread at a time: sums in split order, as one split after another.
  const float4* all = reinterpret_cast<const float4*>(partials + 2 * kTileRows);
  constexpr int kPartialQuads = kPartial / 4;
  const auto add = [](float4& o, float w, const float4& v) {
    if (w == 0.0f) return;
    o.x += w * v.x;
    o.y += w * v.y;
    o.z += w * v.z;
    o.w += w * v.w;
  };
  for (int q = threadIdx.x; q < numRows * kQuads; q += blockDim.x) {
    const int r = q / kQuads;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int sp = 0;
    for (; sp + 4 <= numSplits; sp += 4) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcg(all + (sp + u) * kPartialQuads + q);
#pragma unroll
      for (int u = 0; u < 4; ++u) add(o, sMaxW[(sp + u) * kTileRows + r], v[u]);
    }
    for (; sp < numSplits; ++sp)
      add(o, sMaxW[sp * kTileRows + r], __ldcg(all + sp * kPartialQuads + q));
    const float l = sL[r];
    T* dst = out + (static_cast<int64_t>(rowBegin + r) * p.numHeads + head) * kD + q % kQuads * 4;
    dst[0] = C::fromFloat(l > 0.0f ? o.x / l : 0.0f);
    dst[1] = C::fromFloat(l > 0.0f ? o.y / l : 0.0f);
    dst[2] = C::fromFloat(l > 0.0f ? o.z / l : 0.0f);
    dst[3] = C::fromFloat(l > 0.0f ? o.w / l : 0.0f);
  }
  if (threadIdx.x == 0) *counter = 0;
}

// With numSplits > 1 (a grid of (tiles, heads) under a wave, over a long context: a prompt's tail
// after a cached prefix) each tile's keys are shared among numSplits blocks (blockIdx.z), each
// walking its own run of key tiles; they leave (max, sum, unnormalised output) per row in the
// workspace, and the last to finish merges them, as splitKernel does for decode rows.
template <typename T, KvCacheDType kCache, int kD, Bias kBias>
__global__ void __launch_bounds__(kWarps * 32)
    flashKernel(PagedAttentionParams p, int tilesPerSeq, int numSplits, int minRows) {
  namespace wmma = nvcuda::wmma;
  using L = FlashSmem<T, kD>;
  using C = Convert<T>;
  using K = CacheOf<T, kCache>;
  using E = typename K::Elem;
  using V8 = cuda::Vec<T, 8>;
  using E8 = cuda::Vec<E, 8>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sK = reinterpret_cast<T*>(smem + L::kK);
  T* sV = reinterpret_cast<T*>(smem + L::kV);
  float* sS = reinterpret_cast<float*>(smem + L::kS);
  T* sP = reinterpret_cast<T*>(smem + L::kP);
  float* sO = reinterpret_cast<float*>(smem + L::kO);
  float* sM = reinterpret_cast<float*>(smem + L::kStats);
  float* sL = sM + kTileRows;
  float* sAlpha = sL + kTileRows;
  int64_t* sSlot = reinterpret_cast<int64_t*>(smem + L::kSlots);
  float* sBias = reinterpret_cast<float*>(smem + L::kBias);
  cuda::waitForPrimary();
  cuda::allowDependents();

  const int s = blockIdx.x / tilesPerSeq, tile = blockIdx.x % tilesPerSeq, head = blockIdx.y;
  const int seqRows = p.seqStarts[s + 1] - p.seqStarts[s];
  if (seqRows < minRows) return;  // a mixed batch's decode rows: the split-K kernel's
  const int rowBegin = p.seqStarts[s] + tile * kTileRows;
  const int numRows = min(kTileRows, seqRows - tile * kTileRows);
  if (numRows <= 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int firstPos = p.startPos[s] + tile * kTileRows, lastPos = firstPos + numRows - 1;
  // The last key any row of the tile sees: its own position (causal), or the sequence's last
  // (T5's encoder: every row sees the whole sequence).
  const int keyLast = p.causal ? lastPos : p.startPos[s] + seqRows - 1;
  const int window = static_cast<int>(p.slidingWindow);
  const int kvBegin = window > 0 ? max(0, firstPos - window + 1) : 0;
  const int kvh = head / static_cast<int>(p.numHeads / p.numKvHeads);
  const int32_t* blocks = p.blockTables + s * p.maxBlocksPerSeq;
  const int64_t kvWidth = p.numKvHeads * kD;
  float slope = 0.0f;
  if constexpr (kBias == Bias::kAlibi) slope = p.alibiSlopes[head];
  constexpr int kVecsPerRow = kD / 8;

  // Q tile (rows past the sequence are zero), O = 0, statistics reset.
  for (int i = threadIdx.x; i < kTileRows * kVecsPerRow; i += blockDim.x) {
    const int r = i / kVecsPerRow, c = i % kVecsPerRow;
    V8 v{};
    if (r < numRows) {
      v = reinterpret_cast<const V8*>(static_cast<const T*>(p.q) + (rowBegin + r) * p.qRowStride +
                                      head * kD)[c];
    }
    reinterpret_cast<V8*>(sQ + r * L::kDp)[c] = v;
  }
  for (int i = threadIdx.x; i < kTileRows * L::kOp; i += blockDim.x) sO[i] = 0.0f;
  for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
    sM[i] = -INFINITY;
    sL[i] = 0.0f;
  }
  __syncthreads();

  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qFrag[kD / 16];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wmma::load_matrix_sync(qFrag[kk], sQ + warp * 16 * L::kDp + kk * 16, L::kDp);

  // This block's run of key tiles: an even share of the tile's own range.
  const int kvTile0 = kvBegin / kTileKeys, kvTiles = keyLast / kTileKeys + 1 - kvTile0;
  const int perSplit = (kvTiles + numSplits - 1) / numSplits;
  const int myFirst = kvTile0 + static_cast<int>(blockIdx.z) * perSplit;
  const int myEnd = min(kvTile0 + kvTiles, myFirst + perSplit);
  for (int kvStart = myFirst * kTileKeys; kvStart < myEnd * kTileKeys; kvStart += kTileKeys) {
    for (int c = threadIdx.x; c < kTileKeys; c += blockDim.x) {
      const int j = kvStart + c;
      sSlot[c] =
          j >= kvBegin && j <= keyLast ? slotOf(blocks, static_cast<int>(p.blockSize), j) : -1;
    }
    if constexpr (kBias == Bias::kRelative) {
      // Entry i: relative position (key - query) kvStart - (firstPos + kTileRows - 1) + i, which
      // row r and column c of the tile read at i = c + kTileRows - 1 - r.
      const int relFirst = kvStart - (firstPos + kTileRows - 1);
      for (int i = threadIdx.x; i < kTileRows + kTileKeys - 1; i += blockDim.x) {
        const int bucket = relativePositionBucketInline(relFirst + i, p.relativeBidirectional,
                                                        p.relativeBuckets, p.relativeMaxDistance);
        sBias[i] = __ldg(p.relativeBias + static_cast<int64_t>(bucket) * p.numHeads + head);
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTileKeys * kVecsPerRow; i += blockDim.x) {
      const int c = i / kVecsPerRow, v = i % kVecsPerRow;
      const int64_t slot = sSlot[c];
      E8 ke{}, ve{};
      if (slot >= 0) {
        ke = reinterpret_cast<const E8*>(static_cast<const E*>(p.kCache) + slot * kvWidth +
                                         kvh * kD)[v];
        ve = reinterpret_cast<const E8*>(static_cast<const E*>(p.vCache) + slot * kvWidth +
                                         kvh * kD)[v];
      }
      V8 kv, vv;
      if constexpr (kCache == KvCacheDType::kAuto) {
        kv = ke;
        vv = ve;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {  // fp8 -> float -> T: exact (kv_cache.cuh)
          kv.v[e] = C::fromFloat(K::toFloat(ke.v[e]));
          vv.v[e] = C::fromFloat(K::toFloat(ve.v[e]));
        }
      }
      reinterpret_cast<V8*>(sK + c * L::kDp)[v] = kv;
      reinterpret_cast<V8*>(sV + c * L::kDp)[v] = vv;
    }
    __syncthreads();

    // S = Q·Kᵀ for this warp's 16 rows.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sFrag[kTileKeys / 16];
#pragma unroll
      for (int n = 0; n < kTileKeys / 16; ++n) wmma::fill_fragment(sFrag[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
        for (int n = 0; n < kTileKeys / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kFrag;
          wmma::load_matrix_sync(kFrag, sK + n * 16 * L::kDp + kk * 16, L::kDp);
          wmma::mma_sync(sFrag[n], qFrag[kk], kFrag, sFrag[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kTileKeys / 16; ++n) {
        wmma::store_matrix_sync(sS + warp * 16 * L::kSp + n * 16, sFrag[n], L::kSp,
                                wmma::mem_row_major);
      }
    }
    __syncwarp();

    // Online softmax: two lanes per row, 32 keys each.
    {
      const int r = warp * 16 + lane / 2, half = lane % 2;
      const int pos = firstPos + r;
      const int lo = window > 0 ? max(0, pos - window + 1) : 0;
      float rowMax = -INFINITY;
      float sc[kTileKeys / 2];
#pragma unroll
      for (int c = 0; c < kTileKeys / 2; ++c) {
        const int col = half * (kTileKeys / 2) + c, j = kvStart + col;
        const bool valid = r < numRows && j >= lo && j <= (p.causal ? pos : keyLast);
        float v = sS[r * L::kSp + col] * p.scale;
        if constexpr (kBias == Bias::kAlibi) v += alibiBias(slope, j, pos, p.alibiBf16Divisor);
        if constexpr (kBias == Bias::kRelative) v += sBias[col + kTileRows - 1 - r];
        sc[c] = valid ? v : -INFINITY;
        rowMax = fmaxf(rowMax, sc[c]);
      }
      rowMax = fmaxf(rowMax, __shfl_xor_sync(0xffffffffu, rowMax, 1));
      const float mOld = sM[r];
      const float mNew = fmaxf(mOld, rowMax);
      const float mUse = mNew == -INFINITY ? 0.0f : mNew;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kTileKeys / 2; ++c) {
        const float e = __expf(sc[c] - mUse);
        sum += e;
        sP[r * L::kPp + half * (kTileKeys / 2) + c] = C::fromFloat(e);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      __syncwarp();
      if (half == 0) {
        const float alpha = mOld == -INFINITY ? 0.0f : __expf(mOld - mUse);
        sAlpha[r] = alpha;
        sL[r] = sL[r] * alpha + sum;
        sM[r] = mNew;
      }
    }
    __syncwarp();
    for (int i = lane; i < 16 * kD; i += 32) {
      const int r = warp * 16 + i / kD;
      sO[r * L::kOp + i % kD] *= sAlpha[r];
    }
    __syncwarp();

    // O += P·V.
    {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pFrag[kTileKeys / 16];
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk)
        wmma::load_matrix_sync(pFrag[kk], sP + warp * 16 * L::kPp + kk * 16, L::kPp);
#pragma unroll
      for (int n = 0; n < kD / 16; ++n) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> oFrag;
        float* oTile = sO + warp * 16 * L::kOp + n * 16;
        wmma::load_matrix_sync(oFrag, oTile, L::kOp, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < kTileKeys / 16; ++kk) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vFrag;
          wmma::load_matrix_sync(vFrag, sV + kk * 16 * L::kDp + n * 16, L::kDp);
          wmma::mma_sync(oFrag, pFrag[kk], vFrag, oFrag);
        }
        wmma::store_matrix_sync(oTile, oFrag, L::kOp, wmma::mem_row_major);
      }
    }
    __syncthreads();  // every warp is done with sK and sV
  }

  flashFinish<T, kD>(p, sO, L::kOp, sM, sL, sS, rowBegin, numRows, head, numSplits);
}

// The tensor-core kernel of the common case (a cache of T or fp8 codes, no bias) in
// flash-attention-2's form: each warp keeps its 16 query rows' Q fragments, scores, probabilities
// and output accumulators in registers (mma.sync m16n8k16; the scores' accumulator fragments are
// the probabilities' A fragments once rounded to T), and the block's K and V tiles come in two
// shared-memory stages by cp.async, the next tile's loads in flight while this one is multiplied.
// The tiling, the splits and their partials are flashKernel's, and so is P rounded to T for P·V
// (the sums of its unrounded terms). kFold (a positive scale, the default) computes each
// probability as one fma and one exp2 against the raw maximum, so its exponents differ from
// flashKernel's by an ulp or two, and the row maximum it writes for the merge (m · scale) can
// differ from the one its sums are relative to (m · (scale log2 e), rounded) by a few roundings of
// |m · scale|: below bf16's and fp16's resolution unless scaled logits reach thousands. Without
// kFold only the order of some float sums differs from flashKernel. Blocks take their sequence's
// tiles from the last (a causal prompt's heaviest: the most keys) to the first.
template <typename T, KvCacheDType kCache, int kD>
struct MmaFlashSmem {
  // Row pitch (elements) of Q, K and V: 16 bytes past a multiple of 128, so that the eight rows an
  // ldmatrix reads fall in distinct bank groups.
  static constexpr int kPitch = kD + 8;
  static constexpr int kTileElems = kTileKeys * kPitch;  // one K or V tile
  // An fp8 cache's tiles land as codes (two stages of K and V, kD bytes a key) and are widened
  // into one stage of T before their products; a 16-bit cache's land in two stages of T.
  static constexpr bool kFp8 = kCache != KvCacheDType::kAuto;
  static constexpr size_t kQ = 0;
  static constexpr size_t kKv = kQ + sizeof(T) * kTileRows * kPitch;  // [stage][K, V]
  static constexpr size_t kRaw = kKv + sizeof(T) * (kFp8 ? 2 : 4) * kTileElems;
  static constexpr size_t kStats = kRaw + (kFp8 ? 4 * kTileKeys * kD : 0);  // m, l per row
  static constexpr size_t kBytes = kStats + sizeof(float) * 2 * kTileRows;
  // After the last tile the stages hold O (float rows kOPitch apart), then the merge's weights.
  static constexpr int kOPitch = kD + 4;
  static constexpr size_t kO = kKv;
  static constexpr size_t kW = kO + sizeof(float) * kTileRows * kOPitch;
  static_assert(kW + sizeof(float) * 2 * kMaxFlashSplits * kTileRows <= kStats,
                "the merge's scratch for kMaxFlashSplits splits");
  static_assert(kRaw % 16 == 0 && kStats % 16 == 0);
};

// 2^x (PTX ex2.approx, as __expf computes e^x = 2^(x log2 e)).
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T, KvCacheDType kCache, int kD, bool kFold>
__global__ void __launch_bounds__(kWarps * 32, 2)
    mmaFlashKernel(PagedAttentionParams p, int tilesPerSeq, int numSplits, int minRows,
                   FastDivisor blockDiv) {
  using L = MmaFlashSmem<T, kCache, kD>;
  using E = typename CacheOf<T, kCache>::Elem;
  static_assert(kWarps * 16 == kTileRows && kTileKeys == 64 && kD % 16 == 0);
  constexpr bool kFp8 = L::kFp8;
  constexpr int kQChunks = kD / 8;              // 16-byte chunks of a row of Q
  constexpr int kChunks = kD * sizeof(E) / 16;  // and of a key or value in the cache
  constexpr int kChunkElems = 16 / sizeof(E);
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);
  T* sKv = reinterpret_cast<T*>(smem + L::kKv);
  E* sRaw = reinterpret_cast<E*>(smem + L::kRaw);  // an fp8 cache's codes, [stage][K, V][key][kD]
  float* sM = reinterpret_cast<float*>(smem + L::kStats);
  float* sL = sM + kTileRows;
  cuda::waitForPrimary();
  cuda::allowDependents();

  const int s = blockIdx.x / tilesPerSeq, head = blockIdx.y;
  const int tile = tilesPerSeq - 1 - static_cast<int>(blockIdx.x) % tilesPerSeq;
  const int seqRows = p.seqStarts[s + 1] - p.seqStarts[s];
  if (seqRows < minRows) return;  // a mixed batch's decode rows: the split-K kernel's
  const int rowBegin = p.seqStarts[s] + tile * kTileRows;
  const int numRows = min(kTileRows, seqRows - tile * kTileRows);
  if (numRows <= 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int firstPos = p.startPos[s] + tile * kTileRows, lastPos = firstPos + numRows - 1;
  const int keyLast = p.causal ? lastPos : p.startPos[s] + seqRows - 1;
  const int window = static_cast<int>(p.slidingWindow);
  const int kvBegin = window > 0 ? max(0, firstPos - window + 1) : 0;
  const int kvh = head / static_cast<int>(p.numHeads / p.numKvHeads);
  const int32_t* blocks = p.blockTables + s * p.maxBlocksPerSeq;
  const int64_t kvWidth = p.numKvHeads * kD;
  const E* kBase = static_cast<const E*>(p.kCache) + kvh * kD;
  const E* vBase = static_cast<const E*>(p.vCache) + kvh * kD;

  // Q (rows past the sequence zero), then the first K/V tile: two groups of copies.
  for (int i = threadIdx.x; i < kTileRows * kQChunks; i += blockDim.x) {
    const int r = i / kQChunks, c = i % kQChunks;
    const T* src = static_cast<const T*>(p.q) + (rowBegin + min(r, numRows - 1)) * p.qRowStride +
                   head * kD + c * 8;
    cuda::cpAsync16(sQ + r * L::kPitch + c * 8, src, r < numRows);
  }
  cuda::cpAsyncCommit();
  // A thread copies chunk myChunk of keys myKey, myKey + kKeyStep, ... of every K/V tile. The
  // cache blocks holding them are read one tile ahead of the copies (fetchPages), so that no
  // block-table load sits between two tiles' arithmetic: with the lookup, a division and the
  // copies in one rolled loop, the loads of each tile waited on eight dependent block-table reads
  // (H200, 512 rows after 512: the loader was 40% of the kernel's instructions).
  constexpr int kThreads = kWarps * 32;
  static_assert(kThreads % kChunks == 0 && kTileKeys % (kThreads / kChunks) == 0);
  constexpr int kKeyStep = kThreads / kChunks, kPasses = kTileKeys / kKeyStep;
  const int myChunk = static_cast<int>(threadIdx.x) % kChunks;
  const int myKey = static_cast<int>(threadIdx.x) / kChunks;
  const int blockSize = static_cast<int>(p.blockSize);
  // For each of the thread's keys of a tile: its cache block (-1: no row of the tile sees the key)
  // and its place in the block. The division is done here, a tile ahead, once a key; loadKv's
  // offsets are then one multiply-add each (32-bit slot x row bytes into a 64-bit address). With
  // the division and 64-bit index arithmetic in loadKv, loading took 386 of a tile's 948
  // instructions a warp; it takes 253 of 816 now (sm_90a SASS, heads of 128), though the time
  // changed by 2% at most (H200).
  int32_t pages[kPasses], rems[kPasses];
  const auto fetchPages = [&](int kvStart) {
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int j = kvStart + myKey + it * kKeyStep;
      const uint32_t q = fastDivide(static_cast<uint32_t>(j), blockDiv);
      rems[it] = j - static_cast<int>(q) * blockSize;
      pages[it] = j >= kvBegin && j <= keyLast ? blocks[q] : -1;
    }
  };
  // This thread's chunk of a key's row, as bytes, and a row's bytes (one slot of every KV head).
  const char* kChunk = reinterpret_cast<const char*>(kBase + myChunk * kChunkElems);
  const char* vChunk = reinterpret_cast<const char*>(vBase + myChunk * kChunkElems);
  const uint32_t rowBytes = static_cast<uint32_t>(kvWidth * sizeof(E));
  // Keys outside [kvBegin, keyLast] (no row of the tile sees them) are zeros.
  const auto loadKv = [&](int stage) {
    // Destination rows: T rows kPitch apart in a stage, or an fp8 stage's rows of kD codes.
    E* sK = kFp8 ? sRaw + stage * 2 * kTileKeys * kD
                 : reinterpret_cast<E*>(sKv + stage * 2 * L::kTileElems);
    E* sV = sK + (kFp8 ? kTileKeys * kD : L::kTileElems);
    constexpr int kRowPitch = kFp8 ? kD : L::kPitch;
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int c = myKey + it * kKeyStep;
      const bool ok = pages[it] >= 0;
      const uint32_t slot =
          ok ? static_cast<uint32_t>(pages[it]) * static_cast<uint32_t>(blockSize) +
                   static_cast<uint32_t>(rems[it])
             : 0u;
      const uint64_t at = static_cast<uint64_t>(slot) * rowBytes;
      cuda::cpAsync16(sK + c * kRowPitch + myChunk * kChunkElems, kChunk + at, ok);
      cuda::cpAsync16(sV + c * kRowPitch + myChunk * kChunkElems, vChunk + at, ok);
    }
  };
  // An fp8 stage's codes widened (exactly) into the T stage the products read: each 16 codes of
  // K or V become two 16-byte rows' worth of T. Zero codes (keys no row sees) stay zeros.
  const auto widenStage = [&](int stage) {
    if constexpr (kFp8) {
      const E* raw = sRaw + stage * 2 * kTileKeys * kD;
      for (int i = threadIdx.x; i < 2 * kTileKeys * kChunks; i += kThreads) {
        const int kv = i / (kTileKeys * kChunks), c = i / kChunks % kTileKeys, ch = i % kChunks;
        const uint4 codes =
            *reinterpret_cast<const uint4*>(raw + (kv * kTileKeys + c) * kD + ch * 16);
        uint4 lo, hi;
        lo.x = widenFp8Pair<T, kCache>(codes.x);
        lo.y = widenFp8Pair<T, kCache>(codes.x >> 16);
        lo.z = widenFp8Pair<T, kCache>(codes.y);
        lo.w = widenFp8Pair<T, kCache>(codes.y >> 16);
        hi.x = widenFp8Pair<T, kCache>(codes.z);
        hi.y = widenFp8Pair<T, kCache>(codes.z >> 16);
        hi.z = widenFp8Pair<T, kCache>(codes.w);
        hi.w = widenFp8Pair<T, kCache>(codes.w >> 16);
        uint4* dst = reinterpret_cast<uint4*>(sKv + kv * L::kTileElems + c * L::kPitch + ch * 16);
        dst[0] = lo;
        dst[1] = hi;
      }
    } else {
      (void)stage;
    }
  };
  // This block's run of key tiles: an even share of the tile's own range.
  const int kvTile0 = kvBegin / kTileKeys, kvTiles = keyLast / kTileKeys + 1 - kvTile0;
  const int perSplit = (kvTiles + numSplits - 1) / numSplits;
  const int myFirst = kvTile0 + static_cast<int>(blockIdx.z) * perSplit;
  const int myEnd = min(kvTile0 + kvTiles, myFirst + perSplit);
  if (myFirst < myEnd) {
    fetchPages(myFirst * kTileKeys);
    loadKv(0);
  }
  cuda::cpAsyncCommit();
  if (myFirst + 1 < myEnd) fetchPages((myFirst + 1) * kTileKeys);
  cuda::cpAsyncWait<1>();
  __syncthreads();
  uint32_t qf[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    cuda::ldmatrixX4(qf[kk], sQ + (warp * 16 + lane % 16) * L::kPitch + kk * 16 + lane / 16 * 8);

  // This thread's rows: a = warp * 16 + lane / 4 and b = a + 8; its columns of an n8 block
  // 2 (lane % 4) and the next. The keys each row sees: [lo, hi].
  const int quad = lane % 4;
  const int posA = firstPos + warp * 16 + lane / 4, posB = posA + 8;
  const int hiA = p.causal ? posA : keyLast, hiB = p.causal ? posB : keyLast;
  const int loA = window > 0 ? max(0, posA - window + 1) : 0;
  const int loB = window > 0 ? max(0, posB - window + 1) : 0;
  // Keys every row of the warp sees: tiles inside need no mask.
  const int warpPos = firstPos + warp * 16;
  const int warpLo = window > 0 ? max(0, warpPos + 15 - window + 1) : 0;
  const int warpHi = p.causal ? warpPos : keyLast;
  float o[kD / 8][4] = {};
  // kFold: mA and mB are maxima of the raw products q·k (scaled when written out).
  float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;
  const float log2Scale = p.scale * 1.44269504088896341f;
  int stage = 0;
  for (int kt = myFirst; kt < myEnd; ++kt, stage ^= 1) {
    const int kvStart = kt * kTileKeys;
    if (kt + 1 < myEnd) loadKv(stage ^ 1);
    cuda::cpAsyncCommit();
    if (kt + 2 < myEnd) fetchPages(kvStart + 2 * kTileKeys);
    cuda::cpAsyncWait<1>();
    __syncthreads();
    if constexpr (kFp8) {
      widenStage(stage);
      __syncthreads();
    }
    const T* sK = sKv + (kFp8 ? 0 : stage * 2 * L::kTileElems);
    const T* sV = sK + L::kTileElems;

    // S = Q·Kᵀ: n8 blocks of keys, two a 16-key ldmatrix.
    float sc[kTileKeys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < kTileKeys / 16; ++nb) {
        uint32_t b[4];
        cuda::ldmatrixX4(
            b, sK + (nb * 16 + lane % 8 + lane / 16 * 8) * L::kPitch + kk * 16 + lane / 8 % 2 * 8);
        cuda::mmaK16<T>(sc[2 * nb], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
        cuda::mmaK16<T>(sc[2 * nb + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
      }
    }

    // Online softmax; a row's four lanes (a quad) hold its 64 scores. kFold (scale > 0): the
    // maxima are taken over the raw products (the same maxima, scaled: rounding is monotonic) and
    // each probability is 2^(s * scale log2 e - m scale log2 e), one fma and one exp2 a score.
    const bool whole = kvStart >= warpLo && kvStart + kTileKeys - 1 <= warpHi;
    float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < kTileKeys / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = kvStart + nb * 8 + 2 * quad + e;
        float va = kFold ? sc[nb][e] : sc[nb][e] * p.scale;
        float vb = kFold ? sc[nb][2 + e] : sc[nb][2 + e] * p.scale;
        if (!whole) {
          if (j < loA || j > hiA) va = -INFINITY;
          if (j < loB || j > hiB) vb = -INFINITY;
        }
        sc[nb][e] = va;
        sc[nb][2 + e] = vb;
        if constexpr (!kFold) {
          mxA = fmaxf(mxA, va);
          mxB = fmaxf(mxB, vb);
        }
      }
    }
    if constexpr (kFold) {  // a tree: four dependent maxima a row instead of sixteen
      float ta[kTileKeys / 8], tb[kTileKeys / 8];
#pragma unroll
      for (int nb = 0; nb < kTileKeys / 8; ++nb) {
        ta[nb] = fmaxf(sc[nb][0], sc[nb][1]);
        tb[nb] = fmaxf(sc[nb][2], sc[nb][3]);
      }
#pragma unroll
      for (int w = kTileKeys / 16; w >= 1; w /= 2) {
#pragma unroll
        for (int i = 0; i < w; ++i) {
          ta[i] = fmaxf(ta[i], ta[i + w]);
          tb[i] = fmaxf(tb[i], tb[i + w]);
        }
      }
      mxA = ta[0];
      mxB = tb[0];
    }
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
      mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, off));
      mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, off));
    }
    const float newA = fmaxf(mA, mxA), newB = fmaxf(mB, mxB);
    float sumA = 0.0f, sumB = 0.0f, alphaA, alphaB;
    if constexpr (kFold) {
      const float useA = newA == -INFINITY ? 0.0f : newA * log2Scale;
      const float useB = newB == -INFINITY ? 0.0f : newB * log2Scale;
      alphaA = mA == -INFINITY ? 0.0f : exp2Approx(fmaf(mA, log2Scale, -useA));
      alphaB = mB == -INFINITY ? 0.0f : exp2Approx(fmaf(mB, log2Scale, -useB));
      float ta[kTileKeys / 8], tb[kTileKeys / 8];
#pragma unroll
      for (int nb = 0; nb < kTileKeys / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[nb][e] = exp2Approx(fmaf(sc[nb][e], log2Scale, -useA));
          sc[nb][2 + e] = exp2Approx(fmaf(sc[nb][2 + e], log2Scale, -useB));
        }
        ta[nb] = sc[nb][0] + sc[nb][1];
        tb[nb] = sc[nb][2] + sc[nb][3];
      }
#pragma unroll
      for (int w = kTileKeys / 16; w >= 1; w /= 2) {  // summed as a tree, as the maxima
#pragma unroll
        for (int i = 0; i < w; ++i) {
          ta[i] += ta[i + w];
          tb[i] += tb[i + w];
        }
      }
      sumA = ta[0];
      sumB = tb[0];
    } else {
      const float useA = newA == -INFINITY ? 0.0f : newA, useB = newB == -INFINITY ? 0.0f : newB;
      alphaA = mA == -INFINITY ? 0.0f : __expf(mA - useA);
      alphaB = mB == -INFINITY ? 0.0f : __expf(mB - useB);
#pragma unroll
      for (int nb = 0; nb < kTileKeys / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[nb][e] = __expf(sc[nb][e] - useA);
          sc[nb][2 + e] = __expf(sc[nb][2 + e] - useB);
          sumA += sc[nb][e];
          sumB += sc[nb][2 + e];
        }
      }
    }
    mA = newA;
    mB = newB;
    lA = lA * alphaA + sumA;
    lB = lB * alphaB + sumB;
#pragma unroll
    for (int nd = 0; nd < kD / 8; ++nd) {
      o[nd][0] *= alphaA;
      o[nd][1] *= alphaA;
      o[nd][2] *= alphaB;
      o[nd][3] *= alphaB;
    }

    // O += P·V: P's A fragments from the score blocks, V's B fragments by transposed ldmatrix.
#pragma unroll
    for (int kc = 0; kc < kTileKeys / 16; ++kc) {
      const uint32_t a0 = cuda::pack2<T>(sc[2 * kc][0], sc[2 * kc][1]);
      const uint32_t a1 = cuda::pack2<T>(sc[2 * kc][2], sc[2 * kc][3]);
      const uint32_t a2 = cuda::pack2<T>(sc[2 * kc + 1][0], sc[2 * kc + 1][1]);
      const uint32_t a3 = cuda::pack2<T>(sc[2 * kc + 1][2], sc[2 * kc + 1][3]);
#pragma unroll
      for (int nd = 0; nd < kD / 16; ++nd) {
        uint32_t b[4];
        cuda::ldmatrixX4<true>(
            b, sV + (kc * 16 + lane % 8 + lane / 8 % 2 * 8) * L::kPitch + nd * 16 + lane / 16 * 8);
        cuda::mmaK16<T>(o[2 * nd], a0, a1, a2, a3, b[0], b[1]);
        cuda::mmaK16<T>(o[2 * nd + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }
  cuda::cpAsyncWait<0>();

  // A row's sum over its quad; O, m and l to shared memory for flashFinish.
#pragma unroll
  for (int off = 1; off < 4; off *= 2) {
    lA += __shfl_xor_sync(0xffffffffu, lA, off);
    lB += __shfl_xor_sync(0xffffffffu, lB, off);
  }
  float* sO = reinterpret_cast<float*>(smem + L::kO);
  const int rA = warp * 16 + lane / 4;
#pragma unroll
  for (int nd = 0; nd < kD / 8; ++nd) {
    const int col = nd * 8 + 2 * quad;
    sO[rA * L::kOPitch + col] = o[nd][0];
    sO[rA * L::kOPitch + col + 1] = o[nd][1];
    sO[(rA + 8) * L::kOPitch + col] = o[nd][2];
    sO[(rA + 8) * L::kOPitch + col + 1] = o[nd][3];
  }
  if (quad == 0) {
    sM[rA] = kFold ? mA * p.scale : mA;
    sM[rA + 8] = kFold ? mB * p.scale : mB;
    sL[rA] = lA;
    sL[rA + 8] = lB;
  }
  __syncthreads();
  flashFinish<T, kD>(p, sO, L::kOPitch, sM, sL, reinterpret_cast<float*>(smem + L::kW), rowBegin,
                     numRows, head, numSplits);
}

// Key splits for the tensor-core kernel: 1 while its (tile, head) blocks fill the device; else as
// many as one wave holds (two blocks an SM; rounding up left a few blocks to a second wave), at
// least two key tiles a split, within the workspace's counters and partials.
int64_t flashSplits(const PagedAttentionParams& p, int64_t units, int64_t headDim) {
  static const bool enabled = [] {
    const char* v = std::getenv("TEXTGEN_FLASH_SPLIT");
    return !(v && std::string_view(v) == "0");
  }();
  const int64_t sms = multiprocessorCount();
  if (!enabled || units >= sms || !p.workspace || p.workspaceBytes <= kCounterBytes ||
      reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0 ||
      units * 4 > static_cast<int64_t>(kCounterBytes))
    return 1;
  // TEXTGEN_FLASH_SPLITS (2 to 32): that many, for comparison.
  static const int64_t forced = [] {
    const char* v = std::getenv("TEXTGEN_FLASH_SPLITS");
    const int n = v ? std::atoi(v) : 0;
    return n >= 2 && n <= 32 ? n : 0;
  }();
  const int64_t kvTiles = (p.maxContext + kTileKeys - 1) / kTileKeys;
  int64_t splits = forced ? forced : std::min<int64_t>(2 * sms / units, kvTiles / 2);
  const int64_t perSplit = units * kTileRows * (headDim + 2) * static_cast<int64_t>(sizeof(float));
  splits =
      std::min<int64_t>(splits, static_cast<int64_t>(p.workspaceBytes - kCounterBytes) / perSplit);
  return std::clamp<int64_t>(splits, 1, kMaxFlashSplits);
}

int foldForTesting = -1, mmaFp8ForTesting = -1;  // setFlashVariantsForTesting

// TEXTGEN_FLASH_FOLD=0: the tensor-core kernel scales scores before the maxima (as flashKernel
// does), for comparison.
bool flashFoldOn() {
  if (foldForTesting >= 0) return foldForTesting != 0;
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_FLASH_FOLD");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// TEXTGEN_FLASH_MMA=0: every prompt tile on flashKernel (WMMA), for comparison.
bool mmaFlashOn() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_FLASH_MMA");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// TEXTGEN_FLASH_MMA_FP8=0: prompts over an fp8 cache on flashKernel (WMMA), for comparison.
bool mmaFlashFp8On() {
  if (mmaFp8ForTesting >= 0) return mmaFp8ForTesting != 0;
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_FLASH_MMA_FP8");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

template <typename T, KvCacheDType kCache, int kD, Bias kBias>
Status launchFlashD(const PagedAttentionParams& p, cudaStream_t stream, int minRows) {
  using L = FlashSmem<T, kD>;
  // The opt-in is a property of the kernel on each device: once per device (tensor-parallel ranks
  // may be threads of one process, one device each).
  static std::atomic<uint64_t> optedIn{0};
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (!(optedIn.load(std::memory_order_acquire) & bit)) {
    const cudaError_t attr = cudaFuncSetAttribute(flashKernel<T, kCache, kD, kBias>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(L::kBytes));
    if (attr != cudaSuccess) {
      return internalError(std::string("paged_attention: shared memory opt-in failed: ") +
                           cudaGetErrorString(attr));
    }
    optedIn.fetch_or(bit, std::memory_order_release);
  }
  const int64_t tilesPerSeq = (p.maxNewRows + kTileRows - 1) / kTileRows;
  const int64_t splits = flashSplits(p, p.numSeqs * tilesPerSeq * p.numHeads, kD);
  const dim3 grid(static_cast<unsigned>(p.numSeqs * tilesPerSeq), static_cast<unsigned>(p.numHeads),
                  static_cast<unsigned>(splits));
  // fp8 caches too: their tiles are widened in shared memory (TEXTGEN_FLASH_MMA_FP8=0 keeps them
  // on flashKernel, for comparison).
  if constexpr (kBias == Bias::kNone) {
    if (mmaFlashOn() && (kCache == KvCacheDType::kAuto || mmaFlashFp8On())) {
      using M = MmaFlashSmem<T, kCache, kD>;
      static std::atomic<uint64_t> mmaOptedIn{0};
      const auto kernel = p.scale > 0.0f && flashFoldOn() ? mmaFlashKernel<T, kCache, kD, true>
                                                          : mmaFlashKernel<T, kCache, kD, false>;
      if (!(mmaOptedIn.load(std::memory_order_acquire) & bit)) {
        for (const auto k :
             {mmaFlashKernel<T, kCache, kD, true>, mmaFlashKernel<T, kCache, kD, false>}) {
          const cudaError_t attr = cudaFuncSetAttribute(
              k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(M::kBytes));
          if (attr != cudaSuccess) {
            return internalError(std::string("paged_attention: shared memory opt-in failed: ") +
                                 cudaGetErrorString(attr));
          }
        }
        mmaOptedIn.fetch_or(bit, std::memory_order_release);
      }
      return cuda::launch("paged_attention (flash mma)", kernel, grid, kWarps * 32, M::kBytes,
                          stream, p, static_cast<int>(tilesPerSeq), static_cast<int>(splits),
                          minRows, makeFastDivisor(static_cast<uint32_t>(p.blockSize)));
    }
  }
  return cuda::launch("paged_attention (flash)", flashKernel<T, kCache, kD, kBias>, grid,
                      kWarps * 32, L::kBytes, stream, p, static_cast<int>(tilesPerSeq),
                      static_cast<int>(splits), minRows);
}

// The tensor-core kernel for sequences of at least kFlashMinRows new rows. In a batch that mixes
// them with shorter ones (decode rows beside a prompt chunk), those take the split-K kernel,
// launched after it: a one-row sequence in a 64-row tile walked its whole context for one row, and
// such mixed steps ran at about half speed.
constexpr int kFlashMinRows = 16;

template <typename T, KvCacheDType kCache>
Status launchFlash(const PagedAttentionParams& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return launchSplit<T, kCache>(p, stream);
  } else {
    const bool mixed = p.minNewRows > 0 && p.minNewRows < kFlashMinRows;
    const int minRows = mixed ? kFlashMinRows : 0;
    auto withBias = [&]<Bias kBias>() -> Status {
      if (p.headDim == 64) return launchFlashD<T, kCache, 64, kBias>(p, stream, minRows);
      return launchFlashD<T, kCache, 128, kBias>(p, stream, minRows);
    };
    auto flash = [&]() -> Status {
      if (p.alibiSlopes) return withBias.template operator()<Bias::kAlibi>();
      if (p.relativeBias) return withBias.template operator()<Bias::kRelative>();
      return withBias.template operator()<Bias::kNone>();
    };
    const Status st = flash();
    if (!st.ok() || !mixed) return st;
    return launchSplit<T, kCache>(p, stream, kFlashMinRows);
  }
}

template <typename T, KvCacheDType kCache>
Status launchAs(const PagedAttentionParams& p, cudaStream_t stream, bool flash) {
  return flash ? launchFlash<T, kCache>(p, stream) : launchSplit<T, kCache>(p, stream);
}

template <typename T>
Status launch(const PagedAttentionParams& p, cudaStream_t stream, bool flash) {
  TG_DISPATCH_KV_CACHE(p.cacheDtype, launchAs, T, p, stream, flash);
}

}  // namespace

void setFlashVariantsForTesting(int fold, int mmaFp8) {
  foldForTesting = fold;
  mmaFp8ForTesting = mmaFp8;
}

Status invokePagedAttention(const PagedAttentionParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validatePagedAttention(p));
  if (p.rows == 0) return okStatus();
  // Tensor cores pay off once a sequence brings 16 rows; decode rows (one per sequence) and
  // smaller chunks go to the split kernel. A few rows over a long context (a prompt's tail after a
  // cached prefix) split the context among blocks (flashSplits): one block per (64-row tile, head)
  // walking the whole context alone took 351 us a layer for 16 rows after 2048 cached tokens on an
  // H100.
  // T5's encoder (no causal mask) and decoder prompts (the relative bias) take it too;
  // cross-attention (contextLens: decode rows over the encoder output) the split kernel.
  const bool flash = !p.contextLens && p.dtype != DType::kF32 &&
                     (p.headDim == 64 || p.headDim == 128) && p.maxNewRows >= kFlashMinRows &&
                     p.qRowStride % 8 == 0 && cuda::aligned16(p.q) && cuda::aligned16(p.kCache) &&
                     cuda::aligned16(p.vCache);
  TG_DISPATCH_DTYPE(p.dtype, launch, p, stream, flash);
}

}  // namespace textgen::kernels
