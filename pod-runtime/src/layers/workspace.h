// The activation buffers every graph shares, owned by the model runner and grown (never shrunk) to
// the largest batch seen: rows of the residual stream and of each layer's intermediates, and the
// logit rows' hidden states and logits.
#pragma once

#include <cstdint>
#include <memory>

#include "layers/partition.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

// Allocates `buf` anew when it is smaller than `bytes` (its contents are not kept).
Status ensureBuffer(Backend& backend, std::unique_ptr<Buffer>& buf, size_t bytes);

struct Workspace {
  int64_t rows = 0, logitRows = 0;  // what the buffers hold
  // [rows, hidden] x2, [rows, (heads + 2 kvHeads) * headDim], [rows, heads * headDim],
  // [rows, 2 * intermediate], [rows, intermediate]: this rank's shares.
  std::unique_ptr<Buffer> residual, hidden, qkv, attn, gateUp, act;
  // [rows, hidden]: a second branch's input or output, for graphs whose attention and MLP both read
  // the layer's input (parallel residual: GPT-NeoX, Falcon) or that project embeddings (OPT).
  std::unique_ptr<Buffer> branch;
  // [logitRows, hidden] x2, [logitRows, vocab].
  std::unique_ptr<Buffer> pickedHidden, pickedResidual, logits;
  // Tensor parallelism: the head's part [logitRows, vocabPart], every rank's parts
  // [world, logitRows, vocabPart].
  std::unique_ptr<Buffer> partLogits, gatheredLogits;

  // Grows the buffers to `rows` and `logitRows`; `moved` tells whether any pointer changed
  // (captured graphs hold them).
  Status reserve(Backend& backend, const ModelConfig& config, const Partition& part, DType dtype,
                 int64_t rows, int64_t logitRows, bool& moved);
};

}  // namespace textgen::runtime
