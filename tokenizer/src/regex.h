// PCRE2 (UTF, UCP, JIT) with the regex dialects of the engines Hugging Face tokenizers uses:
// Oniguruma for Split / Replace patterns, Rust's regex crate for built-in patterns. Character
// classes whose meaning differs between engines (\s, \w, \d) are rewritten to Unicode properties.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::tokenizer {

class Regex {
 public:
  enum class Dialect { kOniguruma, kRustRegex };

  static StatusOr<std::shared_ptr<const Regex>> compile(std::string_view pattern,
                                                        Dialect dialect = Dialect::kOniguruma);
  static std::shared_ptr<const Regex> literal(std::string_view text);  // escaped, never fails
  ~Regex();

  // Calls fn(start, end) for each successive non-overlapping match in text (valid UTF-8).
  // After an empty match the search resumes one character later.
  template <typename Fn>
  void forEachMatch(std::string_view text, Fn&& fn) const {
    size_t pos = 0;
    size_t start, end;
    while (pos <= text.size() && find(text, pos, &start, &end)) {
      fn(start, end);
      if (end > start) {
        pos = end;
      } else {
        if (end >= text.size()) break;
        pos = end + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xc0) == 0x80) ++pos;
      }
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  bool find(std::string_view text, size_t from, size_t* start, size_t* end) const;

  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
  std::string pattern_;
};

// regex-syntax's is_word_character: what `\w` matches in Rust's regex crate.
bool isWordCharacter(char32_t c);

}  // namespace textgen::tokenizer
