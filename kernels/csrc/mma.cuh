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

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of D-wide rows stored as
// TileCopier stores them (chunk c of row r at chunk c ^ (r % 8)).
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) * 8);
}

// One k-step (dims 16 k .. 16 k + 15) of mma_scores16: the lane's ldmatrix of K rows r0 ..
// r0 + 15 and the two products with the queries' A fragment qa.
template <typename T, int D>
__device__ __forceinline__ void mma_scores_step(float s0[4], float s1[4], const uint32_t qa[4],
                                                const T* k_tile, int r0, int k) {
  const int lane = threadIdx.x % 32, sub = lane / 8, row8 = lane % 8;
  const int row = r0 + (sub >> 1) * 8 + row8;
  uint32_t b[4];
  ldmatrix_x4(b, k_tile + swizzled<D>(row, 2 * k + (sub & 1)));
  mma_16816<T>(s0, qa, b[0], b[1]);
  mma_16816<T>(s1, qa, b[2], b[3]);
}

// The two products of an attention tile on 16 of its positions (rows r0 .. r0 + 15), over a
// shared-memory tile of D-wide rows stored as TileCopier stores them (16-byte chunk c of row r
// at chunk c ^ (r % 8)). s0 and s1 get the scores of positions r0 .. r0 + 7 and r0 + 8 ..
// r0 + 15 (the lane's columns 2c, 2c + 1): S += Q K^T, with qa[k] the A fragment of the
// queries' k-step k. Matrix sub of each ldmatrix: positions 8 (sub / 2) + row8, dims 8 (sub % 2)
// of the k-step. kDims < D: the product over dims dim0 .. dim0 + kDims only (qa holds those).
template <typename T, int D, int kDims = D>
__device__ __forceinline__ void mma_scores16(float s0[4], float s1[4], const uint32_t (*qa)[4],
                                             const T* k_tile, int r0, int dim0 = 0) {
#pragma unroll
  for (int k = 0; k < kDims / 16; ++k)
    mma_scores_step<T, D>(s0, s1, qa[k], k_tile, r0, dim0 / 16 + k);
}

// mma_scores16 for 16 query rows whose A fragments are read from shared memory at each k-step
// (rows q0 .. q0 + 15 of a tile stored as TileCopier stores K) instead of held in registers: at
// head dim 256 the registers go to the output. s[2j], s[2j + 1]: the scores of key blocks
// 16j .. 16j + 7 and 16j + 8 .. 16j + 15 of `keys` positions (a multiple of 16).
template <typename T, int D, int kKeys>
__device__ __forceinline__ void mma_scores_qs(float (*s)[4], const T* q_tile, int q0,
                                              const T* k_tile) {
  const int lane = threadIdx.x % 32, sub = lane / 8, row8 = lane % 8;
  const int qrow = q0 + (sub & 1) * 8 + row8;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    uint32_t qa[4];
    ldmatrix_x4(qa, q_tile + swizzled<D>(qrow, 2 * k + (sub >> 1)));
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j)
      mma_scores_step<T, D>(s[2 * j], s[2 * j + 1], qa, k_tile, j * 16, k);
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
    ldmatrix_x4_trans(b, v_tile + swizzled<D>(row, 2 * nd + (sub >> 1)));
    mma_16816<T>(o[2 * nd], pa, b[0], b[1]);
    mma_16816<T>(o[2 * nd + 1], pa, b[2], b[3]);
  }
}

// O^T += V^T P^T over the same 16 positions of a V tile, the output transposed so that no
// tensor-core row is wasted on the zero rows of P (decode: a KV head's group has at most 8
// query heads): o[m] holds dims 16m + r and 16m + r + 8 (r = lane / 4) of heads 2c and 2c + 1 (c = lane % 4), as
// {(r, 2c), (r, 2c + 1), (r + 8, 2c), (r + 8, 2c + 1)}; pb is P^T's B fragment (P's row r at
// positions 2c, 2c + 1 and 8 + 2c, 8 + 2c + 1: the score registers). V is read transposed as the
// A operand; matrix sub: positions 8 (sub % 2) + row8, dims 16 m + 8 (sub / 2). Half the
// instructions and accumulators of O = P V with P's 16 rows. kDims < D: dims dim0 .. dim0 +
// kDims only (o[m] then holds dims dim0 + 16m + r, + 8).
template <typename T, int D, int kDims = D>
__device__ __forceinline__ void mma_values16_t(float (*o)[4], const uint32_t pb[2],
                                               const T* v_tile, int r0, int dim0 = 0) {
  const int lane = threadIdx.x % 32, sub = lane / 8, row8 = lane % 8;
  const int row = r0 + (sub & 1) * 8 + row8;
#pragma unroll
  for (int m = 0; m < kDims / 16; ++m) {
    uint32_t v[4];
    ldmatrix_x4_trans(v, v_tile + swizzled<D>(row, 2 * (dim0 / 16 + m) + (sub >> 1)));
    const uint32_t a[4] = {v[0], v[2], v[1], v[3]};
    mma_16816<T>(o[m], a, pb[0], pb[1]);
  }
}

}  // namespace
