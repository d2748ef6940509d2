// The kinds the operator reads and writes, and where they live in the API. Built-in kinds can be
// moved to look-alike groups (`<group>.textgen.test`) for tests against an API server that serves
// custom resources only (docs/operator.md): the test-only --test-api-groups option.
#pragma once

#include <string>

#include "textgen/operator/kube_client.h"

namespace textgen::op {

struct Kind {
  std::string group;    // "" for the core group
  std::string version;  // "v1"
  std::string kind;     // "StatefulSet"
  std::string plural;   // "statefulsets"
  bool namespaced = true;

  std::string apiVersion() const { return group.empty() ? version : group + "/" + version; }
  // /api/v1/namespaces/NS/services[/NAME] or /apis/GROUP/VERSION/...; with NS empty, the
  // collection across every namespace (/api/v1/services).
  std::string path(const std::string& ns, const std::string& name = "") const;
};

class Kinds {
 public:
  // testGroups: built-in kinds (core, apps, autoscaling, policy) in look-alike groups.
  explicit Kinds(bool testGroups = false);

  Kind service, persistentVolumeClaim, pod, statefulSet, deployment, horizontalPodAutoscaler,
      podDisruptionBudget, lease, event, scaledObject, inferencePool;
  Kind textGenerationService;
};

// The cluster's own name for a built-in group, or its test look-alike.
std::string builtinGroup(const std::string& group, bool testGroups);

}  // namespace textgen::op
