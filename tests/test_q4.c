/* test_q4.c: q4_0 and q4_1 weights (kernels.h): matrix_row's dequantization
 * against gguf_quants.c's bit for bit (itself checked against the gguf
 * package by tests/test_gguf_quants.py, which also runs matrix_row through
 * tests/quant_driver); matmul for one token, portable and SIMD (whichever
 * kernels this build of test_run selects), against a double reference of
 * the dequantized weights times the activations as quantize_q8 rounds them;
 * blocks of tokens, dequantized rows and token by token; 1 and 4 threads bit
 * for bit. Part of test_run (test_run.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "gguf_quants.h"

/* A q4 matrix in the kernels' layout, and the same blocks as GGUF stores them. */
typedef struct {
    uint8_t *qs;
    uint16_t *d, *m;  // m NULL for q4_0
    unsigned char *gguf; // rows * n / 32 blocks of 18 (Q4_0) or 20 (Q4_1) bytes
    Matrix mat;
} Q4;

/* Halves from the extremes the tests need: the largest finite (both signs),
 * the smallest subnormal, the largest subnormal, the smallest normal, zero
 * and negative zero; and ordinary ones, exponents 2^-10 .. 2^3 (either sign). */
static uint16_t test_half_bits(uint64_t *rng) {
    static const uint16_t extreme[] = {0x7BFF, 0xFBFF, 0x0001, 0x03FF, 0x0400, 0x0000, 0x8000};
    uint64_t r = random_u32(rng);
    if (r % 8 == 0) return extreme[(r >> 3) % 7];
    return (uint16_t)((r & 0x8000) | (uint16_t)((5 + (r >> 4) % 14) << 10) | (uint16_t)((r >> 8) & 0x3FF));
}

/* rows x n random blocks of type WEIGHT_Q4_0 or WEIGHT_Q4_1; the first block
 * of row 0 holds every nibble value in both halves of its bytes. */
static Q4 make_q4(int type, int rows, int n, uint64_t *rng) {
    size_t blocks = (size_t)rows * n / 32, bytes = type == WEIGHT_Q4_1 ? 20 : 18;
    Q4 w = {malloc(blocks * 16), malloc(blocks * 2), type == WEIGHT_Q4_1 ? malloc(blocks * 2) : NULL,
            malloc(blocks * bytes), {0}};
    for (size_t k = 0; k < blocks; k++) {
        unsigned char *b = w.gguf + k * bytes;
        for (size_t h = 0; h < bytes - 16; h += 2) {
            uint16_t bits = test_half_bits(rng);
            b[h] = (unsigned char)bits, b[h + 1] = (unsigned char)(bits >> 8);
        }
        for (int j = 0; j < 16; j++) // block 0: byte j holds j and 15 - j
            b[bytes - 16 + j] = k ? (unsigned char)random_u32(rng) : (unsigned char)(j | (15 - j) << 4);
    }
    gguf_q4_split(type == WEIGHT_Q4_1 ? GGML_Q4_1 : GGML_Q4_0, w.gguf, blocks, w.qs, w.d, w.m);
    w.mat = (Matrix){type, 32, w.qs, NULL, w.d, w.m};
    return w;
}
static void free_q4(Q4 *w) { free(w->qs), free(w->d), free(w->m), free(w->gguf); }

/* matrix_row (every row) against gguf_dequantize of the same blocks, bit for bit. */
static void check_rows(const Q4 *w, int rows, int n) {
    float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    size_t bytes = w->mat.type == WEIGHT_Q4_1 ? 20 : 18, differ = 0;
    for (int r = 0; r < rows; r++) {
        matrix_row(got, w->mat, r, n);
        gguf_dequantize(w->mat.type == WEIGHT_Q4_1 ? GGML_Q4_1 : GGML_Q4_0, w->gguf + (size_t)r * n / 32 * bytes,
                        (size_t)n / 32, want);
        differ += memcmp(got, want, sizeof(float) * n) != 0;
    }
    CHECK(differ == 0, "matrix_row %s: %zu of %d rows differ from gguf_dequantize", WEIGHT_NAMES[w->mat.type], differ,
          rows);
    free(got), free(want);
}

/* out[i] = row i of w . x in double from the blocks' own numbers (w's values
 * dequantized exactly, x as quantize_q8 makes it), and bound[i] the stated
 * tolerance: (blocks + 4) * 2^-23 * S, S = sum over the row of (|d (q - 8)|,
 * or |d q| + |m|) * |x_q x_scale|: each block's float terms rounded a few
 * times, then up to `blocks` float additions. */
static void q4_reference(double *out, double *bound, const Q4 *w, const int8_t *xq, const float *xs, int rows, int n) {
    int blocks = n / 32;
    for (int i = 0; i < rows; i++) {
        double sum = 0, s = 0;
        for (int g = 0; g < blocks; g++) {
            size_t k = (size_t)i * blocks + g;
            double d = half_to_float_c(w->d[k]), m = w->m ? half_to_float_c(w->m[k]) : 0;
            for (int j = 0; j < 32; j++) {
                int q = j < 16 ? w->qs[k * 16 + j] & 15 : w->qs[k * 16 + j - 16] >> 4;
                double a = (double)xq[g * 32 + j] * xs[g], wv = w->m ? d * q + m : d * (q - 8);
                sum += wv * a;
                s += (w->m ? fabs(d * q) + fabs(m) : fabs(wv)) * fabs(a);
            }
        }
        out[i] = sum, bound[i] = (blocks + 4) * ldexp(1.0, -23) * s;
    }
}

/* Activations with blocks at extreme scales: ordinary, 1e-25, 1e25, and zero. */
static void make_x(float *x, int n) {
    fill_randn(x, n, 1.0f);
    for (int g = 0; g < n / 32; g++) {
        float s = g % 4 == 1 ? 1e-25f : g % 4 == 2 ? 1e25f : g % 4 == 3 && g % 8 == 7 ? 0.0f : 1.0f;
        for (int j = 0; j < 32; j++) x[g * 32 + j] *= s;
    }
}

static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* One token: every row within its bound of the reference, with the portable
 * kernel and with this build's SIMD one, and the same bits on 1 and 4
 * threads. */
static void check_one_token(const Q4 *w, int rows, int n) {
    float *x = malloc(sizeof(float) * n), *xs = malloc(sizeof(float) * n / 32), *xsum = malloc(sizeof(float) * n / 32);
    float *out = malloc(sizeof(float) * rows), *out4 = malloc(sizeof(float) * rows);
    double *ref = malloc(sizeof(double) * rows), *bound = malloc(sizeof(double) * rows);
    int8_t *xq = malloc((size_t)n);
    make_x(x, n);
    MatmulScratch scratch = {.x_q = xq, .x_scale = xs, .x_sum = xsum, .threads = 1};
    int saved = use_simd, saved_wide = q4_avx512;
    for (int simd = 0; simd <= HAVE_SIMD + HAVE_Q8_AVX512; simd++) { // portable, SIMD, the 512-bit kernel
        use_simd = simd > 0, q4_avx512 = simd == 2;
        set_threads(1);
        memset(out, 0xff, sizeof(float) * rows);
        matmul(out, x, w->mat, 1, n, rows, &scratch);
        q4_reference(ref, bound, w, xq, xs, rows, n);
        int bad = -1;
        for (int i = 0; i < rows && bad < 0; i++)
            if (!(fabs(out[i] - ref[i]) <= bound[i])) bad = i;
        int at = bad < 0 ? 0 : bad;
        CHECK(bad < 0, "%s matmul n=%d %s: row %d: %.9g vs %.9g (bound %.3g)", WEIGHT_NAMES[w->mat.type], n,
              simd == 2 ? "AVX-512" : simd ? "SIMD" : "portable", bad, out[at], ref[at], bound[at]);
        set_threads(4);
        memset(out4, 0xff, sizeof(float) * rows);
        matmul(out4, x, w->mat, 1, n, rows, &scratch);
        CHECK(memcmp(out, out4, sizeof(float) * rows) == 0, "%s matmul n=%d %s: 1 and 4 threads differ",
              WEIGHT_NAMES[w->mat.type], n, simd ? "SIMD" : "portable");
    }
    use_simd = saved, q4_avx512 = saved_wide;
    free(x), free(xs), free(xsum), free(out), free(out4), free(ref), free(bound), free(xq);
}

/* B tokens: without w_rows, each token's outputs are the one-token kernel's
 * bits; with w_rows (q4_method's Q8_ROWS: dequantized rows, x float32),
 * within n * 2^-23 * sum |w x| of the double product of matrix_row's values
 * and x, and the same bits on 1 and 4 threads. */
static void check_blocks(const Q4 *w, int rows, int n, int B) {
    int blocks = n / 32;
    float *x = malloc(sizeof(float) * B * n), *xs = malloc(sizeof(float) * B * blocks);
    float *xsum = malloc(sizeof(float) * B * blocks), *one = malloc(sizeof(float) * rows);
    float *dots = malloc(sizeof(float) * B * rows), *deq = malloc(sizeof(float) * B * rows);
    float *deq4 = malloc(sizeof(float) * B * rows), *row = malloc(sizeof(float) * n);
    int8_t *xq = malloc((size_t)B * n);
    for (int b = 0; b < B; b++) make_x(x + (size_t)b * n, n);
    set_threads(4);
    MatmulScratch tokens = {.x_q = xq, .x_scale = xs, .x_sum = xsum, .threads = 4};
    CHECK(q4_method(&tokens, B) == Q8_DOTS, "q4_method without w_rows: %d", q4_method(&tokens, B));
    matmul(dots, x, w->mat, B, n, rows, &tokens);
    int same = 1;
    for (int b = 0; b < B; b++) {
        matmul(one, x + (size_t)b * n, w->mat, 1, n, rows, &tokens);
        same &= memcmp(one, dots + (size_t)b * rows, sizeof(float) * rows) == 0;
    }
    CHECK(same, "%s matmul B=%d without w_rows: other bits than token by token", WEIGHT_NAMES[w->mat.type], B);
    MatmulScratch deq_rows = tokens;
    deq_rows.w_rows = malloc(sizeof(float) * 4 * ROW_CHUNK * n);
    deq_rows.x_t = malloc(sizeof(float) * n * cols_round_up(B));
    CHECK(q4_method(&deq_rows, B) == Q8_ROWS, "q4_method with w_rows: %d", q4_method(&deq_rows, B));
    matmul(deq4, x, w->mat, B, n, rows, &deq_rows);
    set_threads(1);
    matmul(deq, x, w->mat, B, n, rows, &deq_rows);
    CHECK(memcmp(deq, deq4, sizeof(float) * B * rows) == 0, "%s matmul B=%d dequantized rows: 1 and 4 threads differ",
          WEIGHT_NAMES[w->mat.type], B);
    int bad = 0;
    for (int i = 0; i < rows; i++) {
        matrix_row(row, w->mat, i, n);
        for (int b = 0; b < B; b++) {
            double ref = 0, s = 0;
            for (int k = 0; k < n; k++) {
                double p = (double)row[k] * x[(size_t)b * n + k];
                ref += p, s += fabs(p);
            }
            bad += !(fabs(deq[(size_t)b * rows + i] - ref) <= n * ldexp(1.0, -23) * s);
        }
    }
    CHECK(bad == 0, "%s matmul B=%d dequantized rows: %d outputs off the double reference", WEIGHT_NAMES[w->mat.type],
          B, bad);
    free(x), free(xs), free(xsum), free(one), free(dots), free(deq), free(deq4), free(row), free(xq);
    free(deq_rows.w_rows), free(deq_rows.x_t);
}

/* n = 256: whole steps of 8 blocks; 576 (SmolLM2's dim): 2 blocks left over;
 * 96: no whole step. 37 rows: chunks of 24 and 13. */
void test_q4(void) {
    uint64_t rng = 49;
#ifdef _OPENMP
    int max_threads = omp_get_max_threads();
#endif
    static const int widths[] = {96, 256, 576};
    for (int type = WEIGHT_Q4_0; type <= WEIGHT_Q4_1; type++)
        for (int k = 0; k < 3; k++) {
            int rows = 37, n = widths[k];
            Q4 w = make_q4(type, rows, n, &rng);
            check_rows(&w, rows, n);
            check_one_token(&w, rows, n);
            check_blocks(&w, rows, n, 5);
            free_q4(&w);
        }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
}
