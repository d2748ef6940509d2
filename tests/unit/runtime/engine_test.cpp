// The engine directly: Decode of several cached batches as one, prefix reuse through cache_len,
// filter errors, and stop sequences cutting generation short.
#include "textgen/runtime/engine.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "textgen/grammar/grammar.h"

namespace textgen::runtime {
namespace {

const std::string kDir = std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = makeCpuBackend(1);
    auto m = loadModel(kDir, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto t = tokenizer::Tokenizer::fromDirectory(kDir);
    ASSERT_TRUE(t.ok());
    tok_ = std::move(*t);
    engine_ = std::make_unique<Engine>(*model_, *tok_, *backend_,
                                       EngineOptions{.blockSize = 4, .kvCacheBytes = 1 << 22});
    ASSERT_TRUE(engine_->warmup(0, {}, std::nullopt, 64, std::nullopt).ok());
    std::ifstream in(kDir + "/reference.json");
    ref_ = nlohmann::json::parse(in);
  }

  RequestSpec spec(uint64_t id, int prompt, uint32_t maxNew, uint32_t firstBlock = 0) {
    RequestSpec r;
    r.id = id;
    r.inputIds = ref_["prompts"][prompt]["input_ids"].get<std::vector<uint32_t>>();
    r.stopping.maxNewTokens = maxNew;
    r.stopping.ignoreEosToken = true;
    for (uint32_t b = 0; b < (r.inputIds.size() + maxNew + 3) / 4; ++b)
      r.blocks.push_back(firstBlock + b);
    return r;
  }
  std::vector<uint32_t> greedy(int prompt, size_t n) {
    auto g = ref_["prompts"][prompt]["greedy"].get<std::vector<uint32_t>>();
    g.resize(n);
    return g;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
  nlohmann::json ref_;
};

TEST_F(EngineTest, DecodesSeveralCachedBatchesAsOne) {
  std::map<uint64_t, std::vector<uint32_t>> out;
  auto absorb = [&](const StepResult& s) {
    for (const auto& g : s.generations) out[g.requestId].push_back(g.tokens.ids[0]);
  };
  auto a = engine_->prefill(1, {spec(1, 0, 12)}, std::nullopt);
  auto b = engine_->prefill(2, {spec(2, 1, 12, 100)}, std::nullopt);
  ASSERT_TRUE(a.ok() && b.ok());
  absorb(*a);
  absorb(*b);
  auto merged = engine_->decode({1, 2});
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(merged->concatNs.has_value());
  ASSERT_TRUE(merged->batch.has_value());
  EXPECT_EQ(merged->batch->id, 1u);  // the merged batch keeps the first id
  EXPECT_EQ(merged->batch->requestIds, (std::vector<uint64_t>{1, 2}));
  absorb(*merged);
  EXPECT_EQ(engine_->decode({2}).status().code(), StatusCode::kInvalidArgument);  // merged away
  while (true) {
    auto s = engine_->decode({1});
    ASSERT_TRUE(s.ok());
    absorb(*s);
    if (!s->batch) break;
  }
  EXPECT_EQ(out[1], greedy(0, 12));
  EXPECT_EQ(out[2], greedy(1, 12));
}

TEST_F(EngineTest, GreedyOnTheModelEqualsTheHostSampler) {
  // A plain greedy request takes the model's arg-max path; asking for top-n tokens sends the same
  // request through the model's sampling path (kernels::sample, the host sampler's code on the
  // CPU). Tokens and log-probabilities agree.
  auto run = [&](uint64_t id, uint32_t topN) {
    RequestSpec r = spec(id, 3, 10, static_cast<uint32_t>(id) * 20);
    r.sampling.topNTokens = topN;
    std::vector<std::pair<uint32_t, float>> out;
    auto s = engine_->prefill(id, {r}, std::nullopt);
    while (true) {
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      for (const auto& g : s->generations) out.emplace_back(g.tokens.ids[0], g.tokens.logprobs[0]);
      if (!s->batch) break;
      s = engine_->decode({id});
    }
    return out;
  };
  const auto onModel = run(1, 0), onHost = run(2, 1);
  ASSERT_EQ(onModel.size(), 10u);
  ASSERT_EQ(onHost.size(), 10u);
  for (size_t i = 0; i < onModel.size(); ++i) {
    EXPECT_EQ(onModel[i].first, onHost[i].first) << "token " << i;
    EXPECT_NEAR(onModel[i].second, onHost[i].second, 1e-5) << "logprob " << i;
    EXPECT_EQ(onModel[i].first, greedy(3, 10)[i]);
  }
}

TEST_F(EngineTest, CacheLenReusesAPrefixAlreadyInTheBlocks) {
  // Request 1 fills its blocks with the prompt; request 2 reuses those blocks and declares all but
  // the last prompt token cached: only one token is computed, and the output is the same.
  auto first = engine_->prefill(1, {spec(1, 2, 6, 0)}, std::nullopt);
  ASSERT_TRUE(first.ok());
  engine_->clear(std::nullopt);
  RequestSpec again = spec(2, 2, 6, 0);
  again.cacheLen = static_cast<uint32_t>(again.inputIds.size() - 1);
  auto second = engine_->prefill(2, {again}, std::nullopt);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->generations.size(), 1u);
  EXPECT_EQ(second->generations[0].tokens.ids[0], first->generations[0].tokens.ids[0]);
  std::vector<uint32_t> got{second->generations[0].tokens.ids[0]};
  while (second->batch) {
    second = engine_->decode({2});
    ASSERT_TRUE(second.ok());
    got.push_back(second->generations[0].tokens.ids[0]);
  }
  EXPECT_EQ(got, greedy(2, 6));
  // Prompt logprobs need every prompt token computed: a cached prefix is refused, naming why.
  RequestSpec withLogprobs = spec(3, 2, 6, 0);
  withLogprobs.cacheLen = 1;
  withLogprobs.prefillLogprobs = true;
  auto refused = engine_->prefill(3, {withLogprobs}, std::nullopt);
  const bool named =
      refused.ok()
          ? refused->generations.size() == 1 && refused->generations[0].error &&
                refused->generations[0].error->find("prefill_logprobs") != std::string::npos
          : refused.status().message().find("prefill_logprobs") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST_F(EngineTest, StopSequenceAndFilterErrors) {
  RequestSpec r = spec(1, 0, 32, 0);
  // Stop at the text of the 3rd greedy token, as the stream produces it.
  auto first = engine_->prefill(1, {r}, std::nullopt);
  ASSERT_TRUE(first.ok());
  std::string text = first->generations[0].tokens.texts[0];
  for (int i = 0; i < 2; ++i) {
    auto s = engine_->decode({1});
    ASSERT_TRUE(s.ok());
    text += s->generations[0].tokens.texts[0];
  }
  engine_->clear(std::nullopt);
  ASSERT_FALSE(text.empty());
  r.stopping.stopSequences = {text.substr(text.size() - 1)};
  auto again = engine_->prefill(2, {r}, std::nullopt);
  ASSERT_TRUE(again.ok());
  std::optional<FinishedText> finished = again->generations[0].finished;
  int steps = 0;
  while (!finished && steps++ < 40) {
    auto s = engine_->decode({2});
    ASSERT_TRUE(s.ok());
    finished = s->generations[0].finished;
  }
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->reason, FinishReason::kStopSequence);
  EXPECT_LE(finished->generatedTokens, 3u);

  ASSERT_TRUE(engine_->prefill(3, {spec(3, 1, 4, 200)}, std::nullopt).ok());
  EXPECT_EQ(engine_->filter(3, {99}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->filter(42, {3}).status().code(), StatusCode::kInvalidArgument);
  // Keeping no request is refused (as TGI's servers refuse it; the router clears an emptied batch
  // instead), and the batch is left as it was.
  auto none = engine_->filter(3, {});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("keeps no request"), std::string::npos) << none.status();
  auto kept = engine_->filter(3, {3});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->requestIds, std::vector<uint64_t>{3});
  ASSERT_TRUE(engine_->decode({3}).ok());
}

TEST_F(EngineTest, AnInvalidRequestFailsAloneAndTheRestOfItsBatchRuns) {
  // Values the router refuses, sent anyway (an old router, a hand-made RPC): each is refused on
  // its own with its reason; the good request's tokens are the reference's.
  std::vector<RequestSpec> batch;
  batch.push_back(spec(1, 0, 6));
  RequestSpec hot = spec(2, 1, 6, 100);
  hot.sampling.doSample = true;
  hot.sampling.temperature = std::numeric_limits<float>::infinity();
  batch.push_back(hot);
  RequestSpec penalty = spec(3, 1, 6, 200);
  penalty.sampling.repetitionPenalty = 1e-38f;
  batch.push_back(penalty);
  RequestSpec tooFewBlocks = spec(4, 1, 6, 300);
  tooFewBlocks.blocks.resize(1);
  batch.push_back(tooFewBlocks);
  RequestSpec manyTop = spec(5, 1, 6, 500);  // more alternatives than the vocabulary has
  manyTop.sampling.topNTokens = static_cast<uint32_t>(model_->config().vocabSize) + 1;
  batch.push_back(manyTop);
  auto s = engine_->prefill(1, std::move(batch), std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  std::map<uint64_t, std::string> errors;
  std::vector<uint32_t> tokens;
  for (const auto& g : s->generations) {
    if (g.error) {
      errors[g.requestId] += *g.error;
    } else {
      tokens.push_back(g.tokens.ids.at(0));
      EXPECT_EQ(g.requestId, 1u);
    }
  }
  EXPECT_NE(errors[2].find("temperature"), std::string::npos) << errors[2];
  EXPECT_NE(errors[3].find("repetition_penalty"), std::string::npos) << errors[3];
  EXPECT_NE(errors[4].find("blocks"), std::string::npos) << errors[4];
  EXPECT_NE(errors[5].find("top_n_tokens"), std::string::npos) << errors[5];
  ASSERT_TRUE(s->batch.has_value());
  EXPECT_EQ(s->batch->requestIds, std::vector<uint64_t>{1});
  while (s->batch) {
    s = engine_->decode({1});
    ASSERT_TRUE(s.ok()) << s.status();
    for (const auto& g : s->generations) tokens.push_back(g.tokens.ids.at(0));
  }
  EXPECT_EQ(tokens, greedy(0, 6));
  // A batch of refusals only: answered, nothing cached.
  RequestSpec alone = spec(9, 0, 6);
  alone.inputIds.clear();
  auto only = engine_->prefill(2, {alone}, std::nullopt);
  ASSERT_TRUE(only.ok()) << only.status();
  ASSERT_EQ(only->generations.size(), 1u);
  EXPECT_TRUE(only->generations[0].error.has_value());
  EXPECT_FALSE(only->batch.has_value());
}

TEST_F(EngineTest, AnIdInUseFailsTheWholePrefillAndChangesNothing) {
  // Refused alone, a duplicate's refusal would carry a live request's id (the router would free
  // that request's blocks): the whole call is refused instead, and nothing changes.
  // (Each refusal comes before the forward: a tensor-parallel group's ranks refuse it alike.)
  auto first = engine_->prefill(1, {spec(1, 0, 6)}, std::nullopt);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(engine_->lastCallReachedForward());
  std::vector<uint32_t> tokens = {first->generations.at(0).tokens.ids.at(0)};
  auto live = engine_->prefill(2, {spec(1, 1, 6, 100)}, std::nullopt);
  EXPECT_EQ(live.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(live.status().message().find("id already in use"), std::string::npos) << live.status();
  EXPECT_FALSE(engine_->lastCallReachedForward());
  auto twice = engine_->prefill(3, {spec(7, 1, 6, 200), spec(7, 2, 6, 300)}, std::nullopt);
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(engine_->lastCallReachedForward());
  // Neither batch exists, and request 1 decodes on as alone.
  EXPECT_EQ(engine_->decode({2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(engine_->lastCallReachedForward());
  EXPECT_EQ(engine_->decode({3}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->decode({1}, {{.requestId = 99, .blocks = {900}}}).status().code(),
            StatusCode::kInvalidArgument);  // an extension for a request not in the batch
  EXPECT_FALSE(engine_->lastCallReachedForward());
  StatusOr<StepResult> s = engine_->decode({1});
  while (s.ok() && s->batch) {
    for (const auto& g : s->generations) tokens.push_back(g.tokens.ids.at(0));
    s = engine_->decode({1});
  }
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& g : s->generations) tokens.push_back(g.tokens.ids.at(0));
  EXPECT_EQ(tokens, greedy(0, 6));
}

// Learned positions (OPT's table of max_position_embeddings rows, here 256) end: a request whose
// prompt + max_new_tokens exceed them is refused alone when it arrives (TGI's rule; one that ran on
// would fail its whole batch's step once it fed a position past the table); one that just fits
// runs to its last token. Rotary positions have no such end (llama-gqa, also 256: a longer request
// is taken).
TEST(EngineLearnedPositions, ARequestPastTheTableIsRefusedAloneAndOneThatFitsRunsToTheEnd) {
  const std::string dir = std::string(TEXTGEN_MODEL_FIXTURES) + "/opt-pre";
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->config().learnedPositions);
  ASSERT_EQ((*model)->config().maxContext(), 256);
  auto tok = tokenizer::Tokenizer::fromDirectory(dir);
  ASSERT_TRUE(tok.ok());
  Engine engine(**model, **tok, *backend, EngineOptions{.blockSize = 16, .kvCacheBytes = 1 << 22});
  ASSERT_TRUE(engine.warmup(0, {}, std::nullopt, 64, std::nullopt).ok());
  auto request = [](uint64_t id, uint32_t maxNew, uint32_t firstBlock) {
    RequestSpec r;
    r.id = id;
    r.inputIds = {2, 100, 200, 300, 400, 500};
    r.stopping.maxNewTokens = maxNew;
    r.stopping.ignoreEosToken = true;
    for (uint32_t b = 0; b < 16; ++b) r.blocks.push_back(firstBlock + b);
    return r;
  };
  auto s = engine.prefill(1, {request(1, 250, 0), request(2, 251, 16)}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  size_t tokens = 0;
  for (const auto& g : s->generations) {
    if (g.requestId == 2) {
      ASSERT_TRUE(g.error.has_value());
      EXPECT_NE(g.error->find("learned positions"), std::string::npos) << *g.error;
    } else {
      EXPECT_FALSE(g.error.has_value());
      ++tokens;
    }
  }
  ASSERT_TRUE(s->batch.has_value());
  EXPECT_EQ(s->batch->requestIds, std::vector<uint64_t>{1});
  while (s->batch) {
    s = engine.decode({1});
    ASSERT_TRUE(s.ok()) << s.status();
    tokens += s->generations.size();
  }
  EXPECT_EQ(tokens, 250u);
  // A resumed request counts its prompt without what it generated: 6 + 250 fits, though its input
  // holds 16 tokens.
  RequestSpec resumed = request(3, 250, 32);
  resumed.inputIds.insert(resumed.inputIds.end(), {7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  resumed.generatedTokens = 10;
  auto r = engine.prefill(3, {resumed}, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->generations.size(), 1u);
  EXPECT_FALSE(r->generations[0].error.has_value()) << *r->generations[0].error;
  // GPTBigCode's positions are learned too.
  auto bigcode = loadArchitectureConfig(std::string(TEXTGEN_MODEL_FIXTURES) + "/bigcode-mha");
  ASSERT_TRUE(bigcode.ok()) << bigcode.status();
  EXPECT_TRUE(bigcode->learnedPositions);
}

TEST_F(EngineTest, RotaryPositionsTakeARequestPastMaxPositionEmbeddings) {
  ASSERT_FALSE(model_->config().learnedPositions);
  auto s = engine_->prefill(1, {spec(1, 0, 300)}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->generations.size(), 1u);
  EXPECT_FALSE(s->generations[0].error.has_value()) << *s->generations[0].error;
}

// A warmup batch whose every request is refused ran no forward: memory sized without it could
// fail the first real batch of that size, so the warmup fails, naming the reason.
TEST_F(EngineTest, AWarmupWhoseEveryRequestIsRefusedFails) {
  RequestSpec bad = spec(1, 0, 4);
  bad.inputIds.push_back(static_cast<uint32_t>(model_->config().vocabSize));  // out of vocabulary
  auto w = engine_->warmup(5, {bad}, std::nullopt, 64, std::nullopt);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("every request was refused"), std::string::npos)
      << w.status();
  EXPECT_NE(w.status().message().find("out of vocabulary"), std::string::npos) << w.status();
  // A good one warms up.
  ASSERT_TRUE(engine_->warmup(6, {spec(2, 0, 4)}, std::nullopt, 64, std::nullopt).ok());
}

TEST_F(EngineTest, DecodeOfTheSameBatchTwiceLeavesNoEmptyBatchBehind) {
  ASSERT_TRUE(engine_->prefill(1, {spec(1, 0, 6)}, std::nullopt).ok());
  auto s = engine_->decode({1, 1});
  ASSERT_TRUE(s.ok()) << s.status();
  // The duplicate used to leave a null batch under id 1's old slot: a later decode crashed.
  auto again = engine_->decode({1});
  ASSERT_TRUE(again.ok()) << again.status();
}

// One request's stream: its tokens, their text pieces and how it ended.
struct Stream {
  std::vector<uint32_t> ids;
  std::string text;
  std::optional<FinishedText> finished;
};

// Runs `r` to its end, growing its block table one block at a time as a growing router does (a
// block of 4 past `firstFree` whenever the next step would write past the table); stops early after
// `stopAfter` tokens, leaving the batch on the engine.
Stream runGrowing(Engine& e, RequestSpec r, uint64_t batch, uint32_t& nextBlock,
                  size_t stopAfter = SIZE_MAX) {
  Stream out;
  const size_t prompt = r.inputIds.size();
  r.blocks.clear();
  while (r.blocks.size() * 4 < prompt) r.blocks.push_back(nextBlock++);
  auto absorb = [&](const StepResult& s) {
    for (const auto& g : s.generations) {
      EXPECT_FALSE(g.error.has_value()) << *g.error;
      if (g.error) continue;
      out.ids.push_back(g.tokens.ids[0]);
      out.text += g.tokens.texts[0];
      if (g.finished) out.finished = g.finished;
    }
  };
  auto s = e.prefill(batch, {r}, std::nullopt);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  absorb(*s);
  size_t blocks = r.blocks.size();
  while (s->batch && out.ids.size() < stopAfter) {
    // The next decode writes the position of the last token: prompt + generated - 1.
    std::vector<BlockExtension> ext;
    if (blocks * 4 < prompt + out.ids.size()) {
      ext.push_back({r.id, {nextBlock++}});
      ++blocks;
    }
    s = e.decode({batch}, ext);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) break;
    absorb(*s);
  }
  return out;
}

TEST_F(EngineTest, AResumedRequestContinuesItsStreamExactly) {
  // Preemption by recompute: the request is dropped after 5 tokens and sent again with them as the
  // last of its input (generated_tokens 5). Its tokens, text, stop sequence and final text are the
  // uninterrupted run's, with seeded sampling too (the generator skips the draws already made).
  for (bool sample : {false, true}) {
    SCOPED_TRACE(sample);
    RequestSpec r = spec(1, 2, 16);
    r.sampling.doSample = sample;
    r.sampling.seed = 1234;
    r.sampling.temperature = 0.7f;
    r.sampling.repetitionPenalty = 1.3f;
    uint32_t next = 1;
    const Stream whole = runGrowing(*engine_, r, 1, next);
    engine_->clear(std::nullopt);
    ASSERT_EQ(whole.ids.size(), 16u);
    for (const std::vector<std::string>& stops :
         {std::vector<std::string>{}, std::vector<std::string>{"\x01never"}}) {
      RequestSpec s = r;
      s.stopping.stopSequences = stops;
      next = 1;
      const Stream first = runGrowing(*engine_, s, 1, next, 5);
      engine_->clear(std::nullopt);
      ASSERT_EQ(first.ids.size(), 5u);
      RequestSpec resumed = s;
      resumed.id = 2;
      resumed.inputIds.insert(resumed.inputIds.end(), first.ids.begin(), first.ids.end());
      resumed.generatedTokens = 5;
      next = 200;
      const Stream rest = runGrowing(*engine_, resumed, 2, next);
      engine_->clear(std::nullopt);
      std::vector<uint32_t> ids = first.ids;
      ids.insert(ids.end(), rest.ids.begin(), rest.ids.end());
      EXPECT_EQ(ids, whole.ids);
      EXPECT_EQ(first.text + rest.text, whole.text);
      ASSERT_TRUE(rest.finished.has_value());
      EXPECT_EQ(rest.finished->text, whole.finished->text);
      EXPECT_EQ(rest.finished->generatedTokens, 16u);
      EXPECT_EQ(rest.finished->reason, FinishReason::kLength);
    }
  }
}

// Constrained decoding: every token the engine picks continues a match of the request's grammar,
// and the request ends by EOS in an accepting state; greedy on the device path, seeded sampling,
// and the host-logits path (prompt log-probabilities) alike.
TEST_F(EngineTest, GrammarsConstrainEveryChoiceAndEndInAnAcceptingState) {
  using G = SamplingParams::Grammar;
  const std::vector<std::pair<G, std::string>> grammars = {
      {G::kRegex, "[a-z]{2,4}-[0-9]{2}"},
      {G::kRegex, "(yes|no)!"},
      {G::kJson,
       R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]},
           "tag": {"type": "string", "maxLength": 3}}, "required": ["ok", "n", "tag"]})"},
  };
  for (const auto& [type, source] : grammars) {
    auto compiled = grammar::Grammar::compile(
        type == G::kJson ? grammar::Kind::kJsonSchema : grammar::Kind::kRegex, source);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE(source + " mode " + std::to_string(mode));
      RequestSpec r = spec(1, mode, 80);
      r.stopping.ignoreEosToken = false;
      r.sampling.grammarType = type;
      r.sampling.grammar = source;
      if (mode == 1) {
        r.sampling.doSample = true;
        r.sampling.seed = 7;
        r.sampling.temperature = 1.5f;
      }
      if (mode == 2) r.prefillLogprobs = true;
      uint32_t next = 1;
      const Stream out = runGrowing(*engine_, r, 1, next);
      engine_->clear(std::nullopt);
      ASSERT_TRUE(out.finished.has_value());
      EXPECT_EQ(out.finished->reason, FinishReason::kEosToken) << out.finished->text;
      EXPECT_TRUE((*compiled)->matches(out.finished->text)) << out.finished->text;
    }
  }
}

TEST_F(EngineTest, AResumedConstrainedRequestContinuesExactly) {
  RequestSpec r = spec(1, 3, 40);
  r.stopping.ignoreEosToken = false;
  r.sampling.grammarType = SamplingParams::Grammar::kRegex;
  r.sampling.grammar = "[a-z ]{6,12}\\.";
  r.sampling.doSample = true;
  r.sampling.seed = 99;
  uint32_t next = 1;
  const Stream whole = runGrowing(*engine_, r, 1, next);
  engine_->clear(std::nullopt);
  ASSERT_TRUE(whole.finished.has_value());
  ASSERT_GT(whole.ids.size(), 4u);
  next = 1;
  const Stream first = runGrowing(*engine_, r, 1, next, 3);
  engine_->clear(std::nullopt);
  RequestSpec resumed = r;
  resumed.id = 2;
  resumed.inputIds.insert(resumed.inputIds.end(), first.ids.begin(), first.ids.end());
  resumed.generatedTokens = 3;
  next = 200;
  const Stream rest = runGrowing(*engine_, resumed, 2, next);
  engine_->clear(std::nullopt);
  std::vector<uint32_t> ids = first.ids;
  ids.insert(ids.end(), rest.ids.begin(), rest.ids.end());
  EXPECT_EQ(ids, whole.ids);
  ASSERT_TRUE(rest.finished.has_value());
  EXPECT_EQ(rest.finished->text, whole.finished->text);
}

TEST_F(EngineTest, ABadGrammarRefusesItsRequestAlone) {
  RequestSpec bad = spec(1, 0, 8);
  bad.sampling.grammarType = SamplingParams::Grammar::kRegex;
  bad.sampling.grammar = "(unclosed";
  RequestSpec worse = spec(2, 1, 8, 100);
  worse.sampling.grammarType = SamplingParams::Grammar::kJson;
  worse.sampling.grammar = R"({"type": "integr"})";
  RequestSpec good = spec(3, 2, 8, 200);
  auto s = engine_->prefill(1, {bad, worse, good}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  std::map<uint64_t, std::string> errors;
  for (const auto& g : s->generations) {
    if (g.error) errors[g.requestId] = *g.error;
  }
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[1].find("grammar is not valid"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("integr"), std::string::npos) << errors[2];
  ASSERT_TRUE(s->batch.has_value());
  EXPECT_EQ(s->batch->requestIds, std::vector<uint64_t>{3});
}

TEST_F(EngineTest, AStopSequenceAcrossTheResumePointStillStops) {
  RequestSpec r = spec(1, 0, 24);
  // A stop sequence: the last bytes of the text up to token 7 (it may match earlier; the
  // uninterrupted run says where it stops).
  uint32_t next = 1;
  const Stream upTo7 = runGrowing(*engine_, r, 1, next, 7);
  engine_->clear(std::nullopt);
  ASSERT_GE(upTo7.text.size(), 2u);
  r.stopping.stopSequences = {
      upTo7.text.substr(upTo7.text.size() - std::min<size_t>(6, upTo7.text.size()))};
  next = 1;
  const Stream stopped = runGrowing(*engine_, r, 1, next);
  engine_->clear(std::nullopt);
  ASSERT_TRUE(stopped.finished.has_value());
  ASSERT_EQ(stopped.finished->reason, FinishReason::kStopSequence);
  const size_t n = stopped.ids.size();
  ASSERT_GE(n, 2u);
  // Preempted one token before the stop: the resumed run stops at the same token.
  next = 1;
  const Stream first = runGrowing(*engine_, r, 1, next, n - 1);
  engine_->clear(std::nullopt);
  RequestSpec resumed = r;
  resumed.id = 2;
  resumed.inputIds.insert(resumed.inputIds.end(), first.ids.begin(), first.ids.end());
  resumed.generatedTokens = static_cast<uint32_t>(n - 1);
  next = 300;
  const Stream rest = runGrowing(*engine_, resumed, 2, next);
  ASSERT_EQ(rest.ids.size(), 1u);
  ASSERT_TRUE(rest.finished.has_value());
  EXPECT_EQ(rest.finished->reason, FinishReason::kStopSequence);
  EXPECT_EQ(rest.finished->text, stopped.finished->text);
  EXPECT_EQ(rest.finished->generatedTokens, n);
}

TEST_F(EngineTest, BadResumesAndBlockExtensionsAreRefused) {
  auto refusal = [&](RequestSpec r) -> std::string {
    auto s = engine_->prefill(50, {r}, std::nullopt);
    engine_->clear(std::nullopt);
    if (!s.ok() || s->generations.size() != 1 || !s->generations[0].error) return "";
    return *s->generations[0].error;
  };
  RequestSpec r = spec(1, 0, 6);
  r.generatedTokens = static_cast<uint32_t>(r.inputIds.size());
  EXPECT_NE(refusal(r).find("generated_tokens"), std::string::npos);
  r = spec(1, 0, 6);
  r.generatedTokens = 6;  // already at max_new_tokens
  EXPECT_NE(refusal(r).find("generated_tokens"), std::string::npos);
  r = spec(1, 0, 6);
  r.generatedTokens = 1;
  r.prefillLogprobs = true;
  EXPECT_NE(refusal(r).find("prefill_logprobs"), std::string::npos);
  // Generated tokens that already end it (an EOS among them, EOS not ignored).
  r = spec(1, 0, 6);
  r.stopping.ignoreEosToken = false;
  ASSERT_FALSE(model_->config().eosTokenIds.empty());
  r.inputIds.push_back(model_->config().eosTokenIds[0]);
  r.generatedTokens = 1;
  EXPECT_NE(refusal(r).find("already end it"), std::string::npos);

  // Blocks for the prompt only: a decode soon writes past them, and says so instead.
  RequestSpec g = spec(7, 0, 8);
  g.blocks.resize((g.inputIds.size() + 3) / 4);
  auto s = engine_->prefill(7, {g}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  for (int i = 0; i < 4 && s.ok(); ++i) s = engine_->decode({7});
  ASSERT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status();
  EXPECT_NE(s.status().message().find("extend"), std::string::npos) << s.status();
  EXPECT_EQ(engine_->decode({7}, {{8, {100}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->decode({7}, {{7, {1u << 30}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->decode({7}, {{7, {100, 101, 102, 103, 104}}}).status().code(),
            StatusCode::kInvalidArgument);  // more than prompt + max_new_tokens fill
  EXPECT_EQ(engine_->prefill(8, {}, std::nullopt, {{7, {100}}}).status().code(),
            StatusCode::kInvalidArgument);  // extensions without a cached batch
  // A block twice in one table (it would overwrite its own keys): in one extension, or one the
  // table already holds.
  EXPECT_EQ(engine_->decode({7}, {{7, {100, 100}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->decode({7}, {{7, {g.blocks[0]}}}).status().code(),
            StatusCode::kInvalidArgument);
  RequestSpec twice = spec(9, 1, 4, 300);
  twice.blocks[1] = twice.blocks[0];
  auto refused = engine_->prefill(9, {twice}, std::nullopt);
  ASSERT_TRUE(refused.ok()) << refused.status();
  ASSERT_EQ(refused->generations.size(), 1u);
  EXPECT_NE(refused->generations[0].error.value_or("").find("twice"), std::string::npos);
  // The refused calls changed nothing: a good extension makes the batch go on.
  s = engine_->decode({7}, {{7, {100}}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->generations.size(), 1u);
}

// Block ownership, checked by the shard whatever the router sends: a request may read another's
// finished blocks as its cached prefix (cache_len), but never write a block another live request
// holds, nor read as its prefix a block another is still to write; every way a request leaves
// gives its blocks back.
TEST_F(EngineTest, ABlockAnotherRequestHoldsIsNeverWrittenAndLeavingFreesIt) {
  auto errorOf = [](const StatusOr<StepResult>& s, uint64_t id) -> std::string {
    if (!s.ok()) return "call failed: " + s.status().toString();
    for (const auto& g : s->generations)
      if (g.requestId == id) return g.error.value_or("");
    return "no answer";
  };
  // Request 1: prompt 2 (8 tokens), blocks 0-3 (block size 4). After its prefill it has computed
  // 8 positions: blocks 0 and 1 are done, 2 and 3 still to write.
  auto one = engine_->prefill(1, {spec(1, 2, 6, 0)}, std::nullopt);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(one->batch.has_value());

  // Its finished block 0 as another request's cached prefix: accepted, and that request's output
  // is its own prompt's (the prefix's keys are the same tokens').
  RequestSpec shared = spec(2, 2, 6, 100);
  shared.blocks[0] = 0;
  shared.cacheLen = 4;
  auto two = engine_->prefill(2, {shared}, std::nullopt);
  ASSERT_EQ(errorOf(two, 2), "");
  std::vector<uint32_t> got{two->generations[0].tokens.ids[0]};

  // cache_len 7 puts position 7, in request 1's block 1, among the positions this one writes.
  RequestSpec overwrites = spec(3, 2, 6, 110);
  overwrites.blocks[0] = 0;
  overwrites.blocks[1] = 1;
  overwrites.cacheLen = 7;
  // A table naming request 1's block 2 (still to write) without any prefix.
  RequestSpec plain = spec(4, 1, 4, 120);
  plain.blocks[1] = 2;
  // A prefix that runs into request 1's block 2, which it still writes (a 12-token prompt, 8
  // of them cached).
  RequestSpec early = spec(5, 2, 4, 130);
  early.inputIds.insert(early.inputIds.end(), early.inputIds.begin(), early.inputIds.begin() + 4);
  early.blocks = {0, 2, 130, 131};
  early.cacheLen = 8;
  // Two requests of one call: the second writes a block of the first, and a third reads, as its
  // prefix, a block the first is about to write.
  RequestSpec first = spec(6, 1, 4, 140);
  RequestSpec second = spec(7, 1, 4, 150);
  second.blocks[1] = first.blocks[1];
  RequestSpec third = spec(8, 2, 4, 160);
  third.blocks[0] = first.blocks[0];
  third.cacheLen = 4;
  auto mixed = engine_->prefill(3, {overwrites, plain, early, first, second, third}, std::nullopt);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_NE(errorOf(mixed, 3).find("block 1 is held by another request"), std::string::npos)
      << errorOf(mixed, 3);
  EXPECT_NE(errorOf(mixed, 4).find("block 2 is held by another request"), std::string::npos)
      << errorOf(mixed, 4);
  EXPECT_NE(errorOf(mixed, 5).find("block 2 of its cached prefix"), std::string::npos)
      << errorOf(mixed, 5);
  EXPECT_EQ(errorOf(mixed, 6), "");
  EXPECT_NE(errorOf(mixed, 7).find("is held by another request"), std::string::npos)
      << errorOf(mixed, 7);
  EXPECT_NE(errorOf(mixed, 8).find("still to be written"), std::string::npos) << errorOf(mixed, 8);
  EXPECT_TRUE(engine_->auditBlocks().ok()) << engine_->auditBlocks();

  // Extensions: a block already in the request's own table; one another request reads as its
  // prefix (block 0), or still writes (block 3, request 1's); one given to two requests at once.
  EXPECT_NE(
      engine_->decode({1, 2}, {{.requestId = 2, .blocks = {0}}}).status().message().find("twice"),
      std::string::npos);
  RequestSpec alone = spec(9, 1, 4, 170);
  alone.blocks.resize(2);  // its prompt's: room for one more
  ASSERT_EQ(errorOf(engine_->prefill(4, {alone}, std::nullopt), 9), "");
  for (const auto& [bad, why] : std::vector<std::pair<std::vector<BlockExtension>, std::string>>{
           {{{.requestId = 9, .blocks = {0}}}, "block 0 is held by another request"},
           {{{.requestId = 9, .blocks = {3}}}, "block 3 is held by another request"},
           {{{.requestId = 9, .blocks = {190}}, {.requestId = 2, .blocks = {190}}},
            "block 190 given to two requests"}}) {
    auto s = engine_->decode({1, 2, 4}, bad);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  }
  EXPECT_TRUE(engine_->auditBlocks().ok()) << engine_->auditBlocks();

  // Requests 1 and 2 run to the end, request 2 with the right tokens; request 9 is filtered out
  // and batch 3 (request 6) cleared: every block they held can be written again.
  auto d = engine_->decode({2});
  while (d.ok()) {
    for (const auto& g : d->generations)
      if (g.requestId == 2) got.push_back(g.tokens.ids[0]);
    if (!d->batch) break;
    d = engine_->decode({2});
  }
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(got, greedy(2, 6));
  while (true) {
    auto s = engine_->decode({1});
    ASSERT_TRUE(s.ok()) << s.status();
    if (!s->batch) break;
  }
  RequestSpec stays = spec(10, 1, 4, 180);
  ASSERT_EQ(errorOf(engine_->prefill(4, {stays}, std::nullopt, {}), 10),
            "call failed: INVALID_ARGUMENT: batch 4 already exists");
  auto joined = engine_->prefill(5, {stays}, 4);
  ASSERT_EQ(errorOf(joined, 10), "");
  ASSERT_TRUE(engine_->filter(5, {10}).ok());
  engine_->clear(3);
  std::vector<RequestSpec> again;
  for (uint32_t b : {0u, 100u, 140u, 170u}) again.push_back(spec(20 + b, 1, 4, b));
  auto s = engine_->prefill(6, again, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const RequestSpec& r : again) EXPECT_EQ(errorOf(s, r.id), "") << r.id;

  // A Prefill that fails whole (a bad extension of its cached batch) gives back its new requests'
  // blocks as well.
  RequestSpec lost = spec(30, 1, 4, 200);
  EXPECT_FALSE(engine_->prefill(7, {lost}, 6, {{.requestId = 99, .blocks = {600}}}).ok());
  RequestSpec reuses = spec(31, 1, 4, 200);
  EXPECT_EQ(errorOf(engine_->prefill(8, {reuses}, std::nullopt), 31), "");
  EXPECT_TRUE(engine_->auditBlocks().ok()) << engine_->auditBlocks();
  engine_->clear(std::nullopt);
  EXPECT_TRUE(engine_->auditBlocks().ok()) << engine_->auditBlocks();
}

}  // namespace
}  // namespace textgen::runtime

namespace textgen::runtime {
namespace {

// Everything a generation reports, log-probabilities to the bit.
std::string describe(const GenerationResult& g) {
  std::string s = std::to_string(g.requestId) + ":";
  auto list = [&](const TokenList& l) {
    for (size_t i = 0; i < l.ids.size(); ++i) {
      s += " " + std::to_string(l.ids[i]) + "/" + std::to_string(l.logprobs[i]) + "/[" +
           l.texts[i] + "]" + (l.isSpecial[i] ? "s" : "");
    }
  };
  list(g.tokens);
  for (const TokenList& top : g.topTokens) {
    s += " top";
    list(top);
  }
  if (g.finished) {
    s += " finished " + std::to_string(static_cast<int>(g.finished->reason)) + " " +
         std::to_string(g.finished->generatedTokens) + " [" + g.finished->text + "]";
  }
  if (g.error) s += " error " + *g.error;
  return s;
}

// A step's update spread over the host workers gives exactly what one thread gives: request by
// request and step by step, tokens, log-probabilities, texts, top tokens, finish reasons and final
// texts, in the greedy path and the sampling path (seeded draws, top-n), with stop sequences
// ending requests at different steps.
TEST_F(EngineTest, UpdateOnHostWorkersEqualsOneThread) {
  auto run = [&](int threads, bool sampled) {
    Engine engine(*model_, *tok_, *backend_,
                  EngineOptions{.blockSize = 4, .kvCacheBytes = 1 << 22, .updateThreads = threads});
    EXPECT_TRUE(engine.warmup(0, {}, std::nullopt, 512, std::nullopt).ok());
    const char* stops[] = {"e", " a", "o", "zzz"};
    std::vector<RequestSpec> specs;
    for (uint64_t id = 1; id <= 40; ++id) {
      RequestSpec r = spec(id, static_cast<int>(id % 4), static_cast<uint32_t>(4 + id % 13),
                           static_cast<uint32_t>(id * 10));
      if (id % 3 == 0) r.stopping.stopSequences = {stops[id % 4]};
      if (sampled && id % 2 == 0) {
        r.sampling.doSample = true;
        r.sampling.seed = id;
        r.sampling.temperature = 0.7f;
      }
      if (sampled && id % 5 == 0) r.sampling.topNTokens = 3;
      specs.push_back(std::move(r));
    }
    std::vector<std::string> log;
    size_t steps = 0, finished = 0;
    std::set<int> reasons;
    auto s = engine.prefill(1, std::move(specs), std::nullopt);
    while (s.ok()) {
      ++steps;
      for (const auto& g : s->generations) {
        log.push_back(describe(g));
        if (g.finished) {
          ++finished;
          reasons.insert(static_cast<int>(g.finished->reason));
        }
      }
      if (!s->batch) break;
      s = engine.decode({1});
    }
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(finished, 40u);
    EXPECT_GT(steps, 10u);
    // Requests end at different steps (max_new_tokens from 4 to 16); greedily, some by their stop
    // sequence (a stop matches where the text ends: the sampled texts end elsewhere).
    EXPECT_TRUE(reasons.contains(static_cast<int>(FinishReason::kLength)));
    if (!sampled) {
      EXPECT_TRUE(reasons.contains(static_cast<int>(FinishReason::kStopSequence)));
    }
    return log;
  };
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    const std::vector<std::string> one = run(1, sampled);
    const std::vector<std::string> four = run(4, sampled);
    ASSERT_EQ(one.size(), four.size());
    for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], four[i]) << "generation " << i;
  }
}

}  // namespace
}  // namespace textgen::runtime
