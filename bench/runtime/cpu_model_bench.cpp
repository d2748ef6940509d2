// CPU prefill and decode throughput of the shard's model path (OpenBLAS), on a reference fixture
// and on a random-weight Llama of ~100M parameters written here as real safetensors. Prints a table
// and one JSON line. Usage: bench_cpu_model [--fixture DIR] [--threads N]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "textgen/runtime/model.h"

namespace {

using namespace textgen::runtime;
using nlohmann::json;
namespace fs = std::filesystem;

// Writes config.json and model.safetensors of a Llama with random weights.
void writeRandomLlama(const fs::path& dir, int64_t vocab, int64_t hidden, int64_t layers,
                      int64_t heads, int64_t kvHeads, int64_t inter) {
  fs::create_directories(dir);
  const int64_t hd = hidden / heads;
  json config{{"architectures", {"LlamaForCausalLM"}},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", inter},
              {"num_hidden_layers", layers},
              {"num_attention_heads", heads},
              {"num_key_value_heads", kvHeads},
              {"max_position_embeddings", 4096},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", true},
              {"eos_token_id", 2}};
  std::ofstream(dir / "config.json") << config.dump();
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors{
      {"model.embed_tokens.weight", {vocab, hidden}}, {"model.norm.weight", {hidden}}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {hidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {hidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {heads * hd, hidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kvHeads * hd, hidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kvHeads * hd, hidden}});
    tensors.push_back({p + "self_attn.o_proj.weight", {hidden, heads * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= d;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + n * 4}}};
    offset += n * 4;
  }
  const std::string h = header.dump();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> chunk(1 << 20);
  for (uint64_t written = 0; written < offset; written += chunk.size() * 4) {
    const size_t n = std::min<uint64_t>(chunk.size(), (offset - written) / 4);
    for (size_t i = 0; i < n; ++i) chunk[i] = dist(rng);
    out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n * 4));
  }
}

struct Row {
  std::string model, phase;
  int64_t batch, tokens;
  double seconds;
};

// Prefill `batch` sequences of `promptLen` tokens in one forward, then `steps` decode steps.
void measure(const std::string& label, Model& model, Backend& backend, int64_t batch,
             int64_t promptLen, int64_t steps, std::vector<Row>& rows) {
  const int64_t bs = 16;
  const int64_t perSeq = (promptLen + steps + bs - 1) / bs;
  auto cache = KvCache::create(backend, model.kvShape(), perSeq * batch, bs);
  if (!cache.ok()) return;
  std::vector<std::vector<uint32_t>> blocks(batch);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t b = 0; b < perSeq; ++b) blocks[s].push_back(static_cast<uint32_t>(s * perSeq + b));
  }
  auto run = [&](int64_t start, int64_t n) {
    ForwardBatch fb;
    for (int64_t s = 0; s < batch; ++s) {
      fb.sequences.push_back({static_cast<int64_t>(fb.tokenIds.size()), n, start, blocks[s]});
      for (int64_t p = start; p < start + n; ++p) {
        fb.tokenIds.push_back(static_cast<uint32_t>((p * 31 + s) % model.config().vocabSize));
        fb.slots.push_back(blocks[s][p / bs] * bs + p % bs);
      }
      fb.logitRows.push_back(static_cast<int64_t>(fb.tokenIds.size()) - 1);
    }
    auto t0 = std::chrono::steady_clock::now();
    auto r = model.forward(fb, **cache);
    if (!r.ok()) std::fprintf(stderr, "%s\n", r.status().toString().c_str());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  rows.push_back(
      {label, "prefill " + std::to_string(promptLen), batch, batch * promptLen, run(0, promptLen)});
  double decode = 0;
  for (int64_t i = 0; i < steps; ++i) decode += run(promptLen + i, 1);
  rows.push_back({label, "decode @" + std::to_string(promptLen), batch, batch * steps, decode});
}

}  // namespace

int main(int argc, char** argv) {
  std::string fixture;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fixture") && i + 1 < argc) {
      fixture = argv[++i];
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_cpu_model [--fixture DIR] [--threads N]\n");
      return 2;
    }
  }
  auto backend = makeCpuBackend(threads);
  std::vector<Row> rows;
  if (!fixture.empty()) {
    auto m = loadModel(fixture, *backend);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().toString().c_str());
      return 1;
    }
    measure("fixture", **m, *backend, 1, 64, 64, rows);
    measure("fixture", **m, *backend, 8, 64, 64, rows);
  }
  const fs::path dir =
      fs::temp_directory_path() / ("textgen-bench-llama100m-" + std::to_string(getpid()));
  writeRandomLlama(dir, 32000, 768, 12, 12, 4, 2048);
  auto m = loadModel(dir.string(), *backend);
  fs::remove_all(dir);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().toString().c_str());
    return 1;
  }
  measure("llama-100m", **m, *backend, 1, 128, 32, rows);
  measure("llama-100m", **m, *backend, 1, 512, 16, rows);
  measure("llama-100m", **m, *backend, 8, 128, 16, rows);

  std::printf("CPU model throughput (float32, OpenBLAS, %u hardware threads)\n",
              std::thread::hardware_concurrency());
  std::printf("%-12s %-14s %6s %8s %10s %12s\n", "model", "phase", "batch", "tokens", "seconds",
              "tokens/s");
  json results = json::array();
  for (const Row& r : rows) {
    std::printf("%-12s %-14s %6lld %8lld %10.3f %12.1f\n", r.model.c_str(), r.phase.c_str(),
                static_cast<long long>(r.batch), static_cast<long long>(r.tokens), r.seconds,
                r.tokens / r.seconds);
    results.push_back({{"model", r.model},
                       {"phase", r.phase},
                       {"batch", r.batch},
                       {"tokens", r.tokens},
                       {"seconds", r.seconds},
                       {"tokens_per_s", r.tokens / r.seconds}});
  }
  std::printf("%s\n", json{{"bench", "cpu_model"}, {"results", results}}.dump().c_str());
  return 0;
}
