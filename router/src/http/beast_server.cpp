// HttpServer on Boost.Beast's HTTP/1.1 parser and Boost.Asio. One Session per connection, all of
// its work on one strand. What it enforces while reading, before any handler runs:
//   - the header block's size (431) and the time it may take to arrive (the connection closes);
//   - the body's size against the payload limit, for Content-Length and chunked bodies alike, as
//     the bytes arrive (413), and the time the body may take (the connection closes).
// While a handler works, the session keeps reading the socket: end-of-file or a reset means the
// client left, and the callbacks given to onDisconnect run (the routes cancel their generation).
// Every answer goes through one write queue: a whole response, or a stream's header, chunks and
// last chunk. An exception that escapes a handler becomes a 500 with TGI's error JSON and a log
// line; it never reaches a server thread.
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "textgen/base/log.h"
#include "textgen/router/http_server.h"

namespace textgen::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr const char* kInternalError =
    R"({"error":"Internal server error","error_type":"internal"})";

std::string statusLine(int status, unsigned version) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return std::string(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(status) + " " +
         std::string(reason.data(), reason.size()) + "\r\n";
}

// A header value must not end the header block early.
std::string headerLine(const std::string& name, const std::string& value) {
  std::string v = value;
  for (char& c : v)
    if (c == '\r' || c == '\n') c = ' ';
  return name + ": " + v + "\r\n";
}

class Session;

// Shared by the server and every session: a session answered from a batcher's thread after the
// server stopped must still find the io_context its socket belongs to, so the last owner destroys
// it, after the last socket. Once `stopped`, nothing more is posted to it.
struct ServerState {
  ServerState(HttpServerOptions o, HttpHandler h) : options(std::move(o)), handler(std::move(h)) {}
  HttpServerOptions options;
  HttpHandler handler;
  asio::io_context io;
  std::shared_mutex gate;  // posts (shared) against stop (exclusive)
  bool stopped = false;
  std::mutex sessionsMutex;
  std::vector<std::weak_ptr<Session>> sessions;
};

// The method, path, query and header fields (names lower-cased; repeats joined by ", ") of a
// parsed request head.
template <typename Message>
HttpRequest requestHead(const Message& req) {
  HttpRequest r;
  r.method = std::string(req.method_string());
  const std::string_view target(req.target().data(), req.target().size());
  const size_t q = target.find('?');
  r.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
  for (const auto& f : req) {
    std::string key(f.name_string());
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value(f.value());
    auto [it, inserted] = r.headers.emplace(key, value);
    if (!inserted) it->second += ", " + value;
  }
  return r;
}

class Session final : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerState> state)
      : state_(std::move(state)),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        sseTimer_(socket_.get_executor()) {}

  void start() { readHeader(); }
  // Only with no server thread running (stop()).
  void closeNow() { close(); }

  // From any thread: the answer to the current request.
  void reply(int status, const std::string& body, const HttpHeaders& headers);
  void beginStream(int status, const HttpHeaders& headers);
  void streamWrite(std::string data);
  void endStream();
  void onDisconnect(std::function<void()> callback);
  bool gone() const { return gone_.load(); }
  // Bytes queued for the client and not yet written.
  size_t backlog() const { return backlog_.load(); }
  void markGone() {
    post([self = shared_from_this()] { self->clientGone(); });
  }

 private:
  // Runs fn on this session's strand, unless the server has stopped.
  template <typename F>
  void post(F&& fn) {
    std::shared_lock lock(state_->gate);
    if (!state_->stopped) asio::post(socket_.get_executor(), std::forward<F>(fn));
  }

  enum class Phase { kHeader, kBody, kHandling, kClosed };

  void readHeader();
  void onHeader(error_code ec);
  void readBody();
  void onBody(error_code ec);
  void dispatch();
  void watch();
  void enqueue(std::string data, bool last);
  void writeNext();
  void onWritten(error_code ec, size_t bytes, bool last);
  void nextRequest();
  void failRead(error_code ec);
  void refuse(int status, const char* body);
  void clientGone();
  void close();
  void lingerClose();
  void arm(std::chrono::milliseconds d);
  void armKeepAlive();
  void writeChunk(const std::string& data);

  std::shared_ptr<ServerState> state_;  // first: destroyed after the socket and timer
  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::steady_timer sseTimer_;  // an event stream's keep-alive comments
  bool sse_ = false;             // the answer is a text/event-stream
  std::chrono::steady_clock::time_point lastStreamWrite_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kHeader;
  unsigned version_ = 11;
  bool keepAlive_ = true;
  bool head_ = false;  // a HEAD request: answers carry the body's length, not the body (RFC 9110)
  bool watching_ = false;    // a watch read is pending
  bool answerDone_ = false;  // the last byte of the answer is queued
  bool writing_ = false;
  bool stream_ = false;                           // the answer is chunked
  std::deque<std::pair<std::string, bool>> out_;  // data, last piece of the answer
  std::vector<std::function<void()>> onGone_;
  std::atomic<bool> gone_{false};
  std::atomic<size_t> backlog_{0};
  std::array<char, 4096> drain_{};
};

class BeastStream final : public HttpStream {
 public:
  explicit BeastStream(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  ~BeastStream() override { close(); }
  bool write(const std::string& chunk) override {
    std::lock_guard lock(mutex_);
    if (closed_ || session_->gone()) return false;
    if (session_->backlog() > limit_) {  // the client reads nothing: treat it as gone
      session_->markGone();
      return false;
    }
    session_->streamWrite(chunk);
    return true;
  }
  bool clientConnected() const override {
    std::lock_guard lock(mutex_);
    return !closed_ && !session_->gone();
  }
  void close() override {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closed_ = true;
    session_->endStream();
  }
  void setLimit(size_t limit) { limit_ = limit; }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Session> session_;
  size_t limit_ = 0;
  bool closed_ = false;
};

// What a refused second startStream() gets: writes go nowhere.
class ClosedStream final : public HttpStream {
 public:
  bool write(const std::string&) override { return false; }
  bool clientConnected() const override { return false; }
  void close() override {}
};

class BeastResponder final : public HttpResponder {
 public:
  BeastResponder(std::shared_ptr<Session> session, std::string path, size_t streamLimit,
                 HttpHeaders fallback)
      : session_(std::move(session)),
        path_(std::move(path)),
        streamLimit_(streamLimit),
        fallback_(std::move(fallback)) {}
  ~BeastResponder() override {
    // A route whose client left answers nothing, by design; any other silence is a bug.
    if (!answered_.exchange(true) && !session_->gone()) {
      spdlog::error("{}: the handler gave no answer; answering 500", path_);
      session_->reply(500, kInternalError, fallback_);
    }
  }
  // The server's own headers (HttpServerOptions::answerHeaders) for an answer it writes itself.
  const HttpHeaders& fallback() const { return fallback_; }
  void reply(int status, const std::string& body, const HttpHeaders& headers) override {
    if (!claim()) return;
    session_->reply(status, body, headers);
  }
  std::shared_ptr<HttpStream> startStream(int status, const HttpHeaders& headers) override {
    if (!claim()) return std::make_shared<ClosedStream>();  // touches nothing of the session
    auto stream = std::make_shared<BeastStream>(session_);
    stream->setLimit(streamLimit_);
    session_->beginStream(status, headers);
    return stream;
  }
  void onDisconnect(std::function<void()> callback) override {
    session_->onDisconnect(std::move(callback));
  }
  bool answered() const { return answered_.load(); }

 private:
  bool claim() {
    if (answered_.exchange(true)) {
      spdlog::error("{}: a second answer to one request was dropped", path_);
      return false;
    }
    return true;
  }
  std::shared_ptr<Session> session_;
  std::string path_;
  size_t streamLimit_;
  HttpHeaders fallback_;
  std::atomic<bool> answered_{false};
};

void Session::arm(std::chrono::milliseconds d) {
  timer_.expires_after(d);
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    // Re-armed or cancelled; or re-armed after this expiry was already queued.
    if (ec || self->timer_.expiry() > std::chrono::steady_clock::now()) return;
    // Reads or a write overran their time: the pending operations end with an error.
    error_code ignored;
    self->socket_.cancel(ignored);
    self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
  });
}

void Session::readHeader() {
  phase_ = Phase::kHeader;
  head_ = false;  // an error answered before the next header is parsed has a body
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(state_->options.headerLimit));
  parser_->body_limit(state_->options.payloadLimit);
  arm(state_->options.headerTimeout);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](error_code ec, size_t) { self->onHeader(ec); });
}

void Session::onHeader(error_code ec) {
  if (ec) return failRead(ec);
  const auto& req = parser_->get();
  version_ = req.version();
  keepAlive_ = req.keep_alive();
  head_ = req.method() == http::verb::head;
  if (const auto cl = parser_->content_length(); cl && *cl > state_->options.payloadLimit) {
    return refuse(413, R"({"error":"Payload too large","error_type":"payload_too_large"})");
  }
  if (beast::iequals(req[http::field::expect], "100-continue") && !parser_->is_done()) {
    // The client waits for this before it sends the body.
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(kContinue),
                      [self = shared_from_this()](error_code e, size_t) {
                        if (e) return self->failRead(e);
                        self->readBody();
                      });
    return;
  }
  readBody();
}

void Session::readBody() {
  phase_ = Phase::kBody;
  arm(state_->options.bodyTimeout);
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](error_code ec, size_t) { self->onBody(ec); });
}

void Session::onBody(error_code ec) {
  if (ec) return failRead(ec);
  timer_.cancel();
  dispatch();
}

void Session::failRead(error_code ec) {
  timer_.cancel();
  if (ec == http::error::body_limit) {
    return refuse(413, R"({"error":"Payload too large","error_type":"payload_too_large"})");
  }
  if (ec == http::error::header_limit) {
    return refuse(431, R"({"error":"Request headers too large","error_type":"validation"})");
  }
  const bool parseError =
      ec.category() == http::make_error_code(http::error::bad_method).category();
  if (parseError && ec != http::error::end_of_stream && ec != http::error::partial_message &&
      phase_ != Phase::kClosed) {
    // A malformed request: say so, then close (the stream cannot be resynchronised).
    return refuse(400, R"({"error":"Malformed HTTP request","error_type":"validation"})");
  }
  close();  // the client closed, reset, or overran its time
}

// Answers an unreadable request and closes the connection afterwards, with the server's own
// headers for what was read of it (the fields parsed so far: a Content-Length past the body limit
// fails the header's read itself, its fields all parsed).
void Session::refuse(int status, const char* body) {
  keepAlive_ = false;
  phase_ = Phase::kHandling;
  HttpHeaders headers;
  if (state_->options.answerHeaders) {
    HttpRequest r;
    if (parser_) r = requestHead(parser_->get());
    headers = state_->options.answerHeaders(r);
  }
  reply(status, body, headers);
}

void Session::dispatch() {
  phase_ = Phase::kHandling;
  answerDone_ = false;
  stream_ = false;
  gone_ = false;
  onGone_.clear();
  auto& req = parser_->get();
  HttpRequest r = requestHead(req);
  r.body = std::move(req.body());
  watch();
  HttpHeaders fallback;
  if (state_->options.answerHeaders) fallback = state_->options.answerHeaders(r);
  auto responder = std::make_shared<BeastResponder>(
      shared_from_this(), r.path, state_->options.streamBacklogLimit, std::move(fallback));
  // The one guard: nothing a handler throws reaches a server thread.
  try {
    state_->handler(r, responder);
  } catch (const std::exception& e) {
    spdlog::error("{} {}: unhandled exception: {}", r.method, r.path, e.what());
    responder->reply(500, kInternalError, responder->fallback());
  } catch (...) {
    spdlog::error("{} {}: unhandled exception", r.method, r.path);
    responder->reply(500, kInternalError, responder->fallback());
  }
}

// While the answer is prepared: a read that ends only when the client closes or sends more. Bytes
// of a pipelined next request stay in the buffer for the next parse.
void Session::watch() {
  if (watching_ || phase_ != Phase::kHandling) return;
  if (buffer_.size() > state_->options.headerLimit) return;  // enough pipelined; stop reading
  watching_ = true;
  socket_.async_read_some(
      buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
        self->watching_ = false;
        if (!ec) {
          self->buffer_.commit(n);
          if (self->phase_ == Phase::kHandling) return self->watch();
          // The answer was written and nextRequest()'s cancel came too late for this read: the
          // next request's first bytes are in the buffer; read it.
          if (self->phase_ == Phase::kHeader) return self->readHeader();
          return;
        }
        if (ec == asio::error::operation_aborted && self->phase_ == Phase::kHeader) {
          return self->readHeader();  // cancelled so the next request can be read
        }
        if (self->phase_ == Phase::kClosed) return;
        if (ec == asio::error::operation_aborted && self->answerDone_ && !self->writing_ &&
            self->out_.empty()) {
          return self->nextRequest();
        }
        self->clientGone();
      });
}

void Session::clientGone() {
  if (gone_.exchange(true)) return;
  auto callbacks = std::move(onGone_);
  onGone_.clear();
  for (auto& cb : callbacks) cb();
  close();
}

void Session::onDisconnect(std::function<void()> callback) {
  post([self = shared_from_this(), cb = std::move(callback)]() mutable {
    if (self->gone_) return cb();
    if (self->answerDone_ && self->out_.empty() && !self->writing_) return;  // answered in full
    self->onGone_.push_back(std::move(cb));
  });
}

void Session::reply(int status, const std::string& body, const HttpHeaders& headers) {
  std::string head = statusLine(status, version_);
  bool hasType = false;
  for (const auto& [k, v] : headers) {
    if (beast::iequals(k, "content-length") || beast::iequals(k, "connection") ||
        beast::iequals(k, "transfer-encoding"))
      continue;
    hasType = hasType || beast::iequals(k, "content-type");
    head += headerLine(k, v);
  }
  if (!hasType) head += "Content-Type: application/json\r\n";
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  std::string data = std::move(head);
  post([self = shared_from_this(), data = std::move(data), body]() {
    std::string all = data + (self->keepAlive_ ? "" : "Connection: close\r\n") + "\r\n" +
                      (self->head_ ? std::string() : body);
    self->enqueue(std::move(all), true);
  });
}

void Session::beginStream(int status, const HttpHeaders& headers) {
  std::string head = statusLine(status, version_);
  bool events = false;
  for (const auto& [k, v] : headers) {
    if (beast::iequals(k, "content-length") || beast::iequals(k, "connection") ||
        beast::iequals(k, "transfer-encoding"))
      continue;
    if (beast::iequals(k, "content-type") && v.rfind("text/event-stream", 0) == 0) events = true;
    head += headerLine(k, v);
  }
  post([self = shared_from_this(), head = std::move(head), events]() {
    self->stream_ = true;
    if (self->version_ == 10) self->keepAlive_ = false;  // no chunking: the close ends the body
    std::string h = head;
    if (self->version_ != 10) h += "Transfer-Encoding: chunked\r\n";
    if (!self->keepAlive_) h += "Connection: close\r\n";
    self->enqueue(h + "\r\n", false);
    self->sse_ = events && self->state_->options.sseKeepAlive.count() > 0;
    self->lastStreamWrite_ = std::chrono::steady_clock::now();
    if (self->sse_) self->armKeepAlive();
  });
}

// On the strand: one piece of a stream's body, chunked unless HTTP/1.0.
void Session::writeChunk(const std::string& data) {
  lastStreamWrite_ = std::chrono::steady_clock::now();
  if (version_ == 10) return enqueue(data, false);
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  enqueue(size + data + "\r\n", false);
}

void Session::streamWrite(std::string data) {
  if (data.empty()) return;
  backlog_ += data.size();
  post([self = shared_from_this(), data = std::move(data)]() { self->writeChunk(data); });
}

// An event stream idle for sseKeepAlive gets ":\n\n", an SSE comment clients skip. The wait is
// re-armed from the last write; it ends with the stream (or the connection).
void Session::armKeepAlive() {
  sseTimer_.expires_at(lastStreamWrite_ + state_->options.sseKeepAlive);
  sseTimer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->phase_ == Phase::kClosed || self->answerDone_ || !self->stream_ ||
        !self->sse_ || self->gone_)
      return;
    if (std::chrono::steady_clock::now() >=
        self->lastStreamWrite_ + self->state_->options.sseKeepAlive)
      self->writeChunk(":\n\n");
    self->armKeepAlive();
  });
}

void Session::endStream() {
  post([self = shared_from_this()]() {
    self->sse_ = false;
    self->sseTimer_.cancel();
    self->enqueue(self->version_ == 10 ? std::string() : std::string("0\r\n\r\n"), true);
  });
}

void Session::enqueue(std::string data, bool last) {
  if (phase_ == Phase::kClosed || gone_) {
    backlog_ = 0;
    return;
  }
  if (last) answerDone_ = true;
  out_.emplace_back(std::move(data), last);
  if (!writing_) writeNext();
}

void Session::writeNext() {
  if (out_.empty()) return;
  writing_ = true;
  arm(state_->options.writeTimeout);
  const std::string& data = out_.front().first;
  asio::async_write(socket_, asio::buffer(data),
                    [self = shared_from_this()](error_code ec, size_t n) {
                      // close() keeps the piece being written; it is always the front here.
                      const bool last = self->out_.front().second;
                      self->out_.pop_front();
                      self->onWritten(ec, n, last);
                    });
}

void Session::onWritten(error_code ec, size_t bytes, bool last) {
  writing_ = false;
  if (phase_ == Phase::kClosed) {
    out_.clear();
    return;
  }
  timer_.cancel();
  const size_t before = backlog_.load();
  backlog_ = before > bytes ? before - bytes : 0;
  if (ec) return clientGone();
  if (!out_.empty()) return writeNext();
  if (last) nextRequest();
}

// The answer is written: read the next request on this connection, or close it.
void Session::nextRequest() {
  if (phase_ != Phase::kHandling || writing_ || !out_.empty() || !answerDone_) return;
  onGone_.clear();
  if (!keepAlive_) return lingerClose();
  phase_ = Phase::kHeader;
  if (watching_) {
    error_code ignored;
    socket_.cancel(ignored);  // the watch read ends with operation_aborted, then reads the header
    return;
  }
  readHeader();
}

// After an answer that ends the connection: stop sending, then read and drop what the client still
// sends for a short while, so that closing does not reset the connection before the client has
// read the answer (a 413 sent while the client is still uploading, say).
void Session::lingerClose() {
  if (phase_ == Phase::kClosed) return;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  phase_ = Phase::kClosed;
  timer_.expires_after(std::chrono::seconds(2));
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec) return;
    error_code e;
    self->socket_.close(e);
  });
  struct Drain {
    std::shared_ptr<Session> self;
    void operator()(error_code ec, size_t) {
      if (ec || !self->socket_.is_open()) {
        self->timer_.cancel();
        error_code e;
        self->socket_.close(e);
        return;
      }
      self->socket_.async_read_some(asio::buffer(self->drain_), Drain{self});
    }
  };
  socket_.async_read_some(asio::buffer(drain_), Drain{shared_from_this()});
}

void Session::close() {
  phase_ = Phase::kClosed;
  timer_.cancel();
  sseTimer_.cancel();
  // A pending write still reads the front piece: it stays until that write completes.
  while (out_.size() > (writing_ ? 1u : 0u)) out_.pop_back();
  backlog_ = 0;
  if (!socket_.is_open()) return;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

class BeastServer final : public HttpServer {
 public:
  BeastServer(std::shared_ptr<ServerState> state, unsigned threads)
      : state_(std::move(state)), acceptor_(state_->io), threads_(std::max(1u, threads)) {}
  ~BeastServer() override { stop(); }

  Status listen() {
    error_code ec;
    auto address = asio::ip::make_address(state_->options.host, ec);
    if (ec && state_->options.host == "localhost") {
      address = asio::ip::address_v4::loopback();
      ec.clear();
    } else if (ec) {
      // Not an address: as TGI, every interface. Containers set HOSTNAME (TGI's variable for
      // --hostname) to their own name, which the launcher reads like any flag's variable.
      spdlog::warn("--hostname '{}' is not an IP address; listening on 0.0.0.0",
                   state_->options.host);
      address = asio::ip::address_v4::any();
      ec.clear();
    }
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(state_->options.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return unavailableError("cannot listen on " + state_->options.host + ":" +
                              std::to_string(state_->options.port) + ": " + ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    accept();
    for (unsigned i = 0; i < threads_; ++i) pool_.emplace_back([this] { state_->io.run(); });
    return okStatus();
  }

  int port() const override { return port_; }

  // Stops accepting and answering: open connections are closed, and whatever a batcher still
  // sends to them is dropped.
  void stop() override {
    std::lock_guard lock(stopMutex_);
    if (stopped_) return;
    stopped_ = true;
    {
      std::unique_lock gate(state_->gate);
      state_->stopped = true;
    }
    state_->io.stop();
    for (auto& t : pool_) t.join();
    pool_.clear();
    // No server thread runs now: close every connection from here, then run what that completes
    // (operations ending with "aborted") so that nothing queued keeps a session alive.
    error_code ignored;
    acceptor_.close(ignored);
    backoff_.cancel();
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard l(state_->sessionsMutex);
      for (auto& w : state_->sessions)
        if (auto s = w.lock()) live.push_back(std::move(s));
      state_->sessions.clear();
    }
    for (auto& s : live) s->closeNow();
    live.clear();
    state_->io.restart();
    state_->io.poll();
  }

 private:
  void accept() {
    acceptor_.async_accept(
        asio::make_strand(state_->io), [this](error_code ec, tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
          if (ec) {
            // Out of descriptors (EMFILE/ENFILE) or memory: the pending connection stays in the
            // backlog, so accepting again at once would spin. Back off; say so once a second.
            const auto now = std::chrono::steady_clock::now();
            ++acceptErrors_;
            if (now - lastAcceptLog_ >= std::chrono::seconds(1)) {
              spdlog::warn("accept failed: {} ({} times since the last report); backing off",
                           ec.message(), acceptErrors_);
              acceptErrors_ = 0;
              lastAcceptLog_ = now;
            }
            backoff_.expires_after(std::chrono::milliseconds(50));
            backoff_.async_wait([this](error_code e) {
              if (!e && acceptor_.is_open()) accept();
            });
            return;
          }
          {
            error_code ignored;
            socket.set_option(tcp::no_delay(true), ignored);
            auto session = std::make_shared<Session>(std::move(socket), state_);
            {
              std::lock_guard l(state_->sessionsMutex);
              if (state_->sessions.size() >= 2 * liveHint_ + 64) {
                std::erase_if(state_->sessions, [](const auto& w) { return w.expired(); });
                liveHint_ = state_->sessions.size();
              }
              state_->sessions.push_back(session);
            }
            session->start();
          }
          accept();
        });
  }

  std::shared_ptr<ServerState> state_;
  tcp::acceptor acceptor_;
  asio::steady_timer backoff_{state_->io};  // accept() after an error (one strand: accept's)
  size_t acceptErrors_ = 0;
  std::chrono::steady_clock::time_point lastAcceptLog_{};
  size_t liveHint_ = 0;
  unsigned threads_;
  std::vector<std::thread> pool_;
  int port_ = 0;
  std::mutex stopMutex_;
  bool stopped_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<HttpServer>> startHttpServer(const HttpServerOptions& options,
                                                      HttpHandler handler) {
  auto state = std::make_shared<ServerState>(options, std::move(handler));
  auto server = std::make_unique<BeastServer>(state, options.threads);
  TG_RETURN_IF_ERROR(server->listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace textgen::router
