#include "textgen/tracing/tracing.h"

#include <gtest/gtest.h>

#include <thread>

namespace textgen::tracing {
namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceparentTest, ParsesAndFormatsW3C) {
  auto c = parseTraceparent(kValid);
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->sampled);
  EXPECT_EQ(c->traceId[0], 0x4b);
  EXPECT_EQ(c->spanId[7], 0xb7);
  EXPECT_EQ(formatTraceparent(*c), kValid);
  auto unsampled = parseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(unsampled);
  EXPECT_FALSE(unsampled->sampled);
  EXPECT_TRUE(parseTraceparent(std::string(" ") + kValid + "\t"));  // optional whitespace
  // A later version: read as 00, fields after a '-' ignored.
  EXPECT_TRUE(parseTraceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what"));
  EXPECT_TRUE(parseTraceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
}

TEST(TraceparentTest, RefusesMalformedValues) {
  for (const char* bad : {
           "",
           "00",
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // uppercase
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // forbidden version
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // 00 has no more fields
           "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // no '-' before more
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",   // misplaced dash
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",   // not hex
           "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
       })
    EXPECT_FALSE(parseTraceparent(bad)) << bad;
}

TEST(TraceparentTest, NewSpansKeepTheTraceAndFlag) {
  const SpanContext root = newRoot();
  EXPECT_TRUE(root.valid());
  EXPECT_TRUE(root.sampled);
  const SpanContext child = newChild(root);
  EXPECT_EQ(child.traceId, root.traceId);
  EXPECT_NE(child.spanId, root.spanId);
  SpanContext off = root;
  off.sampled = false;
  EXPECT_FALSE(newChild(off).sampled);
  EXPECT_NE(newRoot().traceId, root.traceId);
}

TEST(ExporterTest, ValidatesEndpoints) {
  for (const char* ok : {"http://localhost:4317", "https://collector.example:4317/",
                         "10.0.0.1:4317", "http://[::1]:4317"})
    EXPECT_TRUE(validateEndpoint(ok).ok()) << ok;
  for (const char* bad : {"", "http://", "http://localhost", "grpc://h:4317", "http://h:0",
                          "http://h:65536", "http://h:43x7", "http://h:4317/v1/traces",
                          "http://user@h:4317", "http://[::1]4317", "http://:4317"}) {
    Status s = validateEndpoint(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--otlp-endpoint"), std::string::npos) << s.message();
  }
}

SpanData span(const SpanContext& c) {
  return {.context = c, .name = "x", .startUnixNs = unixNanos(), .endUnixNs = unixNanos()};
}

// No collector listens on the port: every export fails fast, its spans dropped and counted, and
// recording never waits.
TEST(ExporterTest, DropsAndCountsWhenTheCollectorIsDown) {
  auto e = makeOtlpExporter({.endpoint = "http://127.0.0.1:1",
                             .maxQueueSpans = 8,
                             .maxBatchSpans = 4,
                             .scheduleDelay = std::chrono::milliseconds(20),
                             .exportTimeout = std::chrono::milliseconds(500)});
  ASSERT_TRUE(e.ok()) << e.status().message();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) (*e)->record(span(newRoot()));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  (*e)->flush(std::chrono::seconds(5));
  const ExporterCounts c = (*e)->counts();
  EXPECT_EQ(c.recorded, 100u);
  EXPECT_EQ(c.exported, 0u);
  EXPECT_EQ(c.dropped, 100u);  // over the queue's bound, or failed exports
}

TEST(ExporterTest, GlobalRecordIsANoOpWhenOffOrUnsampled) {
  record(span(newRoot()));  // nothing installed
  EXPECT_EQ(counts().recorded, 0u);
  auto e = makeOtlpExporter({.endpoint = "127.0.0.1:1", .scheduleDelay = std::chrono::hours(1)});
  ASSERT_TRUE(e.ok());
  install(std::move(*e));
  EXPECT_TRUE(enabled());
  SpanContext off = newRoot();
  off.sampled = false;
  record(span(off));
  record(span(newRoot()));
  EXPECT_EQ(counts().recorded, 1u);
  shutdown(std::chrono::seconds(5));
  EXPECT_FALSE(enabled());
  EXPECT_FALSE(makeOtlpExporter({.endpoint = "127.0.0.1:1", .serviceName = ""}).ok());
}

TEST(ContextTest, ScopedContextNests) {
  EXPECT_FALSE(currentContext());
  const SpanContext a = newRoot(), b = newRoot();
  {
    ScopedContext sa(a);
    EXPECT_EQ(currentContext()->spanId, a.spanId);
    {
      ScopedContext sb(b);
      EXPECT_EQ(currentContext()->spanId, b.spanId);
    }
    EXPECT_EQ(currentContext()->spanId, a.spanId);
    std::thread([] { EXPECT_FALSE(currentContext()); }).join();
  }
  EXPECT_FALSE(currentContext());
}

}  // namespace
}  // namespace textgen::tracing
