// pagewise: FP8 (e4m3) weights in and out of the activations' dtype. fp8_dequantize_kernel
// writes a weight with its block scales applied (for the steps past the GEMVs' rows, which then
// multiply on cuBLAS); fp8_quantize_rows_kernel quantizes a 16-bit weight row by row (one scale a
// row, its largest magnitude over e4m3's 448: `--quantization fp8`).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.f;

// out[o, c] = w[o, c] * s[(o / bn) * sk + c / bk], 8 values a thread (k a multiple of 8, bk a
// multiple of 8 or at least k).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_dequantize_kernel(T* __restrict__ out, const uint8_t* __restrict__ w,
                          const float* __restrict__ s, int64_t out_dim, int k_dim, int bn, int bk) {
  const int sk = (k_dim + bk - 1) / bk;
  const int64_t chunks = out_dim * (k_dim / 8);
  for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < chunks;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t o = i / (k_dim / 8);
    const int c = (int)(i % (k_dim / 8)) * 8;
    const float scale = s[(o / bn) * sk + c / bk];
    const uint2 raw = *reinterpret_cast<const uint2*>(w + o * k_dim + c);
    const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
    T v[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(p[j], __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      v[2 * j] = from_float<T>(f.x * scale);
      v[2 * j + 1] = from_float<T>(f.y * scale);
    }
    *reinterpret_cast<uint4*>(out + o * k_dim + c) = *reinterpret_cast<const uint4*>(v);
  }
}

// One block a row: s[o] = max |w[o, :]| / 448 (1 for a row of zeros), q[o, c] = e4m3(w[o, c] /
// s[o]) rounded to nearest even (the division IEEE-rounded, as the host computes it).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    fp8_quantize_rows_kernel(uint8_t* __restrict__ q, float* __restrict__ s,
                             const T* __restrict__ w, int k_dim) {
  __shared__ float warp_max[kThreads / 32];
  const int64_t o = blockIdx.x;
  const T* row = w + o * k_dim;
  float m = 0.f;
  for (int c = threadIdx.x; c < k_dim; c += kThreads) m = fmaxf(m, fabsf(to_float(row[c])));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, d));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0.f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, warp_max[i]);
  const float scale = m > 0.f ? __fdiv_rn(m, kE4m3Max) : 1.f;
  if (threadIdx.x == 0) s[o] = scale;
  for (int c = threadIdx.x; c < k_dim; c += kThreads)
    q[o * k_dim + c] =
        __nv_cvt_float_to_fp8(__fdiv_rn(to_float(row[c]), scale), __NV_SATFINITE, __NV_E4M3);
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return (int)(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

}  // namespace

// out ([out_dim, k_dim], dtype 1 = f16, 2 = bf16) = w (e4m3 [out_dim, k_dim]) times its scales
// (f32 [ceil(out_dim / bn), ceil(k_dim / bk)]). k_dim a multiple of 8, bk a multiple of 8 or at
// least k_dim; out and w 16- and 8-byte aligned. Returns 0, a CUDA error code, or 1 when the
// arguments are unsupported.
extern "C" int pagewise_fp8_dequantize(int dtype, void* out, const void* w, const float* scales,
                                       int64_t out_dim, int k_dim, int bn, int bk, void* stream) {
  if (out_dim == 0 || k_dim == 0) return 0;
  if (k_dim % 8 != 0 || bn < 1 || bk < 1 || (bk % 8 != 0 && bk < k_dim)) return 1;
  const int blocks = grid_for(out_dim * (k_dim / 8));
  const auto* wp = reinterpret_cast<const uint8_t*>(w);
  cudaStream_t st = (cudaStream_t)stream;
  switch (dtype) {
    case 1:
      fp8_dequantize_kernel<__half><<<blocks, kThreads, 0, st>>>((__half*)out, wp, scales,
                                                                  out_dim, k_dim, bn, bk);
      break;
    case 2:
      fp8_dequantize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, st>>>(
          (__nv_bfloat16*)out, wp, scales, out_dim, k_dim, bn, bk);
      break;
    default: return 1;
  }
  return (int)cudaGetLastError();
}

// q (e4m3 [out_dim, k_dim]) and s (f32 [out_dim]) from w ([out_dim, k_dim], dtype 1 = f16,
// 2 = bf16): one scale a row (see fp8_quantize_rows_kernel). Returns 0, a CUDA error code, or 1
// when the arguments are unsupported.
extern "C" int pagewise_fp8_quantize_rows(int dtype, void* q, float* s, const void* w,
                                          int64_t out_dim, int k_dim, void* stream) {
  if (out_dim == 0 || k_dim == 0) return 0;
  if (out_dim > 0x7fffffff) return 1;
  auto* qp = reinterpret_cast<uint8_t*>(q);
  cudaStream_t st = (cudaStream_t)stream;
  switch (dtype) {
    case 1:
      fp8_quantize_rows_kernel<__half><<<(int)out_dim, kThreads, 0, st>>>(qp, s, (const __half*)w,
                                                                           k_dim);
      break;
    case 2:
      fp8_quantize_rows_kernel<__nv_bfloat16><<<(int)out_dim, kThreads, 0, st>>>(
          qp, s, (const __nv_bfloat16*)w, k_dim);
      break;
    default: return 1;
  }
  return (int)cudaGetLastError();
}
