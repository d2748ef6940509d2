// The token-sequence inputs of speculative decoding and the watermark detector: a request's tokens
// (any ids, any length) go to the n-gram proposer, and any text's tokens to the watermark score.
// Input: byte 0 picks k (proposed tokens), byte 1 the vocabulary (the rest as little-endian
// 16-bit token ids, small vocabularies giving many repeats). Invariants: a proposal has at most k
// tokens, each one of the sequence's own; a score counts no more green tokens than it scored and
// has a finite z.
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "fuzz_util.h"
#include "textgen/base/watermark.h"
#include "textgen/runtime/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t k = data[0] % 20;  // 0..19: also past the shard's limit of 16
  const uint32_t vocab = 2u + data[1] % 64 * 64;
  std::vector<uint32_t> tokens;
  for (size_t i = 2; i + 1 < size; i += 2)
    tokens.push_back(static_cast<uint32_t>(data[i] | data[i + 1] << 8) % (vocab + 8));
  const std::vector<uint32_t> draft = textgen::runtime::proposeNgram(tokens, k);
  FUZZ_CHECK(static_cast<int64_t>(draft.size()) <= std::max<int64_t>(k, 0),
             "a proposal longer than k");
  const std::set<uint32_t> seen(tokens.begin(), tokens.end());
  for (uint32_t t : draft) FUZZ_CHECK(seen.contains(t), "a proposed token not in the sequence");
  const textgen::WatermarkScore s =
      textgen::scoreWatermark(tokens, vocab, 0.25 + data[0] % 3 * 0.25);
  FUZZ_CHECK(s.green >= 0 && s.green <= s.scored, "more green tokens than scored");
  FUZZ_CHECK(s.scored == (tokens.empty() ? 0 : static_cast<int64_t>(tokens.size()) - 1),
             "every token after the first is scored");
  FUZZ_CHECK(std::isfinite(s.z) && s.pValue >= 0.0 && s.pValue <= 1.0, "a non-finite score");
  return 0;
}
