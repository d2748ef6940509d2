#include "textgen/runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "engine/host_workers.h"
#include "textgen/base/log.h"
#include "textgen/grammar/grammar.h"
#include "textgen/tokenizer/incremental_decoder.h"

namespace textgen::runtime {

namespace {
uint64_t nowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

namespace {

// Where position `pos` of a sequence keeps its key and value: the one formula (the router's slots
// follow it, and validate() checks that they do).
uint32_t slotOf(std::span<const uint32_t> blocks, int64_t blockSize, int64_t pos) {
  return static_cast<uint32_t>(blocks[pos / blockSize] * blockSize + pos % blockSize);
}

enum class RequestState {
  kPrefilling,  // prompt positions still to compute (chunked prefill: more than one step)
  kDecoding,    // one new token per step
};

}  // namespace

struct Engine::Request {
  RequestSpec spec;
  RequestState state = RequestState::kPrefilling;
  std::vector<uint32_t> tokens;  // prompt then generated
  // Of `tokens`, for the penalties (updated per token); empty without one (a 2k-token prompt's
  // counts took about 0.1 ms to build, and each sampled step sent them all).
  TokenCounts history;
  int64_t computed = 0;  // positions whose KV is in the cache
  RequestSampler sampler;
  StoppingCriteria stopping;
  tokenizer::IncrementalDecoder detok;
  std::vector<uint32_t> generated;
  TokenList prefill;                          // prefill log-probabilities, gathered over chunks
  std::unique_ptr<grammar::Matcher> matcher;  // constrained output: where its grammar stands
  // Speculative decoding: the tokens proposed to follow `tokens` this step (Engine::propose); the
  // step computes their positions too and keeps those the model's own choices confirm.
  std::vector<uint32_t> draft;
  // Medusa: the heads' guesses at the row of the last token chosen, the next step's proposal.
  std::vector<uint32_t> medusa;

  // Encoder-decoder requests (seq2seq): the prompt is the encoder's input, kept as cross keys and
  // values in the first crossBlocks of the table; the decoder's tokens (`tokens`, from the start
  // token) take the blocks after them. Penalties and the text see the decoder's tokens, the text
  // after the start token (TGI's Seq2SeqLM).
  bool seq2seq = false;
  int64_t crossBlocks = 0;

  Request(RequestSpec s, const tokenizer::Tokenizer& tok, std::vector<uint32_t> eos)
      : spec(std::move(s)),
        tokens(spec.inputIds),
        history(spec.sampling.penalized() ? TokenCounts(spec.inputIds) : TokenCounts()),
        computed(spec.cacheLen),
        sampler(spec.sampling),
        stopping(spec.stopping, std::move(eos)),
        detok(tok, false,
              std::span<const uint32_t>(spec.inputIds)
                  .first(spec.inputIds.size() - spec.generatedTokens)) {}
  Request(RequestSpec s, const tokenizer::Tokenizer& tok, std::vector<uint32_t> eos,
          uint32_t decoderStart, int64_t blockSize)
      : spec(std::move(s)),
        tokens{decoderStart},
        history(spec.sampling.penalized() ? TokenCounts(std::span<const uint32_t>(&decoderStart, 1))
                                          : TokenCounts()),
        sampler(spec.sampling),
        stopping(spec.stopping, std::move(eos)),
        detok(tok, false, std::span<const uint32_t>(&decoderStart, 1)),
        seq2seq(true),
        crossBlocks((static_cast<int64_t>(spec.inputIds.size()) + blockSize - 1) / blockSize) {}

  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() {
    if (!uses) return;
    for (uint32_t b : spec.blocks) {
      BlockUse& u = (*uses)[b];
      --u.holders;
      if (u.writer == this) u.writer = nullptr;
    }
  }

  // Counts the table in the engine's per-block uses (Engine::blockUses_) from now until the
  // request is destroyed, whichever way it leaves (finished, filtered, cleared, its call failed),
  // and marks it the writer of the blocks from firstWritable() on.
  void hold(std::vector<BlockUse>& counts, int64_t blockSize) {
    uses = &counts;
    countBlocks(0, firstWritable(blockSize));
  }
  void addBlocks(std::span<const uint32_t> blocks) {
    const size_t from = spec.blocks.size();
    spec.blocks.insert(spec.blocks.end(), blocks.begin(), blocks.end());
    if (uses) countBlocks(from, static_cast<int64_t>(from));
  }
  // The first block of the table that the request may still write: the one holding position
  // `computed` (every later position is written by this request alone). A seq2seq request's whole
  // table: its encoder output fills the first blocks, and nothing is shared.
  int64_t firstWritable(int64_t blockSize) const { return seq2seq ? 0 : computed / blockSize; }

  // The block table's parts: the encoder output's (seq2seq) and the positions' in `tokens`.
  std::span<const uint32_t> crossTable() const {
    return std::span<const uint32_t>(spec.blocks).first(crossBlocks);
  }
  std::span<const uint32_t> selfTable() const {
    return std::span<const uint32_t>(spec.blocks).subspan(crossBlocks);
  }
  // Blocks that hold positions [0, end) of `tokens` (and a seq2seq request's encoder output).
  int64_t blocksFor(int64_t end, int64_t blockSize) const {
    return crossBlocks + (end + blockSize - 1) / blockSize;
  }
  // Positions the request can reach: its prompt + max_new_tokens, or a seq2seq request's cross
  // blocks' positions + max_new_tokens (the decoder writes the start token and all but the last).
  int64_t maxLength(int64_t blockSize) const {
    return seq2seq ? crossBlocks * blockSize + spec.stopping.maxNewTokens : spec.maxLength();
  }

  // A resumed request replays its earlier output (validate() bounds generatedTokens): the text
  // stream, the stopping criteria and the seeded draws end where they were when it was preempted.
  // FAILED_PRECONDITION when that output had already finished it.
  Status replayGenerated() {
    const size_t first = spec.inputIds.size() - spec.generatedTokens;
    for (size_t i = first; i < spec.inputIds.size(); ++i) {
      const uint32_t id = spec.inputIds[i];
      generated.push_back(id);
      sampler.skipDraw();
      if (matcher && !matcher->ended()) {  // as update() (EOS ends it; ignore_eos goes on)
        if (Status s = matcher->accept(id); !s.ok()) {
          return invalidArgumentError(
              "request " + std::to_string(spec.id) +
              ": its generated_tokens do not follow its grammar: " + s.message());
        }
      }
      if (stopping.update(id, detok.step(id))) {
        return failedPreconditionError("request " + std::to_string(spec.id) +
                                       ": its generated_tokens already end it");
      }
    }
    return okStatus();
  }

  bool prefilling() const { return state == RequestState::kPrefilling; }
  // Arg-max of the raw logits is the whole choice: no sampling, penalty, bias, top-n or prefill
  // log-probabilities.
  bool plainGreedy() const {
    const SamplingParams& p = spec.sampling;
    return !p.doSample && !p.penalized() && p.logitBias.empty() && p.topNTokens == 0 &&
           !p.watermark && !matcher && !(prefilling() && spec.prefillLogprobs);
  }
  int64_t nextRows() const {
    if (seq2seq) return 1;
    if (!prefilling()) return 1 + static_cast<int64_t>(draft.size());
    const int64_t remaining = static_cast<int64_t>(spec.inputIds.size()) - computed;
    return spec.chunkLen && *spec.chunkLen > 0 ? std::min<int64_t>(*spec.chunkLen, remaining)
                                               : remaining;
  }
  // This step ends the prompt (or decodes): a token is chosen from its last row.
  bool choosesNow() const {
    return !prefilling() || seq2seq ||
           computed + nextRows() >= static_cast<int64_t>(spec.inputIds.size());
  }
  // A seq2seq request's prefill details are its decoder input's (the start token), known without
  // logits.
  bool wantsPromptLogprobs() const { return prefilling() && spec.prefillLogprobs && !seq2seq; }
  // The token of position `pos` this step: known, or proposed.
  uint32_t tokenAt(int64_t pos) const {
    const auto known = static_cast<int64_t>(tokens.size());
    return pos < known ? tokens[pos] : draft[pos - known];
  }
  void append(uint32_t id) {
    tokens.push_back(id);
    if (spec.sampling.penalized()) history.add(id);
    generated.push_back(id);
  }

 private:
  std::vector<BlockUse>* uses = nullptr;
  // Counts spec.blocks[from..], the writer of those from index `writes` on.
  void countBlocks(size_t from, int64_t writes) {
    for (size_t k = from; k < spec.blocks.size(); ++k) {
      const uint32_t b = spec.blocks[k];
      if (b >= uses->size()) uses->resize(size_t{b} + 1);
      BlockUse& u = (*uses)[b];
      ++u.holders;
      if (static_cast<int64_t>(k) >= writes) {
        u.writer = this;
        u.index = static_cast<uint32_t>(k);
      }
    }
  }
};

struct Engine::Batch {
  uint64_t id = 0;
  std::vector<std::unique_ptr<Request>> requests;
};

namespace {

// How a step's tokens are chosen, from the whole batch's needs: plain greedy requests only — the
// arg-max where the logits are; any prompt log-probabilities — whole logit rows to the host;
// otherwise every request's processors and draw where the logits are (the draws come from each
// request's own generator here, so seeded requests give the same tokens either way).
enum class ChoiceMode { kGreedy, kSample, kHostLogits };

}  // namespace

// What one step computes: the forward's rows, where each request's logit rows start, and how
// tokens are chosen.
struct Engine::StepPlan {
  ForwardBatch forward;
  std::vector<int64_t> logitStart;  // per request
  ChoiceMode mode = ChoiceMode::kGreedy;
  SampleBatch sampling;  // kSample
};

// The forward's results, by mode.
// What update() makes of one request: its result, whether it stays in the batch, and its
// speculation counts (added to the engine's after the step).
struct Engine::RequestUpdate {
  std::optional<GenerationResult> result;  // none: a prompt chunk with more to come
  bool keep = false;
  SpeculationStats spec;
};

// Below this many requests a step's update stays on the engine's thread (a few microseconds
// each: not worth the workers' wake-up).
constexpr size_t kParallelUpdateRequests = 16;

struct Engine::StepOutputs {
  std::vector<GreedyToken> picks;
  std::vector<SampledToken> sampled;
  std::vector<float> logits;
  std::vector<uint32_t> medusa;  // Model::speculativeIds: [heads][logit rows], or empty
};

// Computes the masks of grammars' states nearest their start on a thread of its own, so that a
// constrained request's first steps find them (a mask's first computation walks the vocabulary: up
// to ~5 ms at 128k ids inside a JSON string, which would otherwise hold the whole batch's step).
// The token indexes are thread-safe; the engine only posts to it.
class Engine::GrammarWarmer {
 public:
  GrammarWarmer() : thread_([this] { run(); }) {}
  ~GrammarWarmer() {
    stopFlag_ = true;  // a warm run in progress ends at its next state
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  // Queues `index` unless it is the one posted last; a full queue drops it (warming is a hint).
  void post(std::shared_ptr<const grammar::TokenIndex> index) {
    {
      std::lock_guard lock(mu_);
      if (index == last_.lock() || queue_.size() >= 8) return;
      last_ = index;
      queue_.push_back(std::move(index));
    }
    cv_.notify_one();
  }

 private:
  static constexpr size_t kStates = 512;

  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::shared_ptr<const grammar::TokenIndex> index = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      index->warm(kStates, stopFlag_);
      index.reset();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const grammar::TokenIndex>> queue_;
  std::weak_ptr<const grammar::TokenIndex> last_;
  bool stop_ = false;
  std::atomic<bool> stopFlag_{false};
  std::thread thread_;  // last: it starts once the rest is constructed
};

Engine::Engine(Model& model, const tokenizer::Tokenizer& tokenizer, Backend& backend,
               EngineOptions options)
    : model_(model),
      tokenizer_(tokenizer),
      backend_(backend),
      options_(options),
      sampler_(backend) {
  const int threads =
      options_.updateThreads > 0 ? options_.updateThreads : HostWorkers::defaultThreads();
  if (threads > 1) workers_ = std::make_unique<HostWorkers>(threads);
}

Engine::~Engine() = default;

int64_t Engine::maxContext() const {
  return model_.config().maxContext();
}

Status Engine::validate(const RequestSpec& r) const {
  const std::string who = "request " + std::to_string(r.id) + ": ";
  if (r.inputIds.empty()) return invalidArgumentError(who + "empty prompt");
  if (static_cast<int64_t>(r.inputIds.size()) > maxContext()) {
    return invalidArgumentError(who + "prompt of " + std::to_string(r.inputIds.size()) +
                                " tokens is longer than the model allows (" +
                                std::to_string(maxContext()) + ")");
  }
  if (r.stopping.maxNewTokens == 0)
    return invalidArgumentError(who + "max_new_tokens must be at least 1");
  // A learned position table ends: a request is refused now unless prompt + max_new_tokens fit
  // it (TGI's rule; a resumed request's prompt holds what it generated), rather than failing its
  // whole batch's step when it feeds a position past the table.
  if (model_.config().learnedPositions && r.generatedTokens < r.inputIds.size() &&
      r.maxLength() > maxContext()) {
    return invalidArgumentError(who + "prompt + max_new_tokens (" + std::to_string(r.maxLength()) +
                                ") exceeds the model's " + std::to_string(maxContext()) +
                                " learned positions");
  }
  if (r.generatedTokens > 0) {
    if (r.generatedTokens >= r.inputIds.size() || r.generatedTokens >= r.stopping.maxNewTokens) {
      return invalidArgumentError(who + "generated_tokens (" + std::to_string(r.generatedTokens) +
                                  ") must be below the input's length and max_new_tokens");
    }
    if (r.prefillLogprobs)
      return invalidArgumentError(who + "prefill_logprobs is not allowed with generated_tokens");
  }
  for (uint32_t id : r.inputIds) {
    if (id >= model_.config().vocabSize)
      return invalidArgumentError(who + "token id " + std::to_string(id) + " out of vocabulary");
  }
  if (r.cacheLen >= r.inputIds.size())
    return invalidArgumentError(who + "cache_len must be below the prompt length");
  const int64_t bs = cache_->blockSize();
  const auto prompt = static_cast<int64_t>(r.inputIds.size());
  const auto blocks = static_cast<int64_t>(r.blocks.size());
  if (model_.config().isEncoderDecoder) {
    // The encoder runs over the whole prompt in one step, computed anew: no chunk, no cached
    // prefix, no resumed output (the router never preempts without chunking).
    if (r.cacheLen > 0)
      return invalidArgumentError(who + "cache_len: an encoder-decoder model has no prefix cache");
    if (r.chunkLen && *r.chunkLen > 0 && *r.chunkLen < prompt)
      return invalidArgumentError(who +
                                  "chunk_len: an encoder-decoder model encodes its prompt "
                                  "in one step (no chunked prefill)");
    if (r.generatedTokens > 0)
      return invalidArgumentError(who +
                                  "generated_tokens: an encoder-decoder request cannot "
                                  "resume");
    const int64_t cross = (prompt + bs - 1) / bs;
    if (blocks < cross + 1) {
      return invalidArgumentError(who + std::to_string(blocks) + " blocks of " +
                                  std::to_string(bs) + " cannot hold the encoder output of " +
                                  std::to_string(prompt) + " tokens (" + std::to_string(cross) +
                                  " blocks) and the decoder's first position");
    }
  }
  if (r.cacheLen > 0 && r.prefillLogprobs) {
    return invalidArgumentError(
        who + "prefill_logprobs needs every prompt token computed: cache_len must be 0");
  }
  // The blocks cover the prompt at least; later positions may come by extension.
  if (blocks * bs < prompt) {
    return invalidArgumentError(who + std::to_string(blocks) + " blocks of " + std::to_string(bs) +
                                " cannot hold the prompt's " + std::to_string(prompt) + " tokens");
  }
  std::set<uint32_t> seen;
  for (uint32_t b : r.blocks) {
    if (b >= cache_->numBlocks())
      return invalidArgumentError(who + "block " + std::to_string(b) + " out of range");
    if (!seen.insert(b).second)
      return invalidArgumentError(who + "block " + std::to_string(b) + " twice in its table");
  }
  if (!r.slots.empty()) {
    const auto slots = static_cast<int64_t>(r.slots.size());
    if (slots < prompt || slots > blocks * bs) {
      return invalidArgumentError(who + std::to_string(slots) +
                                  " slots: at least one per prompt token, at most what the blocks "
                                  "hold");
    }
    for (int64_t p = 0; p < slots; ++p) {
      if (r.slots[p] != slotOf(r.blocks, bs, p)) {
        return invalidArgumentError(who + "slot " + std::to_string(p) +
                                    " does not follow the block table");
      }
    }
  }
  TG_RETURN_IF_ERROR(validateSamplingParams(r.sampling));
  if (static_cast<int64_t>(r.sampling.topNTokens) > model_.config().vocabSize) {
    return invalidArgumentError(who + "top_n_tokens " + std::to_string(r.sampling.topNTokens) +
                                " exceeds the vocabulary (" +
                                std::to_string(model_.config().vocabSize) + ")");
  }
  return okStatus();
}

Status Engine::attachGrammar(Request& r) {
  const SamplingParams& p = r.spec.sampling;
  if (p.grammarType == SamplingParams::Grammar::kNone) return okStatus();
  if (!grammars_) {
    // The bytes each id adds to the text; ids past the tokenizer (padding) and special tokens have
    // none, so only EOS among them is ever allowed.
    const int64_t vocab = model_.config().vocabSize;
    std::vector<std::optional<std::string>> bytes(static_cast<size_t>(vocab));
    for (int64_t id = 0; id < vocab; ++id)
      bytes[id] = tokenizer_.tokenBytes(static_cast<uint32_t>(id));
    grammars_ = std::make_unique<grammar::GrammarCache>(
        grammar::Vocabulary::create(std::move(bytes), model_.config().eosTokenIds),
        /*capacity=*/32);
  }
  // Generation under a grammar ends by EOS: without an EOS id in the vocabulary a finished match
  // would leave no token to choose.
  const int64_t vocab = model_.config().vocabSize;
  const auto& eos = model_.config().eosTokenIds;
  if (std::none_of(eos.begin(), eos.end(), [&](uint32_t id) { return id < vocab; })) {
    return invalidArgumentError("request " + std::to_string(r.spec.id) +
                                ": grammar needs an EOS token id within the vocabulary; this "
                                "model has none");
  }
  const auto kind = p.grammarType == SamplingParams::Grammar::kJson ? grammar::Kind::kJsonSchema
                                                                    : grammar::Kind::kRegex;
  auto index = grammars_->index(kind, p.grammar);
  if (!index.ok()) {
    return invalidArgumentError("request " + std::to_string(r.spec.id) +
                                ": grammar is not valid: " + index.status().message());
  }
  if (!warmer_) warmer_ = std::make_unique<GrammarWarmer>();
  warmer_->post(*index);
  r.matcher = std::make_unique<grammar::Matcher>(std::move(*index));
  return okStatus();
}

BatchInfo Engine::info(const Batch& b) const {
  BatchInfo i;
  i.id = b.id;
  for (const auto& r : b.requests) {
    i.requestIds.push_back(r->spec.id);
    i.maxTokens += static_cast<uint32_t>(r->maxLength(cache_->blockSize()));
    i.currentTokens += static_cast<uint32_t>(r->nextRows());
  }
  return i;
}

std::vector<uint32_t> proposeNgram(std::span<const uint32_t> tokens, int64_t k) {
  constexpr int64_t kMaxN = 3, kWindow = 4096;
  std::vector<uint32_t> out;
  const auto len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || len < 2) return out;
  const int64_t lowest = std::max<int64_t>(0, len - kWindow);
  for (int64_t n = std::min<int64_t>(kMaxN, len - 1); n >= 1; --n) {
    const std::span<const uint32_t> tail = tokens.subspan(len - n);
    // The latest start s < len - n whose n tokens equal the tail: tokens[s + n, len) followed.
    for (int64_t s = len - n - 1; s >= lowest; --s) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n, period = len - from;
      for (int64_t i = 0; i < k; ++i) out.push_back(tokens[from + i % period]);
      return out;
    }
  }
  return out;
}

void Engine::propose(Request& r) const {
  r.draft.clear();
  if (options_.speculate <= 0 || r.seq2seq || r.prefilling()) return;
  if (r.matcher && r.matcher->ended()) return;
  // Every proposed position must have a block and stay within max_new_tokens: the step chooses at
  // most draft + 1 tokens and writes positions computed .. computed + draft.
  const int64_t bs = cache_->blockSize();
  const int64_t room = static_cast<int64_t>(r.spec.blocks.size()) * bs - r.computed - 1;
  const int64_t left = static_cast<int64_t>(r.spec.stopping.maxNewTokens) -
                       static_cast<int64_t>(r.stopping.generatedTokens()) - 1;
  const int64_t k = std::min({options_.speculate, room, left});
  if (k <= 0) return;
  if (!r.medusa.empty()) {  // the Medusa heads' guesses from the last step
    r.draft.assign(r.medusa.begin(),
                   r.medusa.begin() + std::min<int64_t>(k, static_cast<int64_t>(r.medusa.size())));
  } else {  // n-gram lookup: any model, and a Medusa step that computed no guesses (as TGI)
    r.draft = proposeNgram(r.tokens, k);
  }
  if (r.matcher) {  // a token the grammar would mask cannot be accepted: cut there
    grammar::Matcher m = *r.matcher;
    for (size_t i = 0; i < r.draft.size(); ++i) {
      if (m.ended() || !m.allows(r.draft[i]) || !m.accept(r.draft[i]).ok()) {
        r.draft.resize(i);
        break;
      }
    }
  }
}

std::span<const uint32_t> Engine::greenList(uint32_t previous) {
  if (!greens_) {
    greens_ = std::make_unique<GreenListCache>(static_cast<uint32_t>(model_.config().vocabSize),
                                               options_.watermarkGamma);
  }
  return greens_->mask(previous);
}

// Schedule: every request's rows for this forward (its next prompt chunk, or its last token and
// any proposed tokens), the rows whose logits are wanted, and how tokens will be chosen.
Engine::StepPlan Engine::schedule(Batch& batch) {
  StepPlan plan;
  ForwardBatch& fb = plan.forward;
  const int64_t bs = cache_->blockSize();
  auto all = [&](auto pred) {
    return std::all_of(batch.requests.begin(), batch.requests.end(), pred);
  };
  auto any = [&](auto pred) {
    return std::any_of(batch.requests.begin(), batch.requests.end(), pred);
  };
  // Steps that bring prompt log-probabilities choose on the host, one token per request.
  const bool hostLogits =
      any([](const std::unique_ptr<Request>& r) { return r->wantsPromptLogprobs(); });
  // Proposals only while the step's rows stay within kMaxSpeculativeRows (TGI skips speculation
  // past 128 tokens): the logits and the sampler's scratch grow with them, beyond what warmup saw.
  const auto decoding = static_cast<int64_t>(
      std::count_if(batch.requests.begin(), batch.requests.end(),
                    [](const std::unique_ptr<Request>& r) { return !r->prefilling(); }));
  const bool speculates =
      !hostLogits && options_.speculate > 0 &&
      static_cast<int64_t>(batch.requests.size()) + decoding * options_.speculate <=
          kMaxSpeculativeRows;
  for (const auto& owner : batch.requests) {
    if (speculates) {
      propose(*owner);
    } else {
      owner->draft.clear();
    }
  }
  fb.decode = all([](const std::unique_ptr<Request>& r) { return !r->prefilling(); });
  for (const auto& owner : batch.requests) {
    const Request& r = *owner;
    const int64_t n = r.nextRows();
    const SequenceRows rows{.firstRow = static_cast<int64_t>(fb.tokenIds.size()),
                            .numRows = n,
                            .startPos = r.computed,
                            .blocks = r.selfTable()};
    for (int64_t p = r.computed; p < r.computed + n; ++p) {
      fb.tokenIds.push_back(r.tokenAt(p));
      fb.slots.push_back(slotOf(rows.blocks, bs, p));
    }
    fb.sequences.push_back(rows);
    if (r.seq2seq) {
      fb.cross.push_back({.encoderLen = static_cast<int64_t>(r.spec.inputIds.size()),
                          .encode = r.prefilling(),
                          .blocks = r.crossTable()});
      if (r.prefilling())
        fb.encoderTokenIds.insert(fb.encoderTokenIds.end(), r.spec.inputIds.begin(),
                                  r.spec.inputIds.end());
    }
    plan.logitStart.push_back(static_cast<int64_t>(fb.logitRows.size()));
    if (r.wantsPromptLogprobs() || !r.draft.empty()) {
      for (int64_t t = 0; t < n; ++t) fb.logitRows.push_back(rows.firstRow + t);
    } else {
      fb.logitRows.push_back(rows.firstRow + n - 1);
    }
  }
  if (all([](const std::unique_ptr<Request>& r) { return r->plainGreedy(); })) {
    plan.mode = ChoiceMode::kGreedy;
  } else if (hostLogits) {
    plan.mode = ChoiceMode::kHostLogits;
  } else {
    plan.mode = ChoiceMode::kSample;
    const auto vocab = static_cast<uint32_t>(model_.config().vocabSize);
    const size_t words = (vocab + 31) / 32;
    const auto delta = static_cast<float>(options_.watermarkDelta);
    SampleBatch& sb = plan.sampling;
    for (const auto& owner : batch.requests) {
      Request& r = *owner;
      if (!r.choosesNow()) {  // a prompt chunk with more to come: chooses nothing, draws nothing
        sb.rows.emplace_back();
        continue;
      }
      // One row per choice: the last known token's, then each proposed token's, as if the
      // proposal before it were accepted (its history, grammar state, watermark seed and draw).
      if (!r.draft.empty() && r.spec.sampling.doSample) r.sampler.saveDraws();
      TokenCounts history = r.draft.empty() ? TokenCounts() : r.history;
      std::optional<grammar::Matcher> matcher;
      if (r.matcher) matcher = *r.matcher;
      for (size_t j = 0; j <= r.draft.size(); ++j) {
        if (j > 0) {
          if (r.spec.sampling.penalized()) history.add(r.draft[j - 1]);
          if (matcher) (void)matcher->accept(r.draft[j - 1]);  // propose() checked it
        }
        RequestSampler::SampleInputs in =
            r.sampler.sampleInputs(r.draft.empty() ? r.history : history, vocab);
        kernels::SampleRow row = r.sampler.sampleRow(in);
        row.historyBegin = static_cast<int32_t>(sb.historyTokens.size());
        row.historyEnd += row.historyBegin;
        row.biasBegin = static_cast<int32_t>(sb.biasTokens.size());
        row.biasEnd += row.biasBegin;
        sb.historyTokens.insert(sb.historyTokens.end(), in.historyTokens.begin(),
                                in.historyTokens.end());
        sb.historyCounts.insert(sb.historyCounts.end(), in.historyCounts.begin(),
                                in.historyCounts.end());
        sb.biasTokens.insert(sb.biasTokens.end(), in.biasTokens.begin(), in.biasTokens.end());
        sb.biasValues.insert(sb.biasValues.end(), in.biasValues.begin(), in.biasValues.end());
        sb.maxTopN = std::max<int64_t>(sb.maxTopN, row.topN);
        if (matcher) {
          row.maskBegin = static_cast<int64_t>(sb.masks.size());
          sb.masks.resize(sb.masks.size() + words);
          matcher->fillMask(std::span<uint32_t>(sb.masks).subspan(row.maskBegin, words));
        }
        if (r.spec.sampling.watermark) {
          const uint32_t previous = j == 0 ? r.tokens.back() : r.draft[j - 1];
          const std::span<const uint32_t> green = greenList(previous);
          row.greenBegin = static_cast<int64_t>(sb.masks.size());
          row.greenDelta = delta;
          sb.masks.insert(sb.masks.end(), green.begin(), green.end());
        }
        sb.rows.push_back(row);
      }
    }
  }
  return plan;
}

// Execute: the forward, then the choice where the plan says. The sampler's kernel follows the
// forward (or its graph) on the same stream; only its choices come back, unless the plan wants the
// logits on the host.
StatusOr<Engine::StepOutputs> Engine::execute(const StepPlan& plan) {
  TG_ASSIGN_OR_RETURN(const LogitsView logits, model_.forwardLogits(plan.forward, *cache_));
  StepOutputs out;
  switch (plan.mode) {
    case ChoiceMode::kGreedy: {
      TG_ASSIGN_OR_RETURN(out.picks, sampler_.greedy(logits));
      break;
    }
    case ChoiceMode::kSample: {
      TG_ASSIGN_OR_RETURN(out.sampled, sampler_.sample(logits, plan.sampling));
      break;
    }
    case ChoiceMode::kHostLogits: {
      TG_ASSIGN_OR_RETURN(out.logits, downloadLogits(backend_, logits));
      break;
    }
  }
  if (model_.speculativeHeads() > 0) {
    TG_ASSIGN_OR_RETURN(out.medusa, model_.speculativeIds());
  }
  return out;
}

// Update: prompt log-probabilities, each request's tokens (the first choice, then each proposed
// token the model's own choice confirms, and the choice after the last confirmed one), their
// text, the stopping criteria; the requests still running stay in the batch. Requests are
// independent here, so a large batch's are spread over the host workers (not with host logits:
// the watermark's green lists are one cache).
StepResult Engine::update(Batch& batch, const StepPlan& plan, StepOutputs& out) {
  const size_t n = batch.requests.size();
  std::vector<RequestUpdate> updates(n);
  auto one = [&](size_t i) { updates[i] = updateRequest(*batch.requests[i], i, plan, out); };
  if (n >= kParallelUpdateRequests && plan.mode != ChoiceMode::kHostLogits && workers_) {
    workers_->forEach(n, one);
  } else {
    for (size_t i = 0; i < n; ++i) one(i);
  }
  StepResult result;
  std::vector<std::unique_ptr<Request>> alive;
  for (size_t i = 0; i < n; ++i) {
    RequestUpdate& u = updates[i];
    specStats_.steps += u.spec.steps;
    specStats_.proposed += u.spec.proposed;
    specStats_.accepted += u.spec.accepted;
    if (u.result) result.generations.push_back(std::move(*u.result));
    if (u.keep) alive.push_back(std::move(batch.requests[i]));
  }
  batch.requests = std::move(alive);
  return result;
}

// One request's part of update(): touches only the request and its own rows of the outputs.
Engine::RequestUpdate Engine::updateRequest(Request& r, size_t i, const StepPlan& plan,
                                            StepOutputs& out) {
  const int64_t vocab = model_.config().vocabSize;
  RequestUpdate u;
  const int64_t n = plan.forward.sequences[i].numRows;
  const int64_t first = plan.logitStart[i];
  const bool promptLogprobs = r.wantsPromptLogprobs();
  const bool chooses = r.choosesNow();
  if (promptLogprobs) {
    // Log-probability of prompt token p+1 from the row of position p; the first has none.
    std::vector<float> lp(vocab);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = r.computed + t;
      if (pos == 0) {
        r.prefill.ids.push_back(r.tokens[0]);
        r.prefill.logprobs.push_back(std::numeric_limits<float>::quiet_NaN());
      }
      if (pos + 1 < static_cast<int64_t>(r.spec.inputIds.size())) {
        logSoftmax(std::span<const float>(out.logits.data() + (first + t) * vocab, vocab), lp);
        r.prefill.ids.push_back(r.tokens[pos + 1]);
        r.prefill.logprobs.push_back(lp[r.tokens[pos + 1]]);
      }
    }
  }
  const bool wasPrefilling = r.prefilling();
  const std::vector<uint32_t> draft = std::move(r.draft);
  r.draft.clear();
  if (draft.empty()) r.computed += n;  // else below, by the tokens accepted
  if (r.seq2seq || r.computed >= static_cast<int64_t>(r.spec.inputIds.size()))
    r.state = RequestState::kDecoding;
  if (!chooses) {  // more prompt chunks to come: nothing to choose yet
    u.keep = true;
    return u;
  }
  // The choice of logit row `row`.
  auto choiceAt = [&](int64_t row) {
    TokenChoice choice;
    switch (plan.mode) {
      case ChoiceMode::kGreedy:
        choice.id = out.picks[row].id;
        choice.logprob = out.picks[row].logprob;
        break;
      case ChoiceMode::kSample:
        choice.id = out.sampled[row].id;
        choice.logprob = out.sampled[row].logprob;
        choice.top = std::move(out.sampled[row].top);
        break;
      case ChoiceMode::kHostLogits: {
        std::vector<uint32_t> mask;
        if (r.matcher) {
          mask.resize((vocab + 31) / 32);
          r.matcher->fillMask(mask);
        }
        std::span<const uint32_t> green;
        if (r.spec.sampling.watermark) green = greenList(r.tokens.back());
        choice =
            r.sampler.choose(std::span<float>(out.logits.data() + row * vocab, vocab), r.tokens,
                             mask, green, static_cast<float>(options_.watermarkDelta));
        break;
      }
    }
    return choice;
  };
  std::vector<TokenChoice> choices;
  int64_t lastRow = 0;  // the logit row of the last token chosen
  if (draft.empty()) {
    lastRow = promptLogprobs ? first + n - 1 : first;
    choices.push_back(choiceAt(lastRow));
  } else {
    // Row j chose after draft[0, j): its choice stands while every proposed token before it
    // was the model's own choice.
    choices.push_back(choiceAt(first));
    while (choices.size() <= draft.size() && choices.back().id == draft[choices.size() - 1])
      choices.push_back(choiceAt(first + static_cast<int64_t>(choices.size())));
    const auto accepted = static_cast<int64_t>(choices.size());
    lastRow = first + accepted - 1;
    r.computed += accepted;  // the known token's and the confirmed proposals' positions
    if (r.spec.sampling.doSample && plan.mode == ChoiceMode::kSample)
      r.sampler.restoreDraws(accepted);
    ++u.spec.steps;
    u.spec.proposed += draft.size();
    u.spec.accepted += static_cast<uint64_t>(accepted - 1);
  }
  r.medusa.clear();
  if (!out.medusa.empty()) {
    const int64_t heads = model_.speculativeHeads();
    const auto rows = static_cast<int64_t>(plan.forward.logitRows.size());
    for (int64_t h = 0; h < heads; ++h) r.medusa.push_back(out.medusa[h * rows + lastRow]);
  }
  GenerationResult g;
  g.requestId = r.spec.id;
  if (wasPrefilling && r.spec.prefillLogprobs && r.seq2seq) {
    // The decoder's input, as TGI reports a seq2seq prefill: the start token, no log-prob.
    const uint32_t start = r.tokens[0];
    r.prefill.ids = {start};
    r.prefill.logprobs = {std::numeric_limits<float>::quiet_NaN()};
    r.prefill.texts = {tokenizer_.decode(std::span<const uint32_t>(&start, 1))};
    r.prefill.isSpecial = {false};
    g.prefillTokens = std::move(r.prefill);
  } else if (wasPrefilling && r.spec.prefillLogprobs) {
    for (uint32_t id : r.prefill.ids) {
      r.prefill.texts.push_back(tokenizer_.decode(std::span<const uint32_t>(&id, 1)));
      r.prefill.isSpecial.push_back(tokenizer_.isSpecial(id));
    }
    g.prefillTokens = std::move(r.prefill);
  }
  std::optional<FinishReason> reason;
  for (TokenChoice& choice : choices) {
    r.append(choice.id);
    std::string text = r.detok.step(choice.id);
    reason = r.stopping.update(choice.id, text);
    if (r.matcher && !r.matcher->ended()) {
      // The mask allowed only tokens that continue the match, so this cannot fail; if it does,
      // the request ends here rather than generating outside its grammar.
      if (Status s = r.matcher->accept(choice.id); !s.ok()) {
        spdlog::error("request {}: token outside its grammar: {}", r.spec.id, s.message());
        if (!reason) reason = FinishReason::kStopSequence;
      }
    }
    if (reason) text += r.detok.flush();  // the stream's pieces add up to the whole text
    g.tokens.ids.push_back(choice.id);
    g.tokens.logprobs.push_back(choice.logprob);
    g.tokens.texts.push_back(std::move(text));
    g.tokens.isSpecial.push_back(tokenizer_.isSpecial(choice.id));
    if (r.spec.sampling.topNTokens > 0) {
      TokenList top;
      for (const auto& [id, lp] : choice.top) {
        top.ids.push_back(id);
        top.logprobs.push_back(lp);
        top.texts.push_back(tokenizer_.decode(std::span<const uint32_t>(&id, 1)));
        top.isSpecial.push_back(tokenizer_.isSpecial(id));
      }
      g.topTokens.push_back(std::move(top));
    }
    if (reason) break;  // what follows a stop is discarded
  }
  if (reason) {
    FinishedText f;
    f.text = tokenizer_.decode(r.generated, /*skipSpecialTokens=*/true);
    f.generatedTokens = r.stopping.generatedTokens();
    f.reason = *reason;
    if (r.spec.sampling.doSample) f.seed = r.spec.sampling.seed;
    g.finished = std::move(f);
  } else {
    u.keep = true;
  }
  u.result = std::move(g);
  return u;
}

const Engine::BlockUse& Engine::use(uint32_t block) const {
  static const BlockUse kNone;
  return block < blockUses_.size() ? blockUses_[block] : kNone;
}

Status Engine::auditBlocks() const {
  std::map<uint32_t, uint32_t> counted;
  std::map<uint32_t, uint64_t> writer;  // block -> the request that may still write it
  const int64_t bs = cache_ ? cache_->blockSize() : 1;
  for (const auto& [id, b] : batches_) {
    for (const auto& r : b->requests) {
      const std::span<const uint32_t> t(r->spec.blocks);
      const auto first = static_cast<size_t>(
          std::min<int64_t>(r->firstWritable(bs), static_cast<int64_t>(t.size())));
      for (size_t k = 0; k < t.size(); ++k) {
        ++counted[t[k]];
        if (k >= first && !writer.emplace(t[k], r->spec.id).second)
          return internalError("block " + std::to_string(t[k]) + " written by two requests");
      }
    }
  }
  for (const auto& [block, who] : writer) {
    if (counted[block] != 1) {
      return internalError("block " + std::to_string(block) + ", which request " +
                           std::to_string(who) + " may still write, is in another table");
    }
  }
  for (size_t b = 0; b < blockUses_.size(); ++b) {
    auto it = counted.find(static_cast<uint32_t>(b));
    const uint32_t want = it == counted.end() ? 0 : it->second;
    const BlockUse& u = blockUses_[b];
    if (u.holders != want) {
      return internalError("block " + std::to_string(b) + ": " + std::to_string(u.holders) +
                           " holders counted, " + std::to_string(want) + " live tables hold it");
    }
    // A block still to be written names its writer, at its place in the writer's table.
    auto w = writer.find(static_cast<uint32_t>(b));
    const bool writes = u.writer && u.index >= u.writer->firstWritable(bs);
    if (writes != (w != writer.end()) ||
        (writes && (w->second != u.writer->spec.id || u.index >= u.writer->spec.blocks.size() ||
                    u.writer->spec.blocks[u.index] != b)))
      return internalError("block " + std::to_string(b) + ": its recorded writer is wrong");
  }
  if (!counted.empty() && counted.rbegin()->first >= blockUses_.size())
    return internalError("a live table holds a block the counts never saw");
  return okStatus();
}

Status Engine::checkTable(const Request& r) const {
  const int64_t bs = cache_->blockSize();
  const std::span<const uint32_t> table(r.spec.blocks);
  const auto first = std::min<int64_t>(r.firstWritable(bs), static_cast<int64_t>(table.size()));
  const std::string who = "request " + std::to_string(r.spec.id) + ": block ";
  for (int64_t i = first; i < static_cast<int64_t>(table.size()); ++i) {
    if (use(table[i]).holders > 0)
      return invalidArgumentError(who + std::to_string(table[i]) + " is held by another request");
  }
  for (int64_t i = 0; i < first; ++i) {
    const BlockUse& u = use(table[i]);
    if (u.writer && u.index >= u.writer->firstWritable(bs)) {
      return invalidArgumentError(who + std::to_string(table[i]) +
                                  " of its cached prefix (cache_len) is still to be written by "
                                  "request " +
                                  std::to_string(u.writer->spec.id));
    }
  }
  return okStatus();
}

Status Engine::extend(const std::vector<uint64_t>& batchIds,
                      const std::vector<BlockExtension>& extensions) {
  std::map<uint64_t, Request*> live;
  for (uint64_t id : batchIds) {
    auto it = batches_.find(id);
    if (it == batches_.end()) continue;  // the caller reports unknown batches
    for (auto& r : it->second->requests) live[r->spec.id] = r.get();
  }
  const int64_t bs = cache_->blockSize();
  std::map<uint64_t, std::set<uint32_t>> added;
  std::set<uint32_t> extended;  // by this call, to any request
  for (const BlockExtension& e : extensions) {
    auto it = live.find(e.requestId);
    if (it == live.end()) {
      return invalidArgumentError("block extension for request " + std::to_string(e.requestId) +
                                  ", which is not in the batch");
    }
    const Request& req = *it->second;
    const RequestSpec& spec = req.spec;
    std::set<uint32_t>& mine = added[e.requestId];
    for (uint32_t b : e.blocks) {
      if (b >= cache_->numBlocks())
        return invalidArgumentError("block extension: block " + std::to_string(b) +
                                    " out of range");
      if (!mine.insert(b).second ||
          std::find(spec.blocks.begin(), spec.blocks.end(), b) != spec.blocks.end()) {
        return invalidArgumentError("block extension: block " + std::to_string(b) +
                                    " twice in request " + std::to_string(e.requestId) +
                                    "'s table");
      }
      // A block another request holds (its prefix or its own positions) would be written twice.
      if (use(b).holders > 0) {
        return invalidArgumentError("block extension: request " + std::to_string(e.requestId) +
                                    ": block " + std::to_string(b) + " is held by another request");
      }
      if (!extended.insert(b).second) {
        return invalidArgumentError("block extension: block " + std::to_string(b) +
                                    " given to two requests");
      }
    }
    // A request never needs more blocks than its prompt + max_new_tokens fill.
    const auto total = static_cast<int64_t>(spec.blocks.size() + mine.size());
    if (total > (req.maxLength(bs) + bs - 1) / bs) {
      return invalidArgumentError("block extension gives request " + std::to_string(e.requestId) +
                                  " " + std::to_string(total) +
                                  " blocks, more than its prompt + max_new_tokens fill");
    }
  }
  // Every position the step writes has a block once the extensions are in (checked before
  // anything changes: a refused call leaves the batches as they were).
  for (const auto& [id, r] : live) {
    const int64_t end = r->computed + r->nextRows();
    auto a = added.find(id);
    const auto blocks =
        static_cast<int64_t>(r->spec.blocks.size() + (a == added.end() ? 0 : a->second.size()));
    if (blocks < r->blocksFor(end, bs)) {
      return failedPreconditionError("request " + std::to_string(id) +
                                     " has no KV block for position " + std::to_string(end - 1) +
                                     ": extend its blocks first");
    }
  }
  for (const BlockExtension& e : extensions) live[e.requestId]->addBlocks(e.blocks);
  return okStatus();
}

StatusOr<StepResult> Engine::step(std::unique_ptr<Batch> batch) {
  const uint64_t start = nowNs();
  // Every position this step writes has a block: extend() checked the cached requests, validate()
  // the new ones' prompts; this is the last line before a write past a table.
  const int64_t bs = cache_->blockSize();
  for (const auto& r : batch->requests) {
    const int64_t end = r->computed + r->nextRows();
    if (static_cast<int64_t>(r->spec.blocks.size()) < r->blocksFor(end, bs)) {
      const uint64_t id = r->spec.id;
      batches_.emplace(batch->id, std::move(batch));  // unchanged: the router decides
      return failedPreconditionError("request " + std::to_string(id) +
                                     " has no KV block for position " + std::to_string(end - 1) +
                                     ": extend its blocks first");
    }
  }
  const StepPlan plan = schedule(*batch);
  reachedForward_ = true;
  auto outputs = execute(plan);
  if (!outputs.ok()) {
    for (const auto& r : batch->requests) r->draft.clear();
    batches_.emplace(batch->id, std::move(batch));  // keep the batch: the router decides
    return outputs.status();
  }
  const uint64_t forwardDone = nowNs();
  StepResult result = update(*batch, plan, *outputs);
  if (!batch->requests.empty()) {
    result.batch = info(*batch);
    batches_.emplace(batch->id, std::move(batch));
  }
  const uint64_t end = nowNs();
  result.forwardNs = forwardDone - start;
  result.decodeNs = end - forwardDone;
  result.totalNs = end - start;
  return result;
}

StatusOr<StepResult> Engine::prefill(uint64_t batchId, std::vector<RequestSpec> requests,
                                     std::optional<uint64_t> cachedBatchId,
                                     const std::vector<BlockExtension>& extensions) {
  reachedForward_ = false;
  if (!cache_) return failedPreconditionError("Warmup has not run: the KV cache is not allocated");
  if (requests.empty() && !cachedBatchId) return invalidArgumentError("empty batch");
  if (batches_.contains(batchId) && batchId != cachedBatchId) {
    return invalidArgumentError("batch " + std::to_string(batchId) + " already exists");
  }
  if (cachedBatchId && !batches_.contains(*cachedBatchId))
    return invalidArgumentError("batch " + std::to_string(*cachedBatchId) + " not found");
  if (!extensions.empty() && !cachedBatchId)
    return invalidArgumentError("block extensions without a cached batch");
  // A request id twice in the call, or one a live request has, fails the whole call (nothing
  // changes): answered alone, the refusal would carry the live request's id, and the router would
  // take it for that request's and free its blocks while the shard still writes them.
  std::set<uint64_t> ids;
  for (const auto& [id, b] : batches_) {
    for (const auto& r : b->requests) ids.insert(r->spec.id);
  }
  {
    std::set<uint64_t> mine;
    for (const RequestSpec& r : requests) {
      if (ids.contains(r.id) || !mine.insert(r.id).second) {
        return invalidArgumentError("request " + std::to_string(r.id) +
                                    ": id already in use (by a live request or twice in the call)");
      }
    }
  }
  // One bad request fails alone: it is answered with its reason and left out of the batch.
  std::vector<GenerationResult> refused;
  std::vector<std::unique_ptr<Request>> accepted;
  for (RequestSpec& r : requests) {
    Status s = validate(r);
    if (!s.ok()) {
      refused.push_back(GenerationResult::refusal(r.id, s.message()));
      continue;
    }
    const ModelConfig& config = model_.config();
    auto req = config.isEncoderDecoder
                   ? std::make_unique<Request>(std::move(r), tokenizer_, config.eosTokenIds,
                                               config.decoderStartTokenId, cache_->blockSize())
                   : std::make_unique<Request>(std::move(r), tokenizer_, config.eosTokenIds);
    if (s = attachGrammar(*req); !s.ok()) {
      refused.push_back(GenerationResult::refusal(req->spec.id, s.message()));
      continue;
    }
    if (s = req->replayGenerated(); !s.ok()) {
      refused.push_back(GenerationResult::refusal(req->spec.id, s.message()));
      continue;
    }
    // Block ownership is the router's; a table that breaks it is refused here rather than
    // writing over another request's keys and values. The blocks a request writes (from the one
    // holding position cache_len on; an encoder-decoder request's whole table, encoder output
    // first) are no other live request's, and its cached prefix before them is no live request's
    // still to write. A request accepted by this call counts as live from here.
    if (s = checkTable(*req); !s.ok()) {
      refused.push_back(GenerationResult::refusal(req->spec.id, s.message()));
      continue;
    }
    req->hold(blockUses_, cache_->blockSize());
    accepted.push_back(std::move(req));
  }
  if (accepted.empty() && !cachedBatchId) {
    StepResult only;
    only.generations = std::move(refused);
    return only;
  }
  if (cachedBatchId) TG_RETURN_IF_ERROR(extend({*cachedBatchId}, extensions));
  const uint64_t start = nowNs();
  auto batch = std::make_unique<Batch>();
  batch->id = batchId;
  std::optional<uint64_t> concatNs;
  if (cachedBatchId) {
    auto it = batches_.find(*cachedBatchId);
    batch = std::move(it->second);
    batches_.erase(it);
    batch->id = batchId;
    concatNs = nowNs() - start;
  }
  for (auto& r : accepted) batch->requests.push_back(std::move(r));
  TG_ASSIGN_OR_RETURN(StepResult result, step(std::move(batch)));
  result.concatNs = concatNs;
  for (GenerationResult& g : refused) result.generations.push_back(std::move(g));
  return result;
}

StatusOr<StepResult> Engine::decode(std::vector<uint64_t> batchIds,
                                    std::vector<BlockExtension> extensions, bool followsStep) {
  reachedForward_ = false;
  if (batchIds.empty()) return invalidArgumentError("no batches to decode");
  if (followsStep) {
    // Planned before the step ahead of it ended: what that step finished is gone, batches and
    // requests alike, and so are their extensions.
    std::erase_if(batchIds, [&](uint64_t id) { return !batches_.contains(id); });
    if (batchIds.empty()) return StepResult{};
    std::set<uint64_t> live;
    for (uint64_t id : batchIds)
      for (const auto& r : batches_.at(id)->requests) live.insert(r->spec.id);
    std::erase_if(extensions, [&](const BlockExtension& e) { return !live.contains(e.requestId); });
  }
  for (uint64_t id : batchIds) {
    if (!batches_.contains(id))
      return invalidArgumentError("batch " + std::to_string(id) + " not found");
  }
  TG_RETURN_IF_ERROR(extend(batchIds, extensions));
  const uint64_t start = nowNs();
  auto merged = std::move(batches_[batchIds[0]]);
  batches_.erase(batchIds[0]);
  for (size_t i = 1; i < batchIds.size(); ++i) {
    auto other = batches_.find(batchIds[i]);
    if (other == batches_.end()) continue;  // the same id twice: merged already
    for (auto& r : other->second->requests) merged->requests.push_back(std::move(r));
    batches_.erase(other);
  }
  const std::optional<uint64_t> concatNs =
      batchIds.size() > 1 ? std::optional<uint64_t>(nowNs() - start) : std::nullopt;
  TG_ASSIGN_OR_RETURN(StepResult result, step(std::move(merged)));
  result.concatNs = concatNs;
  return result;
}

StatusOr<BatchInfo> Engine::filter(uint64_t batchId, const std::vector<uint64_t>& keep) {
  auto it = batches_.find(batchId);
  if (it == batches_.end())
    return invalidArgumentError("batch " + std::to_string(batchId) + " not found");
  // As TGI's servers: a batch keeps at least one request (an emptied batch is cleared instead,
  // ClearCache), so no empty batch stays registered for a later Decode or Prefill to fail on.
  if (keep.empty()) {
    return invalidArgumentError("filter of batch " + std::to_string(batchId) +
                                " keeps no request: clear the batch instead (ClearCache)");
  }
  for (uint64_t id : keep) {
    bool found = false;
    for (const auto& r : it->second->requests) found |= r->spec.id == id;
    if (!found)
      return invalidArgumentError("request " + std::to_string(id) + " is not in batch " +
                                  std::to_string(batchId));
  }
  std::erase_if(it->second->requests, [&](const std::unique_ptr<Request>& r) {
    return std::find(keep.begin(), keep.end(), r->spec.id) == keep.end();
  });
  return info(*it->second);
}

void Engine::clear(std::optional<uint64_t> batchId) {
  if (batchId) {
    batches_.erase(*batchId);
  } else {
    batches_.clear();
  }
}

Status Engine::captureDecodeGraphs() {
  const std::vector<int64_t> sizes = model_.graphBatchSizes();
  if (sizes.empty() || model_.config().isEncoderDecoder) return okStatus();
  const uint64_t start = nowNs();
  // Each size's batch: that many one-token sequences at position 0, all in block 0 (reserved: the
  // router never gives it to a request, and graphs pad with it), so they write no request's KV.
  const std::vector<uint32_t> table{0};
  for (int64_t n : sizes) {
    ForwardBatch fb;
    fb.decode = true;
    for (int64_t i = 0; i < n; ++i) {
      fb.tokenIds.push_back(0);
      fb.slots.push_back(0);
      fb.sequences.push_back({.firstRow = i, .numRows = 1, .startPos = 0, .blocks = table});
      fb.logitRows.push_back(i);
    }
    TG_ASSIGN_OR_RETURN(const LogitsView logits, model_.forwardLogits(fb, *cache_));
    TG_RETURN_IF_ERROR(sampler_.greedy(logits).status());
  }
  TG_RETURN_IF_ERROR(backend_.synchronize());
  spdlog::info("decode graphs for batch sizes {} to {} ({} sizes) captured in {:.2f} s",
               sizes.front(), sizes.back(), sizes.size(),
               static_cast<double>(nowNs() - start) * 1e-9);
  return okStatus();
}

StatusOr<WarmupResult> Engine::warmup(uint64_t batchId, std::vector<RequestSpec> requests,
                                      std::optional<uint32_t> maxInputTokens,
                                      uint32_t maxPrefillTokens,
                                      std::optional<uint32_t> maxTotalTokens) {
  const kernels::DType dtype = model_.dtype();
  const kernels::KvCacheDType cacheDtype = options_.kvCacheDtype;
  const KvShape kv = model_.kvShape();
  const int64_t perBlock = KvCache::bytesPerBlock(kv, options_.blockSize, dtype, cacheDtype);
  int64_t needed = 1;
  for (const RequestSpec& r : requests) {
    for (uint32_t b : r.blocks) needed = std::max<int64_t>(needed, int64_t{b} + 1);
  }
  // A real forward of the largest batch the router will send, then forget it.
  auto runWarmupBatch = [&]() -> Status {
    if (requests.empty()) return okStatus();
    for (RequestSpec& r : requests)
      r.stopping.maxNewTokens = std::max<uint32_t>(r.stopping.maxNewTokens, 1);
    auto result = prefill(batchId, std::move(requests), std::nullopt);
    clear(std::nullopt);
    if (!result.ok()) return result.status().withContext("warmup forward");
    // Every request refused: no forward ran, and memory would be sized without its activations.
    if (!result->generations.empty() &&
        std::all_of(result->generations.begin(), result->generations.end(),
                    [](const GenerationResult& g) { return g.error.has_value(); })) {
      return invalidArgumentError("warmup forward: every request was refused (" +
                                  *result->generations.front().error + ")");
    }
    return backend_.synchronize();
  };
  clear(std::nullopt);
  cache_.reset();
  int64_t numBlocks = 0;
  if (options_.kvCacheBytes > 0) {
    numBlocks = options_.kvCacheBytes / perBlock;
    // Ranks may have been given different budgets (a fraction of each one's available memory):
    // all keep the smallest pool.
    if (options_.comm) {
      auto least = allReduceMin(backend_, *options_.comm, numBlocks);
      if (!least.ok()) return least.status().withContext("agreeing on the KV pool size");
      numBlocks = *least;
    }
    if (numBlocks < needed) {
      return resourceExhaustedError("KV cache budget of " + std::to_string(options_.kvCacheBytes) +
                                    " bytes holds " + std::to_string(numBlocks) + " blocks of " +
                                    std::to_string(options_.blockSize) +
                                    " tokens; the warmup batch needs " + std::to_string(needed));
    }
    TG_ASSIGN_OR_RETURN(
        cache_, KvCache::create(backend_, kv, numBlocks, options_.blockSize, dtype, cacheDtype));
    TG_RETURN_IF_ERROR(runWarmupBatch());
  } else {
    // Sized from device memory, as TGI does: run the warmup prefill with a cache just big enough
    // (its activations stay allocated for reuse), free that cache, then give the KV pool what is
    // left of memoryFraction of the device, less a safety margin.
    if (!backend_.memoryInfo()) {
      return failedPreconditionError(std::string("the ") + backend_.name() +
                                     " backend needs an explicit KV cache budget");
    }
    TG_ASSIGN_OR_RETURN(
        cache_, KvCache::create(backend_, kv, needed, options_.blockSize, dtype, cacheDtype));
    TG_RETURN_IF_ERROR(runWarmupBatch());
    // Buffers for a step of up to max_batch_prefill_tokens logit rows (sequences, or prompt rows
    // with their log-probabilities), and for a mixed step's rows (its prompt chunks end on block
    // boundaries and its decode rows ride along: up to the largest graph's rows more), counted
    // before the pool: a step past the largest graph no longer allocates them (and drops every
    // captured graph) after the pool has taken the free memory.
    const std::vector<int64_t> graphs = model_.graphBatchSizes();
    const int64_t slack = std::max<int64_t>(graphs.empty() ? 0 : graphs.back(), options_.blockSize);
    TG_RETURN_IF_ERROR(model_.reserveRows(int64_t{maxPrefillTokens} + slack, maxPrefillTokens)
                           .withContext("buffers for " + std::to_string(maxPrefillTokens) +
                                        " prompt tokens (--max-batch-prefill-tokens)"));
    cache_.reset();
    TG_RETURN_IF_ERROR(backend_.synchronize());
    const MemoryInfo mem = *backend_.memoryInfo();
    const double budget = static_cast<double>(mem.free) -
                          (1.0 - options_.memoryFraction) * static_cast<double>(mem.total);
    numBlocks = static_cast<int64_t>(std::max(0.0, budget * options_.safetyFraction) /
                                     static_cast<double>(perBlock));
    // Tensor-parallel ranks hold the same blocks: the smallest pool of any rank (the router
    // hears rank 0's answer only).
    if (options_.comm) {
      auto least = allReduceMin(backend_, *options_.comm, numBlocks);
      if (!least.ok()) return least.status().withContext("agreeing on the KV pool size");
      numBlocks = *least;
    }
    if (numBlocks < needed) {
      return resourceExhaustedError(
          "not enough device memory for the KV cache: " + std::to_string(mem.free >> 20) +
          " MiB free of " + std::to_string(mem.total >> 20) +
          " MiB after the warmup prefill (memory fraction " +
          std::to_string(options_.memoryFraction) + ") holds " + std::to_string(numBlocks) +
          " blocks; the warmup batch needs " + std::to_string(needed) +
          ": lower --max-batch-prefill-tokens or use a larger GPU");
    }
    auto cache = KvCache::create(backend_, kv, numBlocks, options_.blockSize, dtype, cacheDtype);
    if (!cache.ok())
      return cache.status().withContext("KV cache of " + std::to_string(numBlocks) + " blocks");
    cache_ = std::move(*cache);
  }
  TG_RETURN_IF_ERROR(captureDecodeGraphs().withContext("capturing the decode graphs"));
  WarmupResult w;
  w.maxSupportedTotalTokens =
      static_cast<uint32_t>(std::min<int64_t>(numBlocks * options_.blockSize, UINT32_MAX));
  const auto context = static_cast<uint32_t>(std::min<int64_t>(maxContext(), UINT32_MAX));
  w.maxTotalTokens = maxTotalTokens.value_or(std::min(context, w.maxSupportedTotalTokens));
  w.maxInputTokens = maxInputTokens.value_or(
      std::min(w.maxTotalTokens > 1 ? w.maxTotalTokens - 1 : 1u, maxPrefillTokens));
  return w;
}

}  // namespace textgen::runtime
