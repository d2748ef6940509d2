// Invariant checks that abort with file:line. For programming errors only: bad input is a Status.
#pragma once

#include <fmt/core.h>

#include <string>
#include <utility>

namespace textgen::detail {
[[noreturn]] void checkFailed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace textgen::detail

// TG_CHECK(cond) or TG_CHECK(cond, "format {}", args...). Always on, also in release builds.
#define TG_CHECK(cond, ...)                                                         \
  do {                                                                              \
    if (!(cond)) [[unlikely]] {                                                     \
      ::textgen::detail::checkFailed(__FILE__, __LINE__, #cond,                     \
                                     ::textgen::detail::checkMessage(__VA_ARGS__)); \
    }                                                                               \
  } while (0)

namespace textgen::detail {
inline std::string checkMessage() {
  return {};
}
template <typename... Args>
std::string checkMessage(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace textgen::detail
