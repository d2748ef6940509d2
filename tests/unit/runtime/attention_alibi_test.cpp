// The Attention layer with ALiBi slopes (Options::alibiSlopes) on the CPU backend, on the q/k/v/o
// weights of a tiny random Llama: a prefill of two sequences, then a chunk continuing the first
// over its cached (unrotated) keys, against attention with BLOOM's bias (slope * j) computed in
// double precision from the same weights; on 1, 2 and 4 tensor-parallel ranks (each rank's
// partial outputs summed), so each rank must read its own heads' slopes. Bad slopes are refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "layers/alibi.h"
#include "layers/attention.h"
#include "layers/workspace.h"
#include "runtime/tiny_llama.h"

namespace textgen::runtime {
namespace {

using testing::TinyLlama;
constexpr int64_t kHidden = TinyLlama::kHidden, kHeads = TinyLlama::kHeads,
                  kKvHeads = TinyLlama::kKvHeads, kHeadDim = TinyLlama::kHeadDim;

const Attention::Weights kNames{.q = "model.layers.0.self_attn.q_proj.weight",
                                .k = "model.layers.0.self_attn.k_proj.weight",
                                .v = "model.layers.0.self_attn.v_proj.weight",
                                .qkv = "",
                                .o = "model.layers.0.self_attn.o_proj.weight"};

// One sequence's input rows, [len, hidden].
using Rows = std::vector<std::vector<float>>;

class AttentionAlibiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/textgen-attention-alibi-" + std::to_string(::getpid());
    TinyLlama{}.write(dir_);
    auto config = loadModelConfig(dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto store = WeightStore::open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    std::mt19937 rng(11);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto [seq, len] : {std::pair{0, 7}, std::pair{1, 3}}) {
      seqs_[seq].assign(len, std::vector<float>(kHidden));
      for (auto& row : seqs_[seq])
        for (float& x : row) x = d(rng);
    }
  }

  std::vector<float> weight(const std::string& name) const {
    auto t = store_->loadF32(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::vector<float>(t->f32(), t->f32() + t->numel());
  }

  // The layer's output for every row of sequence `s`, in double precision, [len, hidden].
  Rows expected(int s, const std::vector<float>& slopes) const {
    const std::vector<float> wq = weight(kNames.q), wk = weight(kNames.k), wv = weight(kNames.v),
                             wo = weight(kNames.o);
    const Rows& x = seqs_[s];
    const auto len = static_cast<int64_t>(x.size());
    auto project = [&](const std::vector<float>& w, int64_t out) {
      std::vector<std::vector<double>> y(len, std::vector<double>(out));
      for (int64_t t = 0; t < len; ++t)
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < kHidden; ++i) y[t][o] += double{w[o * kHidden + i]} * x[t][i];
      return y;
    };
    const auto q = project(wq, kHeads * kHeadDim), k = project(wk, kKvHeads * kHeadDim),
               v = project(wv, kKvHeads * kHeadDim);
    Rows out(len, std::vector<float>(kHidden));
    const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
    for (int64_t i = 0; i < len; ++i) {
      std::vector<double> attn(kHeads * kHeadDim);
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t kvh = h / (kHeads / kKvHeads);
        std::vector<double> w(i + 1);
        double maxW = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < kHeadDim; ++e)
            dot += q[i][h * kHeadDim + e] * k[j][kvh * kHeadDim + e];
          w[j] = dot * scale + slopes[h] * static_cast<double>(j);  // BLOOM's form
          maxW = std::max(maxW, w[j]);
        }
        for (double& wj : w) sum += (wj = std::exp(wj - maxW));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < kHeadDim; ++e)
            attn[h * kHeadDim + e] += w[j] / sum * v[j][kvh * kHeadDim + e];
      }
      for (int64_t o = 0; o < kHidden; ++o) {
        double acc = 0.0;
        for (int64_t e = 0; e < kHeads * kHeadDim; ++e)
          acc += wo[o * kHeads * kHeadDim + e] * attn[e];
        out[i][o] = static_cast<float>(acc);
      }
    }
    return out;
  }

  // Rank `rank` of `world`: a prefill of sequence 0's first 5 rows and all of sequence 1, then a
  // chunk of sequence 0's last 2 rows. This rank's partial outputs, sequence by sequence.
  void runRank(int rank, int world, const std::vector<float>& slopes, Rows (&out)[2]) {
    auto backend = makeCpuBackend(1);
    auto part = Partition::split(config_, rank, world);
    ASSERT_TRUE(part.ok()) << part.status();
    const WeightLoader w(*store_, *backend, DType::kF32, config_, *part);
    auto attention = Attention::load(w, kNames, {.alibiSlopes = slopes});
    ASSERT_TRUE(attention.ok()) << attention.status();
    Workspace ws;
    bool moved = false;
    ASSERT_TRUE(ws.reserve(*backend, config_, *part, DType::kF32, 8, 1, moved).ok());
    constexpr int64_t kBlock = 4;
    auto cache = KvCache::create(*backend, {1, part->kvHeads, kHeadDim}, 4, kBlock);
    ASSERT_TRUE(cache.ok()) << cache.status();
    const std::vector<int32_t> tables{2, 0, 1, 3};  // sequence 0: blocks 2, 0; sequence 1: 1, 3
    auto slotOf = [&](int s, int32_t pos) {
      return tables[s * 2 + pos / kBlock] * kBlock + pos % kBlock;
    };

    struct Step {
      std::vector<std::pair<int, std::pair<int32_t, int32_t>>> seqs;  // (seq, [first, end))
    };
    for (const Step& step : {Step{{{0, {0, 5}}, {1, {0, 3}}}}, Step{{{0, {5, 7}}}}}) {
      std::vector<float> hs;
      std::vector<int32_t> positions, slots, seqStarts{0}, startPos, stepTables, ids, logitRows{0};
      for (const auto& [s, range] : step.seqs) {
        for (int32_t p = range.first; p < range.second; ++p) {
          hs.insert(hs.end(), seqs_[s][p].begin(), seqs_[s][p].end());
          positions.push_back(p);
          slots.push_back(slotOf(s, p));
          ids.push_back(0);
        }
        seqStarts.push_back(static_cast<int32_t>(positions.size()));
        startPos.push_back(range.first);
        stepTables.insert(stepTables.end(), tables.begin() + s * 2, tables.begin() + s * 2 + 2);
      }
      const auto rows = static_cast<int64_t>(positions.size());
      const auto numSeqs = static_cast<int64_t>(startPos.size());
      BatchMetadata meta{.ids = ids.data(),
                         .positions = positions.data(),
                         .slots = slots.data(),
                         .seqStarts = seqStarts.data(),
                         .startPos = startPos.data(),
                         .blockTables = stepTables.data(),
                         .logitRows = logitRows.data(),
                         .layout = {.rows = rows,
                                    .numSeqs = numSeqs,
                                    .maxBlocksPerSeq = 2,
                                    .logitRows = 1,
                                    .maxNewRows = 5,
                                    .maxContext = 7}};
      const ForwardContext ctx{*backend, nullptr, config_, *part, DType::kF32, meta, ws, **cache};
      ASSERT_TRUE(attention->forward(ctx, 0, hs.data()).ok());
      int64_t row = 0;
      for (const auto& [s, range] : step.seqs) {
        for (int32_t p = range.first; p < range.second; ++p, ++row) {
          out[s].resize(std::max<size_t>(out[s].size(), p + 1), std::vector<float>(kHidden));
          for (int64_t o = 0; o < kHidden; ++o) out[s][p][o] += hs[row * kHidden + o];
        }
      }
    }
  }

  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<WeightStore> store_;
  Rows seqs_[2];
};

TEST_F(AttentionAlibiTest, MatchesAttentionWithBloomsBiasOnEveryRankSplit) {
  const std::vector<float> slopes = bloomAlibiSlopes(kHeads);  // 2^-2, 2^-4, 2^-6, 2^-8
  const Rows want[2] = {expected(0, slopes), expected(1, slopes)};
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Rows got[2];
    for (int rank = 0; rank < world; ++rank) runRank(rank, world, slopes, got);
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(got[s].size(), want[s].size());
      for (size_t t = 0; t < want[s].size(); ++t)
        for (int64_t o = 0; o < kHidden; ++o)
          ASSERT_NEAR(got[s][t][o], want[s][t][o], 1e-4f) << "sequence " << s << " row " << t;
    }
  }
  // Steeper slopes (2^-0.5 .. 2^-2) give another result: the bias is applied.
  const Rows other = expected(0, mptAlibiSlopes(kHeads, 2.0));
  Rows got[2];
  runRank(0, 1, mptAlibiSlopes(kHeads, 2.0), got);
  EXPECT_NEAR(got[0][6][0], other[6][0], 1e-4f);
  EXPECT_GT(std::fabs(other[6][0] - want[0][6][0]), 1e-3f);
}

TEST_F(AttentionAlibiTest, RefusesBadSlopes) {
  auto backend = makeCpuBackend(1);
  auto part = Partition::split(config_, 0, 1);
  ASSERT_TRUE(part.ok());
  const WeightLoader w(*store_, *backend, DType::kF32, config_, *part);
  const auto count = Attention::load(w, kNames, {.alibiSlopes = bloomAlibiSlopes(kHeads + 1)});
  EXPECT_EQ(count.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(count.status().message().find("5 ALiBi slopes for 4 heads"), std::string::npos)
      << count.status().message();
  std::vector<float> nan = bloomAlibiSlopes(kHeads);
  nan[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Attention::load(w, kNames, {.alibiSlopes = nan}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace textgen::runtime
