// Constrained decoding: a regular expression or a JSON Schema compiled to a deterministic automaton
// over bytes, and the per-step token masks it implies over a model's vocabulary.
//
//   TG_ASSIGN_OR_RETURN(auto g, Grammar::compile(Kind::kJsonSchema, schemaText));
//   auto vocab = Vocabulary::create(tokenBytes, eosIds);
//   auto index = std::make_shared<TokenIndex>(g, vocab);
//   Matcher m(index);
//   m.fillMask(words);            // before each step: the tokens that may come next
//   TG_RETURN_IF_ERROR(m.accept(chosen));
//
// Every state of a compiled grammar can still reach acceptance, so a sequence of allowed tokens
// never strands generation: EOS is allowed exactly in accepting states (and, as the one way out,
// where no other token fits).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::grammar {

// Bounds on compile time and memory: a grammar past them is refused (RESOURCE_EXHAUSTED, which the
// router answers as 422 naming the bound).
struct Limits {
  size_t maxSourceBytes = 256 * 1024;  // the regex or schema text
  int maxSchemaDepth = 32;             // nesting of objects, arrays and $ref expansions
  size_t maxRegexBytes = 1 << 20;      // the regex a schema compiles to
  size_t maxNfaStates = 1 << 20;
  size_t maxDfaStates = 1 << 15;
  // Steps of the DFA's construction (epsilon-closure steps and transition entries): bounds compile
  // time whatever the state count (a few hundred ms at the default).
  size_t maxCompileWork = size_t{1} << 26;
};

enum class Kind { kRegex, kJsonSchema };

// A compiled grammar: a trimmed DFA over bytes (no state from which acceptance is unreachable).
// Immutable; shared between requests and threads.
class Grammar {
 public:
  static constexpr int32_t kDead = -1;

  // INVALID_ARGUMENT naming the problem (a bad pattern, an invalid or unsupported schema);
  // RESOURCE_EXHAUSTED past `limits`.
  static StatusOr<std::shared_ptr<const Grammar>> compile(Kind kind, std::string_view source,
                                                          const Limits& limits = {});
  virtual ~Grammar() = default;

  virtual int32_t start() const = 0;
  virtual int32_t next(int32_t state, uint8_t byte) const = 0;  // kDead when the byte cannot follow
  virtual bool accepting(int32_t state) const = 0;
  virtual size_t numStates() const = 0;
  // Walks `bytes` from `state`; kDead as soon as one cannot follow.
  int32_t walk(int32_t state, std::string_view bytes) const;
  // True when the whole of `text` matches.
  bool matches(std::string_view text) const;
};

// The JSON Schema's regex (outlines' construction, whitespace between tokens limited to one
// optional space). Exposed for tests and tools.
StatusOr<std::string> jsonSchemaToRegex(std::string_view schemaJson, const Limits& limits = {});

// A model's vocabulary as grammars see it: the bytes each token id adds to the text. Ids without
// bytes (special tokens, padding past the tokenizer) are never allowed, EOS aside.
class Vocabulary {
 public:
  static std::shared_ptr<const Vocabulary> create(
      std::vector<std::optional<std::string>> tokenBytes, std::vector<uint32_t> eosIds);
  virtual ~Vocabulary() = default;
  virtual size_t size() const = 0;  // ids [0, size)
  size_t maskWords() const { return (size() + 31) / 32; }
  virtual const std::vector<uint32_t>& eosIds() const = 0;
  virtual const std::optional<std::string>& bytes(uint32_t id) const = 0;
};

// One grammar's token masks over one vocabulary: per DFA state, computed on first use (a walk of
// the vocabulary's byte trie through the automaton) and kept. Thread-safe.
class TokenIndex {
 public:
  TokenIndex(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);
  ~TokenIndex();
  TokenIndex(const TokenIndex&) = delete;
  TokenIndex& operator=(const TokenIndex&) = delete;

  // Writes vocab.maskWords() words: bit (id % 32) of word id / 32 is set when token `id` may come
  // next from `state`. `words` must hold maskWords() words.
  void fillMask(int32_t state, std::span<uint32_t> words) const;
  bool allows(int32_t state, uint32_t token) const;
  // The state after `token` (kDead when it is not allowed; an EOS id leaves the state unchanged).
  int32_t advance(int32_t state, uint32_t token) const;
  bool isEos(uint32_t token) const;
  // Computes ahead the masks of up to `maxStates` states, nearest the start first (breadth-first
  // over the automaton's transitions), for a background thread: the requests' fillMask calls then
  // find them computed instead of walking the vocabulary inside a step. Stops early when `stop` is
  // set or half the mask budget is used. Returns how many masks it computed.
  size_t warm(size_t maxStates, const std::atomic<bool>& stop) const;

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocabulary() const { return *vocab_; }

 private:
  struct Impl;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<Impl> impl_;
};

// One request's position in its grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const TokenIndex> index);
  void fillMask(std::span<uint32_t> words) const;
  bool allows(uint32_t token) const;
  // FAILED_PRECONDITION naming the token when it may not come next. An EOS id ends the matcher.
  Status accept(uint32_t token);
  bool accepting() const;
  bool ended() const { return ended_; }  // EOS accepted
  int32_t state() const { return state_; }

 private:
  std::shared_ptr<const TokenIndex> index_;
  int32_t state_;
  bool ended_ = false;
};

// Compiled grammars and (with a vocabulary) their token indexes, by (kind, source), the least
// recently used dropped past `capacity`. Thread-safe; a failed compile is remembered (its error
// comes back without compiling again).
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab = nullptr, size_t capacity = 64,
                        Limits limits = {});
  ~GrammarCache();
  StatusOr<std::shared_ptr<const Grammar>> grammar(Kind kind, std::string_view source);
  // FAILED_PRECONDITION without a vocabulary.
  StatusOr<std::shared_ptr<const TokenIndex>> index(Kind kind, std::string_view source);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace textgen::grammar
