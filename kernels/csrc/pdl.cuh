// pagewise: programmatic dependent launch (sm_90) for kernels that follow one another in a
// stream or CUDA graph. Included by the kernels that use it.
#pragma once
#include <cuda_runtime.h>

namespace {

// A kernel launched early (`launch_early`) may be scheduled while the kernel before it in the
// stream is still running. It must call wait_for_previous_grid() before touching memory that
// kernel may write; it calls let_next_grid_launch() to let an early kernel after it be scheduled
// before it ends (that one still waits for it to finish).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void let_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Compute capability major of the current device (looked up once per device); 0 when unknown.
inline int device_major() {
  static int known[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (known[dev] == 0 && cudaDeviceGetAttribute(&known[dev], cudaDevAttrComputeCapabilityMajor,
                                                dev) != cudaSuccess)
    known[dev] = 0;
  return known[dev];
}

// launch_early in thread-block clusters of `cluster_z` blocks along z (1: no clusters; more needs
// sm_90 and must divide grid.z).
template <typename... Params, typename... Args>
cudaError_t launch_early_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, int smem,
                                   cudaStream_t stream, int cluster_z, Args... args) {
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (device_major() >= 9) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = 1;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = cluster_z;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// Launches `kernel` with programmatic stream serialization where the device takes it (sm_90 and
// up; see wait_for_previous_grid), plainly elsewhere.
template <typename... Params, typename... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, int smem,
                         cudaStream_t stream, Args... args) {
  return launch_early_clustered(kernel, grid, block, smem, stream, 1, args...);
}

}  // namespace
