// Loading, configuration, errors and truncation.
#include "textgen/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"

namespace textgen::tokenizer {
namespace {

using nlohmann::json;

std::string fixtureJson(const std::string& family) {
  return testing::readText(testing::kFixtures + "/" + family + "/tokenizer.json");
}

TEST(TokenizerTest, LegacyStringMergesLoadTheSame) {
  json j = json::parse(fixtureJson("gpt2"));
  for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  auto legacy = Tokenizer::fromJson(j.dump());
  auto pairs = Tokenizer::fromJson(fixtureJson("gpt2"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_TRUE(pairs.ok());
  for (const char* text :
       {"Hello world", "The quick brown fox jumps over the lazy dog.", "中文 😀"}) {
    EXPECT_EQ((*legacy)->encode(text)->ids, (*pairs)->encode(text)->ids) << text;
  }
}

TEST(TokenizerTest, ConfigTokensAndTgiLlamaOverride) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/llama2");
  ASSERT_TRUE(tok.ok());
  const TokenizerConfig& c = (*tok)->config();
  EXPECT_EQ(c.tokenizerClass, "LlamaTokenizerFast");
  EXPECT_EQ(c.bosToken, "<s>");  // given as an AddedToken object
  EXPECT_EQ(c.eosToken, "</s>");
  EXPECT_EQ(c.addEosToken, true);
  EXPECT_EQ(c.modelMaxLength, 4096u);
  EXPECT_EQ((*tok)->bosTokenId(), 1u);
  EXPECT_EQ((*tok)->eosTokenId(), 2u);
  // tokenizer.json's template adds only <s>; add_eos_token makes TGI append </s> too.
  auto e = (*tok)->encode("hi");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->ids.front(), 1u);
  EXPECT_EQ(e->ids.back(), 2u);
  EXPECT_EQ(e->specialTokensMask.front(), 1);
  EXPECT_TRUE((*tok)->isSpecial(1));
  EXPECT_FALSE((*tok)->isSpecial(e->ids[1]));
}

TEST(TokenizerTest, LlamaOverrideWithoutBosTokenIsAnError) {
  auto tok = Tokenizer::fromJson(fixtureJson("llama2"), R"({"tokenizer_class": "LlamaTokenizer"})");
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("bos_token is missing"), std::string::npos) << tok.status();
}

TEST(TokenizerTest, TruncateLeftKeepsTheEnd) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/llama3");
  ASSERT_TRUE(tok.ok());
  auto e = (*tok)->encode("one two three four five six");
  ASSERT_TRUE(e.ok());
  const Encoding full = *e;
  e->truncateLeft(3);
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ(e->ids, std::vector<uint32_t>(full.ids.end() - 3, full.ids.end()));
  EXPECT_EQ(e->offsets.back(), full.offsets.back());
  e->truncateLeft(10);  // longer than the encoding: unchanged
  EXPECT_EQ(e->size(), 3u);
}

TEST(TokenizerTest, InvalidUtf8IsAnError) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/gpt2");
  ASSERT_TRUE(tok.ok());
  for (std::string bad : {std::string("\xff"), std::string("ab\xc3"), std::string("\xed\xa0\x80"),
                          std::string("\xc0\xaf")}) {
    auto e = (*tok)->encode(bad);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(TokenizerTest, DecodeSkipsUnknownIds) {
  auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/gpt2");
  ASSERT_TRUE(tok.ok());
  auto e = (*tok)->encode("Hello");
  std::vector<uint32_t> ids = e->ids;
  ids.push_back(4000000000u);
  EXPECT_EQ((*tok)->decode(ids), "Hello");
}

struct BadCase {
  const char* what;
  std::string json;
  const char* expected;  // substring of the error
};

TEST(TokenizerTest, MalformedFilesNameComponentAndPath) {
  json base = json::parse(fixtureJson("llama3"));
  std::vector<BadCase> cases;
  auto with = [&](auto edit) {
    json j = base;
    edit(j);
    return j.dump();
  };
  cases.push_back({"not json", "{\"model\": ", "not valid JSON"});
  cases.push_back({"no model", with([](json& j) { j.erase("model"); }), "missing field 'model'"});
  cases.push_back({"unknown pre-tokenizer", with([](json& j) {
                     j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Quantum";
                   }),
                   "/pre_tokenizer/pretokenizers/1: unsupported pre-tokenizer type 'Quantum'"});
  cases.push_back({"bad regex", with([](json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
                   }),
                   "/pre_tokenizer/pretokenizers/0/pattern: invalid regex"});
  cases.push_back({"unknown behavior", with([](json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
                   }),
                   "/pre_tokenizer/pretokenizers/0/behavior: unknown split behavior 'Sideways'"});
  cases.push_back({"merge not in vocab", with([](json& j) {
                     j["model"]["merges"][5] = json::array({"zzzq", "x"});
                   }),
                   "/model/merges/5: merge token 'zzzq' is not in the vocabulary"});
  cases.push_back({"vocab id type", with([](json& j) { j["model"]["vocab"]["a"] = "seven"; }),
                   "/model/vocab: id of 'a' is not a 32-bit unsigned integer"});
  cases.push_back({"unknown decoder", with([](json& j) {
                     j["decoder"] = {{"type", "Telepathy"}};
                   }),
                   "/decoder: unsupported decoder type 'Telepathy'"});
  cases.push_back({"unknown normalizer", with([](json& j) {
                     j["normalizer"] = {{"type", "Sparkle"}};
                   }),
                   "/normalizer: unsupported normalizer type 'Sparkle'"});
  cases.push_back(
      {"template refers to a missing special", with([](json& j) {
         j["post_processor"]["processors"][1]["special_tokens"] = json::object();
       }),
       "/post_processor/processors/1/single/0: special token '<|begin_of_text|>' missing"});
  cases.push_back({"added token without id",
                   with([](json& j) { j["added_tokens"][0].erase("id"); }),
                   "/added_tokens/0: missing or invalid 'id'"});
  cases.push_back({"model type", with([](json& j) { j["model"]["type"] = "Markov"; }),
                   "/model: unsupported model type 'Markov'"});
  for (const BadCase& c : cases) {
    auto tok = Tokenizer::fromJson(c.json);
    ASSERT_FALSE(tok.ok()) << c.what;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(tok.status().message().find(c.expected), std::string::npos)
        << c.what << ": got '" << tok.status().message() << "'";
  }
}

TEST(TokenizerTest, PrecompiledCharsmapCorruptionIsAnError) {
  json j = json::parse(fixtureJson("t5"));
  j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AAAA";  // 3 bytes: no header
  auto tok = Tokenizer::fromJson(j.dump());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("/normalizer/normalizers/0/precompiled_charsmap"),
            std::string::npos)
      << tok.status();
  j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "/////w==";  // trie size 0xffffffff
  tok = Tokenizer::fromJson(j.dump());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("does not fit"), std::string::npos) << tok.status();
}

// Random damage to real files must give an error or a working tokenizer, never a crash.
TEST(TokenizerTest, SurvivesRandomCorruption) {
  std::mt19937 rng(99);
  int loaded = 0, rejected = 0;
  for (const char* family : testing::kFamilies) {
    const std::string text = fixtureJson(family);
    for (int trial = 0; trial < 40; ++trial) {
      std::string damaged = text;
      switch (trial % 3) {
        case 0:  // truncate
          damaged.resize(rng() % damaged.size());
          break;
        case 1:  // flip bytes
          for (int k = 0; k < 20; ++k) damaged[rng() % damaged.size()] = static_cast<char>(rng());
          break;
        default: {  // change one value's type deep inside
          json j = json::parse(text);
          const std::vector<std::string> keys{"normalizer", "pre_tokenizer", "post_processor",
                                              "decoder", "model"};
          json& target = j[keys[rng() % keys.size()]];
          if (target.is_object() && !target.empty()) {
            auto it = target.begin();
            std::advance(it, rng() % target.size());
            *it = (rng() % 2) ? json(12345) : json::array({json(nullptr)});
          }
          damaged = j.dump();
        }
      }
      auto tok = Tokenizer::fromJson(damaged);
      if (!tok.ok()) {
        ++rejected;
        continue;
      }
      ++loaded;
      auto e = (*tok)->encode("Hello world, 中文 😀 <s> 123");
      if (e.ok()) (void)(*tok)->decode(e->ids);
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, 11 * 40);
}

}  // namespace
}  // namespace textgen::tokenizer
