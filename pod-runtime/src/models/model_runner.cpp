#include "models/model_runner.h"

#include <algorithm>
#include <chrono>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"
#include "textgen/base/log.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/rope.h"

namespace textgen::runtime {

StatusOr<std::unique_ptr<Model>> ModelRunner::load(const ModelConfig& config,
                                                   std::unique_ptr<ArchitectureGraph> graph,
                                                   const WeightStore& weights, Backend& backend,
                                                   const ModelOptions& options) {
  auto r = std::make_unique<ModelRunner>(config, std::move(graph), backend);
  r->comm_ = options.comm;
  TG_ASSIGN_OR_RETURN(r->part_, options.comm ? Partition::split(r->config_, options.comm->rank(),
                                                                options.comm->worldSize())
                                             : Partition::split(r->config_, 0, 1));
  r->dtype_ = options.dtype;
  TG_RETURN_IF_ERROR(backend.supports(r->dtype_));
  r->graphSizes_ = options.graphBatchSizes;
  std::sort(r->graphSizes_.begin(), r->graphSizes_.end());
  if (!r->graphSizes_.empty() && r->graphSizes_.front() <= 0)
    return invalidArgumentError("graph batch sizes must be positive");
  r->graphContext_ = r->config_.maxContext();
  if (options.graphRowsPerSequence < 1 || options.graphRowsPerSequence > 64)
    return invalidArgumentError("graph rows per sequence must be in [1, 64]");
  r->graphRows_ = options.graphRowsPerSequence;
  const WeightLoader loader(weights, backend, r->dtype_, r->config_, r->part_, options.quantize);
  TG_RETURN_IF_ERROR(r->graph_->load(loader));
  if (!options.medusaDir.empty()) TG_RETURN_IF_ERROR(r->loadMedusa(options));
  TG_RETURN_IF_ERROR(backend.synchronize());
  return std::unique_ptr<Model>(std::move(r));
}

Status ModelRunner::loadMedusa(const ModelOptions& options) {
  const LogitsHead* head = graph_->logitsHead();
  if (head == nullptr || head->projects() || config_.isEncoderDecoder) {
    return unimplementedError(config_.architecture +
                              ": Medusa heads need a decoder-only model whose logits head reads "
                              "the final hidden state");
  }
  const std::string path = options.medusaDir + "/medusa_lm_head.safetensors";
  TG_ASSIGN_OR_RETURN(auto store, WeightStore::openFile(path));
  // Replicated, in the compute dtype: never quantized (--quantize is the base model's).
  const WeightLoader loader(*store, backend_, dtype_, config_, part_, LoadQuantization::kNone);
  auto heads = MedusaHeads::load(loader, options.medusaHeads, options.medusaLayers, head->linear());
  if (!heads.ok()) return heads.status().withContext(path);
  medusa_ = std::move(*heads);
  return okStatus();
}

StatusOr<std::vector<uint32_t>> ModelRunner::speculativeIds() {
  std::vector<uint32_t> out;
  if (!medusa_ || medusaStride_ == 0) return out;
  const int64_t heads = medusa_->heads();
  std::vector<int32_t> raw(heads * medusaStride_);
  TG_RETURN_IF_ERROR(backend_.download(raw.data(), medusa_->ids(), raw.size() * sizeof(int32_t)));
  out.resize(heads * medusaRows_);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < medusaRows_; ++r)
      out[h * medusaRows_ + r] = static_cast<uint32_t>(raw[h * medusaStride_ + r]);
  }
  return out;
}

StatusOr<LogitsView> ModelRunner::forwardLogits(const ForwardBatch& b, KvCache& cache) {
  TG_RETURN_IF_ERROR(run(b, cache));
  return LogitsView{.buffer = ws_.logits.get(),
                    .rows = static_cast<int64_t>(b.logitRows.size()),
                    .vocab = config_.vocabSize,
                    .dtype = dtype_};
}

StatusOr<std::vector<float>> ModelRunner::forward(const ForwardBatch& b, KvCache& cache) {
  TG_ASSIGN_OR_RETURN(const LogitsView logits, forwardLogits(b, cache));
  return downloadLogits(backend_, logits);
}

StatusOr<std::vector<float>> downloadLogits(Backend& backend, const LogitsView& logits) {
  const int64_t count = logits.rows * logits.vocab;
  std::vector<float> out(count);
  if (logits.dtype == DType::kF32) {
    TG_RETURN_IF_ERROR(backend.download(out.data(), *logits.buffer, count * sizeof(float)));
    return out;
  }
  std::vector<uint16_t> raw(count);
  TG_RETURN_IF_ERROR(backend.download(raw.data(), *logits.buffer, count * sizeof(uint16_t)));
  for (int64_t i = 0; i < count; ++i) {
    out[i] =
        logits.dtype == DType::kF16 ? kernels::f16ToFloat(raw[i]) : kernels::bf16ToFloat(raw[i]);
  }
  return out;
}

// Validates the batch and enqueues its forward, through a decode graph where one applies; the
// logits land in ws_.logits.
Status ModelRunner::run(const ForwardBatch& b, KvCache& cache) {
  TG_RETURN_IF_ERROR(validate(b, cache));
  if (cache.dtype() != dtype_) return invalidArgumentError("the KV cache has another dtype");
  const auto n = static_cast<int64_t>(b.logitRows.size());
  // Speculation's verification rows compute as plain decode rows do; prompt rows, and decode steps
  // of one row a sequence, as without it.
  const bool verifies =
      b.decode && std::any_of(b.sequences.begin(), b.sequences.end(),
                              [](const SequenceRows& s) { return s.numRows > 1; });
  backend_.setGemvRows(verifies ? graphRows_ : 1);
  // Medusa's guesses, for steps of few enough logit rows (enqueue's condition).
  auto medusaOn = [&](int64_t laidOut) {
    medusaStride_ = medusa_ && laidOut <= medusaRowLimit() ? laidOut : 0;
    medusaRows_ = n;
  };
  if (const GraphShape shape = graphShape(b, cache); shape.bucket > 0) {
    medusaOn(shape.bucket * shape.rows);
    return runGraph(b, cache, shape);
  }
  const Layout layout = eagerLayout(b);
  medusaOn(layout.logitRows);
  TG_ASSIGN_OR_RETURN(const BatchMetadata meta, uploadMetadata(b, layout, meta_, invFreq_));
  std::optional<BatchMetadata> encoder;
  if (!b.encoderTokenIds.empty()) {
    TG_ASSIGN_OR_RETURN(encoder, uploadEncoderMetadata(b, cache));
  }
  TG_RETURN_IF_ERROR(
      reserve(std::max<int64_t>(layout.rows, encoder ? encoder->layout.rows : 0), n));
  return enqueue(meta, cache, encoder ? &*encoder : nullptr);
}

// Enqueues the whole forward (no host synchronisation): the architecture's graph, then the
// tensor-parallel logits gathered into whole rows, then the Medusa heads' guesses.
Status ModelRunner::enqueue(const BatchMetadata& meta, KvCache& cache,
                            const BatchMetadata* encoder) {
  const ForwardContext ctx{.backend = backend_,
                           .comm = comm_,
                           .config = config_,
                           .partition = part_,
                           .dtype = dtype_,
                           .meta = meta,
                           .ws = ws_,
                           .cache = cache,
                           .encoder = encoder};
  TG_RETURN_IF_ERROR(graph_->build(ctx));
  if (part_.world > 1) TG_RETURN_IF_ERROR(gatherLogits(meta.layout.logitRows));
  if (medusa_ && meta.layout.logitRows <= medusaRowLimit()) return medusa_->forward(ctx);
  return okStatus();
}

// Each rank's part of the vocabulary, gathered as [rank][row][part], then laid out as whole rows
// (the padding of the last part dropped): every rank holds every logit.
Status ModelRunner::gatherLogits(int64_t n) {
  const int64_t vocab = config_.vocabSize, part = part_.vocabPart;
  TG_RETURN_IF_ERROR(
      comm_->allGather(ws_.partLogits->data(), ws_.gatheredLogits->data(), n * part, dtype_));
  const size_t es = kernels::dtypeSize(dtype_);
  auto* logits = static_cast<char*>(ws_.logits->data());
  auto* gathered = static_cast<const char*>(ws_.gatheredLogits->data());
  for (int r = 0; r < part_.world; ++r) {
    const int64_t width = std::min(part, vocab - r * part);
    if (width <= 0) break;
    TG_RETURN_IF_ERROR(backend_.copy2d(logits + r * part * es, vocab * es,
                                       gathered + r * n * part * es, part * es, width * es, n));
  }
  return okStatus();
}

BatchMetadata::Layout ModelRunner::eagerLayout(const ForwardBatch& b) const {
  Layout l;
  l.rows = static_cast<int64_t>(b.tokenIds.size());
  l.numSeqs = static_cast<int64_t>(b.sequences.size());
  l.logitRows = static_cast<int64_t>(b.logitRows.size());
  for (const SequenceRows& s : b.sequences) {
    l.maxBlocksPerSeq = std::max<int64_t>(l.maxBlocksPerSeq, static_cast<int64_t>(s.blocks.size()));
    if (s.numRows > 0)
      l.minNewRows = l.minNewRows == 0 ? s.numRows : std::min(l.minNewRows, s.numRows);
    l.maxNewRows = std::max(l.maxNewRows, s.numRows);
    l.maxContext = std::max(l.maxContext, s.startPos + s.numRows);
  }
  for (const CrossContext& c : b.cross) {
    l.crossBlocksPerSeq =
        std::max<int64_t>(l.crossBlocksPerSeq, static_cast<int64_t>(c.blocks.size()));
    l.maxCrossLen = std::max(l.maxCrossLen, c.encoderLen);
  }
  return l;
}

// The graph for a decode step (every sequence brings the same number of new rows, up to
// graphRows_, with every row's logits), or bucket 0 to run eagerly.
ModelRunner::GraphShape ModelRunner::graphShape(const ForwardBatch& b, const KvCache& cache) const {
  if (graphSizes_.empty() || !b.encoderTokenIds.empty() || b.sequences.empty()) return {};
  const auto n = static_cast<int64_t>(b.sequences.size());
  const int64_t q = b.sequences[0].numRows;
  // Several rows a sequence: only speculation's verification steps (a prompt chunk of a few rows
  // would capture a graph with other GEMM kernels than the verification steps that replay it).
  if (q > 1 && !b.decode) return {};
  if (q < 1 || q > graphRows_ || static_cast<int64_t>(b.tokenIds.size()) != n * q ||
      static_cast<int64_t>(b.logitRows.size()) != n * q)
    return {};
  const int64_t maxBlocks = graphContext_ / cache.blockSize() + 1;
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    const SequenceRows& s = b.sequences[i];
    if (s.numRows != q || s.firstRow != static_cast<int64_t>(i) * q ||
        static_cast<int64_t>(s.blocks.size()) > maxBlocks || s.startPos + q > graphContext_)
      return {};
  }
  for (int64_t r = 0; r < n * q; ++r) {
    if (b.logitRows[r] != r) return {};
  }
  for (const CrossContext& c : b.cross) {
    if (static_cast<int64_t>(c.blocks.size()) > maxBlocks || c.encoderLen > graphContext_)
      return {};
  }
  for (int64_t size : graphSizes_) {
    if (size >= n) return {size, q};
  }
  return {};
}

BatchMetadata::Layout ModelRunner::graphLayout(GraphShape shape, const KvCache& cache) const {
  Layout l;
  l.numSeqs = shape.bucket;
  l.rows = l.logitRows = shape.bucket * shape.rows;
  l.maxBlocksPerSeq = graphContext_ / cache.blockSize() + 1;
  l.minNewRows = l.maxNewRows = shape.rows;
  l.maxContext = graphContext_;
  if (config_.isEncoderDecoder) {
    l.crossBlocksPerSeq = l.maxBlocksPerSeq;
    l.maxCrossLen = graphContext_;
  }
  return l;
}

// A decode step through the captured graph of its shape (captured on first use, and again when the
// KV cache or the activation buffers change).
Status ModelRunner::runGraph(const ForwardBatch& b, KvCache& cache, GraphShape shape) {
  if (cache.id() != graphCacheId_) {
    if (!graphs_.empty()) spdlog::info("decode graphs dropped: a new KV cache");
    graphs_.clear();
    graphCacheId_ = cache.id();
  }
  const Layout layout = graphLayout(shape, cache);
  // Activations for the largest graph, so that eager forwards rarely move them.
  const int64_t most = graphSizes_.back() * graphRows_;
  TG_RETURN_IF_ERROR(reserve(most, most));
  TG_ASSIGN_OR_RETURN(const BatchMetadata meta,
                      uploadMetadata(b, layout, graphMeta_, graphFreq_, graphMetaBytes()));
  auto it = graphs_.find(shape);
  if (it == graphs_.end()) {
    // One eager forward first: GEMM plans are tuned (timing them, which no capture allows) and
    // modules loaded outside the capture. The graph then recomputes the same rows.
    const auto start = std::chrono::steady_clock::now();
    TG_RETURN_IF_ERROR(enqueue(meta, cache, nullptr));
    TG_RETURN_IF_ERROR(backend_.beginCapture());
    const Status st = enqueue(meta, cache, nullptr);
    auto graph = backend_.endCapture();
    TG_RETURN_IF_ERROR(st.withContext("capturing the decode graph of " +
                                      std::to_string(shape.bucket) + " x " +
                                      std::to_string(shape.rows) + " rows"));
    if (!graph.ok()) return graph.status();
    it = graphs_.emplace(shape, std::move(*graph)).first;
    // Warmup captures the one-row graphs; a capture while serving (speculation's shapes, or
    // after the buffers moved) costs its step this long.
    spdlog::info("decode graph of {} x {} rows captured ({:.1f} ms on the host)", shape.bucket,
                 shape.rows,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  return backend_.launch(*it->second);
}

// Bytes of the graph metadata buffers, sized once for the largest graph (captured pointers must
// not move): int32 fields and RoPE frequencies.
std::pair<size_t, size_t> ModelRunner::graphMetaBytes() const {
  const int64_t bucket = graphSizes_.back(), rows = bucket * graphRows_;
  const int64_t blocks = graphContext_ + 1;  // an upper bound on blocks per sequence
  const int64_t cross = config_.isEncoderDecoder ? bucket * (1 + blocks) : 0;
  // [ids | positions | slots | logit rows] per row, [starts (+1) | start positions | tables] per
  // sequence.
  return {
      static_cast<size_t>(4 * rows + 2 * bucket + 1 + bucket * blocks + cross) * sizeof(int32_t),
      static_cast<size_t>(rows * config_.rotaryDim() / 2) * sizeof(float)};
}

// Builds the batch description on the host in `layout` (rows and sequences past the batch's are
// padding: token 0 at position 0, no KV slot) and uploads it in two copies, int32 fields and each
// row's RoPE frequencies (dynamic NTK depends on each sequence's length). `minBytes` presizes the
// buffers (graphs need them never to move).
StatusOr<BatchMetadata> ModelRunner::uploadMetadata(const ForwardBatch& b, const Layout& layout,
                                                    std::unique_ptr<Buffer>& metaBuf,
                                                    std::unique_ptr<Buffer>& freqBuf,
                                                    std::pair<size_t, size_t> minBytes) {
  const int64_t rows = layout.rows, numSeqs = layout.numSeqs, n = layout.logitRows,
                width = layout.maxBlocksPerSeq;
  // [ids | positions | slots | seqStarts | startPos | blockTables | logitRows | crossLens |
  //  crossTables] (the last two for encoder-decoder models)
  const int64_t crossWidth = layout.crossBlocksPerSeq;
  const int64_t oIds = 0, oPos = rows, oSlots = 2 * rows, oStarts = 3 * rows,
                oStartPos = oStarts + numSeqs + 1, oTables = oStartPos + numSeqs,
                oLogits = oTables + numSeqs * width, oCrossLens = oLogits + n,
                oCrossTables = oCrossLens + (crossWidth > 0 ? numSeqs : 0),
                total = oCrossTables + numSeqs * crossWidth;
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
    if (i >= realSeqs) {  // padding: rows from position 0 (and one encoder position), block 0
      const int64_t perSeq = std::max<int64_t>(1, layout.minNewRows);
      hostMeta_[oStarts + i] = static_cast<int32_t>(realRows + (i - realSeqs) * perSeq);
      if (crossWidth > 0) hostMeta_[oCrossLens + i] = 1;
      continue;
    }
    const SequenceRows& s = b.sequences[i];
    std::vector<float> freq = ropeInverseFrequencies(config_, s.startPos + s.numRows);
    for (int64_t t = 0; t < s.numRows; ++t) {
      // A decode step's rows (the last token, then proposed ones) each take the frequencies of the
      // length plain decoding would have at their position (dynamic NTK depends on it).
      if (b.decode && s.numRows > 1) freq = ropeInverseFrequencies(config_, s.startPos + t + 1);
      hostMeta_[oPos + s.firstRow + t] = static_cast<int32_t>(s.startPos + t);
      std::copy(freq.begin(), freq.end(), hostFreq_.begin() + (s.firstRow + t) * half);
    }
    hostMeta_[oStarts + i] = static_cast<int32_t>(s.firstRow);
    hostMeta_[oStartPos + i] = static_cast<int32_t>(s.startPos);
    for (size_t j = 0; j < s.blocks.size(); ++j)
      hostMeta_[oTables + i * width + static_cast<int64_t>(j)] = static_cast<int32_t>(s.blocks[j]);
    if (crossWidth > 0 && i < static_cast<int64_t>(b.cross.size())) {
      const CrossContext& c = b.cross[i];
      hostMeta_[oCrossLens + i] = static_cast<int32_t>(c.encoderLen);
      for (size_t j = 0; j < c.blocks.size(); ++j)
        hostMeta_[oCrossTables + i * crossWidth + static_cast<int64_t>(j)] =
            static_cast<int32_t>(c.blocks[j]);
    }
  }
  hostMeta_[oStarts + numSeqs] = static_cast<int32_t>(rows);
  for (int64_t i = 0; i < n; ++i) {
    hostMeta_[oLogits + i] =
        i < static_cast<int64_t>(b.logitRows.size()) ? static_cast<int32_t>(b.logitRows[i]) : 0;
  }

  TG_RETURN_IF_ERROR(ensureBuffer(backend_, metaBuf,
                                  std::max(minBytes.first, hostMeta_.size() * sizeof(int32_t))));
  TG_RETURN_IF_ERROR(ensureBuffer(
      backend_, freqBuf, std::max({minBytes.second, hostFreq_.size() * sizeof(float), size_t{4}})));
  TG_RETURN_IF_ERROR(
      backend_.upload(*metaBuf, hostMeta_.data(), hostMeta_.size() * sizeof(int32_t)));
  TG_RETURN_IF_ERROR(backend_.upload(*freqBuf, hostFreq_.data(), hostFreq_.size() * sizeof(float)));
  BatchMetadata m{};
  const auto* base = metaBuf->as<const int32_t>();
  m.ids = base + oIds;
  m.positions = base + oPos;
  m.slots = base + oSlots;
  m.seqStarts = base + oStarts;
  m.startPos = base + oStartPos;
  m.blockTables = base + oTables;
  m.logitRows = base + oLogits;
  m.invFreq = freqBuf->as<const float>();
  if (crossWidth > 0) {
    m.crossLens = base + oCrossLens;
    m.crossTables = base + oCrossTables;
  }
  m.layout = layout;
  return m;
}

// The encoder's rows of a step where encoder-decoder sequences start: their prompts, one sequence
// each over its cross-attention blocks (whose slots the encoder's keys and values use while it
// runs, before the cross keys and values take them), positions from 0, no logit rows.
StatusOr<BatchMetadata> ModelRunner::uploadEncoderMetadata(const ForwardBatch& b,
                                                           const KvCache& cache) {
  Layout l;
  l.rows = static_cast<int64_t>(b.encoderTokenIds.size());
  for (const CrossContext& c : b.cross) {
    if (!c.encode) continue;
    ++l.numSeqs;
    l.maxBlocksPerSeq = std::max<int64_t>(l.maxBlocksPerSeq, static_cast<int64_t>(c.blocks.size()));
    l.maxNewRows = std::max(l.maxNewRows, c.encoderLen);
    l.minNewRows = l.minNewRows == 0 ? c.encoderLen : std::min(l.minNewRows, c.encoderLen);
  }
  l.maxContext = l.maxNewRows;
  const int64_t rows = l.rows, numSeqs = l.numSeqs, width = l.maxBlocksPerSeq;
  // [ids | positions | slots | seqStarts | startPos | blockTables]
  const int64_t oIds = 0, oPos = rows, oSlots = 2 * rows, oStarts = 3 * rows,
                oStartPos = oStarts + numSeqs + 1, oTables = oStartPos + numSeqs,
                total = oTables + numSeqs * width;
  std::vector<int32_t> host(total, 0);
  const int64_t bs = cache.blockSize();
  int64_t row = 0, seq = 0;
  for (const CrossContext& c : b.cross) {
    if (!c.encode) continue;
    host[oStarts + seq] = static_cast<int32_t>(row);
    for (int64_t t = 0; t < c.encoderLen; ++t, ++row) {
      host[oIds + row] = static_cast<int32_t>(b.encoderTokenIds[row]);
      host[oPos + row] = static_cast<int32_t>(t);
      host[oSlots + row] = static_cast<int32_t>(c.blocks[t / bs] * bs + t % bs);
    }
    for (size_t j = 0; j < c.blocks.size(); ++j)
      host[oTables + seq * width + static_cast<int64_t>(j)] = static_cast<int32_t>(c.blocks[j]);
    ++seq;
  }
  host[oStarts + numSeqs] = static_cast<int32_t>(rows);
  TG_RETURN_IF_ERROR(ensureBuffer(backend_, encoderMeta_, host.size() * sizeof(int32_t)));
  TG_RETURN_IF_ERROR(backend_.upload(*encoderMeta_, host.data(), host.size() * sizeof(int32_t)));
  BatchMetadata m{};
  const auto* base = encoderMeta_->as<const int32_t>();
  m.ids = base + oIds;
  m.positions = base + oPos;
  m.slots = base + oSlots;
  m.seqStarts = base + oStarts;
  m.startPos = base + oStartPos;
  m.blockTables = base + oTables;
  m.layout = l;
  return m;
}

Status ModelRunner::reserve(int64_t rows, int64_t logitRows) {
  bool moved = false;
  Status st = ws_.reserve(backend_, config_, part_, dtype_, rows, logitRows, moved);
  if (st.ok() && medusa_) {
    bool medusaMoved = false;
    st = medusa_->reserve(backend_, config_, part_, dtype_, std::min(logitRows, medusaRowLimit()),
                          medusaMoved);
    moved = moved || medusaMoved;
  }
  if (moved && !graphs_.empty()) {
    spdlog::info("decode graphs dropped: the activation buffers grew to {} rows, {} logit rows",
                 ws_.rows, ws_.logitRows);
  }
  if (moved) graphs_.clear();  // their pointers move (even when an allocation failed)
  return st;
}

Status ModelRunner::validate(const ForwardBatch& b, const KvCache& cache) const {
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
  return validateCross(b, cache);
}

// An encoder-decoder batch's cross-attention contexts: one per sequence, each within its blocks,
// the encoding ones' prompts making up encoderTokenIds exactly; none for a decoder-only model.
Status ModelRunner::validateCross(const ForwardBatch& b, const KvCache& cache) const {
  if (!config_.isEncoderDecoder) {
    if (!b.cross.empty() || !b.encoderTokenIds.empty())
      return invalidArgumentError("cross-attention context for a decoder-only model");
    return okStatus();
  }
  if (b.cross.size() != b.sequences.size())
    return invalidArgumentError("an encoder-decoder batch needs one cross context per sequence");
  int64_t encoded = 0;
  for (const CrossContext& c : b.cross) {
    if (c.encoderLen <= 0) return invalidArgumentError("an empty encoder input");
    if (static_cast<int64_t>(c.blocks.size()) * cache.blockSize() < c.encoderLen)
      return invalidArgumentError("a sequence has fewer cross blocks than encoder positions");
    for (uint32_t block : c.blocks) {
      if (block >= cache.numBlocks())
        return invalidArgumentError("block " + std::to_string(block) + " out of range");
    }
    if (c.encode) encoded += c.encoderLen;
  }
  if (encoded != static_cast<int64_t>(b.encoderTokenIds.size()))
    return invalidArgumentError("the encoder's token ids do not match the encoding sequences");
  for (uint32_t id : b.encoderTokenIds) {
    if (id >= config_.vocabSize)
      return invalidArgumentError("token id " + std::to_string(id) + " out of vocabulary");
  }
  return okStatus();
}

}  // namespace textgen::runtime
