// Architectures as data: the tensor names of each supported Hugging Face class and its variant
// flags.
#pragma once

#include <string>
#include <string_view>

namespace textgen::runtime {

struct ArchitectureSpec {
  std::string_view architecture;  // config.json "architectures"[0]
  // Tensor names; "{}" stands for the layer index.
  std::string_view embed = "model.embed_tokens.weight";
  std::string_view finalNorm = "model.norm.weight";
  std::string_view lmHead = "lm_head.weight";
  std::string_view inputNorm = "model.layers.{}.input_layernorm.weight";
  std::string_view q = "model.layers.{}.self_attn.q_proj.weight";
  std::string_view k = "model.layers.{}.self_attn.k_proj.weight";
  std::string_view v = "model.layers.{}.self_attn.v_proj.weight";
  std::string_view o = "model.layers.{}.self_attn.o_proj.weight";
  std::string_view postNorm = "model.layers.{}.post_attention_layernorm.weight";
  std::string_view gate = "model.layers.{}.mlp.gate_proj.weight";
  std::string_view up = "model.layers.{}.mlp.up_proj.weight";
  std::string_view down = "model.layers.{}.mlp.down_proj.weight";
  bool slidingWindow = false;  // honour config.sliding_window
};

inline std::string layerName(std::string_view pattern, int64_t layer) {
  std::string s(pattern);
  const size_t at = s.find("{}");
  if (at != std::string::npos) s.replace(at, 2, std::to_string(layer));
  return s;
}

// The Llama forward serves both; Mistral adds the sliding window.
inline constexpr ArchitectureSpec kLlama{.architecture = "LlamaForCausalLM"};
inline constexpr ArchitectureSpec kMistral{.architecture = "MistralForCausalLM",
                                           .slidingWindow = true};

}  // namespace textgen::runtime
