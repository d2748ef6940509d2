// tokenizer.json from untrusted bytes: the input is tokenizer.json, optionally followed by a NUL
// byte and tokenizer_config.json. A tokenizer that loads is then used: fixed texts (ASCII,
// multi-byte characters, special-token look-alikes, bytes that are not UTF-8) are encoded and
// decoded, and its first ids are streamed, with the checks of tokenizer_checks.h.
#include "textgen/base/json.h"
#include "tokenizer_checks.h"

namespace {

// A decoder Sequence with Fuse before a Strip of start >= 2 or stop >= 1: it strips inside what a
// window of streaming fuses, not only at the sequence's start (see checkStreaming).
bool fusedStrip(std::string_view json) {
  auto j = textgen::parseJson(json, "tokenizer.json");
  if (!j.ok() || !j->is_object()) return false;
  auto d = j->find("decoder");
  if (d == j->end() || !d->is_object()) return false;
  auto list = d->find("decoders");
  if (list == d->end() || !list->is_array()) return false;
  bool fused = false;
  for (const auto& step : *list) {
    if (!step.is_object()) continue;
    const auto type = step.find("type");
    if (type == step.end() || !type->is_string()) continue;
    if (*type == "Fuse") fused = true;
    const auto start = step.find("start"), stop = step.find("stop");
    const bool startsDeep =
        start != step.end() && start->is_number_unsigned() && start->get<uint64_t>() >= 2;
    const bool stops =
        stop != step.end() && stop->is_number_unsigned() && stop->get<uint64_t>() > 0;
    if (fused && *type == "Strip" && (startsDeep || stops)) return true;
  }
  return false;
}

}  // namespace

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
  const bool windowed = fusedStrip(in.substr(0, nul));
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
      textgen::fuzz::checkStreaming(t, ids, !addSpecial, windowed);
    }
  }
  std::vector<uint32_t> first;
  for (uint32_t id = 0; id < std::min<size_t>(t.vocabSize() + 2, 48); ++id) first.push_back(id);
  textgen::fuzz::checkStreaming(t, first, false, windowed);
  textgen::fuzz::checkStreaming(t, first, true, windowed);
  (void)t.bosTokenId();
  (void)t.eosTokenId();
  return 0;
}
