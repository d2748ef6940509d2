// What a TextGenerationService should have in the cluster, as objects ready for server-side apply
// (pure: no API calls). Per replica r: a headless Service and a StatefulSet (`<name>-shard-<r>`) of
// shards / shardsPerPod pods, each with one container `shard` holding the pod's GPUs, in which
// `textgen-launcher --shards-only` runs the pod's shardsPerPod ranks as processes (rank i of the
// pod on its own GPUs through CUDA_VISIBLE_DEVICES and on gRPC port kShardPort + i; all or nothing;
// one memory-backed /dev/shm per pod; updates OnDelete), and a model-cache PersistentVolumeClaim
// for hub models; for the service:
// a headless discovery Service over every replica's rank-0 pod (`<name>-shards`), the router
// Deployment (`<name>-router`) and its Service (`<name>`), a PodDisruptionBudget over the shard
// pods, and with autoscaling an HPA or a KEDA ScaledObject (`<name>`) on tgi_queue_size. Every
// object carries the owner reference (controller) and the service's labels.
#pragma once

#include <string>
#include <vector>

#include "textgen/operator/resources.h"
#include "textgen/operator/service_spec.h"

namespace textgen::op {

inline constexpr const char* kServiceLabel = "textgen.dev/service";
inline constexpr const char* kComponentLabel = "textgen.dev/component";
inline constexpr const char* kReplicaLabel = "textgen.dev/replica";
// Every object the operator creates carries kManagedByLabel=kManagedBy (its informers' selector).
inline constexpr const char* kManagedByLabel = "app.kubernetes.io/managed-by";
inline constexpr const char* kManagedBy = "textgen-operator";
// The StatefulSet's ordinal label on its pods (Kubernetes >= 1.28).
inline constexpr const char* kPodIndexLabel = "apps.kubernetes.io/pod-index";
// Rank i of a pod listens on kShardPort + i.
inline constexpr int kShardPort = 50051, kRendezvousPort = 29500, kRouterPort = 3000;
inline constexpr int64_t kShmGiBPerRank = 1;  // /dev/shm's sizeLimit per rank of the pod

struct DesiredObject {
  Kind kind;
  json object;
  std::string name() const { return object["metadata"]["name"].get<std::string>(); }
};

std::vector<DesiredObject> desiredObjects(const ServiceSpec& s, const Kinds& kinds);

std::string shardStatefulSetName(const ServiceSpec& s, int64_t replica);
// Pods per replica: shards / shardsPerPod.
int64_t podsPerReplica(const ServiceSpec& s);
// The label selector of a service's shard pods (status.selector, for the scale subresource).
std::string shardSelector(const ServiceSpec& s);
// The router's in-cluster URL.
std::string endpointUrl(const ServiceSpec& s);

}  // namespace textgen::op
