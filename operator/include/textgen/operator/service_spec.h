// A TextGenerationService's spec, parsed once into typed fields with the CRD's defaults (the API
// server applies them too; the operator does not rely on it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "textgen/operator/kube_client.h"

namespace textgen::op {

struct SecretKeyRef {
  std::string name, key;
};

struct RouterSpec {
  int64_t replicas = 1;
  std::optional<int64_t> maxConcurrentRequests, maxInputTokens, maxTotalTokens,
      maxBatchPrefillTokens, maxBatchTotalTokens, maxWaitingTokens;
  std::optional<double> waitingServedRatio;
  std::optional<SecretKeyRef> apiKey;
  json resources = json::object();
};

struct AutoscalingSpec {
  bool enabled = false;
  std::string mode = "HPA";  // or KEDA
  // minReplicas 0 (KEDA only): scale to zero when idle, back to one on incoming requests.
  int64_t minReplicas = 1, maxReplicas = 1, targetQueueSizePerReplica = 8;
  std::string prometheusAddress;  // KEDA
  bool scalesToZero() const { return enabled && mode == "KEDA" && minReplicas == 0; }
};

// The endpoint picker of an InferencePool (the Gateway API Inference Extension's v1
// EndpointPickerRef): a Service (kind "Service", group "", then port is required) or another kind.
struct EndpointPickerRef {
  std::string group, kind = "Service", name;
  std::optional<int64_t> port;
  std::string failureMode = "FailClose";  // or FailOpen
};

// An InferencePool (inference.networking.k8s.io/v1) over the router pods, for a Gateway whose
// endpoint picker chooses among them.
struct InferencePoolSpec {
  bool enabled = false;
  EndpointPickerRef endpointPicker;
};

// spec.tracing: OpenTelemetry spans of the router and the shards to an OTLP/gRPC collector
// (--otlp-endpoint; --otlp-service-name, default <name>.router and <name>.server).
struct TracingSpec {
  std::string otlpEndpoint;  // empty: no tracing
  std::string serviceName;
};

struct ServiceSpec {
  // metadata
  std::string name, ns, uid;
  int64_t generation = 0;
  // spec
  std::string modelId, revision = "main";
  std::optional<SecretKeyRef> hfToken;
  std::string modelPvc;  // serve modelId from this claim instead of downloading it
  std::string cacheSize = "100Gi", cacheStorageClass, cacheAccessMode = "ReadWriteMany";
  // Passed to the launcher as --dtype, --quantize, --kv-cache-dtype when set (empty: the flag is
  // left out and the shard takes the checkpoint's dtype, format and a KV cache in the dtype).
  std::string dtype, quantize, kvCacheDtype;
  // shards ranks per replica, shardsPerPod of them in each pod (resolved: spec.shardsPerPod, else
  // shards: one pod per replica); shards / shardsPerPod pods per replica.
  int64_t shards = 1, shardsPerPod = 1, replicas = 1, gpusPerShard = 1;
  json resources = json::object();
  json shardEnv = json::array();  // EnvVars added to every shard container (NCCL_* and the like)
  std::string image, imagePullPolicy = "IfNotPresent";
  RouterSpec router;
  AutoscalingSpec autoscaling;
  InferencePoolSpec inferencePool;
  TracingSpec tracing;
  json nodeSelector = json::object(), tolerations = json::array(), affinity = json::object();
  std::string priorityClassName;
};

// Environment variables the operator sets on shard containers itself: spec.shardEnv may not name
// them (NCCL_NVLS_ENABLE stays 0: NVLink multicast is never used).
inline constexpr const char* kReservedShardEnv[] = {
    "RANK",     "WORLD_SIZE",     "MASTER_ADDR", "MASTER_PORT", "POD_INDEX", "NCCL_NVLS_ENABLE",
    "MODEL_ID", "MODEL_REVISION", "HF_HOME",     "HF_TOKEN"};

// The values spec.dtype, spec.quantize and spec.kvCacheDtype may take: the CRD's enums, and what
// textgen-launcher/textgen-shard accept (TGI's names; --quantize exl2 is refused by the launcher,
// so it is not listed).
inline constexpr const char* kDtypes[] = {"float16", "bfloat16", "float32"};
inline constexpr const char* kQuantizeFormats[] = {"gptq",
                                                   "awq",
                                                   "compressed-tensors",
                                                   "marlin",
                                                   "bitsandbytes",
                                                   "bitsandbytes-nf4",
                                                   "bitsandbytes-fp4",
                                                   "eetq",
                                                   "fp8"};
inline constexpr const char* kKvCacheDtypes[] = {"fp8_e4m3fn", "fp8_e5m2"};

// INVALID_ARGUMENT naming the field for what the CRD's schema would also refuse. `defaultImage`
// fills spec.image when the resource gives none.
StatusOr<ServiceSpec> parseServiceSpec(const json& resource, const std::string& defaultImage);

}  // namespace textgen::op
