// How many CPUs this process may keep busy: the CPUs its affinity mask allows (taskset, cpusets,
// Kubernetes' static CPU manager), capped by the cgroup's CPU quota (a container's limits.cpu,
// docker --cpus), rounded up as the Go and Java runtimes round it.
// std::thread::hardware_concurrency counts the machine's CPUs instead: a pod limited to 4 CPUs on a
// 128-core node would start a pool sized for 128 and spend its quota being throttled.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace textgen {

// At least 1. Computed once per process (the first call reads /proc and /sys).
int usableCpus();

// The pieces, exposed for tests and the fuzz target (malformed content gives nullopt, never a
// throw):
// - cgroup v2's cpu.max ("<quota> <period>" in microseconds, or "max <period>"): quota / period.
std::optional<double> parseCgroupV2CpuMax(std::string_view content);
// - cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (a quota of -1: none).
std::optional<double> parseCgroupV1Quota(std::string_view quotaUs, std::string_view periodUs);
// - The smallest quota, in CPUs, that applies to the process whose /proc/self/cgroup content is
//   `procSelfCgroup`, under the cgroup file systems mounted at `cgroupRoot` (/sys/fs/cgroup):
//   v2 ("0::/path"), each ancestor's cpu.max up to the root; v1 (a "cpu" controller line), the
//   cfs files of the group and its ancestors under cpu,cpuacct/ or cpu/ (so the mount's root when
//   the group's path is not visible there: a container without a cgroup namespace). A path with
//   ".." (a group outside the reader's namespace) reads the root only; a malformed one nothing.
std::optional<double> cgroupCpuLimit(std::string_view procSelfCgroup,
                                     const std::string& cgroupRoot);

}  // namespace textgen
