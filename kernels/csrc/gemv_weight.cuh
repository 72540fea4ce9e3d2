// pagewise: the weights the decode GEMVs stream (gemv.cu, o_router.cu): dense rows in the
// activations' dtype, FP8 (e4m3) rows with f32 scales, one per block of bn rows x bk columns (one
// scale per tensor, per row, or per 128 x 128 block are all such blocks), or 4-bit integer rows
// with an f16 scale and zero point per group of columns (AWQ, GPTQ, compressed-tensors W4A16,
// repacked at load). A kernel takes the weight as a value of one of these types and calls
// dot_weight, overloaded on it.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_rows.cuh"

namespace {

// Rows of T, [out, k] row-major.
template <typename T>
struct DenseWeight {
  const T* w;
};

// e4m3 rows [out, k] (k a multiple of 16) times their scales: element (o, c) is
// w[o, c] * s[(o / bn) * sk + c / (1 << bk_shift)], sk = ceil(k / bk): bk a power of two of at
// least 16, or (bk_shift < 0) at least k, one scale a row.
struct Fp8Weight {
  const uint8_t* w;
  const float* s;
  int bn, bk_shift, sk;
};

// 4-bit codes q [out, k] (k a multiple of 32), 8 a 32-bit word, with an f16 scale s and zero
// point z per row and group of 2^g_shift columns (g_shift < 0: one group a row): element (o, c)
// is s * (q - z) for (s, z) = sz[o * groups + (c >> g_shift)]. Word j of a row holds columns
// 8j..8j+7, column 8j + 2i in nibble i and 8j + 2i + 1 in nibble 4 + i (bits 4i and 16 + 4i:
// AutoAWQ's order), so that one mask takes two neighbouring columns into the halves of a half2.
struct Int4Weight {
  const uint32_t* w;
  const __half2* sz;
  int g_shift, groups;
};

// The (weight kind) of the entry points' weight arguments: w in the activations' dtype; e4m3
// with f32 block scales; 4-bit codes with (scale, zero) f16 pairs (Int4Weight).
enum WeightKind { kDenseWeight = 0, kFp8Weight = 1, kInt4Weight = 2 };

// log2(bk) for a power of two, else -1.
inline int log2_exact(int bk) {
  int shift = 0;
  while ((1 << shift) < bk && shift < 30) ++shift;
  return (1 << shift) == bk ? shift : -1;
}

// The Fp8Weight of e4m3 rows `w` of k_dim columns with scales `s` over blocks of bn x bk.
inline Fp8Weight fp8_weight(const void* w, const float* s, int bn, int bk, int k_dim) {
  return Fp8Weight{reinterpret_cast<const uint8_t*>(w), s, bn, bk >= k_dim ? -1 : log2_exact(bk),
                   (k_dim + bk - 1) / bk};
}

// Whether FP8 weights of k_dim columns in blocks of bn x bk are what Fp8Weight takes.
inline bool fp8_weight_fits(int k_dim, int bn, int bk) {
  return k_dim % 16 == 0 && bn > 0 && bk > 0 &&
         (bk >= k_dim || (bk >= 16 && log2_exact(bk) >= 0));
}

// The Int4Weight of codes `w` of k_dim columns with (scale, zero) pairs `sz` over groups of
// `group` columns (group >= k_dim: one a row).
inline Int4Weight int4_weight(const void* w, const void* sz, int group, int k_dim) {
  const int shift = group >= k_dim ? -1 : log2_exact(group);
  return Int4Weight{reinterpret_cast<const uint32_t*>(w), reinterpret_cast<const __half2*>(sz),
                    shift, shift < 0 ? 1 : k_dim >> shift};
}

// Whether 4-bit weights of k_dim columns in groups of `group` are what Int4Weight takes.
inline bool int4_weight_fits(int k_dim, int group) {
  return k_dim % 32 == 0 && group > 0 && (group >= k_dim || (group >= 32 && log2_exact(group) >= 0));
}

// Whether the weight of `kind` (WeightKind) with these scale blocks or groups fits its type.
inline bool weight_fits(int kind, int k_dim, int block_rows, int block_cols) {
  switch (kind) {
    case kDenseWeight: return true;
    case kFp8Weight: return fp8_weight_fits(k_dim, block_rows, block_cols);
    case kInt4Weight: return int4_weight_fits(k_dim, block_cols);
    default: return false;
  }
}

// dot_rows for the dense rows o[0..N) (each below the weight's rows).
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const DenseWeight<T>& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const T* rows[N];
#pragma unroll
  for (int n = 0; n < N; ++n) rows[n] = wt.w + (int64_t)o[n] * k_dim;
  dot_rows<T, R, N, S>(acc, rows, xs, k_dim, lane, part);
}

// 16 e4m3 values (one 16-byte load) as floats.
__device__ __forceinline__ void fp8x16_to_float(const uint4& raw, float (&f)[16]) {
  const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(p[j], __NV_E4M3);
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h));
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}

// The sums of 16 e4m3 values (one 16-byte load, `raw`) with the staged rows' same 16 values at
// xs + k, added to part[r].
template <typename T, int R>
__device__ __forceinline__ void fp8_run(float (&part)[R], const uint4& raw, const T* xs, int k_dim,
                                        int k) {
  float wf[16];
  fp8x16_to_float(raw, wf);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4 xa = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
    const uint4 xb = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8);
    const T* va = reinterpret_cast<const T*>(&xa);
    const T* vb = reinterpret_cast<const T*>(&xb);
    float p = part[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) p += wf[j] * to_float(va[j]);
#pragma unroll
    for (int j = 0; j < 8; ++j) p += wf[8 + j] * to_float(vb[j]);
    part[r] = p;
  }
}

// dot_rows for FP8 rows: a lane takes 16 values a load (every S-th run of 512 values with S
// warps an output). With one scale a row the sums are scaled once at the end; with blocks of
// columns each run of 16 is scaled by its block's before it is added. The warp's lanes are then
// summed as dot_rows sums them.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Fp8Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 16;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint8_t* row = wt.w + (int64_t)o[n] * k_dim;
    const float* scales = wt.s + (int64_t)(o[n] / wt.bn) * wt.sk;
    if (wt.bk_shift < 0) {
#pragma unroll 4
      for (int k = first; k < k_dim; k += S * 32 * 16)
        fp8_run<T, R>(acc[n], __ldg(reinterpret_cast<const uint4*>(row + k)), xs, k_dim, k);
      const float sc = __ldg(scales);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[n][r] *= sc;
    } else {
#pragma unroll 4
      for (int k = first; k < k_dim; k += S * 32 * 16) {
        float run[R] = {};
        fp8_run<T, R>(run, __ldg(reinterpret_cast<const uint4*>(row + k)), xs, k_dim, k);
        const float sc = __ldg(scales + (k >> wt.bk_shift));
#pragma unroll
        for (int r = 0; r < R; ++r) acc[n][r] += run[r] * sc;
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// dot_rows for 4-bit rows: a lane takes 32 columns a load (one 16-byte load, inside one group:
// every S-th run of 1024 columns with S warps an output), each word's 8 codes made halves
// 1024 + q by one mask and OR each pair, less 1024 + z (exact), summed with the staged rows in
// f32 and scaled by the group's scale once a load. The warp's lanes are summed as dot_rows sums
// them.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Int4Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 32;
  const __half k1024 = __float2half(1024.f);
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint32_t* row = wt.w + (int64_t)o[n] * (k_dim / 8);
    const __half2* sz = wt.sz + (int64_t)o[n] * wt.groups;
#pragma unroll 2
    for (int k = first; k < k_dim; k += S * 32 * 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k / 8));
      const __half2 g = __ldg(sz + (wt.g_shift < 0 ? 0 : k >> wt.g_shift));
      const __half2 bias = __half2half2(__hadd(__high2half(g), k1024));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      float run[R] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t bits = ((words[j] >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
          const float2 f = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&bits), bias));
          wf[2 * i] = f.x;
          wf[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8 * j);
          const T* xv = reinterpret_cast<const T*>(&xraw);
          float p = run[r];
#pragma unroll
          for (int e = 0; e < 8; ++e) p += wf[e] * to_float(xv[e]);
          run[r] = p;
        }
      }
      const float scale = __low2float(g);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[n][r] += run[r] * scale;
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// y[r, o] = sum_k xs[r, k] * w[o, k] (w a DenseWeight<T>, an Fp8Weight or an Int4Weight) (+ residual[r, o], added to the product rounded to T as the
// unfused add would see it) for the R rows the block staged in xs: its warps take outputs in
// rounds of warps / S (S warps an output, see dot_rows), block `block` of `blocks` stepping by
// the grid's.
template <typename T, int R, bool kAdd, int S, int kT, typename W>
__device__ __forceinline__ void gemv_outputs(T* __restrict__ y, const T* xs, const W& w,
                                             const T* __restrict__ residual, int out_dim,
                                             int k_dim, int block, int blocks) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kPerBlock = kT / 32 / S;
  for (int base = block * kPerBlock; base < out_dim; base += blocks * kPerBlock) {
    const int o = base + warp / S;
    float acc[1][R] = {};
    // The residual the storing lane adds, loaded before the dot products so its latency hides
    // behind them.
    T res[R];
    if constexpr (kAdd)
#pragma unroll
      for (int r = 0; r < R; ++r)
        res[r] = lane == 0 && warp % S == 0 && o < out_dim ? residual[(int64_t)r * out_dim + o]
                                                           : from_float<T>(0.f);
    if (o < out_dim) {
      const int os[1] = {o};
      dot_weight<T, R, 1, S>(acc, w, os, xs, k_dim, lane, warp % S);
    }
    if (!merge_split<R, 1, S, kT>(acc, warp, lane) || o >= out_dim || lane != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t at = (int64_t)r * out_dim + o;
      float v = acc[0][r];
      if constexpr (kAdd) v = to_float(from_float<T>(v)) + to_float(res[r]);
      y[at] = from_float<T>(v);
    }
  }
}

}  // namespace
