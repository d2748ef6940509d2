// A string under normalisation that remembers, for every byte of the normalised text, which byte
// range of the original text it came from — the alignment model of Hugging Face's NormalizedString,
// reproduced exactly so that token offsets match it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "regex.h"

namespace textgen::tokenizer {

using Offsets = std::pair<uint32_t, uint32_t>;

// How a split keeps its delimiters (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A pattern yields the string covered by matches and gaps: ((start, end), isMatch), in order.
using Matches = std::vector<std::pair<Offsets, bool>>;

// Hugging Face's Pattern implementations.
Matches findMatches(const Regex& regex, std::string_view text);
Matches findMatches(const std::function<bool(char32_t)>& predicate, std::string_view text);
void invertMatches(Matches& matches);

// One output character of a transformation and how it relates to the input: 0 replaces the next
// input character, +1 is inserted, -n replaces the next character and removes n more after it.
struct CharChange {
  char32_t c;
  int change;
};

class NormalizedString {
 public:
  NormalizedString() = default;
  explicit NormalizedString(std::string_view original);

  const std::string& get() const { return normalized_; }
  size_t originalSize() const { return originalSize_; }
  size_t size() const { return normalized_.size(); }
  bool empty() const { return normalized_.empty(); }
  // Start of this piece in the whole original input.
  size_t originalShift() const { return originalShift_; }

  // Replaces the normalised text by `changes` (see CharChange); the first initialOffset input
  // characters are removed before the first change applies.
  void transform(const std::vector<CharChange>& changes, size_t initialOffset);

  // Original byte range of a normalised byte range (relative to this piece's original).
  std::optional<Offsets> convertOffsets(Offsets normalizedRange) const;

  // The piece covering normalised bytes [start, end).
  NormalizedString slice(Offsets normalizedRange) const;

  // Consumes the string: a split that keeps it whole moves it instead of copying.
  std::vector<NormalizedString> split(const Matches& matches, SplitBehavior behavior) &&;

  void prepend(std::string_view s);
  void replace(const Regex& pattern, std::string_view content);
  void lowercase();
  void strip(bool left, bool right);
  void filter(const std::function<bool(char32_t)>& keep);

 private:
  size_t originalSize_ = 0;  // the original text itself is never needed, only its extent
  std::string normalized_;
  std::vector<Offsets> alignments_;  // one per byte of normalized_, ranges within the original
  size_t originalShift_ = 0;
};

}  // namespace textgen::tokenizer
