// A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) in C++, producing exactly what
// the `tokenizers` library produces — ids, tokens, byte offsets and decoded text — with TGI's
// behaviour where TGI departs from the file (the Llama post-processor override).
//
//   TG_ASSIGN_OR_RETURN(auto tok, Tokenizer::fromDirectory("/models/llama"));
//   TG_ASSIGN_OR_RETURN(Encoding e, tok->encode("Hello world"));
//   std::string text = tok->decode(e.ids, /*skipSpecialTokens=*/true);
//
// Thread-safe: encode and decode may run concurrently on one Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "textgen/base/status_or.h"
#include "textgen/tokenizer/encoding.h"

namespace textgen::tokenizer {

// What tokenizer_config.json says (absent fields stay empty).
struct TokenizerConfig {
  std::string tokenizerClass;
  std::optional<std::string> bosToken;
  std::optional<std::string> eosToken;
  std::optional<std::string> unkToken;
  std::optional<std::string> padToken;
  std::optional<bool> addBosToken;
  std::optional<bool> addEosToken;
  std::optional<uint64_t> modelMaxLength;
};

// The files of a slow GPT2Tokenizer, which Hub OPT checkpoints ship instead of tokenizer.json.
struct Gpt2Files {
  std::string_view vocabJson;             // vocab.json
  std::string_view mergesTxt;             // merges.txt
  std::string_view tokenizerConfigJson;   // tokenizer_config.json; may be empty
  std::string_view specialTokensMapJson;  // special_tokens_map.json; may be empty
};

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json. Without tokenizer.json,
  // a GPT2Tokenizer (tokenizer_config.json's tokenizer_class, or config.json's model_type "opt" or
  // "gpt2" when the config names no class) is built from DIR/vocab.json + DIR/merges.txt as
  // transformers builds it; any other class is refused, naming the missing tokenizer.json.
  static StatusOr<std::unique_ptr<Tokenizer>> fromDirectory(const std::string& dir);
  // From the contents of a slow GPT2Tokenizer's files (see fromDirectory).
  static StatusOr<std::unique_ptr<Tokenizer>> fromGpt2Files(const Gpt2Files& files);
  // From the files' contents; configJson may be empty.
  static StatusOr<std::unique_ptr<Tokenizer>> fromJson(std::string_view tokenizerJson,
                                                       std::string_view configJson = {});
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // INVALID_ARGUMENT when text is not valid UTF-8.
  StatusOr<Encoding> encode(std::string_view text, bool addSpecialTokens = true) const;

  // Unknown ids are skipped, as in Hugging Face.
  std::string decode(std::span<const uint32_t> ids, bool skipSpecialTokens = false) const;

  std::optional<uint32_t> tokenToId(std::string_view token) const;
  std::optional<std::string> idToToken(uint32_t id) const;
  // True for added tokens marked special (e.g. <s>, <|eot_id|>).
  bool isSpecial(uint32_t id) const;
  // True when decode() drops the id (unknown, or special while skipping special tokens).
  bool isSkippedInDecode(uint32_t id, bool skipSpecialTokens) const;
  // True for a byte token ("<0xNN>") that the decoder renders together with its neighbours
  // (ByteFallback), so that its text is final only once the run of byte tokens ends.
  bool isGroupedByteToken(uint32_t id) const;
  // The raw bytes the token adds to decoded text in the middle of a sequence (for constrained
  // decoding): byte-level BPE's byte map, ByteFallback's <0xNN> byte, Metaspace's ▁ as a space.
  // Rules the decoder applies only at the ends of a sequence (the leading-space strip, a
  // BPEDecoder suffix dropped at the end) are not applied. nullopt for special tokens and unknown
  // ids. May be an incomplete UTF-8 sequence.
  std::optional<std::string> tokenBytes(uint32_t id) const;
  // Model vocabulary plus added tokens (one past the largest id).
  size_t vocabSize() const;

  const TokenizerConfig& config() const;
  std::optional<uint32_t> bosTokenId() const;
  std::optional<uint32_t> eosTokenId() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static StatusOr<std::unique_ptr<Tokenizer>> load(std::string_view tokenizerJson,
                                                   std::string_view configJson);
  std::unique_ptr<Impl> impl_;
};

}  // namespace textgen::tokenizer
