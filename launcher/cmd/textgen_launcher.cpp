// textgen-launcher: runs textgen on one machine without Kubernetes, with TGI's launcher flags and
// environment variables (each --foo-bar also reads FOO_BAR). With no --model-id it serves the demo
// model that ships in the repo (models/demo).
//
// It starts --num-shard tensor-parallel ranks of textgen-shard (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; one GPU each through CUDA_VISIBLE_DEVICES, or sharing the CPU) and waits until every
// rank is ready, starts the router, prints a curl command, forwards SIGTERM/SIGINT, and when any
// part dies it stops the others and exits non-zero with that part's last log lines.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "textgen/base/version.h"
#include "textgen/launcher/child_process.h"
#include "textgen/launcher/hub.h"
#include "textgen/launcher/shard_plan.h"

namespace {

using namespace textgen;
using textgen::launcher::ChildProcess;
using textgen::launcher::HubOptions;
using textgen::launcher::hubOptionsFromEnv;
using textgen::launcher::ReadyWait;
using textgen::launcher::resolveModel;
namespace fs = std::filesystem;

enum class Kind { kValue, kSwitch, kRouter, kRouterSwitch, kUnsupported };

struct FlagSpec {
  const char* name;
  Kind kind;
  const char* why = "";  // kUnsupported: why it is refused
};

// TGI's launcher flags. kRouter values pass through to textgen-router unchanged.
const FlagSpec kFlags[] = {
    {"model-id", Kind::kValue},
    {"revision", Kind::kValue},
    {"sharded", Kind::kValue},
    {"num-shard", Kind::kValue},
    {"quantize", Kind::kUnsupported, "quantization is not implemented yet"},
    {"dtype", Kind::kValue},
    {"max-concurrent-requests", Kind::kRouter},
    {"max-best-of", Kind::kRouter},
    {"max-stop-sequences", Kind::kRouter},
    {"max-top-n-tokens", Kind::kRouter},
    {"max-input-tokens", Kind::kRouter},
    {"max-input-length", Kind::kRouter},
    {"max-total-tokens", Kind::kRouter},
    {"waiting-served-ratio", Kind::kRouter},
    {"max-batch-prefill-tokens", Kind::kRouter},
    {"max-batch-total-tokens", Kind::kRouter},
    {"max-waiting-tokens", Kind::kRouter},
    {"max-batch-size", Kind::kRouter},
    {"hostname", Kind::kValue},
    {"port", Kind::kValue},
    {"shard-uds-path", Kind::kValue},
    {"master-addr", Kind::kValue},
    {"master-port", Kind::kValue},
    {"huggingface-hub-cache", Kind::kValue},
    {"weights-cache-override", Kind::kUnsupported,
     "the safetensors weights are served from the hub cache as they are (no conversion step)"},
    {"disable-custom-kernels", Kind::kUnsupported,
     "textgen's CUDA backend is built from its own kernels; there is no fallback to switch to"},
    {"cuda-memory-fraction", Kind::kValue},
    {"cuda-graphs", Kind::kValue},
    {"rope-scaling", Kind::kUnsupported,
     "overriding the model's RoPE scaling is not implemented yet"},
    {"rope-factor", Kind::kUnsupported,
     "overriding the model's RoPE scaling is not implemented yet"},
    {"json-output", Kind::kRouterSwitch},
    {"otlp-endpoint", Kind::kUnsupported, "tracing (OpenTelemetry) is not implemented yet"},
    {"cors-allow-origin", Kind::kRouter},
    {"watermark-gamma", Kind::kUnsupported, "watermarking is not implemented yet"},
    {"watermark-delta", Kind::kUnsupported, "watermarking is not implemented yet"},
    {"api-key", Kind::kRouter},
    {"payload-limit", Kind::kRouter},
    {"validation-workers", Kind::kRouter},
    {"max-client-batch-size", Kind::kRouter},
    {"graceful-termination-timeout", Kind::kValue},
    {"trust-remote-code", Kind::kSwitch},
    {"kv-cache-memory", Kind::kValue},  // textgen: the CPU KV pool budget (fraction or bytes)
    {"log-level", Kind::kValue},
};

std::atomic<int> gSignal{0};

const FlagSpec* findFlag(const std::string& name) {
  for (const FlagSpec& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

std::string envName(const std::string& flag) {
  std::string e;
  for (char c : flag)
    e += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

int usage(const std::string& problem) {
  std::fprintf(stderr, "textgen-launcher: %s\nflags:", problem.c_str());
  for (const FlagSpec& f : kFlags) std::fprintf(stderr, " --%s", f.name);
  std::fprintf(stderr, "\n");
  return 2;
}

fs::path selfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return fs::current_path();
  buf[n] = '\0';
  return fs::path(buf).parent_path();
}

// --sharded / --num-shard and what the ranks depend on: the GPUs this process sees, its CPUs.
launcher::ShardPlanOptions shardPlanOptions(
    const std::map<std::string, std::vector<std::string>>& values) {
  auto given = [&](const std::string& n) {
    auto it = values.find(n);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second.front());
  };
  const char* cudaVisible = std::getenv("CUDA_VISIBLE_DEVICES");
  cpu_set_t cpus;
  launcher::ShardPlanOptions o{
      .sharded = given("sharded"),
      .numShard = given("num-shard"),
      .gpus = launcher::visibleGpus(cudaVisible ? std::optional<std::string>(cudaVisible)
                                                : std::nullopt),
      .nvlsSetByUser = std::getenv("NCCL_NVLS_ENABLE") != nullptr,
      .cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1,
      .kvCacheMemory = given("kv-cache-memory")};
  o.masterAddr = given("master-addr").value_or(o.masterAddr);
  o.masterPort = given("master-port").value_or(o.masterPort);
  return o;
}

// Stops the router first (it stops taking requests), then every rank at once (a rank may wait for
// its peers as it shuts down). `parts` holds the ranks, then the router. Returns the worst exit
// status other than 0 and SIGTERM's.
int stopAll(std::vector<std::unique_ptr<ChildProcess>>& parts, size_t numShards,
            std::chrono::milliseconds timeout) {
  int worst = 0;
  auto note = [&](int status) {
    if (status != 0 && status != 128 + SIGTERM) worst = status;
  };
  for (size_t i = parts.size(); i > numShards; --i) note(parts[i - 1]->stop(timeout));
  const size_t shards = std::min(numShards, parts.size());
  for (size_t i = 0; i < shards; ++i) parts[i]->signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 0; i < shards; ++i) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    note(parts[i]->stop(std::max(left, std::chrono::milliseconds(0))));
  }
  return worst;
}

// `textgen-launcher download-weights <model-id> [--revision R]`: fill the hub cache and print the
// snapshot directory (for an init container, or to prepare a machine that will run offline).
int downloadWeights(int argc, char** argv) {
  std::string modelId, revision;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--revision" && i + 1 < argc) {
      revision = argv[++i];
    } else if (a.rfind("--revision=", 0) == 0) {
      revision = a.substr(11);
    } else if (a.rfind("--", 0) != 0 && modelId.empty()) {
      modelId = a;
    } else {
      std::fprintf(stderr, "textgen-launcher download-weights: unexpected argument '%s'\n",
                   a.c_str());
      return 2;
    }
  }
  if (modelId.empty()) {
    std::fprintf(stderr, "usage: textgen-launcher download-weights <model-id> [--revision R]\n");
    return 2;
  }
  auto snapshot = resolveModel(modelId, revision, hubOptionsFromEnv());
  if (!snapshot.ok()) {
    std::fprintf(stderr, "textgen-launcher: %s\n", snapshot.status().message().c_str());
    return 1;
  }
  std::printf("%s\n", snapshot->c_str());
  return 0;
}

int run(int argc, char** argv) {
  std::map<std::string, std::vector<std::string>> values;
  std::set<std::string> switches;
  if (argc > 1 && std::string(argv[1]) == "download-weights") return downloadWeights(argc, argv);
  // Environment first (TGI's clap env), then the command line.
  for (const FlagSpec& f : kFlags) {
    if (const char* v = std::getenv(envName(f.name).c_str()); v && *v) {
      if (f.kind == Kind::kSwitch || f.kind == Kind::kRouterSwitch) {
        if (std::string(v) == "true" || std::string(v) == "1") switches.insert(f.name);
      } else if (std::string(f.name) != "port" || std::getenv("TEXTGEN_LAUNCHER_PORT_FROM_ENV")) {
        // PORT is commonly set by other tools; only --port or TEXTGEN_LAUNCHER_PORT_FROM_ENV honour
        // it.
        values[f.name] = {v};
      }
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--version") {
      std::printf("textgen-launcher %s\n", kVersion);
      return 0;
    }
    if (a.rfind("--", 0) != 0) return usage("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* f = findFlag(name);
    if (!f) return usage("unknown flag --" + name);
    if (f->kind == Kind::kSwitch || f->kind == Kind::kRouterSwitch) {
      switches.insert(name);
      continue;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= argc) return usage("--" + name + " needs a value");
      value = argv[++i];
    }
    if (f->kind == Kind::kUnsupported)
      return usage("--" + name + " is not supported: " + std::string(f->why));
    if (name == "cors-allow-origin") {
      values[name].push_back(value);
    } else {
      values[name] = {value};
    }
  }
  for (const auto& [name, v] : values) {
    if (const FlagSpec* f = findFlag(name); f && f->kind == Kind::kUnsupported) {
      return usage(envName(name) + " is set, but it is not supported: " + std::string(f->why));
    }
  }
  if (switches.contains("trust-remote-code")) {
    return usage(
        "--trust-remote-code is refused: textgen never runs code from a model repository; "
        "it serves the architectures it implements from their weights alone");
  }
  auto get = [&](const std::string& n, const std::string& fallback) {
    return values.contains(n) ? values[n].front() : fallback;
  };
  auto plan = launcher::planShards(shardPlanOptions(values));
  if (!plan.ok()) return usage(plan.status().message());
  // The model: a local directory, or a hub id resolved in (and downloaded into) the hub cache.
  const fs::path demo = std::getenv("TEXTGEN_DEMO_MODEL")
                            ? fs::path(std::getenv("TEXTGEN_DEMO_MODEL"))
                            : fs::path(TEXTGEN_DEMO_MODEL);
  const std::string modelId = get("model-id", "");
  fs::path modelDir = modelId.empty() ? demo : fs::path(modelId);
  if (!modelId.empty() && !fs::is_directory(modelDir)) {
    HubOptions hub = hubOptionsFromEnv();
    if (values.contains("huggingface-hub-cache")) hub.cacheDir = get("huggingface-hub-cache", "");
    auto snapshot = resolveModel(modelId, get("revision", ""), hub);
    if (!snapshot.ok()) {
      std::fprintf(stderr, "textgen-launcher: %s\n", snapshot.status().message().c_str());
      return 1;
    }
    modelDir = *snapshot;
  }
  if (!fs::exists(modelDir / "config.json"))
    return usage(modelDir.string() + " has no config.json");
  const std::string served = modelId.empty() ? "textgen-demo" : modelId;
  const std::string dtype = get("dtype", ""), memoryFraction = get("cuda-memory-fraction", ""),
                    cudaGraphs = get("cuda-graphs", "");
  const std::string uds = get("shard-uds-path", "/tmp/text-generation-server");
  const auto grace =
      std::chrono::seconds(std::atoi(get("graceful-termination-timeout", "90").c_str()));
  const std::string logLevel = get("log-level", "info");
  const fs::path bin = selfDir();

  std::signal(SIGTERM, [](int s) { gSignal = s; });
  std::signal(SIGINT, [](int s) { gSignal = s; });

  std::vector<std::unique_ptr<ChildProcess>> parts;
  auto fail = [&](const std::string& what, ChildProcess* culprit) {
    if (gSignal) {
      std::fprintf(stderr, "textgen-launcher: signal %d before every part was ready: stopping\n",
                   gSignal.load());
    } else {
      std::fprintf(stderr, "textgen-launcher: %s\n", what.c_str());
    }
    if (culprit)
      std::fprintf(stderr, "  last lines of %s:\n%s", culprit->name().c_str(),
                   culprit->lastLines().c_str());
    stopAll(parts, static_cast<size_t>(plan->numShard), std::chrono::seconds(5));
    return 1;
  };
  const ReadyWait shardsReady{.prefix = "textgen-shard ready ",
                              .timeout = std::chrono::seconds(600),
                              .cancelled = [] { return gSignal != 0; },
                              .running = {}};
  // Every rank first, then wait for them all: ranks meet each other before any is ready.
  std::vector<ChildProcess*> shards;
  for (int rank = 0; rank < plan->numShard; ++rank) {
    std::vector<std::string> args{(bin / "textgen-shard").string(),
                                  "--model-id",
                                  modelDir.string(),
                                  "--uds-path",
                                  uds,
                                  "--log-level",
                                  logLevel};
    if (!dtype.empty()) {  // the shard checks it against its device
      args.push_back("--dtype");
      args.push_back(dtype);
    }
    if (!cudaGraphs.empty()) {
      args.push_back("--cuda-graphs");
      args.push_back(cudaGraphs);
    }
    if (!memoryFraction.empty()) {
      args.push_back("--cuda-memory-fraction");
      args.push_back(memoryFraction);
    }
    for (std::string& a : plan->rankArgs()) args.push_back(std::move(a));
    if (switches.contains("json-output")) args.push_back("--json-output");
    auto shard = ChildProcess::start("textgen-shard rank " + std::to_string(rank), args,
                                     plan->rankEnv(rank));
    if (!shard.ok()) return fail(shard.status().message(), nullptr);
    parts.push_back(std::move(*shard));
    shards.push_back(parts.back().get());
  }
  ChildProcess* culprit = nullptr;
  if (auto ready = ChildProcess::waitAllReady(shards, shardsReady, &culprit); !ready.ok())
    return fail(ready.status().message(), culprit);
  std::vector<std::string> routerArgs{(bin / "textgen-router").string(),
                                      "--tokenizer-name",
                                      modelDir.string(),
                                      "--model-id",
                                      served,
                                      "--master-shard-uds-path",
                                      uds + "-0",
                                      "--hostname",
                                      get("hostname", "0.0.0.0"),
                                      "--port",
                                      get("port", "3000"),
                                      "--log-level",
                                      logLevel};
  for (const FlagSpec& f : kFlags) {
    if (f.kind == Kind::kRouter && values.contains(f.name)) {
      for (const std::string& v : values[f.name]) {
        routerArgs.push_back(std::string("--") + f.name);
        routerArgs.push_back(v);
      }
    }
    if (f.kind == Kind::kRouterSwitch && switches.contains(f.name))
      routerArgs.push_back(std::string("--") + f.name);
  }
  auto router = ChildProcess::start("textgen-router", routerArgs, {});
  if (!router.ok()) return fail(router.status().message(), nullptr);
  parts.push_back(std::move(*router));
  ReadyWait routerReady = shardsReady;
  routerReady.prefix = "textgen-router ready ";
  routerReady.running = shards;
  auto urls = ChildProcess::waitAllReady({parts.back().get()}, routerReady, &culprit);
  if (!urls.ok()) return fail(urls.status().message(), culprit);
  const std::string url = urls->front();
  std::string local = url;
  if (local.find("0.0.0.0") != std::string::npos)
    local.replace(local.find("0.0.0.0"), 7, "127.0.0.1");
  std::printf("textgen-launcher ready %s\n", url.c_str());
  std::printf(
      "serving %s; try:\n  curl %s/generate -X POST -H 'Content-Type: application/json' "
      "-d '{\"inputs\":\"To open a file\",\"parameters\":{\"max_new_tokens\":40}}'\n",
      served.c_str(), local.c_str());
  std::fflush(stdout);

  while (true) {
    if (gSignal) {
      std::fprintf(stderr, "textgen-launcher: signal %d: stopping (graceful timeout %lld s)\n",
                   gSignal.load(), static_cast<long long>(grace.count()));
      const int worst = stopAll(parts, static_cast<size_t>(plan->numShard), grace);
      return worst == 0 ? 0 : 1;
    }
    for (auto& p : parts) {
      if (auto status = p->poll()) {
        return fail(p->name() + " exited with status " + std::to_string(*status), p.get());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
