#include "textgen/kernels/kv_write.h"

#include <cstring>
#include <string>

#include "elements.h"

namespace textgen::kernels {

Status validateKvWrite(const KvWriteParams& p) {
  if (p.rows < 0 || p.numKvHeads <= 0 || p.headDim <= 0 || p.numSlots <= 0)
    return invalidArgumentError("kv_write: bad shape");
  if (p.kvRowStride < p.numKvHeads * p.headDim)
    return invalidArgumentError("kv_write: the row stride is shorter than the row");
  if (p.rows > 0 && (!p.k || !p.v || !p.kCache || !p.vCache || !p.slots))
    return invalidArgumentError("kv_write: k, v, caches and slots are required");
  if (!isValid(p.cacheDtype)) return invalidArgumentError("kv_write: unknown cache dtype");
  return okStatus();
}

Status kvWriteReference(const KvWriteParams& p) {
  TG_RETURN_IF_ERROR(validateKvWrite(p));
  const size_t es = dtypeSize(p.dtype);
  const int64_t width = p.numKvHeads * p.headDim;
  const Elements in{p.dtype};
  const CacheElements cache{p.dtype, p.cacheDtype};
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t slot = p.slots[r];
    if (slot < 0 || slot >= p.numSlots)
      return invalidArgumentError("kv_write: slot " + std::to_string(slot) + " out of range");
    if (p.cacheDtype == KvCacheDType::kAuto) {
      std::memcpy(static_cast<char*>(p.kCache) + slot * width * es,
                  static_cast<const char*>(p.k) + r * p.kvRowStride * es, width * es);
      std::memcpy(static_cast<char*>(p.vCache) + slot * width * es,
                  static_cast<const char*>(p.v) + r * p.kvRowStride * es, width * es);
      continue;
    }
    for (int64_t i = 0; i < width; ++i) {
      cache.store(p.kCache, slot * width + i, in.load(p.k, r * p.kvRowStride + i));
      cache.store(p.vCache, slot * width + i, in.load(p.v, r * p.kvRowStride + i));
    }
  }
  return okStatus();
}

}  // namespace textgen::kernels
