#include "textgen/kernels/launch.h"

#include <cuda_runtime.h>

#include <atomic>

namespace textgen::kernels {
namespace {

std::atomic<bool> gWanted{true};

bool deviceSupports() {
  static const bool supported = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return supported;
}

}  // namespace

bool programmaticLaunch() {
  return gWanted.load(std::memory_order_relaxed) && deviceSupports();
}

void setProgrammaticLaunch(bool on) {
  gWanted.store(on, std::memory_order_relaxed);
}

}  // namespace textgen::kernels
