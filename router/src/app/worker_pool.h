// A fixed set of threads running queued tasks: the routes' parsing, validation and tokenization
// run here (TGI's validation workers), not on the HTTP server's threads, so a burst of large
// prompts delays other large prompts, never /health or a stream's next token, and at most
// `threads` tokenizations hold their memory at once.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace textgen::router {

class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads) {
    for (unsigned i = 0; i < std::max(1u, threads); ++i) threads_.emplace_back([this] { run(); });
  }
  ~WorkerPool() { shutdown(); }
  // Runs the queued tasks, then ends the threads; post() refuses from then on. Idempotent.
  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task` unless `limit` tasks are already waiting (then false: the caller answers 429).
  bool post(std::function<void()> task, size_t limit) {
    {
      std::lock_guard lock(mutex_);
      if (stop_ || queue_.size() >= limit) return false;
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return true;
  }

 private:
  void run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace textgen::router
