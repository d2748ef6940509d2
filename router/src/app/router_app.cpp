#include "textgen/router/router_app.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "docs_page.h"
#include "textgen/base/json.h"
#include "textgen/base/log.h"
#include "textgen/base/version.h"
#include "worker_pool.h"

namespace textgen::router {

using nlohmann::json;

std::string errorJson(const std::string& message, const std::string& type) {
  return json{{"error", message}, {"error_type", type}}.dump(-1, ' ', false,
                                                             json::error_handler_t::replace);
}

std::string openAiStreamError(const std::string& message, const std::string& type, int status) {
  return json{{"error", {{"message", message}, {"type", type}, {"http_status_code", status}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

GenerationError generationError(const Status& error) {
  switch (error.code()) {
    case StatusCode::kCancelled: return {0, "", nullptr};
    case StatusCode::kInvalidArgument: return {422, "validation", "validation"};
    default: return {};
  }
}

void cancelOnDisconnect(HttpResponder& responder,
                        std::vector<std::shared_ptr<RequestControl>> controls) {
  responder.onDisconnect([controls = std::move(controls)] {
    for (const auto& c : controls) c->cancel();
  });
}

RouterApp::RouterApp(RouterOptions options, const tokenizer::Tokenizer& tokenizer,
                     ReplicaSet& replicas, MetricsRegistry& metrics)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      replicas_(replicas),
      metrics_(metrics),
      validator_(tokenizer, options_.limits),
      workers_(std::make_unique<WorkerPool>(options_.validationWorkers)),
      healthWorkers_(std::make_unique<WorkerPool>(2)) {
  // TGI's metric names, help texts and bucket layouts (dashboards and autoscaling rules match
  // them).
  const auto duration = tgiDurationBuckets();
  const std::pair<const char*, const char*> durations[] = {
      {"tgi_request_duration", "Total time spent on a request, in seconds"},
      {"tgi_request_validation_duration", "Time spent validating a request, in seconds"},
      {"tgi_request_queue_duration", "Time a request waited in the queue, in seconds"},
      {"tgi_request_inference_duration", "Time spent generating a request's tokens, in seconds"},
      {"tgi_request_mean_time_per_token_duration",
       "Mean time per generated token of a request, in seconds"},
      {"tgi_batch_forward_duration", "Time of a batch's forward pass on the shards, in seconds"},
      {"tgi_batch_decode_duration",
       "Time of a batch's sampling and detokenization on the shards, in seconds"},
      {"tgi_batch_inference_duration", "Time of a batch's Prefill or Decode call, in seconds"},
      {"tgi_batch_filter_duration", "Time of a FilterBatch call, in seconds"},
      {"textgen_batch_host_duration",
       "Router time on the critical path between a step's answer and the next step's call "
       "(delivering tokens, filtering, planning; a decode sent while the step before it runs "
       "puts none there and is not counted), in seconds"},
      {"textgen_batch_router_duration",
       "The batching thread's work per decode step (planning the next step, this one's "
       "bookkeeping), whether or not the shards wait on it, in seconds"},
      {"textgen_batch_delivery_duration",
       "Time the delivery thread takes to hand one step's tokens to their clients (SSE events), "
       "off the batching thread, in seconds"},
      {"textgen_batch_transport_duration",
       "Time of a Prefill or Decode call beyond the shard's own total and its wait there for the "
       "step before it (gRPC, protobuf), in seconds"},
  };
  for (const auto& [name, help] : durations) metrics_.describe(name, help, duration);
  metrics_.describe("tgi_request_input_length", "Prompt length of a request, in tokens",
                    tgiLinearBuckets(options_.limits.maxInputTokens));
  metrics_.describe("tgi_request_generated_tokens", "Tokens generated for a request",
                    tgiLinearBuckets(options_.limits.maxTotalTokens));
  metrics_.describe("tgi_request_max_new_tokens", "max_new_tokens of a request",
                    tgiLinearBuckets(options_.limits.maxTotalTokens));
  std::vector<double> sizes;
  for (int i = 1; i <= 1024; ++i) sizes.push_back(i);
  metrics_.describe("tgi_batch_next_size", "Requests added to the running batch by one next_batch",
                    sizes);
  const std::pair<const char*, const char*> others[] = {
      {"tgi_request_count", "Requests received"},
      {"tgi_request_success", "Requests that completed"},
      {"tgi_request_failure",
       "Requests that failed, by reason (validation, overloaded, generation, dropped)"},
      {"tgi_queue_size", "Requests waiting in the queue"},
      {"textgen_num_requests_running",
       "Requests admitted to a running batch (prefilling or decoding), over every replica"},
      {"textgen_kv_cache_usage_perc",
       "Fraction of KV-cache blocks held by live requests, over every replica (0 to 1; cached "
       "prefixes nobody uses count as free)"},
      {"tgi_batch_current_size", "Requests in the running batch"},
      {"tgi_batch_current_max_tokens", "Tokens the running batch may grow to"},
      {"tgi_batch_max_total_tokens", "Tokens the KV cache holds across a replica's batch"},
      {"tgi_batch_concat", "Times new requests joined the running batch, by reason"},
      {"tgi_batch_inference_count", "Prefill and Decode calls to the shards"},
      {"tgi_batch_inference_success", "Prefill and Decode calls that succeeded"},
      {"tgi_batch_inference_failure", "Prefill and Decode calls that failed"},
      {"textgen_replicas", "Replicas the router is serving (discovery adds and drains them)"},
      {"textgen_prefix_cache_queried_tokens_total",
       "Prompt tokens of requests batched while prefix caching is on"},
      {"textgen_prefix_cache_hit_tokens_total",
       "Prompt tokens served from the prefix cache (their KV entries reused, not computed)"},
      {"textgen_prefix_cache_blocks", "KV-cache blocks the prefix cache holds, in use or not"},
      {"textgen_otlp_spans_exported_total",
       "Trace spans the OTLP collector accepted (with --otlp-endpoint)"},
      {"textgen_otlp_spans_dropped_total",
       "Trace spans dropped: the exporter's queue was full, or the collector failed or refused "
       "them"},
  };
  for (const auto& [name, help] : others) metrics_.describe(name, help);
  metrics_.gaugeSet("tgi_queue_size", 0);
  metrics_.gaugeSet("textgen_num_requests_running", 0);
  metrics_.gaugeSet("textgen_kv_cache_usage_perc", 0);
  metrics_.gaugeSet("tgi_batch_current_size", 0);
  metrics_.gaugeSet("tgi_batch_current_max_tokens", 0);
}

RouterApp::~RouterApp() = default;

void RouterApp::stopWorkers() {
  workers_->shutdown();
}

void RouterApp::loadGauges() {
  double queued = 0, running = 0, used = 0, total = 0;
  for (const auto& r : replicas_.serving()) {
    const auto q = static_cast<double>(r->batcher->queueSize());
    queued += q;
    running += std::max(0.0, static_cast<double>(r->batcher->load()) - q);
    const uint32_t blocks = r->batcher->usableBlocks();
    total += blocks;
    used += blocks - std::min(blocks, r->batcher->freeBlocks());
  }
  metrics_.gaugeSet("tgi_queue_size", queued);
  metrics_.gaugeSet("textgen_num_requests_running", running);
  metrics_.gaugeSet("textgen_kv_cache_usage_perc", total > 0 ? used / total : 0.0);
  if (tracing::enabled()) {
    std::lock_guard lock(spanCountsMutex_);
    const tracing::ExporterCounts now = tracing::counts();
    // The counts only grow while one exporter lives; anything else (none installed any more)
    // adds nothing.
    if (now.exported >= spanCounts_.exported && now.dropped >= spanCounts_.dropped) {
      metrics_.counterAdd("textgen_otlp_spans_exported_total",
                          static_cast<double>(now.exported - spanCounts_.exported));
      metrics_.counterAdd("textgen_otlp_spans_dropped_total",
                          static_cast<double>(now.dropped - spanCounts_.dropped));
      spanCounts_ = now;
    }
  }
}

HttpHeaders corsHeaders(const HttpRequest& request, const std::vector<std::string>& allowOrigins) {
  HttpHeaders h;
  if (allowOrigins.empty()) {
    h["Access-Control-Allow-Origin"] = "*";
    return h;
  }
  // The answer depends on the Origin header unless "*" is allowed: caches must key on it.
  if (std::find(allowOrigins.begin(), allowOrigins.end(), "*") != allowOrigins.end()) {
    h["Access-Control-Allow-Origin"] = "*";
    return h;
  }
  h["Vary"] = "Origin";
  const std::string origin = request.header("origin");
  if (!origin.empty() &&
      std::find(allowOrigins.begin(), allowOrigins.end(), origin) != allowOrigins.end()) {
    h["Access-Control-Allow-Origin"] = origin;
  }
  return h;
}

namespace {

// Puts the CORS headers on every answer of one request, whichever route or error path writes it
// (a route's own headers win where both name one).
class CorsResponder final : public HttpResponder {
 public:
  CorsResponder(std::shared_ptr<HttpResponder> inner, HttpHeaders cors)
      : inner_(std::move(inner)), cors_(std::move(cors)) {}
  void reply(int status, const std::string& body, const HttpHeaders& headers) override {
    inner_->reply(status, body, merged(headers));
  }
  std::shared_ptr<HttpStream> startStream(int status, const HttpHeaders& headers) override {
    return inner_->startStream(status, merged(headers));
  }
  void onDisconnect(std::function<void()> callback) override {
    inner_->onDisconnect(std::move(callback));
  }

 private:
  HttpHeaders merged(const HttpHeaders& headers) const {
    HttpHeaders m = headers;
    m.insert(cors_.begin(), cors_.end());
    return m;
  }
  std::shared_ptr<HttpResponder> inner_;
  HttpHeaders cors_;
};

// A CORS preflight: answered before authentication, as browsers send it without credentials.
void preflight(const HttpRequest& request, HttpResponder& responder,
               const std::vector<std::string>& allowOrigins) {
  HttpHeaders h = corsHeaders(request, allowOrigins);
  h["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS";
  h["Access-Control-Allow-Headers"] = "content-type, authorization";
  responder.reply(200, "", h);
}

}  // namespace

HttpHeaders RouterApp::baseHeaders(const HttpRequest& request) const {
  return corsHeaders(request, options_.corsAllowOrigins);
}

std::shared_ptr<Replica> RouterApp::admit(std::shared_ptr<HttpResponder>& responder,
                                          std::span<const uint32_t> prompt) {
  if (inFlight_.fetch_add(1) >= options_.maxConcurrentRequests) {
    inFlight_.fetch_sub(1);
    metrics_.counterAdd("tgi_request_failure", 1, {{"err", "overloaded"}});
    responder->reply(429, errorJson("Model is overloaded", "overloaded"), {});
    return nullptr;
  }
  std::shared_ptr<Replica> replica = replicas_.pick(prompt);
  if (!replica) {
    inFlight_.fetch_sub(1);
    // None ready (scaled to zero, or all restarting): at once, never waiting for one, with when to
    // come back (an autoscaler's cold start takes about that long at least).
    responder->reply(503, errorJson("No replica is serving", "unhealthy"),
                     {{"Retry-After", std::to_string(kNoReplicaRetryAfterS)}});
  }
  return replica;
}

namespace {

// The routes TGI puts behind --api-key (every method: its auth layer wraps the whole route). The
// info routes (/info, /health, /ping, /metrics, /v1/models, GET /) stay open, as in TGI.
bool protectedRoute(const HttpRequest& r) {
  const std::string& p = r.path;
  return (p == "/" && r.method != "GET" && r.method != "HEAD") || p == "/generate" ||
         p == "/generate_stream" || p == "/v1/completions" || p == "/v1/chat/completions" ||
         p == "/tokenize" || p == "/chat_tokenize" || p == "/invocations" || p == "/vertex";
}

// Compares in time that depends on the lengths only, not on where the first difference is.
bool constantTimeEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(i < a.size() ? a[i] : 0);
    const auto y = static_cast<unsigned char>(i < b.size() ? b[i] : 0);
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// "Authorization: Bearer <key>" against --api-key (none: every request).
bool bearerAuthorized(const HttpRequest& request, const std::string& apiKey) {
  if (apiKey.empty()) return true;
  const std::string h = request.header("authorization");
  // "Bearer <key>": the scheme is case-insensitive (RFC 9110), the key is compared exactly.
  if (h.size() < 7) return false;
  std::string scheme = h.substr(0, 7);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return constantTimeEquals(scheme, "bearer ") && constantTimeEquals(h.substr(7), apiKey);
}

// GET also answers HEAD (the HTTP layer sends the headers without the body), as axum's get() does.
bool isGet(const HttpRequest& r) {
  return r.method == "GET" || r.method == "HEAD";
}

// The methods a known route takes (its Allow header for a 405); empty for an unknown path.
std::string allowedMethods(const std::string& p) {
  if (p == "/") return "GET, HEAD, POST";
  if (p == "/generate" || p == "/generate_stream" || p == "/v1/completions" || p == "/tokenize" ||
      p == "/v1/chat/completions" || p == "/chat_tokenize" || p == "/invocations" || p == "/vertex")
    return "POST";
  if (p == "/info" || p == "/health" || p == "/ping" || p == "/metrics" ||
      p == "/api-doc/openapi.json" || p == "/v1/models")
    return "GET, HEAD";
  return "";
}

bool generationRoute(const HttpRequest& r) {
  const std::string& p = r.path;
  return r.method == "POST" &&
         (p == "/generate" || p == "/" || p == "/generate_stream" || p == "/v1/completions" ||
          p == "/v1/chat/completions" || p == "/invocations" || p == "/vertex");
}

}  // namespace

void handleWithoutReplica(const HttpRequest& request, HttpResponder& responder,
                          const std::string& apiKey,
                          const std::vector<std::string>& corsAllowOrigins,
                          MetricsRegistry& metrics) {
  const std::string& p = request.path;
  if (request.method == "OPTIONS") return preflight(request, responder, corsAllowOrigins);
  HttpHeaders h = corsHeaders(request, corsAllowOrigins);
  if (isGet(request) && p == "/metrics") {
    h["Content-Type"] = "text/plain; version=0.0.4";
    responder.reply(200, metrics.render(), h);
    return;
  }
  if (protectedRoute(request) && !bearerAuthorized(request, apiKey)) {
    responder.reply(401, errorJson("Unauthorized", "unauthorized"), h);
    return;
  }
  if (isGet(request) && (p == "/health" || p == "/ping")) {
    responder.reply(503, errorJson("unhealthy", "healthcheck"), h);
    return;
  }
  if (generationRoute(request)) metrics.counterAdd("tgi_request_count");
  h["Retry-After"] = std::to_string(kNoReplicaRetryAfterS);
  responder.reply(503, errorJson("No replica is serving yet", "unhealthy"), h);
}

bool RouterApp::authorized(const HttpRequest& request) const {
  return bearerAuthorized(request, options_.apiKey);
}

void RouterApp::handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  const std::string& p = request.path;
  if (request.method == "OPTIONS") return preflight(request, *responder, options_.corsAllowOrigins);
  if (HttpHeaders cors = baseHeaders(request); !cors.empty())
    responder = std::make_shared<CorsResponder>(std::move(responder), std::move(cors));
  if (protectedRoute(request) && !authorized(request)) {
    responder->reply(401, errorJson("Unauthorized", "unauthorized"), baseHeaders(request));
    return;
  }
  const bool work = request.method == "POST" &&
                    (p == "/generate" || p == "/" || p == "/generate_stream" ||
                     p == "/v1/completions" || p == "/tokenize" || p == "/v1/chat/completions" ||
                     p == "/chat_tokenize" || p == "/invocations" || p == "/vertex");
  if (work) {
    // Parsing, validation and tokenization on the validation workers, off the server's threads.
    auto task = [this, request, responder]() mutable {
      try {
        handleWork(request, responder);
      } catch (const std::exception& e) {  // the HTTP layer's guard does not reach this thread
        spdlog::error("{} {}: unhandled exception: {}", request.method, request.path, e.what());
        responder->reply(500, errorJson("Internal server error", "internal"), {});
      } catch (...) {
        spdlog::error("{} {}: unhandled exception", request.method, request.path);
        responder->reply(500, errorJson("Internal server error", "internal"), {});
      }
    };
    if (!workers_->post(std::move(task), options_.maxConcurrentRequests)) {
      metrics_.counterAdd("tgi_request_failure", 1, {{"err", "overloaded"}});
      responder->reply(429, errorJson("Model is overloaded", "overloaded"), baseHeaders(request));
    }
    return;
  }
  if (DocsPage::owns(p)) {  // /docs and its files: GET and HEAD, an allow-list of names
    serveDocs(options_.docs.get(), request, *responder);
  } else if (isGet(request) && p == "/info") {
    info(responder);
  } else if (isGet(request) && (p == "/health" || p == "/ping" || p == "/")) {
    // A shard's Health RPC can take its whole deadline: never on the server's threads.
    if (!healthWorkers_->post([this, responder] { health(responder); }, 64))
      responder->reply(503, errorJson("unhealthy", "healthcheck"), {});
  } else if (isGet(request) && p == "/metrics") {
    loadGauges();
    responder->reply(200, metrics_.render(), {{"Content-Type", "text/plain; version=0.0.4"}});
  } else if (isGet(request) && p == "/api-doc/openapi.json") {
    responder->reply(200, openApiDocument(), baseHeaders(request));
  } else if (isGet(request) && p == "/v1/models") {
    responder->reply(200,
                     json{{"object", "list"},
                          {"data", json::array({{{"id", options_.modelId},
                                                 {"object", "model"},
                                                 {"created", 0},
                                                 {"owned_by", options_.modelId}}})}}
                         .dump(),
                     baseHeaders(request));
  } else if (const std::string allow = allowedMethods(p); !allow.empty()) {
    // A known route asked with another method: 405 naming the ones it takes (TGI's axum router).
    HttpHeaders h = baseHeaders(request);
    h["Allow"] = allow;
    responder->reply(405, errorJson("Method Not Allowed", "method_not_allowed"), h);
  } else {
    responder->reply(404, errorJson("Not Found", "not_found"), baseHeaders(request));
  }
}

void RouterApp::handleWork(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  const std::string& p = request.path;
  if (p == "/generate" || p == "/") {
    if (p == "/") {
      auto parsed = parseGenerateRequest(request.body);
      if (parsed.ok() && parsed->stream) {
        generateStream(request, responder, /*compat=*/true);
        return;
      }
    }
    generate(request, responder, p == "/");
  } else if (p == "/generate_stream") {
    generateStream(request, responder);
  } else if (p == "/v1/completions") {
    completions(request, responder);
  } else if (p == "/v1/chat/completions") {
    chatCompletions(request, responder);
  } else if (p == "/chat_tokenize") {
    chatTokenize(request, responder);
  } else if (p == "/invocations") {
    invocations(request, responder);
  } else if (p == "/vertex") {
    vertex(request, responder);
  } else {
    tokenize(request, responder);
  }
}

void RouterApp::invocations(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  // TGI tries the shapes in this order: a TGI request, a chat, a completion.
  auto body = parseJson(request.body, "the request body");
  if (body.ok() && body->is_object() && !body->contains("inputs")) {
    if (body->contains("messages")) return chatCompletions(request, responder);
    if (body->contains("prompt")) return completions(request, responder);
  }
  auto parsed = parseGenerateRequest(request.body);
  if (parsed.ok() && parsed->stream) return generateStream(request, responder, /*compat=*/true);
  generate(request, responder, /*compat=*/true);
}

void RouterApp::tokenize(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  auto parsed = parseGenerateRequest(request.body);
  if (!parsed.ok()) {
    responder->reply(422, errorJson(parsed.status().message(), "validation"), baseHeaders(request));
    return;
  }
  // The input limit of /generate: a response that lists every token of a 2 MB body is ~100 MB.
  auto e =
      validator_.tokenize(parsed->inputs, parsed->addSpecialTokens, parsed->parameters.truncate);
  if (!e.ok()) {
    responder->reply(422, errorJson(e.status().message(), "validation"), baseHeaders(request));
    return;
  }
  json out = json::array();
  for (size_t i = 0; i < e->size(); ++i) {
    const auto [start, stop] = e->offsets[i];
    out.push_back({{"id", e->ids[i]},
                   {"text", parsed->inputs.substr(start, stop - start)},
                   {"start", start},
                   {"stop", stop}});
  }
  responder->reply(200, out.dump(-1, ' ', false, json::error_handler_t::replace),
                   baseHeaders(request));
}

void RouterApp::info(std::shared_ptr<HttpResponder> responder) {
  const json j{{"model_id", options_.modelId},
               {"model_sha", nullptr},
               {"model_pipeline_tag", "text-generation"},
               {"max_concurrent_requests", options_.maxConcurrentRequests},
               {"max_best_of", options_.limits.maxBestOf},
               {"max_stop_sequences", options_.limits.maxStopSequences},
               {"max_input_tokens", options_.limits.maxInputTokens},
               {"max_total_tokens", options_.limits.maxTotalTokens},
               {"validation_workers", options_.validationWorkers},
               {"max_client_batch_size", options_.maxClientBatchSize},
               {"router", "textgen-router"},
               {"version", kVersion},
               {"sha", nullptr},
               {"docker_label", nullptr}};
  responder->reply(200, j.dump(), {});
}

void RouterApp::health(std::shared_ptr<HttpResponder> responder) {
  // Healthy when a replica's last batch did not fail and its shards answer Health (TGI's health
  // uses the batches' outcome, and asks the shards when it has none).
  // An unhealthy replica is checked again by its batching thread (Batcher::probe: ClearCache +
  // Warmup while idle), so that one failure does not keep the replica out of a readiness probe's
  // rotation until a request happens to succeed.
  // Every unhealthy one, whether or not another answers: requests go to healthy replicas, so
  // this is how a failed one comes back.
  const auto serving = replicas_.serving();
  for (const auto& r : serving) r->batcher->probe();
  for (const auto& r : serving) {
    if (r->batcher->healthy() && r->shards->health().ok()) {
      responder->reply(200, "", {});
      return;
    }
  }
  responder->reply(503, errorJson("unhealthy", "healthcheck"), {});
}

}  // namespace textgen::router
