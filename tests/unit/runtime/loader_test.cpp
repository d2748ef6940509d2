// Safetensors, weights and config.json: hostile files are errors (never crashes or out-of-bounds
// reads), dtypes convert exactly, tensor-parallel slices cut the right rows and columns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "textgen/kernels/half.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/safetensors.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fileBytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("textgen-loader-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const auto p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

TEST_F(LoaderTest, HostileFilesAreErrors) {
  const std::string good = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data(16, '\0');
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  } cases[] = {
      {"empty file", "", "shorter than the 8-byte header length"},
      {"header length past the end", fileBytes(good, data).substr(0, 30), "exceeds the file"},
      {"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}",
       "exceeds 100 MB"},
      {"not json", fileBytes("{nope", data), "header is not valid JSON"},
      {"offsets past the data",
       fileBytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]}})", data),
       "outside the 16-byte data section"},
      {"size does not match shape",
       fileBytes(R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", data),
       "shape and dtype need 24"},
      {"reversed offsets",
       fileBytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data), "outside"},
      {"negative dim",
       fileBytes(R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,16]}})", data),
       "non-negative integers"},
      {"overflowing shape",
       fileBytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})",
                 data),
       "overflows"},
      {"unknown dtype", fileBytes(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", data),
       "unknown dtype"},
      {"overlap",
       fileBytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           data),
       "overlap"},
  };
  for (const Case& c : cases) {
    auto f = SafetensorsFile::open(write("bad.safetensors", c.bytes));
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << f.status();
  }
  // Random corruption of a real file: error or success, never a crash.
  const std::string real = fileBytes(good, data);
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string b = real;
    for (int k = 0; k < 4; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) b.resize(rng() % b.size());
    (void)SafetensorsFile::open(write("fuzz.safetensors", b));
  }
}

TEST_F(LoaderTest, ConvertsHalfTypesAndSlicesForTensorParallelism) {
  // A [4, 6] tensor with value 10*row + col, stored as bf16 and f16.
  std::string bf, f16;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) {
      const uint16_t b = kernels::floatToBf16(10.0f * r + c),
                     h = kernels::floatToF16(10.0f * r + c);
      bf.append(reinterpret_cast<const char*>(&b), 2);
      f16.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[4,6],"data_offsets":[0,48]},)"
      R"("b":{"dtype":"F16","shape":[4,6],"data_offsets":[48,96]},"i":{"dtype":"I64","shape":[1],"data_offsets":[96,104]}})";
  write("model.safetensors", fileBytes(header, bf + f16 + std::string(8, '\0')));
  auto store = WeightStore::open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->loadF32("a", {4, 6});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->f32()[2 * 6 + 5], 25.0f);
  // Column-parallel (dim 0): rank 1 of 2 holds rows 2-3.
  auto rows = (*store)->loadF32("b", {}, {.dim = 0, .rank = 1, .worldSize = 2});
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->shape(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(rows->f32()[0], 20.0f);
  // Row-parallel (dim 1): rank 2 of 3 holds columns 4-5.
  auto cols = (*store)->loadF32("b", {}, {.dim = 1, .rank = 2, .worldSize = 3});
  ASSERT_TRUE(cols.ok());
  EXPECT_EQ(cols->shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(cols->f32()[0], 4.0f);
  EXPECT_EQ(cols->f32()[3 * 2 + 1], 35.0f);
  EXPECT_EQ((*store)->loadF32("b", {}, {.dim = 1, .rank = 0, .worldSize = 4}).status().code(),
            StatusCode::kInvalidArgument);  // 6 columns do not split 4 ways
  EXPECT_NE(
      (*store)->loadF32("a", {6, 4}).status().message().find("has shape [4, 6], expected [6, 4]"),
      std::string::npos);
  EXPECT_NE((*store)->loadF32("i").status().message().find("dtype I64"), std::string::npos);
  EXPECT_EQ((*store)->loadF32("missing").status().code(), StatusCode::kNotFound);
}

TEST_F(LoaderTest, ShardIndexMustNameLocalFiles) {
  write("model.safetensors.index.json", R"({"weight_map":{"w":"../../etc/passwd"}})");
  auto store = WeightStore::open(dir_.string());
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("not a plain file name"), std::string::npos);
  fs::remove(dir_ / "model.safetensors.index.json");
  EXPECT_EQ(WeightStore::open(dir_.string()).status().code(), StatusCode::kNotFound);
}

json llamaConfig() {
  return json::parse(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":128,"rms_norm_eps":1e-5,"rope_theta":10000.0,"eos_token_id":2,"torch_dtype":"bfloat16"})");
}

TEST(ModelConfigTest, ParsesAndMergesGenerationConfig) {
  auto c = parseModelConfig(llamaConfig().dump(), R"({"eos_token_id":[2, 7]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->headDim, 16);
  EXPECT_EQ(c->numKvHeads, 2);
  EXPECT_EQ(c->dtype, kernels::DType::kBF16);
  EXPECT_EQ(c->eosTokenIds, (std::vector<uint32_t>{2, 7}));
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  json j = llamaConfig();
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 4.0}};
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope.type, RopeType::kDynamic);
  EXPECT_EQ(c->rope.factor, 4.0);
  j = llamaConfig();
  j["rope_parameters"] = {{"rope_type", "linear"},
                          {"factor", 2.0},
                          {"rope_theta", 500000.0},
                          {"partial_rotary_factor", 0.5}};
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rotaryDim(), 8);
  // Llama 3.1's scaling: max_position_embeddings is already the stretched context.
  j = llamaConfig();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 16}};
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_EQ(c->rope.originalMaxPositionEmbeddings, 16);
  EXPECT_EQ(c->maxContext(), 128);
  // YaRN: a missing factor comes from the two contexts; the attention factor from the factor, or
  // from DeepSeek's mscales when both are given.
  j = llamaConfig();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 32}};
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_NEAR(c->rope.attentionFactor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  EXPECT_EQ(c->maxContext(), 128);
  j["rope_scaling"]["mscale"] = 2.0;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  c = parseModelConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NEAR(c->rope.attentionFactor, (0.2 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0),
              1e-12);
}

TEST(ModelConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  } cases[] = {
      {"hidden_size", -4, "'hidden_size' must be a positive integer"},
      {"num_key_value_heads", 3, "'num_key_value_heads' must divide num_attention_heads"},
      {"vocab_size", nullptr, "'vocab_size' is missing"},
      {"rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}, "'longrope' is not supported"},
      {"rope_scaling",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}},
       "'rope_scaling.high_freq_factor' is missing (rope_type llama3)"},
      {"rope_scaling",
       {{"rope_type", "llama3"},
        {"factor", 8.0},
        {"low_freq_factor", 4.0},
        {"high_freq_factor", 1.0},
        {"original_max_position_embeddings", 8192}},
       "'rope_scaling.high_freq_factor' must be greater than low_freq_factor"},
      {"rope_scaling",
       {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", -1}},
       "'rope_scaling.mscale' must be a non-negative number"},
      {"hidden_act", "quick_gelu", "'hidden_act' 'quick_gelu' is not supported"},
      {"torch_dtype", "float8", "'dtype' 'float8' is not supported"},
  };
  for (const Case& c : cases) {
    json j = llamaConfig();
    if (c.value.is_null()) {
      j.erase(c.key);
    } else {
      j[c.key] = c.value;
    }
    auto r = parseModelConfig(j.dump());
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.key << ": " << r.status();
  }
  EXPECT_FALSE(parseModelConfig("[1,2]").ok());
  EXPECT_FALSE(parseModelConfig(llamaConfig().dump(), "{not json").ok());
}

}  // namespace
}  // namespace textgen::runtime
