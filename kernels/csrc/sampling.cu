// Sampling on the GPU: one block per row of f32 logits picks a token, so only the ids travel back.
// temperature <= 0: the argmax (lowest index on ties, like the CPU sampler). Otherwise a draw from
// softmax(logits / temperature) restricted to tokens whose probability is at least min_p times the
// most likely one's, by the Gumbel-max trick: argmax(x / t + g) with g = -log(-log(u)), u uniform
// from a counter-based hash of (the row's seed, token index), so a row's draw depends on its own
// seed only, never on the batch around it.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 1024;

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
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
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

__global__ void sample_kernel(uint32_t* __restrict__ out, const float* __restrict__ logits, int vocab,
                              const float* __restrict__ temperatures,
                              const float* __restrict__ min_ps, const uint64_t* __restrict__ seeds) {
  const int row = blockIdx.x;
  const float* x = logits + (int64_t)row * vocab;
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) keep_best(best, best_i, x[i], i);
  block_best(best, best_i);
  const float t = temperatures[row];
  if (t <= 0.f || best == -INFINITY) {
    if (threadIdx.x == 0) out[row] = best_i == 0x7fffffff ? 0 : best_i;
    return;
  }
  // p_i >= min_p * p_max  <=>  x_i >= max + t * ln(min_p).
  const float min_p = min_ps[row];
  const float floor = min_p > 0.f ? best + t * logf(min_p) : -INFINITY;
  const float inv_t = 1.f / t;
  const uint64_t seed = seeds[row];
  float v = -INFINITY;
  int vi = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float xi = x[i];
    if (!(xi >= floor) || xi == -INFINITY) continue;
    keep_best(v, vi, xi * inv_t - logf(-logf(uniform(seed, i))), i);
  }
  block_best(v, vi);
  if (threadIdx.x == 0) out[row] = vi == 0x7fffffff ? best_i : vi;
}

}  // namespace

// Returns 0 on success or a CUDA error code.
extern "C" int pagewise_sample(uint32_t* out, const float* logits, int rows, int vocab,
                               const float* temperatures, const float* min_ps,
                               const uint64_t* seeds, cudaStream_t stream) {
  if (rows == 0) return 0;
  sample_kernel<<<rows, kThreads, 0, stream>>>(out, logits, vocab, temperatures, min_ps, seeds);
  return (int)cudaGetLastError();
}
