// pagewise: MXFP4 weights as the kernels read them (moe.cu's expert GEMVs, mxfp4.cu's
// dequantization). A matrix [rows, k] is two arrays: codes, k / 2 bytes a row, value 2i in byte
// i's low nibble and value 2i + 1 in its high nibble (FP4 E2M1: sign, two exponent bits, one
// mantissa bit); scales, k / 32 bytes a row, one E8M0 byte (2^(s - 127)) for each run of 32
// values. A weight is its code's value times its run's scale, exactly what the host's
// dequantization gives; the GEMVs sum a run's products unscaled and scale the run's sum.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

// A run's scale times 2^14 (which fp4x8's codes are short of): 2^(s - 113) as f32 bits. Exact for
// s <= 240; the loader refuses larger scales.
__device__ __forceinline__ float fp4_scale(uint8_t s) {
  return __uint_as_float((uint32_t)(s + 14) << 23);
}

// Two codes (bits 0-3 and 16-19 of v, the rest zero) as an f16 pair, each 2^-14 times the code's
// value: the exponent and mantissa bits go to f16 bits 9-11 (codes 0 and 1, 0 and 0.5, become
// f16 subnormals, which the conversion to f32 keeps), the sign to bit 15.
__device__ __forceinline__ float2 fp4x2_scaled(uint32_t v, float scale) {
  const uint32_t h = ((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return make_float2(f.x * scale, f.y * scale);
}

// The 8 values of a 32-bit word of codes (u's byte i holds values 2i and 2i + 1), each times
// `scale` (a fp4_scale).
__device__ __forceinline__ void fp4x8(uint32_t u, float scale, float w[8]) {
  const uint32_t lo = u & 0x0F0F0F0Fu, hi = (u >> 4) & 0x0F0F0F0Fu;
  // Bytes 0 and 1 (values 0 and 2 from the low nibbles, 1 and 3 from the high ones), then 2 and 3.
  const float2 a = fp4x2_scaled(__byte_perm(lo, 0, 0x4140), scale);
  const float2 b = fp4x2_scaled(__byte_perm(hi, 0, 0x4140), scale);
  const float2 c = fp4x2_scaled(__byte_perm(lo, 0, 0x4342), scale);
  const float2 d = fp4x2_scaled(__byte_perm(hi, 0, 0x4342), scale);
  w[0] = a.x, w[1] = b.x, w[2] = a.y, w[3] = b.y;
  w[4] = c.x, w[5] = d.x, w[6] = c.y, w[7] = d.y;
}

// One run of 32 weights: its 16 bytes of codes and its scale byte.
struct Fp4Run {
  uint4 codes;
  uint32_t scale;
};

// Run b of an MXFP4 row (`codes`, `scales` at its start), loaded through the read-only path.
__device__ __forceinline__ Fp4Run fp4_run(const uint8_t* __restrict__ codes,
                                          const uint8_t* __restrict__ scales, int b) {
  return {*reinterpret_cast<const uint4*>(codes + 16 * b), scales[b]};
}

// The dot product of a run with the 32 values at x (16-byte aligned, in shared memory), scaled:
// the run's codes times x summed in f32, times the run's scale. The lane reads x's four 16-byte
// pieces in the order rot, rot + 1, ... (mod 4): lanes of consecutive runs with rot =
// (lane / 2) % 4 then read 8 different bank groups at once, where reading in order would read
// two 4 times over.
template <typename T>
__device__ __forceinline__ float fp4_run_dot(Fp4Run run, const T* x, int rot) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = (i + rot) & 3;
    const uint32_t u = c == 0 ? run.codes.x : c == 1 ? run.codes.y : c == 2 ? run.codes.z : run.codes.w;
    const uint4 xraw = *reinterpret_cast<const uint4*>(x + 8 * c);
    const T* xv = reinterpret_cast<const T*>(&xraw);
    float w[8];
    fp4x8(u, 1.f, w);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += w[j] * to_float(xv[j]);
  }
  return acc * fp4_scale((uint8_t)run.scale);
}

}  // namespace
