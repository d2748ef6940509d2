// textgen-launcher: runs textgen on one machine without Kubernetes, with TGI's launcher flags and
// environment variables (each --foo-bar also reads FOO_BAR). With no --model-id it serves the demo
// model that ships in the repo (models/demo).
//
// It starts --num-shard tensor-parallel ranks of textgen-shard (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; one GPU each through CUDA_VISIBLE_DEVICES, or sharing the CPU) and waits until every
// rank is ready, starts the router, prints a curl command, forwards SIGTERM/SIGINT, and when any
// part dies it stops the others and exits non-zero with that part's last log lines.
//
// With --shards-only it starts only this machine's ranks of a group (--num-shard K of --world-size
// N from --rank-offset R, --gpus-per-shard G each, TCP ports from --port), no router: a Kubernetes
// shard pod's one container (docs/operator.md). Any rank's exit stops the others (exit 1);
// SIGTERM stops them all (exit 0).
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "textgen/base/file.h"
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
  const char* why = "";     // kUnsupported: why it is refused
  bool shardsOnly = false;  // --shards-only's: command line only (WORLD_SIZE, RANK_OFFSET, ... in
                            // the environment are other tools' business), refused without it
};

// TGI's launcher flags. kRouter values pass through to textgen-router unchanged.
const FlagSpec kFlags[] = {
    {"model-id", Kind::kValue},
    {"revision", Kind::kValue},
    {"sharded", Kind::kValue},
    {"num-shard", Kind::kValue},
    {"quantize", Kind::kValue},  // the shard checks it against the checkpoint's format
    {"dtype", Kind::kValue},
    {"kv-cache-dtype", Kind::kValue},  // fp8_e4m3fn | fp8_e5m2; absent: the model's dtype
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
    // OpenTelemetry: to the router and the shards alike (as TGI passes them); they check the URL.
    {"otlp-endpoint", Kind::kRouter},
    {"otlp-service-name", Kind::kRouter},
    {"cors-allow-origin", Kind::kRouter},
    {"watermark-gamma", Kind::kValue},  // the shard checks the ranges
    {"watermark-delta", Kind::kValue},
    {"speculate", Kind::kValue},  // n-gram speculation: tokens proposed per step
    {"api-key", Kind::kRouter},
    {"payload-limit", Kind::kRouter},
    {"validation-workers", Kind::kRouter},
    {"max-client-batch-size", Kind::kRouter},
    {"tokenizer-config-path", Kind::kRouter},  // the chat template's tokenizer_config.json
    {"graceful-termination-timeout", Kind::kValue},
    {"trust-remote-code", Kind::kSwitch},
    {"kv-cache-memory", Kind::kValue},  // textgen: the CPU KV pool budget (fraction or bytes)
    {"log-level", Kind::kValue},
    {"prometheus-port", Kind::kRouter},  // TGI's default 9000 is not taken: off unless given
    {"disable-grammar-support", Kind::kRouterSwitch},
    {"usage-stats", Kind::kValue},               // on | off | no-stack: textgen sends none
    {"enable-prefill-logprobs", Kind::kSwitch},  // textgen serves them whenever asked
    {"env", Kind::kSwitch},                      // TGI's -e/--env: the runtime, printed first
    {"lora-adapters", Kind::kUnsupported, "LoRA adapters are not supported yet"},
    // --ngrok (or NGROK=true) is refused below; its token and edge mean nothing without it, and
    // NGROK_AUTHTOKEN is ngrok's own variable, often set in a shell: read, and ignored, as TGI.
    {"ngrok", Kind::kSwitch},
    {"ngrok-authtoken", Kind::kValue},
    {"ngrok-edge", Kind::kValue},
    // textgen: run only this machine's ranks of a group (a Kubernetes pod's), no router.
    {"shards-only", Kind::kSwitch, "", true},
    {"world-size", Kind::kValue, "", true},
    {"rank-offset", Kind::kValue, "", true},
    {"gpus-per-shard", Kind::kValue, "", true},
    {"shard-urls", Kind::kValue, "", true},
};

using Values = std::map<std::string, std::vector<std::string>>;

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
launcher::ShardPlanOptions shardPlanOptions(const Values& values, bool shardsOnly) {
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
      .kvCacheMemory = given("kv-cache-memory"),
      .shardsOnly = shardsOnly,
      .worldSize = given("world-size"),
      .rankOffset = given("rank-offset"),
      .gpusPerShard = given("gpus-per-shard")};
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

// Stops every part after a failure, naming the culprit with its last lines. Returns 1.
int failAll(std::vector<std::unique_ptr<ChildProcess>>& parts, size_t numShards,
            const std::string& what, ChildProcess* culprit) {
  if (gSignal) {
    std::fprintf(stderr, "textgen-launcher: signal %d before every part was ready: stopping\n",
                 gSignal.load());
  } else {
    std::fprintf(stderr, "textgen-launcher: %s\n", what.c_str());
  }
  if (culprit)
    std::fprintf(stderr, "  last lines of %s:\n%s", culprit->name().c_str(),
                 culprit->lastLines().c_str());
  stopAll(parts, numShards, std::chrono::seconds(5));
  return 1;
}

// The command line as parsed: values (environment first, then flags) and switches.
struct Parsed {
  Values values;
  std::set<std::string> switches;
  std::set<std::string> onCommandLine;
  std::string get(const std::string& n, const std::string& fallback) const {
    auto it = values.find(n);
    return it == values.end() ? fallback : it->second.front();
  }
};

// Parses argv (and the flags' environment variables). Returns an exit status when done already
// (--version, a usage error).
std::optional<int> parseFlags(int argc, char** argv, Parsed& p) {
  // Environment first (TGI's clap env), then the command line.
  for (const FlagSpec& f : kFlags) {
    if (f.shardsOnly) continue;
    if (const char* v = std::getenv(envName(f.name).c_str()); v && *v) {
      if (f.kind == Kind::kSwitch || f.kind == Kind::kRouterSwitch) {
        if (std::string(v) == "true" || std::string(v) == "1") p.switches.insert(f.name);
      } else {
        p.values[f.name] = {v};  // PORT and HOSTNAME too, as TGI (its image sets PORT=80)
      }
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--version") {
      std::printf("textgen-launcher %s\n", kVersion);
      return 0;
    }
    if (a == "--help" || a == "-h") {
      std::printf(
          "textgen-launcher %s: TGI's launcher flags (docs/launcher.md); each --foo-bar also reads "
          "FOO_BAR.\nflags:",
          kVersion);
      for (const FlagSpec& f : kFlags) {
        std::printf("\n  --%s%s%s", f.name,
                    f.kind == Kind::kValue || f.kind == Kind::kRouter ? " VALUE" : "",
                    f.kind == Kind::kUnsupported ? "  (refused: " : "");
        if (f.kind == Kind::kUnsupported) std::printf("%s)", f.why);
      }
      std::printf("\n");
      return 0;
    }
    // TGI's short forms.
    if (a == "-e") a = "--env";
    if (a == "-p") a = "--port";
    if (a == "-g") a = "--graceful-termination-timeout";
    if (a.rfind("--", 0) != 0) return usage("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* f = findFlag(name);
    if (!f) return usage("unknown flag --" + name);
    p.onCommandLine.insert(name);
    if (f->kind == Kind::kSwitch || f->kind == Kind::kRouterSwitch) {
      p.switches.insert(name);
      continue;
    }
    // Refused before its value is read: some (--ngrok) are switches in TGI.
    if (f->kind == Kind::kUnsupported)
      return usage("--" + name + " is not supported: " + std::string(f->why));
    if (eq == std::string::npos) {
      if (i + 1 >= argc) return usage("--" + name + " needs a value");
      value = argv[++i];
    }
    if (name == "cors-allow-origin") {
      p.values[name].push_back(value);
    } else {
      p.values[name] = {value};
    }
  }
  for (const auto& [name, v] : p.values) {
    if (const FlagSpec* f = findFlag(name); f && f->kind == Kind::kUnsupported) {
      return usage(envName(name) + " is set, but it is not supported: " + std::string(f->why));
    }
  }
  if (p.switches.contains("ngrok"))
    return usage("--ngrok is not supported: textgen opens no ngrok tunnel; use an ingress");
  if (p.switches.contains("trust-remote-code")) {
    return usage(
        "--trust-remote-code is refused: textgen never runs code from a model repository; "
        "it serves the architectures it implements from their weights alone");
  }
  // TGI's --quantize values: the pre-quantized formats are read from the checkpoint (the shard
  // checks its quantization_config), the load-time ones quantize a dense checkpoint.
  if (p.values.contains("quantize")) {
    const std::string q = p.get("quantize", "");
    static constexpr std::string_view kServed[] = {"gptq",
                                                   "awq",
                                                   "compressed-tensors",
                                                   "marlin",
                                                   "bitsandbytes",
                                                   "bitsandbytes-nf4",
                                                   "bitsandbytes-fp4",
                                                   "eetq",
                                                   "fp8"};
    if (std::find(std::begin(kServed), std::end(kServed), q) == std::end(kServed)) {
      if (q == "exl2")
        return usage(
            "--quantize exl2 is not supported: ExLlamaV2 checkpoints are not read (gptq, awq, "
            "compressed-tensors, marlin, bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, eetq "
            "and fp8 are)");
      return usage("--quantize " + q +
                   ": expected one of gptq, awq, compressed-tensors, marlin, bitsandbytes, "
                   "bitsandbytes-nf4, bitsandbytes-fp4, eetq, fp8");
    }
  }
  // TGI's --kv-cache-dtype: the KV cache in fp8 (without it, in the model's dtype).
  if (p.values.contains("kv-cache-dtype")) {
    const std::string kv = p.get("kv-cache-dtype", "");
    if (kv != "fp8_e4m3fn" && kv != "fp8_e5m2")
      return usage("--kv-cache-dtype " + kv +
                   ": expected fp8_e4m3fn or fp8_e5m2 (without the flag the KV cache takes the "
                   "model's dtype)");
  }
  if (p.values.contains("usage-stats")) {
    const std::string u = p.get("usage-stats", "");
    if (u != "on" && u != "off" && u != "no-stack")
      return usage("--usage-stats " + u + ": expected on, off or no-stack");
  }
  // --shards-only's flags need it; the router's flags are refused with it (it starts no router).
  const bool shardsOnly = p.switches.contains("shards-only");
  // There --port is the first rank's gRPC port: TGI's PORT (the HTTP port an image or a platform
  // sets) must not move it; the command line only.
  if (shardsOnly && !p.onCommandLine.contains("port")) p.values.erase("port");
  for (const std::string& name : p.onCommandLine) {
    const FlagSpec* f = findFlag(name);
    if (!shardsOnly && f->shardsOnly) return usage("--" + name + " needs --shards-only");
    const bool routers = (f->kind == Kind::kRouter || f->kind == Kind::kRouterSwitch ||
                          name == "hostname" || name == "shard-uds-path") &&
                         name != "json-output" && !name.starts_with("otlp-");
    if (shardsOnly && routers)
      return usage("--" + name + " is the router's, and --shards-only starts no router");
  }
  return std::nullopt;
}

// The model directory: a local directory, or a hub id resolved in (and downloaded into) the hub
// cache; the demo model without --model-id. Returns an exit status on failure.
std::variant<fs::path, int> modelDirectory(const Parsed& p) {
  const fs::path demo = std::getenv("TEXTGEN_DEMO_MODEL")
                            ? fs::path(std::getenv("TEXTGEN_DEMO_MODEL"))
                            : fs::path(TEXTGEN_DEMO_MODEL);
  const std::string modelId = p.get("model-id", "");
  fs::path modelDir = modelId.empty() ? demo : fs::path(modelId);
  if (!modelId.empty() && !fs::is_directory(modelDir)) {
    HubOptions hub = hubOptionsFromEnv();
    if (p.values.contains("huggingface-hub-cache"))
      hub.cacheDir = p.get("huggingface-hub-cache", "");
    auto snapshot = resolveModel(modelId, p.get("revision", ""), hub);
    if (!snapshot.ok()) {
      std::fprintf(stderr, "textgen-launcher: %s\n", snapshot.status().message().c_str());
      return 1;
    }
    modelDir = *snapshot;
  }
  if (!fs::exists(modelDir / "config.json"))
    return usage(modelDir.string() + " has no config.json");
  return modelDir;
}

// TGI's Medusa directory (config.json with medusa_num_heads) names its base model: a directory
// (absolute, or relative to it), or a hub id, resolved in (and downloaded into) the hub cache as
// --model-id is. Returns the base's directory (nullopt for a model directory, or a base the shard
// is left to refuse), or an exit status on failure.
std::variant<std::optional<fs::path>, int> medusaBase(const Parsed& p, const fs::path& modelDir) {
  // Bounded and regular files only (a FIFO or a huge file is the shard's to refuse).
  const auto text = readRegularFile((modelDir / "config.json").string());
  if (!text.ok()) return std::optional<fs::path>();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("medusa_num_heads")) return std::optional<fs::path>();
  auto base = j.find("base_model_name_or_path");
  if (base == j.end() || !base->is_string() || base->get<std::string>().empty())
    return std::optional<fs::path>();
  const fs::path named(base->get<std::string>());
  std::error_code ec;
  const fs::path local = named.is_absolute() ? named : modelDir / named;
  if (fs::is_directory(local, ec)) return std::optional<fs::path>(local.lexically_normal());
  HubOptions hub = hubOptionsFromEnv();
  if (p.values.contains("huggingface-hub-cache")) hub.cacheDir = p.get("huggingface-hub-cache", "");
  auto snapshot = resolveModel(named.string(), "", hub);
  if (!snapshot.ok()) {
    std::fprintf(stderr, "textgen-launcher: the Medusa heads' base model %s: %s\n",
                 named.string().c_str(), snapshot.status().message().c_str());
    return 1;
  }
  return std::optional<fs::path>(fs::path(*snapshot));
}

// Every rank's command line but its address (--uds-path or --port) and --shard-urls.
std::vector<std::string> shardArgs(const Parsed& p, const fs::path& modelDir,
                                   const std::optional<fs::path>& medusa,
                                   const launcher::ShardPlan& plan) {
  std::vector<std::string> args{(selfDir() / "textgen-shard").string(), "--model-id",
                                modelDir.string(), "--log-level", p.get("log-level", "info")};
  if (medusa) {
    args.push_back("--medusa-base");
    args.push_back(medusa->string());
  }
  // --dtype etc.: the shard checks them against its device.
  for (const char* flag :
       {"dtype", "quantize", "kv-cache-dtype", "cuda-graphs", "cuda-memory-fraction", "speculate",
        "watermark-gamma", "watermark-delta", "otlp-endpoint", "otlp-service-name"}) {
    if (p.values.contains(flag)) {
      args.push_back(std::string("--") + flag);
      args.push_back(p.get(flag, ""));
    }
  }
  for (std::string& a : plan.rankArgs()) args.push_back(std::move(a));
  if (p.switches.contains("json-output")) args.push_back("--json-output");
  return args;
}

// Starts plan.numShard ranks with `addressArgs(i)` appended to local rank i's command line, and
// waits until all are ready (they meet each other before any is: all start at once). Returns the
// ready lines' rest, or the exit status after stopping them.
std::variant<std::vector<std::string>, int> startRanks(
    std::vector<std::unique_ptr<ChildProcess>>& parts, const launcher::ShardPlan& plan,
    const std::vector<std::string>& common,
    const std::function<std::vector<std::string>(int)>& addressArgs, std::chrono::seconds timeout) {
  const ReadyWait shardsReady{.prefix = "textgen-shard ready ",
                              .timeout = timeout,
                              .cancelled = [] { return gSignal != 0; },
                              .running = {}};
  const auto numShard = static_cast<size_t>(plan.numShard);
  std::vector<ChildProcess*> shards;
  for (int i = 0; i < plan.numShard; ++i) {
    std::vector<std::string> args = common;
    for (std::string& a : addressArgs(i)) args.push_back(std::move(a));
    auto shard = ChildProcess::start("textgen-shard rank " + std::to_string(plan.rankOffset + i),
                                     args, plan.rankEnv(i));
    if (!shard.ok()) return failAll(parts, numShard, shard.status().message(), nullptr);
    parts.push_back(std::move(*shard));
    shards.push_back(parts.back().get());
  }
  ChildProcess* culprit = nullptr;
  auto ready = ChildProcess::waitAllReady(shards, shardsReady, &culprit);
  if (!ready.ok()) return failAll(parts, numShard, ready.status().message(), culprit);
  return *ready;
}

// After start-up: until a signal (stop everything; `stopped` is the exit status) or a part's exit
// (stop the others, exit 1).
int supervise(std::vector<std::unique_ptr<ChildProcess>>& parts, size_t numShards,
              std::chrono::seconds grace, const std::function<int(int worst)>& stopped) {
  while (true) {
    if (gSignal) {
      std::fprintf(stderr, "textgen-launcher: signal %d: stopping (graceful timeout %lld s)\n",
                   gSignal.load(), static_cast<long long>(grace.count()));
      return stopped(stopAll(parts, numShards, grace));
    }
    for (auto& p : parts) {
      if (auto status = p->poll()) {
        return failAll(parts, numShards,
                       p->name() + " exited with status " + std::to_string(*status), p.get());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// `--shards-only`: this machine's ranks of a group on TCP ports --port .. --port+K-1, no router
// (a Kubernetes pod's: docs/operator.md). All or nothing: one rank's exit stops the others and
// exits 1; SIGTERM stops them all at once and exits 0.
int runShardsOnly(const Parsed& p, const launcher::ShardPlan& plan,
                  const std::vector<std::string>& common, std::chrono::seconds grace) {
  const std::string portText = p.get("port", "50051");
  const bool digits =
      !portText.empty() && portText.find_first_not_of("0123456789") == std::string::npos;
  const long port = digits && portText.size() < 6 ? std::stol(portText) : -1;
  if (port < 1 || port + plan.numShard - 1 > 65535) {
    return usage("--port must be a port number with room for " + std::to_string(plan.numShard) +
                 " ranks after it (at most 65535), not '" + portText + "'");
  }
  std::string urls = p.get("shard-urls", "");
  if (urls.empty() && plan.worldSize > 1) {
    if (plan.numShard < plan.worldSize) {
      return usage("--shard-urls is needed: ranks of this group run elsewhere too (--world-size " +
                   std::to_string(plan.worldSize) + ", --num-shard " +
                   std::to_string(plan.numShard) + ")");
    }
    for (int i = 0; i < plan.numShard; ++i)
      urls += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(port + i);
  }
  std::signal(SIGTERM, [](int s) { gSignal = s; });
  std::signal(SIGINT, [](int s) { gSignal = s; });
  std::vector<std::unique_ptr<ChildProcess>> parts;
  auto addressArgs = [&](int i) {
    std::vector<std::string> a{"--port", std::to_string(port + i)};
    if (!urls.empty()) a.insert(a.end(), {"--shard-urls", urls});
    return a;
  };
  // Loading a large model can take long; a Kubernetes startup probe bounds it too.
  auto ready = startRanks(parts, plan, common, addressArgs, std::chrono::seconds(3600));
  if (auto* status = std::get_if<int>(&ready)) return *status;
  std::string lines;
  for (const std::string& l : std::get<std::vector<std::string>>(ready)) lines += " " + l;
  std::printf("textgen-launcher shards ready: ranks %d..%d of %d:%s\n", plan.rankOffset,
              plan.rankOffset + plan.numShard - 1, plan.worldSize, lines.c_str());
  std::fflush(stdout);
  return supervise(parts, parts.size(), grace, [](int worst) {
    if (worst != 0)
      std::fprintf(stderr, "textgen-launcher: a rank exited with status %d as it stopped\n", worst);
    return 0;  // a requested stop
  });
}

int run(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "download-weights") return downloadWeights(argc, argv);
  Parsed p;
  if (auto done = parseFlags(argc, argv, p)) return *done;
  const bool shardsOnly = p.switches.contains("shards-only");
  auto plan = launcher::planShards(shardPlanOptions(p.values, shardsOnly));
  if (!plan.ok()) return usage(plan.status().message());
  auto model = modelDirectory(p);
  if (auto* status = std::get_if<int>(&model)) return *status;
  const fs::path modelDir = std::get<fs::path>(model);
  if (p.switches.contains("env")) {  // TGI's --env: what this launcher runs on, then it goes on
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::printf(
        "textgen-launcher %s\nmodel: %s\nranks: %d on %s\nCUDA_VISIBLE_DEVICES: %s\n", kVersion,
        modelDir.c_str(), plan->numShard,
        plan->gpus.empty() ? "the CPU" : (std::to_string(plan->gpus.size()) + " GPUs").c_str(),
        visible ? visible : "(unset)");
    std::fflush(stdout);
  }
  auto base = medusaBase(p, modelDir);
  if (auto* status = std::get_if<int>(&base)) return *status;
  const std::optional<fs::path> medusa = std::get<std::optional<fs::path>>(base);
  const std::vector<std::string> common = shardArgs(p, modelDir, medusa, *plan);
  // The router's tokenizer: a Medusa directory's own when it has one (as the shard's), else its
  // base model's.
  std::error_code ec;
  const fs::path tokenizerDir =
      medusa && !fs::exists(modelDir / "tokenizer.json", ec) ? *medusa : modelDir;
  const auto grace =
      std::chrono::seconds(std::atoi(p.get("graceful-termination-timeout", "90").c_str()));
  if (shardsOnly) return runShardsOnly(p, *plan, common, grace);

  const std::string modelId = p.get("model-id", "");
  const std::string served = modelId.empty() ? "textgen-demo" : modelId;
  const std::string uds = p.get("shard-uds-path", "/tmp/text-generation-server");
  std::signal(SIGTERM, [](int s) { gSignal = s; });
  std::signal(SIGINT, [](int s) { gSignal = s; });

  std::vector<std::unique_ptr<ChildProcess>> parts;
  const auto numShard = static_cast<size_t>(plan->numShard);
  // The router is given rank 0's socket and finds the others through ServiceDiscovery.
  auto ready = startRanks(
      parts, *plan, common,
      [&](int) {
        return std::vector<std::string>{"--uds-path", uds};
      },
      std::chrono::seconds(600));
  if (auto* status = std::get_if<int>(&ready)) return *status;
  std::vector<ChildProcess*> shards;
  for (auto& part : parts) shards.push_back(part.get());
  std::vector<std::string> routerArgs{(selfDir() / "textgen-router").string(),
                                      "--tokenizer-name",
                                      tokenizerDir.string(),
                                      "--model-id",
                                      served,
                                      "--master-shard-uds-path",
                                      uds + "-0",
                                      "--hostname",
                                      p.get("hostname", "0.0.0.0"),
                                      "--port",
                                      p.get("port", "3000"),
                                      "--log-level",
                                      p.get("log-level", "info")};
  for (const FlagSpec& f : kFlags) {
    if (f.kind == Kind::kRouter && p.values.contains(f.name)) {
      for (const std::string& v : p.values.at(f.name)) {
        routerArgs.push_back(std::string("--") + f.name);
        routerArgs.push_back(v);
      }
    }
    if (f.kind == Kind::kRouterSwitch && p.switches.contains(f.name))
      routerArgs.push_back(std::string("--") + f.name);
  }
  auto router = ChildProcess::start("textgen-router", routerArgs, {});
  if (!router.ok()) return failAll(parts, numShard, router.status().message(), nullptr);
  parts.push_back(std::move(*router));
  const ReadyWait routerReady{.prefix = "textgen-router ready ",
                              .timeout = std::chrono::seconds(600),
                              .cancelled = [] { return gSignal != 0; },
                              .running = shards};
  ChildProcess* culprit = nullptr;
  auto urls = ChildProcess::waitAllReady({parts.back().get()}, routerReady, &culprit);
  if (!urls.ok()) return failAll(parts, numShard, urls.status().message(), culprit);
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
  return supervise(parts, numShard, grace, [](int worst) { return worst == 0 ? 0 : 1; });
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
