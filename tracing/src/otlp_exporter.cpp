// The OTLP/gRPC span exporter: OpenTelemetry's batch span processor, small. Spans queue in memory
// (bounded); one thread sends them in batches to the collector's TraceService/Export, every
// scheduleDelay or as soon as a batch is full. A failed export drops its batch (counted, logged at
// most every 30 s): nothing retries into an unbounded backlog, and serving never waits on it.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "textgen/base/log.h"
#include "textgen/otlp/v1/trace_service.grpc.pb.h"
#include "textgen/tracing/tracing.h"

namespace textgen::tracing {
namespace otlp = opentelemetry::proto::collector::trace::v1;

namespace {

struct Target {
  std::string address;  // host:port, as gRPC takes it
  bool tls = false;
};

StatusOr<Target> parseEndpoint(const std::string& endpoint) {
  auto bad = [&](const std::string& why) {
    return invalidArgumentError("--otlp-endpoint '" + endpoint + "': " + why +
                                " (expected http://host:port, https://host:port or host:port)");
  };
  std::string rest = endpoint;
  Target t;
  if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    t.tls = true;
  } else if (rest.find("://") != std::string::npos) {
    return bad("the scheme is neither http nor https");
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();  // OTLP/gRPC has no path
  if (rest.find('/') != std::string::npos) return bad("OTLP/gRPC takes no path");
  size_t colon;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return bad("an IPv6 address needs [addr]:port");
    colon = close + 1;
  } else {
    colon = rest.rfind(':');
    if (colon == std::string::npos) return bad("no port");
  }
  const std::string host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (host.empty() || host == "[]") return bad("no host");
  for (char c : host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '@' || c == '?' || c == '#')
      return bad("the host has a character hosts never have");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port is not a number");
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return bad("the port is out of range");
  t.address = rest;
  return t;
}

void setValue(otlp::AnyValue* out, const AttributeValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) {
    out->set_string_value(*s);
  } else if (auto* i = std::get_if<int64_t>(&v)) {
    out->set_int_value(*i);
  } else if (auto* d = std::get_if<double>(&v)) {
    out->set_double_value(*d);
  } else {
    out->set_bool_value(std::get<bool>(v));
  }
}

void addAttribute(google::protobuf::RepeatedPtrField<otlp::KeyValue>* out, const std::string& key,
                  const AttributeValue& v) {
  otlp::KeyValue* kv = out->Add();
  kv->set_key(key);
  setValue(kv->mutable_value(), v);
}

std::string bytes(const uint8_t* p, size_t n) {
  return std::string(reinterpret_cast<const char*>(p), n);
}

void toProto(const SpanData& s, otlp::Span* out) {
  out->set_trace_id(bytes(s.context.traceId.data(), s.context.traceId.size()));
  out->set_span_id(bytes(s.context.spanId.data(), s.context.spanId.size()));
  if (s.parent) out->set_parent_span_id(bytes(s.parent->data(), s.parent->size()));
  out->set_name(s.name);
  out->set_kind(static_cast<otlp::Span::SpanKind>(s.kind));
  out->set_start_time_unix_nano(static_cast<uint64_t>(s.startUnixNs));
  out->set_end_time_unix_nano(static_cast<uint64_t>(std::max(s.endUnixNs, s.startUnixNs)));
  // W3C trace flags (bit 0: sampled), and OTLP's bit 8 (whether the parent is remote is known)
  // and bit 9 (it is).
  out->set_flags(0x100 | (s.parent && s.parentRemote ? 0x200 : 0) | (s.context.sampled ? 1 : 0));
  for (const Attribute& a : s.attributes) addAttribute(out->mutable_attributes(), a.key, a.value);
  for (const SpanContext& l : s.links) {
    otlp::Span::Link* link = out->add_links();
    link->set_trace_id(bytes(l.traceId.data(), l.traceId.size()));
    link->set_span_id(bytes(l.spanId.data(), l.spanId.size()));
    link->set_flags(0x100 | (l.sampled ? 1 : 0));
  }
  out->set_dropped_links_count(s.droppedLinks);
  if (s.error) {
    out->mutable_status()->set_code(otlp::Status::STATUS_CODE_ERROR);
    out->mutable_status()->set_message(*s.error);
  }
}

class OtlpExporter final : public Exporter {
 public:
  OtlpExporter(ExporterOptions options, Target target)
      : options_(std::move(options)), target_(std::move(target)) {
    auto credentials = target_.tls ? grpc::SslCredentials(grpc::SslCredentialsOptions())
                                   : grpc::InsecureChannelCredentials();
    stub_ = otlp::TraceService::NewStub(grpc::CreateChannel(target_.address, credentials));
    thread_ = std::thread([this] { run(); });
  }

  ~OtlpExporter() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      if (inFlight_) inFlight_->TryCancel();
    }
    wake_.notify_all();
    thread_.join();
    counts_.dropped += queue_.size();  // never sent (flush() came first, or its time ran out)
  }

  void record(SpanData span) override {
    {
      std::lock_guard lock(mutex_);
      ++counts_.recorded;
      if (queue_.size() >= options_.maxQueueSpans) {
        ++counts_.dropped;
        return;
      }
      queue_.push_back(std::move(span));
      if (queue_.size() < options_.maxBatchSpans) return;
    }
    wake_.notify_all();
  }

  ExporterCounts counts() const override {
    std::lock_guard lock(mutex_);
    return counts_;
  }

  void flush(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    const uint64_t target = ++flushRequests_;
    wake_.notify_all();
    flushed_.wait_for(lock, timeout, [&] { return flushesDone_ >= target || stop_; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, options_.scheduleDelay, [&] {
        return stop_ || queue_.size() >= options_.maxBatchSpans || flushRequests_ > flushesDone_;
      });
      if (stop_) break;
      const uint64_t flushing = flushRequests_;
      while (!queue_.empty() && !stop_) {
        std::vector<SpanData> batch;
        while (!queue_.empty() && batch.size() < options_.maxBatchSpans) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        lock.unlock();
        exportBatch(batch);
        lock.lock();
      }
      flushesDone_ = flushing;
      flushed_.notify_all();
    }
  }

  // Called without the lock.
  void exportBatch(const std::vector<SpanData>& batch) {
    otlp::ExportTraceServiceRequest request;
    otlp::ResourceSpans* rs = request.add_resource_spans();
    addAttribute(rs->mutable_resource()->mutable_attributes(), "service.name",
                 options_.serviceName);
    addAttribute(rs->mutable_resource()->mutable_attributes(), "telemetry.sdk.name",
                 std::string("textgen"));
    otlp::ScopeSpans* ss = rs->add_scope_spans();
    ss->mutable_scope()->set_name("textgen");
    for (const SpanData& s : batch) toProto(s, ss->add_spans());

    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + options_.exportTimeout);
    otlp::ExportTraceServiceResponse response;
    {
      std::lock_guard lock(mutex_);
      if (stop_) {
        counts_.dropped += batch.size();
        return;
      }
      inFlight_ = &ctx;
    }
    const grpc::Status status = stub_->Export(&ctx, request, &response);
    std::unique_lock lock(mutex_);
    inFlight_ = nullptr;
    const uint64_t rejected = status.ok() ? static_cast<uint64_t>(std::max<int64_t>(
                                                0, response.partial_success().rejected_spans()))
                                          : batch.size();
    counts_.exported += batch.size() - std::min<uint64_t>(rejected, batch.size());
    counts_.dropped += std::min<uint64_t>(rejected, batch.size());
    if (rejected == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (lastWarning_ && now - *lastWarning_ < std::chrono::seconds(30)) return;
    lastWarning_ = now;
    const uint64_t dropped = counts_.dropped;
    lock.unlock();  // a log write never holds up record()
    spdlog::warn("otlp: {} of {} spans not exported to {}: {} ({} dropped so far)", rejected,
                 batch.size(), options_.endpoint,
                 status.ok() ? response.partial_success().error_message() : status.error_message(),
                 dropped);
  }

  const ExporterOptions options_;
  const Target target_;
  std::unique_ptr<otlp::TraceService::Stub> stub_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, flushed_;
  std::deque<SpanData> queue_;
  ExporterCounts counts_;
  uint64_t flushRequests_ = 0, flushesDone_ = 0;
  grpc::ClientContext* inFlight_ = nullptr;
  std::optional<std::chrono::steady_clock::time_point> lastWarning_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

Status validateEndpoint(const std::string& endpoint) {
  return parseEndpoint(endpoint).status();
}

StatusOr<std::unique_ptr<Exporter>> makeOtlpExporter(ExporterOptions options) {
  TG_ASSIGN_OR_RETURN(Target target, parseEndpoint(options.endpoint));
  if (options.serviceName.empty()) return invalidArgumentError("--otlp-service-name is empty");
  if (options.maxBatchSpans == 0 || options.maxQueueSpans < options.maxBatchSpans)
    return invalidArgumentError("OTLP exporter: the queue must hold at least one batch");
  return std::unique_ptr<Exporter>(std::make_unique<OtlpExporter>(std::move(options), target));
}

}  // namespace textgen::tracing
