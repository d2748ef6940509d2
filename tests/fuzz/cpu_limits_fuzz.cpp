// The CPU-quota readers of usableCpus (base/cpus.h) over any bytes, as a broken or hostile
// container runtime could leave in cpu.max, cpu.cfs_*_us and /proc/self/cgroup. Byte 0 picks the
// reader; the rest is the content. Invariants: a quota, when found, is a positive finite number of
// CPUs; /proc/self/cgroup content is resolved under a real cgroup root made for the run, which
// holds no quota ("max"), beside a directory that does: a quota found means a path left the root.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "textgen/base/cpus.h"

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "textgen-cpu-limits-fuzz-";

// libFuzzer may end the process without running atexit handlers: the trees of runs whose process
// is gone are removed at the next start.
void removeStaleTrees() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + kPrefix.size(), nullptr, 10);
    std::error_code rm;
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove_all(e.path(), rm);
  }
}

const fs::path& base() {
  static const fs::path dir = [] {
    removeStaleTrees();
    const fs::path d =
        fs::temp_directory_path() / (std::string(kPrefix) + std::to_string(::getpid()));
    fs::create_directories(d / "root" / "a");
    fs::create_directories(d / "escape");
    std::ofstream(d / "root" / "cpu.max") << "max 100000\n";
    std::ofstream(d / "root" / "a" / "cpu.max") << "max 100000\n";
    std::ofstream(d / "escape" / "cpu.max") << "100000 100000\n";
    std::ofstream(d / "cpu.max") << "100000 100000\n";
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(base(), ec);
    });
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::optional<double> v;
  switch (data[0] % 3) {
    case 0: v = textgen::parseCgroupV2CpuMax(text); break;
    case 1: {
      const size_t nl = text.find('\n');
      v = nl == std::string_view::npos
              ? textgen::parseCgroupV1Quota(text, "100000")
              : textgen::parseCgroupV1Quota(text.substr(0, nl), text.substr(nl + 1));
      break;
    }
    default: {
      v = textgen::cgroupCpuLimit(text, (base() / "root").string());
      FUZZ_CHECK(!v, "a quota read from outside the cgroup root");
      break;
    }
  }
  FUZZ_CHECK(!v || (std::isfinite(*v) && *v > 0), "a quota that is not a positive number of CPUs");
  return 0;
}
