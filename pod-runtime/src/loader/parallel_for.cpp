#include "loader/parallel_for.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "textgen/base/cpus.h"

namespace textgen::runtime {

void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  const int64_t threads =
      std::clamp<int64_t>(usableCpus(), 1, std::max<int64_t>(n / std::max<int64_t>(grain, 1), 1));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(fn, b, e);
  }
  fn(0, std::min(n, chunk));  // the calling thread takes the first chunk
  for (std::thread& t : pool) t.join();
}

}  // namespace textgen::runtime
