// Sampling on the GPU: picks a token per row of logits (f32, f16 or bf16: the model's output as
// it is; every comparison is made in f32, so a row picks the same token from its f32 cast), so
// only the ids travel back.
// temperature <= 0: the argmax (lowest index on ties, like the CPU sampler). Otherwise a draw from
// softmax(logits / temperature) restricted to tokens whose probability is at least min_p times the
// most likely one's, by the Gumbel-max trick: argmax(x / t + g) with g = -log(-log(u)), u uniform
// from a counter-based hash of (the row's seed, token index), so a row's draw depends on its own
// seed only, never on the batch around it.
// A row is cut into chunks of kChunk tokens, one block each (a 128k vocabulary on one
// multiprocessor took ~110 us); each chunk keeps its best logit and best draw, and a second
// kernel picks each row's winner among its chunks. Rows with a min_p floor need the row's maximum
// first, so their draws are made in that second pass, whose last block per row picks.
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

// The draws of row `row`'s tokens [begin, end) whose logit is at least `floor`, into (v, vi).
template <typename T>
__device__ __forceinline__ void draw_range(const T* x, int begin, int end, float floor,
                                           float inv_t, uint64_t seed, float& v, int& vi) {
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float xi = to_float(x[i]);
    if (!(xi >= floor) || xi == -INFINITY) continue;
    keep_best(v, vi, xi * inv_t - logf(-logf(uniform(seed, i))), i);
  }
}

// Pass 1, grid (rows, chunks): each chunk's best logit, and its best draw for rows that sample
// without a min_p floor.
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    chunk_pass(Part* __restrict__ parts, unsigned int* __restrict__ tickets,
               const T* __restrict__ logits, T* __restrict__ logits_copy, int vocab,
               const float* __restrict__ temperatures, const float* __restrict__ min_ps,
               const uint64_t* __restrict__ seeds) {
  const int row = blockIdx.x, chunk = blockIdx.y;
  const T* x = logits + (int64_t)row * vocab;
  const int begin = chunk * kChunk, end = min(vocab, begin + kChunk);
  float best = -INFINITY;
  int best_i = kNone;
  T* copy = logits_copy != nullptr ? logits_copy + (int64_t)row * vocab : nullptr;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const T xi = x[i];
    if (copy != nullptr) copy[i] = xi;
    keep_best(best, best_i, to_float(xi), i);
  }
  const float t = temperatures[row];
  float v = -INFINITY;
  int vi = kNone;
  if (t > 0.f && !(min_ps[row] > 0.f))
    draw_range(x, begin, end, -INFINITY, 1.f / t, seeds[row], v, vi);
  block_best(best, best_i);
  block_best(v, vi);
  if (threadIdx.x == 0) {
    parts[(int64_t)row * gridDim.y + chunk] = Part{best, best_i, v, vi};
    if (chunk == 0) tickets[row] = 0;  // for pass 2's count of finished blocks
  }
}

// The best logit of row `row` over its `chunks` parts (every thread gets it).
__device__ __forceinline__ void row_best(const Part* p, int chunks, float& best, int& best_i) {
  best = -INFINITY;
  best_i = kNone;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) keep_best(best, best_i, p[c].max_v, p[c].max_i);
  block_best(best, best_i);
}

// The row's token from its chunks' parts: the argmax for greedy rows (and rows with nothing
// finite), else the best draw (the argmax when no token qualified), into out[row] and, when not
// null, host_out[row] (mapped host memory). The parts are read past L1 (other blocks of this
// kernel may have written their draws).
__device__ void pick_row(uint32_t* out, uint32_t* host_out, int row, const Part* p, int chunks,
                         float t) {
  float best = -INFINITY, v = -INFINITY;
  int best_i = kNone, vi = kNone;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    keep_best(best, best_i, __ldcg(&p[c].max_v), __ldcg(&p[c].max_i));
    keep_best(v, vi, __ldcg(&p[c].draw_v), __ldcg(&p[c].draw_i));
  }
  block_best(best, best_i);
  block_best(v, vi);
  if (threadIdx.x != 0) return;
  uint32_t id;
  if (t <= 0.f || best == -INFINITY)
    id = best_i == kNone ? 0 : best_i;
  else
    id = vi == kNone ? best_i : vi;
  out[row] = id;
  if (host_out != nullptr) host_out[row] = id;
}

// Pass 2, grid (rows, chunks), after pass 1. A row without a min_p floor is picked by its chunk
// 0 block at once (its parts are complete). A row with one: each chunk's best draw among the
// tokens at or above max + t * ln(min_p) (p_i >= min_p * p_max), then the row's last block to
// finish (a ticket counter pass 1 zeroed) picks.
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    floor_pick(uint32_t* __restrict__ out, uint32_t* __restrict__ host_out, Part* parts,
               unsigned int* __restrict__ tickets, const T* __restrict__ logits, int vocab,
               const float* __restrict__ temperatures, const float* __restrict__ min_ps,
               const uint64_t* __restrict__ seeds) {
  const int row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const float t = temperatures[row], min_p = min_ps[row];
  Part* p = parts + (int64_t)row * chunks;
  if (!(t > 0.f && min_p > 0.f)) {
    if (chunk == 0) pick_row(out, host_out, row, p, chunks, t);
    return;
  }
  float best;
  int best_i;
  row_best(p, chunks, best, best_i);
  if (best != -INFINITY) {
    const int begin = chunk * kChunk, end = min(vocab, begin + kChunk);
    float v = -INFINITY;
    int vi = kNone;
    draw_range(logits + (int64_t)row * vocab, begin, end, best + t * logf(min_p), 1.f / t,
               seeds[row], v, vi);
    block_best(v, vi);
    if (threadIdx.x == 0) {
      p[chunk].draw_v = v;
      p[chunk].draw_i = vi;
    }
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();  // this block's draw before its ticket
    last = atomicAdd(&tickets[row], 1u) == (unsigned int)chunks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  pick_row(out, host_out, row, p, chunks, t);
}

template <typename T>
void launch_sample(uint32_t* out, uint32_t* host_out, Part* p, unsigned int* tickets,
                   const void* logits_v, void* logits_copy, int rows, int vocab, int chunks,
                   const float* temperatures, const float* min_ps, const uint64_t* seeds,
                   cudaStream_t stream) {
  const dim3 grid(rows, chunks);
  const T* logits = static_cast<const T*>(logits_v);
  chunk_pass<T><<<grid, kChunkThreads, 0, stream>>>(p, tickets, logits, static_cast<T*>(logits_copy),
                                                    vocab, temperatures, min_ps, seeds);
  floor_pick<T><<<grid, kChunkThreads, 0, stream>>>(out, host_out, p, tickets, logits, vocab,
                                                    temperatures, min_ps, seeds);
}

}  // namespace

// Chunks a row of `vocab` tokens is cut into: the `parts` workspace holds rows x chunks x 16 bytes.
extern "C" int pagewise_sample_chunks(int vocab) { return (vocab + kChunk - 1) / kChunk; }

// Returns 0 on success or a CUDA error code. `dtype`: 0 f32, 1 f16, 2 bf16 logits. `parts`:
// rows x (pagewise_sample_chunks(vocab) x 16 + 4) bytes of scratch. `host_out`: null, or the
// device address of mapped host memory that also receives the ids. `logits_copy`: null, or
// rows x vocab elements of the logits' dtype that receive a copy of them as they are read.
extern "C" int pagewise_sample(int dtype, uint32_t* out, uint32_t* host_out, void* parts,
                               const void* logits, void* logits_copy, int rows, int vocab,
                               const float* temperatures, const float* min_ps,
                               const uint64_t* seeds, cudaStream_t stream) {
  if (rows == 0 || vocab <= 0) return 0;
  const int chunks = pagewise_sample_chunks(vocab);
  Part* p = static_cast<Part*>(parts);
  unsigned int* tickets = reinterpret_cast<unsigned int*>(p + (int64_t)rows * chunks);
  switch (dtype) {
    case 0:
      launch_sample<float>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, stream);
      break;
    case 1:
      launch_sample<__half>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, stream);
      break;
    case 2:
      launch_sample<__nv_bfloat16>(out, host_out, p, tickets, logits, logits_copy, rows, vocab, chunks,
                    temperatures, min_ps, seeds, stream);
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
