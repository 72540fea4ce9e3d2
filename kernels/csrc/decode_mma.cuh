// pagewise: paged decode attention on tensor cores (mma.sync m16n8k16, bf16 and f16, head dims 64,
// 128 and 256). The query heads sharing a KV head are the rows of the scores' matrix product (up
// to 8 of its 16 rows) and the columns of the transposed weighted sum of V rows, so each takes a
// few tensor-core instructions per 16 positions instead of one FMA per element. Included by
// paged_decode.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "decode_common.cuh"
#include "decode_fresh.cuh"
#include "dtype.cuh"
#include "mma.cuh"

namespace {

template <typename T, typename C, int D>
struct MmaShape {
  // Warps a tile's 16 positions are split among by dims: 2 at d256 (each warp takes 128 dims of
  // the scores and of the output, and the pair adds its partial scores through shared memory),
  // so a lane keeps d128's registers and a stage d128's bytes.
  static constexpr int kHalves = D > 128 ? 2 : 1;
  static constexpr int kDims = D / kHalves;  // dims a warp takes
  // Positions per pipeline stage: 16 for each warp (each pair at d256).
  static constexpr int kRows = 16 * kWarps / kHalves;
  // The ring's stages hold the cache's elements C: T, or e4m3 bytes (kv_fp8.cuh), which are
  // widened into one 16-bit tile after the ring (kWideBytes) that the mma code reads. (The
  // e4m3 copies go without the evict-first hint: with it, ptxas 13.0 made an instruction the
  // H100 refused as illegal at d64.)
  static constexpr bool kFp8 = kIsFp8Cache<C>;
  using Copier = TileCopier<C, D, kRows, true, !kFp8>;
  static constexpr int kStageBytes = Copier::kStageElems * (int)sizeof(C);
  static constexpr int kWideBytes = kFp8 ? Copier::kStageElems * (int)sizeof(T) : 0;
  // 2 stages of 32 KB at d128 and d256 (3 blocks per SM), 3 of 16 KB at d64 (4 per SM); an FP8
  // cache keeps the 16-bit ring's count (its stages and the wide tile take the same room at
  // d128 and d256).
  static constexpr int kStages = Copier::kStageElems * (int)sizeof(T) <= 16384 ? 3 : 2;
  static constexpr int kSmemBytes = kStages * kStageBytes + kWideBytes;
  // The end-of-block merge of the warps reuses the stages: (max, sum) and D sums per head, then
  // the block's own (max, sum) and sums per head for a cluster's merge of its splits.
  static_assert(((kWarps + 1) * 8 * (D + 2)) * 4 <= kSmemBytes, "merge space");
};

// Most splits merged inside a thread-block cluster (the portable cluster size). The launch
// (paged_decode.cu's `clustered`) forms no larger clusters: merge_cluster_splits reads this many
// ranks at most.
constexpr int kMaxClusterSplits = 8;

// Merges the splits of a (row, KV head) held by the blocks of one thread-block cluster (one block
// per split; `ml` [8][2] and `o` [8][D] in each block's shared memory, published by the caller's
// cluster barrier): block `rank` of `ranks` writes its share of the group's group x D outputs,
// reading every split's partials through distributed shared memory. Ends with a cluster barrier,
// so no block leaves while another still reads its shared memory.
template <typename T, int D>
__device__ __forceinline__ void merge_cluster_splits(T* out_heads, const float* ml, const float* o,
                                                     int group, const float* sinks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int ranks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
  cluster.sync();
  for (int i = rank * kThreads + (int)threadIdx.x; i < group * D; i += ranks * kThreads) {
    const int g = i / D, d = i % D;
    // Every split's (max, sum) and sum for this output, all requested at once: one trip through
    // distributed shared memory instead of one a split.
    float ms[kMaxClusterSplits], ls[kMaxClusterSplits], os[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      ms[s] = -INFINITY;
      ls[s] = os[s] = 0.f;
      if (s < ranks) {
        const float2 v = *reinterpret_cast<const float2*>(cluster.map_shared_rank(ml, s) + g * 2);
        ms[s] = v.x;
        ls[s] = v.y;
        os[s] = cluster.map_shared_rank(o, s)[g * D + d];
      }
    }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s)
      if (ls[s] > 0.f) M = fmaxf(M, ms[s]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (ls[s] == 0.f) continue;
      const float f = __expf(ms[s] - M);
      L += ls[s] * f;
      acc += os[s] * f;
    }
    L = with_sink(L, M, sinks, g);
    out_heads[g * D + d] = from_float<T>(L > 0.f ? acc / L : 0.f);
  }
  cluster.sync();
#else
  (void)out_heads, (void)ml, (void)o, (void)group, (void)sinks;
#endif
}

// Blocks in this block's thread-block cluster (1 when launched without clusters).
__device__ __forceinline__ int cluster_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return (int)cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

// One block per (query row, KV head, context split), as the CUDA-core kernel. The split streams
// through shared memory in tiles of 64 positions (32 at d256: MmaShape; cp.async, kStages - 1
// tiles ahead); warp w takes positions [16w, 16w + 16) of every tile (at d256 warps 2p and 2p + 1
// take positions [16p, 16p + 16), one half of the dims each) and keeps its own online softmax, so the warps never wait
// on each other inside the loop (one barrier per tile, for the stage ring). Per tile and warp:
// scores S = Q K^T as 2 n8-blocks over D / 16 k-steps, with Q (the group's heads as rows, rows
// past the group zero) held in registers for the whole split; lane l holds head l / 4's scores
// at 4 positions; then O^T += V^T P^T with P^T taken straight from the score registers
// (FlashAttention-2 style) and V read transposed by ldmatrix as the A operand, so the output uses
// every tensor-core row (D / 16 accumulators of 4 a lane, not D / 8). At the end the 4 warps
// merge through shared memory.
// C: the cache's element (T, or e4m3 bytes scaled by kv_scales: each landed stage is widened
// into a 16-bit tile first, one more barrier a tile).
template <typename T, typename C, int D>
__global__ void __launch_bounds__(kThreads)
    paged_decode_mma_kernel(T* __restrict__ out, float* __restrict__ part_ml,
                            float* __restrict__ part_acc, const T* __restrict__ q,
                            const C* __restrict__ k_cache, const C* __restrict__ v_cache,
                            const int32_t* __restrict__ block_tables,
                            const int32_t* __restrict__ row_seq,
                            const int32_t* __restrict__ context_lens, int max_blocks,
                            int num_heads, int num_kv_heads, int block_size, int chunk,
                            int fresh_tail, int window, float scale,
                            const float* __restrict__ sinks, const FreshQkv fresh,
                            const KvScales kv_scales) {
  using S = MmaShape<T, C, D>;
  using Copier = typename S::Copier;
  extern __shared__ __align__(16) unsigned char smem[];
  C* stages = reinterpret_cast<C*>(smem);
  T* wide = reinterpret_cast<T*>(smem + S::kStages * S::kStageBytes);  // (FP8 caches)

  const int seq = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z, num_splits = gridDim.z;
  const int group = num_heads / num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r = lane / 4, c = lane % 4;  // this lane's head (matrix row) and column pair
  int begin, end;
  const int ctx = context_lens[seq];
  window_split_range(ctx, window, split, num_splits, chunk, &begin, &end);
  constexpr int kRows = S::kRows, kDims = S::kDims;
  const int tiles = (end - begin + kRows - 1) / kRows;
  const int32_t* table = block_tables + (int64_t)(row_seq ? row_seq[seq] : seq) * max_blocks;
  // With the step's new tokens unrotated (FreshQkv), the block whose split holds the newest
  // position writes its K and V, and patches them into that tile's stage (decode_fresh.cuh); a
  // row without a slot (-1) writes nothing, and reads the cache as it is, as after rope_qkv_cache.
  const bool from_qkv = !S::kFp8 && fresh.qkv != nullptr;  // (16-bit caches only)
  const int newest = ctx - 1;
  const bool owns_newest = from_qkv && begin <= newest && newest < end && fresh.slots[seq] >= 0;

  // Block tables and lengths are inputs, not earlier kernels' outputs: read them at once. So are
  // the cache's positions before the last fresh_tail of the context: when the ring's first tiles
  // lie wholly before them, they are copied before the wait too (the memory system is busy
  // while the kernel before ends). Taking the new tokens from the projection, no kernel before
  // writes the caches: the ring is always started early.
  Copier copier(k_cache, v_cache, table, begin, end, block_size, num_kv_heads, kv_head);
  copier.fetch(0);
  const bool early =
      tiles > 0 && (from_qkv || (fresh_tail >= 0 &&
                                 min(begin + (S::kStages - 1) * kRows, end) <= ctx - fresh_tail));
  if (early) copier.template start<S::kStages>(stages, tiles);
  wait_for_previous_grid();  // the query (and the cache's fresh positions) are written by it
  let_next_grid_launch();    // the merge may be scheduled now; it waits for this grid's end
  if (!early) copier.template start<S::kStages>(stages, tiles);
  // The group's query heads, then the newest K and V, from the projection.
  __shared__ __align__(16) T fresh_rows[(kMaxGroup + 2) * D];
  if (from_qkv) {
    fresh_heads<T, D>(fresh_rows, fresh, seq, kv_head, group, num_heads, num_kv_heads,
                      owns_newest);
    __syncthreads();
  }

  // This warp's 16 positions of each tile (pos_group) and its dims (dim0 .. dim0 + kDims).
  const int pos_group = warp / S::kHalves, dim0 = (warp % S::kHalves) * kDims;
  // Q as the A operand: row r = head r of the group, columns 2c, 2c + 1 (+ 8) of each k-step of
  // the warp's dims; rows 8-15 are zero.
  uint32_t qa[kDims / 16][4];
  {
    const T* qr = (from_qkv ? fresh_rows + r * D
                            : q + ((int64_t)seq * num_heads + (int64_t)kv_head * group + r) * D) +
                  dim0 + 2 * c;
#pragma unroll
    for (int k = 0; k < kDims / 16; ++k) {
      qa[k][0] = r < group ? *reinterpret_cast<const uint32_t*>(qr + k * 16) : 0u;
      qa[k][2] = r < group ? *reinterpret_cast<const uint32_t*>(qr + k * 16 + 8) : 0u;
      qa[k][1] = qa[k][3] = 0u;
    }
  }

  // O transposed (mma_values16_t): o[m] holds dims 16m + r (+ 8) of heads 2c and 2c + 1.
  float o[kDims / 16][4];
#pragma unroll
  for (int m = 0; m < kDims / 16; ++m) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
  float m = -INFINITY, l = 0.f;    // l: this lane's share of the row sum
  const int prow = pos_group * 16;  // the warp's first row of each tile
  // The pairs' partial scores at d256 (rows 0-7 only: rows 8-15 are zero).
  static_assert(S::kHalves == 1 || kWarps / S::kHalves == 2, "two pairs: barriers 1 and 2");
  __shared__ float4 partial_scores[S::kHalves > 1 ? kWarps : 1][32];

  for (int t = 0; t < tiles; ++t) {
    const C* landed = copier.template next<S::kStages>(stages, t, tiles);
    const T* kt;
    if constexpr (S::kFp8) {
      widen_stage<T, D, kRows, true, kThreads>(wide, landed, kv_scales);
      __syncthreads();
      kt = wide;
    } else {
      (void)wide, (void)kv_scales;
      kt = landed;
    }
    const T* vt = kt + kRows * D;
    if (owns_newest && t == (newest - begin) / kRows) {  // (the same for the whole block)
      patch_stage_row<T, D, kRows>(const_cast<T*>(kt), fresh_rows + group * D,
                                   fresh_rows + (group + 1) * D, (newest - begin) % kRows);
      __syncthreads();
    }

    // Scores: sc[b] covers the warp's positions 8b .. 8b + 7 (lane: 8b + 2c, + 1).
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    mma_scores16<T, D, kDims>(sc[0], sc[1], qa, kt, prow, dim0);
    if constexpr (S::kHalves > 1) {
      // Each warp of the pair adds the other's half (x + y == y + x: both get the same scores,
      // so both keep the same softmax). The other overwrites its half only after next()'s
      // barrier, which this warp reaches after reading it.
      partial_scores[warp][lane] = make_float4(sc[0][0], sc[0][1], sc[1][0], sc[1][1]);
      if (pos_group == 0)  // (named barriers 1 and 2, one per pair; constant ids)
        asm volatile("bar.sync 1, 64;\n" ::: "memory");
      else
        asm volatile("bar.sync 2, 64;\n" ::: "memory");
      const float4 other = partial_scores[warp ^ 1][lane];
      sc[0][0] += other.x;
      sc[0][1] += other.y;
      sc[1][0] += other.z;
      sc[1][1] += other.w;
    }
    // Online softmax of row r over the warp's 16 positions (the quad of lanes 4r .. 4r + 3).
    const int first = begin + t * kRows + prow;
    float mx = -INFINITY;
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool valid = first + 8 * b + 2 * c + j < end;
        sc[b][j] = valid ? sc[b][j] * scale : -INFINITY;
        mx = fmaxf(mx, sc[b][j]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
    const float m_new = fmaxf(m, mx);
    // Nothing valid yet in this row: keep everything at zero.
    const float base = m_new == -INFINITY ? 0.f : m_new;
    const float correction = __expf(m - base);
    m = m_new;
    float p[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < 2; ++j) p[b][j] = __expf(sc[b][j] - base);
    l = l * correction + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    // This lane's output columns are heads 2c and 2c + 1: their corrections live in the quads
    // of lanes 8c and 8c + 4.
    const float corr0 = __shfl_sync(0xffffffff, correction, 8 * c);
    const float corr1 = __shfl_sync(0xffffffff, correction, 8 * c + 4);
#pragma unroll
    for (int n = 0; n < kDims / 16; ++n) {
      o[n][0] *= corr0;
      o[n][1] *= corr1;
      o[n][2] *= corr0;
      o[n][3] *= corr1;
    }
    // O^T += V^T P^T: P's row r at positions 2c (+1) and 8 + 2c (+1) are the score registers.
    const uint32_t pb[2] = {pack2<T>(p[0][0], p[0][1]), pack2<T>(p[1][0], p[1][1])};
    mma_values16_t<T, D, kDims>(o, pb, vt, prow, dim0);
  }

  // Merge the position groups: per head, (max, sum) and the D unnormalized sums of each.
  l += __shfl_xor_sync(0xffffffff, l, 1);
  l += __shfl_xor_sync(0xffffffff, l, 2);
  cp_async_wait<0>();
  __syncthreads();
  constexpr int kGroups = kWarps / S::kHalves;
  float* sm_ml = reinterpret_cast<float*>(smem);  // [kGroups][8][2]
  float* sm_o = sm_ml + kWarps * 8 * 2;           // [kGroups][8][D]
  float* res_ml = sm_o + kWarps * 8 * D;          // [8][2]: the block's, for a cluster merge
  float* res_o = res_ml + 8 * 2;                  // [8][D]
  // Launched in clusters of the splits (launch_split): the splits merge through shared memory.
  const bool clustered = num_splits > 1 && cluster_blocks() == num_splits;
  if (r < group && c == 0 && dim0 == 0) {
    sm_ml[(pos_group * 8 + r) * 2] = m;
    sm_ml[(pos_group * 8 + r) * 2 + 1] = l;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * c + j;
    if (h < group) {
      float* row = sm_o + (pos_group * 8 + h) * D + dim0 + r;
#pragma unroll
      for (int n = 0; n < kDims / 16; ++n) {
        row[16 * n] = o[n][j];
        row[16 * n + 8] = o[n][2 + j];
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < group * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kGroups; ++w)
      if (sm_ml[(w * 8 + g) * 2 + 1] > 0.f) M = fmaxf(M, sm_ml[(w * 8 + g) * 2]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kGroups; ++w) {
      const float lw = sm_ml[(w * 8 + g) * 2 + 1];
      if (lw == 0.f) continue;
      const float f = __expf(sm_ml[(w * 8 + g) * 2] - M);
      L += lw * f;
      acc += sm_o[(w * 8 + g) * D + d] * f;
    }
    const int head = kv_head * group + g;
    if (num_splits == 1) {
      L = with_sink(L, M, sinks, head);
      out[((int64_t)seq * num_heads + head) * D + d] = from_float<T>(L > 0.f ? acc / L : 0.f);
    } else if (clustered) {
      if (d == 0) {
        res_ml[g * 2] = M;
        res_ml[g * 2 + 1] = L;
      }
      res_o[g * D + d] = acc;
    } else {
      const int64_t part = ((int64_t)seq * num_heads + head) * num_splits + split;
      if (d == 0) {
        part_ml[part * 2] = M;
        part_ml[part * 2 + 1] = L;
      }
      part_acc[part * D + d] = acc;
    }
  }
  if (clustered)
    merge_cluster_splits<T, D>(out + ((int64_t)seq * num_heads + (int64_t)kv_head * group) * D,
                               res_ml, res_o, group,
                               sinks == nullptr ? nullptr : sinks + (int64_t)kv_head * group);
}

}  // namespace
