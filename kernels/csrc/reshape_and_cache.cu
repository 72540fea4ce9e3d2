// pagewise CUDA kernel: reshape_and_cache, the step's K and V rows written into the NHD paged KV cache
// ([num_blocks, block_size, num_kv_heads, head_dim] per layer; slot s = block s / bs, row s % bs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

// One block per token: copy its K and V rows (num_kv_heads * head_dim) to its slot.
template <typename T>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         T* __restrict__ k_cache, T* __restrict__ v_cache,
                                         const int64_t* __restrict__ slots, int width) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[slot * width + i] = key[t * width + i];
    v_cache[slot * width + i] = value[t * width + i];
  }
}

template <typename T>
int launch_cache(const void* key, const void* value, void* k_cache, void* v_cache,
                 const int64_t* slots, int num_tokens, int width, cudaStream_t stream) {
  if (num_tokens == 0) return 0;
  reshape_and_cache_kernel<T><<<num_tokens, 256, 0, stream>>>(
      (const T*)key, (const T*)value, (T*)k_cache, (T*)v_cache, slots, width);
  return (int)cudaGetLastError();
}

}  // namespace

// dtype: 0 = f32, 1 = f16, 2 = bf16. Returns 0 on success, a CUDA error code otherwise
// (1 for an unsupported dtype).
extern "C" int pagewise_reshape_and_cache(int dtype, const void* key, const void* value, void* k_cache,
                                          void* v_cache, const int64_t* slots, int num_tokens,
                                          int width, cudaStream_t stream) {
  switch (dtype) {
    case 0: return launch_cache<float>(key, value, k_cache, v_cache, slots, num_tokens, width, stream);
    case 1: return launch_cache<__half>(key, value, k_cache, v_cache, slots, num_tokens, width, stream);
    case 2: return launch_cache<__nv_bfloat16>(key, value, k_cache, v_cache, slots, num_tokens, width, stream);
    default: return 1;
  }
}
