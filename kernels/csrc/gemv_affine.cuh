// pagewise: integer codes with an affine map per group, w = s * q + b, as the decode GEMVs
// stream them (included by gemv_weight.cuh): the GGUF types repacked at load on a GPU (Q4_0,
// Q4_1 and Q4_K as 4-bit codes; Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 as bytes). The offset b is a
// float (Q4_K's and Q5_K's minimums are not whole codes), so a load's sum is split into
// s * sum(q x) + b * sum(x).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

// The most rows the GEMVs take with these weights: the fused decode steps' (each kind of weight
// instantiates every GEMV entry point for each row count it takes, and the binaries travel to the
// GPU machine under a size limit). Larger steps multiply a dequantized copy (affine.cu).
constexpr int kAffineMaxRows = 2;

// 4-bit codes q [out, k] (k a multiple of 32) in Int4Weight's word order, with an f16 (scale s,
// offset b) pair per row and group of 2^g_shift columns (at least 32; g_shift < 0: one group a
// row): element (o, c) is s * q + b for (s, b) = sb[o * groups + (c >> g_shift)].
struct Affine4Weight {
  const uint32_t* w;
  const __half2* sb;
  int g_shift, groups;
};

// Byte codes q [out, k] (k a multiple of 16), row-major, with (s, b) pairs as Affine4Weight's
// over groups of at least 16 columns.
struct Affine8Weight {
  const uint8_t* w;
  const __half2* sb;
  int g_shift, groups;
};

// Whether codes of `bits` (4 or 8) of k_dim columns in groups of `group` fit their type.
inline bool affine_weight_fits(int bits, int k_dim, int group) {
  const int lane_cols = bits == 4 ? 32 : 16;
  if (bits != 4 && bits != 8) return false;
  int shift = 0;
  while ((1 << shift) < group && shift < 30) ++shift;
  return k_dim % lane_cols == 0 && group > 0 &&
         (group >= k_dim || (group >= lane_cols && (1 << shift) == group));
}

// The (g_shift, groups) of groups of `group` columns over k_dim.
inline int2 affine_groups(int group, int k_dim) {
  if (group >= k_dim) return make_int2(-1, 1);
  int shift = 0;
  while ((1 << shift) < group) ++shift;
  return make_int2(shift, k_dim >> shift);
}

inline Affine4Weight affine4_weight(const void* w, const void* sb, int group, int k_dim) {
  const int2 g = affine_groups(group, k_dim);
  return Affine4Weight{reinterpret_cast<const uint32_t*>(w), reinterpret_cast<const __half2*>(sb),
                       g.x, g.y};
}

inline Affine8Weight affine8_weight(const void* w, const void* sb, int group, int k_dim) {
  const int2 g = affine_groups(group, k_dim);
  return Affine8Weight{reinterpret_cast<const uint8_t*>(w), reinterpret_cast<const __half2*>(sb),
                       g.x, g.y};
}

// The 32 codes of one 16-byte load of 4-bit codes (Int4Weight's word order: column 8j + 2i in
// nibble i of word j, 8j + 2i + 1 in nibble 4 + i) as floats: each nibble pair made the exact
// halves 1024 + q by a mask and an OR.
__device__ __forceinline__ void affine4_unpack(uint4 raw, float (&wf)[32]) {
  const __half2 k1024 = __float2half2_rn(1024.f);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = ((words[j] >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
      const float2 f = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&bits), k1024));
      wf[8 * j + 2 * i] = f.x;
      wf[8 * j + 2 * i + 1] = f.y;
    }
}

// The 16 codes of one 16-byte load of byte codes as floats: each pair of bytes put under the
// exponent of 1024 by one byte permute (exact halves 1024 + q).
__device__ __forceinline__ void affine8_unpack(uint4 raw, float (&wf)[16]) {
  const __half2 k1024 = __float2half2_rn(1024.f);
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // Bytes (0, 1) and (2, 3) of the word as the low bytes of two half pairs.
    const uint32_t lo = __byte_perm(words[j], 0x64646464u, 0x4140);
    const uint32_t hi = __byte_perm(words[j], 0x64646464u, 0x4342);
    const float2 a = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&lo), k1024));
    const float2 b = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&hi), k1024));
    wf[4 * j] = a.x;
    wf[4 * j + 1] = a.y;
    wf[4 * j + 2] = b.x;
    wf[4 * j + 3] = b.y;
  }
}

// Adds s * sum(q x) + b * sum(x) of one load's codes wf[0..n) (as floats) against the staged
// rows' columns k.. to acc.
template <typename T, int R, int kCols>
__device__ __forceinline__ void affine_load(float (&acc)[R], const float (&wf)[kCols],
                                            const T* xs, int k_dim, int k, __half2 pair) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float qx = 0.f, sx = 0.f;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8 * j);
      const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x = to_float(xv[e]);
        qx += wf[8 * j + e] * x;
        sx += x;
      }
    }
    const float2 sb = __half22float2(pair);
    acc[r] += qx * sb.x + sx * sb.y;
  }
}

// dot_rows for 4-bit affine rows: a lane takes 32 columns a load (one 16-byte load inside one
// group, every S-th run of 1024 columns), codes made exact halves 1024 + q by a mask and an OR.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Affine4Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 32;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint32_t* row = wt.w + (int64_t)o[n] * (k_dim / 8);
    const __half2* sb = wt.sb + (int64_t)o[n] * wt.groups;
#pragma unroll 2
    for (int k = first; k < k_dim; k += S * 32 * 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k / 8));
      const __half2 pair = __ldg(sb + (wt.g_shift < 0 ? 0 : k >> wt.g_shift));
      float wf[32];
      affine4_unpack(raw, wf);
      affine_load<T, R, 32>(acc[n], wf, xs, k_dim, k, pair);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// dot_rows for byte codes: a lane takes 16 columns a load (every S-th run of 512 columns), each
// pair of bytes put under the exponent of 1024 by one byte permute (exact halves 1024 + q).
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Affine8Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 16;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint8_t* row = wt.w + (int64_t)o[n] * k_dim;
    const __half2* sb = wt.sb + (int64_t)o[n] * wt.groups;
#pragma unroll 2
    for (int k = first; k < k_dim; k += S * 32 * 16) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k));
      const __half2 pair = __ldg(sb + (wt.g_shift < 0 ? 0 : k >> wt.g_shift));
      float wf[16];
      affine8_unpack(raw, wf);
      affine_load<T, R, 16>(acc[n], wf, xs, k_dim, k, pair);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

}  // namespace
