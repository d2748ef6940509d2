// The tracing inputs from outside: a client's W3C `traceparent` header (any bytes, on every traced
// request and in every Prefill/Decode call's metadata) and an --otlp-endpoint value. Input: byte 0
// picks the parser; the rest is the value. Invariants: a parsed context is valid, and formatting it
// then parsing again gives it back (a version-00 value formats to itself); an endpoint either
// validates or is refused with a message naming the flag.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "textgen/tracing/tracing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    auto c = textgen::tracing::parseTraceparent(value);
    if (!c) return 0;
    FUZZ_CHECK(c->valid(), "a parsed traceparent with a zero id");
    const std::string again = textgen::tracing::formatTraceparent(*c);
    auto d = textgen::tracing::parseTraceparent(again);
    FUZZ_CHECK(d && d->traceId == c->traceId && d->spanId == c->spanId && d->sampled == c->sampled,
               "a formatted traceparent does not parse back");
    FUZZ_CHECK(again.size() == 55, "a formatted traceparent is not 55 characters");
  } else {
    const textgen::Status s = textgen::tracing::validateEndpoint(value);
    FUZZ_CHECK(s.ok() || s.message().find("--otlp-endpoint") != std::string::npos,
               "an endpoint refused without naming the flag");
    if (s.ok()) {
      std::string rest = value;
      for (const char* scheme : {"http://", "https://"})
        if (rest.rfind(scheme, 0) == 0) rest = rest.substr(std::string(scheme).size());
      if (!rest.empty() && rest.back() == '/') rest.pop_back();
      FUZZ_CHECK(!rest.empty() && rest.find_first_of(" \t\r\n/@") == std::string::npos &&
                     rest.find(':') != std::string::npos,
                 "an endpoint with whitespace, a path, credentials or no port accepted");
    }
  }
  return 0;
}
