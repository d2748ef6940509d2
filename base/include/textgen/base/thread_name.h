// Names the calling thread (at most 15 characters shown), so that `top -H`, perf and gdb tell the
// batching, delivery, sender and worker threads apart.
#pragma once

#include <pthread.h>

namespace textgen {

inline void setThreadName(const char* name) {
  (void)pthread_setname_np(pthread_self(), name);  // too long a name: left unnamed
}

}  // namespace textgen
