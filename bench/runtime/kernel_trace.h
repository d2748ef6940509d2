// Kernel timeline from CUPTI's activity records (start and end of every kernel, graph launches
// included): what a profiler would show, on machines where nsys is absent and ncu cannot read
// counters (activity records need no counter access). Bench-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace textgen::bench {

struct KernelSpan {
  std::string name;             // demangled, without template arguments and parameters
  uint64_t start = 0, end = 0;  // ns, device timestamps
};

class KernelTrace {
 public:
  // Starts recording kernel activity; false (with a message on stderr) when CUPTI refuses.
  bool start();
  // Waits for the device, stops recording and returns the kernels in start order.
  std::vector<KernelSpan> stop();
};

// Prints per-kernel totals over `steps` repetitions of the traced work (count and µs per step),
// the span from the first start to the last end, the time some kernel ran (overlaps merged), and
// the idle gaps between them.
void printKernelTable(const std::vector<KernelSpan>& spans, int steps);

}  // namespace textgen::bench
