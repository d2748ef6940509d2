// Regex to byte DFA: full-match tables, Unicode classes, bounds, refused constructs.
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {
namespace {

std::shared_ptr<const Grammar> compile(std::string_view re, const Limits& limits = {}) {
  auto g = Grammar::compile(Kind::kRegex, re, limits);
  EXPECT_TRUE(g.ok()) << re << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

struct Case {
  const char* regex;
  std::vector<const char*> yes;
  std::vector<const char*> no;
};

TEST(RegexTest, MatchTable) {
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"a|b|cd", {"a", "b", "cd"}, {"", "c", "ab"}},
      {"a*", {"", "a", "aaaa"}, {"b", "ab"}},
      {"a+b?", {"a", "ab", "aaab"}, {"", "b", "abb"}},
      {"(ab)+", {"ab", "abab"}, {"", "a", "aba"}},
      {"(?:x|y)z", {"xz", "yz"}, {"z", "xyz"}},
      {"a{3}", {"aaa"}, {"aa", "aaaa"}},
      {"a{2,}", {"aa", "aaaaa"}, {"a", ""}},
      {"a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"}},
      {"a{,2}", {"", "a", "aa"}, {"aaa"}},
      {"a{0}", {""}, {"a"}},
      {"a*?b+?c??", {"b", "aabbc"}, {"", "c"}},
      {"[a-c]x", {"ax", "bx", "cx"}, {"dx", "x"}},
      {R"([^"\\]*)", {"", "abc", "é"}, {"\"", "\\"}},
      {R"(\d+\.\d*)", {"1.", "12.5"}, {".5", "a.1"}},
      {R"(\w+)", {"a_Z9"}, {"a-b", ""}},
      {R"(\s)", {" ", "\t", "\n"}, {"a"}},
      {R"(\D\W\S)", {"a-b"}, {"1-b", "aab", "a- "}},
      {R"(\.\\\n\t\r)", {".\\\n\t\r"}, {"a\\\n\t\r"}},
      {R"(\x41\u00e9\u{1F600})", {"Aé😀"}, {"Ae😀"}},
      {"^abc$", {"abc"}, {"abc$", "^abc"}},
      {R"(a\$)", {"a$"}, {"a"}},
      {"a{b", {"a{b"}, {"ab"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"[a-]", {"a", "-"}, {"b"}},
      {"(a|)b", {"ab", "b"}, {"a"}},
      {"()", {""}, {"a"}},
      {"", {""}, {"a"}},
      {"(?P<name>a)b", {"ab"}, {"b"}},
      {"[\\d_]+", {"1_2"}, {"a"}},
  };
  for (const Case& c : cases) {
    auto g = compile(c.regex);
    ASSERT_TRUE(g) << c.regex;
    for (const char* y : c.yes) EXPECT_TRUE(g->matches(y)) << c.regex << " should match " << y;
    for (const char* n : c.no) EXPECT_FALSE(g->matches(n)) << c.regex << " should not match " << n;
  }
}

TEST(RegexTest, UnicodeAndUtf8) {
  auto dot = compile(".");
  EXPECT_TRUE(dot->matches("a"));
  EXPECT_TRUE(dot->matches("é"));
  EXPECT_TRUE(dot->matches("中"));
  EXPECT_TRUE(dot->matches("😀"));
  EXPECT_FALSE(dot->matches("\n"));
  EXPECT_FALSE(dot->matches("ab"));
  EXPECT_FALSE(dot->matches("\xff"));              // not UTF-8
  EXPECT_FALSE(dot->matches("\xc3"));              // truncated
  EXPECT_FALSE(dot->matches("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(dot->matches("\xc0\xaf"));          // overlong
  EXPECT_FALSE(dot->matches("\xf4\x90\x80\x80"));  // past U+10FFFF
  auto greek = compile("[α-ω]+");
  EXPECT_TRUE(greek->matches("αβγω"));
  EXPECT_FALSE(greek->matches("a"));
  EXPECT_FALSE(greek->matches("Ω"));
  auto notAscii = compile("[^a-z]");
  EXPECT_TRUE(notAscii->matches("Ω"));
  EXPECT_TRUE(notAscii->matches("\U0010FFFF"));
  EXPECT_FALSE(notAscii->matches("q"));
  // Boundaries of every UTF-8 length.
  auto range = compile("[\\u007f-\\u0800]");
  for (const char* s : {"\x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80"})
    EXPECT_TRUE(range->matches(s));
  EXPECT_FALSE(range->matches("\xe0\xa0\x81"));
  auto wide = compile("[\\u{10000}-\\u{10FFFF}]");
  EXPECT_TRUE(wide->matches("\xf0\x90\x80\x80"));
  EXPECT_TRUE(wide->matches("\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(wide->matches("\xef\xbf\xbf"));
}

TEST(RegexTest, RandomWalksMatch) {
  std::mt19937 rng(7);
  for (const char* re :
       {"[a-z]{2,5}(,[0-9]+)*", ".{0,3}x", R"("([^"\\]|\\.)*")", "(ab|a)(c|bcd)"}) {
    auto g = compile(re);
    for (int i = 0; i < 100; ++i) {
      const std::string s = testing::randomWalk(*g, rng);
      EXPECT_TRUE(g->matches(s)) << re << ": " << s;
    }
  }
}

TEST(RegexTest, TrimmedAndMinimized) {
  auto g = compile("(a|b)*abb");
  // Every state reaches acceptance: from each state, some byte path ends accepting.
  EXPECT_LE(g->numStates(), 4u);  // the minimal DFA of (a|b)*abb has 4 states
  auto shared = compile("(abc|xbc)");
  EXPECT_LE(shared->numStates(), 4u);
}

struct Bad {
  const char* regex;
  StatusCode code;
  const char* fragment;
};

TEST(RegexTest, RefusedConstructs) {
  const std::vector<Bad> cases = {
      {"(a)\\1", StatusCode::kInvalidArgument, "backreference is not supported at offset 3"},
      {"(?P=x)", StatusCode::kInvalidArgument, "backreference"},
      {"\\k<x>", StatusCode::kInvalidArgument, "backreference"},
      {"a(?=b)", StatusCode::kInvalidArgument, "lookaround assertion is not supported at offset 1"},
      {"a(?!b)", StatusCode::kInvalidArgument, "lookaround"},
      {"(?<=a)b", StatusCode::kInvalidArgument, "lookaround"},
      {"(?<!a)b", StatusCode::kInvalidArgument, "lookaround"},
      {"(?i)a", StatusCode::kInvalidArgument, "inline flags"},
      {"(?>a)", StatusCode::kInvalidArgument, "atomic group"},
      {"\\bword", StatusCode::kInvalidArgument, "word boundary"},
      {"a\\B", StatusCode::kInvalidArgument, "word boundary"},
      {"\\Aa", StatusCode::kInvalidArgument, "anchor"},
      {"a^b", StatusCode::kInvalidArgument,
       "'^' anchor inside the pattern is not supported at offset 1"},
      {"a$b", StatusCode::kInvalidArgument, "'$' anchor"},
      {"\\p{L}", StatusCode::kInvalidArgument, "Unicode property class"},
      {"a**", StatusCode::kInvalidArgument, "multiple repeat"},
      {"a++", StatusCode::kInvalidArgument, "possessive"},
      {"*a", StatusCode::kInvalidArgument, "nothing to repeat"},
      {"(ab", StatusCode::kInvalidArgument, "unterminated group"},
      {"ab)", StatusCode::kInvalidArgument, "unmatched ')' at offset 2"},
      {"[ab", StatusCode::kInvalidArgument, "unterminated character class"},
      {"[z-a]", StatusCode::kInvalidArgument, "bad range"},
      {"a{3,2}", StatusCode::kInvalidArgument, "m > n"},
      {"\\q", StatusCode::kInvalidArgument, "unknown escape"},
      {"a\\", StatusCode::kInvalidArgument, "trailing backslash"},
      {"\\xZZ", StatusCode::kInvalidArgument, "hexadecimal"},
      {"\\ud800", StatusCode::kInvalidArgument, "surrogate"},
      {"\xff", StatusCode::kInvalidArgument, "invalid UTF-8"},
      {"[^\\x00-\\u{10FFFF}]", StatusCode::kInvalidArgument, "matches no text"},
  };
  for (const Bad& c : cases) {
    auto g = Grammar::compile(Kind::kRegex, c.regex);
    ASSERT_FALSE(g.ok()) << c.regex;
    EXPECT_EQ(g.status().code(), c.code) << c.regex << ": " << g.status();
    EXPECT_NE(g.status().message().find(c.fragment), std::string::npos)
        << c.regex << ": " << g.status();
  }
}

TEST(RegexTest, LimitsAreEnforced) {
  auto huge = Grammar::compile(Kind::kRegex, "a{1,100000}");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("maxDfaStates"), std::string::npos) << huge.status();

  auto nfa = Grammar::compile(Kind::kRegex, "(abcdefghij){1,100000}");
  ASSERT_FALSE(nfa.ok());
  EXPECT_EQ(nfa.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(nfa.status().message().find("maxNfaStates"), std::string::npos) << nfa.status();

  auto nested = Grammar::compile(Kind::kRegex, "((a{1000}){1000}){1000}");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("maxNfaStates"), std::string::npos) << nested.status();

  auto count = Grammar::compile(Kind::kRegex, "a{99999999999999999999}");
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.status().code(), StatusCode::kResourceExhausted) << count.status();

  const std::string deep = std::string(1000, '(') + "a" + std::string(1000, ')');
  auto depth = Grammar::compile(Kind::kRegex, deep);
  ASSERT_FALSE(depth.ok());
  EXPECT_EQ(depth.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(depth.status().message().find("nest"), std::string::npos) << depth.status();

  Limits small;
  small.maxSourceBytes = 4;
  auto big = Grammar::compile(Kind::kRegex, "abcde", small);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("maxSourceBytes"), std::string::npos);

  // The subset construction's classic blow-up: (a|b)*a(a|b){n} needs 2^n states.
  auto blowup = Grammar::compile(Kind::kRegex, "(a|b)*a(a|b){20}");
  ASSERT_FALSE(blowup.ok());
  EXPECT_NE(blowup.status().message().find("maxDfaStates"), std::string::npos) << blowup.status();
}

}  // namespace
}  // namespace textgen::grammar
