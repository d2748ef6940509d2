// The small-batch GEMM kernel GemmRunner uses for decode-sized problems (internal to kernels/).
#pragma once

#include "textgen/kernels/gemm.h"

namespace textgen::kernels {

// One row only: at 4 rows re-reading x per weight vector makes it slower than cuBLASLt
// (bench_cuda_model's GEMM table).
constexpr int64_t kMaxGemvRows = 1;

// float16/bfloat16, rows <= kMaxGemvRows, `in` a multiple of 8, x and W 16-byte aligned.
bool gemvApplies(const GemmParams& p);
Status invokeGemv(const GemmParams& p, Stream stream);

}  // namespace textgen::kernels
