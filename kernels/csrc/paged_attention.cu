// pagewise CUDA kernels: reshape_and_cache and paged decode attention over the NHD paged KV cache
// ([num_blocks, block_size, num_kv_heads, head_dim] per layer; slot s = block s / bs, row s % bs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

// Eight consecutive elements as floats, in 16-byte loads (rows are 16-byte aligned: head dims are
// multiples of 8 and cudaMalloc aligns to 256).
__device__ __forceinline__ void load8(const float* p, float out[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
template <typename H>
__device__ __forceinline__ void load8_half(const H* p, float out[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const H* h = reinterpret_cast<const H*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = to_float(h[j]);
}
__device__ __forceinline__ void load8(const __half* p, float out[8]) { load8_half(p, out); }
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float out[8]) { load8_half(p, out); }

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
constexpr int kMaxGroup = 8;

// One block per (query row, KV head, context split). A row is one query token: a decoding
// sequence's, or one of a prefill chunk's (row_seq names its sequence's block table; its context
// length is its position + 1, which makes the chunk causal over itself and full over its prefix). The block serves every query head of the KV
// head's group, so each K/V row is read once. Each warp takes every kWarps-th position of the split
// and keeps one online softmax per query head; lane l holds dims [l*P, l*P+P). The warps merge
// through shared memory; with one split the block writes the output, else unnormalized partials
// (max, sum, acc) for the merge kernel.
// G bounds the group size at compile time (1, 2, 4 or 8), so registers scale with the real group.
template <typename T, int D, int G>
__global__ void paged_decode_kernel(T* __restrict__ out, float* __restrict__ part_ml,
                                    float* __restrict__ part_acc, const T* __restrict__ q,
                                    const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                                    const int32_t* __restrict__ block_tables,
                                    const int32_t* __restrict__ row_seq,
                                    const int32_t* __restrict__ context_lens, int max_blocks,
                                    int num_heads, int num_kv_heads, int block_size, int chunk,
                                    float scale) {
  constexpr int P = D / 32;
  const int seq = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z, num_splits = gridDim.z;
  const int group = num_heads / num_kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ctx = context_lens[seq];
  // `chunk` is a floor: a row splits its own context evenly when that gives longer chunks (a
  // CUDA graph fixes the split count while the contexts vary from replay to replay).
  const int row_chunk = max(chunk, (ctx + num_splits - 1) / num_splits);
  const int begin = split * row_chunk;
  const int end = min(ctx, begin + row_chunk);
  const int32_t* table = block_tables + (int64_t)(row_seq ? row_seq[seq] : seq) * max_blocks;

  // The group's queries (pre-scaled) in shared memory: every lane reads the same element at once.
  __shared__ float sq[G][D];
  for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    sq[g][d] = to_float(q[((int64_t)seq * num_heads + kv_head * group + g) * D + d]) * scale;
  }
  __syncthreads();

  float acc[G][P], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < P; ++i) acc[g][i] = 0.f;
  }
  // Each warp takes 32 positions at a time, one per lane: the lanes' K rows load independently
  // (16 bytes at a time), the softmax update is one warp reduction per 32 positions, and V is
  // accumulated row by row with the lanes spanning the head dims.
  for (int p0 = begin + warp * 32; p0 < end; p0 += kWarps * 32) {
    const int p = p0 + lane;
    const bool valid = p < end;
    const int64_t row =
        valid ? ((int64_t)table[p / block_size] * block_size + p % block_size) * num_kv_heads + kv_head : 0;
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.f;
    if (valid) {
      const T* kp = k_cache + row * D;
#pragma unroll 4
      for (int d = 0; d < D; d += 8) {
        float kf[8];
        load8(kp + d, kf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (g >= group) break;
#pragma unroll
          for (int j = 0; j < 8; ++j) s[g] += sq[g][d + j] * kf[j];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= group) break;
      float mx = valid ? s[g] : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
      const float m_new = fmaxf(m[g], mx);
      const float w = valid ? __expf(s[g] - m_new) : 0.f;
      float sum = w;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
      const float correction = __expf(m[g] - m_new);
      l[g] = l[g] * correction + sum;
#pragma unroll
      for (int i = 0; i < P; ++i) acc[g][i] *= correction;
      m[g] = m_new;
      s[g] = w;
    }
    // V rows eight at a time, so eight loads are in flight per lane.
    const int count = min(32, end - p0);
    for (int j0 = 0; j0 < count; j0 += 8) {
      float vv[8][P];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int64_t rj = __shfl_sync(0xffffffff, row, (j0 + u) & 31);
        const T* vp = v_cache + rj * D + lane * P;
#pragma unroll
        for (int i = 0; i < P; ++i) vv[u][i] = j0 + u < count ? to_float(vp[i]) : 0.f;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float wj = __shfl_sync(0xffffffff, s[g], (j0 + u) & 31);
#pragma unroll
          for (int i = 0; i < P; ++i) acc[g][i] += wj * vv[u][i];
        }
      }
    }
  }

  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < P; ++i) sm_acc[warp][g][lane * P + i] = acc[g][i];
  }
  __syncthreads();
  // Warp w merges query heads w, w + kWarps, ... of the group.
  for (int g = warp; g < group; g += kWarps) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, o[P];
#pragma unroll
    for (int i = 0; i < P; ++i) o[i] = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      if (sm_l[w][g] == 0.f) continue;
      const float c = __expf(sm_m[w][g] - M);
      L += sm_l[w][g] * c;
#pragma unroll
      for (int i = 0; i < P; ++i) o[i] += sm_acc[w][g][lane * P + i] * c;
    }
    const int head = kv_head * group + g;
    if (num_splits == 1) {
      const float inv = L > 0.f ? 1.f / L : 0.f;
      T* op = out + ((int64_t)seq * num_heads + head) * D + lane * P;
#pragma unroll
      for (int i = 0; i < P; ++i) op[i] = from_float<T>(o[i] * inv);
    } else {
      const int64_t part = ((int64_t)seq * num_heads + head) * num_splits + split;
      if (lane == 0) {
        part_ml[part * 2] = M;
        part_ml[part * 2 + 1] = L;
      }
#pragma unroll
      for (int i = 0; i < P; ++i) part_acc[part * D + lane * P + i] = o[i];
    }
  }
}

// One block per (sequence, head): merges the splits' partials by log-sum-exp.
template <typename T, int D>
__global__ void merge_splits_kernel(T* __restrict__ out, const float* __restrict__ part_ml,
                                    const float* __restrict__ part_acc, int num_splits) {
  const int64_t row = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
  const float* ml = part_ml + row * num_splits * 2;
  float M = -INFINITY;
  for (int s = 0; s < num_splits; ++s)
    if (ml[2 * s + 1] > 0.f) M = fmaxf(M, ml[2 * s]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.f, o = 0.f;
    for (int s = 0; s < num_splits; ++s) {
      if (ml[2 * s + 1] == 0.f) continue;
      const float c = __expf(ml[2 * s] - M);
      L += ml[2 * s + 1] * c;
      o += part_acc[(row * num_splits + s) * D + d] * c;
    }
    out[row * D + d] = from_float<T>(L > 0.f ? o / L : 0.f);
  }
}

template <typename T>
int launch_decode(void* out, float* part_ml, float* part_acc, const void* q, const void* k_cache,
                  const void* v_cache, const int32_t* block_tables, const int32_t* row_seq,
                  const int32_t* context_lens, int num_seqs, int max_blocks, int num_heads, int num_kv_heads, int head_dim,
                  int block_size, int num_splits, int chunk, float scale, cudaStream_t stream) {
  if (num_heads / num_kv_heads > kMaxGroup) return 1;
  const dim3 grid(num_seqs, num_kv_heads, num_splits);
  const dim3 block(32 * kWarps);
  const int group = num_heads / num_kv_heads;
#define PAGEWISE_DECODE_G(DIM, G)                                                                 \
  paged_decode_kernel<T, DIM, G><<<grid, block, 0, stream>>>(                                    \
      (T*)out, part_ml, part_acc, (const T*)q, (const T*)k_cache, (const T*)v_cache,               \
      block_tables, row_seq, context_lens, max_blocks, num_heads, num_kv_heads, block_size, chunk,  \
      scale)
#define PAGEWISE_DECODE(DIM)                                                                      \
  if (group == 1) PAGEWISE_DECODE_G(DIM, 1);                                                      \
  else if (group == 2) PAGEWISE_DECODE_G(DIM, 2);                                                 \
  else if (group <= 4) PAGEWISE_DECODE_G(DIM, 4);                                                 \
  else PAGEWISE_DECODE_G(DIM, 8);                                                                 \
  if (num_splits > 1)                                                                             \
    merge_splits_kernel<T, DIM><<<dim3(num_seqs, num_heads), DIM, 0, stream>>>(                  \
        (T*)out, part_ml, part_acc, num_splits)
  switch (head_dim) {
    case 64: PAGEWISE_DECODE(64); break;
    case 128: PAGEWISE_DECODE(128); break;
    case 256: PAGEWISE_DECODE(256); break;
    default: return 1;
  }
#undef PAGEWISE_DECODE
#undef PAGEWISE_DECODE_G
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

// part_ml ([seqs, heads, splits, 2]) and part_acc ([seqs, heads, splits, head_dim]), f32, are
// workspace used only when num_splits > 1; split s covers positions [s * chunk, (s + 1) * chunk).
// row_seq ([num_seqs] rows) maps each query row to its block table row; null means row i uses
// table i.
extern "C" int pagewise_paged_decode(int dtype, void* out, float* part_ml, float* part_acc,
                                     const void* q, const void* k_cache, const void* v_cache,
                                     const int32_t* block_tables, const int32_t* row_seq,
                                     const int32_t* context_lens,
                                     int num_seqs, int max_blocks, int num_heads, int num_kv_heads,
                                     int head_dim, int block_size, int num_splits, int chunk,
                                     float scale, cudaStream_t stream) {
#define PAGEWISE_ARGS out, part_ml, part_acc, q, k_cache, v_cache, block_tables, row_seq,           \
                      context_lens,                                                                \
                      num_seqs, max_blocks, num_heads, num_kv_heads, head_dim, block_size,         \
                      num_splits, chunk, scale, stream
  switch (dtype) {
    case 0: return launch_decode<float>(PAGEWISE_ARGS);
    case 1: return launch_decode<__half>(PAGEWISE_ARGS);
    case 2: return launch_decode<__nv_bfloat16>(PAGEWISE_ARGS);
    default: return 1;
  }
#undef PAGEWISE_ARGS
}
