// pagewise: the weights the decode GEMVs stream (gemv.cu, o_router.cu): dense rows in the
// activations' dtype, FP8 (e4m3) rows with f32 scales, one per block of bn rows x bk columns (one
// scale per tensor, per row, or per 128 x 128 block are all such blocks), or 4-bit integer rows
// with an f16 scale and zero point per group of columns (AWQ, GPTQ, compressed-tensors W4A16,
// repacked at load). A kernel takes the weight as a value of one of these types and calls
// dot_weight, overloaded on it.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <type_traits>
#include "dtype.cuh"
#include "gemv_affine.cuh"
#include "gemv_rows.cuh"

namespace {

// Rows of T, [out, k] row-major.
template <typename T>
struct DenseWeight {
  const T* w;
};

// e4m3 rows [out, k] (k a multiple of 16) times their scales: element (o, c) is
// w[o, c] * s[(o / bn) * sk + c / (1 << bk_shift)], sk = ceil(k / bk): bk a power of two of at
// least 16, or (bk_shift < 0) at least k, one scale a row.
struct Fp8Weight {
  const uint8_t* w;
  const float* s;
  int bn, bk_shift, sk;
};

// 4-bit codes q [out, k] (k a multiple of 32), 8 a 32-bit word, with an f16 scale s and zero
// point z per row and group of 2^g_shift columns (g_shift < 0: one group a row): element (o, c)
// is s * (q - z) for (s, z) = sz[o * groups + (c >> g_shift)]. Word j of a row holds columns
// 8j..8j+7, column 8j + 2i in nibble i and 8j + 2i + 1 in nibble 4 + i (bits 4i and 16 + 4i:
// AutoAWQ's order), so that one mask takes two neighbouring columns into the halves of a half2.
struct Int4Weight {
  const uint32_t* w;
  const __half2* sz;
  int g_shift, groups;
};

// The same codes in tiles of 16 rows x 64 columns for the tensor cores: 512 bytes a tile, row
// tiles in order and each one's column tiles in order; lane l's 16 bytes of a tile at 16 l, its
// word m covering the tile's columns 16m..16m + 15 as lane l's share of an m16n8k16 A fragment:
// for g = l / 4, t = l % 4, the column pairs starting at (row g, column 2t), (g + 8, 2t),
// (g, 2t + 8), (g + 8, 2t + 8) in nibbles (0, 4), (1, 5), (2, 6), (3, 7). out a multiple of 16,
// k of 64, groups whole rows or a power of two of at least 64 columns (one group a 16-byte
// load).
struct Int4Tiles {
  const uint4* w;
  const __half2* sz;
  int g_shift, groups;
};

// The (weight kind) of the entry points' weight arguments: w in the activations' dtype; e4m3
// with f32 block scales; 4-bit codes with (scale, zero) f16 pairs, row by row (Int4Weight) or in
// tiles (Int4Tiles); 4-bit or byte codes with (scale, offset) f16 pairs (gemv_affine.cuh).
enum WeightKind {
  kDenseWeight = 0,
  kFp8Weight = 1,
  kInt4Weight = 2,
  kInt4Tiles = 3,
  kAffine4 = 4,
  kAffine8 = 5
};

// log2(bk) for a power of two, else -1.
inline int log2_exact(int bk) {
  int shift = 0;
  while ((1 << shift) < bk && shift < 30) ++shift;
  return (1 << shift) == bk ? shift : -1;
}

// The Fp8Weight of e4m3 rows `w` of k_dim columns with scales `s` over blocks of bn x bk.
inline Fp8Weight fp8_weight(const void* w, const float* s, int bn, int bk, int k_dim) {
  return Fp8Weight{reinterpret_cast<const uint8_t*>(w), s, bn, bk >= k_dim ? -1 : log2_exact(bk),
                   (k_dim + bk - 1) / bk};
}

// Whether FP8 weights of k_dim columns in blocks of bn x bk are what Fp8Weight takes.
inline bool fp8_weight_fits(int k_dim, int bn, int bk) {
  return k_dim % 16 == 0 && bn > 0 && bk > 0 &&
         (bk >= k_dim || (bk >= 16 && log2_exact(bk) >= 0));
}

// The Int4Weight of codes `w` of k_dim columns with (scale, zero) pairs `sz` over groups of
// `group` columns (group >= k_dim: one a row).
inline Int4Weight int4_weight(const void* w, const void* sz, int group, int k_dim) {
  const int shift = group >= k_dim ? -1 : log2_exact(group);
  return Int4Weight{reinterpret_cast<const uint32_t*>(w), reinterpret_cast<const __half2*>(sz),
                    shift, shift < 0 ? 1 : k_dim >> shift};
}

// Whether 4-bit weights of k_dim columns in groups of `group` are what Int4Weight takes.
inline bool int4_weight_fits(int k_dim, int group) {
  return k_dim % 32 == 0 && group > 0 && (group >= k_dim || (group >= 32 && log2_exact(group) >= 0));
}

// The Int4Tiles of codes `w` in tiles of an [out, k_dim] weight with (scale, zero) pairs `sz`
// over groups of `group` columns (group >= k_dim: one a row).
inline Int4Tiles int4_tiles(const void* w, const void* sz, int group, int k_dim) {
  const int shift = group >= k_dim ? -1 : log2_exact(group);
  return Int4Tiles{reinterpret_cast<const uint4*>(w), reinterpret_cast<const __half2*>(sz), shift,
                   shift < 0 ? 1 : k_dim >> shift};
}

// Whether 4-bit tiles of an [out_dim, k_dim] weight in groups of `group` fit Int4Tiles.
inline bool int4_tiles_fit(int out_dim, int k_dim, int group) {
  return out_dim % 16 == 0 && k_dim % 64 == 0 && group > 0 &&
         (group >= k_dim || (group >= 64 && log2_exact(group) >= 0));
}

// Whether the weight of `kind` (WeightKind) with these scale blocks or groups fits its type.
inline bool weight_fits(int kind, int out_dim, int k_dim, int block_rows, int block_cols) {
  switch (kind) {
    case kDenseWeight: return true;
    case kFp8Weight: return fp8_weight_fits(k_dim, block_rows, block_cols);
    case kInt4Weight: return int4_weight_fits(k_dim, block_cols);
    case kInt4Tiles: return int4_tiles_fit(out_dim, k_dim, block_cols);
    case kAffine4: return affine_weight_fits(4, k_dim, block_cols);
    case kAffine8: return affine_weight_fits(8, k_dim, block_cols);
    default: return false;
  }
}

// dot_rows for the dense rows o[0..N) (each below the weight's rows).
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const DenseWeight<T>& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const T* rows[N];
#pragma unroll
  for (int n = 0; n < N; ++n) rows[n] = wt.w + (int64_t)o[n] * k_dim;
  dot_rows<T, R, N, S>(acc, rows, xs, k_dim, lane, part);
}

// 16 e4m3 values (one 16-byte load) as floats.
__device__ __forceinline__ void fp8x16_to_float(const uint4& raw, float (&f)[16]) {
  const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(p[j], __NV_E4M3);
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h));
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}

// The sums of 16 e4m3 values (one 16-byte load, `raw`) with the staged rows' same 16 values at
// xs + k, added to part[r].
template <typename T, int R>
__device__ __forceinline__ void fp8_run(float (&part)[R], const uint4& raw, const T* xs, int k_dim,
                                        int k) {
  float wf[16];
  fp8x16_to_float(raw, wf);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const uint4 xa = *reinterpret_cast<const uint4*>(xs + r * k_dim + k);
    const uint4 xb = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8);
    const T* va = reinterpret_cast<const T*>(&xa);
    const T* vb = reinterpret_cast<const T*>(&xb);
    float p = part[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) p += wf[j] * to_float(va[j]);
#pragma unroll
    for (int j = 0; j < 8; ++j) p += wf[8 + j] * to_float(vb[j]);
    part[r] = p;
  }
}

// dot_rows for FP8 rows: a lane takes 16 values a load (every S-th run of 512 values with S
// warps an output). With one scale a row the sums are scaled once at the end; with blocks of
// columns each run of 16 is scaled by its block's before it is added. The warp's lanes are then
// summed as dot_rows sums them.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Fp8Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 16;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint8_t* row = wt.w + (int64_t)o[n] * k_dim;
    const float* scales = wt.s + (int64_t)(o[n] / wt.bn) * wt.sk;
    if (wt.bk_shift < 0) {
#pragma unroll 4
      for (int k = first; k < k_dim; k += S * 32 * 16)
        fp8_run<T, R>(acc[n], __ldg(reinterpret_cast<const uint4*>(row + k)), xs, k_dim, k);
      const float sc = __ldg(scales);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[n][r] *= sc;
    } else {
#pragma unroll 4
      for (int k = first; k < k_dim; k += S * 32 * 16) {
        float run[R] = {};
        fp8_run<T, R>(run, __ldg(reinterpret_cast<const uint4*>(row + k)), xs, k_dim, k);
        const float sc = __ldg(scales + (k >> wt.bk_shift));
#pragma unroll
        for (int r = 0; r < R; ++r) acc[n][r] += run[r] * sc;
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// dot_rows for 4-bit rows: a lane takes 32 columns a load (one 16-byte load, inside one group:
// every S-th run of 1024 columns with S warps an output), each word's 8 codes made halves
// 1024 + q by one mask and OR each pair, less 1024 + z (exact), summed with the staged rows in
// f32 and scaled by the group's scale once a load. The warp's lanes are summed as dot_rows sums
// them.
template <typename T, int R, int N, int S>
__device__ __forceinline__ void dot_weight(float (&acc)[N][R], const Int4Weight& wt,
                                           const int (&o)[N], const T* xs, int k_dim, int lane,
                                           int part) {
  const int first = (part * 32 + lane) * 32;
  const __half k1024 = __float2half(1024.f);
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
    const uint32_t* row = wt.w + (int64_t)o[n] * (k_dim / 8);
    const __half2* sz = wt.sz + (int64_t)o[n] * wt.groups;
#pragma unroll 2
    for (int k = first; k < k_dim; k += S * 32 * 32) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + k / 8));
      const __half2 g = __ldg(sz + (wt.g_shift < 0 ? 0 : k >> wt.g_shift));
      const __half2 bias = __half2half2(__hadd(__high2half(g), k1024));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      float run[R] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t bits = ((words[j] >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
          const float2 f = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&bits), bias));
          wf[2 * i] = f.x;
          wf[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4 xraw = *reinterpret_cast<const uint4*>(xs + r * k_dim + k + 8 * j);
          const T* xv = reinterpret_cast<const T*>(&xraw);
          float p = run[r];
#pragma unroll
          for (int e = 0; e < 8; ++e) p += wf[e] * to_float(xv[e]);
          run[r] = p;
        }
      }
      const float scale = __low2float(g);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[n][r] += run[r] * scale;
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[n][r] += __shfl_xor_sync(0xffffffff, acc[n][r], s);
}

// y[r, o] = sum_k xs[r, k] * w[o, k] (w a DenseWeight<T>, an Fp8Weight or an Int4Weight) (+ residual[r, o], added to the product rounded to T as the
// unfused add would see it) for the R rows the block staged in xs: its warps take outputs in
// rounds of warps / S (S warps an output, see dot_rows), block `block` of `blocks` stepping by
// the grid's.
template <typename T, int R, bool kAdd, int S, int kT, typename W>
__device__ __forceinline__ void gemv_outputs(T* __restrict__ y, const T* xs, const W& w,
                                             const T* __restrict__ residual, int out_dim,
                                             int k_dim, int block, int blocks) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kPerBlock = kT / 32 / S;
  for (int base = block * kPerBlock; base < out_dim; base += blocks * kPerBlock) {
    const int o = base + warp / S;
    float acc[1][R] = {};
    // The residual the storing lane adds, loaded before the dot products so its latency hides
    // behind them.
    T res[R];
    if constexpr (kAdd)
#pragma unroll
      for (int r = 0; r < R; ++r)
        res[r] = lane == 0 && warp % S == 0 && o < out_dim ? residual[(int64_t)r * out_dim + o]
                                                           : from_float<T>(0.f);
    if (o < out_dim) {
      const int os[1] = {o};
      dot_weight<T, R, 1, S>(acc, w, os, xs, k_dim, lane, warp % S);
    }
    if (!merge_split<R, 1, S, kT>(acc, warp, lane) || o >= out_dim || lane != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t at = (int64_t)r * out_dim + o;
      float v = acc[0][r];
      if constexpr (kAdd) v = to_float(from_float<T>(v)) + to_float(res[r]);
      y[at] = from_float<T>(v);
    }
  }
}


// Warps that share a tile of Int4Tiles' GEMV, each taking every kTileParts-th 64-column chunk of
// it: a constant, so an output's sum has the same order at every batch size and block size.
constexpr int kTileParts = 16;

// The m16n8k16 tensor-core product d += a b of 16-bit a and b (f16 or bf16 as T), f32 sums.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A code's value as T with an offset m (the exponent bits of m, OR-ed with a code below 16, make
// m + q exactly): m = 1024 for f16, 128 for bf16.
template <typename T>
struct Int4Magic {
  static constexpr uint32_t kBits = std::is_same_v<T, __half> ? 0x64006400u : 0x43004300u;
  static constexpr float kValue = std::is_same_v<T, __half> ? 1024.f : 128.f;
};

// Two copies of m + z (exact) as a T pair, for the zero point z of a (scale, zero) pair.
template <typename T>
__device__ __forceinline__ uint32_t int4_bias(__half2 pair) {
  const T b = from_float<T>(Int4Magic<T>::kValue + __high2float(pair));
  const uint16_t u = *reinterpret_cast<const uint16_t*>(&b);
  return (uint32_t)u | (uint32_t)u << 16;
}

// (m + q) - (m + z) = q - z, exactly, for the two codes of `bits` (magic OR-ed in).
template <typename T>
__device__ __forceinline__ uint32_t int4_pair_minus(uint32_t bits, uint32_t bias) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&bits),
                              *reinterpret_cast<const __half2*>(&bias));
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&bits),
                                     *reinterpret_cast<const __nv_bfloat162*>(&bias));
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// gemv_outputs for 4-bit tiles: a block takes kT / 32 / kTileParts tiles of 16 outputs a round;
// a tile's kTileParts warps each take every kTileParts-th chunk of 64 columns (one 16-byte load a
// lane), dequantize it to T in registers (q - z exactly) and multiply it with the staged rows on
// the tensor cores (B's column n is staged row n; columns past R repeat row 0 and are dropped),
// scaling each chunk's f32 sums by its group's scale. The parts meet in shared memory in warp
// order.
template <typename T, int R, bool kAdd, int S, int kT>
__device__ __forceinline__ void gemv_outputs(T* __restrict__ y, const T* xs, const Int4Tiles& w,
                                             const T* __restrict__ residual, int out_dim,
                                             int k_dim, int block, int blocks) {
  static_assert(kT % (32 * kTileParts) == 0, "a block holds whole tiles");
  constexpr int kTiles = kT / 32 / kTileParts;
  __shared__ float parts[kT / 32][16][R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int part = warp % kTileParts, chunks = k_dim / 64, tiles = out_dim / 16;
  const T* x_col = xs + (g < R ? g : 0) * k_dim + 2 * t;
  for (int base = block * kTiles; base < tiles; base += blocks * kTiles) {
    const int tile = base + warp / kTileParts;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (tile < tiles) {
      const uint4* tw = w.w + (int64_t)tile * chunks * 32 + lane;
      const __half2* p0 = w.sz + (int64_t)(tile * 16 + g) * w.groups;
      const __half2* p8 = p0 + 8 * w.groups;
#pragma unroll 4
      for (int c = part; c < chunks; c += kTileParts) {
        const uint4 raw = __ldg(tw + c * 32);
        const int grp = w.g_shift < 0 ? 0 : (c * 64) >> w.g_shift;
        const __half2 z0 = __ldg(p0 + grp), z8 = __ldg(p8 + grp);
        const uint32_t bias0 = int4_bias<T>(z0), bias8 = int4_bias<T>(z8);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          uint32_t a[4];
#pragma unroll
          for (int p = 0; p < 4; ++p)
            a[p] = int4_pair_minus<T>(((words[m] >> (4 * p)) & 0x000F000Fu) | Int4Magic<T>::kBits,
                                      p & 1 ? bias8 : bias0);
          const T* xc = x_col + c * 64 + m * 16;
          mma_16816<T>(d, a, *reinterpret_cast<const uint32_t*>(xc),
                       *reinterpret_cast<const uint32_t*>(xc + 8));
        }
        const float s0 = __low2float(z0), s8 = __low2float(z8);
        acc[0] += d[0] * s0;
        acc[1] += d[1] * s0;
        acc[2] += d[2] * s8;
        acc[3] += d[3] * s8;
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
