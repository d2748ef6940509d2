#include "textgen/base/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <thread>
#include <vector>

#include "textgen/base/file.h"

namespace textgen {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// A whole decimal integer, nothing else.
std::optional<long long> parseInt(std::string_view s) {
  s = trim(s);
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> ratio(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<double>(quota) / static_cast<double>(period);
}

// A small kernel file's content; nullopt when absent or unreadable.
std::optional<std::string> readSmall(const std::string& path) {
  auto f = RegularFile::open(path);
  if (!f.ok()) return std::nullopt;
  auto text = f->readAll(65536);
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

void keepMin(std::optional<double>& best, std::optional<double> v) {
  if (v && (!best || *v < *best)) best = v;
}

// `path` ("/a/b") and each ancestor ("/a", "/") under `root`, innermost first. A path with ".."
// components (the kernel writes one for a group outside the reader's cgroup namespace) is not
// followed: the root alone, which is the reader's own group then. Nothing for a malformed path.
std::vector<std::string> dirsUp(const std::string& root, std::string_view path) {
  std::vector<std::string> out;
  if (path.empty() || path.front() != '/') return out;
  if (path.find("/..") != std::string_view::npos) {
    out.push_back(root);
    return out;
  }
  std::string p(path);
  while (!p.empty() && p.back() == '/') p.pop_back();
  while (true) {
    out.push_back(root + p);
    if (p.empty()) break;
    p.erase(p.rfind('/'));
  }
  return out;
}

}  // namespace

std::optional<double> parseCgroupV2CpuMax(std::string_view content) {
  content = trim(content);
  const size_t space = content.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view quota = content.substr(0, space), period = content.substr(space + 1);
  if (quota == "max") return std::nullopt;
  const auto q = parseInt(quota), p = parseInt(period);
  if (!q || !p) return std::nullopt;
  return ratio(*q, *p);
}

std::optional<double> parseCgroupV1Quota(std::string_view quotaUs, std::string_view periodUs) {
  const auto q = parseInt(quotaUs), p = parseInt(periodUs);
  if (!q || !p) return std::nullopt;
  return ratio(*q, *p);
}

std::optional<double> cgroupCpuLimit(std::string_view procSelfCgroup,
                                     const std::string& cgroupRoot) {
  std::optional<double> best;
  size_t start = 0;
  while (start < procSelfCgroup.size()) {
    size_t nl = procSelfCgroup.find('\n', start);
    if (nl == std::string_view::npos) nl = procSelfCgroup.size();
    const std::string_view line = procSelfCgroup.substr(start, nl - start);
    start = nl + 1;
    // hierarchy-id:controllers:path
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1),
                           path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {  // cgroup v2
      for (const std::string& dir : dirsUp(cgroupRoot, path)) {
        if (auto text = readSmall(dir + "/cpu.max")) keepMin(best, parseCgroupV2CpuMax(*text));
      }
      continue;
    }
    bool cpu = false;  // v1: the line whose controllers include "cpu"
    for (size_t b = 0; b <= controllers.size();) {
      size_t e = controllers.find(',', b);
      if (e == std::string_view::npos) e = controllers.size();
      cpu |= controllers.substr(b, e - b) == "cpu";
      b = e + 1;
    }
    if (!cpu) continue;
    for (const char* mount : {"/cpu,cpuacct", "/cpu", "/cpuacct,cpu"}) {
      for (const std::string& dir : dirsUp(cgroupRoot + mount, path)) {
        const auto q = readSmall(dir + "/cpu.cfs_quota_us");
        const auto p = readSmall(dir + "/cpu.cfs_period_us");
        if (q && p) keepMin(best, parseCgroupV1Quota(*q, *p));
      }
    }
  }
  return best;
}

namespace {

// CPUs in the calling thread's affinity mask (the process's, as the first call comes before any
// thread changes its own), with a mask large enough for the machine; 0 if unknown.
int affinityCpus() {
  for (int n = 1024; n <= (1 << 16); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return 0;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    const int rc = sched_getaffinity(0, bytes, set);
    const int err = errno;
    const int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return count;
    if (err != EINVAL) return 0;  // EINVAL: the kernel's mask is larger; try a larger one
  }
  return 0;
}

}  // namespace

int usableCpus() {
  static const int count = [] {
    double cpus = std::thread::hardware_concurrency();
    const int allowed = affinityCpus();
    if (allowed > 0 && (cpus <= 0 || allowed < cpus)) cpus = allowed;
    if (const auto self = readSmall("/proc/self/cgroup")) {
      if (const auto limit = cgroupCpuLimit(*self, "/sys/fs/cgroup")) {
        const double quota = std::ceil(*limit - 1e-9);
        cpus = cpus > 0 ? std::min(cpus, quota) : quota;
      }
    }
    // Compared as doubles first: a quota of 2^44 microseconds a millisecond is "unlimited", not
    // an int overflow.
    return cpus >= 1 ? static_cast<int>(std::min(cpus, 1e6)) : 1;
  }();
  return count;
}

}  // namespace textgen
