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
};

struct ShardPlan {
  int numShard = 1;
  std::vector<std::string> gpus;  // rank r runs on gpus[r]; empty: the ranks run on the CPU
  std::string masterAddr, masterPort;
  bool setNvls = true;
  int threadsPerRank = 0;                    // --threads for each rank; 0: the shard's default
  std::optional<std::string> kvCacheMemory;  // --kv-cache-memory for each rank

  // Rank `rank`'s environment on top of the launcher's: RANK, WORLD_SIZE, MASTER_ADDR,
  // MASTER_PORT, its CUDA_VISIBLE_DEVICES on GPUs, and NCCL_NVLS_ENABLE=0 unless the user set it
  // (NVLink multicast is never used).
  std::map<std::string, std::string> rankEnv(int rank) const;
  // Flags for every rank's command line: --device cuda for GPU ranks of a group (no falling back
  // to the CPU alone), --threads and --kv-cache-memory.
  std::vector<std::string> rankArgs() const;
};

// TGI's rules: --num-shard N runs N ranks (1..kMaxShards); --sharded true alone runs one rank per
// visible GPU and needs at least two; --sharded true with --num-shard 1, and --sharded false with
// --num-shard > 1, contradict each other. Neither flag: one rank (TGI would take every visible
// GPU). On GPUs each rank needs its own. INVALID_ARGUMENT names the offending flag.
StatusOr<ShardPlan> planShards(const ShardPlanOptions& options);

}  // namespace textgen::launcher
