// Sampling on the GPU: picks a token per row of logits (f32, f16 or bf16: the model's output as
// it is; every comparison is made in f32, so a row picks the same token from its f32 cast), so
// only the ids travel back.
// temperature <= 0: the argmax (lowest index on ties, like the CPU sampler). Otherwise a draw from
// softmax(logits / temperature) restricted to tokens whose probability is at least min_p times the
// most likely one's, by the Gumbel-max trick: argmax(x / t + g) with g = -log(-log(u)), u uniform
// from a counter-based hash of (the row's seed, token index), so a row's draw depends on its own
// seed only, never on the batch around it.
// A row is cut into chunks of kChunk tokens, one block each (a 128k vocabulary on one
// multiprocessor took ~110 us); each chunk keeps its best logit and best draw, and the row's last
// block to finish picks the winner among its chunks. Rows with a min_p floor need the row's
// maximum first, so that last block makes their draws itself, over the whole row.
// An optional bitmask (constrained decoding: 32 tokens a word, bit i % 32 of word i / 32, one row
// of words per row of logits) makes the tokens it leaves out -inf before anything else; a row
// whose mask allows nothing picks token 0 (the caller knows the row failed).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "dtype.cuh"

namespace {

constexpr int kChunk = 2048;        // tokens per block of the chunk passes
constexpr int kChunkThreads = 256;
constexpr int kNone = 0x7fffffff;   // no index yet

// A chunk's best logit and best draw (index kNone: none).
struct Part {
  float max_v;
  int max_i;
  float draw_v;
  int draw_i;
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1), never 0 or 1.
__device__ __forceinline__ float uniform(uint64_t seed, int i) {
  const uint64_t h = splitmix64(seed ^ splitmix64((uint64_t)i));
  return ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Better of two (value, index) candidates: larger value, then smaller index.
__device__ __forceinline__ void keep_best(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// Block-wide best (value, index); every thread gets the result.
__device__ void block_best(float& v, int& i) {
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = 16; o > 0; o >>= 1) {
    keep_best(v, i, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, i, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  v = lane < blockDim.x / 32 ? sv[lane] : -INFINITY;
  i = lane < blockDim.x / 32 ? si[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1) {
    keep_best(v, i, __shfl_xor_sync(0xffffffff, v, o), __shfl_xor_sync(0xffffffff, i, o));
  }
  __syncthreads();
}

// Token i's logit as f32, -inf when the row's mask (if any) leaves it out.
template <typename T>
__device__ __forceinline__ float logit_at(const T* x, const uint32_t* mask, int i) {
  if (mask != nullptr && ((mask[i >> 5] >> (i & 31)) & 1u) == 0) return -INFINITY;
  return to_float(x[i]);
}

// The draws of row `row`'s tokens [begin, end) whose logit is at least `floor`, into (v, vi).
template <typename T>
__device__ __forceinline__ void draw_range(const T* x, const uint32_t* mask, int begin, int end,
                                           float floor, float inv_t, uint64_t seed, float& v,
                                           int& vi) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float xi = logit_at(x, mask, i);
    if (!(xi >= floor) || xi == -INFINITY) continue;
    keep_best(v, vi, xi * inv_t - logf(-logf(uniform(seed, i))), i);
  }
}

// The row's token from its chunks' parts: the argmax for greedy rows (and rows with nothing
// finite), else the best draw (the argmax when no token qualified). Every thread gets it. The
// parts are read past L1: other blocks wrote them.
__device__ int pick_from_parts(const Part* p, int chunks, float t) {
  float best = -INFINITY, v = -INFINITY;
  int best_i = kNone, vi = kNone;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    keep_best(best, best_i, __ldcg(&p[c].max_v), __ldcg(&p[c].max_i));
    keep_best(v, vi, __ldcg(&p[c].draw_v), __ldcg(&p[c].draw_i));
  }
  block_best(best, best_i);
  block_best(v, vi);
  if (t <= 0.f || best == -INFINITY) return best_i == kNone ? 0 : best_i;
  return vi == kNone ? best_i : vi;
}

// One launch, grid (rows, chunks). Each block finds its chunk's best logit and, for rows that
// sample without a min_p floor, its best draw (copying the logits when asked). The row's last
// block to finish (a ticket counter, left at zero for the next launch) picks the row's token: from
// the parts, or for a row with a min_p floor, by drawing over the whole row among the tokens at or
// above max + t * ln(min_p) (p_i >= min_p * p_max; few pass it, so one block does it).
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    sample_kernel(uint32_t* __restrict__ out, uint32_t* __restrict__ host_out, Part* parts,
                  unsigned int* __restrict__ tickets, const T* __restrict__ logits,
                  T* __restrict__ logits_copy, int vocab, const float* __restrict__ temperatures,
                  const float* __restrict__ min_ps, const uint64_t* __restrict__ seeds,
                  const uint32_t* __restrict__ masks, int mask_words) {
  const int row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const T* x = logits + (int64_t)row * vocab;
  const uint32_t* mask = masks != nullptr ? masks + (int64_t)row * mask_words : nullptr;
  const int begin = chunk * kChunk, end = min(vocab, begin + kChunk);
  float best = -INFINITY;
  int best_i = kNone;
  T* copy = logits_copy != nullptr ? logits_copy + (int64_t)row * vocab : nullptr;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if (copy != nullptr) copy[i] = x[i];
    keep_best(best, best_i, logit_at(x, mask, i), i);
  }
  const float t = temperatures[row], min_p = min_ps[row];
  const bool floored = t > 0.f && min_p > 0.f;
  float v = -INFINITY;
  int vi = kNone;
  if (t > 0.f && !floored)
    draw_range(x, mask, begin, end, -INFINITY, 1.f / t, seeds[row], v, vi);
  block_best(best, best_i);
  block_best(v, vi);
  Part* p = parts + (int64_t)row * chunks;
  __shared__ bool last;
  if (threadIdx.x == 0) {
    p[chunk] = Part{best, best_i, v, vi};
    __threadfence();  // the part before the ticket
    last = atomicAdd(&tickets[row], 1u) == (unsigned int)chunks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  int id;
  if (floored) {
    float m = -INFINITY;
    int mi = kNone;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x)
      keep_best(m, mi, __ldcg(&p[c].max_v), __ldcg(&p[c].max_i));
    block_best(m, mi);
    float dv = -INFINITY;
    int di = kNone;
    if (m != -INFINITY)
      draw_range(x, mask, 0, vocab, m + t * logf(min_p), 1.f / t, seeds[row], dv, di);
    block_best(dv, di);
    id = m == -INFINITY ? 0 : (di == kNone ? mi : di);
  } else {
    id = pick_from_parts(p, chunks, t);
  }
  if (threadIdx.x == 0) {
    out[row] = id;
    if (host_out != nullptr) host_out[row] = id;
    tickets[row] = 0;
  }
}

template <typename T>
void launch_sample(uint32_t* out, uint32_t* host_out, Part* p, unsigned int* tickets,
                   const void* logits, void* logits_copy, int rows, int vocab, int chunks,
                   const float* temperatures, const float* min_ps, const uint64_t* seeds,
                   const uint32_t* masks, int mask_words, cudaStream_t stream) {
  sample_kernel<T><<<dim3(rows, chunks), kChunkThreads, 0, stream>>>(
      out, host_out, p, tickets, static_cast<const T*>(logits), static_cast<T*>(logits_copy),
      vocab, temperatures, min_ps, seeds, masks, mask_words);
}

}  // namespace

// Chunks a row of `vocab` tokens is cut into: the `parts` workspace holds rows x chunks x 16 bytes.
extern "C" int pagewise_sample_chunks(int vocab) { return (vocab + kChunk - 1) / kChunk; }

// Returns 0 on success or a CUDA error code. `dtype`: 0 f32, 1 f16, 2 bf16 logits. `parts`:
// rows x pagewise_sample_chunks(vocab) x 16 bytes of scratch. `tickets`: rows counters, zero
// before the first launch (every launch leaves them zero), at the same address whatever `rows`
// is when launches of different row counts share them. `host_out`: null, or the device address
// of mapped host memory that also receives the ids. `logits_copy`: null, or rows x vocab
// elements of the logits' dtype that receive a copy of them as they are read. `masks`: null, or
// rows x mask_words words (mask_words >= ceil(vocab / 32)) of allowed-token bits.
extern "C" int pagewise_sample(int dtype, uint32_t* out, uint32_t* host_out, void* parts,
                               unsigned int* tickets, const void* logits, void* logits_copy, int rows, int vocab,
                               const float* temperatures, const float* min_ps,
                               const uint64_t* seeds, const uint32_t* masks, int mask_words,
                               cudaStream_t stream) {
  if (rows == 0 || vocab <= 0) return 0;
  const int chunks = pagewise_sample_chunks(vocab);
  Part* p = static_cast<Part*>(parts);
  switch (dtype) {
    case 0:
      launch_sample<float>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, masks, mask_words, stream);
      break;
    case 1:
      launch_sample<__half>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, masks, mask_words, stream);
      break;
    case 2:
      launch_sample<__nv_bfloat16>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, masks, mask_words, stream);
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
