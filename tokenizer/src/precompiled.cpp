#include "precompiled.h"

#include <utf8proc.h>

#include <cstring>

#include "normalized_string.h"
#include "unicode.h"

namespace textgen::tokenizer {
namespace {

bool hasLeaf(uint32_t unit) {
  return ((unit >> 8) & 1) == 1;
}
uint32_t value(uint32_t unit) {
  return unit & ((1u << 31) - 1);
}
uint32_t label(uint32_t unit) {
  return unit & ((1u << 31) | 0xffu);
}
uint32_t offset(uint32_t unit) {
  return (unit >> 10) << ((unit & (1u << 9)) >> 6);
}

// Appends the changes that replace `oldPart` by `newPart` (Hugging Face's precompiled `replace`).
void replaceChars(std::vector<CharChange>& changes, std::string_view oldPart,
                  std::string_view newPart) {
  const int oldCount = static_cast<int>(countChars(oldPart));
  const int newCount = static_cast<int>(countChars(newPart));
  const int diff = newCount - oldCount;
  size_t len;
  for (size_t i = 0; i < newPart.size(); i += len)
    changes.push_back({decodeUtf8(newPart, i, &len), 0});
  if (diff > 0) {
    for (int k = 0; k < diff && k < static_cast<int>(changes.size()); ++k) {
      changes[changes.size() - 1 - k].change = 1;
    }
  } else if (diff < 0 && !changes.empty()) {
    changes.back().change += diff;
  }
}

}  // namespace

StatusOr<PrecompiledCharsMap> PrecompiledCharsMap::parse(std::string_view blob) {
  if (blob.size() < 4) return invalidArgumentError("precompiled_charsmap: shorter than its header");
  uint32_t trieSize;
  std::memcpy(&trieSize, blob.data(), 4);  // little-endian on every supported host
  if (trieSize % 4 != 0 || trieSize > blob.size() - 4) {
    return invalidArgumentError("precompiled_charsmap: trie size " + std::to_string(trieSize) +
                                " does not fit the " + std::to_string(blob.size()) + "-byte blob");
  }
  PrecompiledCharsMap map;
  map.array_.resize(trieSize / 4);
  std::memcpy(map.array_.data(), blob.data() + 4, trieSize);
  map.normalized_ = std::string(blob.substr(4 + trieSize));
  if (!isValidUtf8(map.normalized_)) {
    return invalidArgumentError("precompiled_charsmap: replacement strings are not UTF-8");
  }
  return map;
}

std::optional<std::string_view> PrecompiledCharsMap::transform(std::string_view chunk) const {
  if (array_.empty()) return std::nullopt;
  size_t node = 0;
  uint32_t unit = array_[node];
  node ^= offset(unit);
  for (unsigned char c : chunk) {
    if (c == 0) break;
    node ^= c;
    if (node >= array_.size()) return std::nullopt;
    unit = array_[node];
    if (label(unit) != c) return std::nullopt;
    node ^= offset(unit);
    if (node >= array_.size()) return std::nullopt;
    if (hasLeaf(unit)) {
      const size_t index = value(array_[node]);
      if (index >= normalized_.size()) return std::nullopt;
      const size_t end = normalized_.find('\0', index);
      return std::string_view(normalized_)
          .substr(index, (end == std::string::npos ? normalized_.size() : end) - index);
    }
  }
  return std::nullopt;
}

void PrecompiledCharsMap::normalize(NormalizedString& s) const {
  const std::string& text = s.get();
  std::vector<CharChange> changes;
  changes.reserve(text.size());
  bool modified = false;
  // Extended grapheme clusters, as unicode-segmentation's graphemes(true).
  size_t start = 0;
  utf8proc_int32_t state = 0;
  size_t len;
  char32_t prev = 0;
  auto emitCluster = [&](std::string_view grapheme) {
    if (grapheme.size() < 6) {
      if (auto norm = transform(grapheme)) {
        modified = true;
        replaceChars(changes, grapheme, *norm);
        return;
      }
    }
    size_t n;
    for (size_t i = 0; i < grapheme.size(); i += n) {
      const char32_t c = decodeUtf8(grapheme, i, &n);
      const std::string_view part = grapheme.substr(i, n);
      if (auto norm = transform(part)) {
        modified = true;
        replaceChars(changes, part, *norm);
      } else {
        changes.push_back({c, 0});
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += len) {
    const char32_t c = decodeUtf8(text, i, &len);
    if (i > 0 && utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(prev),
                                                  static_cast<utf8proc_int32_t>(c), &state)) {
      emitCluster(std::string_view(text).substr(start, i - start));
      start = i;
    }
    prev = c;
  }
  if (start < text.size()) emitCluster(std::string_view(text).substr(start));
  if (modified) s.transform(changes, 0);
}

}  // namespace textgen::tokenizer
