// Vocabulary, TokenIndex and Matcher: per-state token masks from a walk of the vocabulary's byte
// trie through the automaton, memoized under a memory budget.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <mutex>

#include "dfa_grammar.h"
#include "fmt/core.h"
#include "textgen/grammar/grammar.h"
#include "token_trie.h"

namespace textgen::grammar {
namespace {

class VocabularyImpl final : public Vocabulary {
 public:
  VocabularyImpl(std::vector<std::optional<std::string>> bytes, std::vector<uint32_t> eos)
      : bytes_(std::move(bytes)), eos_(std::move(eos)), isEos_(bytes_.size(), 0) {
    for (uint32_t id : eos_) {
      if (id < isEos_.size()) isEos_[id] = 1;
    }
  }
  size_t size() const override { return bytes_.size(); }
  const std::vector<uint32_t>& eosIds() const override { return eos_; }
  const std::optional<std::string>& bytes(uint32_t id) const override {
    static const std::optional<std::string> kNone;
    return id < bytes_.size() ? bytes_[id] : kNone;
  }
  const std::vector<uint8_t>& isEos() const { return isEos_; }
  // Built on first use and shared by every index over this vocabulary.
  const TokenTrie& trie() const {
    std::call_once(trieOnce_, [&] { trie_ = TokenTrie::build(bytes_, isEos_); });
    return trie_;
  }

 private:
  std::vector<std::optional<std::string>> bytes_;
  std::vector<uint32_t> eos_;
  std::vector<uint8_t> isEos_;
  mutable std::once_flag trieOnce_;
  mutable TokenTrie trie_;
};

// A token's bytes for an error message: printable ASCII as is, the rest as \xHH.
std::string quoteBytes(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s.substr(0, 64)) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > 64) out += "...";
  return out + "\"";
}

// One state's allowed tokens, in whichever form is smallest.
struct Mask {
  enum class Form : uint8_t { kBits, kAllowed, kDisallowed };
  Form form = Form::kBits;
  std::vector<uint32_t> data;  // kBits: the words; otherwise sorted ids
  size_t bytes() const { return data.size() * sizeof(uint32_t) + sizeof(Mask); }
};

// Cached masks per TokenIndex; past it the least recently used are dropped (and recomputed if
// needed again). 32 MiB holds 2048 masks as bitsets of a 128k vocabulary (any JSON value, the
// largest grammar of the bench, has 1443 states); the shard keeps 32 indexes: 1 GiB at most.
constexpr size_t kMaskBudgetBytes = size_t{32} << 20;

}  // namespace

struct TokenIndex::Impl {
  const Vocabulary* vocab = nullptr;
  const Grammar* grammar = nullptr;
  const Dfa* dfa = nullptr;  // the table when the grammar is ours (fast path)
  std::shared_ptr<const TokenTrie> ownTrie;
  const TokenTrie* trie = nullptr;
  std::vector<uint8_t> isEos;
  size_t words = 0;

  struct Slot {
    std::shared_ptr<const Mask> mask;
    uint64_t lastUse = 0;
  };
  mutable std::mutex mu;
  mutable std::vector<Slot> slots;
  mutable size_t cachedBytes = 0;
  mutable uint64_t clock = 0;

  int32_t step(int32_t state, uint8_t b) const {
    if (dfa) return dfa->next[static_cast<size_t>(state) * dfa->numClasses + dfa->byteClass[b]];
    return grammar->next(state, b);
  }

  // The walk of the trie from `state`: a bitset of the tokens whose bytes the automaton accepts.
  std::shared_ptr<const Mask> compute(int32_t state) const {
    std::vector<uint32_t> bits(words, 0);
    const TokenTrie& t = *trie;
    std::vector<int32_t> at(t.maxDepth + 1);
    at[0] = state;
    const uint32_t n = static_cast<uint32_t>(t.numNodes());
    size_t count = 0;
    for (uint32_t i = 0; i < n;) {
      const int32_t s = step(at[t.depth[i] - 1], t.byte[i]);
      if (s == Grammar::kDead) {
        i = t.subtreeEnd[i];
        continue;
      }
      at[t.depth[i]] = s;
      for (uint32_t k = t.tokenBegin[i]; k < t.tokenBegin[i + 1]; ++k) {
        const uint32_t id = t.tokens[k];
        bits[id >> 5] |= 1u << (id & 31);
        ++count;
      }
      ++i;
    }
    // EOS: in accepting states, and as the one way out where nothing else fits.
    if (grammar->accepting(state) || count == 0) {
      for (size_t id = 0; id < isEos.size(); ++id) {
        if (isEos[id]) {
          bits[id >> 5] |= 1u << (id & 31);
          ++count;
        }
      }
    }
    auto m = std::make_shared<Mask>();
    const size_t size = vocab->size();
    if (count < words) {
      m->form = Mask::Form::kAllowed;
      forEachBit(bits, [&](uint32_t id) { m->data.push_back(id); });
    } else if (size - count < words) {
      m->form = Mask::Form::kDisallowed;
      for (uint32_t id = 0; id < size; ++id) {
        if (!(bits[id >> 5] >> (id & 31) & 1)) m->data.push_back(id);
      }
    } else {
      m->data = std::move(bits);
    }
    return m;
  }

  template <typename Fn>
  static void forEachBit(const std::vector<uint32_t>& bits, Fn&& fn) {
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint32_t x = bits[w]; x; x &= x - 1)
        fn(static_cast<uint32_t>(w * 32 + std::countr_zero(x)));
    }
  }

  std::shared_ptr<const Mask> mask(int32_t state) const {
    {
      std::lock_guard<std::mutex> lock(mu);
      Slot& slot = slots[state];
      if (slot.mask) {
        slot.lastUse = ++clock;
        return slot.mask;
      }
    }
    std::shared_ptr<const Mask> m = compute(state);  // outside the lock; a race computes twice
    std::lock_guard<std::mutex> lock(mu);
    Slot& slot = slots[state];
    if (slot.mask) return slot.mask;
    slot.mask = m;
    slot.lastUse = ++clock;
    cachedBytes += m->bytes();
    if (cachedBytes > kMaskBudgetBytes) evict(state);
    return m;
  }

  // Drops the least recently used masks (never `keep`) until three quarters of the budget.
  void evict(int32_t keep) const {
    std::vector<std::pair<uint64_t, int32_t>> used;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].mask && static_cast<int32_t>(s) != keep)
        used.push_back({slots[s].lastUse, static_cast<int32_t>(s)});
    }
    std::sort(used.begin(), used.end());
    for (auto [use, s] : used) {
      if (cachedBytes <= kMaskBudgetBytes / 4 * 3) break;
      cachedBytes -= slots[s].mask->bytes();
      slots[s].mask.reset();
    }
  }

  void write(const Mask& m, std::span<uint32_t> out) const {
    switch (m.form) {
      case Mask::Form::kBits: std::memcpy(out.data(), m.data.data(), words * 4); break;
      case Mask::Form::kAllowed:
        std::memset(out.data(), 0, words * 4);
        for (uint32_t id : m.data) out[id >> 5] |= 1u << (id & 31);
        break;
      case Mask::Form::kDisallowed: {
        std::memset(out.data(), 0xFF, words * 4);
        const size_t size = vocab->size();
        if (size % 32) out[words - 1] = (1u << (size % 32)) - 1;
        for (uint32_t id : m.data) out[id >> 5] &= ~(1u << (id & 31));
        break;
      }
    }
  }

  bool valid(int32_t state) const {
    return state >= 0 && static_cast<size_t>(state) < slots.size();
  }
};

std::shared_ptr<const Vocabulary> Vocabulary::create(
    std::vector<std::optional<std::string>> tokenBytes, std::vector<uint32_t> eosIds) {
  return std::make_shared<VocabularyImpl>(std::move(tokenBytes), std::move(eosIds));
}

TokenIndex::TokenIndex(std::shared_ptr<const Grammar> grammar,
                       std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.vocab = vocab_.get();
  m.grammar = grammar_.get();
  if (auto* d = dynamic_cast<const DfaGrammar*>(grammar_.get())) m.dfa = &d->dfa();
  m.words = vocab_->maskWords();
  m.slots.resize(grammar_->numStates());
  if (auto* v = dynamic_cast<const VocabularyImpl*>(vocab_.get())) {
    m.isEos = v->isEos();
    m.trie = &v->trie();
  } else {
    m.isEos.assign(vocab_->size(), 0);
    for (uint32_t id : vocab_->eosIds()) {
      if (id < m.isEos.size()) m.isEos[id] = 1;
    }
    std::vector<std::optional<std::string>> bytes(vocab_->size());
    for (uint32_t id = 0; id < bytes.size(); ++id) bytes[id] = vocab_->bytes(id);
    m.ownTrie = std::make_shared<TokenTrie>(TokenTrie::build(bytes, m.isEos));
    m.trie = m.ownTrie.get();
  }
}

TokenIndex::~TokenIndex() = default;

void TokenIndex::fillMask(int32_t state, std::span<uint32_t> words) const {
  const Impl& m = *impl_;
  TG_CHECK(words.size() >= m.words, "fillMask: {} words given, {} needed", words.size(), m.words);
  if (!m.valid(state)) {  // no grammar state: only EOS, so that generation can end
    std::memset(words.data(), 0, m.words * 4);
    for (uint32_t id : vocab_->eosIds()) {
      if (id < vocab_->size()) words[id >> 5] |= 1u << (id & 31);
    }
    return;
  }
  m.write(*m.mask(state), words);
}

bool TokenIndex::allows(int32_t state, uint32_t token) const {
  const Impl& m = *impl_;
  if (token >= vocab_->size()) return false;
  if (!m.valid(state)) return m.isEos[token] != 0;
  if (m.isEos[token]) {
    if (grammar_->accepting(state)) return true;
    const Mask& mask = *m.mask(state);
    switch (mask.form) {
      case Mask::Form::kBits: return (mask.data[token >> 5] >> (token & 31)) & 1;
      case Mask::Form::kAllowed:
        return std::binary_search(mask.data.begin(), mask.data.end(), token);
      case Mask::Form::kDisallowed:
        return !std::binary_search(mask.data.begin(), mask.data.end(), token);
    }
  }
  const auto& bytes = vocab_->bytes(token);
  if (!bytes || bytes->empty()) return false;
  int32_t s = state;
  for (char c : *bytes) {
    s = m.step(s, static_cast<uint8_t>(c));
    if (s == Grammar::kDead) return false;
  }
  return true;
}

int32_t TokenIndex::advance(int32_t state, uint32_t token) const {
  if (!allows(state, token)) return Grammar::kDead;
  if (impl_->isEos[token]) return state;
  return grammar_->walk(state, *vocab_->bytes(token));
}

size_t TokenIndex::warm(size_t maxStates, const std::atomic<bool>& stop) const {
  const Impl& m = *impl_;
  const size_t n = m.slots.size();
  std::vector<uint8_t> seen(n, 0);
  std::vector<int32_t> queue;
  const int32_t start = grammar_->start();
  if (!m.valid(start)) return 0;
  queue.push_back(start);
  seen[start] = 1;
  size_t computed = 0;
  for (size_t head = 0; head < queue.size() && head < maxStates; ++head) {
    if (stop.load(std::memory_order_relaxed)) break;
    const int32_t s = queue[head];
    bool had = false;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      had = m.slots[s].mask != nullptr;
      if (m.cachedBytes > kMaskBudgetBytes / 2) break;
    }
    if (!had) {
      m.mask(s);
      ++computed;
    }
    for (int b = 0; b < 256; ++b) {
      const int32_t t = m.step(s, static_cast<uint8_t>(b));
      if (t != Grammar::kDead && !seen[t]) {
        seen[t] = 1;
        queue.push_back(t);
      }
    }
  }
  return computed;
}

bool TokenIndex::isEos(uint32_t token) const {
  return token < impl_->isEos.size() && impl_->isEos[token];
}

Matcher::Matcher(std::shared_ptr<const TokenIndex> index)
    : index_(std::move(index)), state_(index_->grammar().start()) {}

void Matcher::fillMask(std::span<uint32_t> words) const {
  index_->fillMask(ended_ ? Grammar::kDead : state_, words);
}

bool Matcher::allows(uint32_t token) const {
  return !ended_ && index_->allows(state_, token);
}

Status Matcher::accept(uint32_t token) {
  if (ended_) {
    return failedPreconditionError(
        fmt::format("grammar: token {} after the end of the sequence (EOS accepted)", token));
  }
  const int32_t next = index_->advance(state_, token);
  if (next == Grammar::kDead) {
    const auto& bytes = token < index_->vocabulary().size() ? index_->vocabulary().bytes(token)
                                                            : std::optional<std::string>();
    return failedPreconditionError(
        fmt::format("grammar: token {}{} may not come next", token,
                    bytes ? " (" + quoteBytes(*bytes) + ")" : std::string(" (no bytes)")));
  }
  if (index_->isEos(token)) ended_ = true;
  state_ = next;
  return okStatus();
}

bool Matcher::accepting() const {
  return ended_ || index_->grammar().accepting(state_);
}

}  // namespace textgen::grammar
