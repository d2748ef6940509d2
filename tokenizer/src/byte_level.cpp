#include "byte_level.h"

namespace textgen::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> toChar{};
  std::array<int16_t, 512> toByte{};  // every mapped code point is below 512
  Tables() {
    toByte.fill(-1);
    // Printable Latin-1 bytes map to themselves; the others to 256, 257, ... in byte order.
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      toChar[b] = printable ? static_cast<char32_t>(b) : next++;
      toByte[toChar[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<char32_t, 256>& byteToChar() {
  return tables().toChar;
}

int charToByte(char32_t c) {
  return c < 512 ? tables().toByte[c] : -1;
}

}  // namespace textgen::tokenizer
