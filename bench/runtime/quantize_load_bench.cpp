// Load time per --quantize format (issue 16: load-time quantization of a bfloat16 checkpoint): the
// model loaded through the shard's own loader onto the CPU backend once per format, the wall time
// of loadModel measured (reading, converting, quantizing, packing, uploading). Prints a table, one
// row per format beside `none`, with each format's cost per quantized weight (the decoder layers'
// 2-D weights) and per core, then one JSON line; it measures, never asserts.
//
//   bench_quantize_load --model DIR [--quantize none,eetq,...|all] [--dtype
//   float32|float16|bfloat16]
//                       [--repeat N]
//
// --quantize: TGI's load-time values (bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, eetq,
// fp8) and `none`, comma-separated; `all` (the default) is none and every one of them. --repeat:
// loads per format, the fastest reported (default 1). A random checkpoint with real shapes:
// tools/bench/make_random_model.py (bench/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loader/load_quantizer.h"
#include "loader/quantized_tensor.h"
#include "textgen/kernels/half.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/weights.h"

namespace {

using namespace textgen;
using namespace textgen::runtime;
using nlohmann::json;

constexpr const char* kUsage =
    "usage: bench_quantize_load [--model DIR] [--quantize none,eetq,...|all]\n"
    "                           [--dtype float32|float16|bfloat16] [--repeat N] [--layer OUTxIN]\n";

const std::vector<std::string> kAll = {
    "none", "bitsandbytes", "bitsandbytes-nf4", "bitsandbytes-fp4", "eetq", "fp8"};

struct Flags {
  std::string model;
  std::vector<std::string> quantize = kAll;
  std::string dtype = "float32";  // the CPU backend's only one
  int repeat = 1;
  int64_t layerOut = 11008, layerIn = 4096;
};

std::vector<std::string> splitCommas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

StatusOr<Flags> parseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return invalidArgumentError("flag '" + a + "' needs a value");
    const std::string v = argv[++i];
    if (a == "--model") {
      f.model = v;
    } else if (a == "--quantize") {
      f.quantize = v == "all" ? kAll : splitCommas(v);
      for (const std::string& q : f.quantize)
        if (q != "none" && loadQuantizationOf(q) == LoadQuantization::kNone)
          return invalidArgumentError("--quantize: '" + q + "' is not a load-time format");
    } else if (a == "--dtype") {
      if (v != "float32" && v != "float16" && v != "bfloat16")
        return invalidArgumentError("--dtype must be float32, float16 or bfloat16");
      f.dtype = v;
    } else if (a == "--repeat") {
      f.repeat = std::atoi(v.c_str());
      if (f.repeat < 1) return invalidArgumentError("--repeat must be at least 1");
    } else if (a == "--layer") {
      if (std::sscanf(v.c_str(), "%ldx%ld", &f.layerOut, &f.layerIn) != 2 || f.layerOut < 1 ||
          f.layerIn < 2)
        return invalidArgumentError("--layer must be OUTxIN, e.g. 11008x4096");
    } else {
      return invalidArgumentError("unknown flag '" + a + "'");
    }
  }
  return f;
}

// Elements of the decoder layers' 2-D weights: what --quantize quantizes (the embedding and the
// head stay dense).
StatusOr<int64_t> quantizedElements(const std::string& dir) {
  TG_ASSIGN_OR_RETURN(auto store, WeightStore::open(dir));
  int64_t n = 0;
  for (const std::string& name : store->names()) {
    const TensorInfo* info = store->info(name);
    if (info->shape.size() == 2 && name.find("layers.") != std::string::npos)
      n += info->shape[0] * info->shape[1];
  }
  return n;
}

struct Row {
  std::string quantize;
  double seconds = 0;
};

double secondsOf(const std::function<void()>& fn, int repeat) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The quantizers alone on one random bfloat16 layer: rows, then the JSON results.
json layerRows(const Flags& f, unsigned cores) {
  const int64_t out = f.layerOut, in = f.layerIn, n = out * in;
  std::vector<uint16_t> bf16(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (uint16_t& h : bf16) h = kernels::floatToBf16(normal(rng));
  WeightRows rows;
  rows.cols = in;
  for (int64_t o = 0; o < out; ++o)
    rows.rows.push_back({bf16.data() + o * in, WeightRows::Type::kBF16});
  std::vector<float> f32(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) f32[k] = kernels::bf16ToFloat(bf16[k]);
  std::printf("\nQuantizers alone on a [%lld, %lld] bfloat16 layer, %u cores, best of %d\n",
              static_cast<long long>(out), static_cast<long long>(in), cores, f.repeat);
  std::printf("%-18s %13s %13s %15s %15s %8s\n", "quantize", "loader s", "reference s",
              "loader ns*core", "reference ns*c", "speedup");
  json results = json::array();
  for (const std::string& q : f.quantize) {
    const LoadQuantization lq = loadQuantizationOf(q);
    if (lq == LoadQuantization::kNone) continue;
    const auto code = lq == LoadQuantization::kBitsandbytesNf4 ? kernels::QuantCode::kNf4
                                                               : kernels::QuantCode::kFp4;
    const auto act = lq == LoadQuantization::kBitsandbytes ? kernels::ActQuant::kLlmInt8
                                                           : kernels::ActQuant::kNone;
    size_t sink = 0;
    const double fast = secondsOf(
        [&] {
          PackedQuantized p =
              lq == LoadQuantization::kFp8 ? quantizeFp8Packed(rows)
              : lq == LoadQuantization::kBitsandbytesNf4 || lq == LoadQuantization::kBitsandbytesFp4
                  ? *quantizeBnb4Packed(rows, code)
                  : quantizeInt8Packed(rows, act);
          sink += p.packed[0];
        },
        f.repeat);
    const double ref = secondsOf(
        [&] {
          QuantizedTensor t =
              lq == LoadQuantization::kFp8 ? quantizeFp8PerTensor(f32.data(), out, in)
              : lq == LoadQuantization::kBitsandbytesNf4 || lq == LoadQuantization::kBitsandbytesFp4
                  ? *quantizeBnb4(f32.data(), out, in, code)
                  : quantizeInt8Rowwise(f32.data(), out, in, act);
          sink += pack(t).packed[0];
        },
        f.repeat);
    const double perFast = fast * 1e9 * cores / static_cast<double>(n),
                 perRef = ref * 1e9 * cores / static_cast<double>(n);
    std::printf("%-18s %13.3f %13.3f %15.2f %15.2f %7.1fx%s\n", q.c_str(), fast, ref, perFast,
                perRef, ref / fast, sink == 0xffffffff ? " " : "");
    results.push_back({{"quantize", q},
                       {"loader_seconds", fast},
                       {"reference_seconds", ref},
                       {"loader_ns_per_element_core", perFast},
                       {"reference_ns_per_element_core", perRef}});
  }
  // The floor under the 8-bit formats: a fresh 1-byte-per-element buffer written on every core
  // (its pages faulted in; on a VM that is most of the quantizers' time).
  const double floor = secondsOf(
      [&] {
        HostBytes b(static_cast<size_t>(n));
        parallelFor(
            n, [&](int64_t k0, int64_t k1) { std::memset(b.data() + k0, 1, k1 - k0); }, 1 << 16);
      },
      f.repeat);
  std::printf("%-18s %13.3f %13s %15.2f\n", "(write 1 B/elem)", floor, "",
              floor * 1e9 * cores / static_cast<double>(n));
  results.push_back({{"quantize", "write_floor"},
                     {"loader_seconds", floor},
                     {"loader_ns_per_element_core", floor * 1e9 * cores / static_cast<double>(n)}});
  return results;
}

int run(const Flags& f) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (f.model.empty()) {
    const json layer = layerRows(f, cores);
    std::printf("%s\n", json{{"bench", "quantize_load"},
                             {"cores", cores},
                             {"layer", {f.layerOut, f.layerIn}},
                             {"quantizers", layer}}
                            .dump()
                            .c_str());
    return 0;
  }
  const kernels::DType dtype = f.dtype == "float16"    ? kernels::DType::kF16
                               : f.dtype == "bfloat16" ? kernels::DType::kBF16
                                                       : kernels::DType::kF32;
  auto elements = quantizedElements(f.model);
  if (!elements.ok()) {
    std::fprintf(stderr, "bench_quantize_load: %s\n", elements.status().toString().c_str());
    return 1;
  }
  auto backend = makeCpuBackend(1);
  std::vector<Row> rows;
  for (const std::string& q : f.quantize) {
    ModelOptions options;
    options.dtype = dtype;
    options.quantize = loadQuantizationOf(q);
    double best = 1e30;
    for (int r = 0; r < f.repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto model = loadModel(f.model, *backend, options);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!model.ok()) {
        std::fprintf(stderr, "bench_quantize_load: --quantize %s: %s\n", q.c_str(),
                     model.status().toString().c_str());
        return 1;
      }
      best = std::min(best, s);
    }
    std::fprintf(stderr, "%s: %.2f s\n", q.c_str(), best);
    rows.push_back({q, best});
  }
  std::printf("Load time of %s (%s), %.3g G quantizable elements, %u cores, best of %d\n",
              f.model.c_str(), f.dtype.c_str(), static_cast<double>(*elements) * 1e-9, cores,
              f.repeat);
  std::printf("%-18s %9s %14s %19s\n", "quantize", "seconds", "ns/element", "ns/element x cores");
  json results = json::array();
  for (const Row& r : rows) {
    const double ns = r.seconds * 1e9 / static_cast<double>(*elements);
    std::printf("%-18s %9.2f %14.3f %19.3f\n", r.quantize.c_str(), r.seconds, ns, ns * cores);
    results.push_back({{"quantize", r.quantize},
                       {"seconds", r.seconds},
                       {"ns_per_element", ns},
                       {"ns_per_element_core", ns * cores}});
  }
  const json layer = layerRows(f, cores);
  std::printf("%s\n", json{{"bench", "quantize_load"},
                           {"model", f.model},
                           {"dtype", f.dtype},
                           {"elements", *elements},
                           {"cores", cores},
                           {"repeat", f.repeat},
                           {"results", results},
                           {"layer", {f.layerOut, f.layerIn}},
                           {"quantizers", layer}}
                          .dump()
                          .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = parseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "bench_quantize_load: %s\n%s",
                 std::string(flags.status().message()).c_str(), kUsage);
    return 2;
  }
  return run(*flags);
}
