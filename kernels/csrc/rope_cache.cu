// pagewise: rotary embedding + KV-cache write in one pass over a fused q/k/v projection.
// qkv row t = [q heads | k heads | v heads] (each head_dim wide). Rotates q into q_out
// ([tokens, heads, head_dim]), rotates k and copies v into the paged caches at the token's slot
// (skipped for slot < 0). Rotate-half pairs (i, i + d/2); interleaved pairs (2i, 2i + 1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "pdl.cuh"

namespace {

template <typename T>
__global__ void rope_qkv_cache_kernel(T* __restrict__ q_out, T* __restrict__ k_cache,
                                      T* __restrict__ v_cache, const T* __restrict__ qkv,
                                      const T* __restrict__ cos, const T* __restrict__ sin,
                                      const int64_t* __restrict__ slots, int heads, int kv_heads,
                                      int d, int interleaved) {
  // Launched early (see launch_early): wait for the projection that wrote qkv. Decode attention,
  // launched early after this kernel, may be scheduled now: it reads the block tables while this
  // runs, and waits for this kernel's end before the query and the cache.
  wait_for_previous_grid();
  let_next_grid_launch();
  const int64_t t = blockIdx.x;
  const int half = d / 2;
  const int row_width = (heads + 2 * kv_heads) * d;
  const T* row = qkv + t * row_width;
  const T* c = cos + t * half;
  const T* s = sin + t * half;
  const int64_t slot = slots[t];
  const int64_t cache_row = slot * (int64_t)kv_heads * d;
  // Rotations: one thread per (q or k head, pair).
  for (int idx = threadIdx.x; idx < (heads + kv_heads) * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = to_float(row[h * d + a]), x2 = to_float(row[h * d + b]);
    const float cc = to_float(c[i]), ss = to_float(s[i]);
    const T y1 = from_float<T>(x1 * cc - x2 * ss);
    const T y2 = from_float<T>(x1 * ss + x2 * cc);
    if (h < heads) {
      T* o = q_out + (t * heads + h) * d;
      o[a] = y1;
      o[b] = y2;
    } else if (slot >= 0) {
      T* o = k_cache + cache_row + (int64_t)(h - heads) * d;
      o[a] = y1;
      o[b] = y2;
    }
  }
  if (slot < 0) return;
  const T* v = row + (heads + kv_heads) * d;
  for (int idx = threadIdx.x; idx < kv_heads * d; idx += blockDim.x) v_cache[cache_row + idx] = v[idx];
}

template <typename T>
int launch_rope(void* q_out, void* k_cache, void* v_cache, const void* qkv, const void* cos,
                const void* sin, const int64_t* slots, int tokens, int heads, int kv_heads, int d,
                int interleaved, cudaStream_t stream) {
  // A thread per rotation where they fit one block (a decode token is latency-bound: fewer,
  // longer loops per thread left it waiting on one load after another).
  const int rotations = (heads + kv_heads) * (d / 2);
  const int threads = rotations >= 1024 ? 1024 : (rotations + 31) / 32 * 32;
  const cudaError_t err = launch_early(rope_qkv_cache_kernel<T>, tokens, threads, 0, stream,
                                       (T*)q_out, (T*)k_cache, (T*)v_cache, (const T*)qkv,
                                       (const T*)cos, (const T*)sin, slots, heads, kv_heads, d,
                                       interleaved);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

}  // namespace

extern "C" int pagewise_rope_qkv_cache(int dtype, void* q_out, void* k_cache, void* v_cache,
                                       const void* qkv, const void* cos, const void* sin,
                                       const int64_t* slots, int tokens, int heads, int kv_heads,
                                       int head_dim, int interleaved, void* stream) {
  if (tokens == 0) return 0;
  if (head_dim % 2 != 0) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 0: return launch_rope<float>(q_out, k_cache, v_cache, qkv, cos, sin, slots, tokens, heads, kv_heads, head_dim, interleaved, s);
    case 1: return launch_rope<__half>(q_out, k_cache, v_cache, qkv, cos, sin, slots, tokens, heads, kv_heads, head_dim, interleaved, s);
    case 2: return launch_rope<__nv_bfloat16>(q_out, k_cache, v_cache, qkv, cos, sin, slots, tokens, heads, kv_heads, head_dim, interleaved, s);
    default: return 1;
  }
}
