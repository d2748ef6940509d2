// Greedy choice on the device: per row of logits, the arg-max (the lowest index among equal
// maxima, as std::max_element) and its log-probability log_softmax(row)[id], computed in fp32 from
// the row's values widened exactly. Saves downloading whole logit rows when every request of a step
// decodes greedily without logit processors.
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct ArgmaxParams {
  const void* logits = nullptr;  // [rows, vocab]
  int32_t* ids = nullptr;        // [rows]
  float* logprobs = nullptr;     // [rows]
  int64_t rows = 0, vocab = 0;
  DType dtype = DType::kF32;
};

Status validateArgmax(const ArgmaxParams& p);
Status argmaxReference(const ArgmaxParams& p);
Status invokeArgmax(const ArgmaxParams& p, Stream stream);

}  // namespace textgen::kernels
