// Normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Strip, Replace, Prepend, Precompiled, Sequence.
#include <utf8proc.h>

#include <algorithm>

#include "components.h"
#include "precompiled.h"
#include "unicode.h"

namespace textgen::tokenizer {
namespace {

// Unicode normalisation that also reports, per output character, how it relates to the input
// (the alignment changes of the unicode-normalization-alignments crate Hugging Face uses).
class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(bool compat, bool compose) : compat_(compat), compose_(compose) {}

  void normalize(NormalizedString& s) const override {
    const std::string& text = s.get();
    if (std::all_of(text.begin(), text.end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      return;  // ASCII is invariant under every normalisation form
    }
    std::vector<CharChange> d = decompose(text);
    reorder(d);
    if (compose_) d = recompose(d);
    s.transform(d, 0);
  }

 private:
  std::vector<CharChange> decompose(const std::string& text) const {
    std::vector<CharChange> out;
    out.reserve(text.size());
    const auto options =
        static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | (compat_ ? UTF8PROC_COMPAT : 0));
    utf8proc_int32_t buf[32];
    size_t len;
    for (size_t i = 0; i < text.size(); i += len) {
      const char32_t c = decodeUtf8(text, i, &len);
      int last = 0;
      const utf8proc_ssize_t n =
          utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 32, options, &last);
      if (n <= 0 || n > 32) {
        out.push_back({c, 0});
        continue;
      }
      for (utf8proc_ssize_t k = 0; k < n; ++k)
        out.push_back({static_cast<char32_t>(buf[k]), k > 0 ? 1 : 0});
    }
    return out;
  }

  // Canonical ordering: stable sort of each run of non-starters by combining class.
  static void reorder(std::vector<CharChange>& d) {
    size_t i = 0;
    while (i < d.size()) {
      if (combiningClass(d[i].c) == 0) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < d.size() && combiningClass(d[j].c) != 0) ++j;
      std::stable_sort(d.begin() + i, d.begin() + j, [](const CharChange& a, const CharChange& b) {
        return combiningClass(a.c) < combiningClass(b.c);
      });
      i = j;
    }
  }

  static std::optional<char32_t> composePair(char32_t a, char32_t b) {
    utf8proc_int32_t buf[2] = {static_cast<utf8proc_int32_t>(a), static_cast<utf8proc_int32_t>(b)};
    const utf8proc_ssize_t n = utf8proc_normalize_utf32(buf, 2, UTF8PROC_COMPOSE);
    if (n == 1) return static_cast<char32_t>(buf[0]);
    return std::nullopt;
  }

  static std::vector<CharChange> recompose(const std::vector<CharChange>& d) {
    std::vector<CharChange> out;
    out.reserve(d.size());
    long starter = -1;
    int lastClass = -1;  // class of the last character after the starter; -1: none in between
    for (const CharChange& ch : d) {
      const int cls = combiningClass(ch.c);
      if (starter >= 0 && (lastClass == -1 || lastClass < cls)) {
        if (auto composed = composePair(out[starter].c, ch.c)) {
          out[starter].c = *composed;
          out[starter].change += ch.change - 1;
          continue;
        }
      }
      if (cls == 0) {
        starter = static_cast<long>(out.size());
        lastClass = -1;
      } else {
        lastClass = cls;
      }
      out.push_back(ch);
    }
    return out;
  }

  bool compat_;
  bool compose_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(NormalizedString& s) const override { s.lowercase(); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(NormalizedString& s) const override { s.strip(left_, right_); }

 private:
  bool left_, right_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<const Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(NormalizedString& s) const override { s.replace(*pattern_, content_); }

 private:
  std::shared_ptr<const Regex> pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void normalize(NormalizedString& s) const override {
    if (!s.empty()) s.prepend(prepend_);
  }

 private:
  std::string prepend_;
};

class PrecompiledNormalizer final : public Normalizer {
 public:
  explicit PrecompiledNormalizer(PrecompiledCharsMap map) : map_(std::move(map)) {}
  void normalize(NormalizedString& s) const override { map_.normalize(s); }

 private:
  PrecompiledCharsMap map_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(NormalizedString& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

StatusOr<std::string> base64Decode(std::string_view in, const std::string& path) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const size_t v = kAlphabet.find(c);
    if (v == std::string_view::npos) return jsonError(path, "invalid base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

}  // namespace

StatusOr<std::shared_ptr<const Regex>> makePattern(const PatternSpec& spec,
                                                   const std::string& path) {
  if (!spec.isRegex) {
    // An empty literal matches nothing (Hugging Face), not the empty string everywhere.
    if (spec.text.empty()) return Regex::compile("(?!)");
    return Regex::literal(spec.text);
  }
  auto r = Regex::compile(spec.text, Regex::Dialect::kOniguruma);
  if (!r.ok()) return jsonError(path, r.status().message());
  return r;
}

StatusOr<std::unique_ptr<Normalizer>> makeNormalizer(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(std::string type, componentType(j, path));
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(false, true);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(false, false);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(true, true);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(true, false);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    TG_ASSIGN_OR_RETURN(bool left, getBoolOr(j, path, "strip_left", true));
    TG_ASSIGN_OR_RETURN(bool right, getBoolOr(j, path, "strip_right", true));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Replace") {
    TG_ASSIGN_OR_RETURN(PatternSpec spec, getPattern(j, path, "pattern"));
    TG_ASSIGN_OR_RETURN(std::string content, getString(j, path, "content"));
    TG_ASSIGN_OR_RETURN(auto pattern, makePattern(spec, childPath(path, "pattern")));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Prepend") {
    TG_ASSIGN_OR_RETURN(std::string prepend, getString(j, path, "prepend"));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Precompiled") {
    auto it = j.find("precompiled_charsmap");
    if (it == j.end() || it->is_null()) {
      return std::make_unique<SequenceNormalizer>(std::vector<std::unique_ptr<Normalizer>>{});
    }
    TG_ASSIGN_OR_RETURN(std::string b64, getString(j, path, "precompiled_charsmap"));
    TG_ASSIGN_OR_RETURN(std::string blob,
                        base64Decode(b64, childPath(path, "precompiled_charsmap")));
    auto map = PrecompiledCharsMap::parse(blob);
    if (!map.ok())
      return jsonError(childPath(path, "precompiled_charsmap"), map.status().message());
    return std::make_unique<PrecompiledNormalizer>(std::move(*map));
  }
  if (type == "Sequence") {
    TG_ASSIGN_OR_RETURN(const Json* list, getArray(j, path, "normalizers"));
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TG_ASSIGN_OR_RETURN(auto part,
                          makeNormalizer((*list)[i], childPath(childPath(path, "normalizers"), i)));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return jsonError(path, "unsupported normalizer type '" + type + "'");
}

}  // namespace textgen::tokenizer
