#include "layers/logits_head.h"

namespace textgen::runtime {

StatusOr<LogitsHead> LogitsHead::load(const WeightLoader& w, std::optional<Norm> finalNorm,
                                      const std::string& head, bool tied,
                                      const Embedding& embedding,
                                      std::optional<Linear> projection) {
  LogitsHead l;
  l.finalNorm_ = std::move(finalNorm);
  const ModelConfig& c = w.config();
  int64_t width = c.hiddenSize;  // the head's inputs
  if (projection) {
    if (projection->in != c.hiddenSize || projection->out <= 0 || projection->out > c.hiddenSize ||
        projection->split != SplitKind::kReplicated)
      return invalidArgumentError("the head's projection must be replicated, [width, " +
                                  std::to_string(c.hiddenSize) +
                                  "] with width <= " + std::to_string(c.hiddenSize));
    width = projection->out;
    l.projection_ = std::move(projection);
  }
  if (tied || !w.contains(head)) {
    if (!tied) return notFoundError("weight '" + head + "' not found");
    if (embedding.width() != width)
      return invalidArgumentError("a head tied to the embedding needs its width (" +
                                  std::to_string(embedding.width()) + "), not " +
                                  std::to_string(width));
    l.head_.dtype = w.dtype();
    l.head_.in = width;
    l.head_.out = w.partition().world == 1 ? c.vocabSize : w.partition().vocabPart;
    l.head_.split = SplitKind::kVocab;
    l.head_.weight = &embedding.table();
    return l;
  }
  TG_ASSIGN_OR_RETURN(
      l.head_, w.linear({{head, {c.vocabSize, width}, w.partition().vocab()}}, SplitKind::kVocab));
  return l;
}

Status LogitsHead::forward(const ForwardContext& ctx, const void* hs, const void* residual) const {
  const int64_t rows = ctx.rows(), n = ctx.logitRows(), h = ctx.config.hiddenSize;
  const int64_t width = ctx.partition.world == 1 ? ctx.config.vocabSize : ctx.partition.vocabPart;
  const DType dt = ctx.dtype;
  void* pickedHs = ctx.ws.pickedHidden->data();
  void* pickedX = ctx.ws.pickedResidual->data();
  TG_RETURN_IF_ERROR(ctx.backend.gatherRows({hs, ctx.meta.logitRows, pickedHs, n, h, rows, dt}));
  if (finalNorm_) {
    if (residual) {
      TG_RETURN_IF_ERROR(
          ctx.backend.gatherRows({residual, ctx.meta.logitRows, pickedX, n, h, rows, dt}));
    }
    TG_RETURN_IF_ERROR(
        finalNorm_->forwardReduced(ctx, pickedHs, residual ? pickedX : nullptr, pickedHs, n));
  }
  const void* in = pickedHs;
  if (projection_) {  // [n, hidden] -> [n, width] (width <= hidden: it fits pickedResidual)
    TG_RETURN_IF_ERROR(ctx.backend.linear(*projection_, pickedHs, pickedX, n));
    in = pickedX;
  }
  if (head_.out != width) return internalError("the head's width is not the partition's");
  return ctx.backend.linear(head_, in, ctx.headOut(), n);
}

}  // namespace textgen::runtime
