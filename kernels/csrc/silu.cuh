// pagewise: SiLU(gate) * up, the one formula of the SiLU-and-mul kernel (fused.cu) and of the GEMV
// that folds it into its input (gemv.cu): their outputs must agree bit for bit. Included by both.
// Also Gemma's GeGLU (GELU by its tanh approximation, times up) and gpt-oss's clamped SwiGLU.
#pragma once
#include <stdint.h>
#include "dtype.cuh"

namespace {

__device__ __forceinline__ float silu_mul(float gate, float up) {
  return gate / (1.f + __expf(-gate)) * up;
}

// silu(gate) * up over 16 bytes of T (f16 / bf16: 8 elements), rounded to T.
template <typename T>
__device__ __forceinline__ uint4 silu_mul16(uint4 gate, uint4 up) {
  const T* g = reinterpret_cast<const T*>(&gate);
  const T* u = reinterpret_cast<const T*>(&up);
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int j = 0; j < (int)(16 / sizeof(T)); ++j)
    o[j] = from_float<T>(silu_mul(to_float(g[j]), to_float(u[j])));
  return out;
}

// GeGLU: gelu_tanh(gate), rounded to T as the separate GELU kernel stores it, times up. GELU's
// tanh approximation: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
template <typename T>
__device__ __forceinline__ float gelu_tanh_mul(float gate, float up) {
  const float inner = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
  const float gelu = to_float(from_float<T>(0.5f * gate * (1.f + tanhf(inner))));
  return gelu * up;
}

// gelu_tanh(gate) * up over 16 bytes of T (f16 / bf16: 8 elements), rounded to T.
template <typename T>
__device__ __forceinline__ uint4 gelu_tanh_mul16(uint4 gate, uint4 up) {
  const T* g = reinterpret_cast<const T*>(&gate);
  const T* u = reinterpret_cast<const T*>(&up);
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int j = 0; j < (int)(16 / sizeof(T)); ++j)
    o[j] = from_float<T>(gelu_tanh_mul<T>(to_float(g[j]), to_float(u[j])));
  return out;
}

// gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit),
// (u + 1) * g * sigmoid(alpha * g).
__device__ __forceinline__ float clamped_swiglu(float gate, float up, float alpha, float limit) {
  const float g = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return (u + 1.f) * g / (1.f + __expf(-alpha * g));
}

}  // namespace
