// The gRPC ShardService over an Engine: the only code in pod-runtime that sees protobuf types.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "textgen/runtime/engine.h"

namespace grpc {
class Service;
}

namespace textgen::runtime {

struct ShardServiceOptions {
  // ServiceDiscovery: every rank's address, rank 0 first (read at each call: a TCP shard on port 0
  // knows its own only once listening).
  std::function<std::vector<std::string>()> rankUrls;
  std::string dtype = "float32";
  std::string deviceType = "cpu";
  int worldSize = 1;
  // Reported in Info as use_prefix_caching: the router then reuses cached prompt prefixes
  // (cache_len). The engine honours cache_len either way.
  bool prefixCaching = true;
  // Tensor parallelism: a Warmup, Prefill or Decode still running after this long, or one that
  // fails, calls onGroupFailure — the ranks must make the same collective calls in the same order,
  // so a rank that failed a step (or a peer stuck inside one) leaves the group unusable and it
  // restarts whole. Zero timeouts: no watchdog.
  std::chrono::milliseconds stepTimeout{0};
  std::chrono::milliseconds warmupTimeout{0};
  std::function<void(const std::string&)> onGroupFailure;
};

// The returned service calls into `engine` under a mutex (one RPC at a time, as a shard must).
std::unique_ptr<grpc::Service> makeShardService(Engine& engine, const Model& model,
                                                ShardServiceOptions options);

}  // namespace textgen::runtime
