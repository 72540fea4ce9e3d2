// pagewise fused elementwise kernels for the decoder layer: residual add + RMSNorm in one pass, the
// residual add of a normalized output (Gemma's norms after attention and the MLP), and
// SiLU(gate) * up over a fused gate/up projection. Both compute in f32 and store in the tensor dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

constexpr int kThreads = 256;

// 1 / rms of a row of `hidden` elements from each thread's sum of squares `sq`, for every thread
// of the block: warp sums by shuffles, then the warps' sums added in warp order.
__device__ __forceinline__ float block_inv_rms(float sq, int hidden, float eps) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sq;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return rsqrtf(total / hidden + eps);
}

// One block per row: sum = x + delta (stored, rounded to T, as the unfused ops would), then
// normed = sum / rms(sum) * weight, with the rms taken over the rounded sum.
template <typename T>
__global__ void add_rms_norm_kernel(T* __restrict__ sum_out, T* __restrict__ normed,
                                    const T* __restrict__ x, const T* __restrict__ delta,
                                    const T* __restrict__ weight, int hidden, float eps) {
  const int64_t base = (int64_t)blockIdx.x * hidden;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    const T s = from_float<T>(to_float(x[base + i]) + to_float(delta[base + i]));
    sum_out[base + i] = s;
    const float v = to_float(s);
    sq += v * v;
  }
  const float inv_rms = block_inv_rms(sq, hidden, eps);
  // Each thread reads back the elements it wrote itself: no barrier needed for them.
  for (int i = threadIdx.x; i < hidden; i += kThreads)
    normed[base + i] = from_float<T>(to_float(sum_out[base + i]) * inv_rms * to_float(weight[i]));
}

// The same for rows whose elements fit 16-byte vectors (hidden % (16 / sizeof(T)) == 0, 16-byte
// aligned rows, hidden <= kThreads * kPer vectors): one load of x, delta and weight per vector,
// all issued before the reduction, and the sum kept in registers instead of read back.
template <typename T, int kPer>
__global__ void add_rms_norm_vec_kernel(T* __restrict__ sum_out, T* __restrict__ normed,
                                        const T* __restrict__ x, const T* __restrict__ delta,
                                        const T* __restrict__ weight, int hidden, float eps) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t base = (int64_t)blockIdx.x * hidden;
  const int vectors = hidden / kVec;
  float s[kPer][kVec];
  uint4 w[kPer];
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int v = threadIdx.x + j * kThreads;
    if (v >= vectors) break;
    const uint4 xa = *reinterpret_cast<const uint4*>(x + base + v * kVec);
    const uint4 da = *reinterpret_cast<const uint4*>(delta + base + v * kVec);
    w[j] = *reinterpret_cast<const uint4*>(weight + v * kVec);
    const T* xv = reinterpret_cast<const T*>(&xa);
    const T* dv = reinterpret_cast<const T*>(&da);
    uint4 sa;
    T* sv = reinterpret_cast<T*>(&sa);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      sv[e] = from_float<T>(to_float(xv[e]) + to_float(dv[e]));
      s[j][e] = to_float(sv[e]);
      sq += s[j][e] * s[j][e];
    }
    *reinterpret_cast<uint4*>(sum_out + base + v * kVec) = sa;
  }
  const float inv_rms = block_inv_rms(sq, hidden, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int v = threadIdx.x + j * kThreads;
    if (v >= vectors) break;
    const T* wv = reinterpret_cast<const T*>(&w[j]);
    uint4 na;
    T* nv = reinterpret_cast<T*>(&na);
#pragma unroll
    for (int e = 0; e < kVec; ++e) nv[e] = from_float<T>(s[j][e] * inv_rms * to_float(wv[e]));
    *reinterpret_cast<uint4*>(normed + base + v * kVec) = na;
  }
}

// One block per row: out = x + RMSNorm(delta) * weight, the normalized delta rounded to T before
// the add as the separate norm kernel stores it. Launched early (pdl.cuh): x and delta are the
// kernels before's outputs.
template <typename T>
__global__ void add_rms_normed_kernel(T* __restrict__ out, const T* __restrict__ x,
                                      const T* __restrict__ delta, const T* __restrict__ weight,
                                      int hidden, float eps) {
  wait_for_previous_grid();
  let_next_grid_launch();
  const int64_t base = (int64_t)blockIdx.x * hidden;
  float sq = 0.f;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    const float d = to_float(delta[base + i]);
    sq += d * d;
  }
  const float inv_rms = block_inv_rms(sq, hidden, eps);
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    const T n = from_float<T>(to_float(delta[base + i]) * inv_rms * to_float(weight[i]));
    out[base + i] = from_float<T>(to_float(x[base + i]) + to_float(n));
  }
}

// The same for rows whose elements fit 16-byte vectors (as add_rms_norm_vec_kernel): delta and x
// loaded once, all before the reduction, and kept in registers.
template <typename T, int kPer>
__global__ void add_rms_normed_vec_kernel(T* __restrict__ out, const T* __restrict__ x,
                                          const T* __restrict__ delta,
                                          const T* __restrict__ weight, int hidden, float eps) {
  wait_for_previous_grid();
  let_next_grid_launch();
  constexpr int kVec = 16 / sizeof(T);
  const int64_t base = (int64_t)blockIdx.x * hidden;
  const int vectors = hidden / kVec;
  uint4 dv[kPer], xv[kPer];
  float sq = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int v = threadIdx.x + j * kThreads;
    if (v >= vectors) break;
    dv[j] = *reinterpret_cast<const uint4*>(delta + base + v * kVec);
    xv[j] = *reinterpret_cast<const uint4*>(x + base + v * kVec);
    const T* d = reinterpret_cast<const T*>(&dv[j]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) sq += to_float(d[e]) * to_float(d[e]);
  }
  const float inv_rms = block_inv_rms(sq, hidden, eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int v = threadIdx.x + j * kThreads;
    if (v >= vectors) break;
    const uint4 wa = *reinterpret_cast<const uint4*>(weight + v * kVec);
    const T* w = reinterpret_cast<const T*>(&wa);
    const T* d = reinterpret_cast<const T*>(&dv[j]);
    const T* xs = reinterpret_cast<const T*>(&xv[j]);
    uint4 oa;
    T* o = reinterpret_cast<T*>(&oa);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const T n = from_float<T>(to_float(d[e]) * inv_rms * to_float(w[e]));
      o[e] = from_float<T>(to_float(xs[e]) + to_float(n));
    }
    *reinterpret_cast<uint4*>(out + base + v * kVec) = oa;
  }
}

template <typename T>
int launch_add_rms_normed(void* out, const void* x, const void* delta, const void* weight,
                          int rows, int hidden, float eps, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T), kPer = 4;
  const uintptr_t addresses =
      (uintptr_t)out | (uintptr_t)x | (uintptr_t)delta | (uintptr_t)weight;
  cudaError_t err;
  if (addresses % 16 == 0 && hidden % kVec == 0 && hidden <= kThreads * kVec * kPer)
    err = launch_early(add_rms_normed_vec_kernel<T, kPer>, dim3(rows), dim3(kThreads), 0, stream,
                       (T*)out, (const T*)x, (const T*)delta, (const T*)weight, hidden, eps);
  else
    err = launch_early(add_rms_normed_kernel<T>, dim3(rows), dim3(kThreads), 0, stream, (T*)out,
                       (const T*)x, (const T*)delta, (const T*)weight, hidden, eps);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i].
template <typename T>
__global__ void silu_mul_kernel(T* __restrict__ out, const T* __restrict__ gate_up, int64_t rows,
                                int inter) {
  const int64_t n = rows * inter;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / inter, i = idx % inter;
    const float g = to_float(gate_up[r * 2 * inter + i]);
    const float u = to_float(gate_up[r * 2 * inter + inter + i]);
    out[idx] = from_float<T>(silu_mul(g, u));
  }
}

// The same with 16-byte vectors of gate and up (widths a multiple of the vector, aligned rows):
// one load of each per 8 (16-bit) or 4 (f32) outputs, and one store.
template <typename T>
__global__ void silu_mul_vec_kernel(T* __restrict__ out, const T* __restrict__ gate_up,
                                    int64_t rows, int inter) {
  constexpr int kVec = 16 / sizeof(T);
  const int per_row = inter / kVec;
  const int64_t n = rows * per_row;
  for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < n;
       v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = v / per_row;
    const int i = (int)(v - r * per_row) * kVec;
    const uint4 ga = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + i);
    const uint4 ua = *reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter + i);
    *reinterpret_cast<uint4*>(out + r * inter + i) = silu_mul16<T>(ga, ua);
  }
}

template <typename T>
int launch_add_rms_norm(void* sum_out, void* normed, const void* x, const void* delta,
                        const void* weight, int rows, int hidden, float eps, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T), kPer = 4;
  const uintptr_t addresses = (uintptr_t)sum_out | (uintptr_t)normed | (uintptr_t)x |
                              (uintptr_t)delta | (uintptr_t)weight;
  if (addresses % 16 == 0 && hidden % kVec == 0 && hidden <= kThreads * kVec * kPer) {
    add_rms_norm_vec_kernel<T, kPer><<<rows, kThreads, 0, stream>>>(
        (T*)sum_out, (T*)normed, (const T*)x, (const T*)delta, (const T*)weight, hidden, eps);
    return (int)cudaGetLastError();
  }
  add_rms_norm_kernel<T><<<rows, kThreads, 0, stream>>>((T*)sum_out, (T*)normed, (const T*)x,
                                                        (const T*)delta, (const T*)weight, hidden,
                                                        eps);
  return (int)cudaGetLastError();
}

template <typename T>
int launch_silu_mul(void* out, const void* gate_up, int64_t rows, int inter, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = ((uintptr_t)out | (uintptr_t)gate_up) % 16 == 0 && inter % kVec == 0;
  const int64_t n = vec ? rows * (inter / kVec) : rows * inter;  // threads' work items
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = (int)(wanted < 132 * 16 ? wanted : 132 * 16);
  if (vec)
    silu_mul_vec_kernel<T><<<blocks, kThreads, 0, stream>>>((T*)out, (const T*)gate_up, rows, inter);
  else
    silu_mul_kernel<T><<<blocks, kThreads, 0, stream>>>((T*)out, (const T*)gate_up, rows, inter);
  return (int)cudaGetLastError();
}

}  // namespace

// out = x + RMSNorm(delta) * weight over [rows, hidden] (weight [hidden]); dtype 0 = f32, 1 = f16,
// 2 = bf16. Returns 0, a CUDA error code, or 1 for an unknown dtype.
extern "C" int pagewise_add_rms_normed(int dtype, void* out, const void* x, const void* delta,
                                       const void* weight, int rows, int hidden, float eps,
                                       void* stream) {
  if (rows == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 0: return launch_add_rms_normed<float>(out, x, delta, weight, rows, hidden, eps, s);
    case 1: return launch_add_rms_normed<__half>(out, x, delta, weight, rows, hidden, eps, s);
    case 2: return launch_add_rms_normed<__nv_bfloat16>(out, x, delta, weight, rows, hidden, eps, s);
    default: return 1;
  }
}

extern "C" int pagewise_add_rms_norm(int dtype, void* sum_out, void* normed, const void* x,
                                     const void* delta, const void* weight, int rows, int hidden,
                                     float eps, void* stream) {
  if (rows == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 0: return launch_add_rms_norm<float>(sum_out, normed, x, delta, weight, rows, hidden, eps, s);
    case 1: return launch_add_rms_norm<__half>(sum_out, normed, x, delta, weight, rows, hidden, eps, s);
    case 2: return launch_add_rms_norm<__nv_bfloat16>(sum_out, normed, x, delta, weight, rows, hidden, eps, s);
    default: return 1;
  }
}

extern "C" int pagewise_silu_mul(int dtype, void* out, const void* gate_up, int64_t rows, int inter,
                                 void* stream) {
  if (rows == 0) return 0;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 0: return launch_silu_mul<float>(out, gate_up, rows, inter, s);
    case 1: return launch_silu_mul<__half>(out, gate_up, rows, inter, s);
    case 2: return launch_silu_mul<__nv_bfloat16>(out, gate_up, rows, inter, s);
    default: return 1;
  }
}
