// Streaming detokenization: the text each new token adds, never splitting a UTF-8 character.
//
// TGI's prefix/read-offset method — decode a short window before and after the new token and emit
// the difference once it does not end in an incomplete character — with two additions that make
// it exact: a run of ByteFallback byte tokens is held until the run ends (Hugging Face decodes the
// run as one unit, and an invalid run re-renders bytes already seen as U+FFFD), and flush() emits
// what is still held at the end. Invariant, property-tested: the concatenation of every step() and
// the final flush() equals tokenizer.decode(all ids) (relative to the prompt context, if given).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "textgen/tokenizer/tokenizer.h"

namespace textgen::tokenizer {

class IncrementalDecoder {
 public:
  // `context`: the prompt ids; its last few tokens give the first generated tokens their context
  // (e.g. a leading space), as in TGI.
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skipSpecialTokens = false,
                              std::span<const uint32_t> context = {});

  // Appends one id and returns the text it completes (possibly empty).
  std::string step(uint32_t id);

  // Returns the text still held back (an incomplete character at the end, a trailing U+FFFD).
  std::string flush();

  const std::vector<uint32_t>& ids() const { return ids_; }

 private:
  std::string decodeRange(size_t from, size_t to) const;

  const Tokenizer& tokenizer_;
  bool skipSpecialTokens_;
  std::vector<uint32_t> ids_;
  size_t prefixOffset_ = 0;
  size_t readOffset_ = 0;
};

}  // namespace textgen::tokenizer
