#include "kernel_trace.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace textgen::bench {
namespace {

constexpr size_t kBufferBytes = 8u << 20;

std::mutex gMutex;
std::vector<KernelSpan> gSpans;

// "void textgen::kernels::(anonymous namespace)::gemvKernel<__nv_bfloat16, 1>(...)" -> "gemvKernel"
std::string shortName(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* full = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && full ? full : mangled;
  std::free(full);
  // Cut the parameter list and template arguments, then every qualifier and the return type.
  int depth = 0;
  std::string flat;
  for (char ch : s) {
    if (ch == '<' || ch == '(') ++depth;
    if (depth == 0) flat += ch;
    if (ch == '>' || ch == ')') --depth;
  }
  if (const size_t colon = flat.rfind("::"); colon != std::string::npos)
    flat = flat.substr(colon + 2);
  if (const size_t space = flat.rfind(' '); space != std::string::npos)
    flat = flat.substr(space + 1);
  return flat;
}

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *maxRecords = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(gMutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    gSpans.push_back({shortName(k->name), k->start, k->end});
  }
  std::free(buffer);
}

}  // namespace

bool KernelTrace::start() {
  {
    std::lock_guard<std::mutex> lock(gMutex);
    gSpans.clear();
  }
  CUptiResult r = cuptiActivityRegisterCallbacks(requested, completed);
  if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "kernel trace: CUPTI: %s\n", msg ? msg : "error");
    return false;
  }
  return true;
}

std::vector<KernelSpan> KernelTrace::stop() {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(1);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::lock_guard<std::mutex> lock(gMutex);
  std::vector<KernelSpan> spans = std::move(gSpans);
  gSpans.clear();
  std::sort(spans.begin(), spans.end(),
            [](const KernelSpan& a, const KernelSpan& b) { return a.start < b.start; });
  return spans;
}

void printKernelTable(const std::vector<KernelSpan>& spans, int steps) {
  if (spans.empty() || steps <= 0) {
    std::printf("kernel trace: no kernels recorded\n");
    return;
  }
  struct Total {
    int64_t count = 0;
    double ns = 0;
  };
  std::map<std::string, Total> totals;
  double busy = 0;
  uint64_t coveredTo = spans.front().start;
  for (const KernelSpan& s : spans) {
    Total& t = totals[s.name];
    ++t.count;
    t.ns += static_cast<double>(s.end - s.start);
    const uint64_t from = std::max(coveredTo, s.start);
    if (s.end > from) busy += static_cast<double>(s.end - from);
    coveredTo = std::max(coveredTo, s.end);
  }
  const double span = static_cast<double>(coveredTo - spans.front().start);
  std::vector<std::pair<std::string, Total>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::printf("\n%-28s %10s %14s %12s\n", "kernel (per step)", "launches", "us per step",
              "us each");
  for (const auto& [name, t] : rows) {
    std::printf("%-28s %10.1f %14.1f %12.2f\n", name.c_str(), static_cast<double>(t.count) / steps,
                t.ns / 1e3 / steps, t.ns / 1e3 / static_cast<double>(t.count));
  }
  std::printf("span %.1f us per step: kernels running %.1f us, idle %.1f us (%.2f us per launch)\n",
              span / 1e3 / steps, busy / 1e3 / steps, (span - busy) / 1e3 / steps,
              (span - busy) / 1e3 / static_cast<double>(spans.size()));
}

}  // namespace textgen::bench
