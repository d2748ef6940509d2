// How many tensor-parallel ranks the launcher starts, and what each rank gets, from TGI's
// `--sharded` / `--num-shard` and the GPUs the launcher can see. On GPUs each rank gets its own
// device through CUDA_VISIBLE_DEVICES; on CPUs the ranks share the machine (its cores and the KV
// cache budget are divided between them).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "textgen/base/status_or.h"

namespace textgen::launcher {

inline constexpr int kMaxShards = 64;

// The GPUs a child process would see, as CUDA_VISIBLE_DEVICES entries: `cudaVisibleDevices` (the
// launcher's CUDA_VISIBLE_DEVICES, when set) split at commas, up to the first empty or negative
// entry, where CUDA stops too ("" and "-1" hide every GPU); without it one index per GPU that the
// driver lists under `procGpus`. Empty on a machine with no GPU.
std::vector<std::string> visibleGpus(
    const std::optional<std::string>& cudaVisibleDevices,
    const std::filesystem::path& procGpus = "/proc/driver/nvidia/gpus");

struct ShardPlanOptions {
  std::optional<std::string> sharded;        // --sharded as given: "true" or "false"
  std::optional<std::string> numShard;       // --num-shard as given
  std::vector<std::string> gpus;             // visibleGpus()
  std::string masterAddr = "localhost";      // --master-addr
  std::string masterPort = "29500";          // --master-port
  bool nvlsSetByUser = false;                // NCCL_NVLS_ENABLE is in the launcher's environment
  int cpus = 1;                              // CPUs the launcher may run on (CPU ranks share them)
  std::optional<std::string> kvCacheMemory;  // --kv-cache-memory: bytes or a fraction
  // --shards-only: this machine runs ranks rankOffset..rankOffset+numShard-1 of a group of
  // worldSize (the rest elsewhere), each on gpusPerShard GPUs of its own (0: the CPU).
  bool shardsOnly = false;
  std::optional<std::string> worldSize;     // --world-size (default: --num-shard)
  std::optional<std::string> rankOffset;    // --rank-offset (default 0)
  std::optional<std::string> gpusPerShard;  // --gpus-per-shard (default 1 with GPUs, else 0)
};

struct ShardPlan {
  int numShard = 1;               // ranks this launcher starts
  int worldSize = 1;              // ranks of the group (numShard unless --shards-only)
  int rankOffset = 0;             // the first one's RANK
  int gpusPerRank = 1;            // local rank i runs on gpus[i*gpusPerRank, (i+1)*gpusPerRank)
  bool hideGpus = false;          // CPU ranks of --shards-only: CUDA_VISIBLE_DEVICES=""
  bool deviceCuda = false;        // --device cuda for every rank
  std::vector<std::string> gpus;  // the GPUs the ranks use; empty: the ranks run on the CPU
  std::string masterAddr, masterPort;
  bool setNvls = true;
  int threadsPerRank = 0;                    // --threads for each rank; 0: the shard's default
  std::optional<std::string> kvCacheMemory;  // --kv-cache-memory for each rank

  // Local rank `i`'s environment on top of the launcher's: RANK (rankOffset + i), WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT, its CUDA_VISIBLE_DEVICES on GPUs ("" with hideGpus), and
  // NCCL_NVLS_ENABLE=0 unless the user set it (NVLink multicast is never used).
  std::map<std::string, std::string> rankEnv(int i) const;
  // Flags for every rank's command line: --device cuda for GPU ranks of a group (no falling back
  // to the CPU alone), --threads and --kv-cache-memory.
  std::vector<std::string> rankArgs() const;
};

// TGI's rules: --num-shard N runs N ranks (1..kMaxShards); --sharded true alone runs one rank per
// visible GPU and needs at least two; --sharded true with --num-shard 1, and --sharded false with
// --num-shard > 1, contradict each other. Neither flag: one rank (TGI would take every visible
// GPU). On GPUs each rank needs its own. INVALID_ARGUMENT names the offending flag.
// With `shardsOnly`: --num-shard is required and --sharded refused; --world-size, --rank-offset
// and --gpus-per-shard are checked (the local ranks fit in the group, their GPUs are visible).
StatusOr<ShardPlan> planShards(const ShardPlanOptions& options);

}  // namespace textgen::launcher
