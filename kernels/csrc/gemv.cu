// pagewise: x W^T for decode batches of up to 8 rows, streaming the weight once (one warp per
// output, 16-byte loads), with the layer's neighbouring element-wise steps folded in: the RMSNorm
// before a projection or the SiLU-and-mul before the down projection are applied while the block
// stages x in shared memory, and the residual add after a projection is applied as it stores.
// The staged x is rounded to the tensor dtype as the separate kernels would store it, so only the
// matmul's summation order differs from the unfused path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

constexpr int kGemvThreads = 512;
constexpr int kGemvWarps = kGemvThreads / 32;
// Shared memory a block may stage x in (rows x k elements); callers check gemv_fits first.
constexpr int kMaxStageBytes = 96 * 1024;

// What the block computes from x before the matmul.
enum Input { kPlain = 0, kRmsNorm = 1, kSiluMul = 2 };

// Stages the R rows of the matmul's input in `xs` ([R, k_dim], T): x itself, RMSNorm(x) * norm_w,
// or silu(gate) * up from x = [R, 2 k_dim] (gate columns first).
template <typename T, int R, int kIn>
__device__ void stage_input(T* xs, const T* __restrict__ x, const T* __restrict__ norm_w,
                            int k_dim, float eps) {
  constexpr int kVec = 8;  // 16 bytes of T (f16 / bf16)
  const int vecs = k_dim / kVec;
  if constexpr (kIn == kSiluMul) {
    for (int i = threadIdx.x; i < R * vecs; i += kGemvThreads) {
      const int r = i / vecs, k = (i % vecs) * kVec;
      const uint4 ga = *reinterpret_cast<const uint4*>(x + (int64_t)r * 2 * k_dim + k);
      const uint4 ua = *reinterpret_cast<const uint4*>(x + (int64_t)r * 2 * k_dim + k_dim + k);
      *reinterpret_cast<uint4*>(xs + r * k_dim + k) = silu_mul16<T>(ga, ua);
    }
  } else {
    float sq[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sq[r] = 0.f;
    for (int i = threadIdx.x; i < R * vecs; i += kGemvThreads) {
      const int r = i / vecs, k = (i % vecs) * kVec;
      const uint4 a = *reinterpret_cast<const uint4*>(x + (int64_t)r * k_dim + k);
      *reinterpret_cast<uint4*>(xs + r * k_dim + k) = a;
      if constexpr (kIn == kRmsNorm) {
        const T* v = reinterpret_cast<const T*>(&a);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) s += to_float(v[j]) * to_float(v[j]);
        // (r is the same for all of a thread's items only when R == 1; add by row.)
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
          if (rr == r) sq[rr] += s;
      }
    }
    if constexpr (kIn == kRmsNorm) {
      __shared__ float partial[kGemvWarps][R];
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
        for (int w = 0; w < kGemvWarps; ++w) t += partial[w][threadIdx.x];
        inv[threadIdx.x] = rsqrtf(t / k_dim + eps);
      }
      __syncthreads();
      // Each thread rescales the vectors it staged itself.
      for (int i = threadIdx.x; i < R * vecs; i += kGemvThreads) {
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
  }
  __syncthreads();
}

// y[r, o] = sum_k xs[r, k] * w[o, k] (+ residual[r, o], added to the product rounded to T as the
// unfused add would see it). A block stages its input once, then its warps take outputs
// blockIdx.x * warps + warp, stepping by the grid's warps.
template <typename T, int R, int kIn, bool kAdd>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ norm_w,
                const T* __restrict__ w, const T* __restrict__ residual, int out_dim, int k_dim,
                float eps) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  // Launched early (see launch_early): x and y belong to the kernels around this one.
  wait_for_previous_grid();
  let_next_grid_launch();
  stage_input<T, R, kIn>(xs, x, norm_w, k_dim, eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int o = blockIdx.x * kGemvWarps + warp; o < out_dim; o += gridDim.x * kGemvWarps) {
    const T* wr = w + (int64_t)o * k_dim;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 4
    for (int k = lane * 8; k < k_dim; k += 32 * 8) {
      const uint4 wraw = __ldg(reinterpret_cast<const uint4*>(wr + k));
      const T* wv = reinterpret_cast<const T*>(&wraw);
      float wf[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) wf[j] = to_float(wv[j]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
        const T* xv = reinterpret_cast<const T*>(&xraw);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] += wf[j] * to_float(xv[j]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r];
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffff, v, s);
      if (lane == 0) {
        const int64_t at = (int64_t)r * out_dim + o;
        if constexpr (kAdd) v = to_float(from_float<T>(v)) + to_float(residual[at]);
        y[at] = from_float<T>(v);
      }
    }
  }
}

template <typename T, int R, int kIn, bool kAdd>
int launch_r(const void* x, const void* norm_w, const void* w, const void* residual, void* y,
             int out_dim, int k_dim, float eps, cudaStream_t stream) {
  const auto kernel = gemv_kernel<T, R, kIn, kAdd>;
  const int smem = R * k_dim * (int)sizeof(T);
  if (smem > kMaxStageBytes) return 1;
  // Per device and staging size (in steps of 8 KB), once: the shared-memory opt-in (past 48 KB a
  // kernel must ask) and how many blocks fit on the GPU at once.
  constexpr int kStep = 8 * 1024, kSteps = kMaxStageBytes / kStep;
  static int resident_by[64][kSteps + 1] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return (int)err;
  if (dev < 0 || dev >= 64) return (int)cudaErrorInvalidDevice;
  const int step = (smem + kStep - 1) / kStep;
  if (resident_by[dev][step] == 0) {
    int sms = 0, per_sm = 0;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kMaxStageBytes);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads,
                                                          step * kStep);
    if (err != cudaSuccess) return (int)err;
    resident_by[dev][step] = (per_sm > 0 ? per_sm : 1) * (sms > 0 ? sms : 1);
  }
  // As many blocks as run at once (each stages x once), fewer when the outputs run out, and
  // the outputs spread evenly: every warp takes the same number of rounds.
  const int wanted = (out_dim + kGemvWarps - 1) / kGemvWarps;
  const int rounds = (wanted + resident_by[dev][step] - 1) / resident_by[dev][step];
  const int blocks = (wanted + rounds - 1) / rounds;
  err = launch_early(kernel, blocks, kGemvThreads, smem, stream, (T*)y, (const T*)x,
                     (const T*)norm_w, (const T*)w, (const T*)residual, out_dim, k_dim, eps);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T, int kIn, bool kAdd>
int launch_rows(int rows, const void* x, const void* norm_w, const void* w, const void* residual,
                void* y, int out_dim, int k_dim, float eps, cudaStream_t s) {
#define PAGEWISE_GEMV_R(R) \
  case R: return launch_r<T, R, kIn, kAdd>(x, norm_w, w, residual, y, out_dim, k_dim, eps, s)
  switch (rows) {
    PAGEWISE_GEMV_R(1);
    PAGEWISE_GEMV_R(2);
    PAGEWISE_GEMV_R(3);
    PAGEWISE_GEMV_R(4);
    PAGEWISE_GEMV_R(5);
    PAGEWISE_GEMV_R(6);
    PAGEWISE_GEMV_R(7);
    PAGEWISE_GEMV_R(8);
    default: return 1;
  }
#undef PAGEWISE_GEMV_R
}

template <typename T>
int launch(int input, bool add, int rows, const void* x, const void* norm_w, const void* w,
           const void* residual, void* y, int out_dim, int k_dim, float eps, cudaStream_t s) {
#define PAGEWISE_GEMV_IN(IN)                                                                  \
  return add ? launch_rows<T, IN, true>(rows, x, norm_w, w, residual, y, out_dim, k_dim, eps, s) \
             : launch_rows<T, IN, false>(rows, x, norm_w, w, residual, y, out_dim, k_dim, eps, s)
  switch (input) {
    case kPlain: PAGEWISE_GEMV_IN(kPlain);
    case kRmsNorm: PAGEWISE_GEMV_IN(kRmsNorm);
    case kSiluMul: PAGEWISE_GEMV_IN(kSiluMul);
    default: return 1;
  }
#undef PAGEWISE_GEMV_IN
}

}  // namespace

// y ([rows, out_dim]) = in(x) w^T (+ residual, [rows, out_dim], when not null), rows 1..8, dtype
// 1 = f16, 2 = bf16, k_dim a multiple of 8, every pointer 16-byte aligned. input 0: in(x) = x
// ([rows, k_dim]); 1: RMSNorm(x) * norm_w with `eps` (x [rows, k_dim], norm_w [k_dim]); 2:
// silu(x[:, :k_dim]) * x[:, k_dim:] (x [rows, 2 k_dim]). Returns 0, a CUDA error code, or 1 when
// the arguments are unsupported (rows x k_dim past the staging space among them).
extern "C" int pagewise_gemv(int dtype, int input, void* y, const void* x, const void* norm_w,
                             const void* w, const void* residual, int rows, int out_dim,
                             int k_dim, float eps, void* stream) {
  if (rows == 0 || out_dim == 0) return 0;
  if (k_dim % 8 != 0) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  const bool add = residual != nullptr;
  switch (dtype) {
    case 1: return launch<__half>(input, add, rows, x, norm_w, w, residual, y, out_dim, k_dim, eps, s);
    case 2:
      return launch<__nv_bfloat16>(input, add, rows, x, norm_w, w, residual, y, out_dim, k_dim,
                                   eps, s);
    default: return 1;
  }
}

// The most bytes of staged input (rows x k_dim x element size) pagewise_gemv takes.
extern "C" int pagewise_gemv_max_stage_bytes() { return kMaxStageBytes; }
