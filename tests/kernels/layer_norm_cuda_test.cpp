// invokeLayerNorm against layerNormReference over random shapes, every dtype, with and without the
// residual add and the bias, in place and out of place, aligned (vectorised) and misaligned
// (scalar) pointers.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/device_buffer.h"
#include "support/tolerance.h"
#include "textgen/kernels/layer_norm.h"

namespace textgen::kernels {
namespace {

using testing::decode;
using testing::DeviceBuffer;
using testing::encode;

class LayerNormCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  }
};

struct Case {
  int64_t tokens;
  int64_t hidden;
  DType dtype;
  bool residual;
  bool bias;
  bool inPlace;
  bool misaligned;  // offset every pointer by one element: forces the scalar path
};

std::string describe(const Case& c) {
  return std::string(dtypeName(c.dtype)) + " tokens=" + std::to_string(c.tokens) +
         " hidden=" + std::to_string(c.hidden) + (c.residual ? " residual" : "") +
         (c.bias ? " bias" : "") + (c.inPlace ? " in-place" : "") +
         (c.misaligned ? " misaligned" : "");
}

void runCase(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t n = c.tokens * c.hidden;
  const size_t es = dtypeSize(c.dtype);
  const size_t off = c.misaligned ? 1 : 0;
  std::normal_distribution<float> dist(0.0f, 1.0f), wdist(1.0f, 0.2f);
  std::vector<float> x(n), r(n), w(c.hidden), b(c.hidden);
  for (auto& v : x) v = dist(rng) * 3.0f + 0.5f;  // a mean away from 0
  for (auto& v : r) v = dist(rng);
  for (auto& v : w) v = wdist(rng);
  for (auto& v : b) v = dist(rng) * 0.1f;
  const std::vector<uint8_t> xb = encode(x, c.dtype), rb = encode(r, c.dtype),
                             wb = encode(w, c.dtype), bb = encode(b, c.dtype);

  // Reference on the host.
  std::vector<uint8_t> outRef(n * es), rOutRef(n * es);
  LayerNormParams ref{.input = xb.data(),
                      .residual = c.residual ? rb.data() : nullptr,
                      .residualOut = c.residual ? rOutRef.data() : nullptr,
                      .output = outRef.data(),
                      .weight = wb.data(),
                      .bias = c.bias ? bb.data() : nullptr,
                      .numTokens = c.tokens,
                      .hiddenSize = c.hidden,
                      .eps = 1e-5f,
                      .dtype = c.dtype};
  ASSERT_TRUE(layerNormReference(ref).ok());

  // Device.
  DeviceBuffer dx((n + off) * es), dr((n + off) * es), dw((c.hidden + off) * es);
  DeviceBuffer db((c.hidden + off) * es), dout((n + off) * es), drOut((n + off) * es);
  ASSERT_TRUE(dx.get() && dr.get() && dw.get() && db.get() && dout.get() && drOut.get());
  auto at = [&](const DeviceBuffer& buf) { return static_cast<char*>(buf.get()) + off * es; };
  TG_ASSERT_CUDA(cudaMemcpy(at(dx), xb.data(), xb.size(), cudaMemcpyHostToDevice));
  TG_ASSERT_CUDA(cudaMemcpy(at(dr), rb.data(), rb.size(), cudaMemcpyHostToDevice));
  TG_ASSERT_CUDA(cudaMemcpy(at(dw), wb.data(), wb.size(), cudaMemcpyHostToDevice));
  TG_ASSERT_CUDA(cudaMemcpy(at(db), bb.data(), bb.size(), cudaMemcpyHostToDevice));
  LayerNormParams p{.input = at(dx),
                    .output = c.inPlace ? at(dx) : at(dout),
                    .weight = at(dw),
                    .bias = c.bias ? at(db) : nullptr,
                    .numTokens = c.tokens,
                    .hiddenSize = c.hidden,
                    .eps = 1e-5f,
                    .dtype = c.dtype};
  if (c.residual) {
    p.residual = at(dr);
    p.residualOut = c.inPlace ? at(dr) : at(drOut);
  }
  const Status s = invokeLayerNorm(p, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  TG_ASSERT_CUDA(cudaDeviceSynchronize());

  std::vector<uint8_t> out(n * es), rOut(n * es);
  TG_ASSERT_CUDA(cudaMemcpy(out.data(), p.output, out.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(testing::allClose(decode(out, c.dtype), decode(outRef, c.dtype),
                                testing::toleranceFor(c.dtype), c.hidden));
  if (c.residual) {
    // The residual sum is one rounding of an exact fp32 add on both sides: bit-identical.
    TG_ASSERT_CUDA(cudaMemcpy(rOut.data(), p.residualOut, rOut.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(rOut, rOutRef);
  }
}

TEST_F(LayerNormCudaTest, MatchesReferenceOverRandomShapes) {
  std::mt19937 rng(20261123);
  const std::vector<int64_t> hiddens{1, 8, 31, 64, 100, 128, 1000, 2048, 4096, 5120, 8192, 16384};
  const std::vector<int64_t> tokens{1, 3, 17, 256};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t h : hiddens) {
      for (int64_t t : tokens) {
        for (bool residual : {false, true}) {
          for (bool bias : {false, true}) {
            runCase({t, h, dtype, residual, bias, /*inPlace=*/false, /*misaligned=*/false}, rng);
          }
        }
      }
    }
  }
}

TEST_F(LayerNormCudaTest, InPlaceAndMisalignedPaths) {
  std::mt19937 rng(7);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool misaligned : {false, true}) {
      runCase({33, 4096, dtype, true, true, /*inPlace=*/true, misaligned}, rng);
      runCase({5, 1024, dtype, false, true, /*inPlace=*/true, misaligned}, rng);
      runCase({9, 8192, dtype, true, false, /*inPlace=*/false, misaligned}, rng);
      runCase({7, 2560, dtype, false, false, /*inPlace=*/true, misaligned}, rng);
    }
  }
}

TEST_F(LayerNormCudaTest, ManyTokens) {
  std::mt19937 rng(11);
  runCase({4099, 4096, DType::kBF16, true, true, false, false}, rng);
  runCase({70000, 64, DType::kF16, true, true, false, false}, rng);
}

TEST_F(LayerNormCudaTest, InvalidParamsAreRejectedBeforeLaunch) {
  LayerNormParams p{.numTokens = 4, .hiddenSize = 128, .dtype = DType::kBF16};
  const Status s = invokeLayerNorm(p, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "layer_norm: input is null");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace textgen::kernels
