// pagewise fused elementwise kernels for the decoder layer: residual add + RMSNorm in one pass, and
// SiLU(gate) * up over a fused gate/up projection. Both compute in f32 and store in the tensor dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

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
    out[idx] = from_float<T>(g / (1.f + __expf(-g)) * u);
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
    const T* g = reinterpret_cast<const T*>(&ga);
    const T* u = reinterpret_cast<const T*>(&ua);
    uint4 oa;
    T* o = reinterpret_cast<T*>(&oa);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float gf = to_float(g[j]);
      o[j] = from_float<T>(gf / (1.f + __expf(-gf)) * to_float(u[j]));
    }
    *reinterpret_cast<uint4*>(out + r * inter + i) = oa;
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

// y[r, o] = sum_k x[r, k] * w[o, k] for a few rows (R <= 8): the batch-1..8 decode matmuls, which
// only stream the weight once. One warp per output column o; lanes read 16 bytes of w at a time
// and keep one partial sum per row; x is small and read through the cache.
namespace {
template <typename T, int R>
__global__ void gemv_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                            int out_dim, int k_dim) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int o = blockIdx.x * (kThreads / 32) + warp;
  if (o >= out_dim) return;
  const T* wr = w + (int64_t)o * k_dim;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 4
  for (int k = lane * 8; k < k_dim; k += 32 * 8) {
    const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(wr + k));
    const T* wv = reinterpret_cast<const T*>(&wraw);
    float wf[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wf[j] = to_float(wv[j]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xraw = __ldg(reinterpret_cast<const uint4*>(x + (int64_t)r * k_dim + k));
      const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] += wf[j] * to_float(xv[j]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffff, v, s);
    if (lane == 0) y[(int64_t)r * out_dim + o] = from_float<T>(v);
  }
}

template <typename T>
int launch_gemv(void* y, const void* x, const void* w, int rows, int out_dim, int k_dim,
                cudaStream_t stream) {
  const int blocks = (out_dim + kThreads / 32 - 1) / (kThreads / 32);
#define PAGEWISE_GEMV(R)                                                                 \
  gemv_kernel<T, R><<<blocks, kThreads, 0, stream>>>((T*)y, (const T*)x, (const T*)w, out_dim, \
                                                     k_dim)
  switch (rows) {
    case 1: PAGEWISE_GEMV(1); break;
    case 2: PAGEWISE_GEMV(2); break;
    case 3: PAGEWISE_GEMV(3); break;
    case 4: PAGEWISE_GEMV(4); break;
    case 5: PAGEWISE_GEMV(5); break;
    case 6: PAGEWISE_GEMV(6); break;
    case 7: PAGEWISE_GEMV(7); break;
    case 8: PAGEWISE_GEMV(8); break;
    default: return 1;
  }
#undef PAGEWISE_GEMV
  return (int)cudaGetLastError();
}
}  // namespace

extern "C" int pagewise_gemv(int dtype, void* y, const void* x, const void* w, int rows,
                             int out_dim, int k_dim, void* stream) {
  if (rows == 0 || out_dim == 0) return 0;
  if (k_dim % 8 != 0) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch_gemv<__half>(y, x, w, rows, out_dim, k_dim, s);
    case 2: return launch_gemv<__nv_bfloat16>(y, x, w, rows, out_dim, k_dim, s);
    default: return 1;
  }
}
