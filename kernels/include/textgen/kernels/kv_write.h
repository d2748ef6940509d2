// Paged KV-cache write: each row's key and value go to the cache at its slot
// (slot = block * blockSize + offset; the router owns the block allocation), as they are or, into
// an fp8 cache, as their fp8 codes (kv_cache_dtype.h).
#pragma once

#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/kv_cache_dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

struct KvWriteParams {
  const void* k = nullptr;  // [rows, numKvHeads, headDim], rows kvRowStride elements apart
  const void* v = nullptr;  // same layout as k
  int64_t kvRowStride = 0;
  void* kCache = nullptr;  // [numSlots, numKvHeads, headDim] in cacheDtype
  void* vCache = nullptr;
  const int32_t* slots = nullptr;  // [rows]; in [0, numSlots) (the caller validates)
  int64_t rows = 0, numKvHeads = 0, headDim = 0, numSlots = 0;
  DType dtype = DType::kF32;  // of k and v (and of the cache under kAuto)
  KvCacheDType cacheDtype = KvCacheDType::kAuto;
};

Status validateKvWrite(const KvWriteParams& p);
// INVALID_ARGUMENT for a slot out of range.
Status kvWriteReference(const KvWriteParams& p);
// On the device a slot out of range is skipped.
Status invokeKvWrite(const KvWriteParams& p, Stream stream);

}  // namespace textgen::kernels
