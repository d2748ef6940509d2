// config.json as its class spells it (ConfigDialect: the spec's config-key aliases and default
// activation), hidden_act parsed into the MLP's activations, attention_bias and mlp_bias.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "layers/config_fields.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {
namespace {

using kernels::Activation;
using nlohmann::json;

json llamaConfig() {
  return json::parse(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":128,"rms_norm_eps":1e-5,"eos_token_id":2})");
}

// A GPT-2-like class: its own names for the sizes.
constexpr ConfigKeyAlias kGpt2Aliases[] = {
    {"n_embd", "hidden_size"},        {"n_head", "num_attention_heads"},
    {"n_layer", "num_hidden_layers"}, {"n_positions", "max_position_embeddings"},
    {"n_inner", "intermediate_size"}, {"activation_function", "hidden_act"}};

ConfigDialectLookup gpt2Dialect() {
  return [](std::string_view) -> StatusOr<ConfigDialect> {
    return ConfigDialect{.aliases = kGpt2Aliases, .defaultActivation = Activation::kGeluTanh};
  };
}

// The Llama config with the canonical size keys renamed to GPT-2's.
json gpt2Config() {
  json j = llamaConfig();
  for (const ConfigKeyAlias& a : kGpt2Aliases) {
    const std::string canonical(a.canonical);
    if (!j.contains(canonical)) continue;
    j[std::string(a.key)] = j[canonical];
    j.erase(canonical);
  }
  return j;
}

void expectError(const StatusOr<ModelConfig>& r, StatusCode code, const std::string& substring) {
  ASSERT_FALSE(r.ok()) << substring;
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << r.status();
}

TEST(ModelConfigDialect, AliasesAreReadWhenTheCanonicalKeyIsAbsent) {
  auto plain = parseModelConfig(llamaConfig().dump());
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto c = parseModelConfig(gpt2Config().dump(), {}, gpt2Dialect());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenSize, 64);
  EXPECT_EQ(c->numHeads, 4);
  EXPECT_EQ(c->numLayers, 2);
  EXPECT_EQ(c->maxPositionEmbeddings, 128);
  EXPECT_EQ(c->intermediateSize, 128);
  EXPECT_EQ(c->headDim, plain->headDim);
  EXPECT_EQ(c->hiddenAct, Activation::kGeluTanh);  // the dialect's default: no hidden_act given
  // Without the dialect the same file misses its canonical keys.
  expectError(parseModelConfig(gpt2Config().dump()), StatusCode::kInvalidArgument,
              "'hidden_size' is missing");
}

TEST(ModelConfigDialect, BothSpellingsMustAgree) {
  json j = gpt2Config();
  j["num_attention_heads"] = 4;  // the same value twice: fine
  EXPECT_TRUE(parseModelConfig(j.dump(), {}, gpt2Dialect()).ok());
  j["n_head"] = 8;
  expectError(parseModelConfig(j.dump(), {}, gpt2Dialect()), StatusCode::kInvalidArgument,
              "'n_head' (8) and 'num_attention_heads' (4) disagree");
  // null is absent, as for every other key.
  j["num_attention_heads"] = nullptr;
  auto c = parseModelConfig(j.dump(), {}, gpt2Dialect());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->numHeads, 8);
}

TEST(ModelConfigDialect, TwoAliasesOfOneKeyMustAgree) {
  static constexpr ConfigKeyAlias kTwo[] = {{"n_embd", "hidden_size"}, {"d_model", "hidden_size"}};
  auto lookup = [](std::string_view) -> StatusOr<ConfigDialect> {
    return ConfigDialect{.aliases = kTwo};
  };
  json j = llamaConfig();
  j.erase("hidden_size");
  j["n_embd"] = 64;
  j["d_model"] = 64;
  EXPECT_TRUE(parseModelConfig(j.dump(), {}, lookup).ok());
  j["d_model"] = 32;
  expectError(parseModelConfig(j.dump(), {}, lookup), StatusCode::kInvalidArgument,
              "'d_model' (32) and 'n_embd' (64) disagree");
}

// A value read under an alias is checked like the canonical key's, and the error names both.
TEST(ModelConfigDialect, HostileAliasedValuesNameTheirSpelling) {
  struct Case {
    json value;
    const char* expect;
  } cases[] = {
      {-4, "'num_attention_heads' must be a positive integer (config.json spells it 'n_head')"},
      {"4", "must be a positive integer (config.json spells it 'n_head')"},
      {json::array({4}), "must be a positive integer"},
      {json::object({{"n", 4}}), "must be a positive integer"},
      {4.5, "must be a positive integer"},
      {uint64_t{1} << 63, "more than the limit 1024 (config.json spells it 'n_head')"},
      {3, "'num_key_value_heads' must divide num_attention_heads"},
  };
  for (const Case& c : cases) {
    json j = gpt2Config();
    j["n_head"] = c.value;
    StatusOr<ModelConfig> r = internalError("not run");
    ASSERT_NO_THROW(r = parseModelConfig(j.dump(), {}, gpt2Dialect())) << c.value;
    expectError(r, StatusCode::kInvalidArgument, c.expect);
  }
  // A long conflicting value is cut short in the message.
  json j = gpt2Config();
  j["num_attention_heads"] = 4;
  j["n_head"] = std::string(10000, 'x');
  auto r = parseModelConfig(j.dump(), {}, gpt2Dialect());
  expectError(r, StatusCode::kInvalidArgument, "disagree");
  EXPECT_LT(r.status().message().size(), 300u);
}

// An alias must map a key the parser does not read to one it does: the registry's mistake,
// named, never a silent no-op.
TEST(ModelConfigDialect, MalformedAliasesAreInternalErrors) {
  for (ConfigKeyAlias a :
       {ConfigKeyAlias{"n_head", "num_heads"}, ConfigKeyAlias{"hidden_size", "intermediate_size"},
        ConfigKeyAlias{"", "hidden_size"}}) {
    const ConfigKeyAlias one[] = {a};
    auto lookup = [&](std::string_view) -> StatusOr<ConfigDialect> {
      return ConfigDialect{.aliases = one};
    };
    expectError(parseModelConfig(llamaConfig().dump(), {}, lookup), StatusCode::kInternal,
                "LlamaForCausalLM: config-key alias '" + std::string(a.key) + "' -> '" +
                    std::string(a.canonical) + "'");
  }
}

TEST(ModelConfigDialect, TheLookupCanRefuseTheClass) {
  auto refuse = [](std::string_view name) -> StatusOr<ConfigDialect> {
    return unimplementedError("architecture '" + std::string(name) + "' is not supported");
  };
  expectError(parseModelConfig(llamaConfig().dump(), {}, refuse), StatusCode::kUnimplemented,
              "'LlamaForCausalLM' is not supported");
}

TEST(ModelConfigActivation, HiddenActNamesAreTransformers) {
  const std::pair<const char*, Activation> accepted[] = {
      {"silu", Activation::kSilu},         {"swish", Activation::kSilu},
      {"gelu", Activation::kGelu},         {"gelu_pytorch_tanh", Activation::kGeluTanh},
      {"gelu_new", Activation::kGeluTanh}, {"gelu_fast", Activation::kGeluTanh},
      {"relu", Activation::kRelu},
  };
  for (const auto& [name, act] : accepted) {
    json j = llamaConfig();
    j["hidden_act"] = name;
    auto c = parseModelConfig(j.dump());
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->hiddenAct, act) << name;
  }
  auto c = parseModelConfig(llamaConfig().dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->hiddenAct, Activation::kSilu);  // LlamaConfig's default
  // Not computed exactly by any kernel here (quick_gelu: x sigmoid(1.702 x); gelu_10: clipped).
  for (const char* name : {"quick_gelu", "gelu_accurate", "gelu_10", "tanh", "SiLU", ""}) {
    json j = llamaConfig();
    j["hidden_act"] = name;
    expectError(parseModelConfig(j.dump()), StatusCode::kInvalidArgument,
                "'hidden_act' '" + std::string(name) +
                    "' is not supported (silu, swish, gelu, gelu_pytorch_tanh, gelu_new, "
                    "gelu_fast, relu)");
  }
  json j = llamaConfig();
  j["hidden_act"] = std::string(5000, 'g');
  auto r = parseModelConfig(j.dump());
  expectError(r, StatusCode::kInvalidArgument, "'hidden_act' 'ggg");
  EXPECT_LT(r.status().message().size(), 300u);
  j["hidden_act"] = 3;
  expectError(parseModelConfig(j.dump()), StatusCode::kInvalidArgument,
              "'hidden_act' must be a string");
}

TEST(ModelConfigBias, AttentionAndMlpBiasAreParsed) {
  json j = llamaConfig();
  auto c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->attentionBias);
  EXPECT_FALSE(c->mlpBias);
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attentionBias);
  EXPECT_TRUE(c->mlpBias);
  j["mlp_bias"] = 1;
  expectError(parseModelConfig(j.dump()), StatusCode::kInvalidArgument,
              "'mlp_bias' must be true or false");
}

// A family's prepare hook: derives canonical keys from its own (here: intermediate_size from an
// expansion ratio inside a nested object, as MPT), after the aliases, before the generic fields.
Status prepareExpansion(json& j) {
  if (!j.contains("ffn") || !j["ffn"].is_object())
    return invalidArgumentError("'ffn' must be an object");
  const json& ratio = j["ffn"]["ratio"];
  if (!ratio.is_number_integer() || ratio.get<int64_t>() <= 0 || ratio.get<int64_t>() > 64)
    return invalidArgumentError("'ffn.ratio' must be an integer between 1 and 64");
  j["intermediate_size"] = j["hidden_size"].get<int64_t>() * ratio.get<int64_t>();
  return okStatus();
}

ConfigDialectLookup expansionDialect() {
  return [](std::string_view) -> StatusOr<ConfigDialect> {
    return ConfigDialect{.aliases = kGpt2Aliases, .prepare = prepareExpansion};
  };
}

TEST(ModelConfigDialect, PrepareRewritesAfterTheAliasesAndFieldsAreReadable) {
  json j = gpt2Config();
  j.erase("n_inner");
  j["ffn"] = {{"ratio", 3}, {"clip", 0.5}, {"on", true}, {"blocks", 7}, {"none", nullptr}};
  auto c = parseModelConfig(j.dump(), {}, expansionDialect());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->intermediateSize, 192);  // hidden_size (read under n_embd) * 3
  ASSERT_NE(c->json, nullptr);
  const ConfigFields f(*c);
  EXPECT_EQ(*f.number("ffn.clip", 0.0), 0.5);
  EXPECT_EQ(*f.number("ffn.absent", 8.0), 8.0);
  EXPECT_EQ(*f.number("ffn.none", 8.0), 8.0);  // null reads as absent
  EXPECT_FALSE(f.optionalNumber("ffn.none")->has_value());
  EXPECT_TRUE(*f.boolean("ffn.on", false));
  EXPECT_EQ(*f.integer("ffn.blocks", 0, 10), 7);
  EXPECT_EQ(*f.integer("num_hidden_layers", 0, 10), 2);  // canonical after the aliases
  EXPECT_FALSE(f.integer("ffn.blocks", 0, 5).ok());
  EXPECT_FALSE(f.boolean("ffn.clip", false).ok());
  EXPECT_FALSE(f.number("ffn.on", 0.0).ok());
  auto bad = f.integer("ffn.clip", 0, 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'ffn.clip'"), std::string::npos) << bad.status();
  EXPECT_EQ(*f.boolean("ffn.on.deeper", true), true);  // through a non-object: absent
}

TEST(ModelConfigDialect, PrepareErrorsNameTheFieldAndTheFile) {
  json j = gpt2Config();
  j["ffn"] = {{"ratio", "three"}};
  expectError(parseModelConfig(j.dump(), {}, expansionDialect()), StatusCode::kInvalidArgument,
              "config.json: 'ffn.ratio' must be an integer");
  j.erase("ffn");
  expectError(parseModelConfig(j.dump(), {}, expansionDialect()), StatusCode::kInvalidArgument,
              "'ffn' must be an object");
}

}  // namespace
}  // namespace textgen::runtime
