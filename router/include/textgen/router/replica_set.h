// The replicas a router serves, which may change while it runs: a discovery source (a static list,
// a file of addresses, or a DNS name whose A records are the replicas' masters) is re-resolved
// periodically; new masters are connected and warmed, vanished ones are drained — no new requests,
// destroyed once their in-flight requests finish.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "textgen/router/batcher.h"
#include "textgen/router/shard_client.h"

namespace textgen::router {

struct Replica {
  std::string master;
  std::unique_ptr<ShardGroup> shards;
  std::unique_ptr<Batcher> batcher;
  std::atomic<bool> draining{false};
};

class ReplicaSet {
 public:
  // Connects and warms one replica from its master's address.
  using Factory = std::function<StatusOr<std::shared_ptr<Replica>>(const std::string& master)>;

  // onChange hears the number of serving replicas after every update (a metrics gauge).
  explicit ReplicaSet(Factory factory, std::function<void(size_t)> onChange = {})
      : factory_(std::move(factory)), onChange_(std::move(onChange)) {}

  // Makes the served set equal `masters`: connects new ones (an error is returned and the master
  // retried on the next update), drains the ones no longer listed, reaps drained idle ones.
  Status update(const std::vector<std::string>& masters);

  // The least-loaded replica, healthy ones first; nullptr when none is serving. Given the request's
  // prompt, a healthy replica whose prefix cache holds a longer part of it is preferred while its
  // load is within max(kPrefixLoadSlack, a quarter of the least load) of the least loaded one's.
  std::shared_ptr<Replica> pick(std::span<const uint32_t> prompt = {}) const;
  static constexpr size_t kPrefixLoadSlack = 8;
  std::vector<std::shared_ptr<Replica>> serving() const;

 private:
  Factory factory_;
  std::function<void(size_t)> onChange_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Replica>> replicas_;
  std::vector<std::shared_ptr<Replica>> draining_;
};

// "static:a,b" (or a plain comma-separated list), "file:/path" (one address per line), or
// "dns:name:port" (every A record of name is a master at port), re-resolved every `interval`.
class Discovery {
 public:
  static StatusOr<std::unique_ptr<Discovery>> start(const std::string& source,
                                                    std::chrono::milliseconds interval,
                                                    ReplicaSet& replicas);
  ~Discovery();
  // The masters the source lists right now.
  static StatusOr<std::vector<std::string>> resolve(const std::string& source);

 private:
  Discovery(std::string source, std::chrono::milliseconds interval, ReplicaSet& replicas);
  std::string source_;
  std::chrono::milliseconds interval_;
  ReplicaSet& replicas_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace textgen::router
