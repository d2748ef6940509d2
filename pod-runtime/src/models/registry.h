// The architecture registry: every supported Hugging Face class, its spec and the graph that
// builds it (registry.cpp holds the only list).
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "models/architecture_graph.h"
#include "models/architecture_spec.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace textgen::runtime {

struct Architecture {
  ArchitectureSpec spec;
  GraphFactory makeGraph;
};

std::span<const Architecture> architectures();
// Null when `name` (config.json "architectures"[0]) is not registered.
const Architecture* findArchitecture(std::string_view name);
// The registered class's config dialect; UNIMPLEMENTED naming `name` and the registered classes.
StatusOr<ConfigDialect> registeredDialect(std::string_view name);

// Loads `architecture`'s graph over the model runner (`config` parsed with its dialect).
// UNIMPLEMENTED naming a spec value the graph does not build.
StatusOr<std::unique_ptr<Model>> loadArchitecture(const Architecture& architecture,
                                                  const ModelConfig& config,
                                                  const WeightStore& weights, Backend& backend,
                                                  const ModelOptions& options);

}  // namespace textgen::runtime
