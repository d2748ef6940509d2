#include "textgen/operator/group_restart.h"

#include <optional>

#include "textgen/operator/desired_objects.h"

namespace textgen::op {
namespace {

const json& field(const json& o, const char* key) {
  static const json kNull;
  return o.is_object() && o.contains(key) ? o[key] : kNull;
}

std::string podName(const json& pod) {
  return field(pod, "metadata").value("name", std::string());
}

bool terminating(const json& pod) {
  return !field(field(pod, "metadata"), "deletionTimestamp").is_null();
}

bool podReady(const json& pod) {
  const json& conditions = field(field(pod, "status"), "conditions");
  if (!conditions.is_array()) return false;
  for (const json& c : conditions)
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  return false;
}

// Why this pod's rank has left the group, if it has: a restarted container or a failed pod.
std::optional<std::string> rankFailure(const json& pod) {
  const json& status = field(pod, "status");
  if (field(status, "phase") == "Failed") return "pod " + podName(pod) + " failed";
  for (const char* key : {"initContainerStatuses", "containerStatuses"}) {
    const json& list = field(status, key);
    if (!list.is_array()) continue;
    for (const json& c : list) {
      const int64_t restarts = c.value("restartCount", int64_t{0});
      if (restarts > 0) {
        return "container " + c.value("name", std::string("?")) + " of pod " + podName(pod) +
               " restarted (" + std::to_string(restarts) + "x)";
      }
    }
  }
  return std::nullopt;
}

struct ReplicaState {
  std::vector<std::string> live;  // pods not being deleted
  std::optional<std::string> failure, outdated;
  bool serving = false;
};

ReplicaState observe(const ServiceSpec& s, const ReplicaPods& replica) {
  ReplicaState st;
  std::string gone;
  bool allReady = true;
  const std::string revision =
      field(field(replica.statefulSet, "status"), "updateRevision").is_string()
          ? replica.statefulSet["status"]["updateRevision"].get<std::string>()
          : std::string();
  for (const json& pod : replica.pods) {
    if (terminating(pod)) {
      gone = podName(pod);
      continue;
    }
    st.live.push_back(podName(pod));
    allReady = allReady && podReady(pod);
    if (!st.failure) st.failure = rankFailure(pod);
    const json& labels = field(field(pod, "metadata"), "labels");
    const std::string podRevision = labels.is_object() && labels.contains(kRevisionLabel)
                                        ? labels[kRevisionLabel].get<std::string>()
                                        : std::string();
    if (!st.outdated && !revision.empty() && podRevision != revision)
      st.outdated = "pod " + podName(pod) + " is at revision " + podRevision + ", not " + revision;
  }
  if (!st.failure && !gone.empty() && !st.live.empty())
    st.failure = "pod " + gone + " is being deleted";
  st.serving = !st.failure && allReady && static_cast<int64_t>(st.live.size()) == podsPerReplica(s);
  return st;
}

}  // namespace

GroupPlan planGroupRestarts(const ServiceSpec& s, const std::vector<ReplicaPods>& replicas) {
  GroupPlan plan;
  std::vector<ReplicaState> states;
  for (const ReplicaPods& r : replicas) states.push_back(observe(s, r));
  auto restart = [&](size_t r, GroupRestart::Cause cause, const std::string& reason) {
    plan.restarts.push_back({static_cast<int64_t>(r), cause, reason, states[r].live});
  };
  for (size_t r = 0; r < states.size(); ++r) {
    const ReplicaState& st = states[r];
    if (st.serving) plan.serving.push_back(static_cast<int64_t>(r));
    if (st.live.empty()) continue;
    if (st.failure) {
      restart(r, GroupRestart::Cause::kRankFailed, *st.failure);
    } else if (st.outdated && !st.serving) {  // down anyway: update it now
      restart(r, GroupRestart::Cause::kOutdated, *st.outdated);
    }
  }
  // A serving replica is taken down to update only while every replica serves: one at a time.
  if (plan.serving.size() == states.size()) {
    for (size_t r = 0; r < states.size(); ++r) {
      if (!states[r].outdated) continue;
      restart(r, GroupRestart::Cause::kOutdated, *states[r].outdated);
      break;
    }
  }
  return plan;
}

}  // namespace textgen::op
