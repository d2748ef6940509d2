// ChatTemplate on bad input: every refusal is INVALID_ARGUMENT (HTTP 422) with a message naming
// the problem; a missing template is NOT_FOUND; nothing crashes or renders without bound.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

namespace textgen::router {
namespace {

using json = nlohmann::ordered_json;
using ::testing::HasSubstr;

constexpr const char* kChatMl =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

std::unique_ptr<ChatTemplate> chatMl(ChatTemplateOptions options = {}) {
  auto t = ChatTemplate::fromSource(kChatMl, "", "", std::move(options));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

void expectInvalid(const StatusOr<std::string>& got, const std::string& naming) {
  ASSERT_FALSE(got.ok()) << "rendered: " << *got;
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr(naming));
}

TEST(ChatTemplateBadInput, MessagesNotAnArray) {
  expectInvalid(chatMl()->apply(json::parse(R"({"role": "user"})"), nullptr),
                "`messages` must be an array");
  expectInvalid(chatMl()->apply(json("hi"), nullptr), "`messages` must be an array");
}

TEST(ChatTemplateBadInput, MessageWithoutRole) {
  expectInvalid(chatMl()->apply(json::parse(R"([{"content": "hi"}])"), nullptr),
                "messages[0].role must be a string");
  expectInvalid(chatMl()->apply(json::parse(R"([{"role": "user", "content": "a"}, {"role": 7,
                "content": "b"}])"),
                                nullptr),
                "messages[1].role must be a string");
  expectInvalid(chatMl()->apply(json::parse(R"([42])"), nullptr), "messages[0] must be an object");
}

TEST(ChatTemplateBadInput, ContentOfAWrongType) {
  expectInvalid(chatMl()->apply(json::parse(R"([{"role": "user", "content": 5}])"), nullptr),
                "messages[0].content must be a string, an array of content parts, or null");
  expectInvalid(
      chatMl()->apply(json::parse(R"([{"role": "user", "content": {"text": "x"}}])"), nullptr),
      "messages[0].content must be a string");
  expectInvalid(chatMl()->apply(
                    json::parse(R"([{"role": "user", "content": [{"type": "audio"}]}])"), nullptr),
                "messages[0].content[0].type must be \"text\" or \"image_url\"");
  expectInvalid(
      chatMl()->apply(
          json::parse(R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])"), nullptr),
      "messages[0].content[0].text must be a string");
  expectInvalid(
      chatMl()->apply(json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])"),
                      nullptr),
      "messages[0].content[0].image_url.url must be a string");
  expectInvalid(chatMl()->apply(json::parse(R"([{"role": "user"}])"), nullptr),
                "messages[0] has neither content nor tool_calls");
  expectInvalid(chatMl()->apply(json::parse(R"([{"role": "assistant", "tool_calls": [{"id": "1",
                "type": "function", "function": {"name": "f"}}]}])"),
                                nullptr),
                "messages[0].tool_calls[0].function has no parameters (or arguments)");
}

TEST(ChatTemplateBadInput, BadTools) {
  const json messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  expectInvalid(chatMl()->apply(messages, json("tools")), "`tools` must be an array or null");
  expectInvalid(chatMl()->apply(messages, json::parse(R"([{"type": "function"}])")),
                "tools[0] has no function");
  expectInvalid(chatMl()->apply(messages, json::parse(R"([{"type": "function", "function":
                {"parameters": {}}}])")),
                "tools[0].function.name must be a string");
}

TEST(ChatTemplateBadInput, DeepNestedContent) {
  // A content part nested 10000 arrays deep: refused before anything walks it recursively.
  json deep = json::array();
  json* innermost = &deep;
  for (int i = 0; i < 10000; ++i) {
    innermost->push_back(json::array());
    innermost = &innermost->back();
  }
  json message = json::object();
  message["role"] = "user";
  message["content"] = std::move(deep);
  json messages = json::array();
  messages.push_back(std::move(message));
  expectInvalid(chatMl()->apply(messages, nullptr), "`messages` nests deeper than 64 levels");
  // Shallow but wrong: named.
  expectInvalid(
      chatMl()->apply(json::parse(R"([{"role": "user", "content": [[["x"]]]}])"), nullptr),
      "messages[0].content[0] must be an object");
  // Deep tool parameters (which TGI dumps to a string) are refused too.
  json params = json::object();
  for (int i = 0; i < 200; ++i) params = json{{"p", std::move(params)}};
  json tools = json::array(
      {json{{"type", "function"}, {"function", json{{"name", "f"}, {"parameters", params}}}}});
  expectInvalid(chatMl()->apply(json::parse(R"([{"role": "user", "content": "hi"}])"), tools),
                "`tools` nests deeper than 64 levels");
}

TEST(ChatTemplateBadInput, TemplateThatRaises) {
  auto t = ChatTemplate::fromSource(
      "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
      "}}{% endif %}ok",
      "", "");
  ASSERT_TRUE(t.ok());
  auto got = (*t)->apply(json::parse(R"([{"role": "system", "content": "x"}])"), nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "The chat template refused the messages: System role not supported");
  EXPECT_EQ(*(*t)->apply(json::parse(R"([{"role": "user", "content": "x"}])"), nullptr), "ok");
}

TEST(ChatTemplateBadInput, RenderErrorIsNamed) {
  auto t = ChatTemplate::fromSource("{{ no_such_function(messages) }}", "", "");
  ASSERT_TRUE(t.ok());
  expectInvalid((*t)->apply(json::parse(R"([{"role": "user", "content": "x"}])"), nullptr),
                "Chat template error: ");
}

// A known difference (docs/chat-templates.md): jinja2 raises TypeError on str + int; minja
// concatenates. No corpus template relies on either; this test pins minja's behaviour.
TEST(ChatTemplateKnownDifference, StringPlusIntegerConcatenatesInMinja) {
  auto t = ChatTemplate::fromSource("{{ messages[0].content + 1 }}", "", "");
  ASSERT_TRUE(t.ok());
  auto out = (*t)->apply(json::parse(R"([{"role": "user", "content": "x"}])"), nullptr);
  ASSERT_TRUE(out.ok()) << "minja now refuses str + int as jinja2 does: update the docs";
  EXPECT_EQ(*out, "x1");
}

TEST(ChatTemplateBadInput, SyntaxErrorFailsToLoad) {
  auto t = ChatTemplate::fromSource("{% for message in messages %}{{ message.content }", "", "", {},
                                    {}, "broken.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("chat template broken.jinja does not parse"));
  auto unterminated = ChatTemplate::fromSource("{% if true %}x", "", "");
  ASSERT_FALSE(unterminated.ok());
  EXPECT_THAT(unterminated.status().message(), HasSubstr("does not parse"));
  // Nesting that would exhaust the recursive parser is refused before it runs.
  auto deep = ChatTemplate::fromSource(
      "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "", "");
  ASSERT_FALSE(deep.ok());
  EXPECT_THAT(deep.status().message(), HasSubstr("nests brackets deeper than 64"));
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  auto deepBlocks = ChatTemplate::fromSource(blocks, "", "");
  ASSERT_FALSE(deepBlocks.ok());
  EXPECT_THAT(deepBlocks.status().message(), HasSubstr("nests blocks deeper than 64"));
}

TEST(ChatTemplateBadInput, OverLongRender) {
  // A template that repeats the conversation for every message: quadratic output, cut at the bound.
  auto t = ChatTemplate::fromSource(
      "{% for m in messages %}{% for n in messages %}{{ n.content }}{% endfor %}{% endfor %}", "",
      "", {.now = {}, .maxOutputBytes = 100000});
  ASSERT_TRUE(t.ok());
  json messages = json::array();
  for (int i = 0; i < 200; ++i)
    messages.push_back({{"role", "user"}, {"content", std::string(100, 'x')}});
  expectInvalid((*t)->apply(messages, nullptr), "The rendered chat prompt is over 100000 bytes");
  // The default bound: 1 MiB + 4x the input (here ~2.6 MB of input against ~4 GB of output).
  auto unbounded = ChatTemplate::fromSource(
      "{% for m in messages %}{% for n in messages %}{{ n.content }}{% endfor %}{% endfor %}", "",
      "");
  ASSERT_TRUE(unbounded.ok());
  json big = json::array();
  for (int i = 0; i < 1300; ++i)
    big.push_back({{"role", "user"}, {"content", std::string(2000, 'y')}});
  expectInvalid((*unbounded)->apply(big, nullptr), "The rendered chat prompt is over");
  // Under the bound it renders.
  EXPECT_TRUE(chatMl({.now = {}, .maxOutputBytes = 100000})->apply(messages, nullptr).ok());
}

class ChatTemplateLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("chat_template_load_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::string dir() const { return dir_.string(); }
  std::filesystem::path dir_;
};

const json kHi = json::parse(R"([{"role": "user", "content": "Hi"}])");

TEST_F(ChatTemplateLoadTest, NoTemplateIsNotFound) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto t = ChatTemplate::load(dir(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("no chat template"));
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  EXPECT_EQ(ChatTemplate::load(dir(), "").status().code(), StatusCode::kNotFound);
}

TEST_F(ChatTemplateLoadTest, TokenizerConfigStringAndObjectTokens) {
  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  auto t = ChatTemplate::load(dir(), "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->apply(kHi, nullptr), "<s>Hi</s>");
}

TEST_F(ChatTemplateLoadTest, JinjaFileWinsOverTokenizerConfig) {
  write("tokenizer_config.json", R"({"bos_token": "<s>", "chat_template": "config"})");
  write("chat_template.jinja", "jinja {{ bos_token }}\n");
  auto t = ChatTemplate::load(dir(), "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->apply(kHi, nullptr), "jinja <s>");
}

TEST_F(ChatTemplateLoadTest, NamedTemplatesUseDefaultAndToolUse) {
  write(
      "tokenizer_config.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  auto t = ChatTemplate::load(dir(), "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->apply(kHi, nullptr), "D");
  const json tools =
      json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  EXPECT_EQ(*(*t)->apply(kHi, tools), "T");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  auto none = ChatTemplate::load(dir(), "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("no \"default\""));
}

TEST_F(ChatTemplateLoadTest, ExplicitConfigPathWins) {
  write("tokenizer_config.json", R"({"chat_template": "dir"})");
  write("other.json", R"({"chat_template": "explicit {{ eos_token }}", "eos_token": "E"})");
  auto t = ChatTemplate::load(dir(), dir() + "/other.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->apply(kHi, nullptr), "explicit E");
  auto missing = ChatTemplate::load(dir(), dir() + "/missing.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.json"));
}

TEST_F(ChatTemplateLoadTest, SyntaxErrorOnLoadIsInvalidArgument) {
  write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  auto t = ChatTemplate::load(dir(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("tokenizer_config.json does not parse"));
  write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_EQ(ChatTemplate::load(dir(), "").status().code(), StatusCode::kInvalidArgument);
  write("tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::load(dir(), "").status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplateDemoModel, DemoModelHasAChatTemplate) {
  auto t = ChatTemplate::load(std::string(TEXTGEN_CHAT_FIXTURES) + "/../../../models/demo", "");
  ASSERT_TRUE(t.ok()) << t.status();
  auto out = (*t)->apply(kHi, nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace textgen::router
