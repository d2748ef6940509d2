// T5 (T5ForConditionalGeneration) against transformers (tests/reference/models/t5-*, written by
// tools/reference/make_t5_fixtures.py; docs/t5.md): the gated-gelu FFN with its own head, ReLU with
// the tied head, gated-gelu tied with a padded vocabulary. Through the model: 24 greedy tokens
// equal, the first 4 steps' logits within float32 tolerance and every step's top-5
// log-probabilities, each prompt alone and all four batched with staggered joins (encoding beside
// decoding rows). Through the engine: the same tokens, TGI's seq2seq prefill details and text, and
// the refusals of what an encoder-decoder request cannot have (a chunk, a cached prefix, a resume,
// too few blocks). Config parsing: feed_forward_proj's forms and the fields T5 needs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "models/registry.h"
#include "runtime/t5_runner.h"
#include "textgen/runtime/engine.h"
#include "textgen/tokenizer/tokenizer.h"

namespace textgen::runtime {
namespace {

using nlohmann::json;
using t5test::readT5Reference;
using t5test::runT5Greedy;
using t5test::t5Prompts;

constexpr int kSteps = 24;
constexpr float kAtol = 2e-4f, kRtol = 1e-4f;

std::string fixture(const std::string& name) {
  const char* env = std::getenv("TEXTGEN_MODEL_FIXTURES");
  return (env && *env ? std::string(env) : std::string(TEXTGEN_MODEL_FIXTURES)) + "/" + name;
}

// log_softmax in double of one row.
std::vector<double> logSoftmax(const std::vector<float>& row) {
  double max = -std::numeric_limits<double>::infinity(), sum = 0;
  for (float x : row) max = std::max<double>(max, x);
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - max - std::log(sum);
  return out;
}

void expectMatchesReference(const t5test::T5Trace& t, const json& ref, const std::string& what) {
  ASSERT_TRUE(t.error.empty()) << what << ": " << t.error;
  for (size_t i = 0; i < ref["prompts"].size(); ++i) {
    const json& p = ref["prompts"][i];
    const std::string who = what + " prompt " + std::to_string(i);
    EXPECT_EQ(t.tokens[i], p["greedy"].get<std::vector<uint32_t>>()) << who;
    const json& full = p["decoder_logits"]["full"];
    for (size_t s = 0; s < full.size(); ++s) {
      const auto want = full[s].get<std::vector<float>>();
      ASSERT_EQ(t.logits[i][s].size(), want.size()) << who;
      for (size_t v = 0; v < want.size(); ++v) {
        ASSERT_NEAR(t.logits[i][s][v], want[v], kAtol + kRtol * std::fabs(want[v]))
            << who << " step " << s << " logit " << v;
      }
    }
    const json& top5 = p["decoder_logits"]["top5_logprobs"];
    for (size_t s = 0; s < top5.size() && s < t.logits[i].size(); ++s) {
      const std::vector<double> lp = logSoftmax(t.logits[i][s]);
      for (const json& pair : top5[s]) {
        const auto id = pair[0].get<uint32_t>();
        EXPECT_NEAR(lp[id], pair[1].get<double>(), 2e-4) << who << " step " << s << " id " << id;
      }
    }
  }
}

class T5FixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(T5FixtureTest, GreedyAndLogitsEqualTransformers) {
  const std::string dir = fixture(GetParam());
  const json ref = readT5Reference(dir);
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_TRUE(c.isEncoderDecoder);
  EXPECT_EQ(c.numLayers, 3);  // the decoder's (the encoder has 2)
  EXPECT_EQ(c.decoderStartTokenId, 0u);
  EXPECT_EQ((*model)->kvShape().layers, 3);
  const auto prompts = t5Prompts(ref);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const t5test::T5Trace alone = runT5Greedy(**model, *backend, {prompts[i]}, kSteps);
    json one = ref;
    one["prompts"] = json::array({ref["prompts"][i]});
    expectMatchesReference(alone, one, std::string(GetParam()) + " alone");
  }
  // All four in one batch, joining at steps 0, 3, 3 and 7: encoder rows beside decoder rows.
  const t5test::T5Trace batched = runT5Greedy(**model, *backend, prompts, kSteps, {0, 3, 3, 7});
  expectMatchesReference(batched, ref, std::string(GetParam()) + " batched");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, T5FixtureTest,
                         ::testing::Values("t5-gated-gelu", "t5-relu-tied", "t5-gated-gelu-tied"),
                         [](const auto& p) {
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(T5Model, BatchesWithoutTheirCrossContextAreRefused) {
  const std::string dir = fixture("t5-relu-tied");
  auto backend = makeCpuBackend(1);
  auto model = loadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto cache = KvCache::create(*backend, (*model)->kvShape(), 16, 4);
  ASSERT_TRUE(cache.ok());
  const std::vector<uint32_t> self = {1, 2}, cross = {3};
  auto batch = [&] {
    ForwardBatch b;
    b.tokenIds = {0};
    b.slots = {4};
    b.sequences = {{.firstRow = 0, .numRows = 1, .startPos = 0, .blocks = self}};
    b.logitRows = {0};
    b.cross = {{.encoderLen = 3, .encode = true, .blocks = cross}};
    b.encoderTokenIds = {5, 6, 1};
    return b;
  };
  EXPECT_TRUE((*model)->forward(batch(), **cache).ok());
  auto refused = [&](ForwardBatch b, const std::string& why) {
    auto s = (*model)->forward(b, **cache);
    ASSERT_FALSE(s.ok()) << why;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  };
  ForwardBatch b = batch();
  b.cross.clear();
  refused(b, "one cross context per sequence");
  b = batch();
  b.encoderTokenIds.pop_back();
  refused(b, "do not match");
  b = batch();
  b.cross[0].encoderLen = 5;  // one block of 4 cannot hold it
  b.encoderTokenIds = {5, 6, 7, 8, 1};
  refused(b, "fewer cross blocks");
  b = batch();
  b.encoderTokenIds[0] = 100000;
  refused(b, "out of vocabulary");
  b = batch();
  b.cross[0].blocks = std::span<const uint32_t>();
  refused(b, "fewer cross blocks");
}

TEST(T5Config, FeedForwardProjAndTheFieldsT5Needs) {
  auto parse = [](json j) { return parseModelConfig(j.dump(), {}, registeredDialect); };
  json base = json::parse(R"({"architectures": ["T5ForConditionalGeneration"], "vocab_size": 100,
      "d_model": 8, "d_kv": 2, "num_heads": 4, "d_ff": 16, "num_layers": 2})");
  auto c = parse(base);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->isEncoderDecoder);
  EXPECT_EQ(c->numLayers, 2);  // num_decoder_layers defaults to num_layers
  EXPECT_EQ(c->headDim, 2);
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kRelu);  // no feed_forward_proj: relu
  EXPECT_EQ(c->maxPositionEmbeddings, 512);
  EXPECT_EQ(c->decoderStartTokenId, 0u);
  EXPECT_FALSE((*c->json)["is_gated_act"].get<bool>());
  json j = base;
  j["feed_forward_proj"] = "gated-gelu";
  j["num_decoder_layers"] = 5;
  j["n_positions"] = 1024;
  j["pad_token_id"] = 7;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kGeluTanh);  // "gated-gelu" means gelu_new
  EXPECT_TRUE((*c->json)["is_gated_act"].get<bool>());
  EXPECT_EQ(c->numLayers, 5);
  EXPECT_EQ(c->maxPositionEmbeddings, 1024);
  EXPECT_EQ(c->decoderStartTokenId, 7u);  // pad_token_id when no decoder_start_token_id
  j["feed_forward_proj"] = "gated-silu";
  j["decoder_start_token_id"] = 3;
  c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hiddenAct, kernels::Activation::kSilu);
  EXPECT_EQ(c->decoderStartTokenId, 3u);
  // pad_token_id is read only when decoder_start_token_id is absent.
  json padless = base;
  padless["decoder_start_token_id"] = 0;
  padless["pad_token_id"] = -1;
  c = parse(padless);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->decoderStartTokenId, 0u);
  // A decoder-only class that claims an encoder is refused (its graph has none).
  auto llama = parse(json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
      "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "is_encoder_decoder": true})"));
  ASSERT_FALSE(llama.ok());
  EXPECT_NE(llama.status().message().find("decoder-only class"), std::string::npos)
      << llama.status();
  for (const auto& [key, value, why] : std::vector<std::tuple<std::string, json, std::string>>{
           {"feed_forward_proj", "gated-gelu-x", "is not of the form"},
           {"feed_forward_proj", "gated-", "is not of the form"},
           {"feed_forward_proj", 5, "must be a string"},
           {"feed_forward_proj", "tanh", "hidden_act"},
           {"num_layers", 0, "num_layers"},
           {"num_layers", nullptr, "'num_layers' is missing"},
           {"num_decoder_layers", "3", "num_decoder_layers"},
           {"decoder_start_token_id", 100, "decoder_start_token_id"},
           {"decoder_start_token_id", -1, "decoder_start_token_id"}}) {
    json bad = base;
    bad[key] = value;
    auto r = parse(bad);
    ASSERT_FALSE(r.ok()) << key << " = " << value.dump();
    EXPECT_NE(r.status().message().find(why), std::string::npos)
        << key << " = " << value.dump() << ": " << r.status();
  }
}

// The engine over t5-gated-gelu with its tokenizer.
class T5EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fixture("t5-gated-gelu");
    ref_ = readT5Reference(dir_);
    backend_ = makeCpuBackend(1);
    auto m = loadModel(dir_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    auto t = tokenizer::Tokenizer::fromDirectory(dir_);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
    engine_ = std::make_unique<Engine>(*model_, *tok_, *backend_,
                                       EngineOptions{.blockSize = 4, .kvCacheBytes = 1 << 22});
    ASSERT_TRUE(engine_->warmup(0, {}, std::nullopt, 64, std::nullopt).ok());
  }

  // Blocks as the router gives them: the prompt's whole blocks, then max_new_tokens positions.
  RequestSpec spec(uint64_t id, int prompt, uint32_t maxNew, uint32_t firstBlock) {
    RequestSpec r;
    r.id = id;
    r.inputIds = ref_["prompts"][prompt]["input_ids"].get<std::vector<uint32_t>>();
    r.stopping.maxNewTokens = maxNew;
    r.stopping.ignoreEosToken = true;
    const uint32_t blocks = (static_cast<uint32_t>(r.inputIds.size()) + 3) / 4 + (maxNew + 3) / 4;
    for (uint32_t b = 0; b < blocks; ++b) r.blocks.push_back(firstBlock + b);
    return r;
  }
  std::vector<uint32_t> greedy(int prompt, size_t n) {
    auto g = ref_["prompts"][prompt]["greedy"].get<std::vector<uint32_t>>();
    g.resize(n);
    return g;
  }

  std::string dir_;
  json ref_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(T5EngineTest, GreedyTextAndPrefillDetailsAsTgi) {
  std::map<uint64_t, std::vector<uint32_t>> ids;
  std::map<uint64_t, std::string> stream, finished;
  auto absorb = [&](const StepResult& s) {
    for (const auto& g : s.generations) {
      ASSERT_FALSE(g.error) << *g.error;
      ids[g.requestId].push_back(g.tokens.ids[0]);
      stream[g.requestId] += g.tokens.texts[0];
      if (g.finished) finished[g.requestId] = g.finished->text;
    }
  };
  RequestSpec a = spec(1, 3, kSteps, 1);
  a.prefillLogprobs = true;
  auto first = engine_->prefill(1, {a}, std::nullopt);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->generations.size(), 1u);
  // TGI's Seq2SeqLM: the decoder's input, the start token with no log-probability.
  const auto& prefill = first->generations[0].prefillTokens;
  ASSERT_TRUE(prefill.has_value());
  EXPECT_EQ(prefill->ids, std::vector<uint32_t>{0});
  ASSERT_EQ(prefill->logprobs.size(), 1u);
  EXPECT_TRUE(std::isnan(prefill->logprobs[0]));
  EXPECT_EQ(prefill->texts, std::vector<std::string>{"<pad>"});
  absorb(*first);
  // A second request joins while the first decodes: its encoder runs beside the decoder rows.
  auto second = engine_->prefill(2, {spec(2, 2, kSteps, 40)}, uint64_t{1});
  ASSERT_TRUE(second.ok()) << second.status();
  absorb(*second);
  while (true) {
    auto s = engine_->decode({2});
    ASSERT_TRUE(s.ok()) << s.status();
    absorb(*s);
    if (!s->batch) break;
  }
  EXPECT_EQ(ids[1], greedy(3, kSteps));
  EXPECT_EQ(ids[2], greedy(2, kSteps));
  for (uint64_t id : {1, 2}) {
    // The final text: every generated id decoded without special tokens. The stream decodes after
    // the start token, so its first piece keeps the SentencePiece space that decoding strips.
    EXPECT_EQ(finished[id], tok_->decode(ids[id], /*skipSpecialTokens=*/true));
    const std::string full = tok_->decode(ids[id], /*skipSpecialTokens=*/false);
    EXPECT_TRUE(stream[id] == full || stream[id] == " " + full) << stream[id] << " / " << full;
  }
}

TEST_F(T5EngineTest, WhatAnEncoderDecoderRequestCannotHaveIsRefusedAlone) {
  auto refusedWith = [&](RequestSpec r, const std::string& why) {
    auto s = engine_->prefill(r.id, {std::move(r), spec(99, 0, 4, 200)}, std::nullopt);
    ASSERT_TRUE(s.ok()) << s.status();
    bool sawRefusal = false, sawOther = false;
    for (const auto& g : s->generations) {
      if (g.requestId == 99) {
        sawOther = !g.error.has_value();
      } else {
        ASSERT_TRUE(g.error.has_value()) << why;
        EXPECT_NE(g.error->find(why), std::string::npos) << *g.error;
        sawRefusal = true;
      }
    }
    EXPECT_TRUE(sawRefusal && sawOther) << why;
    engine_->clear(std::nullopt);
  };
  RequestSpec r = spec(10, 3, 8, 1);
  r.cacheLen = 4;
  refusedWith(r, "no prefix cache");
  r = spec(11, 3, 8, 1);
  r.chunkLen = 8;
  refusedWith(r, "no chunked prefill");
  r = spec(12, 3, 8, 1);
  r.generatedTokens = 2;
  refusedWith(r, "cannot resume");
  r = spec(13, 3, 8, 1);
  r.blocks.resize(11);  // the 44-token prompt's 11 blocks, none for the decoder
  refusedWith(r, "cannot hold the encoder output");
  // A chunk as long as the prompt is the whole prompt: accepted.
  r = spec(14, 3, 8, 1);
  r.chunkLen = static_cast<uint32_t>(r.inputIds.size());
  auto s = engine_->prefill(14, {r}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->generations[0].error.has_value());
}

TEST_F(T5EngineTest, ABlockOfAnotherLiveRequestIsRefused) {
  // Request 1 holds blocks 1..17 (11 cross + 6 decoder). A request naming block 5 would write its
  // encoder output over request 1's cross keys and values: refused alone; so is an extension.
  auto first = engine_->prefill(1, {spec(1, 3, kSteps, 1)}, std::nullopt);
  ASSERT_TRUE(first.ok()) << first.status();
  RequestSpec overlap = spec(2, 0, 4, 60);
  overlap.blocks[0] = 5;
  auto s = engine_->prefill(2, {overlap, spec(3, 0, 4, 80)}, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& g : s->generations) {
    if (g.requestId == 2) {
      ASSERT_TRUE(g.error.has_value());
      EXPECT_NE(g.error->find("block 5 is held by another request"), std::string::npos) << *g.error;
    } else {
      EXPECT_FALSE(g.error.has_value()) << *g.error;
    }
  }
  auto extended = engine_->decode({1}, {{.requestId = 1, .blocks = {81}}});
  ASSERT_FALSE(extended.ok());
  EXPECT_NE(extended.status().message().find("held by another request"), std::string::npos)
      << extended.status();
  EXPECT_TRUE(engine_->decode({1}).ok());  // the refused call changed nothing
}

TEST_F(T5EngineTest, SeededSamplingWithPenaltiesRepeatsItself) {
  auto run = [&](uint64_t id) {
    RequestSpec r = spec(id, 1, 16, static_cast<uint32_t>(id) * 30);
    r.sampling.doSample = true;
    r.sampling.seed = 1234;
    r.sampling.temperature = 0.8f;
    r.sampling.repetitionPenalty = 1.3f;
    r.sampling.topNTokens = 2;
    std::vector<uint32_t> out;
    auto s = engine_->prefill(id, {r}, std::nullopt);
    while (true) {
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) break;
      for (const auto& g : s->generations) {
        out.push_back(g.tokens.ids[0]);
        EXPECT_EQ(g.topTokens.size(), 1u);
      }
      if (!s->batch) break;
      s = engine_->decode({id});
    }
    return out;
  };
  const auto a = run(1), b = run(2);
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace textgen::runtime
