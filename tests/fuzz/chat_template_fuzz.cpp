// ChatTemplate (router/src/chat/) on fuzzed templates and fuzzed messages: loading never crashes
// and fails only with INVALID_ARGUMENT; rendering never crashes, fails only with INVALID_ARGUMENT,
// and never returns more than its output bound.
//
// Input: byte 0 bit 0 picks the template: 0 = one of the real templates of
// tests/reference/chat_templates/templates (byte 1 picks which), 1 = template text read from the
// input up to a NUL byte. The rest: the messages JSON, NUL, the tools JSON, NUL, the tool prompt.
// Text that is not JSON becomes the content of one user message, so every input renders something.
// Templates are trusted-ish (they come from the model folder): fuzzed template text that could
// loop or allocate without bound by design (range, string repetition, macros, deep loop nests) is
// skipped, as docs/chat-templates.md says.
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "fuzz_util.h"
#include "textgen/base/json.h"

namespace {

using json = nlohmann::ordered_json;
using textgen::StatusCode;
using textgen::router::ChatTemplate;
using textgen::router::ChatTemplateOptions;

constexpr size_t kMaxOutput = size_t{1} << 20;
const char* const kTemplates[] = {"llama-2",
                                  "llama-3.1",
                                  "llama-3.2",
                                  "mistral-v0.1",
                                  "mixtral-8x7b-v0.1",
                                  "mistral-v0.3",
                                  "zephyr",
                                  "qwen2.5",
                                  "gemma",
                                  "falcon-instruct",
                                  "starchat",
                                  "phi-3",
                                  "deepseek-v3",
                                  "deepseek-r1-distill",
                                  "openchat-3.5",
                                  "qwen3"};

std::tm fixedNow() {
  std::tm tm{};
  tm.tm_year = 124;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  return tm;
}

ChatTemplateOptions options() {
  ChatTemplateOptions o;
  o.now = fixedNow;
  o.maxOutputBytes = kMaxOutput;
  return o;
}

const ChatTemplate& corpusTemplate(uint8_t which) {
  static std::map<size_t, std::unique_ptr<ChatTemplate>> cache;
  const size_t i = which % (sizeof(kTemplates) / sizeof(kTemplates[0]));
  auto& slot = cache[i];
  if (!slot) {
    const std::string path =
        textgen::fuzz::fixturesDir() + "/chat_templates/templates/" + kTemplates[i] + ".jinja";
    auto t = ChatTemplate::fromSource(textgen::fuzz::readFile(path), "<s>", "</s>", options());
    FUZZ_CHECK(t.ok(), t.status().toString());
    slot = std::move(*t);
  }
  return *slot;
}

size_t count(std::string_view s, std::string_view what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string_view::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// Template text whose cost is unbounded by design (trusted input): not rendered.
bool unboundedByDesign(std::string_view t) {
  for (const char* word : {"range", "macro", "call", "recursive", "namespace", "*", "loop.cycle"}) {
    if (t.find(word) != std::string_view::npos) return true;
  }
  return count(t, "for") > 3;
}

json messagesFrom(std::string_view text) {
  auto parsed = textgen::parseOrderedJson(text, "messages");
  if (parsed.ok()) return std::move(*parsed);
  return json::array({json{{"role", "user"}, {"content", std::string(text)}}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  textgen::fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  std::unique_ptr<ChatTemplate> owned;
  const ChatTemplate* tmpl = nullptr;
  bool small = false;  // fuzzed templates render few messages
  if ((mode & 1) == 0) {
    tmpl = &corpusTemplate(in.byte());
  } else {
    const std::string text(in.until('\0'));
    auto t = ChatTemplate::fromSource(text, "<s>", "</s>", options());
    if (!t.ok()) {
      FUZZ_CHECK(t.status().code() == StatusCode::kInvalidArgument, t.status().toString());
      return 0;
    }
    if (unboundedByDesign(text)) return 0;
    owned = std::move(*t);
    tmpl = owned.get();
    small = true;
  }
  json messages = messagesFrom(in.until('\0'));
  if (small && messages.is_array() && messages.size() > 8) return 0;
  const std::string_view toolsText = in.until('\0');
  json tools = nullptr;
  if (!toolsText.empty()) {
    auto parsed = textgen::parseOrderedJson(toolsText, "tools");
    if (parsed.ok()) tools = std::move(*parsed);
  }
  const std::string toolPrompt(in.rest());
  for (bool generationPrompt : {true, false}) {
    auto out = tmpl->apply(messages, tools, toolPrompt, generationPrompt);
    if (out.ok()) {
      FUZZ_CHECK(out->size() <= kMaxOutput, "output over the bound");
    } else {
      FUZZ_CHECK(out.status().code() == StatusCode::kInvalidArgument, out.status().toString());
      FUZZ_CHECK(!out.status().message().empty(), "an error without a message");
    }
  }
  return 0;
}
