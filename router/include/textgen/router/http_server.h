// The HTTP front end's transport (HTTP/1.1 on Boost.Beast): requests in; whole responses, or
// streams (Server-Sent Events) out. Limits are enforced while reading (header size and time, body
// size and time, Content-Length or chunked), and a client that goes away is reported on every
// route, so the scheduler can drop its request within one step.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "textgen/base/status_or.h"

namespace textgen::router {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::string query;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string header(const std::string& lowerName) const {
    auto it = headers.find(lowerName);
    return it == headers.end() ? std::string() : it->second;
  }
};

using HttpHeaders = std::map<std::string, std::string>;

// An open streaming response. Thread-safe; write from any thread.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // False once the client has disconnected (nothing more will reach it).
  virtual bool write(const std::string& chunk) = 0;
  virtual bool clientConnected() const = 0;
  virtual void close() = 0;
};

// Answers one request exactly once: reply() or startStream(). Thread-safe. A second answer is
// ignored (and logged); a responder dropped without answering answers 500.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void reply(int status, const std::string& body, const HttpHeaders& headers) = 0;
  virtual std::shared_ptr<HttpStream> startStream(int status, const HttpHeaders& headers) = 0;
  // Runs `callback` once if the client goes away before its answer was written in full (at once
  // when it already has), on a server thread: it must not block. How every route, streaming or
  // not, cancels a generation that nobody waits for.
  virtual void onDisconnect(std::function<void()> callback) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                           // 0: a free port is chosen
  size_t payloadLimit = 2 * 1024 * 1024;  // larger bodies get 413, counted while reading
  size_t headerLimit = 64 * 1024;         // request line + headers; larger: 431
  // From the first byte awaited (an idle keep-alive connection included) to the end of the
  // headers; then from there to the end of the body. A connection that misses either is closed.
  std::chrono::milliseconds headerTimeout{30'000};
  std::chrono::milliseconds bodyTimeout{60'000};
  // One write to a client that does not read; then the client counts as gone.
  std::chrono::milliseconds writeTimeout{60'000};
  // Bytes of a stream queued for a client that does not read; past it the client counts as gone.
  size_t streamBacklogLimit = 4 * 1024 * 1024;
  // A Server-Sent Events stream (text/event-stream) with nothing written for this long gets a
  // comment line (":"), as TGI's (axum's) KeepAlive sends: proxies with idle timeouts keep it
  // open through a long queue or prefill. 0: none.
  std::chrono::milliseconds sseKeepAlive{15'000};
  unsigned threads = 4;
  // Headers for the answers the server writes itself (413, 431, 400, and the 500 of a handler
  // that threw or gave no answer), from what it read of the request (the router's CORS headers).
  std::function<HttpHeaders(const HttpRequest&)> answerHeaders = nullptr;
};

class HttpServer {
 public:
  virtual ~HttpServer() = default;
  virtual int port() const = 0;
  virtual void stop() = 0;
};

StatusOr<std::unique_ptr<HttpServer>> startHttpServer(const HttpServerOptions& options,
                                                      HttpHandler handler);

}  // namespace textgen::router
