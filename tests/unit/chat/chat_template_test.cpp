// Every (template, message set) pair of tests/reference/chat_templates rendered by ChatTemplate
// must equal jinja2's render byte for byte (references.json, written by
// tools/reference/render_chat_templates.py with TGI's context and transformers' environment); a
// pair the template refuses must be refused with the same raise_exception() message.
#include "chat/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace textgen::router {
namespace {

using json = nlohmann::ordered_json;

const std::string kFixtures = TEXTGEN_CHAT_FIXTURES;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json readJson(const std::string& path) {
  return json::parse(readFile(path));
}

// The reference renders' fixed clock: 2024-07-26 12:00:00 (references.json "now").
std::tm fixedNow() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 12;
  tm.tm_wday = 5;  // a Friday
  tm.tm_yday = 207;
  return tm;
}

// The first differing byte and its surroundings, for a readable failure.
std::string firstDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  want: ..." +
         json(want.substr(from, 100)).dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n  got:  ..." +
         json(got.substr(from, 100)).dump(-1, ' ', false, json::error_handler_t::replace);
}

class ChatTemplateCorpusTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    templates_ = new json(readJson(kFixtures + "/templates.json"));
    references_ = new json(readJson(kFixtures + "/references.json"));
    for (const json& set : readJson(kFixtures + "/messages.json")) {
      (*sets_)[set["name"].get<std::string>()] = set;
    }
  }
  static inline json* templates_ = nullptr;
  static inline json* references_ = nullptr;
  static inline auto* sets_ = new std::map<std::string, json>();
};

TEST_F(ChatTemplateCorpusTest, EveryPairEqualsJinja2) {
  ASSERT_GE(templates_->size(), 12u);
  ASSERT_GE(sets_->size(), 8u);
  std::map<std::string, std::unique_ptr<ChatTemplate>> compiled;
  for (const auto& [name, spec] : templates_->items()) {
    auto t = ChatTemplate::fromSource(
        readFile(kFixtures + "/templates/" + spec["file"].get<std::string>()),
        spec.value("bos", ""), spec.value("eos", ""), {.now = fixedNow}, {}, name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    compiled[name] = std::move(*t);
  }
  int outputs = 0, raises = 0;
  const json& results = (*references_)["results"];
  ASSERT_EQ(results.size(), templates_->size() * sets_->size()) << "references.json is stale";
  for (const json& ref : results) {
    const std::string name = ref["template"];
    const std::string setName = ref["messages"];
    SCOPED_TRACE(name + " x " + setName);
    const json& set = sets_->at(setName);
    const json tools = set.contains("tools") ? set["tools"] : json(nullptr);
    auto got = compiled.at(name)->apply(set["messages"], tools, set.value("tool_prompt", ""),
                                        set.value("add_generation_prompt", true));
    if (ref.contains("output")) {
      ++outputs;
      ASSERT_TRUE(got.ok()) << got.status();
      const std::string want = ref["output"];
      EXPECT_EQ(*got, want) << firstDifference(want, *got);
    } else if (ref.contains("raise")) {
      ++raises;
      ASSERT_FALSE(got.ok()) << "rendered, but jinja2 raised: " << ref["raise"];
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(got.status().message(),
                "The chat template refused the messages: " + ref["raise"].get<std::string>());
    } else {
      ASSERT_FALSE(got.ok()) << "rendered, but jinja2 failed: " << ref["error"];
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(outputs, 150);
  EXPECT_GT(raises, 10);
}

// What TGI does with tools, on one template that reads `tools` and one that does not.
TEST(ChatTemplateTools, TemplatesThatIgnoreToolsGetThemInTheLastMessage) {
  auto zephyr =
      ChatTemplate::fromSource(readFile(kFixtures + "/templates/zephyr.jinja"), "<s>", "</s>");
  auto llama = ChatTemplate::fromSource(readFile(kFixtures + "/templates/llama-3.1.jinja"), "", "");
  ASSERT_TRUE(zephyr.ok() && llama.ok());
  EXPECT_FALSE((*zephyr)->readsTools());
  EXPECT_TRUE((*llama)->readsTools());
  const json messages = json::parse(R"([{"role": "user", "content": "Hi"}])");
  const json tools = json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  auto out = (*zephyr)->apply(messages, tools, "PROMPT");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|user|>\nHi\n---\n[{\"type\":\"function\",\"function\":{\"description\":null,"
            "\"name\":\"f\",\"arguments\":\"{\\\"type\\\":\\\"object\\\"}\"}}]\nPROMPT</s>\n"
            "<|assistant|>\n");
  // No tools (null or an empty list): nothing is appended.
  auto plain = (*zephyr)->apply(messages, json::array());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, "<|user|>\nHi</s>\n<|assistant|>\n");
}

TEST(ChatTemplateTools, ToolUseVariantIsUsedForRequestsWithTools) {
  auto t = ChatTemplate::fromSource("default:{{ messages[0].content }}", "", "", {},
                                    "tool_use:{{ tools[0].function.name }}");
  ASSERT_TRUE(t.ok()) << t.status();
  const json messages = json::parse(R"([{"role": "user", "content": "Hi"}])");
  const json tools =
      json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  EXPECT_EQ(*(*t)->apply(messages, nullptr), "default:Hi");
  EXPECT_EQ(*(*t)->apply(messages, tools), "tool_use:f");
}

TEST(ChatTemplateClock, StrftimeNowUsesTheInjectedClock) {
  auto t = ChatTemplate::fromSource("{{ strftime_now('%d %b %Y') }}", "", "", {.now = fixedNow});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*(*t)->apply(json::array(), nullptr), "26 Jul 2024");
}

// tojson as transformers defines it (json.dumps), where minja's own differs.
TEST(ChatTemplateToJson, MatchesPythonJsonDumps) {
  auto t2 = ChatTemplate::fromSource(
      "{% set x = {'b': [1, 2.5, none, true], 'a': {}} %}{% set e = [] %}"
      "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ e | tojson(indent=2) }}|"
      "{{ x | tojson(sort_keys=true, separators=[',', ':']) }}|{{ 'é<&>' | tojson }}|"
      "{{ 'é😀' | tojson(ensure_ascii=true) }}",
      "", "");
  ASSERT_TRUE(t2.ok()) << t2.status();
  auto out = (*t2)->apply(json::array(), nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "{\"b\": [1, 2.5, null, true], \"a\": {}}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n"
            "    true\n  ],\n  \"a\": {}\n}|[]|{\"a\":{},\"b\":[1,2.5,null,true]}|\"é<&>\"|"
            "\"\\u00e9\\ud83d\\ude00\"");
}

}  // namespace
}  // namespace textgen::router
