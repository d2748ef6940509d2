// Post-processors: TemplateProcessing, ByteLevel (offset trimming), Sequence.
#include "byte_level.h"
#include "components.h"
#include "unicode.h"

namespace textgen::tokenizer {

void Encoding::truncateLeft(size_t maxTokens) {
  if (ids.size() <= maxTokens) return;
  const auto drop = static_cast<std::ptrdiff_t>(ids.size() - maxTokens);
  ids.erase(ids.begin(), ids.begin() + drop);
  tokens.erase(tokens.begin(), tokens.begin() + drop);
  offsets.erase(offsets.begin(), offsets.begin() + drop);
  specialTokensMask.erase(specialTokensMask.begin(), specialTokensMask.begin() + drop);
}

namespace {

class TemplatePostProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool isSequence;
    std::string specialId;  // key into specials_ when !isSequence
  };
  struct Special {
    std::vector<uint32_t> ids;
    std::vector<std::string> tokens;
  };

  TemplatePostProcessor(std::vector<Piece> single,
                        std::unordered_map<std::string, Special> specials)
      : single_(std::move(single)), specials_(std::move(specials)) {}

  void process(Encoding& e, bool addSpecialTokens) const override {
    if (!addSpecialTokens) return;
    Encoding out;
    for (const Piece& p : single_) {
      if (p.isSequence) {
        for (size_t i = 0; i < e.size(); ++i) {
          out.append(e.ids[i], std::move(e.tokens[i]), e.offsets[i], e.specialTokensMask[i] != 0);
        }
        continue;
      }
      const Special& s = specials_.at(p.specialId);
      for (size_t i = 0; i < s.ids.size(); ++i) out.append(s.ids[i], s.tokens[i], {0, 0}, true);
    }
    e = std::move(out);
  }

 private:
  std::vector<Piece> single_;
  std::unordered_map<std::string, Special> specials_;
};

class ByteLevelPostProcessor final : public PostProcessor {
 public:
  ByteLevelPostProcessor(bool addPrefixSpace, bool trimOffsets)
      : addPrefixSpace_(addPrefixSpace), trimOffsets_(trimOffsets) {}

  void process(Encoding& e, bool) const override {
    if (!trimOffsets_) return;
    const char32_t space = byteToChar()[' '];
    for (size_t i = 0; i < e.size(); ++i) {
      const std::string& token = e.tokens[i];
      std::vector<char32_t> chars;
      size_t len;
      for (size_t k = 0; k < token.size(); k += len) chars.push_back(decodeUtf8(token, k, &len));
      auto isSpace = [&](char32_t c) { return c == space || isWhitespace(c); };
      uint32_t leading = 0, trailing = 0;
      while (leading < chars.size() && isSpace(chars[leading])) ++leading;
      while (trailing < chars.size() && isSpace(chars[chars.size() - 1 - trailing])) ++trailing;
      auto& [start, end] = e.offsets[i];
      if (leading > 0) {
        const bool isFirst = i == 0 || start == 0;
        if (isFirst && addPrefixSpace_ && leading == 1) leading = 0;
        start = std::min(start + leading, end);
      }
      if (trailing > 0 && end >= trailing) end = std::max(end - trailing, start);
    }
  }

 private:
  bool addPrefixSpace_;
  bool trimOffsets_;
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(Encoding& e, bool addSpecialTokens) const override {
    for (const auto& p : parts_) p->process(e, addSpecialTokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

StatusOr<std::unique_ptr<PostProcessor>> makeTemplate(const Json& j, const std::string& path) {
  std::unordered_map<std::string, TemplatePostProcessor::Special> specials;
  const std::string specialsPath = childPath(path, "special_tokens");
  if (auto it = j.find("special_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return jsonError(specialsPath, "expected an object");
    for (auto e = it->begin(); e != it->end(); ++e) {
      const std::string p = childPath(specialsPath, e.key());
      const Json& v = e.value();
      if (!v.is_object() || !v.contains("ids") || !v.contains("tokens") || !v["ids"].is_array() ||
          !v["tokens"].is_array() || v["ids"].size() != v["tokens"].size()) {
        return jsonError(p,
                         "expected {\"id\", \"ids\": [...], \"tokens\": [...]} of equal lengths");
      }
      TemplatePostProcessor::Special s;
      for (const Json& id : v["ids"]) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() > UINT32_MAX)
          return jsonError(p, "ids must be 32-bit unsigned integers");
        s.ids.push_back(id.get<uint32_t>());
      }
      for (const Json& t : v["tokens"]) {
        if (!t.is_string()) return jsonError(p, "tokens must be strings");
        s.tokens.push_back(t.get<std::string>());
      }
      specials.emplace(e.key(), std::move(s));
    }
  }
  TG_ASSIGN_OR_RETURN(const Json* single, getArray(j, path, "single"));
  std::vector<TemplatePostProcessor::Piece> pieces;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& p = (*single)[i];
    const std::string piecePath = childPath(childPath(path, "single"), i);
    if (p.contains("Sequence")) {
      pieces.push_back({true, {}});
    } else if (p.contains("SpecialToken") && p["SpecialToken"].contains("id") &&
               p["SpecialToken"]["id"].is_string()) {
      std::string id = p["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(id))
        return jsonError(piecePath, "special token '" + id + "' missing from special_tokens");
      pieces.push_back({false, std::move(id)});
    } else {
      return jsonError(piecePath,
                       "expected {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
    }
  }
  return std::unique_ptr<PostProcessor>(
      std::make_unique<TemplatePostProcessor>(std::move(pieces), std::move(specials)));
}

}  // namespace

StatusOr<std::unique_ptr<PostProcessor>> makeTemplatePostProcessor(
    const std::vector<std::pair<std::string, uint32_t>>& before,
    const std::vector<std::pair<std::string, uint32_t>>& after) {
  std::vector<TemplatePostProcessor::Piece> pieces;
  std::unordered_map<std::string, TemplatePostProcessor::Special> specials;
  for (const auto& [token, id] : before) {
    pieces.push_back({false, token});
    specials[token] = {{id}, {token}};
  }
  pieces.push_back({true, {}});
  for (const auto& [token, id] : after) {
    pieces.push_back({false, token});
    specials[token] = {{id}, {token}};
  }
  return std::unique_ptr<PostProcessor>(
      std::make_unique<TemplatePostProcessor>(std::move(pieces), std::move(specials)));
}

StatusOr<std::unique_ptr<PostProcessor>> makePostProcessor(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(std::string type, componentType(j, path));
  if (type == "TemplateProcessing") return makeTemplate(j, path);
  if (type == "ByteLevel") {
    TG_ASSIGN_OR_RETURN(bool prefix, getBoolOr(j, path, "add_prefix_space", true));
    TG_ASSIGN_OR_RETURN(bool trim, getBoolOr(j, path, "trim_offsets", true));
    return std::unique_ptr<PostProcessor>(std::make_unique<ByteLevelPostProcessor>(prefix, trim));
  }
  if (type == "Sequence") {
    TG_ASSIGN_OR_RETURN(const Json* list, getArray(j, path, "processors"));
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TG_ASSIGN_OR_RETURN(
          auto part, makePostProcessor((*list)[i], childPath(childPath(path, "processors"), i)));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(
        std::make_unique<SequencePostProcessor>(std::move(parts)));
  }
  return jsonError(path, "unsupported post-processor type '" + type + "'");
}

}  // namespace textgen::tokenizer
