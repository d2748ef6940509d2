// HttpServer on cpprestsdk's http_listener. Streaming bodies are producer/consumer buffers: cpprest
// holds references to a response's buffer while the connection lives and drops them when the client
// goes away, which is how a stream learns of a disconnect.
#include <arpa/inet.h>
#include <cpprest/http_listener.h>
#include <cpprest/producerconsumerstream.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "textgen/router/http_server.h"

namespace textgen::router {
namespace {

using namespace web::http;
using namespace web::http::experimental::listener;

class CpprestStream final : public HttpStream {
 public:
  explicit CpprestStream(concurrency::streams::producer_consumer_buffer<uint8_t> buf)
      : buf_(std::move(buf)) {}
  ~CpprestStream() override { close(); }

  bool write(const std::string& chunk) override {
    std::lock_guard lock(mutex_);
    if (closed_ || !connected()) return false;
    buf_.putn_nocopy(reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size()).wait();
    buf_.sync().wait();
    return true;
  }
  bool clientConnected() const override {
    std::lock_guard lock(mutex_);
    return !closed_ && connected();
  }
  void close() override {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closed_ = true;
    buf_.close(std::ios_base::out).wait();
  }

 private:
  // While the connection lives, cpprest holds references to the buffer besides ours.
  bool connected() const { return buf_.get_base().use_count() > 1; }

  mutable std::mutex mutex_;
  concurrency::streams::producer_consumer_buffer<uint8_t> buf_;
  bool closed_ = false;
};

class CpprestResponder final : public HttpResponder {
 public:
  explicit CpprestResponder(http_request request) : request_(std::move(request)) {}

  void reply(int status, const std::string& body, const HttpHeaders& headers) override {
    http_response r(static_cast<status_code>(status));
    for (const auto& [k, v] : headers) r.headers().add(k, v);
    const auto ct = headers.find("Content-Type");
    r.set_body(body, ct == headers.end() ? std::string("application/json") : ct->second);
    request_.reply(r);
  }

  std::shared_ptr<HttpStream> startStream(int status, const HttpHeaders& headers) override {
    concurrency::streams::producer_consumer_buffer<uint8_t> buf;
    http_response r(static_cast<status_code>(status));
    for (const auto& [k, v] : headers) r.headers().add(k, v);
    r.set_body(buf.create_istream());
    auto stream = std::make_shared<CpprestStream>(buf);
    request_.reply(r);
    return stream;
  }

 private:
  http_request request_;
};

// A free TCP port on host (cpprest cannot report the port it bound for ":0").
StatusOr<int> freePort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return internalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return unavailableError("cannot bind a port on " + host);
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

class CpprestServer final : public HttpServer {
 public:
  CpprestServer(int port, std::unique_ptr<http_listener> listener)
      : port_(port), listener_(std::move(listener)) {}
  ~CpprestServer() override { stop(); }
  int port() const override { return port_; }
  void stop() override {
    if (listener_) {
      listener_->close().wait();
      listener_.reset();
    }
  }

 private:
  int port_;
  std::unique_ptr<http_listener> listener_;
};

}  // namespace

StatusOr<std::unique_ptr<HttpServer>> startHttpServer(const HttpServerOptions& options,
                                                      HttpHandler handler) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    int port = options.port;
    if (port == 0) {
      TG_ASSIGN_OR_RETURN(port, freePort(options.host));
    }
    auto listener = std::make_unique<http_listener>(
        web::uri("http://" + options.host + ":" + std::to_string(port)));
    const size_t limit = options.payloadLimit;
    listener->support([handler, limit](http_request request) {
      HttpRequest r;
      r.method = request.method();
      const web::uri& uri = request.relative_uri();
      r.path = uri.path();
      r.query = uri.query();
      for (const auto& [k, v] : request.headers()) {
        std::string key = k;
        std::transform(key.begin(), key.end(), key.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        r.headers[key] = v;
      }
      auto responder = std::make_shared<CpprestResponder>(request);
      const std::string declared = r.header("content-length");
      if (!declared.empty() && std::strtoull(declared.c_str(), nullptr, 10) > limit) {
        responder->reply(413, R"({"error":"Payload too large","error_type":"payload_too_large"})",
                         {});
        return;
      }
      // Read the body as a continuation: blocking a listener thread on it starves cpprest's pool
      // under many concurrent connections (every thread would wait for a read only the pool can
      // do).
      request.extract_vector().then([handler, limit, responder, r = std::move(r)](
                                        pplx::task<std::vector<unsigned char>> t) mutable {
        std::vector<unsigned char> body;
        try {
          body = t.get();
        } catch (const std::exception&) {
          responder->reply(
              400, R"({"error":"Could not read the request body","error_type":"validation"})", {});
          return;
        }
        if (body.size() > limit) {
          responder->reply(413, R"({"error":"Payload too large","error_type":"payload_too_large"})",
                           {});
          return;
        }
        r.body.assign(body.begin(), body.end());
        handler(r, responder);
      });
    });
    try {
      listener->open().wait();
      return std::unique_ptr<HttpServer>(
          std::make_unique<CpprestServer>(port, std::move(listener)));
    } catch (const std::exception& e) {
      if (options.port != 0)
        return unavailableError("cannot listen on " + options.host + ":" + std::to_string(port) +
                                ": " + e.what());
    }
  }
  return unavailableError("cannot find a free port on " + options.host);
}

}  // namespace textgen::router
