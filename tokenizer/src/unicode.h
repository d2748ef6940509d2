// UTF-8 and Unicode character predicates with the exact definitions Hugging Face tokenizers uses
// (Rust's char methods and regex-syntax's \w), backed by utf8proc.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace textgen::tokenizer {

// Decodes the code point at s[i] (s must be valid UTF-8) and returns its byte length in *len.
inline char32_t decodeUtf8(std::string_view s, size_t i, size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if (b0 < 0xe0) {
    *len = 2;
    return ((b0 & 0x1fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3fu);
  }
  if (b0 < 0xf0) {
    *len = 3;
    return ((b0 & 0x0fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3fu) << 6) |
           (static_cast<unsigned char>(s[i + 2]) & 0x3fu);
  }
  *len = 4;
  return ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3fu) << 12) |
         ((static_cast<unsigned char>(s[i + 2]) & 0x3fu) << 6) |
         (static_cast<unsigned char>(s[i + 3]) & 0x3fu);
}

inline size_t utf8Length(char32_t c) {
  return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

void appendUtf8(std::string& out, char32_t c);

// Byte length of the UTF-8 sequence starting with lead byte b.
inline size_t utf8SequenceLength(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
}

// True when s is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool isValidUtf8(std::string_view s);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8Lossy(std::string_view bytes);

// Number of code points (s valid UTF-8).
size_t countChars(std::string_view s);

// Rust char::is_whitespace (the White_Space property).
bool isWhitespace(char32_t c);
// Rust char::is_numeric: general category Nd, Nl or No.
bool isNumeric(char32_t c);
// Unicode general category P* (Pc, Pd, Ps, Pe, Pi, Pf, Po).
bool isPunctuation(char32_t c);

// Rust char::to_lowercase: the full lowercase mapping (one or more code points), appended to out.
void appendLowercase(std::string& out, char32_t c);

// Canonical combining class.
int combiningClass(char32_t c);

}  // namespace textgen::tokenizer
