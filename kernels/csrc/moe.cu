// pagewise: a mixture-of-experts layer's experts for small (decode) batches without the host:
// each token's chosen experts (moe_route.cu routes them on the device) streamed once as GEMVs
// over the experts' stacked weights, the expert read from the routing output on the device
// (moe_gate_up_kernel, which also applies the activation, SiLU-and-mul or gpt-oss's clamped
// SwiGLU; moe_down_kernel, which sums the experts' outputs with their weights; either
// projection may have a bias per expert). No step reads anything back, so the layer runs inside
// a CUDA graph. Both kernels are launched early (pdl.cuh): they wait for the kernel before them
// only where they read what it wrote. A launch with scales reads MXFP4 weights instead (gpt-oss's
// experts as its checkpoints ship them): moe_fp4.cu's twins of these kernels take it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"
#include "moe.cuh"
#include "moe_launch.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

// The warp's dot product of a weight row with a staged row (k_dim elements, a multiple of 8),
// summed over the warp (every lane gets it).
template <typename T>
__device__ __forceinline__ float warp_dot(const T* __restrict__ w, const T* xs, int k_dim,
                                          int lane) {
  float acc = 0.f;
#pragma unroll 4
  for (int k = lane * 8; k < k_dim; k += 32 * 8) {
    const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(w + k));
    const uint4 xraw = *reinterpret_cast<const uint4*>(xs + k);
    const T* wv = reinterpret_cast<const T*>(&wraw);
    const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += to_float(wv[j]) * to_float(xv[j]);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
  return acc;
}

// The warp's dot products of two weight rows with one staged row (as warp_dot computes each:
// the same sums in the same order), their loads interleaved so twice as many are in flight.
template <typename T>
__device__ __forceinline__ float2 warp_dot2(const T* __restrict__ w0, const T* __restrict__ w1,
                                            const T* xs, int k_dim, int lane) {
  float a0 = 0.f, a1 = 0.f;
#pragma unroll 2
  for (int k = lane * 8; k < k_dim; k += 32 * 8) {
    const uint4 r0 = __ldg(reinterpret_cast<const uint4*>(w0 + k));
    const uint4 r1 = __ldg(reinterpret_cast<const uint4*>(w1 + k));
    const uint4 xraw = *reinterpret_cast<const uint4*>(xs + k);
    const T* v0 = reinterpret_cast<const T*>(&r0);
    const T* v1 = reinterpret_cast<const T*>(&r1);
    const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      a0 += to_float(v0[j]) * to_float(xv[j]);
      a1 += to_float(v1[j]) * to_float(xv[j]);
    }
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    a0 += __shfl_xor_sync(0xffffffff, a0, s);
    a1 += __shfl_xor_sync(0xffffffff, a1, s);
  }
  return make_float2(a0, a1);
}

// a[t * top_k + j, o] = act(g, u) for token t = blockIdx.y and inner column o, where g and u are
// x[t] . w[e, o] and x[t] . w[e, inner + o] (+ bias[e, o] and bias[e, inner + o]) for expert
// e = ids[t, j] (w: [experts, 2 inner, k_dim], gate rows first; bias null or [experts, 2 inner]),
// x staged once (kIn = kRmsNorm: RMSNorm(x) * norm_w, rounded to T, staged in its place). A warp
// computes both rows of a column. g and u are rounded to T, as a projection stores them, and so
// is the activation (alpha <= 0: SiLU-and-mul; else the clamped SwiGLU with alpha and limit), as
// the separate kernel stores it.
template <typename T, int kIn>
__global__ void __launch_bounds__(kGemvThreads)
    moe_gate_up_kernel(T* __restrict__ a, const T* __restrict__ x, const T* __restrict__ norm_w,
                       float eps, const T* __restrict__ w, const T* __restrict__ bias,
                       const uint32_t* __restrict__ ids, int top_k, int inner, int k_dim,
                       float alpha, float limit) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (ids are the routing's output; x is read before it)
  let_next_grid_launch();
  stage_input<T, 1, kIn>(xs, x + (int64_t)t * k_dim, norm_w, k_dim, eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int units = top_k * inner;
  for (int u = blockIdx.x * kGemvWarps + warp; u < units; u += gridDim.x * kGemvWarps) {
    const int j = u / inner, o = u % inner;
    const int64_t e = ids[(int64_t)t * top_k + j];
    const T* gate = w + (e * 2 * inner + o) * k_dim;
    float2 gu = warp_dot2(gate, gate + (int64_t)inner * k_dim, xs, k_dim, lane);
    if (bias != nullptr) {
      gu.x += to_float(bias[e * 2 * inner + o]);
      gu.y += to_float(bias[e * 2 * inner + inner + o]);
    }
    const float g = to_float(from_float<T>(gu.x)), up = to_float(from_float<T>(gu.y));
    const float v = alpha > 0.f ? clamped_swiglu(g, up, alpha, limit) : silu_mul(g, up);
    if (lane == 0) a[((int64_t)t * top_k + j) * inner + o] = from_float<T>(v);
  }
}

// y[t, o] = sum_j weights[t, j] * a[t * top_k + j] . w[ids[t, j], o] for token t = blockIdx.y,
// where a = [tokens * top_k, k_dim] holds each chosen expert's activation (moe_gate_up_kernel's
// output) and w = [experts, out_dim, k_dim]. The weighted sum is taken in f32, with each
// expert's bias ([experts, out_dim], or null) inside the weighting, and `residual`
// ([tokens, out_dim], or null) added to the sum before it is rounded. An output's top_k x k_dim
// products are cut into `split` slices (1, 2, 4 or 8) of whole 256-element steps, a warp each,
// so few outputs still keep enough loads in flight (Mixtral: 4096 outputs of 2 x 14336); the
// slices' warps sit in one block and meet in shared memory. Held to 32 registers (4 blocks an
// SM, not 3): Qwen3-30B-A3B's 512 blocks a token run in one round (14.2 -> 12.4 µs on the
// H200). (The gate/up kernel held to 3 blocks an SM lost: Mixtral's 117 -> 121 µs, gpt-oss-20b's
// 37.8 -> 40.)
template <typename T>
__global__ void __launch_bounds__(kGemvThreads, 4)
    moe_down_kernel(T* __restrict__ y, const T* __restrict__ a, const T* __restrict__ w,
                    const T* __restrict__ bias, const T* __restrict__ residual,
                    const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                    int top_k, int out_dim, int k_dim, int split) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kGemvWarps];
  __shared__ int64_t expert[kMaxTopK];
  __shared__ float weight[kMaxTopK];
  T* xs = reinterpret_cast<T*>(smem);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (a is gate/up's output)
  let_next_grid_launch();
  // The token's top_k activation rows are contiguous in `a`, as they are staged.
  const T* rows = a + (int64_t)t * top_k * k_dim;
  for (int i = threadIdx.x * 8; i < top_k * k_dim; i += kGemvThreads * 8)
    *reinterpret_cast<uint4*>(xs + i) = *reinterpret_cast<const uint4*>(rows + i);
  if (threadIdx.x < top_k) {
    expert[threadIdx.x] = ids[(int64_t)t * top_k + threadIdx.x];
    weight[threadIdx.x] = weights[(int64_t)t * top_k + threadIdx.x];
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int total = top_k * k_dim;
  const int per = ((total + 255) / 256 + split - 1) / split * 256;
  const int units = out_dim * split;
  // The experts' biases of output o, weighted, and its residual.
  const auto biased = [&](int o) {
    float b = residual != nullptr ? to_float(residual[(int64_t)t * out_dim + o]) : 0.f;
    if (bias != nullptr)
      for (int j = 0; j < top_k; ++j) b += weight[j] * to_float(bias[expert[j] * out_dim + o]);
    return b;
  };
  if (split == 1) {
    // A warp an output, expert after expert (the loop of warp_dot keeps more loads in flight
    // than the sliced one below: Mixtral's layer 198.1 µs against 206.7).
    for (int o = blockIdx.x * kGemvWarps + warp; o < out_dim; o += gridDim.x * kGemvWarps) {
      float acc = 0.f;
      for (int j = 0; j < top_k; ++j)
        acc += weight[j] *
               warp_dot(w + (expert[j] * out_dim + o) * k_dim, xs + j * k_dim, k_dim, lane);
      if (lane == 0) y[(int64_t)t * out_dim + o] = from_float<T>(acc + biased(o));
    }
    return;
  }
  // Rounds of kGemvWarps units, the same for every warp of the block (so it may sync).
  for (int base = blockIdx.x * kGemvWarps; base < units; base += gridDim.x * kGemvWarps) {
    const int u = base + warp, o = u / split;
    float acc = 0.f;
    if (u < units) {
      const int begin = (u % split) * per, end = min(total, begin + per);
#pragma unroll 4
      for (int f = begin + lane * 8; f < end; f += 32 * 8) {
        // (k_dim is a multiple of 8: a lane's 8 products belong to one expert.)
        const int j = f / k_dim, k = f - j * k_dim;
        const uint4 wraw =
            __ldg(reinterpret_cast<const uint4*>(w + (expert[j] * out_dim + o) * k_dim + k));
        const uint4 xraw = *reinterpret_cast<const uint4*>(xs + f);
        const T* wv = reinterpret_cast<const T*>(&wraw);
        const T* xv = reinterpret_cast<const T*>(&xraw);
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) d += to_float(wv[i]) * to_float(xv[i]);
        acc += weight[j] * d;
      }
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
    }
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (u < units && lane == 0 && u % split == 0) {
      float sum = biased(o);
      for (int i = 0; i < split; ++i) sum += partial[warp + i];
      y[(int64_t)t * out_dim + o] = from_float<T>(sum);
    }
    __syncthreads();
  }
}

// Slices an output of moe_down_kernel takes. Short outputs (at most 8192 products: Qwen3-30B-A3B's
// 8 x 768) are cut until there are about 16k warps, each slice at least two 256-element steps
// (its layer 44.2 -> 42.7 µs on the H200); long ones keep one warp each, which streams enough
// at once (Mixtral's 2 x 14336: 198.1 µs whole, 211.2 µs in 4 slices, whose warps wait for each
// other at the block's barriers; gpt-oss-20b's 4 x 2880: 291.5 tok/s whole, 284.2 in 8).
int down_split(int out_dim, int total) {
  int split = 1;
  if (total > 8192) return split;
  while (split < 8 && out_dim * split < 16384 && total / (2 * split) >= 512) split *= 2;
  return split;
}

template <typename T, int kIn>
int launch_gate_up(void* a, const void* x, const void* norm_w, float eps, const void* w,
                   const void* bias, const uint32_t* ids, int tokens, int top_k, int inner,
                   int k_dim, Activation act, cudaStream_t stream) {
  constexpr auto kernel = moe_gate_up_kernel<T, kIn>;
  const int smem = k_dim * (int)sizeof(T);
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, top_k * inner, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)a, (const T*)x, (const T*)norm_w, eps,
                                       (const T*)w, (const T*)bias, ids, top_k, inner, k_dim,
                                       act.alpha, act.limit);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T>
int gate_up_by_input(void* a, const void* x, const void* norm_w, float eps, const void* w,
                     const void* bias, const uint32_t* ids, int tokens, int top_k, int inner,
                     int k_dim, Activation act, cudaStream_t stream) {
  if (norm_w != nullptr)
    return launch_gate_up<T, kRmsNorm>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner,
                                       k_dim, act, stream);
  return launch_gate_up<T, kPlain>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner, k_dim,
                                   act, stream);
}

template <typename T>
int launch_down(void* y, const void* a, const void* w, const void* bias, const void* residual,
                const uint32_t* ids, const float* weights, int tokens, int top_k, int out_dim,
                int k_dim, cudaStream_t stream) {
  constexpr auto kernel = moe_down_kernel<T>;
  const int smem = top_k * k_dim * (int)sizeof(T);
  const int split = down_split(out_dim, top_k * k_dim);
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, out_dim * split, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)y, (const T*)a, (const T*)w, (const T*)bias,
                                       (const T*)residual, ids, weights, top_k, out_dim, k_dim,
                                       split);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

}  // namespace

// a ([tokens * top_k, inner]) = the activation of each token's x ([tokens, k_dim]; RMSNorm(x) *
// norm_w with `eps` when norm_w ([k_dim]) is not null) times its chosen experts' gate rows and up
// rows of w ([experts, 2 inner, k_dim], gate rows first), plus their bias rows (null or
// [experts, 2 inner]): silu(gate) * up when alpha <= 0, else gpt-oss's clamped SwiGLU (alpha,
// limit). ids [tokens, top_k] (u32, below `experts`, the caller's promise). dtype 1 = f16,
// 2 = bf16; k_dim a multiple of 8; x, norm_w and w 16-byte aligned. With `scales` not null, w
// holds MXFP4 codes and `scales` their scales (mxfp4.cuh; k_dim a multiple of 32). Returns 0, a
// CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_gate_up(int dtype, void* a, const void* x, const void* norm_w,
                                    float eps, const void* w, const uint8_t* scales,
                                    const void* bias, const uint32_t* ids, int tokens, int top_k,
                                    int inner, int k_dim, float alpha, float limit,
                                    void* stream) {
  if (tokens == 0 || inner == 0) return 0;
  if (k_dim % (scales != nullptr ? 32 : 8) != 0 || top_k < 1) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  const Activation act{alpha, limit};
  if (scales != nullptr)
    return moe_fp4_gate_up(dtype, a, x, norm_w, eps, static_cast<const uint8_t*>(w), scales, bias,
                           ids, tokens, top_k, inner, k_dim, act, s);
  switch (dtype) {
    case 1:
      return gate_up_by_input<__half>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner,
                                      k_dim, act, s);
    case 2:
      return gate_up_by_input<__nv_bfloat16>(a, x, norm_w, eps, w, bias, ids, tokens, top_k,
                                             inner, k_dim, act, s);
    default: return 1;
  }
}

// y ([tokens, out_dim]) = sum over a token's chosen experts j of weights[t, j] times (a's row
// t * top_k + j (a: [tokens * top_k, k_dim], pagewise_moe_gate_up's activations) times expert
// ids[t, j]'s rows of w ([experts, out_dim, k_dim]), plus its bias row (null or
// [experts, out_dim])), plus residual's row t (null or [tokens, out_dim]); top_k 1..16. dtype 1 =
// f16, 2 = bf16; k_dim a multiple of 8; top_k x k_dim elements within the staging space; a and w
// 16-byte aligned. With `scales` not null, w holds MXFP4 codes and `scales` their scales (k_dim a
// multiple of 32). Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_down(int dtype, void* y, const void* a, const void* w,
                                 const uint8_t* scales, const void* bias, const void* residual,
                                 const uint32_t* ids, const float* weights, int tokens, int top_k,
                                 int out_dim, int k_dim, void* stream) {
  if (tokens == 0 || out_dim == 0) return 0;
  if (k_dim % (scales != nullptr ? 32 : 8) != 0 || top_k < 1 || top_k > kMaxTopK) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  if (scales != nullptr)
    return moe_fp4_down(dtype, y, a, static_cast<const uint8_t*>(w), scales, bias, residual, ids,
                        weights, tokens, top_k, out_dim, k_dim, s);
  switch (dtype) {
    case 1:
      return launch_down<__half>(y, a, w, bias, residual, ids, weights, tokens, top_k, out_dim,
                                 k_dim, s);
    case 2:
      return launch_down<__nv_bfloat16>(y, a, w, bias, residual, ids, weights, tokens, top_k,
                                        out_dim, k_dim, s);
    default: return 1;
  }
}

// The most bytes of staged input (top_k x k_dim x element size) pagewise_moe_down takes.
extern "C" int pagewise_moe_max_stage_bytes() { return kMaxStageBytes; }
