// textgen-router: TGI's HTTP API in front of one or more replicas of shards.
//
//   textgen-router --tokenizer-name DIR [--model-id NAME] [--master-shard-uds-path PATH |
//   --shard-master ADDR...]
//                  [--hostname H] [--port N] [TGI's limits...]
//                  [--header-timeout-ms N] [--body-timeout-ms N] [--shard-health-timeout-ms N]
//                  [--shard-step-timeout-ms N] [--shard-per-token-timeout-us N]
// Each --shard-master (or the master socket) is one replica's rank 0; requests go to the least
// loaded replica. Prints "textgen-router ready http://HOST:PORT" once serving.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>

#include "../src/app/docs_page.h"
#include "../src/chat/chat_template.h"
#include "textgen/base/log.h"
#include "textgen/base/sampling_rules.h"
#include "textgen/base/version.h"
#include "textgen/router/router_app.h"
#include "textgen/tracing/tracing.h"

namespace {

using namespace textgen;
using namespace textgen::router;

struct Flags {
  std::string tokenizer, modelId, hostname = "0.0.0.0";
  int port = 3000;
  std::vector<std::string> masters;
  std::string discovery;  // static:a,b | file:/path | dns:name:port
  uint32_t discoveryIntervalMs = 5000;
  uint32_t maxConcurrentRequests = 128, maxBestOf = 2, maxStopSequences = 4, maxTopNTokens = 5;
  std::optional<uint32_t> maxInputTokens, maxTotalTokens, maxBatchTotalTokens, maxBatchSize;
  uint32_t maxBatchPrefillTokens = 4096, maxWaitingTokens = 20, maxClientBatchSize = 4,
           validationWorkers = 2;
  float waitingServedRatio = 0.3f;
  size_t payloadLimit = 2000000;
  // Reading a request (headers, then body), and each RPC to a shard (see ShardDeadlines).
  uint64_t headerTimeoutMs = 30'000, bodyTimeoutMs = 60'000;
  uint64_t shardHealthTimeoutMs = 2'000, shardStepTimeoutMs = 10'000,
           shardPerTokenTimeoutUs = 50'000;
  std::vector<std::string> cors;
  std::string apiKey, logLevel = "info";
  std::string tokenizerConfigPath;  // TGI's: a tokenizer_config.json with the chat template
  std::string docsDir;  // /docs's Swagger UI files; empty: next to the binary (DocsPage::find)
  // OpenTelemetry (TGI's flags): spans to an OTLP/gRPC collector when an endpoint is given.
  std::string otlpEndpoint, otlpServiceName = "text-generation-inference.router";
  bool jsonOutput = false;
  bool disableGrammar = false;  // TGI's --disable-grammar-support
  // TGI's --prometheus-port: /metrics on a listener of its own as well (0, the default: none; TGI
  // listens on 9000 always, which would make two servers on one machine collide).
  int prometheusPort = 0;
};

std::atomic<bool> gStop{false};

StatusOr<uint64_t> number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || v[0] == '-')
    return invalidArgumentError(flag + ": '" + v + "' is not a non-negative integer");
  return n;
}

// A duration flag: at least 1 and at most a day.
StatusOr<uint64_t> positive(const std::string& flag, const std::string& v) {
  TG_ASSIGN_OR_RETURN(uint64_t n, number(flag, v));
  if (n == 0 || n > 86'400'000'000ull)
    return invalidArgumentError(flag + " must be positive and at most a day");
  return n;
}

StatusOr<Flags> parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json-output") {
      f.jsonOutput = true;
      continue;
    }
    if (a == "--disable-grammar-support") {
      f.disableGrammar = true;
      continue;
    }
    if (a == "--version") {
      std::printf("textgen-router %s\n", kVersion);
      std::exit(0);
    }
    if (i + 1 >= argc) return invalidArgumentError(a + " needs a value (or is unknown)");
    const std::string v = argv[++i];
    auto u32 = [&](uint32_t& out) -> Status {
      TG_ASSIGN_OR_RETURN(uint64_t n, number(a, v));
      if (n > UINT32_MAX) return invalidArgumentError(a + " is too large");
      out = static_cast<uint32_t>(n);
      return okStatus();
    };
    auto opt = [&](std::optional<uint32_t>& out) -> Status {
      uint32_t n = 0;
      TG_RETURN_IF_ERROR(u32(n));
      out = n;
      return okStatus();
    };
    if (a == "--tokenizer-name") {
      f.tokenizer = v;
    } else if (a == "--tokenizer-config-path") {
      f.tokenizerConfigPath = v;
    } else if (a == "--docs-dir") {
      f.docsDir = v;
    } else if (a == "--model-id") {
      f.modelId = v;
    } else if (a == "--hostname") {
      f.hostname = v;
    } else if (a == "--port") {
      uint32_t p = 0;
      TG_RETURN_IF_ERROR(u32(p));
      if (p > 65535) return invalidArgumentError("--port must be <= 65535");
      f.port = static_cast<int>(p);
    } else if (a == "--prometheus-port") {
      uint32_t p = 0;
      TG_RETURN_IF_ERROR(u32(p));
      if (p > 65535) return invalidArgumentError("--prometheus-port must be <= 65535");
      f.prometheusPort = static_cast<int>(p);
    } else if (a == "--master-shard-uds-path") {
      f.masters.push_back("unix://" + v);
    } else if (a == "--shard-master") {
      f.masters.push_back(v);
    } else if (a == "--shard-discovery") {
      f.discovery = v;
    } else if (a == "--discovery-interval-ms") {
      TG_RETURN_IF_ERROR(u32(f.discoveryIntervalMs));
      if (f.discoveryIntervalMs == 0)
        return invalidArgumentError("--discovery-interval-ms must be positive");
    } else if (a == "--max-concurrent-requests") {
      TG_RETURN_IF_ERROR(u32(f.maxConcurrentRequests));
    } else if (a == "--max-best-of") {
      TG_RETURN_IF_ERROR(u32(f.maxBestOf));
    } else if (a == "--max-stop-sequences") {
      TG_RETURN_IF_ERROR(u32(f.maxStopSequences));
    } else if (a == "--max-top-n-tokens") {
      TG_RETURN_IF_ERROR(u32(f.maxTopNTokens));
      if (f.maxTopNTokens > kMaxTopNTokens) {
        return invalidArgumentError("--max-top-n-tokens must be at most " +
                                    std::to_string(kMaxTopNTokens));
      }
    } else if (a == "--max-input-tokens" || a == "--max-input-length") {
      TG_RETURN_IF_ERROR(opt(f.maxInputTokens));
    } else if (a == "--max-total-tokens") {
      TG_RETURN_IF_ERROR(opt(f.maxTotalTokens));
    } else if (a == "--max-batch-prefill-tokens") {
      TG_RETURN_IF_ERROR(u32(f.maxBatchPrefillTokens));
    } else if (a == "--max-batch-total-tokens") {
      TG_RETURN_IF_ERROR(opt(f.maxBatchTotalTokens));
    } else if (a == "--max-batch-size") {
      TG_RETURN_IF_ERROR(opt(f.maxBatchSize));
    } else if (a == "--max-waiting-tokens") {
      TG_RETURN_IF_ERROR(u32(f.maxWaitingTokens));
    } else if (a == "--waiting-served-ratio") {
      f.waitingServedRatio = std::strtof(v.c_str(), nullptr);
      if (!(f.waitingServedRatio >= 0))
        return invalidArgumentError("--waiting-served-ratio must be >= 0");
    } else if (a == "--max-client-batch-size") {
      TG_RETURN_IF_ERROR(u32(f.maxClientBatchSize));
    } else if (a == "--validation-workers") {
      TG_RETURN_IF_ERROR(u32(f.validationWorkers));
      if (f.validationWorkers == 0 || f.validationWorkers > 256)
        return invalidArgumentError("`validation_workers` must be > 0 and <= 256");
    } else if (a == "--payload-limit") {
      TG_ASSIGN_OR_RETURN(f.payloadLimit, number(a, v));
    } else if (a == "--header-timeout-ms") {
      TG_ASSIGN_OR_RETURN(f.headerTimeoutMs, positive(a, v));
    } else if (a == "--body-timeout-ms") {
      TG_ASSIGN_OR_RETURN(f.bodyTimeoutMs, positive(a, v));
    } else if (a == "--shard-health-timeout-ms") {
      TG_ASSIGN_OR_RETURN(f.shardHealthTimeoutMs, positive(a, v));
    } else if (a == "--shard-step-timeout-ms") {
      TG_ASSIGN_OR_RETURN(f.shardStepTimeoutMs, positive(a, v));
    } else if (a == "--shard-per-token-timeout-us") {
      TG_ASSIGN_OR_RETURN(f.shardPerTokenTimeoutUs, number(a, v));
    } else if (a == "--cors-allow-origin") {
      f.cors.push_back(v);
    } else if (a == "--otlp-endpoint") {
      TG_RETURN_IF_ERROR(tracing::validateEndpoint(v));
      f.otlpEndpoint = v;
    } else if (a == "--otlp-service-name") {
      if (v.empty()) return invalidArgumentError("--otlp-service-name is empty");
      f.otlpServiceName = v;
    } else if (a == "--api-key") {
      f.apiKey = v;
    } else if (a == "--log-level") {
      f.logLevel = v;
    } else {
      return invalidArgumentError("unknown flag '" + a + "'");
    }
  }
  if (f.tokenizer.empty()) return invalidArgumentError("--tokenizer-name DIR is required");
  if (!f.discovery.empty() && !f.masters.empty()) {
    return invalidArgumentError(
        "give --shard-discovery or --shard-master/--master-shard-uds-path, not both");
  }
  if (f.masters.empty() && f.discovery.empty())
    f.masters.push_back("unix:///tmp/text-generation-server-0");
  if (f.modelId.empty()) f.modelId = f.tokenizer;
  return f;
}

// A warmup batch of max_batch_prefill_tokens prompt tokens, with blocks from 1 on.
// An encoder-decoder model's prompt takes whole blocks, then its first decoder position one more.
std::vector<BatchEntry> warmupBatch(uint32_t maxInput, uint32_t maxPrefill, uint32_t blockSize,
                                    bool encoderDecoder) {
  std::vector<BatchEntry> batch;
  uint32_t tokens = 0, nextBlock = 1;
  uint64_t id = 0;
  while (tokens < maxPrefill) {
    const uint32_t len = std::min(maxInput, maxPrefill - tokens);
    BatchEntry e;
    e.entry.id = id++;
    e.entry.request.inputIds.assign(len, 1);
    e.entry.request.inputLength = len;
    e.entry.request.maxNewTokens = 1;
    const uint32_t positions =
        encoderDecoder ? (len + blockSize - 1) / blockSize * blockSize + 1 : len + 1;
    const uint32_t blocks = (positions + blockSize - 1) / blockSize;
    for (uint32_t b = 0; b < blocks; ++b) e.blocks.blocks.push_back(nextBlock++);
    for (uint32_t p = 0; p < positions; ++p)
      e.blocks.slots.push_back(e.blocks.blocks[p / blockSize] * blockSize + p % blockSize);
    batch.push_back(std::move(e));
    tokens += len;
  }
  return batch;
}

int run(int argc, char** argv) {
  auto flags = parse(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "textgen-router: %s\n", flags.status().message().c_str());
    return 2;
  }
  Flags& f = *flags;
  auto level = log::parseLevel(f.logLevel);
  if (!level.ok()) {
    std::fprintf(stderr, "textgen-router: %s\n", level.status().message().c_str());
    return 2;
  }
  log::init({.component = "router",
             .level = *level,
             .format = f.jsonOutput ? log::Format::kJson : log::Format::kText,
             .sink = nullptr});
  auto fail = [](const Status& s) {
    spdlog::critical("{}", s.toString());
    return 1;
  };
  // SIGTERM and SIGINT end the router cleanly from here on, while it waits for a first replica
  // too (exit 0).
  std::signal(SIGTERM, [](int) { gStop = true; });
  std::signal(SIGINT, [](int) { gStop = true; });
  if (!f.otlpEndpoint.empty()) {
    auto exporter =
        tracing::makeOtlpExporter({.endpoint = f.otlpEndpoint, .serviceName = f.otlpServiceName});
    if (!exporter.ok()) return fail(exporter.status());
    tracing::install(std::move(*exporter));
    spdlog::info("tracing: spans to {} as service {}", f.otlpEndpoint, f.otlpServiceName);
  }
  // On every way out: what is queued goes to the collector if it takes it soon, before the
  // process's static objects go (declared first: it runs after everything below is destroyed).
  struct TracingFlush {
    ~TracingFlush() { tracing::shutdown(std::chrono::seconds(2)); }
  } tracingFlush;
  auto tok = tokenizer::Tokenizer::fromDirectory(f.tokenizer);
  if (!tok.ok()) return fail(tok.status().withContext("loading the tokenizer"));
  // The chat template: optional (without one the chat routes answer 422), but one that is there
  // and does not parse stops the router.
  std::shared_ptr<const ChatTemplate> chatTemplate;
  if (auto t = ChatTemplate::load(f.tokenizer, f.tokenizerConfigPath); t.ok()) {
    chatTemplate = std::move(*t);
  } else if (t.status().code() == StatusCode::kNotFound && f.tokenizerConfigPath.empty()) {
    spdlog::info("no chat template in {}: /v1/chat/completions answers 422", f.tokenizer);
  } else {
    return fail(t.status().withContext("loading the chat template"));
  }

  MetricsRegistry metrics;
  // Limits are fixed by the first replica that connects; later ones must fit them.
  std::mutex limitsMutex;
  struct Limits {
    uint32_t maxInput = 0, maxTotal = 0;
    bool encoderDecoder = false;  // the model's kind: every replica serves the same
  };
  std::optional<Limits> limits;
  ReplicaSet::Factory factory =
      [&](const std::string& master) -> StatusOr<std::shared_ptr<Replica>> {
    const ShardDeadlines deadlines{.health = std::chrono::milliseconds(f.shardHealthTimeoutMs),
                                   .step = std::chrono::milliseconds(f.shardStepTimeoutMs),
                                   .perToken = std::chrono::microseconds(f.shardPerTokenTimeoutUs)};
    TG_ASSIGN_OR_RETURN(auto group, connectShardGroup(master, std::chrono::seconds(60), deadlines));
    TG_RETURN_IF_ERROR(group->clearCache(std::nullopt));
    TG_ASSIGN_OR_RETURN(ShardInfo info, group->info());
    uint32_t maxInput, maxTotal;
    {
      std::lock_guard lock(limitsMutex);
      if (!limits) {
        // TGI's defaults: the model's context for max_total_tokens, one less for max_input_tokens.
        const uint32_t total =
            f.maxTotalTokens.value_or(std::min<uint32_t>(info.maxPositionEmbeddings, 4096));
        limits = Limits{f.maxInputTokens.value_or(total - 1), total, info.encoderDecoder};
      }
      if (limits->encoderDecoder != info.encoderDecoder) {
        return invalidArgumentError(
            "replica " + master + " serves " +
            (info.encoderDecoder ? "an encoder-decoder" : "a decoder-only") +
            " model, unlike the first replica");
      }
      maxInput = limits->maxInput;
      maxTotal = limits->maxTotal;
    }
    if (maxInput >= maxTotal)
      return invalidArgumentError("`max_input_tokens` must be < `max_total_tokens`");
    if (info.maxPositionEmbeddings < maxTotal) {
      return invalidArgumentError(
          "replica " + master + " allows " + std::to_string(info.maxPositionEmbeddings) +
          " tokens, fewer than max_total_tokens " + std::to_string(maxTotal));
    }
    if (!info.supportChunking && f.maxBatchPrefillTokens < maxInput) {
      return invalidArgumentError(
          "`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: " +
          std::to_string(f.maxBatchPrefillTokens) + " and " + std::to_string(maxInput));
    }
    auto warm = group->warmup(
        0, warmupBatch(maxInput, f.maxBatchPrefillTokens, info.blockSize, info.encoderDecoder),
        maxInput, f.maxBatchPrefillTokens, maxTotal);
    if (!warm.ok()) return warm.status().withContext("warmup on " + master);
    const uint32_t supported =
        warm->maxSupportedTotalTokens.value_or(f.maxBatchTotalTokens.value_or(16000));
    const uint32_t batchTotal =
        f.maxBatchTotalTokens ? std::min(*f.maxBatchTotalTokens, supported) : supported;
    if (batchTotal < maxTotal) {
      return invalidArgumentError("`max_batch_total_tokens` (" + std::to_string(batchTotal) +
                                  ", what the KV cache holds) must be >= `max_total_tokens` (" +
                                  std::to_string(maxTotal) + ")");
    }
    // Block 0 is reserved: a request of max_total_tokens must fit in the rest, or it would wait at
    // the head of the queue forever (and every request behind it).
    const uint32_t usableBlocks =
        batchTotal / info.blockSize > 0 ? batchTotal / info.blockSize - 1 : 0;
    // (An encoder-decoder request's prompt starts the decoder's positions on a fresh block.)
    const uint32_t neededBlocks =
        (maxTotal + info.blockSize - 1) / info.blockSize + (info.encoderDecoder ? 1 : 0);
    if (neededBlocks > usableBlocks) {
      return invalidArgumentError(
          "`max_batch_total_tokens` (" + std::to_string(batchTotal) + ") leaves " +
          std::to_string(usableBlocks) + " KV-cache blocks of " + std::to_string(info.blockSize) +
          " tokens besides the reserved one, fewer than a request of `max_total_tokens` (" +
          std::to_string(maxTotal) + ") needs (" + std::to_string(neededBlocks) + ")");
    }
    if (f.maxBatchPrefillTokens > batchTotal) {
      return invalidArgumentError("`max_batch_prefill_tokens` must be <= `max_batch_total_tokens`");
    }
    BatcherOptions bo;
    bo.maxBatchPrefillTokens = f.maxBatchPrefillTokens;
    bo.maxBatchTotalTokens = batchTotal;
    if (f.maxBatchSize) bo.maxBatchSize = *f.maxBatchSize;
    bo.waitingServedRatio = f.waitingServedRatio;
    bo.maxWaitingTokens = f.maxWaitingTokens;
    bo.supportChunking = info.supportChunking;
    bo.encoderDecoder = info.encoderDecoder;
    bo.speculate = info.speculate;
    {
      // TGI's buckets: 0 to speculate tokens accepted beyond the first per step.
      std::vector<double> skipped;
      for (uint32_t i = 0; i <= info.speculate; ++i) skipped.push_back(i);
      metrics.describe("tgi_request_skipped_tokens",
                       "Speculated tokens accepted beyond the first, per request and step",
                       skipped);
    }
    bo.prefixCaching = info.usePrefixCaching;
    // A shard that does not order Decode calls (an older build) would run a step sent early
    // before the one it follows.
    bo.stepAhead = info.orderedDecode;
    // For benchmarks: TEXTGEN_DECODE_PIPELINE=1 sends a decode only after the step before it
    // returned (before its delivery), 0 not before its delivery either; default: while it runs.
    if (const char* depth = std::getenv("TEXTGEN_DECODE_PIPELINE")) {
      const std::string_view d(depth);
      if (d != "0" && d != "1" && d != "2")
        return invalidArgumentError("TEXTGEN_DECODE_PIPELINE must be 0, 1 or 2, not `" +
                                    std::string(d) + "`");
      bo.pipelineDecode = d != "0";
      bo.stepAhead = bo.stepAhead && d == "2";
    }
    bo.name = master;
    bo.blockSize = info.blockSize;
    bo.numBlocks = batchTotal / info.blockSize;
    // A shard that comes back after a failure starts with no KV cache: redo ClearCache + Warmup.
    ShardGroup* shards = group.get();
    const uint32_t prefill = f.maxBatchPrefillTokens, blockSize = info.blockSize;
    const bool encoderDecoder = info.encoderDecoder;
    bo.recover = [shards, maxInput, maxTotal, prefill, blockSize, encoderDecoder]() -> Status {
      // Health first, under its short deadline: while a shard stays frozen or gone, each batch
      // fails within that deadline instead of waiting out ClearCache's and Warmup's.
      TG_RETURN_IF_ERROR(shards->health());
      TG_RETURN_IF_ERROR(shards->clearCache(std::nullopt));
      auto w = shards->warmup(0, warmupBatch(maxInput, prefill, blockSize, encoderDecoder),
                              maxInput, prefill, maxTotal);
      if (!w.ok()) return w.status();
      spdlog::info("replica {} recovered", shards->urls().front());
      return okStatus();
    };
    metrics.gaugeSet("tgi_batch_max_total_tokens", batchTotal);
    auto replica = std::make_shared<Replica>();
    replica->master = master;
    replica->shards = std::move(group);
    replica->batcher = std::make_unique<Batcher>(*replica->shards, bo, &metrics);
    spdlog::info(
        "replica {}: {} rank(s), max_batch_total_tokens {}, block size {}, chunking {}, prefix "
        "caching {}",
        master, replica->shards->urls().size(), batchTotal, info.blockSize, info.supportChunking,
        info.usePrefixCaching);
    return replica;
  };
  // The HTTP server starts first. Until the first replica is up (the model's limits come from it,
  // and with them the RouterApp) it answers 503 with Retry-After and counts generation requests:
  // a router whose service is scaled to zero serves, and the requests it refuses wake the service.
  struct AppSlot {
    std::mutex mutex;
    std::shared_ptr<RouterApp> app;
  };
  auto slot = std::make_shared<AppSlot>();
  const HttpHandler handler = [slot, apiKey = f.apiKey, cors = f.cors, &metrics](
                                  const HttpRequest& r, std::shared_ptr<HttpResponder> resp) {
    std::shared_ptr<RouterApp> app;
    {
      std::lock_guard lock(slot->mutex);
      app = slot->app;
    }
    if (app) {
      app->handle(r, std::move(resp));
    } else {
      handleWithoutReplica(r, *resp, apiKey, cors, metrics);
    }
  };
  auto server = startHttpServer(
      {.host = f.hostname,
       .port = f.port,
       .payloadLimit = f.payloadLimit,
       .headerTimeout = std::chrono::milliseconds(f.headerTimeoutMs),
       .bodyTimeout = std::chrono::milliseconds(f.bodyTimeoutMs),
       .answerHeaders = [cors = f.cors](const HttpRequest& r) { return corsHeaders(r, cors); }},
      handler);
  if (!server.ok()) return fail(server.status());
  // --prometheus-port: GET /metrics there too (TGI's Prometheus listener); anything else is a 404.
  std::unique_ptr<HttpServer> prometheus;
  if (f.prometheusPort != 0) {
    auto p = startHttpServer({.host = f.hostname, .port = f.prometheusPort, .threads = 1},
                             [handler](const HttpRequest& r, std::shared_ptr<HttpResponder> resp) {
                               if (r.method == "GET" && r.path == "/metrics")
                                 return handler(r, std::move(resp));
                               resp->reply(404, errorJson("Not Found", "not_found"), {});
                             });
    if (!p.ok()) return fail(p.status());
    prometheus = std::move(*p);
    spdlog::info("Prometheus metrics also on {}:{}/metrics", f.hostname, prometheus->port());
  }
  // Owned here so that shutdown can end it (and with it the in-flight requests) before the
  // RouterApp their answers go through.
  auto replicaSet = std::make_unique<ReplicaSet>(factory, [&metrics](size_t n) {
    metrics.gaugeSet("textgen_replicas", static_cast<double>(n));
  });
  ReplicaSet& replicas = *replicaSet;
  std::unique_ptr<Discovery> discovery;
  if (!f.discovery.empty()) {
    // Wait for a first replica: the limits come from it.
    spdlog::info("listening on {}:{}: 503 until a replica is up", f.hostname, (*server)->port());
    while (!gStop) {
      auto d =
          Discovery::start(f.discovery, std::chrono::milliseconds(f.discoveryIntervalMs), replicas);
      if (!d.ok()) return fail(d.status());
      discovery = std::move(*d);
      if (!replicas.serving().empty()) break;
      discovery.reset();
      spdlog::warn("discovery {}: no replica could be started yet; retrying", f.discovery);
      std::this_thread::sleep_for(std::chrono::milliseconds(f.discoveryIntervalMs));
    }
  } else if (Status s = replicas.update(f.masters); !s.ok()) {
    return fail(s);
  }
  if (gStop && !limits) {  // stopped while waiting for a first replica
    if (prometheus) prometheus->stop();
    (*server)->stop();
    discovery.reset();
    return 0;
  }
  if (!limits) return fail(unavailableError("no replica"));
  const auto [maxInput, maxTotal, encoderDecoder] = *limits;
  RouterOptions ro;
  ro.modelId = f.modelId;
  ro.maxConcurrentRequests = f.maxConcurrentRequests;
  ro.maxClientBatchSize = f.maxClientBatchSize;
  ro.limits = {.maxBestOf = f.maxBestOf,
               .maxStopSequences = f.maxStopSequences,
               .maxTopNTokens = f.maxTopNTokens,
               .maxInputTokens = maxInput,
               .maxTotalTokens = maxTotal,
               .encoderDecoder = encoderDecoder,
               .disableGrammar = f.disableGrammar};
  ro.apiKey = f.apiKey;
  ro.validationWorkers = f.validationWorkers;
  ro.corsAllowOrigins = f.cors;
  ro.chatTemplate = chatTemplate;
  ro.docs = DocsPage::find(f.docsDir);  // missing files: a warning, and /docs answers 503
  if (ro.docs->problem().empty()) {
    spdlog::info("/docs: Swagger UI from {}", ro.docs->dir());
  } else {
    spdlog::warn("/docs answers 503: {}", ro.docs->problem());
  }
  {
    auto app = std::make_shared<RouterApp>(ro, **tok, replicas, metrics);
    std::lock_guard lock(slot->mutex);
    slot->app = std::move(app);
  }
  spdlog::info("serving {} on {}:{} (max_input_tokens {}, max_total_tokens {})", f.modelId,
               f.hostname, (*server)->port(), maxInput, maxTotal);
  std::printf("textgen-router ready http://%s:%d\n", f.hostname.c_str(), (*server)->port());
  std::fflush(stdout);
  while (!gStop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("shutting down");
  // No new request, then no validation task left, then no replica (their in-flight requests end,
  // answered through the RouterApp), then the RouterApp.
  if (prometheus) prometheus->stop();
  (*server)->stop();
  std::shared_ptr<RouterApp> app;
  {
    std::lock_guard lock(slot->mutex);
    app = std::move(slot->app);
  }
  if (app) app->stopWorkers();
  discovery.reset();
  replicaSet.reset();
  app.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
