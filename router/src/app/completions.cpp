// POST /v1/completions in OpenAI's format, over the same validation and batchers as /generate.
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>

#include "request_trace.h"
#include "textgen/base/json.h"
#include "textgen/base/version.h"
#include "textgen/router/router_app.h"

namespace textgen::router {
namespace {

using nlohmann::json;

const char* openAiFinish(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

int64_t unixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// What a whole answer looks like: OpenAI's completion, or TGI's /vertex predictions.
enum class Shape { kCompletion, kVertex };

// Collects (or streams) the completions of every prompt of one request.
class CompletionSink final : public std::enable_shared_from_this<CompletionSink> {
 public:
  CompletionSink(std::shared_ptr<HttpResponder> responder, std::shared_ptr<HttpStream> stream,
                 HttpHeaders headers, std::string model, std::vector<uint32_t> promptTokens,
                 std::vector<uint32_t> maxNewTokens, std::chrono::steady_clock::time_point start,
                 std::function<void()> release, MetricsRegistry& metrics, bool includeUsage,
                 Shape shape = Shape::kCompletion)
      : includeUsage_(includeUsage),
        shape_(shape),
        responder_(std::move(responder)),
        stream_(std::move(stream)),
        headers_(std::move(headers)),
        model_(std::move(model)),
        promptTokens_(std::move(promptTokens)),
        texts_(promptTokens_.size()),
        finish_(promptTokens_.size()),
        generated_(promptTokens_.size(), 0),
        cached_(promptTokens_.size(), 0),
        maxNewTokens_(std::move(maxNewTokens)),
        start_(start),
        release_(std::move(release)),
        metrics_(metrics),
        created_(unixNow()) {}

  void onGeneration(size_t index, const Generation& g,
                    const std::shared_ptr<RequestControl>& control, const RequestTimes& times) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    cached_[index] = times.cachedTokens;
    if (times_.queued == std::chrono::steady_clock::time_point{}) times_ = times;  // the first
    std::string piece;
    for (const std::string& t : g.tokens.texts) piece += t;
    texts_[index] += piece;
    if (g.generatedText) {
      // The whole answer is the generated text, as TGI's /v1/completions returns it: the ids
      // decoded together without special tokens (an encoder-decoder's first piece streams with the
      // leading space the whole decode drops; an EOS streams its text).
      if (!stream_) texts_[index] = g.generatedText->text;
      finish_[index] = openAiFinish(g.generatedText->reason);
      generated_[index] = g.generatedText->generatedTokens;
      ++finished_;
    }
    if (stream_) {
      json choice{{"index", index},
                  {"text", piece},
                  {"logprobs", nullptr},
                  {"finish_reason", g.generatedText ? json(finish_[index]) : json(nullptr)}};
      json event = chunk(json::array({choice}), "text_completion");
      // A prompt's last chunk carries its usage, as TGI's CompletionFinal does; with OpenAI's
      // include_usage only the last chunk does (OpenAI's shape: clients may sum them).
      if (g.generatedText && !includeUsage_) event["usage"] = usage(index, index + 1);
      if (!stream_->write("data: " + dump(event) + "\n\n")) {
        control->cancel();
      }
    }
    if (finished_ == texts_.size()) complete();
  }

  // Every prompt's control: when one fails, the others stop too (nobody waits for them).
  void setControls(std::vector<std::shared_ptr<RequestControl>> controls) {
    std::lock_guard lock(mutex_);
    controls_ = std::move(controls);
  }
  void onAdmitted(const RequestTimes& times) {
    std::lock_guard lock(mutex_);
    if (times_.queued == std::chrono::steady_clock::time_point{}) times_ = times;  // the first
  }
  // Every prompt's steps hang under one infer span: from the first prompt's batching to the end.
  void setTrace(std::shared_ptr<RequestTrace> trace) {
    std::lock_guard lock(mutex_);
    trace_ = std::move(trace);
  }

  void onError(const Status& e) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    for (const auto& c : controls_) c->cancel();
    const GenerationError err = generationError(e);
    if (err.countAs) metrics_.counterAdd("tgi_request_failure", 1, {{"err", err.countAs}});
    if (stream_) {
      if (err.status) {
        stream_->write("data: " + openAiStreamError(e.message(), err.type, err.status) + "\n\n");
        stream_->write("data: [DONE]\n\n");
      }
      stream_->close();
    } else if (err.status && shape_ == Shape::kVertex) {
      // TGI's /vertex answers any instance's failure so (a 500, whatever the cause).
      responder_->reply(500,
                        errorJson("Incomplete generation: " + e.message(), "Incomplete generation"),
                        headers_);
    } else if (err.status) {
      responder_->reply(err.status, errorJson(e.message(), err.type), headers_);
    }
    release_();
    trace_->finish(&times_, std::nullopt, &e.message());
  }

 private:
  json chunk(json choices, const char* object) const {
    return {{"id", ""},
            {"object", object},
            {"created", created_},
            {"model", model_},
            {"system_fingerprint", std::string(kVersion) + "-textgen"},
            {"choices", std::move(choices)}};
  }

  void complete() {
    done_ = true;
    const auto generatedAt = std::chrono::steady_clock::now();
    metrics_.counterAdd("tgi_request_success", 1);
    metrics_.histogramObserve(
        "tgi_request_duration",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    for (size_t i = 0; i < generated_.size(); ++i) {
      metrics_.histogramObserve("tgi_request_generated_tokens", generated_[i]);
      metrics_.histogramObserve("tgi_request_max_new_tokens", maxNewTokens_[i]);
    }
    if (stream_) {
      // OpenAI's stream_options.include_usage: one more chunk, no choices, every prompt's usage.
      if (includeUsage_) {
        json last = chunk(json::array(), "text_completion");
        last["usage"] = usage(0, texts_.size());
        stream_->write("data: " + dump(last) + "\n\n");
      }
      stream_->write("data: [DONE]\n\n");
      stream_->close();
    } else if (shape_ == Shape::kVertex) {
      responder_->reply(200, dump(json{{"predictions", texts_}}), headers_);
    } else {
      json choices = json::array();
      for (size_t i = 0; i < texts_.size(); ++i) {
        choices.push_back({{"index", i},
                           {"text", texts_[i]},
                           {"logprobs", nullptr},
                           {"finish_reason", finish_[i]}});
      }
      json out = chunk(choices, "text_completion");
      out["usage"] = usage(0, texts_.size());
      responder_->reply(200, dump(out), headers_);
    }
    release_();
    trace_->finish(&times_, generatedAt);
  }

  // The usage of prompts [begin, end).
  json usage(size_t begin, size_t end) const {
    uint32_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = begin; i < end; ++i) {
      prompt += promptTokens_[i];
      completion += generated_[i];
      cached += cached_[i];
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  std::mutex mutex_;
  bool includeUsage_ = false;
  Shape shape_ = Shape::kCompletion;
  std::shared_ptr<RequestTrace> trace_;
  RequestTimes times_;
  std::shared_ptr<HttpResponder> responder_;
  std::shared_ptr<HttpStream> stream_;
  std::vector<std::shared_ptr<RequestControl>> controls_;
  HttpHeaders headers_;
  std::string model_;
  std::vector<uint32_t> promptTokens_;
  std::vector<std::string> texts_;
  std::vector<std::string> finish_;
  std::vector<uint32_t> generated_;
  std::vector<uint32_t> cached_;  // prompt tokens served from the prefix cache
  std::vector<uint32_t> maxNewTokens_;
  std::chrono::steady_clock::time_point start_;
  size_t finished_ = 0;
  bool done_ = false;
  std::function<void()> release_;
  MetricsRegistry& metrics_;
  int64_t created_;
};

class PromptSink final : public ResponseSink {
 public:
  PromptSink(std::shared_ptr<CompletionSink> parent, size_t index,
             std::shared_ptr<RequestControl> control)
      : parent_(std::move(parent)), index_(index), control_(std::move(control)) {}
  void onGeneration(const Generation& g, const RequestTimes& times) override {
    parent_->onGeneration(index_, g, control_, times);
  }
  void onError(const Status& e) override { parent_->onError(e); }
  void onAdmitted(const RequestTimes& times) override { parent_->onAdmitted(times); }

 private:
  std::shared_ptr<CompletionSink> parent_;
  size_t index_;
  std::shared_ptr<RequestControl> control_;
};

}  // namespace

void RouterApp::completions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  const auto start = std::chrono::steady_clock::now();
  auto trace = std::make_shared<RequestTrace>(request, "completions");
  metrics_.counterAdd("tgi_request_count");
  HttpHeaders headers = baseHeaders(request);
  auto fail = [&](const std::string& message) {
    metrics_.counterAdd("tgi_request_failure", 1, {{"err", "validation"}});
    responder->reply(422, errorJson(message, "validation"), headers);
    trace->finish(nullptr, std::nullopt, &message);
  };
  auto req = parseCompletionRequest(request.body);
  if (!req.ok()) return fail(req.status().message());
  if (req->prompts.size() > options_.maxClientBatchSize) {
    return fail("Number of prompts exceeds the maximum allowed batch size of " +
                std::to_string(options_.maxClientBatchSize));
  }
  if (req->prompts.empty()) return fail("`prompt` cannot be an empty list");
  if (req->suffix) return fail("`suffix` is not supported");
  const bool stream = req->stream;
  std::vector<ValidRequest> valid;
  for (size_t i = 0; i < req->prompts.size(); ++i) {
    StatusOr<ValidRequest> v = validator_.validate(
        req->toGenerate(i), stream ? Endpoint::kGenerateStream : Endpoint::kCompletions);
    if (!v.ok()) return fail(v.status().message());
    v->trace = trace->infer();
    valid.push_back(std::move(*v));
  }
  trace->validated();
  std::shared_ptr<Replica> replica = admit(responder, valid.front().inputIds);
  if (!replica) return trace->finish(nullptr, std::nullopt, &kNotAdmitted);
  std::shared_ptr<HttpStream> httpStream;
  if (stream) {
    headers["Content-Type"] = "text/event-stream";
    headers["Cache-Control"] = "no-cache";
    headers["x-accel-buffering"] = "no";  // TGI's: proxies (nginx) must not buffer the stream
    httpStream = responder->startStream(200, headers);
  }
  std::vector<uint32_t> promptTokens, maxNewTokens;
  for (const ValidRequest& v : valid) {
    promptTokens.push_back(v.inputLength);
    maxNewTokens.push_back(v.maxNewTokens);
  }
  auto sink = std::make_shared<CompletionSink>(
      responder, httpStream, headers, req->model.value_or(options_.modelId), promptTokens,
      maxNewTokens, start, [this] { inFlight_.fetch_sub(1); }, metrics_, req->includeUsage);
  std::vector<std::shared_ptr<RequestControl>> controls;
  for (size_t i = 0; i < valid.size(); ++i) controls.push_back(std::make_shared<RequestControl>());
  cancelOnDisconnect(*responder, controls);
  sink->setControls(controls);
  sink->setTrace(trace);
  for (size_t i = 0; i < valid.size(); ++i) {
    replica->batcher->submit(nextId_++, std::move(valid[i]), controls[i],
                             std::make_shared<PromptSink>(sink, i, controls[i]));
  }
}

// TGI's /vertex (Google Vertex AI's prediction format): {"instances": [...]} -> {"predictions":
// [generated_text, ...]}. An instance is {"inputs", "parameters"} or a chat request ("messages").
// As TGI (router/src/vertex.rs): an "inputs" instance samples (do_sample) and takes only
// max_new_tokens (unset: up to max_total_tokens) and seed from its parameters; a chat instance goes
// through the chat template as /v1/chat/completions does, and its prediction is the raw generated
// text. Every instance is validated before any runs (a bad one is a 422 naming it; TGI answers 500
// there); a failure after admission is TGI's 500 "Incomplete generation".
void RouterApp::vertex(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  const auto start = std::chrono::steady_clock::now();
  auto trace = std::make_shared<RequestTrace>(request, "vertex");
  metrics_.counterAdd("tgi_request_count");
  const HttpHeaders headers = baseHeaders(request);
  auto fail = [&](const std::string& message) {
    metrics_.counterAdd("tgi_request_failure", 1, {{"err", "validation"}});
    responder->reply(422, errorJson(message, "validation"), headers);
    trace->finish(nullptr, std::nullopt, &message);
  };
  // In document order: a chat instance's tools and schemas show in its template as they were sent.
  auto body = parseOrderedJson(request.body, "the request body");
  if (!body.ok()) return fail(body.status().message());
  if (!body->is_object()) return fail("the request body must be an object with `instances`");
  auto it = body->find("instances");
  if (it == body->end() || !it->is_array())
    return fail("Failed to deserialize the JSON body into the target type: `instances` (a list)");
  const nlohmann::ordered_json& instances = *it;
  if (instances.empty()) return fail("Input validation error: `instances` cannot be empty");
  if (instances.size() > options_.maxClientBatchSize) {
    return fail("Number of instances exceeds the maximum allowed batch size of " +
                std::to_string(options_.maxClientBatchSize));
  }
  std::vector<ValidRequest> valid;
  for (size_t i = 0; i < instances.size(); ++i) {
    const nlohmann::ordered_json& instance = instances[i];
    const std::string at = "instances[" + std::to_string(i) + "]: ";
    if (!instance.is_object()) return fail(at + "expected an object");
    StatusOr<ValidRequest> v = invalidArgumentError("unset");
    if (instance.contains("inputs")) {
      auto parsed = parseGenerateRequest(instance.dump());
      if (!parsed.ok()) return fail(at + parsed.status().message());
      GenerateRequest g;
      g.inputs = std::move(parsed->inputs);
      g.parameters.doSample = true;
      g.parameters.maxNewTokens = parsed->parameters.maxNewTokens;
      g.parameters.seed = parsed->parameters.seed;
      v = validator_.validate(g, Endpoint::kGenerate);
    } else if (instance.contains("messages")) {
      auto chat = parseChatRequest(instance.dump());
      if (!chat.ok()) return fail(at + chat.status().message());
      auto prompt = chatPrompt(*chat, /*withTools=*/true);
      if (!prompt.ok()) return fail(at + prompt.status().message());
      v = validator_.validate(prompt->request, Endpoint::kCompletions);
    } else {
      return fail(at + "neither `inputs` nor `messages`");
    }
    if (!v.ok()) return fail(at + v.status().message());
    v->trace = trace->infer();
    valid.push_back(std::move(*v));
  }
  trace->validated();
  std::shared_ptr<Replica> replica = admit(responder, valid.front().inputIds);
  if (!replica) return trace->finish(nullptr, std::nullopt, &kNotAdmitted);
  std::vector<uint32_t> promptTokens, maxNewTokens;
  for (const ValidRequest& v : valid) {
    promptTokens.push_back(v.inputLength);
    maxNewTokens.push_back(v.maxNewTokens);
  }
  auto sink = std::make_shared<CompletionSink>(
      responder, nullptr, headers, options_.modelId, promptTokens, maxNewTokens, start,
      [this] { inFlight_.fetch_sub(1); }, metrics_, /*includeUsage=*/false, Shape::kVertex);
  std::vector<std::shared_ptr<RequestControl>> controls;
  for (size_t i = 0; i < valid.size(); ++i) controls.push_back(std::make_shared<RequestControl>());
  cancelOnDisconnect(*responder, controls);
  sink->setControls(controls);
  sink->setTrace(trace);
  for (size_t i = 0; i < valid.size(); ++i) {
    replica->batcher->submit(nextId_++, std::move(valid[i]), controls[i],
                             std::make_shared<PromptSink>(sink, i, controls[i]));
  }
}

}  // namespace textgen::router
