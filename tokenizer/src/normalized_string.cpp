#include "normalized_string.h"

#include <algorithm>

#include "unicode.h"

namespace textgen::tokenizer {

Matches findMatches(const Regex& regex, std::string_view text) {
  Matches out;
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  size_t prev = 0;
  regex.forEachMatch(text, [&](size_t start, size_t end) {
    if (prev != start)
      out.push_back({{static_cast<uint32_t>(prev), static_cast<uint32_t>(start)}, false});
    out.push_back({{static_cast<uint32_t>(start), static_cast<uint32_t>(end)}, true});
    prev = end;
  });
  if (prev != text.size()) {
    out.push_back({{static_cast<uint32_t>(prev), static_cast<uint32_t>(text.size())}, false});
  }
  return out;
}

Matches findMatches(const std::function<bool(char32_t)>& predicate, std::string_view text) {
  Matches out;
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  uint32_t lastOffset = 0;
  size_t len;
  for (size_t i = 0; i < text.size(); i += len) {
    const char32_t c = decodeUtf8(text, i, &len);
    if (predicate(c)) {
      if (lastOffset < i) out.push_back({{lastOffset, static_cast<uint32_t>(i)}, false});
      out.push_back({{static_cast<uint32_t>(i), static_cast<uint32_t>(i + len)}, true});
      lastOffset = static_cast<uint32_t>(i + len);
    }
  }
  if (text.size() > lastOffset) {
    out.push_back({{lastOffset, static_cast<uint32_t>(text.size())}, false});
  }
  return out;
}

void invertMatches(Matches& matches) {
  for (auto& m : matches) m.second = !m.second;
}

NormalizedString::NormalizedString(std::string_view original)
    : originalSize_(original.size()), normalized_(original) {
  alignments_.reserve(original.size());
  size_t len;
  for (size_t i = 0; i < original.size(); i += len) {
    decodeUtf8(original, i, &len);
    for (size_t k = 0; k < len; ++k) {
      alignments_.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(i + len)});
    }
  }
}

void NormalizedString::transform(const std::vector<CharChange>& changes, size_t initialOffset) {
  // Hugging Face's transform_range over the whole string.
  size_t offset = 0;  // byte position in the old normalised text
  size_t len;
  for (size_t k = 0; k < initialOffset && offset < normalized_.size(); ++k) {
    decodeUtf8(normalized_, offset, &len);
    offset += len;
  }
  std::string out;
  out.reserve(normalized_.size());
  std::vector<Offsets> alignments;
  alignments.reserve(alignments_.size());
  for (const CharChange& ch : changes) {
    Offsets align;
    if (ch.change > 0) {
      align = offset == 0 ? Offsets{0, 0} : alignments_[offset - 1];
    } else {
      align = offset < alignments_.size()
                  ? alignments_[offset]
                  : (alignments_.empty() ? Offsets{0, 0} : alignments_.back());
      if (offset < normalized_.size()) {  // the replaced character
        decodeUtf8(normalized_, offset, &len);
        offset += len;
      }
      for (int r = 0; r < -ch.change && offset < normalized_.size(); ++r) {  // removed characters
        decodeUtf8(normalized_, offset, &len);
        offset += len;
      }
    }
    const size_t before = out.size();
    appendUtf8(out, ch.c);
    alignments.insert(alignments.end(), out.size() - before, align);
  }
  normalized_ = std::move(out);
  alignments_ = std::move(alignments);
}

std::optional<Offsets> NormalizedString::convertOffsets(Offsets r) const {
  if (r.first == r.second) return r;
  if (r.first > r.second) return std::nullopt;
  if (normalized_.empty() && r == Offsets{0, 0})
    return Offsets{0, static_cast<uint32_t>(originalSize_)};
  if (r.second > alignments_.size()) return std::nullopt;
  return Offsets{alignments_[r.first].first, alignments_[r.second - 1].second};
}

NormalizedString NormalizedString::slice(Offsets r) const {
  NormalizedString out;
  const Offsets o = convertOffsets(r).value_or(Offsets{0, 0});
  out.originalSize_ = o.second - o.first;
  out.normalized_ = normalized_.substr(r.first, r.second - r.first);
  out.alignments_.reserve(r.second - r.first);
  for (uint32_t i = r.first; i < r.second; ++i) {
    const Offsets a = alignments_[i];
    // Inserted characters may align before the slice's original start; clamp like saturating math.
    out.alignments_.push_back(
        {a.first >= o.first ? a.first - o.first : 0, a.second >= o.first ? a.second - o.first : 0});
  }
  out.originalShift_ = originalShift_ + o.first;
  return out;
}

std::vector<NormalizedString> NormalizedString::split(const Matches& matches,
                                                      SplitBehavior behavior) && {
  // (range, remove) per resulting piece.
  std::vector<std::pair<Offsets, bool>> pieces;
  pieces.reserve(matches.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& m : matches) pieces.push_back({m.first, false});
      break;
    case SplitBehavior::kRemoved: pieces.assign(matches.begin(), matches.end()); break;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (const auto& [range, isMatch] : matches) {
        if (isMatch == previous && !pieces.empty()) {
          pieces.back().first.second = range.second;
        } else {
          pieces.push_back({range, false});
        }
        previous = isMatch;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& [range, isMatch] : matches) {
        if (isMatch && !previous && !pieces.empty()) {
          pieces.back().first.second = range.second;
        } else {
          pieces.push_back({range, false});
        }
        previous = isMatch;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        const auto& [range, isMatch] = *it;
        if (isMatch && !previous && !pieces.empty()) {
          pieces.back().first.first = range.first;
        } else {
          pieces.push_back({range, false});
        }
        previous = isMatch;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  std::vector<NormalizedString> out;
  if (pieces.size() == 1 && !pieces[0].second && pieces[0].first.first == 0 &&
      pieces[0].first.second == normalized_.size()) {
    out.push_back(std::move(*this));  // nothing to split
    return out;
  }
  out.reserve(pieces.size());
  for (const auto& [range, remove] : pieces) {
    if (!remove) out.push_back(slice(range));
  }
  return out;
}

void NormalizedString::prepend(std::string_view s) {
  if (normalized_.empty() || s.empty()) return;
  size_t len;
  const char32_t next = decodeUtf8(normalized_, 0, &len);
  // The first prepended character takes the first character's place (and alignment); the rest of
  // the prepended string and the original first character are insertions after it.
  std::vector<CharChange> changes;
  bool first = true;
  for (size_t i = 0, n; i < s.size(); i += n) {
    changes.push_back({decodeUtf8(s, i, &n), first ? 0 : 1});
    first = false;
  }
  changes.push_back({next, 1});
  // transform_range over the first character only: splice the result in front of the rest.
  NormalizedString head;
  head.normalized_ = normalized_.substr(0, len);
  head.alignments_.assign(alignments_.begin(), alignments_.begin() + len);
  head.transform(changes, 0);
  normalized_.replace(0, len, head.normalized_);
  alignments_.erase(alignments_.begin(), alignments_.begin() + len);
  alignments_.insert(alignments_.begin(), head.alignments_.begin(), head.alignments_.end());
}

void NormalizedString::replace(const Regex& pattern, std::string_view content) {
  const Matches matches = findMatches(pattern, normalized_);
  std::string out;
  out.reserve(normalized_.size());
  std::vector<Offsets> alignments;
  alignments.reserve(alignments_.size());
  for (const auto& [range, isMatch] : matches) {
    if (!isMatch) {
      out.append(normalized_, range.first, range.second - range.first);
      alignments.insert(alignments.end(), alignments_.begin() + range.first,
                        alignments_.begin() + range.second);
      continue;
    }
    // Every replacement character is "inserted" after the removed match: it takes the alignment
    // of the match's last byte.
    const Offsets align = range.second == 0 ? Offsets{0, 0} : alignments_[range.second - 1];
    out.append(content);
    alignments.insert(alignments.end(), content.size(), align);
  }
  normalized_ = std::move(out);
  alignments_ = std::move(alignments);
}

void NormalizedString::lowercase() {
  bool ascii = true;
  for (char c : normalized_) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) {  // one byte in, one byte out: alignments unchanged
    for (char& c : normalized_) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    }
    return;
  }
  std::vector<CharChange> changes;
  changes.reserve(normalized_.size());
  std::string lower;
  size_t len;
  for (size_t i = 0; i < normalized_.size(); i += len) {
    const char32_t c = decodeUtf8(normalized_, i, &len);
    lower.clear();
    appendLowercase(lower, c);
    size_t n;
    int index = 0;
    for (size_t j = 0; j < lower.size(); j += n, ++index) {
      changes.push_back({decodeUtf8(lower, j, &n), index > 0 ? 1 : 0});
    }
  }
  transform(changes, 0);
}

void NormalizedString::strip(bool left, bool right) {
  std::vector<char32_t> chars;
  size_t len;
  for (size_t i = 0; i < normalized_.size(); i += len)
    chars.push_back(decodeUtf8(normalized_, i, &len));
  size_t leading = 0, trailing = 0;
  if (left) {
    while (leading < chars.size() && isWhitespace(chars[leading])) ++leading;
  }
  if (right) {
    while (trailing < chars.size() && isWhitespace(chars[chars.size() - 1 - trailing])) ++trailing;
  }
  if (leading == 0 && trailing == 0) return;
  std::vector<CharChange> changes;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (i < leading || i + trailing >= chars.size()) continue;
    changes.push_back({chars[i], 0});
  }
  transform(changes, leading);
}

void NormalizedString::filter(const std::function<bool(char32_t)>& keep) {
  std::vector<CharChange> changes;
  int removed = 0;
  size_t removedStart = 0;
  std::optional<char32_t> last;
  size_t len;
  for (size_t i = 0; i < normalized_.size(); i += len) {
    const char32_t c = decodeUtf8(normalized_, i, &len);
    if (keep(c)) {
      if (last) {
        changes.push_back({*last, -removed});
      } else {
        removedStart = static_cast<size_t>(removed);
      }
      last = c;
      removed = 0;
    } else {
      ++removed;
    }
  }
  if (last) changes.push_back({*last, -removed});
  transform(changes, removedStart);
}

}  // namespace textgen::tokenizer
