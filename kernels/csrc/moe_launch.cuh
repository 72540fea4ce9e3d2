// pagewise: what the expert kernels' launches share (moe.cu for dense stacks, moe_fp4.cu for
// MXFP4 ones): the grid of a step's tokens and the activation's parameters.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "gemv_stage.cuh"

namespace {

// Blocks a token of kKernel for `units` warp-sized outputs: enough, over all the tokens, to fill
// the GPU once (as many as run at once), never more than the outputs need. (A template on the
// kernel itself, not its type: kernels of one signature share a type, and each must have its own
// cache, since the shared-memory opt-in happens where its cache misses.)
template <auto kKernel>
int blocks_per_token(int smem, int units, int tokens, int* blocks) {
  if (smem > kMaxStageBytes) return 1;
  static int resident_by[64][kStageSteps + 1] = {};
  int all = 0;
  // grid_for with one output a block gives the blocks that run at once (capped by `units`).
  if (const int e = grid_for(kKernel, smem, 1 << 30, 1, resident_by, &all)) return e;
  const int wanted = (units + kGemvWarps - 1) / kGemvWarps;
  const int share = (all + tokens - 1) / tokens;
  *blocks = wanted < share ? wanted : (share > 0 ? share : 1);
  return 0;
}

}  // namespace

// What the gate/up launch passes on: the activation's parameters.
struct Activation {
  float alpha, limit;
};

// The MXFP4 twins of moe.cu's launches (moe_fp4.cu): the same arguments, with w as MXFP4 codes
// ([experts, rows, cols / 2] bytes) and `scales` their E8M0 scales ([experts, rows, cols / 32]);
// dtype 1 = f16, 2 = bf16. Return 0, a CUDA error code, or 1 when the arguments are unsupported.
int moe_fp4_gate_up(int dtype, void* a, const void* x, const void* norm_w, float eps,
                    const uint8_t* codes, const uint8_t* scales, const void* bias,
                    const uint32_t* ids, int tokens, int top_k, int inner, int k_dim,
                    Activation act, cudaStream_t stream);
int moe_fp4_down(int dtype, void* y, const void* a, const uint8_t* codes, const uint8_t* scales,
                 const void* bias, const void* residual, const uint32_t* ids,
                 const float* weights, int tokens, int top_k, int out_dim, int k_dim,
                 cudaStream_t stream);
