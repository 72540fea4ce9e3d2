// pagewise: a token's routing by one warp (softmax over the router's f32 logits, the top-k with
// ties to the lower expert), shared by moe_route_kernel (moe_route.cu) and the expert slices that
// route their own token (moe_slices.cu), so both pick the same experts and weights bit for bit.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "moe.cuh"

namespace {

// Most experts a token may be routed among: each lane keeps its share of the probabilities in
// registers (kPerLane each).
constexpr int kPerLane = 8;
constexpr int kMaxExperts = 32 * kPerLane;

// One token's routing by a whole warp: softmax over the `experts` (at most kMaxExperts) f32
// logits of `row` times `scale` (1, or the norm's 1 / rms for logits from o_router.cu), the
// top_k (at most 32) largest probabilities (on a tie the lower expert), divided by their own sum
// when `renormalize` else by the softmax's. Lane j gets the j-th pick in
// `id` and `weight` (lanes past top_k: expert 0, weight 0). Lane l holds the probabilities of
// experts l, l + 32, ...
__device__ __forceinline__ void route_token(const float* row, float scale, int experts, int top_k,
                                            int renormalize, int lane, int& id, float& weight) {
  float p[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < experts ? row[e] * scale : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, s));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    // (Past `experts`: exp(-inf) = 0, then struck out so it is never chosen.)
    p[i] = lane + 32 * i < experts ? expf(p[i] - mx) : -1.f;
    sum += fmaxf(p[i], 0.f);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, s);
  // Each candidate as an unsigned key that orders as its probability: a probability's bits plus
  // one (non-negative floats order as their bits), 0 once struck out. A pick is the warp's
  // largest key, then the lowest expert that holds it: two warp reductions (sm_80 and up, as
  // the whole library: the decode kernels' cp.async and mma.sync need it too).
  unsigned key[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) key[i] = p[i] >= 0.f ? __float_as_uint(p[i]) + 1u : 0u;
  float picked = 0.f;
  id = 0;
  weight = 0.f;
  for (int j = 0; j < top_k; ++j) {
    unsigned mine = 0u;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) mine = max(mine, key[i]);
    const unsigned top = __reduce_max_sync(0xffffffffu, mine);
    unsigned lowest = 0xffffffffu;
#pragma unroll
    for (int i = kPerLane - 1; i >= 0; --i)
      if (top > 0u && key[i] == top) lowest = lane + 32 * i;
    const unsigned pick = __reduce_min_sync(0xffffffffu, lowest);
    const int best_e = top > 0u ? (int)pick : experts;
    const float best = top > 0u ? __uint_as_float(top - 1u) : -1.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (best_e == lane + 32 * i) key[i] = 0u;
    if (lane == j) {
      id = best_e;
      weight = best;
    }
    picked += best;
  }
  static_assert(kMaxTopK <= 32, "a lane a pick");
  weight /= renormalize ? picked : sum;
}

}  // namespace
