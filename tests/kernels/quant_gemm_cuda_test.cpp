// invokeQuantGemm against quantGemmReference (kernels/quant_gemm.h) over every code, activation
// scheme, dtype and every path: the tensor-core GEMV (16-bit x up to 32 rows in one, two or four
// n8 tiles; fp8 W8A8 with one scale per output up to 8), the tile kernel (9 to 64 rows, x through
// shared memory; LongRows' 8464 outputs take its 64-output blocks), the fp32 register-decoding GEMV
// (rows <= 8, LLM.int8 and other fp8 layouts), and the dequantize + cuBLASLt GEMM (more rows; fp8
// with one tensor scale: cuBLASLt's FP8 GEMM), with and without an act-order permutation, groups
// from 32 inputs to one per output, and rows long enough to cross every stage of the GEMV's
// pipeline.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "support/tolerance.h"
#include "textgen/kernels/fp8.h"
#include "textgen/kernels/gated_activation.h"
#include "textgen/kernels/gemm_runner.h"
#include "textgen/kernels/quant_gemm.h"

namespace textgen::kernels {
namespace {

using testing::decode;
using testing::DeviceBuffer;
using testing::encode;

class QuantGemmCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
    auto r = GemmRunner::create(nullptr, 32u << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = std::move(*r);
  }
  std::mt19937 rng_{99};
  std::unique_ptr<GemmRunner> runner_;
};

template <typename T>
std::unique_ptr<DeviceBuffer> toDevice(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return b;
}

struct Case {
  QuantCode code;
  ActQuant act;
  DType dtype;
  int64_t rows, in, out, groupSize;
  bool perm = false;
  bool staticInputScale = false;
  bool fp8PerOutputScales =
      false;  // fp8 with groupSize == in: one scale per output, not per tensor
};

std::string describe(const Case& c) {
  return std::string(toString(c.code)) + " act=" + std::to_string(static_cast<int>(c.act)) + " " +
         std::string(dtypeName(c.dtype)) + " " + std::to_string(c.rows) + "x" +
         std::to_string(c.in) + "x" + std::to_string(c.out) + " g" + std::to_string(c.groupSize) +
         (c.perm ? " perm" : "") + (c.staticInputScale ? " static" : "") +
         (c.fp8PerOutputScales ? " per-output" : "");
}

// gated: W is also taken as [gate; up] stacked (c.out = 2n), and invokeQuantGemmGated must give
// the bits of invokeQuantGemm followed by invokeGatedActivation (where quantGemmGatedTakes it).
void runCase(const Case& c, std::mt19937& rng, GemmRunner& runner,
             const Activation* gated = nullptr) {
  SCOPED_TRACE(describe(c));
  const int bits = quantBits(c.code);
  const int64_t groups = c.in / c.groupSize;
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> packed(static_cast<size_t>(c.out * quantRowBytes(c.code, c.in)));
  for (uint8_t& b : packed) {
    b = static_cast<uint8_t>(byte(rng));
    if (c.code == QuantCode::kFp8E4M3 && (b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  // Scales that give outputs of about unit size.
  const float codeScale = c.code == QuantCode::kUint4     ? 4.6f
                          : c.code == QuantCode::kUint8   ? 74.0f
                          : c.code == QuantCode::kFp8E4M3 ? 60.0f
                                                          : 0.5f;
  std::normal_distribution<float> scaleNoise(1.0f, 0.2f);
  std::vector<float> scales(static_cast<size_t>(c.out * groups));
  for (float& s : scales) s = scaleNoise(rng) / (codeScale * std::sqrt(static_cast<float>(c.in)));
  std::vector<float> tensorScale;
  if (c.code == QuantCode::kFp8E4M3 && c.groupSize == c.in && !c.fp8PerOutputScales) {
    std::fill(scales.begin(), scales.end(), scales[0]);
    tensorScale = {scales[0]};
  }
  std::vector<uint8_t> zeros;
  if (quantHasZeros(c.code)) {
    zeros.resize(scales.size());
    for (uint8_t& z : zeros)
      z = static_cast<uint8_t>(bits == 4 ? byte(rng) % 16 : 118 + byte(rng) % 20);
  }
  std::vector<int32_t> perm;
  if (c.perm) {
    perm.resize(static_cast<size_t>(c.in));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> xf(static_cast<size_t>(c.rows * c.in));
  for (float& v : xf) v = normal(rng);
  if (c.act == ActQuant::kLlmInt8) {  // a few outlier columns, one outlier alone in its column
    for (int64_t r = 0; r < c.rows; ++r) xf[r * c.in + 3] = 9.0f * (r % 2 ? 1.0f : -1.0f);
    xf[(c.rows - 1) * c.in + 17] = 6.0f;
  }
  // Prefill-sized fp8 activations: the tensor's absmax in its very last value (8: the normal
  // samples stay under about 5.5), so that a scale taken from only some of the per-block partial
  // maxima (or stale ones) differs and clips it. (At 60 the scale's coarser steps left a few fp16
  // outputs of the dequantize path, which rounds x' to the dtype, just past the tolerance.)
  if (c.act == ActQuant::kFp8 && c.rows * c.in > (int64_t{1} << 17)) xf.back() = 8.0f;
  const std::vector<uint8_t> x = encode(xf, c.dtype);
  const float inputScale = 0.011f;

  QuantWeight hw{.code = c.code,
                 .packed = packed.data(),
                 .scales = scales.data(),
                 .zeros = zeros.empty() ? nullptr : zeros.data(),
                 .groupSize = c.groupSize,
                 .perm = perm.empty() ? nullptr : perm.data(),
                 .act = c.act,
                 .threshold = 6.0f,
                 .inputScale = c.staticInputScale ? &inputScale : nullptr,
                 .tensorScale = tensorScale.empty() ? nullptr : tensorScale.data()};
  const size_t yBytes = static_cast<size_t>(c.rows * c.out) * dtypeSize(c.dtype);
  std::vector<uint8_t> want(yBytes);
  ASSERT_TRUE(quantGemmReference({.x = x.data(),
                                  .w = hw,
                                  .y = want.data(),
                                  .rows = c.rows,
                                  .in = c.in,
                                  .out = c.out,
                                  .dtype = c.dtype})
                  .ok());

  auto dPacked = toDevice(packed), dScales = toDevice(scales), dX = toDevice(x);
  auto dZeros = zeros.empty() ? nullptr : toDevice(zeros);
  auto dPerm = perm.empty() ? nullptr : toDevice(perm);
  auto dTensor = tensorScale.empty() ? nullptr : toDevice(tensorScale);
  auto dInput = toDevice(std::vector<float>{inputScale});
  QuantWeight dw = hw;
  dw.packed = dPacked->get();
  dw.scales = dScales->as<float>();
  dw.zeros = dZeros ? dZeros->as<uint8_t>() : nullptr;
  dw.perm = dPerm ? dPerm->as<int32_t>() : nullptr;
  dw.tensorScale = dTensor ? dTensor->as<float>() : nullptr;
  dw.inputScale = c.staticInputScale ? dInput->as<float>() : nullptr;
  DeviceBuffer dy(yBytes);
  const QuantGemmParams p{.x = dX->get(),
                          .w = dw,
                          .y = dy.get(),
                          .rows = c.rows,
                          .in = c.in,
                          .out = c.out,
                          .dtype = c.dtype};
  DeviceBuffer ws(quantGemmWorkspaceBytes(p));
  const Status st = invokeQuantGemm(p, ws.get(), ws.bytes(), runner, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(yBytes);
  ASSERT_EQ(cudaMemcpy(got.data(), dy.get(), yBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  // The fp32 GEMV (LLM.int8, fp8 per group) computes as the reference does (fp32, one rounding).
  // The tensor-core GEMV and the cuBLASLt path round the dequantized weight (and x') to the dtype
  // first, and fp8 W8A8 sums in the tensor cores' own order: twice the tolerance.
  testing::Tolerance tol = testing::toleranceFor(c.dtype);
  if (c.dtype == DType::kF32) tol = {2e-5f, 2e-5f};
  const bool fp32Gemv =
      c.act == ActQuant::kLlmInt8 || (c.act == ActQuant::kFp8 && c.groupSize != c.in);
  if (c.rows > kMaxQuantGemvRows || c.dtype == DType::kF32 || !fp32Gemv) {
    tol.atol *= 2;
    tol.rtol *= 2;
  }
  EXPECT_TRUE(testing::allClose(decode(got, c.dtype), decode(want, c.dtype), tol, c.out));
  if (!gated) return;
  // fp8 W8A8 runs on the tensor cores from sm_89 on; before it, no gated GEMV takes fp8 x.
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  if (c.act == ActQuant::kFp8 && major * 10 + minor < 89) {
    EXPECT_FALSE(quantGemmGatedTakes(p));
    return;
  }
  ASSERT_TRUE(quantGemmGatedTakes(p));
  const int64_t n = c.out / 2;
  const size_t actBytes = static_cast<size_t>(c.rows * n) * dtypeSize(c.dtype);
  DeviceBuffer dAct(actBytes), dFused(actBytes);
  ASSERT_TRUE(invokeGatedActivation({.gateUp = dy.get(),
                                     .out = dAct.get(),
                                     .rows = c.rows,
                                     .n = n,
                                     .dtype = c.dtype,
                                     .activation = *gated},
                                    nullptr)
                  .ok());
  QuantGemmParams pg = p;
  pg.y = dFused.get();
  const Status sg = invokeQuantGemmGated(pg, *gated, ws.get(), ws.bytes(), runner, nullptr);
  ASSERT_TRUE(sg.ok()) << sg;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> wantAct(actBytes), gotAct(actBytes);
  ASSERT_EQ(cudaMemcpy(wantAct.data(), dAct.get(), actBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gotAct.data(), dFused.get(), actBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t differ = 0;
  for (size_t i = 0; i < actBytes; ++i) differ += wantAct[i] != gotAct[i];
  EXPECT_EQ(differ, 0) << "bytes of the fused gated GEMV that differ from GEMV + activation";
}

TEST_F(QuantGemmCudaTest, WeightOnlyCodesMatchTheReference) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (QuantCode code : {QuantCode::kUint4, QuantCode::kUint8, QuantCode::kNf4, QuantCode::kFp4,
                           QuantCode::kFp8E4M3}) {
      for (int64_t rows : {1, 2, 3, 8, 9, 16, 17, 32, 40, 64, 65}) {
        runCase({code, ActQuant::kNone, dt, rows, 512, 96, 128}, rng_, *runner_);
        runCase({code, ActQuant::kNone, dt, rows, 256, 40, 256}, rng_, *runner_);
      }
      runCase({code, ActQuant::kNone, dt, 1, 1024, 136, 64}, rng_, *runner_);
      runCase({code, ActQuant::kNone, dt, 5, 1024, 136, 32}, rng_, *runner_);
    }
  }
}

TEST_F(QuantGemmCudaTest, LongRowsCrossEveryStageOfTheGemvPipeline) {
  // 4160 inputs: 130 vectors of 4-bit codes (260 of 8-bit), more steps than the warps of a block
  // take in one round, and a last step only partly inside the row; outputs not a multiple of 16.
  for (DType dt : {DType::kF16, DType::kBF16})
    for (QuantCode code : {QuantCode::kUint4, QuantCode::kUint8, QuantCode::kNf4, QuantCode::kFp4,
                           QuantCode::kFp8E4M3})
      for (int64_t rows : {1, 7, 25}) {
        runCase({code, ActQuant::kNone, dt, rows, 4160, 24, 64}, rng_, *runner_);
        runCase({code, ActQuant::kNone, dt, rows, 96, 17, 32}, rng_, *runner_);
        // Enough 16-output tiles (529) for blocks of 8 warps on any GPU up to 264 SMs; the shapes
        // above take blocks of 12.
        runCase({code, ActQuant::kNone, dt, rows, 512, 8464, 128}, rng_, *runner_);
      }
}

TEST_F(QuantGemmCudaTest, ActOrderPermutationMatchesTheReference) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (QuantCode code : {QuantCode::kUint4, QuantCode::kUint8}) {
      for (int64_t rows : {1, 4, 8, 20, 33}) {
        runCase({code, ActQuant::kNone, dt, rows, 512, 72, 128, true}, rng_, *runner_);
        runCase({code, ActQuant::kNone, dt, rows, 384, 64, 32, true}, rng_, *runner_);
        // A row-parallel shard of an act-order layer: its groups' runs have uneven lengths, so
        // the runtime groups are their gcd (1 or a few inputs) and the dequantize path serves it.
        runCase({code, ActQuant::kNone, dt, rows, 96, 48, 1, true}, rng_, *runner_);
        runCase({code, ActQuant::kNone, dt, rows, 32, 64, 4, true}, rng_, *runner_);
      }
    }
  }
}

TEST_F(QuantGemmCudaTest, GroupsTheGemvDoesNotTakeFallBackToTheGemm) {
  // Groups of 16 4-bit codes (a vector holds 32) and rows of 40 inputs: the dequantize path.
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int64_t rows : {1, 8, 12}) {
      runCase({QuantCode::kUint4, ActQuant::kNone, dt, rows, 688, 64, 16}, rng_, *runner_);
      runCase({QuantCode::kNf4, ActQuant::kNone, dt, rows, 40, 24, 40}, rng_, *runner_);
    }
}

TEST_F(QuantGemmCudaTest, GatedGemvEqualsTheGemvThenTheActivation) {
  // Every code on the tensor-core GEMV (blocks of 12 warps, and of 8 at 8464 outputs), rows 1 to
  // 8, outputs not a multiple of 16, each activation; fp8 W8A8 (one tensor scale, and per output);
  // an act-order permutation.
  const Activation acts[] = {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh,
                             Activation::kRelu};
  int i = 0;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (QuantCode code : {QuantCode::kUint4, QuantCode::kUint8, QuantCode::kNf4, QuantCode::kFp4,
                           QuantCode::kFp8E4M3}) {
      for (int64_t rows : {1, 3, 8}) {
        const Activation* a = &acts[i++ % 4];
        runCase({code, ActQuant::kNone, dt, rows, 512, 96, 128}, rng_, *runner_, a);
        runCase({code, ActQuant::kNone, dt, rows, 4160, 36, 64}, rng_, *runner_, a);
      }
      runCase({code, ActQuant::kNone, dt, 2, 512, 8464, 128}, rng_, *runner_, &acts[0]);
    }
    for (int64_t rows : {1, 5, 8}) {
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 512, 96, 512}, rng_, *runner_,
              &acts[0]);
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 512, 24, 512, false, false, true},
              rng_, *runner_, &acts[1]);
      runCase({QuantCode::kUint4, ActQuant::kNone, dt, rows, 512, 72, 128, true}, rng_, *runner_,
              &acts[0]);
    }
  }
}

TEST_F(QuantGemmCudaTest, LlmInt8DecompositionMatchesTheReference) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32})
    for (int64_t rows : {1, 3, 8, 9, 64})
      runCase({QuantCode::kUint8, ActQuant::kLlmInt8, dt, rows, 512, 80, 512}, rng_, *runner_);
}

TEST_F(QuantGemmCudaTest, Fp8ActivationsMatchTheReference) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (int64_t rows : {1, 5, 8, 9, 64, 200}) {
      // One tensor scale: cuBLASLt's FP8 GEMM past 8 rows; per output: the dequantize path.
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 512, 96, 512}, rng_, *runner_);
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 256, 64, 256, false, true}, rng_,
              *runner_);
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 256, 48, 128}, rng_, *runner_);
      // One scale per output: the W8A8 GEMV up to 8 rows, then the dequantize path.
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 4160, 40, 4160, false, false, true},
              rng_, *runner_);
      runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, rows, 512, 24, 512, false, true, true},
              rng_, *runner_);
    }
    // Prefill-sized x (1.2M values: the vectorised absmax, several rounds of its grid, and
    // quantization), with one tensor scale (cuBLASLt's FP8 GEMM) and one per output (dequantize).
    runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, 300, 4160, 96, 4160}, rng_, *runner_);
    runCase({QuantCode::kFp8E4M3, ActQuant::kFp8, dt, 300, 4160, 40, 4160, false, false, true},
            rng_, *runner_);
  }
}

}  // namespace
}  // namespace textgen::kernels
