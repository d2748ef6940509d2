// MptForCausalLM beyond the fixture test (model_fixture_test.cpp): config.json as MptConfig spells
// it (prepareMptConfig: d_model, n_heads, n_layers, max_seq_len, the nested attn_config), what
// transformers 5.12.1 ignores (expansion_ratio, hidden_act), and the refusals: qk_ln, alibi false
// and multi-query attention (transformers runs none of them), bad clip_qkv and softmax_scale.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "models/registry.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;

json fixtureConfig() {
  std::ifstream in(std::string(TEXTGEN_MODEL_FIXTURES) + "/mpt-clip/config.json");
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

TEST(MptConfig, FixtureIsReadAsMptConfig) {
  auto c = parse(fixtureConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_EQ(c->numLayers, 2);
  EXPECT_EQ(c->numHeads, 4);
  EXPECT_EQ(c->numKvHeads, 4);
  // 4 x d_model, as transformers' MptMLP builds it: expansion_ratio (2 here) is not read.
  EXPECT_EQ(c->intermediateSize, 256);
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kGelu);
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->maxPositionEmbeddings, 256);  // max_seq_len
  EXPECT_EQ(c->vocabSize, 704);              // padded past the tokenizer's
}

TEST(MptConfig, DefaultsOfMptConfig) {
  json j = fixtureConfig();
  j.erase("layer_norm_epsilon");
  j.erase("tie_word_embeddings");
  j.erase("attn_config");  // MptAttentionConfig's defaults: ALiBi, no clip
  j["hidden_act"] = "relu";
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rmsNormEps, 1e-5);
  EXPECT_TRUE(c->tieWordEmbeddings);
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kGelu);
  j["attn_config"] = {{"clip_qkv", nullptr}, {"softmax_scale", nullptr}, {"qk_ln", false}};
  EXPECT_TRUE(parse(j).ok()) << parse(j).status();
}

TEST(MptConfig, WhatTransformersDoesNotRunIsRefused) {
  json j = fixtureConfig();
  j["attn_config"]["qk_ln"] = true;
  expectError(parse(j), StatusCode::kUnimplemented, "'attn_config.qk_ln'");
  j = fixtureConfig();
  j["attn_config"]["alibi"] = false;
  expectError(parse(j), StatusCode::kUnimplemented, "'attn_config.alibi'");
  j = fixtureConfig();
  j["attn_config"]["attn_type"] = "multiquery_attention";
  expectError(parse(j), StatusCode::kUnimplemented, "'attn_config.attn_type'");
}

TEST(MptConfig, BadValuesAreNamed) {
  const auto bad = [](const char* path, json value) {
    json j = fixtureConfig();
    const std::string p(path);
    if (p.starts_with("attn_config.")) {
      j["attn_config"][p.substr(12)] = value;
    } else {
      j[p] = value;
    }
    return parse(j);
  };
  expectError(bad("attn_config.clip_qkv", -1.0), StatusCode::kInvalidArgument,
              "'attn_config.clip_qkv'");
  expectError(bad("attn_config.clip_qkv", "2"), StatusCode::kInvalidArgument,
              "'attn_config.clip_qkv'");
  expectError(bad("attn_config.softmax_scale", 0.0), StatusCode::kInvalidArgument,
              "'attn_config.softmax_scale'");
  expectError(bad("attn_config.qk_ln", "no"), StatusCode::kInvalidArgument, "'attn_config.qk_ln'");
  expectError(bad("attn_config", json::array({1})), StatusCode::kInvalidArgument, "'attn_config'");
  for (const char* key : {"d_model", "n_heads", "n_layers"}) {
    json j = fixtureConfig();
    j.erase(key);
    expectError(parse(j), StatusCode::kInvalidArgument, std::string("'") + key + "'");
    expectError(bad(key, 0), StatusCode::kInvalidArgument, std::string("'") + key + "'");
  }
  expectError(bad("max_seq_len", -3), StatusCode::kInvalidArgument, "max_seq_len");
}

}  // namespace
}  // namespace textgen::runtime
