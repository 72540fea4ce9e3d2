// pagewise: x W^T for decode batches of up to 8 rows, streaming the weight once (one or two warps
// an output, 16-byte loads), with the layer's neighbouring element-wise steps folded in: the
// RMSNorm before a projection or the SiLU-and-mul before the down projection are applied while
// the block stages x in shared memory, and the residual add after a projection is applied as it
// stores; the qkv projection's variant (gemv_rope_kernel) rotates q and k and writes k and v into
// the paged caches as it stores. The staged x is rounded to the tensor dtype as the separate
// kernels would store it, so only the matmul's summation order differs from the unfused path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "dtype.cuh"
#include "gemv_rows.cuh"
#include "gemv_stage.cuh"
#include "gemv_weight.cuh"
#include "pdl.cuh"

namespace {

// Threads a block of gemv_kernel<T, R, kIn, ..> has: 1024 for one row of a gated input, whose
// staging (both halves read, the activation computed) every block repeats, so half as many
// blocks halve it (Gemma-3-12B's down with GeGLU 33.1 -> 31.7 µs, Llama-3.1-8B's with
// SiLU-and-mul 32.5 -> 31.2 on the H200; the other one-row GEMVs lost or held: Gemma's gate/up
// 59.4 -> 60.2, its head-sized 262144 x 3840 496 -> 521); else 512.
constexpr int gemv_threads(int rows, int input) {
  return rows == 1 && (input == kSiluMul || input == kGeluMul) ? 1024 : kGemvThreads;
}

// y[r, o] = sum_k xs[r, k] * w[o, k] (+ residual[r, o], added to the product rounded to T as the
// unfused add would see it). A block stages its input once, then its warps take outputs in
// rounds of warps / S (S warps an output, see dot_rows), stepping by the grid's. One-row
// kernels are held to 32 registers, 2048 threads an SM: more loads in flight (Mistral-7B's down
// with SiLU-and-mul 39.7 -> 31.5 µs, its o 12.7 -> 10.6 on the H200; Gemma-3-12B's qkv and
// gate/up after a normalized add, kAddNormed, took its decode from 138.3 to 143.2 tok/s), except
// the RMSNorm-staging ones, which lost by it (Mistral-7B's qkv 15.4 -> 17.5 µs); gemv_rope gained
// nothing. 4-bit tiles' tensor-core GEMV is held to 64 (1024 threads an SM): at 32 it spilled.
// kAddNormed stages as stage_add_normed says (x is its delta), block 0 storing the stream.
// W: DenseWeight<T>, Fp8Weight, Int4Weight or Int4Tiles (gemv_weight.cuh).
template <typename T, int R, int kIn, bool kAdd, int S, typename W,
          int kT = gemv_threads(R, kIn)>
__global__ void __launch_bounds__(kT, std::is_same_v<W, Int4Tiles>      ? 1024 / kT
                                      : R == 1 && kIn != kRmsNorm ? 2048 / kT
                                                                  : 1)
    gemv_kernel(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ norm_w,
                const W w, const T* __restrict__ residual, int out_dim, int k_dim,
                float eps, const T* __restrict__ stream_in, const T* __restrict__ delta_w,
                T* __restrict__ stream_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  // Launched early (see launch_early): x and y belong to the kernels around this one.
  wait_for_previous_grid();
  let_next_grid_launch();
  if constexpr (kIn == kAddNormed)
    stage_add_normed<T, R, kT>(xs, x, stream_in, delta_w, norm_w, stream_out, k_dim, eps);
  else
    stage_input<T, R, kIn, kT>(xs, x, norm_w, k_dim, eps);
  gemv_outputs<T, R, kAdd, S, kT>(y, xs, w, residual, out_dim, k_dim, blockIdx.x, gridDim.x);
}

// The qkv projection of RMSNorm(x) with rotary and the KV-cache write folded into its store
// (what gemv_kernel then rope_qkv_cache_kernel compute, with the same rounding): a warp takes a
// rotation pair of q or k (both rows, so it can rotate them) or one v output. Row r's rotated q
// goes to q_out [R, heads, d]; its k and v to the caches at slots[r] (skipped when negative).
template <typename T, int R, int S, typename W>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_rope_kernel(T* __restrict__ q_out, T* __restrict__ k_cache, T* __restrict__ v_cache,
                     const T* __restrict__ cos, const T* __restrict__ sin,
                     const uint32_t* __restrict__ positions, int table_rows,
                     const int64_t* __restrict__ slots, const T* __restrict__ x,
                     const T* __restrict__ norm_w, const W w, int heads,
                     int kv_heads, int d, int interleaved, int k_dim, float eps) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);
  wait_for_previous_grid();  // (launched early: x is the kernel before's output)
  let_next_grid_launch();
  stage_input<T, R, kRmsNorm>(xs, x, norm_w, k_dim, eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int half = d / 2, pairs = (heads + kv_heads) * half, units = pairs + kv_heads * d;
  constexpr int kPerBlock = kGemvWarps / S;
  for (int base = blockIdx.x * kPerBlock; base < units; base += gridDim.x * kPerBlock) {
    const int u = base + warp / S, part = warp % S;
    // A pair's two rows, or (acc[1] unused) one v row.
    float acc[2][R] = {};
    const int h = u / half, i = u % half;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    if (u < pairs) {
      const int rows[2] = {h * d + a, h * d + b};
      dot_weight<T, R, 2, S>(acc, w, rows, xs, k_dim, lane, part);
    } else if (u < units) {
      const int rows[1] = {(heads + kv_heads) * d + u - pairs};
      float v_acc[1][R];
      dot_weight<T, R, 1, S>(v_acc, w, rows, xs, k_dim, lane, part);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[0][r] = v_acc[0][r];
    }
    if (!merge_split<R, 2, S>(acc, warp, lane) || u >= units) continue;
    if (u < pairs) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (lane != r) continue;
        // Rounded as the projection stores qkv, rotated as rope_qkv_cache_kernel does.
        const float x1 = to_float(from_float<T>(acc[0][r])), x2 = to_float(from_float<T>(acc[1][r]));
        // cos / sin: the step's rows, or whole tables read at each row's position.
        const int64_t tr = positions != nullptr ? min((int)positions[r], table_rows - 1) : r;
        const float cc = to_float(cos[tr * half + i]), ss = to_float(sin[tr * half + i]);
        const T y1 = from_float<T>(x1 * cc - x2 * ss), y2 = from_float<T>(x1 * ss + x2 * cc);
        T* o = nullptr;
        if (h < heads) {
          o = q_out + ((int64_t)r * heads + h) * d;
        } else if (slots[r] >= 0) {
          o = k_cache + slots[r] * kv_heads * d + (int64_t)(h - heads) * d;
        }
        if (o != nullptr) {
          o[a] = y1;
          o[b] = y2;
        }
      }
    } else {
      const int j = u - pairs;  // v head j / d, dim j % d
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (lane == r && slots[r] >= 0) v_cache[slots[r] * kv_heads * d + j] = from_float<T>(acc[0][r]);
    }
  }
}

// The outputs a block of gemv_kernel takes a round (see gemv_outputs): a warp's S-th of one, or
// for 4-bit tiles 16 a tile's kTileParts warps.
template <typename W>
constexpr int outputs_per_round(int threads, int s) {
  return std::is_same_v<W, Int4Tiles> ? threads / 32 / kTileParts * 16 : threads / 32 / s;
}

template <typename T, int R, int kIn, bool kAdd, int S, typename W>
int launch_rs(const GemvArgs& a, const W& w) {
  const auto kernel = gemv_kernel<T, R, kIn, kAdd, S, W>;
  constexpr int threads = gemv_threads(R, kIn);
  const int smem = R * a.k_dim * (int)sizeof(T);
  if (smem > kMaxStageBytes) return 1;
  static int resident_by[64][kStageSteps + 1] = {};
  int blocks = 0;
  if (const int e = grid_for(kernel, smem, a.out_dim, outputs_per_round<W>(threads, S),
                             resident_by, &blocks, threads))
    return e;
  const cudaError_t err = launch_early(kernel, blocks, threads, smem, a.stream, (T*)a.y,
                                       (const T*)a.x, (const T*)a.norm_w, w,
                                       (const T*)a.residual, a.out_dim, a.k_dim, a.eps,
                                       (const T*)a.stream_in, (const T*)a.delta_w,
                                       (T*)a.stream_out);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

// gemv_kernel for any rows, with the split split_for picks, for the weight `a` names (see
// dispatch_gemv).
struct CudaCoreGemv {
  template <typename T, int R, int kIn, bool kAdd, typename W>
  static int run_w(const GemvArgs& a, const W& w) {
    return split_for(a.k_dim) == 2 ? launch_rs<T, R, kIn, kAdd, 2>(a, w)
                                   : launch_rs<T, R, kIn, kAdd, 1>(a, w);
  }

  template <typename T, int R, int kIn, bool kAdd>
  static int run(const GemvArgs& a) {
    switch (a.w_kind) {
      case kDenseWeight: return run_w<T, R, kIn, kAdd>(a, DenseWeight<T>{(const T*)a.w});
      case kFp8Weight:
        return run_w<T, R, kIn, kAdd>(
            a, fp8_weight(a.w, (const float*)a.scales, a.block_rows, a.block_cols, a.k_dim));
      case kInt4Weight:
        return run_w<T, R, kIn, kAdd>(a, int4_weight(a.w, a.scales, a.block_cols, a.k_dim));
      // (Tiles split their columns over kTileParts warps whatever k is.)
      case kInt4Tiles:
        return launch_rs<T, R, kIn, kAdd, 1>(a, int4_tiles(a.w, a.scales, a.block_cols, a.k_dim));
      // (Affine codes: kAffineMaxRows rows at most, see gemv_affine.cuh.)
      case kAffine4:
        if constexpr (R <= kAffineMaxRows)
          return run_w<T, R, kIn, kAdd>(a, affine4_weight(a.w, a.scales, a.block_cols, a.k_dim));
        return 1;
      case kAffine8:
        if constexpr (R <= kAffineMaxRows)
          return run_w<T, R, kIn, kAdd>(a, affine8_weight(a.w, a.scales, a.block_cols, a.k_dim));
        return 1;
      default: return 1;
    }
  }
};

// The arguments of gemv_rope_kernel (see pagewise_gemv_rope).
struct QkvRopeArgs {
  void *q_out, *k_cache, *v_cache;
  const void *cos, *sin;
  const uint32_t* positions;
  int table_rows;
  const int64_t* slots;
  const void *x, *norm_w, *w;
  int rows, heads, kv_heads, d, interleaved, k_dim;
  float eps;
  // Quantized weights only: as GemvArgs's.
  int w_kind;
  const void* scales;
  int block_rows, block_cols;
};

template <typename T, int R, int S, typename W>
int launch_rope_rs(const QkvRopeArgs& a, const W& w, cudaStream_t stream) {
  const auto kernel = gemv_rope_kernel<T, R, S, W>;
  const int smem = R * a.k_dim * (int)sizeof(T);
  if (smem > kMaxStageBytes) return 1;
  static int resident_by[64][kStageSteps + 1] = {};
  const int units = (a.heads + a.kv_heads) * (a.d / 2) + a.kv_heads * a.d;
  int blocks = 0;
  if (const int e = grid_for(kernel, smem, units, kGemvWarps / S, resident_by, &blocks)) return e;
  const cudaError_t err = launch_early(
      kernel, blocks, kGemvThreads, smem, stream, (T*)a.q_out, (T*)a.k_cache, (T*)a.v_cache,
      (const T*)a.cos, (const T*)a.sin, a.positions, a.table_rows, a.slots, (const T*)a.x, (const T*)a.norm_w, w,
      a.heads, a.kv_heads, a.d, a.interleaved, a.k_dim, a.eps);
  return (int)(err != cudaSuccess ? err : cudaGetLastError());
}

// (The same split as the plain GEMV's, so the rotated q, k and v sum as its outputs do.)
template <typename T, int R, typename W>
int launch_rope_w(const QkvRopeArgs& a, const W& w, cudaStream_t stream) {
  return split_for(a.k_dim) == 2 ? launch_rope_rs<T, R, 2>(a, w, stream)
                                 : launch_rope_rs<T, R, 1>(a, w, stream);
}

template <typename T, int R>
int launch_rope_r(const QkvRopeArgs& a, cudaStream_t stream) {
  switch (a.w_kind) {
    case kDenseWeight: return launch_rope_w<T, R>(a, DenseWeight<T>{(const T*)a.w}, stream);
    case kFp8Weight:
      return launch_rope_w<T, R>(
          a, fp8_weight(a.w, (const float*)a.scales, a.block_rows, a.block_cols, a.k_dim),
          stream);
    case kInt4Weight:
      return launch_rope_w<T, R>(a, int4_weight(a.w, a.scales, a.block_cols, a.k_dim), stream);
    case kAffine4:
      if constexpr (R <= kAffineMaxRows)
        return launch_rope_w<T, R>(a, affine4_weight(a.w, a.scales, a.block_cols, a.k_dim), stream);
      return 1;
    case kAffine8:
      if constexpr (R <= kAffineMaxRows)
        return launch_rope_w<T, R>(a, affine8_weight(a.w, a.scales, a.block_cols, a.k_dim), stream);
      return 1;
    default: return 1;
  }
}

template <typename T>
int launch_rope(const QkvRopeArgs& a, cudaStream_t s) {
  switch (a.rows) {
    case 1: return launch_rope_r<T, 1>(a, s);
    case 2: return launch_rope_r<T, 2>(a, s);
    case 3: return launch_rope_r<T, 3>(a, s);
    case 4: return launch_rope_r<T, 4>(a, s);
    case 5: return launch_rope_r<T, 5>(a, s);
    case 6: return launch_rope_r<T, 6>(a, s);
    case 7: return launch_rope_r<T, 7>(a, s);
    case 8: return launch_rope_r<T, 8>(a, s);
    default: return 1;
  }
}

}  // namespace

// y ([rows, out_dim]) = in(x) w^T (+ residual, [rows, out_dim], when not null), rows 1..8, dtype
// 1 = f16, 2 = bf16, k_dim a multiple of 8, every pointer 16-byte aligned. input 0: in(x) = x
// ([rows, k_dim]); 1: RMSNorm(x) * norm_w with `eps` (x [rows, k_dim], norm_w [k_dim]); 2:
// silu(x[:, :k_dim]) * x[:, k_dim:] (x [rows, 2 k_dim]); 3: gelu_tanh(x[:, :k_dim]) * x[:, k_dim:]
// (no residual). The weight is of w_kind (WeightKind): 0, in the activations' dtype; 1, e4m3,
// w[o, c] standing for w[o, c] times its block's scale (`scales` f32 [ceil(out_dim /
// block_rows), ceil(k_dim / block_cols)], see Fp8Weight; k_dim a multiple of 16); 2, 4-bit codes
// with `scales` the f16 (scale, zero) pairs of groups of block_cols columns (see Int4Weight;
// k_dim a multiple of 32); 3, the same in tiles (see Int4Tiles); 4 and 5, 4-bit or byte codes
// with `scales` the f16 (scale, offset) pairs of groups of block_cols columns (see
// Affine4Weight, Affine8Weight; k_dim a multiple of 32 or 16; kAffineMaxRows rows at most). Returns 0, a CUDA error code, or 1 when the arguments are unsupported
// (rows x k_dim past the staging space among them).
extern "C" int pagewise_gemv(int dtype, int input, void* y, const void* x, const void* norm_w,
                             const void* w, int w_kind, const void* scales, int block_rows,
                             int block_cols, const void* residual, int rows, int out_dim,
                             int k_dim, float eps, void* stream) {
  if (rows == 0 || out_dim == 0) return 0;
  if (k_dim % 8 != 0) return 1;
  if (!weight_fits(w_kind, out_dim, k_dim, block_rows, block_cols)) return 1;
  if (input == kAddNormed) return 1;  // (pagewise_gemv_add_normed)
  const GemvArgs a = {y,      x,      norm_w,     w,          residual, out_dim,
                      k_dim,  eps,    (cudaStream_t)stream, nullptr, nullptr, nullptr,
                      w_kind, scales, block_rows, block_cols};
  return dispatch_gemv<CudaCoreGemv>(dtype, input, rows, a);
}

// y ([rows, out_dim]) = RMSNorm(s) * norm_w times w^T ([out_dim, k_dim]) for s = stream_in +
// RMSNorm(delta) * delta_w (delta's norm rounded to the dtype before the add, s rounded as
// stored; delta and stream_in [rows, k_dim], both weights [k_dim], one eps), also storing s to
// stream_out ([rows, k_dim], apart from stream_in): Gemma's normalized residual add folded into
// the next projection's staging. Rows 1..8, dtype 1 = f16, 2 = bf16, k_dim a multiple of 8,
// every pointer 16-byte aligned; the weight as pagewise_gemv's. Returns 0, a CUDA error code,
// or 1 when the arguments are unsupported.
extern "C" int pagewise_gemv_add_normed(int dtype, void* y, void* stream_out, const void* delta,
                                        const void* stream_in, const void* delta_w,
                                        const void* norm_w, const void* w, int w_kind,
                                        const void* scales, int block_rows, int block_cols,
                                        int rows, int out_dim, int k_dim, float eps,
                                        void* stream) {
  if (rows == 0 || out_dim == 0) return 0;
  if (k_dim % 8 != 0) return 1;
  if (!weight_fits(w_kind, out_dim, k_dim, block_rows, block_cols)) return 1;
  const GemvArgs a = {y,      delta,  norm_w,     w,        nullptr,   out_dim,
                      k_dim,  eps,    (cudaStream_t)stream, stream_in, delta_w, stream_out,
                      w_kind, scales, block_rows, block_cols};
  return dispatch_gemv<CudaCoreGemv>(dtype, kAddNormed, rows, a);
}

// The qkv projection of RMSNorm(x) * norm_w (x [rows, k_dim], w [(heads + 2 kv_heads) d, k_dim],
// q heads then k heads then v heads) with rotary and the cache write folded in: the rotated q
// goes to q_out ([rows, heads, d]), the rotated k and the v to the caches ([.., kv_heads, d] per
// slot) at slots[r] (i64; skipped when negative). cos and sin: [rows, d / 2], or with
// `positions` (u32 [rows]) whole tables [table_rows, d / 2] read at row r's position (clamped to
// the last table row); pairs (2i, 2i + 1)
// when interleaved, else (i, i + d / 2). Rows 1..8, dtype 1 = f16, 2 = bf16, d even, k_dim a
// multiple of 8, x, norm_w and w 16-byte aligned; the weight as pagewise_gemv's. Returns 0, a
// CUDA error code, or 1 when the arguments are unsupported.
extern "C" int pagewise_gemv_rope(int dtype, void* q_out, void* k_cache, void* v_cache,
                                  const void* cos, const void* sin, const uint32_t* positions,
                                  int table_rows, const int64_t* slots,
                                  const void* x, const void* norm_w, const void* w, int w_kind,
                                  const void* scales, int block_rows, int block_cols, int rows,
                                  int heads, int kv_heads, int head_dim, int interleaved,
                                  int k_dim, float eps, void* stream) {
  if (rows == 0) return 0;
  if (k_dim % 8 != 0 || head_dim % 2 != 0) return 1;
  if (positions != nullptr && table_rows < 1) return 1;
  // (Its warps take pairs of rows: 4-bit weights row by row, not in tiles.)
  if (w_kind == kInt4Tiles || !weight_fits(w_kind, 0, k_dim, block_rows, block_cols)) return 1;
  const QkvRopeArgs a = {q_out, k_cache, v_cache, cos,   sin,      positions, table_rows,
                         slots, x,       norm_w,  w,     rows,     heads,     kv_heads,
                         head_dim, interleaved, k_dim, eps, w_kind, scales, block_rows,
                         block_cols};
  cudaStream_t s = (cudaStream_t)stream;
  switch (dtype) {
    case 1: return launch_rope<__half>(a, s);
    case 2: return launch_rope<__nv_bfloat16>(a, s);
    default: return 1;
  }
}

// The most bytes of staged input (rows x k_dim x element size) pagewise_gemv takes.
extern "C" int pagewise_gemv_max_stage_bytes() { return kMaxStageBytes; }
