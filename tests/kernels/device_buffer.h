// Test helpers for device memory: an owning buffer and typed host<->device copies through float.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "textgen/kernels/dtype.h"
#include "textgen/kernels/half.h"

#define TG_ASSERT_CUDA(expr)                                                         \
  do {                                                                               \
    cudaError_t tg_err_ = (expr);                                                    \
    ASSERT_EQ(tg_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(tg_err_); \
  } while (0)

namespace textgen::testing {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as(size_t elementOffset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_)) + elementOffset;
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Host bytes of `values` in `dtype` (rounded to nearest even for 16-bit types).
inline std::vector<uint8_t> encode(const std::vector<float>& values, kernels::DType dtype) {
  std::vector<uint8_t> bytes(values.size() * kernels::dtypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == kernels::DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t h = dtype == kernels::DType::kF16 ? kernels::floatToF16(values[i])
                                                       : kernels::floatToBf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

inline std::vector<float> decode(const std::vector<uint8_t>& bytes, kernels::DType dtype) {
  const size_t n = bytes.size() / kernels::dtypeSize(dtype);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == kernels::DType::kF32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      values[i] = dtype == kernels::DType::kF16 ? kernels::f16ToFloat(h) : kernels::bf16ToFloat(h);
    }
  }
  return values;
}

}  // namespace textgen::testing
