// The stream type of kernel launchers, without pulling CUDA headers into callers.
#pragma once

struct CUstream_st;

namespace textgen::kernels {
using Stream = CUstream_st*;  // identical to cudaStream_t; nullptr is the legacy default stream
}  // namespace textgen::kernels
