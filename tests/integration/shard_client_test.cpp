// The router's shard client against the real textgen-shard: discovery, Info, Warmup, Prefill,
// Decode, FilterBatch, ClearCache, with requests validated by the router's Validator; greedy tokens
// equal transformers'.
#include "textgen/router/shard_client.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shard_process.h"
#include "textgen/router/validation.h"

namespace textgen::router {
namespace {

const std::string kModel = std::string(TEXTGEN_MODEL_FIXTURES) + "/llama-gqa";

TEST(ShardClientTest, DrivesARealShard) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("textgen-client-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  testing::ShardProcess shard(TEXTGEN_SHARD_BINARY, kModel, (dir / "sock").string());
  const std::string addr = shard.waitReady();
  ASSERT_FALSE(addr.empty());
  auto group = connectShardGroup(addr, std::chrono::seconds(10));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->urls(), std::vector<std::string>{addr});
  auto info = (*group)->info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->supportChunking);
  ASSERT_TRUE((*group)->clearCache(std::nullopt).ok());
  auto warm = (*group)->warmup(0, {}, std::nullopt, 64, std::nullopt);
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(warm->maxSupportedTotalTokens.has_value());
  BlockAllocator blocks(*warm->maxSupportedTotalTokens / info->blockSize, info->blockSize);

  auto tok = tokenizer::Tokenizer::fromDirectory(kModel);
  ASSERT_TRUE(tok.ok());
  Validator validator(**tok, {.maxInputTokens = 64, .maxTotalTokens = 128});
  std::ifstream in(kModel + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  std::vector<BatchEntry> batch;
  for (int p = 0; p < 2; ++p) {
    auto req = parseGenerateRequest(nlohmann::json{
        {"inputs", ref["prompts"][p]["text"]},
        {"parameters",
         {{"max_new_tokens", 8}}}}.dump());
    ASSERT_TRUE(req.ok());
    auto v = validator.validate(*req, Endpoint::kGenerate);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->inputIds, ref["prompts"][p]["input_ids"].get<std::vector<uint32_t>>());
    auto b = blocks.allocate(v->inputLength + v->maxNewTokens);
    ASSERT_TRUE(b.has_value());
    batch.push_back(
        {{static_cast<uint64_t>(p + 1), std::move(*v), nullptr, {}}, std::move(*b), std::nullopt});
  }
  std::map<uint64_t, std::vector<uint32_t>> out;
  auto step = (*group)->prefill(1, batch, std::nullopt);
  ASSERT_TRUE(step.ok()) << step.status();
  std::optional<CachedBatch> cached = step->batch;
  for (const auto& g : step->generations) out[g.requestId].push_back(g.tokens.ids[0]);
  int decodes = 0;
  while (cached) {
    auto d = (*group)->decode({*cached});
    ASSERT_TRUE(d.ok()) << d.status();
    ++decodes;
    for (const auto& g : d->generations) {
      out[g.requestId].push_back(g.tokens.ids[0]);
      if (g.generatedText) {
        EXPECT_EQ(g.generatedText->generatedTokens, 8u);
        EXPECT_EQ(g.generatedText->reason, FinishReason::kLength);
      }
    }
    cached = d->batch;
    if (decodes == 3 && cached) {  // the router filters a request away (e.g. its client left)
      auto f = (*group)->filter(cached->id, {1});
      ASSERT_TRUE(f.ok());
      EXPECT_EQ(f->requestIds, std::vector<uint64_t>{1});
      cached = *f;
    }
  }
  auto greedy = [&](int p, size_t n) {
    auto g = ref["prompts"][p]["greedy"].get<std::vector<uint32_t>>();
    g.resize(n);
    return g;
  };
  EXPECT_EQ(out[1], greedy(0, 8));
  EXPECT_EQ(out[2], greedy(1, 4));  // filtered after its 4th token
  auto missing = (*group)->decode({CachedBatch{777, {}, 0, 0}});
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("Decode on " + addr), std::string::npos)
      << missing.status();
  EXPECT_EQ(shard.terminate(), 0);
  std::filesystem::remove_all(dir);
}

TEST(ShardClientTest, UnreachableMasterIsUnavailable) {
  auto group =
      connectShardGroup("unix:///nonexistent/textgen-sock", std::chrono::milliseconds(300));
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace textgen::router
