#include "textgen/operator/informer.h"

#include <algorithm>
#include <chrono>

#include "textgen/base/log.h"

namespace textgen::op {

Informer::Informer(KubeClient& client, std::string collectionPath, std::string labelSelector,
                   Handler handler, int watchSeconds)
    : client_(client),
      path_(std::move(collectionPath)),
      selector_(std::move(labelSelector)),
      handler_(std::move(handler)),
      watchSeconds_(watchSeconds) {}

Informer::~Informer() {
  stop();
  // Joins: a watch blocked in a read ends within watchSeconds (the operator's main exits without
  // destroying its informers for that reason).
  if (thread_.joinable()) thread_.join();
}

void Informer::start() {
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  stop_.store(true);
}

std::string Informer::keyOf(const json& object) {
  const json& m = object.at("metadata");
  return m.value("namespace", std::string()) + "/" + m.value("name", std::string());
}

std::optional<json> Informer::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

std::vector<json> Informer::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  for (const auto& [k, v] : cache_) out.push_back(v);
  return out;
}

void Informer::apply(const std::string& type, const json& object) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (type == "DELETED") {
      cache_.erase(keyOf(object));
    } else {
      cache_[keyOf(object)] = object;
    }
  }
  handler_(type, object);
}

void Informer::setServed(bool served) {
  if (served_.exchange(served) == served) return;
  if (served) {
    spdlog::info("{} is served now", path_);
  } else {
    spdlog::info("{} is not served (404): its CRD is not installed; listing again every {} s",
                 path_, absentRetry_.count() / 1000.0);
  }
  if (servedChange_) servedChange_(served);
}

Informer::ListResult Informer::listOnce(std::string& resourceVersion) {
  const std::string query = selector_.empty() ? "" : "?labelSelector=" + urlEncode(selector_);
  auto r = client_.request("GET", path_ + query);
  // Not served (404), or not allowed (403: a role without the optional kind): an empty, synced
  // cache, so that one kind never holds up the others.
  if (r.ok() && (r->status == 404 || r->status == 403)) {
    if (r->status == 403) spdlog::warn("list {}: {} (the role lacks it)", path_, r->message());
    std::vector<json> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [k, v] : cache_) gone.push_back(v);
      cache_.clear();
    }
    synced_.store(true);
    for (const json& g : gone) handler_("DELETED", g);
    setServed(false);
    return ListResult::kNotServed;
  }
  if (!r.ok() || !r->ok() || !r->body.is_object()) {
    spdlog::warn("list {} failed: {}", path_, r.ok() ? r->message() : r.status().toString());
    return ListResult::kFailed;
  }
  resourceVersion = r->body["metadata"].value("resourceVersion", std::string());
  std::map<std::string, json> fresh;
  for (const json& item : r->body.value("items", json::array())) fresh[keyOf(item)] = item;
  std::vector<json> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, v] : cache_)
      if (!fresh.count(k)) gone.push_back(v);
    cache_ = fresh;
  }
  synced_.store(true);
  setServed(true);
  for (const json& g : gone) handler_("DELETED", g);
  for (const auto& [k, v] : fresh) handler_("SYNC", v);
  return ListResult::kListed;
}

void Informer::sleepUnlessStopped(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (!stop_.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(50), std::chrono::duration_cast<std::chrono::milliseconds>(
                                           until - std::chrono::steady_clock::now())));
}

void Informer::run() {
  auto backoff = std::chrono::milliseconds(100);
  while (!stop_.load()) {
    std::string rv;
    const ListResult listed = listOnce(rv);
    if (listed == ListResult::kNotServed) {
      sleepUnlessStopped(absentRetry_);
      continue;
    }
    if (listed == ListResult::kFailed) {
      sleepUnlessStopped(backoff);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(30));
      continue;
    }
    backoff = std::chrono::milliseconds(100);
    bool relist = false;
    while (!stop_.load() && !relist) {
      std::string query =
          "?watch=1&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(watchSeconds_) +
          "&resourceVersion=" + urlEncode(rv);
      if (!selector_.empty()) query += "&labelSelector=" + urlEncode(selector_);
      const Status st = client_.watch(
          path_ + query,
          [&](const json& event) {
            const std::string type = event.value("type", std::string());
            const json& obj = event.contains("object") ? event["object"] : json::object();
            if (type == "ERROR") {
              const int code = obj.value("code", 0);
              if (code == 410) {
                spdlog::info("watch {} expired at resourceVersion {}: relisting", path_, rv);
              } else {
                spdlog::warn("watch {} error: {}", path_, obj.dump());
              }
              relist = true;
              return false;
            }
            if (obj.contains("metadata") && obj["metadata"].contains("resourceVersion"))
              rv = obj["metadata"]["resourceVersion"].get<std::string>();
            if (type == "BOOKMARK") return true;
            apply(type, obj);
            return !stop_.load();
          },
          stop_);
      if (relist) {
        relists_.fetch_add(1);
      } else if (!st.ok()) {
        // A 410 on the watch request itself also means the version is gone; a 404, that the
        // kind went away (its CRD deleted): the list finds out.
        relist = st.code() == StatusCode::kFailedPrecondition || st.code() == StatusCode::kNotFound;
        if (!relist) {
          spdlog::warn("watch {}: {}; retrying in {} ms", path_, st.toString(), backoff.count());
          sleepUnlessStopped(backoff);
          backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(30));
        }
      } else {
        backoff = std::chrono::milliseconds(100);
      }
    }
  }
}

}  // namespace textgen::op
