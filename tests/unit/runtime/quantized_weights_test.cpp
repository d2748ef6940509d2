// Pre-quantized checkpoints (issue 16): quantization_config parsed into QuantizationConfig with
// errors naming the field, and GPT-Q / AWQ layers dequantized to the values the reference
// dequantizers give. The packed tensors here are written by hand, bit by bit, independently of the
// loader; every malformed tensor is an error naming it, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loader/dequantize.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model.h"
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
  expectError(R"({"quant_method":"bitsandbytes"})",
              "'bitsandbytes' is not supported (gptq, awq, fp8, compressed-tensors, marlin)");
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
  expectError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"exllama"})",
              "checkpoint_format' 'exllama' is not supported (gptq, gptq_v2, marlin)");
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

TEST(QuantizationConfig, Fp8AsVllmAutoFp8AndTgiWriteIt) {
  using A = QuantizationConfig::Fp8Activations;
  auto c =
      parse(R"({"quant_method":"fp8","activation_scheme":"static","ignored_layers":["lm_head"]})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kFp8);
  EXPECT_EQ(c->bits, 8);
  EXPECT_EQ(c->fp8Activations, A::kStatic);
  c = parse(R"({"quant_method":"FP8","activation_scheme":"dynamic","fmt":"e4m3"})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->fp8Activations, A::kDynamic);
  c = parse(R"({"quant_method":"fp8"})");  // transformers' default: dynamic
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->fp8Activations, A::kDynamic);
  expectError(R"({"quant_method":"fp8","activation_scheme":"per-token"})",
              "activation_scheme' 'per-token' is not supported (static, dynamic)");
  expectError(R"({"quant_method":"fp8","activation_scheme":1})", "must be a string");
  expectError(R"({"quant_method":"fp8","fmt":"e5m2"})", "fmt' 'e5m2' is not supported");
  expectError(
      R"({"quant_method":"fp8","activation_scheme":"dynamic","weight_block_size":[128,128]})",
      "'quantization_config.weight_block_size' is set: block-wise fp8");
  expectError(R"({"quant_method":"fbgemm_fp8"})", "'fbgemm_fp8' is not supported");
}

// llm-compressor's presets as its checkpoints hold them (FP8, FP8_DYNAMIC).
std::string compressed(const std::string& weights, const std::string& inputs,
                       const std::string& format = "float-quantized") {
  return R"({"quant_method":"compressed-tensors","format":")" + format +
         R"(","ignore":["lm_head"],"config_groups":{"group_0":{"targets":["Linear"],"weights":)" +
         weights + R"(,"input_activations":)" + inputs + "}}}";
}

TEST(QuantizationConfig, CompressedTensorsFloat8) {
  using A = QuantizationConfig::Fp8Activations;
  const std::string channel =
      R"({"num_bits":8,"type":"float","symmetric":true,"strategy":"channel","dynamic":false})";
  const std::string tensor =
      R"({"num_bits":8,"type":"float","symmetric":true,"strategy":"tensor","dynamic":false})";
  const std::string token =
      R"({"num_bits":8,"type":"float","symmetric":true,"strategy":"token","dynamic":true})";
  const std::string dynTensor =
      R"({"num_bits":8,"type":"float","strategy":"tensor","dynamic":true})";
  struct Case {
    std::string config;
    A act;
  };
  for (const Case& k :
       {Case{compressed(channel, token), A::kNone}, Case{compressed(tensor, tensor), A::kStatic},
        Case{compressed(tensor, dynTensor, "naive-quantized"), A::kDynamic},
        Case{compressed(channel, "null"), A::kNone}}) {
    auto c = parse(k.config);
    ASSERT_TRUE(c.ok()) << k.config << ": " << c.status().message();
    EXPECT_EQ(c->method, QuantMethod::kFp8) << k.config;
    EXPECT_EQ(c->fp8Activations, k.act) << k.config;
  }
  expectError(compressed(channel, token, "pack-quantized"),
              "format' 'pack-quantized' is not supported");
  expectError(compressed(R"({"num_bits":4,"type":"int","strategy":"group"})", "null"),
              "config_groups.group_0.weights.num_bits' must be 8 (fp8), not 4");
  expectError(compressed(R"({"num_bits":8,"type":"int","strategy":"channel"})", "null"),
              "config_groups.group_0.weights.type' must be \"float\"");
  expectError(compressed(R"({"num_bits":8,"type":"float","strategy":"block"})", "null"),
              "config_groups.group_0.weights.strategy' 'block' is not supported");
  expectError(
      compressed(R"({"num_bits":8,"type":"float","strategy":"tensor","symmetric":false})", "null"),
      "weights.symmetric' must be true");
  expectError(compressed(channel, R"({"num_bits":8,"type":"float","strategy":"token"})"),
              "input_activations.strategy' 'token' is not supported (tensor; token when dynamic)");
  expectError(
      compressed(channel, R"({"num_bits":8,"type":"float","strategy":"tensor","dynamic":1})"),
      "input_activations.dynamic' must be true or false");
  expectError(compressed(channel, R"("fp8")"), "input_activations' must be an object");
  expectError(compressed("null", "null"), "config_groups.group_0.weights' is missing");
  expectError(R"({"quant_method":"compressed-tensors","format":"float-quantized"})",
              "'quantization_config.config_groups' must hold exactly one quantization scheme");
  expectError(
      R"({"quant_method":"compressed-tensors","format":"float-quantized","config_groups":{"a":{},"b":{}}})",
      "exactly one quantization scheme");
}

TEST(QuantizationConfig, ParsedOntoModelConfig) {
  auto c = parseModelConfig(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,
      "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
      "quantization_config":{"quant_method":"awq","bits":4,"group_size":32}})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->quantization.method, QuantMethod::kAwq);
  auto bad = parseModelConfig(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,
      "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
      "quantization_config":{"quant_method":"eetq"}})");
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
  void addF32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::string b(v.size() * 4, '\0');
    std::memcpy(b.data(), v.data(), b.size());
    add(name, "F32", std::move(shape), std::move(b));
  }
  void addF8(const std::string& name, std::vector<int64_t> shape, const std::vector<uint8_t>& v) {
    add(name, "F8_E4M3", std::move(shape), std::string(v.begin(), v.end()));
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

// ---- fp8 checkpoints
// -----------------------------------------------------------------------------

QuantizationConfig fp8(QuantizationConfig::Fp8Activations act) {
  QuantizationConfig c;
  c.method = QuantMethod::kFp8;
  c.bits = 8;
  c.fp8Activations = act;
  return c;
}

// [out 4, in 8] float8 e4m3fn codes: code(o, i) = 0x30 + 8 o + i (1.0, 1.125, ... 0x30 is 1.0;
// e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits), and every 5th one negated.
constexpr int64_t kF8Out = 4, kF8In = 8;
uint8_t f8Code(int64_t o, int64_t i) {
  const auto c = static_cast<uint8_t>(0x30 + 8 * o + i);
  return (o * kF8In + i) % 5 == 0 ? static_cast<uint8_t>(c | 0x80) : c;
}
// The value by hand, independently of kernels/fp8.h: (1 + m / 8) * 2^(e - 7).
float f8Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const float v = std::ldexp(1.0f + static_cast<float>(m) / 8, e - 7);
  return c & 0x80 ? -v : v;
}
std::vector<uint8_t> f8Codes() {
  std::vector<uint8_t> v;
  for (int64_t o = 0; o < kF8Out; ++o)
    for (int64_t i = 0; i < kF8In; ++i) v.push_back(f8Code(o, i));
  return v;
}

TEST(DequantizeFp8, PerTensorAndPerChannelScales) {
  using A = QuantizationConfig::Fp8Activations;
  const std::vector<float> channel = {0.5f, 0.25f, 2.0f, 0.125f};
  struct Case {
    std::vector<int64_t> shape;
    bool perTensor;
  };
  for (const Case& k : {Case{{}, true}, Case{{1}, true}, Case{{4}, false}, Case{{4, 1}, false}}) {
    Checkpoint ck;
    ck.addF8("l.weight", {kF8Out, kF8In}, f8Codes());
    ck.addF32("l.weight_scale", k.shape, k.perTensor ? std::vector<float>{0.75f} : channel);
    auto store = ck.open();
    ASSERT_NE(store, nullptr);
    auto q = readQuantizedLinear(*store, fp8(A::kDynamic), "l", kF8Out, kF8In);
    ASSERT_TRUE(q.ok()) << q.status().message();
    EXPECT_EQ(q->code, kernels::QuantCode::kFp8E4M3);
    EXPECT_EQ(q->act, kernels::ActQuant::kFp8);
    EXPECT_EQ(q->perTensorScale, k.perTensor);
    EXPECT_FALSE(q->inputScale.has_value());
    auto w = dequantizeLinear(*store, fp8(A::kDynamic), "l", kF8Out, kF8In, DType::kF32);
    ASSERT_TRUE(w.ok()) << w.status().message();
    for (int64_t o = 0; o < kF8Out; ++o)
      for (int64_t i = 0; i < kF8In; ++i)
        ASSERT_EQ(w->f32()[o * kF8In + i],
                  f8Value(f8Code(o, i)) * (k.perTensor ? 0.75f : channel[o]))
            << "o " << o << " i " << i;
    // W8A16 (compressed-tensors' per-token activations): the same weights, activations as they are.
    auto none = readQuantizedLinear(*store, fp8(A::kNone), "l", kF8Out, kF8In);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->act, kernels::ActQuant::kNone);
  }
}

TEST(DequantizeFp8, StaticInputScaleAndBf16Scales) {
  Checkpoint ck;
  ck.addF8("l.weight", {kF8Out, kF8In}, f8Codes());
  ck.add("l.weight_scale", "BF16", {}, std::string("\x40\x3f", 2));  // bf16 0x3f40 = 0.75
  ck.addF16("l.input_scale", {1}, {0.0625f});
  auto store = ck.open();
  ASSERT_NE(store, nullptr);
  auto q = readQuantizedLinear(*store, fp8(QuantizationConfig::Fp8Activations::kStatic), "l",
                               kF8Out, kF8In);
  ASSERT_TRUE(q.ok()) << q.status().message();
  ASSERT_TRUE(q->inputScale.has_value());
  EXPECT_EQ(*q->inputScale, 0.0625f);
  EXPECT_EQ(q->scales, std::vector<float>(kF8Out, 0.75f));
  // Dynamic ignores a stored input scale.
  auto d = readQuantizedLinear(*store, fp8(QuantizationConfig::Fp8Activations::kDynamic), "l",
                               kF8Out, kF8In);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->inputScale.has_value());
}

TEST(DequantizeFp8BadInput, ScalesAndCodes) {
  using A = QuantizationConfig::Fp8Activations;
  const float nan = std::nanf(""), inf = HUGE_VALF;
  auto layer = [](Checkpoint& ck) { ck.addF8("l.weight", {kF8Out, kF8In}, f8Codes()); };
  {
    Checkpoint ck;
    layer(ck);
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In,
                     "'l.weight_scale' not found in the checkpoint: an fp8 layer needs");
  }
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2}, std::vector<int64_t>{4, 2}, std::vector<int64_t>{1, 4},
        std::vector<int64_t>{1, 1, 1}}) {
    Checkpoint ck;  // block-wise or otherwise foreign scale shapes
    layer(ck);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    ck.addF32("l.weight_scale", shape, std::vector<float>(static_cast<size_t>(n), 1.0f));
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In, "'l.weight_scale' has shape");
  }
  {
    Checkpoint ck;
    layer(ck);
    ck.addI32("l.weight_scale", {}, {1});
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In, "'l.weight_scale' has dtype I32");
  }
  for (float bad : {nan, inf, -inf, -1.0f}) {
    Checkpoint ck;
    layer(ck);
    ck.addF32("l.weight_scale", {4}, {1.0f, bad, 1.0f, 1.0f});
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In,
                     "a weight scale must be finite and non-negative");
  }
  {
    Checkpoint ck;  // static activations without input_scale
    layer(ck);
    ck.addF32("l.weight_scale", {}, {1.0f});
    expectLayerError(ck, fp8(A::kStatic), kF8Out, kF8In,
                     "'l.input_scale' not found in the checkpoint: quantization_config's static");
  }
  for (float bad : {nan, inf, 0.0f, -0.5f}) {
    Checkpoint ck;
    layer(ck);
    ck.addF32("l.weight_scale", {}, {1.0f});
    ck.addF32("l.input_scale", {}, {bad});
    expectLayerError(ck, fp8(A::kStatic), kF8Out, kF8In,
                     "an input scale must be finite and positive");
  }
  {
    Checkpoint ck;
    layer(ck);
    ck.addF32("l.weight_scale", {}, {1.0f});
    ck.addF32("l.input_scale", {2}, {1.0f, 1.0f});
    expectLayerError(ck, fp8(A::kStatic), kF8Out, kF8In,
                     "'l.input_scale' has shape [2]: expected [] or [1]");
  }
  {
    Checkpoint ck;  // a NaN code (0x7f / 0xff in e4m3fn)
    std::vector<uint8_t> codes = f8Codes();
    codes[9] = 0xff;
    ck.addF8("l.weight", {kF8Out, kF8In}, codes);
    ck.addF32("l.weight_scale", {}, {1.0f});
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In, "'l.weight': element 9 is an fp8 NaN");
  }
  {
    Checkpoint ck;  // weight stored as float16, or of the wrong shape
    ck.addF16("l.weight", {kF8Out, kF8In}, std::vector<float>(kF8Out * kF8In, 1.0f));
    ck.addF32("l.weight_scale", {}, {1.0f});
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, kF8In,
                     "'l.weight' has dtype F16 (expected F8_E4M3)");
  }
  {
    Checkpoint ck;
    layer(ck);
    ck.addF32("l.weight_scale", {}, {1.0f});
    expectLayerError(ck, fp8(A::kDynamic), kF8Out, 2 * kF8In, "'l.weight' has shape [4, 8]");
  }
}

TEST(DequantizeFp8BadInput, TruncatedTensorIsRefusedAtOpen) {
  // A header whose F8_E4M3 [4, 8] tensor spans 31 bytes: the store refuses the file.
  const fs::path dir =
      fs::temp_directory_path() / ("textgen-f8-truncated-" + std::to_string(::getpid()));
  json header = json::object();
  header["l.weight"] = {{"dtype", "F8_E4M3"}, {"shape", {4, 8}}, {"data_offsets", {0, 31}}};
  const std::string h = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << out << h << std::string(31, '\x38');
  auto s = WeightStore::open(dir.string());
  fs::remove_all(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("l.weight"), std::string::npos) << s.status().message();
}

// A fixture checkpoint whose config.json or tensors disagree: loadModel fails naming the field or
// tensor at fault.
class Fp8FixtureBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("textgen-fp8-fixture-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-fp8-dynamic", dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void setQuantizationConfig(const json& q) {
    json c = json::parse(std::ifstream(dir_ / "config.json"));
    c["quantization_config"] = q;
    std::ofstream(dir_ / "config.json") << c.dump();
  }
  void expectLoadError(const std::string& words) {
    auto backend = makeCpuBackend(1);
    auto m = loadModel(dir_.string(), *backend, {});
    ASSERT_FALSE(m.ok()) << words;
    EXPECT_NE(m.status().message().find(words), std::string::npos) << m.status().message();
  }
  fs::path dir_;
};

TEST_F(Fp8FixtureBadInput, StaticSchemeWithoutInputScales) {
  setQuantizationConfig({{"quant_method", "fp8"}, {"activation_scheme", "static"}});
  expectLoadError("input_scale' not found in the checkpoint");
}

TEST_F(Fp8FixtureBadInput, BlockWiseConfig) {
  setQuantizationConfig({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}});
  expectLoadError("weight_block_size' is set: block-wise fp8");
}

TEST_F(Fp8FixtureBadInput, Fp8WeightsWithoutQuantizationConfig) {
  json c = json::parse(std::ifstream(dir_ / "config.json"));
  c.erase("quantization_config");
  std::ofstream(dir_ / "config.json") << c.dump();
  expectLoadError("has dtype F8_E4M3");
}

}  // namespace
}  // namespace textgen::runtime
