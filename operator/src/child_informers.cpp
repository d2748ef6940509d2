#include "textgen/operator/child_informers.h"

#include "textgen/operator/desired_objects.h"

namespace textgen::op {

ChildInformers::ChildInformers(KubeClient& client, const Kinds& kinds, const std::string& ns,
                               const Informer::Handler& onChange, int watchSeconds)
    : owned_({kinds.statefulSet, kinds.service, kinds.persistentVolumeClaim, kinds.deployment,
              kinds.horizontalPodAutoscaler, kinds.podDisruptionBudget, kinds.scaledObject,
              kinds.inferencePool}) {
  const std::string managed = std::string(kManagedByLabel) + "=" + kManagedBy;
  for (const Kind& k : owned_)
    informers_.push_back(
        std::make_unique<Informer>(client, k.path(ns), managed, onChange, watchSeconds));
  pods_ = std::make_unique<Informer>(client, kinds.pod.path(ns),
                                     managed + "," + kComponentLabel + "=shard", onChange,
                                     watchSeconds);
}

Informer* ChildInformers::of(const Kind& kind) const {
  for (size_t i = 0; i < owned_.size(); ++i)
    if (owned_[i].group == kind.group && owned_[i].plural == kind.plural)
      return informers_[i].get();
  return nullptr;
}

void ChildInformers::onServedChange(const std::function<void(const Kind&, bool)>& callback) {
  for (size_t i = 0; i < owned_.size(); ++i) {
    const Kind kind = owned_[i];
    informers_[i]->onServedChange([callback, kind](bool served) { callback(kind, served); });
  }
}

void ChildInformers::setAbsentRetry(std::chrono::milliseconds retry) {
  for (auto& i : informers_) i->setAbsentRetry(retry);
}

void ChildInformers::start() {
  for (auto& i : informers_) i->start();
  pods_->start();
}

void ChildInformers::stop() {
  for (auto& i : informers_) i->stop();
  pods_->stop();
}

bool ChildInformers::synced() const {
  for (const auto& i : informers_)
    if (!i->synced()) return false;
  return pods_->synced();
}

int64_t ChildInformers::relists() const {
  int64_t n = pods_->relists();
  for (const auto& i : informers_) n += i->relists();
  return n;
}

}  // namespace textgen::op
