// textgen-shard: one tensor-parallel rank of a model replica, serving ShardService over gRPC.
//
//   textgen-shard --model-id DIR [--uds-path PATH | --port N] [--block-size 16]
//                 [--kv-cache-memory BYTES|FRACTION] [--threads N] [--json-output] [--log-level
//                 info]
// Rank and world size come from RANK / WORLD_SIZE (MASTER_ADDR / MASTER_PORT for the collective),
// as in TGI. With --uds-path the socket is PATH-RANK, and ServiceDiscovery returns every rank's
// socket.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../src/service/shard_service.h"
#include "textgen/base/log.h"
#include "textgen/base/version.h"
#include "textgen/runtime/engine.h"
#include "textgen/tokenizer/tokenizer.h"

namespace {

using namespace textgen;

struct Flags {
  std::string modelId;
  std::string revision;
  std::string dtype;
  std::string udsPath;
  int port = -1;
  int64_t blockSize = 16;
  std::string kvCacheMemory = "0.25";  // a fraction of available memory, or bytes
  int threads = 0;
  bool jsonOutput = false;
  std::string logLevel = "info";
  int rank = 0;
  int worldSize = 1;
};

std::atomic<bool> gStop{false};

StatusOr<int64_t> parseInt(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0')
    return invalidArgumentError(flag + ": '" + v + "' is not an integer");
  return static_cast<int64_t>(n);
}

StatusOr<Flags> parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> StatusOr<std::string> {
      if (i + 1 >= argc) return invalidArgumentError(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--model-id") {
      TG_ASSIGN_OR_RETURN(f.modelId, value());
    } else if (a == "--revision") {
      TG_ASSIGN_OR_RETURN(f.revision, value());
    } else if (a == "--dtype") {
      TG_ASSIGN_OR_RETURN(f.dtype, value());
    } else if (a == "--uds-path") {
      TG_ASSIGN_OR_RETURN(f.udsPath, value());
    } else if (a == "--port") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(int64_t p, parseInt(a, v));
      if (p < 0 || p > 65535) return invalidArgumentError("--port must be in [0, 65535]");
      f.port = static_cast<int>(p);
    } else if (a == "--block-size") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(f.blockSize, parseInt(a, v));
      if (f.blockSize <= 0) return invalidArgumentError("--block-size must be positive");
    } else if (a == "--kv-cache-memory") {
      TG_ASSIGN_OR_RETURN(f.kvCacheMemory, value());
    } else if (a == "--threads") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(int64_t t, parseInt(a, v));
      f.threads = static_cast<int>(t);
    } else if (a == "--json-output") {
      f.jsonOutput = true;
    } else if (a == "--log-level") {
      TG_ASSIGN_OR_RETURN(f.logLevel, value());
    } else if (a == "--version") {
      std::printf("textgen-shard %s\n", kVersion);
      std::exit(0);
    } else {
      return invalidArgumentError("unknown flag '" + a + "'");
    }
  }
  if (f.modelId.empty()) return invalidArgumentError("--model-id DIR is required");
  if (!f.revision.empty()) {
    return invalidArgumentError(
        "--revision selects a hub revision, which textgen-launcher resolves; "
        "the shard takes a local model directory");
  }
  if (!f.dtype.empty() && f.dtype != "float32") {
    return invalidArgumentError("--dtype " + f.dtype + ": the CPU backend computes in float32");
  }
  if (f.udsPath.empty() == (f.port < 0))
    return invalidArgumentError("give exactly one of --uds-path and --port");
  auto envInt = [](const char* name, int fallback) -> StatusOr<int> {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    TG_ASSIGN_OR_RETURN(int64_t n, parseInt(name, v));
    return static_cast<int>(n);
  };
  TG_ASSIGN_OR_RETURN(f.rank, envInt("RANK", 0));
  TG_ASSIGN_OR_RETURN(f.worldSize, envInt("WORLD_SIZE", 1));
  if (f.worldSize < 1 || f.rank < 0 || f.rank >= f.worldSize) {
    return invalidArgumentError("RANK must be in [0, WORLD_SIZE)");
  }
  return f;
}

// Bytes for the KV pool: a fraction of MemAvailable (e.g. "0.25") or an absolute byte count.
StatusOr<int64_t> kvBudget(const std::string& spec) {
  if (spec.find('.') != std::string::npos) {
    const double fraction = std::atof(spec.c_str());
    if (!(fraction > 0 && fraction < 1))
      return invalidArgumentError("--kv-cache-memory fraction must be in (0, 1)");
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (meminfo >> key >> kb >> unit) {
      if (key == "MemAvailable:")
        return static_cast<int64_t>(fraction * static_cast<double>(kb) * 1024);
    }
    return internalError("cannot read MemAvailable from /proc/meminfo");
  }
  return parseInt("--kv-cache-memory", spec);
}

int run(int argc, char** argv) {
  auto flags = parseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "textgen-shard: %s\n", flags.status().message().c_str());
    return 2;
  }
  const Flags& f = *flags;
  auto level = log::parseLevel(f.logLevel);
  if (!level.ok()) {
    std::fprintf(stderr, "textgen-shard: %s\n", level.status().message().c_str());
    return 2;
  }
  log::init({.component = "shard",
             .level = *level,
             .format = f.jsonOutput ? log::Format::kJson : log::Format::kText,
             .sink = nullptr});
  log::ScopedField rankField("rank", std::to_string(f.rank));
  auto fail = [](const Status& s) {
    spdlog::critical("{}", s.toString());
    return 1;
  };
  auto budget = kvBudget(f.kvCacheMemory);
  if (!budget.ok()) return fail(budget.status());
  auto backend = runtime::makeCpuBackend(f.threads);
  auto model = runtime::loadModel(f.modelId, *backend, {.rank = f.rank, .worldSize = f.worldSize});
  if (!model.ok()) return fail(model.status().withContext("loading " + f.modelId));
  auto tok = tokenizer::Tokenizer::fromDirectory(f.modelId);
  if (!tok.ok()) return fail(tok.status().withContext("loading the tokenizer of " + f.modelId));
  runtime::Engine engine(**model, **tok, *backend,
                         {.blockSize = f.blockSize, .kvCacheBytes = *budget});

  runtime::ShardServiceOptions options;
  options.worldSize = f.worldSize;
  std::string listen;
  if (!f.udsPath.empty()) {
    for (int r = 0; r < f.worldSize; ++r)
      options.rankUrls.push_back("unix://" + f.udsPath + "-" + std::to_string(r));
    listen = options.rankUrls[f.rank];
    std::filesystem::remove(f.udsPath + "-" + std::to_string(f.rank));
  } else {
    listen = "0.0.0.0:" + std::to_string(f.port);
  }
  auto service = runtime::makeShardService(engine, **model, options);
  grpc::ServerBuilder builder;
  int boundPort = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           f.udsPath.empty() ? &boundPort : nullptr);
  builder.SetMaxReceiveMessageSize(256 * 1024 * 1024);
  builder.SetMaxSendMessageSize(256 * 1024 * 1024);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return fail(unavailableError("cannot listen on " + listen));
  if (f.udsPath.empty()) {
    options.rankUrls = {"127.0.0.1:" + std::to_string(boundPort)};
    listen = "0.0.0.0:" + std::to_string(boundPort);
  }
  spdlog::info("serving {} ({} layers, vocab {}) on {}", f.modelId, (*model)->config().numLayers,
               (*model)->config().vocabSize, listen);
  // Readiness line for launchers and tests: the address, once it accepts connections.
  std::printf("textgen-shard ready %s\n", listen.c_str());
  std::fflush(stdout);
  std::signal(SIGTERM, [](int) { gStop = true; });
  std::signal(SIGINT, [](int) { gStop = true; });
  while (!gStop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("shutting down");
  // In-flight RPCs get a moment to finish; idle client connections must not hold the exit.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  if (!f.udsPath.empty()) std::filesystem::remove(f.udsPath + "-" + std::to_string(f.rank));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
