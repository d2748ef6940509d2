// Regex and JSON Schema text to automata and masks. Input: the first byte picks the kind (even:
// regex, odd: JSON Schema), the rest is the source. Compiled with small limits so that each run
// stays fast; when it compiles, a few random walks must match and masks over a small synthetic
// vocabulary must agree with a per-token walk.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "textgen/grammar/grammar.h"

namespace {

using textgen::grammar::Grammar;

std::shared_ptr<const textgen::grammar::Vocabulary> vocab() {
  static const auto v = [] {
    std::vector<std::optional<std::string>> bytes{std::nullopt, std::string("<eos>"),
                                                  std::string()};
    for (int c = 0; c < 256; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
    for (const char* s : {"{\"", "\":", "\",", "\"}", "true", "null", " \"", "12", "é", "ab"})
      bytes.push_back(std::string(s));
    return textgen::grammar::Vocabulary::create(std::move(bytes), {1});
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto kind =
      data[0] % 2 ? textgen::grammar::Kind::kJsonSchema : textgen::grammar::Kind::kRegex;
  const std::string_view source(reinterpret_cast<const char*>(data + 1), size - 1);
  textgen::grammar::Limits limits;
  limits.maxSourceBytes = 4096;
  limits.maxSchemaDepth = 8;
  limits.maxRegexBytes = 64 * 1024;
  limits.maxNfaStates = 20000;
  limits.maxDfaStates = 2000;
  auto g = Grammar::compile(kind, source, limits);
  if (!g.ok()) return 0;
  const Grammar& grammar = **g;
  std::mt19937 rng(static_cast<uint32_t>(size));
  for (int walk = 0; walk < 4; ++walk) {
    std::string text;
    int32_t s = grammar.start();
    for (int step = 0; step < 64 && !(grammar.accepting(s) && rng() % 4 == 0); ++step) {
      std::vector<uint8_t> live;
      for (int b = 0; b < 256; ++b) {
        if (grammar.next(s, static_cast<uint8_t>(b)) != Grammar::kDead)
          live.push_back(static_cast<uint8_t>(b));
      }
      if (live.empty()) {
        if (!grammar.accepting(s))
          textgen::fuzz::fail(__FILE__, __LINE__, "a state with no way out");
        break;
      }
      const uint8_t b = live[rng() % live.size()];
      text.push_back(static_cast<char>(b));
      s = grammar.next(s, b);
    }
    if (grammar.walk(grammar.start(), text) != s)
      textgen::fuzz::fail(__FILE__, __LINE__, "walk differs");
  }
  textgen::grammar::TokenIndex index(*g, vocab());
  std::vector<uint32_t> words(vocab()->maskWords());
  int32_t s = grammar.start();
  for (int step = 0; step < 8 && s != Grammar::kDead; ++step) {
    index.fillMask(s, words);
    std::vector<uint32_t> allowed;
    for (uint32_t id = 0; id < vocab()->size(); ++id) {
      const bool bit = (words[id / 32] >> (id % 32)) & 1;
      if (bit != index.allows(s, id))
        textgen::fuzz::fail(__FILE__, __LINE__, "mask and allows differ");
      if (bit) allowed.push_back(id);
    }
    if (allowed.empty()) textgen::fuzz::fail(__FILE__, __LINE__, "no token allowed (not even EOS)");
    const uint32_t pick = allowed[rng() % allowed.size()];
    if (index.isEos(pick)) break;
    s = index.advance(s, pick);
  }
  return 0;
}
