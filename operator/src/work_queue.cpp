#include "textgen/operator/work_queue.h"

#include <algorithm>

namespace textgen::op {

void WorkQueue::add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutDown_) return;
  if (processing_.count(key)) {
    dirty_.insert(key);  // queued again when its worker is done
    return;
  }
  if (queued_.insert(key).second) {
    fifo_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::addAfter(const std::string& key, std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return add(key);
  std::lock_guard<std::mutex> lock(mu_);
  if (shutDown_) return;
  delayed_.emplace(Clock::now() + delay, key);
  cv_.notify_one();
}

void WorkQueue::addRateLimited(const std::string& key) {
  int n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = failures_[key]++;
  }
  const auto delay =
      std::min<std::chrono::milliseconds>(max_, base_ * (int64_t{1} << std::min(n, 20)));
  addAfter(key, delay);
}

void WorkQueue::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::failures(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

void WorkQueue::promoteDue() {
  const auto now = Clock::now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    const std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    if (processing_.count(key)) {
      dirty_.insert(key);
    } else if (queued_.insert(key).second) {
      fifo_.push_back(key);
    }
  }
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutDown_) return std::nullopt;
    promoteDue();
    if (!fifo_.empty()) {
      std::string key = fifo_.front();
      fifo_.pop_front();
      queued_.erase(key);
      processing_.insert(key);
      return key;
    }
    if (delayed_.empty()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, delayed_.begin()->first);
    }
  }
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  processing_.erase(key);
  if (dirty_.erase(key) && !shutDown_ && queued_.insert(key).second) {
    fifo_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shutDown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutDown_ = true;
  cv_.notify_all();
}

size_t WorkQueue::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fifo_.size() + delayed_.size();
}

}  // namespace textgen::op
