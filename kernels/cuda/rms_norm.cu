// RMSNorm (+ fused residual add) on CUDA. One block per token row; 16-byte vector loads when the
// row and every pointer allow it, scalar loads otherwise. Statistics in fp32. See rms_norm.h for
// the exact rounding contract, and cpu/rms_norm.cpp for the reference.
#include "common.cuh"
#include "textgen/kernels/rms_norm.h"

namespace textgen::kernels {
namespace {

using cuda::Convert;
using cuda::Vec;

template <typename T>
struct RmsNormArgs {
  const T* input;
  const T* residual;
  T* residualOut;
  T* output;
  const T* weight;
  int hiddenSize;
  float eps;
};

__device__ float blockReduceSum(float value) {
  __shared__ float warpSums[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (lane == 0) warpSums[warp] = value;
  __syncthreads();
  const int numWarps = (blockDim.x + 31) / 32;
  value = threadIdx.x < numWarps ? warpSums[threadIdx.x] : 0.0f;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
  }
  return value;  // valid in warp 0
}

template <typename T, int kVec>
__global__ void rmsNormKernel(RmsNormArgs<T> args) {
  using C = Convert<T>;
  using V = Vec<T, kVec>;
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t rowOffset = static_cast<int64_t>(blockIdx.x) * args.hiddenSize;
  const int numVecs = args.hiddenSize / kVec;
  const V* input = reinterpret_cast<const V*>(args.input + rowOffset);
  const V* residual =
      args.residual ? reinterpret_cast<const V*>(args.residual + rowOffset) : nullptr;
  V* residualOut = args.residual ? reinterpret_cast<V*>(args.residualOut + rowOffset) : nullptr;

  // Pass 1: residual add (stored rounded), sum of squares of the rounded sums.
  float sumSq = 0.0f;
  for (int i = threadIdx.x; i < numVecs; i += blockDim.x) {
    V x = input[i];
    if (residual) {
      const V r = residual[i];
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] = C::fromFloat(C::toFloat(x.v[k]) + C::toFloat(r.v[k]));
      residualOut[i] = x;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float f = C::toFloat(x.v[k]);
      sumSq += f * f;
    }
  }
  const float total = blockReduceSum(sumSq);
  __shared__ float invRms;
  if (threadIdx.x == 0) invRms = rsqrtf(total / static_cast<float>(args.hiddenSize) + args.eps);
  __syncthreads();
  const float inv = invRms;

  // Pass 2: normalise (each thread re-reads only elements it wrote itself, so aliasing is safe).
  const V* src = residual ? residualOut : input;
  const V* weight = reinterpret_cast<const V*>(args.weight);
  V* output = reinterpret_cast<V*>(args.output + rowOffset);
  for (int i = threadIdx.x; i < numVecs; i += blockDim.x) {
    const V x = src[i];
    const V w = weight[i];
    V o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const T normed = C::fromFloat(C::toFloat(x.v[k]) * inv);
      o.v[k] = C::fromFloat(C::toFloat(w.v[k]) * C::toFloat(normed));
    }
    output[i] = o;
  }
}

template <typename T>
Status launch(const RmsNormParams& p, cudaStream_t stream) {
  RmsNormArgs<T> args{static_cast<const T*>(p.input),
                      static_cast<const T*>(p.residual),
                      static_cast<T*>(p.residualOut),
                      static_cast<T*>(p.output),
                      static_cast<const T*>(p.weight),
                      static_cast<int>(p.hiddenSize),
                      p.eps};
  constexpr int kVec = 16 / sizeof(T);
  using cuda::aligned16;
  const bool vectorized = p.hiddenSize % kVec == 0 && aligned16(p.input) && aligned16(p.output) &&
                          aligned16(p.weight) &&
                          (!p.residual || (aligned16(p.residual) && aligned16(p.residualOut)));
  const int64_t units = vectorized ? p.hiddenSize / kVec : p.hiddenSize;
  const int threads = static_cast<int>(units >= 1024 ? 1024 : (units + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(p.numTokens));
  return cuda::launch("rms_norm", vectorized ? rmsNormKernel<T, kVec> : rmsNormKernel<T, 1>, grid,
                      threads, 0, stream, args);
}

}  // namespace

Status invokeRmsNorm(const RmsNormParams& params, Stream stream) {
  TG_RETURN_IF_ERROR(validateRmsNorm(params));
  if (params.numTokens == 0) return okStatus();
  TG_DISPATCH_DTYPE(params.dtype, launch, params, stream);
}

}  // namespace textgen::kernels
