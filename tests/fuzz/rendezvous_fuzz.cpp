// The rendezvous store's wire protocol from raw bytes, as anything that reaches MASTER_PORT could
// send them: one process-wide rank 0 of a group of 3, and per input one TCP connection that sends
// the input, half-closes, and reads until the store closes it (bounded). After each input the
// store must still answer rank 0's own set and get. Any crash, sanitizer report or hang
// (libFuzzer's -timeout) is a finding. Messages: see pod-runtime/src/comm/rendezvous.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "textgen/runtime/communicator.h"

namespace {

using namespace textgen::runtime;

int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Store {
  Store() : port(freePort()) {
    auto r = Rendezvous::join({.masterAddr = "127.0.0.1",
                               .masterPort = port,
                               .rank = 0,
                               .worldSize = 3,
                               .timeout = std::chrono::seconds(5)});
    if (!r.ok()) textgen::fuzz::fail(__FILE__, __LINE__, r.status().toString());
    zero = std::move(*r);
  }
  int port;
  std::unique_ptr<Rendezvous> zero;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Store store;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(store.port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    for (size_t sent = 0; sent < size;) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    // Read answers until the store closes the connection, for at most a few seconds.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    char buf[4096];
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::recv(fd, buf, sizeof buf, 0) <= 0) break;
    }
  }
  ::close(fd);
  // Rank 0's own view of the store still works: its key (one ending in its rank, which no
  // connection may set) holds its value, and another value for it is refused (written once).
  static const std::string kMine = "rank 0's value";
  auto set = store.zero->set("fuzz/check/0", kMine);
  if (!set.ok() && set.code() != textgen::StatusCode::kResourceExhausted)
    textgen::fuzz::fail(__FILE__, __LINE__, set.toString());
  if (set.ok()) {
    auto got = store.zero->get("fuzz/check/0", std::chrono::seconds(1));
    if (!got.ok() || *got != kMine)
      textgen::fuzz::fail(__FILE__, __LINE__, "the store lost rank 0's own key");
    const std::string value(data, data + std::min<size_t>(size, 64));
    if (value != kMine &&
        store.zero->set("fuzz/check/0", value).code() != textgen::StatusCode::kAlreadyExists)
      textgen::fuzz::fail(__FILE__, __LINE__, "a second value for a key was not refused");
  }
  return 0;
}
