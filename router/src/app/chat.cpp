// POST /v1/chat/completions (OpenAI's Chat Completions, TGI's Messages API), POST /chat_tokenize
// (TGI's), and the chat side of POST /invocations (SageMaker's). The model's chat template renders
// the messages; tools and response_format become a grammar the shard enforces.
//
// Tools follow TGI: the output is constrained to {"function": {"_name": NAME, ...arguments}} over
// the offered functions (tool_choice "required" or one named function), and "auto" adds a
// "no_tool" function: when the model picks it, the request runs again without tools and its text is
// the answer. Tool calls come back in OpenAI's shape (arguments as a JSON string) and stream as
// deltas of the arguments text.
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "../chat/chat_template.h"
#include "request_trace.h"
#include "textgen/base/json.h"
#include "textgen/base/version.h"
#include "textgen/router/router_app.h"
#include "worker_pool.h"

namespace textgen::router {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr const char* kNoTool = "no_tool";

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status toolError(const std::string& message) {
  return invalidArgumentError(message);
}

// The offered tools after tool_choice, and the grammar their calls must follow.
struct ToolSetup {
  json tools;          // what the template sees (TGI's Tool list, no_tool added for "auto")
  std::string schema;  // the calls' JSON Schema
};

// One function's call: {"_name": NAME, ...its parameters}, nothing else.
StatusOr<json> functionSchema(const json& function, json& defs) {
  json schema{{"type", "object"}};
  if (auto d = function.find("description"); d != function.end() && d->is_string())
    schema["description"] = *d;
  json properties{{"_name", {{"type", "string"}, {"const", function["name"]}}}};
  json required = json::array({"_name"});
  auto params = function.find("parameters");
  if (params == function.end() || params->is_null()) params = function.find("arguments");
  if (params != function.end() && !params->is_null()) {
    if (!params->is_object())
      return toolError("tool " + function["name"].get<std::string>() +
                       ": `parameters` must be a JSON Schema object");
    if (auto p = params->find("properties"); p != params->end() && !p->is_null()) {
      if (!p->is_object())
        return toolError("tool " + function["name"].get<std::string>() +
                         ": `parameters.properties` must be an object");
      for (const auto& [k, v] : p->items()) {
        if (k == "_name")
          return toolError("tool " + function["name"].get<std::string>() +
                           ": a parameter may not be called `_name`");
        properties[k] = v;
      }
    }
    if (auto r = params->find("required"); r != params->end() && r->is_array()) {
      for (const auto& name : *r) required.push_back(name);
    }
    // Definitions move to the root, where the calls' "#/$defs/..." references resolve.
    for (const char* key : {"$defs", "definitions"}) {
      auto d = params->find(key);
      if (d == params->end() || !d->is_object()) continue;
      for (const auto& [k, v] : d->items()) {
        json& slot = defs[key];
        if (slot.contains(k) && slot[k] != v)
          return toolError("tools define `" + std::string(key) + "/" + k + "` differently");
        slot[k] = v;
      }
    }
  }
  schema["properties"] = std::move(properties);
  schema["required"] = std::move(required);
  schema["additionalProperties"] = false;
  return schema;
}

// Checks OpenAI's tools array and applies tool_choice; nullopt when no tool is offered (no tools,
// or "none").
StatusOr<std::optional<ToolSetup>> toolGrammar(const json& tools, const ToolChoice& choice) {
  const bool none = tools.is_null() || tools.empty();
  if (none && choice.mode == ToolChoice::Mode::kFunction)
    return toolError("Tool with name " + choice.function + " not found");
  if (none && choice.mode == ToolChoice::Mode::kRequired)
    return toolError("`tool_choice` \"required\" needs `tools`");
  if (none || choice.mode == ToolChoice::Mode::kNone) return std::optional<ToolSetup>();
  std::set<std::string> names;
  json offered = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return toolError(at + " must be an object");
    if (auto type = t.find("type"); type != t.end() && *type != "function")
      return toolError(at + ".type must be \"function\"");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) return toolError(at + ".function must be an object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      return toolError(at + ".function.name must be a non-empty string");
    if (!names.insert(name->get<std::string>()).second)
      return toolError("two tools are called " + name->get<std::string>());
    if (choice.mode == ToolChoice::Mode::kFunction && *name != choice.function) continue;
    offered.push_back(t);
  }
  if (choice.mode == ToolChoice::Mode::kFunction && offered.empty())
    return toolError("Tool with name " + choice.function + " not found");
  if (choice.mode == ToolChoice::Mode::kAuto) {
    if (names.contains(kNoTool)) return toolError("a tool may not be called no_tool with \"auto\"");
    offered.push_back({{"type", "function"},
                       {"function",
                        {{"name", kNoTool},
                         {"description", "Open ended response with no specific tool selected"},
                         {"arguments", {{"type", "object"}}}}}});
  }
  json defs = json::object();
  json alternatives = json::array();
  for (const json& t : offered) {
    TG_ASSIGN_OR_RETURN(json s, functionSchema(t["function"], defs));
    alternatives.push_back(std::move(s));
  }
  json function = alternatives.size() == 1 ? alternatives[0] : json{{"anyOf", alternatives}};
  json schema{{"type", "object"},
              {"properties", {{"function", std::move(function)}}},
              {"required", json::array({"function"})},
              {"additionalProperties", false}};
  for (const auto& [k, v] : defs.items()) schema[k] = v;
  return std::optional<ToolSetup>(ToolSetup{std::move(offered), dump(schema)});
}

// A generated call {"function": {"_name": NAME, ...arguments}}: the name and the arguments (as
// OpenAI's JSON string).
struct ParsedCall {
  std::string name;
  std::string arguments;
};

StatusOr<ParsedCall> parseCall(const std::string& text) {
  auto j = parseOrderedJson(text, "the generated tool call");
  auto bad = [&] {
    return toolError("Failed to parse generated text: not a tool call: " + text.substr(0, 200));
  };
  if (!j.ok() || !j->is_object()) return bad();
  auto f = j->find("function");
  if (f == j->end() || !f->is_object()) return bad();
  auto name = f->find("_name");
  if (name == f->end() || !name->is_string()) return bad();
  ParsedCall c{name->get<std::string>(), ""};
  json args = json::object();
  for (const auto& [k, v] : f->items()) {
    if (k != "_name") args[k] = v;
  }
  c.arguments = dump(args);
  return c;
}

// The start of a generated call, up to its name: `{"function": {"_name": "NAME"` with JSON
// whitespace anywhere. The name and where it ends, or nullopt while incomplete (or not a call).
std::optional<std::pair<std::string, size_t>> callName(const std::string& text) {
  size_t i = 0;
  auto ws = [&] {
    while (i < text.size() &&
           (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r'))
      ++i;
  };
  auto lit = [&](std::string_view s) {
    ws();
    if (text.compare(i, s.size(), s) != 0) return false;
    i += s.size();
    return true;
  };
  if (!lit("{") || !lit("\"function\"") || !lit(":") || !lit("{") || !lit("\"_name\"") ||
      !lit(":") || !lit("\""))
    return std::nullopt;
  const size_t start = i;
  for (; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
      continue;
    }
    if (text[i] == '"') {
      auto name = parseOrderedJson(text.substr(start - 1, i - start + 2), "a tool name");
      if (!name.ok() || !name->is_string()) return std::nullopt;
      return std::make_pair(name->get<std::string>(), i + 1);
    }
  }
  return std::nullopt;
}

json logprobsJson(const TokenList& tokens, const std::vector<TokenList>& top) {
  json content = json::array();
  for (size_t i = 0; i < tokens.ids.size(); ++i) {
    json alternatives = json::array();
    if (i < top.size()) {
      for (size_t k = 0; k < top[i].ids.size(); ++k)
        alternatives.push_back({{"token", top[i].texts[k]}, {"logprob", top[i].logprobs[k]}});
    }
    content.push_back({{"token", tokens.texts[i]},
                       {"logprob", tokens.logprobs[i]},
                       {"top_logprobs", std::move(alternatives)}});
  }
  return content;
}

const char* openAiFinish(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

}  // namespace

// One chat completion: collects or streams its generation, turns tool-call text into tool calls,
// and starts the tool-less rerun when the model chose no_tool.
class ChatSink final : public std::enable_shared_from_this<ChatSink> {
 public:
  struct Setup {
    std::shared_ptr<HttpResponder> responder;
    std::shared_ptr<HttpStream> stream;  // null: one JSON answer
    HttpHeaders headers;
    std::string model;
    std::string id;
    bool logprobs = false;
    bool includeUsage = false;
    bool usingTools = false;
    Clock::time_point start;
    std::function<void()> release;  // once, when the request is over
    // Runs the request again without tools (the model chose no_tool); false when it could not.
    std::function<bool(std::shared_ptr<ChatSink>)> rerunWithoutTools;
    MetricsRegistry* metrics = nullptr;
    const tokenizer::Tokenizer* tokenizer = nullptr;  // special tokens' own text
    std::shared_ptr<RequestTrace> trace;
  };

  explicit ChatSink(Setup s) : s_(std::move(s)), created_(unixNow()) {}

  // A new generation (the first, or the rerun) with its prompt length; returns its epoch.
  int begin(uint32_t promptTokens, uint32_t maxNewTokens, std::shared_ptr<RequestControl> c) {
    std::lock_guard lock(mutex_);
    if (cancelled_) c->cancel();  // the client left while the rerun was on its way
    promptTokens_ = promptTokens;
    maxNewTokens_ = maxNewTokens;
    control_ = std::move(c);
    text_.clear();
    tokens_ = {};
    top_.clear();
    toolState_ = ToolState::kName;
    sent_ = 0;
    pendingLp_ = json::array();
    return ++epoch_;
  }

  void onGeneration(int epoch, const Generation& g, const RequestTimes& times) {
    std::unique_lock lock(mutex_);
    if (done_ || epoch != epoch_) return;
    cached_ = times.cachedTokens;
    times_ = times;
    for (size_t i = 0; i < g.tokens.ids.size(); ++i) {
      tokens_.ids.push_back(g.tokens.ids[i]);
      tokens_.logprobs.push_back(g.tokens.logprobs[i]);
      tokens_.texts.push_back(g.tokens.texts[i]);
      tokens_.isSpecial.push_back(g.tokens.isSpecial[i]);
    }
    for (const TokenList& t : g.topTokens) top_.push_back(t);
    // A special token's own text (EOS's "</s>") is not content; text the detokenizer held back
    // (a run of byte tokens) can come out with it, and is.
    std::string piece;
    for (size_t i = 0; i < g.tokens.ids.size(); ++i) {
      std::string_view t = g.tokens.texts[i];
      if (g.tokens.isSpecial[i]) {
        const std::string own =
            s_.tokenizer->decode(std::span<const uint32_t>(&g.tokens.ids[i], 1));
        if (t.ends_with(own)) t.remove_suffix(own.size());
      }
      piece += t;
    }
    text_ += piece;
    const json lp =
        s_.logprobs ? json{{"content", logprobsJson(g.tokens, g.topTokens)}} : json(nullptr);
    if (s_.stream) {
      if (s_.usingTools) {
        // A tool call's chunks do not follow its tokens one to one: each carries the log-probs of
        // the tokens since the last one.
        if (s_.logprobs) {
          for (auto& e : lp["content"]) pendingLp_.push_back(std::move(e));
        }
        if (!streamTool(g, lock)) return;
      } else {
        json delta{{"role", "assistant"}, {"content", piece}};
        const bool last = g.generatedText.has_value();
        write(chunk(delta, lp, last ? json(openAiFinish(g.generatedText->reason)) : json(nullptr)));
      }
    }
    if (!g.generatedText) return;
    generated_ = g.generatedText->generatedTokens;
    reason_ = g.generatedText->reason;
    finish(lock);
  }

  void onError(int epoch, const Status& e) {
    std::lock_guard lock(mutex_);
    if (done_ || epoch != epoch_) return;
    fail(e, generationError(e));
  }

  void onAdmitted(int epoch, const RequestTimes& times) {
    std::lock_guard lock(mutex_);
    if (epoch == epoch_) times_ = times;
  }

  void cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    if (control_) control_->cancel();
  }
  bool cancelled() {
    std::lock_guard lock(mutex_);
    return cancelled_;
  }

 private:
  enum class ToolState { kName, kArguments };

  json chunk(json delta, json logprobs, json finish) const {
    json choice{{"index", 0},
                {"delta", std::move(delta)},
                {"logprobs", std::move(logprobs)},
                {"finish_reason", std::move(finish)}};
    return {{"id", s_.id},
            {"object", "chat.completion.chunk"},
            {"created", created_},
            {"model", s_.model},
            {"system_fingerprint", std::string(kVersion) + "-textgen"},
            {"choices", json::array({std::move(choice)})},
            {"usage", nullptr}};
  }

  json usage() const {
    return {{"prompt_tokens", promptTokens_},
            {"completion_tokens", generated_},
            {"total_tokens", promptTokens_ + generated_},
            {"prompt_tokens_details", {{"cached_tokens", cached_}}}};
  }

  void write(const json& j) {
    if (!s_.stream->write("data: " + dump(j) + "\n\n") && control_) control_->cancel();
  }

  // The arguments text streamed so far is `{` + body[0, sent_); the body is what follows the name
  // (and its comma), and its trailing `}` and whitespace are held back: the call's two closing
  // braces end it.
  static size_t heldBack(const std::string& body) {
    size_t n = body.size();
    while (n > 0 && (body[n - 1] == '}' || body[n - 1] == ' ' || body[n - 1] == '\n' ||
                     body[n - 1] == '\t' || body[n - 1] == '\r'))
      --n;
    return n;
  }

  std::string argumentBody() const {
    size_t i = argsAt_;
    while (i < text_.size() &&
           (text_[i] == ' ' || text_[i] == '\n' || text_[i] == '\t' || text_[i] == '\r'))
      ++i;
    if (i < text_.size() && text_[i] == ',') ++i;
    return i <= text_.size() ? text_.substr(i) : std::string();
  }

  json toolDelta(json function, bool first) const {
    json call{{"index", 0}};
    if (first) {
      call["id"] = s_.id;
      call["type"] = "function";
    }
    call["function"] = std::move(function);
    return {{"role", "assistant"}, {"tool_calls", json::array({std::move(call)})}};
  }

  // Streams a tool call's name, then its arguments; false when the sink is done with this
  // generation (the rerun took over).
  bool streamTool(const Generation& g, std::unique_lock<std::mutex>& lock) {
    if (toolState_ == ToolState::kName) {
      auto name = callName(text_);
      if (!name) return true;  // the name is not complete yet
      if (name->first == kNoTool) {
        rerun(lock);
        return false;
      }
      argsAt_ = name->second;
      toolState_ = ToolState::kArguments;
      toolName_ = name->first;
      write(chunk(toolDelta({{"name", name->first}, {"arguments", "{"}}, true), takeLp(), nullptr));
      if (g.generatedText) return true;  // finish() sends the rest
    }
    const std::string body = argumentBody();
    const size_t upto = heldBack(body);
    if (upto > sent_ && !g.generatedText) {
      write(chunk(toolDelta({{"arguments", body.substr(sent_, upto - sent_)}}, false), takeLp(),
                  nullptr));
      sent_ = upto;
    }
    return true;
  }

  // The log-probs gathered for the next tool-call chunk (null without logprobs).
  json takeLp() {
    if (!s_.logprobs) return nullptr;
    json out{{"content", std::move(pendingLp_)}};
    pendingLp_ = json::array();
    return out;
  }

  void rerun(std::unique_lock<std::mutex>& lock) {
    if (control_) {
      control_->superseded = true;  // before cancelled: the batcher reads them in that order
      control_->cancel();
    }
    ++epoch_;  // this generation's remaining calls are ignored
    s_.usingTools = false;
    lock.unlock();
    auto self = shared_from_this();
    if (!s_.rerunWithoutTools(self)) {
      lock.lock();
      fail(internalError("could not run the request again without tools"),
           {424, "generation", "generation"});
    } else {
      lock.lock();
    }
  }

  void finish(std::unique_lock<std::mutex>& lock) {
    std::optional<ParsedCall> call;
    bool cut = false;  // a call that max_tokens (or a stop sequence) ended before it closed
    if (s_.usingTools) {
      auto parsed = parseCall(text_);
      auto name = parsed.ok() ? std::nullopt : callName(text_);
      if ((parsed.ok() && parsed->name == kNoTool) || (name && name->first == kNoTool)) {
        rerun(lock);
        return;
      }
      if (parsed.ok()) {
        call = std::move(*parsed);
      } else if (name) {
        // As OpenAI answers a call cut by max_tokens: its partial arguments, finish "length".
        argsAt_ = name->second;
        call = ParsedCall{name->first, "{" + argumentBody()};
        cut = true;
      }
      // Cut before its name: the text as it is.
    }
    done_ = true;
    const Clock::time_point generatedAt = Clock::now();
    MetricsRegistry& m = *s_.metrics;
    m.counterAdd("tgi_request_success", 1);
    m.histogramObserve("tgi_request_duration",
                       std::chrono::duration<double>(Clock::now() - s_.start).count());
    m.histogramObserve("tgi_request_generated_tokens", generated_);
    m.histogramObserve("tgi_request_max_new_tokens", maxNewTokens_);
    const char* finishReason = call && !cut ? "tool_calls" : openAiFinish(reason_);
    if (s_.stream) {
      if (call && cut) {
        const std::string body = argumentBody();
        if (toolState_ == ToolState::kName) {
          write(chunk(toolDelta({{"name", call->name}, {"arguments", "{" + body}}, true), takeLp(),
                      finishReason));
        } else {
          write(chunk(
              toolDelta({{"arguments", body.size() > sent_ ? body.substr(sent_) : ""}}, false),
              takeLp(), finishReason));
        }
      } else if (!call && s_.usingTools) {
        write(chunk({{"role", "assistant"}, {"content", text_}}, takeLp(), finishReason));
      } else if (call) {
        // The rest of the arguments, without the call's closing braces.
        std::string body = argumentBody();
        size_t end = body.size();
        for (int braces = 0; braces < 2 && end > 0;) {
          const char c = body[end - 1];
          if (c == '}') ++braces;
          if (c == '}' || c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            --end;
          } else {
            break;
          }
        }
        std::string rest = end > sent_ ? body.substr(sent_, end - sent_) : std::string();
        write(chunk(toolDelta({{"arguments", rest + "}"}}, false), takeLp(), finishReason));
      }
      if (s_.includeUsage) {
        json last = chunk(json::object(), nullptr, nullptr);
        last["choices"] = json::array();
        last["usage"] = usage();
        write(last);
      }
      s_.stream->write("data: [DONE]\n\n");
      s_.stream->close();
    } else {
      json message{{"role", "assistant"}};
      if (call) {
        message["content"] = nullptr;
        message["tool_calls"] =
            json::array({{{"id", s_.id},
                          {"type", "function"},
                          {"function", {{"name", call->name}, {"arguments", call->arguments}}}}});
      } else {
        message["content"] = text_;
      }
      json choice{{"index", 0},
                  {"message", std::move(message)},
                  {"logprobs",
                   s_.logprobs ? json{{"content", logprobsJson(tokens_, top_)}} : json(nullptr)},
                  {"finish_reason", finishReason}};
      json out{{"id", s_.id},
               {"object", "chat.completion"},
               {"created", created_},
               {"model", s_.model},
               {"system_fingerprint", std::string(kVersion) + "-textgen"},
               {"choices", json::array({std::move(choice)})},
               {"usage", usage()}};
      s_.responder->reply(200, dump(out), s_.headers);
    }
    s_.release();
    s_.trace->attribute("generated_tokens", int64_t{generated_});
    s_.trace->finish(&times_, generatedAt);
  }

  void fail(const Status& e, const GenerationError& err) {
    done_ = true;
    if (control_) control_->cancel();
    if (err.countAs) s_.metrics->counterAdd("tgi_request_failure", 1, {{"err", err.countAs}});
    if (s_.stream) {
      if (err.status) {
        s_.stream->write("data: " + openAiStreamError(e.message(), err.type, err.status) + "\n\n");
        s_.stream->write("data: [DONE]\n\n");
      }
      s_.stream->close();
    } else if (err.status) {
      s_.responder->reply(err.status, errorJson(e.message(), err.type), s_.headers);
    }
    s_.release();
    s_.trace->finish(&times_, std::nullopt, &e.message());
  }

  Setup s_;
  std::mutex mutex_;
  int64_t created_;
  int epoch_ = 0;
  bool done_ = false;
  bool cancelled_ = false;  // the client went away
  std::shared_ptr<RequestControl> control_;
  RequestTimes times_;
  uint32_t promptTokens_ = 0, maxNewTokens_ = 0, generated_ = 0, cached_ = 0;
  FinishReason reason_ = FinishReason::kLength;
  std::string text_;
  TokenList tokens_;
  std::vector<TokenList> top_;
  ToolState toolState_ = ToolState::kName;
  std::string toolName_;
  size_t argsAt_ = 0, sent_ = 0;
  json pendingLp_ = json::array();
};

namespace {

class ChatEpochSink final : public ResponseSink {
 public:
  ChatEpochSink(std::shared_ptr<ChatSink> parent, int epoch)
      : parent_(std::move(parent)), epoch_(epoch) {}
  void onGeneration(const Generation& g, const RequestTimes& times) override {
    parent_->onGeneration(epoch_, g, times);
  }
  void onError(const Status& e) override { parent_->onError(epoch_, e); }
  void onAdmitted(const RequestTimes& times) override { parent_->onAdmitted(epoch_, times); }

 private:
  std::shared_ptr<ChatSink> parent_;
  int epoch_;
};

}  // namespace

StatusOr<RouterApp::ChatPrompt> RouterApp::chatPrompt(const ChatCompletionRequest& chat,
                                                      bool withTools) const {
  if (!options_.chatTemplate) {
    return failedPreconditionError(
        "This model has no chat template: use /generate or /v1/completions, or give one with "
        "--tokenizer-config-path (a tokenizer_config.json with `chat_template`)");
  }
  ChatPrompt p;
  std::optional<ToolSetup> tools;
  if (withTools) {
    TG_ASSIGN_OR_RETURN(tools, toolGrammar(chat.tools, chat.toolChoice));
  }
  auto rendered = options_.chatTemplate->apply(chat.messages, tools ? tools->tools : json(nullptr),
                                               chat.toolPrompt, true);
  if (!rendered.ok()) return invalidArgumentError(rendered.status().message());
  GenerateRequest g = chat.toGenerate(std::move(*rendered));
  if (!withTools) g.parameters.grammar.reset();
  if (withTools && !chat.responseFormat && tools)
    g.parameters.grammar = Grammar{Grammar::Type::kJson, tools->schema};
  p.request = std::move(g);
  p.usingTools = tools.has_value();
  return p;
}

void RouterApp::chatCompletions(const HttpRequest& request,
                                std::shared_ptr<HttpResponder> responder) {
  const auto start = Clock::now();
  auto trace = std::make_shared<RequestTrace>(request, "chat_completions");
  metrics_.counterAdd("tgi_request_count");
  HttpHeaders headers = baseHeaders(request);
  auto fail = [&](const Status& s) {
    metrics_.counterAdd("tgi_request_failure", 1, {{"err", "validation"}});
    responder->reply(422, errorJson(s.message(), "validation"), headers);
    trace->finish(nullptr, std::nullopt, &s.message());
  };
  auto chat = parseChatRequest(request.body);
  if (!chat.ok()) return fail(chat.status());
  auto prompt = chatPrompt(*chat, /*withTools=*/true);
  if (!prompt.ok()) return fail(prompt.status());
  const bool stream = chat->stream;
  auto valid = validator_.validate(prompt->request,
                                   stream ? Endpoint::kGenerateStream : Endpoint::kCompletions);
  if (!valid.ok()) return fail(valid.status());
  trace->validated();
  trace->attribute("input_length", int64_t{valid->inputLength});
  valid->trace = trace->infer();
  std::shared_ptr<Replica> replica = admit(responder, valid->inputIds);
  if (!replica) return trace->finish(nullptr, std::nullopt, &kNotAdmitted);
  std::shared_ptr<HttpStream> httpStream;
  if (stream) {
    headers["Content-Type"] = "text/event-stream";
    headers["Cache-Control"] = "no-cache";
    headers["x-accel-buffering"] = "no";  // TGI's: proxies (nginx) must not buffer the stream
    httpStream = responder->startStream(200, headers);
  }
  const std::string model = chat->model && !chat->model->empty() && *chat->model != "tgi"
                                ? *chat->model
                                : options_.modelId;
  ChatSink::Setup setup{
      .responder = responder,
      .stream = httpStream,
      .headers = headers,
      .model = model,
      .id = "chatcmpl-" + std::to_string(chatIds_.fetch_add(1) + 1),
      .logprobs = chat->logprobs,
      .includeUsage = chat->includeUsage,
      .usingTools = prompt->usingTools,
      .start = start,
      .release = [this] { inFlight_.fetch_sub(1); },
      .rerunWithoutTools = nullptr,
      .metrics = &metrics_,
      .tokenizer = &tokenizer_,
      .trace = trace,
  };
  // "auto" and the model chose no_tool: the same conversation without tools, on a validation
  // worker (rendering and tokenizing are not for the batcher's thread).
  auto chatCopy = std::make_shared<ChatCompletionRequest>(std::move(*chat));
  // The replica is picked again: a sink never owns one (a drained replica's last reference must not
  // go on its own batcher's thread).
  setup.rerunWithoutTools = [this, chatCopy, stream, trace](std::shared_ptr<ChatSink> sink) {
    return workers_->post(
        [this, chatCopy, stream, sink, trace] {
          auto again = chatPrompt(*chatCopy, /*withTools=*/false);
          StatusOr<ValidRequest> v =
              again.ok() ? validator_.validate(again->request, stream ? Endpoint::kGenerateStream
                                                                      : Endpoint::kCompletions)
                         : StatusOr<ValidRequest>(again.status());
          auto control = std::make_shared<RequestControl>();
          std::shared_ptr<Replica> target = v.ok() ? replicas_.pick(v->inputIds) : nullptr;
          if (v.ok() && !target) v = unavailableError("No replica is serving");
          if (!v.ok()) {
            const int epoch = sink->begin(0, 0, control);
            sink->onError(epoch, v.status());
            return;
          }
          v->trace = trace->infer();
          const int epoch = sink->begin(v->inputLength, v->maxNewTokens, control);
          if (control->cancelled()) {  // the client left: nothing to run
            sink->onError(epoch, cancelledError("the client went away"));
            return;
          }
          target->batcher->submit(nextId_++, std::move(*v), control,
                                  std::make_shared<ChatEpochSink>(sink, epoch));
        },
        options_.maxConcurrentRequests);
  };
  auto sink = std::make_shared<ChatSink>(std::move(setup));
  auto control = std::make_shared<RequestControl>();
  responder->onDisconnect([weak = std::weak_ptr<ChatSink>(sink)] {
    if (auto s = weak.lock()) s->cancel();
  });
  const int epoch = sink->begin(valid->inputLength, valid->maxNewTokens, control);
  replica->batcher->submit(nextId_++, std::move(*valid), control,
                           std::make_shared<ChatEpochSink>(sink, epoch));
}

void RouterApp::chatTokenize(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  HttpHeaders headers = baseHeaders(request);
  auto chat = parseChatRequest(request.body);
  if (!chat.ok()) {
    responder->reply(422, errorJson(chat.status().message(), "validation"), headers);
    return;
  }
  auto prompt = chatPrompt(*chat, /*withTools=*/true);
  if (!prompt.ok()) {
    responder->reply(422, errorJson(prompt.status().message(), "validation"), headers);
    return;
  }
  const std::string& text = prompt->request.inputs;
  auto e = validator_.tokenize(text, /*addSpecialTokens=*/false);
  if (!e.ok()) {
    responder->reply(422, errorJson(e.status().message(), "validation"), headers);
    return;
  }
  json tokens = json::array();
  for (size_t i = 0; i < e->size(); ++i) {
    const auto [from, to] = e->offsets[i];
    tokens.push_back(
        {{"id", e->ids[i]}, {"text", text.substr(from, to - from)}, {"start", from}, {"stop", to}});
  }
  responder->reply(200, dump(json{{"tokenize_response", tokens}, {"templated_text", text}}),
                   headers);
}

}  // namespace textgen::router
