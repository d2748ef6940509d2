// The Llama family (Llama, Llama 2, Code Llama, Mistral): RMSNorm, RoPE (default, linear, dynamic
// NTK, partial rotary), grouped-query attention over the paged cache, SiLU-gated MLP.
#include <cmath>

#include "architectures.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

struct Layer {
  std::unique_ptr<Buffer> inputNorm, q, k, v, o, postNorm, gateUp, down;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(ModelConfig config, ArchitectureSpec spec, Backend& backend)
      : config_(std::move(config)), spec_(spec), backend_(backend) {}

  const ModelConfig& config() const override { return config_; }

  Status load(const WeightStore& w, const ModelOptions& options) {
    if (options.worldSize != 1) {
      return unimplementedError("tensor parallelism (world size " +
                                std::to_string(options.worldSize) +
                                ") is not implemented yet: shards load, ranks cannot communicate");
    }
    const ModelConfig& c = config_;
    const int64_t h = c.hiddenSize, qOut = c.numHeads * c.headDim, kvOut = c.numKvHeads * c.headDim;
    // Column-parallel weights split their output rows across ranks, row-parallel ones their input
    // columns; the embedding and the head split the vocabulary.
    const Shard column{0, options.rank, options.worldSize}, row{1, options.rank, options.worldSize};
    TG_ASSIGN_OR_RETURN(embed_, upload(w, std::string(spec_.embed), {c.vocabSize, h}, column));
    TG_ASSIGN_OR_RETURN(finalNorm_, upload(w, std::string(spec_.finalNorm), {h}, {}));
    if (c.tieWordEmbeddings || !w.contains(std::string(spec_.lmHead))) {
      if (!c.tieWordEmbeddings)
        return notFoundError("weight '" + std::string(spec_.lmHead) + "' not found");
      lmHead_ = embed_.get();
    } else {
      TG_ASSIGN_OR_RETURN(ownLmHead_,
                          upload(w, std::string(spec_.lmHead), {c.vocabSize, h}, column));
      lmHead_ = ownLmHead_.get();
    }
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, upload(w, layerName(spec_.inputNorm, i), {h}, {}));
      TG_ASSIGN_OR_RETURN(l.q, upload(w, layerName(spec_.q, i), {qOut, h}, column));
      TG_ASSIGN_OR_RETURN(l.k, upload(w, layerName(spec_.k, i), {kvOut, h}, column));
      TG_ASSIGN_OR_RETURN(l.v, upload(w, layerName(spec_.v, i), {kvOut, h}, column));
      TG_ASSIGN_OR_RETURN(l.o, upload(w, layerName(spec_.o, i), {h, qOut}, row));
      TG_ASSIGN_OR_RETURN(l.postNorm, upload(w, layerName(spec_.postNorm, i), {h}, {}));
      TG_ASSIGN_OR_RETURN(l.down,
                          upload(w, layerName(spec_.down, i), {h, c.intermediateSize}, row));
      // Gate and up stacked: one GEMM yields [rows, 2 * intermediate].
      TG_ASSIGN_OR_RETURN(Tensor gate,
                          w.loadF32(layerName(spec_.gate, i), {c.intermediateSize, h}, column));
      TG_ASSIGN_OR_RETURN(Tensor up,
                          w.loadF32(layerName(spec_.up, i), {c.intermediateSize, h}, column));
      TG_ASSIGN_OR_RETURN(l.gateUp, backend_.allocate(gate.bytes() + up.bytes()));
      std::vector<float> both(gate.numel() + up.numel());
      std::memcpy(both.data(), gate.f32(), gate.bytes());
      std::memcpy(both.data() + gate.numel(), up.f32(), up.bytes());
      TG_RETURN_IF_ERROR(backend_.upload(*l.gateUp, both.data(), both.size() * sizeof(float)));
    }
    return okStatus();
  }

  StatusOr<std::vector<float>> forward(const ForwardBatch& b, KvCache& cache) override {
    const ModelConfig& c = config_;
    const auto rows = static_cast<int64_t>(b.tokenIds.size());
    TG_RETURN_IF_ERROR(validate(b, cache));
    const int64_t h = c.hiddenSize, hd = c.headDim, nh = c.numHeads, nkv = c.numKvHeads,
                  inter = c.intermediateSize;
    TG_RETURN_IF_ERROR(reserve(rows));
    float* x = ws_.residual->f32();
    float* hs = ws_.hidden->f32();
    float* q = ws_.q->f32();
    float* k = ws_.k->f32();
    float* v = ws_.v->f32();
    float* attn = ws_.attn->f32();
    float* gateUp = ws_.gateUp->f32();
    float* act = ws_.act->f32();

    // Per-row positions and RoPE frequencies (dynamic NTK depends on each sequence's length).
    std::vector<int64_t> positions(rows);
    const int64_t half = c.rotaryDim() / 2;
    std::vector<float> invFreq(rows * half);
    for (const SequenceRows& s : b.sequences) {
      const std::vector<float> freq = ropeFrequencies(s.startPos + s.numRows);
      for (int64_t t = 0; t < s.numRows; ++t) {
        positions[s.firstRow + t] = s.startPos + t;
        std::copy(freq.begin(), freq.end(), invFreq.begin() + (s.firstRow + t) * half);
      }
    }

    TG_RETURN_IF_ERROR(
        backend_.embedding({embed_->f32(), b.tokenIds.data(), x, rows, h, c.vocabSize}));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      // Layer 0 normalises the embedding; later layers first add the previous MLP output.
      kernels::RmsNormParams norm{.input = i == 0 ? x : hs,
                                  .residual = i == 0 ? nullptr : x,
                                  .residualOut = i == 0 ? nullptr : x,
                                  .output = hs,
                                  .weight = l.inputNorm->f32(),
                                  .numTokens = rows,
                                  .hiddenSize = h,
                                  .eps = static_cast<float>(c.rmsNormEps)};
      TG_RETURN_IF_ERROR(backend_.rmsNorm(norm));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.q->f32(), q, rows, h, nh * hd}));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.k->f32(), k, rows, h, nkv * hd}));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.v->f32(), v, rows, h, nkv * hd}));
      TG_RETURN_IF_ERROR(backend_.rope(
          {q, k, invFreq.data(), positions.data(), rows, nh, nkv, hd, c.rotaryDim()}));
      TG_RETURN_IF_ERROR(backend_.writeKv(
          {k, v, cache.keys(i), cache.values(i), b.slots.data(), rows, nkv, hd, cache.numSlots()}));
      AttentionParams ap{.q = q,
                         .kCache = cache.keys(i),
                         .vCache = cache.values(i),
                         .out = attn,
                         .sequences = b.sequences,
                         .numHeads = nh,
                         .numKvHeads = nkv,
                         .headDim = hd,
                         .blockSize = cache.blockSize(),
                         .slidingWindow = spec_.slidingWindow ? c.slidingWindow.value_or(0) : 0,
                         .scale = scale};
      TG_RETURN_IF_ERROR(backend_.attention(ap));
      TG_RETURN_IF_ERROR(backend_.linear({attn, l.o->f32(), hs, rows, nh * hd, h}));
      kernels::RmsNormParams post{.input = hs,
                                  .residual = x,
                                  .residualOut = x,
                                  .output = hs,
                                  .weight = l.postNorm->f32(),
                                  .numTokens = rows,
                                  .hiddenSize = h,
                                  .eps = static_cast<float>(c.rmsNormEps)};
      TG_RETURN_IF_ERROR(backend_.rmsNorm(post));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.gateUp->f32(), gateUp, rows, h, 2 * inter}));
      TG_RETURN_IF_ERROR(backend_.siluMul({gateUp, act, rows, inter}));
      TG_RETURN_IF_ERROR(backend_.linear({act, l.down->f32(), hs, rows, inter, h}));
    }
    // Final norm of the wanted rows only, then the head.
    const auto n = static_cast<int64_t>(b.logitRows.size());
    std::vector<float> picked(n * h), pickedResidual(n * h), normed(n * h);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(picked.data() + r * h, hs + b.logitRows[r] * h, h * sizeof(float));
      std::memcpy(pickedResidual.data() + r * h, x + b.logitRows[r] * h, h * sizeof(float));
    }
    kernels::RmsNormParams fin{.input = picked.data(),
                               .residual = pickedResidual.data(),
                               .residualOut = pickedResidual.data(),
                               .output = normed.data(),
                               .weight = finalNorm_->f32(),
                               .numTokens = n,
                               .hiddenSize = h,
                               .eps = static_cast<float>(c.rmsNormEps)};
    TG_RETURN_IF_ERROR(backend_.rmsNorm(fin));
    std::vector<float> logits(n * c.vocabSize);
    TG_RETURN_IF_ERROR(
        backend_.linear({normed.data(), lmHead_->f32(), logits.data(), n, h, c.vocabSize}));
    return logits;
  }

 private:
  struct Workspace {
    int64_t rows = 0;
    std::unique_ptr<Buffer> residual, hidden, q, k, v, attn, gateUp, act;
  };

  StatusOr<std::unique_ptr<Buffer>> upload(const WeightStore& w, const std::string& name,
                                           const std::vector<int64_t>& shape, Shard shard) {
    TG_ASSIGN_OR_RETURN(Tensor t, w.loadF32(name, shape, shard));
    TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(t.bytes()));
    TG_RETURN_IF_ERROR(backend_.upload(*buf, t.data(), t.bytes()));
    return buf;
  }

  Status reserve(int64_t rows) {
    if (rows <= ws_.rows) return okStatus();
    const ModelConfig& c = config_;
    auto alloc = [&](std::unique_ptr<Buffer>& b, int64_t width) -> Status {
      TG_ASSIGN_OR_RETURN(b, backend_.allocate(static_cast<size_t>(rows * width) * sizeof(float)));
      return okStatus();
    };
    TG_RETURN_IF_ERROR(alloc(ws_.residual, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(ws_.hidden, c.hiddenSize));
    TG_RETURN_IF_ERROR(alloc(ws_.q, c.numHeads * c.headDim));
    TG_RETURN_IF_ERROR(alloc(ws_.k, c.numKvHeads * c.headDim));
    TG_RETURN_IF_ERROR(alloc(ws_.v, c.numKvHeads * c.headDim));
    TG_RETURN_IF_ERROR(alloc(ws_.attn, c.numHeads * c.headDim));
    TG_RETURN_IF_ERROR(alloc(ws_.gateUp, 2 * c.intermediateSize));
    TG_RETURN_IF_ERROR(alloc(ws_.act, c.intermediateSize));
    ws_.rows = rows;
    return okStatus();
  }

  Status validate(const ForwardBatch& b, const KvCache& cache) const {
    const auto rows = static_cast<int64_t>(b.tokenIds.size());
    if (rows == 0) return invalidArgumentError("empty batch");
    if (static_cast<int64_t>(b.slots.size()) != rows)
      return invalidArgumentError("one slot per token is required");
    int64_t covered = 0;
    for (const SequenceRows& s : b.sequences) {
      if (s.firstRow != covered || s.numRows <= 0)
        return invalidArgumentError("sequences must cover the rows in order");
      if (static_cast<int64_t>(s.blocks.size()) * cache.blockSize() < s.startPos + s.numRows) {
        return invalidArgumentError("a sequence has fewer KV blocks than positions");
      }
      for (uint32_t block : s.blocks) {
        if (block >= cache.numBlocks())
          return invalidArgumentError("block " + std::to_string(block) + " out of range");
      }
      covered += s.numRows;
    }
    if (covered != rows) return invalidArgumentError("sequences must cover every row");
    for (uint32_t slot : b.slots) {
      if (slot >= cache.numSlots())
        return invalidArgumentError("slot " + std::to_string(slot) + " out of range");
    }
    for (uint32_t id : b.tokenIds) {
      if (id >= config_.vocabSize)
        return invalidArgumentError("token id " + std::to_string(id) + " out of vocabulary");
    }
    for (int64_t r : b.logitRows) {
      if (r < 0 || r >= rows) return invalidArgumentError("logit row out of range");
    }
    return okStatus();
  }

  // inv_freq as Hugging Face computes it, for a sequence whose length after this forward is seqLen.
  std::vector<float> ropeFrequencies(int64_t seqLen) const {
    const RopeConfig& r = config_.rope;
    const int64_t dim = config_.rotaryDim();
    double base = r.theta;
    if (r.type == RopeType::kDynamic && seqLen > config_.maxPositionEmbeddings) {
      const double ratio = r.factor * static_cast<double>(seqLen) /
                           static_cast<double>(config_.maxPositionEmbeddings);
      base = r.theta * std::pow(ratio - (r.factor - 1.0),
                                static_cast<double>(dim) / static_cast<double>(dim - 2));
    }
    std::vector<float> f(dim / 2);
    for (int64_t i = 0; i < dim / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
      f[i] = 1.0f / std::pow(static_cast<float>(base), exponent);
      if (r.type == RopeType::kLinear) f[i] /= static_cast<float>(r.factor);
    }
    return f;
  }

  ModelConfig config_;
  ArchitectureSpec spec_;
  Backend& backend_;
  std::unique_ptr<Buffer> embed_, finalNorm_, ownLmHead_;
  Buffer* lmHead_ = nullptr;
  std::vector<Layer> layers_;
  Workspace ws_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> loadLlamaFamily(const ModelConfig& config,
                                                 const ArchitectureSpec& spec,
                                                 const WeightStore& weights, Backend& backend,
                                                 const ModelOptions& options) {
  auto model = std::make_unique<LlamaModel>(config, spec, backend);
  TG_RETURN_IF_ERROR(model->load(weights, options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace textgen::runtime
