#include "textgen/kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "elements.h"
#include "textgen/kernels/relative_position.h"

namespace textgen::kernels {

Status validatePagedAttention(const PagedAttentionParams& p) {
  if (p.rows < 0 || p.numSeqs < 0 || p.numHeads <= 0 || p.numKvHeads <= 0 || p.headDim <= 0 ||
      p.blockSize <= 0 || p.maxBlocksPerSeq < 0)
    return invalidArgumentError("paged_attention: bad shape");
  if (p.numHeads % p.numKvHeads != 0)
    return invalidArgumentError("paged_attention: numHeads must be a multiple of numKvHeads");
  if (p.headDim > 256) return invalidArgumentError("paged_attention: headDim above 256");
  if (p.qRowStride < p.numHeads * p.headDim)
    return invalidArgumentError("paged_attention: the q row stride is shorter than the row");
  if (p.rows > 0 &&
      (!p.q || !p.kCache || !p.vCache || !p.out || !p.seqStarts || !p.startPos || !p.blockTables))
    return invalidArgumentError("paged_attention: a pointer is missing");
  if (p.rows > 0 && (p.maxNewRows <= 0 || p.maxContext <= 0))
    return invalidArgumentError("paged_attention: maxNewRows and maxContext are required");
  if (!std::isfinite(p.alibiBf16Divisor) || p.alibiBf16Divisor < 0.0f)
    return invalidArgumentError("paged_attention: alibiBf16Divisor must be finite and >= 0");
  if (!isValid(p.cacheDtype)) return invalidArgumentError("paged_attention: unknown cache dtype");
  if (p.relativeBias) {
    if (p.alibiSlopes)
      return invalidArgumentError("paged_attention: a relative bias and ALiBi together");
    if (!validRelativePositionConfig(p.relativeBidirectional, p.relativeBuckets,
                                     p.relativeMaxDistance))
      return invalidArgumentError("paged_attention: bad relative bucket count or max distance");
  } else if (p.relativeBuckets != 0 || p.relativeMaxDistance != 0 || p.relativeBidirectional) {
    return invalidArgumentError("paged_attention: relative bucket settings without a bias table");
  }
  if (p.contextLens && p.causal)
    return invalidArgumentError("paged_attention: contextLens requires causal = false");
  if (!p.causal && p.slidingWindow > 0)
    return invalidArgumentError("paged_attention: a sliding window in a non-causal call");
  return okStatus();
}

namespace {

// Keys [lo, end) of the row at position pos of sequence s, which has numRows new rows.
struct KeyRange {
  int64_t lo = 0, end = 0;
};

KeyRange keysOf(const PagedAttentionParams& p, int64_t s, int64_t pos, int64_t numRows) {
  if (p.contextLens) return {0, p.contextLens[s]};
  if (!p.causal) return {0, p.startPos[s] + numRows};
  return {p.slidingWindow > 0 ? std::max<int64_t>(0, pos - p.slidingWindow + 1) : 0, pos + 1};
}

// The positions the call reads of sequence s must lie in its blocks (and, for the device's
// partitions, under maxContext when contextLens sets them).
Status checkContext(const PagedAttentionParams& p, int64_t s, int64_t numRows) {
  const int64_t capacity = p.maxBlocksPerSeq * p.blockSize;
  if (p.contextLens) {
    const int64_t len = p.contextLens[s];
    if (len < 0 || len > capacity || len > p.maxContext)
      return invalidArgumentError("paged_attention: contextLens of sequence " + std::to_string(s) +
                                  " is negative, past its blocks or past maxContext");
  } else if (p.startPos[s] + numRows > capacity) {
    return invalidArgumentError("paged_attention: sequence " + std::to_string(s) +
                                " has fewer blocks than positions");
  }
  return okStatus();
}

// The bias of key position j for query position pos and head h: ALiBi's or T5's (or none).
float biasOf(const PagedAttentionParams& p, float slope, int64_t h, int64_t j, int64_t pos) {
  if (p.alibiSlopes && p.alibiBf16Divisor > 0.0f) {
    const float product = bf16ToFloat(floatToBf16(slope * static_cast<float>(j)));
    return product / p.alibiBf16Divisor;
  }
  if (p.alibiSlopes) return slope * static_cast<float>(j - pos);
  if (p.relativeBias) {
    const int bucket = relativePositionBucket(static_cast<int>(j - pos), p.relativeBidirectional,
                                              p.relativeBuckets, p.relativeMaxDistance);
    return p.relativeBias[int64_t{bucket} * p.numHeads + h];
  }
  return 0.0f;
}

// The reference with the cache read through `cache` (Elements, or CacheElements for fp8: the
// compute-dtype cache keeps the loop it had).
template <typename CacheLoad>
Status attend(const PagedAttentionParams& p, const CacheLoad& cache) {
  const Elements e{p.dtype};
  const int64_t group = p.numHeads / p.numKvHeads;
  const int64_t kvWidth = p.numKvHeads * p.headDim;
  const bool biased = p.alibiSlopes || p.relativeBias;
  std::vector<float> scores, acc(p.headDim);
  for (int64_t s = 0; s < p.numSeqs; ++s) {
    const int32_t* blocks = p.blockTables + s * p.maxBlocksPerSeq;
    const int64_t first = p.seqStarts[s], numRows = p.seqStarts[s + 1] - first;
    TG_RETURN_IF_ERROR(checkContext(p, s, numRows));
    for (int64_t t = 0; t < numRows; ++t) {
      const int64_t row = first + t, pos = p.startPos[s] + t;
      const auto [lo, end] = keysOf(p, s, pos, numRows);
      scores.assign(std::max<int64_t>(end, 0), 0.0f);
      for (int64_t h = 0; h < p.numHeads; ++h) {
        const int64_t qOff = row * p.qRowStride + h * p.headDim, kvh = h / group;
        const float slope = p.alibiSlopes ? p.alibiSlopes[h] : 0.0f;
        float maxScore = -INFINITY;
        for (int64_t j = lo; j < end; ++j) {
          const int64_t slot = int64_t{blocks[j / p.blockSize]} * p.blockSize + j % p.blockSize;
          const int64_t kOff = slot * kvWidth + kvh * p.headDim;
          float dot = 0.0f;
          for (int64_t d = 0; d < p.headDim; ++d)
            dot += e.load(p.q, qOff + d) * cache.load(p.kCache, kOff + d);
          scores[j] = dot * p.scale;
          if (biased) scores[j] += biasOf(p, slope, h, j, pos);
          maxScore = std::max(maxScore, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = lo; j < end; ++j) {
          scores[j] = std::exp(scores[j] - maxScore);
          sum += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = lo; j < end; ++j) {
          const int64_t slot = int64_t{blocks[j / p.blockSize]} * p.blockSize + j % p.blockSize;
          const int64_t vOff = slot * kvWidth + kvh * p.headDim;
          for (int64_t d = 0; d < p.headDim; ++d)
            acc[d] += scores[j] * cache.load(p.vCache, vOff + d);
        }
        // No keys (contextLens 0): zeros, as the device writes.
        for (int64_t d = 0; d < p.headDim; ++d)
          e.store(p.out, (row * p.numHeads + h) * p.headDim + d, end > lo ? acc[d] / sum : 0.0f);
      }
    }
  }
  return okStatus();
}

}  // namespace

Status pagedAttentionReference(const PagedAttentionParams& p) {
  TG_RETURN_IF_ERROR(validatePagedAttention(p));
  if (p.alibiSlopes) {
    for (int64_t h = 0; h < p.numHeads; ++h) {
      if (!std::isfinite(p.alibiSlopes[h]))
        return invalidArgumentError("paged_attention: ALiBi slope of head " + std::to_string(h) +
                                    " is not finite");
    }
  }
  if (p.relativeBias) {
    for (int64_t i = 0; i < int64_t{p.relativeBuckets} * p.numHeads; ++i) {
      if (!std::isfinite(p.relativeBias[i]))
        return invalidArgumentError("paged_attention: relative bias entry " + std::to_string(i) +
                                    " is not finite");
    }
  }
  if (p.cacheDtype == KvCacheDType::kAuto) return attend(p, Elements{p.dtype});
  return attend(p, CacheElements{p.dtype, p.cacheDtype});
}

}  // namespace textgen::kernels
