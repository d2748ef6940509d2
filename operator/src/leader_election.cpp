#include "textgen/operator/leader_election.h"

#include <ctime>
#include <thread>

#include "textgen/base/log.h"

namespace textgen::op {
namespace {

// RFC 3339 with microseconds (Kubernetes' MicroTime).
std::string microTime() {
  const auto now = std::chrono::system_clock::now();
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%06lldZ", buf, static_cast<long long>(us % 1000000));
  return out;
}

}  // namespace

LeaderElector::LeaderElector(KubeClient& client, Kind lease, LeaderElectionOptions options)
    : client_(client), lease_(std::move(lease)), o_(std::move(options)) {}

bool LeaderElector::tryAcquireOrRenew() {
  const std::string path = lease_.path(o_.ns, o_.name);
  const std::string now = microTime();
  json spec = {{"holderIdentity", o_.identity},
               {"leaseDurationSeconds", o_.leaseDuration.count()},
               {"acquireTime", now},
               {"renewTime", now},
               {"leaseTransitions", 0}};
  auto got = client_.request("GET", path);
  if (!got.ok()) return false;
  if (got->status == 404) {
    json obj = {{"apiVersion", lease_.apiVersion()},
                {"kind", lease_.kind},
                {"metadata", {{"name", o_.name}, {"namespace", o_.ns}}},
                {"spec", spec}};
    auto created = client_.request("POST", lease_.path(o_.ns), obj);
    return created.ok() && created->ok();
  }
  if (!got->ok()) return false;
  json current = got->body;
  const json old = current.value("spec", json::object());
  const std::string holder = old.value("holderIdentity", std::string());
  const std::string record = old.dump();
  const auto local = std::chrono::steady_clock::now();
  if (record != observedRecord_) {
    observedRecord_ = record;
    observedAt_ = local;
  }
  const auto duration = std::chrono::seconds(old.value("leaseDurationSeconds", int64_t{15}));
  if (!holder.empty() && holder != o_.identity && local < observedAt_ + duration)
    return false;  // held by another, renewed recently
  if (holder == o_.identity) {
    spec["acquireTime"] = old.value("acquireTime", now);
    spec["leaseTransitions"] = old.value("leaseTransitions", int64_t{0});
  } else {
    spec["leaseTransitions"] = old.value("leaseTransitions", int64_t{0}) + 1;
  }
  current["spec"] = spec;  // carries metadata.resourceVersion: a concurrent writer gets 409
  auto put = client_.request("PUT", path, current);
  if (!put.ok() || !put->ok()) return false;
  observedRecord_ = put->body.value("spec", json::object()).dump();
  observedAt_ = local;
  return true;
}

bool LeaderElector::acquire(const std::atomic<bool>& stop) {
  spdlog::info("leader election: waiting for lease {}/{} as {}", o_.ns, o_.name, o_.identity);
  while (!stop.load()) {
    if (tryAcquireOrRenew()) {
      leading_.store(true);
      spdlog::info("leader election: acquired lease {}/{}", o_.ns, o_.name);
      return true;
    }
    std::this_thread::sleep_for(o_.retryPeriod);
  }
  return false;
}

bool LeaderElector::hold(const std::atomic<bool>& stop) {
  auto lastRenew = std::chrono::steady_clock::now();
  while (!stop.load()) {
    std::this_thread::sleep_for(o_.retryPeriod);
    if (stop.load()) break;
    if (tryAcquireOrRenew()) {
      lastRenew = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - lastRenew > o_.renewDeadline) {
      leading_.store(false);
      spdlog::error("leader election: lost lease {}/{}", o_.ns, o_.name);
      return false;
    }
  }
  return true;
}

void LeaderElector::release() {
  if (!leading_.exchange(false)) return;
  const std::string path = lease_.path(o_.ns, o_.name);
  auto got = client_.request("GET", path);
  if (!got.ok() || !got->ok()) return;
  json current = got->body;
  if (current["spec"].value("holderIdentity", std::string()) != o_.identity) return;
  current["spec"]["holderIdentity"] = "";
  current["spec"]["leaseDurationSeconds"] = 1;
  auto put = client_.request("PUT", path, current);
  if (!put.ok() || !put->ok()) return;  // it expires on its own
  spdlog::info("leader election: released lease {}/{}", o_.ns, o_.name);
}

}  // namespace textgen::op
