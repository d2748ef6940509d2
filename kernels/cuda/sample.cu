// Logit processing and token choice on the device (see sample.h): one block per row. Where the host
// sorts (top-k, top-p, typical-p), the device searches the threshold bit by bit over
// order-preserving integer keys, then settles ties in id order with a chunked scan, so the kept set
// equals the host's sorted prefix. Sums are float64 as on the host; they differ from it only in
// summation order.
#include <cfloat>
#include <cstdint>

#include "common.cuh"
#include "textgen/kernels/sample.h"

namespace textgen::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ uint32_t floatKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t doubleKey(double d) {
  const auto u = static_cast<uint64_t>(__double_as_longlong(d));
  return (u >> 63) ? ~u : (u | (uint64_t{1} << 63));
}

struct Shared {
  double d[kWarpsPerBlock];
  float f[kWarpsPerBlock];
  int64_t i[kWarpsPerBlock];
  double prefix[kThreads];
  int64_t found;
};

__device__ double blockSum(double v, Shared& s) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) s.d[threadIdx.x / 32] = v;
  __syncthreads();
  double r = 0;
  for (int w = 0; w < kWarpsPerBlock; ++w) r += s.d[w];
  return r;
}

__device__ float blockMax(float v, Shared& s) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) s.f[threadIdx.x / 32] = v;
  __syncthreads();
  float r = s.f[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) r = fmaxf(r, s.f[w]);
  return r;
}

// (value, id) arg-max with the lowest id among equal values; ids == vocab mean "none".
__device__ int64_t blockArgmax(float v, int64_t id, Shared& s) {
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) {
      v = ov;
      id = oi;
    }
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    s.f[threadIdx.x / 32] = v;
    s.i[threadIdx.x / 32] = id;
  }
  __syncthreads();
  float bv = s.f[0];
  int64_t bi = s.i[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) {
    if (s.f[w] > bv || (s.f[w] == bv && s.i[w] < bi)) {
      bv = s.f[w];
      bi = s.i[w];
    }
  }
  return bi;
}

// The first id, in id order over the elements where `in(i)`, at which base + the running sum of
// value(i) satisfies `reached(sum)`; vocab when it never does. Thread t scans a contiguous chunk.
template <typename In, typename Value, typename Reached>
__device__ int64_t firstCrossing(int64_t vocab, double base, In in, Value value, Reached reached,
                                 Shared& s) {
  const int64_t chunk = (vocab + kThreads - 1) / kThreads;
  const int64_t lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
  double local = 0;
  for (int64_t i = lo; i < hi; ++i) {
    if (in(i)) local += value(i);
  }
  __syncthreads();
  s.prefix[threadIdx.x] = local;
  if (threadIdx.x == 0) s.found = vocab;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = base;
    for (int t = 0; t < kThreads; ++t) {
      const double v = s.prefix[t];
      s.prefix[t] = run;
      run += v;
    }
  }
  __syncthreads();
  double c = s.prefix[threadIdx.x];
  for (int64_t i = lo; i < hi; ++i) {
    if (!in(i)) continue;
    c += value(i);
    if (reached(c)) {
      atomicMin(reinterpret_cast<unsigned long long*>(&s.found),
                static_cast<unsigned long long>(i));
      break;
    }
  }
  __syncthreads();
  return s.found;
}

// probs[i] = softmax(w)[i] in float64, as the host computes it; returns nothing
// (block-synchronous).
__device__ void softmax64(const float* w, double* probs, int64_t vocab, Shared& s) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, w[i]);
  const double mx = blockMax(m, s);
  double local = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    probs[i] = exp(static_cast<double>(w[i]) - mx);
    local += probs[i];
  }
  const double sum = blockSum(local, s);
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) probs[i] /= sum;
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sampleKernel(SampleParams sp) {
  __shared__ Shared s;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t r = blockIdx.x, vocab = sp.vocab;
  const SampleRow p = sp.rowParams[r];
  float* w = sp.work + r * vocab;
  double* probs = sp.probs + r * vocab;
  const T* in = static_cast<const T*>(sp.logits) + r * vocab;
  if (static_cast<const void*>(in) != static_cast<const void*>(w)) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) w[i] = cuda::Convert<T>::toFloat(in[i]);
  }
  __syncthreads();
  if (p.greenBegin >= 0) {  // the watermark first, as TGI
    const uint32_t* green = sp.masks + p.greenBegin;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      if (green[i >> 5] >> (i & 31) & 1u) w[i] += p.greenDelta;
    }
    __syncthreads();
  }
  // Penalties (each distinct token once, by one thread), then the bias.
  for (int32_t h = p.historyBegin + threadIdx.x; h < p.historyEnd; h += kThreads) {
    const int32_t id = sp.historyTokens[h];
    if (id < 0 || id >= vocab) continue;
    float l = w[id];
    if (p.repetitionPenalty > 0.0f && p.repetitionPenalty != 1.0f)
      l = l < 0 ? l * p.repetitionPenalty : l / p.repetitionPenalty;
    if (p.frequencyPenalty != 0.0f)
      l -= p.frequencyPenalty * static_cast<float>(sp.historyCounts[h]);
    l -= p.presencePenalty;
    w[id] = l;
  }
  __syncthreads();
  for (int32_t b = p.biasBegin + threadIdx.x; b < p.biasEnd; b += kThreads) {
    const int32_t id = sp.biasTokens[b];
    if (id >= 0 && id < vocab) w[id] += sp.biasValues[b];
  }
  __syncthreads();
  if (p.maskBegin >= 0) {
    const uint32_t* mask = sp.masks + p.maskBegin;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      if (!(mask[i >> 5] >> (i & 31) & 1u)) w[i] = -INFINITY;
    }
    __syncthreads();
  }

  if (p.doSample) {
    if (p.temperature > 0.0f && p.temperature != 1.0f) {
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) w[i] /= p.temperature;
      __syncthreads();
    }
    if (p.topK > 0 && p.topK < vocab) {
      // The k-th largest key: the largest K with at least k keys >= K.
      uint32_t key = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = key | (1u << bit);
        double count = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) count += floatKey(w[i]) >= cand;
        if (blockSum(count, s) >= p.topK) key = cand;
      }
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (floatKey(w[i]) < key) w[i] = -INFINITY;
      }
      __syncthreads();
    }
    if (p.topP > 0.0f && p.topP < 1.0f) {
      softmax64(w, probs, vocab, s);
      // The smallest kept value: the largest key whose keys at or above it hold top_p.
      uint32_t key = 0;
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t cand = key | (1u << bit);
        double mass = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
          if (floatKey(w[i]) >= cand) mass += probs[i];
        }
        if (blockSum(mass, s) >= p.topP) key = cand;
      }
      double above = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (floatKey(w[i]) > key) above += probs[i];
      }
      above = blockSum(above, s);
      // Ties at that value are kept in id order until the mass reaches top_p.
      const double topP = p.topP;
      const int64_t last = firstCrossing(
          vocab, above, [&](int64_t i) { return floatKey(w[i]) == key; },
          [&](int64_t i) { return probs[i]; }, [&](double c) { return c >= topP; }, s);
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const uint32_t k = floatKey(w[i]);
        if (k < key || (k == key && i > last)) w[i] = -INFINITY;
      }
      __syncthreads();
    }
    if (p.typicalP > 0.0f && p.typicalP < 1.0f) {
      softmax64(w, probs, vocab, s);
      double ent = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (probs[i] > 0) ent -= probs[i] * log(probs[i]);
      }
      const double entropy = blockSum(ent, s);
      auto deviation = [&](int64_t i) {
        return probs[i] > 0 ? fabs(-log(probs[i]) - entropy) : INFINITY;
      };
      // The largest deviation key below which the mass stays under typical_p.
      uint64_t key = 0;
      for (int bit = 63; bit >= 0; --bit) {
        const uint64_t cand = key | (uint64_t{1} << bit);
        double mass = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
          if (doubleKey(deviation(i)) < cand) mass += probs[i];
        }
        if (blockSum(mass, s) < p.typicalP) key = cand;
      }
      double below = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (doubleKey(deviation(i)) < key) below += probs[i];
      }
      below = blockSum(below, s);
      const double typicalP = p.typicalP;
      const int64_t last = firstCrossing(
          vocab, below, [&](int64_t i) { return doubleKey(deviation(i)) == key; },
          [&](int64_t i) { return probs[i]; }, [&](double c) { return c >= typicalP; }, s);
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const uint64_t k = doubleKey(deviation(i));
        if (k > key || (k == key && i > last)) w[i] = -INFINITY;
      }
      __syncthreads();
    }
  }

  // Log-softmax, as the host: max in float, float64 sum of exp(float(w - max)).
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, w[i]);
  m = blockMax(m, s);
  double local = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    local += exp(static_cast<double>(w[i] - m));
  const float lse = static_cast<float>(m + log(blockSum(local, s)));

  int64_t id = 0;
  if (p.doSample) {
    const double u = p.uniform;
    id = firstCrossing(
        vocab, 0.0, [](int64_t) { return true; },
        [&](int64_t i) { return exp(static_cast<double>(w[i] - lse)); },
        [&](double c) { return u < c; }, s);
    if (id >= vocab) id = vocab - 1;
    while (id > 0 && w[id] - lse == -INFINITY) --id;  // rounding at the tail: stay in support
  } else {
    float best = -INFINITY;
    int64_t bestId = vocab;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      if (w[i] > best) {
        best = w[i];
        bestId = i;
      }
    }
    id = blockArgmax(best, bestId, s);
    if (id >= vocab) id = 0;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) w[i] -= lse;  // log-probabilities
  __syncthreads();
  if (threadIdx.x == 0) {
    sp.ids[r] = static_cast<int32_t>(id);
    sp.logprobs[r] = w[id];
  }
  // Top-n: repeated arg-max, excluding the ids already taken.
  const int n = static_cast<int>(p.topN < vocab ? p.topN : vocab);
  for (int k = 0; k < n; ++k) {
    float best = -INFINITY;
    int64_t bestId = vocab;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sp.topIds[r * sp.maxTopN + j] == i;
      if (!taken && (w[i] > best || bestId == vocab)) {
        best = w[i];
        bestId = i;
      }
    }
    const int64_t pick = blockArgmax(best, bestId, s);
    if (threadIdx.x == 0) {
      sp.topIds[r * sp.maxTopN + k] = static_cast<int32_t>(pick);
      sp.topLogprobs[r * sp.maxTopN + k] = w[pick];
    }
    __syncthreads();
  }
}

template <typename T>
Status launch(const SampleParams& p, cudaStream_t stream) {
  return cuda::launch("sample", sampleKernel<T>, static_cast<unsigned>(p.rows), kThreads, 0, stream,
                      p);
}

}  // namespace

Status invokeSample(const SampleParams& p, Stream stream) {
  TG_RETURN_IF_ERROR(validateSample(p));
  if (p.rows == 0) return okStatus();
  if (!p.probs)
    return invalidArgumentError("sample: the float64 scratch is required on the device");
  TG_DISPATCH_DTYPE(p.dtype, launch, p, stream);
}

}  // namespace textgen::kernels
