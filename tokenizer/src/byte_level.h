// GPT-2's reversible byte <-> printable-character map used by the ByteLevel components.
#pragma once

#include <array>
#include <cstdint>

namespace textgen::tokenizer {

// byteToChar()[b] is the code point that stands for byte b.
const std::array<char32_t, 256>& byteToChar();

// The byte a code point stands for, or -1 when it is not one of the 256 mapped characters.
int charToByte(char32_t c);

}  // namespace textgen::tokenizer
