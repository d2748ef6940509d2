// How a token's position enters the model: rotary embeddings applied to q and k (Llama; the
// frequencies are layers/rope.cpp's), ALiBi's per-head biases on the attention scores (Bloom,
// MPT), a learned table added to the token embedding (GPT-2, OPT), or T5's bucketed relative
// position bias on the scores (layers/relative_bias.h).
#pragma once

#include <string_view>

namespace textgen::runtime {

enum class PositionKind { kRope, kAlibi, kLearned, kRelative };

constexpr std::string_view toString(PositionKind p) {
  switch (p) {
    case PositionKind::kRope: return "rope";
    case PositionKind::kAlibi: return "alibi";
    case PositionKind::kLearned: return "learned";
    case PositionKind::kRelative: return "relative";
  }
  return "?";
}

}  // namespace textgen::runtime
