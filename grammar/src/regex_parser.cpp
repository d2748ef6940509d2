#include "regex_parser.h"

#include <algorithm>
#include <string>

#include "fmt/core.h"

namespace textgen::grammar {
namespace {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Sorts, merges and removes the surrogate block (which UTF-8 cannot encode).
Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (auto [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.push_back({lo, hi});
    }
  }
  Ranges out;
  for (auto [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.push_back({lo, hi});
      continue;
    }
    if (lo < 0xD800) out.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF) out.push_back({0xE000, hi});
  }
  return out;
}

Ranges negate(const Ranges& r) {
  Ranges out;
  char32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize(std::move(out));
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class Parser {
 public:
  Parser(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  StatusOr<RegexAst> parse() {
    size_t end = text_.size();
    // ^ at the start and $ at the end are full-match anchors: the whole text matches anyway.
    if (!text_.empty() && text_[0] == '^') pos_ = 1;
    if (end > pos_ && text_[end - 1] == '$' && !escapedAt(end - 1)) end -= 1;
    end_ = end;
    const int32_t root = parseAlt(0);
    if (!error_.ok()) return error_;
    if (pos_ < end_) {
      // Only an unmatched ')' stops parseAlt before the end.
      return invalidArgumentError(fmt::format("regex: unmatched ')' at offset {}", pos_));
    }
    ast_.root = root;
    return std::move(ast_);
  }

 private:
  // True when the byte at `i` is preceded by an odd number of backslashes.
  bool escapedAt(size_t i) const {
    size_t n = 0;
    while (i > n && text_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }

  bool atEnd() const { return pos_ >= end_ || !error_.ok(); }
  char peek() const { return text_[pos_]; }

  int32_t fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
    return 0;
  }
  int32_t invalid(std::string_view what, size_t at) {
    return fail(invalidArgumentError(fmt::format("regex: {} at offset {}", what, at)));
  }

  int32_t add(RegexNode n) {
    ast_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(ast_.nodes.size() - 1);
  }
  int32_t addClass(Ranges r) {
    RegexNode n;
    n.type = RegexNode::Type::kClass;
    n.ranges = normalize(std::move(r));
    return add(std::move(n));
  }

  // Decodes one UTF-8 code point at pos_ and advances; invalid UTF-8 is an error.
  char32_t nextCodePoint() {
    const auto b0 = static_cast<unsigned char>(text_[pos_]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > text_.size()) {
      invalid("invalid UTF-8", pos_);
      return 0;
    }
    char32_t c = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<unsigned char>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) {
        invalid("invalid UTF-8", pos_);
        return 0;
      }
      c = (c << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kMin[len] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) {
      invalid("invalid UTF-8", pos_);
      return 0;
    }
    pos_ += len;
    return c;
  }

  // alternation := sequence ('|' sequence)*
  int32_t parseAlt(int depth) {
    if (depth > kMaxRegexNesting) {
      return fail(resourceExhaustedError(
          fmt::format("regex: groups nest deeper than {} at offset {}", kMaxRegexNesting, pos_)));
    }
    std::vector<int32_t> alts{parseSeq(depth)};
    while (!atEnd() && peek() == '|') {
      ++pos_;
      alts.push_back(parseSeq(depth));
    }
    if (alts.size() == 1) return alts[0];
    RegexNode n;
    n.type = RegexNode::Type::kAlt;
    n.children = std::move(alts);
    return add(std::move(n));
  }

  int32_t parseSeq(int depth) {
    std::vector<int32_t> items;
    while (!atEnd() && peek() != '|' && peek() != ')') {
      const int32_t atom = parseAtom(depth);
      if (!error_.ok()) return 0;
      items.push_back(parseQuantifiers(atom));
    }
    if (items.size() == 1) return items[0];
    RegexNode n;
    n.type = items.empty() ? RegexNode::Type::kEmpty : RegexNode::Type::kConcat;
    n.children = std::move(items);
    return add(std::move(n));
  }

  // Reads digits at pos_ (bounded: a count past maxNfaStates can never compile).
  std::optional<int64_t> readNumber() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < end_ && peek() >= '0' && peek() <= '9') {
      v = std::min<int64_t>(v * 10 + (peek() - '0'), int64_t{1} << 40);
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return v;
  }

  // {m}, {m,}, {m,n}, {,n}: true with the bounds, or false (pos_ unchanged) when the brace is not a
  // quantifier, which then is a literal '{' as in Python.
  bool readBraces(int64_t& lo, int64_t& hi) {
    const size_t start = pos_;
    ++pos_;
    auto m = readNumber();
    hi = -1;
    if (pos_ < end_ && peek() == ',') {
      ++pos_;
      auto n = readNumber();
      if (n) hi = *n;
    } else if (m) {
      hi = *m;
    }
    if (pos_ >= end_ || peek() != '}' || (!m && hi < 0)) {
      pos_ = start;
      return false;
    }
    ++pos_;
    lo = m.value_or(0);
    return true;
  }

  int32_t parseQuantifiers(int32_t atom) {
    bool quantified = false;
    while (!atEnd()) {
      const size_t at = pos_;
      int64_t lo, hi;
      const char c = peek();
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        if (!readBraces(lo, hi)) break;
      } else {
        break;
      }
      if (quantified) return invalid("multiple repeat (a quantifier after a quantifier)", at);
      quantified = true;
      if (hi >= 0 && lo > hi) return invalid("repetition {m,n} with m > n", at);
      const auto cap = static_cast<int64_t>(limits_.maxNfaStates);
      if (lo > cap || hi > cap) {
        return fail(resourceExhaustedError(fmt::format(
            "regex: repetition count at offset {} exceeds maxNfaStates ({})", at, cap)));
      }
      if (!atEnd() && peek() == '?') {
        ++pos_;  // lazy: the same language
      } else if (!atEnd() && peek() == '+') {
        return invalid("possessive quantifier is not supported", pos_);
      }
      RegexNode n;
      n.type = RegexNode::Type::kRepeat;
      n.children = {atom};
      n.min = static_cast<int32_t>(lo);
      n.max = static_cast<int32_t>(hi);
      atom = add(std::move(n));
    }
    return atom;
  }

  int32_t parseGroup(int depth) {
    const size_t at = pos_;
    ++pos_;  // '('
    if (pos_ < end_ && peek() == '?') {
      const std::string_view rest = text_.substr(pos_ + 1, std::min<size_t>(3, end_ - pos_ - 1));
      if (rest.starts_with(":")) {
        pos_ += 2;
      } else if (rest.starts_with("P<") ||
                 (rest.starts_with("<") && !rest.starts_with("<=") && !rest.starts_with("<!"))) {
        const size_t close = text_.find('>', pos_);
        if (close == std::string_view::npos || close >= end_)
          return invalid("unterminated group name", at);
        pos_ = close + 1;  // a named group: captures mean nothing here
      } else if (rest.starts_with("=") || rest.starts_with("!") || rest.starts_with("<=") ||
                 rest.starts_with("<!")) {
        return invalid("lookaround assertion is not supported", at);
      } else if (rest.starts_with("P=")) {
        return invalid("backreference is not supported", at);
      } else if (rest.starts_with(">")) {
        return invalid("atomic group is not supported", at);
      } else if (rest.starts_with("#")) {
        return invalid("comment group is not supported", at);
      } else {
        return invalid("inline flags or an unknown group kind '(?' are not supported", at);
      }
    }
    const int32_t inner = parseAlt(depth + 1);
    if (!error_.ok()) return 0;
    if (pos_ >= end_ || peek() != ')') return invalid("unterminated group '('", at);
    ++pos_;
    return inner;
  }

  int32_t parseAtom(int depth) {
    const size_t at = pos_;
    const char c = peek();
    switch (c) {
      case '(': return parseGroup(depth);
      case '[': return parseClass();
      case '.': ++pos_; return addClass({{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}});
      case '*':
      case '+':
      case '?': return invalid(fmt::format("nothing to repeat before '{}'", c), at);
      case '^': return invalid("'^' anchor inside the pattern is not supported", at);
      case '$': return invalid("'$' anchor inside the pattern is not supported", at);
      case '\\': {
        Ranges r;
        if (!parseEscape(r, /*inClass=*/false)) return 0;
        return addClass(std::move(r));
      }
      case '{': {
        int64_t lo, hi;
        if (readBraces(lo, hi)) return invalid("nothing to repeat before '{'", at);
        ++pos_;
        return addClass({{'{', '{'}});
      }
      default: {
        const char32_t cp = nextCodePoint();
        if (!error_.ok()) return 0;
        return addClass({{cp, cp}});
      }
    }
  }

  // Reads `n` hex digits (or, when n == 0, a braced run \u{...}).
  std::optional<char32_t> readHex(int n, size_t at) {
    if (n == 0) {
      const size_t close = text_.find('}', pos_);
      if (pos_ >= end_ || peek() != '{' || close == std::string_view::npos || close >= end_ ||
          close == pos_ + 1 || close - pos_ - 1 > 6) {
        invalid("bad \\u{...} escape", at);
        return std::nullopt;
      }
      ++pos_;
      n = static_cast<int>(close - pos_);
    }
    char32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= end_ || !std::isxdigit(static_cast<unsigned char>(peek()))) {
        invalid("bad hexadecimal escape", at);
        return std::nullopt;
      }
      const char h = peek();
      v = v * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++pos_;
    }
    if (pos_ < end_ && peek() == '}') ++pos_;
    if (v > kMaxCodePoint) {
      invalid("code point past U+10FFFF", at);
      return std::nullopt;
    }
    return v;
  }

  // At a backslash: the class it stands for. False (with error_ set) when refused.
  bool parseEscape(Ranges& out, bool inClass) {
    const size_t at = pos_;
    ++pos_;
    if (pos_ >= text_.size()) {
      invalid("trailing backslash", at);
      return false;
    }
    const char c = text_[pos_];
    auto one = [&](char32_t cp) {
      out.push_back({cp, cp});
      return true;
    };
    if (static_cast<unsigned char>(c) >= 0x80 || !std::isalnum(static_cast<unsigned char>(c))) {
      const char32_t cp = nextCodePoint();  // an escaped punctuation or symbol: itself
      return error_.ok() && one(cp);
    }
    ++pos_;
    switch (c) {
      case 'd': return out.insert(out.end(), kDigit.begin(), kDigit.end()), true;
      case 'w': return out.insert(out.end(), kWord.begin(), kWord.end()), true;
      case 's': return out.insert(out.end(), kSpace.begin(), kSpace.end()), true;
      case 'D':
        for (auto r : negate(kDigit)) out.push_back(r);
        return true;
      case 'W':
        for (auto r : negate(kWord)) out.push_back(r);
        return true;
      case 'S':
        for (auto r : negate(normalize(kSpace))) out.push_back(r);
        return true;
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'a': return one('\a');
      case '0': return one(0);
      case 'e': return one(0x1B);
      case 'x': {
        auto v = pos_ < end_ && peek() == '{' ? readHex(0, at) : readHex(2, at);
        return v && one(*v);
      }
      case 'u': {
        auto v = pos_ < end_ && peek() == '{' ? readHex(0, at) : readHex(4, at);
        if (v && *v >= 0xD800 && *v <= 0xDFFF) {
          invalid("surrogate code point escape", at);
          return false;
        }
        return v && one(*v);
      }
      case 'U': {
        auto v = readHex(8, at);
        return v && one(*v);
      }
      case 'b':
        if (inClass) return one('\b');
        invalid("word boundary '\\b' is not supported", at);
        return false;
      case 'B': invalid("word boundary '\\B' is not supported", at); return false;
      case 'A':
      case 'z':
      case 'Z':
      case 'G': invalid(fmt::format("anchor '\\{}' is not supported", c), at); return false;
      case 'k': invalid("backreference '\\k' is not supported", at); return false;
      case 'p':
      case 'P':
        invalid(fmt::format("Unicode property class '\\{}' is not supported", c), at);
        return false;
      default:
        if (c >= '1' && c <= '9') {
          invalid("backreference is not supported", at);
        } else {
          invalid(fmt::format("unknown escape '\\{}'", c), at);
        }
        return false;
    }
  }

  int32_t parseClass() {
    const size_t at = pos_;
    ++pos_;  // '['
    bool negated = false;
    if (pos_ < end_ && peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (pos_ >= end_) return invalid("unterminated character class '['", at);
      if (peek() == ']' && !first) break;
      first = false;
      const size_t itemAt = pos_;
      Ranges item;
      if (peek() == '\\') {
        if (!parseEscape(item, /*inClass=*/true)) return 0;
      } else {
        const char32_t cp = nextCodePoint();
        if (!error_.ok()) return 0;
        item.push_back({cp, cp});
      }
      // A range a-b (a '-' before ']' is a literal).
      if (pos_ + 1 < end_ && peek() == '-' && text_[pos_ + 1] != ']') {
        if (item.size() != 1 || item[0].first != item[0].second)
          return invalid("a class like \\d cannot start a range", itemAt);
        ++pos_;
        Ranges hiItem;
        if (peek() == '\\') {
          if (!parseEscape(hiItem, /*inClass=*/true)) return 0;
        } else {
          const char32_t cp = nextCodePoint();
          if (!error_.ok()) return 0;
          hiItem.push_back({cp, cp});
        }
        if (hiItem.size() != 1 || hiItem[0].first != hiItem[0].second)
          return invalid("a class like \\d cannot end a range", itemAt);
        if (hiItem[0].first < item[0].first) return invalid("bad range (end before start)", itemAt);
        r.push_back({item[0].first, hiItem[0].first});
      } else {
        r.insert(r.end(), item.begin(), item.end());
      }
    }
    ++pos_;  // ']'
    r = normalize(std::move(r));
    return addClass(negated ? negate(r) : r);
  }

  std::string_view text_;
  const Limits& limits_;
  size_t pos_ = 0;
  size_t end_ = 0;
  RegexAst ast_;
  Status error_;
};

}  // namespace

StatusOr<RegexAst> parseRegex(std::string_view pattern, const Limits& limits) {
  if (pattern.size() > limits.maxSourceBytes) {
    return resourceExhaustedError(fmt::format("regex: {} bytes exceeds maxSourceBytes ({})",
                                              pattern.size(), limits.maxSourceBytes));
  }
  return Parser(pattern, limits).parse();
}

}  // namespace textgen::grammar
