// The router application: TGI's HTTP API over validation, admission and the replicas' batchers.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "textgen/router/batcher.h"
#include "textgen/router/http_server.h"
#include "textgen/router/metrics.h"
#include "textgen/router/replica_set.h"
#include "textgen/router/validation.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::router {

class ChatTemplate;  // router/src/chat/chat_template.h
class DocsPage;      // router/src/app/docs_page.h

struct RouterOptions {
  std::string modelId = "textgen";
  uint32_t maxConcurrentRequests = 128;
  uint32_t maxClientBatchSize = 4;
  ValidationLimits limits;
  std::string apiKey;              // empty: no authentication
  unsigned validationWorkers = 2;  // threads that parse, validate and tokenize (TGI's flag)
  std::vector<std::string> corsAllowOrigins;
  // The model's chat template (/v1/chat/completions, /chat_tokenize); null: those answer 422.
  std::shared_ptr<const ChatTemplate> chatTemplate;
  // /docs (Swagger UI's files, read at start-up); null: /docs answers 503.
  std::shared_ptr<const DocsPage> docs;
};

class WorkerPool;

// Retry-After (seconds) of the 503 answered while no replica serves.
inline constexpr int kNoReplicaRetryAfterS = 10;

// Serves while no replica has started yet (a router started with --shard-discovery while its
// service is scaled to zero: the model's limits come from the first replica, so there is no
// RouterApp yet): /metrics, /health and /ping 503, and 503 with Retry-After for everything else.
// A generation request counts in tgi_request_count: what wakes a service scaled to zero.
// --api-key and --cors-allow-origin are honoured as RouterApp honours them.
void handleWithoutReplica(const HttpRequest& request, HttpResponder& responder,
                          const std::string& apiKey,
                          const std::vector<std::string>& corsAllowOrigins,
                          MetricsRegistry& metrics);

class RouterApp {
 public:
  RouterApp(RouterOptions options, const tokenizer::Tokenizer& tokenizer, ReplicaSet& replicas,
            MetricsRegistry& metrics);
  ~RouterApp();

  void handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  // Shutdown, after the HTTP server stopped and before the replicas go: the validation workers
  // finish their queued tasks and end (a chat rerun asked for later is refused).
  void stopWorkers();

 private:
  // The POST routes, on a validation worker.
  void handleWork(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  // `compat`: TGI's compat routes (POST /, /invocations), whose answer to a whole generation is a
  // list and whose return_full_text defaults to true (TGI's, for a text-generation model).
  void generate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder, bool compat);
  void generateStream(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                      bool compat = false);
  void completions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void vertex(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void chatCompletions(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void chatTokenize(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  // SageMaker's route: a chat (`messages`), a completion (`prompt`) or a TGI request (`inputs`).
  void invocations(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  // A chat request's prompt (its messages through the template) as a GenerateRequest, with the
  // tools' grammar when `withTools` and tools are offered.
  struct ChatPrompt {
    GenerateRequest request;
    bool usingTools = false;
  };
  StatusOr<ChatPrompt> chatPrompt(const ChatCompletionRequest& chat, bool withTools) const;
  void tokenize(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void info(std::shared_ptr<HttpResponder> responder);
  void health(std::shared_ptr<HttpResponder> responder);
  // The load gauges over every serving replica, set before /metrics renders: tgi_queue_size,
  // textgen_num_requests_running and textgen_kv_cache_usage_perc (what the Gateway API Inference
  // Extension's endpoint pickers read from each pod).
  void loadGauges();
  // The span exporter's counts at the last scrape (textgen_otlp_spans_*_total grow by the
  // difference).
  std::mutex spanCountsMutex_;
  tracing::ExporterCounts spanCounts_;

  // Admission and replica choice; nullptr and a 429 (or 503 without replicas) already sent.
  // A replica for a request whose (first) prompt is `prompt`, or nullptr after answering 429/503.
  std::shared_ptr<Replica> admit(std::shared_ptr<HttpResponder>& responder,
                                 std::span<const uint32_t> prompt);
  HttpHeaders baseHeaders(const HttpRequest& request) const;
  // --api-key: "Authorization: Bearer <key>", compared in constant time.
  bool authorized(const HttpRequest& request) const;

  RouterOptions options_;
  const tokenizer::Tokenizer& tokenizer_;
  ReplicaSet& replicas_;
  MetricsRegistry& metrics_;
  Validator validator_;
  std::atomic<uint32_t> inFlight_{0};
  std::atomic<uint64_t> nextId_{1};
  std::atomic<uint64_t> chatIds_{0};  // chat completions' ids (chatcmpl-N)
  // Last: their threads stop before the rest goes.
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<WorkerPool> healthWorkers_;  // /health's shard RPCs, off the server's threads
};

// GET /api-doc/openapi.json.
std::string openApiDocument();

// The CORS headers of an answer to `request` under --cors-allow-origin (`allowOrigins`): none
// given, any origin ("*", as TGI); otherwise the request's origin when listed ("*" when "*" is
// listed), with Vary: Origin.
HttpHeaders corsHeaders(const HttpRequest& request, const std::vector<std::string>& allowOrigins);

// TGI's error body: {"error": message, "error_type": type}.
std::string errorJson(const std::string& message, const std::string& type);

// An error in an OpenAI-route stream, as TGI sends it (its OpenaiErrorEvent): the data of an SSE
// event {"error": {"message": ..., "http_status_code": status}} (plus OpenAI's "type"), after which
// the stream still ends with `data: [DONE]`. The openai clients read error.message.
std::string openAiStreamError(const std::string& message, const std::string& type, int status);

// How a request that failed after admission is answered. A shard's failure is TGI's 424
// "generation"; a request the shard refused alone is a 422 "validation"; a request cancelled
// because its client left is answered nothing (status 0) and counted as "dropped" by the batcher.
struct GenerationError {
  int status = 424;
  const char* type = "generation";
  const char* countAs = "generation";  // tgi_request_failure's err label; null: counted elsewhere
};
GenerationError generationError(const Status& error);

// Marks every control cancelled when the responder's client goes away.
void cancelOnDisconnect(HttpResponder& responder,
                        std::vector<std::shared_ptr<RequestControl>> controls);

}  // namespace textgen::router
