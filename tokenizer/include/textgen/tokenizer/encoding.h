// The result of tokenizing one text: parallel arrays, one entry per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace textgen::tokenizer {

struct Encoding {
  std::vector<uint32_t> ids;
  std::vector<std::string> tokens;                     // vocabulary strings (e.g. "Ġworld")
  std::vector<std::pair<uint32_t, uint32_t>> offsets;  // [start, end) bytes of the input text
  std::vector<uint8_t> specialTokensMask;              // 1: added by the post-processor template

  size_t size() const { return ids.size(); }

  // Keeps the last `maxTokens` tokens (TGI's `truncate`: the end of a prompt matters most).
  void truncateLeft(size_t maxTokens);

  void append(uint32_t id, std::string token, std::pair<uint32_t, uint32_t> offset, bool special) {
    ids.push_back(id);
    tokens.push_back(std::move(token));
    offsets.push_back(offset);
    specialTokensMask.push_back(special ? 1 : 0);
  }
};

}  // namespace textgen::tokenizer
