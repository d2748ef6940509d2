// RoPE's inverse frequencies and cos/sin scale for a model's RopeConfig, computed as Hugging Face
// transformers computes them (float32, in its order of operations), so that every scaling variant
// (default, linear, dynamic NTK, llama3, yarn) reaches the RoPE kernel as one invFreq row and one
// attentionScaling.
#pragma once

#include <cstdint>
#include <vector>

#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

// rotaryDim / 2 frequencies for a sequence whose length after this forward is seqLen (dynamic NTK
// depends on it; the other variants do not).
std::vector<float> ropeInverseFrequencies(const ModelConfig& c, int64_t seqLen);

// Multiplies cos and sin (yarn's attention factor; 1 for the other variants).
float ropeAttentionScaling(const ModelConfig& c);

}  // namespace textgen::runtime
