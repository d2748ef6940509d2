// Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
// Multiple Decoding Heads"): extra heads on the final normalised hidden state of a row that guess
// the tokens after the next one, proposed for speculative decoding. Text Generation Inference's
// layout: a directory with config.json {medusa_num_heads, medusa_num_layers,
// base_model_name_or_path} and medusa_lm_head.safetensors, head i's tensors prefixed "{i}.":
//   - "{i}.{j}.linear.weight" [hidden, hidden] and ".bias" for each of its residual blocks
//     j < medusa_num_layers: x = x + SiLU(W x + b);
//   - "{i}.{L}.weight" [vocab, hidden], its own output layer (TGI's MedusaHeadV1), or, when the
//     checkpoint has none and medusa_num_layers is 1, the model's own logits head (MedusaHeadV2).
// Head i at row t guesses the token at t + 2 + i (the logits head's choice is t + 1).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/forward_context.h"
#include "layers/weight_loader.h"
#include "textgen/runtime/linear.h"

namespace textgen::runtime {

// Eager steps of more logit rows than this get no Medusa guesses (TGI's limit); decode graphs
// compute them for all their rows.
inline constexpr int64_t kMaxMedusaRows = 128;

// The heads' activations for up to `rows` logit rows, grown (never shrunk); `moved` as
// Workspace::reserve's.
struct MedusaWorkspace {
  int64_t rows = 0;
  std::unique_ptr<Buffer> hidden, linearOut;  // [rows, hidden]
  std::unique_ptr<Buffer> logits;             // [heads * rows, vocab]
  std::unique_ptr<Buffer> part, gathered;     // tensor parallel: the vocabulary parts
  std::unique_ptr<Buffer> ids, logprobs;      // [heads * rows] int32 and float32
};

class MedusaHeads {
 public:
  // The first `heads` heads of the checkpoint `w` reads (medusa_lm_head.safetensors), each with
  // `layers` residual blocks. `head` is the model's logits head, used by heads without their own
  // output layer (it must outlive this). NOT_FOUND / INVALID_ARGUMENT naming a missing or
  // misshapen tensor.
  static StatusOr<MedusaHeads> load(const WeightLoader& w, int64_t heads, int64_t layers,
                                    const Linear& head);

  int64_t heads() const { return static_cast<int64_t>(heads_.size()); }
  Status reserve(Backend& backend, const ModelConfig& config, const Partition& part, DType dtype,
                 int64_t rows, bool& moved);
  // Every head's arg-max over the step's logit rows, from ctx.ws.pickedHidden (the logits head's
  // input, left there by LogitsHead::forward): ws.ids[head * logitRows + row].
  Status forward(const ForwardContext& ctx) const;
  // The device buffer forward() writes its ids into.
  Buffer& ids() const { return *ws_->ids; }

 private:
  struct Head {
    std::vector<Linear> blocks;  // residual blocks, replicated
    std::optional<Linear> out;   // own output layer [vocabPart, hidden], split as the model's head
  };
  std::vector<Head> heads_;
  const Linear* head_ = nullptr;  // the model's logits head (a vocabulary part on each rank)
  std::unique_ptr<MedusaWorkspace> ws_ = std::make_unique<MedusaWorkspace>();
};

}  // namespace textgen::runtime
