// Tensor: an owning, contiguous, row-major host buffer with a dtype and a shape. The CPU backend
// computes in float32; the CUDA backend (later) keeps device buffers behind the same Backend API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "textgen/kernels/dtype.h"

namespace textgen::runtime {

using kernels::DType;

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape)
      : dtype_(dtype), shape_(std::move(shape)), data_(numel() * kernels::dtypeSize(dtype_)) {}

  static Tensor zeros(std::vector<int64_t> shape) { return Tensor(DType::kF32, std::move(shape)); }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  int64_t numel() const {
    return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>());
  }
  size_t bytes() const { return data_.size(); }
  bool empty() const { return data_.empty(); }

  void* data() { return data_.data(); }
  const void* data() const { return data_.data(); }
  float* f32() { return reinterpret_cast<float*>(data_.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(data_.data()); }

  std::string shapeString() const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<unsigned char> data_;
};

}  // namespace textgen::runtime
