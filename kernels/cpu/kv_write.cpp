#include "textgen/kernels/kv_write.h"

#include <cstring>
#include <string>

namespace textgen::kernels {

Status validateKvWrite(const KvWriteParams& p) {
  if (p.rows < 0 || p.numKvHeads <= 0 || p.headDim <= 0 || p.numSlots <= 0)
    return invalidArgumentError("kv_write: bad shape");
  if (p.kvRowStride < p.numKvHeads * p.headDim)
    return invalidArgumentError("kv_write: the row stride is shorter than the row");
  if (p.rows > 0 && (!p.k || !p.v || !p.kCache || !p.vCache || !p.slots))
    return invalidArgumentError("kv_write: k, v, caches and slots are required");
  return okStatus();
}

Status kvWriteReference(const KvWriteParams& p) {
  TG_RETURN_IF_ERROR(validateKvWrite(p));
  const size_t es = dtypeSize(p.dtype);
  const int64_t width = p.numKvHeads * p.headDim;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t slot = p.slots[r];
    if (slot < 0 || slot >= p.numSlots)
      return invalidArgumentError("kv_write: slot " + std::to_string(slot) + " out of range");
    std::memcpy(static_cast<char*>(p.kCache) + slot * width * es,
                static_cast<const char*>(p.k) + r * p.kvRowStride * es, width * es);
    std::memcpy(static_cast<char*>(p.vCache) + slot * width * es,
                static_cast<const char*>(p.v) + r * p.kvRowStride * es, width * es);
  }
  return okStatus();
}

}  // namespace textgen::kernels
