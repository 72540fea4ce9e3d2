// pagewise: the weights the decode GEMVs stream (gemv.cu, gemv_fp8.cu, o_router.cu): dense rows
// in the activations' dtype, or FP8 (e4m3) rows with f32 scales, one per block of bn rows x bk
// columns (one scale per tensor, per row, or per 128 x 128 block are all such blocks). A kernel
// takes the weight as a value of one of these types and calls dot_weight, overloaded on it.
#pragma once
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
// w[o, c] * s[(o / bn) * sk + c / bk], sk = ceil(k / bk); bk a multiple of 16 or at least k.
struct Fp8Weight {
  const uint8_t* w;
  const float* s;
  int bn, bk, sk;
};

// The Fp8Weight of e4m3 rows `w` of k_dim columns with scales `s` over blocks of bn x bk.
inline Fp8Weight fp8_weight(const void* w, const float* s, int bn, int bk, int k_dim) {
  return Fp8Weight{reinterpret_cast<const uint8_t*>(w), s, bn, bk, (k_dim + bk - 1) / bk};
}

// Whether FP8 weights of k_dim columns in blocks of bn x bk are what Fp8Weight takes.
inline bool fp8_weight_fits(int k_dim, int bn, int bk) {
  return k_dim % 16 == 0 && bn > 0 && bk > 0 && (bk % 16 == 0 || bk >= k_dim);
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

// dot_rows for FP8 rows: a lane takes 16 values a load (every S-th run of 512 values with S
// warps an output), sums each run of 16 against the staged rows, and adds it times its block's
// scale; the warp's lanes are then summed as dot_rows sums them.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Fp8Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const uint8_t* rows[N];
  const float* scales[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    rows[n] = wt.w + (int64_t)o[n] * k_dim;
    scales[n] = wt.s + (int64_t)(o[n] / wt.bn) * wt.sk;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
  }
#pragma unroll 2
  for (int k = (part * 32 + lane) * 16; k < k_dim; k += S * 32 * 16) {
    float wf[N][16];
    float sc[N];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      fp8x16_to_float(__ldg(reinterpret_cast<const uint4*>(rows[n] + k)), wf[n]);
      sc[n] = __ldg(scales[n] + k / wt.bk);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xa = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
      const uint4 xb = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8);
      const T* va = reinterpret_cast<const T*>(&xa);
      const T* vb = reinterpret_cast<const T*>(&xb);
#pragma unroll
      for (int n = 0; n < N; ++n) {
        float p = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) p += wf[n][j] * to_float(va[j]);
#pragma unroll
        for (int j = 0; j < 8; ++j) p += wf[n][8 + j] * to_float(vb[j]);
        acc[n][r] += p * sc[n];
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

// y[r, o] = sum_k xs[r, k] * w[o, k] (w a DenseWeight<T> or an Fp8Weight) (+ residual[r, o], added to the product rounded to T as the
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
