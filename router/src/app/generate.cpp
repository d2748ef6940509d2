// The generation routes: /generate, POST / (TGI's compat route), /generate_stream (Server-Sent
// Events), /v1/completions (OpenAI). Sinks run on the batcher's delivery thread and answer the
// client from there, so no HTTP thread waits for a generation.
#include <chrono>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>

#include "request_trace.h"
#include "textgen/router/router_app.h"

namespace textgen::router {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* finishReason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEosToken: return "eos_token";
    case FinishReason::kStopSequence: return "stop_sequence";
  }
  return "length";
}

json logprob(float v) {
  return std::isnan(v) ? json(nullptr) : json(v);
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Everything one request produced, gathered step by step.
struct Collected {
  std::vector<json> tokens;
  std::vector<json> topTokens;
  json prefill = json::array();
  std::optional<GeneratedText> generated;
  double logprobSum = 0;
  RequestTimes times;
  Clock::time_point end;
};

json tokenJson(const TokenList& t, size_t i) {
  return {{"id", t.ids[i]},
          {"text", t.texts[i]},
          {"logprob", logprob(t.logprobs[i])},
          {"special", t.isSpecial[i] ? true : false}};
}

void absorb(Collected& c, const Generation& g) {
  if (g.prefillTokens) {
    for (size_t i = 0; i < g.prefillTokens->ids.size(); ++i) {
      c.prefill.push_back({{"id", g.prefillTokens->ids[i]},
                           {"text", g.prefillTokens->texts[i]},
                           {"logprob", logprob(g.prefillTokens->logprobs[i])}});
    }
  }
  for (size_t i = 0; i < g.tokens.ids.size(); ++i) {
    c.tokens.push_back(tokenJson(g.tokens, i));
    c.logprobSum += std::isnan(g.tokens.logprobs[i]) ? 0 : g.tokens.logprobs[i];
  }
  for (const TokenList& top : g.topTokens) {
    json list = json::array();
    for (size_t i = 0; i < top.ids.size(); ++i) list.push_back(tokenJson(top, i));
    c.topTokens.push_back(list);
  }
  if (g.generatedText) {
    c.generated = g.generatedText;
    c.end = Clock::now();
  }
}

}  // namespace

// Request bookkeeping shared by the routes: timings, metrics and TGI's x-* headers.
// TGI's x-compute-type: COMPUTE_TYPE from the environment, else its default.
const std::string& computeType() {
  static const std::string type = [] {
    const char* t = std::getenv("COMPUTE_TYPE");
    return std::string(t && *t ? t : "gpu+optimized");
  }();
  return type;
}

struct RequestTracker {
  RequestTracker(MetricsRegistry& m, std::atomic<uint32_t>& f, const HttpRequest& r,
                 const char* span)
      : metrics(m), inFlight(f), trace(r, span) {}
  MetricsRegistry& metrics;
  std::atomic<uint32_t>& inFlight;
  RequestTrace trace;
  Clock::time_point start = Clock::now();
  Clock::time_point validated;
  uint32_t inputLength = 0;
  uint64_t inputCharacters = 0;
  bool released = false;

  void release() {
    if (!released) {
      released = true;
      inFlight.fetch_sub(1);
    }
  }

  HttpHeaders finishHeaders(const Collected& c) const {
    using std::chrono::duration;
    const auto total = c.end - start;
    const auto validation = validated - start;
    const auto queue = c.times.batched - c.times.queued;
    const auto inference = c.end - c.times.batched;
    const uint32_t generated = c.generated ? c.generated->generatedTokens : 0;
    const auto perToken = generated ? inference / generated : inference;
    auto ms = [](auto d) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    return {{"x-compute-type", computeType()},
            {"x-compute-time", std::to_string(duration<double>(total).count())},
            {"x-compute-characters", std::to_string(inputCharacters)},
            {"x-total-time", ms(total)},
            {"x-validation-time", ms(validation)},
            {"x-queue-time", ms(queue)},
            {"x-inference-time", ms(inference)},
            {"x-time-per-token", ms(perToken)},
            {"x-prompt-tokens", std::to_string(inputLength)},
            {"x-generated-tokens", std::to_string(generated)}};
  }

  void recordSuccess(const Collected& c, uint32_t maxNewTokens) {
    using std::chrono::duration;
    const double inference = duration<double>(c.end - c.times.batched).count();
    const uint32_t generated = c.generated ? c.generated->generatedTokens : 0;
    metrics.counterAdd("tgi_request_success");
    metrics.histogramObserve("tgi_request_duration", duration<double>(c.end - start).count());
    metrics.histogramObserve("tgi_request_validation_duration",
                             duration<double>(validated - start).count());
    metrics.histogramObserve("tgi_request_queue_duration",
                             duration<double>(c.times.batched - c.times.queued).count());
    metrics.histogramObserve("tgi_request_inference_duration", inference);
    metrics.histogramObserve("tgi_request_mean_time_per_token_duration",
                             generated ? inference / generated : inference);
    metrics.histogramObserve("tgi_request_generated_tokens", generated);
    metrics.histogramObserve("tgi_request_max_new_tokens", maxNewTokens);
  }
};

namespace {

json detailsJson(const Collected& c, const ValidRequest& v) {
  json d{{"finish_reason", finishReason(c.generated->reason)},
         {"generated_tokens", c.generated->generatedTokens},
         {"seed", c.generated->seed ? json(*c.generated->seed) : json(nullptr)},
         {"prefill", v.decoderInputDetails ? c.prefill : json::array()},
         {"tokens", c.tokens}};
  if (v.topNTokens > 0) d["top_tokens"] = c.topTokens;
  return d;
}

// /generate and POST /: collects every sequence (best_of of them), replies once.
class GenerateSink final : public ResponseSink, public std::enable_shared_from_this<GenerateSink> {
 public:
  GenerateSink(std::shared_ptr<HttpResponder> responder, HttpHeaders headers, ValidRequest request,
               size_t sequences, bool compatList, std::shared_ptr<RequestTracker> tracker)
      : responder_(std::move(responder)),
        headers_(std::move(headers)),
        request_(std::move(request)),
        results_(sequences),
        compatList_(compatList),
        tracker_(std::move(tracker)) {}

  // One sink per sequence forwards here with its index.
  void onSequence(size_t index, const Generation& g, const RequestTimes& times) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    Collected& c = results_[index];
    c.times = times;
    absorb(c, g);
    if (c.generated && ++finished_ == results_.size()) respond();
  }
  // The controls of every sequence: when one fails, the others stop too (nobody waits for them).
  void setControls(std::vector<std::shared_ptr<RequestControl>> controls) {
    std::lock_guard lock(mutex_);
    controls_ = std::move(controls);
  }
  void onSequenceError(const Status& e) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    for (const auto& c : controls_) c->cancel();
    tracker_->release();
    const GenerationError err = generationError(e);
    if (err.countAs) tracker_->metrics.counterAdd("tgi_request_failure", 1, {{"err", err.countAs}});
    if (err.status) responder_->reply(err.status, errorJson(e.message(), err.type), headers_);
    tracker_->trace.finish(&results_[0].times, std::nullopt, &e.message());
  }
  void onSequenceAdmitted(size_t index, const RequestTimes& times) {
    std::lock_guard lock(mutex_);
    results_[index].times = times;
  }
  void onGeneration(const Generation& g, const RequestTimes& t) override { onSequence(0, g, t); }
  void onError(const Status& e) override { onSequenceError(e); }
  void onAdmitted(const RequestTimes& t) override { onSequenceAdmitted(0, t); }

 private:
  void respond() {
    done_ = true;
    tracker_->release();
    size_t best = 0;
    for (size_t i = 1; i < results_.size(); ++i) {
      if (results_[i].logprobSum > results_[best].logprobSum) best = i;
    }
    const Collected& c = results_[best];
    const std::string& prefix = request_.fullTextPrefix;
    json out{{"generated_text", prefix + c.generated->text}};
    if (request_.details) {
      json d = detailsJson(c, request_);
      if (results_.size() > 1) {
        json others = json::array();
        for (size_t i = 0; i < results_.size(); ++i) {
          if (i == best) continue;
          json o = detailsJson(results_[i], request_);
          o["generated_text"] = prefix + results_[i].generated->text;
          o.erase("best_of_sequences");
          others.push_back(o);
        }
        d["best_of_sequences"] = others;
      }
      out["details"] = d;
    }
    tracker_->recordSuccess(c, request_.maxNewTokens);
    HttpHeaders h = headers_;
    for (auto& [k, v] : tracker_->finishHeaders(c)) h[k] = v;
    responder_->reply(200, dump(compatList_ ? json::array({out}) : out), h);
    tracker_->trace.attribute("generated_tokens", int64_t{c.generated->generatedTokens});
    tracker_->trace.finish(&c.times, c.end);
  }

  std::mutex mutex_;
  std::shared_ptr<HttpResponder> responder_;
  HttpHeaders headers_;
  ValidRequest request_;
  std::vector<Collected> results_;
  std::vector<std::shared_ptr<RequestControl>> controls_;
  size_t finished_ = 0;
  bool done_ = false;
  bool compatList_;
  std::shared_ptr<RequestTracker> tracker_;
};

// Routes one of best_of sequences to the shared GenerateSink.
class SequenceSink final : public ResponseSink {
 public:
  SequenceSink(std::shared_ptr<GenerateSink> parent, size_t index)
      : parent_(std::move(parent)), index_(index) {}
  void onGeneration(const Generation& g, const RequestTimes& t) override {
    parent_->onSequence(index_, g, t);
  }
  void onError(const Status& e) override { parent_->onSequenceError(e); }
  void onAdmitted(const RequestTimes& t) override { parent_->onSequenceAdmitted(index_, t); }

 private:
  std::shared_ptr<GenerateSink> parent_;
  size_t index_;
};

// /generate_stream: one SSE event per token, the last with generated_text and details.
class StreamSink final : public ResponseSink {
 public:
  StreamSink(std::shared_ptr<HttpStream> stream, ValidRequest request,
             std::shared_ptr<RequestControl> control, std::shared_ptr<RequestTracker> tracker)
      : stream_(std::move(stream)),
        request_(std::move(request)),
        control_(std::move(control)),
        tracker_(std::move(tracker)) {}

  void onGeneration(const Generation& g, const RequestTimes& times) override {
    if (done_) return;
    c_.times = times;
    const size_t before = c_.tokens.size();
    absorb(c_, g);
    for (size_t i = before; i < c_.tokens.size(); ++i) {
      json event{{"index", i + 1},
                 {"token", c_.tokens[i]},
                 {"generated_text", nullptr},
                 {"details", nullptr}};
      // As TGI's StreamResponse: top_tokens only when there are some, details on the last event
      // only when the request asked for them.
      if (i < c_.topTokens.size() && !c_.topTokens[i].empty())
        event["top_tokens"] = c_.topTokens[i];
      const bool last = i + 1 == c_.tokens.size() && c_.generated;
      if (last) event["generated_text"] = request_.fullTextPrefix + c_.generated->text;
      if (last && request_.details) {
        event["details"] = {
            {"finish_reason", finishReason(c_.generated->reason)},
            {"generated_tokens", c_.generated->generatedTokens},
            {"seed", c_.generated->seed ? json(*c_.generated->seed) : json(nullptr)},
            {"input_length", request_.inputLength}};
      }
      if (!stream_->write("data:" + dump(event) + "\n\n")) {
        control_->cancel();  // the client left: the batcher drops the request this step
        break;
      }
    }
    if (c_.generated) {
      tracker_->recordSuccess(c_, request_.maxNewTokens);
      finish();
      tracker_->trace.attribute("generated_tokens", int64_t{c_.generated->generatedTokens});
      tracker_->trace.finish(&c_.times, c_.end);
    } else if (control_->cancelled()) {
      finish();
      const std::string left = "the client went away";
      tracker_->trace.finish(&c_.times, std::nullopt, &left);
    }
  }

  void onAdmitted(const RequestTimes& times) override { c_.times = times; }

  void onError(const Status& e) override {
    if (done_) return;
    const GenerationError err = generationError(e);
    if (err.countAs) tracker_->metrics.counterAdd("tgi_request_failure", 1, {{"err", err.countAs}});
    if (err.status) stream_->write("data:" + errorJson(e.message(), err.type) + "\n\n");
    finish();
    tracker_->trace.finish(&c_.times, std::nullopt, &e.message());
  }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    tracker_->release();
    stream_->close();
  }
  bool done_ = false;
  std::shared_ptr<HttpStream> stream_;
  ValidRequest request_;
  std::shared_ptr<RequestControl> control_;
  std::shared_ptr<RequestTracker> tracker_;
  Collected c_;
};

}  // namespace

// Parses and validates; on failure replies 422 and returns nothing.
static std::optional<ValidRequest> validated(const HttpRequest& request, const Validator& validator,
                                             Endpoint endpoint, MetricsRegistry& metrics,
                                             HttpResponder& responder, const HttpHeaders& headers,
                                             RequestTrace& trace, bool compat) {
  metrics.counterAdd("tgi_request_count");
  auto parsed = parseGenerateRequest(request.body);
  // TGI's compat routes default return_full_text to the model's pipeline (text-generation: true).
  if (parsed.ok() && compat && !parsed->parameters.returnFullText)
    parsed->parameters.returnFullText = true;
  StatusOr<ValidRequest> v =
      parsed.ok() ? validator.validate(*parsed, endpoint) : StatusOr<ValidRequest>(parsed.status());
  if (!v.ok()) {
    metrics.counterAdd("tgi_request_failure", 1, {{"err", "validation"}});
    responder.reply(422, errorJson(v.status().message(), "validation"), headers);
    trace.finish(nullptr, std::nullopt, &v.status().message());
    return std::nullopt;
  }
  metrics.histogramObserve("tgi_request_input_length", v->inputLength);
  trace.validated();
  trace.attribute("input_length", int64_t{v->inputLength});
  v->trace = trace.infer();
  return std::move(*v);
}

void RouterApp::generate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                         bool compat) {
  auto tracker = std::make_shared<RequestTracker>(metrics_, inFlight_, request, "generate");
  const HttpHeaders headers = baseHeaders(request);
  auto v = validated(request, validator_, Endpoint::kGenerate, metrics_, *responder, headers,
                     tracker->trace, compat);
  if (!v) return;
  tracker->validated = Clock::now();
  tracker->inputLength = v->inputLength;
  tracker->inputCharacters = v->inputCharacters;
  std::shared_ptr<Replica> replica = admit(responder, v->inputIds);
  if (!replica) return tracker->trace.finish(nullptr, std::nullopt, &kNotAdmitted);
  const size_t n = v->bestOf;
  auto sink = std::make_shared<GenerateSink>(responder, headers, *v, n, compat, tracker);
  std::vector<std::shared_ptr<RequestControl>> controls;
  for (size_t i = 0; i < n; ++i) controls.push_back(std::make_shared<RequestControl>());
  cancelOnDisconnect(*responder, controls);  // TGI drops a request whose client left
  sink->setControls(controls);
  for (size_t i = 0; i < n; ++i) {
    ValidRequest copy = *v;
    if (n > 1) copy.seed = v->seed + i;  // each best_of sequence samples differently
    std::shared_ptr<ResponseSink> s = n == 1 ? std::static_pointer_cast<ResponseSink>(sink)
                                             : std::make_shared<SequenceSink>(sink, i);
    replica->batcher->submit(nextId_++, std::move(copy), controls[i], s);
  }
}

void RouterApp::generateStream(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                               bool compat) {
  auto tracker = std::make_shared<RequestTracker>(metrics_, inFlight_, request, "generate_stream");
  HttpHeaders headers = baseHeaders(request);
  auto v = validated(request, validator_, Endpoint::kGenerateStream, metrics_, *responder, headers,
                     tracker->trace, compat);
  if (!v) return;
  tracker->validated = Clock::now();
  tracker->inputLength = v->inputLength;
  tracker->inputCharacters = v->inputCharacters;
  std::shared_ptr<Replica> replica = admit(responder, v->inputIds);
  if (!replica) return tracker->trace.finish(nullptr, std::nullopt, &kNotAdmitted);
  headers["Content-Type"] = "text/event-stream";
  headers["Cache-Control"] = "no-cache";
  headers["x-accel-buffering"] = "no";
  headers["x-compute-type"] = computeType();
  headers["x-compute-characters"] = std::to_string(v->inputCharacters);
  auto stream = responder->startStream(200, headers);
  auto control = std::make_shared<RequestControl>();
  cancelOnDisconnect(*responder, {control});  // also while it waits in the queue
  replica->batcher->submit(nextId_++, *v, control,
                           std::make_shared<StreamSink>(stream, *v, control, tracker));
}

}  // namespace textgen::router
