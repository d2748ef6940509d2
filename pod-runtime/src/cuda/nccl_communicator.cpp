// NCCL collectives for the CUDA backend, enqueued on the backend's stream (so a decode graph
// records them). Rank 0 makes the unique id and passes it through the rendezvous store. NVLink
// multicast (NVLS) is always off: it can take shared GPUs out of service (../shared notes). A
// watchdog thread polls NCCL's asynchronous error and reports it through onFatal.
// All-reduces of up to kOneShotBytes go through kernels' one-shot all-reduce over peer memory
// (CUDA IPC between processes, peer access between threads of one process) when every rank can
// map every other's buffer; the ranks agree on that at start-up (TEXTGEN_CUSTOM_ALL_REDUCE=0 turns
// it off). Within that path, 16-bit messages of up to kLamportSlotBytes take the Lamport protocol
// (all_reduce.h: one NVLink crossing, no flags), the rest the flags protocol;
// TEXTGEN_ALL_REDUCE_PROTOCOL=flags (read on rank 0, used by all) keeps every message on flags.
// NCCL takes everything else.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "textgen/base/log.h"
#include "textgen/kernels/all_reduce.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"

namespace textgen::runtime {

cudaStream_t cudaBackendStream(Backend& backend);

namespace {

constexpr size_t kOneShotBytes = 8u << 20;
// A Lamport slot: 64 rows of hidden 8192 in 16-bit types (the fused norm's batches up to its
// grid), after the slot's header.
constexpr size_t kLamportSlotBytes = (1u << 20) + kernels::kLamportHeaderBytes;
constexpr size_t kFlagsRegionBytes = kernels::AllReducePeerLayout::bytes(kOneShotBytes);
static_assert(kFlagsRegionBytes % 16 == 0, "the Lamport region must stay 16-byte aligned");

// What a rank tells its peers about its one-shot staging region.
struct PeerRecord {
  int32_t ok = 0;  // this rank allocated its region (and has the one-shot path on)
  int32_t device = 0;
  // Which process: a random number drawn once per process (pids repeat across containers), and
  // the boot of the machine (IPC handles mean nothing on another).
  uint64_t process = 0;
  char boot[40] = {};
  uint64_t pointer = 0;
  cudaIpcMemHandle_t handle{};
  int32_t blocks = 0;   // the one-shot grid this rank would use (rank 0's is used by all)
  int32_t lamport = 0;  // whether this rank would use the Lamport protocol (rank 0's decides)
};

// The one-shot kernels' grid: TEXTGEN_ALL_REDUCE_BLOCKS (1 to 128; a tuning knob read on rank 0,
// whose value every rank then uses), else the default.
int32_t oneShotBlocks() {
  const char* v = std::getenv("TEXTGEN_ALL_REDUCE_BLOCKS");
  if (v == nullptr || *v == '\0') return kernels::kAllReduceDefaultBlocks;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1 || n > kernels::kAllReduceMaxBlocks) {
    spdlog::warn("TEXTGEN_ALL_REDUCE_BLOCKS={} ignored (1 to {})", v, kernels::kAllReduceMaxBlocks);
    return kernels::kAllReduceDefaultBlocks;
  }
  return static_cast<int32_t>(n);
}

// TEXTGEN_ALL_REDUCE_PROTOCOL: lamport (the default) or flags; read on rank 0.
bool lamportWanted() {
  const char* v = std::getenv("TEXTGEN_ALL_REDUCE_PROTOCOL");
  if (v == nullptr || *v == '\0' || std::string(v) == "lamport") return true;
  if (std::string(v) == "flags") return false;
  spdlog::warn("TEXTGEN_ALL_REDUCE_PROTOCOL={} ignored (lamport or flags)", v);
  return true;
}

uint64_t processId() {
  static const uint64_t id = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }();
  return id;
}

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

Status ncclStatus(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return okStatus();
  return unavailableError("nccl: " + what + ": " + ncclGetErrorString(r));
}

StatusOr<ncclDataType_t> ncclType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32: return ncclFloat32;
    case kernels::DType::kF16: return ncclFloat16;
    case kernels::DType::kBF16: return ncclBfloat16;
  }
  return invalidArgumentError("nccl: unsupported dtype");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world, cudaStream_t stream, CommunicatorOptions options)
      : rank_(rank), world_(world), stream_(stream), options_(std::move(options)) {}

  ~NcclCommunicator() override {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    for (void* p : opened_) cudaIpcCloseMemHandle(p);
    if (region_) cudaFree(region_);
    if (counters_) cudaFree(counters_);
  }

  Status init(Rendezvous& rendezvous) {
    // Never NVLink multicast, whatever the environment says.
    if (const char* v = std::getenv("NCCL_NVLS_ENABLE"); v && std::string(v) != "0")
      spdlog::warn("NCCL_NVLS_ENABLE={} ignored: NVLink multicast stays off", v);
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclUniqueId id{};
    if (rank_ == 0) {
      TG_RETURN_IF_ERROR(ncclStatus(ncclGetUniqueId(&id), "unique id"));
      TG_RETURN_IF_ERROR(rendezvous.set(
          "nccl/id", std::string_view(reinterpret_cast<const char*>(&id), sizeof id)));
    } else {
      TG_ASSIGN_OR_RETURN(std::string v, rendezvous.get("nccl/id", std::chrono::minutes(10)));
      if (v.size() != sizeof id)
        return dataLossError("nccl: the unique id from rank 0 is malformed");
      std::memcpy(&id, v.data(), sizeof id);
    }
    TG_RETURN_IF_ERROR(ncclStatus(
        ncclCommInitRank(&comm_, world_, id, rank_),
        "joining " + std::to_string(world_) + " ranks as rank " + std::to_string(rank_)));
    watchdog_ = std::thread([this] { watch(); });
    // Every rank takes part in the agreement, also one with the path turned off.
    const char* custom = std::getenv("TEXTGEN_CUSTOM_ALL_REDUCE");
    TG_RETURN_IF_ERROR(setUpOneShot(rendezvous, world_ <= kernels::kAllReduceMaxRanks &&
                                                    !(custom && std::string(custom) == "0")));
    spdlog::info("rank {}: all-reduce through {}", rank_,
                 oneShot_ ? "the one-shot peer-memory kernel up to 8 MiB (" +
                                std::to_string(blocks_) + " blocks; " +
                                (lamport_ ? "Lamport protocol up to 1 MiB of 16-bit values, "
                                            "flags above"
                                          : "flags protocol") +
                                "), NCCL above"
                          : std::string("NCCL"));
    return okStatus();
  }

  // Every rank allocates its staging region and publishes it; each maps every peer's. The one-shot
  // path is on only if every rank mapped every peer (agreed through the store: a rank on its own
  // would wait forever for peers that use NCCL).
  Status setUpOneShot(Rendezvous& rendezvous, bool wanted) {
    PeerRecord mine;
    mine.process = processId();
    const std::string boot = bootId();
    std::memcpy(mine.boot, boot.data(), std::min(boot.size(), sizeof mine.boot - 1));
    cudaGetDevice(&mine.device);
    mine.blocks = oneShotBlocks();
    mine.lamport = lamportWanted() ? 1 : 0;
    // The flags protocol's region, then the Lamport one (filled with its empty pattern before any
    // peer learns where it is); the counters likewise.
    const size_t lamportBytes = kernels::LamportPeerLayout::bytes(kLamportSlotBytes, world_);
    const size_t bytes = kFlagsRegionBytes + lamportBytes;
    const size_t counterBytes =
        sizeof(uint32_t) * (kernels::kAllReduceMaxBlocks + kernels::kLamportCounterWords);
    if (wanted && cudaMalloc(&region_, bytes) == cudaSuccess &&
        cudaMalloc(&counters_, counterBytes) == cudaSuccess &&
        cudaMemset(region_, 0, bytes) == cudaSuccess &&
        cudaMemset(counters_, 0, counterBytes) == cudaSuccess &&
        kernels::invokeLamportReset(static_cast<char*>(region_) + kFlagsRegionBytes, lamportBytes,
                                    nullptr)
            .ok() &&
        cudaDeviceSynchronize() == cudaSuccess &&
        cudaIpcGetMemHandle(&mine.handle, region_) == cudaSuccess) {
      mine.ok = 1;
      mine.pointer = reinterpret_cast<uint64_t>(region_);
    }
    cudaGetLastError();
    TG_RETURN_IF_ERROR(
        rendezvous.set("oneshot/" + std::to_string(rank_),
                       std::string_view(reinterpret_cast<const char*>(&mine), sizeof mine)));
    bool mapped = mine.ok != 0;
    std::string why = !wanted ? "off on this rank" : mapped ? "" : "no staging memory";
    for (int r = 0; r < world_; ++r) {
      TG_ASSIGN_OR_RETURN(std::string v,
                          rendezvous.get("oneshot/" + std::to_string(r), std::chrono::minutes(10)));
      PeerRecord peer;
      if (v.size() != sizeof peer) return dataLossError("one-shot all-reduce: malformed record");
      std::memcpy(&peer, v.data(), sizeof peer);
      if (r == 0)
        blocks_ = peer.blocks >= 1 && peer.blocks <= kernels::kAllReduceMaxBlocks
                      ? peer.blocks
                      : kernels::kAllReduceDefaultBlocks;
      if (r == 0) lamport_ = peer.lamport != 0;
      if (r == rank_) {
        peers_[r] = region_;
        continue;
      }
      if (!mapped || !peer.ok) {
        mapped = false;
        continue;
      }
      if (std::memcmp(peer.boot, mine.boot, sizeof mine.boot) != 0) {
        mapped = false;
        why = "rank " + std::to_string(r) + " is on another machine";
        continue;
      }
      if (peer.process == mine.process) {  // ranks as threads of one process: peer access
        int can = 0;
        cudaDeviceCanAccessPeer(&can, mine.device, peer.device);
        const cudaError_t e =
            can ? cudaDeviceEnablePeerAccess(peer.device, 0) : cudaErrorNotSupported;
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
          mapped = false;
          why = "no peer access to device " + std::to_string(peer.device);
        }
        peers_[r] = reinterpret_cast<void*>(peer.pointer);
      } else {
        void* p = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&p, peer.handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
          mapped = false;
          why = std::string("cannot map rank ") + std::to_string(r) + "'s memory (" +
                cudaGetErrorString(e) + ")";
        } else {
          opened_.push_back(p);
          peers_[r] = p;
        }
      }
      cudaGetLastError();
    }
    TG_RETURN_IF_ERROR(rendezvous.set("oneshot/ok/" + std::to_string(rank_), mapped ? "1" : "0"));
    bool all = true;
    for (int r = 0; r < world_; ++r) {
      TG_ASSIGN_OR_RETURN(std::string v, rendezvous.get("oneshot/ok/" + std::to_string(r),
                                                        std::chrono::minutes(10)));
      all &= v == "1";
    }
    if (!mapped && wanted) spdlog::warn("rank {}: one-shot all-reduce unavailable: {}", rank_, why);
    oneShot_ = all;
    return okStatus();
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return world_; }
  const char* name() const override { return "nccl"; }

  Status allReduceSum(void* data, int64_t count, kernels::DType dtype) override {
    TG_ASSIGN_OR_RETURN(ncclDataType_t t, ncclType(dtype));
    if (count == 0) return okStatus();
    if (oneShot_ && lamport_ && kernels::lamportAllReduceTakes(count, dtype, kLamportSlotBytes))
      return kernels::invokeOneShotAllReduce(lamportParams(data, count, dtype), stream_);
    if (oneShot_) {
      const kernels::OneShotAllReduceParams p = oneShotParams(data, count, dtype);
      // The path depends on the size alone, the same on every rank; an unaligned buffer there is
      // an error (routing it to NCCL on one rank only would leave the others waiting).
      const size_t bytes = static_cast<size_t>(count) * kernels::dtypeSize(dtype);
      if (bytes <= kOneShotBytes && bytes % 16 == 0)
        return kernels::invokeOneShotAllReduce(p, stream_);
    }
    return ncclStatus(
        ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclSum, comm_, stream_),
        "all-reduce");
  }

  Status allReduceRmsNorm(Backend& backend, const kernels::RmsNormParams& n) override {
    TG_RETURN_IF_ERROR(kernels::validateRmsNorm(n));
    if (!oneShot_ || n.numTokens == 0 ||
        !kernels::oneShotAllReduceRmsNormFits(n.numTokens, n.hiddenSize, n.dtype, kOneShotBytes,
                                              blocks_))
      return Communicator::allReduceRmsNorm(backend, n);
    const int64_t count = n.numTokens * n.hiddenSize;
    void* data = const_cast<void*>(n.input);
    // The same shapes on every rank, so the same protocol (a row fits its slot if it fits at all).
    const bool lamport = lamport_ &&
                         kernels::lamportAllReduceTakes(count, n.dtype, kLamportSlotBytes) &&
                         kernels::oneShotAllReduceRmsNormFits(n.numTokens, n.hiddenSize, n.dtype,
                                                              kLamportSlotBytes, blocks_);
    kernels::OneShotAllReduceRmsNormParams q;
    q.allReduce =
        lamport ? lamportParams(data, count, n.dtype) : oneShotParams(data, count, n.dtype);
    q.residual = n.residual;
    q.residualOut = n.residualOut;
    q.output = n.output;
    q.weight = n.weight;
    q.rows = n.numTokens;
    q.hidden = n.hiddenSize;
    q.eps = n.eps;
    q.prefetch = n.prefetch;
    q.prefetchBytes = n.prefetch ? n.prefetchBytes : 0;
    return kernels::invokeOneShotAllReduceRmsNorm(q, stream_);
  }

  Status allGather(const void* in, void* out, int64_t count, kernels::DType dtype) override {
    TG_ASSIGN_OR_RETURN(ncclDataType_t t, ncclType(dtype));
    if (count == 0) return okStatus();
    return ncclStatus(ncclAllGather(in, out, static_cast<size_t>(count), t, comm_, stream_),
                      "all-gather");
  }

  Status broadcast(void* data, int64_t count, kernels::DType dtype, int root) override {
    TG_ASSIGN_OR_RETURN(ncclDataType_t t, ncclType(dtype));
    if (root < 0 || root >= world_) return invalidArgumentError("broadcast: root out of range");
    if (count == 0) return okStatus();
    return ncclStatus(
        ncclBroadcast(data, data, static_cast<size_t>(count), t, root, comm_, stream_),
        "broadcast");
  }

 private:
  kernels::OneShotAllReduceParams oneShotParams(void* data, int64_t count,
                                                kernels::DType dtype) const {
    kernels::OneShotAllReduceParams p;
    p.data = data;
    p.count = count;
    p.dtype = dtype;
    p.rank = rank_;
    p.worldSize = world_;
    for (int r = 0; r < world_; ++r) p.peers[r] = peers_[r];
    p.capacityBytes = kOneShotBytes;
    p.counters = counters_;
    p.blocks = blocks_;
    return p;
  }

  kernels::OneShotAllReduceParams lamportParams(void* data, int64_t count,
                                                kernels::DType dtype) const {
    kernels::OneShotAllReduceParams p = oneShotParams(data, count, dtype);
    for (int r = 0; r < world_; ++r) p.peers[r] = static_cast<char*>(peers_[r]) + kFlagsRegionBytes;
    p.capacityBytes = kLamportSlotBytes;
    p.counters = counters_ + kernels::kAllReduceMaxBlocks;
    p.protocol = kernels::AllReduceProtocol::kLamport;
    return p;
  }

  // NCCL reports a failed peer or transport asynchronously; the stream would otherwise wait.
  void watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async == ncclSuccess) continue;
      const std::string why = std::string("nccl: asynchronous error on rank ") +
                              std::to_string(rank_) + ": " + ncclGetErrorString(async);
      aborted_ = true;
      ncclCommAbort(comm_);  // the communicator is unusable from here: the process must end
      if (options_.onFatal) {
        options_.onFatal(why);
      } else {
        spdlog::critical("{}", why);
      }
      return;
    }
  }

  int rank_, world_;
  cudaStream_t stream_;
  CommunicatorOptions options_;
  ncclComm_t comm_ = nullptr;
  // The one-shot all-reduce: this rank's region, every rank's as mapped here, IPC mappings.
  bool oneShot_ = false;
  void* region_ = nullptr;
  uint32_t* counters_ = nullptr;
  int blocks_ = kernels::kAllReduceDefaultBlocks;  // rank 0's choice, the same on every rank
  bool lamport_ = true;                            // likewise
  void* peers_[kernels::kAllReduceMaxRanks] = {};
  std::vector<void*> opened_;
  std::atomic<bool> stop_{false}, aborted_{false};
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> makeNcclCommunicator(Backend& backend,
                                                             Rendezvous& rendezvous,
                                                             const CommunicatorOptions& options) {
  auto c = std::make_unique<NcclCommunicator>(rendezvous.rank(), rendezvous.worldSize(),
                                              cudaBackendStream(backend), options);
  TG_RETURN_IF_ERROR(c->init(rendezvous));
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace textgen::runtime
