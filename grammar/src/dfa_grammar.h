// The one Grammar implementation: a table-driven DFA. Private to the module; the token index reads
// the table directly on its hot path.
#pragma once

#include "automaton.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {

class DfaGrammar final : public Grammar {
 public:
  explicit DfaGrammar(Dfa dfa) : dfa_(std::move(dfa)) {}
  int32_t start() const override { return dfa_.start; }
  int32_t next(int32_t state, uint8_t byte) const override {
    if (state < 0 || static_cast<size_t>(state) >= dfa_.numStates()) return kDead;
    return dfa_.next[static_cast<size_t>(state) * dfa_.numClasses + dfa_.byteClass[byte]];
  }
  bool accepting(int32_t state) const override {
    return state >= 0 && static_cast<size_t>(state) < dfa_.numStates() && dfa_.accepting[state];
  }
  size_t numStates() const override { return dfa_.numStates(); }
  const Dfa& dfa() const { return dfa_; }

 private:
  Dfa dfa_;
};

}  // namespace textgen::grammar
