// Logging on spdlog: human-readable text, or one JSON object per line (--json-output), carrying the
// component name and any fields set on the current thread (request id, batch id, ...).
//
//   log::init({.component = "router", .format = log::Format::kJson});
//   log::ScopedField rid("request_id", "42");
//   spdlog::info("queued {} tokens", n);   //
//   {"timestamp":..,"level":"INFO",..,"fields":{"request_id":"42"}}
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

#include "textgen/base/status_or.h"

namespace textgen::log {

enum class Format { kText, kJson };

struct Options {
  std::string component = "textgen";
  spdlog::level::level_enum level = spdlog::level::info;
  Format format = Format::kText;
  spdlog::sink_ptr sink;  // null: stderr
};

// "trace", "debug", "info", "warn" (or "warning"), "error", "critical", "off"; case-insensitive.
StatusOr<spdlog::level::level_enum> parseLevel(std::string_view text);

// Installs the default logger. Call once at start-up, before threads log.
void init(const Options& options);

// Adds key=value to every record this thread logs while the object lives. Nested fields stack;
// a field with the same key shadows the outer one.
class ScopedField {
 public:
  ScopedField(std::string key, std::string value);
  ~ScopedField();
  ScopedField(const ScopedField&) = delete;
  ScopedField& operator=(const ScopedField&) = delete;
};

}  // namespace textgen::log
