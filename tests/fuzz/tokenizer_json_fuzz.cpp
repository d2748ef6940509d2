// tokenizer.json from untrusted bytes: the input is tokenizer.json, optionally followed by a NUL
// byte and tokenizer_config.json. A tokenizer that loads is then used: fixed texts (ASCII,
// multi-byte characters, special-token look-alikes, bytes that are not UTF-8) are encoded and
// decoded, and its first ids are streamed, with the checks of tokenizer_checks.h.
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using textgen::tokenizer::Tokenizer;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view config =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  auto tok = Tokenizer::fromJson(in.substr(0, nul), config);
  if (!tok.ok()) {
    FUZZ_CHECK(!tok.status().message().empty(), "an error without a message");
    return 0;
  }
  const Tokenizer& t = **tok;
  static const std::string_view kTexts[] = {"Hello world",
                                            " the  quick\tbrown\nfox ",
                                            "héllo 中文 😀",
                                            "<s></s><unk><|endoftext|>[CLS]",
                                            "\xff\xfe not utf-8",
                                            "",
                                            "a",
                                            "   ",
                                            "0123456789",
                                            "▁Ġ##"};
  for (std::string_view text : kTexts) {
    for (bool addSpecial : {true, false}) {
      const std::vector<uint32_t> ids =
          textgen::fuzz::checkEncode(t, text, addSpecial, /*fixture=*/false);
      textgen::fuzz::checkStreaming(t, ids, !addSpecial);
    }
  }
  std::vector<uint32_t> first;
  for (uint32_t id = 0; id < std::min<size_t>(t.vocabSize() + 2, 48); ++id) first.push_back(id);
  textgen::fuzz::checkStreaming(t, first, false);
  textgen::fuzz::checkStreaming(t, first, true);
  (void)t.bosTokenId();
  (void)t.eosTokenId();
  return 0;
}
