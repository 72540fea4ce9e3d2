// pagewise: the tensor-core decode kernel taking a step's new tokens straight from the fused qkv
// projection (FreshQkv): each block normalizes (Qwen3, Gemma 3) and rotates its group's query
// heads into shared memory, and the block whose split holds the newest position also its K and
// V head, which it writes into the caches and into its tile's shared-memory row. That is the
// work of rope_qkv_cache (rope_cache.cu), with the same roundings, without a launch of its own
// between the projection and attention. Since no kernel before writes the caches, every tile may
// be copied before the kernel waits for the projection; the newest row is copied stale and then
// overwritten in shared memory. Included by decode_mma.cuh.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "decode_common.cuh"
#include "dtype.cuh"

namespace {

// Row `seq`'s query heads of KV head `kv_head` (rows 0 .. group - 1 of `fs`, [group + 2][D]),
// then that KV head's K (row group) and V (row group + 1), normalized and rotated as
// rope_qkv_cache stores them. With `write`, K and V also go into the caches at the row's slot. A
// warp a head: lane l holds elements l + 32j, so rotate-half pairs (j, j + D / 64) are the lane's
// own and interleaved pairs its neighbour's (a shuffle). Every thread of the block calls it.
template <typename T, int D>
__device__ __forceinline__ void fresh_heads(T* fs, const FreshQkv& f, int seq, int kv_head,
                                            int group, int num_heads, int num_kv_heads,
                                            bool write) {
  constexpr int kPer = D / 32, kHalf = kPer / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* row = static_cast<const T*>(f.qkv) + (int64_t)seq * (num_heads + 2 * num_kv_heads) * D;
  const int pos = f.positions != nullptr ? min((int)f.positions[seq], f.table_rows - 1) : seq;
  const T* cs = static_cast<const T*>(f.cos) + (int64_t)pos * (D / 2);
  const T* sn = static_cast<const T*>(f.sin) + (int64_t)pos * (D / 2);
  const int64_t slot = f.slots[seq];
  const int64_t cache_at = slot * num_kv_heads * D + (int64_t)kv_head * D;
  for (int u = warp; u < group + 2; u += kWarps) {
    const bool is_k = u == group, is_v = u == group + 1;
    const int head = is_v   ? num_heads + num_kv_heads + kv_head
                     : is_k ? num_heads + kv_head
                            : kv_head * group + u;
    const T* src = row + (int64_t)head * D;
    float x[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] = to_float(src[lane + 32 * j]);
    if (!is_v) {
      if (f.q_norm != nullptr) {
        float sq = 0.f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) sq += x[j] * x[j];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, o);
        const float inv_rms = rsqrtf(sq / (float)D + f.eps);
        const T* w = static_cast<const T*>(is_k ? f.k_norm : f.q_norm);
#pragma unroll
        for (int j = 0; j < kPer; ++j)
          x[j] = to_float(from_float<T>(x[j] * inv_rms * to_float(w[lane + 32 * j])));
      }
      if (f.interleaved) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const float other = __shfl_xor_sync(0xffffffff, x[j], 1);
          const int i = (lane + 32 * j) / 2;
          const float cc = to_float(cs[i]), ss = to_float(sn[i]);
          x[j] = lane % 2 == 0 ? x[j] * cc - other * ss : other * ss + x[j] * cc;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kHalf; ++j) {
          const int i = lane + 32 * j;
          const float x1 = x[j], x2 = x[j + kHalf];
          const float cc = to_float(cs[i]), ss = to_float(sn[i]);
          x[j] = x1 * cc - x2 * ss;
          x[j + kHalf] = x1 * ss + x2 * cc;
        }
      }
    }
    T* dst = fs + u * D;
    T* cache = static_cast<T*>(is_k ? f.k_cache : f.v_cache);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const T y = from_float<T>(x[j]);
      dst[lane + 32 * j] = y;
      if (write && u >= group && slot >= 0) cache[cache_at + lane + 32 * j] = y;
    }
  }
}

// Overwrites row `r` of a landed tile stage ([kRows][D] K, then V; 16-byte chunks swizzled as
// TileCopier lays them out, V too) with `k` and `v` ([D] each, shared memory).
template <typename T, int D, int kRows>
__device__ __forceinline__ void patch_stage_row(T* stage, const T* k, const T* v, int r) {
  constexpr int kVec = 16 / (int)sizeof(T);
  for (int e = threadIdx.x; e < D; e += kThreads) {
    const int at = r * D + (((e / kVec) ^ (r & 7)) * kVec) + e % kVec;
    stage[at] = k[e];
    stage[kRows * D + at] = v[e];
  }
}

}  // namespace
