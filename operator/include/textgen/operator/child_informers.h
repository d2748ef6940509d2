// One informer per kind the operator owns (its objects carry the label
// app.kubernetes.io/managed-by=textgen-operator), plus the shard pods: the reconciler reads its
// children from these caches and never lists or gets them on a pass. Optional kinds a cluster may
// not serve (KEDA's ScaledObject, the Gateway API Inference Extension's InferencePool) are
// informers like the others whose served() is false while their CRD is absent.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "textgen/operator/informer.h"
#include "textgen/operator/resources.h"

namespace textgen::op {

class ChildInformers {
 public:
  // ns: the namespace watched ("" for every namespace). onChange sees every event of every kind.
  ChildInformers(KubeClient& client, const Kinds& kinds, const std::string& ns,
                 const Informer::Handler& onChange, int watchSeconds = 60);

  // The informer of a kind the operator creates (nullptr for any other kind).
  Informer* of(const Kind& kind) const;
  // The kinds the operator creates, in the order it prunes them.
  const std::vector<Kind>& owned() const { return owned_; }
  Informer& pods() const { return *pods_; }

  // Runs when one of the kinds becomes served or stops being served (its CRD installed/removed).
  void onServedChange(const std::function<void(const Kind&, bool served)>& callback);
  void setAbsentRetry(std::chrono::milliseconds retry);
  void start();
  void stop();
  bool synced() const;
  int64_t relists() const;

 private:
  std::vector<Kind> owned_;
  std::vector<std::unique_ptr<Informer>> informers_;  // owned_[i]'s at i
  std::unique_ptr<Informer> pods_;
};

}  // namespace textgen::op
