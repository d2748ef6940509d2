// The small memory-bound kernels of a decoder layer: row gather (embedding), learned position
// embeddings, RoPE, paged KV write and the MLP's gated activation. Each reads and writes its rows
// once; 16-byte vectors where alignment allows.
#include <algorithm>

#include "activation.cuh"
#include "common.cuh"
#include "kv_cache.cuh"
#include "textgen/kernels/bias_add.h"
#include "textgen/kernels/gated_activation.h"
#include "textgen/kernels/gather_rows.h"
#include "textgen/kernels/kv_write.h"
#include "textgen/kernels/position_embedding.h"
#include "textgen/kernels/rope.h"
#include "textgen/kernels/rope_kv_write.h"

namespace textgen::kernels {
namespace {

using cuda::activate;
using cuda::CacheOf;
using cuda::Convert;
using cuda::roundTo;

// One block per row; copies `units` elements of type U (a 16-byte vector, or the scalar type).
template <typename U>
__global__ void gatherRowsKernel(const U* table, const int32_t* ids, U* out, int64_t units,
                                 int64_t tableRows, int64_t idOffset) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int64_t id = ids[r] - idOffset;
  U* dst = out + r * units;
  if (id < 0 || id >= tableRows) {
    for (int64_t i = threadIdx.x; i < units; i += blockDim.x) dst[i] = U{};
    return;
  }
  const U* src = table + static_cast<int64_t>(id) * units;
  for (int64_t i = threadIdx.x; i < units; i += blockDim.x) dst[i] = src[i];
}

int threadsFor(int64_t units) {
  return static_cast<int>(units >= 256 ? 256 : (units + 31) / 32 * 32);
}

// One block per row: x[r] += table[positions[r] + offset] in kVec-element vectors. A row whose
// table row is outside the table is left unchanged (no out-of-bounds read).
template <typename T, int kVec>
__global__ void positionEmbeddingKernel(T* x, const T* table, const int32_t* positions,
                                        int64_t width, int64_t tableRows, int64_t offset) {
  using C = Convert<T>;
  using V = cuda::Vec<T, kVec>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int64_t row = static_cast<int64_t>(positions[r]) + offset;
  if (positions[r] < 0 || row >= tableRows) return;
  V* dst = reinterpret_cast<V*>(x + r * width);
  const V* src = reinterpret_cast<const V*>(table + row * width);
  for (int64_t i = threadIdx.x; i < width / kVec; i += blockDim.x) {
    V a = dst[i];
    const V b = src[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) a.v[k] = C::fromFloat(C::toFloat(a.v[k]) + C::toFloat(b.v[k]));
    dst[i] = a;
  }
}

template <typename T>
Status launchPositionEmbedding(const PositionEmbeddingParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  auto* x = static_cast<T*>(p.x);
  const auto* table = static_cast<const T*>(p.table);
  const bool vec = p.width % kVec == 0 && cuda::aligned16(x) && cuda::aligned16(table);
  const auto grid = static_cast<unsigned>(p.rows);
  const int threads = threadsFor(vec ? p.width / kVec : p.width);
  return cuda::launch("position_embedding",
                      vec ? positionEmbeddingKernel<T, kVec> : positionEmbeddingKernel<T, 1>, grid,
                      threads, 0, stream, x, table, p.positions, p.width, p.tableRows, p.offset);
}

template <typename T>
__global__ void ropeKernel(RopeParams p) {
  using C = Convert<T>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int half = static_cast<int>(p.rotaryDim / 2);
  const auto pos = static_cast<float>(p.positions[r]);
  const int heads = static_cast<int>(p.numHeads + p.numKvHeads);
  T* q = static_cast<T*>(p.q) + r * p.qRowStride;
  T* k = static_cast<T*>(p.k) + r * p.kRowStride;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    T* head = h < p.numHeads ? q + h * p.headDim : k + (h - p.numHeads) * p.headDim;
    const float angle = pos * p.invFreq[r * half + i];
    const float c = roundTo<T>(cosf(angle) * p.attentionScaling);
    const float s = roundTo<T>(sinf(angle) * p.attentionScaling);
    const float x1 = C::toFloat(head[i]), x2 = C::toFloat(head[i + half]);
    head[i] = C::fromFloat(roundTo<T>(x1 * c) - roundTo<T>(x2 * s));
    head[i + half] = C::fromFloat(roundTo<T>(x2 * c) + roundTo<T>(x1 * s));
  }
}

// Block (row, group of heads): rotates the group's q and k heads in place, one thread per rotary
// pair, writing rotated keys to the cache at the row's slot straight from registers; the value
// rows and the non-rotary part of the keys of the group go to the cache as they are. Decode steps
// are one row: spreading its heads over blocks keeps each thread to a single round trip. Cache
// elements are kv_cache.cuh's (T, or the fp8 codes of the T values).
template <typename T, KvCacheDType kCache>
__global__ void ropeKvWriteKernel(RopeParams p, KvWriteParams kv, int headsPerBlock) {
  using C = Convert<T>;
  using K = CacheOf<T, kCache>;
  using E = typename K::Elem;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int half = static_cast<int>(p.rotaryDim / 2);
  const int hd = static_cast<int>(p.headDim), nh = static_cast<int>(p.numHeads);
  const int h0 = static_cast<int>(blockIdx.y) * headsPerBlock;
  const int hEnd = min(static_cast<int>(p.numHeads + p.numKvHeads), h0 + headsPerBlock);
  const auto pos = static_cast<float>(p.positions[r]);
  const int32_t slot = kv.slots[r];
  const bool write = slot >= 0 && slot < kv.numSlots;
  const int64_t kvWidth = p.numKvHeads * p.headDim;
  T* q = static_cast<T*>(p.q) + r * p.qRowStride;
  T* k = static_cast<T*>(p.k) + r * p.kRowStride;
  E* kc = static_cast<E*>(kv.kCache) + static_cast<int64_t>(slot) * kvWidth;
  for (int idx = threadIdx.x; idx < (hEnd - h0) * half; idx += blockDim.x) {
    const int h = h0 + idx / half, i = idx % half;
    const bool isKey = h >= nh;
    T* head = isKey ? k + (h - nh) * hd : q + h * hd;
    const float angle = pos * p.invFreq[r * half + i];
    const float c = roundTo<T>(cosf(angle) * p.attentionScaling);
    const float s = roundTo<T>(sinf(angle) * p.attentionScaling);
    const float x1 = C::toFloat(head[i]), x2 = C::toFloat(head[i + half]);
    const T o1 = C::fromFloat(roundTo<T>(x1 * c) - roundTo<T>(x2 * s));
    const T o2 = C::fromFloat(roundTo<T>(x2 * c) + roundTo<T>(x1 * s));
    head[i] = o1;
    head[i + half] = o2;
    if (isKey && write) {
      E* dst = kc + (h - nh) * hd;
      dst[i] = K::store(o1);
      dst[i + half] = K::store(o2);
    }
  }
  if (!write) return;
  // The group's key heads: values, and keys past rotaryDim (partial rotary), which the rotation
  // above does not touch.
  const int kFirst = max(h0, nh);
  if (kFirst >= hEnd) return;
  const T* v = static_cast<const T*>(kv.v) + r * kv.kvRowStride + (kFirst - nh) * hd;
  E* vc = static_cast<E*>(kv.vCache) + static_cast<int64_t>(slot) * kvWidth + (kFirst - nh) * hd;
  const T* kRest = k + (kFirst - nh) * hd;
  E* kcRest = kc + (kFirst - nh) * hd;
  for (int idx = threadIdx.x; idx < (hEnd - kFirst) * hd; idx += blockDim.x) {
    vc[idx] = K::store(v[idx]);
    if (idx % hd >= p.rotaryDim) kcRest[idx] = K::store(kRest[idx]);
  }
}

// ropeKvWriteKernel eight elements a thread: a thread rotates pairs i..i+7 of one head with
// 16-byte loads and stores (the same per-element arithmetic, so the same bits), and copies values
// and unrotated key parts in vectors of eight. Where the layout allows (16-bit T; rotaryDim / 2,
// headDim and the row strides multiples of 8; 16-byte aligned rows) for more than 256 rows: a
// 512-token Llama-2-7B prefill's rope took 26 µs a layer on an H100 with one pair a thread, 11.7
// this way (traced, waits included).
template <typename T, KvCacheDType kCache>
__global__ void ropeKvWriteVecKernel(RopeParams p, KvWriteParams kv, int headsPerBlock) {
  using C = Convert<T>;
  using K = CacheOf<T, kCache>;
  using E = typename K::Elem;
  using V = cuda::Vec<T, 8>;
  using EV = cuda::Vec<E, 8>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int half = static_cast<int>(p.rotaryDim / 2), chunks = half / 8;
  const int hd = static_cast<int>(p.headDim), nh = static_cast<int>(p.numHeads);
  const int h0 = static_cast<int>(blockIdx.y) * headsPerBlock;
  const int hEnd = min(static_cast<int>(p.numHeads + p.numKvHeads), h0 + headsPerBlock);
  const auto pos = static_cast<float>(p.positions[r]);
  const int32_t slot = kv.slots[r];
  const bool write = slot >= 0 && slot < kv.numSlots;
  const int64_t kvWidth = p.numKvHeads * p.headDim;
  T* q = static_cast<T*>(p.q) + r * p.qRowStride;
  T* k = static_cast<T*>(p.k) + r * p.kRowStride;
  E* kc = static_cast<E*>(kv.kCache) + static_cast<int64_t>(slot) * kvWidth;
  const float* freq = p.invFreq + r * half;
  for (int idx = threadIdx.x; idx < (hEnd - h0) * chunks; idx += blockDim.x) {
    const int h = h0 + idx / chunks, i0 = (idx % chunks) * 8;
    const bool isKey = h >= nh;
    T* head = isKey ? k + (h - nh) * hd : q + h * hd;
    V a = *reinterpret_cast<const V*>(head + i0), b = *reinterpret_cast<const V*>(head + i0 + half);
    const float4 f0 = *reinterpret_cast<const float4*>(freq + i0);
    const float4 f1 = *reinterpret_cast<const float4*>(freq + i0 + 4);
    const float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float angle = pos * f[e];
      const float c = roundTo<T>(cosf(angle) * p.attentionScaling);
      const float sn = roundTo<T>(sinf(angle) * p.attentionScaling);
      const float x1 = C::toFloat(a.v[e]), x2 = C::toFloat(b.v[e]);
      a.v[e] = C::fromFloat(roundTo<T>(x1 * c) - roundTo<T>(x2 * sn));
      b.v[e] = C::fromFloat(roundTo<T>(x2 * c) + roundTo<T>(x1 * sn));
    }
    *reinterpret_cast<V*>(head + i0) = a;
    *reinterpret_cast<V*>(head + i0 + half) = b;
    if (isKey && write) {
      EV ea, eb;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ea.v[e] = K::store(a.v[e]);
        eb.v[e] = K::store(b.v[e]);
      }
      E* dst = kc + (h - nh) * hd;
      *reinterpret_cast<EV*>(dst + i0) = ea;
      *reinterpret_cast<EV*>(dst + i0 + half) = eb;
    }
  }
  if (!write) return;
  const int kFirst = max(h0, nh);
  if (kFirst >= hEnd) return;
  const T* v = static_cast<const T*>(kv.v) + r * kv.kvRowStride + (kFirst - nh) * hd;
  E* vc = static_cast<E*>(kv.vCache) + static_cast<int64_t>(slot) * kvWidth + (kFirst - nh) * hd;
  const T* kRest = k + (kFirst - nh) * hd;
  E* kcRest = kc + (kFirst - nh) * hd;
  for (int u = threadIdx.x; u < (hEnd - kFirst) * hd / 8; u += blockDim.x) {
    const V vv = reinterpret_cast<const V*>(v)[u];
    EV ev;
#pragma unroll
    for (int e = 0; e < 8; ++e) ev.v[e] = K::store(vv.v[e]);
    reinterpret_cast<EV*>(vc)[u] = ev;
    if ((u * 8) % hd >= p.rotaryDim) {
      const V kk = reinterpret_cast<const V*>(kRest)[u];
#pragma unroll
      for (int e = 0; e < 8; ++e) ev.v[e] = K::store(kk.v[e]);
      reinterpret_cast<EV*>(kcRest)[u] = ev;
    }
  }
}

template <typename U>
__global__ void kvWriteKernel(const U* k, const U* v, int64_t rowStride, U* kCache, U* vCache,
                              const int32_t* slots, int64_t units, int64_t numSlots) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int32_t slot = slots[r];
  if (slot < 0 || slot >= numSlots) return;
  for (int64_t i = threadIdx.x; i < units; i += blockDim.x) {
    kCache[slot * units + i] = k[r * rowStride + i];
    vCache[slot * units + i] = v[r * rowStride + i];
  }
}

// Into an fp8 cache: one block per row, each element converted (kv_cache.cuh).
template <typename T, KvCacheDType kCache>
__global__ void kvWriteConvertKernel(KvWriteParams p) {
  using K = CacheOf<T, kCache>;
  using E = typename K::Elem;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x;
  const int32_t slot = p.slots[r];
  if (slot < 0 || slot >= p.numSlots) return;
  const int64_t width = p.numKvHeads * p.headDim;
  const T* k = static_cast<const T*>(p.k) + r * p.kvRowStride;
  const T* v = static_cast<const T*>(p.v) + r * p.kvRowStride;
  E* kc = static_cast<E*>(p.kCache) + slot * width;
  E* vc = static_cast<E*>(p.vCache) + slot * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    kc[i] = K::store(k[i]);
    vc[i] = K::store(v[i]);
  }
}

// Not gated: out = act(x) over [rows, n], or residual + act(x) with act rounded first; in place
// allowed.
template <typename T, int kVec, Activation A>
__global__ void activationKernel(const T* x, const T* residual, T* out, int64_t units) {
  using C = Convert<T>;
  using V = cuda::Vec<T, kVec>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < units;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const V in = reinterpret_cast<const V*>(x)[i];
    V o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) o.v[e] = C::fromFloat(activate<A>(C::toFloat(in.v[e])));
    if (residual != nullptr) {
      const V res = reinterpret_cast<const V*>(residual)[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        o.v[e] = C::fromFloat(C::toFloat(res.v[e]) + C::toFloat(o.v[e]));
    }
    reinterpret_cast<V*>(out)[i] = o;
  }
}

template <typename T, int kVec, Activation A>
__global__ void gatedActivationKernel(const T* gateUp, T* out, int64_t rows, int64_t n) {
  using C = Convert<T>;
  using V = cuda::Vec<T, kVec>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t vecsPerRow = n / kVec;
  const int64_t total = rows * vecsPerRow;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecsPerRow, c = i % vecsPerRow;
    const V g = reinterpret_cast<const V*>(gateUp + r * 2 * n)[c];
    const V u = reinterpret_cast<const V*>(gateUp + r * 2 * n + n)[c];
    V o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float x = C::toFloat(g.v[e]);
      o.v[e] = C::fromFloat(roundTo<T>(activate<A>(x)) * C::toFloat(u.v[e]));
    }
    reinterpret_cast<V*>(out + r * n)[c] = o;
  }
}

template <typename T>
__global__ void biasAddKernel(T* y, const T* bias, int64_t rows, int64_t out) {
  using C = Convert<T>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t total = rows * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = C::fromFloat(C::toFloat(y[i]) + C::toFloat(bias[i % out]));
}

template <typename T>
Status launchBiasAdd(const BiasAddParams& p, cudaStream_t stream) {
  const int64_t total = p.rows * p.out;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65536));
  return cuda::launch("bias_add", biasAddKernel<T>, blocks, 256, 0, stream, static_cast<T*>(p.y),
                      static_cast<const T*>(p.bias), p.rows, p.out);
}

template <typename T, Activation A>
Status launchGatedActivationAs(const GatedActivationParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const auto* g = static_cast<const T*>(p.gateUp);
  auto* o = static_cast<T*>(p.out);
  const auto* res = static_cast<const T*>(p.residual);
  const bool vec = p.n % kVec == 0 && cuda::aligned16(g) && cuda::aligned16(o) &&
                   (res == nullptr || cuda::aligned16(res));
  const int64_t units = p.rows * (vec ? p.n / kVec : p.n);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 65536));
  if (!p.gated) {
    return cuda::launch("activation",
                        vec ? activationKernel<T, kVec, A> : activationKernel<T, 1, A>, blocks, 256,
                        0, stream, g, res, o, units);
  }
  return cuda::launch("gated_activation",
                      vec ? gatedActivationKernel<T, kVec, A> : gatedActivationKernel<T, 1, A>,
                      blocks, 256, 0, stream, g, o, p.rows, p.n);
}

template <typename T>
Status launchGatedActivation(const GatedActivationParams& p, cudaStream_t stream) {
  switch (p.activation) {
    case Activation::kSilu: return launchGatedActivationAs<T, Activation::kSilu>(p, stream);
    case Activation::kGelu: return launchGatedActivationAs<T, Activation::kGelu>(p, stream);
    case Activation::kGeluTanh: return launchGatedActivationAs<T, Activation::kGeluTanh>(p, stream);
    case Activation::kRelu: return launchGatedActivationAs<T, Activation::kRelu>(p, stream);
  }
  return invalidArgumentError("gated_activation: unknown activation");
}

template <typename T, KvCacheDType kCache>
Status launchRopeKvWriteAs(const RopeKvWriteParams& p, cudaStream_t stream) {
  // Heads per block: about 256 rotary pairs.
  const int64_t half = p.rope.rotaryDim / 2, heads = p.rope.numHeads + p.rope.numKvHeads;
  // Prefill-sized calls only: decode steps (up to 256 rows) keep one pair a thread, spread over
  // more blocks (the bits are the same either way).
  const bool vec = p.rope.rows > 256 && sizeof(T) == 2 && half % 8 == 0 && half > 0 &&
                   p.rope.headDim % 8 == 0 && p.rope.qRowStride % 8 == 0 &&
                   p.rope.kRowStride % 8 == 0 && p.kv.kvRowStride % 8 == 0 &&
                   cuda::aligned16(p.rope.q) && cuda::aligned16(p.rope.k) &&
                   cuda::aligned16(p.kv.v) && cuda::aligned16(p.rope.invFreq) &&
                   cuda::aligned16(p.kv.kCache) && cuda::aligned16(p.kv.vCache);
  if (vec) {
    // Heads per block: about 256 threads of eight pairs each.
    const int64_t perBlock = std::clamp<int64_t>(256 / (half / 8), 1, heads);
    const dim3 grid(static_cast<unsigned>(p.rope.rows),
                    static_cast<unsigned>((heads + perBlock - 1) / perBlock));
    return cuda::launch("rope_kv_write", ropeKvWriteVecKernel<T, kCache>, grid,
                        threadsFor(perBlock * (half / 8)), 0, stream, p.rope, p.kv,
                        static_cast<int>(perBlock));
  }
  const int64_t perBlock = std::clamp<int64_t>(256 / half, 1, heads);
  const dim3 grid(static_cast<unsigned>(p.rope.rows),
                  static_cast<unsigned>((heads + perBlock - 1) / perBlock));
  return cuda::launch("rope_kv_write", ropeKvWriteKernel<T, kCache>, grid,
                      threadsFor(perBlock * half), 0, stream, p.rope, p.kv,
                      static_cast<int>(perBlock));
}

template <typename T>
Status launchRopeKvWrite(const RopeKvWriteParams& p, cudaStream_t stream) {
  TG_DISPATCH_KV_CACHE(p.kv.cacheDtype, launchRopeKvWriteAs, T, p, stream);
}

template <typename T, KvCacheDType kCache>
Status launchKvWriteConvertAs(const KvWriteParams& p, cudaStream_t stream) {
  return cuda::launch("kv_write", kvWriteConvertKernel<T, kCache>, static_cast<unsigned>(p.rows),
                      threadsFor(p.numKvHeads * p.headDim), 0, stream, p);
}

template <typename T>
Status launchKvWriteConvert(const KvWriteParams& p, cudaStream_t stream) {
  TG_DISPATCH_KV_CACHE(p.cacheDtype, launchKvWriteConvertAs, T, p, stream);
}

template <typename T>
Status launchRope(const RopeParams& p, cudaStream_t stream) {
  const int64_t pairs = (p.numHeads + p.numKvHeads) * (p.rotaryDim / 2);
  return cuda::launch("rope", ropeKernel<T>, static_cast<unsigned>(p.rows), threadsFor(pairs), 0,
                      stream, p);
}

}  // namespace

Status invokeBiasAdd(const BiasAddParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateBiasAdd(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launchBiasAdd, p, stream);
}

Status invokeGatherRows(const GatherRowsParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateGatherRows(p));
  if (p.rows == 0) return okStatus();
  const int64_t rowBytes = p.width * static_cast<int64_t>(dtypeSize(p.dtype));
  const auto grid = static_cast<unsigned>(p.rows);
  if (rowBytes % 16 == 0 && cuda::aligned16(p.table) && cuda::aligned16(p.out)) {
    const int64_t units = rowBytes / 16;
    return cuda::launch("gather_rows", gatherRowsKernel<uint4>, grid, threadsFor(units), 0, stream,
                        static_cast<const uint4*>(p.table), p.ids, static_cast<uint4*>(p.out),
                        units, p.tableRows, p.idOffset);
  }
  const int64_t units = rowBytes / 2;  // every dtype is a whole number of 2-byte units
  return cuda::launch("gather_rows", gatherRowsKernel<uint16_t>, grid, threadsFor(units), 0, stream,
                      static_cast<const uint16_t*>(p.table), p.ids, static_cast<uint16_t*>(p.out),
                      units, p.tableRows, p.idOffset);
}

Status invokePositionEmbedding(const PositionEmbeddingParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validatePositionEmbedding(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launchPositionEmbedding, p, stream);
}

Status invokeRope(const RopeParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateRope(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launchRope, p, stream);
}

Status invokeRopeKvWrite(const RopeKvWriteParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateRopeKvWrite(p));
  if (p.rope.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.rope.dtype, launchRopeKvWrite, p, stream);
}

Status invokeKvWrite(const KvWriteParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateKvWrite(p));
  if (p.rows == 0) return okStatus();
  if (p.cacheDtype != KvCacheDType::kAuto)
    TG_DISPATCH_DTYPE(p.dtype, launchKvWriteConvert, p, stream);
  const int64_t es = static_cast<int64_t>(dtypeSize(p.dtype));
  const int64_t rowBytes = p.numKvHeads * p.headDim * es, strideBytes = p.kvRowStride * es;
  const auto grid = static_cast<unsigned>(p.rows);
  if (rowBytes % 16 == 0 && strideBytes % 16 == 0 && cuda::aligned16(p.k) && cuda::aligned16(p.v) &&
      cuda::aligned16(p.kCache) && cuda::aligned16(p.vCache)) {
    const int64_t units = rowBytes / 16;
    return cuda::launch("kv_write", kvWriteKernel<uint4>, grid, threadsFor(units), 0, stream,
                        static_cast<const uint4*>(p.k), static_cast<const uint4*>(p.v),
                        strideBytes / 16, static_cast<uint4*>(p.kCache),
                        static_cast<uint4*>(p.vCache), p.slots, units, p.numSlots);
  }
  const int64_t units = rowBytes / 2;
  return cuda::launch("kv_write", kvWriteKernel<uint16_t>, grid, threadsFor(units), 0, stream,
                      static_cast<const uint16_t*>(p.k), static_cast<const uint16_t*>(p.v),
                      strideBytes / 2, static_cast<uint16_t*>(p.kCache),
                      static_cast<uint16_t*>(p.vCache), p.slots, units, p.numSlots);
}

Status invokeGatedActivation(const GatedActivationParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateGatedActivation(p));
  if (p.rows == 0) return okStatus();
  TG_DISPATCH_DTYPE(p.dtype, launchGatedActivation, p, stream);
}

}  // namespace textgen::kernels
