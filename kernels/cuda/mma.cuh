// Warp-level tensor-core and asynchronous-copy primitives (sm_80 on): mma.sync m16n8k16 with fp32
// accumulation, ldmatrix, and cp.async with its groups. Fragment layouts are PTX's: for
// m16n8k16, with g = lane / 4 and t = lane % 4, A's registers hold (row g, k 2t..2t+1),
// (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..); B's (k 2t..2t+1, n g), (k 2t + 8.., n g); C's
// (row g, n 2t..2t+1) and (row g + 8, n 2t..2t+1). The lower 16 bits of a register hold the
// element of lower index.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace textgen::kernels::cuda {

// d += A · B, m16n8k16, fp32 accumulation, T = __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mmaK16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats rounded to T and packed into one register (the first in the lower half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&r, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &h, 4);
  }
  return r;
}

// The transpose of an 8x8 matrix of 16-bit elements held one register a lane (row lane / 4,
// columns 2 (lane % 4)..+1): each lane gets its row of the transpose, that is, column lane / 4 of
// the matrix at rows 2 (lane % 4)..+1 (sm_75 on).
__device__ __forceinline__ uint32_t movmatrixTrans(uint32_t a) {
  uint32_t r;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(a));
  return r;
}

// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i+7 give the addresses of
// matrix i's rows; register i holds matrix i (row lane / 4, columns 2 (lane % 4)..+1), or with
// Trans its transpose (row 2 (lane % 4)..+1 of the stored matrix, column lane / 4).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], const void* smemRow) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smemRow));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

// 16 bytes global -> shared, asynchronously; zeros where !ok (nothing is read then).
__device__ __forceinline__ void cpAsync16(void* smem, const void* gmem, bool ok) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cpAsync4(void* smem, const void* gmem, bool ok) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
               "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace textgen::kernels::cuda
