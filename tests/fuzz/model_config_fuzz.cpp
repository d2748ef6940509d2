// config.json (and generation_config.json) to typed hyper-parameters. The input is config.json,
// optionally followed by a NUL byte and generation_config.json. An accepted config must give values
// the model code can use: the derived sizes and RoPE's frequencies are computed from it, and a
// quantization_config a format the dequantizer reads (bits and group size in range). The same text
// is also read as a Medusa directory's config (parseMedusaConfig).
#include <cmath>

#include "fuzz_util.h"
#include "models/registry.h"
#include "textgen/runtime/model_config.h"
#include "textgen/runtime/rope.h"

namespace {

// What the model code relies on in an accepted config.
void checkAccepted(const textgen::runtime::ModelConfig* c) {
  using namespace textgen::runtime;
  FUZZ_CHECK(c->vocabSize > 0 && c->hiddenSize > 0 && c->intermediateSize > 0, "sizes");
  FUZZ_CHECK(c->numLayers > 0 && c->numHeads > 0 && c->numKvHeads > 0 && c->headDim > 0,
             "layers and heads");
  FUZZ_CHECK(c->numHeads % c->numKvHeads == 0, "kv heads must divide heads");
  FUZZ_CHECK(c->maxPositionEmbeddings > 0, "max_position_embeddings");
  const int64_t rotary = c->rotaryDim();
  FUZZ_CHECK(rotary >= 0 && rotary <= c->headDim, "rotary dim " + std::to_string(rotary));
  const int64_t context = c->maxContext();
  FUZZ_CHECK(context > 0, "max context " + std::to_string(context));
  const float scaling = ropeAttentionScaling(*c);
  FUZZ_CHECK(std::isfinite(scaling), "attention scaling");
  for (int64_t seqLen : {int64_t{1}, c->maxPositionEmbeddings, context, context + 1}) {
    const std::vector<float> inv = ropeInverseFrequencies(*c, seqLen);
    FUZZ_CHECK(static_cast<int64_t>(inv.size()) == rotary / 2,
               "inverse frequencies: " + std::to_string(inv.size()));
    for (float f : inv)
      FUZZ_CHECK(std::isfinite(f), "an inverse frequency of " + std::to_string(f));
  }
  const QuantizationConfig& q = c->quantization;
  switch (q.method) {
    case QuantMethod::kNone: break;
    case QuantMethod::kGptq:
      FUZZ_CHECK(q.bits == 4 || q.bits == 8, "GPT-Q bits " + std::to_string(q.bits));
      break;
    case QuantMethod::kAwq: FUZZ_CHECK(q.bits == 4, "AWQ bits " + std::to_string(q.bits)); break;
    case QuantMethod::kFp8: FUZZ_CHECK(q.bits == 8, "fp8 bits " + std::to_string(q.bits)); break;
  }
  FUZZ_CHECK(q.groupSize >= 0 && q.groupSize <= (int64_t{1} << 20),
             "group size " + std::to_string(q.groupSize));
  // An encoder-decoder (T5) starts its decoder from an id of its vocabulary.
  if (c->isEncoderDecoder) FUZZ_CHECK(c->decoderStartTokenId < c->vocabSize, "decoder start token");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace textgen::runtime;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view config = in.substr(0, nul);
  const std::string_view generation =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  // Also as a class with GPT-2's spellings: an accepted config obeys the same invariants.
  static constexpr ConfigKeyAlias kAliases[] = {{"n_embd", "hidden_size"},
                                                {"n_head", "num_attention_heads"},
                                                {"n_layer", "num_hidden_layers"},
                                                {"n_positions", "max_position_embeddings"},
                                                {"d_model", "hidden_size"}};
  auto aliased = parseModelConfig(config, generation, [](std::string_view) {
    return textgen::StatusOr<ConfigDialect>(ConfigDialect{.aliases = kAliases});
  });
  FUZZ_CHECK(aliased.ok() || !aliased.status().message().empty(), "an error without a message");
  // As the registry reads it: the class's own aliases and prepareConfig (BLOOM, MPT, ...).
  auto registered = parseModelConfig(config, generation, registeredDialect);
  FUZZ_CHECK(registered.ok() || !registered.status().message().empty(),
             "an error without a message");
  if (registered.ok()) checkAccepted(&*registered);
  // The same text as a Medusa directory's config: accepted fields are within their limits.
  auto medusa = parseMedusaConfig(config);
  FUZZ_CHECK(medusa.ok() || !medusa.status().message().empty(), "an error without a message");
  if (medusa.ok() && medusa->has_value()) {
    const MedusaConfig& m = **medusa;
    FUZZ_CHECK(m.heads >= 1 && m.heads <= kMaxMedusaHeads, "medusa heads");
    FUZZ_CHECK(m.layers >= 1 && m.layers <= kMaxMedusaLayers, "medusa layers");
    FUZZ_CHECK(!m.baseModel.empty(), "medusa base model");
  }
  auto c = parseModelConfig(config, generation);
  if (!c.ok()) {
    FUZZ_CHECK(!c.status().message().empty(), "an error without a message");
    return 0;
  }
  checkAccepted(&*c);
  return 0;
}
