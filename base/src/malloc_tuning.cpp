#include "textgen/base/malloc_tuning.h"

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace textgen {

void tuneMallocForServing() {
#if defined(__GLIBC__)
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) (void)mallopt(M_MMAP_THRESHOLD, 4 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) (void)mallopt(M_TRIM_THRESHOLD, 16 << 20);
#endif
}

}  // namespace textgen
