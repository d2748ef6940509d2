#include "json_util.h"

#include "unicode.h"

namespace textgen::tokenizer {

StatusOr<std::string> componentType(const Json& j, const std::string& path) {
  if (!j.is_object()) return jsonError(path, "expected an object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return jsonError(path, "missing string field 'type'");
  return it->get<std::string>();
}

StatusOr<std::string> getString(const Json& j, const std::string& path, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end()) return jsonError(path, "missing field '" + std::string(key) + "'");
  if (!it->is_string()) return jsonError(childPath(path, key), "expected a string");
  return it->get<std::string>();
}

StatusOr<std::string> getStringOr(const Json& j, const std::string& path, std::string_view key,
                                  std::string fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return jsonError(childPath(path, key), "expected a string");
  return it->get<std::string>();
}

StatusOr<bool> getBoolOr(const Json& j, const std::string& path, std::string_view key,
                         bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return jsonError(childPath(path, key), "expected a boolean");
  return it->get<bool>();
}

StatusOr<int64_t> getIntOr(const Json& j, const std::string& path, std::string_view key,
                           int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return jsonError(childPath(path, key), "expected an integer");
  return it->get<int64_t>();
}

StatusOr<const Json*> getArray(const Json& j, const std::string& path, std::string_view key) {
  auto it = j.find(key);
  if (it == j.end()) return jsonError(path, "missing field '" + std::string(key) + "'");
  if (!it->is_array()) return jsonError(childPath(path, key), "expected an array");
  return &*it;
}

StatusOr<PatternSpec> getPattern(const Json& j, const std::string& path, std::string_view key) {
  auto it = j.find(key);
  const std::string p = childPath(path, key);
  if (it == j.end()) return jsonError(path, "missing field '" + std::string(key) + "'");
  if (it->is_string()) return PatternSpec{false, it->get<std::string>()};  // older files
  if (!it->is_object()) return jsonError(p, "expected {\"String\": ...} or {\"Regex\": ...}");
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    return PatternSpec{false, s->get<std::string>()};
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) {
    return PatternSpec{true, r->get<std::string>()};
  }
  return jsonError(p, "expected {\"String\": ...} or {\"Regex\": ...}");
}

StatusOr<char32_t> getChar(const Json& j, const std::string& path, std::string_view key) {
  TG_ASSIGN_OR_RETURN(std::string s, getString(j, path, key));
  if (s.empty() || !isValidUtf8(s))
    return jsonError(childPath(path, key), "expected one character");
  size_t len;
  const char32_t c = decodeUtf8(s, 0, &len);
  if (len != s.size()) return jsonError(childPath(path, key), "expected exactly one character");
  return c;
}

}  // namespace textgen::tokenizer
