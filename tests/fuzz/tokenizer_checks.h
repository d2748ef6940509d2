// The checks both tokenizer targets run on a loaded tokenizer: an encoding's arrays agree and its
// offsets lie inside the text; streaming detokenization (IncrementalDecoder) yields whole UTF-8
// characters whose concatenation equals decode() of the same ids.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "textgen/tokenizer/incremental_decoder.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::fuzz {

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
inline bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// `windowed`: the decoder strips more than the first character of a fused window (Fuse, then
// Strip with start >= 2 or stop >= 1). Streaming by prefix windows (TGI's method, which Hugging
// Face tokenizers' own DecodeStream shares) then differs from decode() by design: with tokenizers
// 0.23.2, DecodeStream gives the same streamed text as ours for tests/fuzz/crashes/tokenizer_json/
// strip-start-2-streaming, not decode()'s. Only the UTF-8 check applies there.
inline void checkStreaming(const tokenizer::Tokenizer& tok, std::span<const uint32_t> ids,
                           bool skipSpecial, bool windowed = false) {
  const std::string full = tok.decode(ids, skipSpecial);
  tokenizer::IncrementalDecoder d(tok, skipSpecial);
  std::string streamed;
  for (uint32_t id : ids) {
    const std::string piece = d.step(id);
    FUZZ_CHECK(validUtf8(piece), "a streamed piece ends inside a UTF-8 character");
    streamed += piece;
  }
  streamed += d.flush();
  if (windowed) return;
  FUZZ_CHECK(streamed == full, "streamed '" + streamed + "' but decode gives '" + full + "'");
}

// Encodes `text` and checks the result; returns the ids (empty when the text was rejected).
// `fixture`: a reference tokenizer, where valid UTF-8 must encode and every id is below
// vocabSize(). A fuzzed tokenizer.json may lack an unknown token (encoding then fails), and its
// vocabulary may skip ids, which vocabSize() counts rather than spans
// (tests/fuzz/crashes/README.md).
inline std::vector<uint32_t> checkEncode(const tokenizer::Tokenizer& tok, std::string_view text,
                                         bool addSpecial, bool fixture) {
  auto e = tok.encode(text, addSpecial);
  if (!e.ok()) {
    FUZZ_CHECK(!fixture || !validUtf8(text), "valid UTF-8 rejected: " + e.status().toString());
    return {};
  }
  FUZZ_CHECK(e->tokens.size() == e->size() && e->offsets.size() == e->size() &&
                 e->specialTokensMask.size() == e->size(),
             "encoding arrays of different lengths");
  for (size_t i = 0; i < e->size(); ++i) {
    const auto [start, end] = e->offsets[i];
    FUZZ_CHECK(start <= end && end <= text.size(), "offset [" + std::to_string(start) + ", " +
                                                       std::to_string(end) + ") of a " +
                                                       std::to_string(text.size()) + "-byte text");
    FUZZ_CHECK(!fixture || e->ids[i] < tok.vocabSize(),
               "id " + std::to_string(e->ids[i]) + " >= vocabSize()");
  }
  tokenizer::Encoding copy = *e;
  copy.truncateLeft(e->size() / 2);
  FUZZ_CHECK(copy.size() == e->size() / 2 && copy.offsets.size() == copy.size(), "truncateLeft");
  return e->ids;
}

}  // namespace textgen::fuzz
