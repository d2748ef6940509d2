// ChatTemplate: a model's Jinja chat template, rendered the way TGI renders it (its context: the
// flattened messages, bos/eos, add_generation_prompt, tools; its source rewrites; its tool prompt;
// its trimming after a final assistant message) and byte-equal to Python's jinja2 as transformers
// configures it (trim_blocks, lstrip_blocks, its tojson). The engine is Google's minja,
// header-only, kept inside chat_template.cpp. docs/chat-templates.md has the details and the known
// differences.
//
//   TG_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::load(modelDir, flags.tokenizerConfigPath));
//   StatusOr<std::string> prompt = tmpl->apply(chat.messages, chat.tools, chat.toolPrompt);
//
// load(): NOT_FOUND when the model has no chat template (the route answers 422 "This model has no
// chat template"), INVALID_ARGUMENT when it does not parse. apply(): INVALID_ARGUMENT (HTTP 422)
// for bad messages or tools, a raise_exception() in the template (its message), an output over the
// bound, or a render error (named). A ChatTemplate is immutable: apply() may run on many threads.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "textgen/base/status_or.h"

namespace textgen::router {

struct ChatTemplateOptions {
  // strftime_now()'s clock, as local broken-down time (TGI uses local time). Tests fix it.
  std::function<std::tm()> now = {};
  // The most bytes a render may produce; 0: 1 MiB + 4 x the request's message and tool bytes,
  // at most 64 MiB. Checked while rendering: a render stops at the bound.
  size_t maxOutputBytes = 0;
};

class ChatTemplate {
 public:
  // Finds the template: the tokenizer_config.json at tokenizerConfigPath when it is not empty,
  // else tokenizerDir/chat_template.jinja, else tokenizerDir/chat_template.json ({"chat_template":
  // ...}, as TGI reads it), else tokenizerDir/tokenizer_config.json. `chat_template` is a string or
  // a list of {name, template}: "default" is used, and "tool_use" (if present) for requests with
  // tools, as transformers does. bos/eos come from the tokenizer_config.json used (strings or
  // {"content": ...}); absent, they render as empty strings (as TGI's minijinja renders none).
  static StatusOr<std::unique_ptr<ChatTemplate>> load(const std::string& tokenizerDir,
                                                      const std::string& tokenizerConfigPath,
                                                      ChatTemplateOptions options = {});
  // A template from its text; toolUseSource is the optional "tool_use" variant. `origin` names it
  // in errors (a path, or "template").
  static StatusOr<std::unique_ptr<ChatTemplate>> fromSource(std::string source, std::string bos,
                                                            std::string eos,
                                                            ChatTemplateOptions options = {},
                                                            std::string toolUseSource = {},
                                                            std::string origin = "template");

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // The prompt for a chat request (see the file comment for the errors). `messages`: OpenAI's
  // messages array; `tools`: OpenAI's tools array (as the route chose them for tool_choice), or
  // null for none; `toolPrompt`: TGI's tool_prompt, put after the tools (empty: TGI's default).
  // Objects keep their key order (ordered_json): it shows in the rendered tools.
  StatusOr<std::string> apply(const nlohmann::ordered_json& messages,
                              const nlohmann::ordered_json& tools, std::string_view toolPrompt = {},
                              bool addGenerationPrompt = true) const;

  // Whether the template reads `tools` (TGI: otherwise the tools' JSON goes into the last message).
  bool readsTools(bool forToolRequest = false) const;
  const std::string& bosToken() const;
  const std::string& eosToken() const;

  // TGI's default tool_prompt.
  static std::string_view defaultToolPrompt();

  struct Impl;

 private:
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace textgen::router
