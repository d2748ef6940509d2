#include "textgen/operator/reconciler.h"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <set>

#include "textgen/base/log.h"
#include "textgen/operator/desired_objects.h"
#include "textgen/operator/group_restart.h"
#include "textgen/operator/service_spec.h"

namespace textgen::op {
namespace {

constexpr const char* kCrdNotInstalled = "CRDNotInstalled";

std::string nowRfc3339() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json condition(const std::string& type, bool status, const std::string& reason,
               const std::string& message, int64_t generation) {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"reason", reason},
          {"message", message},
          {"observedGeneration", generation}};
}

// Keeps a condition's lastTransitionTime while its status stays the same.
void stampTransitions(json& conditions, const json& previous) {
  for (json& c : conditions) {
    std::string since = nowRfc3339();
    for (const json& p : previous) {
      if (p.value("type", "") == c["type"] && p.value("status", "") == c["status"])
        since = p.value("lastTransitionTime", since);
    }
    c["lastTransitionTime"] = since;
  }
}

// The service's status from what its children report. notServed: the kinds it asks for that the
// cluster does not serve (their CRDs absent).
json observedStatus(const ServiceSpec& s, const Informer& statefulSets, const Informer& deployments,
                    const std::string& applyError, const std::string& notServed) {
  int64_t ready = 0, rolling = 0;
  std::string notReady;
  for (int64_t r = 0; r < s.replicas; ++r) {
    const std::string name = shardStatefulSetName(s, r);
    auto sts = statefulSets.get(s.ns + "/" + name);
    const json st = sts ? sts->value("status", json::object()) : json::object();
    const int64_t gen = sts ? (*sts)["metadata"].value("generation", int64_t{0}) : 0;
    const bool current = sts && st.value("observedGeneration", int64_t{0}) >= gen;
    const int64_t pods = podsPerReplica(s);
    if (current && st.value("readyReplicas", int64_t{0}) >= pods &&
        st.value("updatedReplicas", pods) >= pods) {
      ++ready;
    } else {
      ++rolling;
      if (notReady.empty()) notReady = name;
    }
  }
  auto router = deployments.get(s.ns + "/" + s.name + "-router");
  const bool routerReady =
      router && router->value("status", json::object()).value("readyReplicas", int64_t{0}) >= 1;
  const int64_t g = s.generation;
  json conditions = json::array();
  if (!applyError.empty()) {
    conditions.push_back(condition("Ready", false, "ApplyFailed", applyError, g));
  } else if (s.replicas == 0) {
    conditions.push_back(condition("Ready", false, "ScaledToZero", "spec.replicas is 0", g));
  } else if (ready < s.replicas) {
    conditions.push_back(condition("Ready", false, "ReplicasNotReady",
                                   std::to_string(ready) + "/" + std::to_string(s.replicas) +
                                       " replicas ready (" + notReady + " is not)",
                                   g));
  } else if (!routerReady) {
    conditions.push_back(
        condition("Ready", false, "RouterNotReady", "the router has no ready pod", g));
  } else {
    conditions.push_back(condition(
        "Ready", true, "Ready", std::to_string(ready) + " replicas and the router are ready", g));
  }
  const bool progressing = rolling > 0 || !routerReady;
  conditions.push_back(condition("Progressing", progressing && applyError.empty(),
                                 progressing ? "RollingOut" : "Stable",
                                 progressing ? std::to_string(rolling) + " replicas rolling out"
                                             : "every replica is up to date",
                                 g));
  if (!applyError.empty()) {
    conditions.push_back(condition("Degraded", true, "ApplyFailed", applyError, g));
  } else if (!notServed.empty()) {
    conditions.push_back(condition("Degraded", true, kCrdNotInstalled, notServed, g));
  } else {
    conditions.push_back(condition("Degraded", false, "AsExpected", "", g));
  }
  return {{"observedGeneration", g},      {"replicas", s.replicas},     {"readyReplicas", ready},
          {"selector", shardSelector(s)}, {"endpoint", endpointUrl(s)}, {"conditions", conditions}};
}

json conditionOf(const json& status, const std::string& type) {
  for (const json& c : status.value("conditions", json::array()))
    if (c.is_object() && c.value("type", "") == type) return c;
  return json::object();
}

EventTarget targetOf(const ServiceSpec& s) {
  return {.ns = s.ns, .name = s.name, .uid = s.uid};
}

EventTarget targetOf(const json& resource) {
  const json& m = resource["metadata"];
  return {.ns = m.value("namespace", ""), .name = m.value("name", ""), .uid = m.value("uid", "")};
}

// What a pass tells of a kind the cluster does not serve.
std::string notServedMessage(const Kind& k) {
  std::string what = k.kind + " (" + k.plural + "." + k.group + "/" + k.version + ")";
  if (k.kind == "InferencePool")
    return "spec.inferencePool asks for an " + what +
           " but the cluster does not serve it: install the Gateway API Inference Extension's "
           "CRDs (or grant the operator's role list and watch on it)";
  if (k.kind == "ScaledObject")
    return "spec.autoscaling.mode KEDA asks for a " + what +
           " but the cluster does not serve it: install KEDA (or grant the operator's role list "
           "and "
           "watch on it)";
  return "the cluster does not serve " + what;
}

}  // namespace

bool containsFields(const json& have, const json& want) {
  if (want.is_object()) {
    if (!have.is_object()) return false;
    for (auto it = want.begin(); it != want.end(); ++it) {
      if (!have.contains(it.key()) || !containsFields(have[it.key()], it.value())) return false;
    }
    return true;
  }
  if (want.is_array()) {
    if (!have.is_array() || have.size() != want.size()) return false;
    for (size_t i = 0; i < want.size(); ++i)
      if (!containsFields(have[i], want[i])) return false;
    return true;
  }
  if (want.is_number() && have.is_number()) return want.get<double>() == have.get<double>();
  return have == want;
}

Reconciler::Reconciler(KubeClient& client, const Kinds& kinds, std::string defaultImage,
                       ReconcilerCaches caches, RequeueAfter requeueAfter, EventRecorder* events)
    : client_(client),
      kinds_(kinds),
      defaultImage_(std::move(defaultImage)),
      services_(caches.services),
      children_(caches.children),
      requeueAfter_(std::move(requeueAfter)),
      events_(events) {}

void Reconciler::event(const EventTarget& target, EventRecorder::Type type,
                       const std::string& reason, const std::string& message) {
  if (events_) events_->record(target, type, reason, message);
}

// Transitions only: a pass whose conditions stay as they were records nothing.
void Reconciler::conditionEvents(const json& resource, const json& next) {
  const json previous = resource.value("status", json::object());
  const EventTarget target = targetOf(resource);
  const json wasReady = conditionOf(previous, "Ready"), ready = conditionOf(next, "Ready");
  const std::string reason = ready.value("reason", ""), message = ready.value("message", "");
  if (reason == "InvalidSpec") {
    if (wasReady.value("reason", "") != reason || wasReady.value("message", "") != message)
      event(target, EventRecorder::Type::kWarning, "InvalidSpec", message);
  } else if (!wasReady.empty() && wasReady.value("status", "") != ready.value("status", "")) {
    if (ready.value("status", "") == "True") {
      event(target, EventRecorder::Type::kNormal, "Ready", message);
    } else if (reason == "ScaledToZero") {
      event(target, EventRecorder::Type::kNormal, "ScaledToZero", message);
    } else {
      event(target, EventRecorder::Type::kWarning, "NotReady", reason + ": " + message);
    }
  }
  // Failed applies have their own events, as they happen.
  const json wasDegraded = conditionOf(previous, "Degraded"),
             degraded = conditionOf(next, "Degraded");
  const std::string why = degraded.value("reason", "");
  if (degraded.value("status", "") == "True" && why != "ApplyFailed" && why != "InvalidSpec" &&
      (wasDegraded.value("status", "") != "True" || wasDegraded.value("reason", "") != why ||
       wasDegraded.value("message", "") != degraded.value("message", "")))
    event(target, EventRecorder::Type::kWarning, why, degraded.value("message", ""));
}

StatusOr<KubeResponse> Reconciler::write(const std::string& method, const std::string& path,
                                         const std::optional<json>& body,
                                         const std::string& contentType) {
  metrics_.writes.fetch_add(1);
  auto r = client_.request(method, path, body, contentType);
  if (r.ok() && r->status == 409) metrics_.conflicts.fetch_add(1);
  return r;
}

namespace {
std::string resourceVersionOf(const json& o) {
  return o.is_object() && o.contains("metadata")
             ? o["metadata"].value("resourceVersion", std::string())
             : std::string();
}
}  // namespace

json Reconciler::freshest(const std::string& url, const json& cached) {
  std::lock_guard<std::mutex> lock(recentMu_);
  auto it = recent_.find(url);
  if (it == recent_.end()) return cached;
  if (it->second.superseded.count(resourceVersionOf(cached))) return it->second.latest;
  recent_.erase(it);  // the cache has caught up (or someone else wrote since)
  return cached;
}

void Reconciler::remember(const std::string& url, const json& before, const KubeResponse& written) {
  if (!written.ok() || !written.body.is_object()) return;
  std::lock_guard<std::mutex> lock(recentMu_);
  OwnWrite& w = recent_[url];
  // Writes chain within a pass (finalizer, then status): every version they replaced is stale.
  w.superseded.insert(resourceVersionOf(before));  // "" for an object the cache did not have
  if (!w.latest.is_null()) w.superseded.insert(resourceVersionOf(w.latest));
  w.latest = written.body;
}

void Reconciler::rememberDeleted(const std::string& url, const json& before) {
  std::lock_guard<std::mutex> lock(recentMu_);
  OwnWrite& w = recent_[url];
  w.superseded.insert(resourceVersionOf(before));
  if (!w.latest.is_null()) w.superseded.insert(resourceVersionOf(w.latest));
  w.latest = json();
}

StatusOr<json> Reconciler::live(const Kind& kind, const std::string& ns, const std::string& name) {
  Informer* cache = children_.of(kind);
  if (!cache) return internalError("no informer for " + kind.kind);
  if (!cache->served()) return json();
  auto o = cache->get(ns + "/" + name);
  return freshest(kind.path(ns, name), o ? *o : json());
}

Status Reconciler::reconcile(const std::string& key) {
  metrics_.reconciles.fetch_add(1);
  Status st = reconcileOnce(key);
  if (!st.ok()) metrics_.errors.fetch_add(1);
  return st;
}

Status Reconciler::reconcileOnce(const std::string& key) {
  auto resource = services_.get(key);
  if (!resource) return okStatus();  // gone; its children went with the finalizer
  const std::string url = kinds_.textGenerationService.path(
      (*resource)["metadata"].value("namespace", ""), (*resource)["metadata"].value("name", ""));
  resource = freshest(url, *resource);
  if (!resource->is_object() || !(*resource)["metadata"].is_object()) return okStatus();
  if ((*resource)["metadata"].contains("deletionTimestamp")) return finalize(*resource);
  TG_RETURN_IF_ERROR(ensureFinalizer(*resource));

  auto spec = parseServiceSpec(*resource, defaultImage_);
  if (!spec.ok()) {
    const int64_t g = (*resource)["metadata"].value("generation", int64_t{0});
    json conditions =
        json::array({condition("Ready", false, "InvalidSpec", spec.status().message(), g),
                     condition("Progressing", false, "InvalidSpec", spec.status().message(), g),
                     condition("Degraded", true, "InvalidSpec", spec.status().message(), g)});
    json status = {{"observedGeneration", g}, {"conditions", conditions}};
    conditionEvents(*resource, status);
    return writeStatus(*resource, status);
  }
  std::string applyError, notServed;
  const Status applied = applyChildren(*spec, applyError, notServed);
  if (!applied.ok() && applied.code() == StatusCode::kAborted) return applied;  // requeue
  if (!applied.ok()) applyError = applied.message();
  // Also after an apply error (say KEDA is absent): a broken group is restarted regardless.
  const Status restarted = restartGroups(*spec, key);
  if (!restarted.ok() && restarted.code() == StatusCode::kAborted) return restarted;
  if (!restarted.ok() && applyError.empty()) applyError = restarted.message();
  json status = observedStatus(*spec, *children_.of(kinds_.statefulSet),
                               *children_.of(kinds_.deployment), applyError, notServed);
  conditionEvents(*resource, status);
  TG_RETURN_IF_ERROR(writeStatus(*resource, status));
  return applyError.empty() ? okStatus() : unavailableError(applyError);
}

// A StatefulSet made when shard pods were updated RollingUpdate carries the server's default
// `rollingUpdate: {partition: 0}`, which OnDelete refuses (422), and server-side apply keeps it (no
// manager owns a default): a merge patch switches the strategy and drops it first.
Status Reconciler::dropRollingUpdate(const DesiredObject& d, const std::string& url,
                                     json& current) {
  if (d.kind.kind != kinds_.statefulSet.kind || current.is_null()) return okStatus();
  const json strategy =
      current.value("spec", json::object()).value("updateStrategy", json::object());
  const json want = d.object["spec"].value("updateStrategy", json::object());
  if (!strategy.contains("rollingUpdate") || want.value("type", "") == "RollingUpdate")
    return okStatus();
  TG_ASSIGN_OR_RETURN(
      KubeResponse r,
      write("PATCH", url + "?fieldManager=" + kFieldManager,
            json{{"spec",
                  {{"updateStrategy", {{"type", want["type"]}, {"rollingUpdate", nullptr}}}}}},
            "application/merge-patch+json"));
  remember(url, current, r);
  TG_RETURN_IF_ERROR(responseStatus(r, "switch " + d.name() + " to OnDelete updates"));
  current = r.body;
  return okStatus();
}

Status Reconciler::applyChildren(const ServiceSpec& spec, std::string& applyError,
                                 std::string& notServed) {
  const std::vector<DesiredObject> desired = desiredObjects(spec, kinds_);
  for (const DesiredObject& d : desired) {
    const Informer* cache = children_.of(d.kind);
    if (cache && !cache->served()) {  // its CRD is absent: said in Degraded, retried once served
      if (notServed.empty()) {
        notServed = notServedMessage(d.kind);
        spdlog::warn("{}/{}: {}", spec.ns, spec.name, notServed);
      }
      continue;
    }
    TG_ASSIGN_OR_RETURN(json current, live(d.kind, spec.ns, d.name()));
    if (!current.is_null() && containsFields(current, d.object)) continue;  // settled
    const std::string url = d.kind.path(spec.ns, d.name());
    TG_RETURN_IF_ERROR(dropRollingUpdate(d, url, current));
    TG_ASSIGN_OR_RETURN(KubeResponse r,
                        write("PATCH", url + "?fieldManager=" + kFieldManager + "&force=true",
                              d.object, "application/apply-patch+yaml"));
    remember(url, current, r);
    if (r.status == 409) return responseStatus(r, "apply " + d.kind.kind + " " + d.name());
    if (!r.ok()) {
      const std::string error = "apply " + d.kind.kind + " " + d.name() + ": " + r.message();
      spdlog::warn("{}/{}: {}", spec.ns, spec.name, error);
      event(targetOf(spec), EventRecorder::Type::kWarning, "ApplyFailed", error);
      if (applyError.empty()) applyError = error;
    } else {
      event(targetOf(spec), EventRecorder::Type::kNormal, current.is_null() ? "Created" : "Updated",
            (current.is_null() ? "created " : "updated ") + d.kind.kind + " " + d.name());
    }
  }
  return prune(spec, desired);
}

Status Reconciler::prune(const ServiceSpec& spec, const std::vector<DesiredObject>& desired) {
  std::set<std::string> wanted;
  for (const DesiredObject& d : desired) wanted.insert(d.kind.plural + "/" + d.name());
  for (const Kind& kind : children_.owned()) {
    const Informer* cache = children_.of(kind);
    if (!cache->served()) continue;  // a kind this cluster does not serve (KEDA absent)
    for (const json& item : cache->list()) {
      const json& m = item["metadata"];
      const json labels = m.value("labels", json::object());
      if (m.value("namespace", "") != spec.ns || !labels.is_object() ||
          labels.value(kServiceLabel, "") != spec.name)
        continue;
      const std::string name = m.value("name", std::string());
      if (wanted.count(kind.plural + "/" + name)) continue;
      const std::string url = kind.path(spec.ns, name);
      if (freshest(url, item).is_null()) continue;  // deleted already; the cache lags
      spdlog::info("{}/{}: deleting {} {} (no longer wanted)", spec.ns, spec.name, kind.kind, name);
      TG_ASSIGN_OR_RETURN(KubeResponse d, write("DELETE", url, std::nullopt, "application/json"));
      if (d.status != 404 && !d.ok()) {
        event(targetOf(spec), EventRecorder::Type::kWarning, "DeleteFailed",
              "delete " + kind.kind + " " + name + ": " + d.message());
        return responseStatus(d, "delete " + name);
      }
      rememberDeleted(url, item);
      if (d.ok())
        event(targetOf(spec), EventRecorder::Type::kNormal, "Deleted",
              "deleted " + kind.kind + " " + name + " (no longer wanted)");
    }
  }
  return okStatus();
}

namespace {

// After the n-th group restart for a failure, the next waits 10 s doubling per failure, up to
// 5 min (the kubelet's crash-loop backoff, which recreated pods would otherwise escape).
std::chrono::seconds groupBackoff(int failures) {
  return std::chrono::seconds(std::min<int64_t>(300, int64_t{10} << std::min(failures - 1, 5)));
}

}  // namespace

Status Reconciler::restartGroups(const ServiceSpec& spec, const std::string& key) {
  std::vector<ReplicaPods> replicas(static_cast<size_t>(spec.replicas));
  for (int64_t r = 0; r < spec.replicas; ++r) {
    auto sts = live(kinds_.statefulSet, spec.ns, shardStatefulSetName(spec, r));
    if (sts.ok()) replicas[static_cast<size_t>(r)].statefulSet = *sts;
  }
  std::lock_guard<std::mutex> lock(groupsMu_);
  std::map<std::string, std::string>& deleted = deletedPods_[key];
  std::map<std::string, std::string> stillCached;  // deletions the cache has not caught up with
  for (json pod : children_.pods().list()) {
    const json& m = pod["metadata"];
    const json labels = m.value("labels", json::object());
    if (m.value("namespace", "") != spec.ns || labels.value(kServiceLabel, "") != spec.name ||
        labels.value(kComponentLabel, "") != "shard")
      continue;
    const std::string name = m.value("name", ""), rv = m.value("resourceVersion", "");
    if (auto it = deleted.find(name); it != deleted.end() && it->second == rv) {
      stillCached[name] = rv;
      pod["metadata"]["deletionTimestamp"] = "deleted by this operator";
    }
    const std::string replica = labels.value(kReplicaLabel, "");
    char* end = nullptr;
    const long long r = std::strtoll(replica.c_str(), &end, 10);
    if (replica.empty() || *end || r < 0 || r >= spec.replicas) continue;
    replicas[static_cast<size_t>(r)].pods.push_back(pod);
  }
  deleted = stillCached;
  const GroupPlan plan = planGroupRestarts(spec, replicas);
  std::map<int64_t, Backoff>& backoff = backoff_[key];
  for (int64_t r : plan.serving) backoff.erase(r);
  std::erase_if(backoff, [&](const auto& b) { return b.first >= spec.replicas; });
  const auto now = std::chrono::steady_clock::now();
  for (const GroupRestart& g : plan.restarts) {
    if (g.cause == GroupRestart::Cause::kRankFailed) {
      Backoff& b = backoff[g.replica];
      if (now < b.notBefore) {
        if (requeueAfter_) {
          requeueAfter_(key,
                        std::chrono::duration_cast<std::chrono::milliseconds>(b.notBefore - now));
        }
        continue;
      }
      b.failures += 1;
      b.notBefore = now + groupBackoff(b.failures);
    }
    spdlog::warn("{}: restarting replica {}'s ranks together ({}): deleting {} pod(s)", key,
                 g.replica, g.reason, g.pods.size());
    metrics_.groupRestarts.fetch_add(1);
    const bool failed = g.cause == GroupRestart::Cause::kRankFailed;
    event(targetOf(spec), failed ? EventRecorder::Type::kWarning : EventRecorder::Type::kNormal,
          failed ? "GroupRestart" : "GroupUpdate",
          "replica " + std::to_string(g.replica) + ": " + g.reason + "; deleting its " +
              std::to_string(g.pods.size()) + " pod(s) together");
    for (const json& pod : replicas[static_cast<size_t>(g.replica)].pods) {
      const json& m = pod["metadata"];
      const std::string name = m.value("name", "");
      if (std::find(g.pods.begin(), g.pods.end(), name) == g.pods.end()) continue;
      // Only the pod seen: a StatefulSet recreates a pod under the same name.
      json options = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
      if (m.contains("uid")) options["preconditions"]["uid"] = m["uid"];
      TG_ASSIGN_OR_RETURN(KubeResponse d, write("DELETE", kinds_.pod.path(spec.ns, name), options,
                                                "application/json"));
      if (d.status == 404 || d.status == 409) continue;  // gone, or already replaced
      TG_RETURN_IF_ERROR(responseStatus(d, "delete pod " + name));
      deleted[name] = m.value("resourceVersion", "");
    }
  }
  return okStatus();
}

Status Reconciler::writeStatus(const json& resource, const json& status) {
  const json previous = resource.value("status", json::object());
  json next = status;
  stampTransitions(next["conditions"], previous.value("conditions", json::array()));
  if (containsFields(previous, next) && containsFields(next, previous)) return okStatus();
  const json& m = resource["metadata"];
  const std::string url =
      kinds_.textGenerationService.path(m.value("namespace", ""), m.value("name", ""));
  TG_ASSIGN_OR_RETURN(KubeResponse r, write("PATCH", url + "/status", json{{"status", next}},
                                            "application/merge-patch+json"));
  if (r.status == 404) return okStatus();  // deleted meanwhile
  remember(url, resource, r);
  return responseStatus(r, "write status");
}

Status Reconciler::ensureFinalizer(const json& resource) {
  const json& m = resource["metadata"];
  json finalizers = m.value("finalizers", json::array());
  for (const json& f : finalizers)
    if (f == kFinalizer) return okStatus();
  finalizers.push_back(kFinalizer);
  json patch = {
      {"metadata",
       {{"finalizers", finalizers}, {"resourceVersion", m.value("resourceVersion", "")}}}};
  const std::string url =
      kinds_.textGenerationService.path(m.value("namespace", ""), m.value("name", ""));
  TG_ASSIGN_OR_RETURN(KubeResponse r, write("PATCH", url, patch, "application/merge-patch+json"));
  remember(url, resource, r);
  return responseStatus(r, "add finalizer");
}

Status Reconciler::finalize(const json& resource) {
  const json& m = resource["metadata"];
  json finalizers = m.value("finalizers", json::array()), rest = json::array();
  bool ours = false;
  for (const json& f : finalizers) {
    if (f == kFinalizer) {
      ours = true;
    } else {
      rest.push_back(f);
    }
  }
  if (!ours) return okStatus();
  ServiceSpec none;
  none.name = m.value("name", "");
  none.ns = m.value("namespace", "");
  none.uid = m.value("uid", "");
  TG_RETURN_IF_ERROR(prune(none, {}));  // every child
  {
    std::lock_guard<std::mutex> lock(groupsMu_);
    backoff_.erase(none.ns + "/" + none.name);
    deletedPods_.erase(none.ns + "/" + none.name);
  }
  json patch = {
      {"metadata", {{"finalizers", rest}, {"resourceVersion", m.value("resourceVersion", "")}}}};
  TG_ASSIGN_OR_RETURN(KubeResponse r,
                      write("PATCH", kinds_.textGenerationService.path(none.ns, none.name), patch,
                            "application/merge-patch+json"));
  if (r.status == 404) return okStatus();
  spdlog::info("{}/{}: deleted its objects, finalizer removed", none.ns, none.name);
  return responseStatus(r, "remove finalizer");
}

}  // namespace textgen::op
