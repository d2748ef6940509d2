// LayerNorm (+ fused residual add, optional bias) on CUDA. One block per token row; 16-byte vector
// loads when the row and every pointer allow it, scalar loads otherwise. Statistics in fp32 by two
// block reductions (mean, then the mean squared deviation: no cancellation), the affine transform
// in fp32, one rounding. See layer_norm.h for the contract, cpu/layer_norm.cpp for the reference.
#include "common.cuh"
#include "textgen/kernels/layer_norm.h"

namespace textgen::kernels {
namespace {

using cuda::Convert;
using cuda::Vec;

template <typename T>
struct LayerNormArgs {
  const T* input;
  const T* residual;
  T* residualOut;
  T* output;
  const T* weight;
  const T* bias;
  int hiddenSize;
  float eps;
};

// The sum of `value` over the block, returned to every thread. `scratch` holds 33 floats; a
// second call may follow at once (every read of the first total precedes the second's write).
__device__ float blockSum(float value, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const int numWarps = (blockDim.x + 31) / 32;
    value = lane < numWarps ? scratch[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    if (lane == 0) scratch[32] = value;
  }
  __syncthreads();
  return scratch[32];
}

template <typename T, int kVec>
__global__ void layerNormKernel(LayerNormArgs<T> args) {
  using C = Convert<T>;
  using V = Vec<T, kVec>;
  __shared__ float scratch[33];
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t rowOffset = static_cast<int64_t>(blockIdx.x) * args.hiddenSize;
  const int numVecs = args.hiddenSize / kVec;
  const V* input = reinterpret_cast<const V*>(args.input + rowOffset);
  const V* residual =
      args.residual ? reinterpret_cast<const V*>(args.residual + rowOffset) : nullptr;
  V* residualOut = args.residual ? reinterpret_cast<V*>(args.residualOut + rowOffset) : nullptr;

  // Pass 1: residual add (stored rounded), sum of the rounded sums. Every later pass re-reads only
  // elements this thread wrote or read itself, so aliasing is safe.
  float sum = 0.0f;
  for (int i = threadIdx.x; i < numVecs; i += blockDim.x) {
    V x = input[i];
    if (residual) {
      const V r = residual[i];
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] = C::fromFloat(C::toFloat(x.v[k]) + C::toFloat(r.v[k]));
      residualOut[i] = x;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += C::toFloat(x.v[k]);
  }
  const float invH = 1.0f / static_cast<float>(args.hiddenSize);
  const float mean = blockSum(sum, scratch) * invH;

  // Pass 2: biased variance.
  const V* src = residual ? residualOut : input;
  float sumSq = 0.0f;
  for (int i = threadIdx.x; i < numVecs; i += blockDim.x) {
    const V x = src[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float d = C::toFloat(x.v[k]) - mean;
      sumSq += d * d;
    }
  }
  const float rstd = rsqrtf(blockSum(sumSq, scratch) * invH + args.eps);

  // Pass 3: normalise, scale, shift; one rounding.
  const V* weight = reinterpret_cast<const V*>(args.weight);
  const V* bias = reinterpret_cast<const V*>(args.bias);
  V* output = reinterpret_cast<V*>(args.output + rowOffset);
  for (int i = threadIdx.x; i < numVecs; i += blockDim.x) {
    const V x = src[i];
    const V w = weight[i];
    V b{};
    if (bias) b = bias[i];
    V o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float shift = bias ? C::toFloat(b.v[k]) : 0.0f;
      o.v[k] = C::fromFloat((C::toFloat(x.v[k]) - mean) * rstd * C::toFloat(w.v[k]) + shift);
    }
    output[i] = o;
  }
}

template <typename T>
Status launch(const LayerNormParams& p, cudaStream_t stream) {
  LayerNormArgs<T> args{static_cast<const T*>(p.input),  static_cast<const T*>(p.residual),
                        static_cast<T*>(p.residualOut),  static_cast<T*>(p.output),
                        static_cast<const T*>(p.weight), static_cast<const T*>(p.bias),
                        static_cast<int>(p.hiddenSize),  p.eps};
  constexpr int kVec = 16 / sizeof(T);
  using cuda::aligned16;
  const bool vectorized = p.hiddenSize % kVec == 0 && aligned16(p.input) && aligned16(p.output) &&
                          aligned16(p.weight) && (!p.bias || aligned16(p.bias)) &&
                          (!p.residual || (aligned16(p.residual) && aligned16(p.residualOut)));
  const int64_t units = vectorized ? p.hiddenSize / kVec : p.hiddenSize;
  const int threads = static_cast<int>(units >= 1024 ? 1024 : (units + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(p.numTokens));
  return cuda::launch("layer_norm", vectorized ? layerNormKernel<T, kVec> : layerNormKernel<T, 1>,
                      grid, threads, 0, stream, args);
}

}  // namespace

Status invokeLayerNorm(const LayerNormParams& params, Stream stream) {
  TG_RETURN_IF_ERROR(validateLayerNorm(params));
  if (params.numTokens == 0) return okStatus();
  TG_DISPATCH_DTYPE(params.dtype, launch, params, stream);
}

}  // namespace textgen::kernels
