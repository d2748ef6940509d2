// The paged KV cache (textgen/runtime/model.h): keys and values of every layer.
#include <atomic>

#include "textgen/runtime/model.h"

namespace textgen::runtime {

int64_t KvCache::bytesPerBlock(const KvShape& c, int64_t blockSize, kernels::DType dtype,
                               kernels::KvCacheDType cacheDtype) {
  return 2 * c.layers * blockSize * c.kvHeads * c.headDim *
         static_cast<int64_t>(kernels::kvCacheElementSize(cacheDtype, dtype));
}

StatusOr<std::unique_ptr<KvCache>> KvCache::create(Backend& backend, const KvShape& c,
                                                   int64_t numBlocks, int64_t blockSize,
                                                   kernels::DType dtype,
                                                   kernels::KvCacheDType cacheDtype) {
  if (numBlocks <= 0 || blockSize <= 0)
    return invalidArgumentError("KV cache needs positive blocks and block size");
  if (!kernels::isValid(cacheDtype)) return invalidArgumentError("unknown KV cache dtype");
  auto cache = std::make_unique<KvCache>();
  cache->numBlocks_ = numBlocks;
  cache->blockSize_ = blockSize;
  cache->dtype_ = dtype;
  cache->cacheDtype_ = cacheDtype;
  static std::atomic<uint64_t> nextId{1};
  cache->id_ = nextId++;
  if (c.layers <= 0 || c.kvHeads <= 0 || c.headDim <= 0)
    return invalidArgumentError("KV cache needs positive layers, heads and head size");
  const size_t bytes = static_cast<size_t>(numBlocks * blockSize * c.kvHeads * c.headDim) *
                       kernels::kvCacheElementSize(cacheDtype, dtype);
  for (int64_t i = 0; i < c.layers; ++i) {
    TG_ASSIGN_OR_RETURN(auto k, backend.allocate(bytes));
    TG_ASSIGN_OR_RETURN(auto v, backend.allocate(bytes));
    cache->keys_.push_back(std::move(k));
    cache->values_.push_back(std::move(v));
  }
  return cache;
}

}  // namespace textgen::runtime
