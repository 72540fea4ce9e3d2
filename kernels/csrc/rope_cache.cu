// pagewise: rotary embedding + KV-cache write in one pass over a fused q/k/v projection.
// qkv row t = [q heads | k heads | v heads] (each head_dim wide). Rotates q into q_out
// ([tokens, heads, head_dim]), rotates k and copies v into the paged caches at the token's slot
// (skipped for slot < 0). Rotate-half pairs (i, i + d/2); interleaved pairs (2i, 2i + 1).
// Optionally (Qwen3, Gemma 3) each q and k head is RMS-normalized first, rounded to T as a
// separate norm kernel would store it; and optionally cos/sin are whole tables read at each
// token's position instead of the step's gathered rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "kv_fp8.cuh"
#include "pdl.cuh"

namespace {

// Most q + k heads a token may have when the heads are normalized (what the Rust side checks).
constexpr int kMaxNormHeads = 512;

// Threads of a block of rope_qkv_cache_kernel, and most heads one block takes.
constexpr int kRopeThreads = 128;
constexpr int kMaxHeadsPerBlock = 32;

// Token t = blockIdx.x. Blocks y < ceil((heads + kv_heads) / heads_per_block) rotate that many q
// or k heads (a thread per rotation pair); each block after them copies one v head. Spread over
// blocks so a decode token's few heads are not one block's loop (one block took 6 µs for
// Gemma-3-12B's 24 heads of 256).
// C: the caches' element (T, or e4m3 bytes with the layer's `scales`).
template <typename T, typename C>
__global__ void __launch_bounds__(kRopeThreads)
    rope_qkv_cache_kernel(T* __restrict__ q_out, C* __restrict__ k_cache,
                          C* __restrict__ v_cache, const T* __restrict__ qkv,
                          const T* __restrict__ cos, const T* __restrict__ sin,
                          const uint32_t* __restrict__ positions, int table_rows,
                          const int64_t* __restrict__ slots, const T* __restrict__ q_norm,
                          const T* __restrict__ k_norm, float eps, int heads, int kv_heads,
                          int d, int interleaved, int heads_per_block, KvScales scales) {
  // Launched early (see launch_early): wait for the projection that wrote qkv. Decode attention,
  // launched early after this kernel, may be scheduled now: it reads the block tables while this
  // runs, and waits for this kernel's end before the query and the cache.
  wait_for_previous_grid();
  let_next_grid_launch();
  const int64_t t = blockIdx.x;
  const int half = d / 2, units = heads + kv_heads;
  const int head_blocks = (units + heads_per_block - 1) / heads_per_block;
  const int row_width = (heads + 2 * kv_heads) * d;
  const T* row = qkv + t * row_width;
  const int64_t slot = slots[t];
  const int64_t cache_row = slot * (int64_t)kv_heads * d;
  if ((int)blockIdx.y >= head_blocks) {
    if (slot < 0) return;
    const int j = blockIdx.y - head_blocks;  // v head j
    const T* v = row + (int64_t)(units + j) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
      v_cache[cache_row + (int64_t)j * d + i] = to_cache<C>(v[i], scales.v);
    return;
  }
  const int64_t tr = positions != nullptr ? min((int)positions[t], table_rows - 1) : t;
  const T* c = cos + tr * half;
  const T* s = sin + tr * half;
  const int h0 = blockIdx.y * heads_per_block;
  // Per-head RMSNorm: a warp sums each head's squares (every thread reaches the barrier).
  __shared__ float inv_rms[kMaxHeadsPerBlock];
  const bool normed = q_norm != nullptr;
  if (normed) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int lh = warp; lh < heads_per_block && h0 + lh < units; lh += warps) {
      const T* x = row + (int64_t)(h0 + lh) * d;
      float sq = 0.f;
      for (int i = lane; i < d; i += 32) {
        const float v = to_float(x[i]);
        sq += v * v;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, o);
      if (lane == 0) inv_rms[lh] = rsqrtf(sq / (float)d + eps);
    }
    __syncthreads();
  }
  // The value at i of the block's head lh, normalized (and rounded to T) where the heads are.
  auto value = [&](int lh, int i) {
    const int h = h0 + lh;
    const float v = to_float(row[h * d + i]);
    if (!normed) return v;
    const T* w = h < heads ? q_norm : k_norm;
    return to_float(from_float<T>(v * inv_rms[lh] * to_float(w[i])));
  };
  // Rotations: one thread per (head, pair).
  for (int idx = threadIdx.x; idx < heads_per_block * half; idx += blockDim.x) {
    const int lh = idx / half, i = idx % half, h = h0 + lh;
    if (h >= units) break;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = value(lh, a), x2 = value(lh, b);
    const float cc = to_float(c[i]), ss = to_float(s[i]);
    const T y1 = from_float<T>(x1 * cc - x2 * ss);
    const T y2 = from_float<T>(x1 * ss + x2 * cc);
    if (h < heads) {
      T* o = q_out + (t * heads + h) * d;
      o[a] = y1;
      o[b] = y2;
    } else if (slot >= 0) {
      C* o = k_cache + cache_row + (int64_t)(h - heads) * d;
      o[a] = to_cache<C>(y1, scales.k);
      o[b] = to_cache<C>(y2, scales.k);
    }
  }
}

// The arguments of rope_qkv_cache_kernel (see pagewise_rope_qkv_cache).
struct RopeArgs {
  void *q_out, *k_cache, *v_cache;
  const KvScales* kv_fp8;
  const void *qkv, *cos, *sin;
  const uint32_t* positions;
  int table_rows;
  const int64_t* slots;
  const void *q_norm, *k_norm;
  float eps;
  int tokens, heads, kv_heads, d, interleaved;
};

template <typename T, typename C>
int launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const int heads = a.heads, kv_heads = a.kv_heads, d = a.d;
  // As many whole heads as fill a block with one thread per rotation pair (at least one).
  const int half = d / 2;
  int per_block = half >= kRopeThreads ? 1 : kRopeThreads / half;
  if (per_block > kMaxHeadsPerBlock) per_block = kMaxHeadsPerBlock;
  const int head_blocks = (heads + kv_heads + per_block - 1) / per_block;
  const cudaError_t err = launch_early(
      rope_qkv_cache_kernel<T, C>, dim3(a.tokens, head_blocks + kv_heads), dim3(kRopeThreads), 0,
      stream, (T*)a.q_out, (C*)a.k_cache, (C*)a.v_cache, (const T*)a.qkv, (const T*)a.cos,
      (const T*)a.sin, a.positions, a.table_rows, a.slots, (const T*)a.q_norm,
      (const T*)a.k_norm, a.eps, heads, kv_heads, d, a.interleaved, per_block,
      a.kv_fp8 != nullptr ? *a.kv_fp8 : KvScales{1.f, 1.f});
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

}  // namespace

// qkv [tokens, (heads + 2 kv_heads) head_dim] rotated and written as the header says. cos and
// sin: [tokens, d / 2], or with `positions` (u32 [tokens]) whole tables [table_rows, d / 2] read
// at each token's position (clamped to the last row). q_norm and k_norm ([head_dim] each, or
// both null): per-head RMSNorm weights applied with `eps` before rotation. dtype 0 = f32, 1 =
// f16, 2 = bf16. kv_fp8: null, the caches hold dtype; or they hold e4m3 bytes with these scales.
// Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_rope_qkv_cache(int dtype, void* q_out, void* k_cache, void* v_cache,
                                       const KvScales* kv_fp8, const void* qkv, const void* cos, const void* sin,
                                       const uint32_t* positions, int table_rows,
                                       const int64_t* slots, const void* q_norm,
                                       const void* k_norm, float eps, int tokens, int heads,
                                       int kv_heads, int head_dim, int interleaved, void* stream) {
  if (tokens == 0) return 0;
  if (head_dim <= 0 || head_dim % 2 != 0) return 1;
  if (positions != nullptr && table_rows < 1) return 1;
  if ((q_norm == nullptr) != (k_norm == nullptr)) return 1;
  if (q_norm != nullptr && heads + kv_heads > kMaxNormHeads) return 1;
  const RopeArgs a = {q_out,  k_cache, v_cache, kv_fp8, qkv,    cos,      sin,  positions,
                      table_rows, slots, q_norm, k_norm, eps, tokens, heads,
                      kv_heads, head_dim, interleaved};
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 0: return kv_fp8 != nullptr ? 1 : launch_rope<float, float>(a, s);
    case 1:
      return kv_fp8 != nullptr ? launch_rope<__half, uint8_t>(a, s) : launch_rope<__half, __half>(a, s);
    case 2:
      return kv_fp8 != nullptr ? launch_rope<__nv_bfloat16, uint8_t>(a, s)
                               : launch_rope<__nv_bfloat16, __nv_bfloat16>(a, s);
    default: return 1;
  }
}
