// invokeClamp against clampReference over random shapes and row strides, every dtype: equal bit
// for bit (the op only selects the input or a rounded bound).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/device_buffer.h"
#include "textgen/kernels/clamp.h"

namespace textgen::kernels {
namespace {

using testing::DeviceBuffer;
using testing::encode;

class ClampCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(ClampCudaTest, MatchesReference) {
  std::mt19937 rng(15);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [rows, cols, gap] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 1, 0}, {3, 192, 0}, {17, 96, 32}, {130, 7, 5}}) {
      SCOPED_TRACE(std::string(dtypeName(dt)) + " rows=" + std::to_string(rows) +
                   " cols=" + std::to_string(cols) + " gap=" + std::to_string(gap));
      const int64_t stride = cols + gap;
      std::vector<float> x(rows * stride);
      for (auto& v : x) v = dist(rng);
      std::vector<uint8_t> want = encode(x, dt);
      const ClampParams host{.x = want.data(),
                             .rows = rows,
                             .cols = cols,
                             .rowStride = stride,
                             .limit = 2.5f,
                             .dtype = dt};
      ASSERT_TRUE(clampReference(host).ok());
      DeviceBuffer d(want.size());
      const std::vector<uint8_t> in = encode(x, dt);
      TG_ASSERT_CUDA(cudaMemcpy(d.get(), in.data(), in.size(), cudaMemcpyHostToDevice));
      ClampParams dev = host;
      dev.x = d.get();
      ASSERT_TRUE(invokeClamp(dev, nullptr).ok());
      std::vector<uint8_t> got(want.size());
      TG_ASSERT_CUDA(cudaMemcpy(got.data(), d.get(), got.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(got, want);
    }
  }
}

}  // namespace
}  // namespace textgen::kernels
