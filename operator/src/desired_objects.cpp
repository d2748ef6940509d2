#include "textgen/operator/desired_objects.h"

namespace textgen::op {
namespace {

// The activation-only trigger's threshold (requests per second per replica).
constexpr const char* kUnreachableRequestRate = "1000000";

json labels(const ServiceSpec& s, const std::string& component) {
  json l = {{"app.kubernetes.io/name", "textgen"},
            {"app.kubernetes.io/instance", s.name},
            {kManagedByLabel, kManagedBy},
            {kServiceLabel, s.name}};
  if (!component.empty()) l[kComponentLabel] = component;
  return l;
}

json metadata(const ServiceSpec& s, const std::string& name, const json& labelSet) {
  return {{"name", name},
          {"namespace", s.ns},
          {"labels", labelSet},
          {"ownerReferences", json::array({{{"apiVersion", "textgen.dev/v1alpha1"},
                                            {"kind", "TextGenerationService"},
                                            {"name", s.name},
                                            {"uid", s.uid},
                                            {"controller", true},
                                            {"blockOwnerDeletion", true}}})}};
}

json object(const Kind& k, json meta, json spec) {
  return {{"apiVersion", k.apiVersion()},
          {"kind", k.kind},
          {"metadata", std::move(meta)},
          {"spec", std::move(spec)}};
}

json envValue(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

json secretEnv(const std::string& name, const SecretKeyRef& ref) {
  return {{"name", name},
          {"valueFrom", {{"secretKeyRef", {{"name", ref.name}, {"key", ref.key}}}}}};
}

// Where the model is inside the containers, and the shell prefix that resolves a hub model into
// the replica's cache (downloaded once: ranks take turns on a lock; later ones find it complete).
constexpr const char* kModelMount = "/data";
std::string modelDir(const ServiceSpec& s) {
  return std::string(kModelMount) + "/" + s.modelId;
}
bool fromHub(const ServiceSpec& s) {
  return s.modelPvc.empty();
}
std::string hubResolve() {
  return "model=$(flock /data/.download textgen-launcher download-weights \"$MODEL_ID\" "
         "--revision \"$MODEL_REVISION\") || exit 1; ";
}

std::string shellQuote(const std::string& a) {
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A command that runs `binary args` with the model directory as `modelFlag`'s value: exec form for
// a model on a volume, a shell line for a hub model (resolved first) or when `shellArgs` (shell
// words appended unquoted, e.g. an arithmetic expansion) is given.
json command(const ServiceSpec& s, const std::string& binary, const std::string& modelFlag,
             const std::vector<std::string>& args, const std::string& shellArgs = "") {
  if (!fromHub(s) && shellArgs.empty()) {
    json c = json::array({binary, modelFlag, modelDir(s)});
    for (const auto& a : args) c.push_back(a);
    return c;
  }
  std::string line;
  if (fromHub(s)) {
    line += hubResolve() + "exec " + binary + " " + modelFlag + " \"$model\"";
  } else {
    line += "exec " + binary + " " + modelFlag + " " + shellQuote(modelDir(s));
  }
  for (const auto& a : args) line += " " + shellQuote(a);
  if (!shellArgs.empty()) line += " " + shellArgs;
  return json::array({"/bin/sh", "-c", line});
}

json modelEnv(const ServiceSpec& s) {
  json env = json::array();
  if (fromHub(s)) {
    env.push_back(envValue("MODEL_ID", s.modelId));
    env.push_back(envValue("MODEL_REVISION", s.revision));
    env.push_back(envValue("HF_HOME", kModelMount));
    if (s.hfToken) env.push_back(secretEnv("HF_TOKEN", *s.hfToken));
  }
  return env;
}

json modelVolume(const ServiceSpec& s, int64_t replica) {
  if (!fromHub(s))
    return {{"name", "model"},
            {"persistentVolumeClaim", {{"claimName", s.modelPvc}, {"readOnly", true}}}};
  return {{"name", "model"},
          {"persistentVolumeClaim",
           {{"claimName", s.name + "-model-cache-" + std::to_string(replica)}}}};
}

// Scheduling fields shared by every pod of the service.
void schedule(const ServiceSpec& s, json& podSpec) {
  if (!s.nodeSelector.empty()) podSpec["nodeSelector"] = s.nodeSelector;
  if (!s.tolerations.empty()) podSpec["tolerations"] = s.tolerations;
  if (!s.affinity.empty()) podSpec["affinity"] = s.affinity;
  if (!s.priorityClassName.empty()) podSpec["priorityClassName"] = s.priorityClassName;
}

// Pod p's stable DNS name under its replica's headless Service.
std::string podHost(const ServiceSpec& s, int64_t r, int64_t p) {
  const std::string name = shardStatefulSetName(s, r);
  return name + "-" + std::to_string(p) + "." + name + "." + s.ns + ".svc.cluster.local";
}

// Every rank's address as the router dials it, in rank order (rank 0 answers ServiceDiscovery
// with them): rank p*k+i is rank i of pod p, on port kShardPort+i of the pod's DNS name (the
// router runs in another pod, so never 127.0.0.1).
std::string shardUrls(const ServiceSpec& s, int64_t r) {
  std::string urls;
  for (int64_t rank = 0; rank < s.shards; ++rank) {
    urls += (rank ? "," : "") + podHost(s, r, rank / s.shardsPerPod) + ":" +
            std::to_string(kShardPort + rank % s.shardsPerPod);
  }
  return urls;
}

// The shard container's environment: the model's, POD_INDEX (pods > 1), the rendezvous address
// (read by the launcher as --master-addr/--master-port), NCCL defaults, then spec.shardEnv (which
// may replace the NCCL defaults but not what the operator sets: the spec refuses those names).
// RANK, WORLD_SIZE and CUDA_VISIBLE_DEVICES are per rank: the launcher sets them.
json shardEnv(const ServiceSpec& s, int64_t r) {
  json env = modelEnv(s);
  const bool onePod = podsPerReplica(s) == 1;
  if (!onePod) {  // the pod's first rank is POD_INDEX * shardsPerPod, computed by the shell
    env.push_back(
        {{"name", "POD_INDEX"},
         {"valueFrom",
          {{"fieldRef",
            {{"fieldPath", std::string("metadata.labels['") + kPodIndexLabel + "']"}}}}}});
  }
  env.push_back(envValue("MASTER_ADDR", onePod ? "127.0.0.1" : podHost(s, r, 0)));
  env.push_back(envValue("MASTER_PORT", std::to_string(kRendezvousPort)));
  env.push_back(envValue("NCCL_NVLS_ENABLE", "0"));  // NVLink multicast is never used
  env.push_back(envValue("NCCL_DEBUG", "WARN"));
  env.push_back(envValue("NCCL_SOCKET_IFNAME", "eth0"));
  for (const json& e : s.shardEnv) {
    bool replaced = false;
    for (json& have : env) {
      if (have["name"] == e["name"]) {
        have = e;
        replaced = true;
      }
    }
    if (!replaced) env.push_back(e);
  }
  return env;
}

// A Kubernetes quantity times n: its number scaled, its suffix (binary, decimal or exponent, all
// multiplicative) kept: "16Gi" x 2 = "32Gi", "500m" x 2 = "1000m", "1.5" x 2 = "3".
std::string scaledQuantity(const std::string& q, int64_t n) {
  const size_t end = q.find_first_not_of("0123456789.");
  const std::string number = q.substr(0, end),
                    suffix = end == std::string::npos ? "" : q.substr(end);
  // Not a quantity (the API server names it), or too long to scale exactly: left as it is.
  if (number.empty() || number == "." || number.size() > 15 ||
      number.find('.') != number.rfind('.'))
    return q;
  const size_t dot = number.find('.');
  if (dot == std::string::npos) return std::to_string(std::stoull(number) * n) + suffix;
  // Decimal: scale the digits as an integer, then put the point back.
  const std::string digits = number.substr(0, dot) + number.substr(dot + 1);
  const size_t decimals = number.size() - dot - 1;
  std::string scaled = std::to_string(std::stoull(digits.empty() ? "0" : digits) * n);
  if (scaled.size() <= decimals) scaled.insert(0, decimals - scaled.size() + 1, '0');
  std::string out = scaled.substr(0, scaled.size() - decimals);
  std::string frac = scaled.substr(scaled.size() - decimals);
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return out + (frac.empty() ? "" : "." + frac) + suffix;
}

// spec.resources are each rank's: the pod's container asks for shardsPerPod times as much.
json podResources(const ServiceSpec& s) {
  json resources = s.resources;
  for (const char* group : {"limits", "requests"}) {
    if (!resources.contains(group) || !resources[group].is_object()) continue;
    for (auto& [name, value] : resources[group].items()) {
      if (value.is_string()) value = scaledQuantity(value.get<std::string>(), s.shardsPerPod);
      if (value.is_number_integer()) value = value.get<int64_t>() * s.shardsPerPod;
      if (value.is_number_float())
        value = value.get<double>() * static_cast<double>(s.shardsPerPod);
    }
  }
  return resources;
}

// spec.tracing as the router's and the launcher's flags; the service name defaults to
// <name>.<part> (part: router or server, TGI's suffixes).
std::vector<std::string> tracingArgs(const ServiceSpec& s, const std::string& part) {
  if (s.tracing.otlpEndpoint.empty()) return {};
  return {"--otlp-endpoint", s.tracing.otlpEndpoint, "--otlp-service-name",
          (s.tracing.serviceName.empty() ? s.name : s.tracing.serviceName) + "." + part};
}

// The pod's one container `shard`: all of the pod's GPUs (NCCL's P2P/IPC/SHM transports and the
// one-shot all-reduce's CUDA IPC need every rank to see its peers' GPUs: docs/operator.md), and
// `textgen-launcher --shards-only` starting the pod's ranks as processes, rank i of the pod on
// GPUs i*g..i*g+g-1 (CUDA_VISIBLE_DEVICES) and port kShardPort+i; one rank's exit ends them all.
json shardContainer(const ServiceSpec& s, int64_t r) {
  const int64_t k = s.shardsPerPod;
  std::vector<std::string> args = {"--shards-only",
                                   "--num-shard",
                                   std::to_string(k),
                                   "--world-size",
                                   std::to_string(s.shards),
                                   "--gpus-per-shard",
                                   std::to_string(s.gpusPerShard),
                                   "--port",
                                   std::to_string(kShardPort),
                                   "--shard-urls",
                                   shardUrls(s, r)};
  if (!s.dtype.empty()) args.insert(args.end(), {"--dtype", s.dtype});
  if (!s.quantize.empty()) args.insert(args.end(), {"--quantize", s.quantize});
  if (!s.kvCacheDtype.empty()) args.insert(args.end(), {"--kv-cache-dtype", s.kvCacheDtype});
  for (std::string& a : tracingArgs(s, "server")) args.push_back(std::move(a));
  // Kubernetes env cannot do arithmetic: with several pods the shell computes the first rank.
  std::string shellArgs;
  if (podsPerReplica(s) == 1) {
    args.insert(args.end(), {"--rank-offset", "0"});
  } else {
    shellArgs = "--rank-offset $((POD_INDEX * " + std::to_string(k) + "))";
  }
  json resources = podResources(s);
  if (s.gpusPerShard > 0) {  // every rank's GPUs, in the one container that sees them all
    const std::string gpus = std::to_string(s.gpusPerShard * k);
    resources["limits"]["nvidia.com/gpu"] = gpus;
    resources["requests"]["nvidia.com/gpu"] = gpus;
  }
  json ports = json::array();
  for (int64_t i = 0; i < k; ++i)
    ports.push_back({{"name", "grpc-" + std::to_string(i)}, {"containerPort", kShardPort + i}});
  ports.push_back({{"name", "rendezvous"}, {"containerPort", kRendezvousPort}});
  // Probes on the pod's first rank: a container has one probe of each kind. The launcher ends the
  // container when any rank exits, and a rank stuck in a collective ends itself (its timeout).
  auto tcp = [](int period, int failures) {
    return json{{"tcpSocket", {{"port", kShardPort}}},
                {"periodSeconds", period},
                {"failureThreshold", failures}};
  };
  return {{"name", "shard"},
          {"image", s.image},
          {"imagePullPolicy", s.imagePullPolicy},
          {"command", command(s, "textgen-launcher", "--model-id", args, shellArgs)},
          {"env", shardEnv(s, r)},
          {"ports", ports},
          // The gRPC port opens once the weights are loaded: up to an hour for a download.
          {"startupProbe", tcp(10, 360)},
          {"readinessProbe", tcp(5, 3)},
          {"livenessProbe", tcp(10, 6)},
          {"resources", resources},
          {"volumeMounts", json::array({{{"name", "model"}, {"mountPath", kModelMount}},
                                        {{"name", "shm"}, {"mountPath", "/dev/shm"}}})}};
}

// Replica r: podsPerReplica pods of shardsPerPod ranks each. Updates are OnDelete: the reconciler
// recreates a replica's pods together (group_restart.h), never one rank at a time.
json shardStatefulSet(const ServiceSpec& s, const Kinds& k, int64_t r) {
  const std::string name = shardStatefulSetName(s, r);
  json podLabels = labels(s, "shard");
  podLabels[kReplicaLabel] = std::to_string(r);
  json containers = json::array({shardContainer(s, r)});
  // One memory-backed /dev/shm for the pod's ranks (NCCL's shared-memory transport between them).
  const json shm = {{"name", "shm"},
                    {"emptyDir",
                     {{"medium", "Memory"},
                      {"sizeLimit", std::to_string(s.shardsPerPod * kShmGiBPerRank) + "Gi"}}}};
  json podSpec = {{"containers", containers}, {"volumes", json::array({modelVolume(s, r), shm})}};
  schedule(s, podSpec);
  json selector = {{"matchLabels", {{kServiceLabel, s.name}, {kReplicaLabel, std::to_string(r)}}}};
  json meta = metadata(s, name, podLabels);
  return object(k.statefulSet, meta,
                {{"replicas", podsPerReplica(s)},
                 {"serviceName", name},
                 {"podManagementPolicy", "Parallel"},
                 {"updateStrategy", {{"type", "OnDelete"}}},
                 {"selector", selector},
                 {"template", {{"metadata", {{"labels", podLabels}}}, {"spec", podSpec}}}});
}

json headlessService(const ServiceSpec& s, const Kind& kind, const std::string& name,
                     const json& labelSet, const json& selector) {
  return object(kind, metadata(s, name, labelSet),
                {{"clusterIP", "None"},
                 {"publishNotReadyAddresses", true},
                 {"selector", selector},
                 {"ports", json::array({{{"name", "grpc"}, {"port", kShardPort}},
                                        {{"name", "rendezvous"}, {"port", kRendezvousPort}}})}});
}

json modelCacheClaim(const ServiceSpec& s, const Kinds& k, int64_t r) {
  json spec = {{"accessModes", json::array({s.cacheAccessMode})},
               {"resources", {{"requests", {{"storage", s.cacheSize}}}}}};
  if (!s.cacheStorageClass.empty()) spec["storageClassName"] = s.cacheStorageClass;
  json l = labels(s, "model-cache");
  l[kReplicaLabel] = std::to_string(r);
  return object(k.persistentVolumeClaim,
                metadata(s, s.name + "-model-cache-" + std::to_string(r), l), spec);
}

std::vector<std::string> routerArgs(const ServiceSpec& s) {
  std::vector<std::string> a = {
      "--port", std::to_string(kRouterPort), "--shard-discovery",
      "dns:" + s.name + "-shards." + s.ns + ".svc.cluster.local:" + std::to_string(kShardPort)};
  auto add = [&](const char* flag, const auto& v) {
    if (v) {
      a.push_back(flag);
      a.push_back(std::to_string(*v));
    }
  };
  const RouterSpec& r = s.router;
  add("--max-concurrent-requests", r.maxConcurrentRequests);
  add("--max-input-tokens", r.maxInputTokens);
  add("--max-total-tokens", r.maxTotalTokens);
  add("--max-batch-prefill-tokens", r.maxBatchPrefillTokens);
  add("--max-batch-total-tokens", r.maxBatchTotalTokens);
  add("--max-waiting-tokens", r.maxWaitingTokens);
  add("--waiting-served-ratio", r.waitingServedRatio);
  if (r.apiKey) a.insert(a.end(), {"--api-key", "$(API_KEY)"});  // expanded by the kubelet
  for (std::string& t : tracingArgs(s, "router")) a.push_back(std::move(t));
  return a;
}

json routerDeployment(const ServiceSpec& s, const Kinds& k) {
  const json l = labels(s, "router");
  json env = modelEnv(s);
  if (s.router.apiKey) env.push_back(secretEnv("API_KEY", *s.router.apiKey));
  json container = {
      {"name", "router"},
      {"image", s.image},
      {"imagePullPolicy", s.imagePullPolicy},
      {"command", command(s, "textgen-router", "--tokenizer-name", routerArgs(s))},
      {"env", env},
      {"ports", json::array({{{"name", "http"}, {"containerPort", kRouterPort}}})},
      // /health fails while no replica serves; a service that scales to zero needs its router
      // in the Service's endpoints then (it answers 503 with Retry-After, and the requests it
      // counts are what wakes the autoscaler), so its readiness is the port alone.
      {"readinessProbe",
       s.autoscaling.scalesToZero()
           ? json{{"tcpSocket", {{"port", "http"}}}, {"periodSeconds", 5}}
           : json{{"httpGet", {{"path", "/health"}, {"port", "http"}}}, {"periodSeconds", 5}}},
      {"livenessProbe", {{"tcpSocket", {{"port", "http"}}}, {"periodSeconds", 10}}},
      {"resources", s.router.resources},
      {"volumeMounts", json::array({{{"name", "model"}, {"mountPath", kModelMount}}})}};
  // The router needs the tokenizer: from the model's volume, or a cache of its own.
  json volume =
      fromHub(s) ? json{{"name", "model"}, {"emptyDir", json::object()}} : modelVolume(s, 0);
  json podSpec = {{"containers", json::array({container})}, {"volumes", json::array({volume})}};
  schedule(s, podSpec);
  podSpec.erase("tolerations");  // GPU nodes' taints are the shards' business
  return object(
      k.deployment, metadata(s, s.name + "-router", l),
      {{"replicas", s.router.replicas},
       {"selector", {{"matchLabels", {{kServiceLabel, s.name}, {kComponentLabel, "router"}}}}},
       {"template", {{"metadata", {{"labels", l}}}, {"spec", podSpec}}}});
}

json routerService(const ServiceSpec& s, const Kinds& k) {
  return object(
      k.service, metadata(s, s.name, labels(s, "router")),
      {{"selector", {{kServiceLabel, s.name}, {kComponentLabel, "router"}}},
       {"ports", json::array({{{"name", "http"}, {"port", 80}, {"targetPort", "http"}}})}});
}

json autoscaler(const ServiceSpec& s, const Kinds& k) {
  const json target = {
      {"apiVersion", "textgen.dev/v1alpha1"}, {"kind", "TextGenerationService"}, {"name", s.name}};
  const AutoscalingSpec& a = s.autoscaling;
  if (a.mode == "KEDA") {
    const std::string match = "{namespace=\"" + s.ns + "\",service=\"" + s.name + "\"}";
    // The queue per replica; active (from zero) while anything waits.
    json triggers = json::array({{{"type", "prometheus"},
                                  {"name", "queue"},
                                  {"metadata",
                                   {{"serverAddress", a.prometheusAddress},
                                    {"query", "sum(tgi_queue_size" + match + ")"},
                                    {"threshold", std::to_string(a.targetQueueSizePerReplica)},
                                    {"activationThreshold", "0"}}}}});
    if (a.minReplicas == 0) {
      // From zero nothing queues (the router answers 503 + Retry-After at once), but it counts
      // every request it receives: requests in the last 2 minutes activate the service. The
      // threshold is out of reach, so this trigger never asks for more than one replica.
      triggers.push_back({{"type", "prometheus"},
                          {"name", "incoming-requests"},
                          {"metadata",
                           {{"serverAddress", a.prometheusAddress},
                            {"query", "sum(rate(tgi_request_count" + match + "[2m]))"},
                            {"threshold", kUnreachableRequestRate},
                            {"activationThreshold", "0"}}}});
    }
    return object(k.scaledObject, metadata(s, s.name, labels(s, "")),
                  {{"scaleTargetRef", target},
                   {"minReplicaCount", a.minReplicas},
                   {"maxReplicaCount", a.maxReplicas},
                   {"triggers", triggers}});
  }
  // The router's queue, averaged over the replicas: a custom-metrics adapter (e.g.
  // prometheus-adapter) serves tgi_queue_size for the router Service.
  return object(
      k.horizontalPodAutoscaler, metadata(s, s.name, labels(s, "")),
      {{"scaleTargetRef", target},
       {"minReplicas", a.minReplicas},
       {"maxReplicas", a.maxReplicas},
       {"metrics",
        json::array(
            {{{"type", "Object"},
              {"object",
               {{"describedObject", {{"apiVersion", "v1"}, {"kind", "Service"}, {"name", s.name}}},
                {"metric", {{"name", "tgi_queue_size"}}},
                {"target",
                 {{"type", "AverageValue"},
                  {"averageValue", std::to_string(a.targetQueueSizePerReplica)}}}}}}})}});
}

// An InferencePool over the router pods (their HTTP port), for a Gateway that asks the endpoint
// picker which pod serves a request.
json inferencePool(const ServiceSpec& s, const Kinds& k) {
  const EndpointPickerRef& e = s.inferencePool.endpointPicker;
  json ref = {{"name", e.name}, {"kind", e.kind}, {"failureMode", e.failureMode}};
  if (!e.group.empty()) ref["group"] = e.group;
  if (e.port) ref["port"] = {{"number", *e.port}};
  return object(
      k.inferencePool, metadata(s, s.name, labels(s, "")),
      {{"selector", {{"matchLabels", {{kServiceLabel, s.name}, {kComponentLabel, "router"}}}}},
       {"targetPorts", json::array({{{"number", kRouterPort}}})},
       {"endpointPickerRef", ref}});
}

}  // namespace

std::string shardStatefulSetName(const ServiceSpec& s, int64_t replica) {
  return s.name + "-shard-" + std::to_string(replica);
}

int64_t podsPerReplica(const ServiceSpec& s) {
  return s.shards / s.shardsPerPod;
}

std::string shardSelector(const ServiceSpec& s) {
  return std::string(kServiceLabel) + "=" + s.name + "," + kComponentLabel + "=shard";
}

std::string endpointUrl(const ServiceSpec& s) {
  return "http://" + s.name + "." + s.ns + ".svc.cluster.local";
}

std::vector<DesiredObject> desiredObjects(const ServiceSpec& s, const Kinds& k) {
  std::vector<DesiredObject> out;
  // Scaled to zero by the autoscaler: replica 0's model cache stays, so that waking up does not
  // download the model again.
  if (s.replicas == 0 && s.autoscaling.scalesToZero() && fromHub(s))
    out.push_back({k.persistentVolumeClaim, modelCacheClaim(s, k, 0)});
  for (int64_t r = 0; r < s.replicas; ++r) {
    const std::string name = shardStatefulSetName(s, r);
    json l = labels(s, "shard");
    l[kReplicaLabel] = std::to_string(r);
    if (fromHub(s)) out.push_back({k.persistentVolumeClaim, modelCacheClaim(s, k, r)});
    out.push_back({k.service,
                   headlessService(s, k.service, name, l,
                                   {{kServiceLabel, s.name}, {kReplicaLabel, std::to_string(r)}})});
    out.push_back({k.statefulSet, shardStatefulSet(s, k, r)});
  }
  // Every replica's rank 0, for the router's DNS discovery.
  out.push_back(
      {k.service,
       headlessService(
           s, k.service, s.name + "-shards", labels(s, "discovery"),
           {{kServiceLabel, s.name}, {kComponentLabel, "shard"}, {kPodIndexLabel, "0"}})});
  out.push_back({k.deployment, routerDeployment(s, k)});
  out.push_back({k.service, routerService(s, k)});
  out.push_back(
      {k.podDisruptionBudget,
       object(k.podDisruptionBudget, metadata(s, s.name + "-shards", labels(s, "shard")),
              {{"maxUnavailable", 1},
               {"selector",
                {{"matchLabels", {{kServiceLabel, s.name}, {kComponentLabel, "shard"}}}}}})});
  if (s.autoscaling.enabled) {
    const Kind& kind = s.autoscaling.mode == "KEDA" ? k.scaledObject : k.horizontalPodAutoscaler;
    out.push_back({kind, autoscaler(s, k)});
  }
  if (s.inferencePool.enabled) out.push_back({k.inferencePool, inferencePool(s, k)});
  return out;
}

}  // namespace textgen::op
