// Dense GEMMs of prefill-sized problems through cuBLASLt: per shape, the heuristic's first choice
// against the fastest of its candidates, bfloat16 and float8 e4m3 (per-tensor scales, with and
// without fast accumulation). y[rows, out] = x[rows, in] · W[out, in]ᵀ, the shard's "TN" layout.
// Weights rotate over copies larger than L2, as a model's layers follow one another. Prints, per
// (format, rows, shape), µs and TFLOP/s for the first choice and the best candidate, then the sum
// over one Llama layer's four linear layers, then one JSON line.
// Usage: bench_gemm [--iters N] [--rows R,...] [--candidates K] [--shapes IN:OUT,...]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

#define BENCH_LT(expr)                                                   \
  do {                                                                   \
    cublasStatus_t s_ = (expr);                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cublasLtGetStatusString(s_));                         \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

// kFp8Row*: a scale per weight row (output channel) and per activation row (token), cuBLASLt's
// outer-vector scale mode, as TGI's and vLLM's dynamic per-token fp8.
enum class Format { kBf16, kFp8, kFp8Fast, kFp8Row, kFp8RowFast };
const char* formatName(Format f) {
  switch (f) {
    case Format::kBf16: return "bf16";
    case Format::kFp8: return "fp8";
    case Format::kFp8Fast: return "fp8-fastacc";
    case Format::kFp8Row: return "fp8-row";
    case Format::kFp8RowFast: return "fp8-row-fast";
  }
  return "?";
}
bool fastAccum(Format f) {
  return f == Format::kFp8Fast || f == Format::kFp8RowFast;
}
bool rowScales(Format f) {
  return f == Format::kFp8Row || f == Format::kFp8RowFast;
}

struct Shape {
  int64_t in, out;
};

struct Row {
  Format format;
  int64_t rows;
  Shape shape;
  double firstUs, bestUs;
  int bestIndex, found;
};

bool parseList(const char* s, std::vector<int64_t>& out) {
  out.clear();
  while (*s) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end == s || v <= 0 || v > 65536) return false;
    out.push_back(v);
    if (*end == ',')
      ++end;
    else if (*end)
      return false;
    s = end;
  }
  return !out.empty();
}

bool parseShapes(const char* s, std::vector<Shape>& out) {
  out.clear();
  while (*s) {
    char* end = nullptr;
    const long in = std::strtol(s, &end, 10);
    if (end == s || *end != ':' || in <= 0 || in > 65536) return false;
    s = end + 1;
    const long o = std::strtol(s, &end, 10);
    if (end == s || o <= 0 || o > 262144) return false;
    out.push_back({in, o});
    if (*end == ',')
      ++end;
    else if (*end)
      return false;
    s = end;
  }
  return !out.empty();
}

uint32_t xorshift(uint32_t& x) {
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return x;
}

// Small random values: bfloat16 with exponents 2^-8..2^-1; e4m3 with exponents 2^-4..2^2 (never
// the NaN codes).
void fillBf16(std::vector<uint16_t>& v, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    const uint32_t r = xorshift(x);
    e = static_cast<uint16_t>((r & 0x8000u) | ((119u + (r >> 7) % 8) << 7) | (r & 0x7Fu));
  }
}
void fillFp8(std::vector<uint8_t>& v, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    const uint32_t r = xorshift(x);
    e = static_cast<uint8_t>((r & 0x80u) | ((3u + (r >> 8) % 7) << 3) | (r & 0x7u));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, candidates = 16;
  std::vector<int64_t> rowsList = {128, 256, 512, 1024, 2048, 4096};
  // Llama-2-7B's linear layers: QKV, output, gate+up, down.
  std::vector<Shape> shapes = {{4096, 12288}, {4096, 4096}, {4096, 22016}, {11008, 4096}};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--candidates") == 0 && i + 1 < argc) {
      candidates = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      if (!parseList(argv[++i], rowsList)) {
        std::fprintf(stderr, "--rows: R[,R...]\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) {
      if (!parseShapes(argv[++i], shapes)) {
        std::fprintf(stderr, "--shapes: IN:OUT[,IN:OUT...]\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iters N] [--rows R,...] [--candidates K] [--shapes IN:OUT,...]\n",
                   argv[0]);
      return 2;
    }
  }
  if (iters <= 0 || candidates <= 0 || candidates > 64) {
    std::fprintf(stderr, "bad --iters or --candidates\n");
    return 2;
  }
  for (const Shape& s : shapes) {
    if (s.in % 16 != 0 || s.out % 16 != 0) {
      std::fprintf(stderr, "shapes must be multiples of 16 (FP8)\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cublasLtHandle_t handle;
  BENCH_LT(cublasLtCreate(&handle));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  size_t workspaceBytes = size_t{32} << 20;  // the CUDA backend's GEMM workspace
  void* workspace = nullptr;
  BENCH_CUDA(cudaMalloc(&workspace, workspaceBytes));
  float* scales = nullptr;
  // Scale pointers 16-byte aligned, as the shard's workspace gives them.
  BENCH_CUDA(cudaMalloc(&scales, 8 * sizeof(float)));
  const float hScales[8] = {0.01f, 0, 0, 0, 0.02f, 0, 0, 0};
  BENCH_CUDA(cudaMemcpy(scales, hScales, sizeof hScales, cudaMemcpyHostToDevice));
  const float* scaleW = scales;
  const float* scaleX = scales + 4;

  int64_t maxRows = *std::max_element(rowsList.begin(), rowsList.end());
  int64_t maxIn = 0, maxOut = 0, maxW = 0;
  for (const Shape& s : shapes) {
    maxIn = std::max(maxIn, s.in);
    maxOut = std::max(maxOut, s.out);
    maxW = std::max(maxW, s.in * s.out);
  }
  // Enough weight copies to pass 3x the L2 in 16-bit, for the smallest shape too.
  const int64_t copies =
      std::max<int64_t>(2, (3 * static_cast<int64_t>(prop.l2CacheSize)) / (2 * maxW) + 2);
  std::vector<void*> w16(copies), w8(copies);
  {
    std::vector<uint16_t> hw(static_cast<size_t>(maxW));
    std::vector<uint8_t> hw8(static_cast<size_t>(maxW));
    fillBf16(hw, 1);
    fillFp8(hw8, 2);
    for (int64_t c = 0; c < copies; ++c) {
      BENCH_CUDA(cudaMalloc(&w16[c], maxW * 2));
      BENCH_CUDA(cudaMalloc(&w8[c], maxW));
      BENCH_CUDA(cudaMemcpy(w16[c], hw.data(), maxW * 2, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(w8[c], hw8.data(), maxW, cudaMemcpyHostToDevice));
    }
  }
  void *x16, *x8, *y;
  {
    const size_t n = static_cast<size_t>(maxRows * maxIn);
    std::vector<uint16_t> hx(n);
    std::vector<uint8_t> hx8(n);
    fillBf16(hx, 3);
    fillFp8(hx8, 4);
    BENCH_CUDA(cudaMalloc(&x16, n * 2));
    BENCH_CUDA(cudaMalloc(&x8, n));
    BENCH_CUDA(cudaMemcpy(x16, hx.data(), n * 2, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(x8, hx8.data(), n, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(maxRows * maxOut) * 2));
  }
  // Per-channel and per-token scales (outer-vector mode), 0.01 each.
  float *rowScaleW = nullptr, *rowScaleX = nullptr;
  {
    BENCH_CUDA(cudaMalloc(&rowScaleW, maxOut * sizeof(float)));
    BENCH_CUDA(cudaMalloc(&rowScaleX, maxRows * sizeof(float)));
    std::vector<float> ones(static_cast<size_t>(std::max(maxOut, maxRows)), 0.01f);
    BENCH_CUDA(cudaMemcpy(rowScaleW, ones.data(), maxOut * sizeof(float), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(rowScaleX, ones.data(), maxRows * sizeof(float), cudaMemcpyHostToDevice));
  }
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));

  std::printf("%s, %d SMs, L2 %d MB, %lld weight copies\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, static_cast<long long>(copies));
  std::vector<Row> rowsOut;
  for (Format f :
       {Format::kBf16, Format::kFp8, Format::kFp8Fast, Format::kFp8Row, Format::kFp8RowFast}) {
    const bool fp8 = f != Format::kBf16;
    for (int64_t rows : rowsList) {
      for (const Shape& s : shapes) {
        cublasLtMatmulDesc_t op;
        BENCH_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        if (fp8) {
          BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scaleW,
                                                  sizeof scaleW));
          BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scaleX,
                                                  sizeof scaleX));
          if (rowScales(f)) {
            const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                                    sizeof mode));
            BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                                    sizeof mode));
            BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &rowScaleW, sizeof rowScaleW));
            BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &rowScaleX, sizeof rowScaleX));
          }
          if (fastAccum(f)) {
            const int8_t fast = 1;
            BENCH_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                    sizeof fast));
          }
        }
        const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        cublasLtMatrixLayout_t la, lb, lc;
        BENCH_LT(cublasLtMatrixLayoutCreate(&la, ab, s.in, s.out, s.in));
        BENCH_LT(cublasLtMatrixLayoutCreate(&lb, ab, s.in, rows, s.in));
        BENCH_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.out, rows, s.out));
        cublasLtMatmulPreference_t pref;
        BENCH_LT(cublasLtMatmulPreferenceCreate(&pref));
        BENCH_LT(cublasLtMatmulPreferenceSetAttribute(pref,
                                                      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspaceBytes, sizeof workspaceBytes));
        std::vector<cublasLtMatmulHeuristicResult_t> res(candidates);
        int found = 0;
        BENCH_LT(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, candidates,
                                                res.data(), &found));
        cublasLtMatmulPreferenceDestroy(pref);
        const float alpha = 1.0f, beta = 0.0f;
        double firstUs = -1, bestUs = -1;
        int bestIndex = -1;
        for (int c = 0; c < found; ++c) {
          int64_t next = 0;
          auto once = [&] {
            const void* w = fp8 ? w8[next % copies] : w16[next % copies];
            ++next;
            return cublasLtMatmul(handle, op, &alpha, w, la, fp8 ? x8 : x16, lb, &beta, y, lc, y,
                                  lc, &res[c].algo, workspace, workspaceBytes, stream);
          };
          if (const cublasStatus_t st = once(); st != CUBLAS_STATUS_SUCCESS) {
            std::fprintf(stderr, "%s %lld %lld:%lld candidate %d: %s\n", formatName(f),
                         static_cast<long long>(rows), static_cast<long long>(s.in),
                         static_cast<long long>(s.out), c, cublasLtGetStatusString(st));
            cudaGetLastError();
            continue;
          }
          for (int k = 0; k < 2; ++k) once();
          float best = -1;
          for (int rep = 0; rep < 3; ++rep) {
            BENCH_CUDA(cudaEventRecord(start, stream));
            for (int k = 0; k < iters; ++k) once();
            BENCH_CUDA(cudaEventRecord(stop, stream));
            BENCH_CUDA(cudaEventSynchronize(stop));
            float ms = 0;
            BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
            best = best < 0 ? ms : std::min(best, ms);
          }
          const double us = 1e3 * best / iters;
          if (c == 0) firstUs = us;
          if (bestIndex < 0 || us < bestUs) {
            bestUs = us;
            bestIndex = c;
          }
        }
        rowsOut.push_back({f, rows, s, firstUs, bestUs, bestIndex, found});
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
      }
    }
  }

  std::printf("%-12s %6s %12s %4s %10s %8s %10s %8s %6s\n", "format", "rows", "in:out", "cand",
              "first us", "TFLOP/s", "best us", "TFLOP/s", "best#");
  for (const Row& r : rowsOut) {
    const double flop = 2.0 * r.rows * r.shape.in * r.shape.out;
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lld:%lld", static_cast<long long>(r.shape.in),
                  static_cast<long long>(r.shape.out));
    std::printf("%-12s %6lld %12s %4d %10.1f %8.0f %10.1f %8.0f %6d\n", formatName(r.format),
                static_cast<long long>(r.rows), shape, r.found, r.firstUs, flop / (r.firstUs * 1e6),
                r.bestUs, flop / (r.bestUs * 1e6), r.bestIndex);
  }
  // Per (format, rows): the layer's sum, first choice against best.
  std::printf("\n%-12s %6s %12s %12s %8s\n", "format", "rows", "layer first", "layer best", "gain");
  std::string json = "{\"bench\":\"gemm\",\"gpu\":\"" + std::string(prop.name) + "\",\"results\":[";
  bool firstJson = true;
  for (size_t i = 0; i < rowsOut.size();) {
    double first = 0, best = 0;
    size_t j = i;
    for (; j < rowsOut.size() && rowsOut[j].format == rowsOut[i].format &&
           rowsOut[j].rows == rowsOut[i].rows;
         ++j) {
      first += rowsOut[j].firstUs;
      best += rowsOut[j].bestUs;
    }
    std::printf("%-12s %6lld %12.1f %12.1f %7.1f%%\n", formatName(rowsOut[i].format),
                static_cast<long long>(rowsOut[i].rows), first, best,
                100.0 * (first - best) / first);
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "%s{\"format\":\"%s\",\"rows\":%lld,\"first_us\":%.1f,\"best_us\":%.1f}",
                  firstJson ? "" : ",", formatName(rowsOut[i].format),
                  static_cast<long long>(rowsOut[i].rows), first, best);
    json += buf;
    firstJson = false;
    i = j;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}
