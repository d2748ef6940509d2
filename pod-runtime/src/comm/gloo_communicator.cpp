// Gloo collectives for the CPU backend: a full mesh of TCP connections set up through the
// rendezvous store, ring algorithms (every rank ends with the same bits), a timeout on each call.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "textgen/runtime/backend.h"
#include "textgen/runtime/communicator.h"

namespace textgen::runtime {

namespace {

// Gloo's store interface over the rendezvous (Gloo reports failures by throwing).
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(Rendezvous& r, std::chrono::milliseconds timeout) : r_(r), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    const Status s = r_.set(key, std::string_view(data.data(), data.size()));
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = r_.get(key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().message());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    for (const std::string& k : keys) {
      auto v = r_.get(k, t);
      if (!v.ok()) throw std::runtime_error(v.status().message());
    }
  }

 private:
  Rendezvous& r_;
  std::chrono::milliseconds timeout_;
};

bool isLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Status f32Only(kernels::DType dtype, const char* op) {
  if (dtype == kernels::DType::kF32) return okStatus();
  return unimplementedError(std::string("gloo: ") + op + " on the CPU backend is float32 only");
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int world, CommunicatorOptions options)
      : rank_(rank),
        world_(world),
        timeout_(options.timeout),
        onFatal_(std::move(options.onFatal)) {}

  Status init(Rendezvous& rendezvous, const std::string& masterAddr) {
    gloo::transport::tcp::attr attr;
    // The address the other ranks dial: the interface named by GLOO_SOCKET_IFNAME (as PyTorch
    // reads it), loopback when the whole group is on this machine, else this host's name.
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) {
      attr.iface = iface;
    } else if (isLoopback(masterAddr)) {
      attr.hostname = "127.0.0.1";
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      attr.hostname = host;
    }
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
      context->setTimeout(timeout_);
      StoreAdapter store(rendezvous, std::chrono::minutes(10));
      gloo::rendezvous::PrefixStore prefixed("gloo", store);
      context->connectFullMesh(prefixed, device);
      context_ = std::move(context);
    } catch (const std::exception& e) {
      return unavailableError(std::string("gloo: connecting the ranks failed: ") + e.what());
    }
    return okStatus();
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return world_; }
  const char* name() const override { return "gloo"; }

  Status allReduceSum(void* data, int64_t count, kernels::DType dtype) override {
    TG_RETURN_IF_ERROR(f32Only(dtype, "all-reduce"));
    if (count == 0) return okStatus();
    return guarded("all-reduce", [&] {
      gloo::AllreduceOptions o(context_);
      o.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTimeout(timeout_);
      gloo::allreduce(o);
    });
  }

  Status allGather(const void* in, void* out, int64_t count, kernels::DType dtype) override {
    TG_RETURN_IF_ERROR(f32Only(dtype, "all-gather"));
    if (count == 0) return okStatus();
    return guarded("all-gather", [&] {
      gloo::AllgatherOptions o(context_);
      o.setInput(const_cast<float*>(static_cast<const float*>(in)), static_cast<size_t>(count));
      o.setOutput(static_cast<float*>(out), static_cast<size_t>(count * world_));
      o.setTimeout(timeout_);
      gloo::allgather(o);
    });
  }

  Status broadcast(void* data, int64_t count, kernels::DType dtype, int root) override {
    TG_RETURN_IF_ERROR(f32Only(dtype, "broadcast"));
    if (root < 0 || root >= world_) return invalidArgumentError("broadcast: root out of range");
    if (count == 0) return okStatus();
    return guarded("broadcast", [&] {
      gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
      o.setRoot(root);
      o.setTimeout(timeout_);
      gloo::broadcast(o);
    });
  }

 private:
  // A failed collective (a peer gone, or silent past the timeout) leaves the group unusable:
  // every later call fails at once with the first error.
  template <typename F>
  Status guarded(const char* what, F&& f) {
    if (!broken_.empty()) return unavailableError(broken_);
    try {
      f();
      return okStatus();
    } catch (const std::exception& e) {
      broken_ = std::string("gloo: ") + what + " failed on rank " + std::to_string(rank_) +
                " (a peer rank died or stopped answering within " +
                std::to_string(timeout_.count()) + " ms): " + e.what();
      if (onFatal_) onFatal_(broken_);
      return unavailableError(broken_);
    }
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::function<void(const std::string&)> onFatal_;
  std::shared_ptr<gloo::Context> context_;
  std::string broken_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> makeGlooCommunicator(Rendezvous& rendezvous,
                                                             const std::string& masterAddr,
                                                             const CommunicatorOptions& options) {
  auto c = std::make_unique<GlooCommunicator>(rendezvous.rank(), rendezvous.worldSize(), options);
  TG_RETURN_IF_ERROR(c->init(rendezvous, masterAddr));
  return std::unique_ptr<Communicator>(std::move(c));
}

StatusOr<int64_t> allReduceMin(Backend& backend, Communicator& comm, int64_t value) {
  // Gathered as raw float32 words (a gather moves bits, it does no arithmetic).
  const int world = comm.worldSize();
  TG_ASSIGN_OR_RETURN(auto in, backend.allocate(sizeof value));
  TG_ASSIGN_OR_RETURN(auto out, backend.allocate(sizeof value * world));
  TG_RETURN_IF_ERROR(backend.upload(*in, &value, sizeof value));
  TG_RETURN_IF_ERROR(comm.allGather(in->data(), out->data(), 2, kernels::DType::kF32));
  std::vector<int64_t> all(world);
  TG_RETURN_IF_ERROR(backend.download(all.data(), *out, sizeof value * world));
  return *std::min_element(all.begin(), all.end());
}

}  // namespace textgen::runtime
