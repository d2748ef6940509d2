// The CPU-quota readers of usableCpus (base/cpus.h) over any bytes, as a broken or hostile
// container runtime could leave in cpu.max, cpu.cfs_*_us and /proc/self/cgroup. Byte 0 picks the
// reader; the rest is the content. Invariants: a quota, when found, is a positive finite number of
// CPUs; /proc/self/cgroup content is resolved under a root that does not exist, so nothing is read
// and no path climbs out of it.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "textgen/base/cpus.h"

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
    default: v = textgen::cgroupCpuLimit(text, "/nonexistent-textgen-cgroup-root"); break;
  }
  FUZZ_CHECK(!v || (std::isfinite(*v) && *v > 0), "a quota that is not a positive number of CPUs");
  FUZZ_CHECK(!(data[0] % 3 == 2 && v), "a quota read from a root that does not exist");
  return 0;
}
