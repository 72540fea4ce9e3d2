// One-shot all-reduce over peer memory for the ranks of one node (tensor parallelism's decode
// steps: a few KiB per call, where NCCL's ~19 µs in a CUDA graph is mostly synchronisation).
// Each rank owns a region, opened by every other rank through CUDA IPC:
//   [2 x data_bytes of staging][flags: kMaxRanks x kMaxBlocks u32][counter u32][done u32]
// A call stages this rank's input in its region (half `epoch & 1`), tells every rank's block b it
// has arrived (flags[rank][b] = epoch, written into the peer's region), waits for every rank's
// arrival in its own flags, then sums all ranks' staged slices in rank order (so every rank gets
// the same bits). Two halves alternate: a rank writes a half again two calls later, after every
// peer has arrived at the call in between, i.e. finished reading it (kernels on a stream run in
// order). The epoch lives in device memory (a CUDA graph replays the same arguments), advanced by
// the last block of each call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 64;
constexpr int kThreads = 512;

struct Regions {
  char* p[kMaxRanks];
};

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A peer's staged element, read past the caches (it was written by another GPU this call).
template <typename T>
__device__ __forceinline__ float load_peer(const T* p) {
  if constexpr (sizeof(T) == 4) {
    return __int_as_float(__ldcv(reinterpret_cast<const int*>(p)));
  } else {
    const unsigned short bits = __ldcv(reinterpret_cast<const unsigned short*>(p));
    T v;
    memcpy(&v, &bits, sizeof(v));
    return to_f(v);
  }
}

__device__ __forceinline__ uint32_t* flags_of(char* region, size_t data_bytes) {
  return reinterpret_cast<uint32_t*>(region + 2 * data_bytes);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) oneshot_kernel(Regions rg, int rank, int size, size_t data_bytes,
                                                           const T* __restrict__ in, T* __restrict__ out,
                                                           int64_t n) {
  const int b = blockIdx.x;
  uint32_t* my_flags = flags_of(rg.p[rank], data_bytes);
  uint32_t* counter = my_flags + kMaxRanks * kMaxBlocks;
  uint32_t* done = counter + 1;
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = *reinterpret_cast<volatile uint32_t*>(counter) + 1;
  __syncthreads();
  const uint32_t epoch = epoch_s;
  const size_t half = (epoch & 1) * data_bytes;
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = b * per;
  const int64_t hi = min(n, lo + per);
  T* mine = reinterpret_cast<T*>(rg.p[rank] + half);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = in[i];
  __syncthreads();
  if (threadIdx.x < size) {
    __threadfence_system();
    store_release(flags_of(rg.p[threadIdx.x], data_bytes) + rank * kMaxBlocks + b, epoch);
    const uint32_t* theirs = my_flags + threadIdx.x * kMaxBlocks + b;
    while (static_cast<int32_t>(load_acquire(theirs) - epoch) < 0) {
    }
  }
  __syncthreads();
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < size; ++r) acc += load_peer(reinterpret_cast<const T*>(rg.p[r] + half) + i);
    out[i] = from_f<T>(acc);
  }
  // The last block of the call advances the epoch (every block has read it by then).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      *done = 0;
      *counter = epoch;
      __threadfence();
    }
  }
}

template <typename T>
int launch(const Regions& rg, int rank, int size, size_t data_bytes, const void* in, void* out, int64_t n,
           cudaStream_t s) {
  int blocks = static_cast<int>((n + 1023) / 1024);
  blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  oneshot_kernel<T><<<blocks, kThreads, 0, s>>>(rg, rank, size, data_bytes, static_cast<const T*>(in),
                                                static_cast<T*>(out), n);
  return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

}  // namespace

// Bytes of a region with `data_bytes` of staging per half.
extern "C" size_t pagewise_ar_region_bytes(size_t data_bytes) {
  return 2 * data_bytes + (kMaxRanks * kMaxBlocks + 2) * sizeof(uint32_t);
}

// Allocates and zeroes this rank's region on the current device; writes its pointer and its
// 64-byte IPC handle. 0 on success.
extern "C" int pagewise_ar_alloc(size_t data_bytes, void** ptr, unsigned char* handle) {
  const size_t bytes = pagewise_ar_region_bytes(data_bytes);
  if (cudaMalloc(ptr, bytes) != cudaSuccess) return 1;
  if (cudaMemset(*ptr, 0, bytes) != cudaSuccess) return 2;
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  cudaIpcMemHandle_t h;
  if (cudaIpcGetMemHandle(&h, *ptr) != cudaSuccess) return 4;
  static_assert(sizeof(h) == 64, "CUDA IPC handles are 64 bytes");
  memcpy(handle, &h, sizeof(h));
  return 0;
}

// Opens another process's region from its handle (peer access enabled as needed).
extern "C" int pagewise_ar_open(const unsigned char* handle, void** ptr) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof(h));
  return cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess ? 0 : 1;
}

// Sum over `size` ranks of `n` elements of `in` into `out` (dtype 0 f32, 1 f16, 2 bf16);
// `regions` holds every rank's region (this rank's own at `rank`); n * element size must be at
// most `data_bytes`.
extern "C" int pagewise_ar_oneshot(int dtype, const uint64_t* regions, int rank, int size, size_t data_bytes,
                                   const void* in, void* out, int64_t n, void* stream) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) return 1;
  if (n == 0) return 0;
  Regions rg{};
  for (int r = 0; r < size; ++r) rg.p[r] = reinterpret_cast<char*>(regions[r]);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0: return launch<float>(rg, rank, size, data_bytes, in, out, n, s);
    case 1: return launch<__half>(rg, rank, size, data_bytes, in, out, n, s);
    case 2: return launch<__nv_bfloat16>(rg, rank, size, data_bytes, in, out, n, s);
    default: return 1;
  }
}
