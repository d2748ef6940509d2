#include "layers/logits_head.h"

namespace textgen::runtime {

StatusOr<LogitsHead> LogitsHead::load(const WeightLoader& w, Norm finalNorm,
                                      const std::string& head, bool tied,
                                      const Embedding& embedding) {
  LogitsHead l;
  l.finalNorm_ = std::move(finalNorm);
  const ModelConfig& c = w.config();
  if (tied || !w.contains(head)) {
    if (!tied) return notFoundError("weight '" + head + "' not found");
    l.head_.dtype = w.dtype();
    l.head_.in = c.hiddenSize;
    l.head_.out = w.partition().world == 1 ? c.vocabSize : w.partition().vocabPart;
    l.head_.split = SplitKind::kVocab;
    l.head_.weight = &embedding.table();
    return l;
  }
  TG_ASSIGN_OR_RETURN(
      l.head_,
      w.linear({{head, {c.vocabSize, c.hiddenSize}, w.partition().vocab()}}, SplitKind::kVocab));
  return l;
}

Status LogitsHead::forward(const ForwardContext& ctx, const void* hs, const void* residual) const {
  const int64_t rows = ctx.rows(), n = ctx.logitRows(), h = ctx.config.hiddenSize;
  const int64_t width = ctx.partition.world == 1 ? ctx.config.vocabSize : ctx.partition.vocabPart;
  const DType dt = ctx.dtype;
  void* pickedHs = ctx.ws.pickedHidden->data();
  void* pickedX = ctx.ws.pickedResidual->data();
  TG_RETURN_IF_ERROR(ctx.backend.gatherRows({hs, ctx.meta.logitRows, pickedHs, n, h, rows, dt}));
  TG_RETURN_IF_ERROR(
      ctx.backend.gatherRows({residual, ctx.meta.logitRows, pickedX, n, h, rows, dt}));
  TG_RETURN_IF_ERROR(finalNorm_.forwardReduced(ctx, pickedHs, pickedX, pickedHs, n));
  if (head_.out != width) return internalError("the head's width is not the partition's");
  return ctx.backend.linear(head_, pickedHs, ctx.headOut(), n);
}

}  // namespace textgen::runtime
