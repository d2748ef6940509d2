// The reconciler against an in-memory API (no server): what it writes for a new resource, that a
// settled pass writes nothing, that a 409 comes back as ABORTED (the worker requeues it), that an
// apply error is reported in the Degraded condition, and group restarts: a replica whose rank
// restarted has all its pods deleted (once, then no sooner than its backoff), and outdated
// replicas are replaced one at a time.
#include "textgen/operator/reconciler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "textgen/operator/desired_objects.h"
#include "textgen/operator/service_spec.h"

namespace textgen::op {
namespace {

// Objects by URL; lists by collection URL prefix; server-side apply stores the applied object.
// Watches stream only what the test emits (the reconciler's own writes are not echoed: its caches
// stay stale until the test says otherwise).
class FakeKube final : public KubeClient {
 public:
  StatusOr<KubeResponse> request(const std::string& method, const std::string& path,
                                 const std::optional<json>& body, const std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string url = path.substr(0, path.find('?'));
    requests.push_back(method + " " + url);
    for (const std::string& prefix : notServed)
      if (url.rfind(prefix, 0) == 0) return KubeResponse{404, {{"message", "page not found"}}};
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
    if (method == "POST") {  // create (events)
      const std::string at = url + "/" + (*body)["metadata"]["name"].get<std::string>();
      if (objects.count(at)) return KubeResponse{409, {{"message", "already exists"}}};
      objects[at] = *body;
      return KubeResponse{201, *body};
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
  Status watch(const std::string& path, const std::function<bool(const json&)>& onEvent,
               const std::atomic<bool>& stop) override {
    const std::string collection = path.substr(0, path.find('?'));
    while (!stop.load()) {
      std::optional<json> event;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto& q = events_[collection];
        if (!q.empty()) {
          event = q.front();
          q.pop_front();
        }
      }
      if (!event) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      } else if (!onEvent(*event)) {
        break;
      }
    }
    return okStatus();
  }
  // Stores (or with `deleted`, removes) `object` at `url` and streams the change to the watch of
  // its collection.
  void emit(const std::string& url, json object, bool deleted = false) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string collection = url.substr(0, url.rfind('/'));
    if (deleted) {
      objects.erase(url);
      events_[collection].push_back({{"type", "DELETED"}, {"object", object}});
      return;
    }
    object["metadata"]["resourceVersion"] = std::to_string(++version_);
    const bool existed = objects.count(url) > 0;
    objects[url] = object;
    events_[collection].push_back({{"type", existed ? "MODIFIED" : "ADDED"}, {"object", object}});
  }

  std::mutex mu_;
  std::map<std::string, json> objects;
  std::vector<std::string> writes, requests;
  std::vector<std::string> notServed;  // collection prefixes answered 404 (CRDs not installed)
  int conflictsLeft = 0;
  bool rejectStatefulSets = false;
  int version_ = 100;
  std::map<std::string, std::deque<json>> events_;
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
        {"spec",
         {{"model", {{"id", "org/m"}}}, {"shards", 2}, {"shardsPerPod", 1}, {"replicas", 2}}}};
    start();
  }
  void TearDown() override { stop(); }

  void start() {
    services_ = std::make_unique<Informer>(kube_, kTgs, "", [](auto&, auto&) {});
    children_ = std::make_unique<ChildInformers>(kube_, kinds_, "ml", [](auto&, auto&) {});
    children_->setAbsentRetry(std::chrono::milliseconds(5));
    services_->start();
    children_->start();
    while (!services_->synced() || !children_->synced())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    sts_ = children_->of(kinds_.statefulSet);
    pods_ = &children_->pods();
    reconciler_ = std::make_unique<Reconciler>(
        kube_, kinds_, "img", ReconcilerCaches{*services_, *children_},
        [this](const std::string& key, std::chrono::milliseconds delay) {
          std::lock_guard<std::mutex> lock(requeueMu_);
          requeues_.emplace_back(key, delay);
        },
        &events_);
  }
  void stop() {
    services_->stop();
    children_->stop();
  }
  // What the informers would have seen by now.
  void resync() {
    stop();
    start();
  }
  template <typename F>
  void waitUntil(const char* what, F done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out waiting for " << what;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  static std::string podUrl(const std::string& name) {
    return "/api/v1/namespaces/ml/pods/" + name;
  }
  // Pod p of replica r as its StatefulSet makes it, seen by the pods informer once this returns.
  void putPod(int r, int p, int restarts, bool ready = true,
              const std::string& revision = "rev-1") {
    const std::string name = "llama-shard-" + std::to_string(r) + "-" + std::to_string(p);
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata",
                 {{"name", name},
                  {"namespace", "ml"},
                  {"labels",
                   {{kServiceLabel, "llama"},
                    {kComponentLabel, "shard"},
                    {kReplicaLabel, std::to_string(r)},
                    {kPodIndexLabel, std::to_string(p)},
                    {"controller-revision-hash", revision}}}}},
                {"status",
                 {{"phase", "Running"},
                  {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}},
                  {"containerStatuses", {{{"name", "shard"}, {"restartCount", restarts}}}}}}};
    kube_.emit(podUrl(name), pod);
    const std::string rv = kube_.objects[podUrl(name)]["metadata"]["resourceVersion"];
    waitUntil("the pod in the cache", [&] {
      auto cached = pods_->get("ml/" + name);
      return cached && (*cached)["metadata"]["resourceVersion"] == rv;
    });
  }
  void removePod(int r, int p) {
    const std::string name = "llama-shard-" + std::to_string(r) + "-" + std::to_string(p);
    auto cached = pods_->get("ml/" + name);
    ASSERT_TRUE(cached);
    kube_.emit(podUrl(name), *cached, /*deleted=*/true);
    waitUntil("the pod gone from the cache", [&] { return !pods_->get("ml/" + name); });
  }
  std::vector<std::string> deletedPods() {
    std::vector<std::string> out;
    for (const std::string& w : kube_.writes)
      if (w.rfind("DELETE /api/v1/namespaces/ml/pods/", 0) == 0)
        out.push_back(w.substr(w.rfind('/') + 1));
    return out;
  }

  // The Events written, oldest first (objects stored under /api/v1/namespaces/ml/events/).
  std::vector<json> events() {
    std::vector<json> out;
    for (const auto& [url, o] : kube_.objects)
      if (url.rfind("/api/v1/namespaces/ml/events/", 0) == 0) out.push_back(o);
    return out;
  }
  std::vector<std::string> eventReasons() {
    std::vector<std::string> out;
    for (const json& e : events()) out.push_back(e["reason"]);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::map<std::string, std::string> conditions() {
    std::map<std::string, std::string> out;
    for (const json& c : kube_.objects[std::string(kTgs) + "/llama"]["status"]["conditions"])
      out[c["type"]] = c["status"].get<std::string>() + " " + c["reason"].get<std::string>();
    return out;
  }

  FakeKube kube_;
  const Kinds kinds_;
  EventRecorder events_{kube_, kinds_.event, "test"};
  std::unique_ptr<Informer> services_;
  std::unique_ptr<ChildInformers> children_;
  Informer *sts_ = nullptr, *pods_ = nullptr;
  std::unique_ptr<Reconciler> reconciler_;
  std::mutex requeueMu_;
  std::vector<std::pair<std::string, std::chrono::milliseconds>> requeues_;
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

// Every read comes from the informers: a settled pass sends no request at all (no GET, no list),
// and so does a pass right after the first writes.
TEST_F(ReconcilerTest, ASettledPassMakesNoRequests) {
  kube_.requests.clear();  // the informers' lists
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  for (const std::string& r : kube_.requests)
    EXPECT_NE(r.rfind("GET /apis/apps", 0), 0u) << "a pass read " << r << " from the server";
  resync();
  kube_.requests.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.requests.empty()) << kube_.requests.size() << ", first " << kube_.requests[0];
}

// Events: a Created event per child on the first pass, about the resource (involvedObject) and by
// textgen-operator; none on a settled pass; Ready and NotReady on transitions; a repeated failure
// counted in one Event.
TEST_F(ReconcilerTest, EventsTellOfChangesOnly) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  const std::vector<json> created = events();
  ASSERT_EQ(
      created.size(),
      desiredObjects(*parseServiceSpec(kube_.objects[std::string(kTgs) + "/llama"], "img"), kinds_)
          .size());
  for (const json& e : created) {
    EXPECT_EQ(e["reason"], "Created") << e.dump();
    EXPECT_EQ(e["type"], "Normal");
    EXPECT_EQ(e["involvedObject"], json({{"apiVersion", "textgen.dev/v1alpha1"},
                                         {"kind", "TextGenerationService"},
                                         {"name", "llama"},
                                         {"namespace", "ml"},
                                         {"uid", "u"}}));
    EXPECT_EQ(e["reportingComponent"], kEventComponent);
    EXPECT_EQ(e["source"]["component"], kEventComponent);
    EXPECT_EQ(e["count"], 1);
  }
  resync();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(events().size(), created.size());  // settled: nothing new
  // Every replica and the router ready: Ready (Normal); then replica 1 not: NotReady (Warning).
  auto setReady = [&](int r, int ready) {
    const std::string url =
        "/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-" + std::to_string(r);
    json sts = kube_.objects[url];
    sts["status"] = {{"replicas", 2}, {"readyReplicas", ready}, {"updatedReplicas", 2}};
    kube_.emit(url, sts);
  };
  setReady(0, 2);
  setReady(1, 2);
  json router = kube_.objects["/apis/apps/v1/namespaces/ml/deployments/llama-router"];
  router["status"] = {{"readyReplicas", 1}};
  kube_.emit("/apis/apps/v1/namespaces/ml/deployments/llama-router", router);
  resync();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(conditions()["Ready"], "True Ready");
  setReady(1, 1);
  resync();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  resync();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());  // settled again: no second NotReady
  std::vector<std::string> reasons = eventReasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "Ready"), 1);
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "NotReady"), 1);
  for (const json& e : events())
    if (e["reason"] == "NotReady") {
      EXPECT_EQ(e["type"], "Warning");
      EXPECT_NE(e["message"].get<std::string>().find("llama-shard-1 is not"), std::string::npos);
    }
  // The same failure on every retry: one ApplyFailed Event, its count going up.
  kube_.rejectStatefulSets = true;
  json tgs = kube_.objects[std::string(kTgs) + "/llama"];
  tgs["spec"]["dtype"] = "float16";
  tgs["metadata"]["generation"] = 2;
  kube_.emit(std::string(kTgs) + "/llama", tgs);
  resync();
  EXPECT_FALSE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_FALSE(reconciler_->reconcile("ml/llama").ok());
  int failed = 0;
  for (const json& e : events())
    if (e["reason"] == "ApplyFailed" &&
        e["message"].get<std::string>().find("llama-shard-0") != std::string::npos) {
      ++failed;
      EXPECT_EQ(e["type"], "Warning");
      EXPECT_EQ(e["count"], 2) << e.dump();
    }
  EXPECT_EQ(failed, 1);
}

// A cluster without KEDA's CRD (404 on its list): the ScaledObject is not applied, Degraded says
// why (CRDNotInstalled) with one Warning event, a settled pass writes nothing, and nothing fails.
TEST_F(ReconcilerTest, AnAbsentCrdIsReportedNotRetriedEveryPass) {
  stop();
  kube_.notServed = {"/apis/keda.sh/"};
  json& tgs = kube_.objects[std::string(kTgs) + "/llama"];
  tgs["spec"]["autoscaling"] = {
      {"mode", "KEDA"}, {"maxReplicas", 4}, {"prometheusAddress", "http://prom:9090"}};
  start();
  EXPECT_FALSE(children_->of(kinds_.scaledObject)->served());
  EXPECT_TRUE(children_->of(kinds_.statefulSet)->served());
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  for (const std::string& w : kube_.writes) EXPECT_EQ(w.find("keda.sh"), std::string::npos) << w;
  EXPECT_EQ(conditions()["Degraded"], "True CRDNotInstalled");
  const std::vector<std::string> reasons = eventReasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "CRDNotInstalled"), 1);
  resync();
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.writes.empty()) << kube_.writes.size() << " writes, first " << kube_.writes[0];
  // KEDA installed: the informer finds it (and would requeue), the next pass applies it.
  kube_.notServed.clear();
  waitUntil("ScaledObjects served", [&] { return children_->of(kinds_.scaledObject)->served(); });
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.objects.count("/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects/llama"));
  EXPECT_EQ(conditions()["Degraded"], "False AsExpected");
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

// shards 2, shardsPerPod 1: a rank's container restarts in replica 0 → both of its pods are deleted
// (replica 1 is left alone), once; a second failure before the replica has served again waits for
// the backoff (a requeue is asked for); once it has served, a failure restarts it at once.
TEST_F(ReconcilerTest, ARestartedRankRestartsItsWholeReplica) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  for (int r = 0; r < 2; ++r)
    for (int p = 0; p < 2; ++p) putPod(r, p, r == 0 && p == 1 ? 1 : 0);
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(deletedPods(), (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
  EXPECT_EQ(reconciler_->metrics().groupRestarts.load(), 1);
  // The cache still shows them: deleted already, not again.
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(deletedPods().empty());
  // Recreated; still loading when a rank crashes again: held back by the backoff.
  removePod(0, 0);
  removePod(0, 1);
  putPod(0, 0, 0, /*ready=*/false);
  putPod(0, 1, 1, /*ready=*/false);
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(deletedPods().empty());
  {
    std::lock_guard<std::mutex> lock(requeueMu_);
    ASSERT_FALSE(requeues_.empty());
    EXPECT_EQ(requeues_.back().first, "ml/llama");
    EXPECT_GT(requeues_.back().second.count(), 0);
    EXPECT_LE(requeues_.back().second.count(), 10000);
  }
  // Once the replica has served, the backoff is forgotten.
  putPod(0, 0, 0);
  putPod(0, 1, 0);
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  putPod(0, 0, 2);
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(deletedPods(), (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
}

// A StatefulSet from before updates were OnDelete, with the server's default rollingUpdate: the
// strategy is switched by a merge patch that drops it (OnDelete refuses it; apply would keep it).
TEST_F(ReconcilerTest, AnOldRollingUpdateStatefulSetIsSwitchedToOnDelete) {
  const std::string url = "/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-0";
  kube_.emit(
      url,
      {{"apiVersion", "apps/v1"},
       {"kind", "StatefulSet"},
       {"metadata", {{"name", "llama-shard-0"}, {"namespace", "ml"}}},
       {"spec",
        {{"replicas", 2},
         {"updateStrategy", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"partition", 0}}}}}}}});
  waitUntil("the old StatefulSet in the cache", [&] { return sts_->get("ml/llama-shard-0"); });
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(std::count(kube_.writes.begin(), kube_.writes.end(), "PATCH " + url), 2);
  EXPECT_EQ(kube_.objects[url]["spec"]["updateStrategy"], json({{"type", "OnDelete"}}));
}

// Editing spec.quantize, then spec.kvCacheDtype, changes the shard pods' template (the launcher's
// flags): both StatefulSets are re-applied with it, which gives them a new updateRevision (the
// replicas are then replaced as below); the router and the Services are left alone, and a
// settled pass after the edit writes nothing.
TEST_F(ReconcilerTest, AQuantizationEditRollsTheShardStatefulSets) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  resync();
  const std::string tgsUrl = std::string(kTgs) + "/llama";
  auto edit = [&](const char* field, const char* value, int generation) {
    json tgs = kube_.objects[tgsUrl];
    tgs["spec"][field] = value;
    tgs["metadata"]["generation"] = generation;
    kube_.emit(tgsUrl, tgs);
    const std::string rv = kube_.objects[tgsUrl]["metadata"]["resourceVersion"];
    waitUntil("the edit in the cache", [&] {
      auto cached = services_->get("ml/llama");
      return cached && (*cached)["metadata"]["resourceVersion"] == rv;
    });
    kube_.writes.clear();
    ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  };
  auto patched = [&](const std::string& url) {
    return std::count(kube_.writes.begin(), kube_.writes.end(), "PATCH " + url);
  };
  auto shardCommand = [&](int r) {  // the shell line (a hub model over two pods)
    return kube_
        .objects["/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-" + std::to_string(r)]
                ["spec"]["template"]["spec"]["containers"][0]["command"]
        .back()
        .get<std::string>();
  };
  for (int r = 0; r < 2; ++r) EXPECT_EQ(shardCommand(r).find("--quantize"), std::string::npos);
  ASSERT_TRUE(kube_.objects.count("/apis/apps/v1/namespaces/ml/deployments/llama-router"));
  ASSERT_TRUE(kube_.objects.count("/api/v1/namespaces/ml/services/llama"));
  edit("quantize", "awq", 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(patched("/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-" + std::to_string(r)),
              1)
        << r;
    EXPECT_NE(shardCommand(r).find("'--quantize' 'awq' --rank-offset"), std::string::npos)
        << shardCommand(r);
  }
  EXPECT_EQ(patched("/apis/apps/v1/namespaces/ml/deployments/llama-router"), 0);
  EXPECT_EQ(patched("/api/v1/namespaces/ml/services/llama"), 0);
  edit("kvCacheDtype", "fp8_e5m2", 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(patched("/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-" + std::to_string(r)),
              1)
        << r;
    EXPECT_NE(
        shardCommand(r).find("'--quantize' 'awq' '--kv-cache-dtype' 'fp8_e5m2' --rank-offset"),
        std::string::npos)
        << shardCommand(r);
  }
  resync();
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(kube_.writes.empty()) << kube_.writes.size() << " writes, first " << kube_.writes[0];
}

// A template change: the StatefulSets report a new updateRevision; replica 0's pods are replaced
// together while replica 1 keeps serving, then replica 1's.
TEST_F(ReconcilerTest, OutdatedReplicasAreReplacedOneAtATime) {
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  for (int r = 0; r < 2; ++r) {
    const std::string url =
        "/apis/apps/v1/namespaces/ml/statefulsets/llama-shard-" + std::to_string(r);
    json sts = kube_.objects[url];
    sts["status"] = {{"replicas", 2}, {"readyReplicas", 2}, {"updateRevision", "rev-2"}};
    kube_.emit(url, sts);
    for (int p = 0; p < 2; ++p) putPod(r, p, 0);
  }
  waitUntil("the StatefulSets' status in the cache", [&] {
    auto sts = sts_->get("ml/llama-shard-1");
    return sts && sts->contains("status");
  });
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(deletedPods(), (std::vector<std::string>{"llama-shard-0-0", "llama-shard-0-1"}));
  for (int p = 0; p < 2; ++p) {
    removePod(0, p);
    putPod(0, p, 0, /*ready=*/false, "rev-2");
  }
  kube_.writes.clear();
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_TRUE(deletedPods().empty());  // replica 0 is not serving yet
  for (int p = 0; p < 2; ++p) putPod(0, p, 0, /*ready=*/true, "rev-2");
  ASSERT_TRUE(reconciler_->reconcile("ml/llama").ok());
  EXPECT_EQ(deletedPods(), (std::vector<std::string>{"llama-shard-1-0", "llama-shard-1-1"}));
  EXPECT_EQ(reconciler_->metrics().groupRestarts.load(), 2);
}

}  // namespace
}  // namespace textgen::op
