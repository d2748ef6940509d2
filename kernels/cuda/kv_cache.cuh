// Device access to KV cache elements (textgen/kernels/kv_cache_dtype.h): CacheOf<T, kCache>::Elem
// is what the cache holds for a model computing in T, store() turns a T value into it and
// toFloat() reads it back. fp8 codes are written with CUDA's saturating round-to-nearest-even
// (__nv_cvt_float_to_fp8 with __NV_SATFINITE, as fp8.h on the host) and widened through half,
// which holds every e4m3fn and e5m2 value exactly. Included only by .cu files.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common.cuh"
#include "textgen/kernels/kv_cache_dtype.h"

namespace textgen::kernels::cuda {

template <typename T, KvCacheDType kCache>
struct CacheOf;

template <typename T>
struct CacheOf<T, KvCacheDType::kAuto> {
  using Elem = T;
  static __device__ __forceinline__ T store(T v) { return v; }
  static __device__ __forceinline__ float toFloat(T v) { return Convert<T>::toFloat(v); }
};

template <typename T, __nv_fp8_interpretation_t kFormat>
struct Fp8CacheOf {
  using Elem = uint8_t;
  static __device__ __forceinline__ uint8_t store(T v) {
    return __nv_cvt_float_to_fp8(Convert<T>::toFloat(v), __NV_SATFINITE, kFormat);
  }
  static __device__ __forceinline__ float toFloat(uint8_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, kFormat)));
  }
};

template <typename T>
struct CacheOf<T, KvCacheDType::kFp8E4M3> : Fp8CacheOf<T, __NV_E4M3> {};
template <typename T>
struct CacheOf<T, KvCacheDType::kFp8E5M2> : Fp8CacheOf<T, __NV_E5M2> {};

}  // namespace textgen::kernels::cuda

// Calls F<T, kCache>(args...) with kCache the value of `cache` (a KvCacheDType), returning its
// Status.
#define TG_DISPATCH_KV_CACHE(cache, F, T, ...)                                \
  do {                                                                        \
    switch (cache) {                                                          \
      case ::textgen::kernels::KvCacheDType::kAuto:                           \
        return F<T, ::textgen::kernels::KvCacheDType::kAuto>(__VA_ARGS__);    \
      case ::textgen::kernels::KvCacheDType::kFp8E4M3:                        \
        return F<T, ::textgen::kernels::KvCacheDType::kFp8E4M3>(__VA_ARGS__); \
      case ::textgen::kernels::KvCacheDType::kFp8E5M2:                        \
        return F<T, ::textgen::kernels::KvCacheDType::kFp8E5M2>(__VA_ARGS__); \
    }                                                                         \
    return ::textgen::invalidArgumentError("unknown KV cache dtype");         \
  } while (0)
