#include "layers/attention.h"

#include <cmath>

#include "layers/alibi.h"
#include "textgen/runtime/rope.h"

namespace textgen::runtime {

StatusOr<Attention> Attention::load(const WeightLoader& w, const Weights& names,
                                    const Options& options) {
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, qOut = c.numHeads * c.headDim, kvOut = c.numKvHeads * c.headDim;
  Attention a;
  a.options_ = options;
  a.ropeScaling_ = ropeAttentionScaling(c);
  if (!options.alibiSlopes.empty()) {
    if (static_cast<int64_t>(options.alibiSlopes.size()) != c.numHeads)
      return invalidArgumentError("attention: " + std::to_string(options.alibiSlopes.size()) +
                                  " ALiBi slopes for " + std::to_string(c.numHeads) + " heads");
    for (float s : options.alibiSlopes) {
      if (!std::isfinite(s)) return invalidArgumentError("attention: an ALiBi slope is not finite");
    }
    TG_ASSIGN_OR_RETURN(auto mine, alibiSlopesForRank(options.alibiSlopes, part.rank, part.world));
    TG_ASSIGN_OR_RETURN(a.alibiSlopes_, w.uploadF32(mine));
  }
  // q, k and v stacked: one GEMM yields [rows, qOut + 2 kvOut] (this rank's heads).
  TG_ASSIGN_OR_RETURN(a.qkv_, w.linear({{names.q, {qOut, h}, part.column()},
                                        {names.k, {kvOut, h}, part.kvShard},
                                        {names.v, {kvOut, h}, part.kvShard}},
                                       SplitKind::kColumn, names.bias));
  TG_ASSIGN_OR_RETURN(a.o_,
                      w.linear({{names.o, {h, qOut}, part.row()}}, SplitKind::kRow, names.bias));
  return a;
}

Status Attention::forward(const ForwardContext& ctx, int64_t layer, void* hs) const {
  const ModelConfig& c = ctx.config;
  const BatchMetadata& meta = ctx.meta;
  const int64_t rows = ctx.rows(), hd = c.headDim, nh = ctx.partition.heads,
                nkv = ctx.partition.kvHeads, qkvOut = (nh + 2 * nkv) * hd;
  const DType dt = ctx.dtype;
  void* qkv = ctx.ws.qkv->data();
  void* kPart = ctx.at(qkv, nh * hd);
  void* vPart = ctx.at(qkv, (nh + nkv) * hd);
  void* attn = ctx.ws.attn->data();
  KvCache& cache = ctx.cache;
  TG_RETURN_IF_ERROR(ctx.backend.linear(qkv_, hs, qkv, rows));
  const kernels::KvWriteParams kv{.k = kPart,
                                  .v = vPart,
                                  .kvRowStride = qkvOut,
                                  .kCache = cache.keys(layer),
                                  .vCache = cache.values(layer),
                                  .slots = meta.slots,
                                  .rows = rows,
                                  .numKvHeads = nkv,
                                  .headDim = hd,
                                  .numSlots = cache.numSlots(),
                                  .dtype = dt};
  if (alibiSlopes_) {
    TG_RETURN_IF_ERROR(ctx.backend.writeKv(kv));  // positions enter as the ALiBi bias
  } else {
    TG_RETURN_IF_ERROR(ctx.backend.ropeWriteKv({.rope = {.q = qkv,
                                                         .k = kPart,
                                                         .qRowStride = qkvOut,
                                                         .kRowStride = qkvOut,
                                                         .invFreq = meta.invFreq,
                                                         .positions = meta.positions,
                                                         .rows = rows,
                                                         .numHeads = nh,
                                                         .numKvHeads = nkv,
                                                         .headDim = hd,
                                                         .rotaryDim = c.rotaryDim(),
                                                         .attentionScaling = ropeScaling_,
                                                         .dtype = dt},
                                                .kv = kv}));
  }
  TG_RETURN_IF_ERROR(ctx.backend.attention(
      {.q = qkv,
       .qRowStride = qkvOut,
       .kCache = cache.keys(layer),
       .vCache = cache.values(layer),
       .out = attn,
       .seqStarts = meta.seqStarts,
       .startPos = meta.startPos,
       .blockTables = meta.blockTables,
       .rows = rows,
       .numSeqs = meta.layout.numSeqs,
       .maxBlocksPerSeq = meta.layout.maxBlocksPerSeq,
       .numHeads = nh,
       .numKvHeads = nkv,
       .headDim = hd,
       .blockSize = cache.blockSize(),
       .slidingWindow = options_.slidingWindow,
       .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
       .alibiSlopes = alibiSlopes_ ? static_cast<const float*>(alibiSlopes_->data()) : nullptr,
       .maxNewRows = meta.layout.maxNewRows,
       .maxContext = meta.layout.maxContext,
       .dtype = dt}));
  return ctx.backend.linear(o_, attn, hs, rows);
}

}  // namespace textgen::runtime
