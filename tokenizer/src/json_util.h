// Reading tokenizer.json with errors that name the JSON path ("/pre_tokenizer/pretokenizers/2").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "textgen/base/status_or.h"

namespace textgen::tokenizer {

using Json = nlohmann::json;

inline std::string childPath(const std::string& path, std::string_view key) {
  return path + "/" + std::string(key);
}
inline std::string childPath(const std::string& path, size_t index) {
  return path + "/" + std::to_string(index);
}

inline Status jsonError(const std::string& path, std::string_view what) {
  return invalidArgumentError("tokenizer.json " + (path.empty() ? std::string("/") : path) + ": " +
                              std::string(what));
}

// The "type" of a component object, or an error naming the path.
StatusOr<std::string> componentType(const Json& j, const std::string& path);

StatusOr<std::string> getString(const Json& j, const std::string& path, std::string_view key);
StatusOr<std::string> getStringOr(const Json& j, const std::string& path, std::string_view key,
                                  std::string fallback);
StatusOr<bool> getBoolOr(const Json& j, const std::string& path, std::string_view key,
                         bool fallback);
StatusOr<int64_t> getIntOr(const Json& j, const std::string& path, std::string_view key,
                           int64_t fallback);
StatusOr<const Json*> getArray(const Json& j, const std::string& path, std::string_view key);

// A {"String": s} or {"Regex": r} pattern object.
struct PatternSpec {
  bool isRegex = false;
  std::string text;
};
StatusOr<PatternSpec> getPattern(const Json& j, const std::string& path, std::string_view key);

// Exactly one UTF-8 character (Rust `char` fields such as Metaspace's replacement).
StatusOr<char32_t> getChar(const Json& j, const std::string& path, std::string_view key);

}  // namespace textgen::tokenizer
