// A slow GPT2Tokenizer's files (vocab.json + merges.txt, as Hub OPT checkpoints ship them) without
// tokenizer.json: what transformers builds from them (the opt-slow fixture checks encodings), and
// every malformed file refused with an error that names it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "textgen/base/file.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Byte-level symbols: "a", "b", "Ġ" (the space), and the merges "a b", "Ġ ab".
const std::string kVocab =
    R"({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4, "b": 5, "\u0120": 6, "ab": 7,
        "\u0120ab": 8})";
const std::string kMerges = "#version: 0.2\na b\n\u0120 ab\n";
const std::string kOptConfig = R"({"errors": "replace",
  "bos_token": {"content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": true, "__type": "AddedToken"},
  "eos_token": {"content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": true, "__type": "AddedToken"},
  "unk_token": {"content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": true, "__type": "AddedToken"},
  "pad_token": {"content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": true, "__type": "AddedToken"},
  "add_prefix_space": false, "add_bos_token": true})";

StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& vocab, const std::string& merges,
                                          const std::string& config = kOptConfig,
                                          const std::string& map = {}) {
  return Tokenizer::fromGpt2Files({vocab, merges, config, map});
}

std::vector<uint32_t> ids(const Tokenizer& t, const std::string& text, bool special = true) {
  auto e = t.encode(text, special);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? e->ids : std::vector<uint32_t>{};
}

TEST(SlowTokenizerTest, BuildsOptsTokenizer) {
  auto tok = load(kVocab, kMerges);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(ids(t, "ab ab"), (std::vector<uint32_t>{2, 7, 8}));  // </s> leads, as OPT's bos
  EXPECT_EQ(ids(t, "ab ab", false), (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(ids(t, "ab</s><pad>", false), (std::vector<uint32_t>{7, 2, 1}));  // added tokens
  EXPECT_TRUE(t.isSpecial(2));
  EXPECT_TRUE(t.isSpecial(1));
  EXPECT_FALSE(t.isSpecial(0));  // <s> and <unk> stay plain vocabulary, as in transformers
  EXPECT_EQ(t.decode(std::vector<uint32_t>{2, 7, 8}, true), "ab ab");
  EXPECT_EQ(t.decode(std::vector<uint32_t>{0, 7}, true), "<s>ab");
  EXPECT_EQ(t.bosTokenId(), 2u);
  EXPECT_EQ(t.eosTokenId(), 2u);
  EXPECT_EQ(t.vocabSize(), 9u);
}

TEST(SlowTokenizerTest, FollowsTransformersForTheConfigsOptions) {
  // No tokenizer_config.json: GPT2Tokenizer's "<|endoftext|>" bos/eos/unk, added after the
  // vocabulary; add_bos_token defaults to false.
  auto plain = load(kVocab, kMerges, "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->tokenToId("<|endoftext|>"), 9u);
  EXPECT_TRUE((*plain)->isSpecial(9));
  EXPECT_EQ(ids(**plain, "ab"), (std::vector<uint32_t>{7}));

  // add_prefix_space, add_eos_token, string tokens, extra special tokens (ids in order, one past
  // the vocabulary), added_tokens_decoder (ids given there are not kept, as in transformers).
  json c = json::parse(kOptConfig);
  c["add_prefix_space"] = true;
  c["add_eos_token"] = true;
  c["mask_token"] = "<mask>";
  c["additional_special_tokens"] = {"<|x|>", "<s>"};
  c["added_tokens_decoder"] = {
      {"40", {{"content", "<|new|>"}, {"special", false}, {"normalized", false}}}};
  auto tok = load(kVocab, kMerges, c.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.tokenToId("<|new|>"), 9u);
  EXPECT_EQ(t.tokenToId("<mask>"), 10u);
  EXPECT_EQ(t.tokenToId("<|x|>"), 11u);
  EXPECT_FALSE(t.isSpecial(9));
  EXPECT_TRUE(t.isSpecial(0));                                // named in additional_special_tokens
  EXPECT_EQ(ids(t, "ab"), (std::vector<uint32_t>{2, 8, 2}));  // prefix space, bos and eos
}

TEST(SlowTokenizerTest, MergesFileAsTokenizersReadsIt) {
  for (const std::string& merges :
       {std::string("a b\n\u0120 ab"), std::string("#version: 0.2\r\na b\r\n\u0120 ab\r\n"),
        std::string("a b\n#version: 0.2\n\u0120 ab\n")}) {
    auto tok = load(kVocab, merges);
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_EQ(ids(**tok, " ab", false), (std::vector<uint32_t>{8}));
  }
  auto none = load(kVocab, "");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(ids(**none, "ab", false), (std::vector<uint32_t>{4, 5}));
}

struct BadCase {
  std::string vocab, merges, config, map;
  std::string expected;  // a substring of the error, which starts with the file's name
};

TEST(SlowTokenizerTest, RefusesMalformedFilesNamingThem) {
  const std::string v = kVocab, m = kMerges, c = kOptConfig;
  const std::vector<BadCase> cases = {
      {"[1, 2]", m, c, "", "vocab.json: expected an object"},
      {"{\"a\": 1", m, c, "", "vocab.json"},
      {R"({"a": "1"})", m, c, "", "vocab.json: the id of 'a' is not an integer"},
      {R"({"a": -1})", m, c, "", "vocab.json: the id of 'a' is not an integer"},
      {R"({"a": 1.5})", m, c, "", "vocab.json: the id of 'a' is not an integer"},
      {R"({"a": 16777216})", m, c, "", "vocab.json: the id of 'a' is not an integer in [0, "},
      {R"({"a": 99999999999999999999})", m, c, "", "vocab.json: the id of 'a'"},
      {R"({"a": 4, "b": 4})", m, c, "", "vocab.json: id 4 is given twice"},
      // A new token's id is one past the largest so far (bos "a"), here past the bound.
      {R"({"a": 16777215})", "", R"({"bos_token": "a", "eos_token": "b"})", "",
       "vocab.json + merges.txt: the tokenizer built from them: tokenizer.json /added_tokens/1"},
      {v, "a b c\n", c, "", "merges.txt: line 1: expected two tokens"},
      {v, "ab\n", c, "", "merges.txt: line 1: expected two tokens"},
      {v, "a  b\n", c, "", "merges.txt: line 1: expected two tokens"},
      {v, "a b \n", c, "", "merges.txt: line 1: expected two tokens"},
      {v, "a\tb\n", c, "", "merges.txt: line 1: expected two tokens"},
      {v, "a b\n\n\u0120 ab\n", c, "", "merges.txt: line 2: expected two tokens"},
      {v, "#version: 0.2\n#comment\n", c, "", "merges.txt: line 2: expected two tokens"},
      {v, "a b\n\n", c, "", "merges.txt: line 2: expected two tokens"},
      {v, "a z\n", c, "", "merges.txt: line 1: token 'z' is not in vocab.json"},
      {v, "b a\n", c, "", "merges.txt: line 1: token 'ba' is not in vocab.json"},
      {v, "a b\xff\n", c, "", "merges.txt: not valid UTF-8"},
      {v, "a b\r\r\n", c, "", "merges.txt: line 1: token 'b\r' is not in vocab.json"},
      {v, m, "[]", "", "tokenizer_config.json: not a JSON object"},
      {v, m, R"({"add_bos_token": "yes"})", "", "/add_bos_token: expected a boolean"},
      {v, m, R"({"add_prefix_space": 1})", "", "tokenizer_config.json: /add_prefix_space"},
      {v, m, R"({"bos_token": 7})", "", "tokenizer_config.json: /bos_token: expected a string"},
      {v, m, R"({"bos_token": {"content": "x", "lstrip": 1}})", "",
       "tokenizer_config.json: /bos_token/lstrip: expected a boolean"},
      {v, m, R"({"added_tokens_decoder": []})", "",
       "tokenizer_config.json: /added_tokens_decoder: expected an object"},
      {v, m, R"({"added_tokens_decoder": {"x": {"content": "y"}}})", "",
       "tokenizer_config.json: /added_tokens_decoder/x: the key is not a token id"},
      {v, m, R"({"additional_special_tokens": "x"})", "",
       "tokenizer_config.json: /additional_special_tokens: expected an array"},
      {v, m, c, "[]", "special_tokens_map.json: not a JSON object"},
      {v, m, c, R"({"pad_token": {"lstrip": true}})", "special_tokens_map.json: /pad_token"},
  };
  for (const BadCase& bad : cases) {
    auto tok = load(bad.vocab, bad.merges, bad.config, bad.map);
    const std::string what = json({bad.vocab, bad.merges, bad.config, bad.map})
                                 .dump(-1, ' ', false, json::error_handler_t::replace);
    ASSERT_FALSE(tok.ok()) << what;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(tok.status().message().find(bad.expected), std::string::npos)
        << what << ": got '" << tok.status().message() << "'";
  }
}

// Random damage to the opt-slow fixture's files: a clean error naming a file, or a working
// tokenizer.
TEST(SlowTokenizerTest, SurvivesRandomCorruption) {
  const std::string dir = testing::kFixtures + "/opt-slow/";
  const std::string files[4] = {testing::readText(dir + "vocab.json"),
                                testing::readText(dir + "merges.txt"),
                                testing::readText(dir + "tokenizer_config.json"),
                                testing::readText(dir + "special_tokens_map.json")};
  ASSERT_FALSE(files[0].empty());
  std::mt19937 rng(15);
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string damaged[4] = {files[0], files[1], files[2], files[3]};
    std::string& target = damaged[trial % 4];
    if (trial % 2) {
      target.resize(rng() % (target.size() + 1));
    } else {
      for (int k = 0; k < 8; ++k) target[rng() % target.size()] = static_cast<char>(rng());
    }
    auto tok = Tokenizer::fromGpt2Files({damaged[0], damaged[1], damaged[2], damaged[3]});
    if (!tok.ok()) {
      ++rejected;
      const std::string m(tok.status().message());
      EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument) << m;
      EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
      EXPECT_TRUE(m.starts_with("vocab.json") || m.starts_with("merges.txt") ||
                  m.starts_with("tokenizer_config.json") ||
                  m.starts_with("special_tokens_map.json"))
          << m;
      continue;
    }
    auto e = (*tok)->encode("Hello world, 中文 😀 </s> 123");
    ASSERT_TRUE(e.ok()) << e.status();
    (void)(*tok)->decode(e->ids, true);
  }
  EXPECT_GT(rejected, 0);
}

class SlowTokenizerDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("textgen-slowtok-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write("vocab.json", kVocab);
    write("merges.txt", kMerges);
    write("config.json", R"({"model_type": "opt"})");
    write("tokenizer_config.json", kOptConfig);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  StatusOr<std::unique_ptr<Tokenizer>> load() { return Tokenizer::fromDirectory(dir_.string()); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(SlowTokenizerDirTest, TheClassComesFromTheConfigOrTheModelType) {
  auto opt = load();  // no tokenizer_class: config.json's model_type "opt"
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(ids(**opt, "ab"), (std::vector<uint32_t>{2, 7}));

  json c = json::parse(kOptConfig);
  c["tokenizer_class"] = "GPT2TokenizerFast";
  write("tokenizer_config.json", c.dump());
  fs::remove(dir_ / "config.json");
  auto named = load();
  ASSERT_TRUE(named.ok()) << named.status();

  // special_tokens_map.json (read when the config has no added_tokens_decoder) overrides the
  // config's tokens.
  write("special_tokens_map.json", R"({"pad_token": "<unk>"})");
  auto mapped = load();
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE((*mapped)->isSpecial(3));
  EXPECT_FALSE((*mapped)->isSpecial(1));
}

TEST_F(SlowTokenizerDirTest, OtherClassesAreRefusedNamingTheMissingFile) {
  for (const std::string& config :
       {std::string(R"({"tokenizer_class": "LlamaTokenizer"})"), std::string("{}")}) {
    write("tokenizer_config.json", config);
    write("config.json", R"({"model_type": "llama"})");
    auto tok = load();
    ASSERT_FALSE(tok.ok()) << config;
    EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(tok.status().message().rfind(path("tokenizer.json") + ": No such file", 0), 0u)
        << tok.status();
  }
  fs::remove(dir_ / "config.json");
  auto none = load();
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("neither tokenizer_config.json's tokenizer_class nor"),
            std::string::npos)
      << none.status();
}

TEST_F(SlowTokenizerDirTest, MissingOrOversizeFilesAreNamed) {
  for (const char* name : {"vocab.json", "merges.txt"}) {
    SetUp();
    fs::remove(dir_ / name);
    auto tok = load();
    ASSERT_FALSE(tok.ok()) << name;
    EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(tok.status().message().rfind(path(name) + ": not found", 0), 0u) << tok.status();
  }
  for (const char* name : {"vocab.json", "merges.txt", "special_tokens_map.json", "config.json"}) {
    SetUp();
    write("tokenizer_config.json", "{}");  // config.json is read for the class
    write(name, "");
    fs::resize_file(dir_ / name, kMaxTextFileBytes + 1);  // sparse: nothing is written
    auto tok = load();
    ASSERT_FALSE(tok.ok()) << name;
    EXPECT_EQ(tok.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(tok.status().message(),
              path(name) + ": larger than " + std::to_string(kMaxTextFileBytes) + " bytes");
  }
}

}  // namespace
}  // namespace textgen::tokenizer
