#include "textgen/tracing/tracing.h"

#include <mutex>
#include <random>
#include <thread>

namespace textgen::tracing {
namespace {

bool allZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // W3C trace context: lowercase only
}

// Lowercase hex into `out` (n bytes from 2n characters).
bool parseHex(std::string_view s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    const int hi = hexDigit(s[2 * i]), lo = hexDigit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

void appendHex(std::string& s, const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
}

// Ids from a per-thread generator seeded from the OS: never all zeros.
template <size_t N>
std::array<uint8_t, N> randomId() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{
        rd(), rd(), rd(), rd(),
        static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id()))};
    return std::mt19937_64(seq);
  }());
  std::array<uint8_t, N> id{};
  do {
    for (size_t i = 0; i < N; i += 8) {
      const uint64_t v = rng();
      for (size_t j = 0; j < 8 && i + j < N; ++j) id[i + j] = static_cast<uint8_t>(v >> (8 * j));
    }
  } while (allZero(id.data(), N));
  return id;
}

std::mutex gMutex;
std::shared_ptr<Exporter> gExporter;  // read under gMutex, used outside it
std::atomic<bool> gEnabled{false};
thread_local std::optional<SpanContext> tCurrent;

}  // namespace

bool SpanContext::valid() const {
  return !allZero(traceId.data(), traceId.size()) && !allZero(spanId.data(), spanId.size());
}

std::optional<SpanContext> parseTraceparent(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  uint8_t version = 0, flags = 0;
  if (!parseHex(v.substr(0, 2), &version, 1) || version == 0xff) return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
  if (version == 0 ? v.size() != 55 : v.size() > 55 && v[55] != '-') return std::nullopt;
  SpanContext c;
  if (!parseHex(v.substr(3, 32), c.traceId.data(), 16) ||
      !parseHex(v.substr(36, 16), c.spanId.data(), 8) || !parseHex(v.substr(53, 2), &flags, 1))
    return std::nullopt;
  if (!c.valid()) return std::nullopt;
  c.sampled = flags & 1;
  return c;
}

std::string formatTraceparent(const SpanContext& c) {
  std::string s = "00-";
  appendHex(s, c.traceId.data(), c.traceId.size());
  s += '-';
  appendHex(s, c.spanId.data(), c.spanId.size());
  s += c.sampled ? "-01" : "-00";
  return s;
}

SpanContext newRoot() {
  return {.traceId = randomId<16>(), .spanId = randomId<8>(), .sampled = true};
}

SpanContext newChild(const SpanContext& parent) {
  return {.traceId = parent.traceId, .spanId = randomId<8>(), .sampled = parent.sampled};
}

int64_t unixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t unixNanos(std::chrono::steady_clock::time_point t) {
  const auto sinceThen = std::chrono::steady_clock::now() - t;
  return unixNanos() - std::chrono::duration_cast<std::chrono::nanoseconds>(sinceThen).count();
}

void install(std::unique_ptr<Exporter> exporter) {
  std::lock_guard lock(gMutex);
  gExporter = std::move(exporter);
  gEnabled = gExporter != nullptr;
}

void shutdown(std::chrono::milliseconds flushTimeout) {
  std::shared_ptr<Exporter> e;
  {
    std::lock_guard lock(gMutex);
    e = std::move(gExporter);
    gEnabled = false;
  }
  if (e) e->flush(flushTimeout);  // the exporter ends with the last reference
}

bool enabled() {
  return gEnabled.load(std::memory_order_relaxed);
}

void record(SpanData span) {
  if (!enabled() || !span.context.sampled) return;
  std::shared_ptr<Exporter> e;
  {
    std::lock_guard lock(gMutex);
    e = gExporter;
  }
  if (e) e->record(std::move(span));
}

ExporterCounts counts() {
  std::shared_ptr<Exporter> e;
  {
    std::lock_guard lock(gMutex);
    e = gExporter;
  }
  return e ? e->counts() : ExporterCounts{};
}

std::optional<SpanContext> currentContext() {
  return tCurrent;
}

ScopedContext::ScopedContext(std::optional<SpanContext> context) : previous_(tCurrent) {
  tCurrent = context;
}

ScopedContext::~ScopedContext() {
  tCurrent = previous_;
}

}  // namespace textgen::tracing
