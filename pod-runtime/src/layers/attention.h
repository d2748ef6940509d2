// Self-attention over the paged KV cache, tensor-parallel as Megatron splits it: q/k/v
// column-parallel in one GEMM, RoPE and the KV write in one pass, paged attention (grouped-query,
// optional sliding window, optional ALiBi), o row-parallel: each rank's output is its partial sum,
// reduced over the ranks by the norm that follows (Norm::forwardReduced, fused with it where the
// communicator can).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"

namespace textgen::runtime {

// How the checkpoint stores q, k and v: three tensors (Llama), one [q; k; v] tensor (Phi-3), or
// one tensor interleaving each head's q, k and v (GPT-NeoX, Bloom).
// kFusedGrouped: one tensor holding, per key/value head, its query heads then its key and value
// (Falcon's new decoder architecture).
enum class QkvLayout { kSeparate, kFused, kFusedInterleavedPerHead, kFusedGrouped };

constexpr std::string_view toString(QkvLayout l) {
  switch (l) {
    case QkvLayout::kSeparate: return "separate";
    case QkvLayout::kFused: return "fused";
    case QkvLayout::kFusedInterleavedPerHead: return "fused_interleaved_per_head";
    case QkvLayout::kFusedGrouped: return "fused_grouped";
  }
  return "?";
}

class Attention {
 public:
  struct Weights {  // one layer's tensor names
    QkvLayout layout = QkvLayout::kSeparate;
    std::string q, k, v;  // kSeparate
    std::string qkv;      // the fused layouts
    std::string o;
    bool bias = false;  // q, k, v and o each with a bias (biasName), Llama's attention_bias
  };
  struct Options {
    int64_t slidingWindow = 0;  // attend to this many most recent positions; 0: all
    // ALiBi instead of RoPE: every head's slope (layers/alibi.h), [numHeads]; empty: RoPE. Each
    // rank uploads its heads' share once at load; keys are cached unrotated. Composes with the
    // sliding window (the window limits the keys, the bias applies to those left).
    std::vector<float> alibiSlopes = {};
    // false: no rotary embedding either; the positions entered with the token embedding (learned
    // tables: OPT, GPT-BigCode) and keys are cached as projected.
    bool rope = true;
    // q, k and v clamped into [-clipQkv, clipQkv] right after their projection (MPT's clip_qkv,
    // on the whole fused output); 0: not clamped.
    float clipQkv = 0;
    // Multiplies q·k, before the ALiBi bias is added (MPT's softmax_scale); 0: 1/sqrt(headDim).
    float scale = 0;
    // > 0: Falcon's ALiBi, bf16(slope * j) / alibiBf16Divisor with j the key's absolute position
    // (kernels/paged_attention.h); 0: slope * (j - i).
    float alibiBf16Divisor = 0.0f;
    // T5: no causal mask (the encoder's self-attention: every row sees its whole sequence).
    bool causal = true;
    // T5's relative position bias, [buckets, this rank's heads] fp32 in backend memory (shared
    // by the layers of one stack: RelativeBias, layers/relative_bias.h); null: none.
    std::shared_ptr<Buffer> relativeBias = nullptr;
    int32_t relativeBuckets = 0, relativeMaxDistance = 0;
    bool relativeBidirectional = false;
  };

  static StatusOr<Attention> load(const WeightLoader& w, const Weights& names,
                                  const Options& options);

  // `hs` [rows, hidden], normalised, in; the attention output projected out (this rank's
  // partial sum on several ranks). Writes this layer's keys and values for the batch's slots into
  // the cache.
  Status forward(const ForwardContext& ctx, int64_t layer, void* hs) const;
  const Linear& firstLinear() const { return qkv_; }  // the first weights forward reads

  // The q, k and v parts of `names` in the checkpoint's layout, each with this rank's shard: their
  // slices stacked give [q; k; v] of this rank's heads.
  static StatusOr<std::vector<WeightLoader::Part>> qkvParts(const ModelConfig& c,
                                                            const Partition& part,
                                                            const Weights& names);

 private:
  // [(heads + 2 kvHeads) * headDim, hidden]: this rank's q, k and v stacked (column-parallel).
  Linear qkv_;
  Linear o_;  // [hidden, heads * headDim]: this rank's columns (row-parallel)
  Options options_;
  std::unique_ptr<Buffer> alibiSlopes_;  // [this rank's heads] fp32; null: RoPE
  float ropeScaling_ = 1.0f;             // multiplies cos and sin (yarn)
};

}  // namespace textgen::runtime
