// When a request stops, in TGI's order: max_new_tokens first, then an EOS token (unless ignored),
// then a stop sequence at the end of the generated text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace textgen::runtime {

enum class FinishReason { kLength, kEosToken, kStopSequence };

struct StoppingParams {
  uint32_t maxNewTokens = 20;
  std::vector<std::string> stopSequences;
  bool ignoreEosToken = false;
};

class StoppingCriteria {
 public:
  StoppingCriteria(StoppingParams params, std::vector<uint32_t> eosTokenIds);
  // Called once per generated token with its text; returns why generation ends, if it does.
  std::optional<FinishReason> update(uint32_t token, std::string_view text);
  uint32_t generatedTokens() const { return generated_; }

 private:
  StoppingParams params_;
  std::vector<uint32_t> eos_;
  uint32_t generated_ = 0;
  std::string tail_;  // the end of the generated text, long enough for the longest stop sequence
  size_t keep_ = 0;
};

}  // namespace textgen::runtime
