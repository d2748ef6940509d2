#include "engine/host_workers.h"

#include <algorithm>
#include <system_error>
#include <utility>

namespace textgen::runtime {

HostWorkers::HostWorkers(int threads) {
  for (int t = 1; t < threads; ++t) {
    try {
      workers_.emplace_back([this] { loop(); });
    } catch (const std::system_error&) {
      break;  // fewer threads than asked (a limit on threads): the caller does the rest
    }
  }
}

HostWorkers::~HostWorkers() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int HostWorkers::defaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 2), 1, 8);
}

void HostWorkers::drain(const std::function<void(size_t)>& fn, size_t n) {
  for (size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n;
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    try {
      fn(i);
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void HostWorkers::forEach(size_t n, const std::function<void(size_t)>& fn) {
  if (workers_.empty() || n < 2) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    size_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  drain(fn, n);
  std::exception_ptr error;
  {
    // Every worker leaves the job before the next one starts (a late one must not claim the
    // next job's indices with this job's function).
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    job_ = nullptr;
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void HostWorkers::loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* job = nullptr;
    size_t n = 0;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = size_;
    }
    drain(*job, n);
    std::lock_guard lock(mu_);
    if (--busy_ == 0) done_.notify_one();
  }
}

}  // namespace textgen::runtime
