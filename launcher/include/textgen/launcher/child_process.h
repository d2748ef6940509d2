// A child process of the launcher: started with extra environment, its stdout read for a readiness
// line, its stderr forwarded with a prefix and its last lines kept for error reports.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::launcher {

class ChildProcess {
 public:
  // Starts argv with the launcher's environment plus `env`.
  static StatusOr<std::unique_ptr<ChildProcess>> start(
      std::string name, std::vector<std::string> argv,
      const std::map<std::string, std::string>& env);
  ~ChildProcess();  // kills a child still running

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Waits for a stdout line starting with `prefix` and returns its rest; UNAVAILABLE when the child
  // exits first or the deadline passes.
  StatusOr<std::string> waitReady(const std::string& prefix, std::chrono::seconds timeout);

  void signal(int sig);
  // Reaps the child if it has exited: its exit status (128 + signal when killed).
  std::optional<int> poll();
  // Waits up to `timeout` for exit; SIGKILL after that. Returns the exit status.
  int stop(std::chrono::milliseconds timeout);

  std::string lastLines() const;

 private:
  ChildProcess() = default;
  void readStderr();

  std::string name_;
  pid_t pid_ = -1;
  int stdoutFd_ = -1, stderrFd_ = -1;
  std::optional<int> status_;
  mutable std::mutex mutex_;
  std::deque<std::string> tail_;
  std::thread stderrThread_;
};

}  // namespace textgen::launcher
