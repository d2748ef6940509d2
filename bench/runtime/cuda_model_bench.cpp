// The CUDA backend on a real-shape model (written by tools/bench/make_random_model.py): device copy
// bandwidth and the bf16 GEMM peak as yardsticks, then batch-1 decode at contexts 128 and 2048
// (ms/token and the fraction of the weight-streaming roofline), prefill of 512 and 2048 tokens
// (tokens/s and the fraction of the GEMM peak), and a TGI-benchmark-style table over batch sizes
// (prefill latency, decode step latency, decode tokens/s). Each forward includes the host work of a
// step: building and uploading the batch metadata, and the greedy choice (the model's logits left
// on the device, then the Sampler's arg-max and the chosen ids downloaded, the engine's path for
// greedy requests; --host-logits downloads every logit row instead, the path of requests that
// sample on the host). Prints a table and one JSON line. Usage:
//   bench_cuda_model --model DIR [--dtype bfloat16|float16] [--prompt 128] [--steps 32]
//                    [--kv-cache-dtype fp8_e4m3fn|fp8_e5m2]   (an fp8 KV cache; default: the dtype)
//   bench_cuda_model --model DIR --profile B   (the kernels of one decode step of B sequences)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernel_trace.h"
#include "textgen/kernels/gemm_runner.h"
#include "textgen/kernels/launch.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/sampler.h"
#include "textgen/runtime/weights.h"

namespace {

using namespace textgen;
using namespace textgen::runtime;
using nlohmann::json;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double copyBandwidthGBs() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int iters = 10;
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3) / 1e9;
}

// cuBLASLt (the backend's GEMM runner) on a large square problem, TFLOP/s.
double gemmPeakTflops(kernels::DType dtype) {
  const int64_t n = 8192;
  const size_t bytes = static_cast<size_t>(n * n) * 2;
  void *x = nullptr, *w = nullptr, *y = nullptr;
  if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&w, bytes) != cudaSuccess ||
      cudaMalloc(&y, bytes) != cudaSuccess)
    return 0;
  cudaMemset(x, 0, bytes);
  cudaMemset(w, 0, bytes);
  auto runner = kernels::GemmRunner::create(nullptr, 32u << 20);
  if (!runner.ok()) return 0;
  const kernels::GemmParams p{x, w, y, n, n, n, dtype};
  (void)(*runner)->run(p);
  cudaDeviceSynchronize();
  const int iters = 20;
  const double t0 = now();
  for (int i = 0; i < iters; ++i) (void)(*runner)->run(p);
  cudaDeviceSynchronize();
  const double s = now() - t0;
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  return 2.0 * static_cast<double>(n) * n * n * iters / s / 1e12;
}

// Decode-shaped GEMMs (the layer shapes of the model, `rows` rows): weight bytes streamed per
// second by the backend's GEMM runner (the gemv kernel for one row, cuBLASLt otherwise) and by
// cuBLASLt alone, to see how close each comes to the copy bandwidth.
void gemvTable(const ModelConfig& c, bool gated, kernels::DType dtype, double copyGBs) {
  const int64_t h = c.hiddenSize, qkv = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
  const std::pair<const char*, std::pair<int64_t, int64_t>> shapes[] = {
      {"qkv", {h, qkv}},
      {"o", {c.numHeads * c.headDim, h}},
      {gated ? "gate_up" : "up", {h, (gated ? 2 : 1) * c.intermediateSize}},
      {"down", {c.intermediateSize, h}},
      {"lm_head", {h, c.vocabSize}}};
  auto gemv = kernels::GemmRunner::create(nullptr, 32u << 20, true);
  auto lt = kernels::GemmRunner::create(nullptr, 32u << 20, false);
  if (!gemv.ok() || !lt.ok()) return;
  std::printf("\n%-10s %5s %14s %14s   (GB/s of weights; copy %.0f)\n", "GEMM", "rows", "textgen",
              "cuBLASLt", copyGBs);
  for (const auto& [name, shape] : shapes) {
    const auto [in, out] = shape;
    void *x = nullptr, *w = nullptr, *y = nullptr;
    const size_t wBytes = static_cast<size_t>(in * out) * 2;
    cudaMalloc(&x, static_cast<size_t>(8 * in) * 2);
    cudaMalloc(&w, wBytes);
    cudaMalloc(&y, static_cast<size_t>(8 * out) * 2);
    cudaMemset(x, 0, static_cast<size_t>(8 * in) * 2);
    cudaMemset(w, 0, wBytes);
    for (int64_t rows : {1, 4}) {
      double gbs[2];
      for (int k = 0; k < 2; ++k) {
        kernels::GemmRunner& r = k == 0 ? **gemv : **lt;
        const kernels::GemmParams p{x, w, y, rows, in, out, dtype};
        (void)r.run(p);
        cudaDeviceSynchronize();
        const int iters = 50;
        const double t0 = now();
        for (int i = 0; i < iters; ++i) (void)r.run(p);
        cudaDeviceSynchronize();
        gbs[k] = static_cast<double>(wBytes) * iters / (now() - t0) / 1e9;
      }
      std::printf("%-10s %5ld %14.0f %14.0f\n", name, static_cast<long>(rows), gbs[0], gbs[1]);
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
  }
}

// Sequences over a shared KV cache; each forward appends `rows` tokens to every listed sequence.
class Driver {
 public:
  Driver(Model& model, KvCache& cache, Backend& backend, bool hostLogits)
      : model_(model),
        cache_(cache),
        backend_(backend),
        sampler_(backend),
        hostLogits_(hostLogits) {}

  // A new sequence with room for `capacity` tokens; returns its index.
  int64_t add(int64_t capacity) {
    const int64_t bs = cache_.blockSize();
    Seq s;
    for (int64_t b = 0; b < (capacity + bs - 1) / bs; ++b) s.blocks.push_back(nextBlock_++);
    seqs_.push_back(std::move(s));
    return static_cast<int64_t>(seqs_.size()) - 1;
  }
  bool fits(int64_t capacity, int64_t count) const {
    const int64_t bs = cache_.blockSize();
    return nextBlock_ + count * ((capacity + bs - 1) / bs) <= cache_.numBlocks();
  }
  void reset() {
    seqs_.clear();
    nextBlock_ = 0;
  }

  // Seconds for one forward of `rows` new tokens of each sequence in [first, first + count); a
  // failed forward ends the benchmark.
  double step(int64_t first, int64_t count, int64_t rows) {
    StatusOr<double> t = tryStep(first, count, rows);
    if (!t.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", t.status().toString().c_str());
      std::exit(1);
    }
    return *t;
  }
  // The same, the error returned (the batch sweep's largest batches may not fit in memory).
  StatusOr<double> tryStep(int64_t first, int64_t count, int64_t rows) {
    const int64_t bs = cache_.blockSize();
    ForwardBatch fb;
    for (int64_t i = first; i < first + count; ++i) {
      Seq& s = seqs_[i];
      fb.sequences.push_back({static_cast<int64_t>(fb.tokenIds.size()), rows, s.len, s.blocks});
      for (int64_t p = s.len; p < s.len + rows; ++p) {
        fb.tokenIds.push_back(
            static_cast<uint32_t>((p * 7919 + i * 31) % model_.config().vocabSize));
        fb.slots.push_back(s.blocks[p / bs] * static_cast<uint32_t>(bs) +
                           static_cast<uint32_t>(p % bs));
      }
      fb.logitRows.push_back(static_cast<int64_t>(fb.tokenIds.size()) - 1);
    }
    const double t0 = now();
    const Status st = choose(fb);
    const double t = now() - t0;
    if (!st.ok()) return st;
    for (int64_t i = first; i < first + count; ++i) seqs_[i].len += rows;
    return t;
  }

 private:
  struct Seq {
    std::vector<uint32_t> blocks;
    int64_t len = 0;
  };
  // The forward, then the engine's greedy choice (or every logit row to the host).
  Status choose(const ForwardBatch& fb) {
    auto logits = model_.forwardLogits(fb, cache_);
    if (!logits.ok()) return logits.status();
    return hostLogits_ ? downloadLogits(backend_, *logits).status()
                       : sampler_.greedy(*logits).status();
  }

  Model& model_;
  KvCache& cache_;
  Backend& backend_;
  Sampler sampler_;
  bool hostLogits_;
  std::vector<Seq> seqs_;
  uint32_t nextBlock_ = 0;
};

// What the checkpoint's tensors say about a decode step, whatever the family: parameters in all,
// those one step streams (every tensor but the token and position tables, whose one row per
// token is left out; the head, or the token table where the head is tied to it), and whether the
// MLP is gated.
struct CheckpointParams {
  double total = 0, streamed = 0;
  bool gated = false;
};

StatusOr<CheckpointParams> checkpointParams(const std::string& dir) {
  auto store = WeightStore::open(dir);
  if (!store.ok()) return store.status();
  auto endsWith = [](const std::string& s, std::string_view t) {
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  const std::vector<std::string> names = (*store)->names();
  bool separateHead = false;
  for (const std::string& n : names)
    separateHead |= endsWith(n, "lm_head.weight") || endsWith(n, "embed_out.weight");
  CheckpointParams p;
  for (const std::string& n : names) {
    double count = 1;
    for (int64_t d : (*store)->info(n)->shape) count *= static_cast<double>(d);
    p.total += count;
    const bool position = endsWith(n, "wpe.weight") || endsWith(n, "embed_positions.weight");
    const bool tokens = endsWith(n, "embed_tokens.weight") ||
                        endsWith(n, "word_embeddings.weight") || endsWith(n, "wte.weight") ||
                        endsWith(n, "embed_in.weight");
    if (!position && !(tokens && separateHead)) p.streamed += count;
    p.gated |= n.find("gate_proj") != std::string::npos;
  }
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string modelDir, dtypeName = "bfloat16";
  kernels::KvCacheDType cacheDtype = kernels::KvCacheDType::kAuto;
  int64_t prompt = 128, steps = 32;
  std::vector<int64_t> graphs{1, 2, 4, 8, 16, 32, 48, 64, 96, 128};  // the shard's default
  std::vector<int64_t> batches{1, 8, 16, 32, 48, 64, 128, 256};      // the batch sweep's
  int64_t profileBatch = 0;    // > 0: a short prefill and a traced decode step of this batch
  int64_t profilePrefill = 0;  // > 0: traced prefills of this many rows, alone and after 2048
  bool gemv = true, hostLogits = false;
  std::string quantize;  // --quantize: a load-time format (a pre-quantized checkpoint needs none)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      modelDir = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      dtypeName = argv[++i];
    } else if (a == "--kv-cache-dtype" && i + 1 < argc) {
      const auto fp8 = kernels::fp8KvCacheDTypeOf(argv[++i]);
      if (!fp8) {
        std::fprintf(stderr, "bench_cuda_model: --kv-cache-dtype must be fp8_e4m3fn or fp8_e5m2\n");
        return 2;
      }
      cacheDtype = *fp8;
    } else if (a == "--prompt" && i + 1 < argc) {
      prompt = std::atol(argv[++i]);
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atol(argv[++i]);
    } else if (a == "--profile" && i + 1 < argc) {
      profileBatch = std::atol(argv[++i]);
    } else if (a == "--profile-prefill" && i + 1 < argc) {
      profilePrefill = std::atol(argv[++i]);
    } else if (a == "--quantize" && i + 1 < argc) {
      quantize = argv[++i];
    } else if (a == "--host-logits") {
      hostLogits = true;
    } else if (a == "--no-gemv") {
      gemv = false;
    } else if (a == "--no-pdl") {
      kernels::setProgrammaticLaunch(false);
    } else if ((a == "--cuda-graphs" || a == "--batches") && i + 1 < argc) {
      std::vector<int64_t>& list = a == "--batches" ? batches : graphs;
      list.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        const long v = std::strtol(p, &end, 10);
        if (v > 0 && v <= 4096) list.push_back(v);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_cuda_model --model DIR [--dtype bfloat16|float16] "
                   "[--kv-cache-dtype fp8_e4m3fn|fp8_e5m2] [--prompt N] "
                   "[--steps N] [--batches 1,8,...] [--cuda-graphs 1,2,4,...|0] [--host-logits] "
                   "[--no-gemv] [--no-pdl] "
                   "[--profile B] [--profile-prefill ROWS] [--quantize "
                   "bitsandbytes|bitsandbytes-nf4|bitsandbytes-fp4|eetq|"
                   "fp8]\n");
      return 2;
    }
  }
  if (batches.empty()) {
    std::fprintf(stderr, "bench_cuda_model: --batches needs sizes from 1 to 4096\n");
    return 2;
  }
  if (modelDir.empty()) {
    std::fprintf(stderr, "bench_cuda_model: --model DIR is required\n");
    return 2;
  }
  const kernels::DType dtype =
      dtypeName == "float16" ? kernels::DType::kF16 : kernels::DType::kBF16;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const bool profiling = profileBatch > 0 || profilePrefill > 0;
  const double copyGBs = profiling ? 1.0 : copyBandwidthGBs();
  const double peak = profiling ? 1.0 : gemmPeakTflops(dtype);
  std::printf("device %s: copy bandwidth %.0f GB/s, %s GEMM (8192^3, cuBLASLt) %.0f TFLOP/s\n",
              prop.name, copyGBs, dtypeName.c_str(), peak);
  std::printf("programmatic dependent launch: %s\n", kernels::programmaticLaunch() ? "on" : "off");

  auto backend = makeCudaBackend(0, gemv);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().toString().c_str());
    return 1;
  }
  const LoadQuantization atLoad = loadQuantizationOf(quantize);
  if (!quantize.empty() && atLoad == LoadQuantization::kNone) {
    std::fprintf(stderr, "bench_cuda_model: --quantize %s is not a load-time format\n",
                 quantize.c_str());
    return 2;
  }
  size_t freeStart = 0, totalMem = 0;
  cudaMemGetInfo(&freeStart, &totalMem);
  const double tLoad = now();
  auto model = loadModel(modelDir, **backend,
                         {.dtype = dtype, .graphBatchSizes = graphs, .quantize = atLoad});
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().toString().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  auto params = checkpointParams(modelDir);
  if (!params.ok()) {
    std::fprintf(stderr, "%s\n", params.status().toString().c_str());
    return 1;
  }
  const int64_t h = c.hiddenSize;
  size_t freeLoaded = 0;
  cudaMemGetInfo(&freeLoaded, &totalMem);
  const bool quantized = atLoad != LoadQuantization::kNone || c.quantization.quantized();
  // Quantized: the device bytes the weights took; dense: the checkpoint's 16-bit parameters.
  const double weightBytes =
      quantized ? static_cast<double>(freeStart - freeLoaded) : 2.0 * params->total;
  // Bytes a decode step streams: every layer weight and the head (plus a row per table, left
  // out); quantized, the weights less the token table where the head is separate.
  const double streamedBytes =
      quantized ? weightBytes - 2.0 * (params->total - params->streamed) : 2.0 * params->streamed;
  const double layerParams =
      (params->streamed - static_cast<double>(c.vocabSize * h)) / static_cast<double>(c.numLayers);
  std::printf("loaded %s (%s) in %.1f s: %.2f GB of weights\n", modelDir.c_str(),
              c.architecture.c_str(), now() - tLoad, weightBytes / 1e9);
  if (!profiling && !quantized) gemvTable(c, params->gated, dtype, copyGBs);

  // One KV pool for every scenario: what the device has left, less 4 GiB for activations.
  size_t freeBytes = 0, total = 0;
  cudaMemGetInfo(&freeBytes, &total);
  const int64_t bs = 16;
  const int64_t perBlock = KvCache::bytesPerBlock((*model)->kvShape(), bs, dtype, cacheDtype);
  const int64_t numBlocks =
      static_cast<int64_t>((static_cast<double>(freeBytes) - (6.0 * (1 << 30))) / perBlock);
  auto cache = KvCache::create(**backend, (*model)->kvShape(), numBlocks, bs, dtype, cacheDtype);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().toString().c_str());
    return 1;
  }
  std::printf("KV pool: %ld blocks of %ld tokens (%.1f GB, %s)\n", static_cast<long>(numBlocks),
              static_cast<long>(bs), static_cast<double>(numBlocks * perBlock) / 1e9,
              cacheDtype == kernels::KvCacheDType::kAuto
                  ? dtypeName.c_str()
                  : std::string(kernels::kvCacheDTypeName(cacheDtype)).c_str());
  Driver d(**model, **cache, **backend, hostLogits);
  if (profileBatch > 0) {
    // A short prefill, warm decode steps, then one traced decode step: the kernel table, and the
    // step's wall time against its span on the device (the rest is host work).
    for (int64_t i = 0; i < profileBatch; ++i) d.add(256);
    d.step(0, profileBatch, 16);
    for (int i = 0; i < 3; ++i)
      std::printf("decode step: %.3f ms\n", d.step(0, profileBatch, 1) * 1e3);
    bench::KernelTrace trace;
    if (!trace.start()) return 1;
    const double wall = d.step(0, profileBatch, 1);
    const std::vector<bench::KernelSpan> spans = trace.stop();
    std::printf("traced decode step of %ld sequences: %.1f us wall\n",
                static_cast<long>(profileBatch), wall * 1e6);
    bench::printKernelTable(spans, 1);
    return 0;
  }
  if (profilePrefill > 0) {
    // One sequence's prefill of `profilePrefill` rows, alone and after 2048 tokens already in its
    // blocks (a prefix-cache hit as the shard runs it): an untraced step of the same shape first
    // (GEMM plans, modules), then the traced one.
    for (int64_t prefix : {int64_t{0}, int64_t{2048}}) {
      d.reset();
      const int64_t s = d.add(prefix + 7 * profilePrefill + 8);
      if (prefix > 0) d.step(s, 1, prefix);
      std::printf("\nprefill of %ld rows after %ld: %.3f ms (first of this shape)\n",
                  static_cast<long>(profilePrefill), static_cast<long>(prefix),
                  d.step(s, 1, profilePrefill) * 1e3);
      bench::KernelTrace trace;
      if (!trace.start()) return 1;
      const double wall = d.step(s, 1, profilePrefill);
      const std::vector<bench::KernelSpan> spans = trace.stop();
      std::printf("traced prefill of %ld rows after %ld: %.1f us wall\n",
                  static_cast<long>(profilePrefill), static_cast<long>(prefix + profilePrefill),
                  wall * 1e6);
      bench::printKernelTable(spans, 1);
      // Untraced repeats of the same shape (each a little further into the sequence): the wall
      // time a server sees, host work included.
      std::vector<double> walls;
      for (int r = 0; r < 5; ++r) walls.push_back(d.step(s, 1, profilePrefill) * 1e3);
      std::sort(walls.begin(), walls.end());
      std::printf(
          "untraced repeats of %ld rows after about %ld: median %.3f ms (min %.3f, max %.3f)\n",
          static_cast<long>(profilePrefill), static_cast<long>(prefix + 2 * profilePrefill),
          walls[2], walls[0], walls[4]);
    }
    return 0;
  }
  json results = json::object();
  results["device"] = prop.name;
  results["architecture"] = c.architecture;
  results["programmatic_launch"] = kernels::programmaticLaunch();
  results["copy_GBps"] = copyGBs;
  results["gemm_peak_TFLOPs"] = peak;
  results["weight_GB"] = weightBytes / 1e9;
  results["quantize"] =
      quantized ? (quantize.empty() ? std::string(toString(c.quantization.method)) : quantize)
                : "none";
  results["kv_cache_dtype"] = std::string(kernels::kvCacheDTypeName(cacheDtype));

  // Batch-1 decode at a context.
  const double rooflineMs = streamedBytes / (copyGBs * 1e9) * 1e3;
  std::printf("\n%-28s %12s %12s %10s\n", "batch-1 decode", "ms/token", "tokens/s", "roofline");
  for (int64_t ctx : {128, 2048}) {
    d.reset();
    const int64_t s = d.add(ctx + 64 + 8);
    d.step(s, 1, ctx);
    for (int i = 0; i < 3; ++i) d.step(s, 1, 1);  // warm the decode path
    std::vector<double> t;
    for (int i = 0; i < 64; ++i) t.push_back(d.step(s, 1, 1));
    const double ms = median(t) * 1e3;
    std::printf("context %-20ld %12.3f %12.1f %9.0f%%\n", static_cast<long>(ctx), ms, 1e3 / ms,
                100.0 * rooflineMs / ms);
    results["decode_b1_ctx" + std::to_string(ctx) + "_ms"] = ms;
    results["decode_b1_ctx" + std::to_string(ctx) + "_roofline_fraction"] = rooflineMs / ms;
  }
  std::printf("roofline (weights %.2f GB / %.0f GB/s): %.3f ms/token\n", streamedBytes / 1e9,
              copyGBs, rooflineMs);
  results["roofline_ms"] = rooflineMs;

  // Prefill of one prompt.
  std::printf("\n%-28s %12s %12s %10s\n", "prefill (batch 1)", "ms", "tokens/s", "GEMM peak");
  for (int64_t len : {512, 2048}) {
    std::vector<double> t;
    for (int i = 0; i < 4; ++i) {
      d.reset();
      const int64_t s = d.add(len + 8);
      t.push_back(d.step(s, 1, len));
    }
    t.erase(t.begin());  // the first run sizes the workspace and picks GEMM algorithms
    const double sec = median(t);
    const double flops = 2.0 * static_cast<double>(len) * c.numLayers * layerParams +
                         2.0 * static_cast<double>(h) * c.vocabSize;  // the head: the last row
    std::printf("prompt %-21ld %12.2f %12.0f %9.0f%%\n", static_cast<long>(len), sec * 1e3,
                len / sec, 100.0 * flops / sec / (peak * 1e12));
    results["prefill_" + std::to_string(len) + "_tokens_per_s"] = len / sec;
    results["prefill_" + std::to_string(len) + "_gemm_fraction"] = flops / sec / (peak * 1e12);
  }

  // Device memory beside the KV pool after the 2048-token prefill: the CUDA context, weights and
  // workspaces (what a server needs before its KV cache).
  {
    size_t freeNow = 0;
    cudaMemGetInfo(&freeNow, &totalMem);
    const double used = static_cast<double>(totalMem - freeNow);
    const double kv = static_cast<double>(numBlocks * perBlock);
    std::printf("\ndevice memory: %.2f GB in use less the KV pool (%.2f GB of weights)\n",
                (used - kv) / 1e9, weightBytes / 1e9);
    results["memory_without_kv_GB"] = (used - kv) / 1e9;
  }

  // TGI-benchmark-style: a batch of prompts prefilled together, then decode steps.
  std::printf("\nbatch sweep: prompt %ld tokens, %ld decode steps\n", static_cast<long>(prompt),
              static_cast<long>(steps));
  std::printf("%6s %14s %16s %16s %16s\n", "batch", "prefill ms", "prefill tok/s", "decode ms/step",
              "decode tok/s");
  json sweep = json::array();
  for (const int64_t batch : batches) {
    d.reset();
    if (!d.fits(prompt + steps + 8, batch)) {
      std::printf("%6ld  (KV pool too small)\n", static_cast<long>(batch));
      continue;
    }
    for (int64_t i = 0; i < batch; ++i) d.add(prompt + steps + 8);
    const StatusOr<double> prefill = d.tryStep(0, batch, prompt);
    if (!prefill.ok()) {  // the prefill's activations beside the KV pool
      std::printf("%6ld  (%s)\n", static_cast<long>(batch), prefill.status().toString().c_str());
      sweep.push_back({{"batch", batch}, {"error", prefill.status().toString()}});
      continue;
    }
    const double pre = *prefill;
    d.step(0, batch, 1);  // warm
    std::vector<double> t;
    for (int64_t i = 0; i < steps - 1; ++i) t.push_back(d.step(0, batch, 1));
    double mean = 0;
    for (double x : t) mean += x;
    mean /= static_cast<double>(t.size());
    std::printf("%6ld %14.2f %16.0f %16.3f %16.0f\n", static_cast<long>(batch), pre * 1e3,
                batch * prompt / pre, mean * 1e3, batch / mean);
    sweep.push_back({{"batch", batch},
                     {"prefill_ms", pre * 1e3},
                     {"decode_step_ms", mean * 1e3},
                     {"decode_tokens_per_s", batch / mean}});
  }
  results["batch_sweep"] = sweep;
  std::printf("\n%s\n", results.dump().c_str());
  return 0;
}
