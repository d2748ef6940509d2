// usableCpus' pieces: cgroup v2 and v1 quota files and /proc/self/cgroup over a fake cgroup tree.
#include "textgen/base/cpus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace textgen {
namespace {

namespace fs = std::filesystem;

TEST(CpusTest, CgroupV2CpuMax) {
  EXPECT_EQ(parseCgroupV2CpuMax("200000 100000\n"), 2.0);
  EXPECT_EQ(parseCgroupV2CpuMax("150000 100000"), 1.5);
  EXPECT_EQ(parseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  for (const char* bad : {"", "\n", "200000", "200000 ", " 100000", "abc 100000", "200000 abc",
                          "0 100000", "-5 100000", "200000 0", "200000 -1", "2e5 100000",
                          "200000 100000 7", "99999999999999999999999 1"}) {
    EXPECT_EQ(parseCgroupV2CpuMax(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(CpusTest, CgroupV1Quota) {
  EXPECT_EQ(parseCgroupV1Quota("400000\n", "100000\n"), 4.0);
  EXPECT_EQ(parseCgroupV1Quota("-1\n", "100000\n"), std::nullopt);  // no quota
  EXPECT_EQ(parseCgroupV1Quota("", "100000"), std::nullopt);
  EXPECT_EQ(parseCgroupV1Quota("50000", "x"), std::nullopt);
}

class CgroupTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("textgen-cgroup-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    root_ = base_ / "root";
    fs::remove_all(base_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(base_); }
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::optional<double> limit(const std::string& self) {
    return cgroupCpuLimit(self, root_.string());
  }
  fs::path base_, root_;
};

TEST_F(CgroupTreeTest, V2TakesTheSmallestQuotaOfTheGroupAndItsAncestors) {
  write("kubepods/pod1/cpu.max", "max 100000\n");
  write("kubepods/pod1/ctr/cpu.max", "350000 100000\n");
  write("kubepods/cpu.max", "1600000 100000\n");
  EXPECT_EQ(limit("0::/kubepods/pod1/ctr\n"), 3.5);
  write("kubepods/pod1/cpu.max", "250000 100000\n");
  EXPECT_EQ(limit("0::/kubepods/pod1/ctr\n"), 2.5);
}

TEST_F(CgroupTreeTest, V2InsideACgroupNamespace) {
  write("cpu.max", "100000 100000\n");  // the container's own group is the root it sees
  EXPECT_EQ(limit("0::/\n"), 1.0);
}

TEST_F(CgroupTreeTest, NoQuotaAnywhere) {
  write("a/cpu.max", "max 100000\n");
  EXPECT_EQ(limit("0::/a\n"), std::nullopt);
  EXPECT_EQ(limit("0::/missing/group\n"), std::nullopt);
  EXPECT_EQ(limit(""), std::nullopt);
}

TEST_F(CgroupTreeTest, V1CpuController) {
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n");
  write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n"), 2.0);
}

TEST_F(CgroupTreeTest, V1PathNotVisibleFallsBackToTheMountRoot) {
  // A container without a cgroup namespace: /proc/self/cgroup names the host's path, the mount
  // shows the container's own group at its root.
  write("cpu/cpu.cfs_quota_us", "300000\n");
  write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit("3:cpu:/kubepods/burstable/pod9/abc\n"), 3.0);
}

TEST_F(CgroupTreeTest, HostileContentIsIgnored) {
  write("cpu.max", "garbage\n");
  EXPECT_EQ(limit("0::/\n"), std::nullopt);
  // A valid quota at the root from here on: malformed lines must still read nothing.
  write("cpu.max", "200000 100000\n");
  for (const char* bad : {"no colons", "0:", "::", "0::", "0::relative", "x:cpu", "\n\n\n",
                          "1:memory:/", "0:cpu:relative"})
    EXPECT_EQ(limit(bad), std::nullopt) << bad;
  // A path that climbs out of the cgroup root (a group outside the reader's namespace) reads the
  // root's quota, never the one beside it.
  write("../escape/cpu.max", "100000 100000\n");
  EXPECT_EQ(limit("0::/../escape\n"), 2.0);
  EXPECT_EQ(limit("0::/a/../../escape\n"), 2.0);
}

TEST_F(CgroupTreeTest, V1MountRootWhenTheGroupIsOutsideTheNamespace) {
  write("cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
  write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(limit("5:cpu,cpuacct:/../../host/group\n"), 0.5);
}

TEST(CpusTest, AHugeQuotaIsNoLimit) {
  // The kernel accepts quotas up to about 2^44 us; per 1 ms that is far past any int.
  EXPECT_GT(*parseCgroupV2CpuMax("17592186044415 1000"), 1e9);
}

TEST(CpusTest, UsableCpusIsWithinTheMachine) {
  const int n = usableCpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(usableCpus(), n);
}

}  // namespace
}  // namespace textgen
