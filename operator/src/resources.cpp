#include "textgen/operator/resources.h"

namespace textgen::op {

std::string Kind::path(const std::string& ns, const std::string& name) const {
  std::string p = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  if (namespaced && !ns.empty()) p += "/namespaces/" + ns;
  p += "/" + plural;
  if (!name.empty()) p += "/" + name;
  return p;
}

std::string builtinGroup(const std::string& group, bool testGroups) {
  if (!testGroups) return group;
  return (group.empty() ? std::string("core") : group) + ".textgen.test";
}

Kinds::Kinds(bool testGroups) {
  auto builtin = [&](const std::string& group, const std::string& version, const std::string& kind,
                     const std::string& plural) {
    return Kind{builtinGroup(group, testGroups), version, kind, plural, true};
  };
  service = builtin("", "v1", "Service", "services");
  persistentVolumeClaim = builtin("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims");
  pod = builtin("", "v1", "Pod", "pods");
  statefulSet = builtin("apps", "v1", "StatefulSet", "statefulsets");
  deployment = builtin("apps", "v1", "Deployment", "deployments");
  horizontalPodAutoscaler =
      builtin("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers");
  podDisruptionBudget = builtin("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets");
  // coordination.k8s.io can be served as a custom resource: the test server serves the real path.
  lease = Kind{"coordination.k8s.io", "v1", "Lease", "leases", true};
  event = builtin("", "v1", "Event", "events");
  // Custom resources of optional add-ons (a cluster may not serve them): at their real paths.
  scaledObject = Kind{"keda.sh", "v1alpha1", "ScaledObject", "scaledobjects", true};
  inferencePool =
      Kind{"inference.networking.k8s.io", "v1", "InferencePool", "inferencepools", true};
  textGenerationService =
      Kind{"textgen.dev", "v1alpha1", "TextGenerationService", "textgenerationservices", true};
}

}  // namespace textgen::op
