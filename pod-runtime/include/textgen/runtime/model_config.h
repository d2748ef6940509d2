// config.json (and generation_config.json) as typed hyper-parameters. Parsed once at start-up; a
// missing or invalid field, or an unsupported architecture, is an error that names it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"
#include "textgen/kernels/dtype.h"

namespace textgen::runtime {

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;               // the scaling factor of every variant but the default
  double partialRotaryFactor = 1.0;  // fraction of head_dim that is rotated
  // llama3 and yarn: the context the model was pre-trained with.
  int64_t originalMaxPositionEmbeddings = 0;
  double lowFreqFactor = 1.0, highFreqFactor = 4.0;  // llama3
  double betaFast = 32.0, betaSlow = 1.0;            // yarn: the correction range's rotations
  bool truncate = true;                              // yarn: round the correction range outward
  double attentionFactor = 1.0;  // multiplies cos and sin (yarn's, resolved when parsed)
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string modelType;     // e.g. "llama"
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  int64_t maxPositionEmbeddings = 0;
  double rmsNormEps = 1e-6;
  RopeConfig rope;
  bool tieWordEmbeddings = false;
  bool attentionBias = false;
  bool mlpBias = false;
  std::optional<int64_t> slidingWindow;  // attend to this many most recent positions (Mistral)
  kernels::DType dtype = kernels::DType::kF32;  // the checkpoint's torch dtype
  std::optional<uint32_t> bosTokenId;
  std::vector<uint32_t> eosTokenIds;  // config.json and generation_config.json, merged

  int64_t rotaryDim() const { return static_cast<int64_t>(headDim * rope.partialRotaryFactor); }
  // Longest prompt + generation the model allows: linear and dynamic scaling stretch the trained
  // context by their factor (as TGI counts it); llama3 and yarn configs give the stretched one as
  // max_position_embeddings already.
  int64_t maxContext() const {
    const bool stretches = rope.type == RopeType::kLinear || rope.type == RopeType::kDynamic;
    return static_cast<int64_t>(static_cast<double>(maxPositionEmbeddings) *
                                (stretches ? rope.factor : 1.0));
  }
};

// `generationConfigJson` may be empty.
StatusOr<ModelConfig> parseModelConfig(std::string_view configJson,
                                       std::string_view generationConfigJson = {});

// Reads DIR/config.json and DIR/generation_config.json (optional).
StatusOr<ModelConfig> loadModelConfig(const std::string& modelDir);

}  // namespace textgen::runtime
