// "A Watermark for Large Language Models" (Kirchenbauer et al. 2023), as TGI applies it: before
// each token is chosen, a green list of gamma * vocab token ids, seeded from the previous token,
// has delta added to its logits. Text generated so contains more green tokens than chance allows;
// the detector counts them and reports a z-score.
//
// The green list is TGI's: a torch CPU generator seeded with hash_key * previous token
// (hash_key = 15485863), torch.randperm(vocab) from it, its first int(vocab * gamma) ids. textgen
// computes it the same way on every device (TGI draws on the model's device, so its CUDA green
// lists differ from its CPU ones; textgen's detector needs no GPU to check text from any of them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "textgen/base/status.h"

namespace textgen {

inline constexpr uint64_t kWatermarkHashKey = 15485863;  // TGI's (and the paper's code's)
inline constexpr double kWatermarkDefaultGamma = 0.5;
inline constexpr double kWatermarkDefaultDelta = 2.0;

// INVALID_ARGUMENT unless 0 < gamma < 1 and delta is finite and in [0, 100].
Status checkWatermarkParams(double gamma, double delta);

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU (n below 2^32 / 20):
// Fisher-Yates over the generator's mt19937 32-bit draws.
std::vector<uint32_t> torchCpuRandperm(uint64_t seed, uint32_t n);

// Number of green ids for a vocabulary: int(vocab * gamma), as TGI.
uint32_t greenListSize(uint32_t vocab, double gamma);

// The green list after `previous`, as a bitmask over the vocabulary ((vocab + 31) / 32 words, bit
// id % 32 of word id / 32).
std::vector<uint32_t> greenListMask(uint32_t previous, uint32_t vocab, double gamma);

// Green lists by previous token, the most recent kept within `budgetBytes` (vocab / 8 bytes each;
// computing one walks the vocabulary: about 1 ms at 128k ids). Not thread-safe.
class GreenListCache {
 public:
  GreenListCache(uint32_t vocab, double gamma, size_t budgetBytes = size_t{64} << 20)
      : vocab_(vocab),
        gamma_(gamma),
        capacity_(std::max<size_t>(
            1, std::min<size_t>(vocab, budgetBytes / (sizeof(uint32_t) * ((vocab + 31) / 32))))) {}
  size_t capacity() const { return capacity_; }
  std::span<const uint32_t> mask(uint32_t previous);
  uint32_t vocab() const { return vocab_; }
  double gamma() const { return gamma_; }

 private:
  uint32_t vocab_;
  double gamma_;
  size_t capacity_;
  std::list<uint32_t> order_;  // most recent first
  struct Entry {
    std::vector<uint32_t> mask;
    std::list<uint32_t>::iterator pos;
  };
  std::unordered_map<uint32_t, Entry> entries_;
};

struct WatermarkScore {
  int64_t scored = 0;  // tokens scored (each after its previous one)
  int64_t green = 0;
  double z = 0.0;       // (green - gamma * scored) / sqrt(scored * gamma * (1 - gamma)); 0 if none
  double pValue = 1.0;  // one-sided, under the normal approximation
};

// Scores `tokens`: token i (i >= 1) is green when it is in the green list after token i - 1. Ids at
// or past `vocab` count as red.
WatermarkScore scoreWatermark(std::span<const uint32_t> tokens, uint32_t vocab, double gamma);

}  // namespace textgen
