// Distributed tracing for the router and the shards: W3C trace context (`traceparent`), spans
// recorded with explicit start and end times, and an OTLP/gRPC exporter (TGI's --otlp-endpoint,
// --otlp-service-name) that batches them on its own thread through a bounded queue.
//
// Recording never blocks on the collector: record() takes a lock for a push, and when the queue is
// full, or an export fails (collector down, deadline), spans are dropped and counted. Without an
// exporter installed every call here is a cheap no-op.
//
// Sampling is OpenTelemetry's default, parent-based always-on: a span without a parent is sampled,
// a span with one follows the parent's sampled flag (a client's `traceparent` ending in -00 turns
// tracing off for its request, and the context still travels, unsampled).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::tracing {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

struct SpanContext {
  TraceId traceId = {};
  SpanId spanId = {};
  bool sampled = false;

  // W3C: neither id is all zeros.
  bool valid() const;
};

// Parses a W3C `traceparent` header value (version 00, or a later version read as 00 as the
// specification asks). Nothing for a malformed value: the request then starts a new trace.
std::optional<SpanContext> parseTraceparent(std::string_view value);
// "00-<trace id>-<span id>-<flags>".
std::string formatTraceparent(const SpanContext& context);

// A new trace (sampled), or a new span of `parent`'s trace with its sampled flag.
SpanContext newRoot();
SpanContext newChild(const SpanContext& parent);

enum class SpanKind { kInternal = 1, kServer = 2, kClient = 3 };

using AttributeValue = std::variant<std::string, int64_t, double, bool>;
struct Attribute {
  std::string key;
  AttributeValue value;
};

struct SpanData {
  SpanContext context;
  std::optional<SpanId> parent = {};  // the parent span's id, in context's trace
  bool parentRemote = false;          // the parent came from another process (a traceparent)
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  int64_t startUnixNs = 0;
  int64_t endUnixNs = 0;
  std::vector<Attribute> attributes = {};
  std::vector<SpanContext> links = {};
  uint32_t droppedLinks = 0;              // links left out (a bound on a span's size)
  std::optional<std::string> error = {};  // status ERROR with this message
};

// Unix time in nanoseconds, now or of a steady-clock instant (spans are recorded after the fact
// from the steady-clock times requests already keep).
int64_t unixNanos();
int64_t unixNanos(std::chrono::steady_clock::time_point t);

struct ExporterOptions {
  // The collector: http://host:port (plaintext, TGI's form), https://host:port (TLS), or host:port.
  std::string endpoint = {};
  std::string serviceName = "textgen";
  size_t maxQueueSpans = 2048;  // OpenTelemetry's BatchSpanProcessor defaults
  size_t maxBatchSpans = 512;
  std::chrono::milliseconds scheduleDelay{1000};
  std::chrono::milliseconds exportTimeout{10000};
};

// Checks an endpoint before anything starts: a clear error for a wrong scheme, host or port.
Status validateEndpoint(const std::string& endpoint);

struct ExporterCounts {
  uint64_t recorded = 0;  // spans handed to record() while sampled
  uint64_t exported = 0;  // spans the collector accepted
  uint64_t dropped = 0;   // spans lost: queue full, export failed or rejected
};

class Exporter {
 public:
  virtual ~Exporter() = default;
  virtual void record(SpanData span) = 0;
  virtual ExporterCounts counts() const = 0;
  // Exports what is queued, waiting at most `timeout` (at shutdown).
  virtual void flush(std::chrono::milliseconds timeout) = 0;
};

StatusOr<std::unique_ptr<Exporter>> makeOtlpExporter(ExporterOptions options);

// The process's exporter: installed once at startup (before any request); at shutdown what is
// queued is exported, waiting at most flushTimeout, and the exporter removed. record() is a no-op
// when none is installed or the span is not sampled.
void install(std::unique_ptr<Exporter> exporter);
void shutdown(std::chrono::milliseconds flushTimeout);
bool enabled();
void record(SpanData span);
ExporterCounts counts();

// The span a thread is working under, for a client call to carry in its metadata
// (`traceparent`): set for the extent of a scope.
std::optional<SpanContext> currentContext();
class ScopedContext {
 public:
  explicit ScopedContext(std::optional<SpanContext> context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  std::optional<SpanContext> previous_;
};

}  // namespace textgen::tracing
