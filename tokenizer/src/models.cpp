// Models: BPE, Unigram, WordLevel.
#include <cmath>
#include <limits>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "components.h"
#include "pair_map.h"
#include "unicode.h"
#include "vocab.h"

namespace textgen::tokenizer {
namespace {

std::string byteToken(unsigned char b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

StatusOr<VocabMap> parseVocabObject(const Json& j, const std::string& path) {
  auto it = j.find("vocab");
  if (it == j.end() || !it->is_object()) return jsonError(path, "missing object field 'vocab'");
  VocabMap vocab;
  vocab.reserve(it->size());
  for (auto e = it->begin(); e != it->end(); ++e) {
    if (!e.value().is_number_unsigned() || e.value().get<uint64_t>() >= kMaxTokenId) {
      return jsonError(
          childPath(path, "vocab"),
          "id of '" + e.key() + "' is not an integer in [0, " + std::to_string(kMaxTokenId) + ")");
    }
    vocab.emplace(e.key(), e.value().get<uint32_t>());
  }
  return vocab;
}

// ---------------------------------------------------------------------------------------------
// BPE

class BpeModel final : public Model {
 public:
  struct Options {
    std::optional<std::string> unkToken;
    std::string continuingSubwordPrefix;
    std::string endOfWordSuffix;
    bool fuseUnk = false;
    bool byteFallback = false;
    bool ignoreMerges = false;
    // No merge joins a symbol that ends in a character other than U+2581 (SentencePiece's space,
    // "▁") to one that starts with it (makeBpe checks the merges).
    bool noMergeBeforeSpace = false;
  };

  BpeModel(VocabMap vocab, PairMap merges, Options options)
      : vocab_(std::move(vocab)), merges_(std::move(merges)), options_(std::move(options)) {
    reverse_.build(vocab_);
    if (options_.byteFallback) {
      for (int b = 0; b < 256; ++b)
        byteIds_[b] = lookup(vocab_, byteToken(static_cast<unsigned char>(b)));
    }
    // SentencePiece-style BPE (Llama 2, Mistral) gets a whole normalised text as one word, and
    // merging it costs a queue over every character. When no merge can join across the place where
    // a "▁" follows another character, no merge ever does, so the word's parts between such places
    // merge alone to the same tokens, and a part repeated (most words) comes from the cache.
    // Merges by rank, unknown runs and byte fallback never cross the boundary ("▁" itself is a
    // token, so an unknown run ends before it). Not with ignore_merges (the whole word's vocabulary
    // look-up is not its parts') or subword prefixes and suffixes.
    splitAtSpaces_ = options_.noMergeBeforeSpace && !options_.ignoreMerges &&
                     options_.continuingSubwordPrefix.empty() && options_.endOfWordSuffix.empty() &&
                     lookup(vocab_, kSpace).has_value();
  }

  Status tokenize(std::string_view piece, std::vector<Token>& out) const override {
    if (piece.empty()) return okStatus();
    if (options_.ignoreMerges) {
      if (auto id = lookup(vocab_, piece)) {
        out.push_back({*id, std::string(piece), {0, static_cast<uint32_t>(piece.size())}});
        return okStatus();
      }
    }
    if (!splitAtSpaces_) return tokenizeWord(piece, 0, out);
    // The parts start where a "▁" follows another character, walked as mergeWord walks them.
    size_t start = 0, len;
    bool previousSpace = false;
    for (size_t i = 0; i < piece.size(); i += len) {
      len = utf8SequenceLength(static_cast<unsigned char>(piece[i]));
      const bool space = piece.compare(i, len, kSpace) == 0;
      if (space && !previousSpace && i > start) {
        TG_RETURN_IF_ERROR(tokenizeWord(piece.substr(start, i - start), start, out));
        start = i;
      }
      previousSpace = space;
    }
    return tokenizeWord(piece.substr(start), start, out);
  }

  std::optional<uint32_t> tokenToId(std::string_view token) const override {
    return lookup(vocab_, token);
  }
  const std::string* idToToken(uint32_t id) const override { return reverse_.get(id); }
  size_t vocabSize() const override { return vocab_.size(); }

 private:
  static constexpr size_t kMaxCachedLength = 256;
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

  // One word (or part of one), its tokens' offsets counted from `base`.
  Status tokenizeWord(std::string_view piece, uint32_t base, std::vector<Token>& out) const {
    const bool cacheable = piece.size() < kMaxCachedLength;
    if (cacheable) {
      std::shared_lock lock(cacheMutex_);
      if (auto it = cache_.find(piece); it != cache_.end()) {
        emit(it->second, base, out);
        return okStatus();
      }
    }
    std::vector<Symbol> word;
    TG_RETURN_IF_ERROR(mergeWord(piece, word));
    if (cacheable) {
      std::unique_lock lock(cacheMutex_);
      if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(piece), word);
    }
    emit(word, base, out);
    return okStatus();
  }

  struct Symbol {
    uint32_t id;
    int prev;
    int next;
    uint32_t len;  // bytes of the piece covered; 0 once merged away
  };

  void emit(const std::vector<Symbol>& word, uint32_t base, std::vector<Token>& out) const {
    uint32_t offset = base;
    for (const Symbol& s : word) {
      const std::string* value = reverse_.get(s.id);
      out.push_back({s.id, value ? *value : std::string(), {offset, offset + s.len}});
      offset += s.len;
    }
  }

  void add(std::vector<Symbol>& word, uint32_t id, uint32_t len) const {
    const int index = static_cast<int>(word.size());
    word.push_back({id, index - 1, -1, len});
    if (index > 0) word[index - 1].next = index;
  }

  Status mergeWord(std::string_view w, std::vector<Symbol>& word) const {
    word.reserve(w.size());
    bool hasUnk = false;  // an unknown run is pending (GCC 12 warns falsely on optional here)
    uint32_t unkId = 0, unkLen = 0;
    std::string s;
    size_t len;
    for (size_t i = 0; i < w.size(); i += len) {
      len = utf8SequenceLength(static_cast<unsigned char>(w[i]));
      const bool isFirst = i == 0;
      const bool isLast = i + len >= w.size();
      s.clear();
      if (!isFirst) s += options_.continuingSubwordPrefix;
      s.append(w, i, len);
      if (isLast) s += options_.endOfWordSuffix;
      if (auto id = lookup(vocab_, s)) {
        if (hasUnk) {
          add(word, unkId, unkLen);
          hasUnk = false;
        }
        add(word, *id, static_cast<uint32_t>(len));
        continue;
      }
      if (options_.byteFallback) {
        bool all = true;
        for (unsigned char b : s) all &= byteIds_[b].has_value();
        if (all) {
          for (unsigned char b : s) add(word, *byteIds_[b], 1);
          continue;
        }
      }
      if (options_.unkToken) {
        if (hasUnk && options_.fuseUnk) {
          unkLen += static_cast<uint32_t>(len);
        } else {
          if (hasUnk) add(word, unkId, unkLen);
          auto id = lookup(vocab_, *options_.unkToken);
          if (!id)
            return invalidArgumentError("BPE: unk_token '" + *options_.unkToken +
                                        "' is not in the vocabulary");
          hasUnk = true;
          unkId = *id;
          unkLen = static_cast<uint32_t>(len);
        }
      }
    }
    if (hasUnk) add(word, unkId, unkLen);
    mergeAll(word);
    return okStatus();
  }

  const PairMap::Value* findMerge(uint32_t a, uint32_t b) const { return merges_.find(a, b); }

  // Applies merges lowest rank first, leftmost first among equal ranks (Hugging Face's order).
  void mergeAll(std::vector<Symbol>& word) const {
    struct Candidate {
      uint32_t rank;
      int pos;
      uint32_t newId;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      if (auto m = findMerge(word[i].id, word[i + 1].id))
        queue.push({m->rank, static_cast<int>(i), m->newId});
    }
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = word[top.pos];
      if (left.len == 0 || left.next == -1) continue;
      const int nextPos = left.next;
      const Symbol right = word[nextPos];
      const auto* m = findMerge(left.id, right.id);
      if (!m || m->newId != top.newId) continue;  // stale entry
      left.id = top.newId;
      left.len += right.len;
      left.next = right.next;
      word[nextPos].len = 0;
      if (right.next >= 0) word[right.next].prev = top.pos;
      if (left.prev >= 0) {
        if (auto pm = findMerge(word[left.prev].id, left.id))
          queue.push({pm->rank, left.prev, pm->newId});
      }
      if (left.next >= 0) {
        if (auto nm = findMerge(left.id, word[left.next].id))
          queue.push({nm->rank, top.pos, nm->newId});
      }
    }
    std::erase_if(word, [](const Symbol& s) { return s.len == 0; });
  }

  VocabMap vocab_;
  ReverseVocab reverse_;
  PairMap merges_;  // (a, b) -> (rank, merged id)
  Options options_;
  bool splitAtSpaces_ = false;
  std::optional<uint32_t> byteIds_[256];
  mutable std::shared_mutex cacheMutex_;
  mutable std::unordered_map<std::string, std::vector<Symbol>, StringHash, std::equal_to<>> cache_;
};

StatusOr<std::unique_ptr<Model>> makeBpe(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(VocabMap vocab, parseVocabObject(j, path));
  BpeModel::Options o;
  if (auto it = j.find("unk_token"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return jsonError(childPath(path, "unk_token"), "expected a string");
    o.unkToken = it->get<std::string>();
  }
  TG_ASSIGN_OR_RETURN(o.continuingSubwordPrefix,
                      getStringOr(j, path, "continuing_subword_prefix", ""));
  TG_ASSIGN_OR_RETURN(o.endOfWordSuffix, getStringOr(j, path, "end_of_word_suffix", ""));
  TG_ASSIGN_OR_RETURN(o.fuseUnk, getBoolOr(j, path, "fuse_unk", false));
  TG_ASSIGN_OR_RETURN(o.byteFallback, getBoolOr(j, path, "byte_fallback", false));
  TG_ASSIGN_OR_RETURN(o.ignoreMerges, getBoolOr(j, path, "ignore_merges", false));
  if (auto it = j.find("dropout"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) return jsonError(childPath(path, "dropout"), "expected a number");
    if (it->get<double>() > 0.0) {
      return unimplementedError("tokenizer.json " + childPath(path, "dropout") +
                                ": BPE dropout is a training feature and is not supported");
    }
  }
  TG_ASSIGN_OR_RETURN(const Json* merges, getArray(j, path, "merges"));
  const std::string mergesPath = childPath(path, "merges");
  const size_t prefixLen = o.continuingSubwordPrefix.size();
  PairMap mergeMap(merges->size());
  o.noMergeBeforeSpace = true;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    std::string a, b;
    if (m.is_string()) {  // legacy "a b"
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return jsonError(childPath(mergesPath, i),
                         "merge '" + s + "' is not two tokens separated by one space");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return jsonError(childPath(mergesPath, i), "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto aId = lookup(vocab, a), bId = lookup(vocab, b);
    if (!aId || !bId) {
      return jsonError(childPath(mergesPath, i),
                       "merge token '" + (!aId ? a : b) + "' is not in the vocabulary");
    }
    if (b.size() < prefixLen)
      return jsonError(childPath(mergesPath, i), "merge token shorter than the subword prefix");
    const std::string merged = a + b.substr(prefixLen);
    auto newId = lookup(vocab, merged);
    if (!newId)
      return jsonError(childPath(mergesPath, i),
                       "merged token '" + merged + "' is not in the vocabulary");
    mergeMap.insert(*aId, *bId, {static_cast<uint32_t>(i), *newId});
    const bool aEndsInSpace = a.size() >= kSpace.size() && a.ends_with(kSpace);
    if (!aEndsInSpace && b.starts_with(kSpace)) o.noMergeBeforeSpace = false;
  }
  return std::unique_ptr<Model>(
      std::make_unique<BpeModel>(std::move(vocab), std::move(mergeMap), std::move(o)));
}

// ---------------------------------------------------------------------------------------------
// Unigram

class UnigramModel final : public Model {
 public:
  UnigramModel(std::vector<std::pair<std::string, double>> pieces, std::optional<uint32_t> unkId,
               bool byteFallback)
      : pieces_(std::move(pieces)), unkId_(unkId), byteFallback_(byteFallback) {
    minScore_ = std::numeric_limits<double>::infinity();
    nodes_.push_back({});
    for (uint32_t id = 0; id < pieces_.size(); ++id) {
      const auto& [piece, score] = pieces_[id];
      vocab_.insert_or_assign(piece, id);  // last occurrence wins on duplicates, as in Hugging Face
      minScore_ = std::min(minScore_, score);
      uint32_t node = 0;
      for (unsigned char c : piece) {
        const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
        auto it = children_.find(key);
        if (it == children_.end()) {
          it = children_.emplace(key, static_cast<uint32_t>(nodes_.size())).first;
          nodes_.push_back({});
        }
        node = it->second;
      }
      nodes_[node].id = id;
    }
  }

  Status tokenize(std::string_view s, std::vector<Token>& out) const override {
    if (s.empty()) return okStatus();
    struct Best {
      double score = 0;
      int64_t start = -1;
      uint32_t id = 0;
    };
    const double unkScore = minScore_ - 10.0;
    std::vector<Best> best(s.size() + 1);
    size_t mblen;
    for (size_t startsAt = 0; startsAt < s.size(); startsAt += mblen) {
      const double base = best[startsAt].score;
      bool hasSingle = false;
      mblen = utf8SequenceLength(static_cast<unsigned char>(s[startsAt]));
      uint32_t node = 0;
      for (size_t k = startsAt; k < s.size(); ++k) {
        auto it =
            children_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[k]));
        if (it == children_.end()) break;
        node = it->second;
        if (auto id = nodes_[node].id) {
          const size_t end = k + 1;
          const double cand = pieces_[*id].second + base;
          if (best[end].start < 0 || cand > best[end].score)
            best[end] = {cand, static_cast<int64_t>(startsAt), *id};
          if (end - startsAt == mblen) hasSingle = true;
        }
      }
      if (!hasSingle) {
        if (!unkId_)
          return failedPreconditionError(
              "Unigram: a character is not in the vocabulary and there is no unk_id");
        const size_t end = startsAt + mblen;
        const double cand = unkScore + base;
        if (best[end].start < 0 || cand > best[end].score)
          best[end] = {cand, static_cast<int64_t>(startsAt), *unkId_};
      }
    }
    // Walk back; consecutive unknown pieces fuse into one.
    std::vector<std::pair<size_t, size_t>> ranges;
    constexpr size_t kNone = static_cast<size_t>(-1);
    size_t endsAt = s.size();
    size_t unkEnd = kNone;  // end of the unknown run being fused
    while (endsAt > 0) {
      const Best& b = best[endsAt];
      const size_t start = static_cast<size_t>(b.start);
      if (unkId_ && b.id == *unkId_) {
        if (unkEnd == kNone) unkEnd = endsAt;
      } else {
        if (unkEnd != kNone) {
          ranges.push_back({endsAt, unkEnd});
          unkEnd = kNone;
        }
        ranges.push_back({start, endsAt});
      }
      endsAt = start;
    }
    if (unkEnd != kNone) ranges.push_back({0, unkEnd});
    for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
      const std::string_view piece = s.substr(it->first, it->second - it->first);
      const Offsets offsets{static_cast<uint32_t>(it->first), static_cast<uint32_t>(it->second)};
      if (auto id = lookup(vocab_, piece)) {
        out.push_back({*id, std::string(piece), offsets});
        continue;
      }
      if (byteFallback_) {
        std::vector<Token> bytes;
        for (unsigned char b : piece) {
          const std::string name = byteToken(b);
          auto id = lookup(vocab_, name);
          if (!id) break;
          bytes.push_back({*id, name, offsets});
        }
        if (bytes.size() == piece.size()) {
          out.insert(out.end(), std::make_move_iterator(bytes.begin()),
                     std::make_move_iterator(bytes.end()));
          continue;
        }
      }
      if (!unkId_) return failedPreconditionError("Unigram: missing unk_id");
      out.push_back({*unkId_, std::string(piece), offsets});
    }
    return okStatus();
  }

  std::optional<uint32_t> tokenToId(std::string_view token) const override {
    return lookup(vocab_, token);
  }
  const std::string* idToToken(uint32_t id) const override {
    return id < pieces_.size() ? &pieces_[id].first : nullptr;
  }
  size_t vocabSize() const override { return pieces_.size(); }

 private:
  struct Node {
    std::optional<uint32_t> id;
  };
  std::vector<std::pair<std::string, double>> pieces_;
  VocabMap vocab_;
  std::optional<uint32_t> unkId_;
  bool byteFallback_;
  double minScore_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> children_;  // (node << 8 | byte) -> child node
};

StatusOr<std::unique_ptr<Model>> makeUnigram(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(const Json* vocab, getArray(j, path, "vocab"));
  std::vector<std::pair<std::string, double>> pieces;
  pieces.reserve(vocab->size());
  for (size_t i = 0; i < vocab->size(); ++i) {
    const Json& e = (*vocab)[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number()) {
      return jsonError(childPath(childPath(path, "vocab"), i), "expected [\"piece\", score]");
    }
    pieces.emplace_back(e[0].get<std::string>(), e[1].get<double>());
  }
  std::optional<uint32_t> unkId;
  if (auto it = j.find("unk_id"); it != j.end() && !it->is_null()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() >= pieces.size()) {
      return jsonError(childPath(path, "unk_id"), "not an index into the vocabulary");
    }
    unkId = it->get<uint32_t>();
  }
  TG_ASSIGN_OR_RETURN(bool byteFallback, getBoolOr(j, path, "byte_fallback", false));
  return std::unique_ptr<Model>(
      std::make_unique<UnigramModel>(std::move(pieces), unkId, byteFallback));
}

// ---------------------------------------------------------------------------------------------
// WordLevel

class WordLevelModel final : public Model {
 public:
  WordLevelModel(VocabMap vocab, std::string unk) : vocab_(std::move(vocab)), unk_(std::move(unk)) {
    reverse_.build(vocab_);
  }

  Status tokenize(std::string_view piece, std::vector<Token>& out) const override {
    const Offsets offsets{0, static_cast<uint32_t>(piece.size())};
    if (auto id = lookup(vocab_, piece)) {
      out.push_back({*id, std::string(piece), offsets});
    } else if (auto unk = lookup(vocab_, unk_)) {
      out.push_back({*unk, unk_, offsets});
    } else {
      return failedPreconditionError("WordLevel: word not in vocabulary and unk_token '" + unk_ +
                                     "' missing");
    }
    return okStatus();
  }

  std::optional<uint32_t> tokenToId(std::string_view token) const override {
    return lookup(vocab_, token);
  }
  const std::string* idToToken(uint32_t id) const override { return reverse_.get(id); }
  size_t vocabSize() const override { return vocab_.size(); }

 private:
  VocabMap vocab_;
  ReverseVocab reverse_;
  std::string unk_;
};

StatusOr<std::unique_ptr<Model>> makeWordLevel(const Json& j, const std::string& path) {
  TG_ASSIGN_OR_RETURN(VocabMap vocab, parseVocabObject(j, path));
  TG_ASSIGN_OR_RETURN(std::string unk, getStringOr(j, path, "unk_token", "<unk>"));
  return std::unique_ptr<Model>(std::make_unique<WordLevelModel>(std::move(vocab), std::move(unk)));
}

}  // namespace

StatusOr<std::unique_ptr<Model>> makeModel(const Json& j, const std::string& path) {
  if (!j.is_object()) return jsonError(path, "expected an object");
  std::string type;
  if (auto it = j.find("type"); it != j.end() && it->is_string()) {
    type = it->get<std::string>();
  } else if (j.contains("merges")) {  // untagged (older files): infer as Hugging Face does
    type = "BPE";
  } else if (j.contains("vocab") && j["vocab"].is_array()) {
    type = "Unigram";
  } else {
    type = "WordLevel";
  }
  if (type == "BPE") return makeBpe(j, path);
  if (type == "Unigram") return makeUnigram(j, path);
  if (type == "WordLevel") return makeWordLevel(j, path);
  return jsonError(path, "unsupported model type '" + type + "'");
}

}  // namespace textgen::tokenizer
