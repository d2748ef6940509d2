// Property: for random id sequences, the concatenation of every step() and flush() equals
// decode(all ids), and no step ever ends inside a UTF-8 character.
#include "textgen/tokenizer/incremental_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace textgen::tokenizer {
namespace {

bool validUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

class IncrementalDecoderTest : public ::testing::TestWithParam<const char*> {};

TEST_P(IncrementalDecoderTest, ConcatenationEqualsFullDecode) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  std::mt19937 rng(1234);
  const auto vocab = static_cast<uint32_t>(t.vocabSize());
  // Bias towards byte tokens and specials, where streaming is hardest.
  std::vector<uint32_t> interesting;
  for (uint32_t id = 0; id < vocab; ++id) {
    auto s = t.idToToken(id);
    if (t.isSpecial(id) || (s && s->rfind("<0x", 0) == 0) || (s && s->size() <= 2))
      interesting.push_back(id);
  }
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint32_t> ids(std::uniform_int_distribution<int>(1, 40)(rng));
    for (auto& id : ids) {
      id = (rng() % 2 && !interesting.empty()) ? interesting[rng() % interesting.size()]
                                               : rng() % vocab;
    }
    for (bool skip : {false, true}) {
      IncrementalDecoder d(t, skip);
      std::string streamed;
      for (uint32_t id : ids) {
        const std::string piece = d.step(id);
        ASSERT_TRUE(validUtf8(piece));
        streamed += piece;
      }
      streamed += d.flush();
      ASSERT_EQ(streamed, t.decode(ids, skip))
          << "family " << GetParam() << ", trial " << trial << (skip ? " (skip special)" : "");
    }
  }
}

TEST_P(IncrementalDecoderTest, WithPromptContextMatchesDecodeDifference) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/" + GetParam());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  auto prompt = t.encode("The quick brown fox", false);
  auto gen = t.encode(" jumps over the lazy dog. 中文 😀 done", false);
  ASSERT_TRUE(prompt.ok() && gen.ok());
  IncrementalDecoder d(t, false, prompt->ids);
  std::string streamed;
  for (uint32_t id : gen->ids) streamed += d.step(id);
  streamed += d.flush();
  std::vector<uint32_t> all = prompt->ids;
  all.insert(all.end(), gen->ids.begin(), gen->ids.end());
  const std::string full = t.decode(all), head = t.decode(prompt->ids);
  ASSERT_EQ(full.compare(0, head.size(), head), 0);
  EXPECT_EQ(streamed, full.substr(head.size()));
}

TEST(IncrementalDecoderBytesTest, HoldsIncompleteCharacters) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/llama2");
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  // "€" = E2 82 AC as three byte-fallback tokens: held while the run of byte tokens lasts, since
  // ByteFallback renders the run as a unit; released by the next ordinary token.
  IncrementalDecoder d(t);
  EXPECT_EQ(d.step(*t.tokenToId("<0xE2>")), "");
  EXPECT_EQ(d.step(*t.tokenToId("<0x82>")), "");
  EXPECT_EQ(d.step(*t.tokenToId("<0xAC>")), "");
  EXPECT_EQ(d.step(*t.tokenToId("</s>")), "€</s>");
  // A dangling lead byte is held, and flushed as U+FFFD at the end, as decode() renders it.
  EXPECT_EQ(d.step(*t.tokenToId("<0xE2>")), "");
  EXPECT_EQ(d.flush(), "\xef\xbf\xbd");
  // "x" then a stray continuation byte: decode renders both bytes as U+FFFD, so "x" must not have
  // been streamed early.
  IncrementalDecoder e(t);
  EXPECT_EQ(e.step(*t.tokenToId("<0x78>")), "");
  EXPECT_EQ(e.step(*t.tokenToId("<0xB6>")), "");
  EXPECT_EQ(e.flush(), "\xef\xbf\xbd\xef\xbf\xbd");
}

INSTANTIATE_TEST_SUITE_P(Families, IncrementalDecoderTest, ::testing::ValuesIn(testing::kFamilies),
                         testing::familyTestName);

}  // namespace
}  // namespace textgen::tokenizer
