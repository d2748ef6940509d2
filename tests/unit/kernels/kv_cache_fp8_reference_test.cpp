// The fp8 KV cache's CPU references (textgen/kernels/kv_cache_dtype.h): kv_write and rope_kv_write
// store exactly fp8.h's code of each value (saturating; from float32, float16 and bfloat16 rows),
// the codes read back as fp8.h's values, slots not written stay as they were; paged attention over
// an fp8 cache equals, bit for bit, paged attention over a float32 cache holding the fp8-rounded
// keys and values (causal, GQA, sliding window, ALiBi); an unknown cache dtype is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "textgen/kernels/fp8.h"
#include "textgen/kernels/half.h"
#include "textgen/kernels/kv_write.h"
#include "textgen/kernels/paged_attention.h"
#include "textgen/kernels/rope_kv_write.h"

namespace textgen::kernels {
namespace {

constexpr KvCacheDType kFp8[] = {KvCacheDType::kFp8E4M3, KvCacheDType::kFp8E5M2};

uint8_t toCode(KvCacheDType c, float v) {
  return c == KvCacheDType::kFp8E4M3 ? floatToFp8E4M3(v) : floatToFp8E5M2(v);
}
float fromCode(KvCacheDType c, uint8_t code) {
  return c == KvCacheDType::kFp8E4M3 ? fp8E4M3ToFloat(code) : fp8E5M2ToFloat(code);
}

// Values across both formats' ranges: normal draws at several scales, subnormals, values past each
// format's largest finite one (saturated), ties and signed zeros.
std::vector<float> testValues(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  const float scales[] = {1.0f, 1e-3f, 1e-5f, 30.0f, 600.0f, 1e5f};
  for (size_t i = 0; i < n; ++i) v[i] = d(rng) * scales[i % 6];
  const float special[] = {448.0f,
                           -448.0f,
                           464.0f,
                           1e9f,
                           -1e9f,
                           57344.0f,
                           61440.0f,
                           0.0f,
                           -0.0f,
                           0.015625f * 0.5f,
                           std::ldexp(1.0f, -10),
                           std::ldexp(3.0f, -10),
                           std::ldexp(1.0f, -17),
                           INFINITY,
                           -INFINITY};
  for (size_t i = 0; i < std::size(special) && i < n; ++i) v[i * 3] = special[i];
  return v;
}

// Host bytes of `values` in a 16/32-bit dtype.
std::vector<uint8_t> encode(const std::vector<float>& values, DType dt) {
  std::vector<uint8_t> out(values.size() * dtypeSize(dt));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dt == DType::kF16 ? floatToF16(values[i]) : floatToBf16(values[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

float decodeAt(const std::vector<uint8_t>& bytes, DType dt, size_t i) {
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return dt == DType::kF16 ? f16ToFloat(h) : bf16ToFloat(h);
}

TEST(KvCacheFp8, CodesAtTheFormatsEdgesAreCudasSaturatingOnes) {
  EXPECT_EQ(floatToFp8E4M3(448.0f), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(464.0f), 0x7e);  // halfway to 480 (not finite in e4m3fn): saturated
  EXPECT_EQ(floatToFp8E4M3(INFINITY), 0x7e);
  EXPECT_EQ(floatToFp8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);   // the smallest subnormal
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);  // a tie: to even (zero)
  EXPECT_EQ(floatToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);  // a tie: to even (2 x 2^-9)
  EXPECT_EQ(floatToFp8E5M2(57344.0f), 0x7b);
  EXPECT_EQ(floatToFp8E5M2(61440.0f), 0x7b);  // rounds to 65536 (inf): saturated
  EXPECT_EQ(floatToFp8E5M2(-INFINITY), 0xfb);
  EXPECT_EQ(floatToFp8E5M2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(floatToFp8E5M2(-0.0f), 0x80);
  EXPECT_EQ(kvCacheElementSize(KvCacheDType::kFp8E4M3, DType::kBF16), 1u);
  EXPECT_EQ(kvCacheElementSize(KvCacheDType::kAuto, DType::kBF16), 2u);
  EXPECT_EQ(fp8KvCacheDTypeOf("fp8_e4m3fn"), KvCacheDType::kFp8E4M3);
  EXPECT_EQ(fp8KvCacheDTypeOf("fp8_e5m2"), KvCacheDType::kFp8E5M2);
  EXPECT_FALSE(fp8KvCacheDTypeOf("fp8").has_value());
  EXPECT_FALSE(fp8KvCacheDTypeOf("auto").has_value());
}

TEST(KvCacheFp8, KvWriteStoresTheCodesOfEachValueAndLeavesOtherSlots) {
  std::mt19937 rng(7);
  for (KvCacheDType cache : kFp8) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(kvCacheDTypeName(cache)) + " from " + std::string(dtypeName(dt)));
      const int64_t rows = 9, kvHeads = 2, headDim = 12, width = kvHeads * headDim;
      const int64_t stride = 3 * width, numSlots = 32;
      const auto qkv = encode(testValues(rows * stride, rng), dt);
      const size_t es = dtypeSize(dt);
      std::vector<int32_t> slots(numSlots);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(rows);
      std::vector<uint8_t> kc(numSlots * width, 0xa5), vc(numSlots * width, 0x5a);
      const KvWriteParams p{.k = qkv.data() + width * es,
                            .v = qkv.data() + 2 * width * es,
                            .kvRowStride = stride,
                            .kCache = kc.data(),
                            .vCache = vc.data(),
                            .slots = slots.data(),
                            .rows = rows,
                            .numKvHeads = kvHeads,
                            .headDim = headDim,
                            .numSlots = numSlots,
                            .dtype = dt,
                            .cacheDtype = cache};
      ASSERT_TRUE(kvWriteReference(p).ok());
      std::vector<bool> written(numSlots, false);
      for (int64_t r = 0; r < rows; ++r) {
        written[slots[r]] = true;
        for (int64_t i = 0; i < width; ++i) {
          const float k = decodeAt(qkv, dt, r * stride + width + i);
          const float v = decodeAt(qkv, dt, r * stride + 2 * width + i);
          const uint8_t kCode = kc[slots[r] * width + i], vCode = vc[slots[r] * width + i];
          ASSERT_EQ(kCode, toCode(cache, k)) << "row " << r << " element " << i << " k " << k;
          ASSERT_EQ(vCode, toCode(cache, v)) << "row " << r << " element " << i << " v " << v;
          // Round trip: the code's value is a fixed point of the conversion (finite, saturated).
          const float back = fromCode(cache, kCode);
          ASSERT_TRUE(std::isfinite(back));
          ASSERT_EQ(toCode(cache, back), kCode);
          // Within the range, round to nearest: at most half an ulp (2^-(mantissa bits + 1)
          // relative; half the smallest subnormal below the normals).
          const bool e4m3 = cache == KvCacheDType::kFp8E4M3;
          if (std::isfinite(k) && std::fabs(k) <= (e4m3 ? kFp8E4M3Max : kFp8E5M2Max)) {
            const float halfUlp =
                std::fabs(k) * (e4m3 ? 0.0625f : 0.125f) + std::ldexp(1.0f, e4m3 ? -10 : -17);
            ASSERT_LE(std::fabs(back - k), halfUlp) << k;
          }
        }
      }
      for (int64_t s = 0; s < numSlots; ++s) {
        if (written[s]) continue;
        for (int64_t i = 0; i < width; ++i) {
          ASSERT_EQ(kc[s * width + i], 0xa5);
          ASSERT_EQ(vc[s * width + i], 0x5a);
        }
      }
    }
  }
}

TEST(KvCacheFp8, RopeKvWriteStoresTheCodesOfTheRotatedKeys) {
  std::mt19937 rng(11);
  for (KvCacheDType cache : kFp8) {
    SCOPED_TRACE(std::string(kvCacheDTypeName(cache)));
    const int64_t rows = 5, heads = 4, kvHeads = 2, headDim = 16, rotary = 8, numSlots = 16;
    const int64_t stride = (heads + 2 * kvHeads) * headDim, width = kvHeads * headDim;
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> qkv(rows * stride);
    for (float& x : qkv) x = d(rng);
    std::vector<int32_t> positions{0, 3, 17, 250, 1000}, slots{4, 0, 15, 9, 2};
    std::vector<float> invFreq(rows * rotary / 2);
    for (size_t i = 0; i < invFreq.size(); ++i)
      invFreq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i % (rotary / 2)) / rotary);
    std::vector<uint8_t> kc(numSlots * width, 0), vc(numSlots * width, 0);
    float* k = qkv.data() + heads * headDim;
    const RopeKvWriteParams p{.rope = {.q = qkv.data(),
                                       .k = k,
                                       .qRowStride = stride,
                                       .kRowStride = stride,
                                       .invFreq = invFreq.data(),
                                       .positions = positions.data(),
                                       .rows = rows,
                                       .numHeads = heads,
                                       .numKvHeads = kvHeads,
                                       .headDim = headDim,
                                       .rotaryDim = rotary,
                                       .dtype = DType::kF32},
                              .kv = {.k = k,
                                     .v = k + width,
                                     .kvRowStride = stride,
                                     .kCache = kc.data(),
                                     .vCache = vc.data(),
                                     .slots = slots.data(),
                                     .rows = rows,
                                     .numKvHeads = kvHeads,
                                     .headDim = headDim,
                                     .numSlots = numSlots,
                                     .dtype = DType::kF32,
                                     .cacheDtype = cache}};
    ASSERT_TRUE(ropeKvWriteReference(p).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(kc[slots[r] * width + i], toCode(cache, k[r * stride + i]));  // rotated in place
        ASSERT_EQ(vc[slots[r] * width + i], toCode(cache, k[r * stride + width + i]));
      }
    }
  }
}

struct AttentionCase {
  int64_t numSeqs, heads, kvHeads, headDim, blockSize, window;
  std::vector<int32_t> startPos, newRows;
  bool alibi = false;
  float alibiBf16Divisor = 0.0f;
};

// Paged attention with an fp8 cache against the float32 cache of the codes' values.
void checkAttention(const AttentionCase& c, KvCacheDType cache, std::mt19937& rng) {
  std::vector<int32_t> seqStarts{0};
  int64_t rows = 0, maxNewRows = 0, maxContext = 0, maxBlocks = 0;
  for (int64_t s = 0; s < c.numSeqs; ++s) {
    rows += c.newRows[s];
    seqStarts.push_back(static_cast<int32_t>(rows));
    maxNewRows = std::max<int64_t>(maxNewRows, c.newRows[s]);
    maxContext = std::max<int64_t>(maxContext, c.startPos[s] + c.newRows[s]);
    maxBlocks = std::max<int64_t>(maxBlocks,
                                  (c.startPos[s] + c.newRows[s] + c.blockSize - 1) / c.blockSize);
  }
  const int64_t numBlocks = c.numSeqs * maxBlocks;
  std::vector<int32_t> tables(numBlocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  const int64_t elems = numBlocks * c.blockSize * c.kvHeads * c.headDim;
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> q(rows * c.heads * c.headDim);
  for (float& x : q) x = d(rng);
  std::vector<uint8_t> kCodes(elems), vCodes(elems);
  std::vector<float> kRounded(elems), vRounded(elems), kExact(elems), vExact(elems);
  for (int64_t i = 0; i < elems; ++i) {
    kExact[i] = d(rng);
    vExact[i] = d(rng);
    kCodes[i] = toCode(cache, kExact[i]);
    vCodes[i] = toCode(cache, vExact[i]);
    kRounded[i] = fromCode(cache, kCodes[i]);
    vRounded[i] = fromCode(cache, vCodes[i]);
  }
  std::vector<float> slopes;
  for (int64_t h = 0; c.alibi && h < c.heads; ++h)
    slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / c.heads));
  std::vector<float> outFp8(q.size()), outRounded(q.size()), outExact(q.size());
  PagedAttentionParams p{.q = q.data(),
                         .qRowStride = c.heads * c.headDim,
                         .kCache = kCodes.data(),
                         .vCache = vCodes.data(),
                         .out = outFp8.data(),
                         .seqStarts = seqStarts.data(),
                         .startPos = c.startPos.data(),
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
                         .maxNewRows = maxNewRows,
                         .maxContext = maxContext,
                         .dtype = DType::kF32,
                         .cacheDtype = cache};
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  p.cacheDtype = KvCacheDType::kAuto;
  p.kCache = kRounded.data();
  p.vCache = vRounded.data();
  p.out = outRounded.data();
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  EXPECT_EQ(std::memcmp(outFp8.data(), outRounded.data(), q.size() * sizeof(float)), 0);
  // Next to the unrounded cache the outputs move by about the codes' relative precision (e4m3:
  // 2^-4, e5m2: 2^-3 at most), more where a sharp softmax turns on a rounded score: a sanity bound
  // on the mean difference, not a tolerance anything relies on.
  p.kCache = kExact.data();
  p.vCache = vExact.data();
  p.out = outExact.data();
  ASSERT_TRUE(pagedAttentionReference(p).ok());
  double meanDiff = 0.0;
  for (size_t i = 0; i < q.size(); ++i) meanDiff += std::fabs(outFp8[i] - outExact[i]);
  meanDiff /= static_cast<double>(q.size());
  std::printf("%s: mean |fp8 - exact| %.4f\n", std::string(kvCacheDTypeName(cache)).c_str(),
              meanDiff);
  EXPECT_LT(meanDiff, cache == KvCacheDType::kFp8E4M3 ? 0.05 : 0.1);
}

TEST(KvCacheFp8, PagedAttentionOverFp8EqualsAttentionOverTheRoundedValues) {
  std::mt19937 rng(3);
  for (KvCacheDType cache : kFp8) {
    SCOPED_TRACE(std::string(kvCacheDTypeName(cache)));
    checkAttention({2, 4, 2, 16, 4, 0, {0, 5}, {7, 3}}, cache, rng);          // prefill, chunk
    checkAttention({3, 4, 1, 32, 8, 0, {40, 0, 17}, {1, 1, 1}}, cache, rng);  // decode, MQA
    checkAttention({2, 4, 4, 16, 4, 6, {9, 0}, {4, 12}}, cache, rng);         // sliding window
    checkAttention({2, 4, 2, 16, 4, 0, {3, 0}, {5, 6}, true}, cache, rng);    // ALiBi
    checkAttention({1, 4, 1, 16, 4, 0, {8}, {4}, true, 4.0f}, cache, rng);    // Falcon's ALiBi
  }
}

TEST(KvCacheFp8, AnUnknownCacheDtypeIsRefused) {
  float x = 0.0f;
  int32_t slot = 0;
  KvWriteParams kv{.k = &x,
                   .v = &x,
                   .kvRowStride = 1,
                   .kCache = &x,
                   .vCache = &x,
                   .slots = &slot,
                   .rows = 1,
                   .numKvHeads = 1,
                   .headDim = 1,
                   .numSlots = 1,
                   .cacheDtype = static_cast<KvCacheDType>(7)};
  EXPECT_EQ(kvWriteReference(kv).code(), StatusCode::kInvalidArgument);
  PagedAttentionParams p{.qRowStride = 1,
                         .numHeads = 1,
                         .numKvHeads = 1,
                         .headDim = 1,
                         .blockSize = 1,
                         .cacheDtype = static_cast<KvCacheDType>(7)};
  EXPECT_EQ(validatePagedAttention(p).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace textgen::kernels
