// pagewise: varlen prefill attention over the paged KV cache on tensor cores (bf16/f16 in, f32
// accumulate). Each sequence's query chunk (rows q_start .. q_start + q_len of q) attends causally
// within itself and fully over the sequence's cached prefix: query i sits at position
// ctx_len - q_len + i and reads keys 0 ..= its position through the block table. The chunk's own
// K/V must already be in the cache (reshape_and_cache runs first). The kernel is
// prefill_mma.cuh's, FlashAttention-2 style; it replaced a WMMA kernel that kept the output in
// shared memory (4.4x slower at head dim 128, 3.8x at 256: benches/RESULTS.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "prefill_mma.cuh"

namespace {

template <typename T, typename C, int D>
int launch(void* out, const void* q, const void* k_cache, const void* v_cache,
           const KvScales* kv_fp8, const int32_t* block_tables, const int32_t* seq_table,
           const int32_t* q_start, const int32_t* q_len, const int32_t* ctx_len, int num_seqs,
           int max_q_len, int max_blocks, int num_heads, int num_kv_heads, int block_size,
           float scale, cudaStream_t stream) {
  constexpr int smem = PrefillShape<T, C, D>::kSmemBytes;
  const auto k = paged_prefill_mma_kernel<T, C, D>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return (int)e;
  const dim3 grid((max_q_len + kPrefillRows - 1) / kPrefillRows, num_heads, num_seqs);
  k<<<grid, kThreads, smem, stream>>>((T*)out, (const T*)q, (const C*)k_cache, (const C*)v_cache,
                                      block_tables, seq_table, q_start, q_len, ctx_len,
                                      max_blocks, num_heads, num_kv_heads, block_size, scale,
                                      kv_fp8 != nullptr ? *kv_fp8 : KvScales{1.f, 1.f});
  return (int)cudaGetLastError();
}

template <typename T, typename C>
int dispatch(int head_dim, void* out, const void* q, const void* k_cache, const void* v_cache,
             const KvScales* kv_fp8, const int32_t* block_tables, const int32_t* seq_table, const int32_t* q_start,
             const int32_t* q_len, const int32_t* ctx_len, int num_seqs, int max_q_len,
             int max_blocks, int num_heads, int num_kv_heads, int block_size, float scale,
             cudaStream_t stream) {
#define PAGEWISE_PREFILL(DIM)                                                                   \
  return launch<T, C, DIM>(out, q, k_cache, v_cache, kv_fp8, block_tables, seq_table, q_start, \
                           q_len,                                                              \
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

// dtype: 1 = f16, 2 = bf16 (tensor cores need 16-bit inputs); kv_fp8: null, the caches hold
// dtype, or they hold e4m3 bytes with these scales (kv_fp8.cuh). Per prefill sequence s: its query
// rows start at q_start[s], number q_len[s], and its block table is row seq_table[s] of
// block_tables; ctx_len[s] counts its tokens in the cache including this chunk. Returns 0 or a
// CUDA error code (1 for an unsupported dtype or head dim).
extern "C" int pagewise_paged_prefill(int dtype, void* out, const void* q, const void* k_cache,
                                      const void* v_cache, const KvScales* kv_fp8,
                                      const int32_t* block_tables,
                                      const int32_t* seq_table, const int32_t* q_start,
                                      const int32_t* q_len, const int32_t* ctx_len, int num_seqs,
                                      int max_q_len, int max_blocks, int num_heads,
                                      int num_kv_heads, int head_dim, int block_size, float scale,
                                      cudaStream_t stream) {
  if (num_seqs == 0 || max_q_len == 0) return 0;
#define PAGEWISE_ARGS head_dim, out, q, k_cache, v_cache, kv_fp8, block_tables, seq_table, q_start, \
                      q_len,                                                                 \
                      ctx_len, num_seqs, max_q_len, max_blocks, num_heads, num_kv_heads,           \
                      block_size, scale, stream
  switch (dtype) {
    case 1:
      return kv_fp8 != nullptr ? dispatch<__half, uint8_t>(PAGEWISE_ARGS)
                               : dispatch<__half, __half>(PAGEWISE_ARGS);
    case 2:
      return kv_fp8 != nullptr ? dispatch<__nv_bfloat16, uint8_t>(PAGEWISE_ARGS)
                               : dispatch<__nv_bfloat16, __nv_bfloat16>(PAGEWISE_ARGS);
    default: return 1;
  }
#undef PAGEWISE_ARGS
}
