// A slow GPT2Tokenizer's files from untrusted bytes (what OPT checkpoints ship instead of
// tokenizer.json): vocab.json NUL merges.txt [NUL tokenizer_config.json [NUL
// special_tokens_map.json]]. A load error must carry a message naming a file; a tokenizer that
// loads passes the checks of tokenizer_checks.h on fixed texts and its first ids.
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using textgen::tokenizer::Tokenizer;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view parts[4];
  for (int i = 0; i < 4; ++i) {
    const size_t nul = i < 3 ? in.find('\0') : std::string_view::npos;
    parts[i] = in.substr(0, nul);
    if (nul == std::string_view::npos) break;
    in.remove_prefix(nul + 1);
  }
  auto tok = Tokenizer::fromGpt2Files({parts[0], parts[1], parts[2], parts[3]});
  if (!tok.ok()) {
    const std::string_view m = tok.status().message();
    FUZZ_CHECK(m.starts_with("vocab.json") || m.starts_with("merges.txt") ||
                   m.starts_with("tokenizer_config.json") ||
                   m.starts_with("special_tokens_map.json"),
               "an error that names no file");
    return 0;
  }
  const Tokenizer& t = **tok;
  static const std::string_view kTexts[] = {"Hello world",
                                            " the  quick\tbrown\nfox ",
                                            "héllo 中文 😀",
                                            "<s></s><pad><unk><|endoftext|>",
                                            "\xff\xfe not utf-8",
                                            "",
                                            "a",
                                            "   "};
  for (std::string_view text : kTexts) {
    for (bool addSpecial : {true, false}) {
      const std::vector<uint32_t> ids =
          textgen::fuzz::checkEncode(t, text, addSpecial, /*fixture=*/false);
      textgen::fuzz::checkStreaming(t, ids, !addSpecial, /*windowed=*/false);
    }
  }
  std::vector<uint32_t> first;
  for (uint32_t id = 0; id < std::min<size_t>(t.vocabSize() + 2, 48); ++id) first.push_back(id);
  textgen::fuzz::checkStreaming(t, first, false, false);
  textgen::fuzz::checkStreaming(t, first, true, false);
  (void)t.bosTokenId();
  (void)t.eosTokenId();
  return 0;
}
