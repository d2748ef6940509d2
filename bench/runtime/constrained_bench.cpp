// Constrained decoding's cost on the engine: decode throughput of B requests unconstrained, then
// each with a grammar (a JSON Schema, a regex), through Engine (sampling kernel with token masks,
// masks computed on the host each step). Prints a table and one JSON line.
//
//   bench_constrained --model DIR --tokenizer DIR [--batch 32] [--prompt 128] [--tokens 128]
//                     [--backend cuda|cpu]
// The model may be random weights of a real shape (tools/bench); the tokenizer gives the vocabulary
// the grammar masks (its size should match the model's).
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

struct Scenario {
  std::string name;
  SamplingParams::Grammar type = SamplingParams::Grammar::kNone;
  std::string grammar;
};

struct Result {
  double tokensPerSecond = 0, msPerStep = 0, hostMsPerStep = 0, firstStepMs = 0;
  int64_t steps = 0;
};

// B requests of `prompt` random tokens, prefilled, then decoded for `tokens` steps (EOS ignored:
// every scenario runs the same number of steps).
Result run(Engine& engine, const Scenario& s, int64_t batch, int64_t prompt, int64_t tokens,
           int64_t vocab, int64_t blockSize, uint64_t& nextId) {
  std::vector<RequestSpec> specs;
  uint32_t block = 0;
  const int64_t blocksEach = (prompt + tokens + blockSize) / blockSize;
  for (int64_t i = 0; i < batch; ++i) {
    RequestSpec r;
    r.id = nextId++;
    for (int64_t t = 0; t < prompt; ++t)
      r.inputIds.push_back(static_cast<uint32_t>((i * 7919 + t * 104729) % (vocab - 100) + 100));
    r.stopping.maxNewTokens = static_cast<uint32_t>(tokens);
    r.stopping.ignoreEosToken = true;
    r.sampling.doSample = true;
    r.sampling.seed = static_cast<uint64_t>(i);
    r.sampling.grammarType = s.type;
    r.sampling.grammar = s.grammar;
    for (int64_t b = 0; b < blocksEach; ++b) r.blocks.push_back(block++);
    specs.push_back(std::move(r));
  }
  const uint64_t batchId = nextId++;
  Result res;
  const double t0 = now();
  auto first = engine.prefill(batchId, std::move(specs), std::nullopt);
  if (!first.ok()) {
    std::fprintf(stderr, "prefill: %s\n", first.status().toString().c_str());
    std::exit(1);
  }
  for (const auto& g : first->generations) {
    if (g.error) {
      std::fprintf(stderr, "request refused: %s\n", g.error->c_str());
      std::exit(1);
    }
  }
  res.firstStepMs = (now() - t0) * 1e3;
  double start = 0, host = 0;
  int64_t generated = 0, steps = 0;
  for (int64_t step = 1; step < tokens; ++step) {
    if (step == 3) {
      start = now();  // the first decode steps compute masks of new states: warm-up
      host = 0;
      generated = 0;
      steps = 0;
    }
    auto s2 = engine.decode({batchId});
    if (!s2.ok()) {
      std::fprintf(stderr, "decode: %s\n", s2.status().toString().c_str());
      std::exit(1);
    }
    host += static_cast<double>(s2->totalNs - s2->forwardNs) * 1e-6;
    generated += static_cast<int64_t>(s2->generations.size());
    ++steps;
    if (!s2->batch) break;
  }
  const double elapsed = now() - start;
  engine.clear(std::nullopt);
  res.steps = steps;
  res.tokensPerSecond = static_cast<double>(generated) / elapsed;
  res.msPerStep = elapsed * 1e3 / static_cast<double>(steps);
  res.hostMsPerStep = host / static_cast<double>(steps);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::string modelDir, tokDir, backendName = "cuda";
  int64_t batch = 32, prompt = 128, tokens = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") {
      modelDir = next();
    } else if (a == "--tokenizer") {
      tokDir = next();
    } else if (a == "--batch") {
      batch = std::atol(next().c_str());
    } else if (a == "--prompt") {
      prompt = std::atol(next().c_str());
    } else if (a == "--tokens") {
      tokens = std::atol(next().c_str());
    } else if (a == "--backend") {
      backendName = next();
    } else {
      std::fprintf(stderr,
                   "usage: bench_constrained --model DIR --tokenizer DIR [--batch 32] "
                   "[--prompt 128] [--tokens 128] [--backend cuda|cpu]\n");
      return 2;
    }
  }
  if (modelDir.empty()) {
    std::fprintf(stderr, "bench_constrained: --model DIR is required\n");
    return 2;
  }
  if (tokDir.empty()) tokDir = modelDir;
  if (batch < 1 || prompt < 1 || tokens < 8) {
    std::fprintf(stderr, "bench_constrained: --batch, --prompt >= 1, --tokens >= 8\n");
    return 2;
  }
  StatusOr<std::unique_ptr<Backend>> backend =
      backendName == "cpu" ? StatusOr<std::unique_ptr<Backend>>(makeCpuBackend(2))
                           : makeCudaBackend(0, true);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().toString().c_str());
    return 1;
  }
  auto tok = tokenizer::Tokenizer::fromDirectory(tokDir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().toString().c_str());
    return 1;
  }
  const bool cpu = backendName == "cpu";
  ModelOptions options;
  options.dtype = cpu ? kernels::DType::kF32 : kernels::DType::kBF16;
  if (!cpu) options.graphBatchSizes = {1, 2, 4, 8, 16, 32, 64};
  auto model = loadModel(modelDir, **backend, options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().toString().c_str());
    return 1;
  }
  const int64_t vocab = (*model)->config().vocabSize;
  const int64_t blockSize = 16;
  const int64_t blocks = batch * ((prompt + tokens + blockSize) / blockSize) + 16;
  const int64_t perBlock = KvCache::bytesPerBlock((*model)->kvShape(), blockSize, (*model)->dtype(),
                                                  kernels::KvCacheDType::kAuto);
  Engine engine(**model, **tok, **backend,
                EngineOptions{.blockSize = blockSize, .kvCacheBytes = blocks * perBlock});
  if (auto w = engine.warmup(0, {}, std::nullopt, 64, std::nullopt); !w.ok()) {
    std::fprintf(stderr, "warmup: %s\n", w.status().toString().c_str());
    return 1;
  }
  const std::vector<Scenario> scenarios = {
      {"unconstrained (sampled)", SamplingParams::Grammar::kNone, ""},
      {"json schema", SamplingParams::Grammar::kJson,
       R"({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
           "items": {"type": "string"}}, "score": {"type": "number"}}, "required": ["name", "tags"]})"},
      {"json object (any)", SamplingParams::Grammar::kJson, R"({"type": "object"})"},
      {"regex", SamplingParams::Grammar::kRegex, "([a-z]+ ){1,200}[a-z]+\\."},
  };
  std::printf("bench_constrained: %s, vocabulary %ld, batch %ld, prompt %ld, %ld tokens each\n",
              modelDir.c_str(), static_cast<long>(vocab), static_cast<long>(batch),
              static_cast<long>(prompt), static_cast<long>(tokens));
  std::printf("%-26s %12s %10s %14s %10s\n", "scenario", "tokens/s", "ms/step", "host ms/step",
              "vs free");
  uint64_t nextId = 1;
  nlohmann::json out{
      {"bench", "constrained"}, {"batch", batch}, {"vocab", vocab}, {"backend", backendName}};
  double base = 0;
  for (const Scenario& s : scenarios) {
    const Result r = run(engine, s, batch, prompt, tokens, vocab, blockSize, nextId);
    if (base == 0) base = r.tokensPerSecond;
    std::printf("%-26s %12.0f %10.3f %14.3f %9.1f%%\n", s.name.c_str(), r.tokensPerSecond,
                r.msPerStep, r.hostMsPerStep, 100.0 * r.tokensPerSecond / base);
    out["scenarios"].push_back({{"name", s.name},
                                {"tokens_per_s", r.tokensPerSecond},
                                {"ms_per_step", r.msPerStep},
                                {"host_ms_per_step", r.hostMsPerStep},
                                {"steps", r.steps},
                                {"ratio", r.tokensPerSecond / base}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
