// The decoder-layer kernels against their CPU references over random shapes and every dtype:
// gather_rows, kv_write and position_embedding bit for bit; rope, the gated activations, gemm and
// paged attention (split-K decode, tensor-core prefill, prefixes, chunks, GQA, sliding windows,
// ALiBi) within the tolerances of tests/support/tolerance.h. With an fp8 KV cache (e4m3fn, e5m2):
// kv_write's codes bit for bit, rope_kv_write's codes those of the keys it rotated, and paged
// attention over fp8 codes within the same tolerances.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "support/tolerance.h"
#include "textgen/kernels/argmax.h"
#include "textgen/kernels/bias_add.h"
#include "textgen/kernels/fp8.h"
#include "textgen/kernels/gated_activation.h"
#include "textgen/kernels/gather_rows.h"
#include "textgen/kernels/gemm_runner.h"
#include "textgen/kernels/kv_write.h"
#include "textgen/kernels/paged_attention.h"
#include "textgen/kernels/position_embedding.h"
#include "textgen/kernels/rope.h"
#include "textgen/kernels/rope_kv_write.h"
#include "textgen/kernels/sample.h"

namespace textgen::kernels {
namespace {

using testing::decode;
using testing::DeviceBuffer;
using testing::encode;
using testing::toleranceFor;

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr KvCacheDType kFp8Caches[] = {KvCacheDType::kFp8E4M3, KvCacheDType::kFp8E5M2};

uint8_t fp8Code(KvCacheDType c, float v) {
  return c == KvCacheDType::kFp8E4M3 ? floatToFp8E4M3(v) : floatToFp8E5M2(v);
}

class OpsCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{1234};
};

std::vector<float> randomValues(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A device copy of host bytes.
std::unique_ptr<DeviceBuffer> toDevice(const void* data, size_t bytes) {
  auto b = std::make_unique<DeviceBuffer>(bytes);
  EXPECT_NE(b->get(), nullptr);
  EXPECT_EQ(cudaMemcpy(b->get(), data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
template <typename T>
std::unique_ptr<DeviceBuffer> toDevice(const std::vector<T>& v) {
  return toDevice(v.data(), v.size() * sizeof(T));
}

std::vector<uint8_t> fromDevice(const DeviceBuffer& b, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), b.get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST_F(OpsCudaTest, GatherRowsCopiesRowsExactly) {
  for (DType dt : kDtypes) {
    for (int64_t width : {1, 7, 64, 4096}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " width " + std::to_string(width));
      const int64_t tableRows = 50, rows = 33;
      const auto table = encode(randomValues(tableRows * width, rng_), dt);
      std::vector<int32_t> ids(rows);
      for (auto& id : ids) id = static_cast<int32_t>(rng_() % tableRows);
      std::vector<uint8_t> want(rows * width * dtypeSize(dt));
      ASSERT_TRUE(
          gatherRowsReference({table.data(), ids.data(), want.data(), rows, width, tableRows, dt})
              .ok());
      auto dTable = toDevice(table), dIds = toDevice(ids);
      DeviceBuffer dOut(want.size());
      ASSERT_TRUE(
          invokeGatherRows(
              {dTable->get(), dIds->as<int32_t>(), dOut.get(), rows, width, tableRows, dt}, nullptr)
              .ok());
      EXPECT_EQ(fromDevice(dOut, want.size()), want);
    }
  }
}

TEST_F(OpsCudaTest, KvWriteScattersRowsToSlotsExactly) {
  for (DType dt : kDtypes) {
    for (int64_t headDim : {8, 64, 128}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " headDim " + std::to_string(headDim));
      const int64_t rows = 40, kvHeads = 2, numSlots = 256, stride = 3 * kvHeads * headDim;
      const auto qkv = encode(randomValues(rows * stride, rng_), dt);
      std::vector<int32_t> slots(numSlots);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng_);
      slots.resize(rows);
      const size_t es = dtypeSize(dt), cacheBytes = numSlots * kvHeads * headDim * es;
      std::vector<uint8_t> kWant(cacheBytes, 0), vWant(cacheBytes, 0);
      const uint8_t* k = qkv.data() + kvHeads * headDim * es;
      const uint8_t* v = k + kvHeads * headDim * es;
      KvWriteParams p{
          k,       v,        stride, kWant.data(), vWant.data(), slots.data(), rows, kvHeads,
          headDim, numSlots, dt};
      ASSERT_TRUE(kvWriteReference(p).ok());
      auto dQkv = toDevice(qkv), dSlots = toDevice(slots);
      DeviceBuffer dk(cacheBytes), dv(cacheBytes);
      cudaMemset(dk.get(), 0, cacheBytes);
      cudaMemset(dv.get(), 0, cacheBytes);
      p.k = dQkv->as<uint8_t>(kvHeads * headDim * es);
      p.v = dQkv->as<uint8_t>(2 * kvHeads * headDim * es);
      p.kCache = dk.get();
      p.vCache = dv.get();
      p.slots = dSlots->as<int32_t>();
      ASSERT_TRUE(invokeKvWrite(p, nullptr).ok());
      EXPECT_EQ(fromDevice(dk, cacheBytes), kWant);
      EXPECT_EQ(fromDevice(dv, cacheBytes), vWant);
    }
  }
}

// Into an fp8 cache: the device's codes (__nv_cvt_float_to_fp8, saturating) equal fp8.h's bit for
// bit, from every dtype, over values reaching past each format's largest finite one.
TEST_F(OpsCudaTest, KvWriteFp8CacheStoresTheReferenceCodesExactly) {
  for (KvCacheDType cache : kFp8Caches) {
    for (DType dt : kDtypes) {
      for (int64_t headDim : {8, 64, 128}) {
        SCOPED_TRACE(std::string(kvCacheDTypeName(cache)) + " from " + std::string(dtypeName(dt)) +
                     " headDim " + std::to_string(headDim));
        const int64_t rows = 40, kvHeads = 2, numSlots = 256, stride = 3 * kvHeads * headDim;
        std::vector<float> values = randomValues(rows * stride, rng_);
        for (size_t i = 0; i < values.size(); i += 7) values[i] *= 1000.0f;  // e4m3 saturates
        for (size_t i = 3; i < values.size(); i += 11) values[i] *= 1e-4f;   // subnormals
        const auto qkv = encode(values, dt);
        std::vector<int32_t> slots(numSlots);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng_);
        slots.resize(rows);
        const size_t es = dtypeSize(dt), cacheBytes = numSlots * kvHeads * headDim;
        std::vector<uint8_t> kWant(cacheBytes, 0), vWant(cacheBytes, 0);
        const uint8_t* k = qkv.data() + kvHeads * headDim * es;
        const uint8_t* v = k + kvHeads * headDim * es;
        KvWriteParams p{.k = k,
                        .v = v,
                        .kvRowStride = stride,
                        .kCache = kWant.data(),
                        .vCache = vWant.data(),
                        .slots = slots.data(),
                        .rows = rows,
                        .numKvHeads = kvHeads,
                        .headDim = headDim,
                        .numSlots = numSlots,
                        .dtype = dt,
                        .cacheDtype = cache};
        ASSERT_TRUE(kvWriteReference(p).ok());
        auto dQkv = toDevice(qkv), dSlots = toDevice(slots);
        DeviceBuffer dk(cacheBytes), dv(cacheBytes);
        TG_ASSERT_CUDA(cudaMemset(dk.get(), 0, cacheBytes));
        TG_ASSERT_CUDA(cudaMemset(dv.get(), 0, cacheBytes));
        p.k = dQkv->as<uint8_t>(kvHeads * headDim * es);
        p.v = dQkv->as<uint8_t>(2 * kvHeads * headDim * es);
        p.kCache = dk.get();
        p.vCache = dv.get();
        p.slots = dSlots->as<int32_t>();
        ASSERT_TRUE(invokeKvWrite(p, nullptr).ok());
        EXPECT_EQ(fromDevice(dk, cacheBytes), kWant);
        EXPECT_EQ(fromDevice(dv, cacheBytes), vWant);
      }
    }
  }
}

TEST_F(OpsCudaTest, RopeMatchesReference) {
  struct Shape {
    int64_t heads, kvHeads, headDim, rotaryDim;
    float theta, scaling;
  };
  const Shape shapes[] = {{4, 2, 64, 64, 10000.0f, 1.0f},
                          {32, 8, 128, 128, 500000.0f, 1.0f},
                          {8, 8, 80, 32, 10000.0f, 1.0f},     // partial rotary
                          {4, 1, 128, 128, 10000.0f, 1.2f}};  // YaRN-style scaling
  for (DType dt : kDtypes) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " headDim " + std::to_string(s.headDim));
      const int64_t rows = 70, stride = (s.heads + 2 * s.kvHeads) * s.headDim,
                    half = s.rotaryDim / 2;
      auto qkv = encode(randomValues(rows * stride, rng_), dt);
      std::vector<int32_t> positions(rows);
      for (auto& p : positions) p = static_cast<int32_t>(rng_() % 32768);
      std::vector<float> invFreq(rows * half);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < half; ++i) {
          invFreq[r * half + i] =
              1.0f / std::pow(s.theta, static_cast<float>(2 * i) / static_cast<float>(s.rotaryDim));
        }
      }
      const size_t es = dtypeSize(dt);
      auto dQkv = toDevice(qkv), dPos = toDevice(positions), dFreq = toDevice(invFreq);
      RopeParams p{.q = qkv.data(),
                   .k = qkv.data() + s.heads * s.headDim * es,
                   .qRowStride = stride,
                   .kRowStride = stride,
                   .invFreq = invFreq.data(),
                   .positions = positions.data(),
                   .rows = rows,
                   .numHeads = s.heads,
                   .numKvHeads = s.kvHeads,
                   .headDim = s.headDim,
                   .rotaryDim = s.rotaryDim,
                   .attentionScaling = s.scaling,
                   .dtype = dt};
      ASSERT_TRUE(ropeReference(p).ok());
      p.q = dQkv->get();
      p.k = dQkv->as<uint8_t>(s.heads * s.headDim * es);
      p.invFreq = dFreq->as<float>();
      p.positions = dPos->as<int32_t>();
      ASSERT_TRUE(invokeRope(p, nullptr).ok());
      EXPECT_TRUE(testing::allClose(decode(fromDevice(*dQkv, qkv.size()), dt), decode(qkv, dt),
                                    toleranceFor(dt), stride));
    }
  }
}

TEST_F(OpsCudaTest, FusedRopeKvWriteMatchesRopeThenKvWrite) {
  struct Shape {
    int64_t heads, kvHeads, headDim, rotaryDim;
  };
  for (DType dt : kDtypes) {
    // Blocks take groups of heads: all query, all key, both (6/3 at 64), one head (256).
    // 37 rows: one rotary pair a thread (decode-sized); 300: eight a thread (prefill-sized).
    for (const int64_t rows : {int64_t{37}, int64_t{300}})
      for (const Shape& s : {Shape{32, 32, 128, 128}, Shape{8, 2, 64, 64}, Shape{4, 2, 80, 32},
                             Shape{6, 3, 64, 64}, Shape{4, 4, 256, 256}}) {
        SCOPED_TRACE(std::string(dtypeName(dt)) + " heads " + std::to_string(s.heads) + "/" +
                     std::to_string(s.kvHeads) + " rotary " + std::to_string(s.rotaryDim) +
                     " rows " + std::to_string(rows));
        const int64_t numSlots = 512, half = s.rotaryDim / 2,
                      stride = (s.heads + 2 * s.kvHeads) * s.headDim,
                      kvWidth = s.kvHeads * s.headDim;
        const size_t es = dtypeSize(dt);
        auto qkv = encode(randomValues(rows * stride, rng_), dt);
        std::vector<int32_t> positions(rows), slots(numSlots);
        for (auto& p : positions) p = static_cast<int32_t>(rng_() % 4096);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng_);
        slots.resize(rows);
        slots[5] = -1;  // a padding row: nothing written
        std::vector<float> invFreq(rows * half);
        for (int64_t i = 0; i < rows * half; ++i)
          invFreq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * (i % half)) / s.rotaryDim);
        const size_t cacheBytes = numSlots * kvWidth * es;
        std::vector<uint8_t> kWant(cacheBytes, 0), vWant(cacheBytes, 0);
        auto dQkv = toDevice(qkv), dPos = toDevice(positions), dFreq = toDevice(invFreq),
             dSlots = toDevice(slots);
        DeviceBuffer dk(cacheBytes), dv(cacheBytes);
        TG_ASSERT_CUDA(cudaMemset(dk.get(), 0, cacheBytes));
        TG_ASSERT_CUDA(cudaMemset(dv.get(), 0, cacheBytes));
        // Reference: rope then kv_write on the host (the padding row skipped, as the device does).
        RopeKvWriteParams p{.rope = {.q = qkv.data(),
                                     .k = qkv.data() + s.heads * s.headDim * es,
                                     .qRowStride = stride,
                                     .kRowStride = stride,
                                     .invFreq = invFreq.data(),
                                     .positions = positions.data(),
                                     .rows = rows,
                                     .numHeads = s.heads,
                                     .numKvHeads = s.kvHeads,
                                     .headDim = s.headDim,
                                     .rotaryDim = s.rotaryDim,
                                     .dtype = dt},
                            .kv = {.k = qkv.data() + s.heads * s.headDim * es,
                                   .v = qkv.data() + (s.heads + s.kvHeads) * s.headDim * es,
                                   .kvRowStride = stride,
                                   .kCache = kWant.data(),
                                   .vCache = vWant.data(),
                                   .slots = slots.data(),
                                   .rows = rows,
                                   .numKvHeads = s.kvHeads,
                                   .headDim = s.headDim,
                                   .numSlots = numSlots,
                                   .dtype = dt}};
        ASSERT_TRUE(ropeReference(p.rope).ok());
        for (int64_t r = 0; r < rows; ++r) {
          if (slots[r] < 0) continue;
          std::memcpy(kWant.data() + slots[r] * kvWidth * es,
                      qkv.data() + (r * stride + s.heads * s.headDim) * es, kvWidth * es);
          std::memcpy(vWant.data() + slots[r] * kvWidth * es,
                      qkv.data() + (r * stride + (s.heads + s.kvHeads) * s.headDim) * es,
                      kvWidth * es);
        }
        RopeKvWriteParams d = p;
        d.rope.q = dQkv->get();
        d.rope.k = dQkv->as<uint8_t>(s.heads * s.headDim * es);
        d.kv.k = d.rope.k;
        d.kv.v = dQkv->as<uint8_t>((s.heads + s.kvHeads) * s.headDim * es);
        d.rope.invFreq = dFreq->as<float>();
        d.rope.positions = dPos->as<int32_t>();
        d.kv.kCache = dk.get();
        d.kv.vCache = dv.get();
        d.kv.slots = dSlots->as<int32_t>();
        ASSERT_TRUE(invokeRopeKvWrite(d, nullptr).ok());
        EXPECT_TRUE(testing::allClose(decode(fromDevice(*dQkv, qkv.size()), dt), decode(qkv, dt),
                                      toleranceFor(dt), stride));
        EXPECT_TRUE(testing::allClose(decode(fromDevice(dk, cacheBytes), dt), decode(kWant, dt),
                                      toleranceFor(dt), kvWidth));
        EXPECT_EQ(fromDevice(dv, cacheBytes), vWant);
      }
  }
}

// More than 256 rows take the kernel of eight rotary pairs a thread, fewer the one of one pair a
// thread: the same arithmetic per element, so a 300-row call must give the bits of the same rows
// in two calls of 150 (q, k, and both caches, in every cache type).
TEST_F(OpsCudaTest, RopeKvWriteOfPrefillRowsEqualsDecodeSizedCallsBitForBit) {
  for (KvCacheDType cache : {KvCacheDType::kAuto, KvCacheDType::kFp8E4M3, KvCacheDType::kFp8E5M2}) {
    for (DType dt : {DType::kF16, DType::kBF16}) {
      for (const auto [heads, kvHeads, headDim, rotaryDim] :
           {std::array<int64_t, 4>{32, 32, 128, 128}, std::array<int64_t, 4>{8, 2, 64, 64},
            std::array<int64_t, 4>{4, 2, 80, 32}, std::array<int64_t, 4>{4, 4, 256, 256}}) {
        SCOPED_TRACE(std::string(kvCacheDTypeName(cache)) + " " + std::string(dtypeName(dt)) +
                     " heads " + std::to_string(heads) + "/" + std::to_string(kvHeads) +
                     " rotary " + std::to_string(rotaryDim));
        const int64_t rows = 300, numSlots = 512, half = rotaryDim / 2,
                      stride = (heads + 2 * kvHeads) * headDim, kvWidth = kvHeads * headDim;
        const size_t es = dtypeSize(dt), cacheEs = cache == KvCacheDType::kAuto ? es : 1;
        const auto qkv = encode(randomValues(rows * stride, rng_, 4.0f), dt);
        std::vector<int32_t> positions(rows), slots(numSlots);
        for (auto& p : positions) p = static_cast<int32_t>(rng_() % 4096);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng_);
        slots.resize(rows);
        slots[7] = -1;  // a padding row
        std::vector<float> invFreq(rows * half);
        for (int64_t i = 0; i < rows * half; ++i)
          invFreq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * (i % half)) / rotaryDim);
        const size_t cacheBytes = numSlots * kvWidth * cacheEs;
        // Run 0: one call of 300 rows; run 1: rows [0, 150) then [150, 300).
        std::vector<uint8_t> outQkv[2], outK[2], outV[2];
        for (int run = 0; run < 2; ++run) {
          auto dQkv = toDevice(qkv), dPos = toDevice(positions), dFreq = toDevice(invFreq),
               dSlots = toDevice(slots);
          DeviceBuffer dk(cacheBytes), dv(cacheBytes);
          TG_ASSERT_CUDA(cudaMemset(dk.get(), 0, cacheBytes));
          TG_ASSERT_CUDA(cudaMemset(dv.get(), 0, cacheBytes));
          for (const auto& [first, n] :
               run == 0 ? std::vector<std::pair<int64_t, int64_t>>{{0, 300}}
                        : std::vector<std::pair<int64_t, int64_t>>{{0, 150}, {150, 150}}) {
            uint8_t* base = dQkv->as<uint8_t>(first * stride * es);
            RopeKvWriteParams d{.rope = {.q = base,
                                         .k = base + heads * headDim * es,
                                         .qRowStride = stride,
                                         .kRowStride = stride,
                                         .invFreq = dFreq->as<float>() + first * half,
                                         .positions = dPos->as<int32_t>() + first,
                                         .rows = n,
                                         .numHeads = heads,
                                         .numKvHeads = kvHeads,
                                         .headDim = headDim,
                                         .rotaryDim = rotaryDim,
                                         .dtype = dt},
                                .kv = {.k = base + heads * headDim * es,
                                       .v = base + (heads + kvHeads) * headDim * es,
                                       .kvRowStride = stride,
                                       .kCache = dk.get(),
                                       .vCache = dv.get(),
                                       .slots = dSlots->as<int32_t>() + first,
                                       .rows = n,
                                       .numKvHeads = kvHeads,
                                       .headDim = headDim,
                                       .numSlots = numSlots,
                                       .dtype = dt,
                                       .cacheDtype = cache}};
            ASSERT_TRUE(invokeRopeKvWrite(d, nullptr).ok());
          }
          outQkv[run] = fromDevice(*dQkv, qkv.size());
          outK[run] = fromDevice(dk, cacheBytes);
          outV[run] = fromDevice(dv, cacheBytes);
        }
        EXPECT_NE(outQkv[0], qkv);  // rotated at all
        EXPECT_EQ(outQkv[0], outQkv[1]);
        EXPECT_EQ(outK[0], outK[1]);
        EXPECT_EQ(outV[0], outV[1]);
      }
    }
  }
}

// Into an fp8 cache: each written key code is the code of the key the kernel rotated (its k rows,
// compared with the host's within the dtype's tolerance), each value code the value's, bit for bit.
TEST_F(OpsCudaTest, FusedRopeKvWriteFp8CacheStoresTheCodesOfTheRotatedKeys) {
  for (KvCacheDType cache : kFp8Caches) {
    for (DType dt : kDtypes) {
      // Whole and partial rotary, heads split over blocks and not (decode-sized: the prefill-sized
      // kernel is checked against this one bit for bit below).
      for (const int64_t rows : {int64_t{21}})
        for (const auto [heads, kvHeads, headDim, rotaryDim] :
             {std::array<int64_t, 4>{8, 2, 64, 64}, std::array<int64_t, 4>{4, 2, 80, 32},
              std::array<int64_t, 4>{4, 4, 256, 256}}) {
          SCOPED_TRACE(std::string(kvCacheDTypeName(cache)) + " " + std::string(dtypeName(dt)) +
                       " heads " + std::to_string(heads) + "/" + std::to_string(kvHeads) +
                       " rotary " + std::to_string(rotaryDim));
          const int64_t numSlots = 64, half = rotaryDim / 2,
                        stride = (heads + 2 * kvHeads) * headDim, kvWidth = kvHeads * headDim;
          const size_t es = dtypeSize(dt);
          const auto qkv = encode(randomValues(rows * stride, rng_, 4.0f), dt);
          std::vector<int32_t> positions(rows), slots(numSlots);
          for (auto& p : positions) p = static_cast<int32_t>(rng_() % 4096);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng_);
          slots.resize(rows);
          slots[2] = -1;  // a padding row: nothing written
          std::vector<float> invFreq(rows * half);
          for (int64_t i = 0; i < rows * half; ++i)
            invFreq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * (i % half)) / rotaryDim);
          auto rotated = qkv;  // the host's rotation, for the device's k rows
          RopeParams hostRope{.q = rotated.data(),
                              .k = rotated.data() + heads * headDim * es,
                              .qRowStride = stride,
                              .kRowStride = stride,
                              .invFreq = invFreq.data(),
                              .positions = positions.data(),
                              .rows = rows,
                              .numHeads = heads,
                              .numKvHeads = kvHeads,
                              .headDim = headDim,
                              .rotaryDim = rotaryDim,
                              .dtype = dt};
          ASSERT_TRUE(ropeReference(hostRope).ok());
          const size_t cacheBytes = numSlots * kvWidth;
          auto dQkv = toDevice(qkv), dPos = toDevice(positions), dFreq = toDevice(invFreq),
               dSlots = toDevice(slots);
          DeviceBuffer dk(cacheBytes), dv(cacheBytes);
          TG_ASSERT_CUDA(cudaMemset(dk.get(), 0, cacheBytes));
          TG_ASSERT_CUDA(cudaMemset(dv.get(), 0, cacheBytes));
          RopeKvWriteParams d{.rope = hostRope,
                              .kv = {.kvRowStride = stride,
                                     .kCache = dk.get(),
                                     .vCache = dv.get(),
                                     .slots = dSlots->as<int32_t>(),
                                     .rows = rows,
                                     .numKvHeads = kvHeads,
                                     .headDim = headDim,
                                     .numSlots = numSlots,
                                     .dtype = dt,
                                     .cacheDtype = cache}};
          d.rope.q = dQkv->get();
          d.rope.k = dQkv->as<uint8_t>(heads * headDim * es);
          d.rope.invFreq = dFreq->as<float>();
          d.rope.positions = dPos->as<int32_t>();
          d.kv.k = d.rope.k;
          d.kv.v = dQkv->as<uint8_t>((heads + kvHeads) * headDim * es);
          ASSERT_TRUE(invokeRopeKvWrite(d, nullptr).ok());
          const auto deviceQkv = fromDevice(*dQkv, qkv.size());
          EXPECT_TRUE(testing::allClose(decode(deviceQkv, dt), decode(rotated, dt),
                                        toleranceFor(dt), stride));
          const std::vector<float> rows32 = decode(deviceQkv, dt);
          const auto kc = fromDevice(dk, cacheBytes), vc = fromDevice(dv, cacheBytes);
          std::vector<bool> written(numSlots, false);
          for (int64_t r = 0; r < rows; ++r) {
            if (slots[r] < 0) continue;
            written[slots[r]] = true;
            for (int64_t i = 0; i < kvWidth; ++i) {
              const float k = rows32[r * stride + heads * headDim + i];
              const float v = rows32[r * stride + (heads + kvHeads) * headDim + i];
              ASSERT_EQ(kc[slots[r] * kvWidth + i], fp8Code(cache, k)) << "row " << r << " " << i;
              ASSERT_EQ(vc[slots[r] * kvWidth + i], fp8Code(cache, v)) << "row " << r << " " << i;
            }
          }
          for (int64_t s = 0; s < numSlots; ++s) {
            for (int64_t i = 0; !written[s] && i < kvWidth; ++i) {
              ASSERT_EQ(kc[s * kvWidth + i], 0) << "slot " << s;
              ASSERT_EQ(vc[s * kvWidth + i], 0) << "slot " << s;
            }
          }
        }
    }
  }
}

TEST_F(OpsCudaTest, ArgmaxPicksTheLowestIndexOfTheMaximumAndItsLogprob) {
  for (DType dt : kDtypes) {
    for (int64_t vocab : {7, 1000, 32000, 128256}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " vocab " + std::to_string(vocab));
      const int64_t rows = 5;
      auto values = randomValues(rows * vocab, rng_, 3.0f);
      // Row 1: a tie for the maximum (the lower index wins); row 2: the maximum last.
      values[vocab + 3] = values[vocab + vocab - 1] = 50.0f;
      values[2 * vocab + vocab - 1] = 60.0f;
      const auto logits = encode(values, dt);
      std::vector<int32_t> wantIds(rows);
      std::vector<float> wantLp(rows);
      ASSERT_TRUE(
          argmaxReference({logits.data(), wantIds.data(), wantLp.data(), rows, vocab, dt}).ok());
      auto dLogits = toDevice(logits);
      DeviceBuffer dIds(rows * 4), dLp(rows * 4);
      ASSERT_TRUE(
          invokeArgmax({dLogits->get(), dIds.as<int32_t>(), dLp.as<float>(), rows, vocab, dt},
                       nullptr)
              .ok());
      const auto ids = fromDevice(dIds, rows * 4), lp = fromDevice(dLp, rows * 4);
      for (int64_t r = 0; r < rows; ++r) {
        int32_t id;
        float l;
        std::memcpy(&id, ids.data() + 4 * r, 4);
        std::memcpy(&l, lp.data() + 4 * r, 4);
        EXPECT_EQ(id, wantIds[r]) << "row " << r;
        EXPECT_NEAR(l, wantLp[r], 1e-5 + 1e-5 * std::fabs(wantLp[r])) << "row " << r;
      }
      EXPECT_EQ(wantIds[1], 3);
      EXPECT_EQ(wantIds[2], vocab - 1);
    }
  }
}

TEST_F(OpsCudaTest, SampleChoosesAsTheHostSampler) {
  // Rows covering every processor alone and together, greedy and sampled, with top-n; logits
  // rounded to each dtype (bfloat16 makes many exact ties, which the top-p/typical-p searches must
  // settle in the host's order).
  std::vector<SampleRow> kinds;
  auto row = [](float temp, int k, float topP, float typ, bool sample, float rep, float freq,
                int n) {
    SampleRow r;
    r.temperature = temp;
    r.topK = k;
    r.topP = topP;
    r.typicalP = typ;
    r.doSample = sample ? 1 : 0;
    r.repetitionPenalty = rep;
    r.frequencyPenalty = freq;
    r.topN = n;
    return r;
  };
  kinds.push_back(row(1, 0, 1, 1, false, 1, 0, 0));                  // greedy
  kinds.push_back(row(1, 0, 1, 1, false, 1.3f, 0.4f, 3));            // greedy with penalties, top-n
  kinds.push_back(row(0.7f, 0, 1, 1, true, 1, 0, 0));                // temperature
  kinds.push_back(row(1, 40, 1, 1, true, 1, 0, 2));                  // top-k
  kinds.push_back(row(1, 0, 0.9f, 1, true, 1, 0, 0));                // top-p
  kinds.push_back(row(1, 0, 1, 0.8f, true, 1, 0, 5));                // typical-p
  kinds.push_back(row(0.8f, 50, 0.95f, 0.9f, true, 1.2f, 0.3f, 4));  // everything
  constexpr int64_t kMaxTopN = 5;
  for (DType dt : kDtypes) {
    for (int64_t vocab : {1000, 32000}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " vocab " + std::to_string(vocab));
      const int64_t reps = 6;  // each kind several times with other logits and draws
      const auto rows = static_cast<int64_t>(kinds.size()) * reps;
      const auto logits = encode(randomValues(rows * vocab, rng_, 2.5f), dt);
      std::vector<SampleRow> params;
      std::vector<int32_t> hist, counts, biasTok;
      std::vector<float> biasVal;
      std::vector<uint32_t> masks;  // constrained rows: a third of the tokens allowed
      std::uniform_real_distribution<double> u01(0.0, 1.0);
      for (int64_t r = 0; r < rows; ++r) {
        SampleRow p = kinds[r % kinds.size()];
        p.uniform = u01(rng_);
        p.historyBegin = static_cast<int32_t>(hist.size());
        for (int i = 0; i < 20; ++i) {  // distinct tokens
          hist.push_back(static_cast<int32_t>((r * 131 + i * 37) % vocab));
          counts.push_back(1 + i % 3);
        }
        p.historyEnd = static_cast<int32_t>(hist.size());
        p.biasBegin = static_cast<int32_t>(biasTok.size());
        if (r % 2 == 0) {
          biasTok.push_back(static_cast<int32_t>((r * 7) % vocab));
          biasVal.push_back(2.0f);
        }
        p.biasEnd = static_cast<int32_t>(biasTok.size());
        if (r % 3 == 1) p.presencePenalty = 0.25f;
        if (r % 3 == 0) {
          p.maskBegin = static_cast<int64_t>(masks.size());
          for (int64_t w = 0; w < (vocab + 31) / 32; ++w) {
            uint32_t bits = 0;
            for (int b = 0; b < 32; ++b) bits |= (u01(rng_) < 0.33 ? 1u : 0u) << b;
            masks.push_back(bits);
          }
        }
        if (r % 4 == 1) {  // watermarked rows: half the tokens green, a large delta
          p.greenBegin = static_cast<int64_t>(masks.size());
          p.greenDelta = 4.0f;
          for (int64_t w = 0; w < (vocab + 31) / 32; ++w) {
            uint32_t bits = 0;
            for (int b = 0; b < 32; ++b) bits |= (u01(rng_) < 0.5 ? 1u : 0u) << b;
            masks.push_back(bits);
          }
        }
        params.push_back(p);
      }
      std::vector<float> work(rows * vocab);
      std::vector<int32_t> ids(rows), topIds(rows * kMaxTopN, -1);
      std::vector<float> lps(rows), topLps(rows * kMaxTopN);
      SampleParams ref{.logits = logits.data(),
                       .rowParams = params.data(),
                       .historyTokens = hist.data(),
                       .historyCounts = counts.data(),
                       .biasTokens = biasTok.data(),
                       .biasValues = biasVal.data(),
                       .masks = masks.data(),
                       .work = work.data(),
                       .ids = ids.data(),
                       .logprobs = lps.data(),
                       .topIds = topIds.data(),
                       .topLogprobs = topLps.data(),
                       .rows = rows,
                       .vocab = vocab,
                       .maxTopN = kMaxTopN,
                       .dtype = dt};
      ASSERT_TRUE(sampleReference(ref).ok());
      auto dLogits = toDevice(logits),
           dParams = toDevice(params.data(), params.size() * sizeof(SampleRow)),
           dHist = toDevice(hist), dCounts = toDevice(counts),
           dBiasTok = toDevice(biasTok.empty() ? std::vector<int32_t>{0} : biasTok),
           dBiasVal = toDevice(biasVal.empty() ? std::vector<float>{0} : biasVal),
           dMasks = toDevice(masks);
      DeviceBuffer dWork(rows * vocab * 4), dProbs(rows * vocab * 8), dIds(rows * 4),
          dLps(rows * 4), dTopIds(rows * kMaxTopN * 4), dTopLps(rows * kMaxTopN * 4);
      SampleParams dev = ref;
      dev.logits = dLogits->get();
      dev.rowParams = dParams->as<SampleRow>();
      dev.historyTokens = dHist->as<int32_t>();
      dev.historyCounts = dCounts->as<int32_t>();
      dev.biasTokens = dBiasTok->as<int32_t>();
      dev.biasValues = dBiasVal->as<float>();
      dev.masks = dMasks->as<uint32_t>();
      dev.work = dWork.as<float>();
      dev.probs = dProbs.as<double>();
      dev.ids = dIds.as<int32_t>();
      dev.logprobs = dLps.as<float>();
      dev.topIds = dTopIds.as<int32_t>();
      dev.topLogprobs = dTopLps.as<float>();
      ASSERT_TRUE(invokeSample(dev, nullptr).ok());
      std::vector<int32_t> gotIds(rows), gotTop(rows * kMaxTopN);
      std::vector<float> gotLps(rows), gotTopLps(rows * kMaxTopN);
      auto copyBack = [](void* dst, const DeviceBuffer& b, size_t bytes) {
        const auto v = fromDevice(b, bytes);
        std::memcpy(dst, v.data(), bytes);
      };
      copyBack(gotIds.data(), dIds, rows * 4);
      copyBack(gotLps.data(), dLps, rows * 4);
      copyBack(gotTop.data(), dTopIds, rows * kMaxTopN * 4);
      copyBack(gotTopLps.data(), dTopLps, rows * kMaxTopN * 4);
      for (int64_t r = 0; r < rows; ++r) {
        SCOPED_TRACE("row " + std::to_string(r) + " kind " + std::to_string(r % kinds.size()));
        EXPECT_EQ(gotIds[r], ids[r]);
        if (params[r].maskBegin >= 0) {  // the choice is one the mask allows
          const uint32_t id = static_cast<uint32_t>(ids[r]);
          EXPECT_TRUE(masks[params[r].maskBegin + id / 32] >> (id % 32) & 1u);
        }
        EXPECT_NEAR(gotLps[r], lps[r], 1e-4 + 1e-5 * std::fabs(lps[r]));
        for (int j = 0; j < params[r].topN; ++j) {
          EXPECT_EQ(gotTop[r * kMaxTopN + j], topIds[r * kMaxTopN + j]) << "top " << j;
          const float got = gotTopLps[r * kMaxTopN + j], want = topLps[r * kMaxTopN + j];
          if (got != want) {  // equal covers -inf on both sides
            EXPECT_NEAR(got, want, 1e-4) << "top " << j;
          }
        }
      }
    }
  }
}

// Every activation, vectorised (n a multiple of 16 bytes) and not; SiLU as before the op was
// generalised (the same kernel code for it).
TEST_F(OpsCudaTest, GatedActivationMatchesReference) {
  for (Activation act :
       {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kRelu}) {
    for (DType dt : kDtypes) {
      for (int64_t n : {1, 13, 256, 11008}) {
        SCOPED_TRACE(std::string(toString(act)) + " " + std::string(dtypeName(dt)) + " n " +
                     std::to_string(n));
        const int64_t rows = 9;
        const auto gateUp = encode(randomValues(rows * 2 * n, rng_, 3.0f), dt);
        std::vector<uint8_t> want(rows * n * dtypeSize(dt));
        ASSERT_TRUE(gatedActivationReference({.gateUp = gateUp.data(),
                                              .out = want.data(),
                                              .rows = rows,
                                              .n = n,
                                              .dtype = dt,
                                              .activation = act})
                        .ok());
        auto dIn = toDevice(gateUp);
        DeviceBuffer dOut(want.size());
        ASSERT_TRUE(invokeGatedActivation({.gateUp = dIn->get(),
                                           .out = dOut.get(),
                                           .rows = rows,
                                           .n = n,
                                           .dtype = dt,
                                           .activation = act},
                                          nullptr)
                        .ok());
        EXPECT_TRUE(testing::allClose(decode(fromDevice(dOut, want.size()), dt), decode(want, dt),
                                      toleranceFor(dt), n));
      }
    }
  }
}

// Not gated (the plain MLPs of GPT-NeoX, Falcon, BLOOM, OPT, MPT, BigCode): act(x) in place.
TEST_F(OpsCudaTest, ActivationNotGatedMatchesReferenceInPlace) {
  for (Activation act :
       {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kRelu}) {
    for (DType dt : kDtypes) {
      for (int64_t n : {1, 13, 256, 16384}) {
        SCOPED_TRACE(std::string(toString(act)) + " " + std::string(dtypeName(dt)) + " n " +
                     std::to_string(n));
        const int64_t rows = 7;
        auto want = encode(randomValues(rows * n, rng_, 3.0f), dt);
        auto dx = toDevice(want);
        ASSERT_TRUE(gatedActivationReference({.gateUp = want.data(),
                                              .out = want.data(),
                                              .rows = rows,
                                              .n = n,
                                              .dtype = dt,
                                              .activation = act,
                                              .gated = false})
                        .ok());
        ASSERT_TRUE(invokeGatedActivation({.gateUp = dx->get(),
                                           .out = dx->get(),
                                           .rows = rows,
                                           .n = n,
                                           .dtype = dt,
                                           .activation = act,
                                           .gated = false},
                                          nullptr)
                        .ok());
        EXPECT_TRUE(testing::allClose(decode(fromDevice(*dx, want.size()), dt), decode(want, dt),
                                      toleranceFor(dt), n));
      }
    }
  }
}

// Medusa's residual blocks: residual + act(x), act rounded first, in place over x.
TEST_F(OpsCudaTest, ActivationWithResidualMatchesReference) {
  for (DType dt : kDtypes) {
    for (int64_t n : {1, 13, 256, 4096}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " n " + std::to_string(n));
      const int64_t rows = 5;
      auto want = encode(randomValues(rows * n, rng_, 3.0f), dt);
      const auto res = encode(randomValues(rows * n, rng_, 3.0f), dt);
      auto dx = toDevice(want);
      auto dr = toDevice(res);
      ASSERT_TRUE(gatedActivationReference({.gateUp = want.data(),
                                            .out = want.data(),
                                            .rows = rows,
                                            .n = n,
                                            .dtype = dt,
                                            .activation = Activation::kSilu,
                                            .gated = false,
                                            .residual = res.data()})
                      .ok());
      ASSERT_TRUE(invokeGatedActivation({.gateUp = dx->get(),
                                         .out = dx->get(),
                                         .rows = rows,
                                         .n = n,
                                         .dtype = dt,
                                         .activation = Activation::kSilu,
                                         .gated = false,
                                         .residual = dr->get()},
                                        nullptr)
                      .ok());
      EXPECT_TRUE(testing::allClose(decode(fromDevice(*dx, want.size()), dt), decode(want, dt),
                                    toleranceFor(dt), n));
    }
  }
}

TEST_F(OpsCudaTest, BiasAddMatchesReference) {
  for (DType dt : kDtypes) {
    for (int64_t out : {1, 13, 4096}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " out " + std::to_string(out));
      const int64_t rows = 5;
      auto want = encode(randomValues(rows * out, rng_, 2.0f), dt);
      const auto bias = encode(randomValues(out, rng_, 1.0f), dt);
      auto dy = toDevice(want);
      auto db = toDevice(bias);
      ASSERT_TRUE(biasAddReference({want.data(), bias.data(), rows, out, dt}).ok());
      ASSERT_TRUE(invokeBiasAdd({dy->get(), db->get(), rows, out, dt}, nullptr).ok());
      EXPECT_TRUE(testing::allClose(decode(fromDevice(*dy, want.size()), dt), decode(want, dt),
                                    toleranceFor(dt), out));
    }
  }
}

TEST_F(OpsCudaTest, PositionEmbeddingAddsTableRowsExactly) {
  for (DType dt : kDtypes) {
    for (int64_t width : {1, 7, 64, 768, 4096}) {
      for (bool misaligned : {false, true}) {  // offset x by one element: the scalar path
        SCOPED_TRACE(std::string(dtypeName(dt)) + " width " + std::to_string(width) +
                     (misaligned ? " misaligned" : ""));
        const int64_t rows = 37, tableRows = 130, offset = 2, maxPosition = 127;
        const size_t es = dtypeSize(dt), off = misaligned ? es : 0;
        auto want = encode(randomValues(rows * width, rng_), dt);
        const auto table = encode(randomValues(tableRows * width, rng_, 0.5f), dt);
        std::vector<int32_t> positions(rows);
        for (auto& pos : positions) pos = static_cast<int32_t>(rng_() % (maxPosition + 1));
        positions[0] = 0;
        positions[1] = maxPosition;
        std::vector<uint8_t> padded(off + want.size());
        std::memcpy(padded.data() + off, want.data(), want.size());
        auto dx = toDevice(padded);
        auto dTable = toDevice(table), dPos = toDevice(positions);
        PositionEmbeddingParams p{.x = want.data(),
                                  .table = table.data(),
                                  .positions = positions.data(),
                                  .rows = rows,
                                  .width = width,
                                  .tableRows = tableRows,
                                  .offset = offset,
                                  .maxPosition = maxPosition,
                                  .dtype = dt};
        ASSERT_TRUE(positionEmbeddingReference(p).ok());
        p.x = dx->as<uint8_t>(off);
        p.table = dTable->get();
        p.positions = dPos->as<int32_t>();
        ASSERT_TRUE(invokePositionEmbedding(p, nullptr).ok());
        const auto got = fromDevice(*dx, padded.size());
        EXPECT_EQ(std::vector<uint8_t>(got.begin() + off, got.end()), want);
      }
    }
  }
}

TEST_F(OpsCudaTest, PositionEmbeddingOutsideTheTableLeavesTheRow) {
  // maxPosition is a promise the caller keeps; a position breaking it must not read out of bounds.
  const int64_t width = 64, tableRows = 4;
  const auto x = encode(randomValues(3 * width, rng_), DType::kF32);
  const auto table = encode(randomValues(tableRows * width, rng_), DType::kF32);
  const std::vector<int32_t> positions{1, 1000000, -5};
  auto dx = toDevice(x), dTable = toDevice(table), dPos = toDevice(positions);
  PositionEmbeddingParams p{.x = dx->get(),
                            .table = dTable->get(),
                            .positions = dPos->as<int32_t>(),
                            .rows = 3,
                            .width = width,
                            .tableRows = tableRows,
                            .offset = 2,
                            .maxPosition = 1};
  ASSERT_TRUE(invokePositionEmbedding(p, nullptr).ok());
  const auto got = decode(fromDevice(*dx, x.size()), DType::kF32);
  const auto before = decode(x, DType::kF32), rows = decode(table, DType::kF32);
  for (int64_t i = 0; i < width; ++i) {
    EXPECT_EQ(got[i], before[i] + rows[3 * width + i]);
    EXPECT_EQ(got[width + i], before[width + i]);
    EXPECT_EQ(got[2 * width + i], before[2 * width + i]);
  }
  p.maxPosition = 2;  // 2 + offset 2 is outside a 4-row table: refused before launch
  EXPECT_EQ(invokePositionEmbedding(p, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(OpsCudaTest, GemmMatchesReference) {
  auto runner = GemmRunner::create(nullptr, 32u << 20);
  ASSERT_TRUE(runner.ok()) << runner.status();
  struct Shape {
    int64_t rows, in, out;
  };
  for (DType dt : kDtypes) {
    // One row takes the gemv kernel in 16-bit dtypes, more take cuBLASLt.
    for (const Shape& s :
         {Shape{1, 64, 96}, Shape{3, 4096, 300}, Shape{7, 512, 1000}, Shape{8, 1000, 33},
          Shape{9, 256, 128}, Shape{64, 1024, 384}, Shape{300, 256, 1024},
          // One row on the gemv kernel: Llama's o and down projections, an odd count of outputs
          // (a block past the end) and long rows.
          Shape{1, 4096, 4096}, Shape{1, 11008, 4096}, Shape{1, 1000, 33}, Shape{1, 4104, 9000},
          // Rows of 2048 (4 warps a row) and 1000 (2).
          Shape{1, 2048, 300}, Shape{1, 1000, 700}}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.in) + "x" + std::to_string(s.out));
      // Weights scaled as real ones are (outputs of unit scale).
      const auto x = encode(randomValues(s.rows * s.in, rng_), dt);
      const auto w =
          encode(randomValues(s.out * s.in, rng_, 1.0f / std::sqrt(static_cast<float>(s.in))), dt);
      std::vector<uint8_t> want(s.rows * s.out * dtypeSize(dt));
      ASSERT_TRUE(gemmReference({x.data(), w.data(), want.data(), s.rows, s.in, s.out, dt}).ok());
      auto dx = toDevice(x), dw = toDevice(w);
      DeviceBuffer dy(want.size());
      ASSERT_TRUE((*runner)->run({dx->get(), dw->get(), dy.get(), s.rows, s.in, s.out, dt}).ok());
      testing::Tolerance tol = toleranceFor(dt);
      if (dt == DType::kF32) tol = {2e-5f, 2e-5f};  // summation order over `in` terms
      EXPECT_TRUE(
          testing::allClose(decode(fromDevice(dy, want.size()), dt), decode(want, dt), tol, s.out));
    }
  }
}

// The gemv kernel on up to 8 rows (speculative decoding's verification rows): each row equals, bit
// for bit, a one-row call on it.
TEST_F(OpsCudaTest, GemvRowsEqualOneRowCalls) {
  auto runner = GemmRunner::create(nullptr, 32u << 20);
  ASSERT_TRUE(runner.ok()) << runner.status();
  (*runner)->setGemvRows(8);
  struct Shape {
    int64_t rows, in, out;
  };
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (const Shape& s : {Shape{5, 4096, 4096}, Shape{8, 11008, 300}, Shape{3, 1000, 9000},
                           Shape{2, 4104, 4224}, Shape{8, 64, 33}, Shape{6, 2048, 130}}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.in) + "x" + std::to_string(s.out));
      const size_t es = dtypeSize(dt);
      const auto x = encode(randomValues(s.rows * s.in, rng_), dt);
      const auto w =
          encode(randomValues(s.out * s.in, rng_, 1.0f / std::sqrt(static_cast<float>(s.in))), dt);
      auto dx = toDevice(x), dw = toDevice(w);
      DeviceBuffer all(s.rows * s.out * es), one(s.out * es);
      ASSERT_TRUE((*runner)->run({dx->get(), dw->get(), all.get(), s.rows, s.in, s.out, dt}).ok());
      const std::vector<uint8_t> together = fromDevice(all, s.rows * s.out * es);
      for (int64_t r = 0; r < s.rows; ++r) {
        const void* xr = static_cast<const uint8_t*>(dx->get()) + r * s.in * es;
        ASSERT_TRUE((*runner)->run({xr, dw->get(), one.get(), 1, s.in, s.out, dt}).ok());
        const std::vector<uint8_t> alone = fromDevice(one, s.out * es);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin() + r * s.out * es))
            << "row " << r;
      }
    }
  }
}

// The gemv kernel's gated epilogue (the gated MLP's gate/up GEMM and activation in one kernel)
// gives the bits of the gemv kernel followed by the gated activation kernel, on every row count the
// gemv takes, and is refused where it does not take the shape.
TEST_F(OpsCudaTest, GemvGatedEqualsGemvThenActivation) {
  auto runner = GemmRunner::create(nullptr, 32u << 20);
  ASSERT_TRUE(runner.ok()) << runner.status();
  (*runner)->setGemvRows(8);
  struct Shape {
    int64_t rows, in, n;  // W is [2n, in]
  };
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (Activation a :
         {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kRelu}) {
      // Widths taking 1, 2, 4 and 8 warps a row (64/512, 1000, 2048, 4096 and up); an odd n (a
      // pair past the end); 1 to 8 rows.
      for (const Shape& s :
           {Shape{1, 4096, 1000}, Shape{3, 1000, 333}, Shape{8, 4104, 96}, Shape{1, 64, 17},
            Shape{5, 11008, 40}, Shape{2, 256, 8}, Shape{1, 512, 129}, Shape{4, 2048, 65}}) {
        SCOPED_TRACE(std::string(dtypeName(dt)) + " " + std::string(toString(a)) + " " +
                     std::to_string(s.rows) + "x" + std::to_string(s.in) + "x" +
                     std::to_string(s.n));
        const size_t es = dtypeSize(dt);
        const int64_t out = 2 * s.n;
        const auto x = encode(randomValues(s.rows * s.in, rng_), dt);
        // Outputs of about unit scale and either sign: every activation's range matters.
        const auto w =
            encode(randomValues(out * s.in, rng_, 2.0f / std::sqrt(static_cast<float>(s.in))), dt);
        auto dx = toDevice(x), dw = toDevice(w);
        DeviceBuffer gateUp(s.rows * out * es), twoKernels(s.rows * s.n * es),
            oneKernel(s.rows * s.n * es);
        const GemmParams p{dx->get(), dw->get(), gateUp.get(), s.rows, s.in, out, dt};
        ASSERT_TRUE((*runner)->takesGated(p));
        ASSERT_TRUE((*runner)->run(p).ok());
        ASSERT_TRUE(invokeGatedActivation({.gateUp = gateUp.get(),
                                           .out = twoKernels.get(),
                                           .rows = s.rows,
                                           .n = s.n,
                                           .dtype = dt,
                                           .activation = a},
                                          nullptr)
                        .ok());
        GemmParams fused = p;
        fused.y = oneKernel.get();
        ASSERT_TRUE((*runner)->runGated(fused, a).ok());
        const auto want = fromDevice(twoKernels, s.rows * s.n * es);
        const auto got = fromDevice(oneKernel, s.rows * s.n * es);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin()));
      }
    }
  }
  // Refused where the gemv kernel does not take the shape: more rows than it takes, an odd number
  // of rows in W, float32, unaligned x.
  const auto x = encode(randomValues(16 * 64, rng_), DType::kBF16);
  const auto w = encode(randomValues(34 * 64, rng_), DType::kBF16);
  auto dx = toDevice(x), dw = toDevice(w);
  DeviceBuffer y(16 * 34 * 2);
  const GemmParams ok{dx->get(), dw->get(), y.get(), 8, 64, 34, DType::kBF16};
  EXPECT_TRUE((*runner)->takesGated(ok));
  for (int c = 0; c < 4; ++c) {
    SCOPED_TRACE(c);
    GemmParams bad = ok;
    switch (c) {
      case 0: bad.rows = 9; break;
      case 1: bad.out = 33; break;
      case 2: bad.dtype = DType::kF32; break;
      case 3: bad.x = static_cast<const uint8_t*>(dx->get()) + 2; break;
    }
    EXPECT_FALSE((*runner)->takesGated(bad));
    EXPECT_EQ((*runner)->runGated(bad, Activation::kSilu).code(), StatusCode::kUnimplemented);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

struct AttentionCase {
  DType dtype;
  int64_t numSeqs, heads, kvHeads, headDim, blockSize, window;
  int64_t maxStart,
      maxRows;         // per sequence: cached positions in [0, maxStart], new rows in [1, maxRows]
  bool alibi = false;  // slopes 2^(-8 (h + 1) / heads) (BLOOM for 2^n heads), reversed
  // > 0: Falcon's ALiBi, bf16(slope * j) / this (PagedAttentionParams::alibiBf16Divisor).
  float alibiBf16Divisor = 0.0f;
  KvCacheDType cache = KvCacheDType::kAuto;  // fp8: the cache holds codes of random values
  // > 0: maxContext as a decode graph passes it (the model's whole context, past every row's), and
  // the output must equal, bit for bit, the same call with the batch's own longest context.
  int64_t graphContext = 0;
  int64_t qPad = 0;    // elements past a fused qkv row (q's rows that much further apart)
  bool causal = true;  // false: every row sees its sequence's whole context (no window, no ALiBi)
};

std::string describe(const AttentionCase& c) {
  return std::string(dtypeName(c.dtype)) + " seqs=" + std::to_string(c.numSeqs) +
         " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kvHeads) +
         " headDim=" + std::to_string(c.headDim) + " block=" + std::to_string(c.blockSize) +
         " window=" + std::to_string(c.window) + " maxStart=" + std::to_string(c.maxStart) +
         " maxRows=" + std::to_string(c.maxRows) + (c.alibi ? " alibi" : "") +
         (c.alibiBf16Divisor > 0 ? " falcon" : "") + (c.qPad > 0 ? " qPad" : "") +
         (c.causal ? "" : " non-causal") + " cache=" + std::string(kvCacheDTypeName(c.cache));
}

void runAttention(const AttentionCase& c, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  const DType dt = c.dtype;
  const size_t es = dtypeSize(dt);
  std::vector<int32_t> seqStarts{0}, startPos;
  int64_t rows = 0, maxNewRows = 0, maxContext = 0, maxBlocks = 0, minNewRows = 0;
  for (int64_t s = 0; s < c.numSeqs; ++s) {
    const auto start = static_cast<int32_t>(rng() % (c.maxStart + 1));
    const auto n = static_cast<int32_t>(1 + rng() % c.maxRows);
    startPos.push_back(start);
    rows += n;
    seqStarts.push_back(static_cast<int32_t>(rows));
    maxNewRows = std::max<int64_t>(maxNewRows, n);
    minNewRows = minNewRows == 0 ? n : std::min<int64_t>(minNewRows, n);
    maxContext = std::max<int64_t>(maxContext, start + n);
    maxBlocks = std::max<int64_t>(maxBlocks, (start + n + c.blockSize - 1) / c.blockSize);
  }
  // Every sequence gets maxBlocks distinct blocks from a shuffled pool, plus spare blocks.
  const int64_t numBlocks = c.numSeqs * maxBlocks + 3;
  std::vector<int32_t> pool(numBlocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(pool.begin(), pool.begin() + c.numSeqs * maxBlocks);
  const int64_t numSlots = numBlocks * c.blockSize, kvWidth = c.kvHeads * c.headDim;
  // q inside a fused qkv row, as the model lays it out.
  const int64_t qStride = (c.heads + 2 * c.kvHeads) * c.headDim + c.qPad;
  const auto q = encode(randomValues(rows * qStride, rng), dt);
  auto cacheOf = [&](const std::vector<float>& values) {
    if (c.cache == KvCacheDType::kAuto) return encode(values, dt);
    std::vector<uint8_t> codes(values.size());
    for (size_t i = 0; i < values.size(); ++i) codes[i] = fp8Code(c.cache, values[i]);
    return codes;
  };
  const auto kc = cacheOf(randomValues(numSlots * kvWidth, rng));
  const auto vc = cacheOf(randomValues(numSlots * kvWidth, rng));
  std::vector<uint8_t> want(rows * c.heads * c.headDim * es);
  // Steep and shallow slopes; reversed so the head order matters (a kernel reading the wrong
  // head's slope fails).
  std::vector<float> slopes;
  for (int64_t h = 0; c.alibi && h < c.heads; ++h)
    slopes.push_back(std::exp2(-8.0f * static_cast<float>(c.heads - h) / c.heads));
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
                         .slidingWindow = c.window,
                         .scale = 1.0f / std::sqrt(static_cast<float>(c.headDim)),
                         .alibiSlopes = c.alibi ? slopes.data() : nullptr,
                         .alibiBf16Divisor = c.alibiBf16Divisor,
                         .causal = c.causal,
                         .maxNewRows = maxNewRows,
                         .maxContext = maxContext,
                         // Mixed batches (prompts beside shorter sequences) split between the
                         // kernels; every third case leaves it unknown (all on tensor cores).
                         .minNewRows = rng() % 3 == 0 ? 0 : minNewRows,
                         .dtype = dt,
                         .cacheDtype = c.cache};
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  auto dq = toDevice(q), dk = toDevice(kc), dv = toDevice(vc), dStarts = toDevice(seqStarts),
       dStartPos = toDevice(startPos), dTables = toDevice(tables);
  auto dSlopes = c.alibi ? toDevice(slopes) : nullptr;
  DeviceBuffer dOut(want.size()), workspace(16u << 20);
  TG_ASSERT_CUDA(cudaMemset(workspace.get(), 0, workspace.bytes()));  // split counters start at 0
  p.q = dq->get();
  p.kCache = dk->get();
  p.vCache = dv->get();
  p.out = dOut.get();
  p.seqStarts = dStarts->as<int32_t>();
  p.startPos = dStartPos->as<int32_t>();
  p.blockTables = dTables->as<int32_t>();
  if (c.alibi) p.alibiSlopes = dSlopes->as<float>();
  p.workspace = workspace.get();
  p.workspaceBytes = workspace.bytes();
  ASSERT_TRUE(invokePagedAttention(p, nullptr).ok());
  testing::Tolerance tol = toleranceFor(dt);
  if (dt == DType::kF32) tol = {2e-5f, 2e-5f};  // fast exp (__expf) and a different sum order
  const std::vector<uint8_t> got = fromDevice(dOut, want.size());
  EXPECT_TRUE(testing::allClose(decode(got, dt), decode(want, dt), tol, c.heads * c.headDim));
  if (c.graphContext > 0) {
    ASSERT_GT(c.graphContext, maxContext);
    p.maxContext = c.graphContext;
    TG_ASSERT_CUDA(cudaMemset(dOut.get(), 0xff, dOut.bytes()));
    ASSERT_TRUE(invokePagedAttention(p, nullptr).ok());
    EXPECT_TRUE(fromDevice(dOut, want.size()) == got) << "maxContext " << c.graphContext;
  }
}

TEST_F(OpsCudaTest, PagedAttentionDecodeSplitK) {
  for (DType dt : kDtypes) {
    // One new row per sequence over contexts up to 3000: several splits and the merge pass.
    runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1}, rng_);
    runAttention({dt, 5, 8, 2, 64, 16, 0, 1000, 1}, rng_);
    runAttention({dt, 3, 4, 1, 128, 4, 0, 300, 1}, rng_);     // MQA, small blocks
    runAttention({dt, 4, 8, 8, 64, 16, 100, 900, 1}, rng_);   // sliding window
    runAttention({dt, 2, 6, 3, 80, 16, 0, 200, 1}, rng_);     // head size 80 (partial lanes)
    runAttention({dt, 2, 4, 2, 16, 4, 0, 50, 1}, rng_);       // tiny heads
    runAttention({dt, 64, 32, 8, 128, 16, 0, 600, 1}, rng_);  // a large decode batch
    // Multi-head attention with heads of 128 (the tensor-core decode kernel, a group of one; with
    // q rows not 16-byte aligned, below, the 16-lane kernels these cases were written for): 32 and
    // 48 sequences, a sliding window.
    runAttention({dt, 32, 32, 32, 128, 16, 0, 300, 1}, rng_);
    runAttention({dt, 48, 32, 32, 128, 16, 100, 300, 1}, rng_);
    // Blocks a little past one wave (up to 1.5 x 8 a multiprocessor: 33-49 sequences of 32 heads
    // on an H100's 132; the band moves with the multiprocessors) split each row's keys in two on
    // the 16-lane kernel: 40 and 48 sequences there (the window above too), and as a decode graph
    // runs them (with q 16-byte aligned, the tensor-core kernel's own splits).
    runAttention({dt, 40, 32, 32, 128, 16, 0, 300, 1}, rng_);
    runAttention({dt, 40, 32, 32, 128, 16, 0, 300, 1, false, 0.0f, KvCacheDType::kAuto, 4096},
                 rng_);
    // Two to 16 sequences of heads of 128 (under half the target's blocks) split on the 16-lane
    // pipelined kernel into about twice the target's blocks, one sequence on the split kernel of
    // few rows; with q 16-byte aligned, as here and in the first case above, the tensor-core
    // kernel's splits. The first case with q rows not 16-byte aligned keeps the split kernel of
    // few rows under test (with heads of 128, batch-1 decode where the tensor-core kernel does not
    // take it: fewer than 8 KV heads, as TP shards have).
    runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1},
                 rng_);
    runAttention({dt, 2, 32, 32, 128, 16, 0, 3000, 1}, rng_);
    runAttention({dt, 16, 32, 32, 128, 16, 0, 600, 1}, rng_);
    runAttention({dt, 12, 32, 32, 128, 16, 100, 600, 1}, rng_);  // sliding window
    runAttention({dt, 16, 32, 32, 128, 16, 0, 600, 1, false, 0.0f, KvCacheDType::kAuto, 4096},
                 rng_);
    // Groups of 8 or more query heads per KV head, as Falcon-7B (71 over one), StarCoder (48 over
    // one) and 20 over 2: with few rows one head a block; with rows x heads past 8 blocks per SM
    // (32 x 71, 32 x 48, 64 x 20, 80 x 16, 64 x 21: any GPU up to 160 SMs) tiles of 8 heads sharing
    // each key load, the last tile of a group short.
    runAttention({dt, 1, 71, 1, 64, 16, 0, 2100, 1}, rng_);
    runAttention({dt, 32, 71, 1, 64, 16, 0, 700, 1}, rng_);
    runAttention({dt, 32, 48, 1, 128, 16, 0, 500, 1}, rng_);
    runAttention({dt, 64, 20, 2, 64, 16, 0, 300, 1}, rng_);
    runAttention({dt, 2, 6, 1, 32, 8, 0, 300, 1}, rng_);
    runAttention({dt, 2, 16, 1, 256, 16, 0, 400, 1}, rng_);
    runAttention({dt, 80, 16, 2, 64, 16, 50, 300, 1}, rng_);  // tiles, sliding window
    // Groups of 2 to 8 with heads of 128 over a 16-bit cache: the tensor-core decode kernel, as
    // Llama-3-8B and Mistral-7B (32 over 8; above, 64 sequences) and Llama-2-70B (64 over 8)
    // decode; Qwen2.5-7B's 28 over 4 (groups of 7), groups of 2 (one with a sliding window),
    // batch 1 over 3000 keys (many splits), 8 and 16 sequences (split), 160 (not), cache blocks of
    // 7, and 64 x 8 over 1 (Llama-2-70B's TP=8 shard).
    runAttention({dt, 64, 28, 4, 128, 16, 0, 400, 1}, rng_);
    runAttention({dt, 48, 32, 8, 128, 16, 0, 700, 1}, rng_);
    runAttention({dt, 8, 16, 8, 128, 16, 0, 500, 1}, rng_);
    runAttention({dt, 48, 32, 16, 128, 16, 50, 300, 1}, rng_);
    runAttention({dt, 1, 32, 8, 128, 16, 0, 3000, 1}, rng_);
    runAttention({dt, 8, 32, 8, 128, 16, 0, 2000, 1}, rng_);
    runAttention({dt, 16, 32, 8, 128, 16, 100, 900, 1}, rng_);
    runAttention({dt, 16, 64, 8, 128, 16, 0, 1500, 1}, rng_);
    runAttention({dt, 6, 32, 8, 128, 7, 0, 500, 1}, rng_);
    runAttention({dt, 64, 8, 1, 128, 16, 0, 700, 1}, rng_);
    runAttention({dt, 160, 32, 8, 128, 16, 0, 300, 1}, rng_);
    // Larger groups of heads of 128 keep the CUDA cores: 16 x 32 over 2 (one head a block, split),
    // 64 x 18 over 1 (tiles of 8 heads, a group's last tile of 2) and 32 x 48 over 1 (above).
    runAttention({dt, 16, 32, 2, 128, 16, 0, 900, 1}, rng_);
    runAttention({dt, 64, 18, 1, 128, 16, 0, 300, 1}, rng_);
    // q rows an odd number of elements apart (no 16-byte loads of q): groups of 4 keep the CUDA
    // cores, tiles of 4 heads for 64 sequences, one head a block (split) for 8; multi-head
    // attention (which the tensor-core kernel otherwise takes, above) the 16-lane kernel: unsplit,
    // split in two past a wave, split for a few sequences.
    runAttention({dt, 64, 32, 8, 128, 16, 0, 300, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1}, rng_);
    runAttention({dt, 8, 32, 8, 128, 16, 0, 900, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1}, rng_);
    runAttention({dt, 32, 32, 32, 128, 16, 0, 300, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1},
                 rng_);
    runAttention({dt, 40, 32, 32, 128, 16, 0, 300, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1},
                 rng_);
    runAttention({dt, 4, 32, 32, 128, 16, 50, 900, 1, false, 0.0f, KvCacheDType::kAuto, 0, 1},
                 rng_);
    // A decode graph's maxContext (the model's whole context) over short live contexts: each row's
    // keys split by its own length, the same bits as the call with the batch's own longest context
    // (one sequence, eight, a large batch with GQA tiles, a sliding window, ALiBi, and contexts of
    // one to four keys).
    auto graph = [](AttentionCase c) {
      c.graphContext = 4096;
      return c;
    };
    runAttention(graph({dt, 1, 32, 32, 128, 16, 0, 200, 1}), rng_);
    runAttention(graph({dt, 8, 32, 32, 128, 16, 0, 300, 1}), rng_);
    runAttention(graph({dt, 32, 48, 1, 128, 16, 0, 500, 1}), rng_);
    runAttention(graph({dt, 4, 8, 8, 64, 16, 100, 900, 1}), rng_);
    runAttention(graph({dt, 5, 8, 2, 64, 16, 0, 1000, 1, true}), rng_);
    runAttention(graph({dt, 6, 8, 2, 128, 16, 0, 3, 1}), rng_);
    runAttention(graph({dt, 64, 32, 8, 128, 16, 0, 300, 1}), rng_);  // grouped heads
    runAttention(graph({dt, 8, 32, 8, 128, 16, 0, 300, 1}), rng_);   // the same, split
  }
}

// Speculative decoding's verification: a sequence's k rows in one call (positions start .. start +
// k - 1) must give, bit for bit, what k decode calls of one row each give at those positions, so
// that verified tokens keep plain decoding's logits. The kernel and its splits are chosen from the
// sequence count, not the rows: one sequence (the split kernel of few rows), several under half a
// wave of blocks (the pipelined kernel, split), and a wave's worth (unsplit).
TEST_F(OpsCudaTest, PagedAttentionVerificationRowsEqualDecodeRowsBitForBit) {
  constexpr int64_t kHeads = 32, kHeadDim = 128, kBlock = 16, kRows = 4;
  // 32 KV heads, and 8 (the tensor-core decode kernel, split for up to 16 sequences on an H200).
  for (const int64_t kvHeads : {kHeads, int64_t{8}}) {
    const int64_t kStride = (kHeads + 2 * kvHeads) * kHeadDim;  // q inside a fused qkv row
    for (DType dt : {DType::kF16, DType::kBF16}) {
      for (int64_t seqs : {1, 4, 16, 40}) {
        SCOPED_TRACE(std::string(dtypeName(dt)) + " seqs=" + std::to_string(seqs) +
                     " kv heads=" + std::to_string(kvHeads));
        const size_t es = dtypeSize(dt);
        std::vector<int32_t> start(seqs);
        int64_t maxBlocks = 0;
        for (auto& st : start) {
          st = static_cast<int32_t>(200 + rng_() % 600);
          maxBlocks = std::max<int64_t>(maxBlocks, (st + kRows + kBlock - 1) / kBlock);
        }
        std::vector<int32_t> tables(seqs * maxBlocks);
        std::iota(tables.begin(), tables.end(), 0);
        std::shuffle(tables.begin(), tables.end(), rng_);
        const int64_t slots = seqs * maxBlocks * kBlock, width = kHeads * kHeadDim,
                      kvWidth = kvHeads * kHeadDim;
        auto dk = toDevice(encode(randomValues(slots * kvWidth, rng_), dt));
        auto dv = toDevice(encode(randomValues(slots * kvWidth, rng_), dt));
        const auto q = encode(randomValues(seqs * kRows * kStride, rng_), dt);
        auto dTables = toDevice(tables);
        DeviceBuffer workspace(16u << 20);
        TG_ASSERT_CUDA(cudaMemset(workspace.get(), 0, workspace.bytes()));
        // rowsPerSeq rows of each sequence from position start + first; q rows copied from the
        // verification rows they stand for.
        auto call = [&](int64_t rowsPerSeq, int64_t first) {
          std::vector<int32_t> seqStarts{0}, startPos;
          std::vector<uint8_t> qs;
          int64_t maxContext = 0;
          for (int64_t sq = 0; sq < seqs; ++sq) {
            startPos.push_back(static_cast<int32_t>(start[sq] + first));
            seqStarts.push_back(static_cast<int32_t>((sq + 1) * rowsPerSeq));
            maxContext = std::max<int64_t>(maxContext, start[sq] + first + rowsPerSeq);
            const auto* row = q.data() + (sq * kRows + first) * kStride * es;
            qs.insert(qs.end(), row, row + rowsPerSeq * kStride * es);
          }
          auto dq = toDevice(qs), dStarts = toDevice(seqStarts), dPos = toDevice(startPos);
          DeviceBuffer out(seqs * rowsPerSeq * width * es);
          PagedAttentionParams p{.q = dq->get(),
                                 .qRowStride = kStride,
                                 .kCache = dk->get(),
                                 .vCache = dv->get(),
                                 .out = out.get(),
                                 .seqStarts = dStarts->as<int32_t>(),
                                 .startPos = dPos->as<int32_t>(),
                                 .blockTables = dTables->as<int32_t>(),
                                 .rows = seqs * rowsPerSeq,
                                 .numSeqs = seqs,
                                 .maxBlocksPerSeq = maxBlocks,
                                 .numHeads = kHeads,
                                 .numKvHeads = kvHeads,
                                 .headDim = kHeadDim,
                                 .blockSize = kBlock,
                                 .scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim)),
                                 .maxNewRows = rowsPerSeq,
                                 .maxContext = maxContext,
                                 .minNewRows = rowsPerSeq,
                                 .dtype = dt,
                                 .workspace = workspace.get(),
                                 .workspaceBytes = workspace.bytes()};
          EXPECT_TRUE(invokePagedAttention(p, nullptr).ok());
          return fromDevice(out, out.bytes());
        };
        const std::vector<uint8_t> verified = call(kRows, 0);
        const size_t rowBytes = width * es;
        for (int64_t r = 0; r < kRows; ++r) {
          const std::vector<uint8_t> decoded = call(1, r);
          for (int64_t sq = 0; sq < seqs; ++sq) {
            EXPECT_EQ(0, std::memcmp(verified.data() + (sq * kRows + r) * rowBytes,
                                     decoded.data() + sq * rowBytes, rowBytes))
                << "sequence " << sq << ", row " << r;
          }
        }
      }
    }
  }
}

TEST_F(OpsCudaTest, PagedAttentionPrefillAndChunks) {
  for (DType dt : kDtypes) {
    runAttention({dt, 1, 8, 8, 128, 16, 0, 0, 300}, rng_);      // one prompt, no prefix
    runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200}, rng_);      // a packed batch of prompts, GQA
    runAttention({dt, 3, 4, 4, 64, 16, 0, 500, 150}, rng_);     // prompts after cached prefixes
    runAttention({dt, 2, 4, 1, 128, 16, 300, 200, 130}, rng_);  // later chunks, window, MQA
    runAttention({dt, 2, 8, 4, 64, 16, 64, 0, 400}, rng_);      // sliding window inside the prompt
    runAttention({dt, 4, 4, 2, 128, 16, 0, 100, 70}, rng_);  // mixed lengths: decode-sized to tiles
    runAttention({dt, 2, 4, 2, 80, 16, 0, 50, 90}, rng_);    // head size without a tensor-core path
    // A prompt's tail after a long cached prefix: few rows, one tile's blocks under a wave, so the
    // split kernel takes them (16 and 24 rows); a full tile after the prefix stays on tensor cores.
    runAttention({dt, 1, 32, 32, 128, 16, 0, 2096, 16}, rng_);
    runAttention({dt, 2, 32, 8, 128, 16, 0, 1500, 24}, rng_);
    runAttention({dt, 1, 32, 32, 128, 16, 0, 2048, 64}, rng_);
    // Few tensor-core tiles over long contexts: the keys are split among blocks and merged
    // (flashSplits), with GQA, a sliding window, head size 64, and sequences of unequal lengths.
    runAttention({dt, 2, 16, 4, 128, 16, 0, 2000, 64}, rng_);
    runAttention({dt, 1, 16, 8, 128, 16, 700, 2000, 64}, rng_);
    runAttention({dt, 1, 8, 2, 64, 16, 0, 2000, 48}, rng_);
    runAttention({dt, 3, 4, 4, 128, 16, 0, 1200, 100}, rng_);
    // Chunked prefill beside running requests: many one-to-few-row sequences and a long chunk.
    runAttention({dt, 12, 8, 2, 128, 16, 0, 300, 70}, rng_);
    runAttention({dt, 8, 4, 2, 64, 16, 100, 300, 40}, rng_);
    // Cache blocks other than 16 tokens (the tile loader divides positions by the block size):
    // 7 (not a power of two, a K/V tile over ten blocks) and 32, whole tiles and split keys.
    runAttention({dt, 2, 8, 4, 128, 7, 0, 300, 90}, rng_);
    runAttention({dt, 1, 16, 16, 128, 7, 0, 1500, 64}, rng_);
    runAttention({dt, 2, 8, 8, 64, 32, 0, 500, 80}, rng_);
  }
}

TEST_F(OpsCudaTest, PagedAttentionAlibiDecodeSplitK) {
  for (DType dt : kDtypes) {
    runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1, true}, rng_);  // several splits, merged
    runAttention({dt, 5, 8, 2, 64, 16, 0, 1000, 1, true}, rng_);     // GQA
    runAttention({dt, 3, 4, 1, 128, 4, 0, 300, 1, true}, rng_);      // MQA, small blocks
    runAttention({dt, 4, 8, 8, 64, 16, 100, 900, 1, true}, rng_);    // sliding window
    runAttention({dt, 2, 6, 3, 80, 16, 0, 200, 1, true}, rng_);      // head size 80
    runAttention({dt, 2, 12, 4, 32, 8, 0, 120, 1, true}, rng_);      // 12 heads, tiny head size
    runAttention({dt, 64, 32, 8, 128, 16, 0, 600, 1, true}, rng_);   // a large decode batch
    runAttention({dt, 2, 21, 1, 64, 16, 0, 500, 1, true},
                 rng_);  // tiles of 8, 8, 5: each its slopes
    // Unsplit heads of 128 (32 x 32 blocks: the kernel that requests the next key ahead), BLOOM's
    // slopes and Falcon's.
    runAttention({dt, 32, 32, 32, 128, 16, 0, 300, 1, true}, rng_);
    runAttention({dt, 32, 32, 32, 128, 16, 0, 300, 1, true, 11.3137085f}, rng_);
    runAttention({dt, 40, 32, 32, 128, 16, 0, 300, 1, true}, rng_);  // keys split in two (H100)
    runAttention({dt, 8, 32, 32, 128, 16, 0, 900, 1, true}, rng_);   // 2-16 sequences, split
  }
}

TEST_F(OpsCudaTest, PagedAttentionAlibiPrefillAndChunks) {
  for (DType dt : kDtypes) {
    runAttention({dt, 1, 8, 8, 128, 16, 0, 0, 300, true}, rng_);      // one prompt, no prefix
    runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, true}, rng_);      // packed prompts, GQA
    runAttention({dt, 3, 4, 4, 64, 16, 0, 500, 150, true}, rng_);     // after cached prefixes
    runAttention({dt, 2, 4, 1, 128, 16, 300, 200, 130, true}, rng_);  // chunks, window, MQA
    runAttention({dt, 2, 8, 1, 64, 16, 0, 0, 400, true}, rng_);       // MQA prompts
    runAttention({dt, 4, 4, 2, 128, 16, 0, 100, 70, true}, rng_);     // decode-sized to tiles
    runAttention({dt, 2, 4, 2, 80, 16, 0, 50, 90, true}, rng_);       // no tensor-core path
    runAttention({dt, 1, 16, 16, 128, 16, 0, 2500, 40, true}, rng_);  // split keys, merged
  }
}

// Falcon's ALiBi: the product slope * j rounded to bfloat16, then divided (sqrt(head_dim)).
TEST_F(OpsCudaTest, PagedAttentionFalconAlibi) {
  for (DType dt : kDtypes) {
    runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1, true, 8.0f}, rng_);      // decode, splits
    runAttention({dt, 3, 4, 1, 64, 4, 0, 300, 1, true, 8.0f}, rng_);           // MQA decode
    runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, true, 11.3137085f}, rng_);  // prefill, GQA
    runAttention({dt, 2, 4, 1, 64, 16, 0, 300, 130, true, 8.0f}, rng_);        // chunks, MQA
    runAttention({dt, 2, 12, 4, 16, 8, 0, 120, 9, true, 4.0f}, rng_);          // tiny heads
  }
}

// An fp8 cache: codes widened to float in the split-K kernel, to the 16-bit dtype (exactly) for the
// tensor-core prefill and decode kernels; the reference reads the same codes, so the usual
// tolerances hold.
TEST_F(OpsCudaTest, PagedAttentionFp8CacheDecodeSplitK) {
  for (KvCacheDType kv : kFp8Caches) {
    for (DType dt : kDtypes) {
      runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1, false, 0.0f, kv}, rng_);  // splits
      runAttention({dt, 5, 8, 2, 64, 16, 0, 1000, 1, false, 0.0f, kv}, rng_);     // GQA
      runAttention({dt, 3, 4, 1, 128, 4, 0, 300, 1, false, 0.0f, kv}, rng_);      // MQA
      runAttention({dt, 4, 8, 8, 64, 16, 100, 900, 1, false, 0.0f, kv}, rng_);    // window
      runAttention({dt, 2, 6, 3, 80, 16, 0, 200, 1, false, 0.0f, kv}, rng_);      // head size 80
      runAttention({dt, 2, 4, 2, 16, 4, 0, 50, 1, false, 0.0f, kv}, rng_);        // tiny heads
      runAttention({dt, 32, 71, 1, 64, 16, 0, 700, 1, false, 0.0f, kv}, rng_);    // tiles of 8
      runAttention({dt, 2, 16, 1, 256, 16, 0, 400, 1, false, 0.0f, kv}, rng_);    // head size 256
      runAttention({dt, 48, 32, 32, 128, 16, 0, 200, 1, false, 0.0f, kv}, rng_);  // heads of 128
      runAttention({dt, 8, 32, 32, 128, 16, 0, 900, 1, false, 0.0f, kv}, rng_);   // 2-16 seqs
      runAttention({dt, 64, 32, 8, 128, 16, 0, 400, 1, false, 0.0f, kv}, rng_);   // GQA, 64 seqs
      // The tensor-core decode kernel (heads of 128 in groups of 1 to 8, at least 8 sequences x
      // KV heads; the four cases of heads of 128 above but MQA's 3 x 1): a sliding window with
      // splits, cache blocks of 7, a decode graph's context; q rows not 16-byte aligned keep the
      // CUDA cores (64 sequences of 4-head tiles, and one sequence on the split kernel of few rows,
      // which the first case above took before).
      runAttention({dt, 16, 32, 8, 128, 16, 100, 900, 1, false, 0.0f, kv}, rng_);
      runAttention({dt, 6, 32, 8, 128, 7, 0, 500, 1, false, 0.0f, kv}, rng_);
      runAttention({dt, 8, 32, 32, 128, 16, 0, 300, 1, false, 0.0f, kv, 4096}, rng_);
      runAttention({dt, 64, 32, 8, 128, 16, 0, 300, 1, false, 0.0f, kv, 0, 1}, rng_);
      runAttention({dt, 1, 32, 32, 128, 16, 0, 3000, 1, false, 0.0f, kv, 0, 1}, rng_);
      runAttention({dt, 5, 8, 2, 64, 16, 0, 1000, 1, true, 0.0f, kv}, rng_);  // ALiBi
      runAttention({dt, 3, 4, 1, 64, 4, 0, 300, 1, true, 8.0f, kv}, rng_);    // Falcon's
    }
  }
}

TEST_F(OpsCudaTest, PagedAttentionFp8CachePrefillAndChunks) {
  for (KvCacheDType kv : kFp8Caches) {
    for (DType dt : kDtypes) {
      runAttention({dt, 1, 8, 8, 128, 16, 0, 0, 300, false, 0.0f, kv}, rng_);      // one prompt
      runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, false, 0.0f, kv}, rng_);      // packed, GQA
      runAttention({dt, 3, 4, 4, 64, 16, 0, 500, 150, false, 0.0f, kv}, rng_);     // prefixes
      runAttention({dt, 2, 4, 1, 128, 16, 300, 200, 130, false, 0.0f, kv}, rng_);  // chunks
      runAttention({dt, 4, 4, 2, 128, 16, 0, 100, 70, false, 0.0f, kv}, rng_);     // mixed
      runAttention({dt, 2, 4, 2, 80, 16, 0, 50, 90, false, 0.0f, kv}, rng_);  // no tensor cores
      runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, true, 0.0f, kv}, rng_);  // ALiBi
      runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, true, 11.3137085f, kv}, rng_);  // Falcon's
      runAttention({dt, 1, 32, 8, 128, 16, 0, 2500, 64, false, 0.0f, kv}, rng_);     // split keys
      // The tensor-core prompt kernel widens fp8 tiles in shared memory: heads of 64 with a
      // window inside the prompt, cache blocks of 7, multi-head split keys (heads of 128 and 64),
      // and a chunk beside one-to-few-row sequences.
      runAttention({dt, 2, 8, 4, 64, 16, 64, 0, 400, false, 0.0f, kv}, rng_);
      runAttention({dt, 2, 8, 4, 128, 7, 0, 300, 90, false, 0.0f, kv}, rng_);
      runAttention({dt, 1, 16, 16, 128, 16, 0, 2000, 64, false, 0.0f, kv}, rng_);
      runAttention({dt, 1, 8, 2, 64, 16, 0, 2000, 48, false, 0.0f, kv}, rng_);
      runAttention({dt, 12, 8, 2, 128, 16, 0, 300, 70, false, 0.0f, kv}, rng_);
    }
  }
}

// The prompt kernels' variants a shard takes only where the environment says so
// (TEXTGEN_FLASH_FOLD=0: scores scaled before their maxima; TEXTGEN_FLASH_MMA_FP8=0: fp8 caches on
// the WMMA kernel), and non-causal prompts without a bias (T5's encoder has its relative bias),
// over 16-bit and fp8 caches: prompts, cached prefixes, split keys, heads of 64 and a block size
// of 7.
TEST_F(OpsCudaTest, PagedAttentionPrefillVariants) {
  struct Variant {
    int fold, mmaFp8;
    const char* name;
  };
  const Variant variants[] = {{-1, -1, "default"}, {0, -1, "fold off"}, {-1, 0, "fp8 on WMMA"}};
  const KvCacheDType caches[] = {KvCacheDType::kAuto, KvCacheDType::kFp8E4M3,
                                 KvCacheDType::kFp8E5M2};
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    setFlashVariantsForTesting(v.fold, v.mmaFp8);
    for (KvCacheDType kv : caches) {
      if (v.mmaFp8 == 0 && kv == KvCacheDType::kAuto) continue;  // the switch is fp8's alone
      for (DType dt : {DType::kF16, DType::kBF16}) {
        if (v.fold == 0 || v.mmaFp8 == 0) {
          runAttention({dt, 1, 8, 8, 128, 16, 0, 0, 300, false, 0.0f, kv}, rng_);
          runAttention({dt, 3, 4, 4, 64, 16, 0, 500, 150, false, 0.0f, kv}, rng_);
          runAttention({dt, 1, 16, 16, 128, 16, 0, 2000, 64, false, 0.0f, kv}, rng_);
          runAttention({dt, 2, 8, 4, 64, 16, 64, 0, 400, false, 0.0f, kv}, rng_);
        }
        // Non-causal: no window, no ALiBi.
        runAttention({dt, 3, 8, 2, 128, 16, 0, 0, 200, false, 0.0f, kv, 0, 0, false}, rng_);
        runAttention({dt, 2, 4, 4, 64, 7, 0, 300, 100, false, 0.0f, kv, 0, 0, false}, rng_);
        runAttention({dt, 1, 16, 16, 128, 16, 0, 2000, 64, false, 0.0f, kv, 0, 0, false}, rng_);
      }
    }
  }
  setFlashVariantsForTesting(-1, -1);
}

}  // namespace
}  // namespace textgen::kernels
