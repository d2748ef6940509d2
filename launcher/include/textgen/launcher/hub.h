// Model resolution for the launcher: a local directory, or a Hugging Face hub id looked up in the
// hub cache layout (HF_HOME / HUGGINGFACE_HUB_CACHE: models--org--name/refs/<rev>,
// snapshots/<commit>/), downloading what is missing from HF_ENDPOINT with HF_TOKEN — redirects
// followed, interrupted transfers resumed, sizes and sha256 checked.
#pragma once

#include <string>

#include "textgen/base/status_or.h"

namespace textgen::launcher {

struct HubOptions {
  std::string endpoint = "https://huggingface.co";
  std::string token;         // HF_TOKEN; empty for public models
  std::string cacheDir;      // the hub cache (…/hub)
  bool progressBar = false;  // a bar on a terminal; plain lines otherwise
};

// HF_ENDPOINT, HF_TOKEN, HUGGINGFACE_HUB_CACHE / HF_HOME, with the hub's defaults.
HubOptions hubOptionsFromEnv();

// The snapshot directory of `modelId` at `revision`, downloading missing files. A directory that
// exists locally is returned as is. A snapshot completed earlier is used without network.
StatusOr<std::string> resolveModel(const std::string& modelId, const std::string& revision,
                                   const HubOptions& options);

}  // namespace textgen::launcher
