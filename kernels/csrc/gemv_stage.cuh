// pagewise: what the GEMV kernels of gemv.cu share: the block shape, the staging of the matmul's
// input (x, RMSNorm(x), SiLU-and-mul or GeGLU) in shared memory, the grid of a launch and the dispatch
// over dtype, input and rows. Included by gemv.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "silu.cuh"

namespace {

constexpr int kGemvThreads = 512;
constexpr int kGemvWarps = kGemvThreads / 32;
// Shared memory a block may stage x in (rows x k elements); callers check gemv_fits first.
constexpr int kMaxStageBytes = 96 * 1024;

// What the block computes from x before the matmul (kAddNormed: see stage_add_normed).
enum Input { kPlain = 0, kRmsNorm = 1, kSiluMul = 2, kGeluMul = 3, kAddNormed = 4 };

// 1 / rms of each of the R rows (in shared memory, for every thread of the block), from each
// thread's sums of squares `sq` over its own items of k_dim elements a row. Two barriers; a block
// may call it again once every thread has read the rows' values it returned.
template <int R, int kT = kGemvThreads>
__device__ __forceinline__ const float* block_inv_rms_rows(const float (&sq)[R], int k_dim,
                                                           float eps) {
  __shared__ float partial[kT / 32][R];
  __shared__ float inv[R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = sq[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < R) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kT / 32; ++w) t += partial[w][threadIdx.x];
    inv[threadIdx.x] = rsqrtf(t / k_dim + eps);
  }
  __syncthreads();
  return inv;
}

// Adds the squares of v (8 values of row r) to sq[r]. (r is the same for all of a thread's
// items only when R == 1: added by row.)
template <typename T, int R>
__device__ __forceinline__ void add_row_squares(float (&sq)[R], int r, const T* v) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += to_float(v[j]) * to_float(v[j]);
#pragma unroll
  for (int rr = 0; rr < R; ++rr)
    if (rr == r) sq[rr] += s;
}

// xs[r, k] = round(xs[r, k] * inv[r] * norm_w[k]) over the R staged rows, each thread taking the
// 16-byte vectors it staged itself (the staging loops' order), so no barrier is needed before.
template <typename T, int R, int kT = kGemvThreads>
__device__ __forceinline__ void rescale_staged(T* xs, const T* __restrict__ norm_w,
                                               const float* inv, int k_dim) {
  constexpr int kVec = 8;
  const int vecs = k_dim / kVec;
  for (int i = threadIdx.x; i < R * vecs; i += kT) {
    const int r = i / vecs, k = (i % vecs) * kVec;
    uint4 a = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
    const uint4 wa = *reinterpret_cast<const uint4*>(norm_w + k);
    T* v = reinterpret_cast<T*>(&a);
    const T* g = reinterpret_cast<const T*>(&wa);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = from_float<T>(to_float(v[j]) * inv[r] * to_float(g[j]));
    *reinterpret_cast<uint4*>(xs + r * k_dim + k) = a;
  }
}

// Stages the R rows of the matmul's input in `xs` ([R, k_dim], T): x itself, RMSNorm(x) * norm_w,
// or silu(gate) * up (gelu_tanh(gate) * up for kGeluMul) from x = [R, 2 k_dim] (gate columns
// first). kT, here and in the helpers: the block's threads. With kRmsNorm, `inv_out` (shared
// memory, R floats, when not null) gets each row's 1 / rms.
template <typename T, int R, int kIn, int kT = kGemvThreads>
__device__ void stage_input(T* xs, const T* __restrict__ x, const T* __restrict__ norm_w,
                            int k_dim, float eps, float* inv_out = nullptr) {
  constexpr int kVec = 8;  // 16 bytes of T (f16 / bf16)
  const int vecs = k_dim / kVec;
  if constexpr (kIn == kSiluMul || kIn == kGeluMul) {
    for (int i = threadIdx.x; i < R * vecs; i += kT) {
      const int r = i / vecs, k = (i % vecs) * kVec;
      const uint4 ga = *reinterpret_cast<const uint4*>(x + (int64_t)r * 2 * k_dim + k);
      const uint4 ua = *reinterpret_cast<const uint4*>(x + (int64_t)r * 2 * k_dim + k_dim + k);
      *reinterpret_cast<uint4*>(xs + r * k_dim + k) =
          kIn == kSiluMul ? silu_mul16<T>(ga, ua) : gelu_tanh_mul16<T>(ga, ua);
    }
  } else {
    float sq[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sq[r] = 0.f;
    for (int i = threadIdx.x; i < R * vecs; i += kT) {
      const int r = i / vecs, k = (i % vecs) * kVec;
      const uint4 a = *reinterpret_cast<const uint4*>(x + (int64_t)r * k_dim + k);
      *reinterpret_cast<uint4*>(xs + r * k_dim + k) = a;
      if constexpr (kIn == kRmsNorm) add_row_squares<T, R>(sq, r, reinterpret_cast<const T*>(&a));
    }
    if constexpr (kIn == kRmsNorm) {
      const float* inv = block_inv_rms_rows<R, kT>(sq, k_dim, eps);
      rescale_staged<T, R, kT>(xs, norm_w, inv, k_dim);
      if (inv_out != nullptr && threadIdx.x < R) inv_out[threadIdx.x] = inv[threadIdx.x];
    }
  }
  __syncthreads();
}

// Stages RMSNorm(s) * norm_w for the R rows of s = stream_in + round(RMSNorm(delta) * delta_w)
// (Gemma's residual add of a normalized output, then the next norm: what add_rms_normed and
// stage_input's kRmsNorm compute, with the same roundings). Block 0 also stores s to stream_out
// ([R, k_dim]), the residual stream the layer goes on with; no other block reads it.
template <typename T, int R, int kT = kGemvThreads>
__device__ void stage_add_normed(T* xs, const T* __restrict__ delta,
                                 const T* __restrict__ stream_in, const T* __restrict__ delta_w,
                                 const T* __restrict__ norm_w, T* __restrict__ stream_out,
                                 int k_dim, float eps) {
  constexpr int kVec = 8;  // 16 bytes of T (f16 / bf16)
  const int vecs = k_dim / kVec;
  float sq[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sq[r] = 0.f;
  for (int i = threadIdx.x; i < R * vecs; i += kT) {
    const int r = i / vecs, k = (i % vecs) * kVec;
    const uint4 a = *reinterpret_cast<const uint4*>(delta + (int64_t)r * k_dim + k);
    *reinterpret_cast<uint4*>(xs + r * k_dim + k) = a;
    add_row_squares<T, R>(sq, r, reinterpret_cast<const T*>(&a));
  }
  const float* inv = block_inv_rms_rows<R, kT>(sq, k_dim, eps);
  // Each thread goes on with the vectors it staged itself.
#pragma unroll
  for (int r = 0; r < R; ++r) sq[r] = 0.f;
  for (int i = threadIdx.x; i < R * vecs; i += kT) {
    const int r = i / vecs, k = (i % vecs) * kVec;
    uint4 a = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
    const uint4 ra = *reinterpret_cast<const uint4*>(stream_in + (int64_t)r * k_dim + k);
    const uint4 wa = *reinterpret_cast<const uint4*>(delta_w + k);
    T* v = reinterpret_cast<T*>(&a);
    const T* res = reinterpret_cast<const T*>(&ra);
    const T* g = reinterpret_cast<const T*>(&wa);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const T n = from_float<T>(to_float(v[j]) * inv[r] * to_float(g[j]));
      v[j] = from_float<T>(to_float(res[j]) + to_float(n));
    }
    *reinterpret_cast<uint4*>(xs + r * k_dim + k) = a;
    if (blockIdx.x == 0) *reinterpret_cast<uint4*>(stream_out + (int64_t)r * k_dim + k) = a;
    add_row_squares<T, R>(sq, r, v);
  }
  rescale_staged<T, R, kT>(xs, norm_w, block_inv_rms_rows<R, kT>(sq, k_dim, eps), k_dim);
  __syncthreads();
}

// Streaming multiprocessors of the current device (looked up once per device); 0 on error.
inline int sm_count() {
  static int known[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (known[dev] == 0 &&
      cudaDeviceGetAttribute(&known[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    known[dev] = 0;
  return known[dev];
}

// Blocks for a GEMV-style launch of `units` outputs, `per_block` of them a block a round: as many
// blocks (of `threads`) as run at once (each stages x once), fewer when the outputs run out,
// spread evenly so every warp takes the same number of rounds. `resident_by` caches
// blocks-at-once per device and staging size (in steps of 8 KB), with the shared-memory opt-in
// done on first use. Returns 0 or a CUDA error code.
constexpr int kStageStep = 8 * 1024;
constexpr int kStageSteps = kMaxStageBytes / kStageStep;
template <typename Kernel>
int grid_for(Kernel kernel, int smem, int units, int per_block,
             int (&resident_by)[64][kStageSteps + 1], int* blocks, int threads = kGemvThreads) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return (int)err;
  if (dev < 0 || dev >= 64) return (int)cudaErrorInvalidDevice;
  const int step = (smem + kStageStep - 1) / kStageStep;
  if (resident_by[dev][step] == 0) {
    int per_sm = 0;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kMaxStageBytes);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads,
                                                          step * kStageStep);
    if (err != cudaSuccess) return (int)err;
    const int sms = sm_count();
    resident_by[dev][step] = (per_sm > 0 ? per_sm : 1) * (sms > 0 ? sms : 1);
  }
  const int wanted = (units + per_block - 1) / per_block;
  const int rounds = (wanted + resident_by[dev][step] - 1) / resident_by[dev][step];
  *blocks = (wanted + rounds - 1) / rounds;
  return 0;
}

// The arguments of one GEMV launch (see pagewise_gemv).
struct GemvArgs {
  void* y;
  const void *x, *norm_w, *w, *residual;
  int out_dim, k_dim;
  float eps;
  cudaStream_t stream;
  // kAddNormed only: the residual stream in and out, and delta's norm weight (x is delta).
  const void *stream_in, *delta_w;
  void* stream_out;
  // The weight's kind (WeightKind, gemv_weight.cuh). FP8 (w e4m3): f32 scales, one per block of
  // block_rows x block_cols (see Fp8Weight); 4-bit (w the codes): f16 (scale, zero) pairs, one
  // per row and group of block_cols columns (see Int4Weight); null for dense weights.
  int w_kind;
  const void* scales;
  int block_rows, block_cols;
};

// Launcher::run<T, R, kIn, kAdd>(a) for the call's dtype (1 = f16, 2 = bf16), input (an Input),
// rows (1..8) and residual (kAdd when not null): the dispatch of gemv.cu's entry point (a
// launcher struct per kernel). Returns 1 for what no instantiation covers.
template <typename Launcher, typename T, int kIn, bool kAdd>
int by_rows(int rows, const GemvArgs& a) {
  switch (rows) {
    case 1: return Launcher::template run<T, 1, kIn, kAdd>(a);
    case 2: return Launcher::template run<T, 2, kIn, kAdd>(a);
    case 3: return Launcher::template run<T, 3, kIn, kAdd>(a);
    case 4: return Launcher::template run<T, 4, kIn, kAdd>(a);
    case 5: return Launcher::template run<T, 5, kIn, kAdd>(a);
    case 6: return Launcher::template run<T, 6, kIn, kAdd>(a);
    case 7: return Launcher::template run<T, 7, kIn, kAdd>(a);
    case 8: return Launcher::template run<T, 8, kIn, kAdd>(a);
    default: return 1;
  }
}

template <typename Launcher, typename T>
int by_input(int input, int rows, const GemvArgs& a) {
  const bool add = a.residual != nullptr;
  switch (input) {
    case kPlain:
      return add ? by_rows<Launcher, T, kPlain, true>(rows, a)
                 : by_rows<Launcher, T, kPlain, false>(rows, a);
    case kRmsNorm:
      return add ? by_rows<Launcher, T, kRmsNorm, true>(rows, a)
                 : by_rows<Launcher, T, kRmsNorm, false>(rows, a);
    case kSiluMul:
      return add ? by_rows<Launcher, T, kSiluMul, true>(rows, a)
                 : by_rows<Launcher, T, kSiluMul, false>(rows, a);
    // (Gemma adds the residual after a norm of the MLP's output: never folded into the store.)
    case kGeluMul: return add ? 1 : by_rows<Launcher, T, kGeluMul, false>(rows, a);
    case kAddNormed: return add ? 1 : by_rows<Launcher, T, kAddNormed, false>(rows, a);
    default: return 1;
  }
}

template <typename Launcher>
int dispatch_gemv(int dtype, int input, int rows, const GemvArgs& a) {
  switch (dtype) {
    case 1: return by_input<Launcher, __half>(input, rows, a);
    case 2: return by_input<Launcher, __nv_bfloat16>(input, rows, a);
    default: return 1;
  }
}

}  // namespace
