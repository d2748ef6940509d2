// The only list of architectures: one line each, a spec (architecture_spec.h; unnamed values are
// Llama's) and the graph that builds it (one file each).
#include "models/registry.h"

#include "models/model_runner.h"

namespace textgen::runtime {

StatusOr<std::unique_ptr<ArchitectureGraph>> makeLlamaGraph(const ArchitectureSpec& spec);
StatusOr<std::unique_ptr<ArchitectureGraph>> makeFalconGraph(const ArchitectureSpec& spec);
ArchitectureSpec falconSpec(std::string_view name);  // models/falcon.cpp

namespace {

const Architecture kArchitectures[] = {
    {{.name = "LlamaForCausalLM"}, makeLlamaGraph},
    {{.name = "MistralForCausalLM", .slidingWindow = true}, makeLlamaGraph},
    {falconSpec("FalconForCausalLM"), makeFalconGraph},
    {falconSpec("RWForCausalLM"), makeFalconGraph},  // Falcon's remote-code configs, as TGI
};

}  // namespace

std::span<const Architecture> architectures() {
  return kArchitectures;
}

const Architecture* findArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (a.spec.name == name) return &a;
  }
  return nullptr;
}

StatusOr<ConfigDialect> registeredDialect(std::string_view name) {
  const Architecture* architecture = findArchitecture(name);
  if (architecture != nullptr) return configDialect(architecture->spec);
  std::string supported;
  for (const Architecture& a : kArchitectures)
    supported += (supported.empty() ? "" : ", ") + std::string(a.spec.name);
  return unimplementedError("config.json: architecture '" + std::string(name) +
                            "' is not supported (supported: " + supported + ")");
}

StatusOr<std::unique_ptr<Model>> loadArchitecture(const Architecture& architecture,
                                                  const ModelConfig& config,
                                                  const WeightStore& weights, Backend& backend,
                                                  const ModelOptions& options) {
  TG_ASSIGN_OR_RETURN(auto graph, architecture.makeGraph(architecture.spec));
  return ModelRunner::load(config, std::move(graph), weights, backend, options);
}

StatusOr<ModelConfig> loadArchitectureConfig(const std::string& modelDir) {
  return loadModelConfig(modelDir, registeredDialect);
}

StatusOr<std::unique_ptr<Model>> loadModel(const std::string& modelDir, Backend& backend,
                                           const ModelOptions& options) {
  // The class is resolved first: config.json is parsed as that class spells it.
  TG_ASSIGN_OR_RETURN(ModelConfig config, loadArchitectureConfig(modelDir));
  const Architecture* architecture = findArchitecture(config.architecture);
  if (architecture == nullptr) return internalError("registered class not found");
  TG_ASSIGN_OR_RETURN(auto weights, WeightStore::open(modelDir));
  return loadArchitecture(*architecture, config, *weights, backend, options);
}

}  // namespace textgen::runtime
