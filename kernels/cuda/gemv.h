// The small-batch GEMM kernel GemmRunner uses for decode-sized problems (internal to kernels/).
#pragma once

#include "textgen/kernels/gemm.h"

namespace textgen::kernels {

constexpr int64_t kMaxGemvRows = 4;

// float16/bfloat16, rows <= kMaxGemvRows, `in` a multiple of 8, x and W 16-byte aligned.
bool gemvApplies(const GemmParams& p);
Status invokeGemv(const GemmParams& p, Stream stream);

}  // namespace textgen::kernels
