// pagewise: the decode GEMV of 3 to 8 rows on tensor cores (opt-in, PAGEWISE_GEMV_MMA=1; see
// pagewise_gemv). gemv.cu's kernel does every row's multiply-adds on CUDA cores and reads each
// staged row from shared memory once per 16-byte weight load, so past two rows it is bound by
// those, not by the weight's bytes. Here a warp computes a 16-output x 8-row tile with mma.sync
// m16n8k16: the weights are the A operand, loaded 16 bytes a lane straight from global memory,
// and the staged rows are B. A dot product may take its k in any order, as long as A and B take
// the same one: lane (g, c) = (lane / 4, lane % 4) loads weight rows g and g + 8 and staged row g
// at columns k0 + 8c .. k0 + 8c + 7, and two mmas take their elements 0-3 and 4-7 as the columns
// 2c, 2c + 1, 2c + 8, 2c + 9 of their fragments. The 16 warps of a block split k (32 columns a
// step, every 16th step a warp) and add their tiles in shared memory in warp order; each element
// of the product is summed in an order independent of the other rows, so a row's result does not
// depend on how many rows share the launch (3 to 8). Input staging (x, RMSNorm, SiLU-and-mul) and
// the residual add are gemv.cu's. Written in the tenth session without a GPU to run it on; its
// index math is emulated lane by lane by scripts/dev/gemv_mma_emu.py (run by CI): change both
// together.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_stage.cuh"
#include "mma.cuh"
#include "pdl.cuh"

namespace {

constexpr int kTileOut = 16;  // outputs a tile (the mma's M)
constexpr int kTileRows = 8;  // staged rows a tile (the mma's N)
constexpr int kStepK = 32;    // columns a warp takes a step (two mmas)

// One step of 32 columns: the lane's 8 columns of weight rows g and g + 8 (a_lo, a_hi) and of
// staged row g (b) as two mmas' fragments (elements 0-3, then 4-7; see the file's comment).
template <typename T>
__device__ __forceinline__ void mma_step(float (&acc)[4], const uint4& a_lo, const uint4& a_hi,
                                         const uint4& b) {
  const uint32_t a1[4] = {a_lo.x, a_hi.x, a_lo.y, a_hi.y};
  mma_16816<T>(acc, a1, b.x, b.y);
  const uint32_t a2[4] = {a_lo.z, a_hi.z, a_lo.w, a_hi.w};
  mma_16816<T>(acc, a2, b.z, b.w);
}

// y[r, o] = in(x)[r, :] . w[o, :] (+ residual[r, o], added to the product rounded to T), for the
// R <= 8 staged rows; blocks take tiles of 16 outputs, stepping by the grid.
template <typename T, int R, int kIn, bool kAdd>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_mma_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ norm_w,
                    const T* __restrict__ w, const T* __restrict__ residual, int out_dim,
                    int k_dim, float eps) {
  static_assert(R >= 1 && R <= kTileRows, "rows");
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float sums[kGemvWarps][4][32];  // [warp][fragment element][lane]
  T* xs = reinterpret_cast<T*>(smem);
  wait_for_previous_grid();  // (launched early: x is the kernel before's output)
  let_next_grid_launch();
  stage_input<T, R, kIn>(xs, x, norm_w, k_dim, eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  // This lane's staged row (a row past R reads row 0 and multiplies by zero instead).
  const bool live = g < R;
  const T* xr = xs + (int64_t)(live ? g : 0) * k_dim + 8 * c;
  const int tiles = (out_dim + kTileOut - 1) / kTileOut;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int o0 = tile * kTileOut;
    // Rows past out_dim read the last row; their sums are not stored.
    const T* wa = w + (int64_t)min(o0 + g, out_dim - 1) * k_dim + 8 * c;
    const T* wb = w + (int64_t)min(o0 + g + 8, out_dim - 1) * k_dim + 8 * c;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    // Groups of kSteps steps, software-pipelined: the next group's weight loads are issued
    // before the current group's mmas, so a warp keeps up to 2 x kSteps x 2 loads in flight;
    // then the last few steps one at a time.
    constexpr int kStride = kGemvWarps * kStepK, kSteps = 2, kGroup = kSteps * kStride;
    int k = warp * kStepK;
    uint4 a_lo[kSteps], a_hi[kSteps];
    const bool any = k + kGroup - kStride < k_dim;  // a whole first group
    if (any) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        a_lo[u] = __ldg(reinterpret_cast<const uint4*>(wa + k + u * kStride));
        a_hi[u] = __ldg(reinterpret_cast<const uint4*>(wb + k + u * kStride));
      }
    }
    for (; any && k + kGroup - kStride < k_dim; k += kGroup) {
      const bool more = k + 2 * kGroup - kStride < k_dim;  // a whole next group
      uint4 n_lo[kSteps], n_hi[kSteps];
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        n_lo[u] = more ? __ldg(reinterpret_cast<const uint4*>(wa + k + kGroup + u * kStride))
                       : a_lo[u];
        n_hi[u] = more ? __ldg(reinterpret_cast<const uint4*>(wb + k + kGroup + u * kStride))
                       : a_hi[u];
      }
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        const uint4 b = *reinterpret_cast<const uint4*>(xr + k + u * kStride);
        mma_step<T>(acc, a_lo[u], a_hi[u], live ? b : uint4{});
      }
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        a_lo[u] = n_lo[u];
        a_hi[u] = n_hi[u];
      }
    }
    for (; k < k_dim; k += kStride) {
      const uint4 lo = __ldg(reinterpret_cast<const uint4*>(wa + k));
      const uint4 hi = __ldg(reinterpret_cast<const uint4*>(wb + k));
      const uint4 b = *reinterpret_cast<const uint4*>(xr + k);
      mma_step<T>(acc, lo, hi, live ? b : uint4{});
    }
    // acc: (output g, rows 2c, 2c + 1), (output g + 8, rows 2c, 2c + 1). Add the warps' tiles.
#pragma unroll
    for (int e = 0; e < 4; ++e) sums[warp][e][lane] = acc[e];
    __syncthreads();
    if (threadIdx.x < 32 * 4) {
      const int l = threadIdx.x % 32, e = threadIdx.x / 32;
      const int o = o0 + l / 4 + (e >= 2 ? 8 : 0), r = 2 * (l % 4) + (e & 1);
      if (o < out_dim && r < R) {
        float v = 0.f;
#pragma unroll
        for (int wp = 0; wp < kGemvWarps; ++wp) v += sums[wp][e][l];
        const int64_t at = (int64_t)r * out_dim + o;
        if constexpr (kAdd) v = to_float(from_float<T>(v)) + to_float(residual[at]);
        y[at] = from_float<T>(v);
      }
    }
    __syncthreads();
  }
}

// gemv_mma_kernel for 3 to 8 rows (see dispatch_gemv; 1 for fewer).
struct TensorCoreGemv {
  template <typename T, int R, int kIn, bool kAdd>
  static int run(const GemvArgs& a) {
    if constexpr (R < 3) {
      return 1;
    } else {
      const auto kernel = gemv_mma_kernel<T, R, kIn, kAdd>;
      const int smem = R * a.k_dim * (int)sizeof(T);
      if (smem > kMaxStageBytes) return 1;
      static int resident_by[64][kStageSteps + 1] = {};
      int blocks = 0;
      const int tiles = (a.out_dim + kTileOut - 1) / kTileOut;
      if (const int e = grid_for(kernel, smem, tiles, 1, resident_by, &blocks)) return e;
      const cudaError_t err = launch_early(kernel, blocks, kGemvThreads, smem, a.stream, (T*)a.y,
                                           (const T*)a.x, (const T*)a.norm_w, (const T*)a.w,
                                           (const T*)a.residual, a.out_dim, a.k_dim, a.eps);
      return (int)(err != cudaSuccess ? err : cudaGetLastError());
    }
  }
};

}  // namespace

// pagewise_gemv on tensor cores, for 3 to 8 rows and k_dim a multiple of 32 (same arguments and
// results; 1 when unsupported). pagewise_gemv sends such calls here when PAGEWISE_GEMV_MMA=1.
extern "C" int pagewise_gemv_mma(int dtype, int input, void* y, const void* x,
                                 const void* norm_w, const void* w, const void* residual,
                                 int rows, int out_dim, int k_dim, float eps, void* stream) {
  if (rows == 0 || out_dim == 0) return 0;
  if (k_dim % kStepK != 0) return 1;
  const GemvArgs a = {y, x, norm_w, w, residual, out_dim, k_dim, eps, (cudaStream_t)stream};
  return dispatch_gemv<TensorCoreGemv>(dtype, input, rows, a);
}
