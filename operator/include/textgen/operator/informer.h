// List + watch of one collection, with a local cache: lists (the cache becomes the list), then
// watches from the list's resourceVersion with bookmarks; a watch that ends is resumed from the
// last version seen, one the server expired (410 Gone, e.g. after an etcd compaction) is
// replaced by a fresh list; connection errors back off exponentially (up to 30 s). The handler
// sees every change ("ADDED", "MODIFIED", "DELETED", and "SYNC" for each object of a list).
// A collection the server does not serve (404 on the list, or 403: not allowed: an optional CRD
// such as KEDA's ScaledObject or the InferencePool, not installed) is synced and empty, and is
// listed again every `absentRetry` until it is; served() says which, and onServedChange's callback
// runs when that changes (an owner waiting for the CRD can be requeued then).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "textgen/operator/kube_client.h"

namespace textgen::op {

class Informer {
 public:
  using Handler = std::function<void(const std::string& type, const json& object)>;

  // collectionPath: e.g. /apis/apps/v1/statefulsets (every namespace) or a namespaced one.
  // watchSeconds: how long the server keeps one watch open before it is resumed.
  Informer(KubeClient& client, std::string collectionPath, std::string labelSelector,
           Handler handler, int watchSeconds = 60);
  // Call before start().
  void onServedChange(std::function<void(bool served)> callback) {
    servedChange_ = std::move(callback);
  }
  void setAbsentRetry(std::chrono::milliseconds retry) { absentRetry_ = retry; }
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void start();
  void stop();  // returns at once; the thread ends with its current watch (joined on destruction)
  bool synced() const { return synced_.load(); }
  // False while the server answers the list with 404 (the kind is not installed).
  bool served() const { return served_.load(); }
  // "namespace/name" -> the object as last seen.
  std::optional<json> get(const std::string& key) const;
  std::vector<json> list() const;
  int64_t relists() const { return relists_.load(); }

  static std::string keyOf(const json& object);

 private:
  void run();
  enum class ListResult { kListed, kNotServed, kFailed };
  ListResult listOnce(std::string& resourceVersion);
  void setServed(bool served);
  void sleepUnlessStopped(std::chrono::milliseconds d);
  void apply(const std::string& type, const json& object);

  KubeClient& client_;
  const std::string path_, selector_;
  Handler handler_;
  const int watchSeconds_;
  std::function<void(bool)> servedChange_;
  std::chrono::milliseconds absentRetry_{std::chrono::seconds(30)};
  std::atomic<bool> stop_{false}, synced_{false}, served_{true};
  std::atomic<int64_t> relists_{0};
  mutable std::mutex mu_;
  std::map<std::string, json> cache_;
  std::thread thread_;
};

}  // namespace textgen::op
