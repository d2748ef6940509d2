// Pre-quantized checkpoints (issue 16): quantization_config parsed into QuantizationConfig with
// errors naming the field, and GPT-Q / AWQ layers dequantized to the values the reference
// dequantizers give. The packed tensors here are written by hand, bit by bit, independently of the
// loader; every malformed tensor is an error naming it, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loader/dequantize.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/quantization_config.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

StatusOr<QuantizationConfig> parse(const std::string& quantizationConfig) {
  return parseQuantizationConfig(
      json::parse(R"({"quantization_config":)" + quantizationConfig + "}"));
}

void expectError(const std::string& q, const std::string& words) {
  auto c = parse(q);
  ASSERT_FALSE(c.ok()) << q;
  EXPECT_NE(c.status().message().find(words), std::string::npos)
      << q << " -> " << c.status().message();
}

TEST(QuantizationConfig, AbsentIsDense) {
  auto c = parseQuantizationConfig(json::parse(R"({"hidden_size":64})"));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->quantized());
  c = parseQuantizationConfig(json::parse(R"({"quantization_config":null})"));
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->quantized());
}

TEST(QuantizationConfig, GptqAsTransformersWritesIt) {
  auto c = parse(R"({"quant_method":"gptq","bits":4,"group_size":32,"desc_act":true,"sym":false,
      "checkpoint_format":"gptq","damp_percent":0.01,"true_sequential":true,"lm_head":false})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kGptq);
  EXPECT_EQ(c->bits, 4);
  EXPECT_EQ(c->groupSize, 32);
  EXPECT_TRUE(c->descAct);
  EXPECT_FALSE(c->sym);
  EXPECT_TRUE(c->zerosMinusOne);
  // Defaults (transformers' GPTQConfig): group 128, no act-order, symmetric, v1 zeros.
  c = parse(R"({"quant_method":"gptq","bits":8})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->groupSize, 128);
  EXPECT_FALSE(c->descAct);
  EXPECT_TRUE(c->sym);
  c = parse(R"({"quant_method":"gptq","bits":4,"group_size":-1,"format":"gptq_v2"})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->groupSize, 0);
  EXPECT_FALSE(c->zerosMinusOne);
}

TEST(QuantizationConfig, AwqAsAutoAwqWritesIt) {
  auto c = parse(R"({"quant_method":"awq","w_bit":4,"q_group_size":64,"zero_point":true,
      "version":"GEMM"})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kAwq);
  EXPECT_EQ(c->groupSize, 64);
  EXPECT_TRUE(c->zeroPoint);
  c = parse(R"({"quant_method":"awq","bits":4,"group_size":128,"zero_point":false,
      "version":"gemm","backend":"autoawq"})");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->zeroPoint);
}

TEST(QuantizationConfig, UnsupportedOrContradictoryNamesTheField) {
  expectError(R"("gptq")", "'quantization_config' must be an object");
  expectError(R"({"bits":4})", "'quantization_config.quant_method' is missing");
  expectError(R"({"quant_method":7})", "'quantization_config.quant_method' must be a string");
  expectError(R"({"quant_method":"bitsandbytes"})", "'bitsandbytes' is not supported (gptq, awq)");
  expectError(R"({"quant_method":"gptq"})", "'quantization_config.bits' is missing");
  expectError(R"({"quant_method":"gptq","bits":3})", "bits' is 3: GPT-Q checkpoints of 4 or 8");
  expectError(R"({"quant_method":"gptq","bits":-4})", "bits' must be a bit width");
  expectError(R"({"quant_method":"gptq","bits":"4"})", "bits' must be a bit width");
  expectError(R"({"quant_method":"gptq","bits":1e30})", "bits' must be a bit width");
  expectError(R"({"quant_method":"awq","bits":8})", "bits' is 8: AWQ checkpoints are 4-bit");
  expectError(R"({"quant_method":"awq","bits":4,"w_bit":8})",
              "'quantization_config.w_bit' and 'quantization_config.bits' disagree");
  expectError(R"({"quant_method":"gptq","bits":4,"group_size":0})", "group_size' must be -1");
  expectError(R"({"quant_method":"gptq","bits":4,"group_size":-2})", "group_size' must be -1");
  expectError(R"({"quant_method":"gptq","bits":4,"group_size":99999999999})",
              "group_size' must be -1");
  expectError(R"({"quant_method":"gptq","bits":4,"group_size":32.5})", "group_size' must be -1");
  expectError(R"({"quant_method":"gptq","bits":4,"desc_act":"yes"})",
              "desc_act' must be true or false");
  expectError(R"({"quant_method":"gptq","bits":4,"sym":1})", "sym' must be true or false");
  expectError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"marlin"})",
              "checkpoint_format' 'marlin' is not supported (gptq, gptq_v2)");
  expectError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"gptq","format":"gptq_v2"})",
              "disagree");
  expectError(R"({"quant_method":"gptq","bits":4,"lm_head":true})", "a quantized lm_head");
  expectError(R"({"quant_method":"awq","bits":4,"version":"gemv"})",
              "version' 'gemv' is not supported");
  expectError(R"({"quant_method":"awq","bits":4,"backend":"llm-awq"})",
              "backend' 'llm-awq' is not supported");
  expectError(R"({"quant_method":"awq","bits":4,"zero_point":"true"})",
              "zero_point' must be true or false");
}

TEST(QuantizationConfig, ParsedOntoModelConfig) {
  auto c = parseModelConfig(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,
      "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
      "quantization_config":{"quant_method":"awq","bits":4,"group_size":32}})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->quantization.method, QuantMethod::kAwq);
  auto bad = parseModelConfig(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,
      "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
      "quantization_config":{"quant_method":"fp8"}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("quant_method"), std::string::npos);
}

// A safetensors file written tensor by tensor.
class Checkpoint {
 public:
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           std::string bytes) {
    header_[name] = {{"dtype", dtype},
                     {"shape", shape},
                     {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_ += bytes;
  }
  void addI32(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& v) {
    std::string b(v.size() * 4, '\0');
    std::memcpy(b.data(), v.data(), b.size());
    add(name, "I32", std::move(shape), std::move(b));
  }
  void addF16(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::string b(v.size() * 2, '\0');
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = kernels::floatToF16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    add(name, "F16", std::move(shape), std::move(b));
  }
  std::unique_ptr<WeightStore> open() {
    dir_ = fs::temp_directory_path() /
           ("textgen-quant-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string h = header_.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(dir_ / "model.safetensors", std::ios::binary) << out << h << data_;
    auto s = WeightStore::open(dir_.string());
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }
  ~Checkpoint() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

 private:
  json header_ = json::object();
  std::string data_;
  fs::path dir_;
};

// Values packed into 32-bit words, `bits` each, element k at bits [k * bits, (k + 1) * bits).
uint32_t word(const std::vector<uint32_t>& values, int bits) {
  uint32_t w = 0;
  for (size_t k = 0; k < values.size(); ++k) w |= values[k] << (k * bits);
  return w;
}

QuantizationConfig gptq(int bits, int64_t group, bool descAct = false, bool v1 = true) {
  QuantizationConfig c;
  c.method = QuantMethod::kGptq;
  c.bits = bits;
  c.groupSize = group;
  c.descAct = descAct;
  c.zerosMinusOne = v1;
  return c;
}

QuantizationConfig awq(int64_t group, bool zeroPoint = true) {
  QuantizationConfig c;
  c.method = QuantMethod::kAwq;
  c.bits = 4;
  c.groupSize = group;
  c.zeroPoint = zeroPoint;
  return c;
}

// GPT-Q 4-bit, [out 8, in 16], group 8 (2 groups): q[o][i] = (o + i) % 16; zero of group g,
// output o: (o + 3 g) % 16 (zero 0 included: v1 stores 15); scale 0.5 + o / 8 + g.
struct GptqLayer {
  static constexpr int64_t kOut = 8, kIn = 16, kGroup = 8;
  static uint32_t q(int64_t o, int64_t i) { return static_cast<uint32_t>((o + i) % 16); }
  static uint32_t z(int64_t g, int64_t o) { return static_cast<uint32_t>((o + 3 * g) % 16); }
  static float s(int64_t g, int64_t o) { return 0.5f + static_cast<float>(o) / 8 + g; }
  // g_idx: natural (i / 8), or act-order's permutation (even inputs group 0, odd group 1).
  static int64_t group(int64_t i, bool actOrder) { return actOrder ? i % 2 : i / kGroup; }

  static void write(Checkpoint& ck, bool actOrder, bool writeGIdx = true) {
    std::vector<uint32_t> qweight;  // [in / 8, out]
    for (int64_t r = 0; r < kIn / 8; ++r)
      for (int64_t o = 0; o < kOut; ++o) {
        std::vector<uint32_t> v;
        for (int k = 0; k < 8; ++k) v.push_back(q(o, r * 8 + k));
        qweight.push_back(word(v, 4));
      }
    std::vector<uint32_t> qzeros;  // [groups, out / 8], v1: zero - 1 mod 16
    std::vector<float> scales;     // [groups, out]
    for (int64_t g = 0; g < 2; ++g) {
      std::vector<uint32_t> v;
      for (int64_t o = 0; o < kOut; ++o) v.push_back((z(g, o) + 15) % 16);
      qzeros.push_back(word(v, 4));
      for (int64_t o = 0; o < kOut; ++o) scales.push_back(s(g, o));
    }
    std::vector<uint32_t> gIdx;
    for (int64_t i = 0; i < kIn; ++i) gIdx.push_back(static_cast<uint32_t>(group(i, actOrder)));
    ck.addI32("l.qweight", {kIn / 8, kOut}, qweight);
    ck.addI32("l.qzeros", {2, kOut / 8}, qzeros);
    ck.addF16("l.scales", {2, kOut}, scales);
    if (writeGIdx) ck.addI32("l.g_idx", {kIn}, gIdx);
  }
  static void expect(const Tensor& w, bool actOrder) {
    ASSERT_EQ(w.shape(), (std::vector<int64_t>{kOut, kIn}));
    for (int64_t o = 0; o < kOut; ++o)
      for (int64_t i = 0; i < kIn; ++i) {
        const int64_t g = group(i, actOrder);
        const float want = (static_cast<float>(q(o, i)) - static_cast<float>(z(g, o))) * s(g, o);
        ASSERT_EQ(w.f32()[o * kIn + i], want) << "o " << o << " i " << i;
      }
  }
};

TEST(Dequantize, GptqV1Zeros) {
  Checkpoint ck;
  GptqLayer::write(ck, false);
  auto store = ck.open();
  auto w = dequantizeLinear(*store, gptq(4, 8), "l", 8, 16, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  GptqLayer::expect(*w, false);
}

TEST(Dequantize, GptqWithoutGIdxUsesGroupSize) {
  Checkpoint ck;
  GptqLayer::write(ck, false, /*writeGIdx=*/false);
  auto store = ck.open();
  auto w = dequantizeLinear(*store, gptq(4, 8), "l", 8, 16, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  GptqLayer::expect(*w, false);
  // Act-order needs g_idx.
  auto missing = dequantizeLinear(*store, gptq(4, 8, true), "l", 8, 16, DType::kF32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'l.g_idx' not found"), std::string::npos);
}

TEST(Dequantize, GptqActOrderReadsGIdx) {
  Checkpoint ck;
  GptqLayer::write(ck, true);
  auto store = ck.open();
  auto w = dequantizeLinear(*store, gptq(4, 8, true), "l", 8, 16, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  GptqLayer::expect(*w, true);
  // Rounded once to the compute dtype.
  auto h = dequantizeLinear(*store, gptq(4, 8, true), "l", 8, 16, DType::kBF16);
  ASSERT_TRUE(h.ok());
  for (int64_t k = 0; k < 8 * 16; ++k)
    EXPECT_EQ(static_cast<const uint16_t*>(h->data())[k], kernels::floatToBf16(w->f32()[k]));
}

TEST(Dequantize, Gptq8BitV2OneGroup) {
  Checkpoint ck;                  // [out 4, in 8], group -1, zeros stored as they are (gptq_v2)
  std::vector<uint32_t> qweight;  // [in / 4, out]
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t o = 0; o < 4; ++o) {
      std::vector<uint32_t> v;
      for (int k = 0; k < 4; ++k) v.push_back(static_cast<uint32_t>(40 * o + 7 * (r * 4 + k)));
      qweight.push_back(word(v, 8));
    }
  ck.addI32("l.qweight", {2, 4}, qweight);
  ck.addI32("l.qzeros", {1, 1}, {word({128, 100, 0, 255}, 8)});
  ck.addF16("l.scales", {1, 4}, {0.25f, 0.5f, 1.0f, 2.0f});
  auto store = ck.open();
  auto w = dequantizeLinear(*store, gptq(8, 0, false, false), "l", 4, 8, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const float zeros[4] = {128, 100, 0, 255}, scales[4] = {0.25f, 0.5f, 1.0f, 2.0f};
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_EQ(w->f32()[o * 8 + i], (static_cast<float>(40 * o + 7 * i) - zeros[o]) * scales[o]);
}

// AWQ, [out 16, in 4], group 2: q[i][o] = (3 i + o) % 16, zero (g + o) % 16, scale 1 + o / 16 - g.
TEST(Dequantize, AwqInterleavedOrder) {
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble k holds output word * 8 + order[k]
  auto q = [](int64_t i, int64_t o) { return static_cast<uint32_t>((3 * i + o) % 16); };
  auto z = [](int64_t g, int64_t o) { return static_cast<uint32_t>((g + o) % 16); };
  auto s = [](int64_t g, int64_t o) { return 1.0f + static_cast<float>(o) / 16 - g; };
  auto pack = [&](auto f, int64_t row) {
    std::vector<uint32_t> words;
    for (int64_t c = 0; c < 2; ++c) {
      std::vector<uint32_t> v;
      for (int k = 0; k < 8; ++k) v.push_back(f(row, c * 8 + order[k]));
      words.push_back(word(v, 4));
    }
    return words;
  };
  Checkpoint ck;
  std::vector<uint32_t> qweight, qzeros;
  std::vector<float> scales;
  for (int64_t i = 0; i < 4; ++i)
    for (uint32_t w : pack(q, i)) qweight.push_back(w);
  for (int64_t g = 0; g < 2; ++g) {
    for (uint32_t w : pack(z, g)) qzeros.push_back(w);
    for (int64_t o = 0; o < 16; ++o) scales.push_back(s(g, o));
  }
  ck.addI32("l.qweight", {4, 2}, qweight);
  ck.addI32("l.qzeros", {2, 2}, qzeros);
  ck.addF16("l.scales", {2, 16}, scales);
  auto store = ck.open();
  auto w = dequantizeLinear(*store, awq(2), "l", 16, 4, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto noZeros = dequantizeLinear(*store, awq(2, false), "l", 16, 4, DType::kF32);
  ASSERT_TRUE(noZeros.ok()) << noZeros.status().message();
  for (int64_t o = 0; o < 16; ++o)
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t g = i / 2;
      const float qi = static_cast<float>(q(i, o));
      EXPECT_EQ(w->f32()[o * 4 + i], (qi - static_cast<float>(z(g, o))) * s(g, o));
      EXPECT_EQ(noZeros->f32()[o * 4 + i], (qi - 8.0f) * s(g, o));
    }
}

// Each malformed layer is an error naming the tensor or field.
void expectLayerError(Checkpoint& ck, const QuantizationConfig& c, int64_t out, int64_t in,
                      const std::string& words) {
  auto store = ck.open();
  ASSERT_NE(store, nullptr);
  auto w = dequantizeLinear(*store, c, "l", out, in, DType::kF32);
  ASSERT_FALSE(w.ok()) << words;
  EXPECT_NE(w.status().message().find(words), std::string::npos) << w.status().message();
}

TEST(DequantizeBadInput, GIdxOutOfRange) {
  for (uint32_t bad : {2u, 0xFFFFFFFFu, 0x80000000u}) {
    Checkpoint ck;
    GptqLayer::write(ck, false, false);
    std::vector<uint32_t> gIdx(16, 0);
    gIdx[5] = bad;
    ck.addI32("l.g_idx", {16}, gIdx);
    expectLayerError(ck, gptq(4, 8, true), 8, 16, "'l.g_idx': input 5 is in group");
  }
}

TEST(DequantizeBadInput, ShapesThatDisagree) {
  {
    Checkpoint ck;  // qweight for 24 inputs
    GptqLayer::write(ck, false);
    expectLayerError(ck, gptq(4, 8), 8, 24, "'l.qweight' has shape [2, 8], expected [3, 8]");
  }
  {
    Checkpoint ck;
    GptqLayer::write(ck, false);
    expectLayerError(ck, gptq(4, 16), 8, 16, "'l.qzeros' has shape [2, 1], expected [1, 1]");
  }
  {
    Checkpoint ck;
    GptqLayer::write(ck, false);
    expectLayerError(ck, gptq(4, 5), 8, 16, "'quantization_config.group_size' (5) does not divide");
  }
  {
    Checkpoint ck;
    GptqLayer::write(ck, false);
    expectLayerError(ck, gptq(4, 8), 12, 16, "does not pack into 32-bit words");
  }
  {
    Checkpoint ck;  // g_idx of the wrong length
    GptqLayer::write(ck, false, false);
    ck.addI32("l.g_idx", {8}, std::vector<uint32_t>(8, 0));
    expectLayerError(ck, gptq(4, 8), 8, 16, "'l.g_idx' has shape [8], expected [16]");
  }
  {
    Checkpoint ck;  // scales of the wrong shape
    ck.addI32("l.qweight", {4, 2}, std::vector<uint32_t>(8, 0));
    ck.addI32("l.qzeros", {2, 2}, std::vector<uint32_t>(4, 0));
    ck.addF16("l.scales", {2, 8}, std::vector<float>(16, 1.0f));
    expectLayerError(ck, awq(2), 16, 4, "'l.scales' has shape [2, 8], expected [2, 16]");
  }
  {
    Checkpoint ck;  // AWQ qweight in GPT-Q's layout
    ck.addI32("l.qweight", {1, 16}, std::vector<uint32_t>(16, 0));
    expectLayerError(ck, awq(2), 16, 4, "'l.qweight' has shape [1, 16], expected [4, 2]");
  }
}

TEST(DequantizeBadInput, DtypesAndMissingTensors) {
  {
    Checkpoint ck;  // qweight as float32
    ck.add("l.qweight", "F32", {2, 8}, std::string(64, '\0'));
    expectLayerError(ck, gptq(4, 8), 8, 16, "'l.qweight' has dtype F32 (expected I32)");
  }
  {
    Checkpoint ck;  // scales as int32
    ck.addI32("l.qweight", {2, 8}, std::vector<uint32_t>(16, 0));
    ck.addI32("l.qzeros", {2, 1}, std::vector<uint32_t>(2, 0));
    ck.addI32("l.scales", {2, 8}, std::vector<uint32_t>(16, 0));
    expectLayerError(ck, gptq(4, 8), 8, 16, "'l.scales' has dtype I32");
  }
  {
    Checkpoint ck;  // no qzeros
    ck.addI32("l.qweight", {2, 8}, std::vector<uint32_t>(16, 0));
    expectLayerError(ck, gptq(4, 8), 8, 16, "'l.qzeros' not found");
  }
  {
    Checkpoint ck;  // a quantized layer in a checkpoint without quantization_config
    GptqLayer::write(ck, false);
    expectLayerError(ck, QuantizationConfig{}, 8, 16, "config.json has no quantization_config");
  }
}

}  // namespace
}  // namespace textgen::runtime
