// OPTForCausalLM's config.json as the registry reads it (models/opt.cpp's prepareConfig: OPT's
// names and defaults, a bad or unsupported OPT field named), and its checkpoints' two tensor
// spellings ("model.decoder.*" and facebook/opt-*'s "decoder.*"). The logits against transformers
// are model_fixture_test's (opt-pre, opt-post-proj).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "models/registry.h"
#include "runtime/tiny_llama.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {
namespace {

using kernels::Activation;
using nlohmann::json;

std::string fixture(const std::string& name) {
  return std::string(TEXTGEN_MODEL_FIXTURES) + "/" + name;
}

json readJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

StatusOr<ModelConfig> parse(const json& config) {
  return parseModelConfig(config.dump(), {}, registeredDialect);
}

void expectError(const StatusOr<ModelConfig>& r, StatusCode code, const std::string& substring) {
  ASSERT_FALSE(r.ok()) << substring;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << r.status();
}

TEST(OptConfig, ReadsOptNamesAndDefaults) {
  json j = readJson(fixture("opt-post-proj") + "/config.json");
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->intermediateSize, 128);  // ffn_dim
  EXPECT_EQ(c->hiddenAct, Activation::kRelu);
  EXPECT_EQ(c->numKvHeads, c->numHeads);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);  // nn.LayerNorm's default: OPTConfig has no eps
  EXPECT_TRUE(c->attentionBias);
  EXPECT_TRUE(c->mlpBias);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->eosTokenIds, std::vector<uint32_t>{2});
  // OPTConfig's defaults where config.json says nothing.
  for (const char* key : {"enable_bias", "tie_word_embeddings", "activation_function",
                          "do_layer_norm_before", "word_embed_proj_dim"})
    j.erase(key);
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attentionBias);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, Activation::kRelu);
  j["enable_bias"] = false;
  j["activation_function"] = "gelu";  // Galactica
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->attentionBias);
  EXPECT_FALSE(c->mlpBias);
  EXPECT_EQ(c->hiddenAct, Activation::kGelu);
}

TEST(OptConfig, BadFieldsAreNamed) {
  const json base = readJson(fixture("opt-pre") + "/config.json");
  struct Case {
    const char* key;
    json value;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"enable_bias", "yes", StatusCode::kInvalidArgument, "'enable_bias' must be true or false"},
      {"do_layer_norm_before", 1, StatusCode::kInvalidArgument,
       "'do_layer_norm_before' must be true or false"},
      {"tie_word_embeddings", "no", StatusCode::kInvalidArgument,
       "'tie_word_embeddings' must be true or false"},
      {"word_embed_proj_dim", 0, StatusCode::kInvalidArgument,
       "'word_embed_proj_dim' must be a positive integer"},
      {"word_embed_proj_dim", "32", StatusCode::kInvalidArgument,
       "'word_embed_proj_dim' must be a positive integer"},
      {"word_embed_proj_dim", 32.5, StatusCode::kInvalidArgument,
       "'word_embed_proj_dim' must be a positive integer"},
      {"word_embed_proj_dim", json(UINT64_MAX), StatusCode::kInvalidArgument,
       "'word_embed_proj_dim' must be a positive integer"},
      {"word_embed_proj_dim", json::object(), StatusCode::kInvalidArgument,
       "'word_embed_proj_dim' must be a positive integer"},
      {"word_embed_proj_dim", 128, StatusCode::kUnimplemented,
       "'word_embed_proj_dim' (128) above hidden_size"},
      {"layer_norm_elementwise_affine", false, StatusCode::kUnimplemented,
       "'layer_norm_elementwise_affine' false"},
      {"layer_norm_elementwise_affine", "true", StatusCode::kInvalidArgument,
       "'layer_norm_elementwise_affine' must be true or false"},
      {"_remove_final_layer_norm", true, StatusCode::kUnimplemented,
       "'_remove_final_layer_norm' true"},
      {"activation_function", "swiglu", StatusCode::kInvalidArgument, "'swiglu' is not supported"},
      {"ffn_dim", -1, StatusCode::kInvalidArgument,
       "'intermediate_size' must be a positive integer"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.key) + " = " + k.value.dump());
    json j = base;
    j[k.key] = k.value;
    expectError(parse(j), k.code, k.message);
  }
  json j = base;
  j["hidden_size"] = "64";  // word_embed_proj_dim is checked against it once it is a number
  expectError(parse(j), StatusCode::kInvalidArgument, "'hidden_size' must be a positive integer");
  j = base;
  j.erase("ffn_dim");
  expectError(parse(j), StatusCode::kInvalidArgument, "'intermediate_size' is missing");
  // A post-LayerNorm OPT has no final norm to remove: _remove_final_layer_norm changes nothing.
  j = base;
  j["do_layer_norm_before"] = false;
  j["_remove_final_layer_norm"] = true;
  EXPECT_TRUE(parse(j).ok());
}

TEST(OptRegistry, TheGraphRefusesSpecValuesItDoesNotBuild) {
  const Architecture* opt = findArchitecture("OPTForCausalLM");
  ASSERT_NE(opt, nullptr);
  EXPECT_TRUE(opt->makeGraph(opt->spec).ok());
  EXPECT_EQ(opt->spec.position, PositionKind::kLearned);
  ArchitectureSpec gated = opt->spec;
  gated.gatedMlp = true;
  auto g = opt->makeGraph(gated);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("gatedMlp 'true' is not implemented by the opt graph"),
            std::string::npos)
      << g.status();
  ArchitectureSpec rope = opt->spec;
  rope.position = PositionKind::kRope;
  EXPECT_EQ(opt->makeGraph(rope).status().code(), StatusCode::kUnimplemented);
}

// DIR's model.safetensors rewritten with every "model." prefix dropped (facebook/opt-*'s names),
// beside copies of its other files.
void writeBareCopy(const std::string& from, const std::string& to) {
  std::filesystem::create_directories(to);
  for (const char* f : {"config.json", "generation_config.json"})
    std::filesystem::copy_file(from + "/" + f, to + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(from + "/model.safetensors", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const json header = json::parse(file.substr(8, n));
  json renamed = json::object();
  for (const auto& [name, entry] : header.items())
    renamed[name.starts_with("model.") ? name.substr(6) : name] = entry;
  std::string h = renamed.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');  // the data stays 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::ofstream(to + "/model.safetensors", std::ios::binary) << out << h << file.substr(8 + n);
}

TEST(OptWeights, ReadsTensorNamesWithoutModelPrefix) {
  const std::vector<std::vector<uint32_t>> ps = {{2, 301, 691, 272, 647, 608}, {2, 5, 9}};
  for (const char* name : {"opt-pre", "opt-post-proj"}) {
    SCOPED_TRACE(name);
    const std::string bare = ::testing::TempDir() + "/opt-bare-" + name;
    writeBareCopy(fixture(name), bare);
    auto backend = makeCpuBackend(1);
    auto original = loadModel(fixture(name), *backend, {});
    ASSERT_TRUE(original.ok()) << original.status();
    auto renamed = loadModel(bare, *backend, {});
    ASSERT_TRUE(renamed.ok()) << renamed.status();
    auto want = testing::prefillLogits(**original, *backend, ps);
    auto got = testing::prefillLogits(**renamed, *backend, ps);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(*got, *want);
    std::filesystem::remove_all(bare);
  }
}

}  // namespace
}  // namespace textgen::runtime
