// A child process of the launcher: started with extra environment, its stdout read for a readiness
// line, its stderr forwarded with a prefix and its last lines kept for error reports.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::launcher {

class ChildProcess;

// What ChildProcess::waitAllReady waits for.
struct ReadyWait {
  std::string prefix;  // the readiness line starts with it
  std::chrono::seconds timeout{600};
  std::function<bool()> cancelled;  // asked every 100 ms; true gives up (a signal to the launcher)
  std::vector<ChildProcess*> running;  // ready before: one exiting fails the wait too
};

class ChildProcess {
 public:
  // Starts argv with the launcher's environment plus `env`.
  static StatusOr<std::unique_ptr<ChildProcess>> start(
      std::string name, std::vector<std::string> argv,
      const std::map<std::string, std::string>& env);
  ~ChildProcess();  // kills a child still running

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Waits until every child has printed a stdout line starting with `wait.prefix`, all at once
  // (tensor-parallel ranks meet each other before any is ready), and returns each line's rest, in
  // order. UNAVAILABLE when a child exits first (one already ready too: its peers would wait for
  // it) or the deadline passes, CANCELLED when `wait.cancelled` says so; `*culprit` is then the
  // child that exited or the first one not ready (nullptr when cancelled).
  static StatusOr<std::vector<std::string>> waitAllReady(const std::vector<ChildProcess*>& children,
                                                         const ReadyWait& wait,
                                                         ChildProcess** culprit);

  void signal(int sig);
  // Reaps the child if it has exited: its exit status (128 + signal when killed).
  std::optional<int> poll();
  // Waits up to `timeout` for exit; SIGKILL after that. Returns the exit status.
  int stop(std::chrono::milliseconds timeout);

  // Its last stderr lines; once it has exited, including what it wrote just before (up to 1 s).
  std::string lastLines();

 private:
  ChildProcess() = default;
  void readStderr();
  // Reads what stdout holds: the rest of a line starting with `prefix` once there is one;
  // UNAVAILABLE at end of file.
  StatusOr<std::optional<std::string>> readReadyLine(const std::string& prefix);

  std::string name_;
  pid_t pid_ = -1;
  int stdoutFd_ = -1, stderrFd_ = -1;
  std::string stdoutBuffer_;
  std::optional<int> status_;
  std::mutex mutex_;
  std::condition_variable stderrClosed_;
  bool stderrDone_ = false;
  std::deque<std::string> tail_;
  std::thread stderrThread_;
};

}  // namespace textgen::launcher
