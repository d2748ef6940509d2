// Tensor parallelism on one machine: the same model at TP=1 and TP=2 (any --tp list) side by side.
// Batch-1 decode at a context (ms/token, and the fraction of the per-GPU weight-streaming
// roofline), decode steps over 64 and 256 sequences (tokens/s), and one decode step of 1 and of 64
// sequences traced with CUPTI on every rank: the all-reduce kernels' time per step and per layer,
// and their share of the step. Every forward is the shard's greedy step, as in bench_cuda_model:
// metadata built and uploaded, decode through the captured CUDA graphs, the Sampler's arg-max on
// the device right after and the chosen ids downloaded.
//
// Each rank is a process, as the launcher runs shards: forked before any CUDA call, device = rank,
// so the communicator takes its production path (the one-shot all-reduce maps its peers through
// CUDA IPC, not peer access within one process) and no process-wide state is shared between
// devices. It loads the model with its Communicator (NCCL on the CUDA backend, with whichever
// all-reduce that communicator picks) and makes exactly the forwards the others make, or the
// collectives hang. TP=1 loads without a communicator, as a lone shard does. Prints a table and
// one JSON line; never asserts. Usage:
//   bench_tp --model DIR [--tp 1,2] [--steps 32] [--context 128] [--batches 64,256]
//            [--cuda-graphs 1,2,4,...,256|0] [--no-pdl]
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kernel_trace.h"
#include "textgen/kernels/launch.h"
#include "textgen/runtime/communicator.h"
#include "textgen/runtime/model.h"
#include "textgen/runtime/sampler.h"

namespace {

using namespace textgen;
using namespace textgen::runtime;
using nlohmann::json;

constexpr int64_t kBlockSize = 16;
constexpr int kWarmSteps = 3;  // the first decode step of a batch size captures its graph
constexpr kernels::DType kDType = kernels::DType::kBF16;

struct Options {
  std::string modelDir;
  std::vector<int64_t> tp{1, 2};
  int64_t steps = 32, context = 128;
  std::vector<int64_t> batches{64, 256};
  // Decode batches up to 256 replay captured graphs, so that 64 and 256 do as the 1 does.
  std::vector<int64_t> graphs{1, 2, 4, 8, 16, 32, 64, 128, 256};
  bool pdl = true;
  std::string traceDir;  // where each rank's traced kernels go as CSV (name,start_ns,end_ns)
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "1,2,4" -> {1, 2, 4}; empty when malformed or when a value is not positive.
std::vector<int64_t> parseList(const std::string& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i <= s.size();) {
    const size_t comma = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, comma - i);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) return {};
    out.push_back(v);
    i = comma + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// A rank's process. It reports to the parent with one JSON object on a pipe, and ends without
// tearing anything down.

int gResultFd = -1;
int gRank = 0;

void writeAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void finish(const json& result, int code) {
  if (gResultFd >= 0) writeAll(gResultFd, result.dump());
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

// A rank that cannot go on ends its process: its peers would wait in their next collective (the
// parent stops them when it sees this exit).
[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "bench_tp rank %d: %s\n", gRank, why.c_str());
  finish(json{{"rank", gRank}, {"error", why}}, 1);
}

// Device-to-device copy bandwidth on the current device, counting bytes read plus bytes written.
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
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3) / 1e9;
}

// Bytes one rank streams per decode step: its share of every layer weight and of the head.
double streamedBytes(const ModelConfig& c, int world) {
  const int64_t h = c.hiddenSize, q = c.numHeads / world * c.headDim;
  const int64_t kv = std::max<int64_t>(c.numKvHeads / world, 1) * c.headDim;
  const int64_t layer = h * (q + 2 * kv) + q * h + 3 * h * (c.intermediateSize / world);
  return 2.0 * static_cast<double>(c.numLayers * layer + (c.vocabSize + world - 1) / world * h);
}

// Sequences over a shared KV cache; each forward appends `rows` tokens to every listed sequence
// (bench_cuda_model's driver, greedy only). Every rank builds the same batches.
class Driver {
 public:
  Driver(Model& model, KvCache& cache, Backend& backend)
      : model_(model), cache_(cache), sampler_(backend) {}

  // A new sequence with room for `capacity` tokens; returns its index.
  int64_t add(int64_t capacity) {
    const int64_t bs = cache_.blockSize();
    Seq s;
    for (int64_t b = 0; b < (capacity + bs - 1) / bs; ++b) s.blocks.push_back(nextBlock_++);
    seqs_.push_back(std::move(s));
    return static_cast<int64_t>(seqs_.size()) - 1;
  }
  void reset() {
    seqs_.clear();
    nextBlock_ = 0;
  }

  // Seconds for one forward of `rows` new tokens of each sequence in [first, first + count).
  double step(int64_t first, int64_t count, int64_t rows) {
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
    auto logits = model_.forwardLogits(fb, cache_);
    const Status st = logits.ok() ? sampler_.greedy(*logits).status() : logits.status();
    const double t = now() - t0;
    if (!st.ok()) die("forward failed: " + st.toString());
    for (int64_t i = first; i < first + count; ++i) seqs_[i].len += rows;
    return t;
  }

 private:
  struct Seq {
    std::vector<uint32_t> blocks;
    int64_t len = 0;
  };
  Model& model_;
  KvCache& cache_;
  Sampler sampler_;
  std::vector<Seq> seqs_;
  uint32_t nextBlock_ = 0;
};

// A barrier of the ranks through the rendezvous store (nothing at TP=1); names are single-use.
class Sync {
 public:
  explicit Sync(Rendezvous* rendezvous) : rendezvous_(rendezvous) {}
  void operator()() {
    if (rendezvous_ == nullptr) return;
    const Status s = rendezvous_->barrier("bench_tp/" + std::to_string(next_++));
    if (!s.ok()) die(s.toString());
  }
  // Before the process ends. The store lives in rank 0's process, which therefore ends last: once
  // every other rank has said it no longer needs it (past a barrier, a rank may still be reading
  // the others' arrivals).
  void leave() {
    if (rendezvous_ == nullptr) return;
    const auto timeout = std::chrono::minutes(1);
    if (rendezvous_->rank() != 0) {
      (void)rendezvous_->set("bench_tp/left/" + std::to_string(rendezvous_->rank()), "1");
      return;
    }
    for (int r = 1; r < rendezvous_->worldSize(); ++r)
      (void)rendezvous_->get("bench_tp/left/" + std::to_string(r), timeout);
  }

 private:
  Rendezvous* rendezvous_;
  int next_ = 0;
};

// Tokens a sequence holds: the context, the warm steps, the timed steps, and a few to spare.
int64_t capacity(const Options& o) {
  return o.context + kWarmSteps + o.steps + 8;
}

// `batch` sequences, their contexts prefilled together, then the warm decode steps.
void prepare(Driver& d, const Options& o, int64_t batch) {
  d.reset();
  for (int64_t i = 0; i < batch; ++i) d.add(capacity(o));
  d.step(0, batch, o.context);
  for (int i = 0; i < kWarmSteps; ++i) d.step(0, batch, 1);
}

// Seconds per decode step of `batch` sequences: the median of `steps`.
double decodeStep(Driver& d, const Options& o, int64_t batch) {
  prepare(d, o, batch);
  std::vector<double> t;
  for (int64_t i = 0; i < o.steps; ++i) t.push_back(d.step(0, batch, 1));
  return median(t);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The collective kernels of one traced step. NCCL's are named like
// ncclDevKernel_AllReduce_Sum_bf16_RING_LL and ncclDevKernel_AllGather_RING_LL, the
// communicator's one-shot kernel oneShotAllReduceKernel: matched case-insensitively on
// "allreduce" / "all_reduce" and "allgather" / "all_gather"; any other kernel named "nccl..." is
// counted apart (a generic NCCL kernel would carry a collective unnamed). A kernel's exposed time
// starts where the kernels before it ended: one launched early (programmatic dependent launch) does
// not count its wait for them. The all-reduce's own wait for a late peer does count: the step pays
// it.
json summarizeTrace(const std::vector<bench::KernelSpan>& spans, int64_t layers) {
  int64_t reduces = 0, gathers = 0, otherNccl = 0;
  double reduceNs = 0, exposedNs = 0, gatherNs = 0, otherNcclNs = 0;
  std::vector<double> each;
  uint64_t coveredTo = spans.empty() ? 0 : spans.front().start;
  for (const bench::KernelSpan& s : spans) {
    const uint64_t from = std::max(coveredTo, s.start);
    const double exposed = s.end > from ? static_cast<double>(s.end - from) : 0.0;
    const double ns = static_cast<double>(s.end - s.start);
    coveredTo = std::max(coveredTo, s.end);
    const std::string n = lower(s.name);
    if (n.find("allreduce") != std::string::npos || n.find("all_reduce") != std::string::npos) {
      ++reduces;
      reduceNs += ns;
      exposedNs += exposed;
      each.push_back(exposed);
    } else if (n.find("allgather") != std::string::npos ||
               n.find("all_gather") != std::string::npos) {
      ++gathers;
      gatherNs += ns;
    } else if (n.find("nccl") != std::string::npos) {
      ++otherNccl;
      otherNcclNs += ns;
    }
  }
  const double spanNs = spans.empty() ? 0.0 : static_cast<double>(coveredTo - spans.front().start);
  return json{{"kernels", spans.size()},
              {"span_us", spanNs / 1e3},
              {"all_reduces", reduces},
              {"all_reduce_us", reduceNs / 1e3},
              {"all_reduce_exposed_us", exposedNs / 1e3},
              {"all_reduce_median_us", median(each) / 1e3},
              {"all_reduce_per_layer_us", exposedNs / 1e3 / static_cast<double>(layers)},
              {"all_reduce_share", spanNs > 0 ? exposedNs / spanNs : 0.0},
              {"all_gathers", gathers},
              {"all_gather_us", gatherNs / 1e3},
              {"other_nccl_kernels", otherNccl},
              {"other_nccl_us", otherNcclNs / 1e3}};
}

// One decode step of `batch` sequences under the kernel trace, on every rank at once.
json traceStep(Driver& d, const Options& o, int64_t batch, Sync& sync, int64_t layers, int world) {
  prepare(d, o, batch);
  const double untraced = d.step(0, batch, 1);
  bench::KernelTrace trace;
  const bool tracing = trace.start();
  sync();  // every rank traced before any starts the step
  const double wall = d.step(0, batch, 1);
  std::vector<bench::KernelSpan> spans;
  if (tracing) spans = trace.stop();
  json j = summarizeTrace(spans, layers);
  if (!o.traceDir.empty() && !spans.empty()) {
    const std::string path = o.traceDir + "/trace.tp" + std::to_string(world) + ".b" +
                             std::to_string(batch) + ".rank" + std::to_string(gRank) + ".csv";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      // CUPTI's timestamps (ns), comparable across the ranks of one machine.
      for (const bench::KernelSpan& s : spans)
        std::fprintf(f, "%s,%llu,%llu\n", s.name.c_str(), static_cast<unsigned long long>(s.start),
                     static_cast<unsigned long long>(s.end));
      std::fclose(f);
    }
  }
  j["batch"] = batch;
  j["wall_us"] = wall * 1e6;
  j["untraced_wall_us"] = untraced * 1e6;
  if (gRank == 0) {
    std::printf(
        "\nTP=%d rank 0: one traced decode step at batch %ld, %.1f us wall (%.1f untraced)\n",
        world, static_cast<long>(batch), wall * 1e6, untraced * 1e6);
    bench::printKernelTable(spans, 1);
  }
  return j;
}

json configJson(const ModelConfig& c) {
  return json{{"hidden", c.hiddenSize}, {"layers", c.numLayers},
              {"heads", c.numHeads},    {"kv_heads", c.numKvHeads},
              {"head_dim", c.headDim},  {"intermediate", c.intermediateSize},
              {"vocab", c.vocabSize}};
}

// The model loaded with this rank's communicator, and a KV pool for the largest batch.
struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Rendezvous> rendezvous;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
};

Loaded load(const Options& o, int rank, int world, int port, json& r) {
  Loaded l;
  auto backend = makeCudaBackend(rank);
  if (!backend.ok()) die(backend.status().toString());
  l.backend = std::move(*backend);
  if (world > 1) {
    auto joined = Rendezvous::join({.masterAddr = "127.0.0.1",
                                    .masterPort = port,
                                    .rank = rank,
                                    .worldSize = world,
                                    .timeout = std::chrono::minutes(5)});
    if (!joined.ok()) die(joined.status().toString());
    l.rendezvous = std::move(*joined);
    auto comm = makeCommunicator(
        *l.backend, *l.rendezvous,
        {.timeout = std::chrono::minutes(2), .onFatal = [](const std::string& why) { die(why); }});
    if (!comm.ok()) die(comm.status().toString());
    l.comm = std::move(*comm);
  }
  const double t0 = now();
  auto model = loadModel(o.modelDir, *l.backend,
                         {.comm = l.comm.get(), .dtype = kDType, .graphBatchSizes = o.graphs});
  if (!model.ok()) die(model.status().toString());
  l.model = std::move(*model);
  r["load_s"] = now() - t0;
  const int64_t maxBatch = std::max<int64_t>(
      1, o.batches.empty() ? 1 : *std::max_element(o.batches.begin(), o.batches.end()));
  const int64_t numBlocks = maxBatch * ((capacity(o) + kBlockSize - 1) / kBlockSize);
  auto cache = KvCache::create(*l.backend, l.model->kvShape(), numBlocks, kBlockSize, kDType);
  if (!cache.ok()) die(cache.status().toString());
  l.cache = std::move(*cache);
  r["kv_GB"] = static_cast<double>(numBlocks *
                                   KvCache::bytesPerBlock(l.model->kvShape(), kBlockSize, kDType)) /
               1e9;
  return l;
}

// Rank `rank` of `world`: every measurement, reported to the parent; never returns.
[[noreturn]] void runRank(const Options& o, int rank, int world, int port) {
  gRank = rank;
  if (!o.pdl) kernels::setProgrammaticLaunch(false);
  json r{{"rank", rank}};
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, rank);
  if (rank == 0 && cudaSetDevice(rank) == cudaSuccess) r["copy_GBps"] = copyBandwidthGBs();
  Loaded l = load(o, rank, world, port, r);
  const ModelConfig& c = l.model->config();
  r["device"] = prop.name;
  r["communicator"] = l.comm ? l.comm->name() : "none";
  r["programmatic_launch"] = kernels::programmaticLaunch();
  r["config"] = configJson(c);
  r["streamed_bytes"] = streamedBytes(c, world);
  if (rank == 0) {
    std::printf("TP=%d: %s, communicator %s, loaded in %.1f s, KV pool %.1f GB per rank\n", world,
                prop.name, r["communicator"].get<std::string>().c_str(), r["load_s"].get<double>(),
                r["kv_GB"].get<double>());
    std::fflush(stdout);
  }
  Driver d(*l.model, *l.cache, *l.backend);
  Sync sync(l.rendezvous.get());
  sync();
  // Progress on the way (the table comes at the end, after every degree).
  auto report = [&](int64_t batch, double sec) {
    if (rank != 0) return;
    std::printf("TP=%d: decode at batch %ld: %.3f ms/step, %.0f tokens/s\n", world,
                static_cast<long>(batch), sec * 1e3, static_cast<double>(batch) / sec);
    std::fflush(stdout);
  };
  const double b1 = decodeStep(d, o, 1);
  report(1, b1);
  r["decode_b1_ms"] = b1 * 1e3;
  json batches = json::array();
  for (int64_t b : o.batches) {
    const double sec = decodeStep(d, o, b);
    report(b, sec);
    batches.push_back(
        {{"batch", b}, {"step_ms", sec * 1e3}, {"tokens_per_s", static_cast<double>(b) / sec}});
  }
  r["batches"] = batches;
  // Traced after every timing: CUPTI stays attached to the process once started.
  json traces = json::array();
  traces.push_back(traceStep(d, o, 1, sync, c.numLayers, world));
  if (!o.batches.empty())
    traces.push_back(traceStep(d, o, o.batches.front(), sync, c.numLayers, world));
  r["traces"] = traces;
  sync.leave();
  finish(r, 0);
}

// ---------------------------------------------------------------------------------------------
// The parent: no CUDA here (a forked child could not use it after).

// A port nothing listens on now (the kernel's choice for port 0).
int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string readAll(int fd) {
  std::string s;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  return s;
}

// Forks the ranks of one degree and returns each rank's report. A rank that fails takes the
// others down (they would wait in their next collective). Reports are a few KB, well within a
// pipe's buffer, so they are read once the ranks have ended.
std::vector<json> runGroup(const Options& o, int world) {
  const int port = world > 1 ? freePort() : 0;
  struct Child {
    pid_t pid;
    int fd;
    bool done;
    int status;
  };
  std::vector<Child> children;
  for (int r = 0; r < world; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) break;
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      gResultFd = fds[1];
      runRank(o, r, world, port);
    }
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      break;
    }
    children.push_back({pid, fds[0], false, 0});
  }
  bool failed = static_cast<int>(children.size()) < world;
  if (failed) {
    for (const Child& c : children) ::kill(c.pid, SIGKILL);
  }
  for (size_t left = children.size(); left > 0;) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    for (Child& c : children) {
      if (c.pid == pid && !c.done) {
        c.done = true;
        c.status = st;
        --left;
      }
    }
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !failed) {
      failed = true;
      for (const Child& c : children)
        if (!c.done) ::kill(c.pid, SIGKILL);
    }
  }
  std::vector<json> reports;
  for (int r = 0; r < world; ++r) {
    json j;
    std::string why = "not started";
    if (r < static_cast<int>(children.size())) {
      const Child& c = children[r];
      j = json::parse(readAll(c.fd), nullptr, false);
      ::close(c.fd);
      why = WIFSIGNALED(c.status) ? "ended by signal " + std::to_string(WTERMSIG(c.status)) +
                                        (failed ? " (another rank failed first?)" : "")
                                  : "exit status " + std::to_string(WEXITSTATUS(c.status));
    }
    if (!j.is_object()) j = json{{"rank", r}, {"error", "no report: " + why}};
    reports.push_back(std::move(j));
  }
  return reports;
}

// Every rank's report for one degree; rank 0's figures are the table's.
struct Run {
  int64_t tp = 0;
  std::vector<json> ranks;
  const json& lead() const { return ranks.front(); }
  bool ok() const {
    return !ranks.empty() && std::none_of(ranks.begin(), ranks.end(),
                                          [](const json& r) { return r.contains("error"); });
  }
};

enum class Better { kNone, kLower, kHigher };

// A figure of a run; absent where the run failed or has no such figure.
using Getter = std::function<std::optional<double>(const Run&)>;

// Rank 0's figure at a JSON pointer, e.g. "/decode_b1_ms".
Getter field(const std::string& pointer) {
  return [pointer](const Run& run) -> std::optional<double> {
    if (!run.ok()) return std::nullopt;
    const json::json_pointer p(pointer);
    if (!run.lead().contains(p) || !run.lead()[p].is_number()) return std::nullopt;
    return run.lead()[p].get<double>();
  };
}

// A figure of the trace of `batch` on `rank`; a collective's figure is absent when that step
// made no all-reduce (TP=1).
Getter traced(int64_t batch, const std::string& key, int rank = 0, double scale = 1,
              bool collective = true) {
  return [=](const Run& run) -> std::optional<double> {
    if (!run.ok() || rank >= static_cast<int>(run.ranks.size())) return std::nullopt;
    for (const json& t : run.ranks[rank].value("traces", json::array())) {
      if (t.value("batch", int64_t{0}) != batch) continue;
      if (collective && t.value("all_reduces", int64_t{0}) == 0) return std::nullopt;
      return t.value(key, 0.0) * scale;
    }
    return std::nullopt;
  };
}

std::optional<double> speedup(std::optional<double> first, std::optional<double> it, Better b) {
  if (b == Better::kNone || !first || !it || *first <= 0 || *it <= 0) return std::nullopt;
  return b == Better::kLower ? *first / *it : *it / *first;
}

class Table {
 public:
  explicit Table(const std::vector<Run>& runs) : runs_(runs) {
    std::printf("\n%-46s", "figure (rank 0)");
    for (const Run& r : runs_) std::printf(" %10s", ("TP=" + std::to_string(r.tp)).c_str());
    for (size_t i = 1; i < runs_.size(); ++i) {
      const std::string h = std::to_string(runs_[i].tp) + " vs " + std::to_string(runs_[0].tp);
      std::printf(" %10s", h.c_str());
    }
    std::printf(" %8s\n", runs_.size() > 1 ? "goal" : "");
  }

  void row(const std::string& label, const Getter& get, const char* format, Better better,
           const std::string& goal = "") {
    std::printf("%-46s", label.c_str());
    for (const Run& r : runs_) std::printf(" %10s", cell(get(r), format).c_str());
    for (size_t i = 1; i < runs_.size(); ++i)
      std::printf(" %10s", cell(speedup(get(runs_[0]), get(runs_[i]), better), "%.2fx").c_str());
    std::printf(" %8s\n", runs_.size() > 1 ? goal.c_str() : "");
  }

 private:
  static std::string cell(std::optional<double> v, const char* format) {
    if (!v) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, format, *v);
    return buf;
  }
  const std::vector<Run>& runs_;
};

void printTable(const std::vector<Run>& runs, const Options& o) {
  Table t(runs);
  const Getter b1 = field("/decode_b1_ms");
  t.row("batch-1 decode, context " + std::to_string(o.context) + " (ms/token)", b1, "%.3f",
        Better::kLower, ">= 1.8x");
  t.row(
      "  tokens/s",
      [&](const Run& r) -> std::optional<double> {
        const auto ms = b1(r);
        return ms ? std::optional<double>(1e3 / *ms) : std::nullopt;
      },
      "%.1f", Better::kHigher);
  t.row(
      "  of the per-GPU weight-streaming roofline",
      [&](const Run& r) -> std::optional<double> {
        const auto ms = b1(r), bytes = field("/streamed_bytes")(r), copy = field("/copy_GBps")(r);
        if (!ms || !bytes || !copy || *copy <= 0) return std::nullopt;
        return 100.0 * (*bytes / (*copy * 1e9) * 1e3) / *ms;
      },
      "%.0f%%", Better::kNone);
  for (size_t i = 0; i < o.batches.size(); ++i) {
    const std::string at = "/batches/" + std::to_string(i);
    t.row("decode over " + std::to_string(o.batches[i]) + " sequences (tokens/s)",
          field(at + "/tokens_per_s"), "%.0f", Better::kHigher,
          o.batches[i] == 64 ? ">= 1.7x" : "");
    t.row("  ms per step", field(at + "/step_ms"), "%.3f", Better::kLower);
  }
  std::vector<int64_t> tracedBatches{1};
  if (!o.batches.empty()) tracedBatches.push_back(o.batches.front());
  int64_t maxTp = 1;
  for (const Run& r : runs) maxTp = std::max(maxTp, r.tp);
  for (int64_t b : tracedBatches) {
    const std::string n = std::to_string(b);
    t.row("all-reduce per layer, batch " + n + " (us)", traced(b, "all_reduce_per_layer_us"),
          "%.1f", Better::kNone);
    t.row("  all-reduces per step (2 per layer + 1)", traced(b, "all_reduces"), "%.0f",
          Better::kNone);
    t.row("  median per all-reduce (us)", traced(b, "all_reduce_median_us"), "%.1f", Better::kNone);
    t.row("  share of the step's kernel span", traced(b, "all_reduce_share", 0, 100), "%.0f%%",
          Better::kNone);
    t.row("  all-gather (logits) per step (us)", traced(b, "all_gather_us"), "%.1f", Better::kNone);
    t.row("  other NCCL kernels per step (us)", traced(b, "other_nccl_us"), "%.1f", Better::kNone);
    t.row("  traced step's kernel span (us)", traced(b, "span_us", 0, 1, false), "%.0f",
          Better::kLower);
    for (int r = 1; r < maxTp; ++r)
      t.row("  rank " + std::to_string(r) + ": all-reduce per layer (us)",
            traced(b, "all_reduce_per_layer_us", r), "%.1f", Better::kNone);
  }
}

void printJson(const std::vector<Run>& runs, const Options& o, const ModelConfig& c) {
  json out{{"bench", "tp"},
           {"model", o.modelDir},
           {"config", configJson(c)},
           {"dtype", "bfloat16"},
           {"context", o.context},
           {"steps", o.steps},
           {"goals", {{"decode_b1_speedup", 1.8}, {"tokens_per_s_64_speedup", 1.7}}}};
  json jr = json::array(), speedups = json::array();
  for (const Run& r : runs) jr.push_back({{"tp", r.tp}, {"ok", r.ok()}, {"ranks", r.ranks}});
  for (size_t i = 1; i < runs.size(); ++i) {
    json s{{"tp", runs[i].tp}, {"vs_tp", runs[0].tp}};
    if (auto x = speedup(field("/decode_b1_ms")(runs[0]), field("/decode_b1_ms")(runs[i]),
                         Better::kLower))
      s["decode_b1"] = *x;
    for (size_t b = 0; b < o.batches.size(); ++b) {
      const Getter g = field("/batches/" + std::to_string(b) + "/tokens_per_s");
      if (auto x = speedup(g(runs[0]), g(runs[i]), Better::kHigher))
        s["tokens_per_s_" + std::to_string(o.batches[b])] = *x;
    }
    speedups.push_back(s);
  }
  out["runs"] = jr;
  out["speedups"] = speedups;
  std::printf("\n%s\n", out.dump().c_str());
}

int usage() {
  std::fprintf(
      stderr,
      "usage: bench_tp --model DIR [--tp 1,2] [--steps N] [--context N] [--batches 64,256] "
      "[--cuda-graphs 1,2,4,...|0] [--no-pdl] [--trace-dir DIR]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool hasValue = i + 1 < argc;
    if (a == "--model" && hasValue) {
      o.modelDir = argv[++i];
    } else if (a == "--tp" && hasValue) {
      o.tp = parseList(argv[++i]);
      if (o.tp.empty()) return usage();
    } else if (a == "--steps" && hasValue) {
      o.steps = std::max(1L, std::atol(argv[++i]));
    } else if (a == "--context" && hasValue) {
      o.context = std::max(1L, std::atol(argv[++i]));
    } else if (a == "--batches" && hasValue) {
      o.batches = parseList(argv[++i]);
      if (o.batches.empty()) return usage();
    } else if (a == "--cuda-graphs" && hasValue) {
      const std::string v = argv[++i];
      o.graphs = v == "0" ? std::vector<int64_t>{} : parseList(v);
      if (v != "0" && o.graphs.empty()) return usage();
    } else if (a == "--no-pdl") {
      o.pdl = false;
    } else if (a == "--trace-dir" && hasValue) {
      o.traceDir = argv[++i];
    } else {
      return usage();
    }
  }
  if (o.modelDir.empty()) return usage();
  // No CUDA call in this process: the ranks are forked from it.
  auto config = loadArchitectureConfig(o.modelDir);
  if (!config.ok()) {
    std::fprintf(stderr, "bench_tp: %s\n", config.status().toString().c_str());
    return 1;
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast; the ranks inherit it
  const ModelConfig& c = *config;
  std::printf(
      "bench_tp: %s (hidden %ld, %ld layers, %ld heads, %ld KV heads, intermediate %ld, "
      "vocab %ld), bfloat16, random weights\n",
      o.modelDir.c_str(), static_cast<long>(c.hiddenSize), static_cast<long>(c.numLayers),
      static_cast<long>(c.numHeads), static_cast<long>(c.numKvHeads),
      static_cast<long>(c.intermediateSize), static_cast<long>(c.vocabSize));
  std::printf(
      "context %ld, %ld timed decode steps per figure (median), CUDA graphs up to %ld, "
      "programmatic dependent launch %s\n",
      static_cast<long>(o.context), static_cast<long>(o.steps),
      static_cast<long>(o.graphs.empty() ? 0 : *std::max_element(o.graphs.begin(), o.graphs.end())),
      o.pdl ? "where supported" : "off");
  std::vector<Run> runs;
  for (int64_t tp : o.tp) {
    Run run{tp, runGroup(o, static_cast<int>(tp))};
    for (const json& r : run.ranks) {
      if (r.contains("error"))
        std::printf("TP=%ld rank %d: %s\n", static_cast<long>(tp), r.value("rank", -1),
                    r["error"].get<std::string>().c_str());
    }
    runs.push_back(std::move(run));
  }
  printTable(runs, o);
  printJson(runs, o, c);
  return 0;
}
