// The operator's pure parts, without an API server: spec parsing and its errors, the desired
// objects (names, owner references, labels, the ranks' pods, their one container's launcher
// command, GPUs, ports and env, router
// flags, autoscaling), the subset
// comparison behind "a settled pass writes nothing", the work queue's semantics, and kubeconfig
// parsing.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "textgen/operator/desired_objects.h"
#include "textgen/operator/reconciler.h"
#include "textgen/operator/work_queue.h"

namespace textgen::op {
namespace {

json resource(json spec) {
  return {{"apiVersion", "textgen.dev/v1alpha1"},
          {"kind", "TextGenerationService"},
          {"metadata", {{"name", "llama"}, {"namespace", "ml"}, {"uid", "u-1"}, {"generation", 3}}},
          {"spec", std::move(spec)}};
}

const DesiredObject* find(const std::vector<DesiredObject>& objs, const std::string& kind,
                          const std::string& name) {
  for (const auto& o : objs)
    if (o.kind.kind == kind && o.name() == name) return &o;
  return nullptr;
}

std::map<std::string, json> envOf(const json& container) {
  std::map<std::string, json> env;
  for (const json& e : container["env"]) env[e["name"]] = e;
  return env;
}

const json& podSpecOf(const DesiredObject& sts) {
  return sts.object["spec"]["template"]["spec"];
}

TEST(ServiceSpecTest, DefaultsAndErrorsNameTheField) {
  auto s = parseServiceSpec(resource({{"model", {{"id", "org/m"}}}}), "img:1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shards, 1);
  EXPECT_EQ(s->shardsPerPod, 1);
  EXPECT_EQ(s->replicas, 1);
  EXPECT_EQ(s->revision, "main");
  EXPECT_EQ(s->image, "img:1");
  EXPECT_EQ(s->generation, 3);
  struct Case {
    json spec;
    const char* message;
  } cases[] = {
      {json::object(), "spec.model.id is required"},
      {{{"model", {{"id", "m"}}}, {"shards", 0}}, "spec.shards must be an integer >= 1"},
      {{{"model", {{"id", "m"}}}, {"shards", 2}, {"shardsPerPod", 0}},
       "spec.shardsPerPod must be an integer >= 1"},
      {{{"model", {{"id", "m"}}}, {"shards", 2}, {"shardsPerPod", 4}},
       "spec.shardsPerPod must not exceed shards"},
      {{{"model", {{"id", "m"}}}, {"shards", 4}, {"shardsPerPod", 3}},
       "spec.shardsPerPod must divide shards"},
      {{{"model", {{"id", "m"}}}, {"shardEnv", {{{"name", "RANK"}, {"value", "1"}}}}},
       "spec.shardEnv[0].name RANK is set by the operator"},
      {{{"model", {{"id", "m"}}}, {"shardEnv", {{{"name", "NCCL_NVLS_ENABLE"}, {"value", "1"}}}}},
       "NCCL_NVLS_ENABLE is set by the operator"},
      {{{"model", {{"id", "m"}}},
        {"shardEnv", {{{"name", "NCCL_DEBUG"}, {"value", "INFO"}}, {{"name", "NCCL_DEBUG"}}}}},
       "spec.shardEnv[1].name NCCL_DEBUG is listed twice"},
      {{{"model", {{"id", "m"}}}, {"autoscaling", {{"minReplicas", 3}, {"maxReplicas", 2}}}},
       "spec.autoscaling.minReplicas must not exceed maxReplicas"},
      {{{"model", {{"id", "m"}}}, {"router", {{"maxInputTokens", 8}, {"maxTotalTokens", 8}}}},
       "spec.router.maxInputTokens must be less than maxTotalTokens"},
      {{{"model", {{"id", "../etc"}, {"pvc", {{"claimName", "c"}}}}}},
       "spec.model.id must not leave the volume"},
      {{{"model", {{"id", "m"}}}, {"dtype", "float8"}},
       "spec.dtype must be one of float16, bfloat16, float32, not 'float8'"},
      {{{"model", {{"id", "m"}}}, {"quantize", "int4"}},
       "spec.quantize must be one of gptq, awq, compressed-tensors, marlin, bitsandbytes, "
       "bitsandbytes-nf4, bitsandbytes-fp4, eetq, fp8, not 'int4'"},
      {{{"model", {{"id", "m"}}}, {"quantize", "GPTQ"}}, "spec.quantize must be one of"},
      {{{"model", {{"id", "m"}}}, {"quantize", "exl2"}}, "spec.quantize exl2 is not served"},
      {{{"model", {{"id", "m"}}}, {"quantize", 4}}, "spec.quantize must be a string"},
      {{{"model", {{"id", "m"}}}, {"quantize", {{"bits", 4}}}}, "spec.quantize must be a string"},
      {{{"model", {{"id", "m"}}}, {"kvCacheDtype", "fp8"}},
       "spec.kvCacheDtype must be one of fp8_e4m3fn, fp8_e5m2, not 'fp8'"},
      {{{"model", {{"id", "m"}}}, {"kvCacheDtype", 8}}, "spec.kvCacheDtype must be a string"},
      {{{"model", {{"id", "m"}}}, {"kvCacheDtype", true}}, "spec.kvCacheDtype must be a string"},
      {{{"model", {{"id", "m"}}}, {"autoscaling", {{"minReplicas", 0}, {"maxReplicas", 2}}}},
       "spec.autoscaling.minReplicas 0 (scale to zero) needs mode KEDA"},
      {{{"model", {{"id", "m"}}}, {"autoscaling", {{"minReplicas", -1}, {"maxReplicas", 2}}}},
       "spec.autoscaling.minReplicas must be an integer >= 0"},
      {{{"model", {{"id", "m"}}}, {"inferencePool", {{"enabled", true}}}},
       "spec.inferencePool.endpointPickerRef is required"},
      {{{"model", {{"id", "m"}}}, {"inferencePool", "yes"}},
       "spec.inferencePool must be an object"},
      {{{"model", {{"id", "m"}}}, {"inferencePool", {{"enabled", "yes"}}}},
       "spec.inferencePool.enabled must be true or false"},
      {{{"model", {{"id", "m"}}}, {"inferencePool", {{"endpointPickerRef", {{"name", "epp"}}}}}},
       "spec.inferencePool.endpointPickerRef.port is required when kind is Service"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool", {{"endpointPickerRef", {{"name", ""}, {"port", {{"number", 9002}}}}}}}},
       "spec.inferencePool.endpointPickerRef.name is required"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool", {{"endpointPickerRef", {{"name", 3}, {"port", {{"number", 9002}}}}}}}},
       "spec.inferencePool.endpointPickerRef.name must be a string"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool", {{"endpointPickerRef", {{"name", "e"}, {"port", {{"number", 70000}}}}}}}},
       "spec.inferencePool.endpointPickerRef.port.number must be an integer in [1, 65535]"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool", {{"endpointPickerRef", {{"name", "e"}, {"port", 9002}}}}}},
       "spec.inferencePool.endpointPickerRef.port must be an object"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool",
         {{"endpointPickerRef",
           {{"name", "e"}, {"port", {{"number", 9002}}}, {"failureMode", "Retry"}}}}}},
       "spec.inferencePool.endpointPickerRef.failureMode must be FailOpen or FailClose"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool", {{"endpointPickerRef", {{"name", "e"}, {"kind", "not a kind"}}}}}},
       "spec.inferencePool.endpointPickerRef.kind must be a Kubernetes kind"},
      {{{"model", {{"id", "m"}}},
        {"inferencePool",
         {{"endpointPickerRef", {{"name", "e"}, {"kind", "Picker"}, {"group", "Bad_Group"}}}}}},
       "spec.inferencePool.endpointPickerRef.group must be an API group"},
  };
  for (const Case& c : cases) {
    auto r = parseServiceSpec(resource(c.spec), "img");
    ASSERT_FALSE(r.ok()) << c.spec.dump();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status();
  }
  EXPECT_FALSE(parseServiceSpec(resource({{"model", {{"id", "m"}}}}), "").ok());  // no image
}

TEST(DesiredObjectsTest, ReplicasOfShardsWithOwnerAndRankEnv) {
  auto s = parseServiceSpec(
      resource({{"model", {{"id", "org/m"}, {"hfTokenSecret", {{"name", "hf"}}}}},
                {"shards", 4},
                {"replicas", 2},
                {"autoscaling", {{"maxReplicas", 5}, {"targetQueueSizePerReplica", 3}}}}),
      "img");
  ASSERT_TRUE(s.ok());
  const Kinds kinds;
  const auto objs = desiredObjects(*s, kinds);
  for (const auto& o : objs) {
    const json& ref = o.object["metadata"]["ownerReferences"][0];
    EXPECT_EQ(ref["uid"], "u-1") << o.name();
    EXPECT_EQ(ref["controller"], true);
    EXPECT_EQ(o.object["metadata"]["labels"][kServiceLabel], "llama");
    EXPECT_EQ(o.object["apiVersion"], o.kind.apiVersion());
  }
  for (int r = 0; r < 2; ++r) {
    const std::string name = "llama-shard-" + std::to_string(r);
    const auto* sts = find(objs, "StatefulSet", name);
    ASSERT_NE(sts, nullptr);
    // By default a replica is one pod: one container runs its four ranks.
    EXPECT_EQ(sts->object["spec"]["replicas"], 1);
    EXPECT_EQ(sts->object["spec"]["serviceName"], name);
    const json& containers = sts->object["spec"]["template"]["spec"]["containers"];
    ASSERT_EQ(containers.size(), 1u);
    const auto env = envOf(containers[0]);
    EXPECT_EQ(env.count("RANK"), 0u);  // per rank: the launcher's
    EXPECT_EQ(env.at("MASTER_ADDR")["value"], "127.0.0.1");
    EXPECT_EQ(env.at("MASTER_PORT")["value"], "29500");
    EXPECT_EQ(env.at("HF_TOKEN")["valueFrom"]["secretKeyRef"]["key"], "HF_TOKEN");
    const std::string line = containers[0]["command"].back().get<std::string>();
    EXPECT_NE(line.find("'--num-shard' '4' '--world-size' '4'"), std::string::npos) << line;
    EXPECT_NE(find(objs, "Service", name), nullptr);
    EXPECT_NE(find(objs, "PersistentVolumeClaim", "llama-model-cache-" + std::to_string(r)),
              nullptr);
  }
  EXPECT_EQ(find(objs, "StatefulSet", "llama-shard-2"), nullptr);
  const auto* hpa = find(objs, "HorizontalPodAutoscaler", "llama");
  ASSERT_NE(hpa, nullptr);
  EXPECT_EQ(hpa->object["spec"]["metrics"][0]["object"]["target"]["averageValue"], "3");
  EXPECT_EQ(hpa->object["apiVersion"], "autoscaling/v2");
  const auto* router = find(objs, "Deployment", "llama-router");
  ASSERT_NE(router, nullptr);
  const std::string cmd =
      router->object["spec"]["template"]["spec"]["containers"][0]["command"].dump();
  EXPECT_NE(cmd.find("dns:llama-shards.ml.svc.cluster.local:50051"), std::string::npos) << cmd;
  EXPECT_NE(find(objs, "PodDisruptionBudget", "llama-shards"), nullptr);
}

TEST(DesiredObjectsTest, PvcModelsRunDirectlyAndTestGroupsMoveBuiltins) {
  auto s = parseServiceSpec(
      resource({{"model", {{"id", "models/llama"}, {"pvc", {{"claimName", "weights"}}}}},
                {"router", {{"maxConcurrentRequests", 7}}}}),
      "img");
  ASSERT_TRUE(s.ok());
  const Kinds kinds(/*testGroups=*/true);
  const auto objs = desiredObjects(*s, kinds);
  const auto* sts = find(objs, "StatefulSet", "llama-shard-0");
  ASSERT_NE(sts, nullptr);
  EXPECT_EQ(sts->object["apiVersion"], "apps.textgen.test/v1");
  const json& c = sts->object["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(c["command"][0], "textgen-launcher");
  EXPECT_EQ(c["command"][2], "/data/models/llama");
  EXPECT_EQ(find(objs, "PersistentVolumeClaim", "llama-model-cache-0"), nullptr);
  EXPECT_EQ(find(objs, "HorizontalPodAutoscaler", "llama"), nullptr);  // autoscaling off
  const auto* router = find(objs, "Deployment", "llama-router");
  ASSERT_NE(router, nullptr);
  const json& rc = router->object["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(rc["command"][0], "textgen-router");
  EXPECT_NE(rc["command"].dump().find("\"--max-concurrent-requests\",\"7\""), std::string::npos);
  EXPECT_EQ(Kind(kinds.service).path("ml", "x"),
            "/apis/core.textgen.test/v1/namespaces/ml/services/x");
  EXPECT_EQ(Kinds(false).service.path("ml", "x"), "/api/v1/namespaces/ml/services/x");
  EXPECT_EQ(Kinds(false).statefulSet.path(""), "/apis/apps/v1/statefulsets");  // every namespace
}

// The shard StatefulSet of replica 0 for `spec` (a model on a volume unless the spec names one).
DesiredObject shardSet(json spec) {
  if (!spec.contains("model"))
    spec["model"] = {{"id", "models/llama"}, {"pvc", {{"claimName", "weights"}}}};
  auto s = parseServiceSpec(resource(spec), "img");
  EXPECT_TRUE(s.ok()) << s.status();
  const auto objs = desiredObjects(*s, Kinds());
  const auto* sts = find(objs, "StatefulSet", "llama-shard-0");
  EXPECT_NE(sts, nullptr);
  return *sts;
}

std::string command(const json& container) {
  return container["command"].back().get<std::string>();
}

constexpr const char* kPod0 = "llama-shard-0-0.llama-shard-0.ml.svc.cluster.local";
constexpr const char* kPod1 = "llama-shard-0-1.llama-shard-0.ml.svc.cluster.local";

// The container's command after the model directory (exec form) as one string.
std::string execArgs(const json& container) {
  std::string a;
  for (size_t i = 3; i < container["command"].size(); ++i)
    a += (a.empty() ? "" : " ") + container["command"][i].get<std::string>();
  return a;
}

// spec.quantize and spec.kvCacheDtype reach the launcher as TGI's flags, after --dtype; unset,
// neither flag is passed (the checkpoint's format, a KV cache in the dtype).
TEST(ShardPodsTest, QuantizationReachesTheLauncher) {
  const std::string urls = std::string(kPod0) + ":50051";
  const std::string head =
      "--shards-only --num-shard 1 --world-size 1 --gpus-per-shard 1 --port 50051 --shard-urls " +
      urls;
  const DesiredObject plain = shardSet({{"dtype", "float16"}});
  EXPECT_EQ(execArgs(podSpecOf(plain)["containers"][0]), head + " --dtype float16 --rank-offset 0");
  for (const char* q : kQuantizeFormats) {
    for (const char* kv : kKvCacheDtypes) {
      const DesiredObject sts =
          shardSet({{"dtype", "float16"}, {"quantize", q}, {"kvCacheDtype", kv}});
      EXPECT_EQ(execArgs(podSpecOf(sts)["containers"][0]), head + " --dtype float16 --quantize " +
                                                               q + " --kv-cache-dtype " + kv +
                                                               " --rank-offset 0");
    }
  }
  // Without a dtype, and over several pods (the shell form): the flags are the same words.
  const DesiredObject gptq = shardSet({{"shards", 2}, {"shardsPerPod", 1}, {"quantize", "gptq"}});
  const std::string cmd = command(podSpecOf(gptq)["containers"][0]);
  EXPECT_NE(cmd.find("'--shard-urls' '" + urls + "," + kPod1 +
                     ":50051' '--quantize' 'gptq' --rank-offset $((POD_INDEX * 1))"),
            std::string::npos)
      << cmd;
  EXPECT_EQ(cmd.find("kv-cache-dtype"), std::string::npos) << cmd;
}

// spec.tracing reaches the router and the launcher (for every rank) as --otlp-endpoint and
// --otlp-service-name <name>.router / <name>.server; unset, neither flag is passed.
TEST(ShardPodsTest, TracingReachesTheRouterAndTheShards) {
  auto routerCommand = [](const json& spec) {
    auto s = parseServiceSpec(resource(spec), "img");
    EXPECT_TRUE(s.ok()) << s.status();
    const auto objs = desiredObjects(*s, Kinds());
    const auto* router = find(objs, "Deployment", "llama-router");
    return router ? router->object["spec"]["template"]["spec"]["containers"][0]["command"].dump()
                  : std::string();
  };
  json spec = {{"model", {{"id", "models/llama"}, {"pvc", {{"claimName", "weights"}}}}},
               {"tracing", {{"otlpEndpoint", "http://otel.monitoring:4317"}}}};
  EXPECT_NE(execArgs(podSpecOf(shardSet(spec))["containers"][0])
                .find("--otlp-endpoint http://otel.monitoring:4317 --otlp-service-name "
                      "llama.server --rank-offset 0"),
            std::string::npos);
  EXPECT_NE(routerCommand(spec).find("\"--otlp-endpoint\",\"http://otel.monitoring:4317\","
                                     "\"--otlp-service-name\",\"llama.router\""),
            std::string::npos)
      << routerCommand(spec);
  spec["tracing"]["serviceName"] = "chat-api";
  EXPECT_NE(routerCommand(spec).find("\"chat-api.router\""), std::string::npos);
  spec.erase("tracing");
  EXPECT_EQ(routerCommand(spec).find("otlp"), std::string::npos);
  EXPECT_EQ(execArgs(podSpecOf(shardSet(spec))["containers"][0]).find("otlp"), std::string::npos);
}

// The CRD's pattern for tracing.otlpEndpoint and the parser agree, value by value.
TEST(ServiceSpecTest, TracingEndpointsAgreeWithTheCrd) {
  const YAML::Node crd = YAML::LoadFile(TEXTGEN_CRD);
  const YAML::Node tracing = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
                                ["spec"]["properties"]["tracing"]["properties"];
  const std::regex pattern(tracing["otlpEndpoint"]["pattern"].as<std::string>());
  for (const char* e :
       {"http://otel:4317", "https://otel.example.com:4317/", "otel:4317", "http://[::1]:4317",
        "10.0.0.1:4317", "ftp://otel:4317", "http://otel", "http://otel:4317/v1/traces",
        "http://user@otel:4317", "otel:4317 ;rm", "-otel:4317", "http://:4317"}) {
    auto s = parseServiceSpec(
        resource({{"model", {{"id", "m"}}}, {"tracing", {{"otlpEndpoint", e}}}}), "img");
    EXPECT_EQ(s.ok(), std::regex_match(std::string(e), pattern)) << e;
    if (!s.ok()) {
      EXPECT_NE(s.status().message().find("tracing.otlpEndpoint"), std::string::npos);
    }
  }
  EXPECT_TRUE(std::regex_match(std::string("http://otel:4317"), pattern));
  EXPECT_FALSE(std::regex_match(std::string("http://otel:4317/v1"), pattern));
  for (const json& bad : {json{{"otlpEndpoint", 3}}, json{{"serviceName", "a b"}}, json("x")}) {
    auto s = parseServiceSpec(resource({{"model", {{"id", "m"}}}, {"tracing", bad}}), "img");
    EXPECT_FALSE(s.ok()) << bad;
  }
}

// The CRD's enums (what the API server accepts) are exactly what parseServiceSpec accepts, and
// what the launcher serves: a manifest one of them refuses, the other refuses too.
TEST(ServiceSpecTest, CrdEnumsAgreeWithTheParser) {
  const YAML::Node crd = YAML::LoadFile(TEXTGEN_CRD);
  const YAML::Node versions = crd["spec"]["versions"];
  ASSERT_TRUE(versions.IsSequence());
  for (const YAML::Node& version : versions) {
    const YAML::Node props =
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    auto enumOf = [&](const char* field) {
      std::vector<std::string> values;
      EXPECT_EQ(props[field]["type"].as<std::string>(""), "string") << field;
      for (const YAML::Node& v : props[field]["enum"]) values.push_back(v.as<std::string>());
      std::sort(values.begin(), values.end());
      return values;
    };
    auto sorted = [](const auto& list) {
      std::vector<std::string> values(std::begin(list), std::end(list));
      std::sort(values.begin(), values.end());
      return values;
    };
    EXPECT_EQ(enumOf("dtype"), sorted(kDtypes));
    EXPECT_EQ(enumOf("quantize"), sorted(kQuantizeFormats));
    EXPECT_EQ(enumOf("kvCacheDtype"), sorted(kKvCacheDtypes));
    for (const char* field : {"dtype", "quantize", "kvCacheDtype"}) {
      for (const std::string& v : enumOf(field)) {
        auto s = parseServiceSpec(resource({{"model", {{"id", "m"}}}, {field, v}}), "img");
        EXPECT_TRUE(s.ok()) << field << "=" << v << ": " << s.status();
      }
    }
  }
}

// An InferencePool over the router pods' HTTP port, owned and labelled like the other children,
// with the endpoint picker as the spec names it (kind Service by default, FailClose by default).
TEST(DesiredObjectsTest, InferencePoolOverTheRouterPods) {
  auto s = parseServiceSpec(
      resource({{"model", {{"id", "org/m"}}},
                {"inferencePool",
                 {{"endpointPickerRef", {{"name", "epp"}, {"port", {{"number", 9002}}}}}}}}),
      "img");
  ASSERT_TRUE(s.ok()) << s.status();
  const Kinds kinds;
  const auto objs = desiredObjects(*s, kinds);
  const DesiredObject* pool = find(objs, "InferencePool", "llama");
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->object["apiVersion"], "inference.networking.k8s.io/v1");
  EXPECT_EQ(pool->object["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_EQ(pool->object["metadata"]["labels"][kServiceLabel], "llama");
  EXPECT_EQ(pool->object["metadata"]["labels"][kManagedByLabel], kManagedBy);
  const json& spec = pool->object["spec"];
  // The router Deployment's pod labels, and its container's port.
  const DesiredObject* router = find(objs, "Deployment", "llama-router");
  ASSERT_NE(router, nullptr);
  for (const auto& [k, v] : spec["selector"]["matchLabels"].items())
    EXPECT_EQ(router->object["spec"]["template"]["metadata"]["labels"][k], v) << k;
  EXPECT_EQ(spec["targetPorts"],
            json::array({{{"number", router->object["spec"]["template"]["spec"]["containers"][0]
                                                   ["ports"][0]["containerPort"]}}}));
  EXPECT_EQ(spec["endpointPickerRef"], json({{"name", "epp"},
                                             {"kind", "Service"},
                                             {"failureMode", "FailClose"},
                                             {"port", {{"number", 9002}}}}));
  // Off: none.
  s->inferencePool.enabled = false;
  EXPECT_EQ(find(desiredObjects(*s, kinds), "InferencePool", "llama"), nullptr);
  auto off = parseServiceSpec(
      resource({{"model", {{"id", "m"}}}, {"inferencePool", {{"enabled", false}}}}), "img");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->inferencePool.enabled);
}

// KEDA with minReplicas 0: the ScaledObject may scale to zero and activates on the queue or on any
// incoming request (the router counts the 503s it answers meanwhile); the router stays in its
// Service (readiness on its port, not on /health, which fails with no replica); scaled to zero,
// replica 0's model cache stays. HPA mode keeps a floor of one.
TEST(DesiredObjectsTest, KedaScalesToZeroAndWakesOnRequests) {
  json spec = {{"model", {{"id", "org/m"}}},
               {"replicas", 0},
               {"autoscaling",
                {{"mode", "KEDA"},
                 {"minReplicas", 0},
                 {"maxReplicas", 3},
                 {"prometheusAddress", "http://prom:9090"}}}};
  auto s = parseServiceSpec(resource(spec), "img");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->autoscaling.scalesToZero());
  const auto objs = desiredObjects(*s, Kinds());
  const DesiredObject* so = find(objs, "ScaledObject", "llama");
  ASSERT_NE(so, nullptr);
  EXPECT_EQ(so->object["spec"]["minReplicaCount"], 0);
  const json& triggers = so->object["spec"]["triggers"];
  ASSERT_EQ(triggers.size(), 2u);
  EXPECT_EQ(triggers[0]["metadata"]["query"],
            "sum(tgi_queue_size{namespace=\"ml\",service=\"llama\"})");
  EXPECT_EQ(triggers[0]["metadata"]["activationThreshold"], "0");
  EXPECT_EQ(triggers[1]["metadata"]["query"],
            "sum(rate(tgi_request_count{namespace=\"ml\",service=\"llama\"}[2m]))");
  EXPECT_EQ(triggers[1]["metadata"]["activationThreshold"], "0");
  const DesiredObject* router = find(objs, "Deployment", "llama-router");
  ASSERT_NE(router, nullptr);
  const json& probe = router->object["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
  EXPECT_TRUE(probe.contains("tcpSocket")) << probe.dump();
  EXPECT_EQ(router->object["spec"]["replicas"], 1);
  EXPECT_EQ(find(objs, "StatefulSet", "llama-shard-0"), nullptr);
  EXPECT_NE(find(objs, "PersistentVolumeClaim", "llama-model-cache-0"), nullptr);
  EXPECT_NE(find(objs, "Service", "llama"), nullptr);
  // A floor of one: one trigger, the router ready on /health.
  spec["autoscaling"]["minReplicas"] = 1;
  spec["replicas"] = 1;
  auto one = parseServiceSpec(resource(spec), "img");
  ASSERT_TRUE(one.ok());
  const auto objs1 = desiredObjects(*one, Kinds());
  EXPECT_EQ(find(objs1, "ScaledObject", "llama")->object["spec"]["triggers"].size(), 1u);
  EXPECT_TRUE(find(objs1, "Deployment", "llama-router")
                  ->object["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
                  .contains("httpGet"));
}

// shards 2, shardsPerPod 2 (the default): one pod, one container with both ranks' GPUs, in which
// the launcher runs ranks 0 and 1 as processes.
TEST(ShardPodsTest, OnePodRunsEveryRankOfAReplica) {
  const DesiredObject sts = shardSet({{"shards", 2},
                                      {"gpusPerShard", 2},
                                      {"dtype", "bfloat16"},
                                      {"resources",
                                       {{"limits", {{"memory", "16Gi"}, {"cpu", "1.5"}}},
                                        {"requests", {{"memory", "500Mi"}, {"cpu", 4}}}}}});
  EXPECT_EQ(sts.object["spec"]["replicas"], 1);
  EXPECT_EQ(sts.object["spec"]["updateStrategy"]["type"], "OnDelete");
  const json& pod = podSpecOf(sts);
  ASSERT_EQ(pod["containers"].size(), 1u);
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["name"], "shard");
  // Exec form: the first rank is a literal.
  EXPECT_EQ(c["command"][0], "textgen-launcher");
  EXPECT_EQ(c["command"][1], "--model-id");
  EXPECT_EQ(c["command"][2], "/data/models/llama");
  const std::string urls = std::string(kPod0) + ":50051," + kPod0 + ":50052";
  EXPECT_EQ(execArgs(c),
            "--shards-only --num-shard 2 --world-size 2 --gpus-per-shard 2 --port 50051 "
            "--shard-urls " +
                urls + " --dtype bfloat16 --rank-offset 0");
  ASSERT_EQ(c["ports"].size(), 3u);  // each rank's gRPC port, then the rendezvous
  EXPECT_EQ(c["ports"][0]["containerPort"], 50051);
  EXPECT_EQ(c["ports"][1]["containerPort"], 50052);
  EXPECT_EQ(c["ports"][2]["containerPort"], 29500);
  for (const char* probe : {"startupProbe", "readinessProbe", "livenessProbe"})
    EXPECT_EQ(c[probe]["tcpSocket"]["port"], 50051) << probe;  // the pod's first rank
  // Both ranks' GPUs in the one container (each rank sees every GPU of the pod's, narrowed to its
  // own by the launcher's CUDA_VISIBLE_DEVICES); the other resources are per rank, times two.
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "32Gi");
  EXPECT_EQ(c["resources"]["limits"]["cpu"], "3");
  EXPECT_EQ(c["resources"]["requests"]["memory"], "1000Mi");
  EXPECT_EQ(c["resources"]["requests"]["cpu"], 8);
  const auto env = envOf(c);
  for (const char* perRank : {"RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "POD_INDEX"})
    EXPECT_EQ(env.count(perRank), 0u) << perRank;
  EXPECT_EQ(env.at("MASTER_ADDR")["value"], "127.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT")["value"], "29500");
  EXPECT_EQ(env.at("NCCL_NVLS_ENABLE")["value"], "0");
  EXPECT_EQ(c["volumeMounts"][1]["mountPath"], "/dev/shm");
  ASSERT_EQ(pod["volumes"].size(), 2u);  // the model and one /dev/shm for both ranks
  EXPECT_EQ(pod["volumes"][1]["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(pod["volumes"][1]["emptyDir"]["sizeLimit"], "2Gi");
}

TEST(ShardPodsTest, RanksWithoutGpusAskForNone) {
  const DesiredObject sts = shardSet({{"shards", 2}, {"gpusPerShard", 0}});
  const json& c = podSpecOf(sts)["containers"][0];
  EXPECT_NE(execArgs(c).find("--gpus-per-shard 0"), std::string::npos) << execArgs(c);
  EXPECT_EQ(c["command"].dump().find("--device"), std::string::npos);
  EXPECT_FALSE(c["resources"].contains("limits"));
}

// shards 2, shardsPerPod 1: two pods of one rank; the first rank from the pod's ordinal.
TEST(ShardPodsTest, OneRankPerPodTakesItsRankFromTheOrdinal) {
  const DesiredObject sts = shardSet({{"shards", 2}, {"shardsPerPod", 1}});
  EXPECT_EQ(sts.object["spec"]["replicas"], 2);
  const json& pod = podSpecOf(sts);
  ASSERT_EQ(pod["containers"].size(), 1u);
  const json& c = pod["containers"][0];
  const auto env = envOf(c);
  EXPECT_EQ(env.count("RANK"), 0u);
  EXPECT_EQ(env.at("POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['apps.kubernetes.io/pod-index']");
  EXPECT_EQ(env.at("MASTER_ADDR")["value"], kPod0);
  EXPECT_EQ(env.at("NCCL_NVLS_ENABLE")["value"], "0");
  EXPECT_EQ(c["command"][0], "/bin/sh");
  EXPECT_EQ(command(c),
            "exec textgen-launcher --model-id '/data/models/llama' '--shards-only' '--num-shard' "
            "'1' '--world-size' '2' '--gpus-per-shard' '1' '--port' '50051' '--shard-urls' '" +
                std::string(kPod0) + ":50051," + kPod1 +
                ":50051' --rank-offset $((POD_INDEX * 1))");
  EXPECT_EQ(c["ports"].size(), 2u);
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "1");
  EXPECT_EQ(pod["volumes"][1]["emptyDir"]["sizeLimit"], "1Gi");
}

// shards 4, shardsPerPod 2: two pods of two ranks; rank = ordinal * 2 + the rank's index in the
// pod (the launcher adds the index to --rank-offset).
TEST(ShardPodsTest, TwoPodsOfTwoRanks) {
  const DesiredObject sts =
      shardSet({{"model", {{"id", "org/m"}}}, {"shards", 4}, {"shardsPerPod", 2}});
  EXPECT_EQ(sts.object["spec"]["replicas"], 2);
  const json& containers = podSpecOf(sts)["containers"];
  ASSERT_EQ(containers.size(), 1u);
  const std::string urls =
      std::string(kPod0) + ":50051," + kPod0 + ":50052," + kPod1 + ":50051," + kPod1 + ":50052";
  const std::string line = command(containers[0]);
  // A hub model: resolved into the cache first, then the launcher.
  EXPECT_EQ(line,
            "model=$(flock /data/.download textgen-launcher download-weights \"$MODEL_ID\" "
            "--revision \"$MODEL_REVISION\") || exit 1; exec textgen-launcher --model-id "
            "\"$model\" '--shards-only' '--num-shard' '2' '--world-size' '4' '--gpus-per-shard' "
            "'1' '--port' '50051' '--shard-urls' '" +
                urls + "' --rank-offset $((POD_INDEX * 2))");
  const auto env = envOf(containers[0]);
  EXPECT_EQ(env.at("MASTER_ADDR")["value"], kPod0);
  EXPECT_EQ(env.at("POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['apps.kubernetes.io/pod-index']");
  EXPECT_EQ(containers[0]["resources"]["limits"]["nvidia.com/gpu"], "2");
}

// spec.shardEnv reaches every rank; it replaces the NCCL defaults it names.
TEST(ShardPodsTest, ShardEnvPassesThrough) {
  const DesiredObject sts =
      shardSet({{"shards", 2},
                {"shardEnv",
                 {{{"name", "NCCL_IB_HCA"}, {"value", "mlx5"}},
                  {{"name", "NCCL_SOCKET_IFNAME"}, {"value", "ib0"}},
                  {{"name", "NCCL_DEBUG"},
                   {"valueFrom", {{"configMapKeyRef", {{"name", "nccl"}, {"key", "debug"}}}}}}}}});
  for (const json& c : podSpecOf(sts)["containers"]) {
    const auto env = envOf(c);
    EXPECT_EQ(env.at("NCCL_IB_HCA")["value"], "mlx5");
    EXPECT_EQ(env.at("NCCL_SOCKET_IFNAME")["value"], "ib0");
    EXPECT_EQ(env.at("NCCL_DEBUG")["valueFrom"]["configMapKeyRef"]["name"], "nccl");
    EXPECT_EQ(env.at("NCCL_DEBUG").count("value"), 0u);
    EXPECT_EQ(env.at("NCCL_NVLS_ENABLE")["value"], "0");
    size_t named = 0;
    for (const json& e : c["env"]) named += e["name"] == "NCCL_SOCKET_IFNAME";
    EXPECT_EQ(named, 1u);
  }
}

TEST(ContainsFieldsTest, ServerDefaultsAreNotDifferences) {
  const json want = {{"spec", {{"replicas", 2}, {"ports", {{{"port", 80}}}}}}};
  json have = {{"spec", {{"replicas", 2}, {"ports", {{{"port", 80}, {"protocol", "TCP"}}}}}},
               {"status", {{"x", 1}}}};
  EXPECT_TRUE(containsFields(have, want));
  have["spec"]["replicas"] = 3;
  EXPECT_FALSE(containsFields(have, want));
  have["spec"]["replicas"] = 2.0;
  EXPECT_TRUE(containsFields(have, want));
  have["spec"]["ports"].push_back({{"port", 81}});
  EXPECT_FALSE(containsFields(have, want));  // lists are compared whole
}

TEST(WorkQueueTest, DedupsAndNeverHandsAKeyToTwoWorkers) {
  WorkQueue q(std::chrono::milliseconds(1), std::chrono::milliseconds(8));
  q.add("a");
  q.add("a");
  q.add("b");
  EXPECT_EQ(q.depth(), 2u);
  auto first = q.get();
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, "a");
  q.add("a");  // while "a" is processed: queued again only once it is done
  auto second = q.get();
  EXPECT_EQ(*second, "b");
  EXPECT_EQ(q.depth(), 0u);
  q.done("a");
  EXPECT_EQ(q.depth(), 1u);
  EXPECT_EQ(*q.get(), "a");
  q.done("a");
  q.done("b");
  // Backoff doubles per failure, capped.
  for (int i = 0; i < 6; ++i) q.addRateLimited("c");
  EXPECT_EQ(q.failures("c"), 6);
  q.forget("c");
  EXPECT_EQ(q.failures("c"), 0);
  EXPECT_EQ(*q.get(), "c");  // the delayed adds arrive
  q.shutDown();
  EXPECT_FALSE(q.get());
}

TEST(KubeconfigTest, ReadsTheCurrentContextAndNamesProblems) {
  const auto dir = std::filesystem::temp_directory_path() / "textgen-kubeconfig-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ca.crt") << "CA PEM";
  std::ofstream(dir / "config") << R"(apiVersion: v1
kind: Config
current-context: b
clusters:
- name: one
  cluster: {server: "https://a.example:6443"}
- name: two
  cluster: {server: "https://b.example:6443", certificate-authority: ca.crt}
users:
- name: u
  user: {token: secret-token}
contexts:
- name: a
  context: {cluster: one, user: u}
- name: b
  context: {cluster: two, user: u, namespace: serving}
)";
  auto c = loadKubeconfig((dir / "config").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://b.example:6443");
  EXPECT_EQ(c->caPem, "CA PEM");
  EXPECT_EQ(c->token, "secret-token");
  EXPECT_EQ(c->namespace_, "serving");
  std::ofstream(dir / "bad") << "current-context: nope\ncontexts: []\n";
  auto bad = loadKubeconfig((dir / "bad").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no current context"), std::string::npos) << bad.status();
  EXPECT_FALSE(loadKubeconfig((dir / "missing").string()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace textgen::op
