// pagewise: MXFP4 experts (mxfp4.cuh) dequantized on the device, for the steps that multiply them
// with grouped GEMMs (prefill and large batches): only the experts the step routes to, into the
// same places of a dense stack, so the GEMMs index it as they index dense experts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "mxfp4.cuh"

namespace {

constexpr int kThreads = 256;

// out[e] = the values of expert e = experts[blockIdx.y] (`per_expert` values, a multiple of 32:
// whole rows of whole runs), a thread taking 8 values (one word of codes) at a time.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    mxfp4_dequant_kernel(T* __restrict__ out, const uint8_t* __restrict__ codes,
                         const uint8_t* __restrict__ scales, const uint32_t* __restrict__ experts,
                         int64_t per_expert) {
  const int64_t base = (int64_t)experts[blockIdx.y] * per_expert;
  const int64_t words = per_expert / 8;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < words;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t v = base + i * 8;
    uint32_t h[4];  // (pair k: values k and k + 4)
    fp4x8_pairs(__ldg(reinterpret_cast<const uint32_t*>(codes + v / 2)), h);
    const float scale = fp4_run_scale(__ldg(scales + v / 32));
    uint4 packed;
    T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[k]));
      o[k] = from_float<T>(f.x * scale), o[k + 4] = from_float<T>(f.y * scale);
    }
    *reinterpret_cast<uint4*>(out + v) = packed;
  }
}

template <typename T>
int launch(void* out, const uint8_t* codes, const uint8_t* scales, const uint32_t* experts,
           int count, int64_t per_expert, cudaStream_t stream) {
  const int64_t words = per_expert / 8;
  int64_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks > 1024) blocks = 1024;  // a grid of 1024 x count blocks streams well on any GPU
  mxfp4_dequant_kernel<T><<<dim3((unsigned)blocks, count), kThreads, 0, stream>>>(
      (T*)out, codes, scales, experts, per_expert);
  return (int)cudaGetLastError();
}

}  // namespace

// out ([experts, per_expert] of dtype 1 = f16 or 2 = bf16) gets, for each of the `count` experts
// listed in `experts` (u32 on the device, below the stack's experts: the caller's promise), that
// expert's `per_expert` values from the MXFP4 stack `codes` / `scales` (mxfp4.cuh); the other
// experts' values are left as they are. per_expert a multiple of 32; out 16-byte aligned. Returns
// 0, a CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_mxfp4_dequant(int dtype, void* out, const uint8_t* codes,
                                      const uint8_t* scales, const uint32_t* experts, int count,
                                      int64_t per_expert, void* stream) {
  if (count == 0 || per_expert == 0) return 0;
  if (per_expert % 32 != 0 || count > 65535) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch<__half>(out, codes, scales, experts, count, per_expert, s);
    case 2: return launch<__nv_bfloat16>(out, codes, scales, experts, count, per_expert, s);
    default: return 1;
  }
}
