// The engine's host workers: every index exactly once, call after call; an exception reaches the
// caller and the pool stays usable; one thread runs everything inline.
#include "engine/host_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace textgen::runtime {
namespace {

TEST(HostWorkersTest, EveryIndexRunsOnceInEveryCall) {
  HostWorkers pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (size_t n : {0u, 1u, 2u, 3u, 17u, 256u, 1000u}) {
    for (int round = 0; round < 50; ++round) {
      std::vector<std::atomic<int>> hits(n);
      pool.forEach(n, [&](size_t i) { hits[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " index " << i;
    }
  }
}

TEST(HostWorkersTest, WorkSpreadsOverThreads) {
  HostWorkers pool(4);
  std::mutex mu;
  std::set<std::thread::id> seen;
  // Each call blocks until a second thread has joined it, so a pool that ran everything on the
  // caller would never finish: the deadline fails the test instead.
  std::atomic<int> inside{0};
  pool.forEach(8, [&](size_t) {
    inside.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (inside.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    std::lock_guard lock(mu);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_GE(inside.load(), 2);
  EXPECT_GE(seen.size(), 2u);
}

TEST(HostWorkersTest, AnExceptionReachesTheCallerAndThePoolGoesOn) {
  HostWorkers pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.forEach(64,
                            [&](size_t i) {
                              ran.fetch_add(1);
                              if (i == 40) throw std::runtime_error("row 40");
                            }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 64);  // the others still ran
  std::atomic<int> again{0};
  pool.forEach(64, [&](size_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 64);
}

TEST(HostWorkersTest, OneThreadRunsInlineInOrder) {
  HostWorkers pool(1);
  EXPECT_EQ(pool.threads(), 1);
  std::vector<size_t> order;
  const auto caller = std::this_thread::get_id();
  pool.forEach(5, [&](size_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_GE(HostWorkers::defaultThreads(), 1);
  EXPECT_LE(HostWorkers::defaultThreads(), 8);
}

}  // namespace
}  // namespace textgen::runtime
