// Marlin-format checkpoints (issue 16): quant_method "marlin" (and GPT-Q's checkpoint_format
// "marlin") parsed with errors naming the field, B and s read back to the codes and scales they
// hold. The layout is written here from its own description (which warp thread and register
// slot each code goes to, a forward map), independently of the loader's inverse table; the
// fixture llama-marlin (tools/reference/make_quant_fixtures.py, checked against upstream
// Layer.pack) covers the bytes end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loader/dequantize.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/quantization_config.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

StatusOr<QuantizationConfig> parse(const std::string& q) {
  return parseQuantizationConfig(json::parse(R"({"quantization_config":)" + q + "}"));
}

void expectConfigError(const std::string& q, const std::string& words) {
  auto c = parse(q);
  ASSERT_FALSE(c.ok()) << q;
  EXPECT_NE(c.status().message().find(words), std::string::npos)
      << q << " -> " << c.status().message();
}

TEST(MarlinConfig, AsVllmAndAutoGptqWriteIt) {
  auto c = parse(R"({"quant_method":"marlin","group_size":128,"lm_head":false})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kMarlin);
  EXPECT_EQ(c->bits, 4);
  EXPECT_EQ(c->groupSize, 128);
  EXPECT_FALSE(c->marlinAsGptq);
  c = parse(R"({"quant_method":"marlin","group_size":-1,"bits":4})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->groupSize, 0);
  // AutoGPTQ >= 0.8: a GPT-Q config with checkpoint_format "marlin"; before: is_marlin_format.
  c = parse(R"({"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true,
      "checkpoint_format":"marlin"})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kMarlin);
  EXPECT_TRUE(c->marlinAsGptq);
  c = parse(R"({"quant_method":"gptq","bits":4,"group_size":-1,"is_marlin_format":true})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kMarlin);
  c = parse(R"({"quant_method":"gptq","bits":4,"format":"marlin"})");  // GPTQModel's old key
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->method, QuantMethod::kMarlin);
}

TEST(MarlinConfig, UnsupportedNamesTheField) {
  expectConfigError(R"({"quant_method":"marlin","bits":8})",
                    "'quantization_config.bits' is 8: Marlin checkpoints are 4-bit");
  expectConfigError(R"({"quant_method":"gptq","bits":8,"checkpoint_format":"marlin"})",
                    "bits' is 8: Marlin checkpoints are 4-bit");
  expectConfigError(R"({"quant_method":"marlin","group_size":64})",
                    "'quantization_config.group_size' is 64: Marlin checkpoints have group_size "
                    "128 or -1");
  expectConfigError(R"({"quant_method":"marlin","group_size":"128"})", "group_size' must be -1");
  expectConfigError(R"({"quant_method":"marlin","is_marlin_24":true})",
                    "'quantization_config.is_marlin_24' is true: 2:4 sparse Marlin checkpoints");
  expectConfigError(R"({"quant_method":"marlin","checkpoint_format":"marlin_24"})",
                    "'quantization_config.checkpoint_format' 'marlin_24': 2:4 sparse Marlin");
  expectConfigError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"marlin_24"})",
                    "2:4 sparse Marlin checkpoints (B_24, B_meta) are not supported");
  expectConfigError(R"({"quant_method":"marlin","is_marlin_24":"no"})",
                    "is_marlin_24' must be true or false");
  expectConfigError(R"({"quant_method":"marlin","checkpoint_format":"gptq"})",
                    "checkpoint_format' 'gptq' is not supported with quant_method 'marlin'");
  expectConfigError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"marlin",
      "desc_act":true})",
                    "desc_act' is true: Marlin's format has no act-order");
  expectConfigError(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"marlin","sym":false})",
                    "sym' is false: Marlin's codes are symmetric");
  expectConfigError(R"({"quant_method":"marlin","lm_head":true})", "a quantized lm_head");
}

// A safetensors file written tensor by tensor (one layer "l").
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
           ("textgen-marlin-" + std::to_string(::getpid()) + "-" +
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

// Where Marlin puts code (k, n) of the [in, out] weight: its tile row k / 16 holds out * 16 codes;
// tile t = (n / 16) % 4 of a 1024-code run, at tile row kk = k % 16, column nn = n % 16, goes to
// warp thread 4 (nn % 8) + (kk % 8) / 2, register slot f = 4 (nn / 8) + (kk % 2) + 2 (kk / 8) of
// the thread's 8 in tile t; slots are stored evens first (0, 2, 4, 6, 1, 3, 5, 7).
int64_t codePosition(int64_t k, int64_t n, int64_t out) {
  const int64_t kk = k % 16, nn = n % 16, tileInRun = (n / 16) % 4, run = n / 64;
  const int64_t thread = 4 * (nn % 8) + (kk % 8) / 2;
  const int64_t f = 4 * (nn / 8) + kk % 2 + 2 * (kk / 8);
  const int64_t slot = f % 2 == 0 ? f / 2 : 4 + f / 2;
  return (k / 16) * out * 16 + run * 1024 + 32 * thread + 8 * tileInRun + slot;
}

// Where scale j of the flattened [groups, out] scales is stored: runs of 64 transposed as 8x8
// with several groups; with one, runs of 32 where pair p = (j % 8) / 2 and column c = j / 8 of a
// run go to 8 p + 2 c + j % 2.
int64_t scalePosition(int64_t j, int64_t groups) {
  if (groups > 1) return j - j % 64 + 8 * (j % 8) + (j % 64) / 8;
  const int64_t r = j % 32;
  return j - r + 8 * ((r % 8) / 2) + 2 * (r / 8) + r % 2;
}

// A Marlin layer [out, in] with `groups` groups: code(k, n) and scale(g, n) chosen to differ
// everywhere that matters.
struct MarlinLayer {
  int64_t out, in, groups;
  static uint32_t code(int64_t k, int64_t n) { return static_cast<uint32_t>((3 * k + 7 * n) % 16); }
  static float scale(int64_t g, int64_t n) {
    return 0.25f + 0.125f * static_cast<float>(n % 13) + g;
  }

  void write(Checkpoint& ck) const {
    std::vector<uint32_t> b(static_cast<size_t>(in / 16 * out * 2), 0);
    for (int64_t k = 0; k < in; ++k)
      for (int64_t n = 0; n < out; ++n) {
        const int64_t x = codePosition(k, n, out);
        b[x / 8] |= code(k, n) << (4 * (x % 8));
      }
    std::vector<float> s(static_cast<size_t>(groups * out));
    for (int64_t j = 0; j < groups * out; ++j)
      s[scalePosition(j, groups)] = scale(j / out, j % out);
    ck.addI32("l.B", {in / 16, out * 2}, b);
    ck.addF16("l.s", {groups, out}, s);
  }
};

QuantizationConfig marlin(int64_t groupSize) {
  QuantizationConfig c;
  c.method = QuantMethod::kMarlin;
  c.bits = 4;
  c.groupSize = groupSize;
  return c;
}

void expectUnpacked(const MarlinLayer& layer, int64_t groupSize) {
  Checkpoint ck;
  layer.write(ck);
  auto store = ck.open();
  ASSERT_NE(store, nullptr);
  auto q = readQuantizedLinear(*store, marlin(groupSize), "l", layer.out, layer.in);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->code, kernels::QuantCode::kUint4);
  ASSERT_EQ(q->groups, layer.groups);
  EXPECT_EQ(q->groupSize, layer.in / layer.groups);
  EXPECT_TRUE(q->gIdx.empty());
  for (int64_t n = 0; n < layer.out; ++n) {
    for (int64_t k = 0; k < layer.in; ++k)
      ASSERT_EQ(q->codes[n * layer.in + k], MarlinLayer::code(k, n))
          << "input " << k << " out " << n;
    for (int64_t g = 0; g < layer.groups; ++g) {
      ASSERT_EQ(q->zeros[n * layer.groups + g], 8);
      ASSERT_EQ(q->scales[n * layer.groups + g], MarlinLayer::scale(g, n)) << "group " << g;
    }
  }
  // And the dense weight: (q - 8) * s.
  auto w = dequantizeLinear(*store, marlin(groupSize), "l", layer.out, layer.in, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const int64_t gs = layer.in / layer.groups;
  for (int64_t n = 0; n < layer.out; n += 7)
    for (int64_t k = 0; k < layer.in; k += 5)
      ASSERT_EQ(w->f32()[n * layer.in + k], (static_cast<float>(MarlinLayer::code(k, n)) - 8.0f) *
                                                MarlinLayer::scale(k / gs, n));
}

TEST(MarlinReader, GroupsOf128) {
  expectUnpacked({128, 384, 3}, 128);
}

TEST(MarlinReader, PerChannel) {
  expectUnpacked({192, 48, 1}, 0);
}

// One group because it spans all inputs (group_size 128 of 128 inputs): Marlin's per-channel
// scale order, as Layer.pack writes it.
TEST(MarlinReader, OneGroupOf128) {
  expectUnpacked({64, 128, 1}, 128);
}

void expectLayerError(Checkpoint& ck, const QuantizationConfig& c, int64_t out, int64_t in,
                      const std::string& words) {
  auto store = ck.open();
  ASSERT_NE(store, nullptr);
  auto q = readQuantizedLinear(*store, c, "l", out, in);
  ASSERT_FALSE(q.ok()) << words;
  EXPECT_NE(q.status().message().find(words), std::string::npos) << q.status().message();
}

TEST(MarlinReaderBadInput, ShapesThatDisagree) {
  {
    Checkpoint ck;  // B for 256 inputs, the layer has 384
    MarlinLayer{128, 256, 2}.write(ck);
    expectLayerError(ck, marlin(128), 128, 384, "'l.B' has shape [16, 256], expected [24, 256]");
  }
  {
    Checkpoint ck;  // B for 64 outputs, the layer has 128
    MarlinLayer{64, 256, 2}.write(ck);
    expectLayerError(ck, marlin(128), 128, 256, "'l.B' has shape [16, 128], expected [16, 256]");
  }
  {
    Checkpoint ck;  // per-channel scales, group_size 128
    MarlinLayer{128, 256, 1}.write(ck);
    expectLayerError(ck, marlin(128), 128, 256, "'l.s' has shape [1, 128], expected [2, 128]");
  }
  {
    Checkpoint ck;  // 144 inputs: tiles of 16, but not groups of 128
    MarlinLayer{64, 144, 1}.write(ck);
    expectLayerError(ck, marlin(128), 64, 144,
                     "'quantization_config.group_size' (128) does not divide the 144 inputs of "
                     "'l'");
  }
  {
    Checkpoint ck;  // outputs not a multiple of 64 (a permutation run spans 4 tiles)
    ck.addI32("l.B", {8, 192}, std::vector<uint32_t>(8 * 192, 0));
    expectLayerError(ck, marlin(0), 96, 128, "needs inputs divisible by 16 and outputs by 64");
  }
  {
    Checkpoint ck;  // inputs not a multiple of 16
    expectLayerError(ck, marlin(0), 64, 120, "needs inputs divisible by 16 and outputs by 64");
  }
}

TEST(MarlinReaderBadInput, DtypesAndMissingTensors) {
  {
    Checkpoint ck;  // B as float32
    ck.add("l.B", "F32", {8, 128}, std::string(8 * 128 * 4, '\0'));
    expectLayerError(ck, marlin(128), 64, 128, "'l.B' has dtype F32 (expected I32)");
  }
  {
    Checkpoint ck;  // no s
    ck.addI32("l.B", {8, 128}, std::vector<uint32_t>(8 * 128, 0));
    expectLayerError(ck, marlin(128), 64, 128, "weight 'l.s' not found in the checkpoint");
  }
  {
    Checkpoint ck;  // GPT-Q tensors under a Marlin config
    ck.addI32("l.qweight", {16, 64}, std::vector<uint32_t>(16 * 64, 0));
    expectLayerError(ck, marlin(128), 64, 128, "weight 'l.B' not found in the checkpoint");
  }
}

// The llama-marlin fixture with its config.json or tensors changed: loadModel fails naming the
// field or tensor at fault.
class MarlinFixtureBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("textgen-marlin-fixture-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::copy(std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-marlin", dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void setQuantizationConfig(const json& q) {
    json c = json::parse(std::ifstream(dir_ / "config.json"));
    if (q.is_null()) {
      c.erase("quantization_config");
    } else {
      c["quantization_config"] = q;
    }
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

TEST_F(MarlinFixtureBadInput, Marlin24) {
  setQuantizationConfig({{"quant_method", "marlin"}, {"group_size", 128}, {"is_marlin_24", true}});
  expectLoadError("is_marlin_24' is true: 2:4 sparse Marlin checkpoints");
}

TEST_F(MarlinFixtureBadInput, EightBits) {
  setQuantizationConfig({{"quant_method", "marlin"}, {"group_size", 128}, {"bits", 8}});
  expectLoadError("bits' is 8: Marlin checkpoints are 4-bit");
}

TEST_F(MarlinFixtureBadInput, GroupSize64) {
  setQuantizationConfig({{"quant_method", "marlin"}, {"group_size", 64}});
  expectLoadError("group_size' is 64");
}

TEST_F(MarlinFixtureBadInput, PerChannelConfigOnGroupedScales) {
  // group_size -1 where down_proj stores 3 groups of 128: its s has the wrong shape.
  setQuantizationConfig({{"quant_method", "marlin"}, {"group_size", -1}});
  expectLoadError("'model.layers.0.mlp.down_proj.s' has shape [3, 128], expected [1, 128]");
}

TEST_F(MarlinFixtureBadInput, MarlinTensorsWithoutQuantizationConfig) {
  setQuantizationConfig(json());
  expectLoadError("not found in the checkpoint");
}

TEST_F(MarlinFixtureBadInput, MarlinTensorsUnderAGptqConfig) {
  setQuantizationConfig({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}});
  expectLoadError("not found in the checkpoint");
}

}  // namespace
}  // namespace textgen::runtime
