// Element access for the CPU references: reads and writes one element of a dtype-typed buffer as
// float, rounding on store exactly as CUDA's round-to-nearest-even conversions do.
#pragma once

#include <cstdint>

#include "textgen/kernels/dtype.h"
#include "textgen/kernels/fp8.h"
#include "textgen/kernels/half.h"
#include "textgen/kernels/kv_cache_dtype.h"

namespace textgen::kernels {

// Reads and writes one element of a dtype-typed buffer as float, rounding on store.
struct Elements {
  DType dtype;

  float load(const void* base, int64_t i) const {
    switch (dtype) {
      case DType::kF32: return static_cast<const float*>(base)[i];
      case DType::kF16: return f16ToFloat(static_cast<const uint16_t*>(base)[i]);
      case DType::kBF16: return bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    }
    return 0.0f;
  }
  void store(void* base, int64_t i, float v) const {
    switch (dtype) {
      case DType::kF32: static_cast<float*>(base)[i] = v; break;
      case DType::kF16: static_cast<uint16_t*>(base)[i] = floatToF16(v); break;
      case DType::kBF16: static_cast<uint16_t*>(base)[i] = floatToBf16(v); break;
    }
  }
  float round(float v) const {
    switch (dtype) {
      case DType::kF32: return v;
      case DType::kF16: return f16ToFloat(floatToF16(v));
      case DType::kBF16: return bf16ToFloat(floatToBf16(v));
    }
    return v;
  }
};

// One element of a KV cache as float: the compute dtype's element under kAuto, else an fp8 code
// (kv_cache_dtype.h), rounded on store (saturating, fp8.h).
struct CacheElements {
  DType dtype;
  KvCacheDType cache;

  float load(const void* base, int64_t i) const {
    const auto* codes = static_cast<const uint8_t*>(base);
    switch (cache) {
      case KvCacheDType::kAuto: break;
      case KvCacheDType::kFp8E4M3: return fp8E4M3ToFloat(codes[i]);
      case KvCacheDType::kFp8E5M2: return fp8E5M2ToFloat(codes[i]);
    }
    return Elements{dtype}.load(base, i);
  }
  void store(void* base, int64_t i, float v) const {
    auto* codes = static_cast<uint8_t*>(base);
    switch (cache) {
      case KvCacheDType::kAuto: break;
      case KvCacheDType::kFp8E4M3: codes[i] = floatToFp8E4M3(v); return;
      case KvCacheDType::kFp8E5M2: codes[i] = floatToFp8E5M2(v); return;
    }
    Elements{dtype}.store(base, i, v);
  }
};

}  // namespace textgen::kernels
