#include "textgen/operator/service_spec.h"

#include <regex>
#include <set>
#include <string_view>

namespace textgen::op {
namespace {

Status fieldError(const std::string& field, const std::string& what) {
  return invalidArgumentError("spec." + field + " " + what);
}

StatusOr<std::optional<int64_t>> optionalInt(const json& j, const char* key, const std::string& at,
                                             int64_t min) {
  if (!j.contains(key) || j[key].is_null()) return std::optional<int64_t>();
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < min)
    return fieldError(at + key, "must be an integer >= " + std::to_string(min));
  return std::optional<int64_t>(j[key].get<int64_t>());
}

StatusOr<int64_t> intOr(const json& j, const char* key, const std::string& at, int64_t min,
                        int64_t fallback) {
  TG_ASSIGN_OR_RETURN(auto v, optionalInt(j, key, at, min));
  return v.value_or(fallback);
}

std::string stringOr(const json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// spec[key], one of `allowed` (the CRD's enum), or "" when absent.
template <size_t N>
StatusOr<std::string> oneOf(const json& j, const char* key, const char* const (&allowed)[N]) {
  if (!j.contains(key) || j[key].is_null()) return std::string();
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  if (!j[key].is_string()) return fieldError(key, "must be a string, one of " + list);
  const std::string v = j[key].get<std::string>();
  for (const char* a : allowed)
    if (v == a) return v;
  if (std::string_view(key) == "quantize" && v == "exl2")
    return fieldError(key, v + " is not served (its checkpoints are not read): one of " + list);
  return fieldError(key, "must be one of " + list + ", not '" + v + "'");
}

StatusOr<std::optional<SecretKeyRef>> secretRef(const json& j, const char* key,
                                                const std::string& at, const char* defaultKey) {
  if (!j.contains(key) || j[key].is_null()) return std::optional<SecretKeyRef>();
  const json& s = j[key];
  if (!s.is_object() || !s.contains("name") || !s["name"].is_string())
    return fieldError(at + key + ".name", "is required");
  return std::optional<SecretKeyRef>(
      SecretKeyRef{s["name"].get<std::string>(), stringOr(s, "key", defaultKey)});
}

Status parseRouter(const json& r, RouterSpec& out) {
  const std::string at = "router.";
  TG_ASSIGN_OR_RETURN(out.replicas, intOr(r, "replicas", at, 1, 1));
  TG_ASSIGN_OR_RETURN(out.maxConcurrentRequests, optionalInt(r, "maxConcurrentRequests", at, 1));
  TG_ASSIGN_OR_RETURN(out.maxInputTokens, optionalInt(r, "maxInputTokens", at, 1));
  TG_ASSIGN_OR_RETURN(out.maxTotalTokens, optionalInt(r, "maxTotalTokens", at, 2));
  TG_ASSIGN_OR_RETURN(out.maxBatchPrefillTokens, optionalInt(r, "maxBatchPrefillTokens", at, 1));
  TG_ASSIGN_OR_RETURN(out.maxBatchTotalTokens, optionalInt(r, "maxBatchTotalTokens", at, 1));
  TG_ASSIGN_OR_RETURN(out.maxWaitingTokens, optionalInt(r, "maxWaitingTokens", at, 1));
  if (r.contains("waitingServedRatio") && !r["waitingServedRatio"].is_null()) {
    if (!r["waitingServedRatio"].is_number() || r["waitingServedRatio"].get<double>() < 0)
      return fieldError(at + "waitingServedRatio", "must be a number >= 0");
    out.waitingServedRatio = r["waitingServedRatio"].get<double>();
  }
  if (out.maxInputTokens && out.maxTotalTokens && *out.maxInputTokens >= *out.maxTotalTokens)
    return fieldError(at + "maxInputTokens", "must be less than maxTotalTokens");
  TG_ASSIGN_OR_RETURN(out.apiKey, secretRef(r, "apiKeySecret", at, "API_KEY"));
  if (r.contains("resources") && r["resources"].is_object()) out.resources = r["resources"];
  return okStatus();
}

Status parseAutoscaling(const json& a, AutoscalingSpec& out) {
  const std::string at = "autoscaling.";
  out.enabled = a.value("enabled", true);
  out.mode = stringOr(a, "mode", "HPA");
  if (out.mode != "HPA" && out.mode != "KEDA")
    return fieldError(at + "mode", "must be HPA or KEDA");
  TG_ASSIGN_OR_RETURN(out.minReplicas, intOr(a, "minReplicas", at, 0, 1));
  if (out.minReplicas == 0 && out.mode != "KEDA")
    return fieldError(
        at + "minReplicas",
        "0 (scale to zero) needs mode KEDA: a HorizontalPodAutoscaler cannot scale to "
        "zero");
  TG_ASSIGN_OR_RETURN(auto max, optionalInt(a, "maxReplicas", at, 1));
  if (!max) return fieldError(at + "maxReplicas", "is required");
  out.maxReplicas = *max;
  if (out.minReplicas > out.maxReplicas)
    return fieldError(at + "minReplicas", "must not exceed maxReplicas");
  TG_ASSIGN_OR_RETURN(out.targetQueueSizePerReplica,
                      intOr(a, "targetQueueSizePerReplica", at, 1, 8));
  out.prometheusAddress = stringOr(a, "prometheusAddress", "");
  if (out.mode == "KEDA" && out.prometheusAddress.empty())
    return fieldError(at + "prometheusAddress", "is required for KEDA");
  return okStatus();
}

bool matches(const std::string& s, const std::regex& re) {
  return std::regex_match(s, re);
}

// An OTLP/gRPC collector: http://host:port, https://host:port or host:port (no path), as the
// router and the shards take it; the CRD's pattern says the same.
Status parseTracing(const json& t, TracingSpec& out) {
  const std::string at = "tracing.";
  if (!t.is_object()) return fieldError("tracing", "must be an object");
  for (const char* key : {"otlpEndpoint", "serviceName"})
    if (t.contains(key) && !t[key].is_string()) return fieldError(at + key, "must be a string");
  out.otlpEndpoint = stringOr(t, "otlpEndpoint", "");
  static const std::regex kEndpoint(
      "^(https?://)?([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}/?$");
  if (!out.otlpEndpoint.empty() &&
      (out.otlpEndpoint.size() > 256 || !matches(out.otlpEndpoint, kEndpoint)))
    return fieldError(at + "otlpEndpoint",
                      "must be http://host:port, https://host:port or host:port (OTLP/gRPC)");
  out.serviceName = stringOr(t, "serviceName", "");
  static const std::regex kName("^[A-Za-z0-9][-A-Za-z0-9._]*$");
  if (!out.serviceName.empty() &&
      (out.serviceName.size() > 128 || !matches(out.serviceName, kName)))
    return fieldError(at + "serviceName", "must be letters, digits, '.', '_' or '-' (at most 128)");
  return okStatus();
}

Status parseInferencePool(const json& p, InferencePoolSpec& out) {
  const std::string at = "inferencePool.";
  if (!p.is_object()) return fieldError("inferencePool", "must be an object");
  if (p.contains("enabled") && !p["enabled"].is_boolean())
    return fieldError(at + "enabled", "must be true or false");
  out.enabled = p.value("enabled", true);
  if (!out.enabled) return okStatus();
  if (!p.contains("endpointPickerRef") || !p["endpointPickerRef"].is_object())
    return fieldError(at + "endpointPickerRef",
                      "is required (the endpoint picker the Gateway asks which router pod serves)");
  const json& r = p["endpointPickerRef"];
  const std::string ref = at + "endpointPickerRef.";
  EndpointPickerRef& e = out.endpointPicker;
  for (const char* key : {"name", "kind", "group", "failureMode"})
    if (r.contains(key) && !r[key].is_string()) return fieldError(ref + key, "must be a string");
  e.name = stringOr(r, "name", "");
  if (e.name.empty() || e.name.size() > 253)
    return fieldError(ref + "name", "is required (1 to 253 characters)");
  e.kind = stringOr(r, "kind", "Service");
  static const std::regex kKind("^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$");
  if (e.kind.size() > 63 || !matches(e.kind, kKind))
    return fieldError(ref + "kind", "must be a Kubernetes kind (CamelCase, at most 63 characters)");
  e.group = stringOr(r, "group", "");
  static const std::regex kGroup(
      "^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
  if (e.group.size() > 253 || !matches(e.group, kGroup))
    return fieldError(ref + "group", "must be an API group (a DNS subdomain) or empty (core)");
  if (r.contains("port") && !r["port"].is_null()) {
    if (!r["port"].is_object()) return fieldError(ref + "port", "must be an object {number: N}");
    TG_ASSIGN_OR_RETURN(auto number, optionalInt(r["port"], "number", ref + "port.", 1));
    if (!number || *number > 65535)
      return fieldError(ref + "port.number", "must be an integer in [1, 65535]");
    e.port = number;
  }
  if (e.kind == "Service" && !e.port)
    return fieldError(ref + "port", "is required when kind is Service");
  e.failureMode = stringOr(r, "failureMode", e.failureMode);
  if (e.failureMode != "FailOpen" && e.failureMode != "FailClose")
    return fieldError(ref + "failureMode", "must be FailOpen or FailClose");
  return okStatus();
}

Status parseShardEnv(const json& env, json& out) {
  if (!env.is_array()) return fieldError("shardEnv", "must be a list of environment variables");
  std::set<std::string> seen;
  for (size_t i = 0; i < env.size(); ++i) {
    const json& e = env[i];
    const std::string at = "shardEnv[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
        e["name"].get<std::string>().empty())
      return fieldError(at + ".name", "is required");
    const std::string name = e["name"].get<std::string>();
    for (const char* reserved : kReservedShardEnv)
      if (name == reserved) return fieldError(at + ".name", name + " is set by the operator");
    if (!seen.insert(name).second) return fieldError(at + ".name", name + " is listed twice");
    if (e.contains("value") && !e["value"].is_string())
      return fieldError(at + ".value", "must be a string");
    if (e.contains("valueFrom") && !e["valueFrom"].is_object())
      return fieldError(at + ".valueFrom", "must be an object");
    if (e.contains("value") && e.contains("valueFrom"))
      return fieldError(at, "sets both value and valueFrom");
  }
  out = env;
  return okStatus();
}

}  // namespace

StatusOr<ServiceSpec> parseServiceSpec(const json& resource, const std::string& defaultImage) {
  ServiceSpec s;
  const json& meta = resource.value("metadata", json::object());
  s.name = stringOr(meta, "name", "");
  s.ns = stringOr(meta, "namespace", "default");
  s.uid = stringOr(meta, "uid", "");
  s.generation = meta.value("generation", int64_t{0});
  if (s.name.empty()) return invalidArgumentError("metadata.name is required");
  const json spec = resource.value("spec", json::object());
  if (!spec.is_object()) return invalidArgumentError("spec must be an object");
  const json model = spec.value("model", json::object());
  s.modelId = stringOr(model, "id", "");
  if (s.modelId.empty()) return fieldError("model.id", "is required");
  s.revision = stringOr(model, "revision", "main");
  TG_ASSIGN_OR_RETURN(s.hfToken, secretRef(model, "hfTokenSecret", "model.", "HF_TOKEN"));
  if (model.contains("pvc") && model["pvc"].is_object()) {
    s.modelPvc = stringOr(model["pvc"], "claimName", "");
    if (s.modelPvc.empty()) return fieldError("model.pvc.claimName", "is required");
    if (s.modelId.find("..") != std::string::npos)
      return fieldError("model.id", "must not leave the volume ('..')");
  }
  const json cache = spec.value("modelCache", json::object());
  s.cacheSize = stringOr(cache, "size", s.cacheSize);
  s.cacheStorageClass = stringOr(cache, "storageClassName", "");
  s.cacheAccessMode = stringOr(cache, "accessMode", s.cacheAccessMode);
  TG_ASSIGN_OR_RETURN(s.dtype, oneOf(spec, "dtype", kDtypes));
  TG_ASSIGN_OR_RETURN(s.quantize, oneOf(spec, "quantize", kQuantizeFormats));
  TG_ASSIGN_OR_RETURN(s.kvCacheDtype, oneOf(spec, "kvCacheDtype", kKvCacheDtypes));
  TG_ASSIGN_OR_RETURN(s.shards, intOr(spec, "shards", "", 1, 1));
  TG_ASSIGN_OR_RETURN(s.shardsPerPod, intOr(spec, "shardsPerPod", "", 1, s.shards));
  if (s.shardsPerPod > s.shards) return fieldError("shardsPerPod", "must not exceed shards");
  if (s.shards % s.shardsPerPod != 0)
    return fieldError("shardsPerPod", "must divide shards (every pod runs as many ranks)");
  if (spec.contains("shardEnv")) TG_RETURN_IF_ERROR(parseShardEnv(spec["shardEnv"], s.shardEnv));
  TG_ASSIGN_OR_RETURN(s.replicas, intOr(spec, "replicas", "", 0, 1));
  TG_ASSIGN_OR_RETURN(s.gpusPerShard, intOr(spec, "gpusPerShard", "", 0, 1));
  if (spec.contains("resources") && spec["resources"].is_object()) s.resources = spec["resources"];
  s.image = stringOr(spec, "image", defaultImage);
  if (s.image.empty()) return fieldError("image", "is required (the operator has no default)");
  s.imagePullPolicy = stringOr(spec, "imagePullPolicy", s.imagePullPolicy);
  if (spec.contains("router")) TG_RETURN_IF_ERROR(parseRouter(spec["router"], s.router));
  if (spec.contains("autoscaling") && spec["autoscaling"].is_object())
    TG_RETURN_IF_ERROR(parseAutoscaling(spec["autoscaling"], s.autoscaling));
  if (spec.contains("inferencePool") && !spec["inferencePool"].is_null())
    TG_RETURN_IF_ERROR(parseInferencePool(spec["inferencePool"], s.inferencePool));
  if (spec.contains("tracing") && !spec["tracing"].is_null())
    TG_RETURN_IF_ERROR(parseTracing(spec["tracing"], s.tracing));
  if (spec.contains("nodeSelector") && spec["nodeSelector"].is_object())
    s.nodeSelector = spec["nodeSelector"];
  if (spec.contains("tolerations") && spec["tolerations"].is_array())
    s.tolerations = spec["tolerations"];
  if (spec.contains("affinity") && spec["affinity"].is_object()) s.affinity = spec["affinity"];
  s.priorityClassName = stringOr(spec, "priorityClassName", "");
  return s;
}

}  // namespace textgen::op
