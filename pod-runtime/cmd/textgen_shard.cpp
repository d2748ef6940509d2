// textgen-shard: one tensor-parallel rank of a model replica, serving ShardService over gRPC.
//
//   textgen-shard --model-id DIR [--uds-path PATH | --port N] [--block-size 16]
//                 [--device auto|cuda|cpu] [--dtype float16|bfloat16|float32]
//                 [--quantize gptq|awq|compressed-tensors|marlin|bitsandbytes|
//                             bitsandbytes-nf4|bitsandbytes-fp4|eetq|fp8]
//                 [--kv-cache-dtype fp8_e4m3fn|fp8_e5m2]
//                 [--cuda-memory-fraction 1.0] [--cuda-graphs 1,2,4,8,16,32,48,64,96,128|0]
//                 [--kv-cache-memory BYTES|FRACTION] [--threads N]
//                 [--shard-urls ADDR,ADDR,...] [--collective-timeout SECONDS]
//                 [--otlp-endpoint URL] [--otlp-service-name NAME]
//                 [--json-output] [--log-level info]
// The device defaults to CUDA where there is one. On CUDA the dtype defaults to the checkpoint's
// (float16 for a float32 checkpoint, as TGI does; bfloat16 for T5, which overflows float16) and
// the KV pool is sized at Warmup from free
// device memory; on the CPU it is float32 and the pool a fraction of MemAvailable. The KV cache is
// kept in the dtype, or with --kv-cache-dtype as fp8 codes (one byte an element: twice the blocks
// of a 16-bit cache in the same memory).
// Rank and world size come from RANK / WORLD_SIZE (MASTER_ADDR / MASTER_PORT for the collective),
// as in TGI. With WORLD_SIZE > 1 the ranks meet through rank 0's rendezvous store, connect NCCL
// (CUDA) or Gloo (CPU), and each loads its Megatron share of the weights; a rank whose peer dies,
// or whose collective stops for --collective-timeout, exits non-zero (the group restarts whole).
// Rank r uses device r % (visible devices): with CUDA_VISIBLE_DEVICES per rank, device 0.
// With --uds-path the socket is PATH-RANK, and ServiceDiscovery returns every rank's socket. On
// TCP, --shard-urls lists every rank's address as the router should dial it (rank order; in
// Kubernetes the pods' DNS names, which textgen-operator passes); without it a single-rank shard
// answers with its own 127.0.0.1 address.
#include <grpcpp/grpcpp.h>
#ifdef TEXTGEN_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include <grpcpp/impl/service_type.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "../src/service/shard_service.h"
#include "textgen/base/file.h"
#include "textgen/base/log.h"
#include "textgen/base/version.h"
#include "textgen/base/watermark.h"
#include "textgen/runtime/communicator.h"
#include "textgen/runtime/engine.h"
#include "textgen/tokenizer/tokenizer.h"
#include "textgen/tracing/tracing.h"

namespace {

using namespace textgen;

struct Flags {
  std::string modelId;
  std::string revision;
  std::string dtype;
  std::string quantize;  // TGI's --quantize: only a pre-quantized checkpoint's own format today
  kernels::KvCacheDType kvCacheDtype = kernels::KvCacheDType::kAuto;  // TGI's --kv-cache-dtype
  std::string udsPath;
  int port = -1;
  int64_t blockSize = 16;
  std::string device = "auto";
  double cudaMemoryFraction = 1.0;
  // TGI's default (1..32) and 48..128: decode batches of 33 to 128 rows replay a graph too, 3-5%
  // faster steps on an H100 at no cost in KV cache (bench/README.md, 2026-11-27).
  std::vector<int64_t> cudaGraphs{1, 2, 4, 8, 16, 32, 48, 64, 96, 128};
  std::string kvCacheMemory;  // a fraction of available memory, or bytes; empty: the default
  int threads = 0;
  bool jsonOutput = false;
  std::string logLevel = "info";
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "localhost";
  int masterPort = 29500;
  bool prefixCaching =
      true;               // TGI's PREFIX_CACHING environment variable ("0" or "false" turns off)
  int updateThreads = 0;  // TEXTGEN_UPDATE_THREADS: the engine's host workers (0: its default)
  int collectiveTimeoutS = 300;
  std::vector<std::string> shardUrls;
  int64_t speculate = -1;  // TGI's --speculate (-1: not given; resolveMedusa sets it)
  // --model-id a Medusa directory: its heads' directory, --model-id then its base model's.
  std::string medusaDir;
  std::string medusaBase;  // --medusa-base: the base model's directory, overriding the config's
  int64_t medusaLayers = 1;
  double watermarkGamma = kWatermarkDefaultGamma, watermarkDelta = kWatermarkDefaultDelta;
  // OpenTelemetry (TGI's flags): Prefill and Decode spans under the router's, when it traces.
  std::string otlpEndpoint, otlpServiceName = "text-generation-inference.server";
};

std::atomic<bool> gStop{false};

// A tensor-parallel group that cannot go on (a peer gone, a collective failed or stuck, a step
// failed on this rank): exit 3 at once, so that the whole group restarts. Called from any thread
// (the rank is named: background threads' log lines carry no rank field).
void groupFailed(int rank, const std::string& why) {
  if (gStop) return;  // shutting down: peers leave too
  spdlog::critical("rank {}: tensor-parallel group failed: {}; exiting so that the group restarts",
                   rank, why);
  spdlog::default_logger()->flush();
  std::_Exit(3);
}

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
    } else if (a == "--quantize") {
      TG_ASSIGN_OR_RETURN(f.quantize, value());
    } else if (a == "--kv-cache-dtype") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      const auto fp8 = kernels::fp8KvCacheDTypeOf(v);
      if (!fp8) {
        return invalidArgumentError("--kv-cache-dtype must be fp8_e4m3fn or fp8_e5m2, not '" + v +
                                    "' (without the flag the KV cache takes the model's dtype)");
      }
      f.kvCacheDtype = *fp8;
    } else if (a == "--uds-path") {
      TG_ASSIGN_OR_RETURN(f.udsPath, value());
    } else if (a == "--port") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(int64_t p, parseInt(a, v));
      if (p < 0 || p > 65535) return invalidArgumentError("--port must be in [0, 65535]");
      f.port = static_cast<int>(p);
    } else if (a == "--shard-urls") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      for (size_t start = 0; start <= v.size();) {
        const size_t comma = std::min(v.find(',', start), v.size());
        if (comma > start) f.shardUrls.push_back(v.substr(start, comma - start));
        start = comma + 1;
      }
    } else if (a == "--block-size") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(f.blockSize, parseInt(a, v));
      if (f.blockSize <= 0) return invalidArgumentError("--block-size must be positive");
    } else if (a == "--device") {
      TG_ASSIGN_OR_RETURN(f.device, value());
      if (f.device != "auto" && f.device != "cuda" && f.device != "cpu")
        return invalidArgumentError("--device must be auto, cuda or cpu");
    } else if (a == "--cuda-memory-fraction") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      f.cudaMemoryFraction = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(f.cudaMemoryFraction > 0 && f.cudaMemoryFraction <= 1))
        return invalidArgumentError("--cuda-memory-fraction must be a number in (0, 1]");
    } else if (a == "--cuda-graphs") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      f.cudaGraphs.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        TG_ASSIGN_OR_RETURN(int64_t n, parseInt(a, v.substr(pos, comma - pos)));
        if (n < 0) return invalidArgumentError("--cuda-graphs sizes must not be negative");
        if (n > 0) f.cudaGraphs.push_back(n);  // "0" disables graphs, as in TGI
        pos = comma + 1;
      }
    } else if (a == "--collective-timeout") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(int64_t t, parseInt(a, v));
      if (t < 1 || t > 86400)
        return invalidArgumentError("--collective-timeout must be in [1, 86400] seconds");
      f.collectiveTimeoutS = static_cast<int>(t);
    } else if (a == "--medusa-base") {  // the launcher's: a hub id base model it resolved
      TG_ASSIGN_OR_RETURN(f.medusaBase, value());
    } else if (a == "--speculate") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(f.speculate, parseInt(a, v));
      if (f.speculate < 0 || f.speculate > 16)
        return invalidArgumentError("--speculate must be in [0, 16]");
    } else if (a == "--watermark-gamma" || a == "--watermark-delta") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0')
        return invalidArgumentError(a + ": '" + v + "' is not a number");
      (a == "--watermark-gamma" ? f.watermarkGamma : f.watermarkDelta) = x;
      TG_RETURN_IF_ERROR(checkWatermarkParams(f.watermarkGamma, f.watermarkDelta));
    } else if (a == "--kv-cache-memory") {
      TG_ASSIGN_OR_RETURN(f.kvCacheMemory, value());
    } else if (a == "--threads") {
      TG_ASSIGN_OR_RETURN(std::string v, value());
      TG_ASSIGN_OR_RETURN(int64_t t, parseInt(a, v));
      f.threads = static_cast<int>(t);
    } else if (a == "--otlp-endpoint") {
      TG_ASSIGN_OR_RETURN(f.otlpEndpoint, value());
      TG_RETURN_IF_ERROR(tracing::validateEndpoint(f.otlpEndpoint));
    } else if (a == "--otlp-service-name") {
      TG_ASSIGN_OR_RETURN(f.otlpServiceName, value());
      if (f.otlpServiceName.empty()) return invalidArgumentError("--otlp-service-name is empty");
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
  if (!f.dtype.empty() && f.dtype != "float32" && f.dtype != "float16" && f.dtype != "bfloat16")
    return invalidArgumentError("--dtype must be float16, bfloat16 or float32, not " + f.dtype);
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
  if (f.worldSize < 1 || f.worldSize > 1024 || f.rank < 0 || f.rank >= f.worldSize) {
    return invalidArgumentError("RANK must be in [0, WORLD_SIZE) and WORLD_SIZE in [1, 1024]");
  }
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) f.masterAddr = a;
  if (const char* p = std::getenv("PREFIX_CACHING"); p && *p) {
    std::string v = p;
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "0" || v == "false") {
      f.prefixCaching = false;
    } else if (v != "1" && v != "true") {
      return invalidArgumentError(std::string("PREFIX_CACHING must be 1, true, 0 or false, not ") +
                                  p);
    }
  }
  TG_ASSIGN_OR_RETURN(f.updateThreads, envInt("TEXTGEN_UPDATE_THREADS", 0));
  if (f.updateThreads < 0 || f.updateThreads > 64)
    return invalidArgumentError("TEXTGEN_UPDATE_THREADS must be in [0, 64] (0: the default)");
  TG_ASSIGN_OR_RETURN(f.masterPort, envInt("MASTER_PORT", 29500));
  if (f.masterPort < 1 || f.masterPort > 65535)
    return invalidArgumentError("MASTER_PORT must be in [1, 65535]");
  if (!f.shardUrls.empty() && !f.udsPath.empty())
    return invalidArgumentError(
        "--shard-urls is for TCP shards (--port); --uds-path names its own");
  if (!f.shardUrls.empty() && static_cast<int>(f.shardUrls.size()) != f.worldSize) {
    return invalidArgumentError("--shard-urls lists " + std::to_string(f.shardUrls.size()) +
                                " addresses for WORLD_SIZE " + std::to_string(f.worldSize));
  }
  if (f.udsPath.empty() && f.shardUrls.empty() && f.worldSize > 1) {
    return invalidArgumentError(
        "a TCP shard of WORLD_SIZE > 1 needs --shard-urls (every rank's address)");
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

// Rank r takes device r % (visible devices): every GPU of the machine visible (rank r on GPU r,
// ranks of a second pod on its own GPUs from 0), or one per rank through CUDA_VISIBLE_DEVICES
// (device 0).
int deviceFor(int rank) {
  int count = 0;
#ifdef TEXTGEN_HAVE_CUDA
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
#endif
  return count > 0 ? rank % count : 0;
}

StatusOr<std::unique_ptr<runtime::Backend>> pickBackend(const Flags& f) {
  if (f.device == "cpu") return runtime::makeCpuBackend(f.threads);
  auto cuda = runtime::makeCudaBackend(f.worldSize > 1 ? deviceFor(f.rank) : 0);
  if (cuda.ok() || f.device == "cuda") return cuda;
  spdlog::info("no CUDA device ({}): using the CPU backend", cuda.status().message());
  return runtime::makeCpuBackend(f.threads);
}

// --quantize: a pre-quantized format names the checkpoint's own (config.json's
// quantization_config, recognised without the flag too); a load-time format quantizes a dense
// checkpoint as it loads.
StatusOr<runtime::LoadQuantization> checkQuantize(const Flags& f, const runtime::ModelConfig& c) {
  using runtime::LoadQuantization;
  if (f.quantize.empty()) return LoadQuantization::kNone;
  const LoadQuantization atLoad = runtime::loadQuantizationOf(f.quantize);
  // --quantize fp8 on an fp8 checkpoint names its own format, as TGI accepts it.
  if (atLoad == LoadQuantization::kFp8 && c.quantization.method == runtime::QuantMethod::kFp8)
    return LoadQuantization::kNone;
  if (atLoad != LoadQuantization::kNone) {
    if (c.quantization.quantized())
      return invalidArgumentError("--quantize " + f.quantize +
                                  ": the checkpoint is already quantized (config.json's "
                                  "quantization_config.quant_method '" +
                                  std::string(toString(c.quantization.method)) +
                                  "'); drop the flag to serve it as it is");
    return atLoad;
  }
  if (f.quantize != "gptq" && f.quantize != "awq" && f.quantize != "compressed-tensors" &&
      f.quantize != "marlin")
    return invalidArgumentError(
        "--quantize " + f.quantize +
        ": expected one of gptq, awq, compressed-tensors, marlin (pre-quantized checkpoints), "
        "bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, eetq, fp8 (quantized at load; fp8 "
        "also names an fp8 checkpoint)");
  // TGI's --quantize compressed-tensors: the fp8 checkpoints of that format that textgen reads.
  if (f.quantize == "compressed-tensors" && c.quantization.method == runtime::QuantMethod::kFp8)
    return LoadQuantization::kNone;
  if (!c.quantization.quantized())
    return invalidArgumentError("--quantize " + f.quantize +
                                ": config.json has no quantization_config (a pre-quantized " +
                                f.quantize + " checkpoint is needed)");
  // A GPT-Q config with checkpoint_format "marlin" is named by --quantize gptq too (vLLM's rule).
  if (f.quantize == "gptq" && c.quantization.marlinAsGptq) return LoadQuantization::kNone;
  // TGI's --quantize marlin reads B and s alone: a GPT-Q checkpoint is not repacked under it.
  if (f.quantize == "marlin" && c.quantization.method != runtime::QuantMethod::kMarlin)
    return invalidArgumentError(
        "--quantize marlin needs a Marlin-format checkpoint (B and s "
        "tensors), but config.json's quantization_config.quant_method is '" +
        std::string(toString(c.quantization.method)) + "'; drop the flag (or pass --quantize " +
        std::string(toString(c.quantization.method)) + ") to serve it as it is");
  if (f.quantize != toString(c.quantization.method))
    return invalidArgumentError("--quantize " + f.quantize +
                                " contradicts config.json's quantization_config.quant_method '" +
                                std::string(toString(c.quantization.method)) + "'");
  return LoadQuantization::kNone;
}

StatusOr<kernels::DType> pickDtype(const Flags& f, const runtime::ModelConfig& c, bool cuda) {
  if (f.dtype == "float32") return kernels::DType::kF32;
  if (f.dtype == "float16" || f.dtype == "bfloat16") {
    if (!cuda)
      return invalidArgumentError("--dtype " + f.dtype + ": the CPU backend computes in float32");
    return f.dtype == "float16" ? kernels::DType::kF16 : kernels::DType::kBF16;
  }
  if (!cuda) return kernels::DType::kF32;
  // T5 overflows float16 (its graph refuses it): bfloat16 whatever the checkpoint's, as TGI.
  if (c.isEncoderDecoder) return kernels::DType::kBF16;
  return c.dtype == kernels::DType::kBF16 ? kernels::DType::kBF16 : kernels::DType::kF16;
}

// What must be equal on every rank of a group.
std::string fingerprint(const Flags& f, runtime::Backend& backend, kernels::DType dtype) {
  std::string config;
  if (auto text = readRegularFile(f.modelId + "/config.json"); text.ok()) config = *text;
  std::string graphs;
  for (int64_t g : f.cudaGraphs) graphs += std::to_string(g) + ",";
  const char* custom = std::getenv("TEXTGEN_CUSTOM_ALL_REDUCE");
  return std::string("backend=") + backend.name() +
         " dtype=" + std::string(kernels::dtypeName(dtype)) +
         " block-size=" + std::to_string(f.blockSize) + " cuda-graphs=" + graphs +
         " config.json=" + std::to_string(std::hash<std::string>{}(config)) +
         " TEXTGEN_CUSTOM_ALL_REDUCE=" + (custom ? custom : "") + " quantize=" + f.quantize +
         " kv-cache-dtype=" + std::string(kernels::kvCacheDTypeName(f.kvCacheDtype)) +
         " speculate=" + std::to_string(f.speculate) + " medusa=" + f.medusaDir +
         " watermark=" + std::to_string(f.watermarkGamma) + "," + std::to_string(f.watermarkDelta);
}

Status checkSameStart(runtime::Rendezvous& r, const std::string& mine) {
  TG_RETURN_IF_ERROR(r.set("start/" + std::to_string(r.rank()), mine));
  TG_ASSIGN_OR_RETURN(std::string zero, r.get("start/0", std::chrono::minutes(10)));
  if (zero != mine) {
    return failedPreconditionError("rank " + std::to_string(r.rank()) +
                                   " was started unlike rank 0: this rank has '" + mine +
                                   "', rank 0 '" + zero + "'");
  }
  return okStatus();
}

// --model-id naming TGI's Medusa directory (config.json with medusa_num_heads): the base model it
// names is served, with its heads proposing --speculate tokens (all of them when not given, as TGI;
// more than it has is an error). Otherwise --speculate defaults to 0 (no speculation).
Status resolveMedusa(Flags& f) {
  TG_ASSIGN_OR_RETURN(std::optional<runtime::MedusaConfig> medusa,
                      runtime::readMedusaConfig(f.modelId, f.medusaBase));
  if (!medusa) {
    if (!f.medusaBase.empty())
      return invalidArgumentError("--medusa-base: " + f.modelId + " is not a Medusa directory");
    f.speculate = std::max<int64_t>(f.speculate, 0);
    return okStatus();
  }
  if (f.speculate > medusa->heads) {
    return invalidArgumentError("--speculate " + std::to_string(f.speculate) +
                                ": the Medusa model " + f.modelId + " has only " +
                                std::to_string(medusa->heads) + " heads; make them match");
  }
  if (f.speculate < 0) f.speculate = std::min<int64_t>(medusa->heads, 16);
  f.medusaDir = f.modelId;
  f.medusaLayers = medusa->layers;
  f.modelId = medusa->baseModel;
  return okStatus();
}

int run(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a peer gone mid-write is an error to report, not a signal
  auto flags = parseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "textgen-shard: %s\n", flags.status().message().c_str());
    return 2;
  }
  Flags& f = *flags;
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
  if (!f.otlpEndpoint.empty()) {
    auto exporter =
        tracing::makeOtlpExporter({.endpoint = f.otlpEndpoint, .serviceName = f.otlpServiceName});
    if (!exporter.ok()) return fail(exporter.status());
    tracing::install(std::move(*exporter));
  }
  // On every way out (but std::_Exit's): what is queued goes to the collector if it takes it soon,
  // before the process's static objects go.
  struct TracingFlush {
    ~TracingFlush() { tracing::shutdown(std::chrono::seconds(2)); }
  } tracingFlush;
  if (Status s = resolveMedusa(f); !s.ok()) return fail(s.withContext("--model-id " + f.modelId));
  if (!f.medusaDir.empty()) {
    spdlog::info("Medusa heads from {}: {} of them propose tokens, base model {}", f.medusaDir,
                 f.speculate, f.modelId);
  }
  auto backend = pickBackend(f);
  if (!backend.ok()) return fail(backend.status());
  const bool cuda = std::string((*backend)->name()) == "cuda";
  auto config = runtime::loadArchitectureConfig(f.modelId);
  if (!config.ok()) return fail(config.status().withContext("loading " + f.modelId));
  auto quantize = checkQuantize(f, *config);
  if (!quantize.ok()) return fail(quantize.status());
  auto dtype = pickDtype(f, *config, cuda);
  if (!dtype.ok()) return fail(dtype.status());
  if (config->isEncoderDecoder && f.kvCacheDtype != kernels::KvCacheDType::kAuto) {
    return fail(invalidArgumentError("--kv-cache-dtype " +
                                     std::string(kernels::kvCacheDTypeName(f.kvCacheDtype)) + ": " +
                                     config->architecture +
                                     " keeps its encoder's attention in the KV cache; fp8 is not "
                                     "supported for encoder-decoder models"));
  }
  if (config->isEncoderDecoder && f.speculate > 0) {
    return fail(invalidArgumentError("--speculate " + std::to_string(f.speculate) + ": " +
                                     config->architecture +
                                     " is an encoder-decoder model; speculative decoding is "
                                     "supported for decoder-only models"));
  }
  // CUDA: 0 sizes the pool from free device memory at Warmup.
  auto budget = f.kvCacheMemory.empty() ? StatusOr<int64_t>(cuda ? 0 : *kvBudget("0.25"))
                                        : kvBudget(f.kvCacheMemory);
  if (!budget.ok()) return fail(budget.status());
  // Tensor parallelism: meet the other ranks, then connect the collectives. A peer lost from here
  // on ends this process (its group restarts whole); so does a collective that fails.
  std::unique_ptr<runtime::Rendezvous> rendezvous;
  std::unique_ptr<runtime::Communicator> comm;
  if (f.worldSize > 1) {
    auto fatal = [rank = f.rank](const std::string& why) { groupFailed(rank, why); };
    spdlog::info("rank {} of {}: meeting the others at {}:{}", f.rank, f.worldSize, f.masterAddr,
                 f.masterPort);
    auto r = runtime::Rendezvous::join({.masterAddr = f.masterAddr,
                                        .masterPort = f.masterPort,
                                        .rank = f.rank,
                                        .worldSize = f.worldSize});
    if (!r.ok()) return fail(r.status());
    rendezvous = std::move(*r);
    // Every rank must have been started alike, or the collectives would not match (a rank that
    // fell back to the CPU beside GPU ranks, another dtype, KV cache dtype, model, block size or
    // graph sizes).
    if (auto s = checkSameStart(*rendezvous, fingerprint(f, **backend, *dtype)); !s.ok())
      return fail(s);
    const auto timeout = std::chrono::seconds(f.collectiveTimeoutS);
    auto c =
        runtime::makeCommunicator(**backend, *rendezvous, {.timeout = timeout, .onFatal = fatal});
    if (!c.ok()) return fail(c.status());
    comm = std::move(*c);
    if (auto s = rendezvous->barrier("connected"); !s.ok()) return fail(s);
    rendezvous->watchPeers([fatal](const std::string& why) {
      // A peer's exit during a graceful stop is expected: give our own SIGTERM a moment.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      fatal(why);
    });
    spdlog::info("rank {} of {}: {} connected", f.rank, f.worldSize, comm->name());
  }
  auto model = runtime::loadModel(f.modelId, **backend,
                                  {.comm = comm.get(),
                                   .dtype = *dtype,
                                   .graphBatchSizes = cuda ? f.cudaGraphs : std::vector<int64_t>{},
                                   .graphRowsPerSequence = 1 + f.speculate,
                                   .quantize = *quantize,
                                   .medusaDir = f.speculate > 0 ? f.medusaDir : std::string(),
                                   .medusaHeads = f.speculate,
                                   .medusaLayers = f.medusaLayers});
  if (!model.ok()) return fail(model.status().withContext("loading " + f.modelId));
  // A Medusa directory's own tokenizer when it has one (TGI reads the --model-id's), else the
  // base model's.
  const std::string tokDir =
      !f.medusaDir.empty() && std::filesystem::exists(f.medusaDir + "/tokenizer.json") ? f.medusaDir
                                                                                       : f.modelId;
  auto tok = tokenizer::Tokenizer::fromDirectory(tokDir);
  if (!tok.ok()) return fail(tok.status().withContext("loading the tokenizer of " + tokDir));
  spdlog::info("backend {}, dtype {}, KV cache {}", (*backend)->name(), kernels::dtypeName(*dtype),
               f.kvCacheDtype == kernels::KvCacheDType::kAuto
                   ? kernels::dtypeName(*dtype)
                   : kernels::kvCacheDTypeName(f.kvCacheDtype));
  runtime::Engine engine(**model, **tok, **backend,
                         {.blockSize = f.blockSize,
                          .kvCacheBytes = *budget,
                          .memoryFraction = f.cudaMemoryFraction,
                          .comm = comm.get(),
                          .kvCacheDtype = f.kvCacheDtype,
                          .speculate = f.speculate,
                          .watermarkGamma = f.watermarkGamma,
                          .watermarkDelta = f.watermarkDelta,
                          .updateThreads = f.updateThreads});

  runtime::ShardServiceOptions options;
  options.dtype = std::string(kernels::dtypeName(*dtype));
  options.deviceType = cuda ? "cuda" : "cpu";
  options.worldSize = f.worldSize;
  options.prefixCaching = f.prefixCaching;
  if (f.worldSize > 1) {
    options.stepTimeout = std::chrono::seconds(f.collectiveTimeoutS);
    options.warmupTimeout = std::chrono::seconds(std::max(f.collectiveTimeoutS, 1800));
    options.onGroupFailure = [rank = f.rank](const std::string& why) { groupFailed(rank, why); };
  }
  std::string listen;
  // A TCP shard on port 0 learns its port only once listening: ServiceDiscovery reads it then.
  auto boundPort = std::make_shared<std::atomic<int>>(0);
  if (!f.udsPath.empty()) {
    std::vector<std::string> urls;
    for (int r = 0; r < f.worldSize; ++r)
      urls.push_back("unix://" + f.udsPath + "-" + std::to_string(r));
    listen = urls[f.rank];
    options.rankUrls = [urls] { return urls; };
    std::filesystem::remove(f.udsPath + "-" + std::to_string(f.rank));
  } else {
    listen = "0.0.0.0:" + std::to_string(f.port);
    if (!f.shardUrls.empty()) {
      options.rankUrls = [urls = f.shardUrls] { return urls; };
    } else {
      options.rankUrls = [boundPort] {
        return std::vector<std::string>{"127.0.0.1:" + std::to_string(boundPort->load())};
      };
    }
  }
  auto service = runtime::makeShardService(engine, **model, options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           f.udsPath.empty() ? &port : nullptr);
  builder.SetMaxReceiveMessageSize(256 * 1024 * 1024);
  builder.SetMaxSendMessageSize(256 * 1024 * 1024);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return fail(unavailableError("cannot listen on " + listen));
  if (f.udsPath.empty()) {
    boundPort->store(port);
    listen = "0.0.0.0:" + std::to_string(port);
  }
  spdlog::info("serving {} ({} layers, vocab {}) on {}", f.modelId, (*model)->config().numLayers,
               (*model)->config().vocabSize, listen);
  // Handlers first: a SIGTERM sent as soon as the readiness line is read must stop us cleanly.
  std::signal(SIGTERM, [](int) { gStop = true; });
  std::signal(SIGINT, [](int) { gStop = true; });
  // Readiness line for launchers and tests: the address, once it accepts connections.
  std::printf("textgen-shard ready %s\n", listen.c_str());
  std::fflush(stdout);
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
