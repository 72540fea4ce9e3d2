// pagewise: integer codes with an affine map per group (Affine4Weight's or Affine8Weight's
// layout, gemv_affine.cuh: the GGUF types repacked at load) written out in the activations'
// dtype, for the steps past the decode GEMVs' rows, which then multiply on cuBLAS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

constexpr int kThreads = 256;

// out[o, c] = s * q[o, c] + b for (s, b) = sb[o * groups + c / group], 8 columns a thread (one
// 32-bit word of 4-bit codes in Int4Weight's nibble order, or 8 bytes); f32 products, rounded
// once to T.
template <typename T, int kBits>
__global__ void __launch_bounds__(kThreads)
    affine_dequantize_kernel(T* __restrict__ out, const uint8_t* __restrict__ w,
                             const __half2* __restrict__ sb, int64_t out_dim, int k_dim,
                             int group) {
  const int chunks = k_dim / 8, groups = (k_dim + group - 1) / group;
  for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < out_dim * chunks;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t o = i / chunks;
    const int c = (int)(i % chunks) * 8;
    const float2 g = __half22float2(sb[o * groups + c / group]);
    T v[8];
    if constexpr (kBits == 4) {
      const uint32_t word = reinterpret_cast<const uint32_t*>(w)[i];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const int nibble = n % 2 == 0 ? n / 2 : 4 + n / 2;
        v[n] = from_float<T>(g.x * (float)((word >> (4 * nibble)) & 0xF) + g.y);
      }
    } else {
      const uint2 bytes = reinterpret_cast<const uint2*>(w)[i];
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const uint32_t word = n < 4 ? bytes.x : bytes.y;
        v[n] = from_float<T>(g.x * (float)((word >> (8 * (n % 4))) & 0xFF) + g.y);
      }
    }
    *reinterpret_cast<uint4*>(out + o * k_dim + c) = *reinterpret_cast<const uint4*>(v);
  }
}

template <typename T>
int launch(int bits, T* out, const uint8_t* w, const __half2* sb, int64_t out_dim, int k_dim,
           int group, int blocks, cudaStream_t st) {
  if (bits == 4)
    affine_dequantize_kernel<T, 4><<<blocks, kThreads, 0, st>>>(out, w, sb, out_dim, k_dim, group);
  else
    affine_dequantize_kernel<T, 8><<<blocks, kThreads, 0, st>>>(out, w, sb, out_dim, k_dim, group);
  return (int)cudaGetLastError();
}

}  // namespace

// out ([out_dim, k_dim], dtype 1 = f16, 2 = bf16) = the codes w of `bits` (4: [out_dim, k_dim /
// 8] u32 words in Int4Weight's order; 8: [out_dim, k_dim] bytes) with their (scale, offset) f16
// pairs sb ([out_dim, ceil(k_dim / group)]) applied. k_dim a multiple of 8, group a multiple of 8
// or at least k_dim; out 16-byte aligned, w 8-byte. Returns 0, a CUDA error code, or 1 when the
// arguments are unsupported.
extern "C" int pagewise_affine_dequantize(int dtype, void* out, const void* w, const void* sb,
                                          int64_t out_dim, int k_dim, int group, int bits,
                                          void* stream) {
  if (out_dim == 0 || k_dim == 0) return 0;
  if (k_dim % 8 != 0 || group < 1 || (group % 8 != 0 && group < k_dim)) return 1;
  if (bits != 4 && bits != 8) return 1;
  const int64_t work = out_dim * (k_dim / 8);
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  const int blocks = (int)(wanted < 8192 ? wanted : 8192);
  const auto* wp = reinterpret_cast<const uint8_t*>(w);
  const auto* sp = reinterpret_cast<const __half2*>(sb);
  const int g = group < k_dim ? group : k_dim;
  cudaStream_t st = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch<__half>(bits, (__half*)out, wp, sp, out_dim, k_dim, g, blocks, st);
    case 2:
      return launch<__nv_bfloat16>(bits, (__nv_bfloat16*)out, wp, sp, out_dim, k_dim, g, blocks,
                                   st);
    default: return 1;
  }
}
