// Every fixture tokenizer of tests/reference/tokenizers on arbitrary bytes. Input: one byte picks
// the tokenizer, one byte of flags (bit 0: add special tokens, bit 1: skip special tokens when
// decoding, bit 2: the payload is token ids, two bytes each, rather than text), then the payload.
#include <algorithm>
#include <filesystem>
#include <memory>

#include "tokenizer_checks.h"

namespace {

using textgen::tokenizer::Tokenizer;

const std::vector<std::unique_ptr<Tokenizer>>& tokenizers() {
  static const std::vector<std::unique_ptr<Tokenizer>> all = [] {
    std::vector<std::string> dirs;
    const auto root = std::filesystem::path(textgen::fuzz::fixturesDir()) / "tokenizers";
    for (const auto& entry : std::filesystem::directory_iterator(root)) {
      if (std::filesystem::exists(entry.path() / "tokenizer.json"))
        dirs.push_back(entry.path().string());
    }
    std::sort(dirs.begin(), dirs.end());  // a byte picks the same tokenizer on every machine
    std::vector<std::unique_ptr<Tokenizer>> out;
    for (const std::string& d : dirs) {
      auto t = Tokenizer::fromDirectory(d);
      if (!t.ok()) textgen::fuzz::fail(__FILE__, __LINE__, d + ": " + t.status().toString());
      out.push_back(std::move(*t));
    }
    if (out.empty()) textgen::fuzz::fail(__FILE__, __LINE__, "no tokenizers in " + root.string());
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  textgen::fuzz::Input in(data, size);
  const auto& all = tokenizers();
  const Tokenizer& tok = *all[in.byte() % all.size()];
  const uint8_t flags = in.byte();
  const bool addSpecial = flags & 1, skipSpecial = flags & 2;
  std::vector<uint32_t> ids;
  if (flags & 4) {
    // Ids up to a little past the vocabulary: unknown ids are skipped, never read out of range.
    const auto limit = static_cast<uint32_t>(tok.vocabSize() + 8);
    while (!in.empty()) ids.push_back(in.u16() % limit);
  } else {
    ids = textgen::fuzz::checkEncode(tok, in.rest(), addSpecial, /*fixture=*/true);
  }
  textgen::fuzz::checkStreaming(tok, ids, skipSpecial);
  for (uint32_t id : ids) {
    (void)tok.isSkippedInDecode(id, skipSpecial);
    if (auto token = tok.idToToken(id)) (void)tok.tokenToId(*token);
  }
  return 0;
}
