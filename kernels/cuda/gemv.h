// The small-batch GEMM kernel GemmRunner uses for decode-sized problems (internal to kernels/).
#pragma once

#include "textgen/kernels/activation.h"
#include "textgen/kernels/gemm.h"

namespace textgen::kernels {

// Up to 8 rows. By default one row only: at 4 rows re-reading x per weight vector makes it slower
// than cuBLASLt (bench_cuda_model's GEMM table). Speculative decoding's verification rows take it
// up to 1 + speculate rows (GemmRunner's gemvMaxRows): each row is computed exactly as a one-row
// call computes it (the same loads, FMAs and reduction), so a verified token's logits are those of
// plain decoding, bit for bit.
constexpr int64_t kMaxGemvRows = 8;

// float16/bfloat16, rows <= maxRows (<= kMaxGemvRows), `in` a multiple of 8, x and W 16-byte
// aligned.
bool gemvApplies(const GemmParams& p, int64_t maxRows);
Status invokeGemv(const GemmParams& p, Stream stream);
// The same where W is [gate; up] stacked (p.out = 2n, even): y [rows, n] = act(x gateᵀ) * (x upᵀ),
// bit for bit invokeGemv then the gated activation kernel (gated_activation.h).
Status invokeGemvGated(const GemmParams& p, Activation a, Stream stream);

}  // namespace textgen::kernels
