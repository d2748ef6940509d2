// A few persistent threads for a step's per-request host work: the update after a forward
// (detokenization, stop sequences, each request's result) sits between two GPU steps, and at a
// few hundred rows it is a millisecond on one core. The calling thread works too, and never waits
// for a worker to wake: a call ends when its items are done, whoever did them. One call at a time
// (the engine is driven by one thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace textgen::runtime {

class HostWorkers {
 public:
  // `threads` in all, the caller included; 1 or less runs everything on the caller.
  explicit HostWorkers(int threads);
  ~HostWorkers();
  HostWorkers(const HostWorkers&) = delete;
  HostWorkers& operator=(const HostWorkers&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(i) for every i in [0, n), spread over the threads, each i once; returns when every call
  // has returned. The first exception a call throws is rethrown here (the others still run).
  void forEach(size_t n, const std::function<void(size_t)>& fn);

  // The default size: half the cores (a tensor-parallel replica's ranks share a machine), at most
  // eight (past that the wake-ups cost more than the rows they take).
  static int defaultThreads();

 private:
  void loop();
  // Claims and runs items of job `generation` until none is left (or a later job started).
  void drain(uint32_t generation, const std::function<void(size_t)>* fn, size_t n);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  const std::function<void(size_t)>* job_ = nullptr;  // guarded by mu_
  size_t size_ = 0;                                   // guarded by mu_
  uint32_t generation_ = 0;                           // guarded by mu_: one per forEach
  bool stop_ = false;                                 // guarded by mu_
  // The claim counter: the job's generation in the high 32 bits, its next index in the low 32.
  // A worker that wakes after its job ended finds another generation there and claims nothing.
  std::atomic<uint64_t> claim_{0};
  std::atomic<size_t> done_{0};  // items of the current job that have returned
  std::mutex errorMu_;
  std::exception_ptr error_;  // guarded by errorMu_
};

}  // namespace textgen::runtime
