// What the fuzz targets share: where the fixtures are, an invariant check that aborts (libFuzzer
// then saves the input as a crash file), and a reader that takes selector bytes from the front of
// an input and leaves the rest as the payload, so that a seed is "selectors + a real file".
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace textgen::fuzz {

// tests/reference of the source tree, or TEXTGEN_FUZZ_FIXTURES (a packed campaign's copy).
inline std::string fixturesDir() {
  const char* env = std::getenv("TEXTGEN_FUZZ_FIXTURES");
  return env && *env ? env : TEXTGEN_FIXTURES;
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz: cannot read %s (set TEXTGEN_FUZZ_FIXTURES)\n", path.c_str());
    std::abort();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, what.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, what)                                                                  \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::textgen::fuzz::fail(__FILE__, __LINE__, std::string(#cond " -- ") + std::string(what)); \
  } while (0)

// Consumes an input from the front; past the end every read yields zeros / empty.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(reinterpret_cast<const char*>(data), size) {}
  uint8_t byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<uint8_t>(data_.front());
    data_.remove_prefix(1);
    return b;
  }
  uint16_t u16() { return static_cast<uint16_t>(byte() | (byte() << 8)); }
  std::string_view take(size_t n) {
    n = std::min(n, data_.size());
    std::string_view out = data_.substr(0, n);
    data_.remove_prefix(n);
    return out;
  }
  std::string_view rest() { return take(data_.size()); }
  // Up to `delimiter` (consumed, not returned), or the rest.
  std::string_view until(char delimiter) {
    const size_t at = data_.find(delimiter);
    if (at == std::string_view::npos) return rest();
    std::string_view out = take(at);
    data_.remove_prefix(1);
    return out;
  }
  bool empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

}  // namespace textgen::fuzz
