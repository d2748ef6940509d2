// BloomForCausalLM beyond the fixture test (model_fixture_test.cpp): config.json as BloomConfig
// spells it (prepareBloomConfig: n_layer, n_head, layer_norm_epsilon, n_embed, no hidden_act, no
// max_position_embeddings), its bad values named, and BigScience's checkpoints whose tensor names
// lack the "transformer." prefix loading to the same logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/registry.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kFixture = std::string(TEXTGEN_MODEL_FIXTURES) + "/bloom";

json fixtureConfig() {
  std::ifstream in(kFixture + "/config.json");
  return json::parse(in);
}

StatusOr<ModelConfig> parse(const json& j) {
  return parseModelConfig(j.dump(), {}, registeredDialect);
}

void expectError(const StatusOr<ModelConfig>& r, StatusCode code, const std::string& substring) {
  ASSERT_FALSE(r.ok()) << substring;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << r.status();
}

TEST(BloomConfig, FixtureIsReadAsBloomConfig) {
  auto c = parse(fixtureConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_EQ(c->numLayers, 2);
  EXPECT_EQ(c->numHeads, 4);
  EXPECT_EQ(c->numKvHeads, 4);
  EXPECT_EQ(c->intermediateSize, 256);  // 4 x hidden
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kGeluTanh);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->maxPositionEmbeddings, 4096);  // TGI's launcher default: ALiBi has no table
}

TEST(BloomConfig, DefaultsAndOlderSpellings) {
  json j = fixtureConfig();
  j.erase("layer_norm_epsilon");
  j.erase("tie_word_embeddings");
  j["n_embed"] = j["hidden_size"];
  j.erase("hidden_size");
  j["hidden_act"] = "relu";  // transformers ignores it: BLOOM's GELU is hard-coded
  j["max_position_embeddings"] = 1000;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kGeluTanh);
  EXPECT_EQ(c->maxPositionEmbeddings, 1000);
}

TEST(BloomConfig, MissingOrBadFieldsAreNamed) {
  for (const char* key : {"n_head", "n_layer", "hidden_size"}) {
    json j = fixtureConfig();
    j.erase(key);
    expectError(parse(j), StatusCode::kInvalidArgument, std::string("'") + key + "'");
    j = fixtureConfig();
    j[key] = "four";
    expectError(parse(j), StatusCode::kInvalidArgument, std::string("'") + key + "'");
  }
  json j = fixtureConfig();
  j["apply_residual_connection_post_layernorm"] = "yes";
  expectError(parse(j), StatusCode::kInvalidArgument, "'apply_residual_connection_post_layernorm'");
  j = fixtureConfig();
  j["n_head"] = 5;  // 64 is not a multiple of 5
  expectError(parse(j), StatusCode::kInvalidArgument, "n_head");
  j = fixtureConfig();
  j["n_head"] = 8;
  j["num_attention_heads"] = 4;  // both spellings, disagreeing
  expectError(parse(j), StatusCode::kInvalidArgument, "n_head");
}

// The fixture's safetensors file with every "transformer." prefix dropped from the header (the
// tensor data is unchanged: offsets are relative to the data section).
void writeUnprefixed(const fs::path& dir) {
  std::ifstream in(kFixture + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  json renamed = json::object();
  for (const auto& [name, info] : header.items()) {
    const std::string prefix = "transformer.";
    renamed[name.starts_with(prefix) ? name.substr(prefix.size()) : name] = info;
  }
  std::string h = renamed.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t m = h.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << h << bytes.substr(8 + n);
  for (const char* f : {"config.json", "generation_config.json"})
    fs::copy_file(fs::path(kFixture) / f, dir / f, fs::copy_options::overwrite_existing);
}

// The first prompt's last logits.
std::vector<float> lastLogits(const std::string& dir, const std::vector<uint32_t>& ids) {
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend, {});
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto cache = KvCache::create(*backend, (*model)->kvShape(), 16, 4, (*model)->dtype());
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  ForwardBatch b;
  const auto n = static_cast<int64_t>(ids.size());
  static const std::vector<uint32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
  b.sequences.push_back({.firstRow = 0, .numRows = n, .startPos = 0, .blocks = blocks});
  for (int64_t p = 0; p < n; ++p) {
    b.tokenIds.push_back(ids[p]);
    b.slots.push_back(static_cast<uint32_t>(p));
  }
  b.logitRows.push_back(n - 1);
  auto logits = (*model)->forward(b, **cache);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

TEST(BloomCheckpoint, NamesWithoutTheTransformerPrefixLoad) {
  const fs::path dir =
      fs::temp_directory_path() / ("tg-bloom-unprefixed-" + std::to_string(getpid()));
  fs::create_directories(dir);
  writeUnprefixed(dir);
  std::ifstream in(kFixture + "/reference.json");
  const json ref = json::parse(in)["prompts"][0];
  const auto ids = ref["input_ids"].get<std::vector<uint32_t>>();
  const auto want = ref["last_logits"].get<std::vector<float>>();
  const std::vector<float> prefixed = lastLogits(kFixture, ids);
  const std::vector<float> bare = lastLogits(dir.string(), ids);
  fs::remove_all(dir);
  ASSERT_EQ(bare.size(), want.size());
  EXPECT_EQ(bare, prefixed);  // the same weights, bit for bit the same logits
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_LE(std::fabs(bare[i] - want[i]), 2e-4f + 1e-4f * std::fabs(want[i])) << i;
}

}  // namespace
}  // namespace textgen::runtime
