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
// Blocks per call: a fixed number per communicator (every call, every rank), at most this many.
inline constexpr int kAllReduceMaxBlocks = 128;
inline constexpr int kAllReduceDefaultBlocks =
    64;  // measured best of 32, 64, 128 (bench/README.md)

// The device memory each rank contributes: staging for two calls, then the flags its peers write
// (each peer's call number), then the element count each peer's call carries.
struct AllReducePeerLayout {
  static constexpr size_t kSlots = kAllReduceMaxBlocks * kAllReduceMaxRanks;
  static constexpr size_t flagsOffset(size_t capacityBytes) { return 2 * capacityBytes; }
  static constexpr size_t countsOffset(size_t capacityBytes) {
    return 2 * capacityBytes + sizeof(uint32_t) * kSlots;
  }
  static constexpr size_t bytes(size_t capacityBytes) {
    return 2 * capacityBytes + 2 * sizeof(uint32_t) * kSlots;
  }
};

// Two protocols share the kernels' shape (block b of every rank, a fixed grid, counters on the
// device so that graphs replay them):
// - kFlags: each rank stages its data in its own region, signals every peer with a flag, waits for
//   theirs, then reads every peer's staging over NVLink (two NVLink crossings and a system fence).
// - kLamport (TensorRT-LLM's low-latency all-reduce): each rank writes its data straight into a
//   slot of every peer's region, and readers poll their own memory until no 16-bit element of it
//   holds the "empty" pattern (-0.0, 0x8000), so the data is its own signal (one NVLink crossing,
//   no fence). Senders write a -0.0 element as +0.0 (the sum may then be +0.0 where the flags
//   protocol gives -0.0; every rank still gets the same bits). Buffers rotate over three calls:
//   call n receives in buffer n % 3 and refills buffer (n - 1) % 3 with the empty pattern (a peer
//   is at most one call ahead, so it never writes the buffer being refilled). 16-bit types only.
//   A slot starts with a header (kLamportHeaderBytes, data after it): the call's element count and
//   sequence number (never the empty pattern), which block 0 of each reader compares with its own,
//   trapping on a difference (ranks out of step), as the flags protocol's signals carry the count.
enum class AllReduceProtocol : int32_t { kFlags = 0, kLamport = 1 };

// A rank's Lamport region: 3 buffers of worldSize slots of slotBytes (slot r holds rank r's data,
// after its header; slotBytes a multiple of 128),
// filled once with kLamportEmptyWord (invokeLamportReset) before any peer may write into it.
struct LamportPeerLayout {
  static constexpr size_t bytes(size_t slotBytes, int worldSize) {
    return 3 * static_cast<size_t>(worldSize) * slotBytes;
  }
  static constexpr size_t slotOffset(size_t slotBytes, int worldSize, int buffer, int slot) {
    return (static_cast<size_t>(buffer) * worldSize + slot) * slotBytes;
  }
};
inline constexpr uint32_t kLamportEmptyWord = 0x80008000u;
inline constexpr size_t kLamportHeaderBytes = 128;  // keeps a slot's data 128-byte aligned
// The state a Lamport communicator keeps per block, zero-initialised: [this call's buffer, 0 to 2]
// [previous call's count][sequence number].
inline constexpr size_t kLamportCounterWords = 3 * kAllReduceMaxBlocks;

// Whether the Lamport protocol takes a message (from values every rank shares).
bool lamportAllReduceTakes(int64_t count, DType dtype, size_t slotBytes);
// Fills a Lamport region with the empty pattern (bytes a multiple of 16, 16-byte aligned).
Status invokeLamportReset(void* region, size_t bytes, Stream stream);

struct OneShotAllReduceParams {
  void* data = nullptr;  // in place: [count] of dtype, 16-byte aligned, count * size % 16 == 0
  int64_t count = 0;
  DType dtype = DType::kF32;
  int rank = 0, worldSize = 1;
  // Each rank's AllReducePeerLayout region as this process addresses it (peers[rank] is local).
  void* peers[kAllReduceMaxRanks] = {};
  size_t capacityBytes = 0;      // staging bytes per call; count * size must fit
  uint32_t* counters = nullptr;  // [kAllReduceMaxBlocks], local, zero-initialised once
  // The grid: the same in every call of a communicator and on every rank (block b's counter and
  // flags pair up with block b's of each peer).
  int blocks = kAllReduceDefaultBlocks;
  // kLamport: peers are LamportPeerLayout regions, capacityBytes is the slot size, counters hold
  // kLamportCounterWords words.
  AllReduceProtocol protocol = AllReduceProtocol::kFlags;
};

// INVALID_ARGUMENT for a message it cannot take (size, alignment, ranks); the caller then uses
// its general all-reduce.
Status validateOneShotAllReduce(const OneShotAllReduceParams& p);
Status invokeOneShotAllReduce(const OneShotAllReduceParams& p, Stream stream);

// The one-shot all-reduce fused with the residual add and RMSNorm that follow a row-parallel
// layer (TensorRT-LLM's fused all-reduce): rms_norm.h's contract applied to the reduced sum,
//   s           = sum over ranks of data      (rounded to dtype, the all-reduce's result)
//   sum         = s + residual                (rounded; residualOut = sum)
//   output      = weight * round(sum * rsqrt(mean(sum^2) + eps))
// the rounding steps of invokeOneShotAllReduce followed by invokeRmsNorm, and their bits for rows
// of up to 512 16-byte units (hidden 4096 in 16-bit types); past that the mean of squares is
// summed in another order (the last bit of the scale may differ). Without a
// residual, sum = s is also written back to data (the plain all-reduce's in-place result). With
// one, data's contents afterwards are unspecified. Block b handles rows b, b + blocks,
// ... and keeps a row in registers, so a row may hold at most kAllReduceRmsNormMaxUnits 16-byte
// units; it takes at most `blocks` rows (decode-sized batches: one row per block; larger
// ones normalise faster with the plain pair). Both kernels let the next kernel launch at once
// (programmatic dependent launch), so a GEMV's weight reads overlap the reduction.
inline constexpr int64_t kAllReduceRmsNormMaxUnits = 2048;

struct OneShotAllReduceRmsNormParams {
  OneShotAllReduceParams allReduce;  // data, count = rows * hidden: this rank's partial sums
  const void* residual = nullptr;    // [rows, hidden] or null
  void* residualOut = nullptr;       // [rows, hidden]; required exactly when residual is set
  void* output = nullptr;            // [rows, hidden]; may alias data when there is a residual
  const void* weight = nullptr;      // [hidden]
  int64_t rows = 0, hidden = 0;
  float eps = 1e-6f;
  const void* prefetch = nullptr;  // RmsNormParams' hint: each block asks for its share at once
  size_t prefetchBytes = 0;
};

// Whether the fused kernel takes this shape (size, row width), from values every rank shares, so
// every rank takes the same path; callers use the plain all-reduce and RMSNorm otherwise.
bool oneShotAllReduceRmsNormFits(int64_t rows, int64_t hidden, DType dtype, size_t capacityBytes,
                                 int blocks);
Status validateOneShotAllReduceRmsNorm(const OneShotAllReduceRmsNormParams& p);
Status invokeOneShotAllReduceRmsNorm(const OneShotAllReduceRmsNormParams& p, Stream stream);

}  // namespace textgen::kernels
