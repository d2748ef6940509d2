#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include <mutex>

#include "unicode.h"

namespace textgen::tokenizer {
namespace {

// Unicode-aware meaning of the shorthand classes in each dialect.
//   Oniguruma (Ruby syntax, UTF-8): \s White_Space, \d Nd, \w L|M|Nd|Pc.
//   Rust regex: \s White_Space, \d Nd, \w Alphabetic|M|Nd|Pc|Join_Control.
// PCRE2's own \s adds U+180E and its \w lacks marks, so both are spelled out.
// A class nested in a class is a union in both dialects (BLOOM's ` ?[^(\s|[.,!?…])]+`); PCRE2 reads
// its '[' as a literal, so a nested class's members are inlined into the enclosing one. A negated
// nested class has no such spelling and is refused.
StatusOr<std::string> translate(std::string_view p, Regex::Dialect dialect) {
  const char* word = dialect == Regex::Dialect::kRustRegex
                         ? "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
                         : "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
  std::string out;
  out.reserve(p.size() + 16);
  // Each open bracket: 'c' a class, 'p' a POSIX class ([:alpha:]), 'n' a nested class (inlined).
  std::string open;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      const bool inClass = !open.empty();
      switch (n) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'd': out += "\\p{Nd}"; break;
        case 'D': out += "\\P{Nd}"; break;
        case 'w': out += inClass ? std::string(word) : "[" + std::string(word) + "]"; break;
        case 'W':
          if (inClass) {
            out += "\\W";  // cannot negate a union inside a class; PCRE2's \W is close
          } else {
            out += "[^" + std::string(word) + "]";
          }
          break;
        default: out += c; out += n;
      }
      continue;
    }
    if (c == '[') {
      const char next = i + 1 < p.size() ? p[i + 1] : '\0';
      if (open.empty()) {
        open += 'c';
        out += c;
        // "[]..." and "[^]..." start with a literal ']'.
        if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
        if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      } else if (next == ':') {
        open += 'p';
        out += c;
      } else if (next == '^') {
        return invalidArgumentError("invalid regex '" + std::string(p) + "' at offset " +
                                    std::to_string(i) +
                                    ": a negated class inside a class is not supported");
      } else {
        open += 'n';
        if (next == ']') {  // "[]...]": a literal ']' first
          out += "\\]";
          ++i;
        }
      }
      continue;
    }
    if (c == ']' && !open.empty()) {
      const char kind = open.back();
      open.pop_back();
      if (kind != 'n') out += c;
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::~Regex() = default;

StatusOr<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern, Dialect dialect) {
  TG_ASSIGN_OR_RETURN(const std::string translated, translate(pattern, dialect));
  int error = 0;
  PCRE2_SIZE errorOffset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &errorOffset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return invalidArgumentError("invalid regex '" + std::string(pattern) + "' at offset " +
                                std::to_string(errorOffset) + ": " +
                                reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
  std::shared_ptr<Regex> regex(new Regex());
  regex->compiled_ = std::make_unique<Compiled>();
  regex->compiled_->code = code;
  regex->pattern_ = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(regex));
}

std::shared_ptr<const Regex> Regex::literal(std::string_view text) {
  std::string quoted = "\\Q";
  // \Q...\E quotes everything but a literal "\E", which is split out.
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'E') {
      quoted += "\\E\\\\E\\Q";
      ++i;
    } else {
      quoted += text[i];
    }
  }
  quoted += "\\E";
  auto r = compile(quoted, Dialect::kOniguruma);
  TG_CHECK(r.ok(), "literal regex failed to compile: {}", r.status().toString());
  return *r;
}

bool Regex::find(std::string_view text, size_t from, size_t* start, size_t* end) const {
  // One match-data block per thread (the pattern's group count is small), freed with the thread.
  struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(32, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  };
  thread_local MatchData data;
  pcre2_match_data* md = data.md;
  const int rc = pcre2_match(compiled_->code, reinterpret_cast<PCRE2_SPTR>(text.data()),
                             text.size(), from, PCRE2_NO_UTF_CHECK, md, nullptr);
  if (rc < 0) return false;  // no match (or a resource limit: treated as no match)
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  *start = ov[0];
  *end = ov[1];
  return true;
}

bool isWordCharacter(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  }
  static const std::shared_ptr<const Regex> word = [] {
    auto r = Regex::compile("^\\w", Regex::Dialect::kRustRegex);
    TG_CHECK(r.ok(), "{}", r.status().toString());
    return *r;
  }();
  std::string s;
  appendUtf8(s, c);
  bool found = false;
  word->forEachMatch(s, [&](size_t, size_t) { found = true; });
  return found;
}

}  // namespace textgen::tokenizer
