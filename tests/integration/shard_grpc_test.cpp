// The real textgen-shard binary, driven through gRPC: Warmup, Prefill, Decode xN, FilterBatch and
// ClearCache with requests that join and finish at different steps; every request's tokens equal
// transformers' greedy output for its prompt alone. Bad input gets a gRPC error and the shard keeps
// serving.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <type_traits>

#include "shard_process.h"
#include "textgen/shard/v1/shard.grpc.pb.h"

namespace {

namespace pb = textgen::shard::v1;
using nlohmann::json;
using textgen::testing::ShardProcess;

// Overridable for the GPU machine, which runs packed binaries away from the build tree.
std::string fromEnv(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
const std::string kShard = fromEnv("TEXTGEN_SHARD_BINARY", TEXTGEN_SHARD_BINARY);
const std::string kModel =
    fromEnv("TEXTGEN_MODEL_FIXTURES", TEXTGEN_MODEL_FIXTURES) + std::string("/llama-gqa");
constexpr uint32_t kBlockSize = 16;

class ShardGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("textgen-shard-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    shard_ = std::make_unique<ShardProcess>(kShard, kModel, (dir_ / "sock").string());
    const std::string addr = shard_->waitReady();
    ASSERT_FALSE(addr.empty()) << "textgen-shard did not start";
    stub_ =
        pb::ShardService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    std::ifstream in(kModel + "/reference.json");
    reference_ = json::parse(in);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A request for prompt `p` of the reference, greedy, EOS ignored (the reference runs 32 tokens).
  pb::Request request(uint64_t id, int p, uint32_t maxNew) {
    pb::Request r;
    r.set_id(id);
    for (uint32_t t : reference_["prompts"][p]["input_ids"]) r.add_input_ids(t);
    r.mutable_stopping_parameters()->set_max_new_tokens(maxNew);
    r.mutable_stopping_parameters()->set_ignore_eos_token(true);
    const uint32_t blocks = (r.input_ids_size() + maxNew + kBlockSize - 1) / kBlockSize;
    for (uint32_t b = 0; b < blocks; ++b) r.add_blocks(nextBlock_++);
    return r;
  }

  std::vector<uint32_t> greedy(int p, size_t n) {
    auto g = reference_["prompts"][p]["greedy"].get<std::vector<uint32_t>>();
    g.resize(n);
    return g;
  }

  std::filesystem::path dir_;
  std::unique_ptr<ShardProcess> shard_;
  std::unique_ptr<pb::ShardService::Stub> stub_;
  json reference_;
  uint32_t nextBlock_ = 0;
};

TEST_F(ShardGrpcTest, ServesABatchWhoseRequestsJoinAndFinishAtDifferentSteps) {
  {
    grpc::ClientContext ctx;
    pb::InfoResponse info;
    ASSERT_TRUE(stub_->Info(&ctx, {}, &info).ok());
    EXPECT_EQ(info.block_size(), kBlockSize);
    EXPECT_EQ(info.vocab_size(), 1565u);
    EXPECT_EQ(info.device_type(), fromEnv("TEXTGEN_TEST_DEVICE", "cpu"));
    EXPECT_TRUE(info.support_chunking());
  }
  {
    grpc::ClientContext ctx;
    pb::ServiceDiscoveryResponse d;
    ASSERT_TRUE(stub_->ServiceDiscovery(&ctx, {}, &d).ok());
    ASSERT_EQ(d.urls_size(), 1);
    EXPECT_EQ(d.urls(0), "unix://" + (dir_ / "sock").string() + "-0");
  }
  {
    // Before Warmup there is no KV cache.
    grpc::ClientContext ctx;
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(99);
    *req.mutable_batch()->add_requests() = request(99, 0, 4);
    req.mutable_batch()->set_size(1);
    pb::PrefillResponse resp;
    EXPECT_EQ(stub_->Prefill(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    pb::WarmupRequest req;
    req.mutable_batch()->set_id(0);
    *req.mutable_batch()->add_requests() = request(1000, 1, 8);
    req.mutable_batch()->set_size(1);
    req.set_max_prefill_tokens(64);
    pb::WarmupResponse resp;
    grpc::Status s = stub_->Warmup(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // 4 MiB / (2 * 3 layers * 16 slots * 2 heads * 16 dims * 4 bytes) = 341 blocks of 16.
    EXPECT_EQ(resp.max_supported_total_tokens(), 341u * 16u);
    nextBlock_ = 0;
  }

  std::map<uint64_t, std::vector<uint32_t>> tokens;
  std::map<uint64_t, std::string> streamed, finalText;
  std::set<uint64_t> live;
  std::optional<pb::CachedBatch> batch;
  auto absorb = [&](const auto& resp) {
    for (const pb::Generation& g : resp.generations()) {
      for (uint32_t id : g.tokens().ids()) tokens[g.request_id()].push_back(id);
      for (const std::string& t : g.tokens().texts()) streamed[g.request_id()] += t;
      if (g.has_generated_text()) {
        live.erase(g.request_id());
        finalText[g.request_id()] = g.generated_text().text();
        EXPECT_EQ(g.generated_text().generated_tokens(), tokens[g.request_id()].size());
        EXPECT_EQ(g.generated_text().finish_reason(), pb::FINISH_REASON_LENGTH);
      }
      if (g.request_id() == 4) {
        if (g.has_prefill_tokens()) {
          EXPECT_EQ(g.prefill_tokens().ids_size(),
                    static_cast<int>(reference_["prompts"][3]["input_ids"].size()));
          EXPECT_TRUE(std::isnan(g.prefill_tokens().logprobs(0)));
          EXPECT_LT(g.prefill_tokens().logprobs(1), 0.0f);
        }
        ASSERT_EQ(g.top_tokens_size(), 1);
        EXPECT_EQ(g.top_tokens(0).ids_size(), 3);
        EXPECT_EQ(g.top_tokens(0).ids(0), g.tokens().ids(0));  // greedy picks the best
      }
    }
    batch.reset();
    if (resp.has_batch()) batch = resp.batch();
  };
  auto filterFinished = [&] {
    if (!batch || static_cast<size_t>(batch->request_ids_size()) == live.size()) return;
    grpc::ClientContext ctx;
    pb::FilterBatchRequest req;
    req.set_batch_id(batch->id());
    for (uint64_t id : live) req.add_request_ids(id);
    pb::FilterBatchResponse resp;
    ASSERT_TRUE(stub_->FilterBatch(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.batch().size(), live.size());
    batch = resp.batch();
  };
  auto prefill = [&](uint64_t batchId, std::vector<pb::Request> requests) {
    grpc::ClientContext ctx;
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(batchId);
    for (auto& r : requests) {
      live.insert(r.id());
      *req.mutable_batch()->add_requests() = r;
    }
    req.mutable_batch()->set_size(static_cast<uint32_t>(requests.size()));
    if (batch) *req.mutable_cached_batch() = *batch;
    pb::PrefillResponse resp;
    grpc::Status s = stub_->Prefill(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    absorb(resp);
  };
  auto decode = [&](int steps) {
    for (int i = 0; i < steps && batch; ++i) {
      grpc::ClientContext ctx;
      pb::DecodeRequest req;
      *req.add_batches() = *batch;
      pb::DecodeResponse resp;
      grpc::Status s = stub_->Decode(&ctx, req, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      absorb(resp);
      filterFinished();
    }
  };

  prefill(1, {request(1, 0, 32), request(2, 1, 10)});
  decode(3);
  pb::Request chunked = request(3, 2, 20);
  chunked.set_chunk_len(3);  // an 8-token prompt in chunks of 3, beside the others' decodes
  prefill(2, {chunked});
  decode(8);
  pb::Request withLogprobs = request(4, 3, 14);
  withLogprobs.set_prefill_logprobs(true);
  withLogprobs.set_top_n_tokens(3);
  prefill(3, {withLogprobs});
  decode(64);
  EXPECT_TRUE(live.empty());
  EXPECT_FALSE(batch.has_value());

  EXPECT_EQ(tokens[1], greedy(0, 32));
  EXPECT_EQ(tokens[2], greedy(1, 10));
  EXPECT_EQ(tokens[3], greedy(2, 20));
  EXPECT_EQ(tokens[4], greedy(3, 14));
  for (uint64_t id = 1; id <= 4; ++id) EXPECT_FALSE(finalText[id].empty()) << id;
}

TEST_F(ShardGrpcTest, BadInputIsAnErrorAndTheShardKeepsServing) {
  {
    grpc::ClientContext ctx;
    pb::WarmupRequest req;
    req.mutable_batch()->set_size(0);
    req.set_max_prefill_tokens(16);
    pb::WarmupResponse resp;
    ASSERT_TRUE(stub_->Warmup(&ctx, req, &resp).ok());
  }
  auto prefill = [&](std::vector<pb::Request> rs, uint64_t batchId, pb::PrefillResponse* resp) {
    grpc::ClientContext ctx;
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(batchId);
    for (pb::Request& r : rs) *req.mutable_batch()->add_requests() = std::move(r);
    req.mutable_batch()->set_size(static_cast<uint32_t>(rs.size()));
    return stub_->Prefill(&ctx, req, resp);
  };
  // A request the shard cannot take is refused alone: the call succeeds, the request's Generation
  // carries only the reason, and nothing is cached for it.
  auto refusal = [&](pb::Request r) -> std::string {
    pb::PrefillResponse resp;
    grpc::Status st = prefill({std::move(r)}, 7, &resp);
    if (!st.ok()) return "the whole call failed: " + st.error_message();
    if (resp.generations_size() != 1 || !resp.generations(0).has_error() || resp.has_batch())
      return "not refused: " + resp.ShortDebugString();
    return resp.generations(0).error();
  };
  pb::Request outOfRange = request(1, 0, 4);
  outOfRange.set_blocks(0, 1000000);
  EXPECT_NE(refusal(outOfRange).find("out of range"), std::string::npos) << refusal(outOfRange);

  pb::Request tooLong = request(2, 0, 4);
  tooLong.clear_input_ids();
  for (int i = 0; i < 300; ++i) tooLong.add_input_ids(5);
  for (int b = 0; b < 20; ++b) tooLong.add_blocks(100 + b);
  EXPECT_NE(refusal(tooLong).find("longer than the model allows"), std::string::npos)
      << refusal(tooLong);

  pb::Request badToken = request(3, 0, 4);
  badToken.set_input_ids(0, 999999);
  EXPECT_NE(refusal(badToken).find("out of vocabulary"), std::string::npos);

  pb::Request adapter = request(4, 0, 4);
  adapter.set_adapter_id("lora-1");
  EXPECT_NE(refusal(adapter).find("LoRA adapters are not implemented"), std::string::npos);

  pb::Request badTemp = request(5, 0, 4);
  badTemp.mutable_parameters()->set_temperature(-1.0f);
  EXPECT_NE(refusal(badTemp).find("`temperature`"), std::string::npos) << refusal(badTemp);

  // Beside a good request, a bad one fails alone and the good one is generated and cached.
  {
    pb::Request infinite = request(9, 0, 4);
    infinite.mutable_parameters()->set_do_sample(true);
    infinite.mutable_parameters()->set_temperature(std::numeric_limits<float>::infinity());
    pb::PrefillResponse resp;
    ASSERT_TRUE(prefill({request(10, 1, 4), std::move(infinite)}, 11, &resp).ok());
    ASSERT_EQ(resp.generations_size(), 2);
    for (const pb::Generation& g : resp.generations()) {
      EXPECT_EQ(g.has_error(), g.request_id() == 9) << g.ShortDebugString();
      if (g.request_id() == 10) {
        EXPECT_EQ(g.tokens().ids_size(), 1);
      }
    }
    ASSERT_TRUE(resp.has_batch());
    EXPECT_EQ(
        std::vector<uint64_t>(resp.batch().request_ids().begin(), resp.batch().request_ids().end()),
        std::vector<uint64_t>{10});
  }
  {
    grpc::ClientContext ctx;
    pb::PrefillRequest req;  // empty batch
    pb::PrefillResponse resp;
    EXPECT_EQ(stub_->Prefill(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    pb::DecodeRequest req;
    req.add_batches()->set_id(12345);
    pb::DecodeResponse resp;
    grpc::Status d = stub_->Decode(&ctx, req, &resp);
    EXPECT_EQ(d.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(d.error_message().find("not found"), std::string::npos);
  }
  // Still serving: a good request works, then ClearCache drops it.
  {
    pb::PrefillResponse resp;
    ASSERT_TRUE(prefill({request(6, 1, 4)}, 8, &resp).ok());
    ASSERT_TRUE(resp.has_batch());
  }
  {
    grpc::ClientContext ctx;
    pb::ClearCacheResponse resp;
    ASSERT_TRUE(stub_->ClearCache(&ctx, {}, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    pb::DecodeRequest req;
    req.add_batches()->set_id(8);
    pb::DecodeResponse resp;
    EXPECT_EQ(stub_->Decode(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(shard_->terminate(), 0);
}

// Pipelined decoding (DecodeRequest.step / after_step): a step sent before the one it follows
// waits for it, whichever arrives first, and each request's tokens stay transformers' greedy ones.
// A step planned while its predecessor ran steps what that predecessor left: a request that
// finished in it is skipped with its extension, and a batch it ended steps nothing. A successor
// of a failed step is refused, so is one that finds another call run before it, and one whose
// predecessor never comes fails within 2 s or its deadline; the shard keeps serving throughout.
// Info reports that Decode calls are ordered.
TEST_F(ShardGrpcTest, PipelinedDecodesRunInTheirOrder) {
  {
    grpc::ClientContext ctx;
    pb::InfoResponse info;
    ASSERT_TRUE(stub_->Info(&ctx, {}, &info).ok());
    EXPECT_TRUE(info.ordered_decode());
  }
  {
    grpc::ClientContext ctx;
    pb::WarmupRequest req;
    req.mutable_batch()->set_size(0);
    req.set_max_prefill_tokens(64);
    pb::WarmupResponse resp;
    ASSERT_TRUE(stub_->Warmup(&ctx, req, &resp).ok());
  }
  std::map<uint64_t, std::vector<uint32_t>> tokens;
  auto absorb = [&](const auto& resp) {
    for (const pb::Generation& g : resp.generations())
      for (uint32_t id : g.tokens().ids()) tokens[g.request_id()].push_back(id);
  };
  auto decode = [&](uint64_t batchId, std::optional<uint64_t> step, std::optional<uint64_t> after,
                    std::vector<std::pair<uint64_t, uint32_t>> extensions = {},
                    std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    pb::DecodeRequest req;
    req.add_batches()->set_id(batchId);
    if (step) req.set_step(*step);
    if (after) req.set_after_step(*after);
    for (auto [id, block] : extensions) {
      pb::BlockExtension* e = req.add_extensions();
      e->set_request_id(id);
      e->add_blocks(block);
    }
    pb::DecodeResponse resp;
    grpc::Status s = stub_->Decode(&ctx, req, &resp);
    return std::make_pair(s, resp);
  };
  {
    // Request 1 runs 5 tokens, request 2 runs 12: blocks for all of them up front.
    grpc::ClientContext ctx;
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(1);
    *req.mutable_batch()->add_requests() = request(1, 0, 5);
    *req.mutable_batch()->add_requests() = request(2, 1, 12);
    req.mutable_batch()->set_size(2);
    pb::PrefillResponse resp;
    ASSERT_TRUE(stub_->Prefill(&ctx, req, &resp).ok());
    absorb(resp);
  }
  // Steps in pairs, the successor sent first. Step k gives request 1 its token k + 1 (it ends in
  // step 4) and request 2 its token k + 1 (it ends in step 11).
  auto [s1, r1] = decode(1, 1, std::nullopt);
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  absorb(r1);
  EXPECT_EQ(r1.queue_ns(), 0u);
  for (uint64_t step = 2; step + 1 <= 9; step += 2) {
    // Step 5 was planned before step 4 ended request 1: its extension for it is dropped.
    std::vector<std::pair<uint64_t, uint32_t>> ext;
    if (step + 1 == 5) ext = {{1, 301}};
    auto later =
        std::async(std::launch::async, [&, step, ext] { return decode(1, step + 1, step, ext); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto [s, r] = decode(1, step, step - 1);
    ASSERT_TRUE(s.ok()) << s.error_message();
    auto [sl, rl] = later.get();
    ASSERT_TRUE(sl.ok()) << sl.error_message();
    EXPECT_GT(rl.queue_ns(), 0u);  // it waited for its predecessor
    absorb(r);
    absorb(rl);
    EXPECT_EQ(rl.generations_size(), step + 1 < 5 ? 2 : 1) << step + 1;
  }
  auto [s10, r10] = decode(1, 10, 9);
  ASSERT_TRUE(s10.ok()) << s10.error_message();
  absorb(r10);
  // Step 11 ends request 2, and batch 1 with it; step 12, planned before that, steps nothing.
  auto [s11, r11] = decode(1, 11, 10, {{1, 300}});
  ASSERT_TRUE(s11.ok()) << s11.error_message();
  absorb(r11);
  EXPECT_FALSE(r11.has_batch());
  EXPECT_EQ(tokens[1], greedy(0, 5));
  EXPECT_EQ(tokens[2], greedy(1, 12));
  auto [s12, r12] = decode(1, 12, 11);
  ASSERT_TRUE(s12.ok()) << s12.error_message();
  EXPECT_EQ(r12.generations_size(), 0);
  EXPECT_FALSE(r12.has_batch());

  // A failed numbered step: its successor is refused.
  auto [sf, rf] = decode(777, 20, std::nullopt);
  EXPECT_EQ(sf.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto [sa, ra] = decode(777, 21, 20);
  EXPECT_EQ(sa.error_code(), grpc::StatusCode::ABORTED) << sa.error_message();
  EXPECT_NE(sa.error_message().find("failed"), std::string::npos) << sa.error_message();
  // Another call runs before the step it follows.
  auto waiting = std::async(std::launch::async, [&] { return decode(1, 31, 30); });
  // (Repeated until it answers: the first may run before it arrives.)
  while (waiting.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    grpc::ClientContext ctx;
    pb::ClearCacheRequest req;
    pb::ClearCacheResponse resp;
    ASSERT_TRUE(stub_->ClearCache(&ctx, req, &resp).ok());
  }
  auto [sw, rw] = waiting.get();
  EXPECT_EQ(sw.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << sw.error_message();
  EXPECT_NE(sw.error_message().find("another call ran"), std::string::npos) << sw.error_message();
  // Its predecessor never comes: an error by the deadline, not a hang.
  const auto start = std::chrono::steady_clock::now();
  auto [sn, rn] = decode(1, 41, 40, {}, std::chrono::milliseconds(500));
  EXPECT_FALSE(sn.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Nor with a long deadline: the step it follows is sent just before it, so after 2 s it is
  // taken as lost. The refusal counts as a failed step: the call following it is refused at once.
  const auto longer = std::chrono::steady_clock::now();
  auto [sl2, rl2] = decode(1, 43, 42);
  EXPECT_EQ(sl2.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << sl2.error_message();
  EXPECT_NE(sl2.error_message().find("did not arrive in time"), std::string::npos)
      << sl2.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - longer, std::chrono::seconds(10));
  auto [sf2, rf2] = decode(1, 44, 43);
  EXPECT_EQ(sf2.error_code(), grpc::StatusCode::ABORTED) << sf2.error_message();
  // At most four wait at once: of five sent together, one is refused at once. (The shard sees the
  // call above gone within 50 ms of its deadline.)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    std::vector<std::future<std::pair<grpc::Status, pb::DecodeResponse>>> waiters;
    for (uint64_t i = 0; i < 5; ++i) {
      waiters.push_back(std::async(std::launch::async, [&, i] {
        return decode(1, 60 + i, 1000 + i, {}, std::chrono::milliseconds(3000));
      }));
    }
    int exhausted = 0;
    for (auto& w : waiters) {
      const grpc::Status st = w.get().first;
      EXPECT_FALSE(st.ok());
      exhausted += st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    }
    EXPECT_EQ(exhausted, 1);
  }
  // Still serving.
  {
    grpc::ClientContext ctx;
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(2);
    *req.mutable_batch()->add_requests() = request(5, 1, 3);
    req.mutable_batch()->set_size(1);
    pb::PrefillResponse resp;
    ASSERT_TRUE(stub_->Prefill(&ctx, req, &resp).ok());
    auto [sd, rd] = decode(2, 50, std::nullopt);
    ASSERT_TRUE(sd.ok()) << sd.error_message();
  }
}

// A tensor-parallel group of two CPU ranks (Gloo, whatever TEXTGEN_TEST_DEVICE says), each its own
// textgen-shard process: a Prefill or Decode the engine refuses before its forward (a request id
// twice in the call, an unknown batch, a bad block extension on the live batch) is an
// INVALID_ARGUMENT on both ranks and the group serves on, in step: both ranks give the reference's
// tokens (before, a rank that failed any step ended with exit 3, taking the group down). Every call
// goes to both ranks at once, as the router sends it. Then a pipelined Decode whose predecessor
// never comes, sent to rank 0 alone (a refusal of that rank's timing): rank 0 ends with exit 3 at
// once, and rank 1 follows.
TEST(ShardGroupGrpcTest, ACallRefusedBeforeTheForwardLeavesTheGroupServing) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("textgen-shard-group-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  int port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    close(fd);
  }
  std::vector<std::unique_ptr<ShardProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<ShardProcess>(
        kShard, kModel, (dir / "sock").string(),
        std::vector<std::pair<std::string, std::string>>{{"RANK", std::to_string(r)},
                                                         {"WORLD_SIZE", "2"},
                                                         {"MASTER_ADDR", "127.0.0.1"},
                                                         {"MASTER_PORT", std::to_string(port)},
                                                         {"TEXTGEN_TEST_DEVICE", "cpu"}}));
  }
  std::vector<std::unique_ptr<pb::ShardService::Stub>> stubs;
  for (auto& rank : ranks) {
    const std::string addr = rank->waitReady();
    ASSERT_FALSE(addr.empty()) << "a rank did not start";
    stubs.push_back(
        pb::ShardService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials())));
  }
  // One call on both ranks at once (a 30 s deadline: a group out of step would wait in a
  // collective for minutes); both statuses, rank 0's answer in *resp0 and rank 1's in *resp1.
  auto both = [&](auto method, const auto& req, auto* resp0, auto* resp1) {
    std::vector<grpc::Status> st(2);
    auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(30); };
    std::thread t([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      st[1] = ((*stubs[1]).*method)(&ctx, req, resp1);
    });
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      st[0] = ((*stubs[0]).*method)(&ctx, req, resp0);
    }
    t.join();
    return st;
  };
  json reference = json::parse(std::ifstream(kModel + "/reference.json"));
  auto request = [&](uint64_t id, int p, uint32_t maxNew, uint32_t firstBlock) {
    pb::Request r;
    r.set_id(id);
    for (uint32_t t : reference["prompts"][p]["input_ids"]) r.add_input_ids(t);
    r.mutable_stopping_parameters()->set_max_new_tokens(maxNew);
    r.mutable_stopping_parameters()->set_ignore_eos_token(true);
    const uint32_t blocks = (r.input_ids_size() + maxNew + kBlockSize - 1) / kBlockSize;
    for (uint32_t b = 0; b < blocks; ++b) r.add_blocks(firstBlock + b);
    return r;
  };
  {
    pb::WarmupRequest req;
    req.mutable_batch()->set_size(0);
    req.set_max_prefill_tokens(16);
    pb::WarmupResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Warmup, req, &resp, &resp1))
      ASSERT_TRUE(s.ok()) << s.error_message();
  }
  {  // a request id twice in one call: the whole call is refused, on both ranks
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(1);
    *req.mutable_batch()->add_requests() = request(5, 0, 4, 0);
    *req.mutable_batch()->add_requests() = request(5, 1, 4, 10);
    req.mutable_batch()->set_size(2);
    pb::PrefillResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Prefill, req, &resp, &resp1)) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_NE(s.error_message().find("id already in use"), std::string::npos);
    }
  }
  {  // a Decode of a batch that does not exist
    pb::DecodeRequest req;
    req.add_batches()->set_id(12345);
    pb::DecodeResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Decode, req, &resp, &resp1))
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // Still a group: a good request prefills and decodes on both ranks (float32: both ranks' tokens
  // are transformers' greedy ones), a bad block extension of its live batch refused on the way.
  std::vector<uint32_t> tokens[2];
  pb::CachedBatch batch;
  auto absorb = [&](const auto& r0, const auto& r1) {
    ASSERT_EQ(r0.generations_size(), 1);
    ASSERT_EQ(r1.generations_size(), 1);
    tokens[0].push_back(r0.generations(0).tokens().ids(0));
    tokens[1].push_back(r1.generations(0).tokens().ids(0));
    if (r0.has_batch()) batch = r0.batch();
  };
  {
    pb::PrefillRequest req;
    req.mutable_batch()->set_id(2);
    *req.mutable_batch()->add_requests() = request(6, 0, 4, 0);
    req.mutable_batch()->set_size(1);
    pb::PrefillResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Prefill, req, &resp, &resp1))
      ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(resp.has_batch());
    absorb(resp, resp1);
  }
  {  // a block extension for a request the batch does not hold
    pb::DecodeRequest req;
    *req.add_batches() = batch;
    pb::BlockExtension* e = req.add_extensions();
    e->set_request_id(999);
    e->add_blocks(40);
    pb::DecodeResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Decode, req, &resp, &resp1))
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  uint64_t step = 0;
  while (tokens[0].size() < 4) {
    pb::DecodeRequest req;
    *req.add_batches() = batch;
    req.set_step(++step);
    pb::DecodeResponse resp, resp1;
    for (const grpc::Status& s : both(&pb::ShardService::Stub::Decode, req, &resp, &resp1))
      ASSERT_TRUE(s.ok()) << s.error_message();
    absorb(resp, resp1);
  }
  auto greedy = reference["prompts"][0]["greedy"].get<std::vector<uint32_t>>();
  greedy.resize(4);
  EXPECT_EQ(tokens[0], greedy);
  EXPECT_EQ(tokens[1], greedy);
  for (auto& rank : ranks) EXPECT_TRUE(rank->alive());
  {  // a pipelined Decode to rank 0 alone, following a step that never comes
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::DecodeRequest req;
    *req.add_batches() = batch;
    req.set_step(100);
    req.set_after_step(99);
    pb::DecodeResponse resp;
    const grpc::Status s = stubs[0]->Decode(&ctx, req, &resp);
    EXPECT_FALSE(s.ok());
  }
  EXPECT_EQ(ranks[0]->waitExit(10), 3);
  EXPECT_EQ(ranks[1]->waitExit(15), 3);
  ranks.clear();
  std::filesystem::remove_all(dir);
}

}  // namespace
