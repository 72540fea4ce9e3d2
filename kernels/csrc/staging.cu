// A step's small inputs (token ids, positions, slots, block tables, sampling parameters) travel in
// one page-locked host buffer that the GPU reads directly (mapped memory): one kernel at the head
// of a CUDA graph copies each field into the fixed-address tensors the graph's kernels read. The
// host's part of a step is then writing plain memory and launching the graph, with no copy calls
// and no copy-engine operations queued before the replay.
#include <cuda_runtime.h>
#include <stdint.h>

#define PAGEWISE_MAX_STAGED_FIELDS 12

// Field `i`: `rows` rows copied from `src_word + r * src_row_words` to `dst + r * dst_row_words`,
// each `row_words` 32-bit words long, or as many as the staging buffer's word 0 says when
// `row_words` is 0 (the block tables: their width changes from step to step).
struct StagedField {
  uint32_t* dst;
  int src_word;
  int rows;
  int row_words;
  int src_row_words;
  int dst_row_words;
};

struct StagedFields {
  StagedField f[PAGEWISE_MAX_STAGED_FIELDS];
  int n;
};

namespace {

__global__ void unpack_kernel(const uint32_t* __restrict__ staging, StagedFields fields) {
  const int width = (int)staging[0];
  const int stride = gridDim.x * blockDim.x;
  for (int k = 0; k < fields.n; ++k) {
    const StagedField f = fields.f[k];
    const int w = f.row_words > 0 ? f.row_words : min(width, f.src_row_words);
    const int total = f.rows * w;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
      const int r = i / w, c = i - r * w;
      f.dst[(int64_t)r * f.dst_row_words + c] = staging[f.src_word + (int64_t)r * f.src_row_words + c];
    }
  }
}

}  // namespace

// Returns 0 on success or a CUDA error code. `staging`: the device address of mapped host memory.
extern "C" int pagewise_unpack_staged(const uint32_t* staging, const StagedField* fields, int n,
                                      void* stream) {
  if (n < 0 || n > PAGEWISE_MAX_STAGED_FIELDS) return (int)cudaErrorInvalidValue;
  StagedFields fs;
  int words = 0;
  for (int i = 0; i < n; ++i) {
    fs.f[i] = fields[i];
    const int w = fields[i].row_words > 0 ? fields[i].row_words : fields[i].src_row_words;
    words += fields[i].rows * w;
  }
  fs.n = n;
  const int threads = 256;
  const int blocks = max(1, min(64, (words + threads - 1) / threads));
  unpack_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(staging, fs);
  return (int)cudaGetLastError();
}
