// How the paged KV cache stores keys and values (TGI's --kv-cache-dtype): in the compute dtype
// (kAuto), or as 8-bit float codes (fp8.h: e4m3fn, e5m2) of value * (1 / scale) with scale 1.0,
// the plain saturating cast TGI and vLLM make when a checkpoint carries no KV scales (textgen reads
// none). Kernels that write the cache convert the compute-dtype value to the code (fp8.h's
// floatToFp8*, bit-exact with CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE); kernels that read
// it widen the code back to float (exact; also exact in float16 and bfloat16) before any
// arithmetic. An fp8 cache takes one byte per element: half a 16-bit cache's, a quarter of fp32's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "textgen/kernels/dtype.h"

namespace textgen::kernels {

enum class KvCacheDType : uint8_t { kAuto, kFp8E4M3, kFp8E5M2 };

constexpr bool isValid(KvCacheDType c) {
  return c == KvCacheDType::kAuto || c == KvCacheDType::kFp8E4M3 || c == KvCacheDType::kFp8E5M2;
}

// Bytes of one cached element for a model computing in `dtype`.
constexpr size_t kvCacheElementSize(KvCacheDType cache, DType dtype) {
  return cache == KvCacheDType::kAuto ? dtypeSize(dtype) : 1;
}

// TGI's spellings (--kv-cache-dtype); "auto": the compute dtype.
constexpr std::string_view kvCacheDTypeName(KvCacheDType c) {
  switch (c) {
    case KvCacheDType::kAuto: return "auto";
    case KvCacheDType::kFp8E4M3: return "fp8_e4m3fn";
    case KvCacheDType::kFp8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

// The fp8 formats by TGI's name; nullopt for anything else ("auto" included: no flag is the
// compute dtype).
constexpr std::optional<KvCacheDType> fp8KvCacheDTypeOf(std::string_view name) {
  if (name == "fp8_e4m3fn") return KvCacheDType::kFp8E4M3;
  if (name == "fp8_e5m2") return KvCacheDType::kFp8E5M2;
  return std::nullopt;
}

}  // namespace textgen::kernels
