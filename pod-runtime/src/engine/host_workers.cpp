#include "engine/host_workers.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "textgen/base/cpus.h"
#include "textgen/base/thread_name.h"

namespace textgen::runtime {

HostWorkers::HostWorkers(int threads) {
  for (int t = 1; t < threads; ++t) {
    try {
      workers_.emplace_back([this] {
        setThreadName("tg-update");
        loop();
      });
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
  return std::clamp(usableCpus() / 2, 1, 8);
}

void HostWorkers::drain(uint32_t generation, const std::function<void(size_t)>* fn, size_t n) {
  const uint64_t tag = uint64_t{generation} << 32;
  uint64_t c = claim_.load(std::memory_order_acquire);
  while (true) {
    // Another job's counter, or this one's items all claimed: nothing more to take.
    if ((c & ~uint64_t{0xffffffff}) != tag || (c & 0xffffffff) >= n) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
    try {
      (*fn)(static_cast<size_t>(c & 0xffffffff));  // alive: its forEach waits for this item
    } catch (...) {
      std::lock_guard lock(errorMu_);
      if (!error_) error_ = std::current_exception();
    }
    // The caller returns once every item is done: past this, `fn` may be gone.
    done_.fetch_add(1, std::memory_order_acq_rel);
    c = claim_.load(std::memory_order_acquire);
  }
}

void HostWorkers::forEach(size_t n, const std::function<void(size_t)>& fn) {
  if (workers_.empty() || n < 2 || n > 0xffffffff) {
    std::exception_ptr error;
    for (size_t i = 0; i < n; ++i) {
      try {
        fn(i);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  uint32_t generation = 0;
  {
    std::lock_guard lock(mu_);
    generation = ++generation_;
    job_ = &fn;
    size_ = n;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(uint64_t{generation} << 32, std::memory_order_release);
  }
  wake_.notify_all();
  drain(generation, &fn, n);
  // The last items may still run on workers: each is a few microseconds.
  while (done_.load(std::memory_order_acquire) < n) std::this_thread::yield();
  std::exception_ptr error;
  {
    std::lock_guard lock(errorMu_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void HostWorkers::loop() {
  uint32_t seen = 0;
  while (true) {
    const std::function<void(size_t)>* job = nullptr;
    size_t n = 0;
    uint32_t generation = 0;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation = generation_;
      job = job_;
      n = size_;
    }
    drain(generation, job, n);  // claims nothing if that call has ended (job may be gone)
  }
}

}  // namespace textgen::runtime
