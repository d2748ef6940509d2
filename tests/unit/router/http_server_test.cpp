// The HTTP transport with a raw-socket client: whole responses, request bodies, the payload limit,
// streamed chunks, and a disconnect seen by the writer.
#include "textgen/router/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
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

}  // namespace
}  // namespace textgen::router
