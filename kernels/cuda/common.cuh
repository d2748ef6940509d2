// Device helpers shared by the kernels: float conversions per element type, aligned vectors, and
// launch error reporting. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"

namespace textgen::kernels::cuda {

template <typename T>
struct Convert;
template <>
struct Convert<float> {
  static __device__ __forceinline__ float toFloat(float v) { return v; }
  static __device__ __forceinline__ float fromFloat(float v) { return v; }
};
template <>
struct Convert<__half> {
  static __device__ __forceinline__ float toFloat(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half fromFloat(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  static __device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 fromFloat(float v) {
    return __float2bfloat16_rn(v);
  }
};

// Rounds v to T's precision and back.
template <typename T>
__device__ __forceinline__ float roundTo(float v) {
  return Convert<T>::toFloat(Convert<T>::fromFloat(v));
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// OK, or INTERNAL naming the kernel when its launch failed.
inline Status launchStatus(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return okStatus();
  return internalError(std::string(kernel) + ": kernel launch failed: " + cudaGetErrorString(err));
}

}  // namespace textgen::kernels::cuda

// Calls F<T>(args...) with T the element type of `dtype`, returning its Status.
#define TG_DISPATCH_DTYPE(dtype, F, ...)                                           \
  do {                                                                             \
    switch (dtype) {                                                               \
      case ::textgen::kernels::DType::kF32: return F<float>(__VA_ARGS__);          \
      case ::textgen::kernels::DType::kF16: return F<__half>(__VA_ARGS__);         \
      case ::textgen::kernels::DType::kBF16: return F<__nv_bfloat16>(__VA_ARGS__); \
    }                                                                              \
    return ::textgen::invalidArgumentError("unknown dtype");                       \
  } while (0)
