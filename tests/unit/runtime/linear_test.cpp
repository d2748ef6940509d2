// Backend::linear over a Linear: dense weights through the GEMM, the bias added, and the parts a
// format does not have (or a backend cannot run) refused by name.
#include <gtest/gtest.h>

#include <cstring>

#include "textgen/kernels/gemm.h"
#include "textgen/runtime/backend.h"

namespace textgen::runtime {
namespace {

std::unique_ptr<Buffer> filled(Backend& b, const std::vector<float>& v) {
  auto buf = *b.allocate(v.size() * 4);
  EXPECT_TRUE(b.upload(*buf, v.data(), v.size() * 4).ok());
  return buf;
}

TEST(Linear, DenseWithBiasIsTheGemmPlusTheBias) {
  auto backend = makeCpuBackend(1);
  const int64_t rows = 3, in = 5, out = 4;
  std::vector<float> x(rows * in), w(out * in), bias(out);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * static_cast<float>(i % 5) - 0.25f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i) - 1.5f;
  Linear l;
  l.in = in;
  l.out = out;
  l.split = SplitKind::kColumn;
  l.owned = filled(*backend, w);
  l.weight = l.owned.get();
  auto xb = filled(*backend, x);
  auto y = *backend->allocate(rows * out * 4);
  ASSERT_TRUE(backend->linear(l, xb->data(), y->data(), rows).ok());
  std::vector<float> want(rows * out);
  ASSERT_TRUE(kernels::gemmReference({x.data(), w.data(), want.data(), rows, in, out}).ok());
  for (int64_t i = 0; i < rows * out; ++i) EXPECT_FLOAT_EQ(y->as<float>()[i], want[i]) << i;
  l.bias = filled(*backend, bias);
  ASSERT_TRUE(backend->linear(l, xb->data(), y->data(), rows).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < out; ++j)
      EXPECT_FLOAT_EQ(y->as<float>()[r * out + j], want[r * out + j] + bias[j]);
  }
}

TEST(Linear, RefusesWhatItCannotRun) {
  auto backend = makeCpuBackend(1);
  auto y = *backend->allocate(64);
  Linear l;
  EXPECT_EQ(backend->linear(l, y->data(), y->data(), 1).code(), StatusCode::kInvalidArgument);
  l.in = 4;
  l.out = 4;
  l.owned = *backend->allocate(8);  // smaller than 4 x 4 floats
  l.weight = l.owned.get();
  EXPECT_EQ(backend->linear(l, y->data(), y->data(), 1).code(), StatusCode::kInvalidArgument);
  l.owned = *backend->allocate(64);
  l.weight = l.owned.get();
  l.scales = *backend->allocate(16);  // dense weights have no scales
  const Status s = backend->linear(l, y->data(), y->data(), 1);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("scales"), std::string::npos) << s;
}

}  // namespace
}  // namespace textgen::runtime
