// pagewise: the dot products of the GEMV kernels (gemv.cu, o_router.cu): a warp's share of an
// output's sum and the merge of the warps that share an output (gemv_weight.cuh has the loop of
// a block's outputs after it staged its input).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"

namespace {

// A warp's share of the dot products of N weight rows with the R staged rows, summed over the
// warp (every lane gets the sums): acc[n][r] = sum over the warp's k of xs[r, k] * rows[n][k].
// With S warps on one output, warp `part` takes every S-th run of 256 elements (merge_split
// adds the parts); each row's sum in the same order whatever N and R.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_rows(float (&acc)[N][R], const T* const (&rows)[N],
                                         const T* xs, int k_dim, int lane, int part) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
#pragma unroll 4
  for (int k = (part * 32 + lane) * 8; k < k_dim; k += S * 32 * 8) {
    float wf[N][8];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(rows[n] + k));
      const T* wv = reinterpret_cast<const T*>(&wraw);
#pragma unroll
      for (int j = 0; j < 8; ++j) wf[n][j] = to_float(wv[j]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
      const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[n][r] += wf[n][j] * to_float(xv[j]);
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// Adds the parts of the S warps that share an output (consecutive warps of the block, in part
// order) into the first one's acc (every lane of it); true for that warp, which stores. Every
// warp of the block must call it the same number of times (it synchronizes the block).
template <int R, int N, int S, int kT = kGemvThreads>
__device__ __forceinline__ bool merge_split(float (&acc)[N][R], int warp, int lane) {
  if constexpr (S == 1) return true;
  __shared__ float parts[kT / 32][N][R];
  if (lane == 0) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int r = 0; r < R; ++r) parts[warp][n][r] = acc[n][r];
  }
  __syncthreads();
  const bool first = warp % S == 0;
  if (first) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float t = 0.f;
#pragma unroll
        for (int p = 0; p < S; ++p) t += parts[warp + p][n][r];
        acc[n][r] = t;
      }
  }
  __syncthreads();
  return first;
}

// Warps an output takes (see dot_rows): 2 when each warp keeps at least four 256-element runs
// of k, else 1. Two warps a row stream the projections of real shapes faster than one, and four
// slower (benches/history/tried.md, "Two warps an output in the decode GEMVs"). A
// function of the weight's shape, never of the rows, so an output's sum has the same order at
// every batch size.
inline int split_for(int k_dim) {
  return k_dim >= 2 * 4 * 256 ? 2 : 1;
}

}  // namespace
