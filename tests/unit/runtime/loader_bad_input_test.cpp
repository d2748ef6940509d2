// Hostile model folders (issue 13): wrong-typed and absurd config.json fields, deep JSON, FIFOs and
// devices where files belong, oversized files, safetensors whose sizes overflow. Each is an error
// that names what is wrong; none crashes, hangs or reaches an allocation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "textgen/runtime/model_config.h"
#include "textgen/runtime/safetensors.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json llamaConfig() {
  return json::parse(R"({"architectures":["LlamaForCausalLM"],"vocab_size":100,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":128,"rms_norm_eps":1e-5,"eos_token_id":2,"torch_dtype":"bfloat16"})");
}

std::string nestedArrays(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

std::string safetensors(const std::string& header, const std::string& data = {}) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

class BadModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("textgen-bad-model-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  void fifo(const std::string& name) { ASSERT_EQ(::mkfifo(path(name).c_str(), 0600), 0); }

  // Runs `call`, which must not block on the FIFO `name`. Should it block in open(), a watchdog
  // opens the FIFO's write end after 3 s so that the call returns and the test fails instead of
  // hanging. Returns the seconds the call took.
  double withinDeadline(const std::string& name, const std::function<void()>& call) {
    std::atomic<bool> done{false};
    std::thread watchdog([&] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (!done && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      while (!done) {  // the reader is stuck: release it
        const int fd = ::open(path(name).c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    const auto start = std::chrono::steady_clock::now();
    call();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    done = true;
    watchdog.join();
    return seconds;
  }

  fs::path dir_;
};

void expectError(const Status& s, StatusCode code, const std::string& substring) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(substring), std::string::npos)
      << "expected '" << substring << "' in: " << s;
}

// A field of the wrong JSON type is INVALID_ARGUMENT naming it, never a nlohmann exception.
TEST(ModelConfigBadInput, WrongTypedFieldsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    const char* field;
  } cases[] = {
      {[](json& j) { j["model_type"] = 5; }, "'model_type' must be a string"},
      {[](json& j) { j["hidden_act"] = json::array({"silu"}); }, "'hidden_act' must be a string"},
      {[](json& j) { j["torch_dtype"] = 16; }, "'torch_dtype' must be a string"},
      {[](json& j) { j["dtype"] = json::object(); }, "'dtype' must be a string"},
      {[](json& j) {
         j["sliding_window"] = 64;
         j["use_sliding_window"] = "yes";
       },
       "'use_sliding_window' must be true or false"},
      {[](json& j) {
         j["rope_scaling"] = {{"rope_type", 3}, {"factor", 2.0}};
       },
       "'rope_scaling.rope_type' must be a string"},
      {[](json& j) { j["bos_token_id"] = "1"; }, "'bos_token_id' must be a token id"},
      {[](json& j) { j["vocab_size"] = "32000"; }, "'vocab_size' must be a positive integer"},
      {[](json& j) { j["head_dim"] = 1.5; }, "'head_dim' must be a positive integer"},
      {[](json& j) { j["architectures"] = "LlamaForCausalLM"; }, "'architectures' must list"},
  };
  for (const Case& c : cases) {
    json j = llamaConfig();
    c.edit(j);
    StatusOr<ModelConfig> r = invalidArgumentError("not run");
    ASSERT_NO_THROW(r = parseModelConfig(j.dump())) << c.field;
    ASSERT_FALSE(r.ok()) << c.field;
    expectError(r.status(), StatusCode::kInvalidArgument, c.field);
  }
}

// Sizes beyond every real model are refused before anything is sized from them.
TEST(ModelConfigBadInput, AbsurdSizesAreErrors) {
  struct Case {
    const char* key;
    json value;
    const char* expect;
  } cases[] = {
      {"num_hidden_layers", 1000000000, "'num_hidden_layers' is 1000000000, more than the limit"},
      {"vocab_size", uint64_t{1} << 40, "'vocab_size' is 1099511627776, more than the limit"},
      {"hidden_size", uint64_t{1} << 40, "'hidden_size' is 1099511627776, more than the limit"},
      {"intermediate_size", uint64_t{1} << 40, "'intermediate_size' is 1099511627776, more than"},
      {"num_attention_heads", 65536, "'num_attention_heads' is 65536, more than the limit"},
      {"num_key_value_heads", 8, "'num_key_value_heads' must divide num_attention_heads"},
      {"head_dim", 1 << 20, "'head_dim' is 1048576, more than the limit"},
      {"max_position_embeddings", uint64_t{1} << 40, "'max_position_embeddings' is 1099511627776"},
      {"max_position_embeddings", uint64_t{1} << 63, "more than the limit"},
      {"sliding_window", uint64_t{1} << 62, "'sliding_window' is 4611686018427387904"},
      {"rope_scaling", {{"type", "linear"}, {"factor", 1e300}}, "'rope_scaling.factor' must be"},
      {"rope_scaling", {{"type", "dynamic"}, {"factor", 1000.0}}, "stretches the context past"},
      // Top level, with no rope_scaling object (found by fuzz.model_config).
      {"partial_rotary_factor", 5.5, "'partial_rotary_factor' must be at most 1"},
  };
  for (const Case& c : cases) {
    json j = llamaConfig();
    j[c.key] = c.value;
    if (std::string(c.key) == "rope_scaling") j["max_position_embeddings"] = 1 << 20;
    auto r = parseModelConfig(j.dump());
    ASSERT_FALSE(r.ok()) << c.key << " = " << c.value.dump();
    expectError(r.status(), StatusCode::kInvalidArgument, c.expect);
  }
  // hidden_size / num_attention_heads is a head_dim too: bounded the same.
  json j = llamaConfig();
  j["hidden_size"] = 1 << 16;
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 1;
  auto r = parseModelConfig(j.dump());
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "'head_dim' (hidden_size");
}

TEST(ModelConfigBadInput, DeepNestingIsAnError) {
  const std::string deep = nestedArrays(100000);
  std::string config = llamaConfig().dump();
  config.insert(1, "\"junk\":" + deep + ",");
  auto r = parseModelConfig(config);
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "config.json nests deeper than 64");
  r = parseModelConfig(llamaConfig().dump(), "{\"eos_token_id\":" + deep + "}");
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "generation_config.json nests deeper");
}

TEST_F(BadModelDir, ConfigFifoIsRefusedWithoutBlocking) {
  fifo("config.json");
  StatusOr<ModelConfig> r = invalidArgumentError("not run");
  const double seconds = withinDeadline("config.json", [&] { r = loadModelConfig(dir_.string()); });
  EXPECT_LT(seconds, 2.0);
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, path("config.json") + ": is a FIFO");
}

TEST_F(BadModelDir, GenerationConfigFifoIsRefusedWithoutBlocking) {
  write("config.json", llamaConfig().dump());
  fifo("generation_config.json");
  StatusOr<ModelConfig> r = invalidArgumentError("not run");
  const double seconds =
      withinDeadline("generation_config.json", [&] { r = loadModelConfig(dir_.string()); });
  EXPECT_LT(seconds, 2.0);
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "generation_config.json: is a FIFO");
}

TEST_F(BadModelDir, ConfigDirectoryAndHugeFileAreErrors) {
  fs::create_directory(dir_ / "config.json");
  auto r = loadModelConfig(dir_.string());
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "config.json: is a directory");
  fs::remove(dir_ / "config.json");
  write("config.json", "");
  fs::resize_file(dir_ / "config.json", (uint64_t{64} << 20) + 1);  // sparse: costs no disk
  r = loadModelConfig(dir_.string());
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "config.json: larger than 67108864 bytes");
  fs::remove(dir_ / "config.json");
  EXPECT_EQ(loadModelConfig(dir_.string()).status().code(), StatusCode::kNotFound);
}

TEST_F(BadModelDir, SafetensorsFifoIsRefusedWithoutBlocking) {
  fifo("model.safetensors");
  StatusOr<std::unique_ptr<WeightStore>> r = invalidArgumentError("not run");
  const double seconds =
      withinDeadline("model.safetensors", [&] { r = WeightStore::open(dir_.string()); });
  EXPECT_LT(seconds, 2.0);
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "model.safetensors: is a FIFO");
}

TEST_F(BadModelDir, IndexFifoDeepNestingAndEmptyNamesAreErrors) {
  fifo("model.safetensors.index.json");
  StatusOr<std::unique_ptr<WeightStore>> r = invalidArgumentError("not run");
  const double seconds =
      withinDeadline("model.safetensors.index.json", [&] { r = WeightStore::open(dir_.string()); });
  EXPECT_LT(seconds, 2.0);
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "index.json: is a FIFO");
  fs::remove(dir_ / "model.safetensors.index.json");
  write("model.safetensors.index.json", "{\"metadata\":" + nestedArrays(100000) + "}");
  r = WeightStore::open(dir_.string());
  ASSERT_FALSE(r.ok());
  expectError(r.status(), StatusCode::kInvalidArgument, "nests deeper than 64");
  for (const char* name : {"", "."}) {
    write("model.safetensors.index.json", json{{"weight_map", {{"w", name}}}}.dump());
    r = WeightStore::open(dir_.string());
    ASSERT_FALSE(r.ok()) << name;
    expectError(r.status(), StatusCode::kInvalidArgument, "is not a plain file name");
  }
}

// Shape × dtype size in checked arithmetic: a product that wraps to the span given is an error,
// not a tensor whose reads run past the mapping.
TEST(SafetensorsBadInput, SizeArithmeticIsChecked) {
  struct Case {
    const char* what;
    std::string header;
    const char* expect;
  } cases[] = {
      {"elements x dtype size wraps to 0",
       R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})",
       "shape overflows"},
      {"elements x dtype size wraps to 16",
       R"({"w":{"dtype":"F32","shape":[4611686018427387908],"data_offsets":[0,16]}})",
       "shape overflows"},
      {"dimension past int64 beside a zero",
       R"({"w":{"dtype":"F32","shape":[0,9223372036854775809],"data_offsets":[0,0]}})",
       "shape overflows"},
      {"rank 100",
       json{{"w",
             {{"dtype", "F32"},
              {"shape", json(std::vector<int>(100, 1))},
              {"data_offsets", {0, 4}}}}}
           .dump(),
       "rank 100 is more than 8"},
      {"deep metadata", "{\"__metadata__\":" + nestedArrays(100000) + "}", "nests deeper than 64"},
  };
  for (const Case& c : cases) {
    auto r = parseSafetensorsHeader(c.header, 16);
    ASSERT_FALSE(r.ok()) << c.what;
    expectError(r.status(), StatusCode::kInvalidArgument, c.expect);
  }
}

// The same through a model folder: the store refuses to open, so nothing is ever sized from it.
TEST_F(BadModelDir, WrappingTensorNeverLoads) {
  write("model.safetensors",
        safetensors(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})"));
  auto store = WeightStore::open(dir_.string());
  ASSERT_FALSE(store.ok()) << "opened; a load would size a 2^64-byte tensor";
  expectError(store.status(), StatusCode::kInvalidArgument, "shape overflows");
}

}  // namespace
}  // namespace textgen::runtime
