// RMSNorm (+ residual add) bandwidth on the GPU against the measured device copy bandwidth: the
// kernel is memory-bound, so the fraction of copy bandwidth is its roofline fraction.
// Prints a table and one JSON line. Usage: bench_rms_norm [--iters N]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "textgen/kernels/rms_norm.h"

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

// Milliseconds per call of fn, averaged over iters after warm-up.
template <typename Fn>
float timeMs(int iters, Fn&& fn) {
  for (int i = 0; i < 5; ++i) fn();
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  BENCH_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) fn();
  BENCH_CUDA(cudaEventRecord(stop));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  return ms / static_cast<float>(iters);
}

// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.
double copyBandwidthGBps() {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  BENCH_CUDA(cudaMalloc(&a, bytes));
  BENCH_CUDA(cudaMalloc(&b, bytes));
  BENCH_CUDA(cudaMemset(a, 1, bytes));
  const float ms =
      timeMs(20, [&] { BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

struct Result {
  int64_t tokens, hidden;
  float us;
  double gbps, fraction;
  bool l2Resident;  // working set fits in L2: repeated calls are not bounded by device memory
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N]\n", argv[0]);
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "--iters must be positive\n");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy = copyBandwidthGBps();

  const DType dtype = DType::kBF16;
  const size_t es = textgen::kernels::dtypeSize(dtype);
  std::vector<Result> results;
  for (int64_t hidden : {4096, 8192}) {
    for (int64_t tokens : {1, 16, 128, 1024, 4096, 16384}) {
      const size_t n = static_cast<size_t>(tokens * hidden);
      void *x, *r, *w;
      BENCH_CUDA(cudaMalloc(&x, n * es));
      BENCH_CUDA(cudaMalloc(&r, n * es));
      BENCH_CUDA(cudaMalloc(&w, hidden * es));
      BENCH_CUDA(cudaMemset(x, 0x3c, n * es));
      BENCH_CUDA(cudaMemset(r, 0x3c, n * es));
      BENCH_CUDA(cudaMemset(w, 0x3f, hidden * es));
      // In place, as the decoder layers use it: reads x and r, writes x and r.
      textgen::kernels::RmsNormParams p{.input = x,
                                        .residual = r,
                                        .residualOut = r,
                                        .output = x,
                                        .weight = w,
                                        .numTokens = tokens,
                                        .hiddenSize = hidden,
                                        .eps = 1e-5f,
                                        .dtype = dtype};
      const float ms = timeMs(iters, [&] {
        textgen::Status s = textgen::kernels::invokeRmsNorm(p, nullptr);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.toString().c_str());
          std::exit(1);
        }
      });
      BENCH_CUDA(cudaDeviceSynchronize());
      const double bytes = 4.0 * n * es + hidden * es;
      const double gbps = bytes / (ms * 1e-3) / 1e9;
      const bool l2 = 2.0 * n * es + hidden * es <= static_cast<double>(prop.l2CacheSize);
      results.push_back({tokens, hidden, ms * 1000.0f, gbps, gbps / copy, l2});
      BENCH_CUDA(cudaFree(x));
      BENCH_CUDA(cudaFree(r));
      BENCH_CUDA(cudaFree(w));
    }
  }

  std::printf("rms_norm + residual, bf16, in place, on %s (copy bandwidth %.0f GB/s)\n", prop.name,
              copy);
  std::printf("%8s %8s %10s %10s %10s\n", "tokens", "hidden", "us", "GB/s", "of copy");
  for (const Result& r : results) {
    std::printf("%8lld %8lld %10.2f %10.0f %9.1f%%%s\n", static_cast<long long>(r.tokens),
                static_cast<long long>(r.hidden), r.us, r.gbps, 100.0 * r.fraction,
                r.l2Resident ? "  (L2-resident)" : "");
  }
  std::printf(
      "L2-resident: the %d MB L2 holds the working set across calls, so the copy-bandwidth\n"
      "roofline does not bound those rows.\n",
      prop.l2CacheSize >> 20);
  std::string json = "{\"bench\":\"rms_norm\",\"dtype\":\"bfloat16\",\"device\":\"" +
                     std::string(prop.name) + "\",\"copy_gbps\":" + std::to_string(copy) +
                     ",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    json += (i ? "," : "") + std::string("{\"tokens\":") + std::to_string(r.tokens) +
            ",\"hidden\":" + std::to_string(r.hidden) + ",\"us\":" + std::to_string(r.us) +
            ",\"gbps\":" + std::to_string(r.gbps) +
            ",\"roofline_fraction\":" + std::to_string(r.fraction) + "}";
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}
