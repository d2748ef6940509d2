// The contract compiles, round-trips, and serves over a real gRPC transport.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "textgen/shard/v1/shard.grpc.pb.h"
#include "textgen/shard/v1/shard.pb.h"

namespace pb = textgen::shard::v1;

namespace {

pb::Request makeRequest() {
  pb::Request r;
  r.set_id(17);
  for (uint32_t id : {1u, 450u, 4996u}) r.add_input_ids(id);
  r.set_inputs("The capital");
  r.set_truncate(3);
  r.mutable_parameters()->set_temperature(0.7f);
  r.mutable_parameters()->set_top_k(40);
  r.mutable_parameters()->set_do_sample(true);
  r.mutable_parameters()->set_seed(1234);
  (*r.mutable_parameters()->mutable_logit_bias())[450] = -5.0f;
  r.mutable_stopping_parameters()->set_max_new_tokens(20);
  r.mutable_stopping_parameters()->add_stop_sequences("\n\n");
  r.set_top_n_tokens(2);
  r.add_blocks(3);
  r.add_blocks(9);
  for (uint32_t s = 48; s < 51; ++s) r.add_slots(s);
  r.set_cache_len(0);
  r.set_chunk_len(3);
  r.set_add_special_tokens(true);
  return r;
}

TEST(ShardProtoTest, RequestRoundTrips) {
  pb::Request r = makeRequest();
  std::string wire;
  ASSERT_TRUE(r.SerializeToString(&wire));
  pb::Request back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.id(), 17u);
  EXPECT_EQ(back.input_ids_size(), 3);
  EXPECT_EQ(back.input_ids(2), 4996u);
  EXPECT_FLOAT_EQ(back.parameters().temperature(), 0.7f);
  EXPECT_EQ(back.parameters().logit_bias().at(450), -5.0f);
  EXPECT_EQ(back.stopping_parameters().stop_sequences(0), "\n\n");
  EXPECT_EQ(back.slots_size(), 3);
  ASSERT_TRUE(back.has_chunk_len());
  EXPECT_EQ(back.chunk_len(), 3u);
  EXPECT_FALSE(back.has_adapter_id());
}

TEST(ShardProtoTest, OptionalFieldsDistinguishUnsetFromZero) {
  pb::ClearCacheRequest all;
  EXPECT_FALSE(all.has_id());
  pb::ClearCacheRequest one;
  one.set_id(0);
  EXPECT_TRUE(one.has_id());
  pb::WarmupResponse w;
  EXPECT_FALSE(w.has_max_supported_total_tokens());
}

TEST(ShardProtoTest, GenerationCarriesSeveralTokensAndNanLogprob) {
  pb::Generation g;
  g.set_request_id(5);
  g.mutable_prefill_tokens()->add_ids(1);
  g.mutable_prefill_tokens()->add_logprobs(std::numeric_limits<float>::quiet_NaN());
  for (uint32_t id : {11u, 12u}) {  // two tokens accepted by speculation
    g.mutable_tokens()->add_ids(id);
    g.mutable_tokens()->add_logprobs(-0.5f);
    g.mutable_tokens()->add_texts("x");
    g.mutable_tokens()->add_is_special(false);
  }
  g.mutable_generated_text()->set_finish_reason(pb::FINISH_REASON_STOP_SEQUENCE);
  std::string wire;
  ASSERT_TRUE(g.SerializeToString(&wire));
  pb::Generation back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.tokens().ids_size(), 2);
  EXPECT_TRUE(std::isnan(back.prefill_tokens().logprobs(0)));
  EXPECT_EQ(back.generated_text().finish_reason(), pb::FINISH_REASON_STOP_SEQUENCE);
  EXPECT_FALSE(back.generated_text().has_seed());
}

TEST(ShardProtoTest, FinishReasonZeroIsUnspecified) {
  pb::GeneratedText t;
  EXPECT_EQ(t.finish_reason(), pb::FINISH_REASON_UNSPECIFIED);
}

// A minimal service: enough to prove the generated stubs link and talk over a socket.
class FakeShard final : public pb::ShardService::Service {
 public:
  grpc::Status Info(grpc::ServerContext*, const pb::InfoRequest*, pb::InfoResponse* out) override {
    out->set_dtype("bfloat16");
    out->set_device_type("cpu");
    out->set_block_size(16);
    out->set_support_chunking(true);
    return grpc::Status::OK;
  }
  grpc::Status FilterBatch(grpc::ServerContext*, const pb::FilterBatchRequest* in,
                           pb::FilterBatchResponse*) override {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "batch " + std::to_string(in->batch_id()) + " not found");
  }
};

TEST(ShardProtoTest, ServesOverGrpc) {
  FakeShard service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = pb::ShardService::NewStub(channel);

  {
    grpc::ClientContext ctx;
    pb::InfoResponse info;
    grpc::Status s = stub->Info(&ctx, pb::InfoRequest(), &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(info.dtype(), "bfloat16");
    EXPECT_EQ(info.block_size(), 16u);
    EXPECT_TRUE(info.support_chunking());
  }
  {
    grpc::ClientContext ctx;
    pb::FilterBatchRequest req;
    req.set_batch_id(99);
    pb::FilterBatchResponse resp;
    grpc::Status s = stub->FilterBatch(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "batch 99 not found");
  }
  {
    grpc::ClientContext
        ctx;  // not overridden by the fake: the generated base answers UNIMPLEMENTED
    pb::DecodeResponse resp;
    grpc::Status s = stub->Decode(&ctx, pb::DecodeRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  server->Shutdown();
}

}  // namespace
