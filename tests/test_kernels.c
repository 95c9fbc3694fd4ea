/* test_kernels.c: the kernels and number formats: every matmul path (SIMD
 * and portable, float32 and q8_0, one token and blocks) against run.c's
 * matmul_reference and a double sum; attention scores, attention blocks (with
 * windows, an f16 cache, threads, Self-Extend) against a double reference or
 * the one-query path; exp_fast against libm; the half conversions against the
 * compiler's _Float16. Part of test_run (test_run.c): each build of it
 * (Makefile, TEST_RUN_C) tests the SIMD kernels its flags select.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

/* run.c's matmul_reference (float, summed in order) into double, the
 * reference every matmul kernel is checked against below. */
static void matmul_ref(double *out, const float *x, const float *w, int B, int n, int d) {
    float *f = malloc(sizeof(float) * B * d);
    matmul_reference(f, x, w, B, n, d);
    for (int i = 0; i < B * d; i++) out[i] = f[i];
    free(f);
}

/* int8 activations in blocks (--q8-activations int8): matmul with
 * int8_blocks takes the q8_0 column kernel in VNNI builds (int8 dot products
 * in others: q8_method must say so) and gives the int8 dot products'
 * results: the same integer sums in another float order, so within 1e-4
 * relative to the output scale sqrt(n), and NaN (from a group of x that holds
 * one) in exactly the same outputs. */
static void check_int8_blocks(const float *x, const int8_t *wq, const float *ws, int B, int n, int d, int gs,
                              int expect_nans) {
    int threads = 1, ldx = simd_round_up(B);
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    float *dots = malloc(sizeof(float) * B * d), *cols = malloc(sizeof(float) * B * d);
    float *xs = malloc(sizeof(float) * B * n / gs);
    int8_t *xq = malloc((size_t)B * n);
    Matrix mq = {WEIGHT_Q8_0, gs, wq, ws, NULL, NULL};
    MatmulScratch int8_only = {.x_q = xq, .x_scale = xs};
    matmul(dots, x, mq, B, n, d, &int8_only);
    MatmulScratch blocks = {.x_q = xq, .x_scale = xs, .threads = threads, .x_qt = malloc((size_t)n * ldx),
                            .x_scale_t = malloc(sizeof(float) * (n / gs) * ldx),
                            .w_sums = malloc(sizeof(int32_t) * threads * ROW_CHUNK * (n / gs)), .int8_blocks = 1};
    int method = q8_method(&blocks, B, gs);
    CHECK(method == (HAVE_Q8_COLS ? Q8_COLUMNS : Q8_DOTS), "q8_method with int8 activations, B=%d gs=%d: %d", B, gs,
          method);
    matmul(cols, x, mq, B, n, d, &blocks);
    double worst = 0;
    int nan_apart = 0, nans = 0;
    for (int i = 0; i < B * d; i++) {
        nans += isnan(cols[i]);
        if (isnan(dots[i]) || isnan(cols[i])) nan_apart += isnan(dots[i]) != isnan(cols[i]);
        else worst = fmax(worst, fabs(cols[i] - dots[i]));
    }
    CHECK(worst < 1e-4 * sqrt((double)n) && nan_apart == 0 && nans == expect_nans,
          "q8_0 matmul B=%d n=%d d=%d gs=%d, int8 activations (%s) vs int8 dot products: %.3g, %d NaN apart, "
          "%d NaN (expected %d)", B, n, d, gs, method == Q8_COLUMNS ? "column kernel" : "dot products", worst,
          nan_apart, nans, expect_nans);
    free(dots), free(cols), free(xs), free(xq), free(blocks.x_qt), free(blocks.x_scale_t), free(blocks.w_sums);
}

/* Generation's float32 matmul (one token) in a matrix big enough to be
 * split between threads, rows one at a time and 4 or 8 side by side from as
 * many runs of each thread's rows (f32_rows_together): against
 * matmul_reference within test_matmul_kernels' 2e-4 (below), and the same
 * bits on 1 thread and on 4 (one row at a time: chunks of ROW_CHUNK rows;
 * runs: every row's sum is the same arithmetic, whatever rows it runs
 * beside, so 4 and 8 runs give the same bits too). In a SIMD build the runs
 * must also give other bits than one row at a time somewhere (four partial
 * sums a row against one), so that the runs' kernel is known to have run.
 * Outputs are set to NaN before each call: a pass that writes nothing fails.
 * d = 301: chunks and runs with rows left over. */
void test_generation_rows(void) {
    int n = 256, d = 301;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * d * n);
    float *one = malloc(sizeof(float) * d), *four = malloc(sizeof(float) * d), *by_row = malloc(sizeof(float) * d);
    float *four_runs = malloc(sizeof(float) * d);
    double *ref = malloc(sizeof(double) * d);
    fill_randn(x, n, 1.0f);
    fill_randn(w, (size_t)d * n, 1.0f);
    matmul_ref(ref, x, w, 1, n, d);
    Matrix mf = {WEIGHT_F32, 0, w, NULL, NULL, NULL};
    CHECK((long)n * d >= PARALLEL_MIN_WORK, "the generation test's matrix is split between threads (n*d=%d)", n * d);
#ifdef _OPENMP
    int max_threads = omp_get_max_threads();
#endif
    int saved_simd = use_simd, saved_together = f32_rows_together;
    use_simd = HAVE_SIMD;
    const int settings[] = {1, 4, 8};
    for (int k = 0; k < 3; k++) {
        int together = settings[k];
        f32_rows_together = together;
        for (int t = 0; t < 2; t++) {
#ifdef _OPENMP
            omp_set_num_threads(t ? 4 : 1);
#endif
            memset(t ? four : one, 0xff, sizeof(float) * d); // NaN
            matmul(t ? four : one, x, mf, 1, n, d, NULL);
        }
        double worst = 0;
        for (int i = 0; i < d; i++) { // (fmax drops a NaN: counted as infinite)
            double e = fabs(one[i] - ref[i]);
            worst = isnan(e) ? INFINITY : fmax(worst, e);
        }
        CHECK(worst < 2e-4, "generation matmul n=%d d=%d, %d rows together: %.3g from the reference", n, d, together,
              worst);
        CHECK(memcmp(one, four, sizeof(float) * d) == 0,
              "generation matmul n=%d d=%d, %d rows together: 1 and 4 threads give other sums", n, d, together);
        if (together == 1) memcpy(by_row, one, sizeof(float) * d);
        if (together == 4) memcpy(four_runs, one, sizeof(float) * d);
    }
    CHECK(memcmp(four_runs, one, sizeof(float) * d) == 0,
          "generation matmul n=%d d=%d: 4 and 8 runs of rows give other sums", n, d);
#if HAVE_SIMD
    CHECK(memcmp(by_row, one, sizeof(float) * d) != 0,
          "generation matmul n=%d d=%d: 8 rows together gave the one-row kernel's bits (did it run?)", n, d);
    CHECK(memcmp(by_row, four_runs, sizeof(float) * d) != 0,
          "generation matmul n=%d d=%d: 4 rows together gave the one-row kernel's bits (did it run?)", n, d);
#endif
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    use_simd = saved_simd, f32_rows_together = saved_together;
    free(x), free(w), free(one), free(four), free(by_row), free(four_runs), free(ref);
}

/* q8_0 generation (one token) with each thread's rows in 2 runs taken in
 * turn (q8_runs = 2, AMD's setting) against the rows in order (q8_runs = 1):
 * every row goes through the same kernel, so the outputs must be the same
 * bits, on 1 thread and on 4, for group sizes 32 (the widest kernel, which
 * takes a run's two rows in one pass with AVX-512) and 64. n = 256: whole
 * steps of 8 groups; n = 576 (SmolLM2's dim): 2 groups left over at 32.
 * Outputs are NaN before each call; d = 301: threads' shares and runs with
 * rows left over. The rows-in-order result is checked against the portable
 * kernel by test_matmul_kernels. In a SIMD build the 2-run kernel must have
 * run (its call count); the portable build has no runs and compares the rows
 * in order with themselves. */
static void generation_q8_runs(int n) {
    int d = 301;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * d * n), *ws = malloc(sizeof(float) * d * n / 32);
    float *xs = malloc(sizeof(float) * n / 32), *in_order = malloc(sizeof(float) * d);
    float *runs = malloc(sizeof(float) * d);
    int8_t *wq = malloc((size_t)d * n), *xq = malloc((size_t)n);
    fill_randn(x, n, 1.0f);
    fill_randn(w, (size_t)d * n, 1.0f);
    MatmulScratch scratch = {.x_q = xq, .x_scale = xs};
#ifdef _OPENMP
    int max_threads = omp_get_max_threads();
#endif
    int saved_simd = use_simd, saved_runs = q8_runs;
    use_simd = HAVE_SIMD;
    for (int gs = 32; gs <= 64; gs += 32) {
        quantize_q8(wq, ws, w, d, n, gs);
        Matrix mq = {WEIGHT_Q8_0, gs, wq, ws, NULL, NULL};
        q8_runs = 1;
        memset(in_order, 0xff, sizeof(float) * d); // NaN
        matmul(in_order, x, mq, 1, n, d, &scratch);
        int nans = 0;
        for (int i = 0; i < d; i++) nans += isnan(in_order[i]);
        CHECK(nans == 0, "q8_0 generation n=%d d=%d gs=%d, rows in order: %d outputs not written", n, d, gs, nans);
        q8_runs = 2;
#if HAVE_SIMD && defined(TESTING)
        int calls = q8_runs_calls, pairs = q8_pair_calls;
#endif
        for (int t = 1; t <= 4; t += 3) {
#ifdef _OPENMP
            omp_set_num_threads(t);
#endif
            memset(runs, 0xff, sizeof(float) * d);
            matmul(runs, x, mq, 1, n, d, &scratch);
            CHECK(memcmp(in_order, runs, sizeof(float) * d) == 0,
                  "q8_0 generation n=%d d=%d gs=%d, 2 runs on %d thread(s): other bits than the rows in order", n, d,
                  gs, t);
        }
#if HAVE_SIMD && defined(TESTING)
        CHECK(q8_runs_calls == calls + 2, "q8_0 generation gs=%d: 2-run kernel ran %d times in 2 calls (expected 2)",
              gs, q8_runs_calls - calls);
        // with AVX-512 VNNI and gs = 32 a run's two rows go through one pass
        int expect_pairs = HAVE_Q8_AVX512 && gs == 32;
        CHECK((q8_pair_calls > pairs) == expect_pairs, "q8_0 generation gs=%d: the two-row pass ran %d times (%s)",
              gs, q8_pair_calls - pairs, expect_pairs ? "expected some" : "expected none");
#endif
#ifdef _OPENMP
        omp_set_num_threads(max_threads);
#endif
    }
    use_simd = saved_simd, q8_runs = saved_runs;
    free(x), free(w), free(ws), free(xs), free(in_order), free(runs), free(wq), free(xq);
}
void test_generation_q8_runs(void) {
    generation_q8_runs(256);
    generation_q8_runs(576);
}

/* The SIMD column kernel cuts k into passes and rows into groups
 * (kernels.c's COLS_K_BLOCK, COLS_GROUP_ROWS) and carries the sums between
 * passes, so each output must still be one FMA chain over k in order: equal,
 * bit for bit, to fmaf applied k = 0, 1, ... n-1. n = 600: two passes of 256
 * and a short one with AVX2; d = 53: chunks of 24 rows and one of 5 (tiles
 * of 4 and 1); B = 21: a partial vector of tokens. */
void test_column_passes(void) {
#if HAVE_SIMD
    int B = 21, n = 600, d = 53;
    float *x = malloc(sizeof(float) * B * n), *w = malloc(sizeof(float) * d * n), *out = malloc(sizeof(float) * B * d);
    float *xt = malloc(sizeof(float) * n * cols_round_up(B));
    MatmulScratch fs = {.x_t = xt};
    fill_randn(x, (size_t)B * n, 1.0f);
    fill_randn(w, (size_t)d * n, 1.0f);
    Matrix mf = {WEIGHT_F32, 0, w, NULL, NULL, NULL};
    use_simd = 1;
    matmul(out, x, mf, B, n, d, &fs);
    int differ = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) {
            float chain = 0.0f;
            for (int k = 0; k < n; k++) chain = fmaf(w[(size_t)i * n + k], x[(size_t)b * n + k], chain);
            differ += memcmp(&chain, &out[(size_t)b * d + i], sizeof chain) != 0;
        }
    CHECK(differ == 0, "column kernel B=%d n=%d d=%d: %d of %d outputs differ from the in-order FMA chain", B, n, d,
          differ, B * d);
    free(x), free(w), free(out), free(xt);
#endif
}

/* Every matmul path (SIMD column kernel, one-row kernels, portable tiles,
 * q8_0 int8 products, q8_0 dequantized rows) against run.c's
 * matmul_reference, and the reference itself against a double sum.
 * Tolerances: float32, different summation orders over n <= 768 terms of
 * unit-scale products: 1e-5 * sqrt(n)-ish, written 2e-4 absolute on outputs of
 * magnitude ~sqrt(n). q8_0: the same integer sums, only the float
 * accumulation order differs: 1e-4 relative to the output scale.
 * Shapes include edge tiles (d % 6 != 0: the last rows in tiles of 4, 2, 1;
 * B % 16 != 0; B = 70 and 128: several tiles of 64 tokens with AVX-512, of
 * 16 with AVX2; for the q8_0 column kernel, of 32 and 8) and n % 8 != 0. */
void test_matmul_kernels(void) {
    int shapes[][3] = {{1, 288, 36}, {5, 288, 37}, {32, 64, 16}, {7, 172, 9}, {2, 96, 5}, {3, 512, 12},
                       {17, 100, 30}, {32, 768, 13}, {70, 96, 29}, {128, 64, 7}, {45, 96, 29}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int B = shapes[c][0], n = shapes[c][1], d = shapes[c][2], gs = n % 32 == 0 ? 32 : 4;
        float *x = malloc(sizeof(float) * B * n), *w = malloc(sizeof(float) * d * n);
        float *simd = malloc(sizeof(float) * B * d), *port = malloc(sizeof(float) * B * d);
        float *wd = malloc(sizeof(float) * d * n), *ws = malloc(sizeof(float) * d * n / gs);
        float *xs = malloc(sizeof(float) * B * n / gs);
        int8_t *wq = malloc((size_t)d * n), *xq = malloc((size_t)B * n);
        float *xt = malloc(sizeof(float) * n * cols_round_up(B)); // x transposed, for blocks (the column kernel)
        MatmulScratch fs = {.x_t = xt};
        double *ref = malloc(sizeof(double) * B * d);
        fill_randn(x, (size_t)B * n, 1.0f);
        fill_randn(w, (size_t)d * n, 1.0f);
        matmul_ref(ref, x, w, B, n, d);
        double worst_def = 0; // the definition itself, against double
        for (int b = 0; b < B; b++)
            for (int i = 0; i < d; i++)
                worst_def = fmax(worst_def, fabs(ref[(size_t)b * d + i] - dot64(x + (size_t)b * n, w + (size_t)i * n, n)));
        CHECK(worst_def < 2e-4, "matmul_reference B=%d n=%d d=%d vs double: %.3g", B, n, d, worst_def);
        Matrix mf = {WEIGHT_F32, 0, w, NULL, NULL, NULL};
        use_simd = HAVE_SIMD;
        matmul(simd, x, mf, B, n, d, &fs);
        use_simd = 0;
        matmul(port, x, mf, B, n, d, &fs);
        double worst = 0, worst_ref = 0;
        for (int i = 0; i < B * d; i++) {
            worst = fmax(worst, fabs(simd[i] - port[i]));
            worst_ref = fmax(worst_ref, fmax(fabs(simd[i] - ref[i]), fabs(port[i] - ref[i])));
        }
        CHECK(worst < 2e-4 && worst_ref < 2e-4, "f32 matmul B=%d n=%d d=%d: simd vs portable %.3g, vs reference %.3g",
              B, n, d, worst, worst_ref);
        // Token b alone (generation's one-row kernel, four partial sums, or 4
        // or 8 runs' rows side by side, one sum each: kernels.h's
        // f32_rows_together, all run here whatever the CPU) gives its row of
        // the block (one FMA chain per output) up to the summation order: the
        // same 2e-4.
        use_simd = HAVE_SIMD;
        int saved_together = f32_rows_together, saved_prefetch = prefetch_f32;
        for (int together = 1; together <= 8; together *= 2) {
            if (together == 2) continue; // 1, 4, 8
            f32_rows_together = together;
            double worst_alone = 0;
            for (int b = 0; b < B; b++) {
                memset(port, 0xff, sizeof(float) * d); // NaN: a pass that writes nothing fails
                matmul(port, x + (size_t)b * n, mf, 1, n, d, &fs);
                for (int i = 0; i < d; i++) { // (fmax drops a NaN: counted as infinite)
                    double e = fabs(port[i] - simd[(size_t)b * d + i]);
                    worst_alone = isnan(e) ? INFINITY : fmax(worst_alone, e);
                }
            }
            CHECK(worst_alone < 2e-4,
                  "f32 matmul B=%d n=%d d=%d, %d rows together: a token alone differs from its block row by %.3g", B,
                  n, d, together, worst_alone);
        }
        // The one-row kernel (every row one at a time) with and without its
        // software prefetch (kernels.h's prefetch_f32, chosen from the CPU):
        // the same sums, bit for bit.
        f32_rows_together = 1;
        int same_bits = 1;
        float *other = malloc(sizeof(float) * d);
        for (int b = 0; b < B; b++) {
            prefetch_f32 = 1;
            matmul(port, x + (size_t)b * n, mf, 1, n, d, &fs);
            prefetch_f32 = 0;
            matmul(other, x + (size_t)b * n, mf, 1, n, d, &fs);
            same_bits &= memcmp(port, other, sizeof(float) * d) == 0;
        }
        f32_rows_together = saved_together, prefetch_f32 = saved_prefetch;
        free(other);
        CHECK(same_bits, "f32 matmul B=%d n=%d d=%d: the one-row kernel's sums differ with and without prefetch", B,
              n, d);

        // q8_0: quantize W; the kernels against each other and against the
        // float matmul with the dequantized W (error from quantizing x only).
        quantize_q8(wq, ws, w, d, n, gs);
        // -128: outside the format's -127..127 (export never writes it) but an
        // int8 all the same; every kernel must still be exact (no sign wrap)
        wq[0] = wq[(size_t)d * n - 1] = -128;
        for (size_t i = 0; i < (size_t)d * n; i++) wd[i] = wq[i] * ws[i / gs];
        Matrix mq = {WEIGHT_Q8_0, gs, wq, ws, NULL, NULL};
        MatmulScratch int8_only = {.x_q = xq, .x_scale = xs}; // no w_rows: int8 dot products for any B
        matmul(simd, x, mq, B, n, d, &int8_only);
        use_simd = 0;
        matmul(port, x, mq, B, n, d, &int8_only);
        use_simd = HAVE_SIMD;
        matmul_ref(ref, x, wd, B, n, d);
        double scale = sqrt((double)n), worst_q = 0, worst_deq = 0;
        for (int i = 0; i < B * d; i++) {
            worst_q = fmax(worst_q, fabs(simd[i] - port[i]));
            worst_deq = fmax(worst_deq, fabs(simd[i] - ref[i]));
        }
        // quantizing x: relative error per value <= 1/254 of the group max, ~0.5% of the output scale
        CHECK(worst_q < 1e-4 * scale && worst_deq < 0.03 * scale,
              "q8_0 matmul B=%d n=%d d=%d gs=%d: simd vs portable %.3g, vs dequantized float %.3g", B, n, d, gs,
              worst_q, worst_deq);
        if (B > 1) { // several tokens with w_rows: dequantized rows, the float kernel
            int threads = 1;
#ifdef _OPENMP
            threads = omp_get_max_threads();
#endif
            MatmulScratch full = {.x_t = xt, .x_q = xq, .x_scale = xs,
                                  .w_rows = malloc(sizeof(float) * threads * ROW_CHUNK * n), .threads = threads};
            CHECK(q8_method(&full, B, gs) == Q8_ROWS && q8_method(&full, 1, gs) == Q8_DOTS,
                  "q8_method B=%d: %d (expected dequantized rows), B=1: %d (expected dot products)",
                  B, q8_method(&full, B, gs), q8_method(&full, 1, gs));
            matmul(port, x, mq, B, n, d, &full);
            double worst_rows = 0;
            for (int i = 0; i < B * d; i++) worst_rows = fmax(worst_rows, fabs(port[i] - ref[i]));
            CHECK(worst_rows < 2e-4, "q8_0 matmul B=%d n=%d d=%d, dequantized rows vs reference: %.3g", B, n, d,
                  worst_rows);
            free(full.w_rows);
            check_int8_blocks(x, wq, ws, B, n, d, gs, 0);
        }
        free(x), free(w), free(simd), free(port), free(wd), free(ws), free(xs), free(wq), free(xq), free(ref), free(xt);
    }
}

/* q8_0 with group sizes other than 32, one token and in blocks, and a NaN in
 * one token's activations. */
void test_q8_group_sizes(void) {
    // q8_0 generation kernel (one token) with group sizes other than 32:
    // SIMD against portable, the same 1e-4 relative to the output scale.
    for (int gs = 64; gs <= 128; gs *= 2) {
        int n = 256, d = 7;
        float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * d * n);
        float *ws = malloc(sizeof(float) * d * n / gs), *xs = malloc(sizeof(float) * n / gs), simd[7], port[7];
        int8_t *wq = malloc((size_t)d * n), *xq = malloc((size_t)n);
        fill_randn(x, (size_t)n, 1.0f);
        fill_randn(w, (size_t)d * n, 1.0f);
        quantize_q8(wq, ws, w, d, n, gs);
        Matrix mq = {WEIGHT_Q8_0, gs, wq, ws, NULL, NULL};
        MatmulScratch int8_only = {.x_q = xq, .x_scale = xs};
        matmul(simd, x, mq, 1, n, d, &int8_only);
        use_simd = 0;
        matmul(port, x, mq, 1, n, d, &int8_only);
        use_simd = HAVE_SIMD;
        double worst = 0;
        for (int i = 0; i < d; i++) worst = fmax(worst, fabs(simd[i] - port[i]));
        CHECK(worst < 1e-4 * sqrt((double)n), "q8_0 one-token matmul gs=%d: simd vs portable %.3g", gs, worst);
        free(x), free(w), free(ws), free(xs), free(wq), free(xq);
    }
    // int8 activations in blocks with group sizes other than 32 (several
    // 32-byte steps per group), and with a NaN in one token's x: NaN in
    // that token's outputs only.
    for (int gs = 64; gs <= 128; gs *= 2)
        for (int with_nan = 0; with_nan <= 1; with_nan++) {
            int B = 37, n = 256, d = 13;
            float *x = malloc(sizeof(float) * B * n), *w = malloc(sizeof(float) * d * n);
            float *ws = malloc(sizeof(float) * d * n / gs);
            int8_t *wq = malloc((size_t)d * n);
            fill_randn(x, (size_t)B * n, 1.0f);
            fill_randn(w, (size_t)d * n, 1.0f);
            if (with_nan) x[5 * n + 77] = NAN;
            quantize_q8(wq, ws, w, d, n, gs);
            check_int8_blocks(x, wq, ws, B, n, d, gs, with_nan ? d : 0);
            free(x), free(w), free(ws), free(wq);
        }
}

/* matrix_row's dequantization, and quantize_q8 on non-finite and subnormal
 * values. */
void test_q8_rows_and_quantize(void) {
    // matrix_row dequantizes one row (the embedding lookup)
    int8_t q[8] = {1, -2, 3, -4, 127, 0, -127, 5};
    float sc[2] = {0.5f, 2.0f}, row[4];
    matrix_row(row, (Matrix){WEIGHT_Q8_0, 4, q, sc, NULL, NULL}, 1, 4);
    CHECK(row[0] == 254 && row[1] == 0 && row[2] == -254 && row[3] == 10, "matrix_row q8_0: %g %g %g %g", row[0],
          row[1], row[2], row[3]);
    // quantize_q8 never converts a non-finite float to an integer: a group holding a
    // NaN or an infinity gets q = 0 and scale NaN; the other groups are untouched.
    float xs[12] = {1, -2, 0.5f, 4, NAN, 1, 2, 3, 1, INFINITY, -1, 0};
    int8_t qx[12];
    float sx[3];
    quantize_q8(qx, sx, xs, 1, 12, 4);
    int zeros = 1;
    for (int i = 4; i < 12; i++) zeros &= qx[i] == 0;
    CHECK(sx[0] == 4.0f / 127 && qx[3] == 127 && qx[1] == -64 && isnan(sx[1]) && isnan(sx[2]) && zeros,
          "quantize_q8 with NaN and infinity: scales %g %g %g", sx[0], sx[1], sx[2]);
    // Values so small that 1/scale overflows (a subnormal scale; found by fuzz_checkpoint).
    float tiny[4] = {1e-39f, -5e-40f, 0, 2e-45f};
    quantize_q8(qx, sx, tiny, 1, 4, 4);
    CHECK(qx[0] == 127 && qx[1] == -64 && qx[2] == 0 && qx[3] == 0 && sx[0] == 1e-39f / 127,
          "quantize_q8 of subnormal values: q %d %d %d %d, scale %g", qx[0], qx[1], qx[2], qx[3], sx[0]);
}

/* causal attention in double, straight from the formula in run.c's
 * attention: out (B, nh, hs) for queries q (B, nh, hs) at pos0.. against
 * keys, values (n_ctx, nkv * hs); with window W > 0 the query at position p
 * sees keys p - W + 1 .. p only. */
static void attention_ref(double *out, const float *q, const float *keys, const float *values, int B, int pos0,
                          int nh, int nkv, int hs, int window) {
    int kv_dim = nkv * hs;
    double *w = malloc(sizeof(double) * (pos0 + B));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)b * nh + h) * hs;
            int n = pos0 + b + 1, kv = h / (nh / nkv), lo = window > 0 && n > window ? n - window : 0;
            double max = -INFINITY, sum = 0;
            for (int t = lo; t < n; t++) {
                w[t] = dot64(qh, keys + (size_t)t * kv_dim + kv * hs, hs) / sqrt((double)hs);
                max = fmax(max, w[t]);
            }
            for (int t = lo; t < n; t++) sum += w[t] = exp(w[t] - max);
            for (int i = 0; i < hs; i++) {
                double o = 0;
                for (int t = lo; t < n; t++) o += w[t] / sum * values[(size_t)t * kv_dim + kv * hs + i];
                out[((size_t)b * nh + h) * hs + i] = o;
            }
        }
    free(w);
}

/* |a - b|, infinity when either is NaN (fmax would drop a NaN) */
static double abs_err(double a, double b) { return isnan(a) || isnan(b) ? INFINITY : fabs(a - b); }

/* Self-Extend in blocks: attention_block with grouped queries and keys (a
 * score from the grouped pair when the key lies W or more positions before
 * the query) against the one-query path, which reads the same arrays; blocks
 * of 2 to 260 queries whose key tiles lie wholly on either side of the line
 * or across it, 1 to 2 threads, GQA and a head size off the vector width.
 * Both sum in float in other orders, with exp_fast: the 2e-5 of the plain
 * block test. (End to end, tests/test_extrapolation.py checks Self-Extend's
 * NLL in blocks against a float64 numpy forward pass.) */
void test_attention_block_self_extend(void) {
    int cases[][5] = {{16, 130, 150, 5, 1}, {20, 7, 200, 60, 2}, {16, 260, 0, 1, 2}, {8, 2, 100, 3, 1},
                      {16, 40, 30, 200, 1}, // head_size, B, pos0, W, threads; then the lines' edges at a tile's:
                      {16, 60, 51, 5, 1},   // key 47, the last of tile 0, is W - 1 before the first query
                      {16, 3, 51, 5, 1}};   // key 48, the first of tile 1, is W before the last query
    int nh = 4, nkv = 2, n_ctx = 300;
    double worst = 0;
#ifdef _OPENMP
    int max_threads = omp_get_max_threads();
#endif
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int hs = cases[c][0], B = cases[c][1], pos0 = cases[c][2], W = cases[c][3], dim = nh * hs, kv_dim = nkv * hs;
        size_t cache_n = (size_t)n_ctx * kv_dim;
        float *q = malloc(sizeof(float) * B * dim), *qg = malloc(sizeof(float) * B * dim);
        float *out = malloc(sizeof(float) * B * dim), *out2 = malloc(sizeof(float) * B * dim);
        float *keys = malloc(sizeof(float) * cache_n), *grouped = malloc(sizeof(float) * cache_n);
        float *values = malloc(sizeof(float) * cache_n), *scores = malloc(sizeof(float) * nh * n_ctx);
        float *tiles = malloc(sizeof(float) * 2 * attention_block_floats(hs, nh / nkv));
        fill_randn(q, (size_t)B * dim, 2.0f);
        fill_randn(qg, (size_t)B * dim, 2.0f);
        fill_randn(keys, cache_n, 1.0f);
        fill_randn(grouped, cache_n, 1.0f);
        fill_randn(values, cache_n, 1.0f);
        Transformer t = attention_fixture(nh, nkv, hs, n_ctx, scores, tiles);
        t.pos.se_window = W, t.keys = KEYS_SELF_EXTEND;
#ifdef _OPENMP
        omp_set_num_threads(cases[c][4]);
#endif
        t.state.mm.threads = cases[c][4];
        CacheView view = {keys, KV_F32, values, KV_F32, pos0, 0, {qg, grouped, W, 0}, NULL};
        attention(out, q, &view, B, &t);
        for (int b = 0; b < B; b++) {
            CacheView one = {keys, KV_F32, values, KV_F32, pos0 + b, 0, {qg + (size_t)b * dim, grouped, W, 0}, NULL};
            attention(out2 + (size_t)b * dim, q + (size_t)b * dim, &one, 1, &t);
        }
        for (int e = 0; e < B * dim; e++) worst = fmax(worst, abs_err(out[e], out2[e]));
        free(q), free(qg), free(out), free(out2), free(keys), free(grouped), free(values), free(scores), free(tiles);
    }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    CHECK(worst < 2e-5, "Self-Extend attention: block vs one query at a time %.3g (expected < 2e-5)", worst);
}

/* The double reference of attention with a second query per query for the
 * first n_sinks rows (attention sinks in a block, kernels.h's SecondQueries):
 * query b at row p = pos0 + b scores rows 0 .. min(n_sinks, p + 1) - 1 with
 * q2 (keys2) and rows max(n_sinks, p + 1 - window) .. p with q (keys), one
 * softmax over both. With frames (f not NULL) q and the keys come unrotated:
 * query b and key t are rotated, in double, at angles p * inv_freq and
 * t * inv_freq of query b's own frequencies freq[b] (pairs of `layout`, the
 * first rot dims), each times mscale[b]. With stats (not NULL), each query
 * and head's row of kernels.h's AttnTally from the weights p_t: the entropy
 * -sum p_t ln p_t, the mass of each distance bucket (bucket[p - t], nb of
 * them) and the sinks' mass. */
static void attention_ref2(double *out, const float *q, const float *q2, const float *keys, const float *keys2,
                           const float *values, int B, int pos0, int nh, int nkv, int hs, int window, int n_sinks,
                           const double *freq, const double *mscale, int rot, int layout, double *stats,
                           const int *bucket, int nb) {
    int kv_dim = nkv * hs, np = rot / 2;
    double *w = malloc(sizeof(double) * (pos0 + B)), *qr = malloc(sizeof(double) * hs);
    double *kr = malloc(sizeof(double) * hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int p = pos0 + b, kv = h / (nh / nkv), lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
            double max = -INFINITY, sum = 0;
            for (int t = 0; t <= p; t++) {
                int sink = t < n_sinks;
                if (!sink && t < lo) continue;
                const float *qh = (sink ? q2 : q) + ((size_t)b * nh + h) * hs;
                const float *kt = (sink ? keys2 : keys) + (size_t)t * kv_dim + kv * hs;
                for (int i = 0; i < hs; i++) qr[i] = qh[i], kr[i] = kt[i];
                for (int i = 0; freq && i < np; i++) { // frames: rotate both, at their own rows
                    int x = layout == ROPE_INTERLEAVED ? 2 * i : i, y = layout == ROPE_INTERLEAVED ? 2 * i + 1 : i + np;
                    double aq = p * freq[(size_t)b * np + i], ak = t * freq[(size_t)b * np + i];
                    double qx = qr[x], qy = qr[y], kx = kr[x], ky = kr[y];
                    qr[x] = mscale[b] * (qx * cos(aq) - qy * sin(aq));
                    qr[y] = mscale[b] * (qx * sin(aq) + qy * cos(aq));
                    kr[x] = mscale[b] * (kx * cos(ak) - ky * sin(ak));
                    kr[y] = mscale[b] * (kx * sin(ak) + ky * cos(ak));
                }
                double d = 0;
                for (int i = 0; i < hs; i++) d += qr[i] * kr[i];
                w[t] = d / sqrt((double)hs);
                max = fmax(max, w[t]);
            }
            for (int t = 0; t <= p; t++)
                if (t < n_sinks || t >= lo) sum += w[t] = exp(w[t] - max);
            for (int i = 0; i < hs; i++) {
                double o = 0;
                for (int t = 0; t <= p; t++)
                    if (t < n_sinks || t >= lo) o += w[t] / sum * values[(size_t)t * kv_dim + kv * hs + i];
                out[((size_t)b * nh + h) * hs + i] = o;
            }
            double *row = stats ? stats + ((size_t)b * nh + h) * (nb + 2) : NULL;
            for (int k = 0; row && k < nb + 2; k++) row[k] = 0;
            for (int t = 0; row && t <= p; t++)
                if (t < n_sinks || t >= lo) {
                    double pt = w[t] / sum;
                    row[0] -= pt > 0 ? pt * log(pt) : 0;
                    row[t < n_sinks ? 1 + nb : 1 + bucket[p - t]] += pt;
                }
        }
    free(w), free(qr), free(kr);
}

/* attention_block with attention sinks' second queries and with per-query
 * frames (kernels.h; run.c's sinks_block and build_frames make them), against
 * attention_ref2 in double, the SIMD and the portable tiles, 1 and 2 threads.
 * Sinks: 4 sinks and a window of 20 (as sinks_block lays out a cache of 24:
 * the first query at row 23; a block of 30 from row 0, among the sinks; and a
 * first window that leaves rows 4..20 out), and 60 sinks (two tiles of them)
 * with a window of 50 and 140 queries (two tiles of queries); rows no query
 * sees (between the sinks and the first window) hold NaN.
 * Frames: random frequencies per query (0 to 1 radian a position) and
 * magnitudes (0.8 to 1.25), both layouts, full and partial rotary (24 of 32
 * dims), blocks of 7 and 140 queries at rows 5 and 100, no window and a
 * window of 30 (tiles start at multiples of ATT_KEYS, the window's edge
 * inside one), GQA (the frames' two heads of a key head in one pass).
 * Tolerance: the 2e-5 of the plain block test (the frames add a rotation in
 * float of each query and key: a few ulp of unit-scale products); measured
 * 6.7e-7 with sinks, 8.4e-7 with frames (AVX-512 build), 1.1e-6 with frames
 * once the heads of a key head share the keys' rotation (AVX2 build; 9.3e-7
 * before). With frames, 1 and 8 threads give the same bits: one group of the
 * key head's 2 query heads, or each head alone (kernels.c's frame_group).
 * Every case also tallies the statistics (kernels.h's AttnTally; distance
 * buckets [0, 16), [16, 64), [64, 300)) against attention_ref2's from the
 * double weights: the entropy (at most ln 300 = 5.7 nats) and each mass, the
 * sinks' too, within 2e-5 like the output (measured 8.5e-7 and 2.1e-7 in each of the four builds). */
void test_attention_block_sinks_and_frames(void) {
    // sinks, window, pos0, B, threads
    int sink_cases[][5] = {{4, 20, 23, 30, 1}, {4, 20, 0, 30, 2}, {4, 20, 40, 9, 1}, {60, 50, 130, 140, 2}};
    // B, pos0, window, rot_dim, layout, threads
    int frame_cases[][6] = {{7, 5, 0, 32, ROPE_INTERLEAVED, 1}, {140, 100, 0, 24, ROPE_NEOX, 2},
                            {140, 100, 30, 32, ROPE_NEOX, 1}, {7, 100, 30, 24, ROPE_INTERLEAVED, 2}};
    int nh = 4, nkv = 2, hs = 32, dim = nh * hs, kv_dim = nkv * hs, n_ctx = 300, n_pairs_max = hs / 2;
    double worst[2] = {0, 0}; // sinks, frames
#ifdef _OPENMP
    int max_threads = omp_get_max_threads();
#endif
    size_t cache_n = (size_t)n_ctx * kv_dim;
    float *keys = malloc(sizeof(float) * cache_n), *keys2 = malloc(sizeof(float) * cache_n);
    float *values = malloc(sizeof(float) * cache_n), *q = malloc(sizeof(float) * 140 * dim);
    float *q2 = malloc(sizeof(float) * 140 * dim), *out = malloc(sizeof(float) * 140 * dim);
    float *tiles = malloc(sizeof(float) * 8 * attention_block_floats(hs, nh / nkv)); // up to 8 threads
    double *ref = malloc(sizeof(double) * 140 * dim);
    int frames_differ = 0;
    int bucket[300], nb = 3; // distance buckets [0, 16), [16, 64), [64, 300)
    for (int d = 0; d < n_ctx; d++) bucket[d] = d < 16 ? 0 : d < 64 ? 1 : 2;
    size_t stats_n = (size_t)140 * nh * (nb + 2); // a tally row per query and head
    double *stats = malloc(sizeof(double) * stats_n), *stats_ref = malloc(sizeof(double) * stats_n);
    double worst_stats[2] = {0, 0}; // entropy, mass
    for (int c = 0; c < 4 + 4; c++) {
        int frames = c >= 4, *sc = sink_cases[frames ? 0 : c], *fc = frame_cases[frames ? c - 4 : 0];
        int n_sinks = frames ? 0 : sc[0], window = frames ? fc[2] : sc[1], pos0 = frames ? fc[1] : sc[2];
        int B = frames ? fc[0] : sc[3], threads = frames ? fc[5] : sc[4], rot = fc[3], layout = fc[4];
        fill_randn(keys, cache_n, 1.0f), fill_randn(keys2, cache_n, 1.0f), fill_randn(values, cache_n, 1.0f);
        fill_randn(q, (size_t)B * dim, 1.0f), fill_randn(q2, (size_t)B * dim, 1.0f);
        int n_coarse = (n_ctx - 1) / ATT_KEYS + 1, np = rot / 2;
        double *freq = malloc(sizeof(double) * B * n_pairs_max), mscale[140];
        int block = B + 3; // coarse rows laid out for more queries than the call has, as run.c's may be
        float *rows = malloc(sizeof(float) * 2 * (B * ATT_KEYS + block * n_coarse) * n_pairs_max);
        QueryFrames f = {rows, rows + B * ATT_KEYS * np, rows + 2 * B * ATT_KEYS * np,
                         rows + 2 * B * ATT_KEYS * np + block * n_coarse * np, n_coarse, block, rot, layout};
        for (int b = 0; frames && b < B; b++) { // each query's frequencies, magnitude, fine and coarse rows
            int p = pos0 + b;
            mscale[b] = 0.8 + 0.45 * random_f32(&test_rng);
            for (int i = 0; i < np; i++) {
                double th = freq[(size_t)b * np + i] = random_f32(&test_rng);
                for (int k = 0; k < ATT_KEYS; k++) {
                    ((float *)f.fine_cos)[((size_t)b * np + i) * ATT_KEYS + k] = (float)(mscale[b] * cos(k * th));
                    ((float *)f.fine_sin)[((size_t)b * np + i) * ATT_KEYS + k] = (float)(mscale[b] * sin(k * th));
                }
                for (int u = 0; u * ATT_KEYS <= p; u++) {
                    size_t at = ((size_t)u * block + b) * np + i;
                    ((float *)f.coarse_cos)[at] = (float)(mscale[b] * cos((p - u * ATT_KEYS) * th));
                    ((float *)f.coarse_sin)[at] = (float)(mscale[b] * sin((p - u * ATT_KEYS) * th));
                }
            }
        }
        attention_ref2(ref, q, q2, keys, keys2, values, B, pos0, nh, nkv, hs, window, n_sinks, frames ? freq : NULL,
                       mscale, rot, layout, stats_ref, bucket, nb);
        int first = window > 0 && pos0 + 1 > window ? pos0 + 1 - window : 0;
        for (size_t e = (size_t)n_sinks * kv_dim; !frames && e < (size_t)first * kv_dim; e++) // unseen: NaN
            keys[e] = keys2[e] = values[e] = NAN;
        SecondQueries second = {q2, keys2, 0, n_sinks};
        for (int simd = HAVE_SIMD; simd >= 0; simd--) {
            use_simd = simd;
#ifdef _OPENMP
            omp_set_num_threads(threads);
#endif
            // with sinks, sinks_block's distances stop at its cache of n_sinks + window rows: the
            // farther pairs (rows up to pos0 + B) are clamped, never looked up
            AttnTally tally = {bucket, frames ? n_ctx : n_sinks + window, nb, stats};
            for (size_t e = 0; e < stats_n; e++) stats[e] = NAN; // every row must be written
            attention_block(out, q, keys, KV_F32, values, KV_F32, frames ? NULL : &second, frames ? &f : NULL,
                            &tally, B, pos0, window, nh, nkv, hs, tiles, threads);
            for (int e = 0; e < B * dim; e++) worst[frames] = fmax(worst[frames], abs_err(out[e], ref[e]));
            for (int e = 0; e < B * nh * (nb + 2); e++) {
                int k = e % (nb + 2);
                worst_stats[k > 0] = fmax(worst_stats[k > 0], abs_err(stats[e], stats_ref[e]));
            }
        }
        use_simd = HAVE_SIMD;
#ifdef _OPENMP
        if (frames) { // 1 thread takes the key head's 2 query heads together, 8 one at a time (frame_group): same bits
            float *one = malloc(sizeof(float) * B * dim);
            omp_set_num_threads(1);
            attention_block(one, q, keys, KV_F32, values, KV_F32, NULL, &f, NULL, B, pos0, window, nh, nkv, hs,
                            tiles, 1);
            omp_set_num_threads(8);
            attention_block(out, q, keys, KV_F32, values, KV_F32, NULL, &f, NULL, B, pos0, window, nh, nkv, hs,
                            tiles, 8);
            frames_differ += memcmp(one, out, sizeof(float) * B * dim) != 0;
            free(one);
        }
#endif
        free(freq), free(rows);
    }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    CHECK(frames_differ == 0, "attention block with frames: %d of 4 cases differ between 1 and 8 threads (expected "
          "the same bits)", frames_differ);
    CHECK(worst[0] < 2e-5 && worst[1] < 2e-5,
          "attention block vs double: sinks' second queries %.3g, per-query frames %.3g (expected < 2e-5)", worst[0],
          worst[1]);
    CHECK(worst_stats[0] < 2e-5 && worst_stats[1] < 2e-5,
          "attention block's tally vs double: entropy %.3g, mass %.3g (expected < 2e-5)", worst_stats[0],
          worst_stats[1]);
    free(stats), free(stats_ref);
    free(keys), free(keys2), free(values), free(q), free(q2), free(out), free(tiles), free(ref);
}

/* attention against the double reference, on every path: a block of B
 * tokens (kernels.c's attention_block: tiles of 128 queries x 48 keys, online
 * softmax; SIMD tiles in a SIMD build), the same block with the portable
 * loops forced (use_simd = 0), and the same tokens one at a time (kv_scores /
 * kv_mix), with a float32 cache, an f16 one and, where kv_dim is a multiple of
 * 32 (head size 16 on 2 kv heads, 64 on any), a q8_0 one.
 * Shapes: head sizes 8, 16, 24, 64, and 20 (not a multiple of 8: the
 * products' last row tiles of 2); B = 2, 7, 17 (two 8-float vectors of
 * queries and one of 1 with AVX2, two 16-float ones with AVX-512), 140 (a
 * tile of 128 queries and one of 12);
 * blocks at position 0, at 5, and at the end of a 150-position cache (keys in
 * tiles of 48, 48, 48 and a partial one; buffers of exactly n_ctx rows, so the
 * sanitizer build with -march=native catches a read past them); no window,
 * and windows of 1, 7 and 40 keys (shorter than the sequence: tiles older
 * than every query's window are skipped) and of 60 and 100 (longer than a
 * tile of 48 keys: tiles off the diagonal that cross a window's edge, masked
 * there); queries of unit scale and 8x that
 * (peaked softmax: the running maximum moves by several units between tiles);
 * MHA, GQA and MQA. Every head size meets every B, position and window; the
 * head layouts and query scales take turns over those cases.
 * Cache rows the block must not read (past its last position, or older than
 * its first query's window) hold NaN: reading one would turn the output NaN.
 * The f16 and q8_0 cases compare against the reference on the keys and
 * values as those caches hold them (rounded to half; quantized and read
 * back), so the same tolerance holds; test_kv_q8 bounds the quantization.
 * Threads: the block with the scratch of 1 and of 2 threads (OpenMP set to 2)
 * gives bit-identical output (each tile of queries is computed by the same
 * code whatever thread runs it).
 * Tolerance: outputs are convex combinations of unit-scale values, so their
 * error is about the weights' relative error: the scores' absolute error
 * (float sums of <= 64 unit-scale products, 8x larger with the peaked
 * queries), exp_fast's 2 ulp, and float sums of <= 150 terms. Measured with
 * gcc -O3 -march=native (AVX-512 and AVX2 builds alike): at most 8.2e-6 for
 * the block (its rescaling adds a rounding per key tile), 4.7e-6 one query at
 * a time; the bound is 2e-5. */
void test_attention_block(void) {
    int head_sizes[] = {8, 16, 24, 64, 20}, heads[][2] = {{4, 2}, {6, 1}, {3, 3}}, blocks[] = {2, 7, 17, 140};
    int windows[] = {0, 1, 7, 40, 60, 100}, n_ctx = 150, n_windows = sizeof windows / sizeof windows[0];
    double worst[3][3] = {{0}}; // [f32, f16, q8_0 cache][block, portable block, one at a time]
    int q8_cases = 0;
    int differ_by_threads = 0, thread_cases = 0;
#ifdef _OPENMP
    int max_threads = omp_get_max_threads(); // restored at the end
    omp_set_num_threads(2);
#endif
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++)
            for (int at = 0; at < 3; at++)
                for (int wi = 0; wi < n_windows; wi++) {
                    int j = (i + k + at) % 3, peaked = (k + at + wi) % 2; // each head layout and query
                    // scale meets every head size, block size, position and window
                    int hs = head_sizes[i], nh = heads[j][0], nkv = heads[j][1], B = blocks[k], W = windows[wi];
                    int dim = nh * hs, kv_dim = nkv * hs, pos0 = at == 0 ? 0 : at == 1 ? 5 : n_ctx - B;
                    int first = W > 0 && pos0 + 1 > W ? pos0 + 1 - W : 0, end = pos0 + B; // keys it may read
                    size_t cache_n = (size_t)n_ctx * kv_dim;
                    float *q = malloc(sizeof(float) * B * dim), *out = malloc(sizeof(float) * B * dim);
                    float *out2 = malloc(sizeof(float) * B * dim), *scores = malloc(sizeof(float) * nh * n_ctx);
                    float *tiles = malloc(sizeof(float) * 2 * attention_block_floats(hs, nh / nkv));
                    float *cache[2] = {malloc(sizeof(float) * cache_n), malloc(sizeof(float) * cache_n)};
                    float *rounded[2] = {malloc(sizeof(float) * cache_n), malloc(sizeof(float) * cache_n)};
                    uint16_t *half[2] = {malloc(sizeof(uint16_t) * cache_n), malloc(sizeof(uint16_t) * cache_n)};
                    double *ref[3] = {malloc(sizeof(double) * B * dim), malloc(sizeof(double) * B * dim),
                                      malloc(sizeof(double) * B * dim)};
                    int q8 = kv_dim % 32 == 0; // a q8_0 cache needs whole blocks per row
                    void *q8c[2] = {malloc(kv_bytes(KV_Q8_0, cache_n)), malloc(kv_bytes(KV_Q8_0, cache_n))};
                    fill_randn(q, (size_t)B * dim, peaked ? 8.0f : 1.0f);
                    for (int kv = 0; kv < 2; kv++) { // keys, values: float32, f16, f16 as float
                        fill_randn(cache[kv], cache_n, 1.0f);
                        for (size_t e = 0; e < cache_n; e++) {
                            half[kv][e] = float_to_half(cache[kv][e]);
                            rounded[kv][e] = half_to_float(half[kv][e]);
                        }
                    }
                    attention_ref(ref[0], q, cache[0], cache[1], B, pos0, nh, nkv, hs, W);
                    attention_ref(ref[1], q, rounded[0], rounded[1], B, pos0, nh, nkv, hs, W);
                    if (q8) { // the reference on the q8_0 values (rounded[] reused: f16's is done)
                        for (int kv = 0; kv < 2; kv++) {
                            kv_store(q8c[kv], KV_Q8_0, 0, cache[kv], (int)cache_n);
                            kv_load(rounded[kv], q8c[kv], KV_Q8_0, 0, (int)cache_n);
                        }
                        attention_ref(ref[2], q, rounded[0], rounded[1], B, pos0, nh, nkv, hs, W);
                        q8_cases++;
                    }
                    for (int kv = 0; kv < 2; kv++) // rows no query of the block sees: NaN
                        for (size_t e = 0; e < cache_n; e++)
                            if ((int)(e / kv_dim) < first || (int)(e / kv_dim) >= end)
                                cache[kv][e] = NAN, half[kv][e] = float_to_half(NAN);
                    for (int kv = 0; q8 && kv < 2; kv++) // whole rows of NaN: NaN blocks
                        kv_store(q8c[kv], KV_Q8_0, 0, cache[kv], (int)cache_n);
                    Transformer t = attention_fixture(nh, nkv, hs, n_ctx, scores, tiles);
                    for (int f16 = 0; f16 < 2 + q8; f16++) { // f16: 0 float32, 1 f16, 2 q8_0
                        const void *keys = f16 == 2 ? q8c[0] : f16 ? (void *)half[0] : (void *)cache[0];
                        const void *values = f16 == 2 ? q8c[1] : f16 ? (void *)half[1] : (void *)cache[1];
                        int type = f16 == 2 ? KV_Q8_0 : f16 ? KV_F16 : KV_F32;
                        CacheView rk = {keys, type, values, type, pos0, W, {NULL, NULL, 0, 0}, NULL}, one = rk;
                        t.kv_type = type;
                        double *r = ref[f16];
                        t.state.mm.threads = 1;
                        attention(out, q, &rk, B, &t);
                        for (int e = 0; e < B * dim; e++) worst[f16][0] = fmax(worst[f16][0], abs_err(out[e], r[e]));
                        if (at == 2) { // the longest blocks (a subset: on a loaded machine each parallel
                            t.state.mm.threads = 2; // region waits for a busy core)
                            attention(out2, q, &rk, B, &t);
                            differ_by_threads += memcmp(out, out2, sizeof(float) * B * dim) != 0;
                            thread_cases++;
                        }
                        use_simd = 0;
                        attention(out2, q, &rk, B, &t);
                        use_simd = HAVE_SIMD;
                        for (int e = 0; e < B * dim; e++) worst[f16][1] = fmax(worst[f16][1], abs_err(out2[e], r[e]));
                        for (int b = 0; b < B; b++) {
                            one.pos0 = pos0 + b;
                            attention(out2 + (size_t)b * dim, q + (size_t)b * dim, &one, 1, &t);
                        }
                        for (int e = 0; e < B * dim; e++) worst[f16][2] = fmax(worst[f16][2], abs_err(out2[e], r[e]));
                    }
                    free(q), free(out), free(out2), free(scores), free(tiles);
                    for (int kv = 0; kv < 2; kv++) free(cache[kv]), free(rounded[kv]), free(half[kv]), free(q8c[kv]);
                    for (int r = 0; r < 3; r++) free(ref[r]);
                }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    for (int f16 = 0; f16 < 3; f16++)
        CHECK(worst[f16][0] < 2e-5 && worst[f16][1] < 2e-5 && worst[f16][2] < 2e-5,
              "attention vs double, %s cache: block %.3g, portable block %.3g, one token at a time %.3g "
              "(expected < 2e-5)", (const char *[]){"float32", "f16", "q8_0"}[f16], worst[f16][0], worst[f16][1],
              worst[f16][2]);
    CHECK(q8_cases >= 20, "attention block: only %d cases with a q8_0 cache (kv_dim a multiple of 32)", q8_cases);
    CHECK(differ_by_threads == 0, "attention block: %d of %d cases differ between 1 and 2 threads",
          differ_by_threads, thread_cases);
}

/* exp_fast against libm's expf: 2 ulp (2.4e-7 relative) over its range, on a
 * dense grid and at the edges; 0 below -87.3, infinity above 88.3, NaN kept. */
void test_exp_fast(void) {
    double worst = 0;
    float worst_x = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.3f + (88.3f + 87.3f) * (float)i / 2000000;
        double rel = fabs((double)exp_fast(x) - expf(x)) / expf(x);
        if (rel > worst) worst = rel, worst_x = x;
    }
    CHECK(worst < 2.4e-7, "exp_fast: relative error %.3g at x = %.7g (expected < 2.4e-7)", worst, worst_x);
    CHECK(exp_fast(0.0f) == 1.0f && exp_fast(-88.0f) == 0.0f && exp_fast(-INFINITY) == 0.0f &&
              isinf(exp_fast(89.0f)) && isnan(exp_fast(NAN)),
          "exp_fast edges: e^0 %g, e^-88 %g, e^-inf %g, e^89 %g, e^nan %g", exp_fast(0.0f), exp_fast(-88.0f),
          exp_fast(-INFINITY), exp_fast(89.0f), exp_fast(NAN));
}

/* Attention scores q . k_j for keys `stride` floats apart: the SIMD kernel
 * (8 keys at a time) against the portable dot and double. Head sizes with and
 * without the 8-key kernel (n % 8), key counts with a remainder, f16 keys
 * (portable path only). Tolerance: float sums of n <= 128 unit-scale
 * products, 1e-5 absolute per sqrt(n)-sized score: 2e-4. */
void test_attention_scores(void) {
    int shapes[][3] = {{48, 19, 96}, {64, 8, 64}, {8, 33, 24}, {128, 17, 256}, {12, 10, 36}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int n = shapes[c][0], n_keys = shapes[c][1], stride = shapes[c][2];
        size_t offset = (size_t)(stride - n); // the head's slice starts inside a row
        float *q = malloc(sizeof(float) * n), *keys = malloc(sizeof(float) * ((size_t)n_keys * stride + stride));
        uint16_t *half = malloc(sizeof(uint16_t) * ((size_t)n_keys * stride + stride));
        float simd[40], port[40], f16[40];
        fill_randn(q, (size_t)n, 1.0f);
        fill_randn(keys, (size_t)n_keys * stride + stride, 1.0f);
        for (size_t i = 0; i < (size_t)n_keys * stride + stride; i++) half[i] = float_to_half(keys[i]);
        use_simd = HAVE_SIMD;
        kv_scores(simd, q, keys, KV_F32, offset, stride, n_keys, n);
        kv_scores(f16, q, half, KV_F16, offset, stride, n_keys, n);
        use_simd = 0;
        kv_scores(port, q, keys, KV_F32, offset, stride, n_keys, n);
        use_simd = HAVE_SIMD;
        double worst = 0, worst_half = 0;
        for (int j = 0; j < n_keys; j++) {
            const float *k = keys + offset + (size_t)j * stride;
            double ref = dot64(q, k, n), ref_half = 0;
            for (int i = 0; i < n; i++) ref_half += (double)q[i] * half_to_float_c(half[offset + (size_t)j * stride + i]);
            worst = fmax(worst, fmax(fabs(simd[j] - ref), fabs(port[j] - ref)));
            worst_half = fmax(worst_half, fabs(f16[j] - ref_half));
        }
        CHECK(worst < 2e-4 && worst_half < 2e-4, "kv_scores n=%d keys=%d stride=%d: vs double %.3g, f16 keys %.3g", n,
              n_keys, stride, worst, worst_half);
        free(q), free(keys), free(half);
    }
}

/* IEEE half conversions: the portable functions against the compiler's
 * _Float16 (every one of the 65536 halves; floats at rounding ties, edges). */
void test_half(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = half_to_float_c((uint16_t)h), b = half_to_float((uint16_t)h);
        if (!(a == b || (isnan(a) && isnan(b)))) bad++;
        else if (!isnan(a) && float_to_half_c(a) != h && !(a == 0 && (h & 0x7fff) == 0)) bad++;
    }
    CHECK(bad == 0, "half_to_float_c / float_to_half_c round trip: %d of 65536 halves wrong", bad);
    float edge[] = {65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-10f,
                    1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, -0.0f, 0.333333f, INFINITY, -INFINITY};
    bad = 0;
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) bad += float_to_half_c(edge[i]) != float_to_half(edge[i]);
    for (int i = 0; i < 100000; i++) {
        float f = randn() * (float)pow(2.0, (i % 40) - 25);
        bad += float_to_half_c(f) != float_to_half(f);
    }
    CHECK(bad == 0, "float_to_half_c disagrees with the compiler's conversion on %d values", bad);
}

/* The q8_0 KV cache (--kv q8_0) against a float64 reference: rows of kv_dim
 * values (96: three blocks; several rows) stored with kv_store and read back
 * with kv_load, scored with kv_scores and mixed with kv_mix over head slices
 * that start inside a block (head sizes 8, 16, 24 and 48 at every column a
 * head can start at), with n_keys and n_rows leaving a remainder after
 * kv_mix's groups of four rows.
 * Tolerance, from the quantization step: each value comes back within
 * scale / 2 of what was stored (scale = its block's max|x| / 127), plus the
 * float32 rounding of scale q (2^-24 relative); a score q . k then within
 * sum_i |q_i| scale_i / 2 and a mix within sum_j |w_j| scale_ij / 2, plus
 * float32 sums of at most 48 terms (1e-5 relative here). The quantized
 * values are the reference's, so the kernels' arithmetic is checked to float
 * rounding too: against the same sums in double over the dequantized values,
 * 2e-5 per unit of magnitude.
 * Non-finite values: a block holding a NaN or an infinity reads back NaN
 * everywhere (as quantize_q8 makes a weight group: scale NaN, q 0), and the
 * other blocks of its row are untouched; zeros read back 0. */
void test_kv_q8(void) {
    enum { KV_DIM = 96, ROWS = 11 };
    float x[ROWS * KV_DIM], back[ROWS * KV_DIM], q[48], w[ROWS], out[ROWS], mix[48];
    size_t bytes = kv_bytes(KV_Q8_0, ROWS * KV_DIM);
    CHECK(bytes == ROWS * KV_DIM / 32 * 36 && kv_bytes(KV_F16, 32) == 64 && kv_bytes(KV_F32, 32) == 128,
          "kv_bytes: q8_0 %zu for %d values (expected 36 per 32), f16 %zu, f32 %zu", bytes, ROWS * KV_DIM,
          kv_bytes(KV_F16, 32), kv_bytes(KV_F32, 32));
    void *cache = malloc(bytes);
    for (int r = 0; r < ROWS; r++) // rows of different magnitudes: the scale follows each block
        fill_randn(x + r * KV_DIM, KV_DIM, (float)pow(2.0, r - 4));
    for (int r = 0; r < ROWS; r++) kv_store(cache, KV_Q8_0, (size_t)r * KV_DIM, x + r * KV_DIM, KV_DIM);
    kv_load(back, cache, KV_Q8_0, 0, ROWS * KV_DIM);
    double half_step[ROWS * KV_DIM / 32], worst_value = 0; // per block: scale / 2, and the worst |err| / that
    for (int b = 0; b < ROWS * KV_DIM / 32; b++) {
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[b * 32 + i]));
        half_step[b] = amax / 127 / 2;
        for (int i = 0; i < 32; i++)
            worst_value = fmax(worst_value, fabs((double)back[b * 32 + i] - x[b * 32 + i]) /
                                                (half_step[b] * (1 + 1e-6) + amax * 1.2e-7));
    }
    CHECK(worst_value <= 1.0, "kv_store/kv_load q8_0: a value off by %.3g x (scale / 2 + rounding)", worst_value);
    int sizes[] = {8, 16, 24, 48};
    double worst_bound = 0, worst_sum = 0; // |err| against the bound; kernels against double on the same values
    for (int si = 0; si < 4; si++)
        for (int col = 0; col + sizes[si] <= KV_DIM; col += sizes[si]) {
            int n = sizes[si];
            fill_randn(q, (size_t)n, 1.0f);
            fill_randn(w, ROWS, 1.0f);
            kv_scores(out, q, cache, KV_Q8_0, (size_t)col, KV_DIM, ROWS, n);
            kv_mix(mix, w, cache, KV_Q8_0, (size_t)col, KV_DIM, ROWS, n);
            for (int j = 0; j < ROWS; j++) {
                double exact = 0, same = 0, bound = 0, mag = 0;
                for (int i = 0; i < n; i++) {
                    size_t e = (size_t)j * KV_DIM + col + i;
                    exact += (double)q[i] * x[e], same += (double)q[i] * back[e];
                    bound += fabs(q[i]) * half_step[e / 32] * (1 + 1e-5), mag += fabs(q[i] * back[e]);
                }
                worst_bound = fmax(worst_bound, fabs(out[j] - exact) / (bound + 2e-5 * mag));
                worst_sum = fmax(worst_sum, fabs(out[j] - same) / (2e-5 * (mag + 1e-30)));
            }
            for (int i = 0; i < n; i++) {
                double exact = 0, same = 0, bound = 0, mag = 0;
                for (int j = 0; j < ROWS; j++) {
                    size_t e = (size_t)j * KV_DIM + col + i;
                    exact += (double)w[j] * x[e], same += (double)w[j] * back[e];
                    bound += fabs(w[j]) * half_step[e / 32] * (1 + 1e-5), mag += fabs(w[j] * back[e]);
                }
                worst_bound = fmax(worst_bound, fabs(mix[i] - exact) / (bound + 2e-5 * mag));
                worst_sum = fmax(worst_sum, fabs(mix[i] - same) / (2e-5 * (mag + 1e-30)));
            }
        }
    CHECK(worst_bound <= 1.0 && worst_sum <= 1.0,
          "kv_scores/kv_mix q8_0: %.3g x the quantization bound, %.3g x 2e-5 against double on the same values",
          worst_bound, worst_sum);
    // a NaN in block 1 of row 0, an infinity in block 2 of row 1, row 2 all zeros
    float bad[3 * KV_DIM], got[3 * KV_DIM];
    fill_randn(bad, 3 * KV_DIM, 1.0f);
    bad[40] = NAN, bad[KV_DIM + 70] = -INFINITY;
    memset(bad + 2 * KV_DIM, 0, KV_DIM * sizeof(float));
    kv_store(cache, KV_Q8_0, 0, bad, 3 * KV_DIM);
    kv_load(got, cache, KV_Q8_0, 0, 3 * KV_DIM);
    int wrong = 0;
    for (int e = 0; e < 3 * KV_DIM; e++) {
        int poisoned = e / 32 == 1 || e / 32 == (KV_DIM + 64) / 32;
        if (poisoned ? !isnan(got[e]) : !(fabs(got[e] - bad[e]) <= 0.05)) wrong++; // randn: max|x| < 6.35
    }
    float ones[32];
    for (int i = 0; i < 32; i++) ones[i] = 1.0f;
    kv_scores(out, ones, cache, KV_Q8_0, 32, KV_DIM, 1, 32);
    CHECK(wrong == 0 && isnan(out[0]), "kv_store q8_0 with NaN, infinity and zeros: %d values wrong; "
          "a NaN block's score %g (expected NaN)", wrong, out[0]);
    free(cache);
}
