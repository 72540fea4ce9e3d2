// What the GPU probes (README.md) share: the bf16 element type, a CUDA call check, random fill,
// and the pieces of the replicated one-row GEMV (pagewise's gemv_kernel, two warps an output).
#pragma once
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

typedef __nv_bfloat16 T;
__device__ __forceinline__ float f(T v) { return __bfloat162float(v); }

#define CK(x)                                                     \
  do {                                                            \
    cudaError_t e = (x);                                          \
    if (e != cudaSuccess) {                                       \
      printf("%s: %s\n", #x, cudaGetErrorString(e));              \
      exit(1);                                                    \
    }                                                             \
  } while (0)

// p[i] = a hash of (i, seed) spread uniformly over [-scale / 2, scale / 2).
__global__ void fill(T* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * scale);
  }
}

// acc + the dot product of one 16-byte run of a weight row (read through the read-only path)
// with the staged x at the same place.
__device__ __forceinline__ float dot16(float acc, const T* w, const T* xs) {
  const uint4 wr = __ldg((const uint4*)w);
  const uint4 xr = *(const uint4*)xs;
  const T* wv = (const T*)&wr;
  const T* xv = (const T*)&xr;
#pragma unroll
  for (int q = 0; q < 8; ++q) acc += f(wv[q]) * f(xv[q]);
  return acc;
}

// The output's sum of the warp pair (warp, warp ^ 1) sharing it, each warp's lanes holding its
// part in acc: true, with the sum in *sum, for lane 0 of the pair's first warp. Synchronizes
// the block (every warp must call it); parts: 16 floats of shared memory.
__device__ __forceinline__ bool pair_sum(float acc, float* parts, int warp, int lane, float* sum) {
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
  if (lane == 0) parts[warp] = acc;
  __syncthreads();
  const bool first = warp % 2 == 0 && lane == 0;
  if (first) *sum = parts[warp] + parts[warp + 1];
  __syncthreads();
  return first;
}
