// Leader election on a coordination.k8s.io Lease, as client-go does it: a candidate takes the
// lease when it is free or its holder has not renewed it for leaseDuration (measured on the
// candidate's own clock, from when it last saw the record change), and the holder renews it every
// retryPeriod. Writes carry the lease's resourceVersion, so two candidates never both win.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "textgen/operator/resources.h"

namespace textgen::op {

struct LeaderElectionOptions {
  std::string ns, name = "textgen-operator", identity;
  std::chrono::seconds leaseDuration{15}, renewDeadline{10};
  std::chrono::milliseconds retryPeriod{2000};
};

class LeaderElector {
 public:
  LeaderElector(KubeClient& client, Kind lease, LeaderElectionOptions options);

  // Blocks until this candidate holds the lease; false when `stop` was set first.
  bool acquire(const std::atomic<bool>& stop);
  // Renews until a renewal has failed for renewDeadline (returns false: leadership lost) or
  // `stop` is set (returns true).
  bool hold(const std::atomic<bool>& stop);
  // Gives the lease up (holder cleared) so that another candidate takes over at once.
  void release();
  bool leading() const { return leading_.load(); }

 private:
  bool tryAcquireOrRenew();

  KubeClient& client_;
  Kind lease_;
  LeaderElectionOptions o_;
  std::atomic<bool> leading_{false};
  std::string observedRecord_;
  std::chrono::steady_clock::time_point observedAt_{};
};

}  // namespace textgen::op
