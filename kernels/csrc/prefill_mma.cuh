// pagewise: varlen prefill attention over the paged KV cache, FlashAttention-2 style on tensor
// cores (mma.sync m16n8k16, bf16 and f16, head dims 64, 128 and 256); the contract is
// pagewise_paged_prefill's (paged_prefill.cu, which includes this file).
//
// One block per (64-query tile, query head, sequence), the longest tiles (the sequence's last)
// launched first; 4 warps, 16 query rows each. The K/V tiles of 64 positions stream through
// shared memory with cp.async (TileCopier, the decode kernels' paged gather: 16-byte chunks
// XOR-swizzled by row), kStages - 1 tiles ahead of the math. Per tile and warp, everything stays
// in registers: the warp's queries as A fragments (loaded once; at head dim 256 they sit in
// shared memory instead and are read a k-step at a time, so that the output's 128 registers a
// lane fit), S = Q K^T (8 n8-blocks of
// scores), the causal mask and online softmax (a quad of lanes per row), then O += P V with P
// taken straight from the score registers and V read transposed by ldmatrix.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "decode_common.cuh"
#include "dtype.cuh"
#include "mma.cuh"

namespace {

constexpr int kPrefillRows = 16 * kWarps;  // query rows of a block, and K/V positions of a tile

// C: the cache's element, T or e4m3 bytes (kv_fp8.cuh); an FP8 cache's stages are widened into
// one 16-bit tile after the ring (kWideBytes), which the mma code reads.
template <typename T, typename C, int D>
struct PrefillShape {
  using Copier = TileCopier<C, D, kPrefillRows, true, false>;
  static constexpr bool kFp8 = kIsFp8Cache<C>;
  static constexpr int kStageBytes = Copier::kStageElems * (int)sizeof(C);
  static constexpr int kWideBytes = kFp8 ? Copier::kStageElems * (int)sizeof(T) : 0;
  // 2 stages of 32 KB at d128, 3 of 16 KB at d64, 2 of 64 KB at d256 (an FP8 cache keeps the
  // 16-bit ring's count).
  static constexpr int kStages = Copier::kStageElems * (int)sizeof(T) <= 16384 ? 3 : 2;
  // Queries in shared memory (after the stages and the wide tile), stored as K tiles are.
  static constexpr bool kQueryInSmem = D > 128;
  static constexpr int kQueryElems = kQueryInSmem ? kPrefillRows * D : 0;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kWideBytes + kQueryElems * (int)sizeof(T);
};

// The block's kPrefillRows query rows of `head` (q row i at q + i * row_stride; rows past `rows`
// zero) into `tile`, 16-byte chunks XOR-swizzled by row as TileCopier stores K (16-bit T).
template <typename T, int D>
__device__ __forceinline__ void stage_query(T* tile, const T* q, int64_t row_stride, int rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  for (int i = threadIdx.x; i < kPrefillRows * kChunks; i += kThreads) {
    const int r = i / kChunks, ch = i % kChunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) v = *reinterpret_cast<const uint4*>(q + r * row_stride + ch * 8);
    *reinterpret_cast<uint4*>(tile + swizzled<D>(r, ch)) = v;
  }
}

// Row `row` of the warp's A fragments: lanes hold rows g and g + 8 (g = lane / 4), columns 2c,
// 2c + 1 and 2c + 8, 2c + 9 of each 16-wide k-step (c = lane % 4); rows past the chunk are zero.
template <typename T, int D>
__device__ __forceinline__ void load_query(uint32_t qa[D / 16][4], const T* q, int64_t row_a,
                                           int64_t row_b, bool ok_a, bool ok_b, int c) {
  const T* pa = q + row_a * D + 2 * c;
  const T* pb = q + row_b * D + 2 * c;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    qa[k][0] = ok_a ? *reinterpret_cast<const uint32_t*>(pa + k * 16) : 0u;
    qa[k][1] = ok_b ? *reinterpret_cast<const uint32_t*>(pb + k * 16) : 0u;
    qa[k][2] = ok_a ? *reinterpret_cast<const uint32_t*>(pa + k * 16 + 8) : 0u;
    qa[k][3] = ok_b ? *reinterpret_cast<const uint32_t*>(pb + k * 16 + 8) : 0u;
  }
}

template <typename T, typename C, int D>
__global__ void __launch_bounds__(kThreads)
    paged_prefill_mma_kernel(T* __restrict__ out, const T* __restrict__ q,
                             const C* __restrict__ k_cache, const C* __restrict__ v_cache,
                             const int32_t* __restrict__ block_tables,
                             const int32_t* __restrict__ seq_table,
                             const int32_t* __restrict__ q_start, const int32_t* __restrict__ q_len,
                             const int32_t* __restrict__ ctx_len, int max_blocks, int num_heads,
                             int num_kv_heads, int block_size, float scale,
                             const KvScales kv_scales) {
  using S = PrefillShape<T, C, D>;
  using Copier = typename S::Copier;
  extern __shared__ __align__(128) unsigned char smem[];
  C* stages = reinterpret_cast<C*>(smem);
  T* wide = reinterpret_cast<T*>(smem + S::kStages * S::kStageBytes);  // (FP8 caches)

  const int seq = blockIdx.z, head = blockIdx.y;
  const int tile0 = (gridDim.x - 1 - blockIdx.x) * kPrefillRows;  // the longest tiles first
  const int qlen = q_len[seq];
  if (tile0 >= qlen) return;
  const int ctx = ctx_len[seq], first_pos = ctx - qlen, qs = q_start[seq];
  const int kv_head = head / (num_heads / num_kv_heads);
  const int32_t* table = block_tables + (int64_t)seq_table[seq] * max_blocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  // Keys 0 .. end - 1: through the block's last query position.
  const int end = first_pos + min(qlen, tile0 + kPrefillRows);
  const int tiles = (end + kPrefillRows - 1) / kPrefillRows;
  Copier copier(k_cache, v_cache, table, 0, end, block_size, num_kv_heads, kv_head);
  copier.fetch(0);
  copier.template start<S::kStages>(stages, tiles);

  // This lane's two query rows (a: g, b: g + 8 of the warp's 16) and their positions.
  const int row_a = tile0 + warp * 16 + g, row_b = row_a + 8;
  const int pos_a = first_pos + row_a, pos_b = first_pos + row_b;
  const int warp_first = first_pos + tile0 + warp * 16;  // the warp's smallest position
  const bool idle = tile0 + warp * 16 >= qlen;
  uint32_t qa[S::kQueryInSmem ? 1 : D / 16][4];
  T* q_tile = reinterpret_cast<T*>(smem + S::kStages * S::kStageBytes + S::kWideBytes);
  if constexpr (S::kQueryInSmem)
    stage_query<T, D>(q_tile, q + ((int64_t)(qs + tile0) * num_heads + head) * D,
                      (int64_t)num_heads * D, qlen - tile0);  // (read after next()'s barrier)
  else
    load_query<T, D>(qa, q + (int64_t)head * D, (int64_t)(qs + row_a) * num_heads,
                     (int64_t)(qs + row_b) * num_heads, row_a < qlen, row_b < qlen, c);

  // o[n]: dims 8n + 2c, + 1 of row a (o[n][0..1]) and row b (o[n][2..3]).
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // l: this lane's share

  for (int t = 0; t < tiles; ++t) {
    const C* landed = copier.template next<S::kStages>(stages, t, tiles);
    const T* kt;
    if constexpr (S::kFp8) {
      widen_stage<T, D, kPrefillRows, true, kThreads>(wide, landed, kv_scales);
      __syncthreads();
      kt = wide;
    } else {
      (void)wide, (void)kv_scales;
      kt = landed;
    }
    const T* vt = kt + kPrefillRows * D;
    const int k0 = t * kPrefillRows;
    // Nothing for this warp: its rows are past the chunk, or no key of the tile is visible to
    // any of them (every warp still takes part in next()'s barrier).
    if (idle || k0 > warp_first + 15) continue;

    // S = Q K^T: sc[j] covers keys 8j .. 8j + 7 of the tile (lane: 8j + 2c, + 1).
    float sc[kPrefillRows / 8][4];
#pragma unroll
    for (int j = 0; j < kPrefillRows / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
    if constexpr (S::kQueryInSmem) {
      mma_scores_qs<T, D, kPrefillRows>(sc, q_tile, warp * 16, kt);
    } else {
#pragma unroll
      for (int kb = 0; kb < kPrefillRows / 16; ++kb)
        mma_scores16<T, D>(sc[2 * kb], sc[2 * kb + 1], qa, kt, kb * 16);
    }

    // Scale, mask (causal: key position <= the row's; no mask when every key of the tile is at
    // or before the warp's first row), and the rows' maxima over the quad.
    const bool full = k0 + kPrefillRows - 1 <= warp_first;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPrefillRows / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + 8 * j + 2 * c + e;
        sc[j][e] = full || key <= pos_a ? sc[j][e] * scale : -INFINITY;
        sc[j][2 + e] = full || key <= pos_b ? sc[j][2 + e] * scale : -INFINITY;
        mx_a = fmaxf(mx_a, sc[j][e]);
        mx_b = fmaxf(mx_b, sc[j][2 + e]);
      }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffff, mx_a, x));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffff, mx_b, x));
    }
    const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
    // A row with nothing visible yet keeps everything at zero.
    const float base_a = new_a == -INFINITY ? 0.f : new_a;
    const float base_b = new_b == -INFINITY ? 0.f : new_b;
    const float corr_a = __expf(m_a - base_a), corr_b = __expf(m_b - base_b);
    m_a = new_a;
    m_b = new_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int j = 0; j < kPrefillRows / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[j][e] = __expf(sc[j][e] - base_a);
        sc[j][2 + e] = __expf(sc[j][2 + e] - base_b);
        sum_a += sc[j][e];
        sum_b += sc[j][2 + e];
      }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr_a;
      o[n][1] *= corr_a;
      o[n][2] *= corr_b;
      o[n][3] *= corr_b;
    }

    // O += P V, 16 keys a k-step: P's A fragment is score blocks 2kk and 2kk + 1.
#pragma unroll
    for (int kk = 0; kk < kPrefillRows / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]),
                              pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                              pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      mma_values16<T, D>(o, pa, vt, kk * 16);
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_a += __shfl_xor_sync(0xffffffff, l_a, x);
    l_b += __shfl_xor_sync(0xffffffff, l_b, x);
  }
  const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
  T* oa = out + ((int64_t)(qs + row_a) * num_heads + head) * D + 2 * c;
  T* ob = out + ((int64_t)(qs + row_b) * num_heads + head) * D + 2 * c;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (row_a < qlen)
      *reinterpret_cast<uint32_t*>(oa + 8 * n) = pack2<T>(o[n][0] * inv_a, o[n][1] * inv_a);
    if (row_b < qlen)
      *reinterpret_cast<uint32_t*>(ob + 8 * n) = pack2<T>(o[n][2] * inv_b, o[n][3] * inv_b);
  }
}

}  // namespace
