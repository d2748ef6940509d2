#include "textgen/operator/event_recorder.h"

#include <cstdio>
#include <ctime>

#include "textgen/base/log.h"

namespace textgen::op {
namespace {

std::string nowRfc3339() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "<object>.<nanoseconds in hex>", as client-go names events (at most 253 characters).
std::string eventName(const std::string& object) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, ".%llx", static_cast<unsigned long long>(ns));
  return object.substr(0, 253 - std::string(suffix).size()) + suffix;
}

// The API's limits: a reason of at most 128 characters, a message of at most 1024 bytes.
std::string clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

}  // namespace

EventRecorder::EventRecorder(KubeClient& client, Kind eventKind, std::string instance)
    : client_(client), kind_(std::move(eventKind)), instance_(std::move(instance)) {}

void EventRecorder::record(const EventTarget& target, Type type, const std::string& reasonIn,
                           const std::string& messageIn) {
  const std::string typeName = type == Type::kWarning ? "Warning" : "Normal";
  const std::string reason = clip(reasonIn, 128), message = clip(messageIn, 1024);
  const std::string key = target.ns + "/" + target.name + "/" + target.uid + "\n" + typeName +
                          "\n" + reason + "\n" + message;
  const auto now = std::chrono::steady_clock::now();
  const std::string stamp = nowRfc3339();
  std::unique_lock<std::mutex> lock(mu_);
  std::erase_if(seen_, [&](const auto& s) { return now - s.second.last > kAggregationWindow; });
  auto it = seen_.find(key);
  if (it != seen_.end()) {
    Seen& seen = it->second;
    const json patch = {{"count", seen.count + 1}, {"lastTimestamp", stamp}};
    auto r = client_.request("PATCH", kind_.path(target.ns, seen.name), patch,
                             "application/merge-patch+json");
    if (r.ok() && r->ok()) {
      seen.count += 1;
      seen.last = now;
      aggregated_.fetch_add(1);
      return;
    }
    if (!r.ok() || r->status != 404) {
      spdlog::warn("{}/{}: event {} not recorded: {}", target.ns, target.name, reason,
                   r.ok() ? r->message() : r.status().toString());
      return;
    }
    seen_.erase(it);  // expired or deleted: a new one
  }
  const std::string name = eventName(target.name);
  const json event = {{"apiVersion", kind_.apiVersion()},
                      {"kind", "Event"},
                      {"metadata", {{"name", name}, {"namespace", target.ns}}},
                      {"involvedObject",
                       {{"apiVersion", target.apiVersion},
                        {"kind", target.kind},
                        {"name", target.name},
                        {"namespace", target.ns},
                        {"uid", target.uid}}},
                      {"reason", reason},
                      {"message", message},
                      {"type", typeName},
                      {"source", {{"component", kEventComponent}}},
                      {"reportingComponent", kEventComponent},
                      {"reportingInstance", instance_},
                      {"firstTimestamp", stamp},
                      {"lastTimestamp", stamp},
                      {"count", 1}};
  auto r = client_.request("POST", kind_.path(target.ns), event, "application/json");
  if (!r.ok() || !r->ok()) {
    spdlog::warn("{}/{}: event {} not recorded: {}", target.ns, target.name, reason,
                 r.ok() ? r->message() : r.status().toString());
    return;
  }
  created_.fetch_add(1);
  if (seen_.size() >= kMaxRemembered) seen_.erase(seen_.begin());
  seen_[key] = Seen{name, 1, now};
}

}  // namespace textgen::op
