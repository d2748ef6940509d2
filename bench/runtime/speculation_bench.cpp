// Speculative decoding on the engine (n-gram proposals, or with --medusa a Medusa directory's
// heads): batch-1 greedy decode of copy-heavy prompts (a code
// example edited and repeated, a summary quoting its source, a changelog restating its entries) and
// of a free-running one, without speculation and with --speculate N, on the same model and graphs.
// Reports ms per generated token, tokens per step (accepted proposals + 1) and whether the outputs
// are identical. Prints a table and one JSON line.
//
//   bench_speculation [--model DIR] [--backend cuda|cpu] [--dtype bfloat16|float32]
//                     [--speculate 4] [--tokens 128] [--repeat 3] [--medusa DIR]
// With --medusa (TGI's Medusa directory: models/demo-medusa for the demo model) the speculative
// runs load the model with its heads, the plain runs without them.
// The default model is the bundled demo model (models/demo): proposals need a model that really
// continues its text (random weights accept nothing).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "textgen/runtime/backend.h"
#include "textgen/runtime/engine.h"
#include "textgen/runtime/model.h"
#include "textgen/tokenizer/tokenizer.h"

using namespace textgen;
using namespace textgen::runtime;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
T orFail(StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "bench_speculation: %s: %s\n", what, v.status().message().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

struct Workload {
  const char* name;
  const char* prompt;
};

// Written for this benchmark in the corpus's style (reStructuredText of the Python docs).
const Workload kWorkloads[] = {
    {"code-edit",
     "Reading a file line by line::\n\n"
     "   with open('data.txt', encoding='utf-8') as f:\n"
     "       for line in f:\n"
     "           fields = line.rstrip('\\n').split(',')\n"
     "           if len(fields) != 3:\n"
     "               continue\n"
     "           name, size, mode = fields\n"
     "           print(name, int(size), mode)\n\n"
     "The same example, with the file opened in binary mode::\n\n"
     "   with open('data.txt', 'rb') as f:\n"
     "       for line in f:\n"},
    {"quote-summary",
     ".. function:: sorted(iterable, /, *, key=None, reverse=False)\n\n"
     "   Return a new sorted list from the items in *iterable*.\n\n"
     "   Has two optional arguments which must be specified as keyword arguments.\n\n"
     "   *key* specifies a function of one argument that is used to extract a comparison\n"
     "   key from each element in *iterable*. The default value is ``None``.\n\n"
     "   *reverse* is a boolean value. If set to ``True``, then the list elements are\n"
     "   sorted as if each comparison were reversed.\n\n"
     "Summary: :func:`sorted` returns a new sorted list from the items in *iterable*.\n"
     "*key* specifies a function of one argument that is used to extract a comparison\n"},
    {"changelog",
     "Changes in this release:\n\n"
     "* :func:`os.path.join` now accepts a :term:`path-like object` for every argument.\n"
     "* :class:`collections.OrderedDict` supports the ``|`` and ``|=`` operators.\n"
     "* :meth:`str.removeprefix` and :meth:`str.removesuffix` were added.\n\n"
     "Porting notes:\n\n"
     "* :func:`os.path.join` now accepts a :term:`path-like object` for every argument.\n"},
    {"free", "The Python interpreter"},
};

struct Run {
  std::vector<uint32_t> ids;
  int64_t steps = 0;
  double decodeSeconds = 0;  // after the prefill step
};

Run generate(Engine& engine, const std::vector<uint32_t>& prompt, int64_t tokens, uint64_t id) {
  RequestSpec r;
  r.id = id;
  r.inputIds = prompt;
  r.stopping.maxNewTokens = static_cast<uint32_t>(tokens);
  r.stopping.ignoreEosToken = true;
  for (uint32_t b = 0; b < (prompt.size() + tokens + 15) / 16; ++b) r.blocks.push_back(b);
  Run out;
  auto s = orFail(engine.prefill(id, {r}, std::nullopt), "prefill");
  for (const auto& g : s.generations)
    out.ids.insert(out.ids.end(), g.tokens.ids.begin(), g.tokens.ids.end());
  const double start = now();
  while (s.batch) {
    s = orFail(engine.decode({id}), "decode");
    ++out.steps;
    for (const auto& g : s.generations)
      out.ids.insert(out.ids.end(), g.tokens.ids.begin(), g.tokens.ids.end());
  }
  out.decodeSeconds = now() - start;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string modelDir = TEXTGEN_DEMO_MODEL, backendName = "cuda", dtypeName = "bfloat16";
  std::vector<int64_t> speculates{4};
  int64_t tokens = 128, repeat = 3;
  std::string medusaDir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (!v) {
      std::fprintf(stderr, "bench_speculation: %s needs a value\n", a.c_str());
      return 2;
    }
    ++i;
    if (a == "--model") {
      modelDir = v;
    } else if (a == "--backend") {
      backendName = v;
    } else if (a == "--dtype") {
      dtypeName = v;
    } else if (a == "--speculate") {  // one value or a comma-separated list
      speculates.clear();
      for (const char* c = v; *c;) {
        speculates.push_back(std::atoll(c));
        while (*c && *c != ',') ++c;
        if (*c == ',') ++c;
      }
    } else if (a == "--tokens") {
      tokens = std::atoll(v);
    } else if (a == "--repeat") {
      repeat = std::atoll(v);
    } else if (a == "--medusa") {
      medusaDir = v;
    } else {
      std::fprintf(stderr, "bench_speculation: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  for (int64_t k : speculates) {
    if (k < 1 || k > 16) {
      std::fprintf(stderr, "bench_speculation: --speculate values in [1, 16]\n");
      return 2;
    }
  }
  if (speculates.empty() || tokens < 2 || repeat < 1) {
    std::fprintf(stderr, "bench_speculation: --tokens >= 2, --repeat >= 1\n");
    return 2;
  }
  const int64_t most = *std::max_element(speculates.begin(), speculates.end());
  const bool cuda = backendName == "cuda";
  auto backend = orFail(
      cuda ? makeCudaBackend(0) : StatusOr<std::unique_ptr<Backend>>(makeCpuBackend(0)), "backend");
  const kernels::DType dtype = dtypeName == "float32"   ? kernels::DType::kF32
                               : dtypeName == "float16" ? kernels::DType::kF16
                                                        : kernels::DType::kBF16;
  ModelOptions mo;
  mo.dtype = cuda ? dtype : kernels::DType::kF32;
  if (cuda) mo.graphBatchSizes = {1, 2, 4, 8};
  mo.graphRowsPerSequence = 1 + most;  // as the shard loads it under --speculate
  int64_t medusaLayers = 1;
  if (!medusaDir.empty()) {
    const auto medusa = orFail(readMedusaConfig(medusaDir), "reading the Medusa directory");
    if (!medusa) {
      std::fprintf(stderr, "bench_speculation: %s is not a Medusa directory\n", medusaDir.c_str());
      return 2;
    }
    if (most > medusa->heads) {
      std::fprintf(stderr, "bench_speculation: --speculate up to %lld with these heads\n",
                   static_cast<long long>(medusa->heads));
      return 2;
    }
    modelDir = medusa->baseModel;
    medusaLayers = medusa->layers;
  }
  auto model = orFail(loadModel(modelDir, *backend, mo), "loading the model");
  std::unique_ptr<Model> withHeads;
  if (!medusaDir.empty()) {
    ModelOptions heads = mo;
    heads.medusaDir = medusaDir;
    heads.medusaHeads = most;
    heads.medusaLayers = medusaLayers;
    withHeads = orFail(loadModel(modelDir, *backend, heads), "loading the Medusa heads");
  }
  Model& specModel = withHeads ? *withHeads : *model;
  auto tok = orFail(tokenizer::Tokenizer::fromDirectory(modelDir), "loading the tokenizer");
  const int64_t kvBytes = int64_t{256} << 20;
  Engine plain(*model, *tok, *backend, {.blockSize = 16, .kvCacheBytes = kvBytes});
  orFail(plain.warmup(0, {}, std::nullopt, 512, std::nullopt), "warmup");
  std::vector<std::unique_ptr<Engine>> specs;
  for (int64_t k : speculates) {
    specs.push_back(std::make_unique<Engine>(
        specModel, *tok, *backend,
        EngineOptions{.blockSize = 16, .kvCacheBytes = kvBytes, .speculate = k}));
    orFail(specs.back()->warmup(0, {}, std::nullopt, 512, std::nullopt), "warmup");
  }

  std::printf("bench_speculation: %s, %s on %s, batch 1, greedy, %lld new tokens, %s proposals\n",
              modelDir.c_str(), dtypeName.c_str(), backend->name(), static_cast<long long>(tokens),
              medusaDir.empty() ? "n-gram" : "Medusa");
  std::printf("%-14s %7s %9s %12s %12s %10s %9s %6s\n", "workload", "prompt", "speculate",
              "plain ms/tok", "spec ms/tok", "tok/step", "speedup", "same");
  nlohmann::json rows = nlohmann::json::array();
  uint64_t id = 1;
  const auto decoded = static_cast<double>(tokens - 1);  // after the prefill's token
  // Per speculate value: the copy-heavy workloads' plain and speculative decode time summed.
  std::vector<double> copyPlain(speculates.size()), copySpec(speculates.size());
  std::vector<double> allPlain(speculates.size()), allSpec(speculates.size());
  bool allSame = true;
  for (const Workload& w : kWorkloads) {
    const std::vector<uint32_t> prompt = orFail(tok->encode(w.prompt), "tokenizing").ids;
    const bool copyHeavy = std::string(w.name) != "free";
    double plainBest = 1e30;
    Run a;
    for (int64_t rep = 0; rep < repeat + 1; ++rep) {  // the first run warms graphs and plans
      a = generate(plain, prompt, tokens, id++);
      if (rep > 0) plainBest = std::min(plainBest, a.decodeSeconds);
    }
    const double plainMs = 1e3 * plainBest / decoded;
    for (size_t k = 0; k < speculates.size(); ++k) {
      double specBest = 1e30;
      Run b;
      for (int64_t rep = 0; rep < repeat + 1; ++rep) {
        b = generate(*specs[k], prompt, tokens, id++);
        if (rep > 0) specBest = std::min(specBest, b.decodeSeconds);
      }
      const double specMs = 1e3 * specBest / decoded;
      const double perStep = decoded / static_cast<double>(b.steps);
      const bool same = a.ids == b.ids;
      allSame = allSame && same;
      int64_t firstDiff = -1;
      for (size_t i = 0; i < std::min(a.ids.size(), b.ids.size()); ++i) {
        if (a.ids[i] != b.ids[i]) {
          firstDiff = static_cast<int64_t>(i);
          break;
        }
      }
      if (copyHeavy) {
        copyPlain[k] += plainBest;
        copySpec[k] += specBest;
      }
      allPlain[k] += plainBest;
      allSpec[k] += specBest;
      std::printf("%-14s %7zu %9lld %12.3f %12.3f %10.2f %8.2fx %6s\n", w.name, prompt.size(),
                  static_cast<long long>(speculates[k]), plainMs, specMs, perStep, plainMs / specMs,
                  same ? "yes" : "NO");
      rows.push_back({{"workload", w.name},
                      {"prompt_tokens", prompt.size()},
                      {"speculate", speculates[k]},
                      {"plain_ms_per_token", plainMs},
                      {"spec_ms_per_token", specMs},
                      {"tokens_per_step", perStep},
                      {"speedup", plainMs / specMs},
                      {"identical", same},
                      {"first_difference", firstDiff}});
    }
  }
  nlohmann::json summary = nlohmann::json::array();
  for (size_t k = 0; k < speculates.size(); ++k) {
    const SpeculationStats& st = specs[k]->speculationStats();
    const double accepted =
        st.proposed ? static_cast<double>(st.accepted) / static_cast<double>(st.proposed) : 0.0;
    std::printf(
        "speculate %lld: copy-heavy workloads %.2fx faster in all, every workload %.2fx; %.1f%% "
        "of %llu proposed tokens accepted, %.2f tokens a step\n",
        static_cast<long long>(speculates[k]), copyPlain[k] / copySpec[k], allPlain[k] / allSpec[k],
        100 * accepted, static_cast<unsigned long long>(st.proposed),
        st.steps ? 1.0 + static_cast<double>(st.accepted) / static_cast<double>(st.steps) : 1.0);
    summary.push_back({{"speculate", speculates[k]},
                       {"copy_heavy_speedup", copyPlain[k] / copySpec[k]},
                       {"all_speedup", allPlain[k] / allSpec[k]},
                       {"accepted_fraction", accepted}});
  }
  nlohmann::json line{
      {"bench", "speculation"}, {"backend", backend->name()},
      {"dtype", dtypeName},     {"proposals", medusaDir.empty() ? "ngram" : "medusa"},
      {"tokens", tokens},       {"identical", allSame},
      {"summary", summary},     {"rows", rows}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}
