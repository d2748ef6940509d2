// Quantized linear layers on the device (quant_gemm.h's definitions).
//
// Decode-sized batches: one warp per output row streams the row's packed codes with 16-byte loads
// (32 4-bit or 16 8-bit codes per load, several loads in flight per lane), decodes them in
// registers and multiplies them by x, re-read from L1/L2; one scale (and zero point) per 16-byte
// vector, which lies within one group. 4-bit and 8-bit integer codes become floats with the
// exponent trick (0x4B000000 | q is 2^23 + q), table codes read a 16-entry table in shared memory,
// fp8 codes convert in hardware.
//
// 16-bit x up to 64 rows runs on the tensor cores instead (quantMmaGemvKernel, quantMmaTileKernel
// below); the fp32 GEMV above serves LLM.int8 and fp8 with per-group scales up to 8 rows.
//
// Larger batches: the weight is dequantized into the workspace and cuBLASLt runs the GEMM (prefill
// is compute bound; the dequantization streams the packed bytes once). fp8 weights with one tensor
// scale skip that: x is quantized to e4m3 and cuBLASLt's FP8 GEMM runs on both operands.
//
// Activation schemes run before either path: LLM.int8's decomposition and fp8's fake quantization
// write x' into the workspace (float32 for the GEMV, the dtype for cuBLASLt).
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "activation.cuh"
#include "common.cuh"
#include "mma.cuh"
#include "quant_gemm_impl.h"
#include "textgen/kernels/fast_div.h"

namespace textgen::kernels {
namespace {

using cuda::cpAsync16;
using cuda::cpAsync4;
using cuda::cpAsyncCommit;
using cuda::cpAsyncWait;
using cuda::mmaK16;

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

// ---------------------------------------------------------------------------------------------
// Decode-sized batches on the tensor cores (16-bit activations, and fp8 W8A8).
//
// A warp multiplies 16 outputs by up to 8 rows of x with mma.sync: the weight is the A operand
// (m16 = 16 outputs), x the B operand (n8 = 8 rows; columns past the batch are zero). The
// reduction index k may be permuted at will as long as W and x are permuted alike, so each lane
// takes its fragments straight from the row-major packed codes: lane (g, c) = (lane / 4, lane % 4)
// loads one 16-byte vector of output rows g and g + 8 at inputs k0 + c * kVec, and the four lanes
// of a row cover one step of 4 * kVec inputs with no repacking. The codes are decoded in registers
// to 16-bit pairs (integer codes with the exponent trick: 0x4300 | q is the bf16 128 + q, 0x6400 |
// q the fp16 1024 + q; table codes from a 256-pair table in shared memory; 8-bit codes through
// fp32) and handed to the mma with fp32 accumulation; the lanes load x's matching inputs, paired
// the same way. Integer codes whose groups hold whole steps go in as q - zero (exact in 16 bits)
// and each step's fp32 sums take the scale; other codes are scaled before (rounded to the dtype,
// as the dequantize + cuBLASLt path rounds them). fp8 W8A8 feeds the e4m3 codes of W and of x
// (quantized by a small kernel before) to m16n8k32 e4m3 mma with no decoding at all. The warps of
// a block split the k steps and add their partial sums through shared memory.
// Warps of a block (they split the k steps): 8, or 12 when the matrix has too few 16-output tiles
// to fill the GPU with blocks of 8 warps (Llama's 4096-output o and down projections).
constexpr int kMmaWarps = 8, kMmaWarpsFew = 12;
constexpr int kMmaOuts = 16;  // outputs of a block: one m16 tile
// Steps whose weights a lane loads ahead of the one it decodes: 1, except 2 for 8-bit weight-only
// codes on one n8 tile (measured on H100, bench_quant_gemm: a second stage slowed the 4-bit GEMV
// by 8-15% at every shape, the registers it holds costing more than the latency it hides, sped up
// EETQ's int8 by 2-7% at 1-8 rows and slowed it by 15-25% at 16 and 32).
template <QuantCode C, bool kW8A8, int kTiles>
constexpr int kMmaPipe = quantBits(C) == 8 && !kW8A8 && kTiles == 1 ? 2 : 1;

template <typename T>
using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;

template <typename T>
__device__ __forceinline__ Pair<T> asPair(uint32_t u) {
  Pair<T> p;
  memcpy(&p, &u, 4);
  return p;
}

template <typename T>
__device__ __forceinline__ uint32_t asBits(Pair<T> p) {
  uint32_t u;
  memcpy(&u, &p, 4);
  return u;
}

template <typename T>
__device__ __forceinline__ uint32_t floatsToPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>)
    return asBits<T>(__floats2half2_rn(lo, hi));
  else
    return asBits<T>(__floats2bfloat162_rn(lo, hi));
}

// The 16-bit float whose bits are kMagic | q (q < 16) is kMagicValue + q.
template <typename T>
constexpr uint32_t kMagic = std::is_same_v<T, __half> ? 0x64006400u : 0x43004300u;
template <typename T>
constexpr float kMagicValue = std::is_same_v<T, __half> ? 1024.0f : 128.0f;

// mmaK16 (mma.cuh): d += A · B, m16n8k16; here A = 16 outputs' weights (a0/a2 rows g, a1/a3
// rows g + 8), B = 8 rows of x.

// d += A · B, m16n8k32 on e4m3 codes (sm_89 on), the same roles.
__device__ __forceinline__ void mmaE4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // the host takes this path only on sm_89 and later
#endif
}

// One weight word's codes as the B fragments of its mmas (kPairs 16-bit pairs; mma h takes pairs
// 2h and 2h + 1), and the matching x pairs (xp[j] holds the inputs of the codes of pair j).
//   kUint4:       pair j = codes (j, j + 4): ((q >> 4j) & 0x000F000F) | kMagic is both at once.
//   kNf4, kFp4:   pair j = byte j = codes (2j, 2j + 1), from the shared table.
//   8-bit codes:  pair j = codes (2j, 2j + 1).
template <QuantCode C>
constexpr int kPairs = quantBits(C) == 4 ? 4 : 2;

template <typename T>
__device__ __forceinline__ float2 pairToFloats(Pair<T> p) {
  if constexpr (std::is_same_v<T, __half>)
    return __half22float2(p);
  else
    return __bfloat1622float2(p);
}

// kScaled: the pairs are value * scale computed in fp32 and rounded to T once (the dequantized
// weight the reference defines, rounded as the dequantize + cuBLASLt path rounds it); else the
// integer values q - zero themselves (exact in T; the scale is applied to the mma's fp32 sums).
// zeroHigh (fp16 uint4 only): the pair -(64 + zero), for codes decoded sixteen times too large.
template <typename T, QuantCode C, bool kScaled>
__device__ __forceinline__ void decodePairs(uint32_t q, Pair<T> zero, Pair<T> zeroHigh, float zeroF,
                                            float scaleF, const uint32_t* lut,
                                            uint32_t (&b)[kPairs<C>]) {
  if constexpr (C == QuantCode::kUint4 && std::is_same_v<T, __half>) {
    // Pairs 1 and 3 without their shifts: codes in bits 4-7 of each half give 1024 + 16 q, and
    // (1024 + 16 q) / 16 - (64 + zero) is q - zero, exact in fp16 as the others are (one shift and
    // eight operations a word instead of three and eleven).
    const uint32_t hi = q >> 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t src = j < 2 ? q : hi;
      const uint32_t t = (src & (j % 2 ? 0x00F000F0u : 0x000F000Fu)) | kMagic<T>;
      constexpr uint32_t kSixteenth = 0x2C002C00u;  // fp16 1/16, twice
      const Pair<T> d = j % 2 ? __hfma2(asPair<T>(t), asPair<T>(kSixteenth), zeroHigh)
                              : __hsub2(asPair<T>(t), zero);
      if constexpr (kScaled) {
        const float2 f = pairToFloats<T>(d);
        b[j] = floatsToPair<T>(f.x * scaleF, f.y * scaleF);
      } else {
        b[j] = asBits<T>(d);
      }
    }
  } else if constexpr (C == QuantCode::kUint4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t t = ((q >> (4 * j)) & 0x000F000Fu) | kMagic<T>;
      const Pair<T> d = __hsub2(asPair<T>(t), zero);  // q - zero, exact
      if constexpr (kScaled) {
        const float2 f = pairToFloats<T>(d);
        b[j] = floatsToPair<T>(f.x * scaleF, f.y * scaleF);
      } else {
        b[j] = asBits<T>(d);
      }
    }
  } else if constexpr (C == QuantCode::kUint8 && !kScaled && std::is_same_v<T, __half>) {
    // 0x64 above a byte is the fp16 1024 + q.
#pragma unroll
    for (int j = 0; j < 2; ++j)
      b[j] = asBits<T>(__hsub2(asPair<T>(__byte_perm(q, 0x64646464u, j ? 0x4342 : 0x4140)), zero));
  } else if constexpr (C == QuantCode::kNf4 || C == QuantCode::kFp4) {
    // The table's pair in T times the scale in T: the weight carries the table value's and the
    // scale's roundings to T besides the product's (at most 2 ulps of T more than one rounding,
    // far below a 4-bit code's own error); scaling in fp32 slowed the batch-1 decode by 12% (H100).
    const Pair<T> s2{cuda::Convert<T>::fromFloat(scaleF), cuda::Convert<T>::fromFloat(scaleF)};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      b[j] = asBits<T>(__hmul2(asPair<T>(lut[(q >> (8 * j)) & 0xFFu]), s2));
  } else if constexpr (C == QuantCode::kUint8) {
    const float bias = 8388608.0f + zeroF;  // 2^23 + zero: (2^23 + q) - bias is exact
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float lo = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7650 + 2 * j)) - bias;
      const float hi = __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7651 + 2 * j)) - bias;
      if constexpr (kScaled)
        b[j] = floatsToPair<T>(lo * scaleF, hi * scaleF);
      else
        b[j] = floatsToPair<T>(lo, hi);
    }
  } else {  // kFp8E4M3, weight only
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const __half2_raw h =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(q >> (16 * j)), __NV_E4M3);
      __half2 hh;
      memcpy(&hh, &h, 4);
      const float2 f = __half22float2(hh);
      b[j] = floatsToPair<T>(f.x * scaleF, f.y * scaleF);
    }
  }
}

// x pairs of one weight word: xw are the x words (two inputs each) of the word's codes in order.
template <QuantCode C>
__device__ __forceinline__ void pairX(const uint32_t* xw, uint32_t (&xp)[kPairs<C>]) {
  if constexpr (C == QuantCode::kUint4) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      xp[j] = __byte_perm(xw[j / 2], xw[j / 2 + 2], j % 2 ? 0x7632 : 0x5410);
  } else {
#pragma unroll
    for (int j = 0; j < kPairs<C>; ++j) xp[j] = xw[j];
  }
}

__device__ __forceinline__ uint4 loadOrZero(const uint8_t* p, bool ok) {
  return ok ? __ldcs(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// What a lane loads for one step ahead of using it: its two weight vectors, and their scales and
// zero points.
struct MmaStage {
  uint4 w[2];
  float scale[2];
  float zero[2];
};

// y[rows, out] = x · deq(W)ᵀ for rows <= 8 * kTiles (kTiles n8 tiles of x's rows share each decoded
// weight fragment). kW8A8: x holds e4m3 codes and *xScale their scale, W is fp8 with one scale per
// output (groups == 1; kTiles 1). kScaleAfter (integer codes, groups a multiple of a step): the
// mmas take q - zero, and each step's fp32 sums are scaled once per output.
// kGated (kTiles 1): W is [gate; up] stacked ([2n, in]) and y [rows, n] = act(gate) * up. A block
// computes 8 outputs: its m16 tile's rows g are the gates of outputs j0 + g, its rows g + 8 their
// ups, each product rounded to T and then the gated activation kernel's formula: bit for bit the
// plain GEMV followed by that kernel.
template <Activation A>
__device__ __forceinline__ float activateAs(float v) {
  return cuda::activate<A>(v);
}

__device__ __forceinline__ float activateBy(Activation a, float v) {
  switch (a) {
    case Activation::kGelu: return activateAs<Activation::kGelu>(v);
    case Activation::kGeluTanh: return activateAs<Activation::kGeluTanh>(v);
    case Activation::kRelu: return activateAs<Activation::kRelu>(v);
    default: return activateAs<Activation::kSilu>(v);
  }
}

template <typename T, QuantCode C, bool kW8A8, bool kScaleAfter, int kWarps, int kTiles,
          bool kGated = false>
__global__ void __launch_bounds__(kWarps * 32, kTiles > 1            ? 1
                                               : kWarps == kMmaWarps ? 3
                                                                     : 2)
    quantMmaGemvKernel(const uint8_t* __restrict__ x, const uint8_t* __restrict__ packed,
                       const float* __restrict__ scales, const uint8_t* __restrict__ zeros,
                       const float* __restrict__ xScale, T* __restrict__ y, int rows, int in,
                       int out, int groupSize, FastDivisor groupDiv, Activation act) {
  static_assert(!kGated || kTiles == 1);
  constexpr int kVec = kCodesPerVec<C>;  // codes of a lane's 16-byte vector
  constexpr int kStep = 4 * kVec;        // inputs of one step (the four lanes of a row)
  constexpr bool kTable = C == QuantCode::kNf4 || C == QuantCode::kFp4;
  __shared__ uint32_t lut[kTable ? 256 : 1];
  __shared__ float partial[kWarps][kMmaOuts][8 * kTiles];
  static_assert(!kW8A8 || kTiles == 1);
  if constexpr (kTable) {
    const float* table = C == QuantCode::kNf4 ? cNf4 : cFp4;
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
      lut[i] = floatsToPair<T>(table[i & 15], table[i >> 4]);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int o0 = blockIdx.x * (kGated ? kMmaOuts / 2 : kMmaOuts);
  const int nOut = kGated ? out / 2 : out;  // outputs
  const int steps = (in + kStep - 1) / kStep, groups = in / groupSize;
  const int64_t rowBytes = static_cast<int64_t>(in) * quantBits(C) / 8;
  // Rows of the lane's weight vectors (t = 0, 1: output o0 + 8t + g; gated: gate and up of output
  // o0 + g), clamped inside the matrix (the sums of outputs past the end are computed and dropped).
  constexpr int kPipe = kMmaPipe<C, kW8A8, kTiles>;
  // With one step loaded ahead, the rows' codes, scales and zero points are addressed once here
  // rather than on every step; two steps ahead (8-bit codes) have no registers for the pointers
  // (ptxas spills) and recompute the addresses from the rows.
  constexpr bool kHoist = kPipe == 1;
  int64_t wRow[2];
  const uint8_t* wBase[2];
  const float* sBase[2];
  const uint8_t* zBase[2];
  bool rowOk[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int o = kGated ? o0 + g : o0 + 8 * t + g;
    rowOk[t] = o < nOut;
    wRow[t] = static_cast<int64_t>(min(o, nOut - 1)) + (kGated && t == 1 ? nOut : 0);
    wBase[t] = packed + wRow[t] * rowBytes;
    sBase[t] = scales + wRow[t] * groups;
    zBase[t] = quantHasZeros(C) ? zeros + wRow[t] * groups : nullptr;
  }
  auto load = [&](int s, MmaStage& st) {
    const int k0 = s * kStep + c * kVec;
    const bool ok = s < steps && k0 < in;
    const int gr = static_cast<int>(fastDivide(static_cast<uint32_t>(min(k0, in - 1)), groupDiv));
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int64_t kb = static_cast<int64_t>(k0) * quantBits(C) / 8;
      st.w[t] =
          loadOrZero(kHoist ? wBase[t] + kb : packed + wRow[t] * rowBytes + kb, ok && rowOk[t]);
      if constexpr (!kW8A8)
        st.scale[t] = ok ? __ldg(kHoist ? sBase[t] + gr : scales + wRow[t] * groups + gr) : 0.0f;
      if constexpr (quantHasZeros(C))
        st.zero[t] = __ldg(kHoist ? zBase[t] + gr : zeros + wRow[t] * groups + gr);
    }
  };
  MmaStage cur[kPipe];
#pragma unroll
  for (int u = 0; u < kPipe; ++u) load(warp + u * kWarps, cur[u]);
  if constexpr (kTable) __syncthreads();
  cuda::waitForPrimary();
  cuda::allowDependents();
  // acc[n][e]: output o0 + g + 8 (e / 2), row 8n + 2c + e % 2 of x.
  float acc[kTiles][4] = {};
  for (int s0 = warp; s0 < steps; s0 += kPipe * kWarps) {
    MmaStage next[kPipe];
#pragma unroll
    for (int u = 0; u < kPipe; ++u) load(s0 + (u + kPipe) * kWarps, next[u]);
#pragma unroll
    for (int u = 0; u < kPipe; ++u) {
      const int s = s0 + u * kWarps;
      const int k0 = s * kStep + c * kVec;
      const bool kOk = s < steps && k0 < in;
      const MmaStage& st = cur[u];
      if constexpr (kW8A8) {
        const uint4 xv = loadOrZero(x + static_cast<int64_t>(g) * in + k0, g < rows && kOk);
        mmaE4m3(acc[0], st.w[0].x, st.w[1].x, st.w[0].y, st.w[1].y, xv.x, xv.y);
        mmaE4m3(acc[0], st.w[0].z, st.w[1].z, st.w[0].w, st.w[1].w, xv.z, xv.w);
      } else {
        // x's inputs of the vector (zero past `in` or past the batch: the weight there is not).
        constexpr int kXVecs = kVec * 2 / 16;
        uint32_t xw[kTiles][kXVecs * 4];
#pragma unroll
        for (int n = 0; n < kTiles; ++n) {
          const int r = 8 * n + g;
          uint4 v[kXVecs];
#pragma unroll
          for (int i = 0; i < kXVecs; ++i) v[i] = make_uint4(0, 0, 0, 0);
          if (r < rows && kOk) {  // one branch, one address for the vector's inputs
            const auto* xr = reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(x) +
                                                            static_cast<int64_t>(r) * in + k0);
#pragma unroll
            for (int i = 0; i < kXVecs; ++i) v[i] = xr[i];
          }
#pragma unroll
          for (int i = 0; i < kXVecs; ++i) {
            xw[n][4 * i] = v[i].x;
            xw[n][4 * i + 1] = v[i].y;
            xw[n][4 * i + 2] = v[i].z;
            xw[n][4 * i + 3] = v[i].w;
          }
        }
        Pair<T> zero[2], zeroHigh[2] = {};
        float zeroF[2] = {}, scaleF[2];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          if constexpr (quantHasZeros(C)) zeroF[t] = st.zero[t];
          scaleF[t] = kScaleAfter ? 1.0f : st.scale[t];
          const T z16 = cuda::Convert<T>::fromFloat(kMagicValue<T> + zeroF[t]);
          zero[t] = Pair<T>{z16, z16};
          if constexpr (C == QuantCode::kUint4 && std::is_same_v<T, __half>) {
            const T h16 = cuda::Convert<T>::fromFloat(-64.0f - zeroF[t]);
            zeroHigh[t] = Pair<T>{h16, h16};
          }
        }
        float sums[kTiles][4] = {};
        float(&dst)[kTiles][4] = kScaleAfter ? sums : acc;
        const uint32_t words[2][4] = {{st.w[0].x, st.w[0].y, st.w[0].z, st.w[0].w},
                                      {st.w[1].x, st.w[1].y, st.w[1].z, st.w[1].w}};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t w[2][kPairs<C>];
#pragma unroll
          for (int t = 0; t < 2; ++t)
            decodePairs<T, C, !kScaleAfter>(words[t][i], zero[t], zeroHigh[t], zeroF[t], scaleF[t],
                                            lut, w[t]);
#pragma unroll
          for (int n = 0; n < kTiles; ++n) {
            uint32_t xp[kPairs<C>];
            pairX<C>(xw[n] + (32 / quantBits(C) / 2) * i, xp);
#pragma unroll
            for (int h = 0; h < kPairs<C> / 2; ++h)
              mmaK16<T>(dst[n], w[0][2 * h], w[1][2 * h], w[0][2 * h + 1], w[1][2 * h + 1],
                        xp[2 * h], xp[2 * h + 1]);
          }
        }
        if constexpr (kScaleAfter) {
#pragma unroll
          for (int n = 0; n < kTiles; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[n][e] = fmaf(sums[n][e], st.scale[e / 2], acc[n][e]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kPipe; ++u) cur[u] = next[u];
  }
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[warp][g + 8 * (e / 2)][8 * n + 2 * c + e % 2] = acc[n][e];
  __syncthreads();
  using Cv = cuda::Convert<T>;
  if constexpr (kGated) {
    for (int idx = threadIdx.x; idx < kMmaOuts / 2 * 8; idx += kWarps * 32) {
      const int oi = idx / 8, r = idx % 8, o = o0 + oi;
      if (r >= rows || o >= nOut) continue;
      float gate = 0.0f, up = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        gate += partial[w][oi][r];
        up += partial[w][oi + 8][r];
      }
      if constexpr (kW8A8) {
        gate *= *xScale * scales[o];
        up *= *xScale * scales[nOut + o];
      }
      gate = Cv::toFloat(Cv::fromFloat(gate));
      up = Cv::toFloat(Cv::fromFloat(up));
      y[static_cast<int64_t>(r) * nOut + o] =
          Cv::fromFloat(cuda::roundTo<T>(activateBy(act, gate)) * up);
    }
  } else {
    for (int idx = threadIdx.x; idx < kMmaOuts * 8 * kTiles; idx += kWarps * 32) {
      const int oi = idx / (8 * kTiles), r = idx % (8 * kTiles), o = o0 + oi;
      if (r >= rows || o >= out) continue;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += partial[w][oi][r];
      if constexpr (kW8A8) sum *= *xScale * scales[o];
      y[static_cast<int64_t>(r) * out + o] = Cv::fromFloat(sum);
    }
  }
}

// 9 to 64 rows of 16-bit x: the GEMV's per-lane decoding, fed through shared memory. A block of 8
// warps covers 16 * kMT outputs; its warps are kMT m16 tiles of outputs times kKS = 8 / kMT parts
// of every k chunk (kKS steps of the GEMV). Each chunk's x rows (shared by all warps: read from L2
// once per block, not once per warp and 16 outputs) and every warp's weight vectors, scales and
// zero points go into a ring of kStages shared-memory stages with cp.async, kStages - 1 chunks
// ahead of the one being decoded, so that neither x nor the weights' memory latency sits between
// two chunks. Each warp decodes its vectors as the GEMV does and runs kTiles n8 tiles of x on each
// decoded fragment; the kKS parts' sums are added through shared memory at the end.
constexpr int kTileWarps = 8;

// Where 16-byte chunk q of row r of x sits in its shared row: XOR-swizzled so that the eight lanes
// of a quarter warp (rows g = 0, 1; c = 0..3) read eight different bank groups.
template <QuantCode C>
__device__ __forceinline__ int xChunkSlot(int q, int r) {
  if constexpr (quantBits(C) == 4)
    return q ^ (((q >> 3) & 1) | ((r & 1) << 1));  // lane c's chunks are 4 apart
  else
    return q ^ (r & 1);  // lane c's chunks are 2 apart
}

// One ring stage, in 16-byte units: x [8 * kTiles rows][kKS steps], the warps' weight vectors
// [warp][t][lane], their scales [warp][t][lane] and the words holding their zero points
// [warp][t][lane] (a lane's vector has its own group when groups are shorter than a step).
template <QuantCode C, int kMT, int kTiles>
struct TileStage {
  static constexpr int kKS = kTileWarps / kMT, kStep = 4 * kCodesPerVec<C>;
  static constexpr int kRows = 8 * kTiles, kRowChunks = kKS * kStep / 8;
  static constexpr int kX = kRows * kRowChunks, kW = kTileWarps * 2 * 32;
  static constexpr int kScales = kTileWarps * 64 / 4, kZeros = kTileWarps * 64 / 4;
  static constexpr int kChunks = kX + kW + kScales + kZeros;
  static constexpr size_t kBytes = size_t{kChunks} * 16;
  // As many stages (2 to 4) as fit 110 KB; the epilogue's sums reuse the ring.
  static constexpr size_t kBudget = 110 * 1024;  // two blocks to a multiprocessor
  static constexpr int kStages = kBytes * 4 <= kBudget ? 4 : kBytes * 3 <= kBudget ? 3 : 2;
  static constexpr size_t kRed = size_t{kTileWarps} * kMmaOuts * kRows * sizeof(float);
  static constexpr size_t kSmem = kBytes * kStages > kRed ? kBytes* kStages : kRed;
};

template <typename T, QuantCode C, bool kScaleAfter, int kMT, int kTiles>
__global__ void __launch_bounds__(kTileWarps * 32, 2)
    quantMmaTileKernel(const T* __restrict__ x, const uint8_t* __restrict__ packed,
                       const float* __restrict__ scales, const uint8_t* __restrict__ zeros,
                       T* __restrict__ y, int rows, int in, int out, int groupSize,
                       FastDivisor groupDiv) {
  using S = TileStage<C, kMT, kTiles>;
  constexpr int kVec = kCodesPerVec<C>, kStep = S::kStep, kKS = S::kKS, kRows = S::kRows;
  constexpr int kXVecs = kVec / 8;  // x's 16-byte chunks of a lane's vector
  constexpr bool kTable = C == QuantCode::kNf4 || C == QuantCode::kFp4;
  extern __shared__ uint4 ring[];
  __shared__ uint32_t lut[kTable ? 256 : 1];
  if constexpr (kTable) {
    const float* table = C == QuantCode::kNf4 ? cNf4 : cFp4;
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
      lut[i] = floatsToPair<T>(table[i & 15], table[i >> 4]);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int mt = warp % kMT, kp = warp / kMT;
  const int o0 = (blockIdx.x * kMT + mt) * kMmaOuts;
  const int steps = (in + kStep - 1) / kStep, groups = in / groupSize;
  const int iters = (steps + kKS - 1) / kKS;
  const int64_t rowBytes = static_cast<int64_t>(in) * quantBits(C) / 8;
  int64_t wRow[2];
  bool rowOk[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int o = o0 + 8 * t + g;
    rowOk[t] = o < out;
    wRow[t] = static_cast<int64_t>(min(o, out - 1));
  }
  auto slot = [&](int it) { return ring + (it % S::kStages) * S::kChunks; };
  // The warp's weight vectors, scales and zero-point words of chunk it.
  auto produceWeights = [&](int it) {
    uint4* st = slot(it);
    const int s = it * kKS + kp, k0 = s * kStep + c * kVec;
    const bool ok = s < steps && k0 < in;
    const int gr = static_cast<int>(fastDivide(static_cast<uint32_t>(min(k0, in - 1)), groupDiv));
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      cpAsync16(st + S::kX + (warp * 2 + t) * 32 + lane,
                packed + wRow[t] * rowBytes + static_cast<int64_t>(k0) * quantBits(C) / 8,
                ok && rowOk[t]);
      // With groups of whole steps the four lanes of a row share them: lane c == 0 loads.
      if (!kScaleAfter || c == 0) {
        auto* sc = reinterpret_cast<float*>(st + S::kX + S::kW);
        cpAsync4(sc + (warp * 2 + t) * 32 + lane, scales + wRow[t] * groups + gr, ok);
      }
      if (quantHasZeros(C) && (!kScaleAfter || c == 0)) {
        // The aligned word holding the zero point. It starts inside the zeros' [out, groups]
        // bytes; where it would run past their end (their last 1-3 bytes, when out * groups is
        // not a multiple of 4), the byte alone is stored at its place in the word instead.
        const uint8_t* zp = zeros + wRow[t] * groups + gr;
        const auto a = reinterpret_cast<uintptr_t>(zp);
        const uintptr_t word = a & ~uintptr_t{3};
        auto* zw = reinterpret_cast<uint32_t*>(st + S::kX + S::kW + S::kScales);
        uint32_t* dst = zw + (warp * 2 + t) * 32 + lane;
        if (word + 4 <= reinterpret_cast<uintptr_t>(zeros + static_cast<int64_t>(out) * groups))
          cpAsync4(dst, reinterpret_cast<const void*>(word), true);
        else
          *dst = static_cast<uint32_t>(*zp) << (8 * (a & 3));
      }
    }
  };
  // Chunk it of x (rows past `rows` and inputs past `in` read as zeros).
  auto produceX = [&](int it) {
    uint4* st = slot(it);
    const int kBase = it * kKS * kStep;
    for (int idx = threadIdx.x; idx < S::kX; idx += kTileWarps * 32) {
      const int r = idx / S::kRowChunks, q = idx % S::kRowChunks, k = kBase + 8 * q;
      const bool ok = r < rows && k < in;
      cpAsync16(st + r * S::kRowChunks + xChunkSlot<C>(q, r),
                ok ? x + static_cast<int64_t>(r) * in + k : x, ok);
    }
  };
  // The weights do not depend on the kernel before (programmatic dependent launch): the first
  // chunks' weights are requested before waiting for it, their x after.
#pragma unroll
  for (int it = 0; it < S::kStages - 1; ++it)
    if (it < iters) produceWeights(it);
  cuda::waitForPrimary();
  cuda::allowDependents();
#pragma unroll
  for (int it = 0; it < S::kStages - 1; ++it) {
    if (it < iters) produceX(it);
    cpAsyncCommit();
  }
  float acc[kTiles][4] = {};
  for (int it = 0; it < iters; ++it) {
    cpAsyncWait<S::kStages - 2>();
    __syncthreads();  // chunk it is in; every warp is done with chunk it - 1's stage
    if (it + S::kStages - 1 < iters) {
      produceWeights(it + S::kStages - 1);
      produceX(it + S::kStages - 1);
    }
    cpAsyncCommit();
    const uint4* st = slot(it);
    const auto* sc = reinterpret_cast<const float*>(st + S::kX + S::kW);
    const int s = it * kKS + kp, k0 = s * kStep + c * kVec;
    const int gr = static_cast<int>(fastDivide(static_cast<uint32_t>(min(k0, in - 1)), groupDiv));
    Pair<T> zero[2], zeroHigh[2] = {};
    float zeroF[2] = {}, scaleAfter[2], scaleF[2];
    uint32_t words[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint4 w = st[S::kX + (warp * 2 + t) * 32 + lane];
      words[t][0] = w.x;
      words[t][1] = w.y;
      words[t][2] = w.z;
      words[t][3] = w.w;
      const int slotLane = kScaleAfter ? lane & ~3 : lane;  // whose scale and zero point
      scaleAfter[t] = sc[(warp * 2 + t) * 32 + slotLane];
      if constexpr (quantHasZeros(C)) {
        const auto* zw = reinterpret_cast<const uint32_t*>(st + S::kX + S::kW + S::kScales);
        const auto a = reinterpret_cast<uintptr_t>(zeros + wRow[t] * groups + gr);
        zeroF[t] =
            static_cast<float>((zw[(warp * 2 + t) * 32 + slotLane] >> (8 * (a & 3))) & 0xFFu);
      }
      scaleF[t] = kScaleAfter ? 1.0f : scaleAfter[t];
      const T z16 = cuda::Convert<T>::fromFloat(kMagicValue<T> + zeroF[t]);
      zero[t] = Pair<T>{z16, z16};
      if constexpr (C == QuantCode::kUint4 && std::is_same_v<T, __half>) {
        const T h16 = cuda::Convert<T>::fromFloat(-64.0f - zeroF[t]);
        zeroHigh[t] = Pair<T>{h16, h16};
      }
    }
    float sums[kTiles][4] = {};
    float(&dst)[kTiles][4] = kScaleAfter ? sums : acc;
    constexpr int kWordsPerChunk = 4 / kXVecs;  // weight words whose inputs one x chunk holds
#pragma unroll
    for (int v = 0; v < kXVecs; ++v) {
      uint32_t xv[kTiles][4];
#pragma unroll
      for (int n = 0; n < kTiles; ++n) {
        const int r = 8 * n + g;
        const uint4 u = st[r * S::kRowChunks + xChunkSlot<C>(kp * (kStep / 8) + c * kXVecs + v, r)];
        xv[n][0] = u.x;
        xv[n][1] = u.y;
        xv[n][2] = u.z;
        xv[n][3] = u.w;
      }
#pragma unroll
      for (int iw = 0; iw < kWordsPerChunk; ++iw) {
        const int i = v * kWordsPerChunk + iw;
        uint32_t w[2][kPairs<C>];
#pragma unroll
        for (int t = 0; t < 2; ++t)
          decodePairs<T, C, !kScaleAfter>(words[t][i], zero[t], zeroHigh[t], zeroF[t], scaleF[t],
                                          lut, w[t]);
#pragma unroll
        for (int n = 0; n < kTiles; ++n) {
          uint32_t xp[kPairs<C>];
          pairX<C>(xv[n] + (32 / quantBits(C) / 2) * iw, xp);
#pragma unroll
          for (int h = 0; h < kPairs<C> / 2; ++h)
            mmaK16<T>(dst[n], w[0][2 * h], w[1][2 * h], w[0][2 * h + 1], w[1][2 * h + 1], xp[2 * h],
                      xp[2 * h + 1]);
        }
      }
    }
    if constexpr (kScaleAfter) {
#pragma unroll
      for (int n = 0; n < kTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = fmaf(sums[n][e], scaleAfter[e / 2], acc[n][e]);
    }
  }
  cpAsyncWait<0>();
  __syncthreads();  // the ring is idle: the kKS parts' sums go through it
  auto* red = reinterpret_cast<float*>(ring);  // [kp][mt * 16 + output][row]
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      red[(kp * kMT * kMmaOuts + mt * kMmaOuts + g + 8 * (e / 2)) * kRows + 8 * n + 2 * c + e % 2] =
          acc[n][e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < kMT * kMmaOuts * kRows; idx += kTileWarps * 32) {
    const int oi = idx / kRows, r = idx % kRows, o = blockIdx.x * kMT * kMmaOuts + oi;
    if (r >= rows || o >= out) continue;
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kKS; ++p) sum += red[(p * kMT * kMmaOuts + oi) * kRows + r];
    y[static_cast<int64_t>(r) * out + o] = cuda::Convert<T>::fromFloat(sum);
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

// Prefill-sized fp8 activations of 16-bit x, eight values a thread: kAbsmaxParts blocks each
// write the absmax of their share to partials[block] (no atomics, so no memset of a counter
// between the kernels), then every block of fp8ActVecKernel takes the max of the partials and
// quantizes its share. The same scale and codes as absmaxKernel + fp8ActKernel (a maximum does
// not depend on its order), at about the bandwidth of the bytes moved: those two took 9 and 22 µs
// a linear layer of a 512-token Llama-2-7B prefill on an H100.
constexpr int kAbsmaxParts = 256;

__device__ __forceinline__ float blockMax(float m) {
  __shared__ float warpMax[32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warpMax[threadIdx.x / 32] = m;
  __syncthreads();
  // Every warp reduces the warps' maxima, so every thread gets the block's.
  m = threadIdx.x % 32 < blockDim.x / 32 ? warpMax[threadIdx.x % 32] : 0.0f;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

template <typename T>
__global__ void __launch_bounds__(256)
    absmaxPartsKernel(const T* __restrict__ x, int64_t vecs, float* __restrict__ partials) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  float m = 0.0f;
#pragma unroll 4
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float f[8];
    toFloats8<T>(__ldg(reinterpret_cast<const uint4*>(x) + i), f);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(f[k]));
  }
  m = blockMax(m);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

template <typename T, typename OutT>
__global__ void __launch_bounds__(256)
    fp8ActVecKernel(const T* __restrict__ x, int64_t vecs, const float* inputScale,
                    const float* __restrict__ partials, OutT* __restrict__ xq, float* scaleOut) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  float s;
  if (inputScale) {
    s = *inputScale;
  } else {
    const float m = blockMax(threadIdx.x < kAbsmaxParts ? partials[threadIdx.x] : 0.0f);
    s = m > 0.0f ? m / 448.0f : 1.0f;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && scaleOut) *scaleOut = s;
#pragma unroll 4
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float f[8];
    toFloats8<T>(__ldg(reinterpret_cast<const uint4*>(x) + i), f);
    cuda::Vec<OutT, 8> v;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint8_t q = toE4m3(f[k] / s);
      if constexpr (std::is_same_v<OutT, uint8_t>)
        v.v[k] = q;
      else
        v.v[k] = cuda::Convert<OutT>::fromFloat(fromE4m3(q) * s);
    }
    reinterpret_cast<cuda::Vec<OutT, 8>*>(xq)[i] = v;
  }
}

// fp8 activations of a decode-sized batch in one block: the absmax, then x' = e4m3(x / s) * s as
// float32, or the codes themselves with s at *scaleOut (OutT uint8_t); one launch where the
// general path takes three.
template <typename T, typename OutT>
__global__ void __launch_bounds__(1024)
    fp8SmallActKernel(const T* __restrict__ x, int n, const float* inputScale,
                      OutT* __restrict__ xq, float* scaleOut) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  __shared__ float warpMax[32];
  // 16-byte loads (eight 16-bit values) where the layout allows: every load of a thread in flight
  // at once, not one latency per element.
  constexpr bool k16Bit = sizeof(T) == 2;
  const bool vec = k16Bit && n % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                   reinterpret_cast<uintptr_t>(xq) % sizeof(cuda::Vec<OutT, 8>) == 0;
  const int nv = vec ? n / 8 : 0;
  auto load8 = [&](int i, float(&f)[8]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x) + i);
    if constexpr (k16Bit) toFloats8<std::conditional_t<k16Bit, T, __half>>(v, f);
  };
  float s;
  if (inputScale) {
    s = *inputScale;
  } else {
    float m = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      float f[8];
      load8(i, f);
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(f[k]));
    }
    for (int i = 8 * nv + threadIdx.x; i < n; i += blockDim.x)
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
  if constexpr (std::is_same_v<OutT, uint8_t>)
    if (threadIdx.x == 0) *scaleOut = s;
  auto quantize = [&](float v) {
    if constexpr (std::is_same_v<OutT, uint8_t>)
      return toE4m3(v / s);
    else
      return cuda::Convert<OutT>::fromFloat(fromE4m3(toE4m3(v / s)) * s);
  };
#pragma unroll 4
  for (int i = threadIdx.x; i < nv; i += blockDim.x) {
    float f[8];
    load8(i, f);
    cuda::Vec<OutT, 8> v;
#pragma unroll
    for (int k = 0; k < 8; ++k) v.v[k] = quantize(f[k]);
    reinterpret_cast<cuda::Vec<OutT, 8>*>(xq)[i] = v;
  }
  for (int i = 8 * nv + threadIdx.x; i < n; i += blockDim.x)
    xq[i] = quantize(cuda::Convert<T>::toFloat(x[i]));
}

// xg[r, j] = x[r, perm[j]]: x in the columns' order, for the tensor-core GEMV.
template <typename T>
__global__ void permuteColumnsKernel(const T* __restrict__ x, const int32_t* __restrict__ perm,
                                     int64_t rows, int64_t in, T* __restrict__ xg) {
  cuda::waitForPrimary();
  cuda::allowDependents();
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < rows * in;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    xg[t] = x[t - t % in + perm[t % in]];
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

// The device's compute capability (major * 10 + minor); a process drives one device.
int deviceArch() {
  static const int arch = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return 0;
    return major * 10 + minor;
  }();
  return arch;
}

enum class MmaPath { kNo, k16Bit, kW8A8 };

// The tensor-core GEMV: 16-bit x with any code (act-order x is permuted first), or fp8 W8A8 with
// one scale per output on sm_89 and later.
// TEXTGEN_QUANT_PATH=dense: every quantized GEMM dequantizes and runs cuBLASLt (a debugging
// switch, to tell a faulty GEMV or tensor-core path from the rest of a model).
bool denseOnly() {
  static const bool dense = [] {
    const char* v = std::getenv("TEXTGEN_QUANT_PATH");
    return v && std::string_view(v) == "dense";
  }();
  return dense;
}

MmaPath mmaPathOf(const QuantGemmParams& p) {
  if (denseOnly()) return MmaPath::kNo;
  const int n = quantBits(p.w.code) == 4 ? 32 : 16;
  if (p.dtype == DType::kF32 || p.rows > kMaxQuantMmaRows || p.in % n != 0 ||
      p.w.groupSize % n != 0 || !cuda::aligned16(p.w.packed) || p.in >= (int64_t{1} << 30) ||
      p.out >= (int64_t{1} << 30))
    return MmaPath::kNo;
  if (p.w.act == ActQuant::kNone) return cuda::aligned16(p.x) ? MmaPath::k16Bit : MmaPath::kNo;
  if (p.w.act == ActQuant::kFp8 && p.w.code == QuantCode::kFp8E4M3 && p.w.groupSize == p.in &&
      !p.w.perm && p.rows <= kMaxQuantGemvRows && deviceArch() >= 89)
    return MmaPath::kW8A8;
  return MmaPath::kNo;
}

bool gemvTakes(const QuantGemmParams& p) {
  if (denseOnly()) return false;
  const int n = quantBits(p.w.code) == 4 ? 32 : 16;
  // fp8 with one tensor scale: cuBLASLt's FP8 GEMM from 3 rows on (bench_cuda_model: it decodes 32
  // rows in less time than the GEMV takes for 8).
  const int64_t maxRows = fp8GemmTakes(p) ? 2 : kMaxQuantGemvRows;
  return p.dtype != DType::kF32 && p.rows <= maxRows && p.in % n == 0 && p.w.groupSize % n == 0 &&
         cuda::aligned16(p.w.packed) && (p.w.act != ActQuant::kNone || cuda::aligned16(p.x)) &&
         p.in < (int64_t{1} << 30) && p.out < (int64_t{1} << 31);
}

bool fp8GemmTakes(const QuantGemmParams& p) {
  return !denseOnly() && p.w.code == QuantCode::kFp8E4M3 && p.w.act == ActQuant::kFp8 &&
         p.w.tensorScale && !p.w.perm && p.dtype != DType::kF32 && p.in % 16 == 0 &&
         p.out % 16 == 0 && cuda::aligned16(p.w.packed);
}

Layout layoutOf(const QuantGemmParams& p) {
  Layout l;
  const size_t n = static_cast<size_t>(p.rows * p.in), es = dtypeSize(p.dtype);
  l.scalars = 256 + kAbsmaxParts * sizeof(float);  // scalars, then absmaxPartsKernel's partials
  if (p.w.act == ActQuant::kLlmInt8) l.flags = alignUp(static_cast<size_t>(p.in));
  const MmaPath mma = mmaPathOf(p);
  if (mma == MmaPath::kW8A8) {
    l.xq = alignUp(n);
  } else if (mma == MmaPath::k16Bit) {
    if (p.w.perm) l.xq = alignUp(n * es);
  } else if (gemvTakes(p)) {
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
    if constexpr (std::is_same_v<OutT, float> || std::is_same_v<OutT, uint8_t>) {
      if (n <= (int64_t{1} << 17))
        return cuda::launch("fp8 activations", fp8SmallActKernel<T, OutT>, 1, 1024, 0, stream, x,
                            static_cast<int>(n), p.w.inputScale, xq,
                            std::is_same_v<OutT, uint8_t> ? scalars + 4 : nullptr);
    }
    constexpr bool k16Bit = sizeof(T) == 2;
    if (k16Bit && n % 8 == 0 && cuda::aligned16(x) &&
        reinterpret_cast<uintptr_t>(xq) % sizeof(cuda::Vec<OutT, 8>) == 0) {
      float* partials = scalars + 64;  // past the 256 bytes of scalars
      const int64_t vecs = n / 8;
      if constexpr (k16Bit) {
        if (!p.w.inputScale)
          TG_RETURN_IF_ERROR(cuda::launch("fp8 absmax", absmaxPartsKernel<T>, kAbsmaxParts, 256, 0,
                                          stream, x, vecs, partials));
        return cuda::launch("fp8 activations", fp8ActVecKernel<T, OutT>,
                            static_cast<unsigned>(std::min<int64_t>((vecs + 255) / 256, 1056)), 256,
                            0, stream, x, vecs, p.w.inputScale, static_cast<const float*>(partials),
                            xq, std::is_same_v<OutT, uint8_t> ? scalars + 4 : nullptr);
      }
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

// gated: [gate; up] stacked, act(gate) * up (kTiles 1 only).
template <typename T, int kWarps, int kTiles, bool kGated = false>
Status mmaGemvWith(const QuantGemmParams& p, const uint8_t* x, const float* xScale, bool w8a8,
                   cudaStream_t stream, Activation act = Activation::kSilu) {
  const int64_t outputs = kGated ? p.out / 2 : p.out;
  constexpr int kPerBlock = kGated ? kMmaOuts / 2 : kMmaOuts;
  const dim3 grid(static_cast<unsigned>((outputs + kPerBlock - 1) / kPerBlock));
  const auto* packed = static_cast<const uint8_t*>(p.w.packed);
  auto* y = static_cast<T*>(p.y);
  const int rows = static_cast<int>(p.rows), in = static_cast<int>(p.in),
            out = static_cast<int>(p.out), gs = static_cast<int>(p.w.groupSize);
  const FastDivisor groupDiv = makeFastDivisor(static_cast<uint32_t>(gs));
#define TG_MMA(C, W8A8, AFTER)                                                                   \
  return cuda::launch(kGated ? "quant mma gemv (gated)" : "quant mma gemv",                      \
                      quantMmaGemvKernel<T, C, W8A8, AFTER, kWarps, kTiles, kGated>, grid,       \
                      kWarps * 32, 0, stream, x, packed, p.w.scales, p.w.zeros, xScale, y, rows, \
                      in, out, gs, groupDiv, act)
  if constexpr (kTiles == 1)
    if (w8a8) TG_MMA(QuantCode::kFp8E4M3, true, false);
  // Integer codes whose groups hold whole steps (4 vectors) scale the fp32 sums.
  const bool after = p.w.groupSize % (4 * (quantBits(p.w.code) == 4 ? 32 : 16)) == 0;
  switch (p.w.code) {
    case QuantCode::kUint4:
      if (after) TG_MMA(QuantCode::kUint4, false, true);
      TG_MMA(QuantCode::kUint4, false, false);
    case QuantCode::kUint8:
      if (after) TG_MMA(QuantCode::kUint8, false, true);
      TG_MMA(QuantCode::kUint8, false, false);
    case QuantCode::kNf4: TG_MMA(QuantCode::kNf4, false, false);
    case QuantCode::kFp4: TG_MMA(QuantCode::kFp4, false, false);
    case QuantCode::kFp8E4M3: TG_MMA(QuantCode::kFp8E4M3, false, false);
  }
#undef TG_MMA
  return invalidArgumentError("quant gemm: unknown code");
}

// The device's multiprocessors (a process drives one device).
int deviceSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 0;
    return n;
  }();
  return sms;
}

template <typename T, QuantCode C, bool kAfter, int kMT, int kTiles>
Status tileWith(const QuantGemmParams& p, const T* x, cudaStream_t stream) {
  constexpr auto kernel = quantMmaTileKernel<T, C, kAfter, kMT, kTiles>;
  constexpr size_t smem = TileStage<C, kMT, kTiles>::kSmem;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess)
    return internalError(
        std::string("quant gemm: ") + std::to_string(smem) +
        " bytes of shared memory for the tile kernel: " + cudaGetErrorString(attr));
  const dim3 grid(static_cast<unsigned>((p.out + kMT * kMmaOuts - 1) / (kMT * kMmaOuts)));
  return cuda::launch("quant mma tile", kernel, grid, kTileWarps * 32, smem, stream, x,
                      static_cast<const uint8_t*>(p.w.packed), p.w.scales, p.w.zeros,
                      static_cast<T*>(p.y), static_cast<int>(p.rows), static_cast<int>(p.in),
                      static_cast<int>(p.out), static_cast<int>(p.w.groupSize),
                      makeFastDivisor(static_cast<uint32_t>(p.w.groupSize)));
}

// The tile kernel's instances: 4-bit codes at every size it takes, 8-bit codes past 32 rows (up
// to 32 the GEMV's n8 tiles are faster for them).
template <QuantCode C, int kTiles>
constexpr bool kTileTakes = quantBits(C) == 4 || kTiles == 8;

template <typename T, int kMT, int kTiles, QuantCode C>
Status tileWithCode(const QuantGemmParams& p, const T* x, bool after, cudaStream_t stream) {
  if constexpr (!kTileTakes<C, kTiles>) {
    return internalError("quant gemm: no tile kernel for this code and row count");
  } else if constexpr (C == QuantCode::kUint4 || C == QuantCode::kUint8) {
    return after ? tileWith<T, C, true, kMT, kTiles>(p, x, stream)
                 : tileWith<T, C, false, kMT, kTiles>(p, x, stream);
  } else {
    return tileWith<T, C, false, kMT, kTiles>(p, x, stream);
  }
}

template <typename T, int kMT, int kTiles>
Status tileByCode(const QuantGemmParams& p, const T* x, cudaStream_t stream) {
  const bool after = p.w.groupSize % (4 * (quantBits(p.w.code) == 4 ? 32 : 16)) == 0;
  switch (p.w.code) {
    case QuantCode::kUint4:
      return tileWithCode<T, kMT, kTiles, QuantCode::kUint4>(p, x, after, stream);
    case QuantCode::kUint8:
      return tileWithCode<T, kMT, kTiles, QuantCode::kUint8>(p, x, after, stream);
    case QuantCode::kNf4: return tileWithCode<T, kMT, kTiles, QuantCode::kNf4>(p, x, after, stream);
    case QuantCode::kFp4: return tileWithCode<T, kMT, kTiles, QuantCode::kFp4>(p, x, after, stream);
    case QuantCode::kFp8E4M3:
      return tileWithCode<T, kMT, kTiles, QuantCode::kFp8E4M3>(p, x, after, stream);
  }
  return invalidArgumentError("quant gemm: unknown code");
}

template <typename T, int kTiles>
Status tileByShape(const QuantGemmParams& p, const T* x, cudaStream_t stream) {
  // Blocks of 64 outputs while they still give every multiprocessor one; else 32 (Llama's
  // 4096-output o and down projections).
  if ((p.out + 63) / 64 >= deviceSms()) return tileByCode<T, 4, kTiles>(p, x, stream);
  return tileByCode<T, 2, kTiles>(p, x, stream);
}

// gated: y = act(gate) * up of [gate; up] stacked (up to 8 rows; quantGemmGatedTakes).
template <typename T>
Status mmaGemv(const QuantGemmParams& p, const uint8_t* x, const float* xScale, bool w8a8,
               cudaStream_t stream, const Activation* gated = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    return internalError("quant gemm: the tensor-core GEMV takes 16-bit dtypes");
  } else {
    // Blocks of 8 warps run 3 to a multiprocessor; fewer tiles than 2 per multiprocessor leave
    // it a third idle, so their blocks take 12 warps (2 to a multiprocessor).
    const int64_t tiles = (p.out + kMmaOuts - 1) / kMmaOuts;
    const bool few = tiles <= 2 * static_cast<int64_t>(deviceSms());
    if (gated) {
      if (p.rows > 8) return internalError("quant gemm (gated): more than 8 rows");
      return few ? mmaGemvWith<T, kMmaWarpsFew, 1, true>(p, x, xScale, w8a8, stream, *gated)
                 : mmaGemvWith<T, kMmaWarps, 1, true>(p, x, xScale, w8a8, stream, *gated);
    }
    if (w8a8 || p.rows <= 8)
      return few ? mmaGemvWith<T, kMmaWarpsFew, 1>(p, x, xScale, w8a8, stream)
                 : mmaGemvWith<T, kMmaWarps, 1>(p, x, xScale, w8a8, stream);
    // Past 8 rows, by the time per decode step of Llama-2-7B's layers (bench_quant_gemm, H100):
    // the tile kernel (x through shared memory) for 4-bit codes past 16 rows, nf4/fp4 past 8 and
    // every code past 32; the GEMV's 2 or 4 n8 tiles (x through L1) otherwise.
    const auto* xt = reinterpret_cast<const T*>(x);
    const bool table = p.w.code == QuantCode::kNf4 || p.w.code == QuantCode::kFp4;
    if (p.rows > 32) return tileByShape<T, 8>(p, xt, stream);
    if (p.rows > 16)
      return quantBits(p.w.code) == 4 ? tileByShape<T, 4>(p, xt, stream)
             : few                    ? mmaGemvWith<T, kMmaWarpsFew, 4>(p, x, xScale, false, stream)
                                      : mmaGemvWith<T, kMmaWarps, 4>(p, x, xScale, false, stream);
    return table ? tileByShape<T, 2>(p, xt, stream)
           : few ? mmaGemvWith<T, kMmaWarpsFew, 2>(p, x, xScale, false, stream)
                 : mmaGemvWith<T, kMmaWarps, 2>(p, x, xScale, false, stream);
  }
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

// gated (quantGemmGatedTakes): the tensor-core GEMV with the gated activation in its epilogue.
template <typename T>
Status run(const QuantGemmParams& p, char* ws, const QuantGemmCallbacks& gemm, cudaStream_t stream,
           const Activation* gated = nullptr) {
  const Layout l = layoutOf(p);
  char* xqBytes = ws + l.scalars + l.flags;
  const MmaPath mma = mmaPathOf(p);
  if (gated && (mma == MmaPath::kNo || p.rows > 8))
    return internalError("quant gemm (gated): not a tensor-core GEMV's shape");
  if (mma == MmaPath::kW8A8) {
    auto* xq = reinterpret_cast<uint8_t*>(xqBytes);
    TG_RETURN_IF_ERROR((activations<T, uint8_t>(p, ws, l, xq, stream)));
    return mmaGemv<T>(p, xq, reinterpret_cast<const float*>(ws) + 4, true, stream, gated);
  }
  if (mma == MmaPath::k16Bit) {
    const auto* x = static_cast<const uint8_t*>(p.x);
    if (p.w.perm) {
      auto* xg = reinterpret_cast<T*>(xqBytes);
      TG_RETURN_IF_ERROR(cuda::launch("permute x", permuteColumnsKernel<T>,
                                      blocksFor(p.rows * p.in, 256), 256, 0, stream,
                                      static_cast<const T*>(p.x), p.w.perm, p.rows, p.in, xg));
      x = reinterpret_cast<const uint8_t*>(xg);
    }
    return mmaGemv<T>(p, x, nullptr, false, stream, gated);
  }
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
  return gemm.dense({x, dense, p.y, p.rows, p.in, p.out, p.dtype, /*weightsFromPrimary=*/true});
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

bool quantGemmGatedTakes(const QuantGemmParams& p) {
  return p.rows >= 1 && p.rows <= 8 && p.out % 2 == 0 && mmaPathOf(p) != MmaPath::kNo;
}

Status invokeQuantGemmGatedWith(const QuantGemmParams& p, Activation a, void* workspace,
                                size_t workspaceBytes, const QuantGemmCallbacks& gemm,
                                Stream stream) {
  TG_RETURN_IF_ERROR(validateQuantGemm(p));
  if (p.rows == 0) return okStatus();
  if (!quantGemmGatedTakes(p))
    return invalidArgumentError(
        "quant gemm (gated): 1 to 8 rows, an even number of outputs, a tensor-core GEMV's layout");
  if (workspaceBytes < quantGemmWorkspaceBytes(p))
    return internalError("quant gemm: the workspace is too small");
  auto* ws = static_cast<char*>(workspace);
  const Activation* gated = &a;
  TG_DISPATCH_DTYPE(p.dtype, run, p, ws, gemm, stream, gated);
}

}  // namespace textgen::kernels
