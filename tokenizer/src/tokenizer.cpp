#include "textgen/tokenizer/tokenizer.h"

#include "added_vocabulary.h"
#include "byte_level.h"
#include "components.h"
#include "slow_tokenizer.h"
#include "textgen/base/file.h"
#include "textgen/base/json.h"
#include "unicode.h"

namespace textgen::tokenizer {

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> preTokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> postProcessor;
  std::unique_ptr<Decoder> decoder;
  // What tokenBytes needs to know of the decoder: is there a ByteLevel step, a ByteFallback step.
  bool byteLevelDecoder = false;
  bool byteFallbackDecoder = false;
  AddedVocabulary added;
  TokenizerConfig config;
};

namespace {

StatusOr<std::vector<AddedToken>> parseAddedTokens(const Json& root) {
  std::vector<AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  if (!it->is_array()) return jsonError("/added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string path = childPath("/added_tokens", i);
    if (!t.is_object()) return jsonError(path, "expected an object");
    AddedToken a;
    TG_ASSIGN_OR_RETURN(a.content, getString(t, path, "content"));
    auto id = t.find("id");
    if (id == t.end() || !id->is_number_unsigned() || id->get<uint64_t>() >= kMaxTokenId) {
      return jsonError(
          path, "missing 'id', or not an integer in [0, " + std::to_string(kMaxTokenId) + ")");
    }
    a.id = id->get<uint32_t>();
    TG_ASSIGN_OR_RETURN(a.singleWord, getBoolOr(t, path, "single_word", false));
    TG_ASSIGN_OR_RETURN(a.lstrip, getBoolOr(t, path, "lstrip", false));
    TG_ASSIGN_OR_RETURN(a.rstrip, getBoolOr(t, path, "rstrip", false));
    TG_ASSIGN_OR_RETURN(a.special, getBoolOr(t, path, "special", false));
    TG_ASSIGN_OR_RETURN(a.normalized, getBoolOr(t, path, "normalized", !a.special));
    out.push_back(std::move(a));
  }
  return out;
}

// A token field of tokenizer_config.json: a string, an AddedToken object, or null.
StatusOr<std::optional<std::string>> configToken(const Json& c, std::string_view key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return std::optional<std::string>((*it)["content"].get<std::string>());
  }
  return invalidArgumentError("tokenizer_config.json /" + std::string(key) +
                              ": expected a string or {\"content\": ...}");
}

StatusOr<TokenizerConfig> parseConfig(std::string_view text) {
  TokenizerConfig config;
  if (text.empty()) return config;
  TG_ASSIGN_OR_RETURN(Json c, parseJson(text, "tokenizer_config.json"));
  if (!c.is_object()) {
    return invalidArgumentError("tokenizer_config.json: not a JSON object");
  }
  if (auto it = c.find("tokenizer_class"); it != c.end() && it->is_string()) {
    config.tokenizerClass = it->get<std::string>();
  }
  TG_ASSIGN_OR_RETURN(config.bosToken, configToken(c, "bos_token"));
  TG_ASSIGN_OR_RETURN(config.eosToken, configToken(c, "eos_token"));
  TG_ASSIGN_OR_RETURN(config.unkToken, configToken(c, "unk_token"));
  TG_ASSIGN_OR_RETURN(config.padToken, configToken(c, "pad_token"));
  for (auto [key, field] : {std::pair{"add_bos_token", &config.addBosToken},
                            std::pair{"add_eos_token", &config.addEosToken}}) {
    if (auto it = c.find(key); it != c.end() && !it->is_null()) {
      if (!it->is_boolean())
        return invalidArgumentError(std::string("tokenizer_config.json /") + key +
                                    ": expected a boolean");
      *field = it->get<bool>();
    }
  }
  if (auto it = c.find("model_max_length"); it != c.end() && it->is_number()) {
    const double v = it->get<double>();
    if (v > 0) config.modelMaxLength = v >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(v);
  }
  return config;
}

// The class AutoTokenizer would pick for a directory without tokenizer.json:
// tokenizer_config.json's tokenizer_class, else GPT2Tokenizer for config.json's model_type "opt" or
// "gpt2" (Hub OPT checkpoints name no class). Empty when neither says.
StatusOr<std::string> slowTokenizerClass(const std::string& dir, std::string_view configText) {
  if (!configText.empty()) {
    TG_ASSIGN_OR_RETURN(TokenizerConfig c, parseConfig(configText));
    if (!c.tokenizerClass.empty()) return c.tokenizerClass;
  }
  auto model = readRegularFile(dir + "/config.json");
  if (!model.ok()) {
    if (model.status().code() == StatusCode::kNotFound) return std::string();
    return model.status();
  }
  TG_ASSIGN_OR_RETURN(Json m, parseJson(*model, "config.json"));
  if (!m.is_object()) return invalidArgumentError("config.json: not a JSON object");
  auto type = m.find("model_type");
  if (type != m.end() && type->is_string() && (*type == "opt" || *type == "gpt2"))
    return std::string("GPT2Tokenizer");
  return std::string();
}

// Records which decoder steps a (possibly nested) decoder has; makeDecoder has checked its shape.
void noteDecoderSteps(const Json& d, bool& byteLevel, bool& byteFallback, int depth) {
  if (!d.is_object() || depth > 16) return;
  auto type = d.find("type");
  if (type == d.end() || !type->is_string()) return;
  if (*type == "ByteLevel") byteLevel = true;
  if (*type == "ByteFallback") byteFallback = true;
  if (*type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    for (const Json& part : d["decoders"])
      noteDecoderSteps(part, byteLevel, byteFallback, depth + 1);
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromDirectory(const std::string& dir) {
  // Regular files only, of bounded size: a FIFO or a device in the directory is an error.
  auto json = readRegularFile(dir + "/tokenizer.json");
  auto config = readRegularFile(dir + "/tokenizer_config.json");  // optional
  if (!config.ok() && config.status().code() != StatusCode::kNotFound) return config.status();
  const std::string configText = config.ok() ? *config : std::string();
  if (json.ok()) return fromJson(*json, configText);
  if (json.status().code() != StatusCode::kNotFound) return json.status();

  // No tokenizer.json: transformers converts the slow tokenizer's files; textgen does so for
  // GPT2Tokenizer (OPT's), the class AutoTokenizer picks from tokenizer_class, else model_type.
  TG_ASSIGN_OR_RETURN(std::string cls, slowTokenizerClass(dir, configText));
  if (cls != "GPT2Tokenizer" && cls != "GPT2TokenizerFast") {
    const std::string why =
        cls.empty() ? "neither tokenizer_config.json's tokenizer_class nor config.json's "
                      "model_type names a GPT2Tokenizer"
                    : "tokenizer class '" + cls + "' cannot be built from slow tokenizer files";
    return notFoundError(std::string(json.status().message()) + "; and " + why +
                         " (textgen builds only GPT2Tokenizer from vocab.json + merges.txt)");
  }
  std::string files[3];  // vocab.json, merges.txt (required), special_tokens_map.json (optional)
  const char* names[3] = {"vocab.json", "merges.txt", "special_tokens_map.json"};
  for (int i = 0; i < 3; ++i) {
    auto text = readRegularFile(dir + "/" + names[i]);
    if (text.ok()) {
      files[i] = std::move(*text);
    } else if (text.status().code() != StatusCode::kNotFound) {
      return text.status();
    } else if (i < 2) {
      return notFoundError(dir + "/" + names[i] + ": not found; a " + cls +
                           " without tokenizer.json needs vocab.json and merges.txt");
    }
  }
  return fromGpt2Files({files[0], files[1], configText, files[2]});
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromGpt2Files(const Gpt2Files& files) {
  try {
    TG_ASSIGN_OR_RETURN(Json root, gpt2TokenizerJson(files));
    auto tok = load(root.dump(), files.tokenizerConfigJson);
    if (!tok.ok() && !tok.status().message().starts_with("tokenizer_config.json")) {
      return invalidArgumentError("vocab.json + merges.txt: the tokenizer built from them: " +
                                  std::string(tok.status().message()));
    }
    return tok;
  } catch (const std::exception& e) {
    return invalidArgumentError(std::string("vocab.json + merges.txt: ") + e.what());
  }
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromJson(std::string_view tokenizerJson,
                                                         std::string_view configJson) {
  // Loading checks types before reading values; this catch is the backstop that keeps a malformed
  // file an error rather than a crash.
  try {
    return load(tokenizerJson, configJson);
  } catch (const std::exception& e) {
    return invalidArgumentError(std::string("tokenizer.json: ") + e.what());
  }
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(std::string_view tokenizerJson,
                                                     std::string_view configJson) {
  // The depth bound also bounds the recursion of nested components (Sequence of Sequence ...).
  TG_ASSIGN_OR_RETURN(Json root, parseJson(tokenizerJson, "tokenizer.json"));
  if (!root.is_object()) return jsonError("", "expected an object");
  auto impl = std::make_unique<Impl>();
  TG_ASSIGN_OR_RETURN(impl->config, parseConfig(configJson));
  auto present = [&](const char* key) { return root.contains(key) && !root[key].is_null(); };
  if (!present("model")) return jsonError("", "missing field 'model'");
  TG_ASSIGN_OR_RETURN(impl->model, makeModel(root["model"], "/model"));
  if (present("normalizer")) {
    TG_ASSIGN_OR_RETURN(impl->normalizer, makeNormalizer(root["normalizer"], "/normalizer"));
  }
  if (present("pre_tokenizer")) {
    TG_ASSIGN_OR_RETURN(impl->preTokenizer,
                        makePreTokenizer(root["pre_tokenizer"], "/pre_tokenizer"));
  }
  if (present("post_processor")) {
    TG_ASSIGN_OR_RETURN(impl->postProcessor,
                        makePostProcessor(root["post_processor"], "/post_processor"));
  }
  if (present("decoder")) {
    TG_ASSIGN_OR_RETURN(impl->decoder, makeDecoder(root["decoder"], "/decoder"));
    noteDecoderSteps(root["decoder"], impl->byteLevelDecoder, impl->byteFallbackDecoder, 0);
  }
  if (present("truncation") || present("padding")) {
    // TGI truncates itself (truncate parameter) and never pads token ids; ignoring these matches
    // it.
  }
  TG_ASSIGN_OR_RETURN(std::vector<AddedToken> added, parseAddedTokens(root));
  impl->added.build(std::move(added), impl->normalizer.get());

  // TGI's router rebuilds the post-processor of Llama tokenizers from tokenizer_config.json.
  const TokenizerConfig& c = impl->config;
  if (c.tokenizerClass == "LlamaTokenizer" || c.tokenizerClass == "LlamaTokenizerFast") {
    const bool addBos = c.addBosToken.value_or(true);
    const bool addEos = c.addEosToken.value_or(false);
    std::vector<std::pair<std::string, uint32_t>> before, after;
    auto resolve = [&](const std::optional<std::string>& token, const char* what,
                       std::vector<std::pair<std::string, uint32_t>>& into) -> Status {
      if (!token)
        return invalidArgumentError(std::string("tokenizer_config.json: add_") + what +
                                    "_token is set but " + what + "_token is missing");
      std::optional<uint32_t> id = impl->added.tokenToId(*token);
      if (!id) id = impl->model->tokenToId(*token);
      if (!id)
        return invalidArgumentError("tokenizer_config.json: " + std::string(what) + "_token '" +
                                    *token + "' is not in the vocabulary");
      into.push_back({*token, *id});
      return okStatus();
    };
    if (addBos) TG_RETURN_IF_ERROR(resolve(c.bosToken, "bos", before));
    if (addEos) TG_RETURN_IF_ERROR(resolve(c.eosToken, "eos", after));
    TG_ASSIGN_OR_RETURN(impl->postProcessor, makeTemplatePostProcessor(before, after));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

StatusOr<Encoding> Tokenizer::encode(std::string_view text, bool addSpecialTokens) const {
  if (!isValidUtf8(text)) return invalidArgumentError("input is not valid UTF-8");
  if (text.size() >= UINT32_MAX) return invalidArgumentError("input is larger than 4 GiB");
  const Impl& t = *impl_;
  PreTokenizedString pre = t.added.extractAndNormalize(t.normalizer.get(), text);
  if (t.preTokenizer) t.preTokenizer->preTokenize(pre);
  Encoding e;
  std::vector<Token> tokens;
  for (Split& split : pre.splits) {
    if (!split.tokens) {
      tokens.clear();
      TG_RETURN_IF_ERROR(t.model->tokenize(split.normalized.get(), tokens));
      split.tokens = std::move(tokens);
      tokens = {};
    }
    const auto shift = static_cast<uint32_t>(split.normalized.originalShift());
    for (Token& tok : *split.tokens) {
      Offsets o = tok.offsets;
      if (auto r = split.normalized.convertOffsets(tok.offsets))
        o = {shift + r->first, shift + r->second};
      e.append(tok.id, std::move(tok.value), o, false);
    }
  }
  if (t.postProcessor) {
    // Hugging Face post-processes offsets in characters (its Python API's unit) — ByteLevel's
    // whitespace trimming counts characters — so do the same and convert back to bytes.
    const bool ascii = countChars(text) == text.size();
    if (ascii) {
      t.postProcessor->process(e, addSpecialTokens);
    } else {
      std::vector<uint32_t> charToByte;
      std::vector<uint32_t> byteToChar(text.size() + 1, 0);
      charToByte.reserve(text.size() + 1);
      for (size_t i = 0; i < text.size(); ++i) {
        if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80)
          charToByte.push_back(static_cast<uint32_t>(i));
        byteToChar[i] = static_cast<uint32_t>(charToByte.size() - 1);
      }
      charToByte.push_back(static_cast<uint32_t>(text.size()));
      byteToChar[text.size()] = static_cast<uint32_t>(charToByte.size() - 1);
      for (auto& [start, end] : e.offsets) {
        start = byteToChar[std::min<size_t>(start, text.size())];
        end = byteToChar[std::min<size_t>(end, text.size())];
      }
      t.postProcessor->process(e, addSpecialTokens);
      for (auto& [start, end] : e.offsets) {
        start = charToByte[std::min<size_t>(start, charToByte.size() - 1)];
        end = charToByte[std::min<size_t>(end, charToByte.size() - 1)];
      }
    }
  }
  return e;
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skipSpecialTokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    const std::string* token = t.added.idToDecodeForm(id);
    if (!token) token = t.model->idToToken(id);
    if (!token) continue;
    if (skipSpecialTokens && t.added.isSpecialContent(*token)) continue;
    tokens.push_back(*token);
  }
  if (!t.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  t.decoder->decodeChain(tokens);
  std::string out;
  for (const std::string& s : tokens) out += s;
  return out;
}

std::optional<uint32_t> Tokenizer::tokenToId(std::string_view token) const {
  if (auto id = impl_->added.tokenToId(token)) return id;
  return impl_->model->tokenToId(token);
}

std::optional<std::string> Tokenizer::idToToken(uint32_t id) const {
  if (const std::string* t = impl_->added.idToToken(id)) return *t;
  if (const std::string* t = impl_->model->idToToken(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::isSpecial(uint32_t id) const {
  const std::string* t = impl_->added.idToToken(id);
  return t && impl_->added.isSpecialContent(*t);
}

bool Tokenizer::isSkippedInDecode(uint32_t id, bool skipSpecialTokens) const {
  const std::string* token = impl_->added.idToDecodeForm(id);
  if (!token) token = impl_->model->idToToken(id);
  return !token || (skipSpecialTokens && impl_->added.isSpecialContent(*token));
}

bool Tokenizer::isGroupedByteToken(uint32_t id) const {
  if (!impl_->decoder || !impl_->decoder->groupsByteTokens() || impl_->added.idToToken(id))
    return false;
  const std::string* token = impl_->model->idToToken(id);
  return token && token->size() == 6 && token->compare(0, 3, "<0x") == 0 && (*token)[5] == '>';
}

std::optional<std::string> Tokenizer::tokenBytes(uint32_t id) const {
  const Impl& t = *impl_;
  if (const std::string* added = t.added.idToToken(id); added && t.added.isSpecialContent(*added))
    return std::nullopt;
  const bool isAdded = t.added.idToDecodeForm(id) != nullptr;
  const std::string* token = t.added.idToDecodeForm(id);
  if (!token) token = t.model->idToToken(id);
  if (!token) return std::nullopt;
  if (!t.decoder) return " " + *token;  // decode() joins tokens with spaces
  if (t.byteLevelDecoder) {
    // The ByteLevel decoder's rule per token: the byte map when every character is in it, else
    // the token's own text (an added token).
    std::string bytes;
    size_t len;
    for (size_t i = 0; i < token->size(); i += len) {
      const int b = charToByte(decodeUtf8(*token, i, &len));
      if (b < 0) return *token;
      bytes.push_back(static_cast<char>(b));
    }
    return bytes;
  }
  if (t.byteFallbackDecoder && !isAdded && token->size() == 6 && token->starts_with("<0x") &&
      (*token)[5] == '>') {
    const std::string hex = token->substr(3, 2);
    if (std::isxdigit(static_cast<unsigned char>(hex[0])) &&
        std::isxdigit(static_cast<unsigned char>(hex[1])))
      return std::string(1, static_cast<char>(std::stoi(hex, nullptr, 16)));
  }
  // Any other decoder: the token between two neutral neighbours, so that rules for the start
  // and the end of a sequence do not touch it.
  std::vector<std::string> chain{"a", *token, "a"};
  t.decoder->decodeChain(chain);
  std::string joined;
  for (const std::string& s : chain) joined += s;
  if (joined.size() >= 2 && joined.front() == 'a' && joined.back() == 'a')
    return joined.substr(1, joined.size() - 2);
  chain.assign(1, *token);
  t.decoder->decodeChain(chain);
  return chain.empty() ? std::string() : chain[0];
}

size_t Tokenizer::vocabSize() const {
  return std::max<size_t>(impl_->model->vocabSize(), impl_->added.maxId());
}

const TokenizerConfig& Tokenizer::config() const {
  return impl_->config;
}

std::optional<uint32_t> Tokenizer::bosTokenId() const {
  return impl_->config.bosToken ? tokenToId(*impl_->config.bosToken) : std::nullopt;
}

std::optional<uint32_t> Tokenizer::eosTokenId() const {
  return impl_->config.eosToken ? tokenToId(*impl_->config.eosToken) : std::nullopt;
}

}  // namespace textgen::tokenizer
