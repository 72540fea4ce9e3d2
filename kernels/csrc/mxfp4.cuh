// pagewise: MXFP4 weights as the kernels read them (moe.cu's expert GEMVs, mxfp4.cu's
// dequantization). A matrix [rows, k] is two arrays: codes, k / 2 bytes a row, value 2i in byte
// i's low nibble and value 2i + 1 in its high nibble (FP4 E2M1: sign, two exponent bits, one
// mantissa bit); scales, k / 32 bytes a row, one E8M0 byte (2^(s - 127)) for each run of 32
// values. A weight is its code's value times its run's scale. Both kernels take a word's codes
// as exact f16 pairs (fp4x8_pairs: table lookups by prmt, no conversion instructions, whose
// throughput is an eighth of an FMA's): the dequantization scales them in f32 (exactly the
// host's values); the GEMVs multiply them with an f16 copy of the input in f16 (exact
// products), sum a word's in f16 and the rest in f32, and scale each run's sum once.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>
#include "dtype.cuh"

namespace {

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

// prmt.b32 (default mode): byte n of the result is byte (c's nibble n & 7) of {b, a}, or, where
// that nibble's bit 3 is set, that byte's sign bit replicated.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The f16 high bytes of the FP4 magnitudes 0..3 and 4..7 (0, 0.5, 1, 1.5 and 2, 3, 4, 6); their
// low bytes are all 0, and so are their sign bits.
constexpr uint32_t kFp4HalfLo = 0x3E3C3800u, kFp4HalfHi = 0x46444240u;

// The 8 codes of a 32-bit word (u's nibble k holds value k) as four f16 pairs, exact: pair k holds
// values k and k + 4, whose sign bits (u's bits 4k + 3 and 4k + 19) land on bits 15 and 31 with one
// shift. A table lookup (prmt) gives the magnitudes' high bytes; a second prmt spreads two of them
// over a pair, its zero bytes the replicated sign of a looked-up byte (never set).
__device__ __forceinline__ void fp4x8_pairs(uint32_t u, uint32_t h[4]) {
  const uint32_t mag = u & 0x77777777u;
  const uint32_t lo = prmt(kFp4HalfLo, kFp4HalfHi, mag), hi = prmt(kFp4HalfLo, kFp4HalfHi, mag >> 16);
  h[0] = prmt(lo, hi, 0x4808u) | ((u << 12) & 0x80008000u);
  h[1] = prmt(lo, hi, 0x5818u) | ((u << 8) & 0x80008000u);
  h[2] = prmt(lo, hi, 0x6828u) | ((u << 4) & 0x80008000u);
  h[3] = prmt(lo, hi, 0x7838u) | (u & 0x80008000u);
}

// A run's scale 2^(s - 127) as f32 bits (0 for s = 0, whose 2^-127 f32 flushes anyway).
__device__ __forceinline__ float fp4_run_scale(uint32_t s) { return __uint_as_float(s << 23); }

// The staged input of the MXFP4 GEMVs: f16, each 8 values in the order 0, 4, 1, 5, 2, 6, 3, 7 (as
// fp4x8_pairs pairs the weights). Converts 8 values of T.
template <typename T>
__device__ __forceinline__ uint4 fp4_input8(uint4 raw) {
  const T* v = reinterpret_cast<const T*>(&raw);
  uint4 out;
  __half2* o = reinterpret_cast<__half2*>(&out);
#pragma unroll
  for (int k = 0; k < 4; ++k) o[k] = __floats2half2_rn(to_float(v[k]), to_float(v[k + 4]));
  return out;
}

// Where the GEMVs stage input piece p (values 8p .. 8p + 7: piece p % 4 of run p / 4) of a
// sequence of `runs` runs: piece-major (all runs' first pieces, then their second, ...), so the
// lanes of consecutive runs read consecutive 16-byte pieces at once, which no two lanes' reads
// share a bank in. Returns the element offset.
__device__ __forceinline__ int fp4_staged_at(int p, int runs) {
  return ((p & 3) * runs + (p >> 2)) * 8;
}

// The dot product of a run with its 32 staged inputs (fp4_input8's order and fp4_staged_at's
// places: piece c at x + c * stride, in shared memory): a word's 8 products summed in f16 pairs
// (exact products; at most 4 terms a half, so inputs up to 2730 in magnitude cannot overflow),
// the words' sums in f32, times the run's scale.
__device__ __forceinline__ float fp4_run_dot(Fp4Run run, const __half* x, int stride) {
  const uint32_t words[4] = {run.codes.x, run.codes.y, run.codes.z, run.codes.w};
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint4 xraw = *reinterpret_cast<const uint4*>(x + c * stride);
    const __half2* xv = reinterpret_cast<const __half2*>(&xraw);
    uint32_t w[4];
    fp4x8_pairs(words[c], w);
    const __half2* wv = reinterpret_cast<const __half2*>(w);
    __half2 sum = __hmul2(wv[0], xv[0]);
#pragma unroll
    for (int k = 1; k < 4; ++k) sum = __hfma2(wv[k], xv[k], sum);
    const float2 f = __half22float2(sum);
    acc += f.x + f.y;
  }
  return acc * fp4_run_scale(run.scale);
}

}  // namespace
