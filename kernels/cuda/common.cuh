// Device helpers shared by the kernels: float conversions per element type, aligned vectors, and
// launch error reporting. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/launch.h"

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

// Programmatic dependent launch (Hopper; no-ops before sm_90). Kernels are launched so that they
// may start while the kernel before them in the stream is still running: every kernel calls
// waitForPrimary() in every block before it reads anything an earlier kernel wrote or writes
// anything an earlier kernel reads (it returns once those kernels have completed and their writes
// are visible), and before it exits, so that its completion implies theirs. Only reads of memory
// no kernel writes (weights) may come before it. allowDependents() lets the next kernel's blocks be
// scheduled (they then wait in their own waitForPrimary) once every block of this one has called
// it.
__device__ __forceinline__ void waitForPrimary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Part `part` of `parts` of [base, base + bytes) requested into the L2 cache by one bulk prefetch
// (sm_90's cp.async.bulk.prefetch; nothing on older GPUs), trimmed to whole 16-byte units. Call
// from one thread per part.
__device__ __forceinline__ void prefetchL2Part(const void* base, size_t bytes, int part,
                                               int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + 15) & ~uintptr_t{15};
  const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + bytes) & ~uintptr_t{15};
  if (end <= start) return;
  const size_t total = end - start;
  const size_t chunk = ((total + parts - 1) / parts + 15) & ~size_t{15};
  const size_t begin = chunk * static_cast<size_t>(part);
  if (begin >= total) return;
  const size_t n = total - begin < chunk ? total - begin : chunk;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(start + begin),
               "r"(static_cast<uint32_t>(n))
               : "memory");
#endif
}

__device__ __forceinline__ void allowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `stream`, with programmatic dependent launch when it is on (launch.h), and
// reports a failed launch naming `what`.
template <typename... Params, typename... Args>
Status launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
              cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = programmaticLaunch() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it
    return internalError(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
  }
  return okStatus();
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
