// The "Precompiled" normaliser: sentencepiece's normalisation rules (e.g. nmt_nfkc) as T5's
// tokenizer.json embeds them — a double-array trie from UTF-8 sequences to replacement strings.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::tokenizer {

class NormalizedString;

class PrecompiledCharsMap {
 public:
  // `blob`: the decoded precompiled_charsmap bytes.
  static StatusOr<PrecompiledCharsMap> parse(std::string_view blob);

  // The replacement for `chunk` (the value of its shortest key prefix, as sentencepiece-rs does).
  std::optional<std::string_view> transform(std::string_view chunk) const;

  void normalize(NormalizedString& s) const;

 private:
  std::vector<uint32_t> array_;
  std::string normalized_;
};

}  // namespace textgen::tokenizer
