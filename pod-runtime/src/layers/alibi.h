// ALiBi's per-head slopes (Press et al.; BLOOM, MPT, Falcon with alibi), computed on the host as
// transformers computes them, then sliced for a tensor-parallel rank. Paged attention adds
// slope[h] * (j - i) to the score of query position i and key position j
// (kernels/paged_attention.h).
//
// For 2^n heads both models use 2^(-8 (h + 1) / 2^n). Otherwise BLOOM (build_alibi_tensor) takes
// the closest power of two below, P, its P slopes 2^(-8 k / P), then the odd powers of
// 2^(-4 / P) for the remaining heads; MPT (build_mpt_alibi_tensor) takes the power of two above,
// Q = 2P, slopes 2^(-k alibiBiasMax / Q) for k = 1..Q, and orders them even k first, then odd k,
// keeping the first numHeads. With alibiBiasMax = 8 the two orders give the same slopes; they
// differ for any other alibiBiasMax. Values match torch's float32 arithmetic within one rounding.
// Falcon (alibi=True) uses BLOOM's slopes but rounds slope * position to bfloat16 itself, which a
// relative bias cannot reproduce bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::runtime {

// [numHeads], numHeads > 0.
std::vector<float> bloomAlibiSlopes(int64_t numHeads);
std::vector<float> mptAlibiSlopes(int64_t numHeads, double alibiBiasMax = 8.0);

// Rank r of `world` takes heads [r * h / world, (r + 1) * h / world), as the q projection's
// column split does (layers/partition.h). INVALID_ARGUMENT when the heads do not divide or the
// rank is out of range.
StatusOr<std::vector<float>> alibiSlopesForRank(const std::vector<float>& slopes, int rank,
                                                int world);

}  // namespace textgen::runtime
