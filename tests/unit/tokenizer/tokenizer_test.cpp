// Loading, configuration, errors and truncation.
#include "textgen/tokenizer/tokenizer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

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

// SentencePiece-style BPE merges the parts of a text between "▁"s alone (models.cpp) only when no
// merge crosses into a "▁" from another character. A model with such a merge ("a" + "▁b") keeps the
// whole-text merge order, and its one token for "a b"; without it, the parts give what the whole
// text gives.
TEST(TokenizerTest, BpeMergesAcrossASpaceKeepTheWholeTextOrder) {
  auto make = [](const json& merges) {
    json j = json::parse(fixtureJson("llama2"));
    j["added_tokens"] =
        json::array({j["added_tokens"][0], j["added_tokens"][1], j["added_tokens"][2]});
    j["model"]["byte_fallback"] = false;
    j["model"]["vocab"] = {
        {"<unk>", 0}, {"<s>", 1},     {"</s>", 2},     {"\u2581", 3},         {"a", 4},
        {"b", 5},     {"\u2581b", 6}, {"a\u2581b", 7}, {"\u2581a\u2581b", 8}, {"\u2581a", 9}};
    j["model"]["merges"] = merges;
    auto tok = Tokenizer::fromJson(j.dump());
    EXPECT_TRUE(tok.ok()) << tok.status();
    return std::move(*tok);
  };
  const std::string sp = "\u2581";
  auto crossing = make(json::array(
      {json::array({sp, "b"}), json::array({"a", sp + "b"}), json::array({sp, "a" + sp + "b"})}));
  EXPECT_EQ(crossing->encode("a b", false)->ids, (std::vector<uint32_t>{8}));
  EXPECT_EQ(crossing->encode("a b a b", false)->ids, (std::vector<uint32_t>{8, 8}));
  auto parts = make(json::array({json::array({sp, "b"}), json::array({sp, "a"})}));
  const auto e = parts->encode("a b  a", false);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->ids, (std::vector<uint32_t>{9, 6, 3, 9}));
  ASSERT_EQ(e->offsets.size(), 4u);
  EXPECT_EQ(e->offsets[1], (std::pair<uint32_t, uint32_t>{1, 3}));  // " b" in the text
  EXPECT_EQ(e->offsets[3], (std::pair<uint32_t, uint32_t>{4, 6}));
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
  // A nested class is a union (BLOOM's pattern, in the bloom fixture); a negated one is refused.
  cases.push_back({"negated nested class", with([](json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a[^b]]+";
                   }),
                   "a negated class inside a class is not supported"});
  cases.push_back({"unknown behavior", with([](json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
                   }),
                   "/pre_tokenizer/pretokenizers/0/behavior: unknown split behavior 'Sideways'"});
  cases.push_back({"merge not in vocab", with([](json& j) {
                     j["model"]["merges"][5] = json::array({"zzzq", "x"});
                   }),
                   "/model/merges/5: merge token 'zzzq' is not in the vocabulary"});
  cases.push_back({"vocab id type", with([](json& j) { j["model"]["vocab"]["a"] = "seven"; }),
                   "/model/vocab: id of 'a' is not an integer in [0, 16777216)"});
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
                   "/added_tokens/0: missing 'id', or not an integer in [0, 16777216)"});
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

// A load error must come from the loader's own checks (a code and a message naming the file),
// never from the backstop that catches a library exception.
void expectCleanRejection(const Status& s, const std::string& what) {
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnimplemented)
      << what << ": " << s;
  EXPECT_EQ(s.message().find("json.exception"), std::string::npos) << what << ": " << s;
  EXPECT_EQ(s.message().rfind("tokenizer", 0), 0u) << what << ": " << s;
}

// Random damage to real files must give a clean error or a working tokenizer, never a crash.
TEST(TokenizerTest, SurvivesRandomCorruption) {
  std::mt19937 rng(99);
  int rejected[3] = {0, 0, 0};
  int families = 0;
  for (const char* family : testing::kFamilies) {
    const std::string text = fixtureJson(family);
    if (text.empty()) continue;  // opt-slow: no tokenizer.json (slow_tokenizer_test damages it)
    ++families;
    for (int trial = 0; trial < 40; ++trial) {
      std::string damaged = text;
      const std::string what = std::string(family) + " trial " + std::to_string(trial);
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
        ++rejected[trial % 3];
        expectCleanRejection(tok.status(), what);
        continue;
      }
      // What loads must encode valid text or say why, and decode what it encoded.
      auto e = (*tok)->encode("Hello world, 中文 😀 <s> 123");
      if (!e.ok()) continue;  // e.g. a vocabulary left without its unknown token
      EXPECT_EQ(e->ids.size(), e->offsets.size()) << what;
      (void)(*tok)->decode(e->ids);
    }
  }
  // A truncated JSON document never loads; most retyped components do not either.
  EXPECT_EQ(rejected[0], families * 14) << "every truncated file must be rejected";
  EXPECT_GT(rejected[2], 0);
}

// Nesting is bounded while parsing, so neither a deep JSON value nor a deep chain of Sequence
// components can exhaust the stack (each level of a Sequence recurses in the loader).
TEST(TokenizerTest, DeepNestingIsAnError) {
  const std::string base = fixtureJson("llama2");
  auto withNormalizer = [&](const std::string& normalizer) {
    json j = json::parse(base);
    j["normalizer"] = "PLACEHOLDER";
    std::string text = j.dump();
    text.replace(text.find("\"PLACEHOLDER\""), 13, normalizer);
    return text;
  };
  const int depth = 100000;
  std::string arrays = std::string(depth, '[') + std::string(depth, ']');
  std::string sequences;
  for (int i = 0; i < depth; ++i) sequences += R"({"type":"Sequence","normalizers":[)";
  sequences += R"({"type":"Lowercase"})";
  for (int i = 0; i < depth; ++i) sequences += "]}";
  for (const std::string* deep : {&arrays, &sequences}) {
    auto tok = Tokenizer::fromJson(withNormalizer(*deep));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(tok.status().message(), "tokenizer.json nests deeper than 64 levels");
  }
  auto tok = Tokenizer::fromJson(base, "{\"bos_token\":" + arrays + "}");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().message(), "tokenizer_config.json nests deeper than 64 levels");
  // A shallow Sequence still loads.
  tok = Tokenizer::fromJson(withNormalizer(
      R"({"type":"Sequence","normalizers":[{"type":"Sequence","normalizers":[]}]})"));
  EXPECT_TRUE(tok.ok()) << tok.status();
}

TEST(TokenizerTest, HugeTokenIdsAreErrorsNotAllocations) {
  // The reverse vocabulary is dense: an id of 2^32-1 wrapped its size to 0 and wrote out of bounds
  // (a SIGSEGV loading router and shard alike), and an id of 10^8 took a gigabyte.
  const std::string base = fixtureJson("llama2");
  for (uint64_t id : {uint64_t{4294967295}, uint64_t{100000000}, uint64_t{1} << 24}) {
    json vocab = json::parse(base);
    vocab["model"]["vocab"]["<unk>"] = id;
    auto tok = Tokenizer::fromJson(vocab.dump());
    ASSERT_FALSE(tok.ok()) << id;
    EXPECT_NE(tok.status().message().find("is not an integer in [0, 16777216)"), std::string::npos)
        << tok.status().message();
    json added = json::parse(base);
    added["added_tokens"][0]["id"] = id;
    tok = Tokenizer::fromJson(added.dump());
    ASSERT_FALSE(tok.ok()) << id;
  }
  json ok = json::parse(base);
  ok["model"]["vocab"]["<unk>"] = (uint64_t{1} << 24) - 1;
  EXPECT_TRUE(Tokenizer::fromJson(ok.dump()).ok());
}

TEST(TokenizerTest, WrongTypesNameThePath) {
  json base = json::parse(fixtureJson("llama3"));
  auto with = [&](auto edit) {
    json j = base;
    edit(j);
    return j.dump();
  };
  std::vector<BadCase> cases;
  cases.push_back(
      {"special id past 32 bits", with([](json& j) {
         j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"][0] =
             uint64_t{1} << 33;
       }),
       "/post_processor/processors/1/special_tokens/<|begin_of_text|>: ids must be "
       "32-bit"});
  cases.push_back(
      {"special ids a string", with([](json& j) {
         j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"][0] =
             "one";
       }),
       "ids must be 32-bit"});
  cases.push_back({"model a number", with([](json& j) { j["model"] = 7; }),
                   "tokenizer.json /model: expected an object"});
  cases.push_back({"added_tokens an object",
                   with([](json& j) { j["added_tokens"] = json::object(); }),
                   "/added_tokens: expected an array"});
  cases.push_back({"pre_tokenizers a string",
                   with([](json& j) { j["pre_tokenizer"]["pretokenizers"] = "none"; }),
                   "/pre_tokenizer/pretokenizers: expected an array"});
  for (const BadCase& c : cases) {
    auto tok = Tokenizer::fromJson(c.json);
    ASSERT_FALSE(tok.ok()) << c.what;
    expectCleanRejection(tok.status(), c.what);
    EXPECT_NE(tok.status().message().find(c.expected), std::string::npos)
        << c.what << ": got '" << tok.status().message() << "'";
  }
}

// A FIFO (or any non-regular file) in a tokenizer directory is an error naming it, at once: a
// blocking open would wait for a writer forever. Should it block, the watchdog opens the write end
// after 3 s so that the test fails instead of hanging.
TEST(TokenizerTest, FifoInTheDirectoryIsRefusedWithoutBlocking) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("textgen-tok-fifo-" + std::to_string(getpid()));
  for (const char* fifoName : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(testing::kFixtures + "/gpt2/tokenizer.json", dir / "tokenizer.json");
    fs::remove(dir / fifoName);
    const std::string fifo = (dir / fifoName).string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::atomic<bool> done{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 300 && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      while (!done) {
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    const auto start = std::chrono::steady_clock::now();
    auto tok = Tokenizer::fromDirectory(dir.string());
    const auto took = std::chrono::steady_clock::now() - start;
    done = true;
    watchdog.join();
    EXPECT_LT(took, std::chrono::seconds(2)) << fifoName;
    ASSERT_FALSE(tok.ok()) << fifoName;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << fifoName;
    EXPECT_EQ(tok.status().message(), fifo + ": is a FIFO, not a regular file");
  }
  fs::remove_all(dir);
}

// Whatever bytes come in, encode answers: tokens for valid UTF-8, INVALID_ARGUMENT otherwise.
TEST(TokenizerTest, EncodeTakesArbitraryBytes) {
  std::mt19937 rng(7);
  for (const char* family : testing::kFamilies) {
    auto tok = Tokenizer::fromDirectory(testing::kFixtures + "/" + family);
    ASSERT_TRUE(tok.ok()) << family << ": " << tok.status();
    for (int trial = 0; trial < 200; ++trial) {
      std::string bytes(rng() % 64, '\0');
      for (char& b : bytes) b = static_cast<char>(trial % 2 ? rng() : 0x20 + rng() % 0x60);
      auto e = (*tok)->encode(bytes);
      if (!e.ok()) {
        EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << family << ": " << e.status();
        continue;
      }
      for (const auto& [begin, end] : e->offsets) {
        EXPECT_LE(begin, end) << family;
        EXPECT_LE(end, bytes.size()) << family;
      }
    }
    // A long input without a single space or newline: one pre-token of 256 KiB.
    std::string longWord(256 << 10, 'a');
    for (size_t i = 0; i < longWord.size(); i += 7) longWord[i] = static_cast<char>('b' + i % 20);
    auto e = (*tok)->encode(longWord);
    ASSERT_TRUE(e.ok()) << family << ": " << e.status();
    EXPECT_GT(e->ids.size(), 0u) << family;
  }
}

}  // namespace
}  // namespace textgen::tokenizer
