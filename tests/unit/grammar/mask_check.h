// Brute-force reference for token masks: per token, walk its bytes from the state.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "textgen/grammar/grammar.h"

namespace textgen::grammar::testing {

inline std::vector<uint32_t> bruteForceMask(const TokenIndex& index, int32_t state) {
  const Vocabulary& v = index.vocabulary();
  const Grammar& g = index.grammar();
  std::vector<uint32_t> words(v.maskWords(), 0);
  bool any = false;
  for (uint32_t id = 0; id < v.size(); ++id) {
    if (index.isEos(id)) continue;
    const auto& b = v.bytes(id);
    if (!b || b->empty() || g.walk(state, *b) == Grammar::kDead) continue;
    words[id / 32] |= 1u << (id % 32);
    any = true;
  }
  if (g.accepting(state) || !any) {
    for (uint32_t id : v.eosIds()) {
      if (id < v.size()) words[id / 32] |= 1u << (id % 32);
    }
  }
  return words;
}

// Every reachable state (BFS over bytes) gets a mask equal to the brute force, and allows()
// agrees with it bit for bit.
inline void expectMasksMatchBruteForce(const TokenIndex& index, size_t maxStates = 400) {
  const Grammar& g = index.grammar();
  std::vector<int32_t> order{g.start()};
  std::vector<bool> seen(g.numStates(), false);
  seen[g.start()] = true;
  for (size_t i = 0; i < order.size() && order.size() < maxStates; ++i) {
    for (int b = 0; b < 256; ++b) {
      const int32_t t = g.next(order[i], static_cast<uint8_t>(b));
      if (t != Grammar::kDead && !seen[t]) {
        seen[t] = true;
        order.push_back(t);
      }
    }
  }
  std::vector<uint32_t> got(index.vocabulary().maskWords());
  for (int32_t s : order) {
    index.fillMask(s, got);
    const auto want = bruteForceMask(index, s);
    ASSERT_EQ(got, want) << "state " << s;
    for (uint32_t id = 0; id < index.vocabulary().size(); ++id) {
      ASSERT_EQ(index.allows(s, id), ((want[id / 32] >> (id % 32)) & 1) != 0)
          << "state " << s << " token " << id;
    }
  }
}

}  // namespace textgen::grammar::testing
