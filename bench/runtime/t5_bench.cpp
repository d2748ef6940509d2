// T5 (encoder-decoder) on the CUDA backend, at a real shape (FLAN-T5-XL, random weights written by
// tools/bench/make_random_model.py --shape flan-t5-xl): encoding throughput (B prompts encoded in
// one forward) and decode step latency over sequences whose encoder output is already cached, with
// CUDA graphs and without, against the decoder's memory roofline (the weights a step reads plus
// every self- and cross-attention key and value it reads, at the HBM bandwidth). Each timing is
// one forwardLogits through backend.synchronize() (the logits left on the device, no token
// choice); medians over repeats after warm-up. Prints a markdown table and one JSON line. Usage:
//   bench_t5 --model DIR [--dtype bfloat16|float32] [--steps 32] [--encoder-len 512]
//            [--hbm-tbps 3.35] [--profile]
// --profile: then the kernels (CUPTI, kernel_trace.h) of one encode of a prompt and of one eager
// decode step of 1 and of 64 sequences.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernel_trace.h"
#include "textgen/kernels/dtype.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace {

using namespace textgen;
using namespace textgen::runtime;
using nlohmann::json;

constexpr int64_t kBlockSize = 16;
constexpr int64_t kWarmSteps = 3;  // decode steps before timing (the first captures the graph)
constexpr int kEncodeWarm = 2;     // the first encode sizes workspaces and picks GEMM plans
constexpr int kEncodeRepeats = 5;
constexpr int64_t kMaxBatch = 64;  // the largest batch any scenario runs (sizes the KV pool)
// Decode batches are encoded this many sequences a forward (the encode scenario's largest batch),
// not 64 x 512 rows at once, whose activations the timed steps do not need.
constexpr int64_t kEncodeGroup = 8;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A benchmark never asserts: any failed call prints its status and ends the run.
[[noreturn]] void fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "bench_t5: %s: %s\n", what.c_str(), st.toString().c_str());
  std::exit(1);
}

template <typename T>
T orFail(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) fail(what, v.status());
  return std::move(v).value();
}

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One encoder-decoder sequence: its prompt, its cross blocks (every decoder layer's keys and values
// of the encoder output) and its self-attention blocks, and the decoder's next position.
struct Seq {
  std::vector<uint32_t> prompt, cross, self;
  int64_t pos = 0;
};

// `count` sequences laid out from block 0 of the pool (each scenario starts afresh and overwrites
// what the previous one left), prompts of `encoderLen` pseudo-random ids ending in </s> (1), room
// for `selfLen` decoder positions each.
std::vector<Seq> makeSeqs(int64_t count, int64_t encoderLen, int64_t selfLen, int64_t vocab) {
  std::vector<Seq> seqs(static_cast<size_t>(count));
  uint32_t next = 0;
  for (int64_t i = 0; i < count; ++i) {
    Seq& s = seqs[static_cast<size_t>(i)];
    for (int64_t t = 0; t + 1 < encoderLen; ++t)  // ids from 2: clear of <pad> (0) and </s> (1)
      s.prompt.push_back(static_cast<uint32_t>(2 + (t * 7919 + i * 104729) % (vocab - 2)));
    s.prompt.push_back(1);
    for (int64_t b = 0; b < ceilDiv(encoderLen, kBlockSize); ++b) s.cross.push_back(next++);
    for (int64_t b = 0; b < ceilDiv(selfLen, kBlockSize); ++b) s.self.push_back(next++);
  }
  return seqs;
}

int64_t blocksFor(int64_t count, int64_t encoderLen, int64_t selfLen) {
  return count * (ceilDiv(encoderLen, kBlockSize) + ceilDiv(selfLen, kBlockSize));
}

// Seconds of one forward in which every sequence adds one decoder row (the start token at position
// 0, then any token) and those at position 0 encode their prompt first: the batch built on the host
// beforehand, the forward timed to the end of its device work.
StatusOr<double> step(Model& model, Backend& backend, KvCache& cache, std::span<Seq> seqs) {
  const ModelConfig& c = model.config();
  ForwardBatch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = seqs[i];
    const auto row = static_cast<int64_t>(b.tokenIds.size());
    b.sequences.push_back({.firstRow = row, .numRows = 1, .startPos = s.pos, .blocks = s.self});
    b.tokenIds.push_back(
        s.pos == 0 ? c.decoderStartTokenId
                   : static_cast<uint32_t>(2 + (s.pos * 31 + static_cast<int64_t>(i) * 17) %
                                                   (c.vocabSize - 2)));
    b.slots.push_back(s.self[static_cast<size_t>(s.pos / kBlockSize)] *
                          static_cast<uint32_t>(kBlockSize) +
                      static_cast<uint32_t>(s.pos % kBlockSize));
    b.logitRows.push_back(row);
    b.cross.push_back({.encoderLen = static_cast<int64_t>(s.prompt.size()),
                       .encode = s.pos == 0,
                       .blocks = s.cross});
    if (s.pos == 0)
      b.encoderTokenIds.insert(b.encoderTokenIds.end(), s.prompt.begin(), s.prompt.end());
  }
  const double t0 = now();
  auto logits = model.forwardLogits(b, cache);
  if (!logits.ok()) return logits.status();
  if (Status st = backend.synchronize(); !st.ok()) return st;
  const double t = now() - t0;
  for (Seq& s : seqs) ++s.pos;
  return t;
}

// Bytes of weights one decode step reads, in the compute dtype: every decoder tensor but the cross
// k and v (applied to the encoder output once, when the sequence starts) and the tables read a row
// at a time (token embedding, relative-bias buckets), plus the head (lm_head, or the shared
// embedding where the head is tied to it and read whole). Taken from the checkpoint's own tensors,
// so a plain (ReLU) FFN or another depth counts right.
StatusOr<double> decoderStepWeightBytes(const std::string& dir, size_t elemSize,
                                        double* totalBytes) {
  auto store = WeightStore::open(dir);
  if (!store.ok()) return store.status();
  auto has = [](const std::string& s, std::string_view t) {
    return s.find(t) != std::string::npos;
  };
  const bool ownHead = (*store)->contains("lm_head.weight");
  double perStep = 0, total = 0;
  for (const std::string& n : (*store)->names()) {
    double count = 1;
    for (int64_t d : (*store)->info(n)->shape) count *= static_cast<double>(d);
    total += count;
    const bool decoder = n.rfind("decoder.", 0) == 0 && !has(n, "EncDecAttention.k.") &&
                         !has(n, "EncDecAttention.v.") && !has(n, "relative_attention_bias") &&
                         !has(n, "embed_tokens");
    const bool head = ownHead ? n == "lm_head.weight" : n == "shared.weight";
    if (decoder || head) perStep += count;
  }
  *totalBytes = total * static_cast<double>(elemSize);
  return perStep * static_cast<double>(elemSize);
}

struct Row {
  std::string scenario;
  int64_t batch = 0;
  std::string graphs;
  double ms = 0, tokensPerS = 0, idealMs = 0;  // idealMs 0: no roofline
};

}  // namespace

int main(int argc, char** argv) {
  std::string modelDir, dtypeName = "bfloat16";
  int64_t steps = 32, encoderLen = 512;
  double hbmTBps = 3.35;  // H100 SXM's HBM3; pass the device's own figure on another card
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      modelDir = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      dtypeName = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atol(argv[++i]);
    } else if (a == "--encoder-len" && i + 1 < argc) {
      encoderLen = std::atol(argv[++i]);
    } else if (a == "--hbm-tbps" && i + 1 < argc) {
      hbmTBps = std::atof(argv[++i]);
    } else if (a == "--profile") {
      profile = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_t5 --model DIR [--dtype bfloat16|float32] [--steps N] "
                   "[--encoder-len N] [--hbm-tbps TB/s]\n");
      return 2;
    }
  }
  if (modelDir.empty() || steps < 1 || encoderLen < 1 || hbmTBps <= 0 ||
      (dtypeName != "bfloat16" && dtypeName != "float16" && dtypeName != "float32")) {
    std::fprintf(stderr,
                 "bench_t5: --model DIR is required; --steps, --encoder-len and --hbm-tbps must be "
                 "positive; --dtype bfloat16, float16 or float32\n");
    return 2;
  }
  // float16 is passed through so that the loader's own refusal (T5 overflows it) is what prints.
  const kernels::DType dtype = dtypeName == "float32"   ? kernels::DType::kF32
                               : dtypeName == "float16" ? kernels::DType::kF16
                                                        : kernels::DType::kBF16;
  const size_t elemSize = kernels::dtypeSize(dtype);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "bench_t5: no CUDA device\n");
    return 1;
  }

  auto backend = orFail(makeCudaBackend(0), "CUDA backend");
  const std::vector<int64_t> graphSizes{1, 2, 4, 8, 16, 32, 64};
  const double tLoad = now();
  auto model =
      orFail(loadModel(modelDir, *backend, {.dtype = dtype, .graphBatchSizes = graphSizes}),
             "loading " + modelDir);
  const double loadS = now() - tLoad;
  const ModelConfig c = model->config();  // a copy: this model is freed before the eager run
  if (!c.isEncoderDecoder) {
    std::fprintf(stderr, "bench_t5: %s is %s, not an encoder-decoder model\n", modelDir.c_str(),
                 c.architecture.c_str());
    return 1;
  }
  double totalBytes = 0;
  const double stepWeightBytes =
      orFail(decoderStepWeightBytes(modelDir, elemSize, &totalBytes), "reading " + modelDir);
  const KvShape kv = model->kvShape();
  // Positions 0 .. kWarmSteps + steps: the encode step's row, the warm steps, the timed ones.
  const int64_t selfLen = 1 + kWarmSteps + steps;
  std::printf("device %s; %s (%s) loaded in %.1f s: %.2f GB of weights, %ld decoder layers\n",
              prop.name, modelDir.c_str(), c.architecture.c_str(), loadS, totalBytes / 1e9,
              static_cast<long>(c.numLayers));
  if (encoderLen > c.maxContext() || selfLen > c.maxContext())
    std::printf("note: beyond n_positions (%ld) decode steps run eagerly, not through graphs\n",
                static_cast<long>(c.maxContext()));

  // One pool for every scenario, sized for the largest batch's cross and self blocks (no need for
  // the shard's pool from all free memory: a step's work does not depend on the pool's size).
  const int64_t numBlocks = blocksFor(kMaxBatch, encoderLen, selfLen);
  auto cache = orFail(KvCache::create(*backend, kv, numBlocks, kBlockSize, model->dtype()),
                      "KV cache of " + std::to_string(numBlocks) + " blocks");
  const int64_t perBlock = KvCache::bytesPerBlock(kv, kBlockSize, model->dtype());
  std::printf("KV pool: %ld blocks of %ld tokens (%.2f GB)\n", static_cast<long>(numBlocks),
              static_cast<long>(kBlockSize), static_cast<double>(numBlocks * perBlock) / 1e9);

  std::vector<Row> rows;
  // Encoding: B prompts encoded in one forward (with each sequence's first decoder row).
  for (int64_t batch : {int64_t{1}, int64_t{8}}) {
    std::vector<Seq> seqs = makeSeqs(batch, encoderLen, selfLen, c.vocabSize);
    std::vector<double> t;
    for (int r = 0; r < kEncodeWarm + kEncodeRepeats; ++r) {
      for (Seq& s : seqs) s.pos = 0;  // encode again over the same blocks
      const double once = orFail(step(*model, *backend, *cache, seqs),
                                 "encode of " + std::to_string(batch) + " prompts");
      if (r >= kEncodeWarm) t.push_back(once);
    }
    const double sec = median(t);
    rows.push_back({"encode " + std::to_string(encoderLen), batch, "-", sec * 1e3,
                    static_cast<double>(batch * encoderLen) / sec, 0});
  }

  // Ideal ms of a decode step of `batch` sequences at decoder position `pos`: the weights once,
  // and per sequence and layer the keys and values of the encoder output and of positions 0..pos.
  const double bw = hbmTBps * 1e12;
  const double kvPerToken = 2.0 * static_cast<double>(kv.kvHeads * kv.headDim) *
                            static_cast<double>(elemSize) * static_cast<double>(kv.layers);
  auto idealMs = [&](int64_t batch, double pos) {
    const double kvBytes =
        static_cast<double>(batch) * kvPerToken * (static_cast<double>(encoderLen) + pos + 1);
    return (stepWeightBytes + kvBytes) / bw * 1e3;
  };
  // The timed steps' mean position (the roofline is linear in it).
  const double meanPos = static_cast<double>(1 + kWarmSteps) + static_cast<double>(steps - 1) / 2;

  // Decode: the batch encoded, warm steps (the first of a batch size captures its graph), then
  // `steps` timed steps at advancing positions.
  auto decode = [&](Model& m, int64_t batch, const char* graphs) {
    std::vector<Seq> seqs = makeSeqs(batch, encoderLen, selfLen, c.vocabSize);
    const std::string what = "decode of " + std::to_string(batch) + " sequences";
    for (int64_t g = 0; g < batch; g += kEncodeGroup) {
      const auto first = static_cast<size_t>(g);
      const auto count = static_cast<size_t>(std::min(kEncodeGroup, batch - g));
      (void)orFail(step(m, *backend, *cache, std::span<Seq>(seqs).subspan(first, count)),
                   what + " (encode)");
    }
    for (int64_t i = 0; i < kWarmSteps; ++i) (void)orFail(step(m, *backend, *cache, seqs), what);
    std::vector<double> t;
    for (int64_t i = 0; i < steps; ++i) t.push_back(orFail(step(m, *backend, *cache, seqs), what));
    const double ms = median(t) * 1e3;
    rows.push_back({"decode", batch, graphs, ms, static_cast<double>(batch) * 1e3 / ms,
                    idealMs(batch, meanPos)});
  };
  decode(*model, 1, "on");
  decode(*model, kMaxBatch, "on");
  // Graphs off: the same checkpoint loaded again without graph sizes (they are fixed at load),
  // after the first model's memory is freed.
  model.reset();
  auto eager = orFail(loadModel(modelDir, *backend, {.dtype = dtype, .graphBatchSizes = {}}),
                      "loading " + modelDir);
  decode(*eager, 1, "off");
  if (profile) {
    // Eager forwards (each kernel its own launch), traced after one untraced warm-up each.
    auto traced = [&](const char* what, int64_t batch, bool encode) {
      std::vector<Seq> seqs = makeSeqs(batch, encoderLen, selfLen, c.vocabSize);
      if (!encode) {
        for (int64_t g = 0; g < batch; g += kEncodeGroup)
          (void)orFail(step(*eager, *backend, *cache,
                            std::span<Seq>(seqs).subspan(
                                static_cast<size_t>(g),
                                static_cast<size_t>(std::min(kEncodeGroup, batch - g)))),
                       what);
      }
      for (Seq& s : seqs) s.pos = encode ? 0 : s.pos;
      (void)orFail(step(*eager, *backend, *cache, seqs), what);
      for (Seq& s : seqs) s.pos = encode ? 0 : s.pos;
      bench::KernelTrace trace;
      if (!trace.start()) return;
      (void)orFail(step(*eager, *backend, *cache, seqs), what);
      std::printf("\n%s\n", what);
      bench::printKernelTable(trace.stop(), 1);
    };
    traced("profile: encode of one prompt", 1, true);
    traced("profile: decode step of 1 sequence (eager)", 1, false);
    traced("profile: decode step of 64 sequences (eager)", kMaxBatch, false);
  }

  std::printf("\nencoder prompts of %ld tokens; decode: %ld timed steps after %ld warm, median\n",
              static_cast<long>(encoderLen), static_cast<long>(steps),
              static_cast<long>(kWarmSteps));
  std::printf(
      "roofline: %.3f GB of decoder weights a step + %.1f KB of KV per sequence and "
      "token, at %.2f TB/s\n\n",
      stepWeightBytes / 1e9, kvPerToken / 1e3, hbmTBps);
  std::printf("| scenario | batch | CUDA graphs | ms | tokens/s | ideal ms | of roofline |\n");
  std::printf("| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  json results = {{"bench", "t5"},
                  {"device", prop.name},
                  {"model", modelDir},
                  {"architecture", c.architecture},
                  {"dtype", dtypeName},
                  {"encoder_len", encoderLen},
                  {"steps", steps},
                  {"weight_GB", totalBytes / 1e9},
                  {"decode_step_weight_GB", stepWeightBytes / 1e9},
                  {"hbm_TBps", hbmTBps}};
  for (const Row& r : rows) {
    const bool encode = r.scenario != "decode";
    if (encode) {
      std::printf("| %s | %ld | %s | %.2f | %.0f encoder | | |\n", r.scenario.c_str(),
                  static_cast<long>(r.batch), r.graphs.c_str(), r.ms, r.tokensPerS);
      results["encode_b" + std::to_string(r.batch) + "_ms"] = r.ms;
      results["encode_b" + std::to_string(r.batch) + "_encoder_tokens_per_s"] = r.tokensPerS;
    } else {
      std::printf("| %s | %ld | %s | %.3f ms/step | %.0f | %.3f | %.0f%% |\n", r.scenario.c_str(),
                  static_cast<long>(r.batch), r.graphs.c_str(), r.ms, r.tokensPerS, r.idealMs,
                  100.0 * r.idealMs / r.ms);
      const std::string key =
          "decode_b" + std::to_string(r.batch) + (r.graphs == "on" ? "_graphs" : "_eager");
      results[key + "_ms_per_step"] = r.ms;
      results[key + "_tokens_per_s"] = r.tokensPerS;
      results[key + "_ideal_ms"] = r.idealMs;
      results[key + "_roofline_fraction"] = r.idealMs / r.ms;
    }
  }
  std::printf("\n%s\n", results.dump().c_str());
  return 0;
}
