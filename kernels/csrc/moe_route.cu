// pagewise: a mixture-of-experts layer's routing on the device, for the decode path (moe.cu) and
// larger steps' grouped GEMMs alike: the router's f32 logits (moe_router_kernel, the layer's
// RMSNorm folded into its staging), then each token's top-k experts and their weights
// (moe_route_kernel). Both are launched early (pdl.cuh): they wait for the kernel before them
// only where they read what it wrote, and the router streams its first weights before that.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"
#include "moe.cuh"
#include "pdl.cuh"
#include "route.cuh"

namespace {

// Routing of token blockIdx.x (one warp, route.cuh); ids and weights: [tokens, top_k].
__global__ void moe_route_kernel(const float* __restrict__ logits, int experts, int top_k,
                                 int renormalize, uint32_t* __restrict__ ids,
                                 float* __restrict__ weights) {
  wait_for_previous_grid();  // (the logits are the router's)
  let_next_grid_launch();
  const int t = blockIdx.x, lane = threadIdx.x;
  int id;
  float weight;
  route_token(logits + (int64_t)t * experts, 1.f, experts, top_k, renormalize, lane, id, weight);
  if (lane < top_k) {
    ids[(int64_t)t * top_k + lane] = (uint32_t)id;
    weights[(int64_t)t * top_k + lane] = weight;
  }
}

// Warps splitting one expert's router row, and experts a block of the router kernel.
constexpr int kRouterSlices = 8;
constexpr int kRouterExperts = kGemvWarps / kRouterSlices;
// float4s of its slice a lane of the router loads before it waits for the kernel before it.
constexpr int kRouterEarly = 4;

// A router's f32 logits[t, e] = x[t] . w[e] for token t = blockIdx.y (w: [experts, k_dim] f32),
// x staged once a block (kIn = kRmsNorm: RMSNorm(x) * norm_w rounded to T, as the experts take
// it). Each expert's row is cut into kRouterSlices slices, a warp each, so a router of few
// experts still spreads over many blocks (Qwen3-30B-A3B's 128 x 2048: 64 blocks a token, not 8).
// The weights stay f32: in 16 bits near-tied experts swap places.
template <typename T, int kIn>
__global__ void __launch_bounds__(kGemvThreads)
    moe_router_kernel(float* __restrict__ logits, const T* __restrict__ x,
                      const T* __restrict__ norm_w, float eps, const float* __restrict__ w,
                      int experts, int k_dim) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kGemvWarps];
  T* xs = reinterpret_cast<T*>(smem);
  const int t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * kRouterExperts + warp / kRouterSlices;
  const int slice = warp % kRouterSlices;
  // Slices of whole float4s (k_dim is a multiple of 8).
  const int per = (k_dim / 4 + kRouterSlices - 1) / kRouterSlices * 4;
  const int begin = slice * per, end = min(k_dim, begin + per);
  const float* row = w + (int64_t)(e < experts ? e : 0) * k_dim;
  // The weights belong to no kernel before this one: the first ones are loaded while that one
  // may still run (Qwen3-30B-A3B's and gpt-oss's whole slices).
  float4 early[kRouterEarly];
#pragma unroll
  for (int i = 0; i < kRouterEarly; ++i) {
    const int k = begin + (lane + 32 * i) * 4;
    early[i] = e < experts && k < end ? __ldg(reinterpret_cast<const float4*>(row + k))
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  wait_for_previous_grid();  // (x is the kernel before's output)
  let_next_grid_launch();
  stage_input<T, 1, kIn>(xs, x + (int64_t)t * k_dim, norm_w, k_dim, eps);
  const auto dot4 = [&](float4 wv, int k) {
    return wv.x * to_float(xs[k]) + wv.y * to_float(xs[k + 1]) + wv.z * to_float(xs[k + 2]) +
           wv.w * to_float(xs[k + 3]);
  };
  float acc = 0.f;
  if (e < experts) {
    // (The same order of sums as one loop over the slice.)
#pragma unroll
    for (int i = 0; i < kRouterEarly; ++i) {
      const int k = begin + (lane + 32 * i) * 4;
      if (k < end) acc += dot4(early[i], k);
    }
#pragma unroll 2
    for (int k = begin + (lane + 32 * kRouterEarly) * 4; k < end; k += 32 * 4)
      acc += dot4(__ldg(reinterpret_cast<const float4*>(row + k)), k);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (e < experts && slice == 0 && lane == 0) {
    float sum = 0.f;
    for (int i = 0; i < kRouterSlices; ++i) sum += partial[warp + i];
    logits[(int64_t)t * experts + e] = sum;
  }
}

template <typename T>
int launch_router(float* logits, const void* x, const void* norm_w, float eps, const float* w,
                  int tokens, int experts, int k_dim, cudaStream_t stream) {
  const int smem = k_dim * (int)sizeof(T);
  const dim3 grid((experts + kRouterExperts - 1) / kRouterExperts, tokens);
  const auto kernel = norm_w != nullptr ? moe_router_kernel<T, kRmsNorm> : moe_router_kernel<T, kPlain>;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
  }
  const cudaError_t err = launch_early(kernel, grid, dim3(kGemvThreads), smem, stream, logits,
                                       (const T*)x, (const T*)norm_w, eps, w, experts, k_dim);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

}  // namespace

// A router's f32 logits ([tokens, experts]) of x ([tokens, k_dim]; RMSNorm(x) * norm_w with `eps`
// first when norm_w ([k_dim]) is not null) times w ([experts, k_dim], f32). dtype 1 = f16,
// 2 = bf16 (x and norm_w); k_dim a multiple of 8 within the staging space; x, norm_w and w
// 16-byte aligned. Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_router(int dtype, float* logits, const void* x, const void* norm_w,
                                   float eps, const float* w, int tokens, int experts, int k_dim,
                                   void* stream) {
  if (tokens == 0 || experts == 0) return 0;
  if (k_dim % 8 != 0 || k_dim * 2 > kMaxStageBytes) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch_router<__half>(logits, x, norm_w, eps, w, tokens, experts, k_dim, s);
    case 2:
      return launch_router<__nv_bfloat16>(logits, x, norm_w, eps, w, tokens, experts, k_dim, s);
    default: return 1;
  }
}

// Routing of `tokens` rows of f32 router logits ([tokens, experts]) to ids (u32) and weights
// (f32), both [tokens, top_k]: softmax, the top_k largest (ties to the lower expert), renormalized
// over the chosen ones when `renormalize`. top_k 1..16, at most `experts`; experts at most 256.
// Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_route(const float* logits, uint32_t* ids, float* weights, int tokens,
                                  int experts, int top_k, int renormalize, void* stream) {
  if (tokens == 0) return 0;
  if (top_k < 1 || top_k > kMaxTopK || top_k > experts || experts > kMaxExperts) return 1;
  const cudaError_t err = launch_early(moe_route_kernel, dim3(tokens), dim3(32), 0,
                                       (cudaStream_t)stream, logits, experts, top_k, renormalize,
                                       ids, weights);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

// The most experts pagewise_moe_route takes.
extern "C" int pagewise_moe_max_experts() { return kMaxExperts; }
