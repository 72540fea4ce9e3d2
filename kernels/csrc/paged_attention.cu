// pagewise CUDA kernels: reshape_and_cache and paged decode attention over the NHD paged KV cache
// ([num_blocks, block_size, num_kv_heads, head_dim] per layer; slot s = block s / bs, row s % bs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(float x) { return x; }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float(float x) { return x; }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16(x); }

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

constexpr int kWarps = 4;

// One block per (sequence, query head); each warp takes every kWarps-th position of the context and
// keeps an online softmax; the warps are merged at the end. Lane l holds dims l, l+32, ...
template <typename T, int D>
__global__ void paged_decode_kernel(T* __restrict__ out, const T* __restrict__ q,
                                    const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                    const int32_t* __restrict__ block_tables,
                                    const int32_t* __restrict__ context_lens, int max_blocks,
                                    int num_heads, int num_kv_heads, int block_size, float scale) {
  constexpr int P = D / 32;
  const int seq = blockIdx.x, head = blockIdx.y;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ctx = context_lens[seq];
  const int32_t* table = block_tables + (int64_t)seq * max_blocks;

  float qv[P], acc[P];
  const T* qp = q + ((int64_t)seq * num_heads + head) * D;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    qv[i] = to_float(qp[lane + 32 * i]) * scale;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int p = warp; p < ctx; p += kWarps) {
    const int64_t slot = (int64_t)table[p / block_size] * block_size + p % block_size;
    const int64_t base = (slot * num_kv_heads + kv_head) * D;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) s += qv[i] * to_float(k_cache[base + lane + 32 * i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    const float m_new = fmaxf(m, s);
    const float correction = __expf(m - m_new);
    const float w = __expf(s - m_new);
    l = l * correction + w;
#pragma unroll
    for (int i = 0; i < P; ++i) acc[i] = acc[i] * correction + w * to_float(v_cache[base + lane + 32 * i]);
    m = m_new;
  }

  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][D];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < P; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0.f, o[P];
#pragma unroll
  for (int i = 0; i < P; ++i) o[i] = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    if (sm_l[w] == 0.f) continue;
    const float c = __expf(sm_m[w] - M);
    L += sm_l[w] * c;
#pragma unroll
    for (int i = 0; i < P; ++i) o[i] += sm_acc[w][lane + 32 * i] * c;
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  T* op = out + ((int64_t)seq * num_heads + head) * D;
#pragma unroll
  for (int i = 0; i < P; ++i) op[lane + 32 * i] = from_float<T>(o[i] * inv);
}

template <typename T>
int launch_decode(void* out, const void* q, const void* k_cache, const void* v_cache,
                  const int32_t* block_tables, const int32_t* context_lens, int num_seqs,
                  int max_blocks, int num_heads, int num_kv_heads, int head_dim, int block_size,
                  float scale, cudaStream_t stream) {
  const dim3 grid(num_seqs, num_heads);
  const dim3 block(32 * kWarps);
#define PAGEWISE_DECODE(DIM)                                                                      \
  paged_decode_kernel<T, DIM><<<grid, block, 0, stream>>>(                                       \
      (T*)out, (const T*)q, (const T*)k_cache, (const T*)v_cache, block_tables, context_lens,      \
      max_blocks, num_heads, num_kv_heads, block_size, scale)
  switch (head_dim) {
    case 64: PAGEWISE_DECODE(64); break;
    case 128: PAGEWISE_DECODE(128); break;
    case 256: PAGEWISE_DECODE(256); break;
    default: return 1;
  }
#undef PAGEWISE_DECODE
  return (int)cudaGetLastError();
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
// (1 for an unsupported head dim).
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

extern "C" int pagewise_paged_decode(int dtype, void* out, const void* q, const void* k_cache,
                                     const void* v_cache, const int32_t* block_tables,
                                     const int32_t* context_lens, int num_seqs, int max_blocks,
                                     int num_heads, int num_kv_heads, int head_dim, int block_size,
                                     float scale, cudaStream_t stream) {
#define PAGEWISE_ARGS out, q, k_cache, v_cache, block_tables, context_lens, num_seqs, max_blocks, \
                      num_heads, num_kv_heads, head_dim, block_size, scale, stream
  switch (dtype) {
    case 0: return launch_decode<float>(PAGEWISE_ARGS);
    case 1: return launch_decode<__half>(PAGEWISE_ARGS);
    case 2: return launch_decode<__nv_bfloat16>(PAGEWISE_ARGS);
    default: return 1;
  }
#undef PAGEWISE_ARGS
}
