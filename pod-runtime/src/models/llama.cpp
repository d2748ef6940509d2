// The Llama family (Llama, Llama 2, Code Llama, Mistral): RMSNorm, RoPE (default, linear, dynamic
// NTK, partial rotary), grouped-query attention over the paged cache, SiLU-gated MLP.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "architectures.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/rope.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {
namespace {

struct Layer {
  std::unique_ptr<Buffer> inputNorm, qkv, o, postNorm, gateUp, down;
};

// Byte offset of element `i` of a buffer holding `dtype` elements.
void* at(Buffer& b, int64_t i, DType dtype) {
  return static_cast<char*>(b.data()) + i * static_cast<int64_t>(kernels::dtypeSize(dtype));
}

class LlamaModel final : public Model {
 public:
  LlamaModel(ModelConfig config, ArchitectureSpec spec, Backend& backend)
      : config_(std::move(config)), spec_(spec), backend_(backend) {}

  const ModelConfig& config() const override { return config_; }
  DType dtype() const override { return dtype_; }
  KvShape kvShape() const override { return {config_.numLayers, kvHeads_, config_.headDim}; }

  // Megatron's splits over `world` ranks: attention heads and the MLP's intermediate columns are
  // divided (key/value heads replicated when there are fewer than ranks), the vocabulary split in
  // padded parts. A shape that does not divide is refused, naming the dimension.
  Status partition(int rank, int world) {
    const ModelConfig& c = config_;
    rank_ = rank;
    world_ = world;
    auto refuse = [&](const char* what, int64_t n) {
      return invalidArgumentError(std::string(what) + " (" + std::to_string(n) +
                                  ") does not divide across " + std::to_string(world) +
                                  " tensor-parallel ranks");
    };
    if (c.numHeads % world != 0) return refuse("num_attention_heads", c.numHeads);
    if (c.intermediateSize % world != 0) return refuse("intermediate_size", c.intermediateSize);
    if (c.numKvHeads >= world ? c.numKvHeads % world != 0 : world % c.numKvHeads != 0)
      return refuse("num_key_value_heads", c.numKvHeads);
    heads_ = c.numHeads / world;
    kvHeads_ = std::max<int64_t>(c.numKvHeads / world, 1);
    inter_ = c.intermediateSize / world;
    vocabPart_ = (c.vocabSize + world - 1) / world;
    // Rank r's query heads [r*heads, (r+1)*heads) read key/value head r*heads / (heads per group).
    kvShard_ = c.numKvHeads >= world ? Shard{0, rank, world}
                                     : Shard{0, rank / (world / static_cast<int>(c.numKvHeads)),
                                             static_cast<int>(c.numKvHeads)};
    return okStatus();
  }

  Status load(const WeightStore& w, const ModelOptions& options) {
    comm_ = options.comm;
    TG_RETURN_IF_ERROR(comm_ ? partition(comm_->rank(), comm_->worldSize()) : partition(0, 1));
    dtype_ = options.dtype;
    TG_RETURN_IF_ERROR(backend_.supports(dtype_));
    graphSizes_ = options.graphBatchSizes;
    std::sort(graphSizes_.begin(), graphSizes_.end());
    if (!graphSizes_.empty() && graphSizes_.front() <= 0)
      return invalidArgumentError("graph batch sizes must be positive");
    graphContext_ = config_.maxContext();
    ropeScaling_ = ropeAttentionScaling(config_);
    const ModelConfig& c = config_;
    const int64_t h = c.hiddenSize, qOut = c.numHeads * c.headDim, kvOut = c.numKvHeads * c.headDim;
    // Column-parallel weights split their output rows across ranks, row-parallel ones their input
    // columns; the embedding and the head split the vocabulary (padded to equal parts).
    const Shard column{0, rank_, world_}, row{1, rank_, world_}, vocab{0, rank_, world_, true};
    TG_ASSIGN_OR_RETURN(embed_, upload(w, {{std::string(spec_.embed), {c.vocabSize, h}, vocab}}));
    TG_ASSIGN_OR_RETURN(finalNorm_, upload(w, {{std::string(spec_.finalNorm), {h}, {}}}));
    if (c.tieWordEmbeddings || !w.contains(std::string(spec_.lmHead))) {
      if (!c.tieWordEmbeddings)
        return notFoundError("weight '" + std::string(spec_.lmHead) + "' not found");
      lmHead_ = embed_.get();
    } else {
      TG_ASSIGN_OR_RETURN(ownLmHead_,
                          upload(w, {{std::string(spec_.lmHead), {c.vocabSize, h}, vocab}}));
      lmHead_ = ownLmHead_.get();
    }
    layers_.resize(c.numLayers);
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      TG_ASSIGN_OR_RETURN(l.inputNorm, upload(w, {{layerName(spec_.inputNorm, i), {h}, {}}}));
      // q, k and v stacked: one GEMM yields [rows, qOut + 2 kvOut].
      TG_ASSIGN_OR_RETURN(l.qkv, upload(w, {{layerName(spec_.q, i), {qOut, h}, column},
                                            {layerName(spec_.k, i), {kvOut, h}, kvShard_},
                                            {layerName(spec_.v, i), {kvOut, h}, kvShard_}}));
      TG_ASSIGN_OR_RETURN(l.o, upload(w, {{layerName(spec_.o, i), {h, qOut}, row}}));
      TG_ASSIGN_OR_RETURN(l.postNorm, upload(w, {{layerName(spec_.postNorm, i), {h}, {}}}));
      // Gate and up stacked: one GEMM yields [rows, 2 * intermediate].
      TG_ASSIGN_OR_RETURN(l.gateUp,
                          upload(w, {{layerName(spec_.gate, i), {c.intermediateSize, h}, column},
                                     {layerName(spec_.up, i), {c.intermediateSize, h}, column}}));
      TG_ASSIGN_OR_RETURN(l.down,
                          upload(w, {{layerName(spec_.down, i), {h, c.intermediateSize}, row}}));
    }
    return backend_.synchronize();
  }

  StatusOr<std::vector<float>> forward(const ForwardBatch& b, KvCache& cache) override {
    TG_RETURN_IF_ERROR(run(b, cache));
    return downloadLogits(static_cast<int64_t>(b.logitRows.size()) * config_.vocabSize);
  }

  StatusOr<std::vector<GreedyToken>> forwardGreedy(const ForwardBatch& b, KvCache& cache) override {
    TG_RETURN_IF_ERROR(run(b, cache));
    const auto n = static_cast<int64_t>(b.logitRows.size());
    // [ids (int32) | logprobs (float)] in one buffer: one download.
    TG_RETURN_IF_ERROR(ensure(backend_, ws_.greedy, static_cast<size_t>(2 * n) * 4));
    auto* ids = ws_.greedy->as<int32_t>();
    TG_RETURN_IF_ERROR(backend_.argmax({.logits = ws_.logits->data(),
                                        .ids = ids,
                                        .logprobs = reinterpret_cast<float*>(ids + n),
                                        .rows = n,
                                        .vocab = config_.vocabSize,
                                        .dtype = dtype_}));
    std::vector<int32_t> raw(2 * n);
    TG_RETURN_IF_ERROR(backend_.download(raw.data(), *ws_.greedy, raw.size() * 4));
    std::vector<GreedyToken> out(n);
    for (int64_t i = 0; i < n; ++i) {
      out[i].id = static_cast<uint32_t>(raw[i]);
      std::memcpy(&out[i].logprob, &raw[n + i], 4);
    }
    return out;
  }

  StatusOr<std::vector<SampledToken>> forwardSample(const ForwardBatch& b, KvCache& cache,
                                                    const SampleBatch& sb) override {
    const auto n = static_cast<int64_t>(b.logitRows.size());
    if (static_cast<int64_t>(sb.rows.size()) != n)
      return invalidArgumentError("one sampling row per logit row is required");
    TG_RETURN_IF_ERROR(run(b, cache));
    const int64_t vocab = config_.vocabSize, topN = sb.maxTopN;
    // Inputs in one upload: [rows | history tokens | counts | bias tokens | bias values].
    auto bytesOf = [](const auto& v) { return v.size() * sizeof(v[0]); };
    const size_t oRows = 0, oHist = oRows + bytesOf(sb.rows),
                 oCounts = oHist + bytesOf(sb.historyTokens),
                 oBiasTok = oCounts + bytesOf(sb.historyCounts),
                 oBiasVal = oBiasTok + bytesOf(sb.biasTokens),
                 total = oBiasVal + bytesOf(sb.biasValues);
    std::vector<unsigned char> host(std::max<size_t>(total, 16));
    auto put = [&](size_t at, const auto& v) {
      if (!v.empty()) std::memcpy(host.data() + at, v.data(), bytesOf(v));
    };
    put(oRows, sb.rows);
    put(oHist, sb.historyTokens);
    put(oCounts, sb.historyCounts);
    put(oBiasTok, sb.biasTokens);
    put(oBiasVal, sb.biasValues);
    TG_RETURN_IF_ERROR(ensure(backend_, ws_.sampleIn, host.size()));
    TG_RETURN_IF_ERROR(backend_.upload(*ws_.sampleIn, host.data(), host.size()));
    TG_RETURN_IF_ERROR(ensure(backend_, ws_.sampleWork, static_cast<size_t>(n * vocab) * 4));
    TG_RETURN_IF_ERROR(ensure(backend_, ws_.sampleProbs, static_cast<size_t>(n * vocab) * 8));
    // Outputs in one download: [ids | logprobs | top ids | top logprobs].
    const size_t outWords = static_cast<size_t>(2 * n + 2 * n * topN);
    TG_RETURN_IF_ERROR(ensure(backend_, ws_.sampleOut, std::max<size_t>(outWords, 1) * 4));
    auto* base = static_cast<unsigned char*>(ws_.sampleIn->data());
    auto* out = ws_.sampleOut->as<int32_t>();
    TG_RETURN_IF_ERROR(
        backend_.sample({.logits = ws_.logits->data(),
                         .rowParams = reinterpret_cast<const kernels::SampleRow*>(base + oRows),
                         .historyTokens = reinterpret_cast<const int32_t*>(base + oHist),
                         .historyCounts = reinterpret_cast<const int32_t*>(base + oCounts),
                         .biasTokens = reinterpret_cast<const int32_t*>(base + oBiasTok),
                         .biasValues = reinterpret_cast<const float*>(base + oBiasVal),
                         .work = ws_.sampleWork->as<float>(),
                         .probs = ws_.sampleProbs->as<double>(),
                         .ids = out,
                         .logprobs = reinterpret_cast<float*>(out + n),
                         .topIds = out + 2 * n,
                         .topLogprobs = reinterpret_cast<float*>(out + 2 * n + n * topN),
                         .rows = n,
                         .vocab = vocab,
                         .maxTopN = topN,
                         .dtype = dtype_}));
    std::vector<int32_t> raw(outWords);
    TG_RETURN_IF_ERROR(backend_.download(raw.data(), *ws_.sampleOut, outWords * 4));
    std::vector<SampledToken> result(n);
    auto asFloat = [](int32_t bits) {
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    };
    for (int64_t i = 0; i < n; ++i) {
      result[i].id = static_cast<uint32_t>(raw[i]);
      result[i].logprob = asFloat(raw[n + i]);
      for (int32_t j = 0; j < sb.rows[i].topN; ++j) {
        result[i].top.emplace_back(static_cast<uint32_t>(raw[2 * n + i * topN + j]),
                                   asFloat(raw[2 * n + n * topN + i * topN + j]));
      }
    }
    return result;
  }

 private:
  // The shape of one forward's metadata: eager forwards use the batch's own; a decode graph
  // fixes it for its batch size (padded rows, block tables as wide as the longest context).
  struct Layout {
    int64_t rows = 0, numSeqs = 0, maxBlocksPerSeq = 1, logitRows = 0;
    int64_t maxNewRows = 0, maxContext = 0;
  };

  // Device views of one forward's batch description (see uploadMetadata).
  struct Metadata {
    const int32_t *ids, *positions, *slots, *seqStarts, *startPos, *blockTables, *logitRows;
    const float* invFreq;
    Layout layout;
  };

  // Validates the batch and enqueues its forward, through a decode graph where one applies; the
  // logits land in ws_.logits.
  Status run(const ForwardBatch& b, KvCache& cache) {
    TG_RETURN_IF_ERROR(validate(b, cache));
    if (cache.dtype() != dtype_) return invalidArgumentError("the KV cache has another dtype");
    const auto n = static_cast<int64_t>(b.logitRows.size());
    if (const int64_t bucket = graphBucket(b, cache); bucket > 0) return runGraph(b, cache, bucket);
    const Layout layout = eagerLayout(b);
    TG_ASSIGN_OR_RETURN(const Metadata meta, uploadMetadata(b, layout, ws_.meta, ws_.invFreq));
    TG_RETURN_IF_ERROR(reserve(layout.rows, n));
    return enqueue(meta, cache);
  }

  // Enqueues the whole forward (no host synchronisation): embedding, the layers, the final norm
  // of the logit rows and the head into ws_.logits.
  Status enqueue(const Metadata& meta, KvCache& cache) {
    const ModelConfig& c = config_;
    const int64_t rows = meta.layout.rows, n = meta.layout.logitRows;
    const int64_t h = c.hiddenSize, hd = c.headDim, nh = heads_, nkv = kvHeads_, inter = inter_,
                  qkvOut = (nh + 2 * nkv) * hd;
    const DType dt = dtype_;
    void* x = ws_.residual->data();
    void* hs = ws_.hidden->data();
    void* qkv = ws_.qkv->data();
    void* kPart = at(*ws_.qkv, nh * hd, dt);
    void* vPart = at(*ws_.qkv, (nh + nkv) * hd, dt);
    void* attn = ws_.attn->data();
    void* gateUp = ws_.gateUp->data();
    void* act = ws_.act->data();
    const auto eps = static_cast<float>(c.rmsNormEps);

    // Each rank embeds the tokens of its part of the vocabulary (zero rows for the others).
    TG_RETURN_IF_ERROR(backend_.gatherRows({.table = embed_->data(),
                                            .ids = meta.ids,
                                            .out = x,
                                            .rows = rows,
                                            .width = h,
                                            .tableRows = vocabPart_,
                                            .dtype = dt,
                                            .idOffset = rank_ * vocabPart_,
                                            .zeroOutside = world_ > 1}));
    TG_RETURN_IF_ERROR(allReduce(x, rows * h));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t i = 0; i < c.numLayers; ++i) {
      Layer& l = layers_[i];
      // Layer 0 normalises the embedding; later layers first add the previous MLP output.
      TG_RETURN_IF_ERROR(backend_.rmsNorm({.input = i == 0 ? x : hs,
                                           .residual = i == 0 ? nullptr : x,
                                           .residualOut = i == 0 ? nullptr : x,
                                           .output = hs,
                                           .weight = l.inputNorm->data(),
                                           .numTokens = rows,
                                           .hiddenSize = h,
                                           .eps = eps,
                                           .dtype = dt}));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.qkv->data(), qkv, rows, h, qkvOut, dt}));
      TG_RETURN_IF_ERROR(backend_.ropeWriteKv({.rope = {.q = qkv,
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
                                               .kv = {.k = kPart,
                                                      .v = vPart,
                                                      .kvRowStride = qkvOut,
                                                      .kCache = cache.keys(i),
                                                      .vCache = cache.values(i),
                                                      .slots = meta.slots,
                                                      .rows = rows,
                                                      .numKvHeads = nkv,
                                                      .headDim = hd,
                                                      .numSlots = cache.numSlots(),
                                                      .dtype = dt}}));
      TG_RETURN_IF_ERROR(backend_.attention(
          {.q = qkv,
           .qRowStride = qkvOut,
           .kCache = cache.keys(i),
           .vCache = cache.values(i),
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
           .slidingWindow = spec_.slidingWindow ? c.slidingWindow.value_or(0) : 0,
           .scale = scale,
           .maxNewRows = meta.layout.maxNewRows,
           .maxContext = meta.layout.maxContext,
           .dtype = dt}));
      TG_RETURN_IF_ERROR(backend_.linear({attn, l.o->data(), hs, rows, nh * hd, h, dt}));
      TG_RETURN_IF_ERROR(allReduce(hs, rows * h));
      TG_RETURN_IF_ERROR(backend_.rmsNorm({.input = hs,
                                           .residual = x,
                                           .residualOut = x,
                                           .output = hs,
                                           .weight = l.postNorm->data(),
                                           .numTokens = rows,
                                           .hiddenSize = h,
                                           .eps = eps,
                                           .dtype = dt}));
      TG_RETURN_IF_ERROR(backend_.linear({hs, l.gateUp->data(), gateUp, rows, h, 2 * inter, dt}));
      TG_RETURN_IF_ERROR(backend_.siluMul({gateUp, act, rows, inter, dt}));
      TG_RETURN_IF_ERROR(backend_.linear({act, l.down->data(), hs, rows, inter, h, dt}));
      TG_RETURN_IF_ERROR(allReduce(hs, rows * h));
    }
    // Final norm of the wanted rows only, then the head.
    void* pickedHs = ws_.pickedHidden->data();
    void* pickedX = ws_.pickedResidual->data();
    TG_RETURN_IF_ERROR(backend_.gatherRows({hs, meta.logitRows, pickedHs, n, h, rows, dt}));
    TG_RETURN_IF_ERROR(backend_.gatherRows({x, meta.logitRows, pickedX, n, h, rows, dt}));
    TG_RETURN_IF_ERROR(backend_.rmsNorm({.input = pickedHs,
                                         .residual = pickedX,
                                         .residualOut = pickedX,
                                         .output = pickedHs,
                                         .weight = finalNorm_->data(),
                                         .numTokens = n,
                                         .hiddenSize = h,
                                         .eps = eps,
                                         .dtype = dt}));
    if (world_ == 1)
      return backend_.linear(
          {pickedHs, lmHead_->data(), ws_.logits->data(), n, h, c.vocabSize, dt});
    // Each rank's part of the vocabulary, gathered as [rank][row][part], then laid out as whole
    // rows (the padding of the last part dropped): every rank holds every logit.
    TG_RETURN_IF_ERROR(
        backend_.linear({pickedHs, lmHead_->data(), ws_.partLogits->data(), n, h, vocabPart_, dt}));
    TG_RETURN_IF_ERROR(
        comm_->allGather(ws_.partLogits->data(), ws_.gatheredLogits->data(), n * vocabPart_, dt));
    const size_t es = kernels::dtypeSize(dt);
    for (int r = 0; r < world_; ++r) {
      const int64_t width = std::min(vocabPart_, c.vocabSize - r * vocabPart_);
      if (width <= 0) break;
      TG_RETURN_IF_ERROR(backend_.copy2d(at(*ws_.logits, r * vocabPart_, dt), c.vocabSize * es,
                                         at(*ws_.gatheredLogits, r * n * vocabPart_, dt),
                                         vocabPart_ * es, width * es, n));
    }
    return okStatus();
  }

  Status allReduce(void* data, int64_t count) {
    return world_ == 1 ? okStatus() : comm_->allReduceSum(data, count, dtype_);
  }

  Layout eagerLayout(const ForwardBatch& b) const {
    Layout l;
    l.rows = static_cast<int64_t>(b.tokenIds.size());
    l.numSeqs = static_cast<int64_t>(b.sequences.size());
    l.logitRows = static_cast<int64_t>(b.logitRows.size());
    for (const SequenceRows& s : b.sequences) {
      l.maxBlocksPerSeq =
          std::max<int64_t>(l.maxBlocksPerSeq, static_cast<int64_t>(s.blocks.size()));
      l.maxNewRows = std::max(l.maxNewRows, s.numRows);
      l.maxContext = std::max(l.maxContext, s.startPos + s.numRows);
    }
    return l;
  }

  // The graph batch size for a decode step (one new row per sequence, every sequence's logits),
  // or 0 to run eagerly.
  int64_t graphBucket(const ForwardBatch& b, const KvCache& cache) const {
    if (graphSizes_.empty()) return 0;
    const auto n = static_cast<int64_t>(b.sequences.size());
    if (static_cast<int64_t>(b.tokenIds.size()) != n ||
        static_cast<int64_t>(b.logitRows.size()) != n)
      return 0;
    const int64_t maxBlocks = graphContext_ / cache.blockSize() + 1;
    for (size_t i = 0; i < b.sequences.size(); ++i) {
      const SequenceRows& s = b.sequences[i];
      if (s.numRows != 1 || b.logitRows[i] != static_cast<int64_t>(i) ||
          static_cast<int64_t>(s.blocks.size()) > maxBlocks || s.startPos + 1 > graphContext_)
        return 0;
    }
    for (int64_t size : graphSizes_) {
      if (size >= n) return size;
    }
    return 0;
  }

  Layout graphLayout(int64_t bucket, const KvCache& cache) const {
    Layout l;
    l.rows = l.numSeqs = l.logitRows = bucket;
    l.maxBlocksPerSeq = graphContext_ / cache.blockSize() + 1;
    l.maxNewRows = 1;
    l.maxContext = graphContext_;
    return l;
  }

  // A decode step through the captured graph of `bucket` sequences (captured on first use, and
  // again when the KV cache or the activation buffers change).
  Status runGraph(const ForwardBatch& b, KvCache& cache, int64_t bucket) {
    if (cache.id() != graphCacheId_) {
      graphs_.clear();
      graphCacheId_ = cache.id();
    }
    const Layout layout = graphLayout(bucket, cache);
    // Activations for the largest graph, so that eager forwards rarely move them.
    TG_RETURN_IF_ERROR(reserve(graphSizes_.back(), graphSizes_.back()));
    TG_ASSIGN_OR_RETURN(const Metadata meta,
                        uploadMetadata(b, layout, graphMeta_, graphFreq_, graphMetaBytes()));
    auto it = graphs_.find(bucket);
    if (it == graphs_.end()) {
      TG_RETURN_IF_ERROR(backend_.beginCapture());
      const Status st = enqueue(meta, cache);
      auto graph = backend_.endCapture();
      TG_RETURN_IF_ERROR(st.withContext("capturing the decode graph of " + std::to_string(bucket)));
      if (!graph.ok()) return graph.status();
      it = graphs_.emplace(bucket, std::move(*graph)).first;
    }
    return backend_.launch(*it->second);
  }

  // Bytes of the graph metadata buffers, sized once for the largest graph (captured pointers must
  // not move): int32 fields and RoPE frequencies.
  std::pair<size_t, size_t> graphMetaBytes() const {
    const int64_t bucket = graphSizes_.back();
    const int64_t blocks = graphContext_ + 1;  // an upper bound on blocks per sequence
    return {static_cast<size_t>(5 * bucket + 1 + bucket * blocks) * sizeof(int32_t),
            static_cast<size_t>(bucket * config_.rotaryDim() / 2) * sizeof(float)};
  }

  struct Workspace {
    int64_t rows = 0, logitRows = 0;
    std::unique_ptr<Buffer> residual, hidden, qkv, attn, gateUp, act;
    std::unique_ptr<Buffer> pickedHidden, pickedResidual, logits;
    std::unique_ptr<Buffer> partLogits, gatheredLogits;  // tensor parallelism: the head's parts
    std::unique_ptr<Buffer> meta, invFreq, greedy;
    // kernels::sample: inputs, float32/float64 scratch, outputs.
    std::unique_ptr<Buffer> sampleIn, sampleWork, sampleProbs, sampleOut;
  };

  struct Part {
    std::string name;
    std::vector<int64_t> shape;
    Shard shard;
  };

  // Loads the tensors in the model dtype and uploads them stacked along the first dimension.
  StatusOr<std::unique_ptr<Buffer>> upload(const WeightStore& w, const std::vector<Part>& parts) {
    std::vector<Tensor> tensors;
    size_t total = 0;
    for (const Part& p : parts) {
      TG_ASSIGN_OR_RETURN(Tensor t, w.load(p.name, dtype_, p.shape, p.shard));
      total += t.bytes();
      tensors.push_back(std::move(t));
    }
    TG_ASSIGN_OR_RETURN(auto buf, backend_.allocate(total));
    size_t offset = 0;
    for (const Tensor& t : tensors) {
      TG_RETURN_IF_ERROR(backend_.upload(*buf, t.data(), t.bytes(), offset));
      offset += t.bytes();
    }
    // Host tensors are freed on return; pageable uploads are staged before upload() returns.
    return buf;
  }

  static Status ensure(Backend& backend, std::unique_ptr<Buffer>& buf, size_t bytes) {
    if (buf && buf->bytes() >= bytes) return okStatus();
    buf.reset();
    TG_ASSIGN_OR_RETURN(buf, backend.allocate(bytes));
    return okStatus();
  }

  // Builds the batch description on the host in `layout` (rows and sequences past the batch's are
  // padding: token 0 at position 0, no KV slot) and uploads it in two copies, int32 fields and
  // each row's RoPE frequencies (dynamic NTK depends on each sequence's length). `minBytes`
  // presizes the buffers (graphs need them never to move).
  StatusOr<Metadata> uploadMetadata(const ForwardBatch& b, const Layout& layout,
                                    std::unique_ptr<Buffer>& metaBuf,
                                    std::unique_ptr<Buffer>& freqBuf,
                                    std::pair<size_t, size_t> minBytes = {0, 0}) {
    const int64_t rows = layout.rows, numSeqs = layout.numSeqs, n = layout.logitRows,
                  width = layout.maxBlocksPerSeq;
    // [ids | positions | slots | seqStarts | startPos | blockTables | logitRows]
    const int64_t oIds = 0, oPos = rows, oSlots = 2 * rows, oStarts = 3 * rows,
                  oStartPos = oStarts + numSeqs + 1, oTables = oStartPos + numSeqs,
                  oLogits = oTables + numSeqs * width, total = oLogits + n;
    hostMeta_.assign(total, 0);
    const int64_t half = config_.rotaryDim() / 2;
    hostFreq_.assign(rows * half, 0.0f);
    const auto realRows = static_cast<int64_t>(b.tokenIds.size());
    for (int64_t r = 0; r < rows; ++r) {
      hostMeta_[oIds + r] = r < realRows ? static_cast<int32_t>(b.tokenIds[r]) : 0;
      hostMeta_[oSlots + r] = r < realRows ? static_cast<int32_t>(b.slots[r]) : -1;
    }
    const auto realSeqs = static_cast<int64_t>(b.sequences.size());
    for (int64_t i = 0; i < numSeqs; ++i) {
      if (i >= realSeqs) {  // padding: one row at position 0
        hostMeta_[oStarts + i] = static_cast<int32_t>(realRows + (i - realSeqs));
        continue;
      }
      const SequenceRows& s = b.sequences[i];
      const std::vector<float> freq = ropeInverseFrequencies(config_, s.startPos + s.numRows);
      for (int64_t t = 0; t < s.numRows; ++t) {
        hostMeta_[oPos + s.firstRow + t] = static_cast<int32_t>(s.startPos + t);
        std::copy(freq.begin(), freq.end(), hostFreq_.begin() + (s.firstRow + t) * half);
      }
      hostMeta_[oStarts + i] = static_cast<int32_t>(s.firstRow);
      hostMeta_[oStartPos + i] = static_cast<int32_t>(s.startPos);
      for (size_t j = 0; j < s.blocks.size(); ++j)
        hostMeta_[oTables + i * width + static_cast<int64_t>(j)] =
            static_cast<int32_t>(s.blocks[j]);
    }
    hostMeta_[oStarts + numSeqs] = static_cast<int32_t>(rows);
    for (int64_t i = 0; i < n; ++i) {
      hostMeta_[oLogits + i] =
          i < static_cast<int64_t>(b.logitRows.size()) ? static_cast<int32_t>(b.logitRows[i]) : 0;
    }

    TG_RETURN_IF_ERROR(
        ensure(backend_, metaBuf, std::max(minBytes.first, hostMeta_.size() * sizeof(int32_t))));
    TG_RETURN_IF_ERROR(
        ensure(backend_, freqBuf,
               std::max({minBytes.second, hostFreq_.size() * sizeof(float), size_t{4}})));
    TG_RETURN_IF_ERROR(
        backend_.upload(*metaBuf, hostMeta_.data(), hostMeta_.size() * sizeof(int32_t)));
    TG_RETURN_IF_ERROR(
        backend_.upload(*freqBuf, hostFreq_.data(), hostFreq_.size() * sizeof(float)));
    Metadata m{};
    const auto* base = metaBuf->as<const int32_t>();
    m.ids = base + oIds;
    m.positions = base + oPos;
    m.slots = base + oSlots;
    m.seqStarts = base + oStarts;
    m.startPos = base + oStartPos;
    m.blockTables = base + oTables;
    m.logitRows = base + oLogits;
    m.invFreq = freqBuf->as<const float>();
    m.layout = layout;
    return m;
  }

  Status reserve(int64_t rows, int64_t logitRows) {
    const ModelConfig& c = config_;
    const size_t es = kernels::dtypeSize(dtype_);
    auto alloc = [&](std::unique_ptr<Buffer>& b, int64_t r, int64_t width) {
      return ensure(backend_, b, static_cast<size_t>(r * width) * es);
    };
    if (rows > ws_.rows || logitRows > ws_.logitRows) graphs_.clear();  // their pointers move
    if (rows > ws_.rows) {
      TG_RETURN_IF_ERROR(alloc(ws_.residual, rows, c.hiddenSize));
      TG_RETURN_IF_ERROR(alloc(ws_.hidden, rows, c.hiddenSize));
      TG_RETURN_IF_ERROR(alloc(ws_.qkv, rows, (heads_ + 2 * kvHeads_) * c.headDim));
      TG_RETURN_IF_ERROR(alloc(ws_.attn, rows, heads_ * c.headDim));
      TG_RETURN_IF_ERROR(alloc(ws_.gateUp, rows, 2 * inter_));
      TG_RETURN_IF_ERROR(alloc(ws_.act, rows, inter_));
      ws_.rows = rows;
    }
    if (logitRows > ws_.logitRows) {
      TG_RETURN_IF_ERROR(alloc(ws_.pickedHidden, logitRows, c.hiddenSize));
      TG_RETURN_IF_ERROR(alloc(ws_.pickedResidual, logitRows, c.hiddenSize));
      TG_RETURN_IF_ERROR(alloc(ws_.logits, logitRows, c.vocabSize));
      if (world_ > 1) {
        TG_RETURN_IF_ERROR(alloc(ws_.partLogits, logitRows, vocabPart_));
        TG_RETURN_IF_ERROR(alloc(ws_.gatheredLogits, logitRows, world_ * vocabPart_));
      }
      ws_.logitRows = logitRows;
    }
    return okStatus();
  }

  StatusOr<std::vector<float>> downloadLogits(int64_t count) {
    std::vector<float> logits(count);
    if (dtype_ == DType::kF32) {
      TG_RETURN_IF_ERROR(backend_.download(logits.data(), *ws_.logits, count * sizeof(float)));
      return logits;
    }
    std::vector<uint16_t> raw(count);
    TG_RETURN_IF_ERROR(backend_.download(raw.data(), *ws_.logits, count * sizeof(uint16_t)));
    for (int64_t i = 0; i < count; ++i) {
      logits[i] =
          dtype_ == DType::kF16 ? kernels::f16ToFloat(raw[i]) : kernels::bf16ToFloat(raw[i]);
    }
    return logits;
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

  ModelConfig config_;
  ArchitectureSpec spec_;
  Backend& backend_;
  // Tensor parallelism: this rank's share (everything, on one rank).
  Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  int64_t heads_ = 0, kvHeads_ = 0, inter_ = 0, vocabPart_ = 0;
  Shard kvShard_;
  DType dtype_ = DType::kF32;
  float ropeScaling_ = 1.0f;  // multiplies cos and sin
  std::unique_ptr<Buffer> embed_, finalNorm_, ownLmHead_;
  Buffer* lmHead_ = nullptr;
  std::vector<Layer> layers_;
  Workspace ws_;
  // Decode graphs by batch size, bound to one KV cache and to the workspace's buffers.
  std::vector<int64_t> graphSizes_;  // ascending
  int64_t graphContext_ = 0;         // longest context a graph serves
  std::map<int64_t, std::unique_ptr<Graph>> graphs_;
  uint64_t graphCacheId_ = 0;
  std::unique_ptr<Buffer> graphMeta_, graphFreq_;
  std::vector<int32_t> hostMeta_;
  std::vector<float> hostFreq_;
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
