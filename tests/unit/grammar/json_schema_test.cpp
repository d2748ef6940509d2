// JSON Schema to regex to DFA over a corpus (schemas/*.json): random walks validated by Python's
// jsonschema (validate.py), hand-written instances that must or must not match, and bad schemas.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "test_util.h"
#include "textgen/grammar/grammar.h"

namespace textgen::grammar {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // property order matters

const std::string kDir = TEXTGEN_GRAMMAR_TEST_DIR;

std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string python() {
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

std::vector<fs::path> corpus() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kDir + "/schemas")) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(JsonSchemaTest, CorpusHasEveryFeature) {
  EXPECT_GE(corpus().size(), 25u);
}

TEST(JsonSchemaTest, CorpusInstancesMatchOrNot) {
  for (const fs::path& file : corpus()) {
    const json doc = json::parse(readText(file));
    const std::string schema = doc["schema"].dump();
    auto g = Grammar::compile(Kind::kJsonSchema, schema);
    ASSERT_TRUE(g.ok()) << file << ": " << g.status();
    for (const json& v : doc["valid"]) {
      EXPECT_TRUE((*g)->matches(v.get<std::string>())) << file.filename() << " should match " << v;
    }
    for (const json& v : doc["invalid"]) {
      EXPECT_FALSE((*g)->matches(v.get<std::string>()))
          << file.filename() << " should not match " << v;
    }
  }
}

TEST(JsonSchemaTest, RandomWalksValidateWithJsonschema) {
  const fs::path tmp = fs::temp_directory_path() / ("grammar_test_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  std::mt19937 rng(20240611);
  for (const fs::path& file : corpus()) {
    const json doc = json::parse(readText(file));
    auto g = Grammar::compile(Kind::kJsonSchema, doc["schema"].dump());
    ASSERT_TRUE(g.ok()) << file << ": " << g.status();
    const auto dist = testing::distancesToAccept(**g);
    const fs::path samples = tmp / (file.stem().string() + ".txt");
    {
      std::ofstream out(samples, std::ios::binary);
      for (int i = 0; i < 60; ++i) {
        const std::string s = testing::randomWalk(**g, dist, rng, 20 + i * 2);
        ASSERT_TRUE((*g)->matches(s)) << s;
        ASSERT_EQ(s.find('\n'), std::string::npos) << s;
        out << s << "\n";
      }
    }
    const std::string cmd = python() + " " + kDir + "/validate.py " + file.string() + " " +
                            samples.string() + " > " + samples.string() + ".log 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << file.filename() << ":\n" << readText(samples.string() + ".log");
  }
  fs::remove_all(tmp);
}

TEST(JsonSchemaTest, RegexShapes) {
  // Whitespace between tokens is at most one space.
  auto g = Grammar::compile(Kind::kJsonSchema, R"({"type":"array","items":{"type":"integer"}})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->matches("[ 1, 2 ]"));
  EXPECT_FALSE((*g)->matches("[  1]"));
  EXPECT_FALSE((*g)->matches("[\n1]"));
  // minimum/maximum are not enforced (as in outlines).
  auto bounded = Grammar::compile(Kind::kJsonSchema, R"({"type":"integer","minimum":5})");
  ASSERT_TRUE(bounded.ok());
  EXPECT_TRUE((*bounded)->matches("1"));
  auto r = jsonSchemaToRegex(R"({"type":"boolean"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "(true|false)");
  // An empty schema stays a few thousand states.
  auto any = Grammar::compile(Kind::kJsonSchema, "{}");
  ASSERT_TRUE(any.ok());
  EXPECT_LT((*any)->numStates(), 4000u);
  EXPECT_TRUE((*any)->matches(R"([[[[1]]]])"));
  EXPECT_FALSE((*any)->matches(R"([[[[[1]]]]])"));  // deeper than the any-value depth (4)
}

struct BadSchema {
  const char* schema;
  StatusCode code;
  const char* fragment;
};

TEST(JsonSchemaTest, BadSchemas) {
  const std::vector<BadSchema> cases = {
      {"{", StatusCode::kInvalidArgument, "json schema"},
      {"[1]", StatusCode::kInvalidArgument, "must be an object"},
      {"12", StatusCode::kInvalidArgument, "must be an object"},
      {R"({"properties":{"age":{"type":"integr"}}})", StatusCode::kInvalidArgument,
       R"(properties.age.type: unknown type "integr")"},
      {R"({"$ref":"#/$defs/missing"})", StatusCode::kInvalidArgument, "unresolvable $ref"},
      {R"({"$ref":"http://example.com/s.json"})", StatusCode::kInvalidArgument, "unresolvable"},
      {R"({"type":"string","format":"ipv9"})", StatusCode::kInvalidArgument, "unsupported format"},
      {R"({"allOf":[{"type":"string"},{"type":"null"}]})", StatusCode::kInvalidArgument, "allOf"},
      {R"({"anyOf":[]})", StatusCode::kInvalidArgument, "anyOf: expected a non-empty array"},
      {R"({"type":"array","minItems":3,"maxItems":1})", StatusCode::kInvalidArgument, "minimum"},
      {R"({"type":"string","minLength":-1})", StatusCode::kInvalidArgument, "minLength"},
      {R"({"properties":{"a":false},"required":["a"]})", StatusCode::kInvalidArgument,
       "properties.a: the schema false matches nothing"},
      {R"({"type":"string","pattern":"(a"})", StatusCode::kInvalidArgument, "unterminated group"},
      {R"x({"type":"string","pattern":"a(?=b)"})x", StatusCode::kInvalidArgument, "lookaround"},
      // Recursion: expanded to maxSchemaDepth, then refused.
      {R"({"$defs":{"node":{"type":"object","properties":{"next":{"$ref":"#/$defs/node"}}}},"$ref":"#/$defs/node"})",
       StatusCode::kResourceExhausted, "maxSchemaDepth"},
      {R"({"$ref":"#"})", StatusCode::kResourceExhausted, "maxSchemaDepth"},
  };
  for (const BadSchema& c : cases) {
    auto g = Grammar::compile(Kind::kJsonSchema, c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.status().code(), c.code) << c.schema << ": " << g.status();
    EXPECT_NE(g.status().message().find(c.fragment), std::string::npos)
        << c.schema << ": " << g.status();
  }
}

TEST(JsonSchemaTest, LimitsAreEnforced) {
  // Deep nesting of objects.
  std::string deep = "{\"type\":\"integer\"}";
  for (int i = 0; i < 40; ++i)
    deep = R"({"type":"object","properties":{"a":)" + deep + "},\"required\":[\"a\"]}";
  auto d = Grammar::compile(Kind::kJsonSchema, deep);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted) << d.status();
  EXPECT_NE(d.status().message().find("maxSchemaDepth"), std::string::npos) << d.status();
  // Nesting past the JSON parser's bound.
  auto j = Grammar::compile(Kind::kJsonSchema, std::string(5000, '[') + std::string(5000, ']'));
  ASSERT_FALSE(j.ok());
  // An enormous enum.
  json e;
  for (int i = 0; i < 60000; ++i) e["enum"].push_back("value-" + std::to_string(i * 7919));
  auto big = Grammar::compile(Kind::kJsonSchema, e.dump());
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status();
  // Many optional properties: the outlines construction is quadratic; the regex bound stops it.
  json wide = {{"type", "object"}};
  for (int i = 0; i < 600; ++i) wide["properties"]["p" + std::to_string(i)] = {{"type", "string"}};
  auto w = Grammar::compile(Kind::kJsonSchema, wide.dump());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status();
  // A huge string length.
  auto len = Grammar::compile(Kind::kJsonSchema, R"({"type":"string","maxLength":1000000})");
  ASSERT_FALSE(len.ok());
  EXPECT_EQ(len.status().code(), StatusCode::kResourceExhausted) << len.status();
}

}  // namespace
}  // namespace textgen::grammar
