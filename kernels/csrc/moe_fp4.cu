// pagewise: the MXFP4 twins of moe.cu's expert kernels, for gpt-oss's experts as its checkpoints
// ship them (4.25 bits a weight; mxfp4.cuh has the format and its decoding). The same work as the
// dense kernels, token by token (blockIdx.y), inside CUDA graphs and launched early (pdl.cuh):
// moe_gate_up_fp4_kernel stages the token's input (RMSNorm folded in where asked) and writes each
// chosen expert's activation; moe_down_fp4_kernel sums the experts' down projections with their
// routing weights. A lane loads whole runs of 32 weights (16 bytes of codes and the scale byte),
// kFp4Batch runs of a row before it uses the first; codes become exact f16 pairs by table lookups
// and meet an f16 copy of the staged input laid out piece-major (fp4_staged_at), so the lanes of
// consecutive runs read consecutive 16-byte pieces.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"
#include "moe.cuh"
#include "moe_launch.cuh"
#include "mxfp4.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

// Runs a lane loads before it uses the first (MXFP4): enough 16-byte loads in flight.
constexpr int kFp4Batch = 4;

// The dot products of two MXFP4 rows (codes c0, c1 and scales s0, s1 at their starts) with one
// staged row xs (k_dim values, a multiple of 32, staged by fp4_input8 at fp4_staged_at), summed
// over the warp: lane l takes runs l,
// l + 32, ..., loading kFp4Batch runs of each row before it sums them.
__device__ __forceinline__ float2 warp_dot2_fp4(const uint8_t* __restrict__ c0,
                                                const uint8_t* __restrict__ s0,
                                                const uint8_t* __restrict__ c1,
                                                const uint8_t* __restrict__ s1, const __half* xs,
                                                int k_dim, int lane) {
  const int runs = k_dim / 32;
  float a0 = 0.f, a1 = 0.f;
  for (int first = lane; first < runs; first += 32 * kFp4Batch) {
    Fp4Run r0[kFp4Batch], r1[kFp4Batch];
#pragma unroll
    for (int i = 0; i < kFp4Batch; ++i) {
      const int b = first + 32 * i;
      if (b < runs) r0[i] = fp4_run(c0, s0, b), r1[i] = fp4_run(c1, s1, b);
    }
#pragma unroll
    for (int i = 0; i < kFp4Batch; ++i) {
      const int b = first + 32 * i;
      if (b < runs) {
        a0 += fp4_run_dot(r0[i], xs + 8 * b, 8 * runs);
        a1 += fp4_run_dot(r1[i], xs + 8 * b, 8 * runs);
      }
    }
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    a0 += __shfl_xor_sync(0xffffffff, a0, s);
    a1 += __shfl_xor_sync(0xffffffff, a1, s);
  }
  return make_float2(a0, a1);
}

// sum_j weight[j] * (row o of expert[j] in the MXFP4 stack (codes, scales; [experts, out_dim,
// k_dim]) . xs[j]) for j below top_k, over the warp: the top_k rows' runs taken as one sequence (xs's rows are
// contiguous), kFp4Batch runs loaded at a time.
__device__ __forceinline__ float warp_dot_experts_fp4(const uint8_t* __restrict__ codes,
                                                      const uint8_t* __restrict__ scales,
                                                      const int64_t* expert, int out_dim, int o,
                                                      const float* weight, int top_k,
                                                      const __half* xs, int k_dim, int lane) {
  const int runs = k_dim / 32, all = top_k * runs;
  float acc = 0.f;
  for (int first = lane; first < all; first += 32 * kFp4Batch) {
    Fp4Run r[kFp4Batch];
#pragma unroll
    for (int i = 0; i < kFp4Batch; ++i) {
      const int f = first + 32 * i, j = f / runs;
      const int64_t row = expert[j] * out_dim + o;
      if (f < all) r[i] = fp4_run(codes + row * (k_dim / 2), scales + row * runs, f - j * runs);
    }
#pragma unroll
    for (int i = 0; i < kFp4Batch; ++i) {
      const int f = first + 32 * i;
      if (f < all) acc += weight[f / runs] * fp4_run_dot(r[i], xs + 8 * f, 8 * all);
    }
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
  return acc;
}

// a[t * top_k + j, o] = act(g, u) as moe.cu's moe_gate_up_kernel computes it (g, u rounded to
// T, bias added, SiLU-and-mul or the clamped SwiGLU), from MXFP4 rows: codes [experts, 2 inner,
// k_dim / 2] bytes, gate rows first, and their scales [experts, 2 inner, k_dim / 32]. The input is
// staged as T (RMSNorm folded in for kIn = kRmsNorm), then again as f16, piece-major.
template <typename T, int kIn>
__global__ void __launch_bounds__(kGemvThreads)
    moe_gate_up_fp4_kernel(T* __restrict__ a, const T* __restrict__ x,
                           const T* __restrict__ norm_w, float eps,
                           const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                           const T* __restrict__ bias, const uint32_t* __restrict__ ids,
                           int top_k, int inner, int k_dim, float alpha, float limit) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  __half* xh = reinterpret_cast<__half*>(xs + k_dim);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (ids are the routing's output; x is read before it)
  let_next_grid_launch();
  stage_input<T, 1, kIn>(xs, x + (int64_t)t * k_dim, norm_w, k_dim, eps);
  for (int p = threadIdx.x; p < k_dim / 8; p += kGemvThreads)
    *reinterpret_cast<uint4*>(xh + fp4_staged_at(p, k_dim / 32)) =
        fp4_input8<T>(*reinterpret_cast<const uint4*>(xs + 8 * p));
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int units = top_k * inner;
  for (int u = blockIdx.x * kGemvWarps + warp; u < units; u += gridDim.x * kGemvWarps) {
    const int j = u / inner, o = u % inner;
    const int64_t e = ids[(int64_t)t * top_k + j];
    const int64_t gate_row = e * 2 * inner + o, up_row = gate_row + inner;
    float2 gu = warp_dot2_fp4(codes + gate_row * (k_dim / 2), scales + gate_row * (k_dim / 32),
                              codes + up_row * (k_dim / 2), scales + up_row * (k_dim / 32), xh,
                              k_dim, lane);
    if (bias != nullptr) {
      gu.x += to_float(bias[e * 2 * inner + o]);
      gu.y += to_float(bias[e * 2 * inner + inner + o]);
    }
    const float g = to_float(from_float<T>(gu.x)), up = to_float(from_float<T>(gu.y));
    const float v = alpha > 0.f ? clamped_swiglu(g, up, alpha, limit) : silu_mul(g, up);
    if (lane == 0) a[((int64_t)t * top_k + j) * inner + o] = from_float<T>(v);
  }
}

// y[t, o] as moe.cu's moe_down_kernel computes it (the experts' outputs weighted in f32, their
// biases inside the weighting, the residual added before rounding), from MXFP4 rows ([experts,
// out_dim, k_dim]): a warp an output, the token's top_k activation rows staged as f16, piece-major,
// as one sequence of runs. Two blocks an SM (its lanes hold kFp4Batch runs in registers).
template <typename T>
__global__ void __launch_bounds__(kGemvThreads, 2)
    moe_down_fp4_kernel(T* __restrict__ y, const T* __restrict__ a,
                        const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                        const T* __restrict__ bias, const T* __restrict__ residual,
                        const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                        int top_k, int out_dim, int k_dim) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t expert[kMaxTopK];
  __shared__ float weight[kMaxTopK];
  __half* xs = reinterpret_cast<__half*>(smem);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (a is gate/up's output)
  let_next_grid_launch();
  const T* rows = a + (int64_t)t * top_k * k_dim;
  for (int i = threadIdx.x * 8; i < top_k * k_dim; i += kGemvThreads * 8)
    *reinterpret_cast<uint4*>(xs + fp4_staged_at(i / 8, top_k * k_dim / 32)) =
        fp4_input8<T>(*reinterpret_cast<const uint4*>(rows + i));
  if (threadIdx.x < top_k) {
    expert[threadIdx.x] = ids[(int64_t)t * top_k + threadIdx.x];
    weight[threadIdx.x] = weights[(int64_t)t * top_k + threadIdx.x];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int o = blockIdx.x * kGemvWarps + warp; o < out_dim; o += gridDim.x * kGemvWarps) {
    const float acc = warp_dot_experts_fp4(codes, scales, expert, out_dim, o, weight, top_k, xs,
                                           k_dim, lane);
    // (The experts' biases, weighted, and the residual: summed first, as moe.cu does.)
    float b = residual != nullptr ? to_float(residual[(int64_t)t * out_dim + o]) : 0.f;
    if (bias != nullptr)
      for (int j = 0; j < top_k; ++j) b += weight[j] * to_float(bias[expert[j] * out_dim + o]);
    if (lane == 0) y[(int64_t)t * out_dim + o] = from_float<T>(acc + b);
  }
}

template <typename T, int kIn>
int launch_gate_up(void* a, const void* x, const void* norm_w, float eps, const uint8_t* codes,
                   const uint8_t* scales, const void* bias, const uint32_t* ids, int tokens,
                   int top_k, int inner, int k_dim, Activation act, cudaStream_t stream) {
  constexpr auto kernel = moe_gate_up_fp4_kernel<T, kIn>;
  // (The staged input as T, then as f16.)
  const int smem = k_dim * (int)(sizeof(T) + sizeof(__half));
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, top_k * inner, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)a, (const T*)x, (const T*)norm_w, eps, codes,
                                       scales, (const T*)bias, ids, top_k, inner, k_dim,
                                       act.alpha, act.limit);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T>
int launch_down(void* y, const void* a, const uint8_t* codes, const uint8_t* scales,
                const void* bias, const void* residual, const uint32_t* ids,
                const float* weights, int tokens, int top_k, int out_dim, int k_dim,
                cudaStream_t stream) {
  constexpr auto kernel = moe_down_fp4_kernel<T>;
  const int smem = top_k * k_dim * (int)sizeof(__half);
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, out_dim, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)y, (const T*)a, codes, scales, (const T*)bias,
                                       (const T*)residual, ids, weights, top_k, out_dim, k_dim);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T>
int gate_up_by_input(void* a, const void* x, const void* norm_w, float eps, const uint8_t* codes,
                     const uint8_t* scales, const void* bias, const uint32_t* ids, int tokens,
                     int top_k, int inner, int k_dim, Activation act, cudaStream_t stream) {
  if (norm_w != nullptr)
    return launch_gate_up<T, kRmsNorm>(a, x, norm_w, eps, codes, scales, bias, ids, tokens, top_k,
                                       inner, k_dim, act, stream);
  return launch_gate_up<T, kPlain>(a, x, norm_w, eps, codes, scales, bias, ids, tokens, top_k,
                                   inner, k_dim, act, stream);
}

}  // namespace

int moe_fp4_gate_up(int dtype, void* a, const void* x, const void* norm_w, float eps,
                    const uint8_t* codes, const uint8_t* scales, const void* bias,
                    const uint32_t* ids, int tokens, int top_k, int inner, int k_dim,
                    Activation act, cudaStream_t stream) {
  switch (dtype) {
    case 1:
      return gate_up_by_input<__half>(a, x, norm_w, eps, codes, scales, bias, ids, tokens, top_k,
                                      inner, k_dim, act, stream);
    case 2:
      return gate_up_by_input<__nv_bfloat16>(a, x, norm_w, eps, codes, scales, bias, ids, tokens,
                                             top_k, inner, k_dim, act, stream);
    default: return 1;
  }
}

int moe_fp4_down(int dtype, void* y, const void* a, const uint8_t* codes, const uint8_t* scales,
                 const void* bias, const void* residual, const uint32_t* ids,
                 const float* weights, int tokens, int top_k, int out_dim, int k_dim,
                 cudaStream_t stream) {
  switch (dtype) {
    case 1:
      return launch_down<__half>(y, a, codes, scales, bias, residual, ids, weights, tokens, top_k,
                                 out_dim, k_dim, stream);
    case 2:
      return launch_down<__nv_bfloat16>(y, a, codes, scales, bias, residual, ids, weights, tokens,
                                        top_k, out_dim, k_dim, stream);
    default: return 1;
  }
}
