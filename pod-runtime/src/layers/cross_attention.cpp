#include "layers/cross_attention.h"

#include <cmath>

namespace textgen::runtime {

StatusOr<CrossAttention> CrossAttention::load(const WeightLoader& w, const Weights& names,
                                              float scale) {
  if (!std::isfinite(scale) || scale <= 0)
    return invalidArgumentError("cross-attention: the score scale must be positive and finite");
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, qOut = c.numHeads * c.headDim, kvOut = c.numKvHeads * c.headDim;
  CrossAttention a;
  a.scale_ = scale;
  TG_ASSIGN_OR_RETURN(a.q_, w.linear({{names.q, {qOut, h}, part.column()}}, SplitKind::kColumn));
  TG_ASSIGN_OR_RETURN(
      a.kv_, w.linear({{names.k, {kvOut, h}, part.kvShard}, {names.v, {kvOut, h}, part.kvShard}},
                      SplitKind::kColumn));
  TG_ASSIGN_OR_RETURN(a.o_, w.linear({{names.o, {h, qOut}, part.row()}}, SplitKind::kRow));
  return a;
}

Status CrossAttention::writeKeysValues(const ForwardContext& encoder, int64_t layer,
                                       const void* encoderOut) const {
  const int64_t rows = encoder.rows(), hd = encoder.config.headDim, nkv = encoder.partition.kvHeads;
  void* kv = encoder.ws.qkv->data();  // [rows, 2 * kvHeads * headDim]
  TG_RETURN_IF_ERROR(encoder.backend.linear(kv_, encoderOut, kv, rows));
  KvCache& cache = encoder.cache;
  return encoder.backend.writeKv({.k = kv,
                                  .v = encoder.at(kv, nkv * hd),
                                  .kvRowStride = 2 * nkv * hd,
                                  .kCache = cache.keys(layer),
                                  .vCache = cache.values(layer),
                                  .slots = encoder.meta.slots,
                                  .rows = rows,
                                  .numKvHeads = nkv,
                                  .headDim = hd,
                                  .numSlots = cache.numSlots(),
                                  .dtype = encoder.dtype,
                                  .cacheDtype = cache.cacheDtype()});
}

Status CrossAttention::forward(const ForwardContext& ctx, int64_t layer, void* hs) const {
  const BatchMetadata& meta = ctx.meta;
  const int64_t rows = ctx.rows(), hd = ctx.config.headDim, nh = ctx.partition.heads,
                nkv = ctx.partition.kvHeads;
  void* q = ctx.ws.qkv->data();  // [rows, heads * headDim]
  void* attn = ctx.ws.attn->data();
  KvCache& cache = ctx.cache;
  TG_RETURN_IF_ERROR(ctx.backend.linear(q_, hs, q, rows));
  TG_RETURN_IF_ERROR(ctx.backend.attention({.q = q,
                                            .qRowStride = nh * hd,
                                            .kCache = cache.keys(layer),
                                            .vCache = cache.values(layer),
                                            .out = attn,
                                            .seqStarts = meta.seqStarts,
                                            .startPos = meta.startPos,
                                            .blockTables = meta.crossTables,
                                            .rows = rows,
                                            .numSeqs = meta.layout.numSeqs,
                                            .maxBlocksPerSeq = meta.layout.crossBlocksPerSeq,
                                            .numHeads = nh,
                                            .numKvHeads = nkv,
                                            .headDim = hd,
                                            .blockSize = cache.blockSize(),
                                            .scale = scale_,
                                            .causal = false,
                                            .contextLens = meta.crossLens,
                                            .maxNewRows = meta.layout.maxNewRows,
                                            .maxContext = meta.layout.maxCrossLen,
                                            .minNewRows = meta.layout.minNewRows,
                                            .dtype = ctx.dtype,
                                            .cacheDtype = cache.cacheDtype()}));
  return ctx.backend.linear(o_, attn, hs, rows);
}

}  // namespace textgen::runtime
