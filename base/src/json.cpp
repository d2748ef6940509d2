#include "textgen/base/json.h"

namespace textgen {
namespace {

using nlohmann::json;

// A SAX pass that only counts nesting: it stops at the first container past the bound, before
// anything is allocated for it.
class DepthCheck final : public nlohmann::json_sax<json> {
 public:
  explicit DepthCheck(int maxDepth) : maxDepth_(maxDepth) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception&) override {
    errorAt_ = position;
    return false;
  }

  bool tooDeep() const { return tooDeep_; }
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
  int depth_ = 0;
  bool tooDeep_ = false;
  size_t errorAt_ = 0;
};

}  // namespace

namespace {

// The depth and syntax check shared by both parsers.
Status checkJson(std::string_view text, std::string_view what, int maxDepth) {
  DepthCheck check(maxDepth);
  const bool ok = json::sax_parse(text, &check, json::input_format_t::json, /*strict=*/true);
  if (check.tooDeep()) {
    return invalidArgumentError(std::string(what) + " nests deeper than " +
                                std::to_string(maxDepth) + " levels");
  }
  if (!ok) {
    return invalidArgumentError(std::string(what) + " is not valid JSON (at byte " +
                                std::to_string(check.errorAt()) + ")");
  }
  return okStatus();
}

}  // namespace

StatusOr<nlohmann::ordered_json> parseOrderedJson(std::string_view text, std::string_view what,
                                                  int maxDepth) {
  TG_RETURN_IF_ERROR(checkJson(text, what, maxDepth));
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

StatusOr<json> parseJson(std::string_view text, std::string_view what, int maxDepth) {
  TG_RETURN_IF_ERROR(checkJson(text, what, maxDepth));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgumentError(std::string(what) + " is not valid JSON");
  return j;
}

}  // namespace textgen
