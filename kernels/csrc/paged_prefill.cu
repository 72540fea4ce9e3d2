// Varlen prefill attention over the paged KV cache on tensor cores (WMMA, bf16/f16 in, f32
// accumulate). Each sequence's query chunk (rows q_start .. q_start + q_len of q) attends causally
// within itself and fully over the sequence's cached prefix: query i sits at position
// ctx_len - q_len + i and reads keys 0 ..= its position through the block table. The chunk's own
// K/V must already be in the cache (reshape_and_cache runs first).
//
// One block per (64-query tile, query head, sequence); 4 warps, 16 query rows each. Per 64-key
// tile: K and V rows gathered from the cache into shared memory (16-byte loads), S = Q K^T on
// tensor cores, an online softmax per row (two lanes per row), O += P V on tensor cores with O
// kept in shared memory (rescaled by the softmax correction between tiles).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include "dtype.cuh"
#include "prefill_mma.cuh"

namespace {

using namespace nvcuda;

constexpr int kBM = 64, kBN = 64;  // (kWarps: 4, from decode_common.cuh)

template <int D> struct Smem {
  static constexpr int ld = D + 8;         // 16-bit tiles: Q, K, V
  static constexpr int lds = kBN + 4;      // f32 scores per warp
  static constexpr int ldp = kBN + 8;      // 16-bit probabilities per warp
  static constexpr int ldo = D + 4;        // f32 output accumulator per warp
  static constexpr size_t bytes16 = (size_t)(3 * kBM * ld + kWarps * 16 * ldp) * 2;
  static constexpr size_t bytes = bytes16 + (size_t)kWarps * 16 * (lds + ldo) * 4;
};

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    paged_prefill_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                         const T* __restrict__ v_cache, const int32_t* __restrict__ block_tables,
                         const int32_t* __restrict__ seq_table, const int32_t* __restrict__ q_start,
                         const int32_t* __restrict__ q_len, const int32_t* __restrict__ ctx_len,
                         int max_blocks, int num_heads, int num_kv_heads, int block_size,
                         float scale) {
  using S = Smem<D>;
  const int seq = blockIdx.z, head = blockIdx.y, tile0 = blockIdx.x * kBM;
  const int qlen = q_len[seq];
  if (tile0 >= qlen) return;
  const int ctx = ctx_len[seq], first_pos = ctx - qlen, qs = q_start[seq];
  const int kv_head = head / (num_heads / num_kv_heads);
  const int32_t* table = block_tables + (int64_t)seq_table[seq] * max_blocks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBM * S::ld;
  T* sV = sK + kBN * S::ld;
  T* sP = sV + kBN * S::ld + warp * 16 * S::ldp;
  float* sS = reinterpret_cast<float*>(smem + S::bytes16) + warp * 16 * S::lds;
  float* sO = reinterpret_cast<float*>(smem + S::bytes16) + kWarps * 16 * S::lds + warp * 16 * S::ldo;

  constexpr int kVec = 8;  // 16-bit elements per 16-byte load
  for (int idx = threadIdx.x; idx < kBM * D / kVec; idx += blockDim.x) {
    const int r = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tile0 + r < qlen)
      v = *reinterpret_cast<const uint4*>(q + ((int64_t)(qs + tile0 + r) * num_heads + head) * D + c);
    *reinterpret_cast<uint4*>(sQ + r * S::ld + c) = v;
  }
  for (int i = lane; i < 16 * S::ldo; i += 32) sO[i] = 0.f;

  // Two lanes per query row: lane 2r and 2r+1 share row r of this warp's 16, each half the columns.
  const int r = lane / 2, half = lane % 2;
  const int row = tile0 + warp * 16 + r;
  const int qpos = first_pos + row;
  float m = -INFINITY, l = 0.f;
  const int last_pos = first_pos + min(qlen, tile0 + kBM) - 1;

  for (int k0 = 0; k0 <= last_pos; k0 += kBN) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kBN * D / kVec; idx += blockDim.x) {
      const int kr = idx / (D / kVec), c = (idx % (D / kVec)) * kVec;
      const int p = k0 + kr;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (p <= last_pos) {
        const int64_t slot = (int64_t)table[p / block_size] * block_size + p % block_size;
        const int64_t off = (slot * num_kv_heads + kv_head) * D + c;
        kv = *reinterpret_cast<const uint4*>(k_cache + off);
        vv = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      *reinterpret_cast<uint4*>(sK + kr * S::ld + c) = kv;
      *reinterpret_cast<uint4*>(sV + kr * S::ld + c) = vv;
    }
    __syncthreads();

    // S = Q K^T for this warp's 16 rows.
#pragma unroll
    for (int n = 0; n < kBN / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
        wmma::load_matrix_sync(a, sQ + warp * 16 * S::ld + k * 16, S::ld);
        wmma::load_matrix_sync(b, sK + n * 16 * S::ld + k * 16, S::ld);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sS + n * 16, acc, S::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this tile's 64 keys (masked causally), P to shared memory.
    float mx = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < kBN / 2; ++j) {
      const int c = half * (kBN / 2) + j;
      const float s = k0 + c <= qpos ? sS[r * S::lds + c] * scale : -INFINITY;
      sS[r * S::lds + c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
    const float m_new = fmaxf(m, mx);
    float sum = 0.f;
#pragma unroll 8
    for (int j = 0; j < kBN / 2; ++j) {
      const int c = half * (kBN / 2) + j;
      const float s = sS[r * S::lds + c];
      const float p = m_new == -INFINITY ? 0.f : __expf(s - m_new);
      sum += p;
      sP[r * S::ldp + c] = from_float<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    const float corr = m == -INFINITY ? 0.f : __expf(m - m_new);
    l = l * corr + sum;
    m = m_new;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) sO[r * S::ldo + d] *= corr;
    __syncwarp();

    // O += P V.
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, sO + n * 16, S::ldo, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kBN / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
        wmma::load_matrix_sync(a, sP + k * 16, S::ldp);
        wmma::load_matrix_sync(b, sV + k * 16 * S::ld + n * 16, S::ld);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(sO + n * 16, acc, S::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (row < qlen) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    T* o = out + ((int64_t)(qs + row) * num_heads + head) * D;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) o[d] = from_float<T>(sO[r * S::ldo + d] * inv);
  }
}

template <typename T, int D>
int launch(int kernel, void* out, const void* q, const void* k_cache, const void* v_cache,
           const int32_t* block_tables, const int32_t* seq_table, const int32_t* q_start,
           const int32_t* q_len, const int32_t* ctx_len, int num_seqs, int max_q_len, int max_blocks,
           int num_heads, int num_kv_heads, int block_size, float scale, cudaStream_t stream) {
  if constexpr (D <= 128) {
    if (kernel == 1) {
      constexpr int smem = PrefillShape<T, D>::kSmemBytes;
      const auto k = paged_prefill_mma_kernel<T, D>;
      cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) return (int)e;
      const dim3 grid((max_q_len + kPrefillRows - 1) / kPrefillRows, num_heads, num_seqs);
      k<<<grid, kThreads, smem, stream>>>((T*)out, (const T*)q, (const T*)k_cache,
                                          (const T*)v_cache, block_tables, seq_table, q_start,
                                          q_len, ctx_len, max_blocks, num_heads, num_kv_heads,
                                          block_size, scale);
      return (int)cudaGetLastError();
    }
  }
  const size_t smem = Smem<D>::bytes;
  cudaError_t e = cudaFuncSetAttribute(paged_prefill_kernel<T, D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return (int)e;
  const dim3 grid((max_q_len + kBM - 1) / kBM, num_heads, num_seqs);
  paged_prefill_kernel<T, D><<<grid, kWarps * 32, smem, stream>>>(
      (T*)out, (const T*)q, (const T*)k_cache, (const T*)v_cache, block_tables, seq_table, q_start,
      q_len, ctx_len, max_blocks, num_heads, num_kv_heads, block_size, scale);
  return (int)cudaGetLastError();
}

template <typename T>
int dispatch(int kernel, int head_dim, void* out, const void* q, const void* k_cache, const void* v_cache,
             const int32_t* block_tables, const int32_t* seq_table, const int32_t* q_start,
             const int32_t* q_len, const int32_t* ctx_len, int num_seqs, int max_q_len,
             int max_blocks, int num_heads, int num_kv_heads, int block_size, float scale,
             cudaStream_t stream) {
#define PAGEWISE_PREFILL(DIM)                                                                   \
  return launch<T, DIM>(kernel, out, q, k_cache, v_cache, block_tables, seq_table, q_start, q_len,     \
                        ctx_len, num_seqs, max_q_len, max_blocks, num_heads, num_kv_heads,      \
                        block_size, scale, stream)
  switch (head_dim) {
    case 64: PAGEWISE_PREFILL(64);
    case 128: PAGEWISE_PREFILL(128);
    case 256: PAGEWISE_PREFILL(256);
    default: return 1;
  }
#undef PAGEWISE_PREFILL
}

}  // namespace

// dtype: 1 = f16, 2 = bf16 (tensor cores need 16-bit inputs). Per prefill sequence s: its query
// rows start at q_start[s], number q_len[s], and its block table is row seq_table[s] of
// block_tables; ctx_len[s] counts its tokens in the cache including this chunk. kernel: 0 the
// WMMA kernel above, 1 the FlashAttention-2 style one (prefill_mma.cuh) at head dims 64 and 128
// (the WMMA kernel at 256). Returns 0 or a CUDA error code (1 for an unsupported dtype or head
// dim).
extern "C" int pagewise_paged_prefill(int kernel, int dtype, void* out, const void* q, const void* k_cache,
                                      const void* v_cache, const int32_t* block_tables,
                                      const int32_t* seq_table, const int32_t* q_start,
                                      const int32_t* q_len, const int32_t* ctx_len, int num_seqs,
                                      int max_q_len, int max_blocks, int num_heads,
                                      int num_kv_heads, int head_dim, int block_size, float scale,
                                      cudaStream_t stream) {
  if (num_seqs == 0 || max_q_len == 0) return 0;
#define PAGEWISE_ARGS kernel, head_dim, out, q, k_cache, v_cache, block_tables, seq_table, q_start, q_len, \
                      ctx_len, num_seqs, max_q_len, max_blocks, num_heads, num_kv_heads,           \
                      block_size, scale, stream
  switch (dtype) {
    case 1: return dispatch<__half>(PAGEWISE_ARGS);
    case 2: return dispatch<__nv_bfloat16>(PAGEWISE_ARGS);
    default: return 1;
  }
#undef PAGEWISE_ARGS
}
