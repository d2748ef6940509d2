// ChatTemplate: TGI's chat-template context rendered by minja (see chat_template.h and
// docs/chat-templates.md). minja's headers stay in this file: they take ~15 s to compile.
#include "chat/chat_template.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <minja/minja.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <streambuf>
#include <utility>
#include <vector>

#include "textgen/base/file.h"
#include "textgen/base/json.h"

namespace textgen::router {
namespace {

using json = nlohmann::ordered_json;

// Bounds on the template text, checked before minja's recursive-descent parser sees it (the
// templates of real models are a few KiB, nest a few levels, and their longest tag is ~2 KiB).
constexpr size_t kMaxTemplateBytes = size_t{1} << 20;
constexpr size_t kMaxTagBytes = size_t{16} << 10;
constexpr int kMaxTemplateNesting = 64;
// Bounds on a render: the default output budget and the nesting of request JSON we walk.
constexpr size_t kBaseOutputBytes = size_t{1} << 20;
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int kMaxRequestDepth = 64;
constexpr int kMaxToJsonDepth = 256;

constexpr std::string_view kDefaultToolPrompt =
    "\nGiven the functions available, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt. Respond in the format {name: function "
    "name, parameters: dictionary of argument name and its value}.Do not use variables.\n";

void replaceAll(std::string& s, std::string_view from, std::string_view to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
}

// TGI's rewrites of the template text (router/src/infer/chat_template.rs): Gemma 3's first
// system part, Python's [::-1] (Qwen 3), and the training-only {% generation %} tags.
std::string applyTgiRewrites(std::string s) {
  replaceAll(s, "messages[0]['content'][0]['text']", "messages[0]['content']");
  replaceAll(s, "[::-1]", "|reverse");
  replaceAll(s, "{% generation %}", "");
  replaceAll(s, "{% endgeneration %}", "");
  return s;
}

// The code of each {{ }} / {% %} tag, with its string literals blanked; comments skipped.
template <typename Fn>
void forEachTag(const std::string& s, Fn&& fn) {
  size_t pos = 0;
  while ((pos = s.find('{', pos)) != std::string::npos && pos + 1 < s.size()) {
    const char kind = s[pos + 1];
    if (kind != '{' && kind != '%' && kind != '#') {
      ++pos;
      continue;
    }
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t i = pos + 2;
    std::string code;
    char quote = 0;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (quote) {
        if (c == '\\' && i + 1 < s.size()) {
          code += "  ";
          ++i;
        } else {
          if (c == quote) quote = 0;
          code += ' ';
        }
        continue;
      }
      if (kind != '#' && (c == '\'' || c == '"')) {
        quote = c;
        code += ' ';
        continue;
      }
      if (s.compare(i, 2, close) == 0) break;
      code += c;
    }
    if (kind != '#' && !fn(kind, code)) return;
    pos = i + 2;
  }
}

bool isIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Whether `tools` is read as a variable (TGI asks minijinja for the undeclared variables; minja has
// no such query, so this is lexical: the identifier `tools` in a tag, not after a '.').
bool templateReadsTools(const std::string& source) {
  bool found = false;
  forEachTag(source, [&](char, const std::string& code) {
    for (size_t p = code.find("tools"); p != std::string::npos; p = code.find("tools", p + 1)) {
      if (p > 0 && isIdentChar(code[p - 1])) continue;
      if (p + 5 < code.size() && isIdentChar(code[p + 5])) continue;
      size_t b = p;
      while (b > 0 && std::isspace(static_cast<unsigned char>(code[b - 1]))) --b;
      if (b > 0 && code[b - 1] == '.') continue;
      found = true;
      return false;
    }
    return true;
  });
  return found;
}

// Refuses template text that could exhaust minja's recursive parser: too long, a huge tag, or
// brackets or blocks nested too deep.
Status checkTemplateShape(const std::string& source, const std::string& origin) {
  if (source.size() > kMaxTemplateBytes) {
    return invalidArgumentError(fmt::format("chat template {} is {} bytes (at most {})", origin,
                                            source.size(), kMaxTemplateBytes));
  }
  Status status;
  int blocks = 0;
  forEachTag(source, [&](char kind, const std::string& code) {
    if (code.size() > kMaxTagBytes) {
      status =
          invalidArgumentError(fmt::format("chat template {} has a tag of {} bytes (at most {})",
                                           origin, code.size(), kMaxTagBytes));
      return false;
    }
    int depth = 0;
    for (char c : code) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') --depth;
      if (depth > kMaxTemplateNesting) {
        status = invalidArgumentError(fmt::format("chat template {} nests brackets deeper than {}",
                                                  origin, kMaxTemplateNesting));
        return false;
      }
    }
    if (kind == '%') {
      size_t b = code.find_first_not_of(" \t\r\n-+~");
      size_t e = b == std::string::npos ? b : code.find_first_of(" \t\r\n-+~(", b);
      const std::string word = b == std::string::npos ? "" : code.substr(b, e - b);
      static const char* const kOpen[] = {"if",     "for",   "macro",     "call",
                                          "filter", "block", "generation"};
      bool opens = std::find_if(std::begin(kOpen), std::end(kOpen),
                                [&](const char* w) { return word == w; }) != std::end(kOpen);
      if (word == "set" && code.find('=') == std::string::npos) opens = true;
      if (opens && ++blocks > kMaxTemplateNesting) {
        status = invalidArgumentError(fmt::format("chat template {} nests blocks deeper than {}",
                                                  origin, kMaxTemplateNesting));
        return false;
      }
      if (word.rfind("end", 0) == 0) --blocks;
    }
    return true;
  });
  return status;
}

// The deepest nesting of a JSON value, walked without recursion (nlohmann's dump recurses).
bool nestsDeeperThan(const json& root, int maxDepth) {
  std::vector<std::pair<const json*, int>> stack{{&root, 1}};
  while (!stack.empty()) {
    auto [j, depth] = stack.back();
    stack.pop_back();
    if (!j->is_structured()) continue;
    if (depth > maxDepth) return true;
    for (const auto& child : *j) stack.emplace_back(&child, depth + 1);
  }
  return false;
}

// serde_json::to_string of a value (TGI's Rust side): compact, key order kept, UTF-8 as is.
std::string compactJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// TGI's Message -> TextMessage: the content as one string.
struct FlatMessage {
  std::string role;
  std::string content;
  bool hasContentBody = true;  // false: tool_calls (TGI appends the tool prompt to content only)
};

StatusOr<std::string> flattenContent(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) {
    return invalidArgumentError(
        fmt::format("{}.content must be a string, an array of content parts, or null", where));
  }
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}.content[{}]", where, i);
    if (!part.is_object()) return invalidArgumentError(at + " must be an object");
    const json* type = member(part, "type");
    if (!type || !type->is_string()) return invalidArgumentError(at + ".type must be a string");
    if (*type == "text") {
      const json* text = member(part, "text");
      if (!text || !text->is_string()) return invalidArgumentError(at + ".text must be a string");
      out += text->get<std::string>();
    } else if (*type == "image_url") {
      const json* image = member(part, "image_url");
      const json* url = image && image->is_object() ? member(*image, "url") : nullptr;
      if (!url || !url->is_string()) {
        return invalidArgumentError(at + ".image_url.url must be a string");
      }
      out += "![](" + url->get<std::string>() + ")";  // TGI's markdown image
    } else {
      return invalidArgumentError(fmt::format("{}.type must be \"text\" or \"image_url\", not {}",
                                              at, compactJson(*type).substr(0, 64)));
    }
  }
  return out;
}

// TGI's FunctionDefinition as serialized: description (null when absent), name, and the
// parameters ("arguments"; "parameters" is its alias) as a JSON string.
StatusOr<json> functionDefinition(const json& fn, const std::string& where) {
  if (!fn.is_object()) return invalidArgumentError(where + " must be an object");
  const json* name = member(fn, "name");
  if (!name || !name->is_string()) return invalidArgumentError(where + ".name must be a string");
  const json* description = member(fn, "description");
  if (description && !description->is_string() && !description->is_null()) {
    return invalidArgumentError(where + ".description must be a string");
  }
  const json* args = member(fn, "arguments");
  if (!args) args = member(fn, "parameters");
  if (!args) return invalidArgumentError(where + " has no parameters (or arguments)");
  json out = json::object();
  out["description"] = description ? *description : json(nullptr);
  out["name"] = *name;
  out["arguments"] = compactJson(*args);
  return out;
}

StatusOr<std::vector<FlatMessage>> flattenMessages(const json& messages) {
  if (!messages.is_array()) return invalidArgumentError("`messages` must be an array");
  if (nestsDeeperThan(messages, kMaxRequestDepth)) {
    return invalidArgumentError(
        fmt::format("`messages` nests deeper than {} levels", kMaxRequestDepth));
  }
  std::vector<FlatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalidArgumentError(where + " must be an object");
    const json* role = member(m, "role");
    if (!role || !role->is_string()) return invalidArgumentError(where + ".role must be a string");
    FlatMessage flat{role->get<std::string>(), {}, true};
    const json* content = member(m, "content");
    const json* toolCalls = member(m, "tool_calls");
    if (content && !content->is_null()) {
      TG_ASSIGN_OR_RETURN(flat.content, flattenContent(*content, where));
    } else if (toolCalls && !toolCalls->is_null()) {
      // TGI renders an assistant's tool calls as their JSON in `content`.
      if (!toolCalls->is_array())
        return invalidArgumentError(where + ".tool_calls must be an array");
      json calls = json::array();
      for (size_t c = 0; c < toolCalls->size(); ++c) {
        const json& call = (*toolCalls)[c];
        const std::string at = fmt::format("{}.tool_calls[{}]", where, c);
        if (!call.is_object()) return invalidArgumentError(at + " must be an object");
        const json* id = member(call, "id");
        const json* type = member(call, "type");
        const json* fn = member(call, "function");
        if (!id || !id->is_string()) return invalidArgumentError(at + ".id must be a string");
        if (!type || !type->is_string()) return invalidArgumentError(at + ".type must be a string");
        if (!fn) return invalidArgumentError(at + " has no function");
        TG_ASSIGN_OR_RETURN(json def, functionDefinition(*fn, at + ".function"));
        calls.push_back(json{{"id", *id}, {"type", *type}, {"function", std::move(def)}});
      }
      flat.content = compactJson(calls);
      flat.hasContentBody = false;
    } else if (!content) {
      return invalidArgumentError(where + " has neither content nor tool_calls");
    }
    out.push_back(std::move(flat));
  }
  return out;
}

// TGI's Tool list as the template sees it, or null.
StatusOr<json> contextTools(const json& tools) {
  if (tools.is_null()) return json(nullptr);
  if (!tools.is_array()) return invalidArgumentError("`tools` must be an array or null");
  if (tools.empty()) return json(nullptr);
  if (nestsDeeperThan(tools, kMaxRequestDepth)) {
    return invalidArgumentError(
        fmt::format("`tools` nests deeper than {} levels", kMaxRequestDepth));
  }
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = fmt::format("tools[{}]", i);
    const json& tool = tools[i];
    if (!tool.is_object()) return invalidArgumentError(where + " must be an object");
    const json* type = member(tool, "type");
    const json* fn = member(tool, "function");
    if (!type || !type->is_string()) return invalidArgumentError(where + ".type must be a string");
    if (!fn) return invalidArgumentError(where + " has no function");
    TG_ASSIGN_OR_RETURN(json def, functionDefinition(*fn, where + ".function"));
    out.push_back(json{{"type", *type}, {"function", std::move(def)}});
  }
  return out;
}

// Python's json.dumps, as transformers' tojson filter calls it.
struct PyJsonStyle {
  bool ensureAscii = false;
  std::optional<std::string> indent;  // none: one line
  std::string itemSeparator = ", ";
  std::string keySeparator = ": ";
  bool sortKeys = false;
};

void appendPyString(std::string& out, const std::string& s, bool ensureAscii) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else if (c < 0x80 || !ensureAscii) {
      out += static_cast<char>(c);
    } else {
      // Decode one UTF-8 sequence (input is valid UTF-8: it came from JSON or the template).
      int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = c & (len == 4 ? 0x07 : len == 3 ? 0x0F : 0x1F);
      for (int k = 1; k < len && i + 1 < s.size(); ++k) cp = (cp << 6) | (s[++i] & 0x3F);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
    }
  }
  out += '"';
}

std::string pyKey(const minja::Value& key) {
  if (key.is_string()) return key.get<std::string>();
  return key.get<json>().dump();  // Python: int/float/bool/None keys become their JSON text
}

void appendPyJson(std::string& out, const minja::Value& v, const PyJsonStyle& style, int level) {
  if (level > kMaxToJsonDepth) throw std::runtime_error("tojson: value nests too deep");
  auto newline = [&](int lvl) {
    if (!style.indent) return;
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *style.indent;
  };
  if (v.is_callable()) throw std::runtime_error("tojson: a callable is not JSON serializable");
  if (v.is_array()) {
    if (v.size() == 0) {
      out += "[]";
      return;
    }
    out += '[';
    newline(level + 1);
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) {
        out += style.itemSeparator;
        newline(level + 1);
      }
      appendPyJson(out, const_cast<minja::Value&>(v).at(i), style, level + 1);
    }
    newline(level);
    out += ']';
  } else if (v.is_object()) {
    minja::Value obj = v;
    std::vector<minja::Value> keys = obj.keys();
    if (keys.empty()) {
      out += "{}";
      return;
    }
    if (style.sortKeys) {
      std::stable_sort(keys.begin(), keys.end(), [](const minja::Value& a, const minja::Value& b) {
        return pyKey(a) < pyKey(b);
      });
    }
    out += '{';
    newline(level + 1);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i) {
        out += style.itemSeparator;
        newline(level + 1);
      }
      appendPyString(out, pyKey(keys[i]), style.ensureAscii);
      out += style.keySeparator;
      appendPyJson(out, obj.at(keys[i]), style, level + 1);
    }
    newline(level);
    out += '}';
  } else if (v.is_string()) {
    appendPyString(out, v.get<std::string>(), style.ensureAscii);
  } else if (v.is_null()) {
    out += "null";
  } else {
    const json prim = v.get<json>();
    if (prim.is_number_float() && !std::isfinite(prim.get<double>())) {
      const double d = prim.get<double>();
      out += std::isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity";
    } else {
      out += prim.dump();
    }
  }
}

// tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
minja::Value pyToJson(minja::ArgumentsValue& args) {
  static const char* const kNames[] = {"value", "ensure_ascii", "indent", "separators",
                                       "sort_keys"};
  std::vector<std::optional<minja::Value>> params(5);
  if (args.args.size() > 5) throw std::runtime_error("tojson: too many arguments");
  for (size_t i = 0; i < args.args.size(); ++i) params[i] = args.args[i];
  for (auto& [name, value] : args.kwargs) {
    auto it = std::find(std::begin(kNames), std::end(kNames), name);
    if (it == std::end(kNames)) throw std::runtime_error("tojson: unknown argument " + name);
    params[it - std::begin(kNames)] = value;
  }
  if (!params[0]) throw std::runtime_error("tojson: no value");
  PyJsonStyle style;
  if (params[1]) style.ensureAscii = params[1]->to_bool();
  if (params[2] && !params[2]->is_null()) {
    if (params[2]->is_string()) {
      style.indent = params[2]->get<std::string>();
    } else {
      style.indent = std::string(std::max<int64_t>(0, params[2]->get<int64_t>()), ' ');
    }
    style.itemSeparator = ",";
  }
  if (params[3] && !params[3]->is_null()) {
    if (!params[3]->is_array() || params[3]->size() != 2) {
      throw std::runtime_error("tojson: separators must be a pair");
    }
    style.itemSeparator = params[3]->at(0).get<std::string>();
    style.keySeparator = params[3]->at(1).get<std::string>();
  }
  if (params[4]) style.sortKeys = params[4]->to_bool();
  std::string out;
  appendPyJson(out, *params[0], style, 0);
  return minja::Value(out);
}

// Filters jinja2 has and minja lacks, where templates (or TGI's rewrites) need them: `reverse`
// (TGI rewrites Python's [::-1] to it), `replace`, `first`.
std::vector<uint32_t> codePoints(const std::string& s, std::vector<size_t>* starts) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    starts->push_back(i);
    out.push_back(c);
    i += len;
  }
  starts->push_back(s.size());
  return out;
}

minja::Value reverseFilter(minja::ArgumentsValue& args) {
  if (args.args.size() != 1) throw std::runtime_error("reverse takes one value");
  const minja::Value& v = args.args[0];
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    std::vector<size_t> starts;
    codePoints(s, &starts);
    std::string out;
    out.reserve(s.size());
    for (size_t k = starts.size() - 1; k > 0; --k)
      out.append(s, starts[k - 1], starts[k] - starts[k - 1]);
    return minja::Value(out);
  }
  if (!v.is_array()) throw std::runtime_error("reverse: the value is not a list or a string");
  std::vector<minja::Value> items;
  for (size_t i = v.size(); i > 0; --i) items.push_back(const_cast<minja::Value&>(v).at(i - 1));
  return minja::Value::array(items);
}

minja::Value replaceFilter(minja::ArgumentsValue& args) {
  if (args.args.size() < 3 || !args.args[0].is_string() || !args.args[1].is_string() ||
      !args.args[2].is_string()) {
    throw std::runtime_error("replace takes a string, the old and the new text");
  }
  const std::string s = args.args[0].get<std::string>();
  const std::string from = args.args[1].get<std::string>();
  const std::string to = args.args[2].get<std::string>();
  int64_t count = args.args.size() > 3 ? args.args[3].get<int64_t>() : -1;
  std::string out;
  if (from.empty()) {  // Python: `to` before every character and at the end
    std::vector<size_t> starts;
    codePoints(s, &starts);
    for (size_t k = 0; k + 1 < starts.size(); ++k) {
      if (count-- != 0) out += to;
      out.append(s, starts[k], starts[k + 1] - starts[k]);
    }
    if (count != 0) out += to;
    return minja::Value(out);
  }
  size_t pos = 0;
  for (size_t at; count != 0 && (at = s.find(from, pos)) != std::string::npos; --count) {
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
  }
  out.append(s, pos, std::string::npos);
  return minja::Value(out);
}

minja::Value firstFilter(minja::ArgumentsValue& args) {
  if (args.args.size() != 1) throw std::runtime_error("first takes one value");
  minja::Value v = args.args[0];
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    std::vector<size_t> starts;
    codePoints(s, &starts);
    return s.empty() ? minja::Value() : minja::Value(s.substr(0, starts[1]));
  }
  if (!v.is_array()) throw std::runtime_error("first: the value is not a list or a string");
  return v.size() == 0 ? minja::Value() : v.at(0);
}

// The rendered text, with its size bounded while it is written.
class BoundedBuffer final : public std::streambuf {
 public:
  explicit BoundedBuffer(size_t limit) : limit_(limit) {}
  std::string& text() { return text_; }
  bool exceeded() const { return exceeded_; }

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (text_.size() + static_cast<size_t>(n) > limit_) {
      exceeded_ = true;
      return 0;
    }
    text_.append(s, static_cast<size_t>(n));
    return n;
  }
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    const char c = traits_type::to_char_type(ch);
    return xsputn(&c, 1) == 1 ? ch : traits_type::eof();
  }

 private:
  size_t limit_;
  std::string text_;
  bool exceeded_ = false;
};

// Rust's char::is_whitespace (Unicode White_Space), for TGI's trim_end.
bool isUnicodeWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

void trimEndUnicode(std::string& s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const unsigned char lead = static_cast<unsigned char>(s[start]);
    const size_t len = s.size() - start;
    uint32_t cp = lead < 0x80 ? lead : lead & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[start + k]) & 0x3F);
    if (!isUnicodeWhitespace(cp)) return;
    s.resize(start);
  }
}

std::string shortMessage(std::string m) {
  constexpr size_t kMax = 600;
  if (m.size() > kMax) m = m.substr(0, kMax) + "...";
  return m;
}

std::tm localNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

struct CompiledTemplate {
  std::shared_ptr<minja::TemplateNode> root;
  bool readsTools = false;
};

StatusOr<CompiledTemplate> compile(const std::string& text, const std::string& origin) {
  std::string source = applyTgiRewrites(text);
  TG_RETURN_IF_ERROR(checkTemplateShape(source, origin));
  CompiledTemplate out;
  out.readsTools = templateReadsTools(source);
  try {
    minja::Options options{};
    options.trim_blocks = true;  // transformers' ImmutableSandboxedEnvironment settings
    options.lstrip_blocks = true;
    options.keep_trailing_newline = false;
    out.root = minja::Parser::parse(source, options);
  } catch (const std::exception& e) {
    return invalidArgumentError(
        fmt::format("chat template {} does not parse: {}", origin, shortMessage(e.what())));
  } catch (...) {
    return invalidArgumentError(fmt::format("chat template {} does not parse", origin));
  }
  return out;
}

// The render's globals plus transformers' functions and the filters minja lacks.
// raise_exception() records its message in `raised`: minja rethrows every error with its position
// appended, and the 422 carries the template's own words.
std::shared_ptr<minja::Context> renderContext(const json& globals,
                                              std::shared_ptr<std::optional<std::string>> raised,
                                              std::function<std::tm()> now) {
  auto context = minja::Context::make(minja::Value(globals));
  context->set("raise_exception",
               minja::Value::callable([raised](const std::shared_ptr<minja::Context>&,
                                               minja::ArgumentsValue& args) -> minja::Value {
                 *raised = args.args.empty() ? std::string() : args.args[0].to_str();
                 throw std::runtime_error(**raised);
               }));
  context->set("strftime_now",
               minja::Value::callable([now](const std::shared_ptr<minja::Context>&,
                                            minja::ArgumentsValue& args) -> minja::Value {
                 if (args.args.size() != 1 || !args.args[0].is_string()) {
                   throw std::runtime_error("strftime_now takes one format string");
                 }
                 const std::string format = args.args[0].get<std::string>();
                 const std::tm tm = now();
                 std::vector<char> out(format.size() * 4 + 64);
                 size_t n = std::strftime(out.data(), out.size(), format.c_str(), &tm);
                 if (n == 0 && !format.empty()) {
                   out.resize(format.size() * 64 + 1024);
                   n = std::strftime(out.data(), out.size(), format.c_str(), &tm);
                 }
                 return minja::Value(std::string(out.data(), n));
               }));
  auto filter = [](minja::Value (*fn)(minja::ArgumentsValue&)) {
    return minja::Value::callable([fn](const std::shared_ptr<minja::Context>&,
                                       minja::ArgumentsValue& args) { return fn(args); });
  };
  context->set("reverse", filter(reverseFilter));
  context->set("replace", filter(replaceFilter));
  context->set("first", filter(firstFilter));
  context->set("tojson",
               minja::Value::callable([](const std::shared_ptr<minja::Context>&,
                                         minja::ArgumentsValue& args) { return pyToJson(args); }));
  return context;
}

}  // namespace

struct ChatTemplate::Impl {
  CompiledTemplate main;
  std::optional<CompiledTemplate> toolUse;
  std::string bos;
  std::string eos;
  ChatTemplateOptions options;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;

std::string_view ChatTemplate::defaultToolPrompt() {
  return kDefaultToolPrompt;
}
const std::string& ChatTemplate::bosToken() const {
  return impl_->bos;
}
const std::string& ChatTemplate::eosToken() const {
  return impl_->eos;
}
bool ChatTemplate::readsTools(bool forToolRequest) const {
  return forToolRequest && impl_->toolUse ? impl_->toolUse->readsTools : impl_->main.readsTools;
}

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::fromSource(std::string source,
                                                                 std::string bos, std::string eos,
                                                                 ChatTemplateOptions options,
                                                                 std::string toolUseSource,
                                                                 std::string origin) {
  auto impl = std::make_unique<Impl>();
  TG_ASSIGN_OR_RETURN(impl->main, compile(source, origin));
  if (!toolUseSource.empty()) {
    TG_ASSIGN_OR_RETURN(impl->toolUse, compile(toolUseSource, origin + " (tool_use)"));
  }
  impl->bos = std::move(bos);
  impl->eos = std::move(eos);
  if (!options.now) options.now = localNow;
  impl->options = std::move(options);
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
}

StatusOr<std::string> ChatTemplate::apply(const json& messages, const json& tools,
                                          std::string_view toolPrompt,
                                          bool addGenerationPrompt) const {
  TG_ASSIGN_OR_RETURN(json ctxTools, contextTools(tools));
  TG_ASSIGN_OR_RETURN(std::vector<FlatMessage> flat, flattenMessages(messages));
  const bool withTools = !ctxTools.is_null();
  const CompiledTemplate& tmpl = withTools && impl_->toolUse ? *impl_->toolUse : impl_->main;

  size_t inputBytes = 0;
  if (withTools) {
    // TGI: the tool prompt goes after the last message's content; the tools' JSON too when the
    // template does not read `tools`.
    const std::string prompt(toolPrompt.empty() ? kDefaultToolPrompt : toolPrompt);
    const std::string toolsJson = compactJson(ctxTools);
    inputBytes += toolsJson.size() + prompt.size();
    if (!flat.empty() && flat.back().hasContentBody) {
      flat.back().content +=
          tmpl.readsTools ? "\n---\n" + prompt : "\n---\n" + toolsJson + "\n" + prompt;
    }
  }
  json ctxMessages = json::array();
  for (const FlatMessage& m : flat) {
    inputBytes += m.role.size() + m.content.size();
    ctxMessages.push_back(json{{"role", m.role}, {"content", m.content}});
  }
  const size_t limit = impl_->options.maxOutputBytes
                           ? impl_->options.maxOutputBytes
                           : std::min(kMaxOutputBytes, kBaseOutputBytes + 4 * inputBytes);

  json globals = {{"messages", std::move(ctxMessages)},
                  {"bos_token", impl_->bos},
                  {"eos_token", impl_->eos},
                  {"add_generation_prompt", addGenerationPrompt},
                  {"tools", std::move(ctxTools)}};
  auto raised = std::make_shared<std::optional<std::string>>();
  BoundedBuffer buffer(limit);
  try {
    auto context = renderContext(globals, raised, impl_->options.now);
    std::ostringstream out;
    out.std::ios::rdbuf(&buffer);
    out.exceptions(std::ios::badbit);
    tmpl.root->render(out, context);
  } catch (const std::exception& e) {
    if (raised->has_value()) {
      return invalidArgumentError("The chat template refused the messages: " + **raised);
    }
    if (buffer.exceeded()) {
      return invalidArgumentError(fmt::format(
          "The rendered chat prompt is over {} bytes (the bound for this request)", limit));
    }
    return invalidArgumentError("Chat template error: " + shortMessage(e.what()));
  } catch (...) {
    return invalidArgumentError("Chat template error");
  }
  std::string rendered = std::move(buffer.text());

  // TGI (after transformers' pipeline): a final assistant message is continued, not closed.
  if (!flat.empty() && flat.back().role == "assistant") {
    const std::string& last = flat.back().content;
    const size_t at = rendered.rfind(last);
    if (at != std::string::npos) {
      rendered.resize(at + last.size());
      trimEndUnicode(rendered);
    }
  }
  return rendered;
}

namespace {

struct TemplateText {
  std::string main;
  std::string toolUse;
};

// `chat_template`: a string, or a list of {name, template} ("default", and "tool_use").
StatusOr<TemplateText> templateText(const json& value, const std::string& origin) {
  if (value.is_string()) return TemplateText{value.get<std::string>(), {}};
  if (!value.is_array()) {
    return invalidArgumentError(origin +
                                ": chat_template must be a string or a list of {name, template}");
  }
  TemplateText out;
  std::vector<std::string> names;
  bool haveDefault = false;
  for (const json& entry : value) {
    const json* name = entry.is_object() ? member(entry, "name") : nullptr;
    const json* text = entry.is_object() ? member(entry, "template") : nullptr;
    if (!name || !name->is_string() || !text || !text->is_string()) {
      return invalidArgumentError(origin + ": each chat_template entry must be {name, template}");
    }
    names.push_back(name->get<std::string>());
    if (*name == "default") {
      out.main = text->get<std::string>();
      haveDefault = true;
    } else if (*name == "tool_use") {
      out.toolUse = text->get<std::string>();
    }
  }
  if (!haveDefault) {
    return notFoundError(fmt::format("{}: no \"default\" among the chat templates ({})", origin,
                                     fmt::join(names, ", ")));
  }
  return out;
}

std::string tokenText(const json& config, const char* key) {
  const json* token = member(config, key);
  if (!token) return {};
  if (token->is_string()) return token->get<std::string>();
  if (token->is_object()) {
    const json* content = member(*token, "content");
    if (content && content->is_string()) return content->get<std::string>();
  }
  return {};
}

// The file's JSON; NOT_FOUND when it does not exist. A model's file: no bound on its objects' keys
// (base/json.h; read once, at start-up).
StatusOr<json> readJsonFile(const std::string& path) {
  TG_ASSIGN_OR_RETURN(std::string text, readRegularFile(path));
  return parseOrderedJson(text, path, kMaxJsonDepth, /*boundKeys=*/false);
}

}  // namespace

StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::load(const std::string& tokenizerDir,
                                                           const std::string& tokenizerConfigPath,
                                                           ChatTemplateOptions options) {
  const std::string dir = tokenizerDir.empty() ? "." : tokenizerDir;
  json config = json::object();  // the tokenizer_config.json in use (bos/eos)
  std::optional<TemplateText> text;
  std::string origin;
  if (!tokenizerConfigPath.empty()) {
    TG_ASSIGN_OR_RETURN(config, readJsonFile(tokenizerConfigPath));
    if (const json* t = member(config, "chat_template"); t && !t->is_null()) {
      TG_ASSIGN_OR_RETURN(text, templateText(*t, tokenizerConfigPath));
      origin = tokenizerConfigPath;
    }
  } else {
    auto c = readJsonFile(dir + "/tokenizer_config.json");
    if (c.ok()) {
      config = std::move(*c);
    } else if (c.status().code() != StatusCode::kNotFound) {
      return c.status();
    }
  }
  if (!text) {
    auto jinja = readRegularFile(dir + "/chat_template.jinja");
    if (jinja.ok()) {
      text = TemplateText{std::move(*jinja), {}};
      origin = dir + "/chat_template.jinja";
    } else if (jinja.status().code() != StatusCode::kNotFound) {
      return jinja.status();
    }
  }
  if (!text) {
    auto standalone = readJsonFile(dir + "/chat_template.json");
    if (standalone.ok()) {
      origin = dir + "/chat_template.json";
      const json* t = member(*standalone, "chat_template");
      if (!t) return invalidArgumentError(origin + " has no chat_template");
      TG_ASSIGN_OR_RETURN(text, templateText(*t, origin));
    } else if (standalone.status().code() != StatusCode::kNotFound) {
      return standalone.status();
    }
  }
  if (!text && tokenizerConfigPath.empty()) {
    if (const json* t = member(config, "chat_template"); t && !t->is_null()) {
      origin = dir + "/tokenizer_config.json";
      TG_ASSIGN_OR_RETURN(text, templateText(*t, origin));
    }
  }
  if (!text) {
    return notFoundError(fmt::format(
        "This model has no chat template (no chat_template in {}, no chat_template.jinja or "
        "chat_template.json in {})",
        tokenizerConfigPath.empty() ? dir + "/tokenizer_config.json" : tokenizerConfigPath, dir));
  }
  return fromSource(std::move(text->main), tokenText(config, "bos_token"),
                    tokenText(config, "eos_token"), std::move(options), std::move(text->toolUse),
                    origin);
}

}  // namespace textgen::router
