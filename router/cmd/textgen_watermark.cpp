// textgen-watermark: the detector of Kirchenbauer et al.'s watermark (textgen/base/watermark.h), as
// textgen and TGI apply it with `"watermark": true`.
//
//   textgen-watermark detect --model-id DIR [--gamma 0.5] [--vocab-size N] [--json]
//                            [--text TEXT | --file PATH]   (else the text is read from stdin)
//
// The text is tokenized with DIR's tokenizer (no special tokens added); each token after the first
// is green when it is in the green list seeded by the token before it. The green list spans the
// model's vocabulary (config.json's vocab_size, the logits' width, unless --vocab-size says
// otherwise). Prints the tokens scored, the green ones, the z-score and its one-sided p-value; exit
// status 0, or 2 for bad usage or input.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "textgen/base/file.h"
#include "textgen/base/watermark.h"
#include "textgen/tokenizer/tokenizer.h"

namespace {

using namespace textgen;

int usage(const std::string& why) {
  std::fprintf(stderr,
               "textgen-watermark: %s\n"
               "usage: textgen-watermark detect --model-id DIR [--gamma 0.5] [--vocab-size N] "
               "[--json] [--text TEXT | --file PATH]\n",
               why.c_str());
  return 2;
}

StatusOr<double> parseNumber(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0')
    return invalidArgumentError(flag + ": '" + v + "' is not a number");
  return x;
}

// config.json's vocab_size: the width of the logits the green lists were drawn over.
StatusOr<uint32_t> vocabSizeOf(const std::string& dir) {
  TG_ASSIGN_OR_RETURN(std::string text, readRegularFile(dir + "/config.json"));
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    return invalidArgumentError(dir + "/config.json is not a JSON object");
  // Multimodal configs keep the language model's under text_config.
  const bool nested = !config.contains("vocab_size") && config.contains("text_config") &&
                      config["text_config"].is_object();
  const nlohmann::json& src = nested ? config["text_config"] : config;
  const auto it = src.find("vocab_size");
  if (it == src.end() || !it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
      it->get<uint64_t>() > (1u << 24)) {
    return invalidArgumentError(dir +
                                "/config.json has no usable vocab_size (a positive integer up to "
                                "2^24); pass --vocab-size");
  }
  return static_cast<uint32_t>(it->get<uint64_t>());
}

int detect(int argc, char** argv) {
  std::string modelId, text, file;
  bool haveText = false, json = false;
  double gamma = kWatermarkDefaultGamma;
  std::optional<uint32_t> vocab;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    if (a == "--json") {
      json = true;
      continue;
    }
    const std::optional<std::string> v = value();
    if (!v) return usage(a + " needs a value");
    if (a == "--model-id") {
      modelId = *v;
    } else if (a == "--text") {
      text = *v;
      haveText = true;
    } else if (a == "--file") {
      file = *v;
    } else if (a == "--gamma") {
      auto g = parseNumber(a, *v);
      if (!g.ok()) return usage(g.status().message());
      gamma = *g;
      if (Status s = checkWatermarkParams(gamma, kWatermarkDefaultDelta); !s.ok())
        return usage(s.message());
    } else if (a == "--vocab-size") {
      auto n = parseNumber(a, *v);
      if (!n.ok() || *n < 1 || *n > (1 << 24) ||
          *n != static_cast<double>(static_cast<int64_t>(*n)))
        return usage("--vocab-size must be an integer in [1, 2^24]");
      vocab = static_cast<uint32_t>(*n);
    } else {
      return usage("unknown flag '" + a + "'");
    }
  }
  if (modelId.empty()) return usage("--model-id DIR is required");
  if (haveText && !file.empty()) return usage("give --text or --file, not both");
  if (!file.empty()) {
    auto t = readRegularFile(file);
    if (!t.ok()) return usage(t.status().message());
    text = std::move(*t);
  } else if (!haveText) {
    // At most what --file reads (kMaxTextFileBytes).
    char buf[1 << 16];
    while (std::cin.read(buf, sizeof(buf)) || std::cin.gcount() > 0) {
      text.append(buf, static_cast<size_t>(std::cin.gcount()));
      if (text.size() > kMaxTextFileBytes)
        return usage("the text on stdin is longer than " + std::to_string(kMaxTextFileBytes) +
                     " bytes");
    }
  }
  if (!vocab) {
    auto n = vocabSizeOf(modelId);
    if (!n.ok()) return usage(n.status().message());
    vocab = *n;
  }
  auto tok = tokenizer::Tokenizer::fromDirectory(modelId);
  if (!tok.ok())
    return usage("loading the tokenizer of " + modelId + ": " + tok.status().message());
  auto enc = (*tok)->encode(text, /*addSpecialTokens=*/false);
  if (!enc.ok()) return usage("tokenizing the text: " + enc.status().message());
  const WatermarkScore s = scoreWatermark(enc->ids, *vocab, gamma);
  if (json) {
    std::printf("%s\n",
                nlohmann::json{
                    {"tokens_scored", s.scored},
                    {"green_tokens", s.green},
                    {"green_fraction",
                     s.scored ? static_cast<double>(s.green) / static_cast<double>(s.scored) : 0.0},
                    {"gamma", gamma},
                    {"vocab_size", *vocab},
                    {"z_score", s.z},
                    {"p_value", s.pValue}}
                    .dump()
                    .c_str());
  } else {
    std::printf(
        "tokens scored  %lld\ngreen tokens   %lld (gamma %.3f)\nz-score        %.3f\n"
        "p-value        %.3g\n",
        static_cast<long long>(s.scored), static_cast<long long>(s.green), gamma, s.z, s.pValue);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("no command");
  const std::string cmd = argv[1];
  if (cmd == "detect") return detect(argc, argv);
  if (cmd == "--help" || cmd == "-h") {
    usage("detects the watermark of textgen's and TGI's `watermark: true`");
    return 0;
  }
  return usage("unknown command '" + cmd + "'");
}
