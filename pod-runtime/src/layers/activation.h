// The MLP's activation: the kernels' enum (textgen/kernels/activation.h), which config.json's
// hidden_act is parsed into (ModelConfig::hiddenAct).
#pragma once

#include "textgen/kernels/activation.h"

namespace textgen::runtime {

using kernels::Activation;
using kernels::toString;

}  // namespace textgen::runtime
