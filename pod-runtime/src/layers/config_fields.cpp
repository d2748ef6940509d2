#include "layers/config_fields.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace textgen::runtime {
namespace {

Status fieldError(std::string_view path, std::string_view what) {
  return invalidArgumentError("config.json: '" + std::string(path) + "' " + std::string(what));
}

}  // namespace

const nlohmann::json* ConfigFields::find(std::string_view path) const {
  const nlohmann::json* at = json_;
  while (at != nullptr) {
    if (!at->is_object()) return nullptr;
    const size_t dot = path.find('.');
    const std::string key(path.substr(0, dot));
    auto it = at->find(key);
    if (it == at->end() || it->is_null()) return nullptr;
    at = &*it;
    if (dot == std::string_view::npos) return at;
    path.remove_prefix(dot + 1);
  }
  return nullptr;
}

StatusOr<bool> ConfigFields::boolean(std::string_view path, bool fallback) const {
  const nlohmann::json* v = find(path);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return fieldError(path, "must be true or false");
  return v->get<bool>();
}

StatusOr<std::optional<double>> ConfigFields::optionalNumber(std::string_view path) const {
  const nlohmann::json* v = find(path);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return fieldError(path, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d)) return fieldError(path, "must be finite");
  return std::optional<double>(d);
}

StatusOr<double> ConfigFields::number(std::string_view path, double fallback) const {
  TG_ASSIGN_OR_RETURN(const std::optional<double> v, optionalNumber(path));
  return v.value_or(fallback);
}

StatusOr<int64_t> ConfigFields::integer(std::string_view path, int64_t fallback,
                                        int64_t max) const {
  const nlohmann::json* v = find(path);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) return fieldError(path, "must be an integer");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(max)
                              : (v->get<int64_t>() < 0 || v->get<int64_t>() > max)) {
    return fieldError(path, "must be between 0 and " + std::to_string(max));
  }
  return v->get<int64_t>();
}

}  // namespace textgen::runtime
