// pagewise CUDA kernel: reshape_and_cache, the step's K and V rows written into the NHD paged KV cache
// ([num_blocks, block_size, num_kv_heads, head_dim] per layer; slot s = block s / bs, row s % bs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "kv_fp8.cuh"

namespace {

// One block per token: copy its K and V rows (num_kv_heads * head_dim) to its slot, as cache
// elements C (T, or e4m3 bytes with the layer's scales).
template <typename T, typename C>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         C* __restrict__ k_cache, C* __restrict__ v_cache,
                                         const int64_t* __restrict__ slots, int width,
                                         KvScales scales) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[slot * width + i] = to_cache<C>(key[t * width + i], scales.k);
    v_cache[slot * width + i] = to_cache<C>(value[t * width + i], scales.v);
  }
}

template <typename T>
int launch_cache(const void* key, const void* value, void* k_cache, void* v_cache,
                 const KvScales* kv_fp8, const int64_t* slots, int num_tokens, int width,
                 cudaStream_t stream) {
  if (num_tokens == 0) return 0;
  if (kv_fp8 != nullptr)
    reshape_and_cache_kernel<T, uint8_t><<<num_tokens, 256, 0, stream>>>(
        (const T*)key, (const T*)value, (uint8_t*)k_cache, (uint8_t*)v_cache, slots, width,
        *kv_fp8);
  else
    reshape_and_cache_kernel<T, T><<<num_tokens, 256, 0, stream>>>(
        (const T*)key, (const T*)value, (T*)k_cache, (T*)v_cache, slots, width,
        KvScales{1.f, 1.f});
  return (int)cudaGetLastError();
}

}  // namespace

// dtype: 0 = f32, 1 = f16, 2 = bf16 (key's and value's); kv_fp8: null, the caches hold dtype,
// or they hold e4m3 bytes with these scales. Returns 0 on success, a CUDA error code otherwise
// (1 for an unsupported dtype).
extern "C" int pagewise_reshape_and_cache(int dtype, const void* key, const void* value, void* k_cache,
                                          void* v_cache, const KvScales* kv_fp8,
                                          const int64_t* slots, int num_tokens, int width,
                                          cudaStream_t stream) {
#define PAGEWISE_CACHE_ARGS key, value, k_cache, v_cache, kv_fp8, slots, num_tokens, width, stream
  switch (dtype) {
    case 0: return launch_cache<float>(PAGEWISE_CACHE_ARGS);
    case 1: return launch_cache<__half>(PAGEWISE_CACHE_ARGS);
    case 2: return launch_cache<__nv_bfloat16>(PAGEWISE_CACHE_ARGS);
    default: return 1;
  }
#undef PAGEWISE_CACHE_ARGS
}
