// Probe (benches/probes/README.md): how fast can a one-row GEMV stream 4-bit weights (AWQ-style
// codes, an f16 (scale, zero) pair per row and group of 128 columns)? pagewise's CUDA-core GEMV
// (gemv_weight.cuh's Int4Weight: a lane takes 32 columns a 16-byte load, dequantizes them to f32
// and multiplies on the CUDA cores) against tensor-core GEMVs: the codes repacked so that a lane's
// 32-bit word is its share of one m16n8k16 A fragment (16 rows x 16 columns, a warp's 16-byte
// loads covering 16 rows x 64 columns), dequantized to bf16 by one mask (exact: 128 + q, less
// 128 + z) and multiplied by mma.sync with the staged x as B, each group's f32 sums scaled once.
// A block takes TILES row tiles of 16 at a time, its warps splitting each tile's columns; the
// parts meet in shared memory. Bf16 rows (pagewise's dense GEMV, two warps an output) for the
// speed a byte. Each shape runs 64 launches over weights rotated past the L2; every variant's
// output is checked against the CUDA-core one.
#include <cmath>
#include <vector>
#include "probe_common.cuh"

__device__ __forceinline__ uint32_t hash(uint32_t a, uint32_t b) {
  uint32_t h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u;
  h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
  return h;
}
// The logical weight: code q(o, c) in 0..15, and per (o, group) a scale and zero point.
__device__ __forceinline__ uint32_t code(int o, int c) { return hash(o, c) & 15; }
__device__ __forceinline__ __half2 pair(int o, int g) {
  const uint32_t h = hash(o + 7777, g);
  return __halves2half2(__float2half(1e-3f + (h & 1023) * 4e-6f), __float2half((float)((h >> 10) & 15)));
}

// Row-major words, AutoAWQ's order (column 8j + 2i in nibble i, 8j + 2i + 1 in nibble 4 + i).
__global__ void pack_rows(uint32_t* w, int out, int k) {
  const int words = k / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)out * words; i += (int64_t)gridDim.x * blockDim.x) {
    const int o = i / words, j = i % words;
    uint32_t v = 0;
    for (int p = 0; p < 4; ++p) v |= code(o, 8 * j + 2 * p) << (4 * p) | code(o, 8 * j + 2 * p + 1) << (16 + 4 * p);
    w[i] = v;
  }
}
// Tiles: tile (rt, kc) of 16 rows x 64 columns is 512 bytes, lane L's 16 at 16 L; its word m
// (columns 16 m..16 m + 15 of the tile) holds the A fragment's pairs p = 0..3 in nibbles p
// (lower column) and 4 + p: (row g, col 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8) for
// g = L / 4, t = L % 4.
__global__ void pack_tiles(uint32_t* w, int out, int k) {
  const int kc_n = k / 64;
  const int64_t n = (int64_t)out / 16 * kc_n * 32 * 4;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int m = i % 4, lane = (i / 4) % 32;
    const int64_t tile = i / 128;
    const int rt = tile / kc_n, kc = tile % kc_n;
    const int g = lane / 4, t = lane % 4;
    uint32_t v = 0;
    for (int p = 0; p < 4; ++p) {
      const int row = rt * 16 + g + (p & 1) * 8, col = kc * 64 + m * 16 + 2 * t + (p >> 1) * 8;
      v |= code(row, col) << (4 * p) | code(row, col + 1) << (16 + 4 * p);
    }
    w[i] = v;
  }
}
__global__ void fill_pairs(__half2* sz, int out, int groups) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (int64_t)out * groups; i += (int64_t)gridDim.x * blockDim.x)
    sz[i] = pair(i / groups, i % groups);
}

__device__ __forceinline__ void stage(T* xs, const T* x, int k) {
  for (int i = threadIdx.x * 8; i < k; i += blockDim.x * 8) *(uint4*)(xs + i) = *(const uint4*)(x + i);
  __syncthreads();
}

// ---- pagewise's CUDA-core 4-bit GEMV (R = 1, plain input, S warps an output, 512 threads).
template <int S>
__global__ void __launch_bounds__(512, 4) core_gemv(float* y, const T* x, const uint32_t* w, const __half2* sz, int out, int k, int g_shift) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = (T*)smem;
  stage(xs, x, k);
  __shared__ float parts[16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % S;
  const int groups = k >> g_shift;
  const __half k1024 = __float2half(1024.f);
  for (int base = blockIdx.x * (16 / S); base < out; base += gridDim.x * (16 / S)) {
    const int o = base + warp / S;
    float acc = 0.f;
    if (o < out) {
      const uint32_t* row = w + (int64_t)o * (k / 8);
      const __half2* pz = sz + (int64_t)o * groups;
#pragma unroll 2
      for (int kk = (part * 32 + lane) * 32; kk < k; kk += S * 32 * 32) {
        const uint4 raw = __ldg((const uint4*)(row + kk / 8));
        const __half2 g = __ldg(pz + (kk >> g_shift));
        const __half2 bias = __half2half2(__hadd(__high2half(g), k1024));
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        float run = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4 xr = *(const uint4*)(xs + kk + 8 * j);
          const T* xv = (const T*)&xr;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t bits = ((words[j] >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
            const float2 fv = __half22float2(__hsub2(*(const __half2*)&bits, bias));
            run += fv.x * f(xv[2 * i]) + fv.y * f(xv[2 * i + 1]);
          }
        }
        acc += run * __low2float(g);
      }
    }
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, s);
    if (S == 1) {
      if (lane == 0 && o < out) y[o] = acc;
      continue;
    }
    if (lane == 0) parts[warp] = acc;
    __syncthreads();
    if (warp % S == 0 && lane == 0 && o < out) {
      float t = 0.f;
      for (int p = 0; p < S; ++p) t += parts[warp + p];
      y[o] = t;
    }
    __syncthreads();
  }
}

// ---- tensor-core 4-bit GEMV: WARPS warps a block, TILES row tiles a round (WARPS / TILES warps
// splitting each tile's 64-column chunks).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t bias_of(__half2 g) {  // bf16x2 of 128 + z
  const __nv_bfloat16 b = __float2bfloat16(128.f + __high2float(g));
  const uint16_t u = *(const uint16_t*)&b;
  return (uint32_t)u | (uint32_t)u << 16;
}

// One 64-column chunk of a tile: the lane's 16 bytes `raw` dequantized to bf16 q - z (rows g and
// g + 8's pairs z0, z8), four m16n8k16 products with the staged x at `xc` (this chunk's columns,
// from the lane's 2t), the f32 sums scaled by the rows' scales into acc.
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const uint4& raw, __half2 z0, __half2 z8, const T* xc) {
  const uint32_t b0r = bias_of(z0), b8r = bias_of(z8);
  const __nv_bfloat162 bias0 = *(const __nv_bfloat162*)&b0r, bias8 = *(const __nv_bfloat162*)&b8r;
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t a[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t bits = ((words[m] >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
      const __nv_bfloat162 v = __hsub2(*(const __nv_bfloat162*)&bits, (p & 1) ? bias8 : bias0);
      a[p] = *(const uint32_t*)&v;
    }
    mma_bf16(d, a, *(const uint32_t*)(xc + m * 16), *(const uint32_t*)(xc + m * 16 + 8));
  }
  const float s0 = __low2float(z0), s8 = __low2float(z8);
  acc[0] += d[0] * s0; acc[1] += d[1] * s0; acc[2] += d[2] * s8; acc[3] += d[3] * s8;
}

template <int WARPS, int TILES, int UNROLL>
__global__ void __launch_bounds__(WARPS * 32) mma_gemv(float* y, const T* x, const uint32_t* w, const __half2* sz, int out, int k, int g_shift) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = (T*)smem;
  stage(xs, x, k);
  constexpr int kSplit = WARPS / TILES;
  __shared__ float parts[WARPS][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int tile_in = warp / kSplit, part = warp % kSplit;
  const int kc_n = k / 64, groups = k >> g_shift, tiles = out / 16;
  for (int base = blockIdx.x * TILES; base < tiles; base += gridDim.x * TILES) {
    const int rt = base + tile_in;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (rt < tiles) {
      const uint4* tw = (const uint4*)w + (int64_t)rt * kc_n * 32 + lane;
      const __half2* p0 = sz + (int64_t)(rt * 16 + g) * groups;
      const __half2* p8 = p0 + 8 * groups;
#pragma unroll UNROLL
      for (int kc = part; kc < kc_n; kc += kSplit) {
        const uint4 raw = __ldg(tw + kc * 32);
        const __half2 z0 = __ldg(p0 + ((kc * 64) >> g_shift)), z8 = __ldg(p8 + ((kc * 64) >> g_shift));
        chunk_mma(acc, raw, z0, z8, xs + kc * 64 + 2 * t);
      }
    }
    // Column 0 (thread t == 0's c0 and c2) is the product with x.
    if (kSplit == 1) {
      if (t == 0 && rt < tiles) { y[rt * 16 + g] = acc[0]; y[rt * 16 + g + 8] = acc[2]; }
      continue;
    }
    if (t == 0) { parts[warp][g] = acc[0]; parts[warp][g + 8] = acc[2]; }
    __syncthreads();
    if (part == 0 && lane < 16 && rt < tiles) {
      float s = 0.f;
      for (int p = 0; p < kSplit; ++p) s += parts[warp + p][lane];
      y[rt * 16 + lane] = s;
    }
    __syncthreads();
  }
}


// The same with each warp's loads issued PF at a time into registers before any is used (the
// first PF before x is staged), its chunks CONTIG (a run of the tile's) or strided by the warps.
template <int WARPS, int PF, bool CONTIG>
__global__ void __launch_bounds__(WARPS * 32) mma_gemv_pf(float* y, const T* x, const uint32_t* w, const __half2* sz, int out, int k, int g_shift) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = (T*)smem;
  __shared__ float parts[WARPS][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kc_n = k / 64, groups = k >> g_shift, tiles = out / 16;
  const int per = (kc_n + WARPS - 1) / WARPS;
  const int nj = CONTIG ? max(0, min(per, kc_n - warp * per)) : (kc_n - warp + WARPS - 1) / WARPS;
  auto chunk = [&](int j) { return CONTIG ? warp * per + j : warp + j * WARPS; };
  uint4 raw[PF];
  __half2 z0[PF], z8[PF];
  auto issue = [&](int rt, int b) {
    const uint4* tw = (const uint4*)w + (int64_t)rt * kc_n * 32 + lane;
    const __half2* p0 = sz + (int64_t)(rt * 16 + g) * groups;
#pragma unroll
    for (int i = 0; i < PF; ++i)
      if (b + i < nj) {
        const int kc = chunk(b + i);
        raw[i] = __ldg(tw + kc * 32);
        z0[i] = __ldg(p0 + ((kc * 64) >> g_shift));
        z8[i] = __ldg(p0 + 8 * groups + ((kc * 64) >> g_shift));
      }
  };
  if (blockIdx.x < tiles) issue(blockIdx.x, 0);
  stage(xs, x, k);
  for (int rt = blockIdx.x; rt < tiles; rt += gridDim.x) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < nj; b += PF) {
      if (b > 0 || rt != blockIdx.x) issue(rt, b);
#pragma unroll
      for (int i = 0; i < PF; ++i) {
        if (b + i >= nj) break;
        chunk_mma(acc, raw[i], z0[i], z8[i], xs + chunk(b + i) * 64 + 2 * t);
      }
    }
    if (t == 0) { parts[warp][g] = acc[0]; parts[warp][g + 8] = acc[2]; }
    __syncthreads();
    if (warp == 0 && lane < 16) {
      float s = 0.f;
      for (int p = 0; p < WARPS; ++p) s += parts[p][lane];
      y[rt * 16 + lane] = s;
    }
    __syncthreads();
  }
}

// ---- bf16 rows, pagewise's dense GEMV (two warps an output), for the speed a byte.
__global__ void __launch_bounds__(512, 4) dense_gemv(float* y, const T* x, const T* w, int out, int k) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = (T*)smem;
  stage(xs, x, k);
  __shared__ float parts[16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % 2;
  for (int base = blockIdx.x * 8; base < out; base += gridDim.x * 8) {
    const int o = base + warp / 2;
    float acc = 0.f;
    if (o < out) {
      const T* row = w + (int64_t)o * k;
#pragma unroll 4
      for (int kk = (part * 32 + lane) * 8; kk < k; kk += 2 * 32 * 8) acc = dot16(acc, row + kk, xs + kk);
    }
    float sum;
    if (pair_sum(acc, parts, warp, lane, &sum) && o < out) y[o] = sum;
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Shape { const char* n; int out, k; } shapes[] = {
      {"8B qkv", 6144, 4096}, {"8B o", 4096, 4096}, {"8B gate/up", 28672, 4096}, {"8B down", 4096, 14336},
      {"1B qkv", 3072, 2048}, {"1B gate/up", 16384, 2048}, {"1B down", 2048, 8192}};
  const int g_shift = 7;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (const Shape& s : shapes) {
    const int64_t n = (int64_t)s.out * s.k;
    const double q_bytes = n / 2 + (double)s.out * (s.k >> g_shift) * 4, d_bytes = n * 2.0;
    const int copies = (int)ceil(256e6 / q_bytes), dcopies = (int)ceil(256e6 / d_bytes);
    std::vector<uint32_t*> rows(copies), tiles(copies);
    std::vector<__half2*> pairs(copies);
    std::vector<T*> dense(dcopies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&rows[c], n / 2)); CK(cudaMalloc(&tiles[c], n / 2));
      CK(cudaMalloc(&pairs[c], (size_t)s.out * (s.k >> g_shift) * 4));
      pack_rows<<<1024, 256>>>(rows[c], s.out, s.k);
      pack_tiles<<<1024, 256>>>(tiles[c], s.out, s.k);
      fill_pairs<<<1024, 256>>>(pairs[c], s.out, s.k >> g_shift);
    }
    for (int c = 0; c < dcopies; ++c) { CK(cudaMalloc(&dense[c], n * 2)); fill<<<1024, 256>>>(dense[c], n, c * 77 + 1, 0.1f); }
    T* x; float *y0, *y1;
    CK(cudaMalloc(&x, s.k * 2)); CK(cudaMalloc(&y0, s.out * 4)); CK(cudaMalloc(&y1, s.out * 4));
    fill<<<64, 256>>>(x, s.k, 12345, 2.f);
    CK(cudaDeviceSynchronize());
    const int smem = s.k * 2;
    std::vector<float> ref(s.out), got(s.out);
    auto report = [&](const char* name, int blocks, double bytes, auto launch) {
      launch(0, y1);
      CK(cudaDeviceSynchronize());
      for (int i = 0; i < 4; ++i) launch(i, y1);
      cudaEventRecord(e0);
      for (int i = 0; i < 64; ++i) launch(i, y1);
      cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      const float us = ms * 1000 / 64;
      CK(cudaMemcpy(got.data(), y1, s.out * 4, cudaMemcpyDeviceToHost));
      float md = 0, mr = 0;
      for (int i = 0; i < s.out; ++i) { md = fmaxf(md, fabsf(got[i] - ref[i])); mr = fmaxf(mr, fabsf(ref[i])); }
      printf("  %-24s %5d blocks: %7.2f us  %.2f TB/s  (max diff %.1e of %.1e)\n", name, blocks, us, bytes / us / 1e6, md, mr);
    };
    printf("%s (%d x %d, 4-bit %.1f MB)\n", s.n, s.out, s.k, q_bytes / 1e6);
    {  // the reference: CUDA-core, S = 2
      auto k = core_gemv<2>;
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      k<<<sms * 4, 512, smem>>>(y0, x, rows[0], pairs[0], s.out, s.k, g_shift);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(ref.data(), y0, s.out * 4, cudaMemcpyDeviceToHost));
    }
    report("bf16 dense (2 warps/out)", sms * 4, d_bytes, [&](int i, float* y) {
      CK(cudaFuncSetAttribute(dense_gemv, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      dense_gemv<<<sms * 4, 512, smem>>>(y, x, dense[i % dcopies], s.out, s.k); });
    report("core S=2 (now)", sms * 4, q_bytes, [&](int i, float* y) {
      core_gemv<2><<<sms * 4, 512, smem>>>(y, x, rows[i % copies], pairs[i % copies], s.out, s.k, g_shift); });
    report("core S=1", sms * 4, q_bytes, [&](int i, float* y) {
      CK(cudaFuncSetAttribute(core_gemv<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      core_gemv<1><<<sms * 4, 512, smem>>>(y, x, rows[i % copies], pairs[i % copies], s.out, s.k, g_shift); });
#define MMA(W, TL, U, PER_SM)                                                                      \
    {                                                                                              \
      auto k = mma_gemv<W, TL, U>;                                                                 \
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));              \
      const int tiles_n = s.out / 16, blocks = std::min(sms * PER_SM, (tiles_n + TL - 1) / TL);    \
      report("mma " #W "w " #TL "t u" #U " " #PER_SM "/SM", blocks, q_bytes, [&](int i, float* y) { \
        k<<<blocks, W * 32, smem>>>(y, x, tiles[i % copies], pairs[i % copies], s.out, s.k, g_shift); }); \
    }
    MMA(16, 1, 4, 4)
    MMA(8, 1, 4, 8)

#define PF(W, P, C, PER_SM)                                                                        \
    {                                                                                              \
      auto k = mma_gemv_pf<W, P, C>;                                                               \
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));              \
      const int tiles_n = s.out / 16, blocks = std::min(sms * PER_SM, tiles_n);                    \
      report("pf " #W "w pf" #P " c" #C " " #PER_SM "/SM", blocks, q_bytes, [&](int i, float* y) {  \
        k<<<blocks, W * 32, smem>>>(y, x, tiles[i % copies], pairs[i % copies], s.out, s.k, g_shift); }); \
    }
    PF(16, 4, false, 4)
    PF(16, 8, false, 4)
    PF(16, 4, true, 4)
    PF(16, 8, true, 4)
    PF(8, 8, false, 8)
    PF(8, 8, true, 8)
    PF(32, 4, false, 2)
    PF(32, 8, true, 2)
    PF(16, 8, true, 2)
    for (int c = 0; c < copies; ++c) { cudaFree(rows[c]); cudaFree(tiles[c]); cudaFree(pairs[c]); }
    for (int c = 0; c < dcopies; ++c) cudaFree(dense[c]);
    cudaFree(x); cudaFree(y0); cudaFree(y1);
  }
  return 0;
}
