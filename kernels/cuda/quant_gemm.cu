// Quantized linear layers on the device (quant_gemm.h's definitions).
//
// Decode-sized batches: one warp per output row streams the row's packed codes with 16-byte loads
// (32 4-bit or 16 8-bit codes per load, several loads in flight per lane), decodes them in
// registers and multiplies them by x, re-read from L1/L2; one scale (and zero point) per 16-byte
// vector, which lies within one group. 4-bit and 8-bit integer codes become floats with the
// exponent trick (0x4B000000 | q is 2^23 + q), table codes read a 16-entry table in shared memory,
// fp8 codes convert in hardware.
//
// Larger batches: the weight is dequantized into the workspace and cuBLASLt runs the GEMM (prefill
// is compute bound; the dequantization streams the packed bytes once). fp8 weights with one tensor
// scale skip that: x is quantized to e4m3 and cuBLASLt's FP8 GEMM runs on both operands.
//
// Activation schemes run before either path: LLM.int8's decomposition and fp8's fake quantization
// write x' into the workspace (float32 for the GEMV, the dtype for cuBLASLt).
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "quant_gemm_impl.h"

namespace textgen::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

// kNf4Table and kFp4Table (kernels/cpu/quant_gemm.cpp), as constants of the device code; the
// kernel tests compare every code's product with the CPU reference.
__constant__ float cNf4[16] = {-1.0f,
                               -0.6961928009986877f,
                               -0.5250730514526367f,
                               -0.39491748809814453f,
                               -0.28444138169288635f,
                               -0.18477343022823334f,
                               -0.09105003625154495f,
                               0.0f,
                               0.07958029955625534f,
                               0.16093020141124725f,
                               0.24611230194568634f,
                               0.33791524171829224f,
                               0.44070982933044434f,
                               0.5626170039176941f,
                               0.7229568362236023f,
                               1.0f};
__constant__ float cFp4[16] = {
    0.0f,  5.208333333e-03f,  0.66666667f,  1.0f,  0.33333333f,  0.5f,  0.16666667f,  0.25f,
    -0.0f, -5.208333333e-03f, -0.66666667f, -1.0f, -0.33333333f, -0.5f, -0.16666667f, -0.25f};

size_t alignUp(size_t n) {
  return (n + 255) & ~size_t{255};
}

// Codes of one 16-byte vector.
template <QuantCode C>
constexpr int kCodesPerVec = quantBits(C) == 4 ? 32 : 16;

template <typename T>
__device__ __forceinline__ void toFloats8(const uint4& v, float (&f)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __half>) {
      __half2 h;
      memcpy(&h, &words[i], 4);
      const float2 p = __half22float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    } else {
      __nv_bfloat162 h;
      memcpy(&h, &words[i], 4);
      const float2 p = __bfloat1622float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
}

// The values of one vector's codes before scaling (zero point subtracted for integer codes).
template <QuantCode C>
__device__ __forceinline__ void decode(const uint4& v, float zero, const float* table,
                                       float (&w)[kCodesPerVec<C>]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (C == QuantCode::kUint4) {
    const float bias = 8388608.0f + zero;  // 2^23 + zero
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < 8; ++k)
        w[8 * i + k] = __uint_as_float(0x4B000000u | ((words[i] >> (4 * k)) & 15u)) - bias;
  } else if constexpr (C == QuantCode::kUint8) {
    const float bias = 8388608.0f + zero;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[4 * i + k] = __uint_as_float(__byte_perm(words[i], 0x4B000000u, 0x7650 + k)) - bias;
  } else if constexpr (C == QuantCode::kNf4 || C == QuantCode::kFp4) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int k = 0; k < 8; ++k) w[8 * i + k] = table[(words[i] >> (4 * k)) & 15u];
  } else {  // kFp8E4M3
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(words[i] >> (16 * k)), __NV_E4M3);
        __half2 hh;
        memcpy(&hh, &h, 4);
        const float2 f = __half22float2(hh);
        w[4 * i + 2 * k] = f.x;
        w[4 * i + 2 * k + 1] = f.y;
      }
    }
  }
}

// Codes of one 32-bit word.
template <QuantCode C>
constexpr int kCodesPerWord = quantBits(C) == 4 ? 8 : 4;

// One word's values before scaling (zero point subtracted for integer codes).
template <QuantCode C>
__device__ __forceinline__ void decodeWord(uint32_t word, float bias, const float* table,
                                           float (&w)[kCodesPerWord<C>]) {
  if constexpr (C == QuantCode::kUint4) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      w[k] = __uint_as_float(0x4B000000u | ((word >> (4 * k)) & 15u)) - bias;
  } else if constexpr (C == QuantCode::kUint8) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7650 + k)) - bias;
  } else if constexpr (C == QuantCode::kNf4 || C == QuantCode::kFp4) {
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = table[(word >> (4 * k)) & 15u];
  } else {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(word >> (16 * k)), __NV_E4M3);
      __half2 hh;
      memcpy(&hh, &h, 4);
      const float2 f = __half22float2(hh);
      w[2 * k] = f.x;
      w[2 * k + 1] = f.y;
    }
  }
}

// M (8 or 4) x values of one row from input j0.
template <typename XT, int M>
__device__ __forceinline__ void loadXWord(const XT* __restrict__ xRow,
                                          const int32_t* __restrict__ perm, int j0,
                                          float (&xf)[M]) {
  if (perm) {
#pragma unroll
    for (int k = 0; k < M; ++k) xf[k] = cuda::Convert<XT>::toFloat(xRow[perm[j0 + k]]);
  } else if constexpr (std::is_same_v<XT, float>) {
#pragma unroll
    for (int k = 0; k < M / 4; ++k) {
      const float4 v = reinterpret_cast<const float4*>(xRow + j0)[k];
      xf[4 * k] = v.x;
      xf[4 * k + 1] = v.y;
      xf[4 * k + 2] = v.z;
      xf[4 * k + 3] = v.w;
    }
  } else if constexpr (M == 8) {
    float f[8];
    toFloats8<XT>(*reinterpret_cast<const uint4*>(xRow + j0), f);
#pragma unroll
    for (int k = 0; k < 8; ++k) xf[k] = f[k];
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(xRow + j0);
    const uint4 wide = make_uint4(v.x, v.y, 0, 0);
    float f[8];
    toFloats8<XT>(wide, f);
#pragma unroll
    for (int k = 0; k < 4; ++k) xf[k] = f[k];
  }
}

template <typename T, typename XT, QuantCode C, int kRows>
__global__ void __launch_bounds__(kWarps * 32)
    quantGemvKernel(const XT* __restrict__ x, const uint8_t* __restrict__ packed,
                    const float* __restrict__ scales, const uint8_t* __restrict__ zeros,
                    const int32_t* __restrict__ perm, T* __restrict__ y, int rows, int in, int out,
                    int groupSize) {
  constexpr int N = kCodesPerVec<C>;
  constexpr int kStep = 32 * kUnroll;
  __shared__ float table[16];
  if constexpr (C == QuantCode::kNf4 || C == QuantCode::kFp4) {
    if (threadIdx.x < 16)
      table[threadIdx.x] = C == QuantCode::kNf4 ? cNf4[threadIdx.x] : cFp4[threadIdx.x];
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int o = blockIdx.x * kWarps + warp;
  const int vecs = o < out ? in / N : 0;
  const int groups = in / groupSize;
  const uint4* wRow =
      reinterpret_cast<const uint4*>(packed + static_cast<int64_t>(o) * (in / N) * 16);
  uint4 cur[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int v = lane + 32 * u;
    cur[u] = v < vecs ? __ldcs(wRow + v) : make_uint4(0, 0, 0, 0);
  }
  cuda::waitForPrimary();
  cuda::allowDependents();
  if (o >= out) return;
  float acc[kRows] = {};
  const float* rowScales = scales + static_cast<int64_t>(o) * groups;
  const uint8_t* rowZeros = quantHasZeros(C) ? zeros + static_cast<int64_t>(o) * groups : nullptr;
  for (int v0 = lane; v0 < vecs; v0 += kStep) {
    // Every vector's scale and zero point requested at once (not one latency per vector).
    float sc[kUnroll], zp[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = min(v0 + 32 * u, vecs - 1) * N / groupSize;
      sc[u] = __ldg(rowScales + g);
      zp[u] = 0.0f;
      if constexpr (quantHasZeros(C)) zp[u] = __ldg(rowZeros + g);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + 32 * u;
      if (v >= vecs) break;
      const float s = sc[u], bias = 8388608.0f + zp[u];  // 2^23 + zero: the exponent trick
      const uint32_t words[4] = {cur[u].x, cur[u].y, cur[u].z, cur[u].w};
      constexpr int M = kCodesPerWord<C>;
      float dot[kRows] = {};
      // Word by word (few registers: more warps resident, more loads in flight).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float w[M];
        decodeWord<C>(words[i], bias, table, w);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r >= rows) break;
          float xf[M];
          loadXWord<XT, M>(x + static_cast<int64_t>(r) * in, perm, v * N + i * M, xf);
#pragma unroll
          for (int k = 0; k < M; ++k) dot[r] = fmaf(w[k], xf[k], dot[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = fmaf(s, dot[r], acc[r]);
    }
    if (v0 + kStep < vecs) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + kStep + 32 * u;
        cur[u] = v < vecs ? __ldcs(wRow + v) : make_uint4(0, 0, 0, 0);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float a = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0 && r < rows)
      y[static_cast<int64_t>(r) * out + o] = cuda::Convert<T>::fromFloat(a);
  }
}

// dense[o, perm[j]] = deq(W)[o, j]: one thread per 16-byte vector of codes.
template <typename T, QuantCode C>
__global__ void dequantizeKernel(const uint8_t* __restrict__ packed,
                                 const float* __restrict__ scales,
                                 const uint8_t* __restrict__ zeros,
                                 const int32_t* __restrict__ perm, T* __restrict__ dense, int in,
                                 int out, int groupSize) {
  constexpr int N = kCodesPerVec<C>;
  __shared__ float table[16];
  if constexpr (C == QuantCode::kNf4 || C == QuantCode::kFp4) {
    if (threadIdx.x < 16)
      table[threadIdx.x] = C == QuantCode::kNf4 ? cNf4[threadIdx.x] : cFp4[threadIdx.x];
    __syncthreads();
  }
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t vecsPerRow = in / N;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= vecsPerRow * out) return;
  const int64_t o = t / vecsPerRow;
  const int j0 = static_cast<int>(t % vecsPerRow) * N;
  const int groups = in / groupSize;
  const int64_t g = o * groups + j0 / groupSize;
  const float s = scales[g];
  float zero = 0.0f;
  if constexpr (quantHasZeros(C)) zero = zeros[g];
  float w[N];
  decode<C>(reinterpret_cast<const uint4*>(packed)[t], zero, table, w);
  T* row = dense + o * in;
  if (perm) {
#pragma unroll
    for (int k = 0; k < N; ++k) row[perm[j0 + k]] = cuda::Convert<T>::fromFloat(w[k] * s);
    return;
  }
  // 16-byte stores (a warp's stores then cover whole lines, not one element of each).
  constexpr int kPer = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < N / kPer; ++c) {
    cuda::Vec<T, kPer> v;
#pragma unroll
    for (int e = 0; e < kPer; ++e) v.v[e] = cuda::Convert<T>::fromFloat(w[c * kPer + e] * s);
    *reinterpret_cast<cuda::Vec<T, kPer>*>(row + j0 + c * kPer) = v;
  }
}

// Scalar fallback of the dequantization for layouts the vector kernel does not take (groups not
// a multiple of a vector, odd row bytes): one thread per weight.
template <typename T>
__global__ void dequantizeScalarKernel(QuantCode code, const uint8_t* __restrict__ packed,
                                       const float* __restrict__ scales,
                                       const uint8_t* __restrict__ zeros,
                                       const int32_t* __restrict__ perm, T* __restrict__ dense,
                                       int in, int out, int groupSize) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<int64_t>(in) * out) return;
  const int64_t o = t / in;
  const int j = static_cast<int>(t % in);
  const int groups = in / groupSize;
  const int64_t g = o * groups + j / groupSize;
  const float s = scales[g];
  const bool four = quantBits(code) == 4;
  const int64_t rowBytes = four ? in / 2 : in;
  const uint8_t byte = packed[o * rowBytes + (four ? j / 2 : j)];
  const uint32_t q = four ? (byte >> (4 * (j % 2))) & 15u : byte;
  float v;
  switch (code) {
    case QuantCode::kUint4:
    case QuantCode::kUint8: v = static_cast<float>(q) - static_cast<float>(zeros[g]); break;
    case QuantCode::kNf4: v = cNf4[q]; break;
    case QuantCode::kFp4: v = cFp4[q]; break;
    default: {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
      __half hh;
      memcpy(&hh, &h, 2);
      v = __half2float(hh);
    }
  }
  dense[o * in + (perm ? perm[j] : j)] = cuda::Convert<T>::fromFloat(v * s);
}

// absmax of n values into *amax (zeroed before): non-negative floats order as their bits.
template <typename T>
__global__ void absmaxKernel(const T* __restrict__ x, int64_t n, float* amax) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(cuda::Convert<T>::toFloat(x[i])));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

__device__ __forceinline__ float fp8Scale(const float* inputScale, const float* amax) {
  if (inputScale) return *inputScale;
  const float a = *amax;
  return a > 0.0f ? a / 448.0f : 1.0f;
}

__device__ __forceinline__ uint8_t toE4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float fromE4m3(uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
  __half hh;
  memcpy(&hh, &h, 2);
  return __half2float(hh);
}

// fp8 activations: xq = e4m3(x / s) * s (OutT float or the dtype), or the codes themselves
// (OutT uint8_t, the scale stored at *scaleOut for cuBLASLt).
template <typename T, typename OutT>
__global__ void fp8ActKernel(const T* __restrict__ x, int64_t n, const float* inputScale,
                             const float* amax, OutT* __restrict__ xq, float* scaleOut) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const float s = fp8Scale(inputScale, amax);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i0 == 0 && scaleOut) *scaleOut = s;
  for (int64_t i = i0; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t q = toE4m3(cuda::Convert<T>::toFloat(x[i]) / s);
    if constexpr (std::is_same_v<OutT, uint8_t>)
      xq[i] = q;
    else
      xq[i] = cuda::Convert<OutT>::fromFloat(fromE4m3(q) * s);
  }
}

// fp8 activations of a decode-sized batch in one block: the absmax, then x' = e4m3(x / s) * s as
// float32 (one launch where the general path takes three).
template <typename T>
__global__ void __launch_bounds__(1024)
    fp8SmallActKernel(const T* __restrict__ x, int n, const float* inputScale,
                      float* __restrict__ xq) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  __shared__ float warpMax[32];
  float s;
  if (inputScale) {
    s = *inputScale;
  } else {
    float m = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      m = fmaxf(m, fabsf(cuda::Convert<T>::toFloat(x[i])));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (threadIdx.x % 32 == 0) warpMax[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
      m = threadIdx.x < blockDim.x / 32 ? warpMax[threadIdx.x] : 0.0f;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (threadIdx.x == 0) warpMax[0] = m;
    }
    __syncthreads();
    s = warpMax[0] > 0.0f ? warpMax[0] / 448.0f : 1.0f;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    xq[i] = fromE4m3(toE4m3(cuda::Convert<T>::toFloat(x[i]) / s)) * s;
}

// LLM.int8, step 1: outlier columns (any row with |x| >= threshold).
template <typename T>
__global__ void outlierColumnsKernel(const T* __restrict__ x, int rows, int in, float threshold,
                                     uint8_t* __restrict__ outlier) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= in) return;
  uint8_t o = 0;
  for (int r = 0; r < rows; ++r)
    o |= fabsf(cuda::Convert<T>::toFloat(x[static_cast<int64_t>(r) * in + i])) >= threshold;
  outlier[i] = o;
}

// LLM.int8, step 2 (one block per row): the row's absmax over its elements below the threshold,
// then x' = rint(x * 127 / a) * a / 127 in the other columns, x in the outlier ones.
template <typename T, typename OutT>
__global__ void llmInt8RowKernel(const T* __restrict__ x, int in, float threshold,
                                 const uint8_t* __restrict__ outlier, OutT* __restrict__ xq) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  const T* row = x + static_cast<int64_t>(blockIdx.x) * in;
  OutT* dst = xq + static_cast<int64_t>(blockIdx.x) * in;
  float m = 0.0f;
  for (int i = threadIdx.x; i < in; i += blockDim.x) {
    const float a = fabsf(cuda::Convert<T>::toFloat(row[i]));
    if (a < threshold) m = fmaxf(m, a);
  }
  __shared__ float warpMax[32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warpMax[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? warpMax[threadIdx.x] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (threadIdx.x == 0) warpMax[0] = m;
  }
  __syncthreads();
  const float amax = warpMax[0];
  for (int i = threadIdx.x; i < in; i += blockDim.x) {
    const float v = cuda::Convert<T>::toFloat(row[i]);
    float r = v;
    if (!outlier[i]) r = amax > 0.0f ? rintf(v * (127.0f / amax)) * (amax / 127.0f) : 0.0f;
    dst[i] = cuda::Convert<OutT>::fromFloat(r);
  }
}

struct Layout {
  size_t scalars = 0, flags = 0, xq = 0, dense = 0, total = 0;
};

bool fp8GemmTakes(const QuantGemmParams& p);

bool gemvTakes(const QuantGemmParams& p) {
  const int n = quantBits(p.w.code) == 4 ? 32 : 16;
  // fp8 with one tensor scale: cuBLASLt's FP8 GEMM from 3 rows on (bench_cuda_model: it decodes 32
  // rows in less time than the GEMV takes for 8).
  const int64_t maxRows = fp8GemmTakes(p) ? 2 : kMaxQuantGemvRows;
  return p.dtype != DType::kF32 && p.rows <= maxRows && p.in % n == 0 && p.w.groupSize % n == 0 &&
         cuda::aligned16(p.w.packed) && (p.w.act != ActQuant::kNone || cuda::aligned16(p.x)) &&
         p.in < (int64_t{1} << 30) && p.out < (int64_t{1} << 31);
}

bool fp8GemmTakes(const QuantGemmParams& p) {
  return p.w.code == QuantCode::kFp8E4M3 && p.w.act == ActQuant::kFp8 && p.w.tensorScale &&
         !p.w.perm && p.dtype != DType::kF32 && p.in % 16 == 0 && p.out % 16 == 0 &&
         cuda::aligned16(p.w.packed);
}

Layout layoutOf(const QuantGemmParams& p) {
  Layout l;
  const size_t n = static_cast<size_t>(p.rows * p.in), es = dtypeSize(p.dtype);
  l.scalars = 256;
  if (p.w.act == ActQuant::kLlmInt8) l.flags = alignUp(static_cast<size_t>(p.in));
  if (gemvTakes(p)) {
    if (p.w.act != ActQuant::kNone) l.xq = alignUp(n * sizeof(float));
  } else if (fp8GemmTakes(p)) {
    l.xq = alignUp(n);
  } else {
    if (p.w.act != ActQuant::kNone) l.xq = alignUp(n * es);
    l.dense = alignUp(static_cast<size_t>(p.out * p.in) * es);
  }
  l.total = l.scalars + l.flags + l.xq + l.dense;
  return l;
}

unsigned blocksFor(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
}

// x' = act(x) into xq (OutT), or nothing for kNone.
template <typename T, typename OutT>
Status activations(const QuantGemmParams& p, char* ws, const Layout& l, OutT* xq,
                   cudaStream_t stream) {
  const auto* x = static_cast<const T*>(p.x);
  const int64_t n = p.rows * p.in;
  auto* scalars = reinterpret_cast<float*>(ws);
  if (p.w.act == ActQuant::kFp8) {
    if constexpr (std::is_same_v<OutT, float>) {
      if (n <= (int64_t{1} << 17))
        return cuda::launch("fp8 activations", fp8SmallActKernel<T>, 1, 1024, 0, stream, x,
                            static_cast<int>(n), p.w.inputScale, xq);
    }
    if (!p.w.inputScale) {
      if (cudaMemsetAsync(scalars, 0, sizeof(float), stream) != cudaSuccess)
        return internalError("quant gemm: memset failed");
      const unsigned blocks = std::min<unsigned>(blocksFor(n, 256), 1024);
      TG_RETURN_IF_ERROR(
          cuda::launch("fp8 absmax", absmaxKernel<T>, blocks, 256, 0, stream, x, n, scalars));
    }
    return cuda::launch("fp8 activations", fp8ActKernel<T, OutT>, blocksFor(n, 256), 256, 0, stream,
                        x, n, p.w.inputScale, static_cast<const float*>(scalars), xq,
                        std::is_same_v<OutT, uint8_t> ? scalars + 4 : nullptr);
  }
  if constexpr (!std::is_same_v<OutT, uint8_t>) {
    if (p.w.act != ActQuant::kLlmInt8) return okStatus();
    auto* flags = reinterpret_cast<uint8_t*>(ws + l.scalars);
    TG_RETURN_IF_ERROR(cuda::launch(
        "llm.int8 outliers", outlierColumnsKernel<T>, blocksFor(p.in, 256), 256, 0, stream, x,
        static_cast<int>(p.rows), static_cast<int>(p.in), p.w.threshold, flags));
    return cuda::launch("llm.int8 rows", llmInt8RowKernel<T, OutT>, static_cast<unsigned>(p.rows),
                        256, 0, stream, x, static_cast<int>(p.in), p.w.threshold,
                        static_cast<const uint8_t*>(flags), xq);
  }
  return okStatus();
}

template <typename T, typename XT, QuantCode C>
Status launchGemv(const QuantGemmParams& p, const XT* x, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out + kWarps - 1) / kWarps));
  const auto* packed = static_cast<const uint8_t*>(p.w.packed);
  auto* y = static_cast<T*>(p.y);
  const int rows = static_cast<int>(p.rows), in = static_cast<int>(p.in),
            out = static_cast<int>(p.out), gs = static_cast<int>(p.w.groupSize);
#define TG_QGEMV(R)                                                                                \
  return cuda::launch("quant gemv", quantGemvKernel<T, XT, C, R>, grid, kWarps * 32, 0, stream, x, \
                      packed, p.w.scales, p.w.zeros, p.w.perm, y, rows, in, out, gs)
  if (rows == 1) TG_QGEMV(1);
  if (rows == 2) TG_QGEMV(2);
  if (rows <= 4) TG_QGEMV(4);
  TG_QGEMV(8);
#undef TG_QGEMV
}

template <typename T, typename XT>
Status gemvByCode(const QuantGemmParams& p, const XT* x, cudaStream_t stream) {
  switch (p.w.code) {
    case QuantCode::kUint4: return launchGemv<T, XT, QuantCode::kUint4>(p, x, stream);
    case QuantCode::kUint8: return launchGemv<T, XT, QuantCode::kUint8>(p, x, stream);
    case QuantCode::kNf4: return launchGemv<T, XT, QuantCode::kNf4>(p, x, stream);
    case QuantCode::kFp4: return launchGemv<T, XT, QuantCode::kFp4>(p, x, stream);
    case QuantCode::kFp8E4M3: return launchGemv<T, XT, QuantCode::kFp8E4M3>(p, x, stream);
  }
  return invalidArgumentError("quant gemm: unknown code");
}

template <typename T>
Status dequantize(const QuantGemmParams& p, T* dense, cudaStream_t stream) {
  const auto* packed = static_cast<const uint8_t*>(p.w.packed);
  const int in = static_cast<int>(p.in), out = static_cast<int>(p.out),
            gs = static_cast<int>(p.w.groupSize);
  const int n = quantBits(p.w.code) == 4 ? 32 : 16;
  if (p.in % n == 0 && p.w.groupSize % n == 0 && cuda::aligned16(packed)) {
    const unsigned blocks = static_cast<unsigned>((p.out * (p.in / n) + 255) / 256);
#define TG_DEQ(C)                                                                           \
  return cuda::launch("dequantize", dequantizeKernel<T, C>, blocks, 256, 0, stream, packed, \
                      p.w.scales, p.w.zeros, p.w.perm, dense, in, out, gs)
    switch (p.w.code) {
      case QuantCode::kUint4: TG_DEQ(QuantCode::kUint4);
      case QuantCode::kUint8: TG_DEQ(QuantCode::kUint8);
      case QuantCode::kNf4: TG_DEQ(QuantCode::kNf4);
      case QuantCode::kFp4: TG_DEQ(QuantCode::kFp4);
      case QuantCode::kFp8E4M3: TG_DEQ(QuantCode::kFp8E4M3);
    }
#undef TG_DEQ
  }
  const unsigned blocks = static_cast<unsigned>((p.out * p.in + 255) / 256);
  return cuda::launch("dequantize", dequantizeScalarKernel<T>, blocks, 256, 0, stream, p.w.code,
                      packed, p.w.scales, p.w.zeros, p.w.perm, dense, in, out, gs);
}

template <typename T>
Status run(const QuantGemmParams& p, char* ws, const QuantGemmCallbacks& gemm,
           cudaStream_t stream) {
  const Layout l = layoutOf(p);
  char* xqBytes = ws + l.scalars + l.flags;
  if (gemvTakes(p)) {
    if (p.w.act == ActQuant::kNone) return gemvByCode<T, T>(p, static_cast<const T*>(p.x), stream);
    auto* xq = reinterpret_cast<float*>(xqBytes);
    TG_RETURN_IF_ERROR((activations<T, float>(p, ws, l, xq, stream)));
    return gemvByCode<T, float>(p, xq, stream);
  }
  if (fp8GemmTakes(p)) {
    auto* xq = reinterpret_cast<uint8_t*>(xqBytes);
    TG_RETURN_IF_ERROR((activations<T, uint8_t>(p, ws, l, xq, stream)));
    return gemm.fp8({xq, p.w.packed, p.y, p.rows, p.in, p.out, p.dtype}, p.w.tensorScale,
                    reinterpret_cast<const float*>(ws) + 4);
  }
  const void* x = p.x;
  if (p.w.act != ActQuant::kNone) {
    auto* xq = reinterpret_cast<T*>(xqBytes);
    TG_RETURN_IF_ERROR((activations<T, T>(p, ws, l, xq, stream)));
    x = xq;
  }
  auto* dense = reinterpret_cast<T*>(xqBytes + l.xq);
  TG_RETURN_IF_ERROR(dequantize<T>(p, dense, stream));
  return gemm.dense({x, dense, p.y, p.rows, p.in, p.out, p.dtype});
}

}  // namespace

size_t quantGemmWorkspaceBytes(const QuantGemmParams& p) {
  return layoutOf(p).total;
}

Status invokeQuantGemmWith(const QuantGemmParams& p, void* workspace, size_t workspaceBytes,
                           const QuantGemmCallbacks& gemm, Stream stream) {
  TG_RETURN_IF_ERROR(validateQuantGemm(p));
  if (p.rows == 0) return okStatus();
  if (workspaceBytes < quantGemmWorkspaceBytes(p))
    return internalError("quant gemm: the workspace is too small");
  auto* ws = static_cast<char*>(workspace);
  TG_DISPATCH_DTYPE(p.dtype, run, p, ws, gemm, stream);
}

}  // namespace textgen::kernels
