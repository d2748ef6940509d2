// Added tokens (special or not) matched in the input before normalisation and the model run, with
// Hugging Face's semantics: leftmost-longest, single_word, lstrip, rstrip, normalized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "components.h"
#include "vocab.h"

namespace textgen::tokenizer {

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool singleWord = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) turns the patterns of normalized tokens into normalised text.
  void build(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` around added tokens; the remaining pieces are normalised.
  PreTokenizedString extractAndNormalize(const Normalizer* normalizer, std::string_view text) const;

  const std::string* idToToken(uint32_t id) const;
  // The string decode() feeds to the decoder: the normalised content for normalized tokens whose
  // normalisation changes them (Hugging Face's normalized_cache), else the content.
  const std::string* idToDecodeForm(uint32_t id) const;
  std::optional<uint32_t> tokenToId(std::string_view content) const;
  bool isSpecialContent(std::string_view content) const { return special_.contains(content); }
  size_t size() const { return tokens_.size(); }
  // Ids at or above this are added tokens not in the model's vocabulary.
  uint32_t maxId() const;

 private:
  // A byte trie over patterns; value = index into tokens_.
  struct Matcher {
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> children;  // sorted by byte
      int32_t token = -1;
    };
    std::vector<Node> nodes{Node{}};
    void add(std::string_view pattern, int32_t token);
    // Leftmost-longest non-overlapping matches: (token, start, end).
    std::vector<std::tuple<int32_t, size_t, size_t>> findAll(std::string_view text) const;
  };

  std::vector<std::pair<std::optional<int32_t>, Offsets>> findMatches(std::string_view s,
                                                                      const Matcher& m) const;
  std::vector<NormalizedString> splitWith(NormalizedString s, const Matcher& m,
                                          std::vector<std::optional<Token>>& tokens) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> decodeForms_;  // per token; empty when equal to the content
  std::unordered_map<uint32_t, size_t> byId_;
  VocabMap byContent_;
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_;
  Matcher raw_;         // normalized == false: matched on the original text
  Matcher normalized_;  // normalized == true: matched on normalised pieces
};

}  // namespace textgen::tokenizer
