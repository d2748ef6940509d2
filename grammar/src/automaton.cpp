#include "automaton.h"

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "fmt/core.h"

namespace textgen::grammar {
namespace {

// One UTF-8 encoding path: per position, a byte range.
struct ByteSeq {
  int len = 0;
  std::array<std::pair<uint8_t, uint8_t>, 4> bytes{};
};

int encodeUtf8(char32_t c, uint8_t* out) {
  if (c < 0x80) {
    out[0] = static_cast<uint8_t>(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  return 4;
}

// The byte-range sequences that encode exactly the code points [lo, hi] (surrogates excluded by
// the parser): split where the encoding length changes, then where continuation bytes stop being
// independent, until each piece is a product of byte ranges.
void utf8Sequences(char32_t lo, char32_t hi, std::vector<ByteSeq>& out) {
  std::vector<std::pair<char32_t, char32_t>> stack{{lo, hi}};
  while (!stack.empty()) {
    auto [a, b] = stack.back();
    stack.pop_back();
    bool split = false;
    for (char32_t m : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
      if (a <= m && b > m) {
        stack.push_back({m + 1, b});
        stack.push_back({a, m});
        split = true;
        break;
      }
    }
    for (int i = 1; i < 4 && !split; ++i) {
      const char32_t m = (char32_t{1} << (6 * i)) - 1;
      if ((a & ~m) == (b & ~m)) continue;
      if ((a & m) != 0) {
        stack.push_back({(a | m) + 1, b});
        stack.push_back({a, a | m});
        split = true;
      } else if ((b & m) != m) {
        stack.push_back({b & ~m, b});
        stack.push_back({a, (b & ~m) - 1});
        split = true;
      }
    }
    if (split) continue;
    uint8_t ea[4], eb[4];
    ByteSeq s;
    s.len = encodeUtf8(a, ea);
    encodeUtf8(b, eb);
    for (int i = 0; i < s.len; ++i) s.bytes[i] = {ea[i], eb[i]};
    out.push_back(s);
  }
}

struct NfaState {
  enum Kind : uint8_t { kRange, kSplit, kEps, kMatch, kFail };
  Kind kind;
  uint8_t lo = 0, hi = 0;
  int32_t out = -1, out1 = -1;
};

// Builds the NFA backwards: emit(node, next) returns the start of `node` followed by `next`.
class NfaBuilder {
 public:
  NfaBuilder(const RegexAst& ast, size_t maxStates) : ast_(ast), max_(maxStates) {}

  bool exhausted() const { return exhausted_; }
  std::vector<NfaState>& states() { return states_; }

  int32_t add(NfaState s) {
    if (states_.size() >= max_) {
      exhausted_ = true;
      return 0;
    }
    states_.push_back(s);
    return static_cast<int32_t>(states_.size() - 1);
  }

  int32_t emit(int32_t node, int32_t next) {
    if (exhausted_) return 0;
    const RegexNode& n = ast_.nodes[node];
    switch (n.type) {
      case RegexNode::Type::kEmpty: return next;
      case RegexNode::Type::kClass: return emitClass(n, next);
      case RegexNode::Type::kConcat:
        for (size_t i = n.children.size(); i-- > 0 && !exhausted_;)
          next = emit(n.children[i], next);
        return next;
      case RegexNode::Type::kAlt: {
        int32_t s = emit(n.children[0], next);
        for (size_t i = 1; i < n.children.size() && !exhausted_; ++i) {
          const int32_t other = emit(n.children[i], next);
          s = add({NfaState::kSplit, 0, 0, other, s});
        }
        return s;
      }
      case RegexNode::Type::kRepeat: return emitRepeat(n, next);
    }
    return next;
  }

 private:
  int32_t emitRepeat(const RegexNode& n, int32_t next) {
    const int32_t child = n.children[0];
    const int32_t exit = next;
    if (n.max < 0) {
      const int32_t loop = add({NfaState::kSplit, 0, 0, -1, exit});
      const int32_t body = emit(child, loop);
      if (exhausted_) return 0;
      states_[loop].out = body;
      next = loop;
    } else {
      // X{0,k} nested as (X(X(...)?)?)?: each optional copy either goes on or leaves.
      for (int32_t i = n.min; i < n.max && !exhausted_; ++i) {
        const int32_t body = emit(child, next);
        next = add({NfaState::kSplit, 0, 0, body, exit});
      }
    }
    for (int32_t i = 0; i < n.min && !exhausted_; ++i) next = emit(child, next);
    return next;
  }

  int32_t emitClass(const RegexNode& n, int32_t next) {
    std::vector<ByteSeq> seqs;
    for (auto [lo, hi] : n.ranges) utf8Sequences(lo, hi, seqs);
    if (seqs.empty()) return add({NfaState::kFail});
    // Share suffixes: the same (range, successor) is one state.
    std::map<std::tuple<uint8_t, uint8_t, int32_t>, int32_t> shared;
    int32_t s = -1;
    for (const ByteSeq& q : seqs) {
      int32_t cur = next;
      for (int i = q.len; i-- > 0 && !exhausted_;) {
        auto key = std::make_tuple(q.bytes[i].first, q.bytes[i].second, cur);
        auto it = shared.find(key);
        if (it != shared.end()) {
          cur = it->second;
          continue;
        }
        const int32_t st = add({NfaState::kRange, q.bytes[i].first, q.bytes[i].second, cur, -1});
        shared.emplace(key, st);
        cur = st;
      }
      s = s < 0 ? cur : add({NfaState::kSplit, 0, 0, cur, s});
    }
    return s;
  }

  const RegexAst& ast_;
  size_t max_;
  std::vector<NfaState> states_;
  bool exhausted_ = false;
};

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

class SubsetBuilder {
 public:
  SubsetBuilder(const std::vector<NfaState>& nfa, const Limits& limits)
      : nfa_(nfa), limits_(limits), mark_(nfa.size(), 0) {}

  StatusOr<Dfa> build(int32_t nfaStart) {
    computeClasses();
    const size_t maxEntries = std::min<size_t>(limits_.maxDfaStates * 512, size_t{1} << 24);
    std::vector<int32_t> seed{nfaStart};
    closure(seed);
    intern(std::move(seed));
    std::vector<std::vector<int32_t>> buckets(dfa_.numClasses);
    auto overWorked = [&] {
      return resourceExhaustedError(
          fmt::format("grammar: building the automaton takes more than maxCompileWork ({} steps)",
                      limits_.maxCompileWork));
    };
    for (size_t d = 0; d < sets_.size(); ++d) {
      for (auto& b : buckets) b.clear();
      for (int32_t s : *sets_[d]) {
        const NfaState& st = nfa_[s];
        if (st.kind != NfaState::kRange) continue;
        for (int c = clsOf_[st.lo]; c <= clsOf_[st.hi]; ++c) buckets[c].push_back(st.out);
        work_ += clsOf_[st.hi] - clsOf_[st.lo] + 1;
      }
      if (work_ > limits_.maxCompileWork) return overWorked();
      const std::vector<int32_t>* prevBucket = nullptr;
      int32_t prevTarget = Grammar::kDead;
      for (int c = 0; c < dfa_.numClasses; ++c) {
        int32_t target = Grammar::kDead;
        work_ += buckets[c].size();
        if (prevBucket && *prevBucket == buckets[c]) {
          target = prevTarget;
        } else if (!buckets[c].empty()) {
          std::vector<int32_t> set = buckets[c];
          closure(set);
          if (work_ > limits_.maxCompileWork) return overWorked();
          if (!set.empty()) {
            target = intern(std::move(set));
            if (sets_.size() > limits_.maxDfaStates) {
              return resourceExhaustedError(
                  fmt::format("grammar: the automaton needs more than maxDfaStates ({}) states",
                              limits_.maxDfaStates));
            }
            if (entries_ > maxEntries) {
              return resourceExhaustedError(fmt::format(
                  "grammar: the automaton's construction exceeds its work bound ({} NFA-state "
                  "entries, from maxDfaStates)",
                  maxEntries));
            }
          }
        }
        prevBucket = &buckets[c];
        prevTarget = target;
        dfa_.next.push_back(target);
      }
    }
    return std::move(dfa_);
  }

 private:
  void computeClasses() {
    std::array<bool, 257> boundary{};
    for (const NfaState& s : nfa_) {
      if (s.kind != NfaState::kRange) continue;
      boundary[s.lo] = true;
      boundary[s.hi + 1] = true;
    }
    int cls = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && boundary[b]) ++cls;
      clsOf_[b] = static_cast<uint8_t>(cls);
    }
    dfa_.byteClass = clsOf_;
    dfa_.numClasses = cls + 1;
  }

  // Replaces `set` (seed states) by the sorted range/match states reachable through epsilons.
  void closure(std::vector<int32_t>& set) {
    ++gen_;
    stack_.assign(set.begin(), set.end());
    set.clear();
    while (!stack_.empty()) {
      const int32_t s = stack_.back();
      stack_.pop_back();
      ++work_;
      if (s < 0 || mark_[s] == gen_) continue;
      mark_[s] = gen_;
      const NfaState& st = nfa_[s];
      switch (st.kind) {
        case NfaState::kRange:
        case NfaState::kMatch: set.push_back(s); break;
        case NfaState::kSplit:
          stack_.push_back(st.out1);
          stack_.push_back(st.out);
          break;
        case NfaState::kEps: stack_.push_back(st.out); break;
        case NfaState::kFail: break;
      }
    }
    std::sort(set.begin(), set.end());
    work_ += set.size();
  }

  int32_t intern(std::vector<int32_t> set) {
    auto [it, inserted] = ids_.try_emplace(std::move(set), static_cast<int32_t>(sets_.size()));
    if (inserted) {
      entries_ += it->first.size();
      sets_.push_back(&it->first);
      bool acc = false;
      for (int32_t s : it->first) acc = acc || nfa_[s].kind == NfaState::kMatch;
      dfa_.accepting.push_back(acc ? 1 : 0);
    }
    return it->second;
  }

  const std::vector<NfaState>& nfa_;
  const Limits& limits_;
  std::array<uint8_t, 256> clsOf_{};
  std::vector<uint32_t> mark_;
  uint32_t gen_ = 0;
  size_t work_ = 0;  // closure steps and bucket entries, against Limits::maxCompileWork
  std::vector<int32_t> stack_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids_;
  std::vector<const std::vector<int32_t>*> sets_;
  size_t entries_ = 0;
  Dfa dfa_;
};

// Keeps the states from which acceptance is reachable; renumbers them with start first.
Status trim(Dfa& dfa) {
  const size_t n = dfa.numStates();
  const int32_t k = dfa.numClasses;
  std::vector<std::vector<int32_t>> preds(n);
  for (size_t s = 0; s < n; ++s) {
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      if (t >= 0 && (preds[t].empty() || preds[t].back() != static_cast<int32_t>(s)))
        preds[t].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s) {
    if (dfa.accepting[s]) {
      live[s] = 1;
      stack.push_back(static_cast<int32_t>(s));
    }
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : preds[s]) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  if (!live[dfa.start]) return invalidArgumentError("grammar: the pattern matches no text at all");
  // Renumber in BFS order from start (only live states reachable from start survive).
  std::vector<int32_t> id(n, -1);
  std::vector<int32_t> order{dfa.start};
  id[dfa.start] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      if (t >= 0 && live[t] && id[t] < 0) {
        id[t] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    }
  }
  std::vector<int32_t> next(order.size() * k, Grammar::kDead);
  std::vector<uint8_t> acc(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = order[i];
    acc[i] = dfa.accepting[s];
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      next[i * k + c] = t >= 0 ? id[t] : Grammar::kDead;
    }
  }
  dfa.next = std::move(next);
  dfa.accepting = std::move(acc);
  dfa.start = 0;
  return okStatus();
}

// Moore's partition refinement, skipped (the DFA stays as it is, still correct) when its work
// would pass a fixed bound.
void minimize(Dfa& dfa) {
  const size_t n = dfa.numStates();
  const int32_t k = dfa.numClasses;
  constexpr size_t kMaxWork = size_t{1} << 26;
  std::vector<int32_t> block(n);
  for (size_t s = 0; s < n; ++s) block[s] = dfa.accepting[s];
  size_t numBlocks = 0, work = 0;
  std::vector<int32_t> key(k + 1);
  while (true) {
    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
    std::vector<int32_t> nextBlock(n);
    for (size_t s = 0; s < n; ++s) {
      key[0] = block[s];
      for (int32_t c = 0; c < k; ++c) {
        const int32_t t = dfa.next[s * k + c];
        key[c + 1] = t >= 0 ? block[t] : -1;
      }
      nextBlock[s] = ids.try_emplace(key, static_cast<int32_t>(ids.size())).first->second;
    }
    work += n * (k + 1);
    const bool stable = ids.size() == numBlocks;
    numBlocks = ids.size();
    block = std::move(nextBlock);
    if (stable) break;
    if (work > kMaxWork) return;
  }
  if (numBlocks == n) return;
  // Renumber blocks with the start's block first, in BFS order.
  std::vector<int32_t> rep(numBlocks, -1);
  for (size_t s = 0; s < n; ++s) {
    if (rep[block[s]] < 0) rep[block[s]] = static_cast<int32_t>(s);
  }
  std::vector<int32_t> id(numBlocks, -1);
  std::vector<int32_t> order{block[dfa.start]};
  id[block[dfa.start]] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = rep[order[i]];
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      if (t >= 0 && id[block[t]] < 0) {
        id[block[t]] = static_cast<int32_t>(order.size());
        order.push_back(block[t]);
      }
    }
  }
  std::vector<int32_t> next(order.size() * k, Grammar::kDead);
  std::vector<uint8_t> acc(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t s = rep[order[i]];
    acc[i] = dfa.accepting[s];
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      next[i * k + c] = t >= 0 ? id[block[t]] : Grammar::kDead;
    }
  }
  dfa.next = std::move(next);
  dfa.accepting = std::move(acc);
  dfa.start = 0;
}

}  // namespace

StatusOr<Dfa> buildDfa(const RegexAst& ast, const Limits& limits) {
  NfaBuilder nfa(ast, limits.maxNfaStates);
  const int32_t match = nfa.add({NfaState::kMatch});
  const int32_t start = nfa.emit(ast.root, match);
  if (nfa.exhausted()) {
    return resourceExhaustedError(fmt::format(
        "grammar: the pattern needs more than maxNfaStates ({}) NFA states", limits.maxNfaStates));
  }
  SubsetBuilder subset(nfa.states(), limits);
  TG_ASSIGN_OR_RETURN(Dfa dfa, subset.build(start));
  TG_RETURN_IF_ERROR(trim(dfa));
  minimize(dfa);
  return dfa;
}

}  // namespace textgen::grammar
