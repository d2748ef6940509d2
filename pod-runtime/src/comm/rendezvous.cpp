// The rendezvous store: rank 0 serves a key-value map over TCP, one thread per connection; the
// other ranks hold one connection each. Messages (u32 in host order: the ranks of a group run the
// same build):
//   hello  'H' u32 rank u32 worldSize          -> u8 0 (accepted) | 1 (refused)
//   set    'S' u32 keyLen key u32 valueLen value -> u8 0 (stored) | 1 (refused: see store())
//   get    'G' u32 keyLen key u32 timeoutMs      -> u8 0 u32 valueLen value | u8 1 (timed out)
// Anything else, or a length past the limits, closes the connection. A connection must say hello
// first, within a few seconds; one rank connects once. Connections open at once are capped, and the
// store's bytes too (whoever reaches the port can write to it: it holds nothing secret).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "textgen/runtime/communicator.h"

namespace textgen::runtime {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMaxKey = 1024;
constexpr uint32_t kMaxValue = 1 << 20;
constexpr size_t kMaxKeys = 4096;
constexpr size_t kMaxStoreBytes = 16u << 20;
constexpr auto kHelloTimeout = std::chrono::seconds(5);

// Blocking I/O with an overall deadline (poll before each read or write).
bool waitFd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool readAll(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!waitFd(fd, POLLIN, deadline)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool writeAll(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!waitFd(fd, POLLOUT, deadline)) return false;
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;  // poll again
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The other end closed (or reset) the connection: nothing more will be read from it.
bool peerClosed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte;
  const ssize_t r = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void putU32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}

bool readU32(int fd, uint32_t& v, Clock::time_point deadline) {
  return readAll(fd, &v, 4, deadline);
}

bool readString(int fd, std::string& s, uint32_t limit, Clock::time_point deadline) {
  uint32_t n = 0;
  if (!readU32(fd, n, deadline) || n > limit) return false;
  s.resize(n);
  return n == 0 || readAll(fd, s.data(), n, deadline);
}

class TcpRendezvous final : public Rendezvous {
 public:
  explicit TcpRendezvous(const Options& o) : options_(o) {}

  ~TcpRendezvous() override {
    destroying_ = true;  // peers leaving from here on are not lost peers
    if (options_.rank == 0) {
      // The others may still be reading their last answers (a barrier's): let them leave first,
      // for a moment.
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(2), [&] { return activePeers_ == 0; });
    }
    closing_ = true;
    {
      std::lock_guard lock(mu_);
      cv_.notify_all();
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    if (listenFd_ >= 0) ::shutdown(listenFd_, SHUT_RDWR);
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // wakes the monitor's read
    if (acceptThread_.joinable()) acceptThread_.join();
    {
      // Connection threads are detached; each closes its descriptor and leaves.
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return connections_ == 0; });
    }
    if (monitor_.joinable()) monitor_.join();
    if (listenFd_ >= 0) ::close(listenFd_);
    if (fd_ >= 0) ::close(fd_);
  }

  int rank() const override { return options_.rank; }
  int worldSize() const override { return options_.worldSize; }
  const std::string& masterAddr() const override { return options_.masterAddr; }

  Status start() { return options_.rank == 0 ? listen() : connect(); }

  Status set(const std::string& key, std::string_view value) override {
    if (key.size() > kMaxKey || value.size() > kMaxValue)
      return invalidArgumentError("rendezvous: key or value too long");
    if (options_.rank == 0) return store(key, std::string(value), 0);
    if (watching_)
      return failedPreconditionError("rendezvous: the store is closed once peers are watched");
    std::string msg = "S";
    putU32(msg, static_cast<uint32_t>(key.size()));
    msg += key;
    putU32(msg, static_cast<uint32_t>(value.size()));
    msg += value;
    std::lock_guard lock(clientMu_);
    const auto deadline = Clock::now() + options_.timeout;
    uint8_t ack = 2;
    if (!writeAll(fd_, msg.data(), msg.size(), deadline) || !readAll(fd_, &ack, 1, deadline) ||
        ack > 1)
      return unavailableError("rendezvous: lost the connection to rank 0 at " + master());
    if (ack == 1)
      return failedPreconditionError("rendezvous: rank 0's store refused key '" + key +
                                     "' (a key is written once, a rank's key by that rank only, "
                                     "within the store's limits)");
    return okStatus();
  }

  StatusOr<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    if (key.size() > kMaxKey) return invalidArgumentError("rendezvous: key too long");
    if (options_.rank == 0) {
      std::unique_lock lock(mu_);
      const bool ready = cv_.wait_for(
          lock, timeout, [&] { return closing_ || !lost_.empty() || map_.contains(key); });
      if (ready && !closing_ && map_.contains(key)) return map_.at(key);
      if (!lost_.empty()) return unavailableError("rendezvous: " + lost_);
      return deadlineExceededError("rendezvous: no value for '" + key + "' within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    if (watching_)
      return failedPreconditionError("rendezvous: the store is closed once peers are watched");
    std::string msg = "G";
    putU32(msg, static_cast<uint32_t>(key.size()));
    msg += key;
    putU32(msg, static_cast<uint32_t>(std::min<int64_t>(timeout.count(), UINT32_MAX)));
    std::lock_guard lock(clientMu_);
    const auto deadline = Clock::now() + timeout + std::chrono::seconds(10);
    uint8_t found = 2;
    std::string value;
    if (!writeAll(fd_, msg.data(), msg.size(), deadline) || !readAll(fd_, &found, 1, deadline) ||
        found > 1 || (found == 0 && !readString(fd_, value, kMaxValue, deadline)))
      return unavailableError("rendezvous: lost the connection to rank 0 at " + master());
    if (found == 1)
      return deadlineExceededError("rendezvous: no value for '" + key + "' within " +
                                   std::to_string(timeout.count()) + " ms");
    return value;
  }

  Status barrier(const std::string& name) override {
    TG_RETURN_IF_ERROR(set(name + "/" + std::to_string(options_.rank), "1"));
    for (int r = 0; r < options_.worldSize; ++r) {
      auto v = get(name + "/" + std::to_string(r), options_.timeout);
      if (!v.ok())
        return v.status().withContext("barrier '" + name + "' waiting for rank " +
                                      std::to_string(r));
    }
    return okStatus();
  }

  void watchPeers(std::function<void(const std::string&)> onLost) override {
    {
      std::lock_guard lock(mu_);
      onLost_ = std::move(onLost);
      watching_ = true;
      // A peer that left before watching began is lost too.
      if (options_.rank == 0 && lostBeforeWatch_) fireLost(*lostBeforeWatch_);
    }
    if (options_.rank != 0) {
      monitor_ = std::thread([this] {
        char byte;
        for (;;) {
          const ssize_t r = ::recv(fd_, &byte, 1, 0);
          if (r < 0 && errno == EINTR) continue;
          break;  // rank 0 never sends unasked: any return is the end of the connection
        }
        std::lock_guard lock(mu_);
        fireLost("the connection to rank 0 (" + master() + ") closed: rank 0 is gone");
      });
    }
  }

 private:
  std::string master() const {
    return options_.masterAddr + ":" + std::to_string(options_.masterPort);
  }

  // Keys are written once: the same value again is accepted, another refused, so nothing that
  // reaches the port can replace what a rank published (NCCL's id, an IPC handle). A key ending in
  // a rank number ("start/1", Gloo's "1") belongs to that rank: only its connection sets it.
  Status store(const std::string& key, std::string value, int setter) {
    const size_t slash = key.rfind('/');
    const std::string_view last =
        std::string_view(key).substr(slash == std::string::npos ? 0 : slash + 1);
    int owner = -1;
    if (!last.empty() && last.size() <= 4 &&
        std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; }))
      owner = std::stoi(std::string(last));
    if (owner >= 0 && owner < options_.worldSize && owner != setter)
      return permissionDeniedError("rendezvous: key '" + key + "' belongs to rank " +
                                   std::to_string(owner) + ", not rank " + std::to_string(setter));
    std::lock_guard lock(mu_);
    if (const auto it = map_.find(key); it != map_.end()) {
      if (it->second == value) return okStatus();
      return alreadyExistsError("rendezvous: key '" + key + "' is already set (written once)");
    }
    if (!map_.contains(key) && map_.size() >= kMaxKeys)
      return resourceExhaustedError("rendezvous: too many keys");
    if (storeBytes_ + key.size() + value.size() > kMaxStoreBytes)
      return resourceExhaustedError("rendezvous: the store is full");
    storeBytes_ += key.size() + value.size();
    map_[key] = std::move(value);
    cv_.notify_all();
    return okStatus();
  }

  // Under mu_.
  void fireLost(const std::string& why) {
    if (closing_ || destroying_ || fired_ || !onLost_) return;
    fired_ = true;
    std::thread([cb = onLost_, why] { cb(why); }).detach();
  }

  Status listen() {
    listenFd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool v6 = listenFd_ >= 0;
    if (!v6) listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listenFd_ < 0)
      return unavailableError("rendezvous: socket: " + std::string(strerror(errno)));
    const int one = 1, zero = 0;
    ::setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
      ::setsockopt(listenFd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(options_.masterPort));
      rc = ::bind(listenFd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(options_.masterPort));
      rc = ::bind(listenFd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0 || ::listen(listenFd_, 64) != 0) {
      return unavailableError("rendezvous: rank 0 cannot listen on port " +
                              std::to_string(options_.masterPort) +
                              " (MASTER_PORT): " + strerror(errno));
    }
    acceptThread_ = std::thread([this] { acceptLoop(); });
    return okStatus();
  }

  void acceptLoop() {
    while (!closing_) {
      const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (closing_) return;
        if (errno == EINTR || errno == ECONNABORTED) continue;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // e.g. out of descriptors
        continue;
      }
      std::lock_guard lock(mu_);
      // Connections open at once (a scan or a crash-looping rank must not lock the store out).
      if (closing_ || fds_.size() >= static_cast<size_t>(2 * options_.worldSize + 16)) {
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      try {
        std::thread([this, fd] { serve(fd); }).detach();
      } catch (const std::system_error&) {
        ::close(fd);  // no thread to serve it
        continue;
      }
      fds_.insert(fd);
      ++connections_;
    }
  }

  // One connection: hello, then requests until it closes.
  void serve(int fd) {
    int peer = -1;
    char op = 0;
    if (readAll(fd, &op, 1, Clock::now() + kHelloTimeout) && op == 'H') {
      uint32_t rank = 0, world = 0;
      const auto deadline = Clock::now() + kHelloTimeout;
      if (readU32(fd, rank, deadline) && readU32(fd, world, deadline)) {
        std::lock_guard lock(mu_);
        const bool ok = world == static_cast<uint32_t>(options_.worldSize) && rank >= 1 &&
                        rank < world && !joined_.contains(static_cast<int>(rank));
        if (ok) {
          peer = static_cast<int>(rank);
          joined_.insert(peer);
          ++activePeers_;
        }
      }
      const uint8_t answer = peer >= 0 ? 0 : 1;
      writeAll(fd, &answer, 1, Clock::now() + kHelloTimeout);
    }
    while (peer >= 0 && !closing_) {
      // Requests come at any time (a rank may idle for hours between them once serving).
      if (!readAll(fd, &op, 1, Clock::time_point::max())) break;
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      std::string key, value;
      if (!readString(fd, key, kMaxKey, deadline)) break;
      if (op == 'S') {
        if (!readString(fd, value, kMaxValue, deadline)) break;
        const uint8_t ack = store(key, std::move(value), peer).ok() ? 0 : 1;
        if (!writeAll(fd, &ack, 1, deadline)) break;
      } else if (op == 'G') {
        uint32_t timeoutMs = 0;
        if (!readU32(fd, timeoutMs, deadline)) break;
        std::string reply;
        {
          // Waits in slices, so that a client that asked for a long wait and left frees its
          // connection (and its place under the cap) at once.
          const auto until = Clock::now() + std::chrono::milliseconds(timeoutMs);
          std::unique_lock lock(mu_);
          bool found = false;
          for (;;) {
            const auto slice = std::min(until, Clock::now() + std::chrono::milliseconds(200));
            found = cv_.wait_until(
                lock, slice, [&] { return closing_ || !lost_.empty() || map_.contains(key); });
            if (found || Clock::now() >= until || peerClosed(fd)) break;
          }
          found = found && !closing_ && map_.contains(key);
          if (found) {
            reply.push_back(0);
            putU32(reply, static_cast<uint32_t>(map_.at(key).size()));
            reply += map_.at(key);
          } else {
            reply.push_back(1);
          }
        }
        if (!writeAll(fd, reply.data(), reply.size(), Clock::now() + std::chrono::seconds(30)))
          break;
      } else {
        break;
      }
    }
    std::lock_guard lock(mu_);
    if (peer >= 0) {
      --activePeers_;
      joined_.erase(peer);  // it may connect again (a connection lost during start-up)
    }
    if (peer >= 0 && !closing_ && !destroying_) {
      const std::string why = "rank " + std::to_string(peer) + " closed its connection: it is gone";
      if (watching_) {
        fireLost(why);
      } else {
        lostBeforeWatch_ = why;
        lost_ = why;  // wakes whoever waits in the store for it
      }
    }
    fds_.erase(fd);
    ::close(fd);
    --connections_;
    cv_.notify_all();
  }

  // connect() bounded in time (a blocking one waits minutes when SYNs are dropped); the socket is
  // blocking again afterwards (reads and writes poll with their own deadlines).
  static bool connectWithin(int fd, const addrinfo* a, Clock::time_point deadline,
                            std::string& last) {
    const int flags = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS && waitFd(fd, POLLOUT, deadline)) {
      int err = 0;
      socklen_t len = sizeof err;
      ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
      if (!ok) last = strerror(err);
    } else if (!ok) {
      last = errno == EINPROGRESS ? "connect timed out" : strerror(errno);
    }
    ::fcntl(fd, F_SETFL, flags);
    return ok;
  }

  Status connect() {
    const auto deadline = Clock::now() + options_.timeout;
    std::string last = "not tried";
    while (Clock::now() < deadline) {
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      const std::string port = std::to_string(options_.masterPort);
      const int gai = ::getaddrinfo(options_.masterAddr.c_str(), port.c_str(), &hints, &res);
      if (gai != 0) {
        last = gai_strerror(gai);  // DNS of a pod not yet started: retry
      } else {
        for (addrinfo* a = res; a; a = a->ai_next) {
          const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
          if (fd < 0) continue;
          if (connectWithin(fd, a, std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                            last)) {
            fd_ = fd;
            break;
          }
          ::close(fd);
        }
        ::freeaddrinfo(res);
      }
      if (fd_ >= 0) {
        const int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        std::string hello = "H";
        putU32(hello, static_cast<uint32_t>(options_.rank));
        putU32(hello, static_cast<uint32_t>(options_.worldSize));
        uint8_t answer = 2;
        const auto helloDeadline = Clock::now() + kHelloTimeout;
        const bool answered = writeAll(fd_, hello.data(), hello.size(), helloDeadline) &&
                              readAll(fd_, &answer, 1, helloDeadline);
        if (answered && answer == 0) return okStatus();
        ::close(fd_);
        fd_ = -1;
        if (answered && answer == 1) {
          return failedPreconditionError("rendezvous: rank 0 at " + master() + " refused rank " +
                                         std::to_string(options_.rank) + " of " +
                                         std::to_string(options_.worldSize) +
                                         " (another WORLD_SIZE, or this rank joined twice)");
        }
        last = "the connection closed before rank 0 answered";  // not a refusal: try again
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return deadlineExceededError("rendezvous: rank 0 at " + master() +
                                 " (MASTER_ADDR:MASTER_PORT) " + "did not answer within " +
                                 std::to_string(options_.timeout.count()) + " ms (" + last + ")");
  }

  Options options_;
  std::atomic<bool> closing_{false};
  // Rank 0: the store and its connections.
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
  std::set<int> joined_;
  int activePeers_ = 0;
  int listenFd_ = -1;
  std::set<int> fds_;    // open connections
  int connections_ = 0;  // their threads (detached)
  size_t storeBytes_ = 0;
  std::string lost_;  // a joined peer gone before watching began
  std::atomic<bool> destroying_{false};
  std::thread acceptThread_;
  std::function<void(const std::string&)> onLost_;
  std::atomic<bool> watching_{false};
  bool fired_ = false;
  std::optional<std::string> lostBeforeWatch_;
  // Other ranks: the connection to rank 0.
  std::mutex clientMu_;
  int fd_ = -1;
  std::thread monitor_;
};

}  // namespace

StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::join(const Options& options) {
  if (options.worldSize < 1 || options.rank < 0 || options.rank >= options.worldSize)
    return invalidArgumentError("rendezvous: rank " + std::to_string(options.rank) +
                                " is not in [0, " + std::to_string(options.worldSize) + ")");
  if (options.masterPort <= 0 || options.masterPort > 65535)
    return invalidArgumentError("MASTER_PORT must be in [1, 65535]");
  auto r = std::make_unique<TcpRendezvous>(options);
  TG_RETURN_IF_ERROR(r->start());
  return std::unique_ptr<Rendezvous>(std::move(r));
}

}  // namespace textgen::runtime
