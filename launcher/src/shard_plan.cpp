#include "textgen/launcher/shard_plan.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace textgen::launcher {
namespace {

// The shard's KV budget on the CPU when --kv-cache-memory is not given (docs/shard.md).
constexpr double kShardCpuKvFraction = 0.25;

// A whole decimal number with nothing around it (no sign, no spaces); nullopt otherwise or when it
// does not fit.
std::optional<int64_t> parseWhole(const std::string& s) {
  int64_t n = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, n);
  if (s.empty() || s[0] == '-' || ec != std::errc() || p != end) return std::nullopt;
  return n;
}

StatusOr<int> parseNumShard(const std::string& v) {
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits)
    return invalidArgumentError("--num-shard must be a positive integer, not '" + v + "'");
  const std::optional<int64_t> n = parseWhole(v);
  if (!n || *n > kMaxShards) {
    return invalidArgumentError("--num-shard " + v + ": at most " + std::to_string(kMaxShards) +
                                " ranks");
  }
  if (*n < 1) return invalidArgumentError("--num-shard must be at least 1");
  return static_cast<int>(*n);
}

StatusOr<bool> parseSharded(const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  return invalidArgumentError("--sharded must be true or false, not '" + v + "'");
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += (s.empty() ? "" : ",") + e;
  return s;
}

// A whole number for `flag` within [low, high].
StatusOr<int> parseBounded(const std::string& flag, const std::string& v, int64_t low,
                           int64_t high) {
  const std::optional<int64_t> n = parseWhole(v);
  if (!n || *n < low || *n > high) {
    return invalidArgumentError(flag + " must be a whole number from " + std::to_string(low) +
                                " to " + std::to_string(high) + ", not '" + v + "'");
  }
  return static_cast<int>(*n);
}

// --shards-only: this machine's part of a group (--world-size, --rank-offset, --gpus-per-shard).
Status planPart(const ShardPlanOptions& o, ShardPlan& plan) {
  if (o.sharded) {
    return invalidArgumentError(
        "--sharded does not go with --shards-only: give --num-shard K, this machine's ranks");
  }
  if (!o.numShard)
    return invalidArgumentError("--shards-only needs --num-shard K (this machine's ranks)");
  TG_ASSIGN_OR_RETURN(plan.numShard, parseNumShard(*o.numShard));
  plan.worldSize = plan.numShard;
  if (o.worldSize) {
    TG_ASSIGN_OR_RETURN(plan.worldSize, parseBounded("--world-size", *o.worldSize, 1, kMaxShards));
  }
  if (o.rankOffset) {
    TG_ASSIGN_OR_RETURN(plan.rankOffset,
                        parseBounded("--rank-offset", *o.rankOffset, 0, kMaxShards - 1));
  }
  if (plan.rankOffset + plan.numShard > plan.worldSize) {
    return invalidArgumentError("ranks " + std::to_string(plan.rankOffset) + ".." +
                                std::to_string(plan.rankOffset + plan.numShard - 1) +
                                " (--rank-offset, --num-shard) are not all below --world-size " +
                                std::to_string(plan.worldSize));
  }
  plan.gpusPerRank = o.gpus.empty() ? 0 : 1;
  if (o.gpusPerShard) {
    TG_ASSIGN_OR_RETURN(plan.gpusPerRank,
                        parseBounded("--gpus-per-shard", *o.gpusPerShard, 0, kMaxShards));
  }
  const size_t needed = static_cast<size_t>(plan.numShard) * plan.gpusPerRank;
  if (needed > o.gpus.size()) {
    return invalidArgumentError("--num-shard " + std::to_string(plan.numShard) +
                                " with --gpus-per-shard " + std::to_string(plan.gpusPerRank) +
                                " needs " + std::to_string(needed) + " GPUs, and " +
                                std::to_string(o.gpus.size()) + " are visible" +
                                (o.gpus.empty() ? std::string() : " (" + joined(o.gpus) + ")"));
  }
  plan.gpus.assign(o.gpus.begin(), o.gpus.begin() + static_cast<std::ptrdiff_t>(needed));
  plan.hideGpus = plan.gpusPerRank == 0;
  plan.deviceCuda = plan.gpusPerRank > 0;  // a rank given GPUs runs on them or fails
  return okStatus();
}

StatusOr<int> numShards(const ShardPlanOptions& o) {
  std::optional<bool> sharded;
  if (o.sharded) {
    TG_ASSIGN_OR_RETURN(sharded, parseSharded(*o.sharded));
  }
  std::optional<int> numShard;
  if (o.numShard) {
    TG_ASSIGN_OR_RETURN(numShard, parseNumShard(*o.numShard));
  }
  if (sharded == true && !numShard) {
    if (o.gpus.empty()) {
      return invalidArgumentError(
          "--sharded true without --num-shard runs one rank per GPU, and no GPU is visible "
          "(CUDA_VISIBLE_DEVICES, /proc/driver/nvidia/gpus); give --num-shard N to run N ranks "
          "on the CPU");
    }
    if (o.gpus.size() == 1) {
      return invalidArgumentError(
          "--sharded true without --num-shard runs one rank per GPU, and only one GPU is "
          "visible (" +
          o.gpus.front() + ")");
    }
    return static_cast<int>(o.gpus.size());
  }
  if (sharded == true && numShard == 1)
    return invalidArgumentError("--sharded true contradicts --num-shard 1");
  if (sharded == false && numShard > 1) {
    return invalidArgumentError("--sharded false contradicts --num-shard " +
                                std::to_string(*numShard));
  }
  return numShard.value_or(1);
}

// Each CPU rank's share of the --kv-cache-memory budget (the shard's default when none is given).
StatusOr<std::string> kvShare(const std::optional<std::string>& budget, int numShard) {
  const std::string v = budget.value_or(std::to_string(kShardCpuKvFraction));
  if (v.find('.') == std::string::npos) {
    const std::optional<int64_t> bytes = parseWhole(v);
    if (!bytes) {
      return invalidArgumentError("--kv-cache-memory must be a byte count or a fraction, not '" +
                                  v + "'");
    }
    return std::to_string(*bytes / numShard);
  }
  char* end = nullptr;
  const double fraction = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || !(fraction > 0 && fraction < 1))
    return invalidArgumentError("--kv-cache-memory fraction must be in (0, 1), not '" + v + "'");
  char share[32];
  std::snprintf(share, sizeof share, "%.9f", fraction / numShard);
  return std::string(share);
}

}  // namespace

std::vector<std::string> visibleGpus(const std::optional<std::string>& cudaVisibleDevices,
                                     const std::filesystem::path& procGpus) {
  std::vector<std::string> gpus;
  if (cudaVisibleDevices) {
    size_t start = 0;
    while (start <= cudaVisibleDevices->size()) {
      size_t end = cudaVisibleDevices->find(',', start);
      if (end == std::string::npos) end = cudaVisibleDevices->size();
      std::string entry = cudaVisibleDevices->substr(start, end - start);
      entry.erase(0, entry.find_first_not_of(" \t"));
      entry.erase(entry.find_last_not_of(" \t") + 1);
      if (entry.empty() || entry[0] == '-') break;
      gpus.push_back(entry);
      start = end + 1;
    }
    return gpus;
  }
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator(procGpus, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    gpus.push_back(std::to_string(n++));
  }
  return gpus;
}

StatusOr<ShardPlan> planShards(const ShardPlanOptions& o) {
  ShardPlan plan;
  if (o.shardsOnly) {
    TG_RETURN_IF_ERROR(planPart(o, plan));
  } else {
    TG_ASSIGN_OR_RETURN(plan.numShard, numShards(o));
    if (!o.gpus.empty() && plan.numShard > static_cast<int>(o.gpus.size())) {
      return invalidArgumentError("--num-shard " + std::to_string(plan.numShard) +
                                  " needs one GPU per rank, and " + std::to_string(o.gpus.size()) +
                                  " are visible (" + joined(o.gpus) + ")");
    }
    plan.worldSize = plan.numShard;
    if (!o.gpus.empty()) plan.gpus.assign(o.gpus.begin(), o.gpus.begin() + plan.numShard);
    // A GPU rank of a group that fell back to the CPU would leave its peers waiting in NCCL.
    plan.deviceCuda = !plan.gpus.empty() && plan.numShard > 1;
  }
  if (o.masterAddr.empty()) return invalidArgumentError("--master-addr must not be empty");
  const std::optional<int64_t> port = parseWhole(o.masterPort);
  if (!port || *port < 1 || *port > 65535)
    return invalidArgumentError("--master-port must be a port number, not '" + o.masterPort + "'");
  plan.masterAddr = o.masterAddr;
  plan.masterPort = std::to_string(*port);
  plan.setNvls = !o.nvlsSetByUser;
  plan.kvCacheMemory = o.kvCacheMemory;
  if (plan.gpus.empty() && plan.numShard > 1) {
    plan.threadsPerRank = std::max(1, o.cpus / plan.numShard);
    TG_ASSIGN_OR_RETURN(plan.kvCacheMemory, kvShare(o.kvCacheMemory, plan.numShard));
  }
  return plan;
}

std::map<std::string, std::string> ShardPlan::rankEnv(int i) const {
  std::map<std::string, std::string> env{{"RANK", std::to_string(rankOffset + i)},
                                         {"WORLD_SIZE", std::to_string(worldSize)},
                                         {"MASTER_ADDR", masterAddr},
                                         {"MASTER_PORT", masterPort}};
  if (!gpus.empty()) {
    const auto first = gpus.begin() + static_cast<std::ptrdiff_t>(i) * gpusPerRank;
    env["CUDA_VISIBLE_DEVICES"] = joined(std::vector<std::string>(first, first + gpusPerRank));
  } else if (hideGpus) {
    env["CUDA_VISIBLE_DEVICES"] = "";
  }
  if (setNvls) env["NCCL_NVLS_ENABLE"] = "0";
  return env;
}

std::vector<std::string> ShardPlan::rankArgs() const {
  std::vector<std::string> args;
  if (deviceCuda) {
    args.push_back("--device");
    args.push_back("cuda");
  }
  if (threadsPerRank > 0) {
    args.push_back("--threads");
    args.push_back(std::to_string(threadsPerRank));
  }
  if (kvCacheMemory) {
    args.push_back("--kv-cache-memory");
    args.push_back(*kvCacheMemory);
  }
  return args;
}

}  // namespace textgen::launcher
