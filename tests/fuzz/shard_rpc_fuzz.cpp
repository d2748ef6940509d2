// The shard's RPCs from raw protobuf bytes, as a router (or anything that reaches the port) could
// send them, against the real ShardService over the CPU backend and the llama-gqa fixture. The
// input is a sequence of calls, each: one byte naming the RPC, two bytes of length (little endian),
// then that many bytes of the request message; bytes that do not parse are skipped, as gRPC would
// refuse them. Batches live across the calls of one input (prefill, decode, filter, clear) and are
// cleared after it, so every input starts from a warmed, empty shard. Every call must return a
// status; any crash or sanitizer report is a finding.
#include <memory>

#include "fuzz_util.h"
#include "shard_service.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/engine.h"
#include "textgen/runtime/model.h"
#include "textgen/shard/v1/shard.grpc.pb.h"

namespace {

namespace pb = textgen::shard::v1;
using namespace textgen::runtime;

enum Rpc : uint8_t {
  kPrefill,
  kDecode,
  kFilterBatch,
  kClearCache,
  kWarmup,
  kInfo,
  kHealth,
  kCount
};

struct Shard {
  Shard() {
    const std::string dir = textgen::fuzz::fixturesDir() + "/models/llama-gqa";
    backend = makeCpuBackend(1);
    auto m = loadModel(dir, *backend);
    if (!m.ok()) textgen::fuzz::fail(__FILE__, __LINE__, dir + ": " + m.status().toString());
    model = std::move(*m);
    auto t = textgen::tokenizer::Tokenizer::fromDirectory(dir);
    if (!t.ok()) textgen::fuzz::fail(__FILE__, __LINE__, dir + ": " + t.status().toString());
    tokenizer = std::move(*t);
    // 4 MiB of KV cache: 341 blocks of 16 tokens for this model.
    engine = std::make_unique<Engine>(*model, *tokenizer, *backend,
                                      EngineOptions{.blockSize = 16, .kvCacheBytes = 4 << 20});
    service = makeShardService(
        *engine, *model, {.rankUrls = [] { return std::vector<std::string>{"unix:///fuzz-0"}; }});
    rpc = static_cast<pb::ShardService::Service*>(service.get());
    warmup();
  }

  // The warmup a router sends first: one request, the largest prefill it will send.
  void warmup() {
    pb::WarmupRequest req;
    pb::Request* r = req.mutable_batch()->add_requests();
    for (uint32_t id : {1u, 450u, 1200u, 7u}) r->add_input_ids(id);
    r->mutable_stopping_parameters()->set_max_new_tokens(4);
    for (uint32_t b = 0; b < 8; ++b) r->add_blocks(b);
    req.mutable_batch()->set_size(1);
    req.set_max_prefill_tokens(128);
    pb::WarmupResponse resp;
    const grpc::Status s = rpc->Warmup(nullptr, &req, &resp);
    if (!s.ok()) textgen::fuzz::fail(__FILE__, __LINE__, "warmup: " + s.error_message());
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<textgen::tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<grpc::Service> service;
  pb::ShardService::Service* rpc = nullptr;
};

Shard& shard() {
  static Shard s;
  return s;
}

// Parses `bytes` as Request and calls `method`; unparsable bytes are no call.
template <typename Request, typename Response, typename Method>
void call(pb::ShardService::Service* rpc, Method method, std::string_view bytes) {
  Request req;
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  Response resp;
  const grpc::Status s = (rpc->*method)(nullptr, &req, &resp);
  if (!s.ok()) FUZZ_CHECK(!s.error_message().empty(), "an error without a message");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  shard();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Shard& s = shard();
  textgen::fuzz::Input in(data, size);
  bool warmedUp = false;
  while (!in.empty()) {
    const uint8_t op = in.byte() % kCount;
    const std::string_view msg = in.take(in.u16());
    switch (op) {
      case kPrefill:
        call<pb::PrefillRequest, pb::PrefillResponse>(s.rpc, &pb::ShardService::Service::Prefill,
                                                      msg);
        break;
      case kDecode:
        call<pb::DecodeRequest, pb::DecodeResponse>(s.rpc, &pb::ShardService::Service::Decode, msg);
        break;
      case kFilterBatch:
        call<pb::FilterBatchRequest, pb::FilterBatchResponse>(
            s.rpc, &pb::ShardService::Service::FilterBatch, msg);
        break;
      case kClearCache:
        call<pb::ClearCacheRequest, pb::ClearCacheResponse>(
            s.rpc, &pb::ShardService::Service::ClearCache, msg);
        break;
      case kWarmup:
        call<pb::WarmupRequest, pb::WarmupResponse>(s.rpc, &pb::ShardService::Service::Warmup, msg);
        warmedUp = true;
        break;
      case kInfo:
        call<pb::InfoRequest, pb::InfoResponse>(s.rpc, &pb::ShardService::Service::Info, msg);
        break;
      case kHealth:
        call<pb::HealthRequest, pb::HealthResponse>(s.rpc, &pb::ShardService::Service::Health, msg);
        break;
    }
    // Whatever the calls, no block is written by one live request while another holds it, and
    // the engine's per-block counts match its live tables.
    if (const textgen::Status a = s.engine->auditBlocks(); !a.ok())
      FUZZ_CHECK(false, "block ownership: " + a.message());
  }
  // Back to a warmed, empty shard for the next input.
  pb::ClearCacheRequest clear;
  pb::ClearCacheResponse cleared;
  (void)s.rpc->ClearCache(nullptr, &clear, &cleared);
  if (const textgen::Status a = s.engine->auditBlocks(); !a.ok())
    FUZZ_CHECK(false, "block ownership after ClearCache: " + a.message());
  if (warmedUp) s.warmup();
  return 0;
}
