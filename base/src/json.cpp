#include "textgen/base/json.h"

#include <cstdint>
#include <vector>

namespace textgen {
namespace {

using nlohmann::json;

// A SAX pass that only counts nesting and objects' keys: it stops at the first container past the
// depth bound, before anything is allocated for it, and, for the ordered parse, once the objects'
// keys would cost more than kMaxOrderedKeyWork comparisons to insert (see below).
class DepthCheck final : public nlohmann::json_sax<json> {
 public:
  DepthCheck(int maxDepth, bool ordered) : maxDepth_(maxDepth), ordered_(ordered) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.push_back(0);
    return enter();
  }
  bool key(string_t& k) override {
    // nlohmann's ordered_map finds a key by walking the object's earlier keys: the m-th key of an
    // object costs m comparisons, an object of n keys n^2 / 2; long keys of one length cost more
    // a comparison (a unit a 32 bytes).
    if (!ordered_) return true;
    work_ += keys_.back()++ * (1 + k.size() / 32);
    if (work_ > kMaxOrderedKeyWork) {
      tooManyKeys_ = true;
      return false;
    }
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return leave();
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception&) override {
    errorAt_ = position;
    return false;
  }

  bool tooDeep() const { return tooDeep_; }
  bool tooManyKeys() const { return tooManyKeys_; }
  size_t errorAt() const { return errorAt_; }

 private:
  bool enter() {
    if (++depth_ > maxDepth_) {
      tooDeep_ = true;
      return false;
    }
    return true;
  }
  bool leave() {
    --depth_;
    return true;
  }

  int maxDepth_;
  bool ordered_;
  int depth_ = 0;
  bool tooDeep_ = false;
  bool tooManyKeys_ = false;
  std::vector<uint64_t> keys_;  // keys so far of each open object, innermost last
  uint64_t work_ = 0;
  size_t errorAt_ = 0;
};

}  // namespace

namespace {

// The depth and syntax check shared by both parsers (and the keys' bound, for the ordered one).
Status checkJson(std::string_view text, std::string_view what, int maxDepth, bool ordered) {
  DepthCheck check(maxDepth, ordered);
  const bool ok = json::sax_parse(text, &check, json::input_format_t::json, /*strict=*/true);
  if (check.tooDeep()) {
    return invalidArgumentError(std::string(what) + " nests deeper than " +
                                std::to_string(maxDepth) + " levels");
  }
  if (check.tooManyKeys()) {
    return invalidArgumentError(std::string(what) +
                                " has objects of too many keys (one of at most " +
                                std::to_string(kMaxOrderedObjectKeys) + ", or fewer in several)");
  }
  if (!ok) {
    return invalidArgumentError(std::string(what) + " is not valid JSON (at byte " +
                                std::to_string(check.errorAt()) + ")");
  }
  return okStatus();
}

}  // namespace

StatusOr<nlohmann::ordered_json> parseOrderedJson(std::string_view text, std::string_view what,
                                                  int maxDepth, bool boundKeys) {
  TG_RETURN_IF_ERROR(checkJson(text, what, maxDepth, /*ordered=*/boundKeys));
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

StatusOr<json> parseJson(std::string_view text, std::string_view what, int maxDepth) {
  TG_RETURN_IF_ERROR(checkJson(text, what, maxDepth, /*ordered=*/false));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

}  // namespace textgen
