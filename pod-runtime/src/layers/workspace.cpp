#include "layers/workspace.h"

namespace textgen::runtime {

Status ensureBuffer(Backend& backend, std::unique_ptr<Buffer>& buf, size_t bytes) {
  if (buf && buf->bytes() >= bytes) return okStatus();
  buf.reset();
  TG_ASSIGN_OR_RETURN(buf, backend.allocate(bytes));
  return okStatus();
}

Status Workspace::reserve(Backend& backend, const ModelConfig& c, const Partition& part,
                          DType dtype, int64_t wantRows, int64_t wantLogitRows, bool& moved) {
  const size_t es = kernels::dtypeSize(dtype);
  auto alloc = [&](std::unique_ptr<Buffer>& b, int64_t r, int64_t width) {
    return ensureBuffer(backend, b, static_cast<size_t>(r * width) * es);
  };
  moved = wantRows > rows || wantLogitRows > logitRows;
  // ensureBuffer frees a buffer before allocating its larger one: when an allocation fails (a
  // step larger than the memory left), the sizes drop to 0 so that the next step allocates every
  // buffer it finds missing, rather than use one that is gone.
  if (wantRows > rows) {
    rows = 0;
    TG_RETURN_IF_ERROR(alloc(residual, wantRows, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(hidden, wantRows, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(branch, wantRows, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(qkv, wantRows, (part.heads + 2 * part.kvHeads) * c.headDim));
    TG_RETURN_IF_ERROR(alloc(attn, wantRows, part.heads * c.headDim));
    TG_RETURN_IF_ERROR(alloc(gateUp, wantRows, 2 * part.intermediate));
    TG_RETURN_IF_ERROR(alloc(act, wantRows, part.intermediate));
    rows = wantRows;
  }
  if (wantLogitRows > logitRows) {
    logitRows = 0;
    TG_RETURN_IF_ERROR(alloc(pickedHidden, wantLogitRows, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(pickedResidual, wantLogitRows, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(logits, wantLogitRows, c.vocabSize));
    if (part.world > 1) {
      TG_RETURN_IF_ERROR(alloc(partLogits, wantLogitRows, part.vocabPart));
      TG_RETURN_IF_ERROR(alloc(gatheredLogits, wantLogitRows, part.world * part.vocabPart));
    }
    logitRows = wantLogitRows;
  }
  return okStatus();
}

}  // namespace textgen::runtime
