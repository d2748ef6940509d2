// Prefill attention on the GPU (the tensor-core flash kernel of paged_attention.cu): one sequence's
// new rows over a paged cache already holding `cached` positions, causal, heads of 128, bfloat16,
// blocks of 16 tokens scattered over the pool as the shard's allocator leaves them. Prints, per
// shape, µs per call and the achieved TFLOP/s counting the causal products (Q·Kᵀ and P·V over the
// keys each row sees), then one JSON line. --decode: each shape is S:C, S sequences of one new row
// after C cached positions (a decode step's attention), reported as the cache's bytes read per
// second. Usage: bench_attention [--iters N] [--shapes R:C,...] [--heads H] [--kv-heads H]
// [--kv-cache-dtype fp8_e4m3fn|fp8_e5m2] [--decode]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "textgen/kernels/kv_cache_dtype.h"
#include "textgen/kernels/paged_attention.h"

namespace {

using textgen::kernels::DType;

#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

struct Shape {
  int64_t rows, cached;
};

struct Result {
  Shape shape;
  double us, tflops, gbps;
};

// bfloat16 bits of small random values (|x| < 1), so that scores stay in a realistic range
// (xorshift: the decode shapes' caches hold billions of values).
std::vector<uint16_t> randomBf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    // sign, exponent 117-126 (2^-10 to 2^-1), 7 mantissa bits
    e = static_cast<uint16_t>((x & 0x8000u) | ((117u + (x >> 7) % 10) << 7) | (x & 0x7Fu));
  }
  return v;
}

bool parseShapes(const char* s, std::vector<Shape>& out) {
  out.clear();
  while (*s) {
    char* end = nullptr;
    const long r = std::strtol(s, &end, 10);
    if (end == s || *end != ':') return false;
    s = end + 1;
    const long c = std::strtol(s, &end, 10);
    if (end == s || r <= 0 || r > 16384 || c < 0 || c > 65536) return false;
    out.push_back({r, c});
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return false;
  }
  return !out.empty();
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  int64_t heads = 32, kvHeads = 32;
  bool decode = false;
  textgen::kernels::KvCacheDType cache = textgen::kernels::KvCacheDType::kAuto;
  std::vector<Shape> shapes = {{512, 0},   {512, 512}, {512, 2048}, {2048, 0},
                               {64, 2048}, {16, 2048}, {64, 128}};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
      heads = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--kv-heads") == 0 && i + 1 < argc) {
      kvHeads = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--kv-cache-dtype") == 0 && i + 1 < argc) {
      const auto fp8 = textgen::kernels::fp8KvCacheDTypeOf(argv[++i]);
      if (!fp8) {
        std::fprintf(stderr, "--kv-cache-dtype: fp8_e4m3fn or fp8_e5m2\n");
        return 2;
      }
      cache = *fp8;
    } else if (std::strcmp(argv[i], "--decode") == 0) {
      decode = true;
      shapes = {{1, 2048}, {8, 2048}, {32, 512}, {64, 128}, {64, 512}, {64, 2048}, {256, 512}};
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      if (!parseShapes(argv[++i], shapes)) {
        std::fprintf(stderr, "--shapes: ROWS:CACHED[,ROWS:CACHED...]\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--shapes R:C,...] [--heads H] [--kv-heads H] "
                   "[--kv-cache-dtype fp8_e4m3fn|fp8_e5m2] [--decode]\n",
                   argv[0]);
      return 2;
    }
  }
  if (iters <= 0 || heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0 || heads > 128) {
    std::fprintf(stderr, "bad --iters, --heads or --kv-heads\n");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  constexpr int64_t kHd = 128, kBlock = 16;
  const size_t kWorkspace = size_t{64} << 20;  // the CUDA backend's attention workspace
  void* workspace = nullptr;
  BENCH_CUDA(cudaMalloc(&workspace, kWorkspace));
  BENCH_CUDA(cudaMemset(workspace, 0, kWorkspace));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));

  std::vector<Result> results;
  for (const Shape& sh : shapes) {
    // Prefill: one sequence of sh.rows new rows after sh.cached. Decode: sh.rows sequences of one
    // new row each after sh.cached.
    const int64_t seqs = decode ? sh.rows : 1, rowsPerSeq = decode ? 1 : sh.rows;
    const int64_t rows = seqs * rowsPerSeq, context = sh.cached + rowsPerSeq;
    const int64_t nBlocks = (context + kBlock - 1) / kBlock;
    // A pool a little larger than the sequences' blocks, each sequence's blocks scattered in it.
    const int64_t pool = seqs * nBlocks + nBlocks + 8;
    std::vector<int32_t> order(pool);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    std::vector<int32_t> table(order.begin(), order.begin() + seqs * nBlocks);
    const size_t cacheElems = static_cast<size_t>(pool * kBlock * kvHeads * kHd);
    const size_t qElems = static_cast<size_t>(rows * heads * kHd);
    std::vector<uint16_t> hk = randomBf16(cacheElems, 1), hv = randomBf16(cacheElems, 2),
                          hq = randomBf16(qElems, 3);
    // An fp8 cache holds one byte an element: the random bits' low bytes with bit 6 clear (no
    // NaN or infinity in either format).
    const bool fp8 = cache != textgen::kernels::KvCacheDType::kAuto;
    const size_t elemBytes = fp8 ? 1 : 2;
    std::vector<uint8_t> hk8, hv8;
    if (fp8) {
      hk8.resize(cacheElems);
      hv8.resize(cacheElems);
      for (size_t i = 0; i < cacheElems; ++i) {
        hk8[i] = static_cast<uint8_t>(hk[i] & 0xBF);
        hv8[i] = static_cast<uint8_t>(hv[i] & 0xBF);
      }
    }
    const void* hkBytes = fp8 ? static_cast<const void*>(hk8.data()) : hk.data();
    const void* hvBytes = fp8 ? static_cast<const void*>(hv8.data()) : hv.data();
    void *q, *k, *v, *out;
    int32_t *seqStarts, *startPos, *tables;
    BENCH_CUDA(cudaMalloc(&q, qElems * 2));
    BENCH_CUDA(cudaMalloc(&out, qElems * 2));
    BENCH_CUDA(cudaMalloc(&k, cacheElems * elemBytes));
    BENCH_CUDA(cudaMalloc(&v, cacheElems * elemBytes));
    BENCH_CUDA(cudaMalloc(&seqStarts, (seqs + 1) * sizeof(int32_t)));
    BENCH_CUDA(cudaMalloc(&startPos, seqs * sizeof(int32_t)));
    BENCH_CUDA(cudaMalloc(&tables, table.size() * sizeof(int32_t)));
    BENCH_CUDA(cudaMemcpy(q, hq.data(), qElems * 2, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(k, hkBytes, cacheElems * elemBytes, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(v, hvBytes, cacheElems * elemBytes, cudaMemcpyHostToDevice));
    std::vector<int32_t> hStarts(seqs + 1), hPos(seqs, static_cast<int32_t>(sh.cached));
    for (int64_t i = 0; i <= seqs; ++i) hStarts[i] = static_cast<int32_t>(i * rowsPerSeq);
    BENCH_CUDA(cudaMemcpy(seqStarts, hStarts.data(), hStarts.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    BENCH_CUDA(
        cudaMemcpy(startPos, hPos.data(), hPos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    BENCH_CUDA(
        cudaMemcpy(tables, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    textgen::kernels::PagedAttentionParams p;
    p.q = q;
    p.qRowStride = heads * kHd;
    p.kCache = k;
    p.vCache = v;
    p.out = out;
    p.seqStarts = seqStarts;
    p.startPos = startPos;
    p.blockTables = tables;
    p.rows = rows;
    p.numSeqs = seqs;
    p.maxBlocksPerSeq = nBlocks;
    p.numHeads = heads;
    p.numKvHeads = kvHeads;
    p.headDim = kHd;
    p.blockSize = kBlock;
    p.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
    p.maxNewRows = rowsPerSeq;
    p.maxContext = context;
    p.minNewRows = rowsPerSeq;
    p.dtype = DType::kBF16;
    p.cacheDtype = cache;
    p.workspace = workspace;
    p.workspaceBytes = kWorkspace;
    auto call = [&] {
      const textgen::Status s = textgen::kernels::invokePagedAttention(p, stream);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.toString().c_str());
        std::exit(1);
      }
    };
    for (int i = 0; i < 3; ++i) call();
    cudaEvent_t start, stop;
    BENCH_CUDA(cudaEventCreate(&start));
    BENCH_CUDA(cudaEventCreate(&stop));
    BENCH_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) call();
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    const double us = 1e3 * ms / iters;
    // Keys row t sees: cached + t + 1; two products of 2 * hd flops per (row, key, head).
    const double keys =
        static_cast<double>(seqs) * (static_cast<double>(rowsPerSeq) * sh.cached +
                                     static_cast<double>(rowsPerSeq) * (rowsPerSeq + 1) / 2.0);
    const double flops = keys * heads * 4.0 * kHd;
    // The cache's bytes: each sequence's keys and values once, every KV head.
    const double bytes =
        static_cast<double>(seqs) * context * kvHeads * kHd * 2.0 * static_cast<double>(elemBytes);
    results.push_back({sh, us, flops / (us * 1e-6) / 1e12, bytes / (us * 1e-6) / 1e9});
    BENCH_CUDA(cudaEventDestroy(start));
    BENCH_CUDA(cudaEventDestroy(stop));
    for (void* ptr : {q, out, k, v}) BENCH_CUDA(cudaFree(ptr));
    for (int32_t* ptr : {seqStarts, startPos, tables}) BENCH_CUDA(cudaFree(ptr));
  }
  const std::string cacheName(textgen::kernels::kvCacheDTypeName(cache));
  std::printf("%s attention, bf16, cache %s, %lld heads over %lld KV heads of %lld, on %s\n",
              decode ? "decode" : "prefill", cacheName.c_str(), static_cast<long long>(heads),
              static_cast<long long>(kvHeads), static_cast<long long>(kHd), prop.name);
  std::printf("%8s %8s %12s %10s %10s\n", decode ? "seqs" : "rows", "cached", "us", "TFLOP/s",
              "cache GB/s");
  for (const Result& r : results) {
    std::printf("%8lld %8lld %12.2f %10.1f %10.0f\n", static_cast<long long>(r.shape.rows),
                static_cast<long long>(r.shape.cached), r.us, r.tflops, r.gbps);
  }
  std::string json = std::string("{\"bench\":\"attention\",\"mode\":\"") +
                     (decode ? "decode" : "prefill") + "\",\"device\":\"" + std::string(prop.name) +
                     "\",\"heads\":" + std::to_string(heads) +
                     ",\"kv_heads\":" + std::to_string(kvHeads) + ",\"kv_cache_dtype\":\"" +
                     cacheName + "\",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    json += (i ? "," : "") + std::string("{\"rows\":") + std::to_string(r.shape.rows) +
            ",\"cached\":" + std::to_string(r.shape.cached) + ",\"us\":" + std::to_string(r.us) +
            ",\"tflops\":" + std::to_string(r.tflops) +
            ",\"cache_gbps\":" + std::to_string(r.gbps) + "}";
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  BENCH_CUDA(cudaFree(workspace));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
