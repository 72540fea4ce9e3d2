// pagewise: the o projection of a mixture-of-experts layer on the fused decode path with the
// layer's router folded in (Qwen3-MoE, Mixtral). The router scores RMSNorm(h) * g for the
// residual stream h = residual + o(a). The norm scales a row by one number, 1 / rms(h), so the
// router's logits are 1 / rms(h) times (W_r diag(g) W_o) a + (W_r diag(g)) residual, products of
// the step's inputs alone. The first blocks of this kernel's grid score them against
// [A | B] = [W_r diag(g) W_o | W_r diag(g)] (f32, made at load) while the other blocks run the o
// projection as gemv_kernel does (the same sums, bit for bit), so no router kernel waits for h;
// the expert slices, which compute 1 / rms(h) as they stage the norm, scale the logits as they
// route (moe_slices.cu). These are the logits of h before it is rounded to the dtype, normalized
// and rounded again: they differ from the router kernel's by about that rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_rows.cuh"
#include "gemv_weight.cuh"
#include "gemv_stage.cuh"
#include "pdl.cuh"

namespace {

// Warps a router row takes (consecutive warps of a block; merge_split adds their parts), and the
// rows a block scores.
constexpr int kRouterSplit = 8;
constexpr int kRouterRows = kGemvWarps / kRouterSplit;

// Stages [a[r] | b[r]] (k_dim then b_dim elements, both multiples of 8) for each of the R rows.
template <typename T, int R>
__device__ __forceinline__ void stage_pair(T* xs, const T* __restrict__ a, int k_dim,
                                           const T* __restrict__ b, int b_dim) {
  const int n = k_dim + b_dim, vecs = n / 8;
  for (int i = threadIdx.x; i < R * vecs; i += kGemvThreads) {
    const int r = i / vecs, k = (i % vecs) * 8;
    const T* src = k < k_dim ? a + (int64_t)r * k_dim + k : b + (int64_t)r * b_dim + (k - k_dim);
    *reinterpret_cast<uint4*>(xs + r * n + k) = *reinterpret_cast<const uint4*>(src);
  }
  __syncthreads();
}

// logits[r, e] = sum_k router[e, k] * xs[r, k] over the R staged rows (n elements each) for this
// block's kRouterRows experts from `first`.
template <typename T, int R>
__device__ __forceinline__ void router_logits(float* __restrict__ logits, const T* xs,
                                              const float* __restrict__ router, int experts,
                                              int n, int first) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % kRouterSplit;
  const int e = first + warp / kRouterSplit;
  float acc[1][R] = {};
  if (e < experts) {
    const float* row = router + (int64_t)e * n;
#pragma unroll 4
    for (int k = (part * 32 + lane) * 8; k < n; k += kRouterSplit * 32 * 8) {
      const float4 w0 = __ldg(reinterpret_cast<const float4*>(row + k));
      const float4 w1 = __ldg(reinterpret_cast<const float4*>(row + k + 4));
      const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * n + k);
        const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[0][r] += wf[j] * to_float(xv[j]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[0][r] += __shfl_xor_sync(0xffffffff, acc[0][r], s);
  }
  if (!merge_split<R, 1, kRouterSplit>(acc, warp, lane) || e >= experts || lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) logits[(int64_t)r * experts + e] = acc[0][r];
}

// Blocks [0, router_blocks) score the router's rows against [a | residual]; the others compute
// y = residual + a w^T as gemv_kernel<T, R, kPlain, true, S> does (held to the same registers).
template <typename T, int R, int S>
__global__ void __launch_bounds__(kGemvThreads, R == 1 ? 2048 / kGemvThreads : 1)
    o_router_kernel(T* __restrict__ y, float* __restrict__ logits, const T* __restrict__ a,
                    const T* __restrict__ w, const T* __restrict__ residual,
                    const float* __restrict__ router, int experts, int out_dim, int k_dim,
                    int router_blocks) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  // Launched early (see launch_early): a and residual may be the kernels before's output.
  wait_for_previous_grid();
  let_next_grid_launch();
  if ((int)blockIdx.x < router_blocks) {
    stage_pair<T, R>(xs, a, k_dim, residual, out_dim);
    router_logits<T, R>(logits, xs, router, experts, k_dim + out_dim, blockIdx.x * kRouterRows);
    return;
  }
  stage_input<T, R, kPlain>(xs, a, nullptr, k_dim, 0.f);
  gemv_outputs<T, R, true, S, kGemvThreads>(y, xs, DenseWeight<T>{w}, residual, out_dim, k_dim,
                                            blockIdx.x - router_blocks, gridDim.x - router_blocks);
}

struct ORouterArgs {
  void* y;
  float* logits;
  const void *a, *w, *residual;
  const float* router;
  int experts, out_dim, k_dim;
  cudaStream_t stream;
};

template <typename T, int R, int S>
int launch_rs(const ORouterArgs& a) {
  const auto kernel = o_router_kernel<T, R, S>;
  // (The router blocks stage [a | residual], the others a.)
  const int smem = R * (a.k_dim + a.out_dim) * (int)sizeof(T);
  if (smem > kMaxStageBytes) return 1;
  static int resident_by[64][kStageSteps + 1] = {};
  int blocks = 0;
  if (const int e = grid_for(kernel, smem, a.out_dim, kGemvWarps / S, resident_by, &blocks))
    return e;
  const int router_blocks = (a.experts + kRouterRows - 1) / kRouterRows;
  const cudaError_t err =
      launch_early(kernel, router_blocks + blocks, kGemvThreads, smem, a.stream, (T*)a.y,
                   a.logits, (const T*)a.a, (const T*)a.w, (const T*)a.residual, a.router,
                   a.experts, a.out_dim, a.k_dim, router_blocks);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T, int R>
int launch_r(const ORouterArgs& a) {
  // (gemv_kernel's split for this k, so the outputs sum as pagewise_gemv's do.)
  return split_for(a.k_dim) == 2 ? launch_rs<T, R, 2>(a) : launch_rs<T, R, 1>(a);
}

template <typename T>
int launch(int rows, const ORouterArgs& a) {
  switch (rows) {
    case 1: return launch_r<T, 1>(a);
    case 2: return launch_r<T, 2>(a);
    default: return 1;
  }
}

}  // namespace

// y ([rows, out_dim]) = residual + a w^T (a [rows, k_dim], w [out_dim, k_dim], residual
// [rows, out_dim]), bit for bit as pagewise_gemv computes it (input 0 with the residual), and
// logits (f32 [rows, experts]) = [a | residual] router^T for router = [W_r diag(g) W_o |
// W_r diag(g)] (f32 [experts, k_dim + out_dim]): the router's logits of RMSNorm(y) * g before the
// norm's 1 / rms (see above). Rows 1..2, dtype 1 = f16, 2 = bf16, k_dim and out_dim multiples of
// 8, every pointer 16-byte aligned. Returns 0, a CUDA error code, or 1 when the arguments are
// unsupported (rows x (k_dim + out_dim) past the staging space among them).
extern "C" int pagewise_o_router(int dtype, void* y, float* logits, const void* a, const void* w,
                                 const void* residual, const float* router, int rows,
                                 int experts, int out_dim, int k_dim, void* stream) {
  if (rows == 0) return 0;
  if (k_dim % 8 != 0 || out_dim % 8 != 0 || out_dim == 0 || experts < 1) return 1;
  const ORouterArgs args = {y,       logits,  a,     w, residual, router,
                            experts, out_dim, k_dim, (cudaStream_t)stream};
  switch (dtype) {
    case 1: return launch<__half>(rows, args);
    case 2: return launch<__nv_bfloat16>(rows, args);
    default: return 1;
  }
}
