// Probe (benches/probes/README.md): how fast a one-row bf16 GEMV y = W x can stream W on the GPU,
// outside the engine. A replica of pagewise's gemv_kernel (plain input, two warps an output,
// 16-byte loads per lane) at 4 and 2 blocks an SM, with each warp's runs of a row started at a
// rotation by its output or not, and (`gemv_stream bulk`) rows streamed by 1-D bulk copies
// (cp.async.bulk, the copy engine) into a per-warp shared-memory ring instead. Each shape runs 40
// launches back to back over weights rotated past the L2 and is checked against the first
// variant's output.
#include <cmath>
#include <string>
#include <vector>
#include "probe_common.cuh"

// ---- replica of gemv_kernel<R=1, kPlain, S=2, 512 threads>; ROT: each warp starts its runs at
// a rotation by its output (spreading a round's loads over the row).
template <int MINB, int ROT>
__global__ void __launch_bounds__(512, MINB) ldg_gemv(float* y, const T* x, const T* w, int out, int k) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = (T*)smem;
  for (int i = threadIdx.x * 8; i < k; i += 512 * 8) *(uint4*)(xs + i) = *(const uint4*)(x + i);
  __syncthreads();
  __shared__ float parts[16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % 2;
  const int runs = k / 256, J = (runs - part + 1) / 2;
  for (int base = blockIdx.x * 8; base < out; base += gridDim.x * 8) {
    const int o = base + warp / 2;
    float acc = 0.f;
    if (o < out) {
      const T* row = w + (int64_t)o * k;
      int j = ROT == 0 ? 0 : (ROT == 1 ? o % J : (o * 5) % J);
#pragma unroll 4
      for (int jj = 0; jj < J; ++jj) {
        const int kk = (part + 2 * j) * 256 + lane * 8;
        if (++j == J) j = 0;
        acc = dot16(acc, row + kk, xs + kk);
      }
    }
    float sum;
    if (pair_sum(acc, parts, warp, lane, &sum) && o < out) y[o] = sum;
  }
}

// ---- bulk: each warp streams its rows (o = global warp, step total warps) in CHUNK-byte pieces
// through its own NST-stage ring, lane 0 issuing the copies.
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n));
}
__device__ __forceinline__ void mb_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mb_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n"
      ::"r"(sa(b)), "r"(parity) : "memory");
}

template <int CHUNK, int NST, int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB) bulk_gemv(float* y, const T* x, const T* w, int out, int k) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ uint64_t bars[WARPS][NST];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* ring = smem + warp * NST * CHUNK;
  T* xs = (T*)(smem + WARPS * NST * CHUNK);
  const int row_bytes = k * 2, pieces = (row_bytes + CHUNK - 1) / CHUNK;
  const int gw = blockIdx.x * WARPS + warp, tw = gridDim.x * WARPS;
  const int my_rows = gw < out ? (out - gw + tw - 1) / tw : 0;
  const int total = my_rows * pieces;
  if (lane == 0) {
    for (int s = 0; s < NST; ++s) mb_init(&bars[warp][s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int i) {
    const int r = i / pieces, p = i % pieces, s = i % NST;
    const int o = gw + r * tw;
    const uint32_t off = p * CHUNK, n = min(CHUNK, row_bytes - (int)off);
    mb_expect(&bars[warp][s], n);
    bulk(ring + s * CHUNK, (const unsigned char*)(w + (int64_t)o * k) + off, n, &bars[warp][s]);
  };
  if (lane == 0)
    for (int i = 0; i < NST && i < total; ++i) issue(i);
  for (int i = threadIdx.x * 8; i < k; i += WARPS * 32 * 8) *(uint4*)(xs + i) = *(const uint4*)(x + i);
  __syncthreads();
  float acc = 0.f;
  for (int i = 0; i < total; ++i) {
    const int r = i / pieces, p = i % pieces, s = i % NST;
    mb_wait(&bars[warp][s], (i / NST) & 1);
    const int off = p * CHUNK, n = min(CHUNK, row_bytes - off);
    const unsigned char* buf = ring + s * CHUNK;
#pragma unroll
    for (int b = lane * 16; b < CHUNK; b += 512) {
      if (b < n) {
        uint4 wr = *(const uint4*)(buf + b);
        uint4 xr = *(const uint4*)((const unsigned char*)xs + off + b);
        const T* wv = (const T*)&wr; const T* xv = (const T*)&xr;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += f(wv[j]) * f(xv[j]);
      }
    }
    __syncwarp();
    if (lane == 0) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (i + NST < total) issue(i + NST);
    }
    if (p == pieces - 1) {
      for (int sh = 16; sh > 0; sh >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, sh);
      if (lane == 0) y[gw + r * tw] = acc;
      acc = 0.f;
    }
  }
}


template <typename K>
float timeit(K launch, int iters) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) launch(i);
  cudaEventRecord(a);
  for (int i = 0; i < iters; ++i) launch(i);
  cudaEventRecord(b); CK(cudaEventSynchronize(b));
  float ms; cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.f / iters;
}

template <int CHUNK, int NST, int WARPS, int MINB>
void run_bulk(const char* name, float* y, const T* x, const std::vector<T*>& ws, int out, int k, double bytes, int sms, float* ref) {
  auto kern = bulk_gemv<CHUNK, NST, WARPS, MINB>;
  const int smem = WARPS * NST * CHUNK + k * 2;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, WARPS * 32, smem));
  const int blocks = per_sm * sms;
  float us = timeit([&](int i) { kern<<<blocks, WARPS * 32, smem>>>(y, x, ws[i % ws.size()], out, k); }, 40);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  // check against ref (weights ws[0])
  kern<<<blocks, WARPS * 32, smem>>>(y, x, ws[0], out, k);
  std::vector<float> h(out), r(out);
  CK(cudaMemcpy(h.data(), y, out * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.data(), ref, out * 4, cudaMemcpyDeviceToHost));
  double md = 0, mr = 0;
  for (int i = 0; i < out; ++i) { md = fmax(md, fabs(h[i] - r[i])); mr = fmax(mr, fabs(r[i])); }
  printf("  bulk %-22s %d blocks/SM, smem %6d: %8.2f us  %.2f TB/s  (max diff %.2e of %.2e)\n", name, per_sm, smem, us, bytes / us / 1e6, md, mr);
}

template <int MINB, int ROT>
void run_ldg(const char* name, float* y, const T* x, const std::vector<T*>& ws, int out, int k, double bytes, int sms, float* ref) {
  auto kern = ldg_gemv<MINB, ROT>;
  const int smem = k * 2;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 512, smem));
  const int wanted = (out + 7) / 8, res = per_sm * sms, rounds = (wanted + res - 1) / res, blocks = (wanted + rounds - 1) / rounds;
  float us = timeit([&](int i) { kern<<<blocks, 512, smem>>>(y, x, ws[i % ws.size()], out, k); }, 40);
  CK(cudaDeviceSynchronize());
  kern<<<blocks, 512, smem>>>(y, x, ws[0], out, k);
  CK(cudaDeviceSynchronize());
  double md = 0;
  if (ref != nullptr) {
    std::vector<float> h(out), r(out);
    CK(cudaMemcpy(h.data(), y, out * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r.data(), ref, out * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < out; ++i) md = fmax(md, fabs(h[i] - r[i]));
  }
  printf("  ldg %-12s %d/SM %4d blocks: %8.2f us  %.2f TB/s  (max diff %.1e)\n", name, per_sm, blocks, us, bytes / us / 1e6, md);
}


int main(int argc, char** argv) {
  const bool bulk_mode = argc > 1 && std::string(argv[1]) == "bulk";
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct S { const char* n; int out, k; } shapes[] = {
      {"8B gate/up", 28672, 4096}, {"8B qkv", 6144, 4096}, {"8B o", 4096, 4096}, {"8B down", 4096, 14336},
      {"Gemma gate/up", 30720, 3840}, {"Gemma qkv", 8192, 3840}, {"Gemma o", 3840, 4096},
      {"Gemma down", 3840, 15360}, {"Gemma head", 262144, 3840}, {"Phi-4 gate/up", 35840, 5120},
      {"Phi-4 down", 5120, 17920}, {"1B gate/up", 16384, 2048}, {"Qwen3-30B qkv", 5120, 2048}};
  for (auto& s : shapes) {
    const size_t n = (size_t)s.out * s.k;
    const double bytes = n * 2.0;
    const int copies = (int)ceil(256e6 / bytes);
    std::vector<T*> ws(copies);
    for (int c = 0; c < copies; ++c) { CK(cudaMalloc(&ws[c], n * 2)); fill<<<1024, 256>>>(ws[c], n, c * 77 + 1, 0.1f); }
    T* x; CK(cudaMalloc(&x, s.k * 2)); fill<<<64, 256>>>(x, s.k, 999, 0.1f);
    float *y, *ref; CK(cudaMalloc(&y, s.out * 4)); CK(cudaMalloc(&ref, s.out * 4));
    CK(cudaDeviceSynchronize());
    printf("%s (%d x %d, %.1f MB)\n", s.n, s.out, s.k, bytes / 1e6);
    run_ldg<4, 0>("4/SM", ref, x, ws, s.out, s.k, bytes, sms, nullptr);
    run_ldg<4, 1>("4/SM rot o", y, x, ws, s.out, s.k, bytes, sms, ref);
    run_ldg<4, 2>("4/SM rot 5o", y, x, ws, s.out, s.k, bytes, sms, ref);
    run_ldg<2, 0>("2/SM", y, x, ws, s.out, s.k, bytes, sms, ref);
    run_ldg<2, 1>("2/SM rot o", y, x, ws, s.out, s.k, bytes, sms, ref);
    run_ldg<4, 0>("4/SM", y, x, ws, s.out, s.k, bytes, sms, ref);
    run_ldg<4, 1>("4/SM rot o", y, x, ws, s.out, s.k, bytes, sms, ref);
    if (bulk_mode) {
      run_bulk<2048, 4, 16, 1>("2K x4, 16 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
      run_bulk<2048, 4, 8, 1>("2K x4, 8 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
      run_bulk<4096, 2, 8, 1>("4K x2, 8 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
      run_bulk<4096, 3, 4, 1>("4K x3, 4 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
      run_bulk<1024, 6, 8, 1>("1K x6, 8 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
      run_bulk<8192, 2, 4, 1>("8K x2, 4 warps", y, x, ws, s.out, s.k, bytes, sms, ref);
    }
    for (auto p : ws) cudaFree(p);
    cudaFree(x); cudaFree(y); cudaFree(ref);
  }
  return 0;
}
