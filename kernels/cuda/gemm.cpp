// GemmRunner: the gemv kernel for decode-sized problems (rows <= 8, 16-bit), cuBLASLt otherwise.
// Row-major y = x·Wᵀ is, in cuBLAS's column-major terms, yᵀ[out, rows] = op(W)[out, in] · xᵀ[in,
// rows] with op = transpose: the "TN" GEMM, cuBLAS's fastest layout. Descriptors and the
// heuristic's choice are cached per (rows, in, out, dtype); up to 64 rows the heuristic's
// candidates are timed first and the fastest cached.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gemv.h"
#include "textgen/kernels/gemm_runner.h"

namespace textgen::kernels {
namespace {

Status cublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return okStatus();
  return internalError(std::string("gemm: ") + what + " failed: " + cublasLtGetStatusName(s) +
                       " (" + cublasLtGetStatusString(s) + ")");
}

#define TG_CUBLAS(expr) TG_RETURN_IF_ERROR(cublasStatus((expr), #expr))

cudaDataType_t cudaType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// TEXTGEN_FP8_FAST_ACCUM=1: FP8 GEMMs accumulate in the tensor cores' own precision, without
// cuBLASLt's periodic promotion of the partial sums to float32, as vLLM's Hopper FP8 kernels do
// (CUTLASS's FP8FastAccum schedules). On an H200 that makes Llama-2-7B's GEMMs at 512 rows 7%
// faster and its fp8 prefill 4% faster (bench/README.md), but the outputs leave the kernel test's
// tolerance (QuantGemmCudaTest.Fp8ActivationsMatchTheReference, twice the dtype's), so it is off
// by default.
bool fp8FastAccum() {
  static const bool on = [] {
    const char* v = std::getenv("TEXTGEN_FP8_FAST_ACCUM");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

class LtRunner final : public GemmRunner {
 public:
  LtRunner(cublasLtHandle_t handle, void* workspace, size_t workspaceBytes, cudaStream_t stream,
           bool gemv)
      : handle_(handle),
        workspace_(workspace),
        workspaceBytes_(workspaceBytes),
        stream_(stream),
        gemv_(gemv),
        gemvRows_(gemv ? 1 : 0) {}
  ~LtRunner() override {
    plans_.clear();
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }

  void setGemvRows(int64_t rows) override {
    gemvRows_ = gemv_ ? std::clamp<int64_t>(rows, 1, kMaxGemvRows) : 0;
  }

  Status run(const GemmParams& p) override {
    TG_RETURN_IF_ERROR(validateGemm(p));
    if (p.rows == 0) return okStatus();
    if (gemvRows_ > 0 && gemvApplies(p, gemvRows_)) return invokeGemv(p, stream_);
    TG_ASSIGN_OR_RETURN(const Plan* plan, planFor(p, false));
    const float alpha = 1.0f, beta = 0.0f;
    TG_CUBLAS(cublasLtMatmul(handle_, plan->op, &alpha, p.weight, plan->a, p.x, plan->b, &beta, p.y,
                             plan->c, p.y, plan->c, &plan->algo, workspace_, workspaceBytes_,
                             stream_));
    return okStatus();
  }

  bool takesGated(const GemmParams& p) const override {
    return gemvRows_ > 0 && p.out % 2 == 0 && gemvApplies(p, gemvRows_);
  }

  Status runGated(const GemmParams& p, Activation a) override {
    TG_RETURN_IF_ERROR(validateGemm(p));
    if (!takesGated(p))
      return unimplementedError("gemm: a gated product only where the gemv kernel takes it");
    if (p.rows == 0) return okStatus();
    return invokeGemvGated(p, a, stream_);
  }

  Status runFp8(const GemmParams& p, const float* scaleW, const float* scaleX) override {
    TG_RETURN_IF_ERROR(validateGemm(p));
    if (p.dtype == DType::kF32 || p.in % 16 != 0 || p.out % 16 != 0)
      return invalidArgumentError("gemm: FP8 needs a 16-bit output and in, out multiples of 16");
    if (p.rows == 0) return okStatus();
    TG_ASSIGN_OR_RETURN(const Plan* plan, planFor(p, true, scaleW, scaleX));
    // The scales are read on the device when the GEMM runs (graph replays see new values); the
    // pointers are this call's (layers of one shape share a plan).
    TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                             &scaleW, sizeof scaleW));
    TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                             &scaleX, sizeof scaleX));
    const float alpha = 1.0f, beta = 0.0f;
    TG_CUBLAS(cublasLtMatmul(handle_, plan->op, &alpha, p.weight, plan->a, p.x, plan->b, &beta, p.y,
                             plan->c, p.y, plan->c, &plan->algo, workspace_, workspaceBytes_,
                             stream_));
    return okStatus();
  }

 private:
  StatusOr<const Plan*> planFor(const GemmParams& p, bool fp8, const float* scaleW = nullptr,
                                const float* scaleX = nullptr) {
    const auto key = std::make_tuple(p.rows, p.in, p.out, p.dtype, fp8);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    const cudaDataType_t t = cudaType(p.dtype);
    const cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : t;
    TG_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transA = CUBLAS_OP_T, transB = CUBLAS_OP_N;
    TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transA,
                                             sizeof transA));
    TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &transB,
                                             sizeof transB));
    if (fp8) {  // the heuristic picks among FP8 kernels for scaled operands
      TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &scaleW, sizeof scaleW));
      TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &scaleX, sizeof scaleX));
      if (fp8FastAccum()) {
        const int8_t fast = 1;
        TG_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                 sizeof fast));
      }
    }
    const auto rows = static_cast<uint64_t>(p.rows), in = static_cast<uint64_t>(p.in),
               out = static_cast<uint64_t>(p.out);
    TG_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, ab, in, out, p.in));
    TG_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, ab, in, rows, p.in));
    TG_CUBLAS(cublasLtMatrixLayoutCreate(&plan->c, t, out, rows, p.out));
    cublasLtMatmulPreference_t pref = nullptr;
    TG_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    Status st = cublasStatus(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspaceBytes_, sizeof workspaceBytes_),
        "set workspace preference");
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
    int found = 0;
    if (st.ok()) {
      st = cublasStatus(
          cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c,
                                         pref, kTuneCandidates, results, &found),
          "algorithm heuristic");
    }
    cublasLtMatmulPreferenceDestroy(pref);
    TG_RETURN_IF_ERROR(st);
    if (found == 0) {
      return internalError("gemm: cuBLASLt has no algorithm for " + std::to_string(p.rows) + "x" +
                           std::to_string(p.in) + "x" + std::to_string(p.out));
    }
    plan->algo = results[0].algo;
    // Decode-sized problems: the heuristic's first choice is not always the fastest (32 rows of
    // Llama-2-7B decoded slower than 64 with it), so its candidates are timed once, on the real
    // operands, and the fastest kept. Not while a graph is being captured (nothing may wait then):
    // that plan keeps the heuristic's choice and is not cached, so a later eager call tunes it.
    bool tuned = false;
    if (p.rows <= kTuneRows && found > 1) {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream_, &capturing) == cudaSuccess &&
          capturing == cudaStreamCaptureStatusNone) {
        tune(p, *plan, results, found);
        tuned = true;
      }
    }
    const Plan* raw = plan.get();
    if (!tuned && p.rows <= kTuneRows && found > 1) {
      untuned_.push_back(std::move(plan));  // kept alive for the graph that captured it
      return raw;
    }
    plans_.emplace(key, std::move(plan));
    return raw;
  }

  // Times each candidate (one warm-up run, then the best of three timings of kRuns back-to-back
  // runs, so that the host's enqueue time is not what is measured) and keeps the fastest in `plan`
  // where it beats the heuristic's first choice by more than 5% (the choice stays the same from
  // run to run unless it clearly matters). A candidate that fails to run is skipped; timing errors
  // leave the heuristic's choice.
  void tune(const GemmParams& p, Plan& plan, const cublasLtMatmulHeuristicResult_t* results,
            int found) {
    constexpr int kRuns = 4;
    cudaEvent_t start = nullptr, stop = nullptr;
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
      if (start) cudaEventDestroy(start);
      cudaGetLastError();
      return;
    }
    const float alpha = 1.0f, beta = 0.0f;
    float best = 0.0f, first = -1.0f;
    int bestIndex = -1;
    for (int i = 0; i < found; ++i) {
      auto once = [&] {
        return cublasLtMatmul(handle_, plan.op, &alpha, p.weight, plan.a, p.x, plan.b, &beta, p.y,
                              plan.c, p.y, plan.c, &results[i].algo, workspace_, workspaceBytes_,
                              stream_) == CUBLAS_STATUS_SUCCESS;
      };
      if (!once()) continue;
      float fastest = -1.0f;
      for (int rep = 0; rep < 3; ++rep) {
        float ms = 0.0f;
        bool ran = cudaEventRecord(start, stream_) == cudaSuccess;
        for (int k = 0; ran && k < kRuns; ++k) ran = once();
        if (!ran || cudaEventRecord(stop, stream_) != cudaSuccess ||
            cudaEventSynchronize(stop) != cudaSuccess ||
            cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
          fastest = -1.0f;
          break;
        }
        fastest = fastest < 0.0f ? ms : std::min(fastest, ms);
      }
      if (fastest < 0.0f) continue;
      if (i == 0) first = fastest;
      if (bestIndex < 0 || fastest < best) {
        best = fastest;
        bestIndex = i;
      }
    }
    // The heuristic's choice unless another is more than 5% faster.
    if (first >= 0.0f && best > 0.95f * first) bestIndex = 0;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaGetLastError();  // a failed candidate's launch error is not the caller's
    if (bestIndex >= 0) plan.algo = results[bestIndex].algo;
  }

  static constexpr int kTuneCandidates = 8;
  static constexpr int64_t kTuneRows = 64;

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspaceBytes_;
  cudaStream_t stream_;
  bool gemv_;
  int64_t gemvRows_;  // the most rows the gemv kernel takes; 0: never
  std::map<std::tuple<int64_t, int64_t, int64_t, DType, bool>, std::unique_ptr<Plan>> plans_;
  std::vector<std::unique_ptr<Plan>> untuned_;  // made during a capture, used by its graph
};

}  // namespace

StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::create(Stream stream, size_t workspaceBytes,
                                                         bool smallBatchGemv) {
  cublasLtHandle_t handle = nullptr;
  TG_CUBLAS(cublasLtCreate(&handle));
  void* workspace = nullptr;
  if (workspaceBytes > 0) {
    const cudaError_t err = cudaMalloc(&workspace, workspaceBytes);
    if (err != cudaSuccess) {
      cublasLtDestroy(handle);
      return resourceExhaustedError("gemm: cannot allocate a " + std::to_string(workspaceBytes) +
                                    "-byte workspace: " + cudaGetErrorString(err));
    }
  }
  return std::unique_ptr<GemmRunner>(
      std::make_unique<LtRunner>(handle, workspace, workspaceBytes, stream, smallBatchGemv));
}

}  // namespace textgen::kernels
