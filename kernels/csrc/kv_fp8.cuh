// pagewise: the FP8 KV cache (`--kv-cache-dtype fp8`). A cache's element type C is either the
// model's 16-bit T (values stored as they are) or uint8_t: e4m3 bytes, value x stored as
// e4m3(x / scale) with one scale for a layer's K and one for its V (saturated to +-448, rounded
// to nearest even). The writers store through to_cache; the tensor-core attention kernels copy
// e4m3 tiles into shared memory (half the bytes of 16-bit ones) and widen each landed stage into
// the 16-bit tile their mma code reads (widen_stage), so every value a kernel multiplies is
// T(float(e4m3) * scale), the same whatever the kernel. Included by the kernel files that touch
// the caches.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>
#include "dtype.cuh"

namespace {

// A layer's K and V scales; null where the caches hold T.
struct KvScales {
  float k;
  float v;
};

// Whether cache element C is e4m3 bytes.
template <typename C>
constexpr bool kIsFp8Cache = std::is_same<C, uint8_t>::value;

// The cache element for value y (already rounded to T, as a 16-bit cache would hold it).
template <typename C, typename T>
__device__ __forceinline__ C to_cache(T y, float scale) {
  if constexpr (kIsFp8Cache<C>) {
    // __fdiv_rn: an exact quotient whatever --use_fast_math makes of `/`.
    return (C)__nv_cvt_float_to_fp8(__fdiv_rn(to_float(y), scale), __NV_SATFINITE, __NV_E4M3);
  } else {
    (void)scale;
    return y;
  }
}

// Two floats as one 32-bit pair of T (first in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const T a = from_float<T>(lo), b = from_float<T>(hi);
  return (uint32_t)(*reinterpret_cast<const uint16_t*>(&a)) |
         ((uint32_t)(*reinterpret_cast<const uint16_t*>(&b)) << 16);
}

// Eight e4m3 bytes (byte i is element i) times `scale`, as eight T (one 16-byte word).
template <typename T>
__device__ __forceinline__ uint4 widen8(uint2 raw, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? raw.x : raw.y;
    const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)((word >> (16 * (i % 2))) & 0xffff);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[i] = pack_pair<T>(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A landed stage of e4m3 bytes (the K tile [kRows][D], then the V tile; rows as the cache holds
// them, unswizzled) widened into `dst` as TileCopier stores a 16-bit stage: 16-byte chunk c of
// K row r at chunk c ^ (r % 8), V's too when kSwizzleV. Every thread of the block takes part;
// the caller's barrier publishes `dst`.
template <typename T, int D, int kRows, bool kSwizzleV, int kBlockThreads>
__device__ __forceinline__ void widen_stage(T* dst, const uint8_t* raw, KvScales s) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a T row (8 elements)
  constexpr int kTileChunks = kRows * kChunks;
  for (int i = threadIdx.x; i < 2 * kTileChunks; i += kBlockThreads) {
    const bool is_v = i >= kTileChunks;
    const int j = is_v ? i - kTileChunks : i;
    const int r = j / kChunks, ch = j % kChunks;
    const uint2 w = *reinterpret_cast<const uint2*>(raw + (int64_t)i * 8);
    const int col = (!is_v || kSwizzleV) ? (ch ^ (r & 7)) : ch;
    *reinterpret_cast<uint4*>(dst + (is_v ? kRows * D : 0) + r * D + col * 8) =
        widen8<T>(w, is_v ? s.v : s.k);
  }
}

}  // namespace
