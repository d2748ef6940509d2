// Level-based reconcile of one TextGenerationService: it reads the resource and its children
// from the informers' caches only (a pass makes no GET or list), applies what differs from the
// desired objects (server-side apply, field manager "textgen-operator"), deletes children it no
// longer wants (replicas scaled down, autoscaling turned off), and writes status (conditions Ready,
// Progressing, Degraded, observedGeneration, replicas, readyReplicas, selector, endpoint) when it
// changed. It restarts a replica's ranks together (group_restart.h): it deletes every pod of a
// replica whose rank failed (again no sooner than a backoff of 10 s doubling to 5 min, until the
// replica has served) or whose pods are outdated. A pass over a settled service writes nothing.
// Deletion runs behind the finalizer textgen.dev/cleanup: the children are deleted explicitly (also
// where no garbage collector runs), then the finalizer goes. A child whose kind the cluster does
// not serve (KEDA or the InferencePool CRD not installed) is not applied: the Degraded condition
// says so (CRDNotInstalled) until it is. Events (event_recorder.h) tell of changes: children
// created, updated, deleted, failed applies, group restarts, Ready transitions, an invalid spec, a
// CRD missing; a settled pass records none.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "textgen/operator/child_informers.h"
#include "textgen/operator/event_recorder.h"
#include "textgen/operator/informer.h"
#include "textgen/operator/resources.h"

namespace textgen::op {

inline constexpr const char* kFieldManager = "textgen-operator";
inline constexpr const char* kFinalizer = "textgen.dev/cleanup";

struct ReconcilerMetrics {
  std::atomic<int64_t> reconciles{0}, errors{0}, writes{0}, conflicts{0}, groupRestarts{0};
};

// The informers the reconciler reads: the resources, and every kind it owns and the shard pods.
struct ReconcilerCaches {
  Informer& services;
  ChildInformers& children;
};

// Asks for another pass over `key` after `delay` (a group restart held back by its backoff).
using RequeueAfter = std::function<void(const std::string& key, std::chrono::milliseconds delay)>;

class Reconciler {
 public:
  // events: where Events go (nullptr: none are recorded).
  Reconciler(KubeClient& client, const Kinds& kinds, std::string defaultImage,
             ReconcilerCaches caches, RequeueAfter requeueAfter = {},
             EventRecorder* events = nullptr);

  // OK when the service is settled for now; ABORTED (a conflict) or another error: requeue.
  Status reconcile(const std::string& key);
  const ReconcilerMetrics& metrics() const { return metrics_; }

 private:
  Status reconcileOnce(const std::string& key);
  Status finalize(const json& resource);
  Status ensureFinalizer(const json& resource);
  // applyError: the first apply that failed; notServed: the kinds wanted but not served.
  Status applyChildren(const struct ServiceSpec& spec, std::string& applyError,
                       std::string& notServed);
  Status dropRollingUpdate(const struct DesiredObject& d, const std::string& url, json& current);
  Status prune(const struct ServiceSpec& spec, const std::vector<struct DesiredObject>& desired);
  Status restartGroups(const struct ServiceSpec& spec, const std::string& key);
  Status writeStatus(const json& resource, const json& status);
  // The object from its kind's cache (null when absent), fresher where our own writes are newer.
  StatusOr<json> live(const Kind& kind, const std::string& ns, const std::string& name);
  void event(const EventTarget& target, EventRecorder::Type type, const std::string& reason,
             const std::string& message);
  // Events for the resource's condition changes (Ready, Degraded, an invalid spec).
  void conditionEvents(const json& resource, const json& next);
  // The cached object, or what this reconciler's last write to `url` returned while the cache still
  // shows a version its writes replaced (their watch events have not arrived yet): without it a
  // pass right after a write would see the old object and write again.
  json freshest(const std::string& url, const json& cached);
  void remember(const std::string& url, const json& before, const KubeResponse& written);
  // A deletion: until the cache drops `before`, freshest() answers null for it.
  void rememberDeleted(const std::string& url, const json& before);
  StatusOr<KubeResponse> write(const std::string& method, const std::string& path,
                               const std::optional<json>& body, const std::string& contentType);

  KubeClient& client_;
  const Kinds& kinds_;
  std::string defaultImage_;
  Informer& services_;
  ChildInformers& children_;
  RequeueAfter requeueAfter_;
  EventRecorder* events_;
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
