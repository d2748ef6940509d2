#include "textgen/launcher/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

extern char** environ;

namespace textgen::launcher {

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::start(
    std::string name, std::vector<std::string> argv,
    const std::map<std::string, std::string>& env) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    return internalError("pipe() failed");
  // Build everything before fork: after it only async-signal-safe calls.
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    if (!env.contains(kv.substr(0, kv.find('=')))) envStrings.push_back(kv);
  }
  for (const auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envStrings) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return internalError("fork() failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    setpgid(0, 0);  // its own group: the terminal's Ctrl-C reaches the launcher, which stops it
    execve(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  std::unique_ptr<ChildProcess> c(new ChildProcess());
  c->name_ = std::move(name);
  c->pid_ = pid;
  c->stdoutFd_ = out[0];
  c->stderrFd_ = err[0];
  c->stderrThread_ = std::thread([raw = c.get()] { raw->readStderr(); });
  return c;
}

ChildProcess::~ChildProcess() {
  if (!status_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
  }
  if (stderrThread_.joinable()) stderrThread_.join();
  if (stdoutFd_ >= 0) close(stdoutFd_);
  if (stderrFd_ >= 0) close(stderrFd_);
}

void ChildProcess::readStderr() {
  FILE* f = fdopen(dup(stderrFd_), "r");
  if (!f) return;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    std::fprintf(stderr, "[%s] %s", name_.c_str(), line);
    std::lock_guard lock(mutex_);
    tail_.emplace_back(line);
    if (tail_.size() > 20) tail_.pop_front();
  }
  fclose(f);
}

StatusOr<std::string> ChildProcess::waitReady(const std::string& prefix,
                                              std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string buffer;
  char chunk[1024];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{stdoutFd_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0) continue;
    const ssize_t n = read(stdoutFd_, chunk, sizeof chunk);
    if (n <= 0) return unavailableError(name_ + " exited before it was ready");
    buffer.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
  }
  return unavailableError(name_ + " was not ready within " + std::to_string(timeout.count()) +
                          " s");
}

void ChildProcess::signal(int sig) {
  if (!status_ && pid_ > 0) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::poll() {
  if (status_) return status_;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_)
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return status_;
}

int ChildProcess::stop(std::chrono::milliseconds timeout) {
  signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!poll()) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    status_ = 128 + SIGKILL;
  }
  return *status_;
}

std::string ChildProcess::lastLines() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const std::string& l : tail_) out += "    " + l;
  return out;
}

}  // namespace textgen::launcher
