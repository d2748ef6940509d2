// The Norm layer (layers/norm.h) with RMSNorm and LayerNorm, and the learned position embedding
// layer (layers/position_embedding.h), on the CPU backend over a small safetensors file written
// by the test: the bias choices, the residual, the sum over ranks, the batch's positions and the
// table's bounds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "layers/forward_context.h"
#include "layers/norm.h"
#include "layers/position_embedding.h"
#include "layers/weight_loader.h"
#include "layers/workspace.h"
#include "textgen/kernels/layer_norm.h"
#include "textgen/kernels/rms_norm.h"

namespace textgen::runtime {
namespace {

constexpr int64_t kHidden = 8, kMaxPositions = 16;

// Sums over `world` ranks that all hold the same data: data *= world.
class ScalingCommunicator final : public Communicator {
 public:
  explicit ScalingCommunicator(int world) : world_(world) {}
  int rank() const override { return 0; }
  int worldSize() const override { return world_; }
  const char* name() const override { return "scaling"; }
  Status allReduceSum(void* data, int64_t count, kernels::DType dtype) override {
    if (dtype != kernels::DType::kF32) return unimplementedError("f32 only");
    for (int64_t i = 0; i < count; ++i) static_cast<float*>(data)[i] *= static_cast<float>(world_);
    ++calls;
    return okStatus();
  }
  Status allGather(const void*, void*, int64_t, kernels::DType) override {
    return unimplementedError("allGather");
  }
  Status broadcast(void*, int64_t, kernels::DType, int) override {
    return unimplementedError("broadcast");
  }
  int calls = 0;

 private:
  int world_;
};

std::vector<float> randomVector(size_t n, uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class NormLayerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/textgen-norm-layer-test-" + std::to_string(::getpid());
    config_.hiddenSize = kHidden;
    config_.maxPositionEmbeddings = kMaxPositions;
    tensors_["ln.weight"] = {{kHidden}, randomVector(kHidden, 1, 1.0f)};
    tensors_["ln.bias"] = {{kHidden}, randomVector(kHidden, 2)};
    tensors_["rms.weight"] = {{kHidden}, randomVector(kHidden, 3, 1.0f)};
    tensors_["pos.weight"] = {{kMaxPositions + 2, kHidden},
                              randomVector((kMaxPositions + 2) * kHidden, 4)};
    tensors_["short.weight"] = {{kMaxPositions, kHidden}, randomVector(kMaxPositions * kHidden, 5)};
    write();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write() {
    store_.reset();  // it maps the file rewritten below
    std::filesystem::create_directories(dir_);
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, t] : tensors_) {
      const size_t begin = data.size();
      data.append(reinterpret_cast<const char*>(t.second.data()), t.second.size() * sizeof(float));
      header[name] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {begin, data.size()}}};
    }
    const std::string h = header.dump();
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << len << h << data;
    auto store = WeightStore::open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  WeightLoader loader() const {
    return WeightLoader(*store_, *backend_, DType::kF32, config_, partition_);
  }

  ForwardContext context(Communicator* comm, int64_t rows, int64_t maxContext = 0,
                         const int32_t* positions = nullptr) {
    meta_.positions = positions;
    meta_.layout.rows = rows;
    meta_.layout.maxContext = maxContext;
    return ForwardContext{*backend_, comm, config_, partition_, DType::kF32, meta_, ws_, *cache_};
  }

  void SetUpCache() {
    auto cache = KvCache::create(*backend_, {1, 1, 1}, 1, 1);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  const std::vector<float>& weight(const std::string& name) { return tensors_[name].second; }

  std::string dir_;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors_;
  ModelConfig config_;
  Partition partition_;
  std::unique_ptr<Backend> backend_ = makeCpuBackend(1);
  std::unique_ptr<WeightStore> store_;
  BatchMetadata meta_;
  Workspace ws_;
  std::unique_ptr<KvCache> cache_;
};

// LayerNorm with the checkpoint's weight (and bias) on the host, through the reference op.
std::vector<float> expectLayerNorm(const std::vector<float>& x, const std::vector<float>& w,
                                   const std::vector<float>* b, int64_t rows) {
  std::vector<float> out(x.size());
  EXPECT_TRUE(kernels::layerNormReference({.input = x.data(),
                                           .output = out.data(),
                                           .weight = w.data(),
                                           .bias = b ? b->data() : nullptr,
                                           .numTokens = rows,
                                           .hiddenSize = kHidden,
                                           .eps = 1e-5f})
                  .ok());
  return out;
}

TEST_F(NormLayerTest, LayerNormLoadsItsBiasAsTheGraphSays) {
  SetUpCache();
  const int64_t rows = 3;
  const auto x = randomVector(rows * kHidden, 10, 2.0f);
  const auto withBias = expectLayerNorm(x, weight("ln.weight"), &weight("ln.bias"), rows);
  const auto noBias = expectLayerNorm(x, weight("ln.weight"), nullptr, rows);
  ASSERT_NE(withBias, noBias);
  const std::pair<NormBias, bool> cases[] = {
      {NormBias::kRequired, true}, {NormBias::kOptional, true}, {NormBias::kAbsent, false}};
  for (const auto& [bias, has] : cases) {
    SCOPED_TRACE(static_cast<int>(bias));
    auto norm = Norm::load(loader(), NormKind::kLayer, "ln.weight", 1e-5, bias);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_EQ(norm->hasBias(), has);
    std::vector<float> out(x.size());
    ASSERT_TRUE(norm->forward(context(nullptr, rows), x.data(), nullptr, out.data(), rows).ok());
    EXPECT_EQ(out, has ? withBias : noBias);
  }
}

TEST_F(NormLayerTest, MissingBiasIsAnErrorOnlyWhenRequired) {
  tensors_.erase("ln.bias");
  write();
  auto required = Norm::load(loader(), NormKind::kLayer, "ln.weight", 1e-5, NormBias::kRequired);
  ASSERT_FALSE(required.ok());
  EXPECT_EQ(required.status().code(), StatusCode::kNotFound);
  EXPECT_NE(required.status().message().find("ln.bias"), std::string::npos) << required.status();
  auto optional = Norm::load(loader(), NormKind::kLayer, "ln.weight", 1e-5, NormBias::kOptional);
  ASSERT_TRUE(optional.ok()) << optional.status();
  EXPECT_FALSE(optional->hasBias());

  tensors_["ln.bias"] = {{kHidden + 1}, randomVector(kHidden + 1, 2)};
  write();
  auto misshapen = Norm::load(loader(), NormKind::kLayer, "ln.weight", 1e-5, NormBias::kOptional);
  ASSERT_FALSE(misshapen.ok());
  EXPECT_NE(misshapen.status().message().find("ln.bias"), std::string::npos) << misshapen.status();

  auto rms = Norm::load(loader(), NormKind::kRms, "rms.weight", 1e-6, NormBias::kOptional);
  ASSERT_FALSE(rms.ok());
  EXPECT_EQ(rms.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(NormLayerTest, LayerNormResidualAndReducedForward) {
  SetUpCache();
  const int64_t rows = 2;
  auto norm = Norm::load(loader(), NormKind::kLayer, "ln.weight", 1e-5, NormBias::kRequired);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_EQ(norm->kind(), NormKind::kLayer);
  const auto x = randomVector(rows * kHidden, 20), r = randomVector(rows * kHidden, 21);

  // With a residual: the sum kept in the residual, the norm of it in the output.
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + r[i];
  std::vector<float> residual = r, out(x.size());
  ASSERT_TRUE(
      norm->forward(context(nullptr, rows), x.data(), residual.data(), out.data(), rows).ok());
  EXPECT_EQ(residual, sum);
  EXPECT_EQ(out, expectLayerNorm(sum, weight("ln.weight"), &weight("ln.bias"), rows));

  // Two ranks holding x each: the all-reduce gives 2x, which the input keeps (no residual).
  partition_.world = 2;
  ScalingCommunicator comm(2);
  std::vector<float> input = x, twice(x.size());
  for (size_t i = 0; i < x.size(); ++i) twice[i] = 2.0f * x[i];
  ASSERT_TRUE(
      norm->forwardReduced(context(&comm, rows), input.data(), nullptr, out.data(), rows).ok());
  EXPECT_EQ(comm.calls, 1);
  EXPECT_EQ(input, twice);
  EXPECT_EQ(out, expectLayerNorm(twice, weight("ln.weight"), &weight("ln.bias"), rows));

  // One rank: no all-reduce.
  partition_.world = 1;
  input = x;
  ASSERT_TRUE(
      norm->forwardReduced(context(&comm, rows), input.data(), nullptr, out.data(), rows).ok());
  EXPECT_EQ(comm.calls, 1);
  EXPECT_EQ(out, expectLayerNorm(x, weight("ln.weight"), &weight("ln.bias"), rows));
}

TEST_F(NormLayerTest, RmsNormStillRunsBothWays) {
  SetUpCache();
  const int64_t rows = 2;
  auto norm = Norm::load(loader(), NormKind::kRms, "rms.weight", 1e-6);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_FALSE(norm->hasBias());
  const auto x = randomVector(rows * kHidden, 30);
  std::vector<float> want(x.size()), out(x.size());
  ASSERT_TRUE(kernels::rmsNormReference({.input = x.data(),
                                         .output = want.data(),
                                         .weight = weight("rms.weight").data(),
                                         .numTokens = rows,
                                         .hiddenSize = kHidden})
                  .ok());
  ASSERT_TRUE(norm->forward(context(nullptr, rows), x.data(), nullptr, out.data(), rows).ok());
  EXPECT_EQ(out, want);
  // Two ranks: the communicator's allReduceRmsNorm (by default allReduceSum, then the norm).
  partition_.world = 2;
  ScalingCommunicator comm(2);
  std::vector<float> input = x, twice(x.size());
  for (size_t i = 0; i < x.size(); ++i) twice[i] = 2.0f * x[i];
  ASSERT_TRUE(
      norm->forwardReduced(context(&comm, rows), input.data(), nullptr, out.data(), rows).ok());
  EXPECT_EQ(comm.calls, 1);
  EXPECT_EQ(input, twice);
  ASSERT_TRUE(kernels::rmsNormReference({.input = twice.data(),
                                         .output = want.data(),
                                         .weight = weight("rms.weight").data(),
                                         .numTokens = rows,
                                         .hiddenSize = kHidden})
                  .ok());
  EXPECT_EQ(out, want);
}

TEST_F(NormLayerTest, PositionEmbeddingAddsTheRowOfEachPosition) {
  SetUpCache();
  auto pos = PositionEmbedding::load(loader(), "pos.weight", kMaxPositions + 2, /*offset=*/2);
  ASSERT_TRUE(pos.ok()) << pos.status();
  // Two sequences: positions 0..2 (prefill) and 9 (decode).
  const std::vector<int32_t> positions{0, 1, 2, 9};
  const int64_t rows = 4;
  const auto x = randomVector(rows * kHidden, 40);
  const auto& table = weight("pos.weight");
  std::vector<float> want = x;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < kHidden; ++i)
      want[r * kHidden + i] += table[(positions[r] + 2) * kHidden + i];
  }
  std::vector<float> hidden = x;
  ASSERT_TRUE(pos->forward(context(nullptr, rows, 10, positions.data()), hidden.data()).ok());
  EXPECT_EQ(hidden, want);

  // A batch whose context exceeds the table: refused, nothing read or written.
  hidden = x;
  const Status s =
      pos->forward(context(nullptr, rows, kMaxPositions + 1, positions.data()), hidden.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(hidden, x);

  // Rank 1 of two holds a partial sum: rank 0 alone adds the positions.
  partition_.world = 2;
  partition_.rank = 1;
  ASSERT_TRUE(pos->forward(context(nullptr, rows, 10, positions.data()), hidden.data()).ok());
  EXPECT_EQ(hidden, x);
}

TEST_F(NormLayerTest, PositionTableMustHoldTheContext) {
  // GPT-2 style (offset 0) fits exactly; OPT's offset 2 needs two more rows.
  EXPECT_TRUE(PositionEmbedding::load(loader(), "short.weight", kMaxPositions).ok());
  auto opt = PositionEmbedding::load(loader(), "short.weight", kMaxPositions, /*offset=*/2);
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("short.weight"), std::string::npos) << opt.status();
  // A shape other than the checkpoint's.
  auto wrong = PositionEmbedding::load(loader(), "short.weight", kMaxPositions + 2, 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("short.weight"), std::string::npos) << wrong.status();
}

// A step too large for the memory left (a hostile Prefill's rows, or logits of every prompt
// token) fails to grow the workspace; ensureBuffer has freed the old buffers by then, so the next
// ordinary step must allocate every buffer again rather than use one that is gone. (Skipped under
// the sanitizers, whose allocators abort on a petabyte rather than fail it.)
TEST(Workspace, AFailedGrowthLeavesNoMissingBufferForTheNextStep) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer's allocator aborts on the failing allocation";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || \
    __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizer's allocator aborts on the failing allocation";
#endif
#endif
  auto backend = makeCpuBackend(1);
  ModelConfig c;
  c.hiddenSize = 8;
  c.headDim = 4;
  c.vocabSize = 16;
  Partition part;
  part.heads = 2;
  part.kvHeads = 1;
  part.intermediate = 16;
  part.vocabPart = 16;
  Workspace ws;
  bool moved = false;
  ASSERT_TRUE(ws.reserve(*backend, c, part, DType::kF32, 4, 2, moved).ok());
  const int64_t huge = int64_t{1} << 45;  // rows: petabytes of activations or logits
  const Status rows = ws.reserve(*backend, c, part, DType::kF32, huge, 2, moved);
  EXPECT_EQ(rows.code(), StatusCode::kResourceExhausted) << rows;
  const Status logits = ws.reserve(*backend, c, part, DType::kF32, 4, huge, moved);
  EXPECT_EQ(logits.code(), StatusCode::kResourceExhausted) << logits;
  ASSERT_TRUE(ws.reserve(*backend, c, part, DType::kF32, 4, 2, moved).ok());
  EXPECT_TRUE(moved);
  EXPECT_EQ(ws.rows, 4);
  EXPECT_EQ(ws.logitRows, 2);
  const size_t f = sizeof(float);
  for (const auto& [buf, bytes] : std::vector<std::pair<const std::unique_ptr<Buffer>*, size_t>>{
           {&ws.residual, 4 * 8 * f},
           {&ws.hidden, 4 * 8 * f},
           {&ws.branch, 4 * 8 * f},
           {&ws.qkv, 4 * 4 * 4 * f},
           {&ws.attn, 4 * 2 * 4 * f},
           {&ws.gateUp, 4 * 32 * f},
           {&ws.act, 4 * 16 * f},
           {&ws.pickedHidden, 2 * 8 * f},
           {&ws.pickedResidual, 2 * 8 * f},
           {&ws.logits, 2 * 16 * f}}) {
    ASSERT_NE(*buf, nullptr);
    EXPECT_GE((*buf)->bytes(), bytes);
  }
}

}  // namespace
}  // namespace textgen::runtime
