// pagewise: what the two paged decode kernels share (cp.async helpers, launch arguments, the
// split's range of positions). Included by paged_decode.cu.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "kv_fp8.cuh"
#include "pdl.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = 8;
// Most splits of one context the merges take (the plans stay within it).
constexpr int kMaxSplits = 512;

// 16 bytes global -> shared without passing through registers; `fill` false writes zeros instead
// (rows past the context, so a masked score never meets an uninitialized V row).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(fill ? 16 : 0));
}
// The same with an L2 cache policy (from l2_evict_first).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool fill,
                                           uint64_t policy) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d),
               "l"(src), "r"(fill ? 16 : 0), "l"(policy));
}
// An L2 policy for data read once: its lines are the first to go, so streaming it keeps what
// is read again (block tables, queries, the merge's partials) in L2.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A decode step's new tokens as the fused projection left them (rows: [heads | kv_heads |
// kv_heads] x D each), for the tensor-core kernel to normalize (per head, optionally), rotate and
// write into the caches itself instead of a kernel before it doing so (decode_fresh.cuh). Row r
// of the step is its sequence's newest token: position context_lens[r] - 1, cache slot slots[r]
// (-1: not written). qkv null: the query is given rotated and the caches hold the step's K/V.
struct FreshQkv {
  const void* qkv;
  void* k_cache;  // the caches again, to write (the kernel's own pointers are read-only)
  void* v_cache;
  const void* cos;  // [table_rows, D / 2] read at each row's position (clamped to the last row),
  const void* sin;  // or without positions a row for each row of the step
  const uint32_t* positions;
  int table_rows;
  const int64_t* slots;
  const void* q_norm;  // [D] each, or both null: no per-head RMSNorm
  const void* k_norm;
  float eps;
  int interleaved;  // pairs (2i, 2i + 1) instead of (i, i + D / 2)
};

struct DecodeArgs {
  void* out;
  float* part_ml;
  float* part_acc;
  const void* q;
  const void* k_cache;
  const void* v_cache;
  // null: the caches hold the queries' dtype; else e4m3 bytes with these scales (kv_fp8.cuh).
  const KvScales* kv_fp8;
  const int32_t* block_tables;
  const int32_t* row_seq;
  const int32_t* context_lens;
  int num_seqs, max_blocks, num_heads, num_kv_heads, head_dim, block_size, num_splits, chunk;
  // How many positions at the end of each row's context the kernel before this one may still be
  // writing in the caches (1: a decode step's new tokens); -1: any, so no K/V is read before it
  // ends. The tensor-core kernel starts copying tiles wholly before them early.
  int fresh_tail;
  // A sliding-window layer's window: each row attends over the last `window` positions of its
  // context only; 0: the whole context.
  int window;
  float scale;
  // Each query head's attention sink (f32 [num_heads]): a learned logit that joins the softmax
  // and attends to nothing (gpt-oss); null: none.
  const float* sinks;
  FreshQkv fresh;
  cudaStream_t stream;
};

// The softmax's denominator `L` (over scores relative to `M`) with head `head`'s sink, if any.
__device__ __forceinline__ float with_sink(float L, float M, const float* sinks, int head) {
  return (sinks != nullptr && L > 0.f) ? L + __expf(sinks[head] - M) : L;
}

// Contexts of at most this many positions are never split (split.rs's MIN_CHUNK): the first
// split takes them whole whatever the plan, so a short sequence's attention sums in one order in
// every step, eager or graph-replayed, alone or batched.
constexpr int kWholeContext = 128;

// The positions [begin, end) of a row's context that split `split` of `num_splits` covers.
// `chunk` is a floor: a row splits its own context evenly when that gives longer chunks (a CUDA
// graph fixes the split count while the contexts vary from replay to replay).
__device__ __forceinline__ void split_range(int ctx, int split, int num_splits, int chunk,
                                            int* begin, int* end) {
  const int row_chunk =
      ctx <= kWholeContext ? ctx : max(chunk, (ctx + num_splits - 1) / num_splits);
  *begin = (int)min((int64_t)ctx, (int64_t)split * row_chunk);
  *end = min(ctx, *begin + row_chunk);
}

// split_range over the positions a row attends to: the last `window` of its context (all of it
// when window is 0), split among the splits as a context of that length would be.
__device__ __forceinline__ void window_split_range(int ctx, int window, int split, int num_splits,
                                                   int chunk, int* begin, int* end) {
  const int first = window > 0 ? max(0, ctx - window) : 0;
  split_range(ctx - first, split, num_splits, chunk, begin, end);
  *begin += first;
  *end += first;
}

// Streams tiles of kRows context positions of one KV head (its K and V rows, D elements each)
// from the paged cache into shared-memory stages with cp.async. Stage layout: the K tile
// [kRows][D], then the V tile. K rows, and V rows when kSwizzleV, store their 16-byte chunks
// XOR-swizzled by row (chunk c of row r at c ^ (r % 8)), so reads of one chunk column by eight
// rows hit distinct banks. The cache offsets of a tile are fetched one tile before its copies
// are issued, so the block-table reads are in flight during a tile's math. kReadOnce: the copies
// carry L2's evict-first policy (decode reads each K/V row once a step; prefill's tiles are read
// again by the next query tiles and heads, so it keeps the default).
// benches/history/tried.md, "Evict-first K/V copies in decode attention".
// T of one byte (an FP8 cache's e4m3, kv_fp8.cuh): rows are stored as the cache holds them,
// unswizzled (widen_stage lays them out swizzled as 16-bit tiles).
template <typename T, int D, int kRows, bool kSwizzleV, bool kReadOnce>
struct TileCopier {
  static constexpr bool kBytes = sizeof(T) == 1;
  static constexpr int kChunks = D * (int)sizeof(T) / 16;    // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;    // rows one pass of copies covers
  static constexpr int kPer = kRows / kRowsPerPass;          // rows each thread copies per tile
  static constexpr int kStageElems = 2 * kRows * D;
  static_assert((kChunks >= 8 || kBytes) && kThreads % kChunks == 0 && kRows % kRowsPerPass == 0,
                "shape");

  const T* k_cache;
  const T* v_cache;
  const int32_t* table;
  int begin, end, block_size, col, row0;
  int64_t row_stride, head_off;
  int32_t slots[kPer];  // cache slots (block x block_size + offset) of this thread's rows

  __device__ TileCopier(const T* k, const T* v, const int32_t* tbl, int b, int e, int bs,
                        int num_kv_heads, int kv_head)
      : k_cache(k), v_cache(v), table(tbl), begin(b), end(e), block_size(bs),
        col(threadIdx.x % kChunks), row0(threadIdx.x / kChunks),
        row_stride((int64_t)num_kv_heads * D),
        head_off((int64_t)kv_head * D + (threadIdx.x % kChunks) * (16 / (int)sizeof(T))) {}

  // Cache slots of this thread's rows of `tile` (-1 past the split's end). Kept as 32-bit slots,
  // not 64-bit offsets: at head dim 256 a thread copies 16 rows a tile.
  __device__ __forceinline__ void fetch(int tile) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int p = begin + tile * kRows + row0 + i * kRowsPerPass;
      slots[i] = p < end ? table[p / block_size] * block_size + p % block_size : -1;
    }
  }

  // The ring of kStages stages at `stages`: its first kStages - 1 tiles in flight (one commit
  // group each, empty past the last tile) and the next tile's offsets fetched. Tile 0's offsets
  // are fetched before (fetch(0)): a kernel does that before it waits for the previous grid.
  template <int kStages>
  __device__ __forceinline__ void start(T* stages, int tiles) {
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < tiles) {
        if (s > 0) fetch(s);
        issue(stages + s * kStageElems);
      }
      cp_async_commit();
    }
    fetch(kStages - 1);
  }

  // Waits until tile t has landed for every thread (the barrier also means everyone is done with
  // tile t - 1's stage), refills that stage with tile t + kStages - 1, and returns tile t's stage.
  template <int kStages>
  __device__ __forceinline__ const T* next(T* stages, int t, int tiles) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < tiles) issue(stages + ((t + kStages - 1) % kStages) * kStageElems);
    cp_async_commit();
    fetch(t + kStages);
    return stages + (t % kStages) * kStageElems;
  }

  // Copies the fetched tile into `stage`; rows past the end are zero-filled.
  __device__ __forceinline__ void issue(T* stage) const {
    constexpr int kVec = 16 / (int)sizeof(T);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int r = row0 + i * kRowsPerPass;
      const bool ok = slots[i] >= 0;
      const int64_t off = ok ? (int64_t)slots[i] * row_stride + head_off : 0;
      const int sw = (kBytes ? col : col ^ (r & 7)) * kVec;
      T* k_dst = stage + r * D + sw;
      T* v_dst = stage + (kRows + r) * D + (kSwizzleV ? sw : col * kVec);
      if constexpr (kReadOnce) {
        const uint64_t policy = l2_evict_first();
        cp_async16(k_dst, k_cache + off, ok, policy);
        cp_async16(v_dst, v_cache + off, ok, policy);
      } else {
        cp_async16(k_dst, k_cache + off, ok);
        cp_async16(v_dst, v_cache + off, ok);
      }
    }
  }
};

}  // namespace
