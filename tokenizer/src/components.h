// The pipeline stages of a Hugging Face tokenizer and the data passed between them:
//   added tokens -> normalizer -> pre-tokenizer -> model -> post-processor;  decoder for ids ->
//   text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json_util.h"
#include "normalized_string.h"
#include "textgen/tokenizer/encoding.h"

namespace textgen::tokenizer {

struct Token {
  uint32_t id;
  std::string value;
  Offsets offsets;  // byte range within the normalised piece the model saw
};

struct Split {
  NormalizedString normalized;
  std::optional<std::vector<Token>>
      tokens;  // set once the piece is tokenized (added tokens: early)
};

// The input as a list of pieces, each with its own alignment to the original text.
struct PreTokenizedString {
  std::vector<Split> splits;

  // Replaces every not-yet-tokenized piece by fn(piece) (a vector of pieces); empty pieces are
  // dropped.
  template <typename Fn>
  void split(Fn&& fn) {
    std::vector<Split> out;
    out.reserve(splits.size());
    for (Split& s : splits) {
      if (s.tokens) {
        out.push_back(std::move(s));
        continue;
      }
      for (NormalizedString& piece : fn(std::move(s.normalized))) {
        if (!piece.empty()) out.push_back({std::move(piece), std::nullopt});
      }
    }
    splits = std::move(out);
  }

  template <typename Fn>
  void normalize(Fn&& fn) {
    for (Split& s : splits) {
      if (!s.tokens) fn(s.normalized);
    }
  }
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormalizedString& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void preTokenize(PreTokenizedString& s) const = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  // Appends the tokens of one pre-tokenized piece (offsets relative to the piece).
  virtual Status tokenize(std::string_view piece, std::vector<Token>& out) const = 0;
  virtual std::optional<uint32_t> tokenToId(std::string_view token) const = 0;
  virtual const std::string* idToToken(uint32_t id) const = 0;
  virtual size_t vocabSize() const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(Encoding& encoding, bool addSpecialTokens) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings; decode() joins the result.
  virtual void decodeChain(std::vector<std::string>& tokens) const = 0;
  // True when "<0xNN>" tokens are decoded as a group whose rendering depends on the whole run
  // (ByteFallback): streaming must not emit such a run before it ends.
  virtual bool groupsByteTokens() const { return false; }
};

// A Split/Replace pattern: a literal string, or a regex in Oniguruma's dialect.
StatusOr<std::shared_ptr<const Regex>> makePattern(const PatternSpec& spec,
                                                   const std::string& path);

StatusOr<std::unique_ptr<Normalizer>> makeNormalizer(const Json& j, const std::string& path);
StatusOr<std::unique_ptr<PreTokenizer>> makePreTokenizer(const Json& j, const std::string& path);
StatusOr<std::unique_ptr<Model>> makeModel(const Json& j, const std::string& path);
StatusOr<std::unique_ptr<PostProcessor>> makePostProcessor(const Json& j, const std::string& path);
// TemplateProcessing of one sequence: `before` tokens, the sequence, `after` tokens.
StatusOr<std::unique_ptr<PostProcessor>> makeTemplatePostProcessor(
    const std::vector<std::pair<std::string, uint32_t>>& before,
    const std::vector<std::pair<std::string, uint32_t>>& after);
StatusOr<std::unique_ptr<Decoder>> makeDecoder(const Json& j, const std::string& path);

}  // namespace textgen::tokenizer
