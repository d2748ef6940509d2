#include "added_vocabulary.h"

#include <algorithm>

#include "regex.h"
#include "unicode.h"

namespace textgen::tokenizer {
namespace {

bool endsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) --i;
  size_t len;
  return isWordCharacter(decodeUtf8(s, i, &len));
}

bool startsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t len;
  return isWordCharacter(decodeUtf8(s, 0, &len));
}

// Byte position just after the last non-whitespace character of s (0 if all whitespace).
size_t spaceLeftmostAtEnd(std::string_view s) {
  size_t end = 0, len;
  for (size_t i = 0; i < s.size(); i += len) {
    if (!isWhitespace(decodeUtf8(s, i, &len))) end = i + len;
  }
  return end;
}

// Byte position of the first non-whitespace character of s (s.size() if none).
size_t spaceRightmostAtStart(std::string_view s) {
  size_t len;
  for (size_t i = 0; i < s.size(); i += len) {
    if (!isWhitespace(decodeUtf8(s, i, &len))) return i;
  }
  return s.size();
}

}  // namespace

void AddedVocabulary::Matcher::add(std::string_view pattern, int32_t token) {
  if (pattern.empty()) return;
  uint32_t node = 0;
  for (unsigned char c : pattern) {
    auto& ch = nodes[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, 0u),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it != ch.end() && it->first == c) {
      node = it->second;
    } else {
      const auto next = static_cast<uint32_t>(nodes.size());
      ch.insert(it, {c, next});
      nodes.push_back({});
      node = next;
    }
  }
  nodes[node].token = token;
}

std::vector<std::tuple<int32_t, size_t, size_t>> AddedVocabulary::Matcher::findAll(
    std::string_view text) const {
  std::vector<std::tuple<int32_t, size_t, size_t>> out;
  if (nodes[0].children.empty()) return out;
  size_t i = 0;
  while (i < text.size()) {
    uint32_t node = 0;
    int32_t bestToken = -1;
    size_t bestEnd = 0;
    for (size_t k = i; k < text.size(); ++k) {
      const auto& ch = nodes[node].children;
      const auto c = static_cast<unsigned char>(text[k]);
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, 0u),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it == ch.end() || it->first != c) break;
      node = it->second;
      if (nodes[node].token >= 0) {
        bestToken = nodes[node].token;
        bestEnd = k + 1;
      }
    }
    if (bestToken >= 0) {
      out.emplace_back(bestToken, i, bestEnd);
      i = bestEnd;
    } else {
      ++i;
    }
  }
  return out;
}

void AddedVocabulary::build(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  decodeForms_.assign(tokens_.size(), {});
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    byId_[t.id] = i;
    byContent_.insert_or_assign(t.content, t.id);
    if (t.special) special_.insert(t.content);
    if (t.normalized) {
      NormalizedString pattern(t.content);
      if (normalizer) normalizer->normalize(pattern);
      normalized_.add(pattern.get(), static_cast<int32_t>(i));
      if (pattern.get() != t.content) decodeForms_[i] = pattern.get();
    } else {
      raw_.add(t.content, static_cast<int32_t>(i));
    }
  }
}

std::vector<std::pair<std::optional<int32_t>, Offsets>> AddedVocabulary::findMatches(
    std::string_view s, const Matcher& m) const {
  std::vector<std::pair<std::optional<int32_t>, Offsets>> splits;
  if (s.empty()) {
    splits.push_back({std::nullopt, {0, 0}});
    return splits;
  }
  size_t startOffset = 0;
  for (auto [token, start, stop] : m.findAll(s)) {
    const AddedToken& t = tokens_[token];
    if (t.singleWord) {
      const bool startSpace = start == 0 || !endsWithWord(s.substr(0, start));
      const bool stopSpace = stop == s.size() || !startsWithWord(s.substr(stop));
      if (!startSpace || !stopSpace) continue;
    }
    if (t.lstrip) start = std::max(spaceLeftmostAtEnd(s.substr(0, start)), startOffset);
    if (t.rstrip) stop += spaceRightmostAtStart(s.substr(stop));
    if (start > startOffset) {
      splits.push_back(
          {std::nullopt, {static_cast<uint32_t>(startOffset), static_cast<uint32_t>(start)}});
    }
    splits.push_back({token, {static_cast<uint32_t>(start), static_cast<uint32_t>(stop)}});
    startOffset = stop;
  }
  if (startOffset != s.size()) {
    splits.push_back(
        {std::nullopt, {static_cast<uint32_t>(startOffset), static_cast<uint32_t>(s.size())}});
  }
  return splits;
}

PreTokenizedString AddedVocabulary::extractAndNormalize(const Normalizer* normalizer,
                                                        std::string_view text) const {
  PreTokenizedString out;
  out.splits.push_back({NormalizedString(text), std::nullopt});
  auto pass = [&](const Matcher& m, bool normalize) {
    std::vector<Split> next;
    for (Split& s : out.splits) {
      if (s.tokens) {
        next.push_back(std::move(s));
        continue;
      }
      if (normalize && normalizer) normalizer->normalize(s.normalized);
      auto matches = findMatches(s.normalized.get(), m);
      if (matches.size() == 1 && !matches[0].first) {  // no added token here: keep the piece whole
        if (!s.normalized.empty()) next.push_back(std::move(s));
        continue;
      }
      for (auto& [token, range] : matches) {
        NormalizedString piece = s.normalized.slice(range);
        if (piece.empty()) continue;
        if (token) {
          const AddedToken& t = tokens_[*token];
          std::vector<Token> tok{{t.id, piece.get(), {0, static_cast<uint32_t>(piece.size())}}};
          next.push_back({std::move(piece), std::move(tok)});
        } else {
          next.push_back({std::move(piece), std::nullopt});
        }
      }
    }
    out.splits = std::move(next);
  };
  pass(raw_, false);
  pass(normalized_, true);
  return out;
}

const std::string* AddedVocabulary::idToToken(uint32_t id) const {
  auto it = byId_.find(id);
  return it == byId_.end() ? nullptr : &tokens_[it->second].content;
}

const std::string* AddedVocabulary::idToDecodeForm(uint32_t id) const {
  auto it = byId_.find(id);
  if (it == byId_.end()) return nullptr;
  return decodeForms_[it->second].empty() ? &tokens_[it->second].content
                                          : &decodeForms_[it->second];
}

std::optional<uint32_t> AddedVocabulary::tokenToId(std::string_view content) const {
  return lookup(byContent_, content);
}

uint32_t AddedVocabulary::maxId() const {
  uint32_t m = 0;
  for (const auto& t : tokens_) m = std::max(m, t.id + 1);
  return m;
}

}  // namespace textgen::tokenizer
