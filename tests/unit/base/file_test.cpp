// RegularFile: regular files only, opened without blocking; reads bounded.
#include "textgen/base/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace textgen {
namespace {

namespace fs = std::filesystem;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("textgen-file-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(RegularFileTest, ReadsARegularFile) {
  std::ofstream(path("a.json"), std::ios::binary) << "{\"x\": 1}";
  auto text = readRegularFile(path("a.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"x\": 1}");
  auto file = RegularFile::open(path("a.json"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->size(), 8u);
  EXPECT_GE(file->fd(), 0);
  // Through a symlink, as in the hub cache's snapshots.
  fs::create_symlink(path("a.json"), path("link.json"));
  EXPECT_TRUE(readRegularFile(path("link.json")).ok());
}

TEST_F(RegularFileTest, FifoIsRefusedAtOnce) {
  ASSERT_EQ(::mkfifo(path("config.json").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto text = readRegularFile(path("config.json"));  // a blocking open would never return
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), path("config.json") + ": is a FIFO, not a regular file");
}

TEST_F(RegularFileTest, DirectoriesDevicesAndMissingFilesAreErrors) {
  auto r = readRegularFile(dir_.string());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status();
  r = readRegularFile("/dev/zero");  // would never end
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("/dev/zero: is a device"), std::string::npos) << r.status();
  r = readRegularFile(path("absent.json"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path("absent.json")), std::string::npos);
  r = readRegularFile(path("absent-dir/x.json"));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST_F(RegularFileTest, SizeIsBounded) {
  std::ofstream(path("big.json"), std::ios::binary) << std::string(1001, 'x');
  auto r = readRegularFile(path("big.json"), 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), path("big.json") + ": larger than 1000 bytes");
  EXPECT_TRUE(readRegularFile(path("big.json"), 1001).ok());
  // The default bound: 64 MiB (a sparse file, so the test writes nothing).
  fs::resize_file(path("big.json"), kMaxTextFileBytes + 1);
  EXPECT_EQ(readRegularFile(path("big.json")).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(RegularFileTest, MovedFromFileDoesNotCloseTwice) {
  std::ofstream(path("a")) << "abc";
  auto a = RegularFile::open(path("a"));
  ASSERT_TRUE(a.ok());
  RegularFile b = std::move(*a);
  EXPECT_EQ(a->fd(), -1);
  auto text = b.readAll();
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "abc");
}

}  // namespace
}  // namespace textgen
