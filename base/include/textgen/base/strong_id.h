// StrongId<Tag>: an integer id that does not mix with other ids or plain integers.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace textgen {

template <typename Tag, typename Rep = uint64_t>
class StrongId {
 public:
  using RepType = Rep;

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(value) {}

  constexpr Rep value() const { return value_; }

  friend constexpr auto operator<=>(const StrongId&, const StrongId&) = default;

 private:
  Rep value_{};
};

// The ids that cross module boundaries. The router allocates all of them; shards only echo them.
using RequestId = StrongId<struct RequestIdTag>;        // one client request (one sequence)
using BatchId = StrongId<struct BatchIdTag>;            // a batch cached on the shards
using BlockId = StrongId<struct BlockIdTag, uint32_t>;  // one page of the paged KV cache
using SlotId = StrongId<struct SlotIdTag, uint32_t>;    // one token position in the KV cache

}  // namespace textgen

template <typename Tag, typename Rep>
struct std::hash<textgen::StrongId<Tag, Rep>> {
  size_t operator()(const textgen::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>{}(id.value());
  }
};
