// A flat open-addressing map from an id pair to a BPE merge (rank, merged id): the BPE inner loop
// looks pairs up constantly, and a node-based std::unordered_map costs a cache miss per lookup.
#pragma once

#include <cstdint>
#include <vector>

namespace textgen::tokenizer {

class PairMap {
 public:
  struct Value {
    uint32_t rank;
    uint32_t newId;
  };

  explicit PairMap(size_t expected = 0) { rehash(expected * 2 + 16); }

  // Later insertions of the same pair replace earlier ones (as Hugging Face's HashMap collect
  // does).
  void insert(uint32_t a, uint32_t b, Value v) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    Slot& s = probe(key(a, b));
    if (s.key == kEmpty) ++size_;
    s = {key(a, b), v};
  }

  const Value* find(uint32_t a, uint32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // (0xffffffff, 0xffffffff): never a real pair
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };

  static uint64_t key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }
  size_t hash(uint64_t k) const {
    return static_cast<size_t>((k * 0x9e3779b97f4a7c15ull) >> shift_);
  }

  Slot& probe(uint64_t k) {
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k || slots_[i].key == kEmpty) return slots_[i];
    }
  }

  void rehash(size_t want) {
    size_t cap = 16;
    int bits = 4;
    while (cap < want) {
      cap *= 2;
      ++bits;
    }
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    shift_ = 64 - bits;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != kEmpty)
        insert(static_cast<uint32_t>(s.key >> 32), static_cast<uint32_t>(s.key), s.value);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 0;
  size_t size_ = 0;
};

}  // namespace textgen::tokenizer
