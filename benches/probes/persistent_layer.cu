// Probe (benches/probes/README.md): a Gemma-3-12B-shaped decode layer's four GEMVs (qkv 8192x3840, o
// 3840x4096, gate/up 30720x3840, down 3840x15360; plain inputs, bf16, one row) as four launches a
// layer chained by programmatic dependent launch, against one persistent kernel for all layers
// whose phases meet at grid barriers (optionally prefetching each warp's first weights of the next
// phase into L2 before it waits).
#include <vector>
#include "probe_common.cuh"

struct Phase { const T* w; const T* x; T* y; int out, k, blocks; };
constexpr int kPhases = 4;
struct Layer { Phase p[kPhases]; };

// One block's share of a GEMV phase (rounds of 8 outputs, 2 warps an output), x staged from L2.
__device__ __forceinline__ void gemv_phase(const Phase& ph, T* xs, float* parts, int block, int nblocks) {
  for (int i = threadIdx.x * 8; i < ph.k; i += 512 * 8)
    *(uint4*)(xs + i) = __ldcg((const uint4*)(ph.x + i));
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % 2;
  for (int base = block * 8; base < ph.out; base += nblocks * 8) {
    const int o = base + warp / 2;
    float acc = 0.f;
    if (o < ph.out) {
      const T* row = ph.w + (int64_t)o * ph.k;
#pragma unroll 4
      for (int kk = (part * 32 + lane) * 8; kk < ph.k; kk += 2 * 32 * 8)
        acc = dot16(acc, row + kk, xs + kk);
    }
    float sum;
    if (pair_sum(acc, parts, warp, lane, &sum) && o < ph.out) ph.y[o] = __float2bfloat16(sum);
  }
}

__global__ void __launch_bounds__(512, 4) gemv_pdl(Phase ph) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float parts[16];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  gemv_phase(ph, (T*)smem, parts, blockIdx.x, gridDim.x);
}

__device__ unsigned int g_count;
__device__ unsigned int g_gen;

__device__ __forceinline__ void grid_sync(unsigned int& gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned int want = gen + 1;
    if (atomicAdd(&g_count, 1) == gridDim.x - 1) {
      g_count = 0;
      __threadfence();
      atomicExch(&g_gen, want);
    } else {
      unsigned int g;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(g) : "l"(&g_gen) : "memory");
      } while (g != want);
    }
  }
  ++gen;
  __syncthreads();
}

// Each warp's first weight runs of a phase (its first output's first 4 runs) into L2.
__device__ __forceinline__ void prefetch_phase(const Phase& ph, int block) {
  if (block >= ph.blocks) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % 2;
  const int o = block * 8 + warp / 2;
  if (o >= ph.out || lane >= 16) return;
  const int run = part + 2 * (lane / 4);
  if ((run + 1) * 256 > ph.k) return;
  const T* p = ph.w + (int64_t)o * ph.k + run * 256 + (lane % 4) * 64;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <bool kPrefetch>
__global__ void __launch_bounds__(512, 4) persistent(const Layer* layers, int nlayers, int passes) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float parts[16];
  unsigned int gen = 0;
  if (threadIdx.x == 0) gen = 0;
  // (g_gen starts at 0 each launch: reset by the host)
  for (int it = 0; it < passes * nlayers; ++it) {
    const Layer& L = layers[it % nlayers];
    for (int p = 0; p < kPhases; ++p) {
      const Phase ph = L.p[p];
      if (blockIdx.x < ph.blocks) gemv_phase(ph, (T*)smem, parts, blockIdx.x, ph.blocks);
      if (kPrefetch) {
        const Phase& nx = p + 1 < kPhases ? L.p[p + 1] : layers[(it + 1) % nlayers].p[0];
        prefetch_phase(nx, blockIdx.x);
      }
      grid_sync(gen);
    }
  }
}


int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int nl = 8, passes = 6;
  const int shapes[kPhases][2] = {{8192, 3840}, {3840, 4096}, {30720, 3840}, {3840, 15360}};
  const int smem = 15360 * 2;
  CK(cudaFuncSetAttribute(gemv_pdl, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(persistent<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(persistent<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent<true>, 512, smem));
  const int resident = per_sm * sms;
  printf("%d SMs, %d blocks an SM (%d resident)\n", sms, per_sm, resident);
  T *h, *q, *o, *gu;
  CK(cudaMalloc(&h, 3840 * 2)); CK(cudaMalloc(&q, 8192 * 2)); CK(cudaMalloc(&o, 3840 * 2)); CK(cudaMalloc(&gu, 30720 * 2));
  fill<<<16, 256>>>(h, 3840, 7, 0.02f);
  std::vector<Layer> layers(nl);
  double bytes = 0;
  for (int l = 0; l < nl; ++l) {
    const T* xs[kPhases] = {h, q, o, gu};
    T* ys[kPhases] = {q, o, gu, h};
    for (int p = 0; p < kPhases; ++p) {
      const int out = shapes[p][0], k = shapes[p][1];
      T* w; CK(cudaMalloc(&w, (size_t)out * k * 2)); fill<<<1024, 256>>>(w, (size_t)out * k, l * 10 + p, 0.02f);
      const int wanted = (out + 7) / 8, rounds = (wanted + resident - 1) / resident;
      layers[l].p[p] = Phase{w, xs[p], ys[p], out, k, (wanted + rounds - 1) / rounds};
      if (l == 0) bytes += (double)out * k * 2;
    }
  }
  Layer* dl; CK(cudaMalloc(&dl, sizeof(Layer) * nl));
  CK(cudaMemcpy(dl, layers.data(), sizeof(Layer) * nl, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto chain = [&](bool pdl) {
    for (int it = 0; it < passes * nl; ++it)
      for (int p = 0; p < kPhases; ++p) {
        const Phase& ph = layers[it % nl].p[p];
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = ph.blocks; cfg.blockDim = 512; cfg.dynamicSmemBytes = smem; cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
        cfg.attrs = at; cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, gemv_pdl, ph));
      }
  };
  auto pers = [&](bool pf) {
    unsigned int zero = 0;
    CK(cudaMemcpyToSymbolAsync(g_count, &zero, 4, 0, cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyToSymbolAsync(g_gen, &zero, 4, 0, cudaMemcpyHostToDevice, st));
    int nlv = nl, pv = passes;
    void* args[] = {&dl, &nlv, &pv};
    CK(cudaLaunchCooperativeKernel(pf ? (void*)persistent<true> : (void*)persistent<false>, resident, 512, args, smem, st));
  };
  auto time_direct = [&](const char* name, auto run) {
    run(); CK(cudaStreamSynchronize(st));
    float best = 1e9;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(a, st); run(); cudaEventRecord(b, st);
      CK(cudaEventSynchronize(b));
      float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best;
    }
    const double us = best * 1000.0 / (passes * nl);
    printf("%-34s %7.2f us a layer (%.2f TB/s over %.0f MB)\n", name, us, bytes / us / 1e6, bytes / 1e6);
  };
  auto time = [&](const char* name, auto run) {
    run(); CK(cudaStreamSynchronize(st));
    // graph-capture the chain so launches are not host-bound
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    run();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
    float best = 1e9;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(a, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(b, st);
      CK(cudaEventSynchronize(b));
      float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best;
    }
    const double us = best * 1000.0 / (passes * nl);
    printf("%-34s %7.2f us a layer (%.2f TB/s over %.0f MB)\n", name, us, bytes / us / 1e6, bytes / 1e6);
  };
  time("chain, 4 launches a layer", [&] { chain(false); });
  time("chain with PDL", [&] { chain(true); });
  time_direct("persistent, grid barriers", [&] { pers(false); });
  time_direct("persistent + L2 prefetch", [&] { pers(true); });
  time("chain with PDL", [&] { chain(true); });
  time_direct("persistent, grid barriers", [&] { pers(false); });
  time_direct("persistent + L2 prefetch", [&] { pers(true); });
  return 0;
}
