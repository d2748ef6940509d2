// The HTTP front end's transport, kept behind this interface so the library (cpprestsdk today) can
// be swapped: requests in; whole responses, or streams (Server-Sent Events) out. A stream reports
// when its client has gone, so the scheduler can drop the request within one step.
#pragma once

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

// Answers one request exactly once: reply() or startStream().
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void reply(int status, const std::string& body, const HttpHeaders& headers) = 0;
  virtual std::shared_ptr<HttpStream> startStream(int status, const HttpHeaders& headers) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                           // 0: a free port is chosen
  size_t payloadLimit = 2 * 1024 * 1024;  // larger bodies get 413 before the handler runs
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
