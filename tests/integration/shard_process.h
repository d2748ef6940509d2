// A textgen-shard child process for integration tests: started with its stdout on a pipe (the
// readiness line is the synchronisation, never a sleep), stopped with SIGTERM or killed on scope
// exit.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace textgen::testing {

// The shard process: started with a pipe on stdout, stopped with SIGTERM.
class ShardProcess {
 public:
  // `env`: variables set in the child only (a tensor-parallel rank's RANK, WORLD_SIZE, ...).
  ShardProcess(const std::string& binary, const std::string& model, const std::string& uds,
               const std::vector<std::pair<std::string, std::string>>& env = {}) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      // The CPU backend in float32 unless TEXTGEN_TEST_DEVICE names another device (the GPU
      // machine runs this test with "cuda": float32 there too, so the references still apply).
      const char* device = std::getenv("TEXTGEN_TEST_DEVICE");
      execl(binary.c_str(), binary.c_str(), "--model-id", model.c_str(), "--uds-path", uds.c_str(),
            "--kv-cache-memory", "4194304", "--threads", "1", "--log-level", "warn", "--device",
            device && *device ? device : "cpu", "--dtype", "float32", nullptr);
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~ShardProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_) fclose(out_);
  }
  // Blocks until the shard prints its readiness line (or exits).
  std::string waitReady() {
    char line[512];
    while (out_ && fgets(line, sizeof line, out_)) {
      std::string s(line);
      if (s.rfind("textgen-shard ready ", 0) == 0) return s.substr(20, s.size() - 21);
    }
    return {};
  }
  // Whether the process is still running (it has not exited or been killed).
  bool alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == 0) return true;
    pid_ = -1;
    return false;
  }
  // The exit code once the process ends within `seconds` (-1 if it does not, or did not exit).
  int waitExit(int seconds) {
    for (int i = 0; i < seconds * 10 && pid_ > 0; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      usleep(100000);
    }
    return -1;
  }
  int terminate() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

}  // namespace textgen::testing
