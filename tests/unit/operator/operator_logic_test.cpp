// The operator's pure parts, without an API server: spec parsing and its errors, the desired
// objects (names, owner references, labels, rank env, router flags, autoscaling), the subset
// comparison behind "a settled pass writes nothing", the work queue's semantics, and kubeconfig
// parsing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

TEST(ServiceSpecTest, DefaultsAndErrorsNameTheField) {
  auto s = parseServiceSpec(resource({{"model", {{"id", "org/m"}}}}), "img:1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shards, 1);
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
      {{{"model", {{"id", "m"}}}, {"autoscaling", {{"minReplicas", 3}, {"maxReplicas", 2}}}},
       "spec.autoscaling.minReplicas must not exceed maxReplicas"},
      {{{"model", {{"id", "m"}}}, {"router", {{"maxInputTokens", 8}, {"maxTotalTokens", 8}}}},
       "spec.router.maxInputTokens must be less than maxTotalTokens"},
      {{{"model", {{"id", "../etc"}, {"pvc", {{"claimName", "c"}}}}}},
       "spec.model.id must not leave the volume"},
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
    EXPECT_EQ(sts->object["spec"]["replicas"], 4);
    EXPECT_EQ(sts->object["spec"]["serviceName"], name);
    const json& c = sts->object["spec"]["template"]["spec"]["containers"][0];
    std::map<std::string, json> env;
    for (const json& e : c["env"]) env[e["name"]] = e;
    EXPECT_EQ(env["WORLD_SIZE"]["value"], "4");
    EXPECT_EQ(env["MASTER_ADDR"]["value"], name + "-0." + name + ".ml.svc.cluster.local");
    EXPECT_EQ(env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
              "metadata.labels['apps.kubernetes.io/pod-index']");
    EXPECT_EQ(env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"], "HF_TOKEN");
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
  EXPECT_EQ(c["command"][0], "textgen-shard");
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
