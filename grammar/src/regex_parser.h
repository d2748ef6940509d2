// A regular expression parsed into a tree over Unicode code points: classes of code-point ranges,
// concatenation, alternation and counted repetition. Everything else (anchors inside the pattern,
// backreferences, lookarounds, word boundaries, inline flags) is refused with the construct and
// its byte offset.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {

// Groups may nest this deep (the parser and the automaton builder recurse once per level).
inline constexpr int kMaxRegexNesting = 400;

struct RegexNode {
  enum class Type : uint8_t { kEmpty, kClass, kConcat, kAlt, kRepeat };
  Type type = Type::kEmpty;
  std::vector<std::pair<char32_t, char32_t>> ranges;  // kClass: sorted, disjoint, no surrogates
  std::vector<int32_t> children;                      // kConcat, kAlt; kRepeat: one
  int32_t min = 0;
  int32_t max = -1;  // kRepeat: -1 = unbounded
};

struct RegexAst {
  std::vector<RegexNode> nodes;
  int32_t root = 0;
};

// INVALID_ARGUMENT naming the construct and offset; RESOURCE_EXHAUSTED for nesting or counts past
// the limits.
StatusOr<RegexAst> parseRegex(std::string_view pattern, const Limits& limits);

}  // namespace textgen::grammar
