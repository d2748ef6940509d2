// GrammarCache: compiled grammars and their token indexes by (kind, source), least recently used
// dropped past the capacity; failed compiles are remembered too. Compiles run outside the lock; two
// threads compiling the same source at once both compile and the first to finish is kept.
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "textgen/grammar/grammar.h"

namespace textgen::grammar {

struct GrammarCache::Impl {
  struct Entry {
    std::string key;
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const TokenIndex> index;
  };
  std::shared_ptr<const Vocabulary> vocab;
  size_t capacity;
  Limits limits;
  std::mutex mu;
  std::list<Entry> lru;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> byKey;
  // Compiles that failed, by key: a hostile grammar resent costs a lookup, not another compile up
  // to the limits. Forgotten all at once past kMaxFailed entries.
  static constexpr size_t kMaxFailed = 1024;
  std::unordered_map<std::string, Status> failed;

  static std::string keyOf(Kind kind, std::string_view source) {
    std::string k(1, kind == Kind::kRegex ? 'r' : 'j');
    k.append(source);
    return k;
  }

  // The entry, moved to the front; nullptr when absent. Holds mu.
  Entry* find(const std::string& key) {
    auto it = byKey.find(key);
    if (it == byKey.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    return &*it->second;
  }

  Entry* insert(std::string key, std::shared_ptr<const Grammar> g) {
    if (Entry* e = find(key)) return e;
    lru.push_front({key, std::move(g), nullptr});
    byKey.emplace(std::move(key), lru.begin());
    while (lru.size() > capacity && lru.size() > 1) {
      byKey.erase(lru.back().key);
      lru.pop_back();
    }
    return &lru.front();
  }
};

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t capacity, Limits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->vocab = std::move(vocab);
  impl_->capacity = std::max<size_t>(capacity, 1);
  impl_->limits = limits;
}

GrammarCache::~GrammarCache() = default;

StatusOr<std::shared_ptr<const Grammar>> GrammarCache::grammar(Kind kind, std::string_view source) {
  Impl& m = *impl_;
  std::string key = Impl::keyOf(kind, source);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (Impl::Entry* e = m.find(key)) return e->grammar;
    if (auto f = m.failed.find(key); f != m.failed.end()) return f->second;
  }
  auto g = Grammar::compile(kind, source, m.limits);
  std::lock_guard<std::mutex> lock(m.mu);
  if (!g.ok()) {
    if (m.failed.size() >= Impl::kMaxFailed) m.failed.clear();
    m.failed.emplace(std::move(key), g.status());
    return g.status();
  }
  return m.insert(std::move(key), std::move(*g))->grammar;
}

StatusOr<std::shared_ptr<const TokenIndex>> GrammarCache::index(Kind kind,
                                                                std::string_view source) {
  Impl& m = *impl_;
  if (!m.vocab) return failedPreconditionError("grammar cache: no vocabulary to index against");
  TG_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, grammar(kind, source));
  std::string key = Impl::keyOf(kind, source);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    Impl::Entry* e = m.find(key);
    if (e && e->index && e->grammar == g) return e->index;
  }
  auto index = std::make_shared<const TokenIndex>(g, m.vocab);
  std::lock_guard<std::mutex> lock(m.mu);
  Impl::Entry* e = m.insert(std::move(key), g);
  if (!e->index && e->grammar == g) e->index = index;
  return e->index && e->grammar == g ? e->index : index;
}

}  // namespace textgen::grammar
