// NCCL collectives for the CUDA backend, enqueued on the backend's stream (so a decode graph
// records them). Rank 0 makes the unique id and passes it through the rendezvous store. NVLink
// multicast (NVLS) is always off: it can take shared GPUs out of service (../shared notes). A
// watchdog thread polls NCCL's asynchronous error and reports it through onFatal.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "textgen/base/log.h"
#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"

namespace textgen::runtime {

cudaStream_t cudaBackendStream(Backend& backend);

namespace {

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
    return okStatus();
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return world_; }
  const char* name() const override { return "nccl"; }

  Status allReduceSum(void* data, int64_t count, kernels::DType dtype) override {
    TG_ASSIGN_OR_RETURN(ncclDataType_t t, ncclType(dtype));
    if (count == 0) return okStatus();
    return ncclStatus(
        ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclSum, comm_, stream_),
        "all-reduce");
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
