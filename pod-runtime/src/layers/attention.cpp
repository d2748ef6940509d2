#include "layers/attention.h"

#include <cmath>

#include "layers/alibi.h"
#include "textgen/runtime/rope.h"

namespace textgen::runtime {

StatusOr<std::vector<WeightLoader::Part>> Attention::qkvParts(const ModelConfig& c,
                                                              const Partition& part,
                                                              const Weights& names) {
  const int64_t h = c.hiddenSize, hd = c.headDim, nh = c.numHeads, nkv = c.numKvHeads;
  const int64_t qOut = nh * hd, kvOut = nkv * hd, total = qOut + 2 * kvOut;
  const std::vector<int64_t> fused = {total, h};
  switch (names.layout) {
    case QkvLayout::kSeparate:
      return std::vector<WeightLoader::Part>{{names.q, {qOut, h}, part.column()},
                                             {names.k, {kvOut, h}, part.kvShard},
                                             {names.v, {kvOut, h}, part.kvShard}};
    case QkvLayout::kFused:  // [q; k; v]
      return std::vector<WeightLoader::Part>{
          {names.qkv, fused, part.column(), {total, 0, qOut}},
          {names.qkv, fused, part.kvShard, {total, qOut, kvOut}},
          {names.qkv, fused, part.kvShard, {total, qOut + kvOut, kvOut}}};
    case QkvLayout::kFusedInterleavedPerHead:  // [q_0; k_0; v_0; q_1; ...], one per head
      if (nkv != nh)
        return invalidArgumentError("'" + names.qkv + "': a q/k/v layout interleaved per head " +
                                    "needs as many key/value heads as heads (" +
                                    std::to_string(nkv) + " and " + std::to_string(nh) + ")");
      return std::vector<WeightLoader::Part>{
          {names.qkv, fused, part.column(), {3 * hd, 0, hd}},
          {names.qkv, fused, part.kvShard, {3 * hd, hd, hd}},
          {names.qkv, fused, part.kvShard, {3 * hd, 2 * hd, hd}}};
    case QkvLayout::kFusedGrouped: {  // per key/value head g: [q of its heads; k_g; v_g]
      if (nkv < 1 || nh % nkv != 0)
        return invalidArgumentError("'" + names.qkv + "': heads (" + std::to_string(nh) +
                                    ") are not a multiple of key/value heads (" +
                                    std::to_string(nkv) + ")");
      const int64_t perGroup = nh / nkv * hd, period = perGroup + 2 * hd;
      return std::vector<WeightLoader::Part>{
          {names.qkv, fused, part.column(), {period, 0, perGroup}},
          {names.qkv, fused, part.kvShard, {period, perGroup, hd}},
          {names.qkv, fused, part.kvShard, {period, perGroup + hd, hd}}};
    }
  }
  return invalidArgumentError("unknown q/k/v layout");
}

StatusOr<Attention> Attention::load(const WeightLoader& w, const Weights& names,
                                    const Options& options) {
  const ModelConfig& c = w.config();
  const Partition& part = w.partition();
  const int64_t h = c.hiddenSize, qOut = c.numHeads * c.headDim;
  Attention a;
  a.options_ = options;
  a.ropeScaling_ = ropeAttentionScaling(c);
  if (!std::isfinite(options.clipQkv) || options.clipQkv < 0)
    return invalidArgumentError("attention: clip_qkv must be positive and finite");
  if (!std::isfinite(options.scale) || options.scale < 0)
    return invalidArgumentError("attention: the softmax scale must be positive and finite");
  if ((options.relativeBias || !options.causal) && (!options.alibiSlopes.empty() || options.rope))
    return invalidArgumentError("attention: T5's bias and masks take neither RoPE nor ALiBi");
  if (!options.alibiSlopes.empty()) {
    if (static_cast<int64_t>(options.alibiSlopes.size()) != c.numHeads)
      return invalidArgumentError("attention: " + std::to_string(options.alibiSlopes.size()) +
                                  " ALiBi slopes for " + std::to_string(c.numHeads) + " heads");
    if (!std::isfinite(options.alibiBf16Divisor) || options.alibiBf16Divisor < 0.0f)
      return invalidArgumentError("attention: the ALiBi divisor must be finite and >= 0");
    for (float s : options.alibiSlopes) {
      if (!std::isfinite(s)) return invalidArgumentError("attention: an ALiBi slope is not finite");
    }
    TG_ASSIGN_OR_RETURN(auto mine, alibiSlopesForRank(options.alibiSlopes, part.rank, part.world));
    TG_ASSIGN_OR_RETURN(a.alibiSlopes_, w.uploadF32(mine));
  }
  // q, k and v stacked: one GEMM yields [rows, qOut + 2 kvOut] (this rank's heads), whichever
  // layout the checkpoint stores them in.
  TG_ASSIGN_OR_RETURN(std::vector<WeightLoader::Part> qkv, qkvParts(c, part, names));
  TG_ASSIGN_OR_RETURN(a.qkv_, w.linear(qkv, SplitKind::kColumn, names.bias));
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
  if (options_.clipQkv > 0) {
    TG_RETURN_IF_ERROR(ctx.backend.clamp({.x = qkv,
                                          .rows = rows,
                                          .cols = qkvOut,
                                          .rowStride = qkvOut,
                                          .limit = options_.clipQkv,
                                          .dtype = dt}));
  }
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
                                  .dtype = dt,
                                  .cacheDtype = cache.cacheDtype()};
  if (alibiSlopes_ || !options_.rope) {
    // Positions enter as the ALiBi bias, or entered with the embedding.
    TG_RETURN_IF_ERROR(ctx.backend.writeKv(kv));
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
       .scale = options_.scale > 0 ? options_.scale : 1.0f / std::sqrt(static_cast<float>(hd)),
       .alibiSlopes = alibiSlopes_ ? static_cast<const float*>(alibiSlopes_->data()) : nullptr,
       .alibiBf16Divisor = options_.alibiBf16Divisor,
       .causal = options_.causal,
       .relativeBias = options_.relativeBias
                           ? static_cast<const float*>(options_.relativeBias->data())
                           : nullptr,
       .relativeBuckets = options_.relativeBuckets,
       .relativeMaxDistance = options_.relativeMaxDistance,
       .relativeBidirectional = options_.relativeBidirectional,
       .maxNewRows = meta.layout.maxNewRows,
       .maxContext = meta.layout.maxContext,
       .minNewRows = meta.layout.minNewRows,
       .dtype = dt,
       .cacheDtype = cache.cacheDtype()}));
  return ctx.backend.linear(o_, attn, hs, rows);
}

}  // namespace textgen::runtime
