// The model runner (vLLM's model runner, llama.cpp's context): everything about a forward that
// belongs to no architecture. It validates the batch, lays out and uploads its metadata, keeps the
// shared activation buffers, captures and replays decode graphs, runs the architecture's graph,
// all-gathers the vocabulary parts of tensor-parallel logits into whole rows, and leaves the logits
// where they are for token choice (sampler.h) or a download.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "layers/batch_metadata.h"
#include "layers/medusa.h"
#include "layers/partition.h"
#include "layers/workspace.h"
#include "models/architecture_graph.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

class ModelRunner final : public Model {
 public:
  // This rank's share of `graph`'s weights (options.comm's rank; the whole model without one).
  // INVALID_ARGUMENT for a shape that does not divide across the ranks, UNIMPLEMENTED for a dtype
  // the backend does not compute in.
  static StatusOr<std::unique_ptr<Model>> load(const ModelConfig& config,
                                               std::unique_ptr<ArchitectureGraph> graph,
                                               const WeightStore& weights, Backend& backend,
                                               const ModelOptions& options);

  ModelRunner(const ModelConfig& config, std::unique_ptr<ArchitectureGraph> graph, Backend& backend)
      : config_(config), graph_(std::move(graph)), backend_(backend) {}

  const ModelConfig& config() const override { return config_; }
  DType dtype() const override { return dtype_; }
  KvShape kvShape() const override { return {config_.numLayers, part_.kvHeads, config_.headDim}; }
  StatusOr<LogitsView> forwardLogits(const ForwardBatch& b, KvCache& cache) override;
  StatusOr<std::vector<float>> forward(const ForwardBatch& b, KvCache& cache) override;
  int64_t speculativeHeads() const override { return medusa_ ? medusa_->heads() : 0; }
  std::vector<int64_t> graphBatchSizes() const override { return graphSizes_; }
  Status reserveRows(int64_t rows, int64_t logitRows) override {
    return reserve(std::max(ws_.rows, rows), std::max(ws_.logitRows, logitRows));
  }
  StatusOr<std::vector<uint32_t>> speculativeIds() override;

 private:
  using Layout = BatchMetadata::Layout;

  Status validate(const ForwardBatch& b, const KvCache& cache) const;
  Status validateCross(const ForwardBatch& b, const KvCache& cache) const;
  Status run(const ForwardBatch& b, KvCache& cache);
  Status enqueue(const BatchMetadata& meta, KvCache& cache, const BatchMetadata* encoder);
  Status gatherLogits(int64_t logitRows);
  Layout eagerLayout(const ForwardBatch& b) const;
  // A graph's shape: sequences (the batch size padded to a captured size) and rows per sequence.
  struct GraphShape {
    int64_t bucket = 0, rows = 1;
    auto operator<=>(const GraphShape&) const = default;
  };
  // {0, ...}: run eagerly.
  GraphShape graphShape(const ForwardBatch& b, const KvCache& cache) const;
  Layout graphLayout(GraphShape shape, const KvCache& cache) const;
  Status runGraph(const ForwardBatch& b, KvCache& cache, GraphShape shape);
  std::pair<size_t, size_t> graphMetaBytes() const;
  StatusOr<BatchMetadata> uploadMetadata(const ForwardBatch& b, const Layout& layout,
                                         std::unique_ptr<Buffer>& metaBuf,
                                         std::unique_ptr<Buffer>& freqBuf,
                                         std::pair<size_t, size_t> minBytes = {0, 0});
  StatusOr<BatchMetadata> uploadEncoderMetadata(const ForwardBatch& b, const KvCache& cache);
  Status reserve(int64_t rows, int64_t logitRows);
  Status loadMedusa(const ModelOptions& options);
  // The most logit rows a step computes Medusa guesses for: TGI's 128, or the largest decode
  // graph's rows (a graph computes them for its padding rows too: a verification step of fewer
  // than 128 real rows padded past them keeps its guesses).
  int64_t medusaRowLimit() const {
    return std::max(kMaxMedusaRows,
                    graphSizes_.empty() ? int64_t{0} : graphSizes_.back() * graphRows_);
  }

  ModelConfig config_;
  std::unique_ptr<ArchitectureGraph> graph_;
  Backend& backend_;
  Communicator* comm_ = nullptr;  // tensor parallelism; null on one rank
  Partition part_;                // this rank's share (everything, on one rank)
  DType dtype_ = DType::kF32;
  Workspace ws_;
  std::unique_ptr<Buffer> meta_, invFreq_;  // eager metadata
  std::unique_ptr<Buffer> encoderMeta_;     // encoder-decoder models: the encoder's rows
  // Decode graphs by batch size, bound to one KV cache and to the workspace's buffers.
  std::vector<int64_t> graphSizes_;  // ascending
  int64_t graphRows_ = 1;            // the most rows per sequence a graph takes
  int64_t graphContext_ = 0;         // longest context a graph serves
  std::map<GraphShape, std::unique_ptr<Graph>> graphs_;
  uint64_t graphCacheId_ = 0;
  std::unique_ptr<Buffer> graphMeta_, graphFreq_;
  std::vector<int32_t> hostMeta_;
  std::vector<float> hostFreq_;
  // Medusa heads, and the last forward's: logit rows the ids are laid out for (0: none computed)
  // and the batch's own (a graph's padding rows past them).
  std::optional<MedusaHeads> medusa_;
  int64_t medusaStride_ = 0, medusaRows_ = 0;
};

}  // namespace textgen::runtime
