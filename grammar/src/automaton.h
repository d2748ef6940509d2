// A parsed regex to a byte DFA: Thompson NFA over UTF-8 byte ranges, subset construction bounded
// by Limits, trimming of states that cannot reach acceptance, and Moore minimization when cheap.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "regex_parser.h"
#include "textgen/base/status_or.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {

// Transitions are stored per byte class: bytes that no part of the pattern tells apart share one.
struct Dfa {
  std::array<uint8_t, 256> byteClass{};
  int32_t numClasses = 1;
  int32_t start = 0;
  std::vector<int32_t> next;  // [numStates * numClasses]; Grammar::kDead when none
  std::vector<uint8_t> accepting;
  size_t numStates() const { return accepting.size(); }
};

// RESOURCE_EXHAUSTED naming maxNfaStates / maxDfaStates when past them; INVALID_ARGUMENT when the
// pattern matches nothing at all.
StatusOr<Dfa> buildDfa(const RegexAst& ast, const Limits& limits);

}  // namespace textgen::grammar
