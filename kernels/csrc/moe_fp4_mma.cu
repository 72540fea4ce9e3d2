// pagewise: MXFP4 experts (mxfp4.cuh) on tensor cores, for steps of tens to hundreds of tokens:
// more than the token-by-token expert kernels (moe_fp4.cu) serve well, each token streaming its
// own experts, and fewer than make the grouped GEMMs of prefill worth their dequantized copy of
// every routed expert. On the device end to end (inside CUDA graphs), four kernels launched early
// (pdl.cuh):
// - moe_align_kernel sorts the step's slots (token t's j-th expert is slot t * top_k + j) by
//   expert into tiles of `tile` slots, each tile one expert's (a tile's unused places -1);
// - moe_fp4_mma_kernel<.., true> multiplies each tile's tokens by its expert's gate/up rows and
//   writes each slot's activation (bias, rounding and activation as moe_fp4.cu's gate/up);
// - moe_fp4_mma_kernel<.., false> multiplies each slot's activation by its expert's down rows,
//   in f32;
// - moe_combine_kernel sums each token's slots with their routing weights (biases and residual
//   as moe_fp4.cu's down).
// The GEMMs read the codes as they are: a warp takes two 16-row tiles of weights and the tile's
// tokens in groups of 8, one mma.sync m16n8k16 (f16 in, f32 out) a 16-value step. Within a run
// of 32 values lane quad member q takes the run's word q (values 8q .. 8q + 7), decoded to exact
// f16 pairs by fp4x8_pairs, and the input's same 8 values in fp4_input8's order: the two steps of
// a run then pair weights and inputs alike, every step stays inside one run, and its sums are
// scaled by the row's run scale in f32 before they are added up.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "mma.cuh"
#include "moe.cuh"
#include "mxfp4.cuh"
#include "pdl.cuh"
#include "silu.cuh"

namespace {

constexpr int kMmaThreads = 128;     // 4 warps a block
constexpr int kAlignThreads = 1024;  // one block sorts the step
constexpr int kMaxAlignExperts = 256;

// sorted[max_tiles * tile]: the slots of expert e at its tiles' places, in no particular order
// within the expert (each slot's results do not depend on its neighbours), -1 in the unused
// places; tile_expert[max_tiles]: each tile's expert, -1 past the last used tile.
__global__ void __launch_bounds__(kAlignThreads)
    moe_align_kernel(const uint32_t* __restrict__ ids, int slots, int experts, int tile,
                     int max_tiles, int32_t* __restrict__ sorted,
                     int32_t* __restrict__ tile_expert) {
  __shared__ int count[kMaxAlignExperts], first[kMaxAlignExperts], tiles[kMaxAlignExperts];
  wait_for_previous_grid();  // (ids are the routing's)
  let_next_grid_launch();
  for (int e = threadIdx.x; e < experts; e += kAlignThreads) count[e] = 0;
  for (int i = threadIdx.x; i < max_tiles * tile; i += kAlignThreads) sorted[i] = -1;
  for (int t = threadIdx.x; t < max_tiles; t += kAlignThreads) tile_expert[t] = -1;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += kAlignThreads) atomicAdd(&count[ids[s]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    // Each expert's first tile: a running sum of the experts' tiles, 32 experts at a time.
    const int lane = threadIdx.x;
    int before = 0;
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      const int n = e < experts ? (count[e] + tile - 1) / tile : 0;
      int sum = n;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int up = __shfl_up_sync(0xffffffff, sum, d);
        if (lane >= d) sum += up;
      }
      if (e < experts) {
        first[e] = before + sum - n;
        tiles[e] = n;
        count[e] = 0;  // from here, the places each expert has filled
      }
      before += __shfl_sync(0xffffffff, sum, 31);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += kAlignThreads)
    for (int i = 0; i < tiles[e]; ++i) tile_expert[first[e] + i] = e;
  for (int s = threadIdx.x; s < slots; s += kAlignThreads) {
    const int e = ids[s];
    sorted[first[e] * tile + atomicAdd(&count[e], 1)] = s;
  }
}

// The experts' product for the tile blockIdx.y (its expert tile_expert[..], its slots sorted[..]):
// gate/up (kGateUp): a block takes 64 outputs, warp w the gate rows o .. o + 15 (o = 64 x + 16 w)
// and the up rows inner + o .., and writes act[slot, o..] = act(gate + bias, up + bias), each
// rounded to T first; down: a block takes 128 outputs, warp w the rows o .. o + 31 (o = 128 x +
// 32 w), and writes ys[slot, o..] in f32. x's row for a slot: slot / per_row (gate/up: the
// token's input, per_row = top_k; down: the slot's activation, per_row = 1). NT groups of 8 slots
// a tile. Tiles of 8 and 16 slots run 5 blocks an SM (96 registers), tiles of 32 four (128):
// against 4 blocks and 6 / 4 runs ahead, gpt-oss-120b's layer 7-10% faster at 8 to 256 tokens and
// gpt-oss-20b's at 16 to 128 tokens up to 15%; tiles of 32 lost 15% at 5 (one run ahead).
template <typename T, int NT, bool kGateUp>
__global__ void __launch_bounds__(kMmaThreads, NT == 4 ? 4 : 5)
    moe_fp4_mma_kernel(void* __restrict__ out, const T* __restrict__ x,
                       const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                       const T* __restrict__ bias, const int32_t* __restrict__ sorted,
                       const int32_t* __restrict__ tile_expert, int per_row, int n_out,
                       int k_dim, float alpha, float limit) {
  wait_for_previous_grid();  // (the tiles are the align kernel's; down's x is gate/up's output)
  let_next_grid_launch();
  const int tile = blockIdx.y, e = tile_expert[tile];
  if (e < 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int o = kGateUp ? blockIdx.x * 64 + warp * 16 : blockIdx.x * 128 + warp * 32;
  if (o >= n_out) return;
  // Down's second row tile past the last output: computed on the first one's rows, not stored.
  const bool second = kGateUp || o + 16 < n_out;
  const int runs = k_dim / 32;
  const int64_t first_row = (int64_t)e * (kGateUp ? 2 * n_out : n_out) + o + g;
  const int64_t row[2][2] = {
      {first_row, first_row + 8},
      {first_row + (kGateUp ? n_out : second ? 16 : 0),
       first_row + (kGateUp ? n_out : second ? 16 : 0) + 8}};
  // The scales lane q loads for its quad: tile q / 2's row g + 8 (q % 2).
  const uint8_t* my_scales = scales + ((q < 2 ? row[0][0] : row[1][0]) + 8 * (q % 2)) * runs;
  const int* slots = sorted + (int64_t)tile * 8 * NT;
  const T* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int slot = slots[8 * j + g];
    xr[j] = slot >= 0 ? x + (int64_t)(slot / per_row) * k_dim + 8 * q : nullptr;
  }
  float acc[2][NT][4] = {};
  // kAhead runs' codes, scales and inputs loaded before the first is used: enough loads in flight
  // with few warps a step.
  constexpr int kAhead = NT == 1 ? 4 : 2;
  for (int b0 = 0; b0 < runs; b0 += kAhead) {
    // sb[u]: lane q's share of the run's four scale bytes (tile q / 2, row g + 8 (q % 2)).
    uint32_t w[kAhead][2][2], sb[kAhead];
    uint4 xraw[kAhead][NT];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int b = b0 + u < runs ? b0 + u : runs - 1;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          w[u][m][h] = __ldg(reinterpret_cast<const uint32_t*>(codes + row[m][h] * (k_dim / 2) +
                                                               16 * b + 4 * q));
      sb[u] = __ldg(my_scales + b);
#pragma unroll
      for (int j = 0; j < NT; ++j)
        xraw[u][j] = xr[j] != nullptr ? __ldg(reinterpret_cast<const uint4*>(xr[j] + 32 * b))
                                      : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (b0 + u >= runs) break;
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xv[j] = fp4_input8<T>(xraw[u][j]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        // Rows g and g + 8: the word's values (0, 4), (1, 5), (2, 6), (3, 7) as f16 pairs.
        uint32_t p0[4], p1[4];
        fp4x8_pairs(w[u][m][0], p0);
        fp4x8_pairs(w[u][m][1], p1);
        const uint32_t a0[4] = {p0[0], p1[0], p0[1], p1[1]};
        const uint32_t a1[4] = {p0[2], p1[2], p0[3], p1[3]};
        const float s0 = fp4_run_scale(__shfl_sync(0xffffffff, sb[u], (lane & ~3) | (2 * m)));
        const float s1 = fp4_run_scale(__shfl_sync(0xffffffff, sb[u], (lane & ~3) | (2 * m + 1)));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          mma_16816<__half>(d, a0, xv[j].x, xv[j].y);
          mma_16816<__half>(d, a1, xv[j].z, xv[j].w);
          acc[m][j][0] += d[0] * s0;
          acc[m][j][1] += d[1] * s0;
          acc[m][j][2] += d[2] * s1;
          acc[m][j][3] += d[3] * s1;
        }
      }
    }
  }
  // Lane (g, q) holds, for each group j, columns 2q and 2q + 1 of rows g and g + 8 of each tile.
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int slot = slots[8 * j + 2 * q + cc];
      if (slot < 0) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = o + g + 8 * h;
        if constexpr (kGateUp) {
          float gv = acc[0][j][2 * h + cc], uv = acc[1][j][2 * h + cc];
          if (bias != nullptr) {
            gv += to_float(bias[(int64_t)e * 2 * n_out + r]);
            uv += to_float(bias[(int64_t)e * 2 * n_out + n_out + r]);
          }
          const float gate = to_float(from_float<T>(gv)), up = to_float(from_float<T>(uv));
          const float v = alpha > 0.f ? clamped_swiglu(gate, up, alpha, limit) : silu_mul(gate, up);
          reinterpret_cast<T*>(out)[(int64_t)slot * n_out + r] = from_float<T>(v);
        } else {
          float* ys = reinterpret_cast<float*>(out) + (int64_t)slot * n_out;
          ys[r] = acc[0][j][2 * h + cc];
          if (second) ys[r + 16] = acc[1][j][2 * h + cc];
        }
      }
    }
}

// y[t, o] = sum_j weights[t, j] (ys[t top_k + j, o] + bias[ids[t, j], o]) + residual[t, o], as
// moe_fp4.cu's down sums it (the weighted biases and the residual apart, added last), rounded once.
template <typename T>
__global__ void __launch_bounds__(256)
    moe_combine_kernel(T* __restrict__ y, const float* __restrict__ ys,
                       const T* __restrict__ bias, const T* __restrict__ residual,
                       const uint32_t* __restrict__ ids, const float* __restrict__ weights,
                       int top_k, int hidden) {
  wait_for_previous_grid();  // (ys is down's output)
  let_next_grid_launch();
  const int64_t t = blockIdx.y;
  for (int o = blockIdx.x * 256 + threadIdx.x; o < hidden; o += gridDim.x * 256) {
    float acc = 0.f, b = residual != nullptr ? to_float(residual[t * hidden + o]) : 0.f;
    for (int j = 0; j < top_k; ++j) {
      const float w = weights[t * top_k + j];
      acc += w * ys[(t * top_k + j) * hidden + o];
      if (bias != nullptr) b += w * to_float(bias[(int64_t)ids[t * top_k + j] * hidden + o]);
    }
    y[t * hidden + o] = from_float<T>(acc + b);
  }
}

// Slots a tile for a step of `slots` over `experts` (8, 16 or 32: about each used expert's share)
// and the most tiles the step can take.
void tiles_for(int slots, int experts, int* tile, int* max_tiles) {
  const int used = experts < slots ? experts : slots;
  const int share = used > 0 ? (slots + used - 1) / used : 1;
  *tile = share <= 8 ? 8 : share <= 16 ? 16 : 32;
  *max_tiles = (slots + *tile - 1) / *tile + used;
}

struct Fp4MmaArgs {
  void *y, *act;
  float* ys;
  int32_t *sorted, *tile_expert;
  const void* x;
  const uint8_t *gu_codes, *gu_scales;
  const void* gu_bias;
  const uint8_t *d_codes, *d_scales;
  const void *d_bias, *residual;
  const uint32_t* ids;
  const float* weights;
  int tokens, top_k, experts, inner, hidden;
  float alpha, limit;
};

template <typename T, int NT>
int launch_mma(const Fp4MmaArgs& a, int max_tiles, cudaStream_t st) {
  const int slots = a.tokens * a.top_k;
  cudaError_t err = launch_early(moe_align_kernel, dim3(1), dim3(kAlignThreads), 0, st, a.ids,
                                 slots, a.experts, 8 * NT, max_tiles, a.sorted, a.tile_expert);
  if (err == cudaSuccess)
    err = launch_early(moe_fp4_mma_kernel<T, NT, true>, dim3((a.inner + 63) / 64, max_tiles),
                       dim3(kMmaThreads), 0, st, a.act, (const T*)a.x, a.gu_codes, a.gu_scales,
                       (const T*)a.gu_bias, (const int32_t*)a.sorted,
                       (const int32_t*)a.tile_expert, a.top_k, a.inner, a.hidden, a.alpha,
                       a.limit);
  if (err == cudaSuccess)
    err = launch_early(moe_fp4_mma_kernel<T, NT, false>, dim3((a.hidden + 127) / 128, max_tiles),
                       dim3(kMmaThreads), 0, st, (void*)a.ys, (const T*)a.act, a.d_codes,
                       a.d_scales, (const T*)nullptr, (const int32_t*)a.sorted,
                       (const int32_t*)a.tile_expert, 1, a.hidden, a.inner, 0.f, 0.f);
  if (err == cudaSuccess)
    err = launch_early(moe_combine_kernel<T>, dim3((a.hidden + 255) / 256, a.tokens), dim3(256),
                       0, st, (T*)a.y, (const float*)a.ys, (const T*)a.d_bias,
                       (const T*)a.residual, a.ids, a.weights, a.top_k, a.hidden);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

template <typename T>
int launch_by_tile(const Fp4MmaArgs& a, cudaStream_t st) {
  int tile = 0, max_tiles = 0;
  tiles_for(a.tokens * a.top_k, a.experts, &tile, &max_tiles);
  switch (tile) {
    case 8: return launch_mma<T, 1>(a, max_tiles, st);
    case 16: return launch_mma<T, 2>(a, max_tiles, st);
    default: return launch_mma<T, 4>(a, max_tiles, st);
  }
}

}  // namespace

// The scratch a step of `tokens` x `top_k` slots over `experts` needs: *sorted_len i32 places and
// *tiles i32 tile experts (the act and ys scratch: [tokens x top_k, inner] of the dtype and
// [tokens x top_k, hidden] f32).
extern "C" void pagewise_moe_fp4_mma_scratch(int tokens, int top_k, int experts, int* sorted_len,
                                             int* tiles) {
  int tile = 0;
  tiles_for(tokens * top_k, experts, &tile, tiles);
  *sorted_len = tile * *tiles;
}

// y ([tokens, hidden], dtype 1 = f16 or 2 = bf16) = each token's routed experts (ids, weights:
// [tokens, top_k], u32 below `experts` and f32) applied to x ([tokens, hidden]) and summed with
// their weights, as pagewise_moe_gate_up then pagewise_moe_down compute them over MXFP4 stacks
// (gate/up [experts, 2 inner, hidden], gate rows first; down [experts, hidden, inner]), biases
// and residual optional (null), alpha > 0 for the clamped SwiGLU. act, ys, sorted and
// tile_expert: scratch as pagewise_moe_fp4_mma_scratch says. inner and hidden multiples of 32;
// x, act 16-byte aligned. Returns 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_moe_fp4_mma(int dtype, void* y, void* act, float* ys, int32_t* sorted,
                                    int32_t* tile_expert, const void* x, const uint8_t* gu_codes,
                                    const uint8_t* gu_scales, const void* gu_bias,
                                    const uint8_t* d_codes, const uint8_t* d_scales,
                                    const void* d_bias, const void* residual, const uint32_t* ids,
                                    const float* weights, int tokens, int top_k, int experts,
                                    int inner, int hidden, float alpha, float limit,
                                    void* stream) {
  if (tokens == 0) return 0;
  if (inner % 32 != 0 || hidden % 32 != 0 || experts < 1 || experts > kMaxAlignExperts ||
      top_k < 1 || top_k > kMaxTopK || tokens > 65535)
    return 1;
  const Fp4MmaArgs a = {y,     act,      ys,     sorted, tile_expert, x,     gu_codes,
                        gu_scales, gu_bias, d_codes, d_scales, d_bias, residual, ids,
                        weights, tokens, top_k, experts, inner, hidden, alpha, limit};
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch_by_tile<__half>(a, s);
    case 2: return launch_by_tile<__nv_bfloat16>(a, s);
    default: return 1;
  }
}
