// A tiny random Llama written by the test itself (config.json and a float32 model.safetensors) for
// variants no reference fixture covers yet: attention and MLP biases, other activations. The
// weights depend only on the seed, the biases on the seed and their scale, so models that differ
// in biases alone share every other tensor bit for bit.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "textgen/runtime/model.h"

namespace textgen::runtime::testing {

struct TinyLlama {
  bool attentionBias = false, mlpBias = false;  // config.json's flags
  // Bias tensors written for the layers the flags name (set writeBiases for a spec that always
  // has them); scale 0 writes zeros.
  bool writeBiases = true;
  float biasScale = 0.5f;
  std::string hiddenAct = "gelu_pytorch_tanh";
  uint32_t seed = 1;
  std::map<std::string, std::vector<int64_t>> shapes = {};  // a tensor's shape replaced (bad input)
  int64_t kvHeads = kKvHeads;
  // Query heads; head_dim stays kHeadDim (written to config.json when heads differs from kHeads,
  // so q/o are heads * kHeadDim wide, not kHidden).
  int64_t heads = kHeads;
  // How q/k/v (and their biases) are stored: 0 separate (Llama's names), else one
  // self_attn.qkv_proj tensor: 1 [q; k; v], 2 [q; k; v] per head (needs kvHeads == heads), 3 per
  // key/value head its query heads then k and v. The values are the separate layout's, moved.
  int qkvLayout = 0;

  static constexpr int64_t kVocab = 64, kHidden = 32, kInter = 64, kLayers = 2, kHeads = 4,
                           kKvHeads = 2, kHeadDim = kHidden / kHeads;

  // Writes DIR/config.json and DIR/model.safetensors.
  void write(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                             {"model_type", "llama"},
                             {"vocab_size", kVocab},
                             {"hidden_size", kHidden},
                             {"intermediate_size", kInter},
                             {"num_hidden_layers", kLayers},
                             {"num_attention_heads", kHeads},
                             {"num_key_value_heads", kvHeads},
                             {"max_position_embeddings", 128},
                             {"rms_norm_eps", 1e-5},
                             {"hidden_act", hiddenAct},
                             {"attention_bias", attentionBias},
                             {"mlp_bias", mlpBias},
                             {"tie_word_embeddings", false},
                             {"torch_dtype", "float32"},
                             {"eos_token_id", 2}};
    if (heads != kHeads) {
      config["num_attention_heads"] = heads;
      config["head_dim"] = kHeadDim;
    }
    std::ofstream(dir + "/config.json") << config.dump(2);

    std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
        {"model.embed_tokens.weight", {kVocab, kHidden}},
        {"model.norm.weight", {kHidden}},
        {"lm_head.weight", {kVocab, kHidden}}};
    std::vector<std::pair<std::string, std::vector<int64_t>>> biases;
    const int64_t qOut = heads * kHeadDim, kvOut = kvHeads * kHeadDim;
    for (int64_t l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const std::pair<std::string, std::vector<int64_t>> attn[] = {
          {p + "self_attn.q_proj", {qOut, kHidden}},
          {p + "self_attn.k_proj", {kvOut, kHidden}},
          {p + "self_attn.v_proj", {kvOut, kHidden}},
          {p + "self_attn.o_proj", {kHidden, qOut}}};
      const std::pair<std::string, std::vector<int64_t>> mlp[] = {
          {p + "mlp.gate_proj", {kInter, kHidden}},
          {p + "mlp.up_proj", {kInter, kHidden}},
          {p + "mlp.down_proj", {kHidden, kInter}}};
      tensors.push_back({p + "input_layernorm.weight", {kHidden}});
      tensors.push_back({p + "post_attention_layernorm.weight", {kHidden}});
      for (const auto& [name, shape] : attn) {
        tensors.push_back({name + ".weight", shape});
        if (attentionBias && writeBiases) biases.push_back({name + ".bias", {shape[0]}});
      }
      for (const auto& [name, shape] : mlp) {
        tensors.push_back({name + ".weight", shape});
        if (mlpBias && writeBiases) biases.push_back({name + ".bias", {shape[0]}});
      }
    }
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> values;
    auto add = [&](const std::string& name, std::vector<int64_t> shape, std::mt19937& rng,
                   float scale, float offset) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> v(n);
      for (float& x : v) x = offset + scale * dist(rng);
      if (auto it = shapes.find(name); it != shapes.end()) {
        shape = it->second;
        n = 1;
        for (int64_t d : shape) n *= d;
        v.resize(n, 0.0f);
      }
      values[name] = {shape, std::move(v)};
    };
    std::mt19937 weights(seed), biasRng(seed + 7919);
    for (const auto& [name, shape] : tensors) {
      const bool norm = name.find("norm") != std::string::npos;
      add(name, shape, weights, norm ? 0.1f : 0.2f, norm ? 1.0f : 0.0f);
    }
    for (const auto& [name, shape] : biases) add(name, shape, biasRng, biasScale, 0.0f);
    if (qkvLayout != 0) {
      for (int64_t l = 0; l < kLayers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
        for (const std::string suffix : {".weight", ".bias"}) {
          if (!values.contains(p + "q_proj" + suffix)) continue;
          const auto q = values[p + "q_proj" + suffix], k = values[p + "k_proj" + suffix],
                     v = values[p + "v_proj" + suffix];
          const int64_t inner = static_cast<int64_t>(q.second.size()) / qOut;  // hidden or 1
          std::vector<float> fused;
          auto rows = [&](const std::vector<float>& src, int64_t first, int64_t count) {
            fused.insert(fused.end(), src.begin() + first * inner,
                         src.begin() + (first + count) * inner);
          };
          if (qkvLayout == 1) {
            rows(q.second, 0, qOut);
            rows(k.second, 0, kvOut);
            rows(v.second, 0, kvOut);
          } else if (qkvLayout == 2) {
            for (int64_t h = 0; h < heads; ++h) {
              rows(q.second, h * kHeadDim, kHeadDim);
              rows(k.second, h * kHeadDim, kHeadDim);
              rows(v.second, h * kHeadDim, kHeadDim);
            }
          } else {
            const int64_t group = heads / kvHeads;
            for (int64_t g = 0; g < kvHeads; ++g) {
              rows(q.second, g * group * kHeadDim, group * kHeadDim);
              rows(k.second, g * kHeadDim, kHeadDim);
              rows(v.second, g * kHeadDim, kHeadDim);
            }
          }
          std::vector<int64_t> shape = {qOut + 2 * kvOut};
          if (inner > 1) shape.push_back(inner);
          for (const char* part : {"q_proj", "k_proj", "v_proj"}) values.erase(p + part + suffix);
          values[p + "qkv_proj" + suffix] = {shape, std::move(fused)};
        }
      }
    }
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, entry] : values) {
      const size_t begin = data.size();
      data.append(reinterpret_cast<const char*>(entry.second.data()),
                  entry.second.size() * sizeof(float));
      header[name] = {
          {"dtype", "F32"}, {"shape", entry.first}, {"data_offsets", {begin, data.size()}}};
    }
    const std::string h = header.dump();
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << file << h << data;
  }
};

// The last row's logits of each prompt, prefilled together in one batch.
inline StatusOr<std::vector<float>> prefillLogits(Model& model, Backend& backend,
                                                  const std::vector<std::vector<uint32_t>>& ps) {
  constexpr int64_t kBlockSize = 4;
  TG_ASSIGN_OR_RETURN(auto cache,
                      KvCache::create(backend, model.kvShape(), 64, kBlockSize, model.dtype()));
  ForwardBatch b;
  uint32_t nextBlock = 0;
  std::vector<std::vector<uint32_t>> tables(ps.size());  // the batch's spans point here
  for (size_t s = 0; s < ps.size(); ++s) {
    const std::vector<uint32_t>& p = ps[s];
    std::vector<uint32_t>& blocks = tables[s];
    for (size_t i = 0; i < p.size(); i += kBlockSize) blocks.push_back(nextBlock++);
    b.sequences.push_back({.firstRow = static_cast<int64_t>(b.tokenIds.size()),
                           .numRows = static_cast<int64_t>(p.size()),
                           .startPos = 0,
                           .blocks = blocks});
    for (size_t i = 0; i < p.size(); ++i) {
      b.tokenIds.push_back(p[i]);
      b.slots.push_back(blocks[i / kBlockSize] * kBlockSize + i % kBlockSize);
    }
    b.logitRows.push_back(static_cast<int64_t>(b.tokenIds.size()) - 1);
  }
  return model.forward(b, *cache);
}

inline const std::vector<std::vector<uint32_t>>& tinyPrompts() {
  static const std::vector<std::vector<uint32_t>> ps = {
      {1, 5, 9, 13, 17, 21, 3}, {1, 40, 2}, {1, 63, 62, 61, 60, 59, 58, 57, 56, 55}};
  return ps;
}

}  // namespace textgen::runtime::testing
