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

inline std::optional<uint32_t> lookup(const VocabMap& vocab, std::string_view token) {
  auto it = vocab.find(token);
  if (it == vocab.end()) return std::nullopt;
  return it->second;
}

// id -> token; ids without a token map to null.
class ReverseVocab {
 public:
  void build(const VocabMap& vocab) {
    uint32_t maxId = 0;
    for (const auto& [token, id] : vocab) maxId = std::max(maxId, id);
    tokens_.assign(vocab.empty() ? 0 : maxId + 1, nullptr);
    for (const auto& [token, id] : vocab) tokens_[id] = &token;
  }
  const std::string* get(uint32_t id) const { return id < tokens_.size() ? tokens_[id] : nullptr; }

 private:
  std::vector<const std::string*> tokens_;
};

}  // namespace textgen::tokenizer
