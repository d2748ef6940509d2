// All-or-nothing restarts of a replica's ranks (pure: the reconciler applies the plan). The ranks
// of a replica form one NCCL group that a restarted rank cannot rejoin while the others are still
// in it, so a replica's pods live and die together, as LeaderWorkerSet's RecreateGroupOnPodRestart
// does: when a container of one of its pods has restarted (restartCount > 0; a recreated pod starts
// at 0), a pod has failed, or a pod is being deleted while the others are not, every pod of the
// replica is deleted and its StatefulSet recreates them all, so that they rendezvous afresh.
// Updates go the same way (the shard StatefulSets update OnDelete): a replica whose pods are not
// at its StatefulSet's updateRevision is recreated whole, at once when it is not serving anyway,
// else only while every other replica serves (one serving replica down at a time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "textgen/operator/kube_client.h"
#include "textgen/operator/service_spec.h"

namespace textgen::op {

// The label a StatefulSet puts on its pods: the revision of the template they were made from.
inline constexpr const char* kRevisionLabel = "controller-revision-hash";

struct GroupRestart {
  enum class Cause { kRankFailed, kOutdated };
  int64_t replica = 0;
  Cause cause = Cause::kRankFailed;
  std::string reason;             // what happened, naming the pod (and container)
  std::vector<std::string> pods;  // the replica's pods to delete: those not already terminating
};

// What the cluster shows for one replica.
struct ReplicaPods {
  json statefulSet;  // null when there is none
  std::vector<json> pods;
};

struct GroupPlan {
  std::vector<GroupRestart> restarts;
  // Replicas whose every pod is there, Ready, and has never restarted (a failure backoff resets).
  std::vector<int64_t> serving;
};

// `replicas[r]` is replica r, for r < s.replicas.
GroupPlan planGroupRestarts(const ServiceSpec& s, const std::vector<ReplicaPods>& replicas);

}  // namespace textgen::op
