#include "layers/medusa.h"

#include <algorithm>

#include "layers/activation.h"

namespace textgen::runtime {

StatusOr<MedusaHeads> MedusaHeads::load(const WeightLoader& w, int64_t heads, int64_t layers,
                                        const Linear& head) {
  const ModelConfig& c = w.config();
  if (heads <= 0 || layers <= 0)
    return invalidArgumentError("medusa: heads and layers must be positive");
  const int64_t h = c.hiddenSize;
  auto name = [](int64_t i, int64_t j, const char* rest) {
    return std::to_string(i) + "." + std::to_string(j) + rest;
  };
  // Own output layers (MedusaHeadV1) when every head has one; else the model's head (V2).
  bool own = true;
  for (int64_t i = 0; i < heads; ++i) own = own && w.contains(name(i, layers, ".weight"));
  if (!own && layers != 1) {
    return notFoundError("medusa: weight '" + name(0, layers, ".weight") +
                         "' not found (heads without their own output layer have one layer)");
  }
  MedusaHeads m;
  m.head_ = &head;
  for (int64_t i = 0; i < heads; ++i) {
    Head hd;
    for (int64_t j = 0; j < layers; ++j) {
      TG_ASSIGN_OR_RETURN(Linear block, w.linear({{name(i, j, ".linear.weight"), {h, h}, {}}},
                                                 SplitKind::kReplicated, /*withBias=*/true));
      hd.blocks.push_back(std::move(block));
    }
    if (own) {
      // Split by vocabulary like the model's head, and gathered the same way: every rank then
      // takes its arg-max over the same logits, whatever its GEMM plans (a replicated layer's
      // rounding may differ between ranks, and the guesses decide each rank's rows next step).
      TG_ASSIGN_OR_RETURN(
          hd.out, w.linear({{name(i, layers, ".weight"), {c.vocabSize, h}, w.partition().vocab()}},
                           SplitKind::kVocab));
    }
    m.heads_.push_back(std::move(hd));
  }
  return m;
}

Status MedusaHeads::reserve(Backend& backend, const ModelConfig& c, const Partition& part,
                            DType dtype, int64_t rows, bool& moved) {
  MedusaWorkspace& ws = *ws_;
  moved = rows > ws.rows;
  if (!moved) return okStatus();
  ws.rows = 0;  // until every buffer is there (ensureBuffer frees before it allocates)
  const size_t es = kernels::dtypeSize(dtype);
  const auto n = static_cast<size_t>(heads() * rows);
  TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.hidden, rows * c.hiddenSize * es));
  TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.linearOut, rows * c.hiddenSize * es));
  TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.logits, n * c.vocabSize * es));
  if (part.world > 1) {
    TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.part, n * part.vocabPart * es));
    TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.gathered, n * part.world * part.vocabPart * es));
  }
  TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.ids, n * sizeof(int32_t)));
  TG_RETURN_IF_ERROR(ensureBuffer(backend, ws.logprobs, n * sizeof(float)));
  ws.rows = rows;
  return okStatus();
}

Status MedusaHeads::forward(const ForwardContext& ctx) const {
  const MedusaWorkspace& ws = *ws_;
  const int64_t n = ctx.logitRows(), h = ctx.config.hiddenSize, vocab = ctx.config.vocabSize;
  if (n > ws.rows) return internalError("medusa: the workspace holds fewer rows than the step's");
  const DType dt = ctx.dtype;
  const size_t es = kernels::dtypeSize(dt);
  // Output layers are split by vocabulary (the heads' own, or the model's head): on several
  // ranks each writes its part, gathered into whole rows after the last head.
  const bool parts = ctx.partition.world > 1;
  const int64_t width = parts ? ctx.partition.vocabPart : vocab;
  char* dst = static_cast<char*>(parts ? ws.part->data() : ws.logits->data());
  for (size_t i = 0; i < heads_.size(); ++i) {
    const Head& hd = heads_[i];
    const void* x = ctx.ws.pickedHidden->data();
    for (const Linear& block : hd.blocks) {
      TG_RETURN_IF_ERROR(ctx.backend.linear(block, x, ws.linearOut->data(), n));
      TG_RETURN_IF_ERROR(ctx.backend.gatedActivation({.gateUp = ws.linearOut->data(),
                                                      .out = ws.hidden->data(),
                                                      .rows = n,
                                                      .n = h,
                                                      .dtype = dt,
                                                      .activation = Activation::kSilu,
                                                      .gated = false,
                                                      .residual = x}));
      x = ws.hidden->data();
    }
    const Linear& out = hd.out ? *hd.out : *head_;
    if (out.out != width)
      return internalError("medusa: the output layer's width is not the step's");
    TG_RETURN_IF_ERROR(ctx.backend.linear(out, x, dst + i * n * width * es, n));
  }
  const int64_t rows = heads() * n;
  if (parts) {
    const int64_t part = ctx.partition.vocabPart;
    TG_RETURN_IF_ERROR(ctx.comm->allGather(ws.part->data(), ws.gathered->data(), rows * part, dt));
    auto* logits = static_cast<char*>(ws.logits->data());
    const auto* gathered = static_cast<const char*>(ws.gathered->data());
    for (int r = 0; r < ctx.partition.world; ++r) {
      const int64_t cols = std::min(part, vocab - r * part);
      if (cols <= 0) break;
      TG_RETURN_IF_ERROR(ctx.backend.copy2d(logits + r * part * es, vocab * es,
                                            gathered + r * rows * part * es, part * es, cols * es,
                                            rows));
    }
  }
  return ctx.backend.argmax({.logits = ws.logits->data(),
                             .ids = ws.ids->as<int32_t>(),
                             .logprobs = ws.logprobs->as<float>(),
                             .rows = rows,
                             .vocab = vocab,
                             .dtype = dt});
}

}  // namespace textgen::runtime
