// One HTTP request's trace, under TGI's span names: the request span (generate, generate_stream,
// chat_completions or completions), a child of the client's W3C `traceparent` when it sent one,
// with validate, queue, infer and send beneath it. The spans are recorded when the request ends,
// from the times the router keeps anyway; infer's id is chosen up front so that the Prefill and
// Decode steps the request takes part in (the batcher's spans, and the shards' beneath them) hang
// under it. Without an exporter installed, or for a request its client sent unsampled, it records
// nothing and costs a header lookup.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "textgen/router/batcher.h"
#include "textgen/router/http_server.h"
#include "textgen/tracing/tracing.h"

namespace textgen::router {

// The error of a request the router did not admit (it answered 503 or 429).
inline const std::string kNotAdmitted = "not admitted: no replica serves, or too many requests";

class RequestTrace {
 public:
  using Clock = std::chrono::steady_clock;

  RequestTrace(const HttpRequest& request, const char* name)
      : name_(name), startUnix_(tracing::unixNanos()) {
    if (!tracing::enabled()) return;
    parent_ = tracing::parseTraceparent(request.header("traceparent"));
    request_ = parent_ ? tracing::newChild(*parent_) : tracing::newRoot();
    if (request_.sampled) infer_ = tracing::newChild(request_);
  }

  // The infer span's context, for ValidRequest::trace: nothing when this request is not traced.
  std::optional<tracing::SpanContext> infer() const { return infer_; }
  void validated() { validated_ = Clock::now(); }
  void attribute(std::string key, tracing::AttributeValue value) {
    if (infer_) attributes_.push_back({std::move(key), std::move(value)});
  }

  // Records the spans, once: at the end of the response (after its last byte was handed to the
  // connection), with the batcher's times when the request reached it and the time generation
  // ended, or an error.
  void finish(const RequestTimes* times, std::optional<Clock::time_point> generated,
              const std::string* error = nullptr) {
    if (!infer_ || finished_) return;
    finished_ = true;
    const int64_t end = tracing::unixNanos();
    auto child = [&](const char* name, int64_t from, int64_t to, tracing::SpanContext ctx) {
      tracing::record({.context = ctx,
                       .parent = request_.spanId,
                       .name = name,
                       .startUnixNs = from,
                       .endUnixNs = to});
    };
    const int64_t validatedAt = validated_ ? tracing::unixNanos(*validated_) : end;
    child("validate", startUnix_, validatedAt, tracing::newChild(request_));
    if (times && times->queued != Clock::time_point{}) {
      const int64_t queued = tracing::unixNanos(times->queued);
      const bool batched = times->batched != Clock::time_point{};
      const int64_t inBatch = batched ? tracing::unixNanos(times->batched) : end;
      child("queue", queued, inBatch, tracing::newChild(request_));
      if (batched) {
        const int64_t done = generated ? tracing::unixNanos(*generated) : end;
        child("infer", inBatch, done, *infer_);
        if (generated) child("send", done, end, tracing::newChild(request_));
      }
    }
    tracing::SpanData span{.context = request_,
                           .parent = {},
                           .name = name_,
                           .kind = tracing::SpanKind::kServer,
                           .startUnixNs = startUnix_,
                           .endUnixNs = end,
                           .attributes = std::move(attributes_)};
    if (parent_) {
      span.parent = parent_->spanId;
      span.parentRemote = true;
    }
    if (error) span.error = *error;
    tracing::record(std::move(span));
  }

 private:
  std::string name_;
  int64_t startUnix_;
  std::optional<Clock::time_point> validated_;
  std::optional<tracing::SpanContext> parent_;
  tracing::SpanContext request_;
  std::optional<tracing::SpanContext> infer_;
  std::vector<tracing::Attribute> attributes_;
  bool finished_ = false;
};

}  // namespace textgen::router
