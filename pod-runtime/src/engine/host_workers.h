// A few persistent threads for a step's per-request host work: the update after a forward
// (detokenization, stop sequences, each request's result) sits between two GPU steps, and at a
// few hundred rows it is a millisecond on one core. The calling thread works too. One call at a
// time (the engine is driven by one thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
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
  void drain(const std::function<void(size_t)>& fn, size_t n);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* job_ = nullptr;  // guarded by mu_
  size_t size_ = 0;                                   // guarded by mu_
  uint64_t generation_ = 0;                           // guarded by mu_: one per forEach
  int busy_ = 0;                                      // guarded by mu_: workers in this job
  bool stop_ = false;                                 // guarded by mu_
  std::exception_ptr error_;                          // guarded by mu_
  std::atomic<size_t> next_{0};                       // the next index to claim
};

}  // namespace textgen::runtime
