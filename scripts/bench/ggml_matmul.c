// llama.cpp's own CPU matmul per GGUF type, timed the way pagewise-cpu's `bandwidth` test times
// ours (issue 62): an 8192 x 2048 weight (a Llama-3.2-1B MLP matrix) against one activation row
// over copies filling 384 MiB (decode: weights from memory) and against 64 rows (prefill), with
// the weights in the CPU backend's repacking buffer where llama.cpp repacks that type (as
// llama-bench loads them) and in a plain buffer otherwise.
//
//   scripts/bench/ggml_matmul.sh   # builds this against the peer kit's CPU build and runs it
//
// Prints one line a type: decode µs and GB/s of weights, prefill ms and GMAC/s, and whether the
// repacked kernels ran.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

enum { ROWS = 8192, COLS = 2048, PREFILL = 64, PASS_MIB = 384 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Seconds of the best of `reps` runs of `gf` after one warm-up.
static double best_of(ggml_backend_t be, struct ggml_cgraph * gf, int reps) {
    ggml_backend_graph_compute(be, gf);
    double best = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t = now();
        ggml_backend_graph_compute(be, gf);
        t = now() - t;
        best = t < best ? t : best;
    }
    return best;
}

static void measure(ggml_backend_t be, ggml_backend_buffer_type_t repack, enum ggml_type type,
                    const float * values, const float * x) {
    size_t bytes = ggml_row_size(type, COLS) * ROWS;
    int copies = (int) (((size_t) PASS_MIB << 20) / bytes) + 1;
    // The weights: `copies` tensors in the repacking buffer where it takes this type.
    struct ggml_init_params wp = {ggml_tensor_overhead() * (copies + 1), NULL, true};
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor ** w = malloc(sizeof(*w) * copies);
    for (int c = 0; c < copies; c++) {
        w[c] = ggml_new_tensor_2d(wctx, type, COLS, ROWS);
    }
    // Activations and the graphs' tensors.
    struct ggml_init_params ap = {ggml_tensor_overhead() * (2 * copies + 8) + ggml_graph_overhead_custom(4 * copies, false) * 2, NULL, true};
    struct ggml_context * actx = ggml_init(ap);
    struct ggml_tensor * one = ggml_new_tensor_2d(actx, GGML_TYPE_F32, COLS, 1);
    struct ggml_tensor * many = ggml_new_tensor_2d(actx, GGML_TYPE_F32, COLS, PREFILL);

    // As llama.cpp's loader picks a weight's buffer: the repacking one where the CPU device says
    // that a matmul with the weight in it runs (a tensor of a zero-size buffer of that type asks).
    int repacked = 0;
    if (repack != NULL) {
        ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(repack, 0);
        w[0]->buffer = dummy;
        repacked = ggml_backend_dev_supports_op(ggml_backend_get_device(be), ggml_mul_mat(actx, w[0], many));
        w[0]->buffer = NULL;
        ggml_backend_buffer_free(dummy);
    }
    ggml_backend_buffer_t wbuf =
        ggml_backend_alloc_ctx_tensors_from_buft(wctx, repacked ? repack : ggml_backend_cpu_buffer_type());
    void * q = malloc(bytes);
    ggml_quantize_chunk(type, values, q, 0, ROWS, COLS, NULL);
    for (int c = 0; c < copies; c++) {
        ggml_backend_tensor_set(w[c], q, 0, bytes);
    }

    struct ggml_cgraph * decode = ggml_new_graph_custom(actx, 4 * copies, false);
    for (int c = 0; c < copies; c++) {
        ggml_build_forward_expand(decode, ggml_mul_mat(actx, w[c], one));
    }
    struct ggml_cgraph * prefill = ggml_new_graph_custom(actx, 4, false);
    ggml_build_forward_expand(prefill, ggml_mul_mat(actx, w[0], many));
    ggml_backend_buffer_t abuf = ggml_backend_alloc_ctx_tensors_from_buft(actx, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(one, x, 0, sizeof(float) * COLS);
    ggml_backend_tensor_set(many, x, 0, sizeof(float) * COLS * PREFILL);

    double d = best_of(be, decode, 5) / copies;
    double p = best_of(be, prefill, 3);
    printf("| %s | %d x %d | %.1f MB | %.0f µs | %.1f | %.1f ms | %.1f | %s |\n", ggml_type_name(type),
           ROWS, COLS, bytes / 1e6, d * 1e6, bytes / d / 1e9, p * 1e3, (double) PREFILL * ROWS * COLS / p / 1e9,
           repacked ? "repacked" : "plain");
    ggml_backend_buffer_free(abuf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(actx);
    ggml_free(wctx);
    free(q);
    free(w);
}

int main(int argc, char ** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, threads);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = NULL;
    if (get_extra != NULL) {
        for (ggml_backend_buffer_type_t * b = get_extra(dev); b != NULL && *b != NULL; b++) {
            if (strstr(ggml_backend_buft_name(*b), "REPACK") != NULL) {
                repack = *b;
            }
        }
    }
    float * values = malloc(sizeof(float) * ROWS * COLS);
    for (size_t i = 0; i < (size_t) ROWS * COLS; i++) {
        values[i] = (float) ((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    }
    float * x = malloc(sizeof(float) * PREFILL * COLS);
    for (size_t i = 0; i < (size_t) PREFILL * COLS; i++) {
        x[i] = (float) (i % 17) / 17.0f;
    }
    printf("llama.cpp (ggml) CPU matmul, %d threads; repacking buffer: %s\n", threads,
           repack != NULL ? ggml_backend_buft_name(repack) : "none");
    printf("| type | matrix | bytes | decode (1 row) | GB/s | prefill (%d rows) | GMAC/s | weights |\n", PREFILL);
    printf("|---|---|---|---|---|---|---|---|\n");
    enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                              GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                              GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_F16, GGML_TYPE_BF16};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        measure(be, repack, types[t], values, x);
    }
    ggml_backend_free(be);
    return 0;
}
