// Typed reads of the config.json fields only one family has (Falcon's multi_query, MPT's
// attn_config.clip_qkv, OPT's word_embed_proj_dim), from ModelConfig::json, with errors that name
// the field as config.json spells it. Dotted paths reach into nested objects ("attn_config.alibi").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "textgen/base/status_or.h"
#include "textgen/runtime/model_config.h"

namespace textgen::runtime {

class ConfigFields {
 public:
  explicit ConfigFields(const ModelConfig& c) : json_(c.json.get()) {}

  // Absent or null: the fallback. Present with the wrong type: INVALID_ARGUMENT naming the path.
  StatusOr<bool> boolean(std::string_view path, bool fallback) const;
  StatusOr<double> number(std::string_view path, double fallback) const;  // finite
  StatusOr<std::optional<double>> optionalNumber(std::string_view path) const;
  StatusOr<int64_t> integer(std::string_view path, int64_t fallback,
                            int64_t max) const;  // [0, max]

 private:
  // The value at `path`, or null when it (or an object on the way) is absent or null.
  const nlohmann::json* find(std::string_view path) const;

  const nlohmann::json* json_;
};

}  // namespace textgen::runtime
