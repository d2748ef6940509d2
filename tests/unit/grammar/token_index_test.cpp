// TokenIndex, Matcher and GrammarCache over synthetic vocabularies: masks equal a brute-force
// walk of every token, EOS rules, accept/advance, threads.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "mask_check.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {
namespace {

// Printable ASCII singles and pairs, some multi-byte UTF-8, a few long tokens, specials, EOS.
std::shared_ptr<const Vocabulary> syntheticVocab(size_t extra = 0) {
  std::vector<std::optional<std::string>> bytes;
  bytes.push_back(std::nullopt);         // 0: a special token
  bytes.push_back(std::string("</s>"));  // 1: EOS (its bytes are ignored)
  bytes.push_back(std::string());        // 2: empty
  for (int c = 32; c < 127; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  for (const char* s :
       {"\"",  "{\"", "\":",           "\",",   "\"}", "true", "false", "null", "name",
        "age", " \"", ", \"",          "12",    "3.5", "é",    "\xc3",  "\xa9", "中文",
        "\n",  "  ",  "{\"name\": \"", "\"}\n", "ab",  "abc",  "bc",    "[1,",  "2]",
        "]",   "}}"}) {
    bytes.push_back(std::string(s));
  }
  std::mt19937 rng(3);
  for (size_t i = 0; i < extra; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < len; ++k) s.push_back(static_cast<char>(32 + rng() % 95));
    bytes.push_back(s);
  }
  return Vocabulary::create(std::move(bytes), {1});
}

std::shared_ptr<const Grammar> compile(Kind kind, std::string_view src) {
  auto g = Grammar::compile(kind, src);
  EXPECT_TRUE(g.ok()) << g.status();
  return *g;
}

TEST(TokenIndexTest, MasksEqualBruteForce) {
  auto vocab = syntheticVocab(500);
  for (
      auto [kind, src] : std::vector<std::pair<Kind, const char*>>{
          {Kind::kRegex, "[a-c]{1,4}"},
          {Kind::kRegex, "(true|false|null)"},
          {Kind::kRegex, "é+中文"},
          {Kind::kJsonSchema,
           R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})"},
          {Kind::kJsonSchema, R"({"type":"array","items":{"enum":[1,2,3.5]}})"},
      }) {
    TokenIndex index(compile(kind, src), vocab);
    testing::expectMasksMatchBruteForce(index);
  }
}

TEST(TokenIndexTest, EosRules) {
  auto vocab = syntheticVocab();
  // "ab" accepting after "ab", and "abc" can continue: EOS allowed in accepting states only.
  auto index = std::make_shared<TokenIndex>(compile(Kind::kRegex, "ab(c)?"), vocab);
  const int32_t s0 = index->grammar().start();
  EXPECT_FALSE(index->allows(s0, 1));
  const int32_t sAb = index->advance(
      s0, *[&] {
        for (uint32_t id = 0; id < vocab->size(); ++id)
          if (vocab->bytes(id) == std::optional<std::string>("ab"))
            return std::optional<uint32_t>(id);
        return std::optional<uint32_t>();
      }());
  ASSERT_NE(sAb, Grammar::kDead);
  EXPECT_TRUE(index->allows(sAb, 1));
  EXPECT_EQ(index->advance(sAb, 1), sAb);  // EOS leaves the state
  EXPECT_FALSE(index->allows(s0, 0));      // no bytes: never
  EXPECT_FALSE(index->allows(s0, 2));      // empty bytes: never
  // A state where no token fits: only a 3-byte character no token spells; EOS is the way out.
  auto stuck = std::make_shared<TokenIndex>(compile(Kind::kRegex, "☃"), vocab);
  std::vector<uint32_t> words(vocab->maskWords());
  stuck->fillMask(stuck->grammar().start(), words);
  EXPECT_EQ(words[0] & 2u, 2u);
}

TEST(TokenIndexTest, MatcherAcceptsAndEnds) {
  auto vocab = syntheticVocab();
  auto find = [&](const char* s) {
    for (uint32_t id = 0; id < vocab->size(); ++id)
      if (vocab->bytes(id) == std::optional<std::string>(s)) return id;
    return uint32_t{0};
  };
  auto index = std::make_shared<const TokenIndex>(
      compile(Kind::kJsonSchema,
              R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})"),
      vocab);
  Matcher m(index);
  EXPECT_FALSE(m.accepting());
  Status bad = m.accept(find("["));
  EXPECT_EQ(bad.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.message().find("may not come next"), std::string::npos) << bad;
  for (const char* t : {"{\"", "name", "\":", "\"", "a", "b", "\"}"}) {
    ASSERT_TRUE(m.allows(find(t))) << t;
    ASSERT_TRUE(m.accept(find(t)).ok()) << t;
  }
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.ended());
  ASSERT_TRUE(m.accept(1).ok());
  EXPECT_TRUE(m.ended());
  EXPECT_EQ(m.accept(find("a")).code(), StatusCode::kFailedPrecondition);
  std::vector<uint32_t> words(vocab->maskWords());
  m.fillMask(words);
  EXPECT_EQ(words[0], 2u);  // only EOS after the end
}

TEST(TokenIndexTest, ThreadsFillMasksConcurrently) {
  auto vocab = syntheticVocab(3000);
  auto index = std::make_shared<const TokenIndex>(compile(Kind::kJsonSchema, "{}"), vocab);
  const size_t n = index->grammar().numStates();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint32_t> words(vocab->maskWords());
      for (size_t i = 0; i < 300; ++i) {
        const auto s = static_cast<int32_t>((i * 7 + t * 13) % n);
        index->fillMask(s, words);
        if (words != testing::bruteForceMask(*index, s)) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// warm() computes masks ahead, nearest the start first, once: the masks are the same as computed on
// demand, a second run computes none, a set stop flag computes none, and it can run while requests
// fill masks.
TEST(TokenIndexTest, WarmComputesMasksAheadOnce) {
  auto vocab = syntheticVocab(500);
  auto index = std::make_shared<const TokenIndex>(
      compile(
          Kind::kJsonSchema,
          R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"enum":["a","b"]}}}})"),
      vocab);
  std::atomic<bool> stop{true};
  EXPECT_EQ(index->warm(1000, stop), 0u);
  stop = false;
  std::vector<uint32_t> words(vocab->maskWords());
  std::thread filler([&] {
    for (int i = 0; i < 200; ++i) index->fillMask(i % 7, words);
  });
  const size_t computed = index->warm(1000, stop);
  filler.join();
  EXPECT_GT(computed, 10u);
  EXPECT_LE(computed, index->grammar().numStates());
  EXPECT_EQ(index->warm(1000, stop), 0u);  // all there already
  testing::expectMasksMatchBruteForce(*index);
  // A bound on the states: at most that many.
  auto fresh = std::make_shared<const TokenIndex>(compile(Kind::kJsonSchema, "{}"), vocab);
  EXPECT_LE(fresh->warm(5, stop), 5u);
}

TEST(GrammarCacheTest, CachesAndEvicts) {
  auto vocab = syntheticVocab();
  GrammarCache cache(vocab, 2);
  auto a = cache.grammar(Kind::kRegex, "a+");
  ASSERT_TRUE(a.ok());
  auto a2 = cache.grammar(Kind::kRegex, "a+");
  EXPECT_EQ(a->get(), a2->get());
  auto sameTextOtherKind = cache.grammar(Kind::kJsonSchema, "a+");
  EXPECT_FALSE(sameTextOtherKind.ok());  // not JSON; and a failure is not cached
  auto ia = cache.index(Kind::kRegex, "a+");
  ASSERT_TRUE(ia.ok());
  EXPECT_EQ(&(*ia)->grammar(), a->get());
  EXPECT_EQ(ia->get(), cache.index(Kind::kRegex, "a+")->get());
  ASSERT_TRUE(cache.grammar(Kind::kRegex, "b+").ok());
  ASSERT_TRUE(cache.grammar(Kind::kRegex, "c+").ok());  // evicts a+
  auto a3 = cache.grammar(Kind::kRegex, "a+");
  EXPECT_NE(a3->get(), a->get());
  GrammarCache noVocab;
  EXPECT_EQ(noVocab.index(Kind::kRegex, "a").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache.grammar(Kind::kRegex, "(").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace textgen::grammar
