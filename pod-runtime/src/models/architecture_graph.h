// One architecture's forward, as llama.cpp's llm_build_* and vLLM's model.forward: it loads this
// rank's weights into shared layers (layers/) and enqueues embedding -> layers -> final norm of the
// logit rows -> head. Everything else (batch validation, metadata, graphs, workspace, tensor-
// parallel logits, token choice) is the ModelRunner's.
#pragma once

#include <memory>

#include "layers/forward_context.h"
#include "layers/logits_head.h"
#include "layers/weight_loader.h"
#include "models/architecture_spec.h"

namespace textgen::runtime {

class ArchitectureGraph {
 public:
  virtual ~ArchitectureGraph() = default;
  // This rank's share of the weights, in the compute dtype.
  virtual Status load(const WeightLoader& weights) = 0;
  // Enqueues one forward over ctx.meta's rows, writing ctx.headOut(); never waits for the device
  // (the runner captures it into graphs).
  virtual Status build(const ForwardContext& ctx) const = 0;
  // A decoder-only graph's logits head (Medusa heads read its input and may project with it);
  // null for graphs that do not expose one.
  virtual const LogitsHead* logitsHead() const { return nullptr; }
};

// A graph for `spec`: UNIMPLEMENTED naming the first spec value the graph does not build.
using GraphFactory = StatusOr<std::unique_ptr<ArchitectureGraph>> (*)(const ArchitectureSpec&);

}  // namespace textgen::runtime
