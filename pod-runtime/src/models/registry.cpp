// Architecture registry: config.json's class name -> the forward that serves it.
#include <atomic>

#include "architectures.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

StatusOr<std::unique_ptr<Model>> loadLlamaFamily(const ModelConfig& config,
                                                 const ArchitectureSpec& spec,
                                                 const WeightStore& weights, Backend& backend,
                                                 const ModelOptions& options);

StatusOr<std::unique_ptr<Model>> loadModel(const std::string& modelDir, Backend& backend,
                                           const ModelOptions& options) {
  TG_ASSIGN_OR_RETURN(ModelConfig config, loadModelConfig(modelDir));
  TG_ASSIGN_OR_RETURN(auto weights, WeightStore::open(modelDir));
  if (config.architecture == kLlama.architecture)
    return loadLlamaFamily(config, kLlama, *weights, backend, options);
  if (config.architecture == kMistral.architecture)
    return loadLlamaFamily(config, kMistral, *weights, backend, options);
  return unimplementedError("architecture '" + config.architecture + "' is not supported");
}

int64_t KvCache::bytesPerBlock(const KvShape& c, int64_t blockSize, kernels::DType dtype) {
  return 2 * c.layers * blockSize * c.kvHeads * c.headDim *
         static_cast<int64_t>(kernels::dtypeSize(dtype));
}

StatusOr<std::unique_ptr<KvCache>> KvCache::create(Backend& backend, const KvShape& c,
                                                   int64_t numBlocks, int64_t blockSize,
                                                   kernels::DType dtype) {
  if (numBlocks <= 0 || blockSize <= 0)
    return invalidArgumentError("KV cache needs positive blocks and block size");
  auto cache = std::make_unique<KvCache>();
  cache->numBlocks_ = numBlocks;
  cache->blockSize_ = blockSize;
  cache->dtype_ = dtype;
  static std::atomic<uint64_t> nextId{1};
  cache->id_ = nextId++;
  if (c.layers <= 0 || c.kvHeads <= 0 || c.headDim <= 0)
    return invalidArgumentError("KV cache needs positive layers, heads and head size");
  const size_t bytes = static_cast<size_t>(numBlocks * blockSize * c.kvHeads * c.headDim) *
                       kernels::dtypeSize(dtype);
  for (int64_t i = 0; i < c.layers; ++i) {
    TG_ASSIGN_OR_RETURN(auto k, backend.allocate(bytes));
    TG_ASSIGN_OR_RETURN(auto v, backend.allocate(bytes));
    cache->keys_.push_back(std::move(k));
    cache->values_.push_back(std::move(v));
  }
  return cache;
}

}  // namespace textgen::runtime
