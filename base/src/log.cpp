#include "textgen/base/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <iterator>
#include <utility>
#include <vector>

namespace textgen::log {
namespace {

thread_local std::vector<std::pair<std::string, std::string>> tFields;

void appendJsonString(spdlog::memory_buf_t& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (c < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

// {"timestamp":"2026-11-21T11:12:13.456789Z","level":"INFO","target":"router",
//  "message":"...","fields":{"request_id":"42"}}
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(msg.time.time_since_epoch());
    auto secs = std::chrono::floor<std::chrono::seconds>(micros);
    std::time_t t = secs.count();
    std::tm tm{};
    gmtime_r(&t, &tm);
    fmt::format_to(std::back_inserter(dest),
                   "{{\"timestamp\":\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z\",\"level\":",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   (micros - secs).count());
    std::string level(spdlog::level::to_string_view(msg.level).data(),
                      spdlog::level::to_string_view(msg.level).size());
    std::transform(level.begin(), level.end(), level.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (level == "WARNING") level = "WARN";
    appendJsonString(dest, level);
    dest.append(std::string_view(",\"target\":"));
    appendJsonString(dest, std::string_view(msg.logger_name.data(), msg.logger_name.size()));
    dest.append(std::string_view(",\"message\":"));
    appendJsonString(dest, std::string_view(msg.payload.data(), msg.payload.size()));
    if (!tFields.empty()) {
      dest.append(std::string_view(",\"fields\":{"));
      bool first = true;
      // In the order set; a key set again further in shadows the outer value.
      for (auto it = tFields.begin(); it != tFields.end(); ++it) {
        bool shadowed = std::any_of(std::next(it), tFields.end(),
                                    [&](const auto& f) { return f.first == it->first; });
        if (shadowed) continue;
        if (!first) dest.push_back(',');
        first = false;
        appendJsonString(dest, it->first);
        dest.push_back(':');
        appendJsonString(dest, it->second);
      }
      dest.push_back('}');
    }
    dest.append(std::string_view("}\n"));
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// Text mode appends the thread's fields as " key=value" after the message.
class FieldsFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    for (const auto& [key, value] : tFields) {
      dest.push_back(' ');
      dest.append(key);
      dest.push_back('=');
      dest.append(value);
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<FieldsFlag>();
  }
};

}  // namespace

StatusOr<spdlog::level::level_enum> parseLevel(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warn" || lower == "warning") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "critical") return spdlog::level::critical;
  if (lower == "off") return spdlog::level::off;
  return invalidArgumentError("unknown log level '" + std::string(text) +
                              "' (expected trace, debug, info, warn, error, critical or off)");
}

void init(const Options& options) {
  spdlog::sink_ptr sink = options.sink;
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(options.component, std::move(sink));
  if (options.format == Format::kJson) {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<FieldsFlag>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %^%-5l%$ %n: %v%*");
    logger->set_formatter(std::move(formatter));
  }
  logger->set_level(options.level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
}

ScopedField::ScopedField(std::string key, std::string value) {
  tFields.emplace_back(std::move(key), std::move(value));
}

ScopedField::~ScopedField() {
  tFields.pop_back();
}

}  // namespace textgen::log
