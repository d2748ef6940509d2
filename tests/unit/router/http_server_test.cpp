// The HTTP transport with a raw-socket client: whole responses, request bodies, the payload limit,
// streamed chunks, and a disconnect seen by the writer; then the limits enforced while reading
// (chunked bodies, header and body time, header size), the guard around handlers, keep-alive, and
// a disconnect reported to a handler that has not answered yet.
#include "textgen/router/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>

namespace textgen::router {
namespace {

int connectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string request(int port, const std::string& raw, size_t stopAfter = 0) {
  const int fd = connectTo(port);
  if (fd < 0) return {};
  ::send(fd, raw.data(), raw.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
    out.append(buf, static_cast<size_t>(n));
    if (stopAfter && out.size() >= stopAfter) break;
  }
  ::close(fd);
  return out;
}

TEST(HttpServerTest, RepliesAndPassesBodies) {
  auto server = startHttpServer(
      {.host = "127.0.0.1", .port = 0, .payloadLimit = 64},
      [](const HttpRequest& r, auto responder) {
        responder->reply(r.path == "/missing" ? 404 : 200,
                         r.method + " " + r.path + " q=" + r.query + " body=" + r.body,
                         {{"Content-Type", "text/plain"}, {"x-test", r.header("x-client")}});
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_GT(port, 0);
  std::string got = request(
      port, "GET /info?a=1 HTTP/1.1\r\nHost: x\r\nX-Client: abc\r\nConnection: close\r\n\r\n");
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  EXPECT_NE(got.find("GET /info q=a=1 body="), std::string::npos) << got;
  EXPECT_NE(got.find("x-test: abc"), std::string::npos) << got;
  got = request(
      port,
      "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  EXPECT_NE(got.find("body=hello"), std::string::npos) << got;
  got = request(port, "GET /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(got.find("HTTP/1.1 404"), std::string::npos);
  got = request(
      port,
      "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n" +
          std::string(100, 'x'));
  EXPECT_NE(got.find("HTTP/1.1 413"), std::string::npos) << got;
  EXPECT_NE(got.find("payload_too_large"), std::string::npos);
}

TEST(HttpServerTest, StreamsChunksAndSeesDisconnects) {
  std::promise<bool> writerSawDisconnect;
  std::atomic<bool> secondRequest{false};
  auto server = startHttpServer({}, [&](const HttpRequest&, auto responder) {
    auto stream = responder->startStream(200, {{"Content-Type", "text/event-stream"}});
    const bool abandon = secondRequest.exchange(true);
    std::thread([stream, abandon, &writerSawDisconnect] {
      if (!abandon) {
        for (int i = 0; i < 3; ++i) stream->write("data:" + std::to_string(i) + "\n\n");
        stream->close();
        return;
      }
      // The client leaves after the first event: writes must start failing.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline) {
        if (!stream->write("data:tick\n\n")) {
          writerSawDisconnect.set_value(true);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      writerSawDisconnect.set_value(false);
    }).detach();
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string got =
      request((*server)->port(), "GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(got.find("text/event-stream"), std::string::npos) << got;
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(got.find("data:" + std::to_string(i) + "\n\n"), std::string::npos) << got;
  const std::string first = request((*server)->port(), "GET /s HTTP/1.1\r\nHost: x\r\n\r\n", 150);
  EXPECT_NE(first.find("data:tick"), std::string::npos);
  auto saw = writerSawDisconnect.get_future();
  ASSERT_EQ(saw.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  EXPECT_TRUE(saw.get());
}

TEST(HttpServerTest, AnIdleEventStreamGetsKeepAliveComments) {
  // An event stream quiet for longer than sseKeepAlive gets ":" comments (TGI's SSE keep-alive);
  // a busy one and a stream of another type get none.
  auto server = startHttpServer(
      {.host = "127.0.0.1", .port = 0, .sseKeepAlive = std::chrono::milliseconds(40)},
      [](const HttpRequest& r, auto responder) {
        const bool events = r.path != "/plain";
        auto stream = responder->startStream(
            200, {{"Content-Type", events ? "text/event-stream" : "application/x-ndjson"}});
        const bool quiet = r.path != "/busy";
        std::thread([stream, quiet] {
          for (int i = 0; i < 3; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(quiet ? 150 : 10));
            stream->write("data:" + std::to_string(i) + "\n\n");
          }
          stream->close();
        }).detach();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto comments = [](const std::string& s) {
    size_t n = 0;
    for (size_t at = s.find("\r\n:\n\n\r\n"); at != std::string::npos;
         at = s.find("\r\n:\n\n\r\n", at + 1))
      ++n;
    return n;
  };
  const std::string quiet =
      request(port, "GET /quiet HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_GE(comments(quiet), 3u) << quiet;  // about three a 150 ms gap
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(quiet.find("data:" + std::to_string(i) + "\n\n"), std::string::npos) << quiet;
  EXPECT_NE(quiet.find("0\r\n\r\n"), std::string::npos) << quiet;
  const std::string busy =
      request(port, "GET /busy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(comments(busy), 0u) << busy;
  const std::string plain =
      request(port, "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(comments(plain), 0u) << plain;
}

// Reads until the peer closes or `timeout` passes; `closed` tells which.
std::string readAll(int fd, std::chrono::milliseconds timeout, bool* closed) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  *closed = false;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

HttpHandler echo(std::atomic<int>* calls = nullptr) {
  return [calls](const HttpRequest& r, std::shared_ptr<HttpResponder> responder) {
    if (calls) ++*calls;
    responder->reply(200, "body=" + r.body, {{"Content-Type", "text/plain"}});
  };
}

TEST(HttpServerTest, ChunkedBodiesCountAgainstTheLimitWhileReading) {
  std::atomic<int> calls{0};
  auto server = startHttpServer({.port = 0, .payloadLimit = 1000}, echo(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Within the limit: the chunks are joined.
  std::string got = request(port,
                            "POST /g HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                            "Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  EXPECT_NE(got.find("body=abcde"), std::string::npos) << got;
  // Over it: 413 once 1000 bytes have arrived, though the client never ends its body.
  const int fd = connectTo(port);
  ASSERT_GE(fd, 0);
  std::string head = "POST /g HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  ::send(fd, head.data(), head.size(), 0);
  const std::string chunk = "100\r\n" + std::string(256, 'y') + "\r\n";
  for (int i = 0; i < 5; ++i) ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
  bool closed = false;
  got = readAll(fd, std::chrono::seconds(10), &closed);
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 413"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  EXPECT_EQ(calls.load(), 1);  // the handler never saw the oversized body
}

TEST(HttpServerTest, SlowHeadersAndBodiesAreCut) {
  std::atomic<int> calls{0};
  auto server = startHttpServer({.port = 0,
                                 .headerTimeout = std::chrono::milliseconds(300),
                                 .bodyTimeout = std::chrono::milliseconds(300)},
                                echo(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  for (const std::string& partial :
       {std::string("POST /g HTTP/1.1\r\nHost: x\r\n"),  // headers never end
        std::string("POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")}) {
    const int fd = connectTo(port);
    ASSERT_GE(fd, 0);
    ::send(fd, partial.data(), partial.size(), 0);
    const auto start = std::chrono::steady_clock::now();
    bool closed = false;
    readAll(fd, std::chrono::seconds(10), &closed);
    ::close(fd);
    EXPECT_TRUE(closed) << partial;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << partial;
  }
  // An idle keep-alive connection is closed the same way.
  const int fd = connectTo(port);
  bool closed = false;
  readAll(fd, std::chrono::seconds(10), &closed);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_EQ(calls.load(), 0);
}

TEST(HttpServerTest, OversizedHeadersAndMalformedRequestsAreRefused) {
  auto server = startHttpServer({.port = 0, .headerLimit = 1024}, echo());
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::string got =
      request(port, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n");
  EXPECT_NE(got.find("HTTP/1.1 431"), std::string::npos) << got;
  got = request(port, "NOT A REQUEST\r\n\r\n");
  EXPECT_NE(got.find("HTTP/1.1 400"), std::string::npos) << got;
  got = request(port, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n");
  EXPECT_NE(got.find("HTTP/1.1 400"), std::string::npos) << got;
}

TEST(HttpServerTest, AnExceptionOrAMissingAnswerIsA500AndTheServerGoesOn) {
  auto server = startHttpServer({}, [](const HttpRequest& r, std::shared_ptr<HttpResponder> resp) {
    if (r.path == "/throw") throw std::runtime_error("boom");
    if (r.path == "/throw-int") throw 42;
    if (r.path == "/forget") return;  // the responder dies unanswered
    if (r.path == "/twice") resp->reply(200, "first", {});
    resp->reply(200, "ok", {});
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  for (const char* path : {"/throw", "/throw-int", "/forget"}) {
    const std::string got = request(
        port, std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    EXPECT_NE(got.find("HTTP/1.1 500"), std::string::npos) << path << ": " << got;
    EXPECT_NE(got.find(R"("error_type":"internal")"), std::string::npos) << got;
  }
  const std::string got =
      request(port, "GET /twice HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(got.find("first"), std::string::npos);
  EXPECT_EQ(got.find("ok"), std::string::npos) << "a second answer must be dropped: " << got;
}

TEST(HttpServerTest, KeepAlivePipeliningAndExpectContinue) {
  auto server = startHttpServer({}, echo());
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = connectTo((*server)->port());
  // Two requests in one write, then a third with Expect: 100-continue on the same connection.
  const std::string two =
      "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"
      "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n2";
  ::send(fd, two.data(), two.size(), 0);
  bool closed = false;
  std::string got = readAll(fd, std::chrono::milliseconds(600), &closed);
  EXPECT_NE(got.find("body=1"), std::string::npos) << got;
  EXPECT_NE(got.find("body=2"), std::string::npos) << got;
  EXPECT_FALSE(closed);
  const std::string head =
      "POST /c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
  ::send(fd, head.data(), head.size(), 0);
  got = readAll(fd, std::chrono::milliseconds(600), &closed);
  EXPECT_NE(got.find("HTTP/1.1 100 Continue"), std::string::npos) << got;
  ::send(fd, "xyz", 3, 0);
  got = readAll(fd, std::chrono::milliseconds(600), &closed);
  EXPECT_NE(got.find("body=xyz"), std::string::npos) << got;
  ::close(fd);
}

// HEAD: the GET's headers, Content-Length included, and no body; the next answer on the
// connection (an error the server gives before any handler runs) has its body again.
TEST(HttpServerTest, HeadAnswersCarryTheLengthButNoBody) {
  auto server = startHttpServer({.port = 0, .payloadLimit = 1000}, echo());
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = connectTo((*server)->port());
  const std::string head = "HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, head.data(), head.size(), 0);
  bool closed = false;
  std::string got = readAll(fd, std::chrono::milliseconds(600), &closed);
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  EXPECT_NE(got.find("Content-Length: 5\r\n"), std::string::npos) << got;  // "body="
  EXPECT_TRUE(got.ends_with("\r\n\r\n")) << got;
  EXPECT_FALSE(closed);
  const std::string big = "POST /y HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\n";
  ::send(fd, big.data(), big.size(), 0);
  got = readAll(fd, std::chrono::milliseconds(600), &closed);
  EXPECT_NE(got.find("HTTP/1.1 413"), std::string::npos) << got;
  EXPECT_NE(got.find("\"error_type\":\"payload_too_large\"}"), std::string::npos) << got;
  ::close(fd);
}

TEST(HttpServerTest, AHandlerHearsWhenItsClientLeavesBeforeTheAnswer) {
  std::promise<void> left;
  std::shared_ptr<HttpResponder> held;
  std::mutex m;
  auto server = startHttpServer({}, [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->onDisconnect([&left] { left.set_value(); });
    std::lock_guard lock(m);
    held = r;  // answers later (a generation in progress)
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = connectTo((*server)->port());
  const std::string req = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  ::send(fd, req.data(), req.size(), 0);
  while (true) {
    std::lock_guard lock(m);
    if (held) break;
  }
  ::close(fd);
  auto f = left.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard lock(m);
  held->reply(200, "too late", {});  // harmless after the client left
  held.reset();
}

TEST(HttpServerTest, AStreamToAClientThatReadsNothingEnds) {
  std::promise<bool> ended;
  auto server = startHttpServer(
      {.port = 0, .writeTimeout = std::chrono::milliseconds(500), .streamBacklogLimit = 1 << 20},
      [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        auto stream = r->startStream(200, {});
        std::thread([stream, &ended] {
          const std::string chunk(64 * 1024, 'z');
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (std::chrono::steady_clock::now() < deadline) {
            if (!stream->write(chunk)) return ended.set_value(true);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          ended.set_value(false);
        }).detach();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = connectTo((*server)->port());
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  const std::string req = "GET /s HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, req.data(), req.size(), 0);
  auto f = ended.get_future();  // the client never reads: memory must not grow without bound
  ASSERT_EQ(f.wait_for(std::chrono::seconds(25)), std::future_status::ready);
  EXPECT_TRUE(f.get());
  ::close(fd);
}

}  // namespace
}  // namespace textgen::router
