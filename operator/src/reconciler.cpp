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

// The service's status from what its children report.
json observedStatus(const ServiceSpec& s, const Informer& statefulSets, const Informer& deployments,
                    const std::string& applyError) {
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
  conditions.push_back(condition("Degraded", !applyError.empty(),
                                 applyError.empty() ? "AsExpected" : "ApplyFailed",
                                 applyError.empty() ? "" : applyError, g));
  return {{"observedGeneration", g},      {"replicas", s.replicas},     {"readyReplicas", ready},
          {"selector", shardSelector(s)}, {"endpoint", endpointUrl(s)}, {"conditions", conditions}};
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
                       ReconcilerCaches caches, RequeueAfter requeueAfter)
    : client_(client),
      kinds_(kinds),
      defaultImage_(std::move(defaultImage)),
      services_(caches.services),
      statefulSets_(caches.statefulSets),
      deployments_(caches.deployments),
      pods_(caches.pods),
      requeueAfter_(std::move(requeueAfter)) {}

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

StatusOr<json> Reconciler::live(const Kind& kind, const std::string& ns, const std::string& name) {
  const std::string url = kind.path(ns, name);
  if (kind.kind == kinds_.statefulSet.kind && kind.group == kinds_.statefulSet.group) {
    auto o = statefulSets_.get(ns + "/" + name);
    return freshest(url, o ? *o : json());
  }
  if (kind.kind == kinds_.deployment.kind && kind.group == kinds_.deployment.group) {
    auto o = deployments_.get(ns + "/" + name);
    return freshest(url, o ? *o : json());
  }
  TG_ASSIGN_OR_RETURN(KubeResponse r, client_.request("GET", kind.path(ns, name)));
  if (r.status == 404) return json();
  TG_RETURN_IF_ERROR(responseStatus(r, "get " + kind.kind + " " + name));
  return r.body;
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
    return writeStatus(*resource, status);
  }
  std::string applyError;
  const Status applied = applyChildren(*spec, applyError);
  if (!applied.ok() && applied.code() == StatusCode::kAborted) return applied;  // requeue
  if (!applied.ok()) applyError = applied.message();
  // Also after an apply error (say KEDA is absent): a broken group is restarted regardless.
  const Status restarted = restartGroups(*spec, key);
  if (!restarted.ok() && restarted.code() == StatusCode::kAborted) return restarted;
  if (!restarted.ok() && applyError.empty()) applyError = restarted.message();
  json status = observedStatus(*spec, statefulSets_, deployments_, applyError);
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

Status Reconciler::applyChildren(const ServiceSpec& spec, std::string& applyError) {
  const std::vector<DesiredObject> desired = desiredObjects(spec, kinds_);
  for (const DesiredObject& d : desired) {
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
      applyError = "apply " + d.kind.kind + " " + d.name() + ": " + r.message();
      spdlog::warn("{}/{}: {}", spec.ns, spec.name, applyError);
    }
  }
  return prune(spec, desired);
}

Status Reconciler::prune(const ServiceSpec& spec, const std::vector<DesiredObject>& desired) {
  std::set<std::string> wanted;
  for (const DesiredObject& d : desired) wanted.insert(d.kind.plural + "/" + d.name());
  const std::string selector = std::string(kServiceLabel) + "=" + spec.name;
  for (const Kind* kind :
       {&kinds_.statefulSet, &kinds_.service, &kinds_.persistentVolumeClaim, &kinds_.deployment,
        &kinds_.horizontalPodAutoscaler, &kinds_.podDisruptionBudget, &kinds_.scaledObject}) {
    auto r = client_.request("GET", kind->path(spec.ns) + "?labelSelector=" + urlEncode(selector));
    if (!r.ok()) return r.status();
    if (r->status == 404) continue;  // a kind this cluster does not serve (KEDA absent)
    TG_RETURN_IF_ERROR(responseStatus(*r, "list " + kind->plural));
    for (const json& item : r->body.value("items", json::array())) {
      const std::string name = item["metadata"].value("name", std::string());
      if (wanted.count(kind->plural + "/" + name)) continue;
      spdlog::info("{}/{}: deleting {} {} (no longer wanted)", spec.ns, spec.name, kind->kind,
                   name);
      TG_ASSIGN_OR_RETURN(KubeResponse d, write("DELETE", kind->path(spec.ns, name), std::nullopt,
                                                "application/json"));
      if (d.status != 404) TG_RETURN_IF_ERROR(responseStatus(d, "delete " + name));
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
  for (json pod : pods_.list()) {
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
