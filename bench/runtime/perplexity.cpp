// Perplexity of a model on a text, per quantization format (issue 16's quality budgets): the text
// tokenized with the model's own tokenizer, cut into windows of `--window` tokens (stride = window:
// each token is scored once, given the tokens before it in its window), every window one prefill
// whose logits are read for each row. perplexity = exp(mean over predicted tokens of
// -log softmax(logits)[next token]). Prints a table (one row per --quantize value, each against the
// unquantized row when there is one) and one JSON line; it measures, never asserts.
//
//   bench_perplexity --model DIR --text FILE [--quantize none,eetq,...|all] [--window N]
//                    [--documents] [--device cpu|cuda] [--dtype float32|float16|bfloat16]
//                    [--threads N]
//
// --quantize takes TGI's values (bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, eetq, fp8: the
// dense checkpoint quantized as it loads; gptq, awq: the checkpoint's own format, which loads
// without the flag too) and `none` (the checkpoint as it is), comma-separated; `all` is none and
// every load-time format. --documents reads FILE as the demo model's corpus format: documents
// after form-feed lines ("\f name"), each tokenized alone as <s> text </s>, as
// tools/demo_model/train.py scored its held-out documents. Window default: the model's context;
// compare formats at one window, and one the model was trained at (the demo model: 256 of its 512).
// docs/quantization.md has the formats and the demo model's figures.
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "textgen/runtime/model.h"
#include "textgen/tokenizer/tokenizer.h"

namespace {

using namespace textgen;
using namespace textgen::runtime;
using nlohmann::json;

constexpr const char* kUsage =
    "usage: bench_perplexity --model DIR --text FILE [--quantize none,eetq,...|all] [--window N]\n"
    "                        [--documents] [--device cpu|cuda] [--dtype float32|float16|bfloat16]\n"
    "                        [--threads N]\n";

struct Flags {
  std::string model, text;
  std::vector<std::string> quantize{"none"};
  int64_t window = 0;  // 0: the model's context
  bool documents = false;
  std::string device = "cpu";
  std::string dtype;  // empty: float32 on the CPU, bfloat16 on CUDA
  int threads = 0;
};

const std::vector<std::string> kLoadTimeFormats = {"bitsandbytes", "bitsandbytes-nf4",
                                                   "bitsandbytes-fp4", "eetq", "fp8"};

std::vector<std::string> splitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

StatusOr<Flags> parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> StatusOr<std::string> {
      if (i + 1 >= argc) return invalidArgumentError(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--model") {
      TG_ASSIGN_OR_RETURN(f.model, value());
    } else if (a == "--text") {
      TG_ASSIGN_OR_RETURN(f.text, value());
    } else if (a == "--quantize") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      f.quantize = v == "all" ? std::vector<std::string>{"none"} : splitCommas(v);
      if (v == "all")
        f.quantize.insert(f.quantize.end(), kLoadTimeFormats.begin(), kLoadTimeFormats.end());
      for (const std::string& q : f.quantize)
        if (q != "none" && q != "gptq" && q != "awq" &&
            loadQuantizationOf(q) == LoadQuantization::kNone)
          return invalidArgumentError("--quantize '" + q +
                                      "': expected none, gptq, awq, bitsandbytes, "
                                      "bitsandbytes-nf4, bitsandbytes-fp4, eetq, fp8 or all");
    } else if (a == "--window") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      f.window = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || f.window < 2)
        return invalidArgumentError("--window must be a number of tokens, at least 2");
    } else if (a == "--documents") {
      f.documents = true;
    } else if (a == "--device") {
      TG_ASSIGN_OR_RETURN(f.device, value());
      if (f.device != "cpu" && f.device != "cuda")
        return invalidArgumentError("--device must be cpu or cuda");
    } else if (a == "--dtype") {
      TG_ASSIGN_OR_RETURN(f.dtype, value());
      if (f.dtype != "float32" && f.dtype != "float16" && f.dtype != "bfloat16")
        return invalidArgumentError("--dtype must be float32, float16 or bfloat16");
    } else if (a == "--threads") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      f.threads = std::atoi(v.c_str());
    } else {
      return invalidArgumentError("unknown flag '" + a + "'");
    }
  }
  if (f.model.empty() || f.text.empty())
    return invalidArgumentError("--model and --text are required");
  return f;
}

kernels::DType dtypeOf(const Flags& f) {
  const std::string d = f.dtype.empty() ? (f.device == "cuda" ? "bfloat16" : "float32") : f.dtype;
  return d == "float16"    ? kernels::DType::kF16
         : d == "bfloat16" ? kernels::DType::kBF16
                           : kernels::DType::kF32;
}

// The text's token ids: the whole file as one encoding, or (--documents) each document's
// encoding followed by the end-of-sequence id.
StatusOr<std::vector<uint32_t>> readTokens(const Flags& f, const tokenizer::Tokenizer& tok,
                                           int64_t* documents) {
  std::ifstream in(f.text, std::ios::binary);
  if (!in) return notFoundError("--text '" + f.text + "': " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> docs;
  if (f.documents) {
    // As train.py: text.split("\f")[1:], each document's first line (its name) dropped.
    size_t start = text.find('\f');
    while (start != std::string::npos) {
      const size_t next = text.find('\f', start + 1);
      const std::string d =
          text.substr(start + 1, next == std::string::npos ? next : next - start - 1);
      const size_t nl = d.find('\n');
      if (nl != std::string::npos) docs.push_back(d.substr(nl + 1));
      start = next;
    }
    if (docs.empty())
      return invalidArgumentError("--text '" + f.text +
                                  "' has no documents (--documents expects form-feed lines)");
  } else {
    docs.push_back(text);
  }
  const std::optional<uint32_t> eos = tok.eosTokenId();
  if (f.documents && !eos)
    return invalidArgumentError("--documents: the tokenizer has no end-of-sequence token");
  std::vector<uint32_t> ids;
  for (const std::string& d : docs) {
    TG_ASSIGN_OR_RETURN(tokenizer::Encoding e, tok.encode(d, /*addSpecialTokens=*/true));
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    if (f.documents) ids.push_back(*eos);
  }
  *documents = static_cast<int64_t>(docs.size());
  size_t textTokens = 0;  // tokens that are not special (an empty text still gets <s>)
  for (uint32_t id : ids) textTokens += tok.isSpecial(id) ? 0 : 1;
  if (textTokens == 0) return invalidArgumentError("--text '" + f.text + "' has no text to score");
  return ids;
}

struct Score {
  double nll = 0;  // summed over the predicted tokens
  int64_t predictions = 0, windows = 0;
  double seconds = 0;
};

// Each window of tokens one forward from position 0 (the cache reused), the logits of every row
// but the last read back; row r predicts token r + 1 of the window.
StatusOr<Score> scoreWindows(Model& model, Backend& backend, const std::vector<uint32_t>& tokens,
                             int64_t window) {
  constexpr int64_t kBlockSize = 16;
  const int64_t numBlocks = (window + kBlockSize - 1) / kBlockSize;
  TG_ASSIGN_OR_RETURN(
      auto cache, KvCache::create(backend, model.kvShape(), numBlocks, kBlockSize, model.dtype()));
  std::vector<uint32_t> blocks(static_cast<size_t>(numBlocks));
  for (int64_t b = 0; b < numBlocks; ++b) blocks[b] = static_cast<uint32_t>(b);
  const int64_t vocab = model.config().vocabSize;
  const int64_t n = static_cast<int64_t>(tokens.size());
  Score s;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t start = 0; start + 1 < n; start += window) {
    const int64_t len = std::min(window, n - start);
    ForwardBatch fb;
    fb.tokenIds.assign(tokens.begin() + start, tokens.begin() + start + len);
    for (int64_t p = 0; p < len; ++p) fb.slots.push_back(static_cast<uint32_t>(p));
    fb.sequences.push_back({.firstRow = 0, .numRows = len, .startPos = 0, .blocks = blocks});
    for (int64_t r = 0; r + 1 < len; ++r) fb.logitRows.push_back(r);
    TG_ASSIGN_OR_RETURN(std::vector<float> logits, model.forward(fb, *cache));
    for (int64_t r = 0; r + 1 < len; ++r) {
      const float* row = logits.data() + r * vocab;
      double max = row[0];
      for (int64_t v = 1; v < vocab; ++v) max = std::max<double>(max, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
      s.nll += max + std::log(sum) - row[fb.tokenIds[r + 1]];
    }
    s.predictions += len - 1;
    ++s.windows;
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

// The load options a --quantize value asks for on this checkpoint (as textgen-shard checks them).
StatusOr<LoadQuantization> loadQuantization(const std::string& q, const ModelConfig& c) {
  const LoadQuantization atLoad = loadQuantizationOf(q);
  if (atLoad != LoadQuantization::kNone && c.quantization.quantized())
    return invalidArgumentError("--quantize " + q + ": the checkpoint is already quantized (" +
                                std::string(toString(c.quantization.method)) + ")");
  if ((q == "gptq" || q == "awq") && q != toString(c.quantization.method))
    return invalidArgumentError("--quantize " + q + ": the checkpoint's quantization_config is '" +
                                std::string(toString(c.quantization.method)) + "'");
  return atLoad;
}

// Issue 16's budgets over the unquantized perplexity, in percent.
std::optional<double> budgetPercent(const std::string& q) {
  if (q == "bitsandbytes" || q == "eetq" || q == "fp8") return 1.0;
  if (q == "bitsandbytes-nf4" || q == "bitsandbytes-fp4" || q == "gptq" || q == "awq") return 5.0;
  return std::nullopt;
}

struct Row {
  std::string quantize;
  Score score;
  double perplexity = 0;
};

// What was measured, for the report.
struct Report {
  const Flags* flags = nullptr;
  size_t tokens = 0;
  int64_t documents = 0, window = 0;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<Row> rows;
};

// The table, then one JSON line.
void print(const Report& rep) {
  const Flags& f = *rep.flags;
  std::optional<double> baseline;
  for (const Row& r : rep.rows)
    if (r.quantize == "none") baseline = r.perplexity;
  std::printf("Perplexity of %s on %s: %zu tokens (%lld %s), windows of %lld, %s %s\n",
              f.model.c_str(), f.text.c_str(), rep.tokens, static_cast<long long>(rep.documents),
              rep.documents == 1 ? "text" : "documents", static_cast<long long>(rep.window),
              f.device.c_str(), std::string(kernels::dtypeName(rep.dtype)).c_str());
  std::printf("%-18s %11s %9s %7s %9s %11s %8s %8s\n", "quantize", "perplexity", "vs none",
              "budget", "mean NLL", "predictions", "windows", "seconds");
  json results = json::array();
  for (const Row& r : rep.rows) {
    const std::optional<double> budget = budgetPercent(r.quantize);
    std::optional<double> delta;
    if (baseline && r.quantize != "none") delta = 100.0 * (r.perplexity / *baseline - 1.0);
    char deltaText[32] = "-", budgetText[32] = "-";
    if (delta) std::snprintf(deltaText, sizeof deltaText, "%+.2f%%", *delta);
    if (budget) std::snprintf(budgetText, sizeof budgetText, "+%.0f%%", *budget);
    const double meanNll = r.score.nll / static_cast<double>(r.score.predictions);
    std::printf("%-18s %11.4f %9s %7s %9.5f %11lld %8lld %8.2f\n", r.quantize.c_str(), r.perplexity,
                deltaText, budgetText, meanNll, static_cast<long long>(r.score.predictions),
                static_cast<long long>(r.score.windows), r.score.seconds);
    results.push_back({{"quantize", r.quantize},
                       {"perplexity", r.perplexity},
                       {"mean_nll", meanNll},
                       {"vs_none_percent", delta ? json(*delta) : json(nullptr)},
                       {"budget_percent", budget ? json(*budget) : json(nullptr)},
                       {"predictions", r.score.predictions},
                       {"windows", r.score.windows},
                       {"seconds", r.score.seconds}});
  }
  std::printf("%s\n", json{{"bench", "perplexity"},
                           {"model", f.model},
                           {"text", f.text},
                           {"tokens", rep.tokens},
                           {"documents", rep.documents},
                           {"window", rep.window},
                           {"device", f.device},
                           {"dtype", kernels::dtypeName(rep.dtype)},
                           {"results", results}}
                          .dump()
                          .c_str());
}

// Loads the model once per --quantize value and scores the text with each.
StatusOr<Report> measure(const Flags& f) {
  TG_ASSIGN_OR_RETURN(ModelConfig config, loadArchitectureConfig(f.model));
  TG_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::fromDirectory(f.model));
  Report rep;
  rep.flags = &f;
  rep.dtype = dtypeOf(f);
  TG_ASSIGN_OR_RETURN(std::vector<uint32_t> tokens, readTokens(f, *tok, &rep.documents));
  rep.tokens = tokens.size();
  for (uint32_t id : tokens)
    if (id >= config.vocabSize)
      return invalidArgumentError("token id " + std::to_string(id) +
                                  " is outside the model's vocabulary");
  rep.window = f.window > 0 ? f.window : config.maxContext();
  if (rep.window < 2 || rep.window > config.maxContext())
    return invalidArgumentError("--window " + std::to_string(rep.window) +
                                ": the model's context is " + std::to_string(config.maxContext()) +
                                " tokens");
  std::unique_ptr<Backend> backend;
  if (f.device == "cuda") {
    TG_ASSIGN_OR_RETURN(backend, makeCudaBackend(0));
  } else {
    backend = makeCpuBackend(f.threads);
  }
  for (const std::string& q : f.quantize) {
    TG_ASSIGN_OR_RETURN(LoadQuantization lq, loadQuantization(q, config));
    ModelOptions options;
    options.dtype = rep.dtype;
    options.quantize = lq;
    auto model = loadModel(f.model, *backend, options);
    if (!model.ok()) return model.status().withContext("--quantize " + q);
    auto score = scoreWindows(**model, *backend, tokens, rep.window);
    if (!score.ok()) return score.status().withContext("--quantize " + q);
    rep.rows.push_back({q, *score, std::exp(score->nll / static_cast<double>(score->predictions))});
    std::fprintf(stderr, "%s: perplexity %.4f (%.1f s)\n", q.c_str(), rep.rows.back().perplexity,
                 score->seconds);
  }
  return rep;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = parseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "bench_perplexity: %s\n%s", std::string(flags.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  auto report = measure(*flags);
  if (!report.ok()) {
    std::fprintf(stderr, "bench_perplexity: %s\n", report.status().toString().c_str());
    return 1;
  }
  print(*report);
  return 0;
}
