// T5's attention on the device (paged_attention.h: non-causal rows, contextLens, the relative bias)
// against the CPU reference over random shapes, in float32, float16 and bfloat16, within the
// tolerances of the other paged attention tests: the encoder (non-causal, bidirectional buckets),
// the decoder (causal buckets, first steps, chunks, decode rows) and cross-attention (contextLens,
// no bias, some contexts empty); few rows over long contexts take several key splits and the merge.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "support/tolerance.h"
#include "textgen/kernels/paged_attention.h"

namespace textgen::kernels {
namespace {

using testing::decode;
using testing::DeviceBuffer;
using testing::encode;
using testing::toleranceFor;

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

enum class Mode { kEncoder, kDecoder, kCross };

struct T5Case {
  DType dtype;
  Mode mode;
  int64_t numSeqs, heads, kvHeads, headDim, blockSize;
  int32_t maxStart, maxRows;
  int32_t maxEncoderLen = 0;  // cross-attention: contextLens in [0, this]
  int32_t maxDistance = 128;  // the released checkpoints' (the fixtures use 64)
  // The caches one element past an allocation's start: the split kernel's vector loads (heads of
  // 64, one a block) must give way to scalar ones.
  bool misalignedCache = false;
};

const char* modeName(Mode m) {
  return m == Mode::kEncoder ? "encoder" : m == Mode::kDecoder ? "decoder" : "cross";
}

std::string describe(const T5Case& c) {
  return std::string(dtypeName(c.dtype)) + " " + modeName(c.mode) +
         " seqs=" + std::to_string(c.numSeqs) + " heads=" + std::to_string(c.heads) + "/" +
         std::to_string(c.kvHeads) + " headDim=" + std::to_string(c.headDim) +
         " block=" + std::to_string(c.blockSize) + " maxStart=" + std::to_string(c.maxStart) +
         " maxRows=" + std::to_string(c.maxRows) +
         " maxEncoderLen=" + std::to_string(c.maxEncoderLen) +
         " maxDistance=" + std::to_string(c.maxDistance);
}

std::vector<float> randomValues(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
std::unique_ptr<DeviceBuffer> toDevice(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
  EXPECT_NE(b->get(), nullptr);
  EXPECT_EQ(cudaMemcpy(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return b;
}

std::vector<uint8_t> fromDevice(const DeviceBuffer& b, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), b.get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

class T5AttentionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  }
  void run(const T5Case& c);
  std::mt19937 rng_{1919};
};

void T5AttentionCudaTest::run(const T5Case& c) {
  SCOPED_TRACE(describe(c));
  const DType dt = c.dtype;
  const size_t es = dtypeSize(dt);
  std::vector<int32_t> seqStarts{0}, startPos, contextLens;
  int64_t rows = 0, maxNewRows = 0, maxContext = 1, maxBlocks = 1;
  for (int64_t s = 0; s < c.numSeqs; ++s) {
    const auto start =
        c.mode == Mode::kEncoder ? 0 : static_cast<int32_t>(rng_() % (c.maxStart + 1));
    const auto n = static_cast<int32_t>(1 + rng_() % c.maxRows);
    startPos.push_back(start);
    rows += n;
    seqStarts.push_back(static_cast<int32_t>(rows));
    maxNewRows = std::max<int64_t>(maxNewRows, n);
    int64_t ctx = start + n;
    if (c.mode == Mode::kCross) {
      // Some sequences with an empty context (zeros), one at the longest.
      const int32_t len = s == 0            ? c.maxEncoderLen
                          : rng_() % 7 == 0 ? 0
                                            : static_cast<int32_t>(1 + rng_() % c.maxEncoderLen);
      contextLens.push_back(len);
      ctx = len;
    }
    maxContext = std::max(maxContext, ctx);
    maxBlocks = std::max<int64_t>(maxBlocks, (ctx + c.blockSize - 1) / c.blockSize);
  }
  const int64_t numBlocks = c.numSeqs * maxBlocks + 3;
  std::vector<int32_t> pool(numBlocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng_);
  std::vector<int32_t> tables(pool.begin(), pool.begin() + c.numSeqs * maxBlocks);
  const int64_t numSlots = numBlocks * c.blockSize, kvWidth = c.kvHeads * c.headDim;
  const int64_t qStride = (c.heads + 2 * c.kvHeads) * c.headDim;  // q inside a fused qkv row
  // T5 folds 1/sqrt(d) into q and passes scale 1.
  const auto q = encode(
      randomValues(rows * qStride, rng_, 1.0f / std::sqrt(static_cast<float>(c.headDim))), dt);
  const auto kc = encode(randomValues(numSlots * kvWidth, rng_), dt);
  const auto vc = encode(randomValues(numSlots * kvWidth, rng_), dt);
  const bool bias = c.mode != Mode::kCross;
  const int32_t buckets = 32;
  const std::vector<float> table = randomValues(buckets * c.heads, rng_, 2.0f);
  std::vector<uint8_t> want(rows * c.heads * c.headDim * es);
  PagedAttentionParams p{.q = q.data(),
                         .qRowStride = qStride,
                         .kCache = kc.data(),
                         .vCache = vc.data(),
                         .out = want.data(),
                         .seqStarts = seqStarts.data(),
                         .startPos = startPos.data(),
                         .blockTables = tables.data(),
                         .rows = rows,
                         .numSeqs = c.numSeqs,
                         .maxBlocksPerSeq = maxBlocks,
                         .numHeads = c.heads,
                         .numKvHeads = c.kvHeads,
                         .headDim = c.headDim,
                         .blockSize = c.blockSize,
                         .scale = 1.0f,
                         .causal = c.mode == Mode::kDecoder,
                         .contextLens = c.mode == Mode::kCross ? contextLens.data() : nullptr,
                         .relativeBias = bias ? table.data() : nullptr,
                         .relativeBuckets = bias ? buckets : 0,
                         .relativeMaxDistance = bias ? c.maxDistance : 0,
                         .relativeBidirectional = c.mode == Mode::kEncoder,
                         .maxNewRows = maxNewRows,
                         .maxContext = maxContext,
                         .minNewRows = 0,
                         .dtype = dt};
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  auto dq = toDevice(q), dk = toDevice(kc), dv = toDevice(vc), dStarts = toDevice(seqStarts),
       dStartPos = toDevice(startPos), dTables = toDevice(tables), dTable = toDevice(table);
  auto dLens = c.mode == Mode::kCross ? toDevice(contextLens) : nullptr;
  DeviceBuffer dOut(want.size()), workspace(16u << 20);
  TG_ASSERT_CUDA(cudaMemset(workspace.get(), 0, workspace.bytes()));  // split counters start at 0
  TG_ASSERT_CUDA(cudaMemset(dOut.get(), 0xff, dOut.bytes()));  // NaNs where nothing was written
  p.q = dq->get();
  p.kCache = dk->get();
  p.vCache = dv->get();
  std::unique_ptr<DeviceBuffer> shiftedK, shiftedV;
  if (c.misalignedCache) {
    shiftedK = std::make_unique<DeviceBuffer>(kc.size() + 64);
    shiftedV = std::make_unique<DeviceBuffer>(vc.size() + 64);
    auto* k = static_cast<char*>(shiftedK->get()) + es;
    auto* v = static_cast<char*>(shiftedV->get()) + es;
    TG_ASSERT_CUDA(cudaMemcpy(k, kc.data(), kc.size(), cudaMemcpyHostToDevice));
    TG_ASSERT_CUDA(cudaMemcpy(v, vc.data(), vc.size(), cudaMemcpyHostToDevice));
    p.kCache = k;
    p.vCache = v;
  }
  p.out = dOut.get();
  p.seqStarts = dStarts->as<int32_t>();
  p.startPos = dStartPos->as<int32_t>();
  p.blockTables = dTables->as<int32_t>();
  if (bias) p.relativeBias = dTable->as<float>();
  if (dLens) p.contextLens = dLens->as<int32_t>();
  p.workspace = workspace.get();
  p.workspaceBytes = workspace.bytes();
  ASSERT_TRUE(invokePagedAttention(p, nullptr).ok());
  testing::Tolerance tol = toleranceFor(dt);
  if (dt == DType::kF32) tol = {2e-5f, 2e-5f};  // fast exp (__expf) and a different sum order
  EXPECT_TRUE(testing::allClose(decode(fromDevice(dOut, want.size()), dt), decode(want, dt), tol,
                                c.heads * c.headDim));
}

TEST_F(T5AttentionCudaTest, Encoder) {
  for (DType dt : kDtypes) {
    run({dt, Mode::kEncoder, 4, 8, 8, 64, 16, 0, 50});        // flan-t5-base-like heads, packed
    run({dt, Mode::kEncoder, 1, 4, 4, 64, 16, 0, 300});       // few blocks: keys split and merged
    run({dt, Mode::kEncoder, 3, 6, 6, 16, 4, 0, 40, 0, 64});  // the fixtures' config
    run({dt, Mode::kEncoder, 8, 12, 12, 64, 16, 0, 200});     // many rows: one split
    run({dt, Mode::kEncoder, 2, 16, 2, 128, 16, 0, 100});     // grouped heads (tiles of 8)
  }
}

TEST_F(T5AttentionCudaTest, Decoder) {
  for (DType dt : kDtypes) {
    run({dt, Mode::kDecoder, 6, 8, 8, 64, 16, 300, 1});       // decode rows, split keys
    run({dt, Mode::kDecoder, 1, 8, 8, 64, 16, 2000, 1});      // one long decode, many splits
    run({dt, Mode::kDecoder, 3, 8, 8, 64, 16, 0, 80});        // first steps (prefill-sized)
    run({dt, Mode::kDecoder, 4, 4, 4, 16, 4, 30, 8, 0, 64});  // the fixtures' config, chunks
    run({dt, Mode::kDecoder, 64, 12, 12, 64, 16, 200, 1});    // a decode batch
  }
}

TEST_F(T5AttentionCudaTest, CrossAttention) {
  for (DType dt : kDtypes) {
    run({dt, Mode::kCross, 6, 8, 8, 64, 16, 50, 1, 200});      // decode rows over the encoder
    run({dt, Mode::kCross, 1, 8, 8, 64, 16, 10, 2, 1500});     // a long encoder output, splits
    run({dt, Mode::kCross, 3, 8, 8, 64, 16, 0, 40, 120});      // first steps of several rows
    run({dt, Mode::kCross, 5, 4, 4, 16, 4, 20, 5, 30});        // the fixtures' head size
    run({dt, Mode::kCross, 64, 12, 12, 64, 16, 100, 1, 400});  // a decode batch
    run({dt, Mode::kCross, 8, 4, 4, 64, 16, 20, 1, 300, 128, /*misalignedCache=*/true});
  }
}

}  // namespace
}  // namespace textgen::kernels
