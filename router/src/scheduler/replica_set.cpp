#include "textgen/router/replica_set.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "textgen/base/file.h"
#include "textgen/base/log.h"

namespace textgen::router {

Status ReplicaSet::update(const std::vector<std::string>& masters) {
  const std::set<std::string> wanted(masters.begin(), masters.end());
  std::vector<std::string> toAdd;
  std::vector<std::shared_ptr<Replica>> reaped;  // destroyed outside the lock (their threads join)
  {
    std::lock_guard lock(mutex_);
    for (auto it = replicas_.begin(); it != replicas_.end();) {
      if (!wanted.contains(it->first)) {
        spdlog::info("replica {} left the discovery source: draining", it->first);
        it->second->draining = true;
        draining_.push_back(it->second);
        it = replicas_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& m : wanted) {
      if (!replicas_.contains(m)) toAdd.push_back(m);
    }
    // Reap drained replicas whose requests are all done (their batcher threads stop here).
    std::erase_if(draining_, [&](const std::shared_ptr<Replica>& r) {
      if (r->batcher->load() != 0) return false;
      reaped.push_back(r);
      return true;
    });
  }
  Status first;
  for (const std::string& m : toAdd) {  // connecting and warming happen outside the lock
    auto replica = factory_(m);
    if (!replica.ok()) {
      spdlog::warn("replica {}: {}", m, replica.status().toString());
      if (first.ok()) first = replica.status();
      continue;
    }
    std::lock_guard lock(mutex_);
    replicas_[m] = std::move(*replica);
    spdlog::info("replica {} joined", m);
  }
  if (onChange_) onChange_(serving().size());
  return first;
}

std::shared_ptr<Replica> ReplicaSet::pick(std::span<const uint32_t> prompt) const {
  std::lock_guard lock(mutex_);
  std::shared_ptr<Replica> best;
  for (const auto& [m, r] : replicas_) {
    if (!best || (r->batcher->healthy() && !best->batcher->healthy()) ||
        (r->batcher->healthy() == best->batcher->healthy() &&
         r->batcher->load() < best->batcher->load())) {
      best = r;
    }
  }
  if (prompt.empty() || replicas_.size() < 2) return best;
  // The healthy replica that caches the longest prefix of the prompt (the least loaded among
  // equals), as long as it is not much busier than the least loaded one: then load wins.
  std::shared_ptr<Replica> warm;
  uint32_t warmLen = 0;
  for (const auto& [m, r] : replicas_) {
    if (!r->batcher->healthy()) continue;
    const uint32_t len = r->batcher->cachedPrefix(prompt);
    if (len > warmLen || (len == warmLen && warm && r->batcher->load() < warm->batcher->load())) {
      warm = r;
      warmLen = len;
    }
  }
  if (!warm || warmLen == 0) return best;
  const size_t minLoad = best->batcher->load();
  const size_t slack = std::max<size_t>(kPrefixLoadSlack, minLoad / 4);
  return warm->batcher->load() <= minLoad + slack ? warm : best;
}

std::vector<std::shared_ptr<Replica>> ReplicaSet::serving() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Replica>> out;
  for (const auto& [m, r] : replicas_) out.push_back(r);
  return out;
}

StatusOr<std::vector<std::string>> Discovery::resolve(const std::string& source) {
  std::vector<std::string> out;
  auto splitList = [&](const std::string& list) {
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.push_back(item);
    }
  };
  if (source.rfind("file:", 0) == 0) {
    // A regular file only (a FIFO would block discovery forever), of bounded size.
    auto text = readRegularFile(source.substr(5), 1 << 20);
    if (!text.ok()) return text.status().withContext("discovery file " + source.substr(5));
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
      line.erase(
          std::remove_if(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); }),
          line.end());
      if (!line.empty() && line[0] != '#') out.push_back(line);
    }
  } else if (source.rfind("dns:", 0) == 0) {
    const std::string rest = source.substr(4);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos)
      return invalidArgumentError("discovery source " + source + ": expected dns:NAME:PORT");
    const std::string name = rest.substr(0, colon), port = rest.substr(colon + 1);
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(name.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return unavailableError("resolving " + name + ": " + gai_strerror(rc));
    }
    std::set<std::string> seen;
    for (addrinfo* a = res; a; a = a->ai_next) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof ip);
      if (seen.insert(ip).second) out.push_back(std::string(ip) + ":" + port);
    }
    freeaddrinfo(res);
  } else {
    splitList(source.rfind("static:", 0) == 0 ? source.substr(7) : source);
  }
  return out;
}

Discovery::Discovery(std::string source, std::chrono::milliseconds interval, ReplicaSet& replicas)
    : source_(std::move(source)), interval_(interval), replicas_(replicas) {}

StatusOr<std::unique_ptr<Discovery>> Discovery::start(const std::string& source,
                                                      std::chrono::milliseconds interval,
                                                      ReplicaSet& replicas) {
  TG_ASSIGN_OR_RETURN(std::vector<std::string> masters, resolve(source));
  (void)replicas.update(masters);  // failures are retried on the next round
  std::unique_ptr<Discovery> d(new Discovery(source, interval, replicas));
  d->thread_ = std::thread([raw = d.get()] {
    std::unique_lock lock(raw->mutex_);
    while (!raw->wake_.wait_for(lock, raw->interval_, [&] { return raw->stop_; })) {
      lock.unlock();
      auto listed = resolve(raw->source_);
      if (listed.ok()) {
        (void)raw->replicas_.update(*listed);
      } else {
        spdlog::warn("discovery {}: {}", raw->source_, listed.status().toString());
      }
      lock.lock();
    }
  });
  return d;
}

Discovery::~Discovery() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace textgen::router
