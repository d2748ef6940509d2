// Quantized linear layers on the GPU at decode batch sizes: time per call of invokeQuantGemm on
// Llama-2-7B's four linear shapes for each weight format beside bf16 (the GEMM runner's choice, and
// cuBLASLt alone), and the bytes the
// call must read (packed codes, scales, zero points) per second against the measured device copy
// bandwidth: at decode sizes the layer is memory-bound, so that fraction is its roofline fraction
// (issue 16 asks 80% of it for the 4-bit decode GEMV). Weights rotate over copies larger than the
// L2 cache together, so every call reads from DRAM as a model's decode step does, and the calls
// run from one CUDA graph, as the model's decode step runs them.
// Prints a table and one JSON line. Usage: bench_quant_gemm [--iters N] [--formats a,b] [--rows
// 1,8,64]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "textgen/kernels/gemm_runner.h"
#include "textgen/kernels/quant_gemm.h"

namespace {

using namespace textgen::kernels;

#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

void check(const textgen::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.toString().c_str());
    std::exit(1);
  }
}

// Milliseconds per call of fn(i) on `stream`: iters calls captured in one CUDA graph (as the
// model's decode step runs them: programmatic dependent launch between kernels, no launch gaps),
// after warm-up.
template <typename Fn>
float timeGraphMs(cudaStream_t stream, int iters, Fn&& fn) {
  for (int i = 0; i < 5; ++i) fn(i);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) fn(i);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  BENCH_CUDA(cudaEventRecord(start, stream));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaEventRecord(stop, stream));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return ms / static_cast<float>(iters);
}

// Milliseconds per call of fn(), averaged over iters after warm-up.
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

struct Shape {
  const char* name;
  int64_t out, in;
};

struct Format {
  const char* name;
  bool dense;  // 16-bit weights: the runner's choice ("bf16"), or cuBLASLt alone ("bf16-cublaslt")
  QuantCode code;
  ActQuant act;
  int64_t groupSize;  // 0: one group per output
};

struct Result {
  std::string format, shape;
  int64_t rows;
  double us, gbps;
};

// One copy of a layer's weight in a format.
struct Weights {
  void* packed = nullptr;
  float* scales = nullptr;
  uint8_t* zeros = nullptr;
  size_t bytes = 0;  // what one call reads of it
};

Weights makeWeights(const Format& f, const Shape& s) {
  Weights w;
  if (f.dense) {
    w.bytes = static_cast<size_t>(s.out * s.in) * 2;
    BENCH_CUDA(cudaMalloc(&w.packed, w.bytes));
    BENCH_CUDA(cudaMemset(w.packed, 0x3c, w.bytes));  // bf16 0x3c3c ~ 0.011
    return w;
  }
  const int64_t gs = f.groupSize ? f.groupSize : s.in, groups = s.in / gs;
  const size_t packedBytes = static_cast<size_t>(s.out * quantRowBytes(f.code, s.in));
  const size_t n = static_cast<size_t>(s.out * groups);
  BENCH_CUDA(cudaMalloc(&w.packed, packedBytes));
  BENCH_CUDA(cudaMemset(w.packed, 0x35, packedBytes));  // finite codes of every format
  std::vector<float> scales(n, 0.01f);
  BENCH_CUDA(cudaMalloc(&w.scales, n * sizeof(float)));
  BENCH_CUDA(cudaMemcpy(w.scales, scales.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  w.bytes = packedBytes + n * sizeof(float);
  if (quantHasZeros(f.code)) {
    BENCH_CUDA(cudaMalloc(&w.zeros, n));
    BENCH_CUDA(cudaMemset(w.zeros, f.code == QuantCode::kUint4 ? 8 : 128, n));
    w.bytes += n;
  }
  return w;
}

void freeWeights(Weights& w) {
  BENCH_CUDA(cudaFree(w.packed));
  if (w.scales) BENCH_CUDA(cudaFree(w.scales));
  if (w.zeros) BENCH_CUDA(cudaFree(w.zeros));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200;
  std::string only;  // comma-separated format names; empty: all
  std::vector<int64_t> rowsList = {1, 2, 4, 8, 16, 32, 64};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--formats") == 0 && i + 1 < argc) {
      only = "," + std::string(argv[++i]) + ",";
    } else if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      rowsList.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        const long long v = std::strtoll(p, &end, 10);
        if (end == p || v < 1 || v > 64) {
          std::fprintf(stderr, "--rows takes numbers from 1 to 64, comma-separated\n");
          return 2;
        }
        rowsList.push_back(v);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--formats a,b] [--rows 1,8,64]\n", argv[0]);
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "--iters must be positive\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_quant_gemm: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy = copyBandwidthGBps();
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto runnerOr = GemmRunner::create(stream, 64u << 20);
  check(runnerOr.status());
  GemmRunner& runner = **runnerOr;
  auto ltOr = GemmRunner::create(stream, 64u << 20, /*smallBatchGemv=*/false);
  check(ltOr.status());
  GemmRunner& lt = **ltOr;

  const Shape shapes[] = {
      {"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gate_up", 22016, 4096}, {"down", 4096, 11008}};
  const Format formats[] = {
      {"bf16", true, QuantCode::kUint4, ActQuant::kNone, 0},
      {"bf16-cublaslt", true, QuantCode::kUint4, ActQuant::kNone, 0},
      {"gptq-4bit-g128", false, QuantCode::kUint4, ActQuant::kNone, 128},
      {"nf4", false, QuantCode::kNf4, ActQuant::kNone, 64},
      {"eetq-int8", false, QuantCode::kUint8, ActQuant::kNone, 0},
      {"fp8-w8a8", false, QuantCode::kFp8E4M3, ActQuant::kFp8, 0},
  };
  float* tensorScale = nullptr;
  BENCH_CUDA(cudaMalloc(&tensorScale, 16));
  const float one = 0.01f;
  BENCH_CUDA(cudaMemcpy(tensorScale, &one, sizeof(float), cudaMemcpyHostToDevice));
  void *x = nullptr, *y = nullptr, *ws = nullptr;
  const size_t maxX = 64 * 22016 * 2;
  BENCH_CUDA(cudaMalloc(&x, maxX));
  BENCH_CUDA(cudaMemset(x, 0x3c, maxX));
  BENCH_CUDA(cudaMalloc(&y, maxX));
  size_t wsBytes = 64u << 20;
  BENCH_CUDA(cudaMalloc(&ws, wsBytes));

  std::vector<Result> results;
  auto wanted = [&](const Format& f) {
    return only.empty() || only.find("," + std::string(f.name) + ",") != std::string::npos;
  };
  for (const Format& f : formats) {
    if (!wanted(f)) continue;
    for (const Shape& s : shapes) {
      std::vector<Weights> copies;
      size_t total = 0;
      while (total < (size_t(256) << 20) || copies.size() < 2) {
        copies.push_back(makeWeights(f, s));
        total += copies.back().bytes;
      }
      for (int64_t rows : rowsList) {
        auto call = [&](int i) {
          const Weights& w = copies[static_cast<size_t>(i) % copies.size()];
          if (f.dense) {
            GemmRunner& r = std::strcmp(f.name, "bf16") == 0 ? runner : lt;
            check(r.run({x, w.packed, y, rows, s.in, s.out, DType::kBF16}));
            return;
          }
          QuantGemmParams p{.x = x,
                            .w = {.code = f.code,
                                  .packed = w.packed,
                                  .scales = w.scales,
                                  .zeros = w.zeros,
                                  .groupSize = f.groupSize ? f.groupSize : s.in,
                                  .act = f.act,
                                  .tensorScale = f.act == ActQuant::kFp8 ? tensorScale : nullptr},
                            .y = y,
                            .rows = rows,
                            .in = s.in,
                            .out = s.out,
                            .dtype = DType::kBF16};
          if (quantGemmWorkspaceBytes(p) > wsBytes) {
            std::fprintf(stderr, "bench_quant_gemm: workspace too small\n");
            std::exit(1);
          }
          check(invokeQuantGemm(p, ws, wsBytes, runner, stream));
        };
        const float ms = timeGraphMs(stream, iters, call);
        BENCH_CUDA(cudaGetLastError());
        const double bytes = static_cast<double>(copies[0].bytes);
        results.push_back({f.name, s.name, rows, ms * 1e3, bytes / (ms * 1e-3) / 1e9});
      }
      for (Weights& w : copies) freeWeights(w);
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());

  std::printf(
      "quantized linear layers, bf16 x, Llama-2-7B shapes, on %s (copy bandwidth %.0f GB/s)\n",
      prop.name, copy);
  std::printf("%-16s %-8s %5s %10s %10s %9s\n", "format", "shape", "rows", "us", "GB/s", "of copy");
  for (const Result& r : results)
    std::printf("%-16s %-8s %5lld %10.2f %10.0f %8.1f%%\n", r.format.c_str(), r.shape.c_str(),
                static_cast<long long>(r.rows), r.us, r.gbps, 100.0 * r.gbps / copy);
  // A decode step's linear layers (32 layers of the four shapes, the head aside), per format/rows.
  std::printf("\nper decode step (32 layers x 4 shapes), ms:\n%-16s", "format");
  for (int64_t rows : rowsList) std::printf(" %8s%lld", "rows=", static_cast<long long>(rows));
  std::printf("\n");
  for (const Format& f : formats) {
    if (!wanted(f)) continue;
    std::printf("%-16s", f.name);
    for (int64_t rows : rowsList) {
      double us = 0;
      for (const Result& r : results)
        if (r.format == f.name && r.rows == rows) us += r.us;
      std::printf(" %13.3f", 32 * us / 1e3);
    }
    std::printf("\n");
  }
  std::string json = "{\"bench\":\"quant_gemm\",\"dtype\":\"bfloat16\",\"device\":\"" +
                     std::string(prop.name) + "\",\"copy_gbps\":" + std::to_string(copy) +
                     ",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    json += (i ? "," : "") + std::string("{\"format\":\"") + r.format + "\",\"shape\":\"" +
            r.shape + "\",\"rows\":" + std::to_string(r.rows) + ",\"us\":" + std::to_string(r.us) +
            ",\"gbps\":" + std::to_string(r.gbps) + "}";
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  BENCH_CUDA(cudaFree(tensorScale));
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(y));
  BENCH_CUDA(cudaFree(ws));
  return 0;
}
