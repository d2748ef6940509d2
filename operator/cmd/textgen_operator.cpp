// textgen-operator: reconciles TextGenerationService resources (textgen.dev/v1alpha1) into shard
// StatefulSets, Services, the router Deployment, a PodDisruptionBudget, autoscaling and an
// InferencePool, records Kubernetes Events of what it changes, and
// restarts a replica's shard pods together when one of its ranks fails (docs/operator.md). One
// active replica at a time through a Lease; /metrics and /healthz on --metrics-port.
//
//   textgen-operator [--kubeconfig FILE] [--namespace NS] [--image IMAGE] [--metrics-port 8080]
//                    [--leader-elect true|false] [--lease-namespace NS] [--lease-seconds 15]
//                    [--workers 2] [--watch-seconds 60] [--crd-recheck-seconds 30]
//                    [--json-output] [--log-level info]
//   (test only) --test-api-groups: built-in kinds in look-alike <group>.textgen.test groups
//   textgen-operator render FILE [--image IMAGE]: the objects it would create for the resource in
//   FILE (YAML or JSON), as a JSON list, without a cluster

#include <cpprest/http_listener.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "textgen/base/log.h"
#include "textgen/base/version.h"
#include "textgen/operator/child_informers.h"
#include "textgen/operator/desired_objects.h"
#include "textgen/operator/event_recorder.h"
#include "textgen/operator/informer.h"
#include "textgen/operator/leader_election.h"
#include "textgen/operator/reconciler.h"
#include "textgen/operator/service_spec.h"
#include "textgen/operator/work_queue.h"

namespace {

using namespace textgen;
using namespace textgen::op;

std::atomic<bool> gStop{false};

struct Flags {
  std::string kubeconfig, ns, image, leaseNamespace, logLevel = "info";
  int metricsPort = 8080, workers = 2, leaseSeconds = 15, watchSeconds = 60, crdRecheckSeconds = 30;
  bool leaderElect = true, testGroups = false, json = false;
};

StatusOr<Flags> parseFlags(int argc, char** argv) {
  Flags f;
  if (const char* env = std::getenv("TEXTGEN_IMAGE")) f.image = env;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> StatusOr<std::string> {
      if (i + 1 >= argc) return invalidArgumentError(a + " needs a value");
      return std::string(argv[++i]);
    };
    auto number = [&](int& out, int min, int max) -> Status {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (*end || n < min || n > max)
        return invalidArgumentError(a + " must be an integer in [" + std::to_string(min) + ", " +
                                    std::to_string(max) + "]");
      out = static_cast<int>(n);
      return okStatus();
    };
    if (a == "--kubeconfig") {
      TG_ASSIGN_OR_RETURN(f.kubeconfig, value());
    } else if (a == "--namespace") {
      TG_ASSIGN_OR_RETURN(f.ns, value());
    } else if (a == "--image") {
      TG_ASSIGN_OR_RETURN(f.image, value());
    } else if (a == "--lease-namespace") {
      TG_ASSIGN_OR_RETURN(f.leaseNamespace, value());
    } else if (a == "--metrics-port") {
      TG_RETURN_IF_ERROR(number(f.metricsPort, 0, 65535));
    } else if (a == "--workers") {
      TG_RETURN_IF_ERROR(number(f.workers, 1, 64));
    } else if (a == "--watch-seconds") {
      TG_RETURN_IF_ERROR(number(f.watchSeconds, 1, 1800));
    } else if (a == "--crd-recheck-seconds") {
      TG_RETURN_IF_ERROR(number(f.crdRecheckSeconds, 1, 3600));
    } else if (a == "--lease-seconds") {
      TG_RETURN_IF_ERROR(number(f.leaseSeconds, 2, 3600));
    } else if (a == "--leader-elect") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      if (v != "true" && v != "false") return invalidArgumentError("--leader-elect: true or false");
      f.leaderElect = v == "true";
    } else if (a == "--test-api-groups") {
      f.testGroups = true;
    } else if (a == "--json-output") {
      f.json = true;
    } else if (a == "--log-level") {
      TG_ASSIGN_OR_RETURN(f.logLevel, value());
    } else if (a == "--version") {
      std::printf("textgen-operator %s\n", std::string(textgen::kVersion).c_str());
      std::exit(0);
    } else {
      return invalidArgumentError("unknown flag '" + a + "'");
    }
  }
  return f;
}

std::string hostIdentity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "_" + std::to_string(getpid());
}

// /metrics (Prometheus text) and /healthz.
class StatusServer {
 public:
  StatusServer(int port, std::function<std::string()> metrics)
      : listener_("http://0.0.0.0:" + std::to_string(port)), metrics_(std::move(metrics)) {
    using namespace web::http;
    listener_.support(methods::GET, [this](http_request req) {
      const std::string path = req.relative_uri().path();
      if (path == "/healthz" || path == "/readyz") {
        req.reply(status_codes::OK, "ok\n", "text/plain");
      } else if (path == "/metrics") {
        req.reply(status_codes::OK, metrics_(), "text/plain; version=0.0.4");
      } else {
        req.reply(status_codes::NotFound, "not found\n", "text/plain");
      }
    });
  }
  Status open() {
    try {
      listener_.open().wait();
      return okStatus();
    } catch (const std::exception& e) {
      return unavailableError(std::string("metrics listener: ") + e.what());
    }
  }
  void close() {
    try {
      listener_.close().wait();
    } catch (...) {
    }
  }

 private:
  web::http::experimental::listener::http_listener listener_;
  std::function<std::string()> metrics_;
};

int run(const Flags& f) {
  auto config = f.kubeconfig.empty() ? inClusterConfig() : loadKubeconfig(f.kubeconfig);
  if (!config.ok()) {
    std::fprintf(stderr, "textgen-operator: %s\n", config.status().toString().c_str());
    return 1;
  }
  auto client = KubeClient::create(*config);
  if (!client.ok()) {
    std::fprintf(stderr, "textgen-operator: %s\n", client.status().toString().c_str());
    return 1;
  }
  KubeClient& kube = **client;
  const Kinds kinds(f.testGroups);
  WorkQueue queue;
  std::atomic<int64_t> leading{0};

  // Children report to their service through its label.
  auto owner = [&](const std::string&, const json& o) {
    const json& m = o["metadata"];
    const json labels = m.value("labels", json::object());
    if (labels.contains(kServiceLabel))
      queue.add(m.value("namespace", "") + "/" + labels[kServiceLabel].get<std::string>());
  };
  const std::string scope = f.ns;  // empty: every namespace
  auto collection = [&](const Kind& k) { return k.path(scope); };
  Informer services(
      kube, collection(kinds.textGenerationService), "",
      [&](const std::string&, const json& o) { queue.add(Informer::keyOf(o)); }, f.watchSeconds);
  // Every kind the operator owns: a pass reads its children from these caches only.
  ChildInformers children(kube, kinds, scope, owner, f.watchSeconds);
  children.setAbsentRetry(std::chrono::seconds(f.crdRecheckSeconds));
  // A CRD installed (or removed) later: every resource is looked at again.
  children.onServedChange([&](const Kind&, bool) {
    for (const json& o : services.list()) queue.add(Informer::keyOf(o));
  });
  EventRecorder events(kube, kinds.event, hostIdentity());
  Reconciler reconciler(
      kube, kinds, f.image, {services, children},
      [&](const std::string& key, std::chrono::milliseconds delay) { queue.addAfter(key, delay); },
      &events);

  StatusServer server(f.metricsPort, [&] {
    const ReconcilerMetrics& m = reconciler.metrics();
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, int64_t v) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
             name + " " + std::to_string(v) + "\n";
    };
    metric("textgen_operator_reconciles_total", "counter", "Reconcile passes.", m.reconciles);
    metric("textgen_operator_reconcile_errors_total", "counter",
           "Passes that failed and were requeued.", m.errors);
    metric("textgen_operator_writes_total", "counter", "Writes to the API server.", m.writes);
    metric("textgen_operator_conflicts_total", "counter", "409 conflicts (requeued).", m.conflicts);
    metric("textgen_operator_group_restarts_total", "counter",
           "Replicas whose shard pods were deleted together (a failed rank, or an update).",
           m.groupRestarts);
    metric("textgen_operator_queue_depth", "gauge", "Keys waiting in the work queue.",
           static_cast<int64_t>(queue.depth()));
    metric("textgen_operator_leader", "gauge", "1 while this replica holds the lease.", leading);
    metric("textgen_operator_relists_total", "counter", "Lists after an expired watch.",
           services.relists() + children.relists());
    metric("textgen_operator_events_total", "counter", "Kubernetes Events created.",
           events.created());
    metric("textgen_operator_events_aggregated_total", "counter",
           "Repeated Events counted in an existing Event (count and lastTimestamp patched).",
           events.aggregated());
    return out;
  });
  if (Status st = server.open(); !st.ok()) {
    std::fprintf(stderr, "textgen-operator: %s\n", st.toString().c_str());
    return 1;
  }
  spdlog::info("textgen-operator {}: API server {}, {}, metrics on :{}",
               std::string(textgen::kVersion), config->server,
               scope.empty() ? std::string("every namespace") : "namespace " + scope,
               f.metricsPort);

  LeaderElector elector(kube, kinds.lease,
                        {.ns = f.leaseNamespace.empty() ? config->namespace_ : f.leaseNamespace,
                         .identity = hostIdentity(),
                         .leaseDuration = std::chrono::seconds(f.leaseSeconds),
                         .renewDeadline = std::chrono::seconds(std::max(1, f.leaseSeconds * 2 / 3)),
                         .retryPeriod = std::chrono::milliseconds(f.leaseSeconds * 1000 / 7)});
  if (f.leaderElect && !elector.acquire(gStop)) {
    server.close();
    return 0;
  }
  leading = 1;
  services.start();
  children.start();
  std::printf("textgen-operator: leading, reconciling\n");
  std::fflush(stdout);

  std::vector<std::thread> workers;
  for (int w = 0; w < f.workers; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.get()) {
        if (!services.synced() || !children.synced()) {
          queue.done(*key);
          queue.addAfter(*key, std::chrono::milliseconds(100));
          continue;
        }
        log::ScopedField field("service", *key);
        const Status st = reconciler.reconcile(*key);
        if (st.ok()) {
          queue.forget(*key);
        } else {
          spdlog::warn("reconcile {}: {} (requeued)", *key, st.toString());
          queue.addRateLimited(*key);
        }
        queue.done(*key);
      }
    });
  }
  int code = 0;
  if (f.leaderElect) {
    if (!elector.hold(gStop)) code = 1;  // lost the lease: stop acting at once
  } else {
    while (!gStop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  queue.shutDown();
  for (auto& t : workers) t.join();
  services.stop();
  children.stop();
  if (code == 0) elector.release();
  server.close();
  spdlog::info("textgen-operator: stopped{}", code ? " (lost the lease)" : "");
  std::fflush(stdout);
  std::_Exit(code);  // informers may be blocked in a watch read
}

}  // namespace

// `render FILE [--image IMAGE]`: the desired objects of one resource, as a JSON list.
int render(int argc, char** argv) {
  std::string file, image = "textgen:latest";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--image" && i + 1 < argc) {
      image = argv[++i];
    } else if (file.empty() && a.rfind("--", 0) != 0) {
      file = a;
    } else {
      std::fprintf(stderr, "usage: textgen-operator render FILE [--image IMAGE]\n");
      return 2;
    }
  }
  std::ifstream in(file);
  if (!in) {
    std::fprintf(stderr, "textgen-operator render: cannot read '%s'\n", file.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto doc = parseYamlDocument(text.str());
  if (!doc.ok()) {
    std::fprintf(stderr, "textgen-operator render: %s: %s\n", file.c_str(),
                 doc.status().toString().c_str());
    return 1;
  }
  json& meta = (*doc)["metadata"];
  if (!meta.contains("namespace")) meta["namespace"] = "default";
  if (!meta.contains("uid")) meta["uid"] = "00000000-0000-0000-0000-000000000000";
  auto spec = parseServiceSpec(*doc, image);
  if (!spec.ok()) {
    std::fprintf(stderr, "textgen-operator render: %s: %s\n", file.c_str(),
                 spec.status().toString().c_str());
    return 1;
  }
  json out = json::array();
  for (const DesiredObject& o : desiredObjects(*spec, Kinds(false))) out.push_back(o.object);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "render") return render(argc, argv);
  auto flags = parseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "textgen-operator: %s\n", flags.status().toString().c_str());
    return 2;
  }
  auto level = log::parseLevel(flags->logLevel);
  if (!level.ok()) {
    std::fprintf(stderr, "textgen-operator: %s\n", level.status().toString().c_str());
    return 2;
  }
  log::init({.component = "operator",
             .level = *level,
             .format = flags->json ? log::Format::kJson : log::Format::kText,
             .sink = nullptr});
  std::signal(SIGTERM, [](int) { gStop = true; });
  std::signal(SIGINT, [](int) { gStop = true; });
  return run(*flags);
}
