// pagewise: 4-bit affine codes (gemv_affine.cuh) in Int4Tiles' layout, multiplied on the tensor
// cores (included at the end of gemv_weight.cuh, after the tile helpers it shares with
// Int4Tiles).
#pragma once

namespace {

// 4-bit codes in Int4Tiles' layout (out a multiple of 16, k of 64) with (scale, offset) f16
// pairs as Affine4Weight's, over groups of a power of two of at least 32 columns or whole rows.
struct Affine4Tiles {
  const uint4* w;
  const __half2* sb;
  int g_shift, groups;
};

inline Affine4Tiles affine4_tiles(const void* w, const void* sb, int group, int k_dim) {
  const int2 g = affine_groups(group, k_dim);
  return Affine4Tiles{reinterpret_cast<const uint4*>(w), reinterpret_cast<const __half2*>(sb),
                      g.x, g.y};
}

// gemv_outputs for affine tiles: as Int4Tiles' (kTileParts warps a tile, a 64-column chunk a
// load), with the codes made T values q exactly and each 32-column half of a chunk (one group)
// summed apart: s times the tensor-core product with the staged rows, plus b times the rows'
// sums of those columns (the product of an A fragment of ones with the same B).
template <typename T, int R, bool kAdd, int S, int kT>
__device__ __forceinline__ void gemv_outputs(T* __restrict__ y, const T* xs,
                                             const Affine4Tiles& w,
                                             const T* __restrict__ residual, int out_dim,
                                             int k_dim, int block, int blocks) {
  static_assert(kT % (32 * kTileParts) == 0, "a block holds whole tiles");
  constexpr int kTiles = kT / 32 / kTileParts;
  __shared__ float parts[kT / 32][16][R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int part = warp % kTileParts, chunks = k_dim / 64, tiles = out_dim / 16;
  const T* x_col = xs + (g < R ? g : 0) * k_dim + 2 * t;
  const T one = from_float<T>(1.f);
  const uint32_t one2 = (uint32_t)*reinterpret_cast<const uint16_t*>(&one) * 0x10001u;
  const uint32_t ones[4] = {one2, one2, one2, one2};
  for (int base = block * kTiles; base < tiles; base += blocks * kTiles) {
    const int tile = base + warp / kTileParts;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (tile < tiles) {
      const uint4* tw = w.w + (int64_t)tile * chunks * 32 + lane;
      const __half2* p0 = w.sb + (int64_t)(tile * 16 + g) * w.groups;
      const __half2* p8 = p0 + 8 * w.groups;
#pragma unroll 2
      for (int c = part; c < chunks; c += kTileParts) {
        const uint4 raw = __ldg(tw + c * 32);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int grp = w.g_shift < 0 ? 0 : (c * 64 + 32 * h) >> w.g_shift;
          const float2 s0 = __half22float2(__ldg(p0 + grp)), s8 = __half22float2(__ldg(p8 + grp));
          float dq[4] = {0.f, 0.f, 0.f, 0.f}, dx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int m = 2 * h; m < 2 * h + 2; ++m) {
            uint32_t a[4];
#pragma unroll
            for (int p = 0; p < 4; ++p)
              a[p] = int4_pair_minus<T>(((words[m] >> (4 * p)) & 0x000F000Fu) | Int4Magic<T>::kBits,
                                        Int4Magic<T>::kBits);
            const T* xc = x_col + c * 64 + m * 16;
            const uint32_t b0 = *reinterpret_cast<const uint32_t*>(xc);
            const uint32_t b1 = *reinterpret_cast<const uint32_t*>(xc + 8);
            mma_16816<T>(dq, a, b0, b1);
            mma_16816<T>(dx, ones, b0, b1);
          }
          acc[0] += dq[0] * s0.x + dx[0] * s0.y;
          acc[1] += dq[1] * s0.x + dx[1] * s0.y;
          acc[2] += dq[2] * s8.x + dx[2] * s8.y;
          acc[3] += dq[3] * s8.x + dx[3] * s8.y;
        }
      }
    }
    // This lane's sums: rows g and g + 8 of the tile, staged rows 2t and 2t + 1.
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (2 * t + j < R) {
        parts[warp][g][2 * t + j] = acc[j];
        parts[warp][g + 8][2 * t + j] = acc[2 + j];
      }
    __syncthreads();
    const int first = warp - part, row = (threadIdx.x - first * 32) / R,
              r = (threadIdx.x - first * 32) % R;
    if (threadIdx.x - first * 32 < 16 * R && tile < tiles) {
      float v = 0.f;
#pragma unroll
      for (int p = 0; p < kTileParts; ++p) v += parts[first + p][row][r];
      const int o = tile * 16 + row;
      const int64_t at = (int64_t)r * out_dim + o;
      if constexpr (kAdd) v = to_float(from_float<T>(v)) + to_float(residual[at]);
      y[at] = from_float<T>(v);
    }
    __syncthreads();
  }
}

}  // namespace
