// Sampling on the GPU: picks a token per row of logits (f32, f16 or bf16: the model's output as
// it is; every comparison is made in f32, so a row picks the same token from its f32 cast), so
// only the ids travel back.
// temperature <= 0: the argmax (lowest index on ties, like the CPU sampler). Otherwise a draw from
// softmax(logits / temperature) restricted to tokens whose probability is at least min_p times the
// most likely one's, by the Gumbel-max trick: argmax(x / t + g) with g = -log(-log(u)), u uniform
// from a counter-based hash of (the row's seed, token index), so a row's draw depends on its own
// seed only, never on the batch around it.
// A row is cut into chunks of kChunk tokens, one block each (a 128k vocabulary on one
// multiprocessor took ~110 us); each chunk keeps its best logit and best draw, and a last kernel
// picks each row's winner among its chunks. Rows with a min_p floor need the row's maximum
// first, so their draws are made in a second pass over the chunks.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "dtype.cuh"

namespace {

constexpr int kChunk = 2048;        // tokens per block of the chunk passes
constexpr int kChunkThreads = 256;
constexpr int kFinalThreads = 128;
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
    chunk_pass(Part* __restrict__ parts, const T* __restrict__ logits, int vocab,
               const float* __restrict__ temperatures, const float* __restrict__ min_ps,
               const uint64_t* __restrict__ seeds) {
  const int row = blockIdx.x, chunk = blockIdx.y;
  const T* x = logits + (int64_t)row * vocab;
  const int begin = chunk * kChunk, end = min(vocab, begin + kChunk);
  float best = -INFINITY;
  int best_i = kNone;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) keep_best(best, best_i, to_float(x[i]), i);
  const float t = temperatures[row];
  float v = -INFINITY;
  int vi = kNone;
  if (t > 0.f && !(min_ps[row] > 0.f))
    draw_range(x, begin, end, -INFINITY, 1.f / t, seeds[row], v, vi);
  block_best(best, best_i);
  block_best(v, vi);
  if (threadIdx.x == 0) parts[(int64_t)row * gridDim.y + chunk] = Part{best, best_i, v, vi};
}

// The best logit of row `row` over its `chunks` parts (every thread gets it).
__device__ __forceinline__ void row_best(const Part* p, int chunks, float& best, int& best_i) {
  best = -INFINITY;
  best_i = kNone;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) keep_best(best, best_i, p[c].max_v, p[c].max_i);
  block_best(best, best_i);
}

// Pass 2, grid (rows, chunks): for rows with a min_p floor, each chunk's best draw among the
// tokens at or above max + t * ln(min_p) (p_i >= min_p * p_max); other rows return at once.
template <typename T>
__global__ void __launch_bounds__(kChunkThreads)
    floor_pass(Part* __restrict__ parts, const T* __restrict__ logits, int vocab,
               const float* __restrict__ temperatures, const float* __restrict__ min_ps,
               const uint64_t* __restrict__ seeds) {
  const int row = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const float t = temperatures[row], min_p = min_ps[row];
  if (!(t > 0.f && min_p > 0.f)) return;
  Part* p = parts + (int64_t)row * chunks;
  float best;
  int best_i;
  row_best(p, chunks, best, best_i);
  if (best == -INFINITY) return;
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

// Last, one block per row: the argmax for greedy rows (and rows with nothing finite), else the
// best draw (the argmax when no token qualified).
__global__ void __launch_bounds__(kFinalThreads)
    pick(uint32_t* __restrict__ out, const Part* __restrict__ parts, int chunks,
         const float* __restrict__ temperatures) {
  const int row = blockIdx.x;
  const Part* p = parts + (int64_t)row * chunks;
  float best;
  int best_i;
  row_best(p, chunks, best, best_i);
  if (temperatures[row] <= 0.f || best == -INFINITY) {
    if (threadIdx.x == 0) out[row] = best_i == kNone ? 0 : best_i;
    return;
  }
  float v = -INFINITY;
  int vi = kNone;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) keep_best(v, vi, p[c].draw_v, p[c].draw_i);
  block_best(v, vi);
  if (threadIdx.x == 0) out[row] = vi == kNone ? best_i : vi;
}

template <typename T>
void launch_sample(uint32_t* out, Part* p, const T* logits, int rows, int vocab, int chunks,
                   const float* temperatures, const float* min_ps, const uint64_t* seeds,
                   cudaStream_t stream) {
  const dim3 grid(rows, chunks);
  chunk_pass<T><<<grid, kChunkThreads, 0, stream>>>(p, logits, vocab, temperatures, min_ps, seeds);
  floor_pass<T><<<grid, kChunkThreads, 0, stream>>>(p, logits, vocab, temperatures, min_ps, seeds);
  pick<<<rows, kFinalThreads, 0, stream>>>(out, p, chunks, temperatures);
}

}  // namespace

// Chunks a row of `vocab` tokens is cut into: the `parts` workspace holds rows x chunks x 16 bytes.
extern "C" int pagewise_sample_chunks(int vocab) { return (vocab + kChunk - 1) / kChunk; }

// Returns 0 on success or a CUDA error code. `dtype`: 0 f32, 1 f16, 2 bf16 logits. `parts`:
// rows x pagewise_sample_chunks(vocab) x 16 bytes of scratch.
extern "C" int pagewise_sample(int dtype, uint32_t* out, void* parts, const void* logits, int rows,
                               int vocab, const float* temperatures, const float* min_ps,
                               const uint64_t* seeds, cudaStream_t stream) {
  if (rows == 0 || vocab <= 0) return 0;
  const int chunks = pagewise_sample_chunks(vocab);
  Part* p = static_cast<Part*>(parts);
  switch (dtype) {
    case 0:
      launch_sample(out, p, static_cast<const float*>(logits), rows, vocab, chunks, temperatures,
                    min_ps, seeds, stream);
      break;
    case 1:
      launch_sample(out, p, static_cast<const __half*>(logits), rows, vocab, chunks, temperatures,
                    min_ps, seeds, stream);
      break;
    case 2:
      launch_sample(out, p, static_cast<const __nv_bfloat16*>(logits), rows, vocab, chunks,
                    temperatures, min_ps, seeds, stream);
      break;
    default:
      return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
