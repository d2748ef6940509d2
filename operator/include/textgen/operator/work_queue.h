// A rate-limited work queue of object keys ("namespace/name"), as controllers use: a key is queued
// at most once, is never handed to two workers at a time (added again while being processed, it is
// queued once the worker is done), and failures come back after a per-key exponential backoff.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace textgen::op {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  WorkQueue(std::chrono::milliseconds baseDelay = std::chrono::milliseconds(50),
            std::chrono::milliseconds maxDelay = std::chrono::seconds(60))
      : base_(baseDelay), max_(maxDelay) {}

  void add(const std::string& key);
  void addAfter(const std::string& key, std::chrono::milliseconds delay);
  // Re-queues after the key's next backoff (doubling per failure since its last forget()).
  void addRateLimited(const std::string& key);
  void forget(const std::string& key);
  // The next ready key; nullopt once shut down.
  std::optional<std::string> get();
  void done(const std::string& key);
  void shutDown();
  size_t depth() const;
  int failures(const std::string& key) const;

 private:
  void promoteDue();  // moves due delayed keys to the queue (mutex held)

  std::chrono::milliseconds base_, max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> queued_, processing_, dirty_;
  std::multimap<Clock::time_point, std::string> delayed_;
  std::deque<std::string> fifo_;
  std::map<std::string, int> failures_;
  bool shutDown_ = false;
};

}  // namespace textgen::op
