#include "slow_tokenizer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "textgen/base/json.h"
#include "unicode.h"
#include "vocab.h"

namespace textgen::tokenizer {
namespace {

// An AddedToken as transformers holds it before handing it to `tokenizers`.
struct AddedSpec {
  std::string content;
  bool singleWord = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

Status fileError(std::string_view file, const std::string& what) {
  return invalidArgumentError(std::string(file) + ": " + what);
}

// vocab.json: {"token": id, ...}. `tokenizers` skips values that are not numbers and lets two
// tokens share an id (which one decodes is then hash order); both are refused here.
StatusOr<VocabMap> parseVocab(std::string_view text) {
  TG_ASSIGN_OR_RETURN(Json j, parseJson(text, "vocab.json"));
  if (!j.is_object()) return fileError("vocab.json", "expected an object of token -> id");
  VocabMap vocab;
  vocab.reserve(j.size());
  std::unordered_set<uint32_t> seen;
  seen.reserve(j.size());
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= kMaxTokenId) {
      return fileError("vocab.json", "the id of '" + token + "' is not an integer in [0, " +
                                         std::to_string(kMaxTokenId) + ")");
    }
    const auto value = id.get<uint32_t>();
    if (!seen.insert(value).second) {
      return fileError("vocab.json", "id " + std::to_string(value) +
                                         " is given twice (again for '" + token + "')");
    }
    vocab.emplace(token, value);
  }
  return vocab;
}

// merges.txt as `tokenizers` reads it: lines split on "\n" with one trailing "\r" dropped, lines
// starting "#version" skipped, every other line exactly two tokens separated by one space, each
// part and their concatenation in the vocabulary. Returns [["a", "b"], ...].
StatusOr<Json> parseMerges(std::string_view text, const VocabMap& vocab) {
  if (!isValidUtf8(text)) return fileError("merges.txt", "not valid UTF-8");
  Json merges = Json::array();
  size_t lineNo = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const bool last = end == std::string_view::npos;
    if (last) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = last ? text.size() : end + 1;
    ++lineNo;
    if (!last && !line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with("#version")) continue;
    const std::string where = "line " + std::to_string(lineNo) + ": ";
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return fileError("merges.txt", where + "expected two tokens separated by one space");
    }
    const std::string a(line.substr(0, space)), b(line.substr(space + 1));
    for (const std::string& token : {a, b, a + b}) {
      if (!lookup(vocab, token)) {
        return fileError("merges.txt", where + "token '" + token + "' is not in vocab.json");
      }
    }
    merges.push_back(Json::array({a, b}));
  }
  return merges;
}

StatusOr<Json> parseOptionalObject(std::string_view text, std::string_view file) {
  if (text.empty()) return Json::object();
  TG_ASSIGN_OR_RETURN(Json j, parseJson(text, file));
  if (!j.is_object()) return fileError(file, "not a JSON object");
  return j;
}

// A token value: a string (special, not normalized, as transformers makes it), or an AddedToken
// object whose absent flags take `tokenizers`' defaults (normalized = !special).
StatusOr<AddedSpec> parseToken(const Json& v, std::string_view file, const std::string& key,
                               std::optional<bool> forceSpecial) {
  AddedSpec t;
  if (v.is_string()) {
    t.content = v.get<std::string>();
    t.special = true;
    return t;
  }
  const std::string where = "/" + key;
  if (!v.is_object() || !v.contains("content") || !v["content"].is_string()) {
    return fileError(file, where + ": expected a string or an object with a string 'content'");
  }
  t.content = v["content"].get<std::string>();
  auto flag = [&](const char* name, bool fallback, bool& out) -> Status {
    auto it = v.find(name);
    if (it == v.end() || it->is_null()) {
      out = fallback;
    } else if (it->is_boolean()) {
      out = it->get<bool>();
    } else {
      return fileError(file, where + "/" + name + ": expected a boolean");
    }
    return okStatus();
  };
  TG_RETURN_IF_ERROR(flag("special", false, t.special));
  if (forceSpecial) t.special = *forceSpecial;
  TG_RETURN_IF_ERROR(flag("single_word", false, t.singleWord));
  TG_RETURN_IF_ERROR(flag("lstrip", false, t.lstrip));
  TG_RETURN_IF_ERROR(flag("rstrip", false, t.rstrip));
  TG_RETURN_IF_ERROR(flag("normalized", !t.special, t.normalized));
  return t;
}

constexpr const char* kNamedTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};

struct SpecialTokens {
  std::map<std::string, std::optional<AddedSpec>> named;  // key -> token; nullopt: none
  std::vector<AddedSpec> extra;                           // additional_special_tokens
  std::vector<AddedSpec> decoder;                         // added_tokens_decoder, by id
};

// What transformers' from_pretrained passes GPT2Tokenizer: tokenizer_config.json's tokens,
// overridden by special_tokens_map.json when the config has no added_tokens_decoder; unk, bos and
// eos default to "<|endoftext|>" (GPT2Tokenizer's defaults) when no file names them.
StatusOr<SpecialTokens> specialTokens(const Json& config, const Json& map) {
  SpecialTokens out;
  const bool hasDecoder =
      config.contains("added_tokens_decoder") && !config["added_tokens_decoder"].is_null();
  if (hasDecoder) {
    const Json& d = config["added_tokens_decoder"];
    if (!d.is_object()) {
      return fileError("tokenizer_config.json", "/added_tokens_decoder: expected an object");
    }
    std::vector<std::pair<uint64_t, AddedSpec>> byId;
    for (const auto& [key, value] : d.items()) {
      const std::string path = "added_tokens_decoder/" + key;
      if (key.empty() || key.size() > 9 ||
          !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return fileError("tokenizer_config.json", "/" + path + ": the key is not a token id");
      }
      TG_ASSIGN_OR_RETURN(AddedSpec t, parseToken(value, "tokenizer_config.json", path, {}));
      byId.emplace_back(std::stoull(key), std::move(t));
    }
    std::stable_sort(byId.begin(), byId.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& [id, t] : byId) out.decoder.push_back(std::move(t));
  }
  for (const char* key : kNamedTokens) {
    const Json* source = nullptr;
    const char* file = "tokenizer_config.json";
    std::optional<bool> forceSpecial;
    if (auto it = config.find(key); it != config.end()) source = &*it;
    if (!hasDecoder) {
      if (auto it = map.find(key); it != map.end()) {
        source = &*it;
        file = "special_tokens_map.json";
        forceSpecial = true;
      }
    }
    const std::string k = key;
    if (source == nullptr) {
      if (k == "bos_token" || k == "eos_token" || k == "unk_token") {
        out.named[k] = AddedSpec{"<|endoftext|>", false, false, false, false, true};
      } else {
        out.named[k] = std::nullopt;
      }
      continue;
    }
    if (source->is_null()) {
      out.named[k] = std::nullopt;
      continue;
    }
    TG_ASSIGN_OR_RETURN(AddedSpec t, parseToken(*source, file, k, forceSpecial));
    // A named token that added_tokens_decoder lists is that entry (from_pretrained swaps it in).
    for (const AddedSpec& d : out.decoder) {
      if (d.content == t.content) t = d;
    }
    out.named[k] = std::move(t);
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    const Json* list = nullptr;
    const char* file = "tokenizer_config.json";
    if (auto it = config.find(key); it != config.end() && !it->is_null()) list = &*it;
    if (!hasDecoder) {
      if (auto it = map.find(key); it != map.end() && !it->is_null()) {
        list = &*it;
        file = "special_tokens_map.json";
      }
    }
    if (list == nullptr) continue;
    // A list, or (transformers 5) an object of model-specific names -> tokens.
    if (!list->is_array() && !list->is_object()) {
      return fileError(file, std::string("/") + key + ": expected an array or an object");
    }
    for (const auto& [name, value] : list->items()) {
      TG_ASSIGN_OR_RETURN(AddedSpec t,
                          parseToken(value, file, std::string(key) + "/" + name, true));
      out.extra.push_back(std::move(t));
    }
    break;  // additional_special_tokens is the older name of extra_special_tokens
  }
  return out;
}

// TokenizersBackend.__init__'s order — added_tokens_decoder, the named tokens, the extra ones —
// with `tokenizers`' AddedVocabulary ids: the vocabulary's id for a token it has, else one past the
// largest id given so far (the model's size when that is larger). The first occurrence of a content
// wins; a token that a named attribute or the extra list names is special.
Json addedTokens(const SpecialTokens& s, const VocabMap& vocab) {
  std::unordered_set<std::string> specialContent;
  for (const auto& [key, t] : s.named) {
    if (t) specialContent.insert(t->content);
  }
  for (const AddedSpec& t : s.extra) specialContent.insert(t.content);
  std::vector<AddedSpec> order = s.decoder;
  for (const char* key : kNamedTokens) {
    if (const auto& t = s.named.at(key)) order.push_back(*t);
  }
  order.insert(order.end(), s.extra.begin(), s.extra.end());

  std::map<uint32_t, Json> byId;
  std::unordered_set<std::string> present;
  std::optional<uint32_t> maxId;
  const auto modelSize = static_cast<uint32_t>(vocab.size());
  for (AddedSpec t : order) {
    if (t.content.empty() || !present.insert(t.content).second) continue;
    if (specialContent.contains(t.content)) t.special = true;
    uint32_t id;
    if (auto v = lookup(vocab, t.content)) {
      id = *v;
    } else if (!maxId || (*maxId < modelSize && modelSize != 0)) {
      id = modelSize;
    } else {
      id = *maxId + 1;
    }
    maxId = std::max(maxId.value_or(0), id);
    byId[id] = Json{{"id", id},
                    {"content", t.content},
                    {"single_word", t.singleWord},
                    {"lstrip", t.lstrip},
                    {"rstrip", t.rstrip},
                    {"normalized", t.normalized},
                    {"special", t.special}};
  }
  Json out = Json::array();
  for (auto& [id, token] : byId) out.push_back(std::move(token));
  return out;
}

StatusOr<bool> configBool(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    return fileError("tokenizer_config.json", std::string("/") + key + ": expected a boolean");
  }
  return it->get<bool>();
}

// TokenizersBackend.update_post_processor.
Json templateProcessing(const std::optional<AddedSpec>& bos, const std::optional<AddedSpec>& eos,
                        bool addBos, bool addEos, const Json& added, const VocabMap& vocab) {
  addBos = addBos && bos.has_value();
  addEos = addEos && eos.has_value();
  auto idOf = [&](const std::string& content) -> uint32_t {
    for (const Json& t : added) {
      if (t["content"] == content) return t["id"].get<uint32_t>();
    }
    return lookup(vocab, content).value_or(0);  // every named token was added above
  };
  auto special = [](const std::string& content, int typeId) {
    return Json{{"SpecialToken", {{"id", content}, {"type_id", typeId}}}};
  };
  auto sequence = [](const char* id, int typeId) {
    return Json{{"Sequence", {{"id", id}, {"type_id", typeId}}}};
  };
  Json single = Json::array(), pair = Json::array(), specials = Json::object();
  for (int typeId : {0, 1}) {
    Json& into = typeId == 0 ? single : pair;
    if (typeId == 1) pair = single;
    if (addBos) into.push_back(special(bos->content, typeId));
    into.push_back(sequence(typeId == 0 ? "A" : "B", typeId));
    if (addEos) into.push_back(special(eos->content, typeId));
  }
  for (const auto& [on, t] : {std::pair{addBos, &bos}, std::pair{addEos, &eos}}) {
    if (!on) continue;
    const std::string& c = (*t)->content;
    specials[c] = {{"id", c}, {"ids", Json::array({idOf(c)})}, {"tokens", Json::array({c})}};
  }
  return {{"type", "TemplateProcessing"},
          {"single", std::move(single)},
          {"pair", std::move(pair)},
          {"special_tokens", std::move(specials)}};
}

}  // namespace

StatusOr<Json> gpt2TokenizerJson(const Gpt2Files& files) {
  TG_ASSIGN_OR_RETURN(VocabMap vocab, parseVocab(files.vocabJson));
  TG_ASSIGN_OR_RETURN(Json merges, parseMerges(files.mergesTxt, vocab));
  TG_ASSIGN_OR_RETURN(Json config,
                      parseOptionalObject(files.tokenizerConfigJson, "tokenizer_config.json"));
  TG_ASSIGN_OR_RETURN(Json map,
                      parseOptionalObject(files.specialTokensMapJson, "special_tokens_map.json"));
  TG_ASSIGN_OR_RETURN(SpecialTokens special, specialTokens(config, map));
  TG_ASSIGN_OR_RETURN(bool addPrefixSpace, configBool(config, "add_prefix_space"));
  TG_ASSIGN_OR_RETURN(bool addBos, configBool(config, "add_bos_token"));
  TG_ASSIGN_OR_RETURN(bool addEos, configBool(config, "add_eos_token"));

  Json added = addedTokens(special, vocab);
  Json post = templateProcessing(special.named.at("bos_token"), special.named.at("eos_token"),
                                 addBos, addEos, added, vocab);
  Json vocabJson = Json::object();
  for (const auto& [token, id] : vocab) vocabJson[token] = id;
  auto byteLevel = [](bool prefix) {
    return Json{{"type", "ByteLevel"},
                {"add_prefix_space", prefix},
                {"trim_offsets", true},
                {"use_regex", true}};
  };
  return Json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", std::move(added)},
              {"normalizer", nullptr},
              {"pre_tokenizer", byteLevel(addPrefixSpace)},
              {"post_processor", std::move(post)},
              {"decoder", byteLevel(true)},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocabJson)},
                {"merges", std::move(merges)}}}};
}

}  // namespace textgen::tokenizer
