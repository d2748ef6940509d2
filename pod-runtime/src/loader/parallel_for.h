// Load-time loops over a layer's millions of weights (conversion, quantization, packing) split
// across the machine's cores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace textgen::runtime {

// fn(begin, end) over [0, n) in one contiguous chunk per core, each chunk at least `grain` items
// (the caller's estimate of enough work to pay for a thread: ~64K elements); inline when one
// chunk holds everything. The chunk a thread writes is also the memory it first touches.
void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 64);

// The grain for a loop over rows of `rowElements` elements each: ~64K elements per thread.
inline int64_t rowGrain(int64_t rowElements) {
  return rowElements >= (int64_t{1} << 16) ? 1
                                           : (int64_t{1} << 16) / std::max<int64_t>(rowElements, 1);
}

}  // namespace textgen::runtime
