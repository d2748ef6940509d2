// Element-wise comparison with explicit per-dtype tolerances: |actual - expected| <= atol +
// rtol*|expected|. On failure reports the count and the first mismatch, so a kernel bug is located,
// not just detected.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "textgen/kernels/dtype.h"

namespace textgen::testing {

struct Tolerance {
  float atol;
  float rtol;
};

// One rounding step of each format is 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16) relative; kernels and
// references may differ by a reduction order and one extra rounding, so allow a few of those.
inline Tolerance toleranceFor(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32: return {1e-5f, 1e-5f};
    case kernels::DType::kF16: return {1e-3f, 2.0f / 1024.0f};
    case kernels::DType::kBF16: return {1e-2f, 2.0f / 128.0f};
  }
  return {0.0f, 0.0f};
}

// `width` names the row length so mismatches print as [row, col].
inline ::testing::AssertionResult allClose(const std::vector<float>& actual,
                                           const std::vector<float>& expected, Tolerance tol,
                                           int64_t width = 0) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  int64_t bad = 0;
  int64_t first = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const float a = actual[i], e = expected[i];
    const bool ok =
        (std::isnan(a) && std::isnan(e)) || std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream where;
  if (width > 0) {
    where << "[" << first / width << ", " << first % width << "]";
  } else {
    where << "[" << first << "]";
  }
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ (atol " << tol.atol << ", rtol "
         << tol.rtol << "); first at " << where.str() << ": got " << actual[first] << ", expected "
         << expected[first];
}

}  // namespace textgen::testing
