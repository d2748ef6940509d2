// What a graph and its layers run against in one forward (vLLM's forward context, llama.cpp's
// graph context): the backend and communicator, the model's hyper-parameters and this rank's
// share, the batch metadata, the shared activation buffers and the KV cache. Everything is
// enqueued; nothing here waits for the device (forwards are captured into graphs).
#pragma once

#include <cstdint>

#include "layers/batch_metadata.h"
#include "layers/partition.h"
#include "layers/workspace.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

struct ForwardContext {
  Backend& backend;
  Communicator* comm;  // null: the whole model on one rank
  const ModelConfig& config;
  const Partition& partition;
  DType dtype;  // weights, activations and KV cache
  const BatchMetadata& meta;
  Workspace& ws;
  KvCache& cache;
  // Encoder-decoder models in a step where sequences start: the encoder's rows (their prompts),
  // one sequence each over its cross-attention blocks, positions from 0; null otherwise.
  const BatchMetadata* encoder = nullptr;

  int64_t rows() const { return meta.layout.rows; }
  // The same context over the encoder's rows (requires `encoder`).
  ForwardContext encoderContext() const {
    return {backend, comm, config, partition, dtype, *encoder, ws, cache, nullptr};
  }
  int64_t logitRows() const { return meta.layout.logitRows; }
  // Element `i` of a buffer of the compute dtype.
  void* at(void* base, int64_t i) const {
    return static_cast<char*>(base) + i * static_cast<int64_t>(kernels::dtypeSize(dtype));
  }
  // In place, the sum over ranks (nothing on one rank).
  Status allReduceSum(void* data, int64_t count) const {
    return partition.world == 1 ? okStatus() : comm->allReduceSum(data, count, dtype);
  }
  // Where the head writes this rank's logits: the whole rows on one rank, else its vocabulary
  // part, which the runner gathers into ws.logits.
  void* headOut() const { return partition.world == 1 ? ws.logits->data() : ws.partLogits->data(); }
};

}  // namespace textgen::runtime
