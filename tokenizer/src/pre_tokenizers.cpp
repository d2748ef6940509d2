// Pre-tokenizers: ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Punctuation, Digits,
// Sequence.
#include "byte_level.h"
#include "components.h"
#include "unicode.h"

namespace textgen::tokenizer {
namespace {

// GPT-2's pre-tokenization regex (what ByteLevel uses when use_regex is set).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::shared_ptr<const Regex> compileBuiltin(std::string_view pattern, Regex::Dialect dialect) {
  auto r = Regex::compile(pattern, dialect);
  TG_CHECK(r.ok(), "built-in pattern: {}", r.status().toString());
  return *r;
}

// Maps every byte of the piece to its ByteLevel character (each byte after a character's first
// is an inserted character).
void byteLevelTransform(NormalizedString& s) {
  const std::string& text = s.get();
  std::vector<CharChange> changes;
  changes.reserve(text.size());
  const auto& map = byteToChar();
  size_t len;
  for (size_t i = 0; i < text.size(); i += len) {
    len = utf8SequenceLength(static_cast<unsigned char>(text[i]));
    for (size_t k = 0; k < len; ++k) {
      changes.push_back({map[static_cast<unsigned char>(text[i + k])], k > 0 ? 1 : 0});
    }
  }
  s.transform(changes, 0);
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool addPrefixSpace, bool useRegex)
      : addPrefixSpace_(addPrefixSpace),
        regex_(useRegex ? compileBuiltin(kGpt2Pattern, Regex::Dialect::kOniguruma) : nullptr) {}

  void preTokenize(PreTokenizedString& s) const override {
    s.split([&](NormalizedString piece) {
      if (addPrefixSpace_ && piece.get().rfind(' ', 0) != 0) piece.prepend(" ");
      if (!regex_) return std::vector<NormalizedString>{std::move(piece)};
      return std::move(piece).split(findMatches(*regex_, piece.get()), SplitBehavior::kIsolated);
    });
    s.normalize(byteLevelTransform);
  }

 private:
  bool addPrefixSpace_;
  std::shared_ptr<const Regex> regex_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::shared_ptr<const Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void preTokenize(PreTokenizedString& s) const override {
    s.split([&](NormalizedString piece) {
      Matches m = findMatches(*pattern_, piece.get());
      if (invert_) invertMatches(m);
      return std::move(piece).split(m, behavior_);
    });
  }

 private:
  std::shared_ptr<const Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split), space_(Regex::literal(" ")) {
    appendUtf8(replacementStr_, replacement);
  }

  void preTokenize(PreTokenizedString& s) const override {
    s.split([&](NormalizedString piece) {
      piece.replace(*space_, replacementStr_);
      const bool startsWith = piece.get().rfind(replacementStr_, 0) == 0;
      if (scheme_ == PrependScheme::kAlways && !startsWith) piece.prepend(replacementStr_);
      if (scheme_ == PrependScheme::kFirst && !startsWith && piece.originalShift() == 0) {
        piece.prepend(replacementStr_);
      }
      if (!split_) return std::vector<NormalizedString>{std::move(piece)};
      const char32_t r = replacement_;
      return std::move(piece).split(findMatches([r](char32_t c) { return c == r; }, piece.get()),
                                    SplitBehavior::kMergedWithNext);
    });
  }

 private:
  char32_t replacement_;
  std::string replacementStr_;
  PrependScheme scheme_;
  bool split_;
  std::shared_ptr<const Regex> space_;
};

// Splits by a character predicate.
class PredicatePreTokenizer final : public PreTokenizer {
 public:
  PredicatePreTokenizer(bool (*predicate)(char32_t), SplitBehavior behavior)
      : predicate_(predicate), behavior_(behavior) {}

  void preTokenize(PreTokenizedString& s) const override {
    s.split([&](NormalizedString piece) {
      return std::move(piece).split(findMatches(predicate_, piece.get()), behavior_);
    });
  }

 private:
  bool (*predicate_)(char32_t);
  SplitBehavior behavior_;
};

class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  WhitespacePreTokenizer()
      : regex_(compileBuiltin(R"(\w+|[^\w\s]+)", Regex::Dialect::kRustRegex)) {}

  void preTokenize(PreTokenizedString& s) const override {
    s.split([&](NormalizedString piece) {
      Matches m = findMatches(*regex_, piece.get());
      invertMatches(m);
      return std::move(piece).split(m, SplitBehavior::kRemoved);
    });
  }

 private:
  std::shared_ptr<const Regex> regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void preTokenize(PreTokenizedString& s) const override {
    for (const auto& p : parts_) p->preTokenize(s);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// Rust char::is_numeric (Nd, Nl, No), which the Digits pre-tokenizer uses.
bool isNumericChar(char32_t c) {
  return (c >= '0' && c <= '9') || (c >= 0x80 && isNumeric(c));
}
bool isPunctuationChar(char32_t c) {
  return (c < 0x80 && ((c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
                       (c >= '{' && c <= '~'))) ||
         isPunctuation(c);
}

StatusOr<SplitBehavior> parseBehavior(const Json& j, const std::string& path,
                                      SplitBehavior fallback) {
  auto it = j.find("behavior");
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) return jsonError(childPath(path, "behavior"), "expected a string");
  const std::string b = it->get<std::string>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return jsonError(childPath(path, "behavior"), "unknown split behavior '" + b + "'");
}

StatusOr<PrependScheme> parsePrependScheme(const Json& j, const std::string& path) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {
    // Files older than prepend_scheme carry add_prefix_space.
    TG_ASSIGN_OR_RETURN(bool add, getBoolOr(j, path, "add_prefix_space", true));
    return add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  if (!it->is_string()) return jsonError(childPath(path, "prepend_scheme"), "expected a string");
  const std::string s = it->get<std::string>();
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  return jsonError(childPath(path, "prepend_scheme"), "unknown prepend_scheme '" + s + "'");
}

}  // namespace

StatusOr<std::unique_ptr<PreTokenizer>> makePreTokenizer(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(std::string type, componentType(j, path));
  if (type == "ByteLevel") {
    TG_ASSIGN_OR_RETURN(bool prefix, getBoolOr(j, path, "add_prefix_space", true));
    TG_ASSIGN_OR_RETURN(bool useRegex, getBoolOr(j, path, "use_regex", true));
    return std::make_unique<ByteLevelPreTokenizer>(prefix, useRegex);
  }
  if (type == "Split") {
    TG_ASSIGN_OR_RETURN(PatternSpec spec, getPattern(j, path, "pattern"));
    TG_ASSIGN_OR_RETURN(auto pattern, makePattern(spec, childPath(path, "pattern")));
    TG_ASSIGN_OR_RETURN(SplitBehavior behavior, parseBehavior(j, path, SplitBehavior::kIsolated));
    TG_ASSIGN_OR_RETURN(bool invert, getBoolOr(j, path, "invert", false));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "Metaspace") {
    TG_ASSIGN_OR_RETURN(char32_t replacement, getChar(j, path, "replacement"));
    TG_ASSIGN_OR_RETURN(PrependScheme scheme, parsePrependScheme(j, path));
    TG_ASSIGN_OR_RETURN(bool split, getBoolOr(j, path, "split", true));
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, split);
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") {
    return std::make_unique<PredicatePreTokenizer>(isWhitespace, SplitBehavior::kRemoved);
  }
  if (type == "Punctuation") {
    TG_ASSIGN_OR_RETURN(SplitBehavior behavior, parseBehavior(j, path, SplitBehavior::kIsolated));
    return std::make_unique<PredicatePreTokenizer>(isPunctuationChar, behavior);
  }
  if (type == "Digits") {
    TG_ASSIGN_OR_RETURN(bool individual, getBoolOr(j, path, "individual_digits", false));
    return std::make_unique<PredicatePreTokenizer>(
        isNumericChar, individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
  }
  if (type == "Sequence") {
    TG_ASSIGN_OR_RETURN(const Json* list, getArray(j, path, "pretokenizers"));
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      TG_ASSIGN_OR_RETURN(
          auto part, makePreTokenizer((*list)[i], childPath(childPath(path, "pretokenizers"), i)));
      parts.push_back(std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  return jsonError(path, "unsupported pre-tokenizer type '" + type + "'");
}

}  // namespace textgen::tokenizer
