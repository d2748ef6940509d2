// The reconciler against an in-memory API (no server): what it writes for a new resource, that a
// settled pass writes nothing, that a 409 comes back as ABORTED (the worker requeues it), and that
// an apply error is reported in the Degraded condition.
#include "textgen/operator/reconciler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

namespace textgen::op {
namespace {

// Objects by URL; lists by collection URL prefix; server-side apply stores the applied object.
class FakeKube final : public KubeClient {
 public:
  StatusOr<KubeResponse> request(const std::string& method, const std::string& path,
                                 const std::optional<json>& body, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string url = path.substr(0, path.find('?'));
    if (method != "GET") writes.push_back(method + " " + url);
    if (method != "GET" && conflictsLeft > 0) {
      --conflictsLeft;
      return KubeResponse{409, {{"message", "the object has been modified"}}};
    }
    if (method == "PATCH" && url.find("statefulsets") != std::string::npos && rejectStatefulSets)
      return KubeResponse{422, {{"message", "spec.template: invalid"}}};
    if (method == "GET") {
      if (objects.count(url)) return KubeResponse{200, objects[url]};
      json items = json::array();
      for (const auto& [k, v] : objects)
        if (k.rfind(url + "/", 0) == 0 && k.find('/', url.size() + 1) == std::string::npos)
          items.push_back(v);
      if (!items.empty() || url.find("/namespaces/") != std::string::npos)
        return KubeResponse{200, {{"metadata", {{"resourceVersion", "1"}}}, {"items", items}}};
      return KubeResponse{404, {{"message", "not found"}}};
    }
    if (method == "DELETE") {
      objects.erase(url);
      return KubeResponse{200, json::object()};
    }
    // PATCH: apply, merge or status.
    const bool status = url.size() > 7 && url.substr(url.size() - 7) == "/status";
    const std::string target = status ? url.substr(0, url.size() - 7) : url;
    json& obj = objects[target];
    if (obj.is_null())
      obj = *body;
    else
      obj.merge_patch(*body);
    return KubeResponse{200, obj};
  }
  Status watch(const std::string&, const std::function<bool(const json&)>&,
               const std::atomic<bool>& stop) override {
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return okStatus();
  }

  std::mutex mu_;
  std::map<std::string, json> objects;
  std::vector<std::string> writes;
  int conflictsLeft = 0;
  bool rejectStatefulSets = false;
  int version_ = 100;
};

const char* kTgs = "/apis/textgen.dev/v1alpha1/namespaces/ml/textgenerationservices";

class ReconcilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kube_.objects[std::string(kTgs) + "/llama"] = {
        {"apiVersion", "textgen.dev/v1alpha1"},
        {"kind", "TextGenerationService"},
        {"metadata",
         {{"name", "llama"},
          {"namespace", "ml"},
          {"uid", "u"},
          {"generation", 1},
          {"resourceVersion", "7"}}},
        {"spec", {{"model", {{"id", "org/m"}}}, {"replicas", 2}}}};
    start();
  }
  void TearDown() override { stop(); }

  void start() {
    services_ = std::make_unique<Informer>(kube_, kTgs, "", [](auto&, auto&) {});
    sts_ =
        std::make_unique<Informer>(kube_, kinds_.statefulSet.path("ml"), "", [](auto&, auto&) {});
    deps_ =
        std::make_unique<Informer>(kube_, kinds_.deployment.path("ml"), "", [](auto&, auto&) {});
    for (Informer* i : {services_.get(), sts_.get(), deps_.get()}) i->start();
    while (!services_->synced() || !sts_->synced() || !deps_->synced())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    reconciler_ = std::make_unique<Reconciler>(kube_, kinds_, "img", *services_, *sts_, *deps_);
  }
  void stop() {
    for (Informer* i : {services_.get(), sts_.get(), deps_.get()}) i->stop();
  }
  // What the informers would have seen by now.
  void resync() {
    stop();
    start();
  }

  FakeKube kube_;
  const Kinds kinds_;
  std::unique_ptr<Informer> services_, sts_, deps_;
  std::unique_ptr<Reconciler> reconciler_;
};

TEST_F(ReconcilerTest, AppliesThenASettledPassWritesNothing) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.objects.count("/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-1"));
  EXPECT_TRUE(kube_.objects.count("/api/v1/namespaces/ml/services/llama"));
  const json& tgs = kube_.objects[std::string(kTgs) + "/llama"];
  EXPECT_EQ(tgs["metadata"]["finalizers"][0], kFinalizer);
  EXPECT_EQ(tgs["status"]["conditions"][0]["reason"], "ReplicasNotReady");
  resync();
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.writes.empty()) << kube_.writes.size() << " writes, first " << kube_.writes[0];
}

// A pass right after the first, before the informers have seen any of its writes (finalizer,
// status, children): what the reconciler wrote stands in for the stale cache, so it writes nothing
// again.
TEST_F(ReconcilerTest, AStaleCacheRightAfterOwnWritesCausesNoRewrite) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());  // no resync: every cache is stale
  EXPECT_TRUE(kube_.writes.empty()) << kube_.writes.size() << " writes, first " << kube_.writes[0];
}

TEST_F(ReconcilerTest, AConflictIsAbortedForARequeue) {
  kube_.conflictsLeft = 1;
  const Status st = reconciler_->reconcile("ml/llama");
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st;
  EXPECT_EQ(reconciler_->metrics().conflicts.load(), 1);
  resync();
  EXPECT_TRUE(reconciler_->reconcile("ml/llama").ok());  // the requeued pass succeeds
}

TEST_F(ReconcilerTest, AnApplyErrorIsDegradedAndRetried) {
  kube_.rejectStatefulSets = true;
  const Status st = reconciler_->reconcile("ml/llama");
  EXPECT_FALSE(st.ok());
  const json& status = kube_.objects[std::string(kTgs) + "/llama"]["status"];
  bool degraded = false;
  for (const json& c : status["conditions"]) {
    if (c["type"] == "Degraded") {
      degraded =
          c["status"] == "True" && c["reason"] == "ApplyFailed" &&
          c["message"].get<std::string>().find("spec.template: invalid") != std::string::npos;
    }
  }
  EXPECT_TRUE(degraded) << status.dump();
}

}  // namespace
}  // namespace textgen::op
