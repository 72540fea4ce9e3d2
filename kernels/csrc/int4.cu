// pagewise: 4-bit integer weights (Int4Weight's or Int4Tiles' layout, gemv_weight.cuh) written
// out in the activations' dtype, for the steps past the decode GEMVs' rows, which then multiply
// on cuBLAS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

constexpr int kThreads = 256;

// out[o, c] = s * (q[o, c] - z) for (s, z) = sz[o * groups + c / group], a word (8 columns) a
// thread; the products in f32, rounded once to T.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    int4_dequantize_kernel(T* __restrict__ out, const uint32_t* __restrict__ w,
                           const __half2* __restrict__ sz, int64_t out_dim, int k_dim,
                           int group) {
  const int words = k_dim / 8, groups = (k_dim + group - 1) / group;
  for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < out_dim * words;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t o = i / words;
    const int c = (int)(i % words) * 8;
    const float2 g = __half22float2(sz[o * groups + c / group]);
    const uint32_t word = w[i];
    T v[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      // Column 2j in nibble j, column 2j + 1 in nibble 4 + j.
      const int nibble = n % 2 == 0 ? n / 2 : 4 + n / 2;
      v[n] = from_float<T>(g.x * ((float)((word >> (4 * nibble)) & 0xF) - g.y));
    }
    *reinterpret_cast<uint4*>(out + o * k_dim + c) = *reinterpret_cast<const uint4*>(v);
  }
}

// The same for codes in tiles (Int4Tiles, gemv_weight.cuh): a word is 4 pairs of neighbouring
// columns at the places the tile layout gives its lane and index.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    int4_dequantize_tiles_kernel(T* __restrict__ out, const uint32_t* __restrict__ w,
                                 const __half2* __restrict__ sz, int64_t out_dim, int k_dim,
                                 int group) {
  const int chunks = k_dim / 64, groups = (k_dim + group - 1) / group;
  for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < out_dim * (k_dim / 8);
       i += (int64_t)gridDim.x * kThreads) {
    const int m = (int)(i % 4), lane = (int)(i / 4 % 32);
    const int64_t tile = i / 128;
    const int64_t row_tile = tile / chunks;
    const int chunk = (int)(tile % chunks), g = lane / 4, t = lane % 4;
    const uint32_t word = w[i];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int64_t o = row_tile * 16 + g + (p & 1) * 8;
      const int c = chunk * 64 + m * 16 + 2 * t + (p >> 1) * 8;
      const float2 s = __half22float2(sz[o * groups + c / group]);
      T v[2];
      v[0] = from_float<T>(s.x * ((float)((word >> (4 * p)) & 0xF) - s.y));
      v[1] = from_float<T>(s.x * ((float)((word >> (16 + 4 * p)) & 0xF) - s.y));
      *reinterpret_cast<uint32_t*>(out + o * k_dim + c) = *reinterpret_cast<const uint32_t*>(v);
    }
  }
}

}  // namespace

// out ([out_dim, k_dim], dtype 1 = f16, 2 = bf16) = the 4-bit weight w (codes [out_dim, k_dim /
// 8] u32 words in Int4Weight's order) with its (scale, zero) f16 pairs sz ([out_dim,
// ceil(k_dim / group)]) applied. k_dim a multiple of 8, group a multiple of 8 or at least k_dim;
// out 16-byte aligned, w 4-byte. With `tiles` the codes are in Int4Tiles' order (out_dim a
// multiple of 16, k_dim of 64). Returns 0, a CUDA error code, or 1 when the arguments are
// unsupported.
extern "C" int pagewise_int4_dequantize(int dtype, void* out, const void* w, const void* sz,
                                        int64_t out_dim, int k_dim, int group, int tiles,
                                        void* stream) {
  if (out_dim == 0 || k_dim == 0) return 0;
  if (k_dim % 8 != 0 || group < 1 || (group % 8 != 0 && group < k_dim)) return 1;
  if (tiles && (out_dim % 16 != 0 || k_dim % 64 != 0)) return 1;
  const int64_t work = out_dim * (k_dim / 8);
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int blocks = (int)(wanted < 8192 ? wanted : 8192);
  const auto* wp = reinterpret_cast<const uint32_t*>(w);
  const auto* sp = reinterpret_cast<const __half2*>(sz);
  const int g = group < k_dim ? group : k_dim;
  cudaStream_t st = (cudaStream_t)stream;
  switch (dtype * 2 + (tiles ? 1 : 0)) {
    case 2:
      int4_dequantize_kernel<__half><<<blocks, kThreads, 0, st>>>((__half*)out, wp, sp, out_dim,
                                                                   k_dim, g);
      break;
    case 3:
      int4_dequantize_tiles_kernel<__half><<<blocks, kThreads, 0, st>>>(
          (__half*)out, wp, sp, out_dim, k_dim, g);
      break;
    case 4:
      int4_dequantize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, st>>>(
          (__nv_bfloat16*)out, wp, sp, out_dim, k_dim, g);
      break;
    case 5:
      int4_dequantize_tiles_kernel<__nv_bfloat16><<<blocks, kThreads, 0, st>>>(
          (__nv_bfloat16*)out, wp, sp, out_dim, k_dim, g);
      break;
    default: return 1;
  }
  return (int)cudaGetLastError();
}
