// pagewise: the integer-code twins of moe.cu's expert kernels, for experts kept as codes with an
// affine map per group, w = s * q + b (gemv_affine.cuh's layouts, stacked: AWQ and GPTQ experts
// with b = -s * z, and the GGUF types repacked at load): 4-bit codes in Int4Weight's word order
// or a byte a code, with an f16 (s, b) pair per row and group. The same work as the dense kernels,
// token by token (blockIdx.y), inside CUDA graphs and launched early (pdl.cuh).
//
// A lane loads whole runs of a row (16 bytes of codes: 32 4-bit codes or 16 bytes, inside one
// group), kAffineBatch of them before it uses the first. The staged input is laid out
// piece-major (all runs' first 8 values, then their second, ...), so the lanes of consecutive
// runs read consecutive 16-byte pieces, which share no bank; each run's sum of inputs is staged
// beside it, so a run costs s * sum(q x) + b * sum(x) with one multiply-add a code.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_affine.cuh"
#include "gemv_stage.cuh"
#include "moe.cuh"
#include "moe_launch.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

// Runs of a row a lane loads before it uses the first: the down projection's one row, or each of
// gate/up's two (both held to 64 registers, so 2 blocks of 512 threads share an SM).
constexpr int kAffineBatch = 4;
constexpr int kAffineBatch2 = 2;

// Columns a 16-byte load of codes of kBits holds.
template <int kBits>
constexpr int kRunCols = kBits == 4 ? 32 : 16;

// One run of a row: its 16 bytes of codes and its group's (scale, offset).
struct AffineRun {
  uint4 codes;
  __half2 pair;
};

// Run b of a row of codes (its pairs at `pairs`; groups of 2^g_shift columns, g_shift < 0: one
// group a row).
template <int kBits>
__device__ __forceinline__ AffineRun affine_run(const uint8_t* row, const __half2* pairs, int b,
                                                int g_shift) {
  AffineRun r;
  r.codes = __ldg(reinterpret_cast<const uint4*>(row) + b);
  r.pair = __ldg(pairs + (g_shift < 0 ? 0 : (b * kRunCols<kBits>) >> g_shift));
  return r;
}

// 128 + q as an f32 for the 4-bit code q at bits 4n..4n+3 of w: the nibble moved to bits 16..19,
// under the exponent of 128 (a shift and a mask, no conversion instruction).
__device__ __forceinline__ float nibble_plus_128(uint32_t w, int n) {
  const uint32_t at16 = n < 4 ? w << (16 - 4 * n) : w >> (4 * n - 16);
  return __uint_as_float((at16 & 0x000F0000u) | 0x43000000u);
}

// What nibble_plus_128 adds to each code: the run's offset term takes it back.
constexpr int kAffine4Bias = 128;

// Byte k of w as an f32: put under the exponent of 2^23 by one byte permute, less 2^23 (exact).
__device__ __forceinline__ float byte_value(uint32_t w, int k) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | k)) - 8388608.f;
}

// Where piece c (8 values) of run r of a staged sequence of `runs` runs lies (elements).
__device__ __forceinline__ int staged_at(int c, int r, int runs) { return (c * runs + r) * 8; }

// Stages `runs` runs of kCols values of src (contiguous) piece-major into xs, and each run's sum
// (in order, in f32) into sums; a thread a run. Ends with the block's barrier.
template <typename T, int kCols>
__device__ void stage_runs(T* xs, float* sums, const T* src, int runs) {
  for (int r = threadIdx.x; r < runs; r += kGemvThreads) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kCols / 8; ++c) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src + (int64_t)r * kCols + 8 * c);
      *reinterpret_cast<uint4*>(xs + staged_at(c, r, runs)) = raw;
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) s += to_float(v[e]);
    }
    sums[r] = s;
  }
  __syncthreads();
}

// s * sum(q x) + b * sum(x) of a run against staged run r (of `runs`), whose input sum is rsum.
// 4-bit codes are multiplied as kAffine4Bias + q (nibble_plus_128), the bias taken back with the
// offset's term.
template <typename T, int kBits>
__device__ __forceinline__ float affine_run_dot(const AffineRun& run, const T* xs, int r, int runs,
                                                float rsum) {
  constexpr int kCols = kRunCols<kBits>;
  const uint32_t words[4] = {run.codes.x, run.codes.y, run.codes.z, run.codes.w};
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < kCols / 8; ++c) {
    const uint4 xraw = *reinterpret_cast<const uint4*>(xs + staged_at(c, r, runs));
    const T* xv = reinterpret_cast<const T*>(&xraw);
    if constexpr (kBits == 4) {
      // Piece c is word c: column 2i in nibble i, column 2i + 1 in nibble 4 + i.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc += nibble_plus_128(words[c], i) * to_float(xv[2 * i]);
        acc += nibble_plus_128(words[c], 4 + i) * to_float(xv[2 * i + 1]);
      }
    } else {
      // Piece c is words 2c and 2c + 1: column 4h + k in byte k of word 2c + h.
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc += byte_value(words[2 * c + h], k) * to_float(xv[4 * h + k]);
    }
  }
  const float2 sb = __half22float2(run.pair);
  const float offset = kBits == 4 ? sb.y - (float)kAffine4Bias * sb.x : sb.y;
  return acc * sb.x + rsum * offset;
}

// The stacked codes as the kernels take them: [experts, rows, k_dim * kBits / 8] bytes and
// [experts, rows, groups] pairs.
struct AffineStackArgs {
  const uint8_t* codes;
  const __half2* pairs;
  int g_shift, groups;
};

// a[t * top_k + j, o] = act(g, u) as moe.cu's moe_gate_up_kernel computes it (g, u rounded to
// T, bias added, SiLU-and-mul or the clamped SwiGLU), from code rows [experts, 2 inner, k_dim]
// (gate rows first). The input is staged as T (RMSNorm folded in for kIn = kRmsNorm), then
// piece-major with its runs' sums.
template <typename T, int kIn, int kBits>
__global__ void __launch_bounds__(kGemvThreads, 2)
    moe_gate_up_affine_kernel(T* __restrict__ a, const T* __restrict__ x,
                              const T* __restrict__ norm_w, float eps, AffineStackArgs w,
                              const T* __restrict__ bias, const uint32_t* __restrict__ ids,
                              int top_k, int inner, int k_dim, float alpha, float limit) {
  constexpr int kCols = kRunCols<kBits>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int runs = k_dim / kCols;
  T* xs = reinterpret_cast<T*>(smem);
  T* xp = xs + k_dim;
  float* sums = reinterpret_cast<float*>(xp + k_dim);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (ids are the routing's output; x is read before it)
  let_next_grid_launch();
  stage_input<T, 1, kIn>(xs, x + (int64_t)t * k_dim, norm_w, k_dim, eps);
  stage_runs<T, kCols>(xp, sums, xs, runs);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_bytes = (int64_t)k_dim * kBits / 8;
  const int units = top_k * inner;
  for (int u = blockIdx.x * kGemvWarps + warp; u < units; u += gridDim.x * kGemvWarps) {
    const int j = u / inner, o = u % inner;
    const int64_t e = ids[(int64_t)t * top_k + j];
    const int64_t gate_row = e * 2 * inner + o, up_row = gate_row + inner;
    const uint8_t *g = w.codes + gate_row * row_bytes, *up = w.codes + up_row * row_bytes;
    const __half2 *gp = w.pairs + gate_row * w.groups, *upp = w.pairs + up_row * w.groups;
    float a0 = 0.f, a1 = 0.f;
    for (int first = lane; first < runs; first += 32 * kAffineBatch2) {
      AffineRun r0[kAffineBatch2], r1[kAffineBatch2];
#pragma unroll
      for (int i = 0; i < kAffineBatch2; ++i) {
        const int b = first + 32 * i;
        if (b < runs)
          r0[i] = affine_run<kBits>(g, gp, b, w.g_shift),
          r1[i] = affine_run<kBits>(up, upp, b, w.g_shift);
      }
#pragma unroll
      for (int i = 0; i < kAffineBatch2; ++i) {
        const int b = first + 32 * i;
        if (b < runs) {
          a0 += affine_run_dot<T, kBits>(r0[i], xp, b, runs, sums[b]);
          a1 += affine_run_dot<T, kBits>(r1[i], xp, b, runs, sums[b]);
        }
      }
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      a0 += __shfl_xor_sync(0xffffffff, a0, s);
      a1 += __shfl_xor_sync(0xffffffff, a1, s);
    }
    if (bias != nullptr) {
      a0 += to_float(bias[e * 2 * inner + o]);
      a1 += to_float(bias[e * 2 * inner + inner + o]);
    }
    const float gv = to_float(from_float<T>(a0)), uv = to_float(from_float<T>(a1));
    const float v = alpha > 0.f ? clamped_swiglu(gv, uv, alpha, limit) : silu_mul(gv, uv);
    if (lane == 0) a[((int64_t)t * top_k + j) * inner + o] = from_float<T>(v);
  }
}

// y[t, o] as moe.cu's moe_down_kernel computes it (the experts' outputs weighted in f32, their
// biases inside the weighting, the residual added before rounding), from code rows [experts,
// out_dim, k_dim]: the token's top_k activation rows staged piece-major as one sequence of runs;
// an output's runs cut into `split` slices of a warp each, which meet in shared memory.
template <typename T, int kBits>
__global__ void __launch_bounds__(kGemvThreads, 2)
    moe_down_affine_kernel(T* __restrict__ y, const T* __restrict__ a, AffineStackArgs w,
                           const T* __restrict__ bias, const T* __restrict__ residual,
                           const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                           int top_k, int out_dim, int k_dim, int split) {
  constexpr int kCols = kRunCols<kBits>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kGemvWarps];
  __shared__ int64_t expert[kMaxTopK];
  __shared__ float weight[kMaxTopK];
  const int per_row = k_dim / kCols, all = top_k * per_row;
  T* xp = reinterpret_cast<T*>(smem);
  float* sums = reinterpret_cast<float*>(xp + top_k * k_dim);
  const int t = blockIdx.y;
  wait_for_previous_grid();  // (a is gate/up's output)
  let_next_grid_launch();
  if (threadIdx.x < top_k) {
    expert[threadIdx.x] = ids[(int64_t)t * top_k + threadIdx.x];
    weight[threadIdx.x] = weights[(int64_t)t * top_k + threadIdx.x];
  }
  // (The token's top_k activation rows are contiguous in `a`.)
  stage_runs<T, kCols>(xp, sums, a + (int64_t)t * top_k * k_dim, all);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_bytes = (int64_t)k_dim * kBits / 8;
  const int per = (all + split - 1) / split, units = out_dim * split;
  // Rounds of kGemvWarps units, the same for every warp of the block (so it may sync).
  for (int base = blockIdx.x * kGemvWarps; base < units; base += gridDim.x * kGemvWarps) {
    const int u = base + warp, o = u / split;
    float acc = 0.f;
    if (u < units) {
      const int begin = (u % split) * per, end = min(all, begin + per);
      for (int first = begin + lane; first < end; first += 32 * kAffineBatch) {
        AffineRun r[kAffineBatch];
#pragma unroll
        for (int i = 0; i < kAffineBatch; ++i) {
          const int f = first + 32 * i;
          if (f < end) {
            const int j = f / per_row;
            const int64_t row = expert[j] * out_dim + o;
            r[i] = affine_run<kBits>(w.codes + row * row_bytes, w.pairs + row * w.groups,
                                     f - j * per_row, w.g_shift);
          }
        }
#pragma unroll
        for (int i = 0; i < kAffineBatch; ++i) {
          const int f = first + 32 * i;
          if (f < end) acc += weight[f / per_row] * affine_run_dot<T, kBits>(r[i], xp, f, all, sums[f]);
        }
      }
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
    }
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (u < units && lane == 0 && u % split == 0) {
      float sum = residual != nullptr ? to_float(residual[(int64_t)t * out_dim + o]) : 0.f;
      if (bias != nullptr)
        for (int j = 0; j < top_k; ++j) sum += weight[j] * to_float(bias[expert[j] * out_dim + o]);
      for (int i = 0; i < split; ++i) sum += partial[warp + i];
      y[(int64_t)t * out_dim + o] = from_float<T>(sum);
    }
    __syncthreads();
  }
}

// Slices an output of moe_down_affine_kernel takes: halved while the outputs make fewer than
// 16k warps and each slice keeps at least 64 runs (two a lane).
int affine_down_split(int out_dim, int all_runs) {
  int split = 1;
  while (split < 8 && out_dim * split < 16384 && all_runs / (2 * split) >= 64) split *= 2;
  return split;
}

AffineStackArgs stack_args(const void* codes, const void* pairs, int group, int k_dim) {
  const int2 g = affine_groups(group, k_dim);
  return AffineStackArgs{static_cast<const uint8_t*>(codes), static_cast<const __half2*>(pairs),
                         g.x, g.y};
}

template <typename T, int kIn, int kBits>
int launch_gate_up(void* a, const void* x, const void* norm_w, float eps, AffineStackArgs w,
                   const void* bias, const uint32_t* ids, int tokens, int top_k, int inner,
                   int k_dim, Activation act, cudaStream_t stream) {
  constexpr auto kernel = moe_gate_up_affine_kernel<T, kIn, kBits>;
  // (The staged input as T, again piece-major, and its runs' sums.)
  const int smem = 2 * k_dim * (int)sizeof(T) + k_dim / kRunCols<kBits> * (int)sizeof(float);
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, top_k * inner, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)a, (const T*)x, (const T*)norm_w, eps, w,
                                       (const T*)bias, ids, top_k, inner, k_dim, act.alpha,
                                       act.limit);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T, int kBits>
int gate_up_by_input(void* a, const void* x, const void* norm_w, float eps, AffineStackArgs w,
                     const void* bias, const uint32_t* ids, int tokens, int top_k, int inner,
                     int k_dim, Activation act, cudaStream_t stream) {
  if (norm_w != nullptr)
    return launch_gate_up<T, kRmsNorm, kBits>(a, x, norm_w, eps, w, bias, ids, tokens, top_k,
                                              inner, k_dim, act, stream);
  return launch_gate_up<T, kPlain, kBits>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner,
                                          k_dim, act, stream);
}

template <typename T>
int gate_up_by_bits(int bits, void* a, const void* x, const void* norm_w, float eps,
                    AffineStackArgs w, const void* bias, const uint32_t* ids, int tokens,
                    int top_k, int inner, int k_dim, Activation act, cudaStream_t stream) {
  if (bits == 4)
    return gate_up_by_input<T, 4>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner, k_dim,
                                  act, stream);
  return gate_up_by_input<T, 8>(a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner, k_dim, act,
                                stream);
}

template <typename T, int kBits>
int launch_down(void* y, const void* a, AffineStackArgs w, const void* bias, const void* residual,
                const uint32_t* ids, const float* weights, int tokens, int top_k, int out_dim,
                int k_dim, cudaStream_t stream) {
  constexpr auto kernel = moe_down_affine_kernel<T, kBits>;
  const int all = top_k * (k_dim / kRunCols<kBits>);
  const int smem = top_k * k_dim * (int)sizeof(T) + all * (int)sizeof(float);
  const int split = affine_down_split(out_dim, all);
  int blocks = 0;
  if (const int e = blocks_per_token<kernel>(smem, out_dim * split, tokens, &blocks)) return e;
  const cudaError_t err = launch_early(kernel, dim3(blocks, tokens), dim3(kGemvThreads), smem,
                                       stream, (T*)y, (const T*)a, w, (const T*)bias,
                                       (const T*)residual, ids, weights, top_k, out_dim, k_dim,
                                       split);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T>
int down_by_bits(int bits, void* y, const void* a, AffineStackArgs w, const void* bias,
                 const void* residual, const uint32_t* ids, const float* weights, int tokens,
                 int top_k, int out_dim, int k_dim, cudaStream_t stream) {
  if (bits == 4)
    return launch_down<T, 4>(y, a, w, bias, residual, ids, weights, tokens, top_k, out_dim, k_dim,
                             stream);
  return launch_down<T, 8>(y, a, w, bias, residual, ids, weights, tokens, top_k, out_dim, k_dim,
                           stream);
}

}  // namespace

// pagewise_moe_gate_up (moe.cu) with the experts' rows as codes: `codes` [experts, 2 inner,
// k_dim * bits / 8] (bits 4: Int4Weight's word order; 8: a byte a code) and `pairs` their f16
// (scale, offset) pairs [experts, 2 inner, ceil(k_dim / group)]; k_dim a multiple of 32 (4-bit)
// or 16 (bytes), group whole rows or a power of two of at least that; codes 16-byte aligned,
// pairs 4-byte. Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_affine_gate_up(int dtype, void* a, const void* x, const void* norm_w,
                                           float eps, const void* codes, const void* pairs,
                                           int group, int bits, const void* bias,
                                           const uint32_t* ids, int tokens, int top_k, int inner,
                                           int k_dim, float alpha, float limit, void* stream) {
  if (tokens == 0 || inner == 0) return 0;
  if (!affine_weight_fits(bits, k_dim, group) || top_k < 1) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  const Activation act{alpha, limit};
  const AffineStackArgs w = stack_args(codes, pairs, group, k_dim);
  switch (dtype) {
    case 1:
      return gate_up_by_bits<__half>(bits, a, x, norm_w, eps, w, bias, ids, tokens, top_k, inner,
                                     k_dim, act, s);
    case 2:
      return gate_up_by_bits<__nv_bfloat16>(bits, a, x, norm_w, eps, w, bias, ids, tokens, top_k,
                                            inner, k_dim, act, s);
    default: return 1;
  }
}

// pagewise_moe_down (moe.cu) with the experts' rows as codes: `codes` [experts, out_dim, k_dim *
// bits / 8] and `pairs` [experts, out_dim, ceil(k_dim / group)], as pagewise_moe_affine_gate_up
// takes them. Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_affine_down(int dtype, void* y, const void* a, const void* codes,
                                        const void* pairs, int group, int bits, const void* bias,
                                        const void* residual, const uint32_t* ids,
                                        const float* weights, int tokens, int top_k, int out_dim,
                                        int k_dim, void* stream) {
  if (tokens == 0 || out_dim == 0) return 0;
  if (!affine_weight_fits(bits, k_dim, group) || top_k < 1 || top_k > kMaxTopK) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  const AffineStackArgs w = stack_args(codes, pairs, group, k_dim);
  switch (dtype) {
    case 1:
      return down_by_bits<__half>(bits, y, a, w, bias, residual, ids, weights, tokens, top_k,
                                  out_dim, k_dim, s);
    case 2:
      return down_by_bits<__nv_bfloat16>(bits, y, a, w, bias, residual, ids, weights, tokens,
                                         top_k, out_dim, k_dim, s);
    default: return 1;
  }
}
