#include "textgen/runtime/stopping.h"

#include <algorithm>

namespace textgen::runtime {

StoppingCriteria::StoppingCriteria(StoppingParams params, std::vector<uint32_t> eosTokenIds)
    : params_(std::move(params)), eos_(std::move(eosTokenIds)) {
  for (const std::string& s : params_.stopSequences) keep_ = std::max(keep_, s.size());
}

std::optional<FinishReason> StoppingCriteria::update(uint32_t token, std::string_view text) {
  ++generated_;
  if (generated_ >= params_.maxNewTokens) return FinishReason::kLength;
  if (!params_.ignoreEosToken && std::find(eos_.begin(), eos_.end(), token) != eos_.end()) {
    return FinishReason::kEosToken;
  }
  if (keep_ == 0) return std::nullopt;
  tail_ += text;
  if (tail_.size() > 2 * keep_) tail_.erase(0, tail_.size() - keep_);
  for (const std::string& s : params_.stopSequences) {
    if (!s.empty() && tail_.size() >= s.size() &&
        tail_.compare(tail_.size() - s.size(), s.size(), s) == 0) {
      return FinishReason::kStopSequence;
    }
  }
  return std::nullopt;
}

}  // namespace textgen::runtime
