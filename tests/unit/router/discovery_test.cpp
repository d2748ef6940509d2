#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "textgen/router/replica_set.h"

namespace textgen::router {
namespace {

TEST(DiscoveryTest, ResolvesStaticFileAndDnsSources) {
  auto s = Discovery::resolve("static:unix:///a-0,10.0.0.2:5000");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<std::string>{"unix:///a-0", "10.0.0.2:5000"}));
  EXPECT_EQ(*Discovery::resolve("h1:1,h2:2"), (std::vector<std::string>{"h1:1", "h2:2"}));

  const auto path =
      std::filesystem::temp_directory_path() / ("textgen-discovery-" + std::to_string(getpid()));
  std::ofstream(path) << "# replicas\nunix:///r0-0\n\n  10.1.2.3:7000 \n";
  auto f = Discovery::resolve("file:" + path.string());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, (std::vector<std::string>{"unix:///r0-0", "10.1.2.3:7000"}));
  std::filesystem::remove(path);
  EXPECT_EQ(Discovery::resolve("file:" + path.string()).status().code(), StatusCode::kNotFound);
  // A FIFO in the file's place is refused at once (reading it would block discovery forever).
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  const auto fifo = Discovery::resolve("file:" + path.string());
  EXPECT_EQ(fifo.status().code(), StatusCode::kInvalidArgument) << fifo.status();
  std::filesystem::remove(path);

  auto d = Discovery::resolve("dns:localhost:5001");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_FALSE(d->empty());
  EXPECT_EQ(d->front(), "127.0.0.1:5001");
  EXPECT_EQ(Discovery::resolve("dns:nohost").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Discovery::resolve("dns:no-such-host.invalid:1").ok());
}

}  // namespace
}  // namespace textgen::router
