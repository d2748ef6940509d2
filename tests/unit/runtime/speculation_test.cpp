// Speculative decoding (n-gram proposals verified in one forward) and the watermark, on the demo
// model (models/demo, float32 on the CPU backend; in runtime_cuda_test on the GPU with graphs):
// speculation never changes what is generated — greedy or seeded sampling, with stop sequences,
// max_new_tokens and grammars — and the watermark leaves a z-score the detector finds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "textgen/base/watermark.h"
#include "textgen/runtime/engine.h"

namespace textgen::runtime {
namespace {

// TEXTGEN_DEMO_MODEL in the environment: the tree's place on another machine (the GPU's).
const std::string kDemo = std::getenv("TEXTGEN_DEMO_MODEL") && *std::getenv("TEXTGEN_DEMO_MODEL")
                              ? std::getenv("TEXTGEN_DEMO_MODEL")
                              : TEXTGEN_DEMO_MODEL;

// A copy-heavy prompt: the model's continuation tends to quote it.
const char* kCopyPrompt =
    ".. function:: open(file, mode='r', buffering=-1, encoding=None)\n\n"
    "   Open *file* and return a corresponding :term:`file object`.\n\n"
    ".. function:: open(file, mode='r', buffering=-1, encoding=None)\n\n"
    "   Open *file* and return";

struct Output {
  std::vector<uint32_t> ids;
  std::string text;
  FinishReason reason = FinishReason::kLength;
  size_t steps = 0;  // Generations received (one per step)
};

class SpeculationTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef TEXTGEN_FIXTURE_CUDA
    // On the GPU: float32 (the comparisons are exact), decode graphs for 1, 2 and 4 sequences of
    // 1 to 5 rows (speculation's verification steps replay graphs too).
    auto b = makeCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << b.status();
    backend_ = std::move(*b);
    auto m = loadModel(
        kDemo, *backend_,
        {.dtype = kernels::DType::kF32, .graphBatchSizes = {1, 2, 4}, .graphRowsPerSequence = 5});
#else
    backend_ = makeCpuBackend(2);
    auto m = loadModel(kDemo, *backend_);
#endif
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto t = tokenizer::Tokenizer::fromDirectory(kDemo);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
  }

  std::unique_ptr<Engine> engine(int64_t speculate) {
    auto e = std::make_unique<Engine>(
        *model_, *tok_, *backend_,
        EngineOptions{.blockSize = 16, .kvCacheBytes = 64 << 20, .speculate = speculate});
    EXPECT_TRUE(e->warmup(0, {}, std::nullopt, 512, std::nullopt).ok());
    return e;
  }

  RequestSpec spec(uint64_t id, const std::string& prompt, uint32_t maxNew) {
    RequestSpec r;
    r.id = id;
    r.inputIds = tok_->encode(prompt).value().ids;
    r.stopping.maxNewTokens = maxNew;
    r.stopping.ignoreEosToken = true;
    const uint32_t blocks = static_cast<uint32_t>((r.inputIds.size() + maxNew + 15) / 16);
    for (uint32_t b = 0; b < blocks; ++b) r.blocks.push_back(static_cast<uint32_t>(id) * 16 + b);
    return r;
  }

  // Runs the requests as one batch to the end.
  std::map<uint64_t, Output> run(Engine& e, std::vector<RequestSpec> requests) {
    std::map<uint64_t, Output> out;
    auto s = e.prefill(1, std::move(requests), std::nullopt);
    while (true) {
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      for (const GenerationResult& g : s->generations) {
        EXPECT_FALSE(g.error) << *g.error;
        Output& o = out[g.requestId];
        ++o.steps;
        EXPECT_EQ(g.tokens.ids.size(), g.tokens.texts.size());
        EXPECT_EQ(g.tokens.ids.size(), g.tokens.logprobs.size());
        o.ids.insert(o.ids.end(), g.tokens.ids.begin(), g.tokens.ids.end());
        if (g.finished) {
          o.text = g.finished->text;
          o.reason = g.finished->reason;
          EXPECT_EQ(g.finished->generatedTokens, o.ids.size());
        }
      }
      if (!s->batch) break;
      s = e.decode({1});
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

TEST(ProposeNgram, LatestMatchOfTheLongestTail) {
  // Tail (7, 8): found at 1 and at 5; the latest (5) is followed by 9, 7, 8.
  const std::vector<uint32_t> t{1, 7, 8, 2, 3, 7, 8, 9, 4, 7, 8};
  EXPECT_EQ(proposeNgram(t, 3), (std::vector<uint32_t>{9, 4, 7}));
  // No earlier occurrence of any tail: nothing.
  EXPECT_TRUE(proposeNgram(std::vector<uint32_t>{1, 2, 3, 4}, 4).empty());
  // A continuation that runs into the end repeats with its period.
  EXPECT_EQ(proposeNgram(std::vector<uint32_t>{5, 6, 5, 6, 5}, 5),
            (std::vector<uint32_t>{6, 5, 6, 5, 6}));
  EXPECT_TRUE(proposeNgram(std::vector<uint32_t>{5, 5}, 0).empty());
  EXPECT_TRUE(proposeNgram(std::vector<uint32_t>{5}, 3).empty());
}

TEST_F(SpeculationTest, GreedyOutputIsUnchangedAndProposalsAreAccepted) {
  auto plain = engine(0), spec4 = engine(4);
  auto batch = [&] {
    return std::vector<RequestSpec>{spec(1, kCopyPrompt, 96), spec(2, "The Python interpreter", 80),
                                    spec(3, "To open a file", 7)};
  };
  const auto want = run(*plain, batch());
  const auto got = run(*spec4, batch());
  ASSERT_EQ(want.size(), 3u);
  for (const auto& [id, o] : want) {
    SCOPED_TRACE("request " + std::to_string(id));
    EXPECT_EQ(got.at(id).ids, o.ids);
    EXPECT_EQ(got.at(id).text, o.text);
    EXPECT_EQ(o.steps, o.ids.size());  // one token per step without speculation
  }
  // The copy-heavy request takes fewer steps than tokens: proposals were accepted.
  EXPECT_LT(got.at(1).steps, got.at(1).ids.size() * 3 / 4);
  const SpeculationStats& st = spec4->speculationStats();
  EXPECT_GT(st.accepted, 0u);
  EXPECT_LE(st.accepted, st.proposed);
  EXPECT_EQ(plain->speculationStats().proposed, 0u);
}

// Block ownership under speculation (a step writes its proposals' positions, then keeps those
// confirmed): after every step, a request that takes the writer's finished blocks as its cached
// prefix (the router's rule: whole blocks of every position but the last token's) is accepted and
// chooses what the same prompt computed from scratch chooses; one block further, into the block the
// writer still writes, is refused. The engine's block counts stay equal to its live tables.
TEST_F(SpeculationTest, APrefixSharerTakesTheWritersFinishedBlocksAndNoMore) {
  constexpr size_t bs = 16;
  for (int64_t speculate : {0, 4}) {
    auto e = engine(speculate);
    RequestSpec a = spec(1, kCopyPrompt, 48);
    std::vector<uint32_t> tokens = a.inputIds;
    const std::vector<uint32_t> table = a.blocks;
    auto s = e->prefill(1, {a}, std::nullopt);
    uint64_t id = 100;
    size_t shared = 0, refused = 0;
    while (true) {
      ASSERT_TRUE(s.ok()) << s.status();
      for (const GenerationResult& g : s->generations)
        tokens.insert(tokens.end(), g.tokens.ids.begin(), g.tokens.ids.end());
      ASSERT_TRUE(e->auditBlocks().ok()) << e->auditBlocks();
      if (!s->batch) break;
      const size_t written = tokens.size() - 1;  // the last token is not fed yet
      const size_t full = written / bs;
      // A prompt of the written tokens and one more: its cached prefix, `full` of the writer's
      // blocks (at least one prompt token left to compute).
      RequestSpec b;
      b.id = id++;
      b.inputIds.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(written) + 1);
      b.stopping.maxNewTokens = 1;
      b.stopping.ignoreEosToken = true;
      b.cacheLen = static_cast<uint32_t>(full * bs);
      b.blocks.assign(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(full));
      while (b.blocks.size() * bs < b.inputIds.size() + 1)
        b.blocks.push_back(static_cast<uint32_t>(200 + b.blocks.size()));
      RequestSpec fresh = b;
      fresh.id = id++;
      fresh.cacheLen = 0;
      fresh.blocks.clear();
      while (fresh.blocks.size() * bs < fresh.inputIds.size() + 1)
        fresh.blocks.push_back(static_cast<uint32_t>(300 + fresh.blocks.size()));
      auto got = e->prefill(50, {b}, std::nullopt);
      auto want = e->prefill(51, {fresh}, std::nullopt);
      ASSERT_TRUE(got.ok() && want.ok());
      ASSERT_FALSE(got->generations[0].error) << *got->generations[0].error;
      ASSERT_FALSE(want->generations[0].error) << *want->generations[0].error;
      EXPECT_EQ(got->generations[0].tokens.ids, want->generations[0].tokens.ids)
          << "after " << written << " positions";
      ++shared;
      // One block further: the block holding position `written`, which the writer still writes
      // (a longer prompt, so that cache_len stays under it).
      RequestSpec c = b;
      c.id = id++;
      c.inputIds.insert(c.inputIds.end(), tokens.begin(), tokens.begin() + 2 * bs);
      c.cacheLen = static_cast<uint32_t>((full + 1) * bs);
      c.blocks.assign(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(full) + 1);
      while (c.blocks.size() * bs < c.inputIds.size() + 1)
        c.blocks.push_back(static_cast<uint32_t>(400 + c.blocks.size()));
      auto over = e->prefill(52, {c}, std::nullopt);
      ASSERT_TRUE(over.ok()) << over.status();
      ASSERT_TRUE(over->generations[0].error.has_value());
      EXPECT_NE(over->generations[0].error->find("still to be written by request 1"),
                std::string::npos)
          << *over->generations[0].error;
      ++refused;
      s = e->decode({1});
    }
    EXPECT_GT(shared, 10u) << "speculate " << speculate;
    EXPECT_EQ(refused, shared);
    ASSERT_TRUE(e->auditBlocks().ok()) << e->auditBlocks();
  }
}

TEST_F(SpeculationTest, SeededSamplingIsUnchanged) {
  auto plain = engine(0), spec3 = engine(3);
  auto batch = [&] {
    std::vector<RequestSpec> b{spec(1, kCopyPrompt, 64), spec(2, "A list comprehension", 64)};
    for (RequestSpec& r : b) {
      r.sampling.doSample = true;
      r.sampling.temperature = 0.5f;
      r.sampling.topK = 20;
      r.sampling.seed = 1234 + r.id;
      r.sampling.repetitionPenalty = 1.05f;
    }
    return b;
  };
  const auto want = run(*plain, batch());
  const auto got = run(*spec3, batch());
  for (const auto& [id, o] : want) EXPECT_EQ(got.at(id).ids, o.ids) << "request " << id;
  EXPECT_GT(spec3->speculationStats().accepted, 0u);
}

TEST_F(SpeculationTest, StopsWhereThePlainRunStops) {
  auto plain = engine(0), spec4 = engine(4);
  for (uint32_t maxNew : {1u, 2u, 5u, 33u}) {
    SCOPED_TRACE("max_new_tokens " + std::to_string(maxNew));
    const auto want = run(*plain, {spec(1, kCopyPrompt, maxNew)});
    const auto got = run(*spec4, {spec(1, kCopyPrompt, maxNew)});
    EXPECT_EQ(got.at(1).ids.size(), maxNew);
    EXPECT_EQ(got.at(1).ids, want.at(1).ids);
  }
  // A stop sequence inside an accepted run ends the request there; what follows is discarded.
  const auto full = run(*plain, {spec(1, kCopyPrompt, 48)});
  // The stop ends at a token boundary (the criteria look at the text's end after each token).
  const std::vector<uint32_t> head(full.at(1).ids.begin(), full.at(1).ids.begin() + 14);
  const std::string upTo = tok_->decode(head);
  const std::string stop = upTo.substr(upTo.size() - 5);
  auto stopping = [&] {
    RequestSpec r = spec(1, kCopyPrompt, 48);
    r.stopping.stopSequences = {stop};
    return r;
  };
  const auto want = run(*plain, {stopping()});
  const auto got = run(*spec4, {stopping()});
  EXPECT_EQ(want.at(1).reason, FinishReason::kStopSequence)
      << "stop '" << stop << "' in '" << full.at(1).text << "' -> '" << want.at(1).text << "'";
  EXPECT_EQ(got.at(1).reason, FinishReason::kStopSequence);
  EXPECT_EQ(got.at(1).ids, want.at(1).ids);
  EXPECT_EQ(got.at(1).text, want.at(1).text);
}

TEST_F(SpeculationTest, GrammarMasksEveryProposedPosition) {
  auto plain = engine(0), spec4 = engine(4);
  auto constrained = [&] {
    RequestSpec r = spec(1, kCopyPrompt, 40);
    r.stopping.ignoreEosToken = false;
    r.sampling.grammarType = SamplingParams::Grammar::kRegex;
    r.sampling.grammar = "( Open \\*file\\* and return)+";
    return r;
  };
  const auto want = run(*plain, {constrained()});
  const auto got = run(*spec4, {constrained()});
  EXPECT_EQ(got.at(1).ids, want.at(1).ids);
  EXPECT_EQ(got.at(1).text, want.at(1).text);
  EXPECT_EQ(got.at(1).text.rfind(" Open *file* and return", 0), 0u) << got.at(1).text;
}

TEST_F(SpeculationTest, ProposalsStayWithinTheBlocksGiven) {
  // Blocks for the prompt and the first position only: a request may be extended later; until it
  // is, nothing is proposed past its table (the step would otherwise write outside it).
  auto spec4 = engine(4);
  RequestSpec r = spec(1, kCopyPrompt, 64);
  const size_t need = (r.inputIds.size() + 1 + 15) / 16;
  r.blocks.resize(need);
  auto s = spec4->prefill(1, {r}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  size_t generated = s->generations.at(0).tokens.ids.size();
  uint32_t next = 500;
  while (s->batch) {
    // Extend one block at a time, only when the next position needs it (a router that grows).
    std::vector<BlockExtension> ext;
    const size_t positions = r.inputIds.size() + generated;  // written by the step: the last
    if ((positions + 15) / 16 > r.blocks.size()) {
      ext.push_back({1, {next}});
      r.blocks.push_back(next++);
    }
    s = spec4->decode({1}, ext);
    ASSERT_TRUE(s.ok()) << s.status();
    generated += s->generations.at(0).tokens.ids.size();
  }
  EXPECT_EQ(generated, 64u);
}

TEST_F(SpeculationTest, WatermarkedTextScoresHighAndPlainTextDoesNot) {
  auto e = engine(0);
  const uint32_t vocab = static_cast<uint32_t>(model_->config().vocabSize);
  auto sample = [&](uint64_t id, bool watermark) {
    RequestSpec r = spec(id, "The Python interpreter", 200);
    r.sampling.doSample = true;
    r.sampling.seed = 42 + id;
    r.sampling.watermark = watermark;
    return r;
  };
  const auto out = run(*e, {sample(1, true), sample(2, false)});
  ASSERT_EQ(out.at(1).ids.size(), 200u);
  // Scored as the detector scores text: re-tokenized, each token after its predecessor.
  auto score = [&](const Output& o) {
    return scoreWatermark(tok_->encode(o.text, false).value().ids, vocab, 0.5);
  };
  const WatermarkScore marked = score(out.at(1)), plain = score(out.at(2));
  EXPECT_GE(marked.z, 4.0) << marked.green << " of " << marked.scored;
  EXPECT_LT(std::abs(plain.z), 2.0) << plain.green << " of " << plain.scored;
  // On the generated ids themselves (the first scored after the prompt's last token) too.
  std::vector<uint32_t> ids = tok_->encode("The Python interpreter").value().ids;
  ids.insert(ids.end(), out.at(1).ids.begin(), out.at(1).ids.end());
  EXPECT_GE(scoreWatermark(ids, vocab, 0.5).z, 4.0);
}

TEST_F(SpeculationTest, WatermarkWithSpeculationKeepsTheSeededOutput) {
  auto plain = engine(0), spec4 = engine(4);
  auto marked = [&] {
    RequestSpec r = spec(1, kCopyPrompt, 48);
    r.sampling.watermark = true;  // greedy over the biased logits
    return r;
  };
  EXPECT_EQ(run(*spec4, {marked()}).at(1).ids, run(*plain, {marked()}).at(1).ids);
}

TEST_F(SpeculationTest, ProposalsStopPastTheRowCap) {
  // 26 decoding requests with 4 proposals each would bring 130 rows, past kMaxSpeculativeRows:
  // those steps run without proposals (the logits and sampling scratch stay what plain decoding
  // of such a batch takes). The outputs are the plain ones either way.
  auto plain = engine(0), spec4 = engine(4);
  auto batch = [&] {
    std::vector<RequestSpec> b;
    for (uint64_t id = 1; id <= 26; ++id) b.push_back(spec(id, kCopyPrompt, 6));
    return b;
  };
  ASSERT_GT(26 + 26 * 4, kMaxSpeculativeRows);
  const auto want = run(*plain, batch());
  const auto got = run(*spec4, batch());
  for (const auto& [id, o] : want) EXPECT_EQ(got.at(id).ids, o.ids) << "request " << id;
  EXPECT_EQ(spec4->speculationStats().proposed, 0u);
}

TEST_F(SpeculationTest, DynamicNtkRowsTakeTheirOwnLength) {
  // Dynamic NTK RoPE (llama-dynamic: 16 positions, factor 2) past its positions: each proposed
  // row is rotated with the frequencies of its own length, as plain decoding rotates it.
  const char* env = std::getenv("TEXTGEN_MODEL_FIXTURES");
  const std::string dir =
      std::string(env && *env ? env : TEXTGEN_MODEL_FIXTURES) + "/llama-dynamic";
  auto m = loadModel(dir, *backend_);
  ASSERT_TRUE(m.ok()) << m.status();
  model_ = std::move(*m);
  auto t = tokenizer::Tokenizer::fromDirectory(dir);
  ASSERT_TRUE(t.ok());
  tok_ = std::move(*t);
  auto plain = engine(0), spec4 = engine(4);
  const int64_t context = model_->config().maxContext();
  auto request = [&](std::vector<uint32_t> prompt) {
    RequestSpec r;
    r.id = 1;
    r.inputIds = std::move(prompt);
    r.stopping.maxNewTokens = static_cast<uint32_t>(context - r.inputIds.size());
    r.stopping.ignoreEosToken = true;
    for (uint32_t b = 0; b < (context + 15) / 16; ++b) r.blocks.push_back(b);
    return r;
  };
  // A prompt that repeats itself, so that proposals come.
  const std::vector<uint32_t> prompt{5, 9, 13, 5, 9, 13, 5, 9};
  const auto want = run(*plain, {request(prompt)});
  const auto got = run(*spec4, {request(prompt)});
  EXPECT_GT(context, 16);
  EXPECT_EQ(got.at(1).ids, want.at(1).ids);
  EXPECT_GT(spec4->speculationStats().proposed, 0u);
}

#ifdef TEXTGEN_FIXTURE_CUDA
// bfloat16, the default for serving: a verification step's rows are computed as plain decode rows
// are (gemv for up to 1 + speculate rows, attention split by sequences), so batch-1 greedy and
// seeded output equals plain decoding token for token, through decode graphs and eagerly.
TEST_F(SpeculationTest, Bfloat16BatchOneIsUnchanged) {
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    auto m =
        loadModel(kDemo, *backend_,
                  {.dtype = kernels::DType::kBF16,
                   .graphBatchSizes = graphs ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{},
                   .graphRowsPerSequence = 5});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto plain = engine(0), spec4 = engine(4);
    for (const char* prompt : {kCopyPrompt, "The Python interpreter", "A list comprehension"}) {
      SCOPED_TRACE(prompt);
      EXPECT_EQ(run(*spec4, {spec(1, prompt, 120)}).at(1).ids,
                run(*plain, {spec(1, prompt, 120)}).at(1).ids);
      auto sampled = [&] {
        RequestSpec r = spec(1, prompt, 80);
        r.sampling.doSample = true;
        r.sampling.seed = 99;
        r.sampling.topP = 0.9f;
        return r;
      };
      EXPECT_EQ(run(*spec4, {sampled()}).at(1).ids, run(*plain, {sampled()}).at(1).ids);
    }
    EXPECT_GT(spec4->speculationStats().accepted, 0u);
  }
}
#endif

}  // namespace
}  // namespace textgen::runtime
