// Every route of the router's HTTP API (RouterApp::handle) on fuzzed requests, with the router's
// test tokenizer and no replica: a request that passes validation ends in 503, after everything
// that would have refused it. Each request must be answered exactly once, with a status the API
// documents and, unless it is /metrics, a JSON body (or none).
//
// Input: byte 0 picks the method (low 3 bits) and the route (high 5 bits; past the list, the path
// is read from the input up to a newline); byte 1 flags: bit 0 an app with an API key and CORS,
// bit 1 the right bearer token, bit 2 a wrong one, bit 3 an Origin header, bit 4 the scheme in
// lower case; the rest is the body.
#include <chrono>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "chat/chat_template.h"
#include "fuzz_util.h"
#include "textgen/router/router_app.h"

namespace {

using namespace textgen::router;

const char* const kMethods[] = {"GET", "POST", "OPTIONS", "PUT", "DELETE", "HEAD", "", "post"};
const char* const kRoutes[] = {"/generate",
                               "/",
                               "/generate_stream",
                               "/v1/completions",
                               "/tokenize",
                               "/info",
                               "/health",
                               "/metrics",
                               "/v1/models",
                               "/api-doc/openapi.json",
                               "/v1/chat/completions",
                               "/invocations",
                               "/generate/",
                               "//generate",
                               "/GENERATE",
                               "/docs",
                               "/ping",
                               "/chat_tokenize",
                               "/vertex"};
constexpr size_t kNumRoutes = sizeof(kRoutes) / sizeof(kRoutes[0]);

class RecordingStream final : public HttpStream {
 public:
  bool write(const std::string& chunk) override {
    FUZZ_CHECK(!closed_, "write after close");
    data_ += chunk;
    return true;
  }
  bool clientConnected() const override { return true; }
  void close() override { closed_ = true; }

 private:
  std::string data_;
  bool closed_ = false;
};

// Thread-safe: the POST routes answer from a validation worker.
class RecordingResponder final : public HttpResponder {
 public:
  void reply(int code, const std::string& text, const HttpHeaders&) override {
    std::lock_guard lock(mutex);
    ++answers;
    status = code;
    body = text;
  }
  std::shared_ptr<HttpStream> startStream(int code, const HttpHeaders&) override {
    std::lock_guard lock(mutex);
    ++answers;
    status = code;
    stream = std::make_shared<RecordingStream>();
    return stream;
  }
  void onDisconnect(std::function<void()>) override {}  // the client never leaves
  std::mutex mutex;
  int answers = 0;
  int status = 0;
  std::string body;
  std::shared_ptr<RecordingStream> stream;
};

struct App {
  explicit App(RouterOptions options)
      : replicas([](const std::string& master) -> textgen::StatusOr<std::shared_ptr<Replica>> {
          return textgen::unavailableError("no replica in the fuzzer: " + master);
        }),
        app(std::move(options), tokenizer(), replicas, metrics) {}

  static const textgen::tokenizer::Tokenizer& tokenizer() {
    static const auto tok = [] {
      const std::string dir = textgen::fuzz::fixturesDir() + "/models/llama-gqa";
      auto t = textgen::tokenizer::Tokenizer::fromDirectory(dir);
      if (!t.ok()) textgen::fuzz::fail(__FILE__, __LINE__, dir + ": " + t.status().toString());
      return std::move(*t);
    }();
    return *tok;
  }

  ReplicaSet replicas;
  MetricsRegistry metrics;
  RouterApp app;
};

// A ChatML template: the chat routes get as far as rendering and validation.
std::shared_ptr<const ChatTemplate> chatTemplate() {
  auto t = ChatTemplate::fromSource(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "<s>", "</s>");
  if (!t.ok()) textgen::fuzz::fail(__FILE__, __LINE__, t.status().toString());
  return std::move(*t);
}

App& plainApp() {
  static App app{RouterOptions{.modelId = "llama-gqa", .chatTemplate = chatTemplate()}};
  return app;
}

App& securedApp() {
  static App app{RouterOptions{.modelId = "llama-gqa",
                               .maxConcurrentRequests = 2,
                               .apiKey = "secret",
                               .corsAllowOrigins = {"https://example.com"}}};
  return app;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  plainApp();
  securedApp();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  textgen::fuzz::Input in(data, size);
  const uint8_t pick = in.byte(), flags = in.byte();
  HttpRequest request;
  request.method = kMethods[pick & 7];
  const size_t route = pick >> 3;
  if (route < kNumRoutes) {
    request.path = kRoutes[route];
  } else {
    request.path = std::string(in.until('\n'));
  }
  if (flags & 2) request.headers["authorization"] = flags & 16 ? "bearer secret" : "Bearer secret";
  if (flags & 4) request.headers["authorization"] = "Bearer wrong";
  if (flags & 8) request.headers["origin"] = "https://example.com";
  request.headers["content-type"] = "application/json";
  request.body = std::string(in.rest());

  App& app = flags & 1 ? securedApp() : plainApp();
  auto responder = std::make_shared<RecordingResponder>();
  app.app.handle(request, responder);
  const std::string what = request.method + " " + request.path + " " + request.body;
  // Done when the route let go of the responder (no replica: nothing keeps it); a route that
  // holds it for 10 s is a hang.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (responder.use_count() > 1) {
    FUZZ_CHECK(std::chrono::steady_clock::now() < deadline, "no end after 10 s: " + what);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::lock_guard lock(responder->mutex);
  FUZZ_CHECK(responder->answers == 1, std::to_string(responder->answers) + " answers to " + what);
  // Nothing else is in flight, so admission must never answer "overloaded": a 429 here means an
  // earlier request kept its slot.
  FUZZ_CHECK(responder->status != 429, "overloaded with nothing in flight: " + what);
  static const std::set<int> kStatuses = {200, 401, 404, 405, 413, 422, 424, 503};
  FUZZ_CHECK(kStatuses.contains(responder->status),
             "status " + std::to_string(responder->status) + " for " + what);
  if (!responder->stream && !responder->body.empty() && request.path != "/metrics") {
    FUZZ_CHECK(!nlohmann::json::parse(responder->body, nullptr, false).is_discarded(),
               "a body that is not JSON for " + what + ": " + responder->body);
  }
  return 0;
}
