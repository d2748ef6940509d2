// Level-based reconcile of one TextGenerationService: it reads the resource and its children
// from the informers' caches, applies what differs from the desired objects (server-side apply,
// field manager "textgen-operator"), deletes children it no longer wants (replicas scaled down,
// autoscaling turned off), and writes status (conditions Ready, Progressing, Degraded,
// observedGeneration, replicas, readyReplicas, selector, endpoint) when it changed. It restarts a
// replica's ranks together (group_restart.h): it deletes every pod of a replica whose rank failed
// (again no sooner than a backoff of 10 s doubling to 5 min, until the replica has served) or
// whose pods are outdated. A pass over a settled service writes nothing. Deletion runs behind the
// finalizer textgen.dev/cleanup: the children are deleted explicitly (also where no garbage
// collector runs), then the finalizer goes.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "textgen/operator/informer.h"
#include "textgen/operator/resources.h"

namespace textgen::op {

inline constexpr const char* kFieldManager = "textgen-operator";
inline constexpr const char* kFinalizer = "textgen.dev/cleanup";

struct ReconcilerMetrics {
  std::atomic<int64_t> reconciles{0}, errors{0}, writes{0}, conflicts{0}, groupRestarts{0};
};

// The informers the reconciler reads (pods: the shard pods, for group restarts).
struct ReconcilerCaches {
  Informer &services, &statefulSets, &deployments, &pods;
};

// Asks for another pass over `key` after `delay` (a group restart held back by its backoff).
using RequeueAfter = std::function<void(const std::string& key, std::chrono::milliseconds delay)>;

class Reconciler {
 public:
  Reconciler(KubeClient& client, const Kinds& kinds, std::string defaultImage,
             ReconcilerCaches caches, RequeueAfter requeueAfter = {});

  // OK when the service is settled for now; ABORTED (a conflict) or another error: requeue.
  Status reconcile(const std::string& key);
  const ReconcilerMetrics& metrics() const { return metrics_; }

 private:
  Status reconcileOnce(const std::string& key);
  Status finalize(const json& resource);
  Status ensureFinalizer(const json& resource);
  Status applyChildren(const struct ServiceSpec& spec, std::string& applyError);
  Status dropRollingUpdate(const struct DesiredObject& d, const std::string& url, json& current);
  Status prune(const struct ServiceSpec& spec, const std::vector<struct DesiredObject>& desired);
  Status restartGroups(const struct ServiceSpec& spec, const std::string& key);
  Status writeStatus(const json& resource, const json& status);
  StatusOr<json> live(const Kind& kind, const std::string& ns, const std::string& name);
  // The cached object, or what this reconciler's last write to `url` returned while the cache still
  // shows a version its writes replaced (their watch events have not arrived yet): without it a
  // pass right after a write would see the old object and write again.
  json freshest(const std::string& url, const json& cached);
  void remember(const std::string& url, const json& before, const KubeResponse& written);
  StatusOr<KubeResponse> write(const std::string& method, const std::string& path,
                               const std::optional<json>& body, const std::string& contentType);

  KubeClient& client_;
  const Kinds& kinds_;
  std::string defaultImage_;
  Informer &services_, &statefulSets_, &deployments_, &pods_;
  RequeueAfter requeueAfter_;
  ReconcilerMetrics metrics_;
  struct OwnWrite {
    std::set<std::string> superseded;  // resourceVersions our writes replaced
    json latest;                       // what the last write returned
  };
  std::mutex recentMu_;
  std::map<std::string, OwnWrite> recent_;  // by object URL
  // Group restarts, by service key: failures since the replica last served (and when the next
  // restart may come), and the pods deleted whose deletion the cache does not show yet (their
  // resourceVersion then).
  struct Backoff {
    int failures = 0;
    std::chrono::steady_clock::time_point notBefore{};
  };
  std::mutex groupsMu_;
  std::map<std::string, std::map<int64_t, Backoff>> backoff_;
  std::map<std::string, std::map<std::string, std::string>> deletedPods_;
};

// True when every field `want` sets has the same value in `have` (objects recursively; arrays
// element by element, same length). Server defaults in `have` do not count as differences.
bool containsFields(const json& have, const json& want);

}  // namespace textgen::op
