#include "textgen/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace textgen::detail {

void checkFailed(const char* file, int line, const char* expr, const std::string& msg) {
  // stderr directly: the logger may be the thing that is broken.
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, expr, msg.empty() ? "" : ": ",
               msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace textgen::detail
