// Collectives between the tensor-parallel ranks of one model replica, beside the Backend: NCCL on
// CUDA (enqueued on the backend's stream, so they are recorded into CUDA graphs like any kernel),
// Gloo over TCP on the CPU. Every pointer is backend memory. Ranks find each other through a
// Rendezvous (TGI's MASTER_ADDR / MASTER_PORT), which afterwards watches that every peer stays
// alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "textgen/base/status_or.h"
#include "textgen/kernels/dtype.h"
#include "textgen/kernels/rms_norm.h"

namespace textgen::runtime {

class Backend;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual const char* name() const = 0;

  // In place: data[i] = sum over ranks of data[i]. Every rank gets the same bits.
  virtual Status allReduceSum(void* data, int64_t count, kernels::DType dtype) = 0;
  // out = [rank 0's `count` elements | rank 1's | ...]; `in` may not alias `out`.
  virtual Status allGather(const void* in, void* out, int64_t count, kernels::DType dtype) = 0;
  // In place: every rank gets root's data.
  virtual Status broadcast(void* data, int64_t count, kernels::DType dtype, int root) = 0;
  // The all-reduce after a row-parallel layer fused with the residual add and RMSNorm after it:
  // p.input holds this rank's partial sums [numTokens, hiddenSize]; they are summed over ranks,
  // then backend.rmsNorm(p) runs on the sum, as one kernel where the communicator has one. Without
  // a residual p.input holds the sum afterwards (as allReduceSum leaves it); with one, its
  // contents are unspecified. The default is allReduceSum then rmsNorm.
  virtual Status allReduceRmsNorm(Backend& backend, const kernels::RmsNormParams& p);
};

// A small key-value store served by rank 0 over TCP for the start-up handshake (NCCL's unique id,
// Gloo's addresses). Once every rank has joined, the connections stay open: when a peer's process
// ends, its connection closes and onPeerLost fires (rank 0 watches every rank, the others watch
// rank 0), so a group never waits silently for a dead member.
class Rendezvous {
 public:
  struct Options {
    std::string masterAddr = "127.0.0.1";
    int masterPort = 29500;
    int rank = 0;
    int worldSize = 1;
    // How long a rank waits for the others to join, and for a key.
    std::chrono::milliseconds timeout = std::chrono::minutes(10);
  };
  // Rank 0 listens on masterPort (every interface); the others connect to masterAddr:masterPort,
  // retrying until the timeout. UNAVAILABLE / DEADLINE_EXCEEDED naming the address otherwise.
  static StatusOr<std::unique_ptr<Rendezvous>> join(const Options& options);
  virtual ~Rendezvous() = default;

  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual const std::string& masterAddr() const = 0;
  virtual Status set(const std::string& key, std::string_view value) = 0;
  // Waits until the key is set (by any rank) or the timeout passes.
  virtual StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Every rank calls it: returns once all have (a barrier through the store).
  virtual Status barrier(const std::string& name) = 0;
  // From now on a lost peer calls `onLost` (once, from a background thread) with what happened.
  // The store is done with then: set/get on ranks other than 0 answer FAILED_PRECONDITION.
  virtual void watchPeers(std::function<void(const std::string&)> onLost) = 0;
};

struct CommunicatorOptions {
  // A collective that does not complete within this fails (Gloo) or ends the process (NCCL's
  // watchdog): a rank that hangs must not hang the others silently.
  std::chrono::milliseconds timeout = std::chrono::minutes(2);
  // A failed collective, or an error found outside any call (NCCL's asynchronous errors): the
  // group is unusable after it. May be called from a background thread; unset: logged (NCCL) or
  // only returned (Gloo).
  std::function<void(const std::string&)> onFatal;
};

// Gloo on the CPU backend, NCCL on the CUDA backend. The rendezvous must outlive the call only.
StatusOr<std::unique_ptr<Communicator>> makeCommunicator(Backend& backend, Rendezvous& rendezvous,
                                                         const CommunicatorOptions& options = {});

// The smallest of every rank's `value` (e.g. the KV blocks each rank's memory holds).
StatusOr<int64_t> allReduceMin(Backend& backend, Communicator& comm, int64_t value);

}  // namespace textgen::runtime
