// pagewise: the tensor-core building blocks the attention kernels share: mma.sync m16n8k16
// (bf16 or f16 in, f32 accumulate), ldmatrix loads of 8x8 tiles from shared memory, and the
// packing of two floats into one 16-bit pair register.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4], uint32_t b0,
                                                  uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Two floats as the element pair of one 32-bit matrix register (first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The two products of an attention tile on 16 of its positions (rows r0 .. r0 + 15), over a
// shared-memory tile of D-wide rows stored as TileCopier stores them (16-byte chunk c of row r
// at chunk c ^ (r % 8)). s0 and s1 get the scores of positions r0 .. r0 + 7 and r0 + 8 ..
// r0 + 15 (the lane's columns 2c, 2c + 1): S += Q K^T, with qa[k] the A fragment of the
// queries' k-step k. Matrix sub of each ldmatrix: positions 8 (sub / 2) + row8, dims 8 (sub % 2)
// of the k-step.
template <typename T, int D>
__device__ __forceinline__ void mma_scores16(float s0[4], float s1[4], const uint32_t (*qa)[4],
                                             const T* k_tile, int r0) {
  const int lane = threadIdx.x % 32, sub = lane / 8, row8 = lane % 8;
  const int row = r0 + (sub >> 1) * 8 + row8;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    uint32_t b[4];
    ldmatrix_x4(b, k_tile + row * D + (((2 * k + (sub & 1)) ^ (row & 7)) * 8));
    mma_16816<T>(s0, qa[k], b[0], b[1]);
    mma_16816<T>(s1, qa[k], b[2], b[3]);
  }
}

// O += P V over the same 16 positions of a V tile: pa is P's A fragment (its columns are the
// positions), o[n] the output dims 8n .. 8n + 7. V is read transposed; matrix sub: positions
// 8 (sub % 2) + row8, dims 16 nd + 8 (sub / 2).
template <typename T, int D>
__device__ __forceinline__ void mma_values16(float (*o)[4], const uint32_t pa[4],
                                             const T* v_tile, int r0) {
  const int lane = threadIdx.x % 32, sub = lane / 8, row8 = lane % 8;
  const int row = r0 + (sub & 1) * 8 + row8;
#pragma unroll
  for (int nd = 0; nd < D / 16; ++nd) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, v_tile + row * D + (((2 * nd + (sub >> 1)) ^ (row & 7)) * 8));
    mma_16816<T>(o[2 * nd], pa, b[0], b[1]);
    mma_16816<T>(o[2 * nd + 1], pa, b[2], b[3]);
  }
}

}  // namespace
