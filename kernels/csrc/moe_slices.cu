// pagewise: a mixture-of-experts layer's dense experts for a decode token or a few, cut into
// slices of the experts' inner columns instead of two grids of rows. moe.cu runs gate/up for
// every chosen expert, then (after the whole grid ends) down; with short expert rows
// (Qwen3-MoE: 8 experts of 768 columns) each down warp streams too little between the two
// grids' ramps. Here a block takes `kCols` consecutive inner columns of one chosen expert: their
// gate and up rows (bias, activation, rounded to T as the separate kernels store them), then the
// same columns of every down row, so its share of each output is a dot product of kCols terms;
// it stores that share, times the expert's routing weight, as f32 in `partial`. No block waits
// for another. Given the router's logits, each block also routes its token itself (route.cuh,
// the routing kernel's own code), so no routing kernel runs between the router and the slices.
// moe_slice_sum_kernel then sums a token's shares in a fixed order (the result does not depend
// on which block ran first), adds the weighted down biases and the residual, and rounds. Both
// kernels launch early (pdl.cuh), so the layer stays inside a CUDA graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"
#include "moe.cuh"
#include "pdl.cuh"
#include "route.cuh"
#include "silu.cuh"

namespace {

constexpr int kSliceThreads = 256;
constexpr int kSliceWarps = kSliceThreads / 32;
// Rows a thread loads at once in the down part.
constexpr int kDownUnroll = 4;

// The warp's dot products of R weight rows with the staged row xs (k_dim elements, a multiple
// of 8), summed over the warp (every lane gets them); the rows' loads interleaved.
template <typename T, int R>
__device__ __forceinline__ void warp_dots(float (&acc)[R], const T* const (&w)[R], const T* xs,
                                          int k_dim, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  // Four 16-byte loads a lane in flight (eight spill at four blocks an SM, and three blocks an
  // SM with eight were no faster on the H200).
  constexpr int kUnroll = R >= 4 ? 1 : 4 / R;
#pragma unroll kUnroll
  for (int k = lane * 8; k < k_dim; k += 32 * 8) {
    uint4 raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = __ldg(reinterpret_cast<const uint4*>(w[r] + k));
    const uint4 xraw = *reinterpret_cast<const uint4*>(xs + k);
    const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const T* v = reinterpret_cast<const T*>(&raw[r]);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] += to_float(v[j]) * to_float(xv[j]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffff, acc[r], s);
}

// partial[t, i, o] = weights[t, j] * sum over the slice's columns c of
// down[e, o, c] * act(x[t] . gu[e, c] (+ bias), x[t] . gu[e, inner + c] (+ bias)) for token
// t = blockIdx.y and slice i = blockIdx.x = j * (inner / kCols) + (first column / kCols), where
// e = ids[t, j]. With `logits` (f32 [tokens, experts]) the block routes its token itself
// (route.cuh, as moe_route_kernel does) instead of reading ids and weights, and slice 0 stores
// the token's picks there for the sum; with `norm_scales` too (kIn = kRmsNorm), the logits are
// o_router.cu's, of x before its norm's 1 / rms, which the block scales them by as it routes.
// gu: [experts, 2 inner, hidden] (gate rows first), down: [experts, hidden, inner]; x staged
// once (kIn = kRmsNorm: RMSNorm(x) * norm_w, rounded to T, in its place). The activation is
// SiLU-and-mul (alpha <= 0) or the clamped SwiGLU, with g, u and the activation rounded to T as
// moe.cu's kernels round them.
template <typename T, int kIn, int kCols>
__global__ void __launch_bounds__(kSliceThreads, 4)
    moe_slice_kernel(float* __restrict__ partial, const T* __restrict__ x,
                     const T* __restrict__ norm_w, float eps, const T* __restrict__ gu,
                     const T* __restrict__ gu_bias, const T* __restrict__ down,
                     uint32_t* __restrict__ ids, float* __restrict__ weights,
                     const float* __restrict__ logits, int norm_scales, int experts,
                     int renormalize, int top_k, int inner, int hidden, float alpha, float limit) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  __shared__ float act[kCols];
  __shared__ int routed_id[kMaxTopK];
  __shared__ float routed_weight[kMaxTopK];
  __shared__ float inv_rms[1];
  const int t = blockIdx.y, slice = blockIdx.x;
  const int per_expert = inner / kCols;
  const int j = slice / per_expert, c0 = (slice % per_expert) * kCols;
  // x is staged while the kernel before may still run where only the routing (its ids and
  // weights, or the router's logits) is that kernel's output (x was written before the router;
  // see pagewise_moe_slices); o_router's logits come with x.
  if (!norm_scales)
    stage_input<T, 1, kIn, kSliceThreads>(xs, x + (int64_t)t * hidden, norm_w, hidden, eps);
  wait_for_previous_grid();
  let_next_grid_launch();
  if (norm_scales)
    stage_input<T, 1, kIn, kSliceThreads>(xs, x + (int64_t)t * hidden, norm_w, hidden, eps,
                                          inv_rms);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t e;
  float wj;
  if (logits != nullptr) {
    if (warp == 0) {
      int id;
      float weight;
      const float scale = norm_scales ? inv_rms[0] : 1.f;
      route_token(logits + (int64_t)t * experts, scale, experts, top_k, renormalize, lane, id,
                  weight);
      if (lane < top_k) {
        routed_id[lane] = id;
        routed_weight[lane] = weight;
        if (slice == 0) {
          ids[(int64_t)t * top_k + lane] = (uint32_t)id;
          weights[(int64_t)t * top_k + lane] = weight;
        }
      }
    }
    __syncthreads();
    e = routed_id[j];
    wj = routed_weight[j];
  } else {
    e = ids[(int64_t)t * top_k + j];
    wj = weights[(int64_t)t * top_k + j];
  }

  // Gate/up: a warp takes kCols / kSliceWarps columns (or one, while the warps outnumber them),
  // two at a time: their gate and up rows, four streams.
  constexpr int kPer = kCols / kSliceWarps > 0 ? kCols / kSliceWarps : 1;
  constexpr int kAtOnce = kPer >= 2 ? 2 : 1;
  if (warp * kPer < kCols) {
#pragma unroll
    for (int p = 0; p < kPer; p += kAtOnce) {
      const T* rows[2 * kAtOnce];
#pragma unroll
      for (int q = 0; q < kAtOnce; ++q) {
        const int64_t c = c0 + warp * kPer + p + q;
        rows[2 * q] = gu + (e * 2 * inner + c) * hidden;
        rows[2 * q + 1] = gu + (e * 2 * inner + inner + c) * hidden;
      }
      float dots[2 * kAtOnce];
      warp_dots<T, 2 * kAtOnce>(dots, rows, xs, hidden, lane);
      if (lane == 0) {
#pragma unroll
        for (int q = 0; q < kAtOnce; ++q) {
          const int c = c0 + warp * kPer + p + q;
          float g = dots[2 * q], u = dots[2 * q + 1];
          if (gu_bias != nullptr) {
            g += to_float(gu_bias[e * 2 * inner + c]);
            u += to_float(gu_bias[e * 2 * inner + inner + c]);
          }
          g = to_float(from_float<T>(g));
          u = to_float(from_float<T>(u));
          const float v = alpha > 0.f ? clamped_swiglu(g, u, alpha, limit) : silu_mul(g, u);
          act[c - c0] = to_float(from_float<T>(v));
        }
      }
    }
  }
  __syncthreads();

  // Down: kLanes threads a row, 8 columns (16 bytes) each; kRows rows a pass.
  constexpr int kLanes = kCols / 8;
  constexpr int kRows = kSliceThreads / kLanes;
  const int part = threadIdx.x % kLanes;
  float a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = act[part * 8 + i];
  const T* base = down + e * hidden * inner + c0 + part * 8;
  float* out = partial + ((int64_t)t * gridDim.x + slice) * hidden;
  for (int o0 = 0; o0 < hidden; o0 += kRows * kDownUnroll) {
    uint4 raw[kDownUnroll];
#pragma unroll
    for (int u = 0; u < kDownUnroll; ++u) {
      const int o = o0 + u * kRows + threadIdx.x / kLanes;
      raw[u] = o < hidden ? __ldg(reinterpret_cast<const uint4*>(base + (int64_t)o * inner))
                          : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kDownUnroll; ++u) {
      const T* v = reinterpret_cast<const T*>(&raw[u]);
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) d += to_float(v[i]) * a[i];
#pragma unroll
      for (int s = kLanes / 2; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffff, d, s);
      const int o = o0 + u * kRows + threadIdx.x / kLanes;
      if (part == 0 && o < hidden) out[o] = wj * d;
    }
  }
}

// y[t, o] = round(residual[t, o] + sum_j weights[t, j] * bias[ids[t, j], o] + sum over the
// token's slices i (in order) of partial[t, i, o]). A block takes 16 outputs: 4 threads a group
// of 4 outputs, 64 such quads splitting the slices; each thread sums its slices in order, the
// warp's 8 groups meet by shuffles and the block's 8 warps in shared memory, always in the same
// order.
template <typename T>
__global__ void __launch_bounds__(kSliceThreads)
    moe_slice_sum_kernel(T* __restrict__ y, const float* __restrict__ partial, int slices,
                         const T* __restrict__ bias, const T* __restrict__ residual,
                         const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                         int top_k, int hidden) {
  constexpr int kOuts = 16, kGroups = kSliceThreads / (kOuts / 4);
  __shared__ float4 sums[kSliceWarps][kOuts / 4];
  const int t = blockIdx.y;
  const int quad = threadIdx.x % (kOuts / 4), group = threadIdx.x / (kOuts / 4);
  const int o = blockIdx.x * kOuts + quad * 4;
  // The residual was written before the routing: loaded while the slices may still run.
  const int oo = blockIdx.x * kOuts + threadIdx.x;
  const bool stores = threadIdx.x < kOuts && oo < hidden;
  float sum = stores && residual != nullptr ? to_float(residual[(int64_t)t * hidden + oo]) : 0.f;
  wait_for_previous_grid();  // (partial is the slices' output)
  let_next_grid_launch();
  // (Eight loads a thread issued before their sums made this kernel slower on the H200: 5.6
  // against 4.4 µs for Qwen3-30B-A3B's 384 slices.)
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  if (o < hidden) {
    const float* p = partial + (int64_t)t * slices * hidden + o;
    for (int i = group; i < slices; i += kGroups) {
      const float4 v = *reinterpret_cast<const float4*>(p + (int64_t)i * hidden);
      s.x += v.x;
      s.y += v.y;
      s.z += v.z;
      s.w += v.w;
    }
  }
#pragma unroll
  for (int m = kOuts / 4; m < 32; m <<= 1) {
    s.x += __shfl_xor_sync(0xffffffff, s.x, m);
    s.y += __shfl_xor_sync(0xffffffff, s.y, m);
    s.z += __shfl_xor_sync(0xffffffff, s.z, m);
    s.w += __shfl_xor_sync(0xffffffff, s.w, m);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < kOuts / 4) sums[warp][lane] = s;
  __syncthreads();
  if (!stores) return;
  if (bias != nullptr)
    for (int j = 0; j < top_k; ++j)
      sum += weights[(int64_t)t * top_k + j] *
             to_float(bias[(int64_t)ids[(int64_t)t * top_k + j] * hidden + oo]);
#pragma unroll
  for (int w = 0; w < kSliceWarps; ++w) sum += reinterpret_cast<const float*>(&sums[w][0])[threadIdx.x];
  y[(int64_t)t * hidden + oo] = from_float<T>(sum);
}

// Where the routing comes from: ids and weights to read, or the router's logits to route from
// (ids and weights then written); see moe_slice_kernel.
struct Routing {
  uint32_t* ids;
  float* weights;
  const float* logits;
  int norm_scales, experts, renormalize;
};

template <typename T, int kIn, int kCols>
cudaError_t launch_slices(float* partial, const void* x, const void* norm_w, float eps,
                          const void* gu, const void* gu_bias, const void* down, Routing r,
                          int tokens, int top_k, int inner, int hidden, float alpha, float limit,
                          cudaStream_t stream) {
  const int slices = top_k * inner / kCols;
  return launch_early(moe_slice_kernel<T, kIn, kCols>, dim3(slices, tokens), dim3(kSliceThreads),
                      hidden * (int)sizeof(T), stream, partial, (const T*)x, (const T*)norm_w,
                      eps, (const T*)gu, (const T*)gu_bias, (const T*)down, r.ids, r.weights,
                      r.logits, r.norm_scales, r.experts, r.renormalize, top_k, inner, hidden,
                      alpha, limit);
}

template <typename T, int kIn>
cudaError_t slices_by_cols(int cols, float* partial, const void* x, const void* norm_w,
                           float eps, const void* gu, const void* gu_bias, const void* down,
                           Routing r, int tokens, int top_k, int inner, int hidden, float alpha,
                           float limit, cudaStream_t stream) {
#define PAGEWISE_SLICES(C)                                                                    \
  launch_slices<T, kIn, C>(partial, x, norm_w, eps, gu, gu_bias, down, r, tokens, top_k, inner, \
                           hidden, alpha, limit, stream)
  switch (cols) {
    case 8: return PAGEWISE_SLICES(8);
    case 16: return PAGEWISE_SLICES(16);
    case 32: return PAGEWISE_SLICES(32);
    case 64: return PAGEWISE_SLICES(64);
    default: return cudaErrorInvalidValue;
  }
#undef PAGEWISE_SLICES
}

template <typename T>
int run_slices(int cols, void* y, float* partial, const void* x, const void* norm_w, float eps,
               const void* gu, const void* gu_bias, const void* down, const void* down_bias,
               const void* residual, Routing r, int tokens, int top_k, int inner, int hidden,
               float alpha, float limit, cudaStream_t stream) {
  cudaError_t err =
      norm_w != nullptr
          ? slices_by_cols<T, kRmsNorm>(cols, partial, x, norm_w, eps, gu, gu_bias, down, r,
                                        tokens, top_k, inner, hidden, alpha, limit, stream)
          : slices_by_cols<T, kPlain>(cols, partial, x, norm_w, eps, gu, gu_bias, down, r,
                                      tokens, top_k, inner, hidden, alpha, limit, stream);
  if (err == cudaSuccess) err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  const int slices = top_k * inner / cols;
  err = launch_early(moe_slice_sum_kernel<T>, dim3((hidden + 15) / 16, tokens),
                     dim3(kSliceThreads), 0, stream, (T*)y, (const float*)partial, slices,
                     (const T*)down_bias, (const T*)residual, (const uint32_t*)r.ids,
                     (const float*)r.weights, top_k, hidden);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

}  // namespace

// The inner columns a slice of pagewise_moe_slices takes for `tokens` tokens of `top_k` experts
// of hidden x inner, or 0 where the two kernels of moe.cu take them: the narrowest of 16, 32 and
// 64 (dividing inner) whose slices fill the GPU about three blocks an SM at most (8 where 16 does
// not divide inner); rows for more than two tokens, a hidden width past 8192, or where even 64
// columns make more slices than that (Mixtral-8x7B's two tokens: 362 µs in slices against 350
// by rows). On the H200, one token: Qwen3-30B-A3B's layer (8 x 768) in slices of 16 28.1 µs
// against 31.1 by rows, Mixtral-8x7B's (2 x 14336) in 64 175.6 against 182.7, gpt-oss-20b's in
// bf16 (4 x 2880) in 32 59.9 against 72.7; two tokens, Qwen3 in 32 48.3 against 51.7.
extern "C" int pagewise_moe_slice_columns(int tokens, int top_k, int inner, int hidden) {
  if (tokens < 1 || tokens > 2 || top_k < 1 || hidden > 8192 || hidden % 8 != 0) return 0;
  if (inner % 16 != 0) return inner % 8 == 0 ? 8 : 0;
  const int known = sm_count();
  const int sms = known > 0 ? known : 132;
  const int64_t columns = (int64_t)tokens * top_k * inner;
  for (int cols = 16; cols <= 64 && inner % cols == 0; cols *= 2)
    if (columns / cols <= sms * 7 / 2) return cols;
  return 0;
}

// y ([tokens, hidden]) = what pagewise_moe_gate_up then pagewise_moe_down compute (same
// arguments: x, norm_w, eps, gu with gu_bias, the activation (alpha, limit), down with
// down_bias, residual, ids, weights; dense f16 (dtype 1) or bf16 (2) weights), in slices of `cols`
// inner columns (8, 16, 32 or 64, dividing inner; hidden a multiple of 8, at most 8192): the
// down sums taken in another order. With `logits` (f32 [tokens, experts], experts at most
// pagewise_moe_max_experts) the slices route each token as pagewise_moe_route would (renormalize
// as there) and write its picks to ids and weights instead of reading them: no routing kernel.
// With `norm_scales` (and norm_w) the logits are pagewise_o_router's, of x before its norm's
// 1 / rms: each token's are scaled by that as the slices route.
// `partial`: f32 scratch of tokens x (top_k x inner / cols) x hidden elements, 16-byte aligned.
// x, norm_w and residual must be written before the kernel just before this call (the routing,
// or the router with `logits`; with `norm_scales`, x may be that kernel's, o_router's): the
// slices stage x (unless norm_scales), and the sum loads the residual, while it may still run.
// Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_slices(int dtype, int cols, void* y, float* partial, const void* x,
                                   const void* norm_w, float eps, const void* gu,
                                   const void* gu_bias, const void* down, const void* down_bias,
                                   const void* residual, uint32_t* ids, float* weights,
                                   const float* logits, int norm_scales, int experts,
                                   int renormalize, int tokens, int top_k, int inner,
                                   int hidden, float alpha, float limit, void* stream) {
  if (tokens == 0 || hidden == 0) return 0;
  if ((cols != 8 && cols != 16 && cols != 32 && cols != 64) || inner % cols != 0 ||
      hidden % 8 != 0 || hidden > 8192 || top_k < 1 || top_k > kMaxTopK || tokens > 65535)
    return 1;
  if (logits != nullptr && (experts < top_k || experts > kMaxExperts)) return 1;
  if (norm_scales && (logits == nullptr || norm_w == nullptr)) return 1;
  const Routing r = {ids, weights, logits, norm_scales, experts, renormalize};
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1:
      return run_slices<__half>(cols, y, partial, x, norm_w, eps, gu, gu_bias, down, down_bias,
                                residual, r, tokens, top_k, inner, hidden, alpha, limit, s);
    case 2:
      return run_slices<__nv_bfloat16>(cols, y, partial, x, norm_w, eps, gu, gu_bias, down,
                                       down_bias, residual, r, tokens, top_k, inner, hidden,
                                       alpha, limit, s);
    default: return 1;
  }
}
