#include "textgen/launcher/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
  if (FILE* f = fdopen(dup(stderrFd_), "r")) {
    char line[4096];
    while (fgets(line, sizeof line, f)) {
      std::fprintf(stderr, "[%s] %s", name_.c_str(), line);
      std::lock_guard lock(mutex_);
      tail_.emplace_back(line);
      if (tail_.size() > 20) tail_.pop_front();
    }
    fclose(f);
  }
  std::lock_guard lock(mutex_);
  stderrDone_ = true;
  stderrClosed_.notify_all();
}

namespace {

Status exitedEarly(const ChildProcess& c, int status) {
  return unavailableError(c.name() + " exited with status " + std::to_string(status) +
                          " before every part was ready");
}

}  // namespace

StatusOr<std::optional<std::string>> ChildProcess::readReadyLine(const std::string& prefix) {
  char chunk[1024];
  const ssize_t n = read(stdoutFd_, chunk, sizeof chunk);
  if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
    return unavailableError(name_ + " closed its output before it was ready");
  if (n > 0) stdoutBuffer_.append(chunk, static_cast<size_t>(n));
  size_t nl;
  while ((nl = stdoutBuffer_.find('\n')) != std::string::npos) {
    const std::string line = stdoutBuffer_.substr(0, nl);
    stdoutBuffer_.erase(0, nl + 1);
    if (line.rfind(prefix, 0) == 0) return std::optional<std::string>(line.substr(prefix.size()));
  }
  return std::optional<std::string>();
}

StatusOr<std::vector<std::string>> ChildProcess::waitAllReady(
    const std::vector<ChildProcess*>& children, const ReadyWait& wait, ChildProcess** culprit) {
  using std::chrono::milliseconds;
  *culprit = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + wait.timeout;
  std::vector<std::optional<std::string>> rests(children.size());
  size_t ready = 0;
  while (ready < children.size()) {
    if (wait.cancelled && wait.cancelled()) return cancelledError("stopped while starting");
    for (const auto* group : {&children, &wait.running}) {
      for (ChildProcess* c : *group) {
        if (const std::optional<int> status = c->poll()) {
          *culprit = c;
          return exitedEarly(*c, *status);
        }
      }
    }
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::string late;
      for (size_t i = 0; i < children.size(); ++i) {
        if (rests[i]) continue;
        if (!*culprit) *culprit = children[i];
        late += (late.empty() ? "" : ", ") + children[i]->name_;
      }
      return unavailableError(late + " not ready within " + std::to_string(wait.timeout.count()) +
                              " s");
    }
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i) {
      if (rests[i]) continue;
      fds.push_back({children[i]->stdoutFd_, POLLIN, 0});
      which.push_back(i);
    }
    const int timeoutMs = static_cast<int>(std::clamp<int64_t>(left.count(), 1, 100));
    if (::poll(fds.data(), fds.size(), timeoutMs) <= 0) continue;  // a timeout, or a signal
    for (size_t j = 0; j < fds.size(); ++j) {
      if (fds[j].revents == 0) continue;
      ChildProcess* c = children[which[j]];
      auto line = c->readReadyLine(wait.prefix);
      if (!line.ok()) {
        // Its output closes as it exits: give the exit status a moment to show.
        *culprit = c;
        for (int i = 0; i < 100 && !c->poll(); ++i) std::this_thread::sleep_for(milliseconds(10));
        if (const std::optional<int> status = c->poll()) return exitedEarly(*c, *status);
        return line.status();
      }
      if (*line) {
        rests[which[j]] = std::move(**line);
        ++ready;
      }
    }
  }
  std::vector<std::string> out;
  for (auto& r : rests) out.push_back(std::move(*r));
  return out;
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

std::string ChildProcess::lastLines() {
  std::unique_lock lock(mutex_);
  if (status_)
    stderrClosed_.wait_for(lock, std::chrono::seconds(1), [this] { return stderrDone_; });
  std::string out;
  for (const std::string& l : tail_) out += "    " + l;
  return out;
}

}  // namespace textgen::launcher
