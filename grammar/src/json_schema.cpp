// JSON Schema to regex, after outlines' build_regex_from_schema (the construction TGI uses), with
// whitespace between tokens limited to one optional space. Resolution order per schema node, as in
// outlines: properties, allOf, anyOf, oneOf, prefixItems, enum, const, $ref, type; a node with
// none of them (or `true`) is any JSON value, nested at most kAnyValueDepth deep.
#include <string>
#include <vector>

#include "fmt/core.h"
#include "textgen/base/json.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {
namespace {

using json = nlohmann::ordered_json;  // properties keep the schema's order

constexpr std::string_view kWs = "[ ]?";
// A JSON string character: anything but '"', '\' and control characters, or an escape.
constexpr std::string_view kStringInner =
    R"re(([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}))re";
constexpr std::string_view kInteger = "(-?(0|[1-9][0-9]*))";
constexpr std::string_view kNumber = R"re((-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?))re";
constexpr std::string_view kBoolean = "(true|false)";
constexpr std::string_view kNull = "null";
// Formats (the quotes included).
constexpr std::string_view kDate = R"re("[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")re";
constexpr std::string_view kTime =
    R"re("([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?")re";
constexpr std::string_view kDateTime =
    R"re("[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")re";
constexpr std::string_view kUuid =
    R"re("[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")re";
constexpr std::string_view kEmail =
    R"re("[a-zA-Z0-9._%+\-]+@[a-zA-Z0-9\-]+(\.[a-zA-Z0-9\-]+)*\.[a-zA-Z]{2,}")re";

// Nesting of arrays/objects in an unconstrained value ({} or true): deep enough for real payloads,
// shallow enough that the automaton stays at a few thousand states (docs/grammar.md).
constexpr int kAnyValueDepth = 4;
// Calls of the compiler on one path (every keyword level, not only objects and arrays).
constexpr int kMaxFrames = 256;

std::string escapeRegex(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view(R"re(\.^$|?*+()[]{}/-)re").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string joinPath(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const Limits& limits) : root_(root), limits_(limits) {}

  StatusOr<std::string> compile() {
    std::string out = toRegex(root_, "", 0, 0);
    if (!error_.ok()) return error_;
    return out;
  }

 private:
  std::string fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
    return {};
  }
  std::string invalid(const std::string& path, std::string_view what) {
    return fail(invalidArgumentError(
        fmt::format("json schema: {}: {}", path.empty() ? "(root)" : path, what)));
  }
  // False (and the error set) when `n` more bytes would pass maxRegexBytes.
  bool fits(const std::string& s, size_t n) {
    if (s.size() + n <= limits_.maxRegexBytes) return true;
    fail(resourceExhaustedError(fmt::format(
        "json schema: its regex passes maxRegexBytes ({} bytes)", limits_.maxRegexBytes)));
    return false;
  }
  void append(std::string& out, std::string_view piece) {
    if (error_.ok() && fits(out, piece.size())) out += piece;
  }

  std::string toRegex(const json& s, const std::string& path, int depth, int frames) {
    if (!error_.ok()) return {};
    if (depth > limits_.maxSchemaDepth || frames > kMaxFrames) {
      return fail(resourceExhaustedError(
          fmt::format("json schema: {}: nesting (objects, arrays, $ref expansions) deeper than "
                      "maxSchemaDepth ({})",
                      path.empty() ? "(root)" : path, limits_.maxSchemaDepth)));
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return anyValue(kAnyValueDepth);
      return invalid(path, "the schema false matches nothing");
    }
    if (!s.is_object()) return invalid(path, "a schema must be an object or a boolean");
    if (s.contains("properties")) return object(s, path, depth, frames);
    for (const char* key : {"allOf", "anyOf", "oneOf"}) {
      if (s.contains(key)) return alternatives(s, key, path, depth, frames);
    }
    if (s.contains("prefixItems")) return array(s, path, depth, frames);
    if (s.contains("enum")) return enumeration(s["enum"], joinPath(path, "enum"));
    if (s.contains("const")) return literal(s["const"], joinPath(path, "const"));
    if (s.contains("$ref")) return ref(s["$ref"], joinPath(path, "$ref"), depth, frames);
    if (s.contains("type")) return typed(s, path, depth, frames);
    return anyValue(kAnyValueDepth);
  }

  std::string alternatives(const json& s, const char* key, const std::string& path, int depth,
                           int frames) {
    const std::string p = joinPath(path, key);
    const json& list = s[key];
    if (!list.is_array() || list.empty()) return invalid(p, "expected a non-empty array");
    if (std::string_view(key) == "allOf" && list.size() != 1) {
      return invalid(p,
                     fmt::format("allOf with {} members is not supported (only one)", list.size()));
    }
    std::string out = "(";
    for (size_t i = 0; i < list.size() && error_.ok(); ++i) {
      if (i) append(out, "|");
      append(out, toRegex(list[i], p + "." + std::to_string(i), depth, frames + 1));
    }
    append(out, ")");
    return out;
  }

  std::string literal(const json& value, const std::string& path) {
    if (value.is_discarded()) return invalid(path, "bad value");
    std::string dumped;
    try {
      dumped = value.dump(-1, ' ', false, json::error_handler_t::strict);
    } catch (const std::exception&) {
      return invalid(path, "value is not valid UTF-8");
    }
    if (!fits(dumped, dumped.size() * 2)) return {};
    return escapeRegex(dumped);
  }

  std::string enumeration(const json& list, const std::string& path) {
    if (!list.is_array() || list.empty()) return invalid(path, "expected a non-empty array");
    std::string out = "(";
    for (size_t i = 0; i < list.size() && error_.ok(); ++i) {
      if (i) append(out, "|");
      append(out, literal(list[i], path + "." + std::to_string(i)));
    }
    append(out, ")");
    return out;
  }

  std::string ref(const json& target, const std::string& path, int depth, int frames) {
    if (!target.is_string()) return invalid(path, "expected a string");
    const std::string r = target.get<std::string>();
    if (r != "#" && !r.starts_with("#/"))
      return invalid(path, fmt::format("unresolvable $ref \"{}\" (only local #/... refs)", r));
    const json* node = &root_;
    size_t pos = 2;
    while (r != "#" && pos <= r.size()) {
      size_t slash = r.find('/', pos);
      if (slash == std::string::npos) slash = r.size();
      std::string token = r.substr(pos, slash - pos);
      for (size_t i; (i = token.find("~1")) != std::string::npos;) token.replace(i, 2, "/");
      for (size_t i; (i = token.find("~0")) != std::string::npos;) token.replace(i, 2, "~");
      if (node->is_object() && node->contains(token)) {
        node = &(*node)[token];
      } else if (node->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos && token.size() < 9 &&
                 std::stoul(token) < node->size()) {
        node = &(*node)[std::stoul(token)];
      } else {
        return invalid(path, fmt::format("unresolvable $ref \"{}\"", r));
      }
      pos = slash + 1;
    }
    return toRegex(*node, path + "(" + r + ")", depth + 1, frames + 1);
  }

  std::string typed(const json& s, const std::string& path, int depth, int frames) {
    const json& type = s["type"];
    const std::string p = joinPath(path, "type");
    if (type.is_string()) return ofType(s, type.get<std::string>(), path, depth, frames);
    if (!type.is_array() || type.empty())
      return invalid(p, "expected a type name or a non-empty list of them");
    std::string out = "(";
    for (size_t i = 0; i < type.size() && error_.ok(); ++i) {
      if (!type[i].is_string()) return invalid(p, "expected a type name");
      if (i) append(out, "|");
      append(out, ofType(s, type[i].get<std::string>(), path, depth, frames));
    }
    append(out, ")");
    return out;
  }

  std::string ofType(const json& s, const std::string& type, const std::string& path, int depth,
                     int frames) {
    if (type == "string") return string(s, path);
    if (type == "number") return std::string(kNumber);
    if (type == "integer") return std::string(kInteger);
    if (type == "boolean") return std::string(kBoolean);
    if (type == "null") return std::string(kNull);
    if (type == "object") return object(s, path, depth, frames);
    if (type == "array") return array(s, path, depth, frames);
    return invalid(joinPath(path, "type"), fmt::format("unknown type \"{}\"", type));
  }

  // A non-negative integer keyword, or -1 when absent.
  int64_t count(const json& s, const char* key, const std::string& path) {
    auto it = s.find(key);
    if (it == s.end()) return -1;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      invalid(joinPath(path, key), "expected a non-negative integer");
      return -1;
    }
    return std::min<int64_t>(it->get<int64_t>(), int64_t{1} << 40);
  }

  // "{m,n}" for the repetitions after the first item (outlines' _get_num_items_pattern), or
  // nullopt when max < 1 (only the empty container fits).
  std::optional<std::string> repeats(int64_t min, int64_t max, const std::string& path) {
    if (max >= 0 && min > max) {
      invalid(path, fmt::format("minimum {} is larger than maximum {}", min, max));
      return std::nullopt;
    }
    if (max == 0) return std::nullopt;
    const int64_t lo = std::max<int64_t>(min - 1, 0);
    return max < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, max - 1);
  }

  std::string string(const json& s, const std::string& path) {
    if (s.contains("minLength") || s.contains("maxLength")) {
      const int64_t lo = std::max<int64_t>(count(s, "minLength", path), 0);
      const int64_t hi = count(s, "maxLength", path);
      if (hi >= 0 && lo > hi) return invalid(path, "minLength is larger than maxLength");
      return hi < 0 ? fmt::format("\"{}{{{},}}\"", kStringInner, lo)
                    : fmt::format("\"{}{{{},{}}}\"", kStringInner, lo, hi);
    }
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return invalid(joinPath(path, "pattern"), "expected a string");
      std::string_view p = it->get_ref<const std::string&>();
      if (p.starts_with("^")) p.remove_prefix(1);
      if (p.ends_with("$") && !p.ends_with("\\$")) p.remove_suffix(1);
      return "\"(?:" + std::string(p) + ")\"";
    }
    if (auto it = s.find("format"); it != s.end()) {
      const std::string f = it->is_string() ? it->get<std::string>() : "";
      if (f == "date-time") return std::string(kDateTime);
      if (f == "date") return std::string(kDate);
      if (f == "time") return std::string(kTime);
      if (f == "uuid") return std::string(kUuid);
      if (f == "email") return std::string(kEmail);
      return invalid(joinPath(path, "format"), fmt::format("unsupported format \"{}\"", f));
    }
    return fmt::format("\"{}*\"", kStringInner);
  }

  std::string property(const std::string& name, const json& schema, const std::string& path,
                       int depth, int frames) {
    std::string out = fmt::format("{}{}{}:{}", kWs, escapeRegex(json(name).dump()), kWs, kWs);
    append(out, toRegex(schema, joinPath(path, name), depth, frames + 1));
    return out;
  }

  std::string object(const json& s, const std::string& path, int depth, int frames) {
    if (!s.contains("properties")) return mapObject(s, path, depth, frames);
    const json& props = s["properties"];
    if (!props.is_object()) return invalid(joinPath(path, "properties"), "expected an object");
    std::vector<std::string> names;
    for (auto it = props.begin(); it != props.end(); ++it) names.push_back(it.key());
    std::vector<bool> required(names.size(), false);
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return invalid(joinPath(path, "required"), "expected an array");
      for (size_t i = 0; i < names.size(); ++i) {
        for (const json& r : *it) required[i] = required[i] || (r.is_string() && r == names[i]);
      }
    }
    std::vector<std::string> subs;
    for (const std::string& n : names) {
      subs.push_back(property(n, props[n], joinPath(path, "properties"), depth + 1, frames));
      if (!error_.ok()) return {};
    }
    std::string out = "\\{";
    int lastRequired = -1;
    for (size_t i = 0; i < names.size(); ++i) lastRequired = required[i] ? int(i) : lastRequired;
    if (lastRequired >= 0) {
      // Before the last required property: "sub," (optional or not); after it: ",sub".
      for (int i = 0; i < int(names.size()) && error_.ok(); ++i) {
        std::string sub = subs[i];
        if (i < lastRequired) sub = sub + std::string(kWs) + ",";
        if (i > lastRequired) sub = std::string(kWs) + "," + sub;
        append(out, required[i] ? sub : "(" + sub + ")?");
      }
    } else if (!subs.empty()) {
      // None required: one branch per property being the last present one; all of it optional.
      append(out, "(");
      for (size_t i = 0; i < subs.size() && error_.ok(); ++i) {
        if (i) append(out, "|");
        for (size_t j = 0; j < i && error_.ok(); ++j) append(out, "(" + subs[j] + ",)?");
        append(out, subs[i]);
        for (size_t j = i + 1; j < subs.size() && error_.ok(); ++j)
          append(out, std::string("(") + std::string(kWs) + "," + subs[j] + ")?");
      }
      append(out, ")?");
    }
    append(out, std::string(kWs) + "\\}");
    return out;
  }

  // An object without `properties`: arbitrary string keys whose values follow
  // additionalProperties (any value when it is absent or true; only {} when false).
  std::string mapObject(const json& s, const std::string& path, int depth, int frames) {
    const int64_t lo = std::max<int64_t>(count(s, "minProperties", path), 0);
    const auto rep = repeats(lo, count(s, "maxProperties", path), path);
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (!error_.ok()) return {};
    if (!rep || (extra && extra->is_boolean() && !extra->get<bool>())) {
      if (lo > 0) return invalid(path, "minProperties > 0 but no property may appear");
      return fmt::format("\\{{{}\\}}", kWs);
    }
    std::string value =
        extra && !extra->is_boolean()
            ? toRegex(*extra, joinPath(path, "additionalProperties"), depth + 1, frames + 1)
            : anyValue(std::min(kAnyValueDepth - 1, limits_.maxSchemaDepth - depth));
    const std::string kv = fmt::format("\"{}*\"{}:{}", kStringInner, kWs, kWs) + value;
    std::string out = fmt::format("\\{{{}(", kWs);
    append(out, kv);
    append(out, fmt::format("({},{}", kWs, kWs));
    append(out, kv);
    append(out, ")" + *rep + ")" + (lo == 0 ? "?" : ""));
    append(out, fmt::format("{}\\}}", kWs));
    return out;
  }

  std::string array(const json& s, const std::string& path, int depth, int frames) {
    if (auto it = s.find("prefixItems"); it != s.end()) return tuple(s, path, depth, frames);
    const int64_t lo = std::max<int64_t>(count(s, "minItems", path), 0);
    const auto rep = repeats(lo, count(s, "maxItems", path), path);
    if (!error_.ok()) return {};
    if (!rep) {
      if (lo > 0) return invalid(path, "minItems > 0 but maxItems is 0");
      return fmt::format("\\[{}\\]", kWs);
    }
    std::string item;
    auto it = s.find("items");
    if (it != s.end() && !(it->is_boolean() && it->get<bool>())) {
      if (it->is_boolean()) {
        if (lo > 0) return invalid(joinPath(path, "items"), "items false but minItems > 0");
        return fmt::format("\\[{}\\]", kWs);
      }
      item = toRegex(*it, joinPath(path, "items"), depth + 1, frames + 1);
    } else {
      item = anyValue(std::min(kAnyValueDepth - 1, limits_.maxSchemaDepth - depth));
    }
    std::string out = fmt::format("\\[{}((", kWs);
    append(out, item);
    append(out, fmt::format(")({},{}(", kWs, kWs));
    append(out, item);
    append(out, "))" + *rep + ")" + (lo == 0 ? "?" : ""));
    append(out, fmt::format("{}\\]", kWs));
    return out;
  }

  // prefixItems: exactly those items in order (outlines), then more `items` when that is a schema.
  std::string tuple(const json& s, const std::string& path, int depth, int frames) {
    const std::string p = joinPath(path, "prefixItems");
    const json& list = s["prefixItems"];
    if (!list.is_array()) return invalid(p, "expected an array");
    std::string out = fmt::format("\\[{}", kWs);
    for (size_t i = 0; i < list.size() && error_.ok(); ++i) {
      if (i) append(out, fmt::format("{},{}", kWs, kWs));
      append(out, toRegex(list[i], p + "." + std::to_string(i), depth + 1, frames + 1));
    }
    if (auto it = s.find("items"); it != s.end() && it->is_object() && !list.empty()) {
      const std::string item = toRegex(*it, joinPath(path, "items"), depth + 1, frames + 1);
      append(out, fmt::format("({},{}", kWs, kWs));
      append(out, item);
      append(out, ")*");
    }
    append(out, fmt::format("{}\\]", kWs));
    return out;
  }

  // Any JSON value with containers nested at most `depth` deep (memoized per depth).
  std::string anyValue(int depth) {
    depth = std::max(depth, 0);
    if (static_cast<size_t>(depth) < anyCache_.size() && !anyCache_[depth].empty())
      return anyCache_[depth];
    std::string scalar = fmt::format("(\"{}*\"|{}|{}|{})", kStringInner, kNumber, kBoolean, kNull);
    std::string v = scalar;
    for (int d = 1; d <= depth && error_.ok(); ++d) {
      const std::string& inner = v;
      const std::string kv = fmt::format("\"{}*\"{}:{}{}", kStringInner, kWs, kWs, inner);
      std::string next = "(" + scalar;
      append(next, fmt::format("|\\[{}({}({},{}{})*)?{}\\]", kWs, inner, kWs, kWs, inner, kWs));
      append(next, fmt::format("|\\{{{}({}({},{}{})*)?{}\\}}", kWs, kv, kWs, kWs, kv, kWs));
      append(next, ")");
      v = std::move(next);
    }
    if (anyCache_.size() <= static_cast<size_t>(depth)) anyCache_.resize(depth + 1);
    anyCache_[depth] = v;
    return v;
  }

  const json& root_;
  const Limits& limits_;
  Status error_;
  std::vector<std::string> anyCache_;
};

}  // namespace

StatusOr<std::string> jsonSchemaToRegex(std::string_view schemaJson, const Limits& limits) {
  if (schemaJson.size() > limits.maxSourceBytes) {
    return resourceExhaustedError(fmt::format("json schema: {} bytes, past maxSourceBytes ({})",
                                              schemaJson.size(), limits.maxSourceBytes));
  }
  // parseJson bounds the nesting before anything is built; the ordered parse keeps key order.
  const int maxDepth = std::max(kMaxJsonDepth, 4 * limits.maxSchemaDepth + 8);
  auto checked = parseJson(schemaJson, "json schema", maxDepth);
  if (!checked.ok()) return checked.status();
  const json root = json::parse(schemaJson, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalidArgumentError("json schema: not valid JSON");
  if (!root.is_object() && !root.is_boolean()) {
    return invalidArgumentError("json schema: (root): a schema must be an object or a boolean");
  }
  return SchemaCompiler(root, limits).compile();
}

}  // namespace textgen::grammar
