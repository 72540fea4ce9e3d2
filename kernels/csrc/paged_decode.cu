// pagewise CUDA kernels: paged decode attention over the NHD paged KV cache
// ([num_blocks, block_size, num_kv_heads, head_dim] per layer; slot s = block s / bs, row s % bs),
// split-KV with a log-sum-exp merge. The CUDA-core kernel here serves f32; bf16 and f16 (head dims
// 64, 128 and 256) run on tensor cores (decode_mma.cuh). Needs sm_80+ (cp.async, mma.sync).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <type_traits>
#include "dtype.cuh"
#include "decode_common.cuh"
#include "decode_mma.cuh"

namespace {

// Context positions per pipeline stage: one per lane in the softmax.
constexpr int kTile = 32;

// Sizes that follow from the element type and head dim.
template <typename T, int D>
struct Shape {
  static constexpr int kVec = 16 / sizeof(T);              // elements per 16-byte chunk
  static constexpr int kChunks = D / kVec;                 // chunks per K or V row (8..64)
  static constexpr int kStageElems = 2 * kTile * D;        // the K tile, then the V tile
  static constexpr int kStageBytes = kStageElems * (int)sizeof(T);
  // Tiles in flight (f32, the only type this kernel serves): 3 stages of 16 KB at d64, 2 of 32
  // or 64 KB at d128 and d256.
  static constexpr int kStages = kStageBytes <= 16384 ? 3 : 2;
  static constexpr int kPart = D / 32;                     // output dims per lane
};

template <typename T, int N>
struct alignas(N * sizeof(T)) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* p, float out[N]) {
  const Vec<T, N> x = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(x.v[i]);
}

template <typename T, int D, int G>
constexpr int decode_smem_bytes() {
  using S = Shape<T, D>;
  return S::kStages * S::kStageBytes + (G * D + kWarps * G * kTile) * (int)sizeof(float);
}

// One block per (query row, KV head, context split); the block serves every query head of the KV
// head's group, so each K/V row is read once. A row is one query token: a decoding sequence's, or
// one of a prefill chunk's (row_seq names its sequence's block table; its context length is its
// position + 1, which makes a chunk causal over itself and full over its prefix).
//
// The split's context streams through shared memory in tiles of 32 positions, kStages - 1 tiles
// ahead of the math (cp.async), so the loads in flight do not wait on the softmax. Per tile:
// scores with lane = position and warp = a quarter of the head dims (K rows are stored with their
// 16-byte chunks XOR-swizzled by row, so the lanes' reads hit distinct banks); then warp w owns
// query heads w, w + 4, ... of the group: it sums the quarters, updates that head's online
// softmax, and accumulates the V rows with lane l holding dims [l*P, l*P+P). One split writes the
// output; several write unnormalized partials (max, sum, acc) for the merge kernel.
// G bounds the group size at compile time (1, 2, 4 or 8), so registers scale with the real group.
template <typename T, int D, int G>
__global__ void __launch_bounds__(kThreads)
    paged_decode_kernel(T* __restrict__ out, float* __restrict__ part_ml,
                        float* __restrict__ part_acc, const T* __restrict__ q,
                        const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                        const int32_t* __restrict__ block_tables,
                        const int32_t* __restrict__ row_seq,
                        const int32_t* __restrict__ context_lens, int max_blocks, int num_heads,
                        int num_kv_heads, int block_size, int chunk, int /*fresh_tail*/,
                        int window, float scale, const float* __restrict__ sinks,
                        const FreshQkv /*fresh: the tensor-core kernel's only*/,
                        const KvScales /*FP8 caches: the tensor-core kernel's only*/) {
  using S = Shape<T, D>;
  constexpr int kHeadsPerWarp = (G + kWarps - 1) / kWarps;
  extern __shared__ __align__(16) unsigned char smem[];
  T* stages = reinterpret_cast<T*>(smem);
  float* sq = reinterpret_cast<float*>(smem + S::kStages * S::kStageBytes);  // [G][D]
  float* sp = sq + G * D;                                                     // [kWarps][G][kTile]

  const int seq = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z, num_splits = gridDim.z;
  const int group = num_heads / num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int begin, end;
  window_split_range(context_lens[seq], window, split, num_splits, chunk, &begin, &end);
  const int tiles = (end - begin + kTile - 1) / kTile;
  const int32_t* table = block_tables + (int64_t)(row_seq ? row_seq[seq] : seq) * max_blocks;
  TileCopier<T, D, kTile, false, true> copier(k_cache, v_cache, table, begin, end, block_size,
                                        num_kv_heads, kv_head);
  copier.fetch(0);           // block tables and lengths are inputs, not earlier kernels' outputs
  wait_for_previous_grid();  // the query and the cache are
  let_next_grid_launch();    // the merge may be scheduled now; it waits for this grid's end

  // The group's queries (the heads are adjacent), pre-scaled, as f32.
  const T* qg = q + ((int64_t)seq * num_heads + (int64_t)kv_head * group) * D;
  for (int i = tid; i < group * D; i += kThreads) sq[i] = to_float(qg[i]) * scale;
  copier.template start<S::kStages>(stages, tiles);

  float acc[kHeadsPerWarp][S::kPart], m[kHeadsPerWarp], l[kHeadsPerWarp], w[kHeadsPerWarp];
#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
    w[h] = 0.f;
#pragma unroll
    for (int i = 0; i < S::kPart; ++i) acc[h][i] = 0.f;
  }

  for (int t = 0; t < tiles; ++t) {
    const T* kt = copier.template next<S::kStages>(stages, t, tiles);
    const T* vt = kt + kTile * D;

    // Partial scores over this warp's quarter of the head dims.
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.f;
#pragma unroll
    for (int c = warp; c < S::kChunks; c += kWarps) {
      float kf[S::kVec];
      load_vec<T, S::kVec>(kt + lane * D + (c ^ (lane & 7)) * S::kVec, kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (g >= group) break;
#pragma unroll
        for (int j = 0; j < S::kVec; ++j) s[g] += sq[g * D + c * S::kVec + j] * kf[j];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g >= group) break;
      sp[(warp * G + g) * kTile + lane] = s[g];
    }
    __syncthreads();

    const int rows = min(kTile, end - (begin + t * kTile));
    const bool valid = lane < rows;
#pragma unroll
    for (int h = 0; h < kHeadsPerWarp; ++h) {
      const int g = warp + h * kWarps;
      if (g >= group) break;
      float x = 0.f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) x += sp[(v * G + g) * kTile + lane];
      x = valid ? x : -INFINITY;
      float mx = x;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
      const float m_new = fmaxf(m[h], mx);
      w[h] = valid ? __expf(x - m_new) : 0.f;
      float sum = w[h];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
      const float correction = __expf(m[h] - m_new);
      l[h] = l[h] * correction + sum;
#pragma unroll
      for (int i = 0; i < S::kPart; ++i) acc[h][i] *= correction;
      m[h] = m_new;
    }
    if (warp < group) {
#pragma unroll 8
      for (int r = 0; r < rows; ++r) {
        float vf[S::kPart];
        load_vec<T, S::kPart>(vt + r * D + lane * S::kPart, vf);
#pragma unroll
        for (int h = 0; h < kHeadsPerWarp; ++h) {
          if (warp + h * kWarps >= group) break;
          const float wr = __shfl_sync(0xffffffff, w[h], r);
#pragma unroll
          for (int i = 0; i < S::kPart; ++i) acc[h][i] += wr * vf[i];
        }
      }
    }
  }

#pragma unroll
  for (int h = 0; h < kHeadsPerWarp; ++h) {
    const int g = warp + h * kWarps;
    if (g >= group) break;
    const int head = kv_head * group + g;
    if (num_splits == 1) {
      const float total = with_sink(l[h], m[h], sinks, head);
      const float inv = total > 0.f ? 1.f / total : 0.f;
      T* op = out + ((int64_t)seq * num_heads + head) * D + lane * S::kPart;
#pragma unroll
      for (int i = 0; i < S::kPart; ++i) op[i] = from_float<T>(acc[h][i] * inv);
    } else {
      const int64_t part = ((int64_t)seq * num_heads + head) * num_splits + split;
      if (lane == 0) {
        part_ml[part * 2] = m[h];
        part_ml[part * 2 + 1] = l[h];
      }
#pragma unroll
      for (int i = 0; i < S::kPart; ++i) part_acc[part * D + lane * S::kPart + i] = acc[h][i];
    }
  }
}

constexpr int kMergeThreads = 512;

// The block's max (kMax) or sum of one value per thread; every thread gets the result.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffff, x, o);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = x;
  __syncthreads();
  x = kMax ? -INFINITY : 0.f;
  for (int w = 0; w < warps; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();
  return x;
}

// One block per (row, head): merges the splits' partials by log-sum-exp. The splits' weights
// are computed once into shared memory; then thread (dim d, lane j) sums every kLanes-th split's
// partial of dim d, so many splits' loads are in flight at once, and the lanes meet in shared
// memory.
// kThreadsM: D for a few splits, kMergeThreads for many.
template <typename T, int D, int kThreadsM>
__global__ void __launch_bounds__(kThreadsM)
    merge_splits_kernel(T* __restrict__ out, const float* __restrict__ part_ml,
                        const float* __restrict__ part_acc, int num_splits,
                        const float* __restrict__ sinks) {
  constexpr int kLanes = kThreadsM / D;
  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[kThreadsM / 32];
  __shared__ float sums[kLanes][D];
  const int64_t row = (int64_t)blockIdx.x * gridDim.y + blockIdx.y;
  const float* ml = part_ml + row * num_splits * 2;
  const int tid = threadIdx.x, d = tid % D, j = tid / D;
  const float* acc = part_acc + row * num_splits * D + d;
  wait_for_previous_grid();   // the split kernel's partials
  let_next_grid_launch();
  // This thread's first kHeld partials of dim d, loaded together with the (max, sum) pairs so
  // the merge waits on one round trip to memory instead of two.
  constexpr int kHeld = 16;
  float held[kHeld];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int s = j + k * kLanes;
    held[k] = s < num_splits ? acc[(int64_t)s * D] : 0.f;
  }
  float m = -INFINITY;
  for (int s = tid; s < num_splits; s += kThreadsM)
    if (ml[2 * s + 1] > 0.f) m = fmaxf(m, ml[2 * s]);
  const float M = block_reduce<true>(m, scratch);
  float l = 0.f;
  for (int s = tid; s < num_splits; s += kThreadsM) {
    const float w = ml[2 * s + 1] > 0.f ? __expf(ml[2 * s] - M) : 0.f;
    weight[s] = w;
    l += ml[2 * s + 1] * w;
  }
  // (Its barrier also publishes `weight`.) The row's head is blockIdx.y.
  const float L = with_sink(block_reduce<false>(l, scratch), M, sinks, blockIdx.y);
  float o = 0.f;
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    const int s = j + k * kLanes;
    if (s < num_splits) o += held[k] * weight[s];
  }
  for (int s = j + kHeld * kLanes; s < num_splits; s += kLanes) o += acc[(int64_t)s * D] * weight[s];
  sums[j][d] = o;
  __syncthreads();
  if (j == 0) {
#pragma unroll
    for (int k = 1; k < kLanes; ++k) o += sums[k][d];
    out[row * D + d] = from_float<T>(L > 0.f ? o / L : 0.f);
  }
}

// The merge kernel over a split launch's partials: D threads a block for a few splits, more
// for many.
template <typename T, int D>
cudaError_t launch_merge(const DecodeArgs* a) {
  const dim3 rows(a->num_seqs, a->num_heads);
  if (a->num_splits > 8)
    return launch_early(merge_splits_kernel<T, D, kMergeThreads>, rows, kMergeThreads, 0,
                        a->stream, a->out, a->part_ml, a->part_acc, a->num_splits, a->sinks);
  if (a->num_splits > 1)
    return launch_early(merge_splits_kernel<T, D, D>, rows, D, 0, a->stream, a->out,
                        a->part_ml, a->part_acc, a->num_splits, a->sinks);
  return cudaSuccess;
}

// Opts `kernel` in to its dynamic shared memory (above 48 KB a kernel must) and the largest
// shared-memory carveout, once per device.
template <typename K>
cudaError_t configure(K kernel, int smem, bool (&configured)[64]) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64) return cudaErrorInvalidDevice;
  if (configured[dev]) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess) configured[dev] = true;
  return err;
}

// Clusters of `splits` blocks of `kernel` that fit on the current device at once (0 when unknown):
// a cluster's blocks must share a GPC, so fewer blocks run at once than in plain launches.
template <typename K>
int cluster_capacity(K kernel, int smem, int splits) {
  static int known[64][kMaxClusterSplits + 1] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int& n = known[dev][splits];
  if (n == 0) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = splits;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, splits);
    cfg.blockDim = kThreads;
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = -1;
    }
  }
  return n;
}

// Whether a split launch of `a` runs in clusters of its splits, merging them in distributed
// shared memory instead of a merge kernel: the kernel `can_cluster` (the tensor-core one), 2 to
// kMaxClusterSplits splits, sm_90 and up, every cluster resident at once (past that, a second
// wave costs more than the merge kernel).
template <typename K>
bool clustered(K kernel, int smem, const DecodeArgs* a, bool can_cluster) {
  if (!can_cluster || a->num_splits < 2 || a->num_splits > kMaxClusterSplits ||
      device_major() < 9)
    return false;
  return a->num_seqs * a->num_kv_heads <= cluster_capacity(kernel, smem, a->num_splits);
}

// One decode kernel over `a`'s rows, KV heads and splits, then the merge of the splits (in the
// kernel when its splits form clusters). Both are launched early (see launch_early): the
// kernel's set-up overlaps the previous kernel's end, and the merge is scheduled while the
// splits run.
template <typename T, int D, typename K>
cudaError_t launch_split(K kernel, int smem, const DecodeArgs* a, bool can_cluster) {
  const dim3 grid(a->num_seqs, a->num_kv_heads, a->num_splits);
  const bool in_clusters = clustered(kernel, smem, a, can_cluster);
  cudaError_t err = launch_early_clustered(
      kernel, grid, kThreads, smem, a->stream, in_clusters ? a->num_splits : 1, a->out,
      a->part_ml, a->part_acc, a->q, a->k_cache, a->v_cache, a->block_tables, a->row_seq,
      a->context_lens, a->max_blocks, a->num_heads, a->num_kv_heads, a->block_size, a->chunk,
      a->fresh_tail, a->window, a->scale, a->sinks, a->fresh,
      a->kv_fp8 != nullptr ? *a->kv_fp8 : KvScales{1.f, 1.f});
  if (err == cudaSuccess && !in_clusters) err = launch_merge<T, D>(a);
  return err;
}

// The kernel for (T, cache element C, D, group bound G) over `a`, then the merge when the
// context is split: tensor cores for bf16 and f16 (with caches of T or e4m3), the CUDA-core
// kernel for f32. With `a` null, writes how many of its blocks fit on one SM instead.
template <typename T, typename C, int D, int G>
int decode_g(const DecodeArgs* a, int* blocks) {
  if (a != nullptr && a->num_splits > kMaxSplits) return 1;
  if constexpr (kIsFp8Cache<C>) {
    // The step's new tokens from the projection: 16-bit caches only.
    if (a != nullptr && a->fresh.qkv != nullptr) return 1;
  }
  if constexpr (!std::is_same<T, float>::value) {
    static bool configured[64] = {};
    constexpr int smem = MmaShape<T, C, D>::kSmemBytes;
    const auto kernel = paged_decode_mma_kernel<T, C, D>;
    if (const cudaError_t err = configure(kernel, smem, configured)) return (int)err;
    if (a == nullptr)
      return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, smem);
    return (int)launch_split<T, D>(kernel, smem, a, true);
  }
  if (a != nullptr && a->fresh.qkv != nullptr) return 1;  // (the tensor-core kernel's only)
  if constexpr (kIsFp8Cache<C>) return 1;              // (so are FP8 caches)
  static bool configured[64] = {};
  constexpr int smem = decode_smem_bytes<T, D, G>();
  if (const cudaError_t err = configure(paged_decode_kernel<T, D, G>, smem, configured))
    return (int)err;
  if (a == nullptr)
    return (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        blocks, paged_decode_kernel<T, D, G>, kThreads, smem);
  return (int)launch_split<T, D>(paged_decode_kernel<T, D, G>, smem, a, false);
}

template <typename T, typename C>
int decode(int head_dim, int group, const DecodeArgs* a, int* blocks) {
  if (group < 1 || group > kMaxGroup) return 1;
#define PAGEWISE_BY_GROUP(D)                                 \
  (group == 1   ? decode_g<T, C, D, 1>(a, blocks)            \
   : group == 2 ? decode_g<T, C, D, 2>(a, blocks)            \
   : group <= 4 ? decode_g<T, C, D, 4>(a, blocks)            \
                : decode_g<T, C, D, 8>(a, blocks))
  switch (head_dim) {
    case 64: return PAGEWISE_BY_GROUP(64);
    case 128: return PAGEWISE_BY_GROUP(128);
    case 256: return PAGEWISE_BY_GROUP(256);
    default: return 1;
  }
#undef PAGEWISE_BY_GROUP
}

// fp8: the caches hold e4m3 bytes (f16 and bf16 queries only).
int decode_any(int dtype, bool fp8, int head_dim, int group, const DecodeArgs* a, int* blocks) {
  switch (dtype) {
    case 0: return fp8 ? 1 : decode<float, float>(head_dim, group, a, blocks);
    case 1:
      return fp8 ? decode<__half, uint8_t>(head_dim, group, a, blocks)
                 : decode<__half, __half>(head_dim, group, a, blocks);
    case 2:
      return fp8 ? decode<__nv_bfloat16, uint8_t>(head_dim, group, a, blocks)
                 : decode<__nv_bfloat16, __nv_bfloat16>(head_dim, group, a, blocks);
    default: return 1;
  }
}

}  // namespace

// dtype: 0 = f32, 1 = f16, 2 = bf16. Returns 0 on success, a CUDA error code otherwise (1 for an
// unsupported dtype, head dim or group size).
// part_ml ([seqs, heads, splits, 2]) and part_acc ([seqs, heads, splits, head_dim]), f32, are
// workspace used only when num_splits > 1; split s covers positions [s * c, (s + 1) * c) with
// c = max(chunk, ceil(context / num_splits)). row_seq ([num_seqs] rows) maps each query row to
// its block table row; null means row i uses table i. On sm_90 the kernel is launched early and
// reads block_tables, row_seq and context_lens before it waits for the kernel before it: they
// must be uploaded inputs, not that kernel's output (q may be). The caches may be that kernel's
// output only in the last fresh_tail positions of each row's context (1 when it writes a
// decode step's new tokens); -1 means anywhere, and no K/V is read before it ends. window > 0:
// each row attends over the last `window` positions of its context only (sliding-window layers).
// sinks: null, or f32 [num_heads], each head's attention sink (a logit in the softmax that attends
// to nothing; gpt-oss). fresh: null, or (bf16 and f16 only) the step's new tokens straight from
// the qkv projection (FreshQkv, decode_common.cuh): q is then not read, each row must be its
// sequence's newest token, and the kernel writes their K and V into the caches itself (so the
// kernel before must not write the caches at all; fresh_tail is not used). kv_fp8: null, the
// caches hold dtype; or (f16 and bf16, without fresh) they hold e4m3 bytes with these scales.
extern "C" int pagewise_paged_decode(int dtype, void* out, float* part_ml, float* part_acc,
                                     const void* q, const void* k_cache, const void* v_cache,
                                     const KvScales* kv_fp8, const int32_t* block_tables, const int32_t* row_seq,
                                     const int32_t* context_lens, int num_seqs, int max_blocks,
                                     int num_heads, int num_kv_heads, int head_dim,
                                     int block_size, int num_splits, int chunk, int fresh_tail,
                                     int window, float scale, const float* sinks,
                                     const FreshQkv* fresh, cudaStream_t stream) {
  const DecodeArgs a{out,          part_ml,  part_acc,     q,          k_cache,    v_cache,
                     kv_fp8,
                     block_tables, row_seq,  context_lens, num_seqs,   max_blocks, num_heads,
                     num_kv_heads, head_dim, block_size,   num_splits, chunk,      fresh_tail,
                     window,       scale,    sinks,        fresh != nullptr ? *fresh : FreshQkv{},
                     stream};
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return 1;
  return decode_any(dtype, kv_fp8 != nullptr, head_dim, num_heads / num_kv_heads, &a, nullptr);
}

// How many decode blocks (dtype as above, head dim, query heads per KV head) fit on one
// multiprocessor of the current device at once, and how many multiprocessors it has: what a split
// plan needs to fill the GPU.
extern "C" int pagewise_decode_occupancy(int dtype, int head_dim, int group, int* blocks_per_sm,
                                         int* sms) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return (int)err;
  return decode_any(dtype, false, head_dim, group, nullptr, blocks_per_sm);
}
