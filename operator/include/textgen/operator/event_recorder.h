// Kubernetes Events (core/v1) about a TextGenerationService, as client-go's recorder writes them:
// involvedObject the resource, source.component and reportingComponent "textgen-operator",
// reportingInstance this process, type Normal or Warning, a CamelCase reason. An event identical to
// one recorded in the last 10 minutes (same object, type, reason and message) is aggregated: the
// existing Event's count and lastTimestamp are patched instead of a new Event being created.
// Writing an event is best effort: a failure is logged, never returned (it must not fail a pass).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "textgen/operator/resources.h"

namespace textgen::op {

inline constexpr const char* kEventComponent = "textgen-operator";

// The object an event is about.
struct EventTarget {
  std::string apiVersion = "textgen.dev/v1alpha1", kind = "TextGenerationService";
  std::string ns, name, uid;
};

class EventRecorder {
 public:
  enum class Type { kNormal, kWarning };

  EventRecorder(KubeClient& client, Kind eventKind, std::string instance);

  void record(const EventTarget& target, Type type, const std::string& reason,
              const std::string& message);
  // Events created, and repeats patched into an existing one.
  int64_t created() const { return created_.load(); }
  int64_t aggregated() const { return aggregated_.load(); }

  static constexpr std::chrono::minutes kAggregationWindow{10};
  static constexpr size_t kMaxRemembered = 4096;

 private:
  struct Seen {
    std::string name;  // the Event's name
    int64_t count = 0;
    std::chrono::steady_clock::time_point last{};
  };

  KubeClient& client_;
  const Kind kind_;
  const std::string instance_;
  std::mutex mu_;
  std::map<std::string, Seen> seen_;  // by object, type, reason, message
  std::atomic<int64_t> created_{0}, aggregated_{0};
};

}  // namespace textgen::op
