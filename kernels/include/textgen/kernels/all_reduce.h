// One-shot all-reduce (sum) over GPUs that can read each other's memory (NVLink peer access),
// for the small messages of a decode step, where NCCL's latency (~20 µs a call) would dominate.
// Every rank copies its data into its own staging buffer, signals every peer, waits for their
// signals, then reads all staging buffers and sums them in rank order, so every rank gets the same
// bits. Staging is double-buffered by call parity and each block keeps its own call counter in
// device memory, so the kernel replays correctly inside CUDA graphs. Every rank must make the same
// sequence of calls: each signal carries the call's element count, and a peer whose count differs
// (ranks out of step) traps the kernel, so the rank fails instead of summing unrelated data.
// Every kernel on the stream must wait for its predecessor before it ends (waitForPrimary): the
// staging reuse argument in all_reduce.cu relies on a call finishing only after the one before.
#pragma once

#include <cstddef>
#include <cstdint>

#include "textgen/base/status.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/stream.h"

namespace textgen::kernels {

inline constexpr int kAllReduceMaxRanks = 8;
inline constexpr int kAllReduceBlocks = 32;

// The device memory each rank contributes: staging for two calls, then the flags its peers write
// (each peer's call number), then the element count each peer's call carries.
struct AllReducePeerLayout {
  static constexpr size_t kSlots = kAllReduceBlocks * kAllReduceMaxRanks;
  static constexpr size_t flagsOffset(size_t capacityBytes) { return 2 * capacityBytes; }
  static constexpr size_t countsOffset(size_t capacityBytes) {
    return 2 * capacityBytes + sizeof(uint32_t) * kSlots;
  }
  static constexpr size_t bytes(size_t capacityBytes) {
    return 2 * capacityBytes + 2 * sizeof(uint32_t) * kSlots;
  }
};

struct OneShotAllReduceParams {
  void* data = nullptr;  // in place: [count] of dtype, 16-byte aligned, count * size % 16 == 0
  int64_t count = 0;
  DType dtype = DType::kF32;
  int rank = 0, worldSize = 1;
  // Each rank's AllReducePeerLayout region as this process addresses it (peers[rank] is local).
  void* peers[kAllReduceMaxRanks] = {};
  size_t capacityBytes = 0;      // staging bytes per call; count * size must fit
  uint32_t* counters = nullptr;  // [kAllReduceBlocks], local, zero-initialised once
};

// INVALID_ARGUMENT for a message it cannot take (size, alignment, ranks); the caller then uses
// its general all-reduce.
Status validateOneShotAllReduce(const OneShotAllReduceParams& p);
Status invokeOneShotAllReduce(const OneShotAllReduceParams& p, Stream stream);

}  // namespace textgen::kernels
