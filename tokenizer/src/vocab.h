// String -> id maps with string_view lookups, and the reverse table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace textgen::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

using VocabMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

// Token ids are below this (the loader's bound on config.json's vocab_size): the reverse table is
// dense, so one huge id in a small file must not decide how much memory it takes.
inline constexpr uint64_t kMaxTokenId = uint64_t{1} << 24;

inline std::optional<uint32_t> lookup(const VocabMap& vocab, std::string_view token) {
  auto it = vocab.find(token);
  if (it == vocab.end()) return std::nullopt;
  return it->second;
}

// id -> token; ids without a token map to null.
class ReverseVocab {
 public:
  // Ids are below kMaxTokenId (checked where vocabularies are parsed).
  void build(const VocabMap& vocab) {
    size_t size = 0;
    for (const auto& [token, id] : vocab) size = std::max(size, size_t{id} + 1);
    tokens_.assign(size, nullptr);
    for (const auto& [token, id] : vocab) tokens_[id] = &token;
  }
  const std::string* get(uint32_t id) const { return id < tokens_.size() ? tokens_[id] : nullptr; }

 private:
  std::vector<const std::string*> tokens_;
};

}  // namespace textgen::tokenizer
