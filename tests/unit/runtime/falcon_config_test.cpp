// FalconForCausalLM's config.json (pod-runtime/src/models/falcon.cpp's prepareConfig), as
// transformers 5.12.1's FalconConfig reads it: key/value heads from multi_query /
// new_decoder_architecture / num_kv_heads, ffn_hidden_size, layer_norm_epsilon, activation and
// the class's defaults; a bad Falcon field is refused naming it. RWForCausalLM (the remote-code
// RWConfig: n_head, n_layer, n_head_kv, model_type RefinedWeb) reads as the same model: its
// logits equal FalconForCausalLM's on the same weights. The graph builds the decoder config.json
// picks (ln_attn/ln_mlp or one input_layernorm).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "models/registry.h"
#include "textgen/runtime/model.h"

namespace textgen::runtime {
namespace {

using kernels::Activation;
using nlohmann::json;
namespace fs = std::filesystem;

const std::string kModels = TEXTGEN_MODEL_FIXTURES;

json fixtureConfig(const std::string& name) {
  std::ifstream in(kModels + "/" + name + "/config.json");
  return json::parse(in);
}

// A model directory holding `config` and the fixture's other files (linked).
std::string writeModelDir(const std::string& fixture, const json& config, const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "/textgen-falcon-" + std::to_string(::getpid()) +
                          "-" + fixture + "-" + tag;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kModels + "/" + fixture)) {
    if (e.path().filename() != "config.json")
      fs::create_symlink(fs::absolute(e.path()), dir + "/" + e.path().filename().string());
  }
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

StatusOr<ModelConfig> parse(const json& config, const std::string& tag = "parse") {
  return loadArchitectureConfig(writeModelDir("falcon-new", config, tag));
}

void expectError(const StatusOr<ModelConfig>& r, const std::string& substring) {
  ASSERT_FALSE(r.ok()) << "expected an error with '" << substring << "'";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << r.status();
}

TEST(FalconConfig, KeyValueHeadsFollowTheDecoder) {
  // Old decoder with multi_query: one key/value head although num_kv_heads says 4.
  auto mqa = parse(fixtureConfig("falcon-mqa-rotary"));
  ASSERT_TRUE(mqa.ok()) << mqa.status();
  EXPECT_EQ(mqa->numHeads, 4);
  EXPECT_EQ(mqa->numKvHeads, 1);
  EXPECT_EQ(mqa->headDim, 16);
  EXPECT_EQ(mqa->intermediateSize, 128);  // ffn_hidden_size
  EXPECT_FLOAT_EQ(mqa->rmsNormEps, 1e-5);
  EXPECT_TRUE(mqa->tieWordEmbeddings);
  EXPECT_EQ(mqa->hiddenAct, Activation::kGelu);
  // Old decoder without multi_query: a key/value head per head.
  auto alibi = parse(fixtureConfig("falcon-alibi"));
  ASSERT_TRUE(alibi.ok()) << alibi.status();
  EXPECT_EQ(alibi->numKvHeads, 4);
  // New decoder: num_kv_heads (multi_query ignored).
  auto grouped = parse(fixtureConfig("falcon-new"));
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  EXPECT_EQ(grouped->numKvHeads, 2);
  json j = fixtureConfig("falcon-new");
  j.erase("num_kv_heads");  // FalconConfig: num_kv_heads defaults to the heads
  auto all = parse(j);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->numKvHeads, 4);
}

TEST(FalconConfig, DefaultsAreFalconConfigs) {
  json j = fixtureConfig("falcon-mqa-rotary");
  for (const char* key : {"ffn_hidden_size", "layer_norm_epsilon", "tie_word_embeddings",
                          "activation", "max_position_embeddings", "multi_query"})
    j.erase(key);
  j["intermediate_size"] = 999;  // Llama's keys are not FalconConfig's: ignored
  j["num_key_value_heads"] = 4;
  j["rms_norm_eps"] = 0.5;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->intermediateSize, 4 * 64);
  EXPECT_FLOAT_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, Activation::kGelu);
  EXPECT_EQ(c->maxPositionEmbeddings, 2048);
  EXPECT_EQ(c->numKvHeads, 1);  // multi_query defaults to true
  j["activation"] = "relu";
  j["tie_word_embeddings"] = false;
  auto relu = parse(j);
  ASSERT_TRUE(relu.ok()) << relu.status();
  EXPECT_EQ(relu->hiddenAct, Activation::kRelu);
  EXPECT_FALSE(relu->tieWordEmbeddings);
  // null is Python's None: false for FalconConfig's flags (multi_query None: not multi-query).
  j["multi_query"] = nullptr;
  auto none = parse(j);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->numKvHeads, 4);
}

TEST(FalconConfig, BadFalconFieldsAreNamed) {
  const json base = fixtureConfig("falcon-new");
  struct Case {
    const char* key;
    json value;
    const char* error;
  };
  const Case cases[] = {
      {"num_kv_heads", 3, "'num_kv_heads' must divide num_attention_heads"},
      {"num_kv_heads", -1, "'num_kv_heads' must be a positive integer"},
      {"num_ln_in_parallel_attn", 3, "'num_ln_in_parallel_attn' must be 1 or 2"},
      {"num_ln_in_parallel_attn", "two", "'num_ln_in_parallel_attn' must be a positive integer"},
      {"parallel_attn", false, "'parallel_attn' must be true with new_decoder_architecture"},
      {"alibi", "yes", "'alibi' must be true or false"},
      {"new_decoder_architecture", 1, "'new_decoder_architecture' must be true or false"},
      {"bias", "no", "'bias' must be true or false"},
      {"ffn_hidden_size", 0, "'ffn_hidden_size' must be a positive integer"},
      {"layer_norm_epsilon", "small", "'layer_norm_epsilon' must be a number"},
      {"num_attention_heads", 5, "'num_attention_heads' must divide hidden_size"},
      {"activation", "swiglu", "config.json spells it 'activation'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    json j = base;
    j[c.key] = c.value;
    expectError(parse(j), c.error);
  }
  json old = fixtureConfig("falcon-alibi");  // old decoder, not multi-query
  old["num_kv_heads"] = 2;
  expectError(parse(old), "'num_kv_heads' must equal num_attention_heads");
  json mqa = fixtureConfig("falcon-mqa-rotary");
  mqa["num_ln_in_parallel_attn"] = 2;
  expectError(parse(mqa), "'num_ln_in_parallel_attn' 2 (ln_attn and ln_mlp) needs");
  json missing = base;
  missing.erase("num_attention_heads");
  expectError(parse(missing), "'num_attention_heads' is required");
}

// Every Falcon field given every JSON type (and removed): parsed or refused with a message, and an
// accepted config is one the graph can split (kv heads divide heads).
TEST(FalconConfig, AnyValueOfAFalconFieldIsParsedOrNamed) {
  const json values[] = {
      nullptr, true,          false,         0, -1, 1, 2, 3, 1.5, int64_t{1} << 40,
      "x",     json::array(), json::object()};
  for (const char* fixture : {"falcon-new", "falcon-mqa-rotary", "falcon-alibi"}) {
    for (const char* key :
         {"alibi", "new_decoder_architecture", "multi_query", "parallel_attn", "bias",
          "tie_word_embeddings", "num_kv_heads", "num_ln_in_parallel_attn", "ffn_hidden_size",
          "layer_norm_epsilon", "activation", "num_attention_heads", "hidden_size", "model_type",
          "max_position_embeddings", "n_head", "n_embed"}) {
      for (int v = -1; v < static_cast<int>(std::size(values)); ++v) {
        json j = fixtureConfig(fixture);
        if (v < 0) {
          j.erase(key);
        } else {
          j[key] = values[v];
        }
        SCOPED_TRACE(std::string(fixture) + " " + key + " = " + (v < 0 ? "absent" : j[key].dump()));
        auto c = parseModelConfig(j.dump(), {}, registeredDialect);
        if (c.ok()) {
          EXPECT_GT(c->numKvHeads, 0);
          EXPECT_EQ(c->numHeads % c->numKvHeads, 0);
          EXPECT_GT(c->intermediateSize, 0);
        } else {
          EXPECT_FALSE(c.status().message().empty());
        }
      }
    }
  }
}

// Falcon-40B's remote-code config: RWForCausalLM, model_type RefinedWeb (the new decoder),
// n_head / n_layer / n_head_kv.
json rwConfig(const std::string& fixture) {
  json j = fixtureConfig(fixture);
  j["architectures"] = {"RWForCausalLM"};
  j["model_type"] = j["new_decoder_architecture"].get<bool>() ? "RefinedWeb" : "RefinedWebModel";
  j["n_head"] = j["num_attention_heads"];
  j["n_layer"] = j["num_hidden_layers"];
  if (j["new_decoder_architecture"].get<bool>()) j["n_head_kv"] = j["num_kv_heads"];
  for (const char* key : {"num_attention_heads", "num_hidden_layers", "num_kv_heads",
                          "new_decoder_architecture", "num_ln_in_parallel_attn"})
    j.erase(key);
  return j;
}

// One prefill of a few tokens: the last row's logits.
std::vector<float> lastLogits(const std::string& dir) {
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  constexpr int64_t kBlock = 4;
  auto cache = KvCache::create(*backend, (*model)->kvShape(), 8, kBlock, kernels::DType::kF32);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  ForwardBatch b;
  b.tokenIds = {11, 52, 301, 7, 99};
  const std::vector<uint32_t> blocks = {3, 1};
  for (size_t p = 0; p < b.tokenIds.size(); ++p)
    b.slots.push_back(blocks[p / kBlock] * kBlock + p % kBlock);
  b.sequences.push_back({.firstRow = 0, .numRows = 5, .startPos = 0, .blocks = blocks});
  b.logitRows.push_back(4);
  auto logits = (*model)->forward(b, **cache);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

TEST(FalconConfig, RwConfigsReadAsFalcon) {
  for (const std::string fixture : {"falcon-new", "falcon-mqa-rotary"}) {
    SCOPED_TRACE(fixture);
    const json rw = rwConfig(fixture);
    auto c = parse(rw, "rw-" + fixture);
    ASSERT_TRUE(c.ok()) << c.status();
    auto want = parse(fixtureConfig(fixture), "falcon-" + fixture);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(c->numHeads, want->numHeads);
    EXPECT_EQ(c->numKvHeads, want->numKvHeads);
    EXPECT_EQ(c->numLayers, want->numLayers);
    const std::vector<float> got = lastLogits(writeModelDir(fixture, rw, "rw-model"));
    const std::vector<float> ref = lastLogits(kModels + "/" + fixture);
    ASSERT_FALSE(ref.empty());
    EXPECT_EQ(got, ref);
  }
  // The new decoder spelled as RW's, with model_type RefinedWebModel: the old decoder, which
  // reads input_layernorm (falcon-new has ln_attn/ln_mlp).
  json j = rwConfig("falcon-new");
  j["model_type"] = "RefinedWebModel";
  auto backend = makeCpuBackend(1);
  auto model = loadModel(writeModelDir("falcon-new", j, "rw-old"), *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("transformer.h.0.input_layernorm.weight"),
            std::string::npos)
      << model.status();
}

// num_ln_in_parallel_attn 1 with the new decoder (Falcon2-11B): one input_layernorm feeds both
// branches; the falcon-new checkpoint has ln_attn and ln_mlp, so the name missing shows the choice.
TEST(FalconConfig, OneNormNewDecoderReadsInputLayernorm) {
  json j = fixtureConfig("falcon-new");
  j["num_ln_in_parallel_attn"] = 1;
  auto backend = makeCpuBackend(1);
  auto model = loadModel(writeModelDir("falcon-new", j, "one-ln"), *backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound) << model.status();
  EXPECT_NE(model.status().message().find("transformer.h.0.input_layernorm.weight"),
            std::string::npos)
      << model.status();
}

}  // namespace
}  // namespace textgen::runtime
