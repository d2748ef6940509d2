#include "textgen/tokenizer/incremental_decoder.h"

namespace textgen::tokenizer {
namespace {

constexpr size_t kContextTokens = 5;  // TGI keeps the last five prompt tokens as context
constexpr std::string_view kReplacement = "\xef\xbf\xbd";

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skipSpecialTokens,
                                       std::span<const uint32_t> context)
    : tokenizer_(tokenizer),
      skipSpecialTokens_(skipSpecialTokens),
      ids_(context.begin(), context.end()) {
  readOffset_ = ids_.size();
  prefixOffset_ = ids_.size() > kContextTokens ? ids_.size() - kContextTokens : 0;
}

std::string IncrementalDecoder::decodeRange(size_t from, size_t to) const {
  return tokenizer_.decode(std::span<const uint32_t>(ids_).subspan(from, to - from),
                           skipSpecialTokens_);
}

std::string IncrementalDecoder::step(uint32_t id) {
  ids_.push_back(id);
  // A run of grouped byte tokens may still turn invalid and re-render as U+FFFD (ByteFallback
  // decodes the run as one unit): hold it until a token that ends the run. Tokens that decode
  // drops do not end it.
  for (auto it = ids_.rbegin(); it != ids_.rend(); ++it) {
    if (tokenizer_.isSkippedInDecode(*it, skipSpecialTokens_)) continue;
    if (tokenizer_.isGroupedByteToken(*it)) return {};
    break;
  }
  const std::string prefixText = decodeRange(prefixOffset_, readOffset_);
  const std::string newText = decodeRange(prefixOffset_, ids_.size());
  if (newText.size() > prefixText.size() && !endsWith(newText, kReplacement) &&
      startsWith(newText, prefixText)) {
    prefixOffset_ = readOffset_;
    readOffset_ = ids_.size();
    return newText.substr(prefixText.size());
  }
  return {};
}

std::string IncrementalDecoder::flush() {
  const std::string prefixText = decodeRange(prefixOffset_, readOffset_);
  const std::string newText = decodeRange(prefixOffset_, ids_.size());
  prefixOffset_ = readOffset_ = ids_.size();
  if (newText.size() > prefixText.size() && startsWith(newText, prefixText)) {
    return newText.substr(prefixText.size());
  }
  return {};
}

}  // namespace textgen::tokenizer
