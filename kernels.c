/* kernels.c: the fast versions of run.c's ops (see kernels.h for what each
 * computes). Sections:
 *   1. KV cache elements: float32, IEEE half or q8_0 blocks, and the weighted
 *      sum of rows
 *   2. SIMD kernels (AVX2 + FMA; AVX-512 where the compiler targets it), each
 *      beside its portable C version
 *   3. attention over the cache: one query's scores; a block of queries in
 *      tiles, with an online softmax (flash attention)
 *   4. matmul over float32, q8_0, q4_0 or q4_1 weights: chunks of rows over
 *      threads, tiles of rows x tokens within a chunk
 * Every function computes exactly the formula in its first comment line (or
 * kernels.h's); tests/test_kernels.c checks each against run.c's matmul_reference
 * or a double-precision reference.
 */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "kernels.h"
#if HAVE_SIMD
#include <cpuid.h>
#include <immintrin.h>
#endif

int use_simd = HAVE_SIMD;
int prefetch_f32 = 1;
int f32_rows_together = 1;
int q8_runs = 1;
int q4_avx512 = 0;

#if HAVE_SIMD
/* The CPU's family from cpuid leaf 1 (the base family, plus the extended
 * family where the base is 15): 25 for AMD's Zen 3 and Zen 4, 26 for Zen 5. */
static int cpu_family(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    unsigned base = (eax >> 8) & 0xf;
    return (int)(base == 0xf ? base + ((eax >> 20) & 0xff) : base);
}
#endif

void kernels_init(void) {
#if HAVE_SIMD
    __builtin_cpu_init();
    int amd = __builtin_cpu_is("amd");
    prefetch_f32 = !amd;
    f32_rows_together = !amd ? 1 : cpu_family() >= 26 ? 4 : 8;
    q8_runs = amd ? 2 : 1;
#endif
}

/* ==========================================================================
 * 1. KV cache elements
 * ========================================================================== */

/* Portable conversions (round to nearest even; infinities, NaN, subnormals). */
uint16_t float_to_half_c(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0)); // inf, NaN
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           // rounds past 65504: infinity
    if (mag < 0x38800000u) {                                              // below 2^-14: subnormal or zero
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));   // in units of 2^-24
    }
    uint32_t h = ((mag - 0x38000000u) >> 13), rest = mag & 0x1fffu;      // rebias 127 -> 15
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;              // round to nearest even
    return (uint16_t)(sign | h);
}
float half_to_float_c(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0) { // zero or subnormal: m * 2^-24
        float f = (float)m / 16777216.0f;
        return sign ? -f : f;
    }
    x = sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* One q8_0 group of gs values (kernels.h's quantize_q8, which the q8_0 KV
 * cache shares): q = round(x / scale), scale = max|x| / 127, returned; a
 * group holding a NaN or an infinity gets q = 0 and scale NaN. */
static inline float quantize_group(int8_t *restrict q, const float *restrict xg, int gs) {
    // max |x| on the bits of |x|, which order as the values do (and are
    // above those of FLT_MAX exactly for infinities and NaN): an integer
    // maximum, which compilers vectorize (a float one must keep NaN's rules)
    uint32_t amax_bits = 0;
    for (int i = 0; i < gs; i++) {
        uint32_t bits;
        memcpy(&bits, xg + i, 4);
        bits &= 0x7fffffffu;
        amax_bits = bits > amax_bits ? bits : amax_bits;
    }
    if (amax_bits > 0x7f7fffffu) { // a NaN or an infinity: no integer can hold it (converting one is undefined)
        memset(q, 0, (size_t)gs);
        return NAN; // the group's products come out NaN, as with float32 weights
    }
    float amax;
    memcpy(&amax, &amax_bits, 4);
    // 1/s overflows to infinity when s is subnormal: then divide by s (|x / s| <= 127 always)
    float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    if (isinf(inv))
        for (int i = 0; i < gs; i++) q[i] = (int8_t)(int)(xg[i] / s + (xg[i] >= 0.0f ? 0.5f : -0.5f));
    else
        for (int i = 0; i < gs; i++) { // round half away from zero; |q| <= 127
            float v = xg[i] * inv;
            q[i] = (int8_t)(int)(v + (v >= 0.0f ? 0.5f : -0.5f));
        }
    return s;
}

/* A q8_0 cache block: KV_Q8_BLOCK values along a cache row, their scale
 * first (float32), then the values as int8; element e lies in block
 * e / KV_Q8_BLOCK at place e % KV_Q8_BLOCK. */
typedef struct {
    float scale;
    int8_t q[KV_Q8_BLOCK];
} KvBlock;
_Static_assert(sizeof(KvBlock) == 4 + KV_Q8_BLOCK, "a q8_0 cache block is its scale and its values");

size_t kv_bytes(int kv_type, size_t n) {
    if (kv_type == KV_Q8_0) return n / KV_Q8_BLOCK * sizeof(KvBlock);
    return n * (kv_type == KV_F16 ? sizeof(uint16_t) : sizeof(float));
}

/* Element e of a q8_0 cache: its block's scale into *scale, and the int8
 * values from e to the end of the block, KV_Q8_BLOCK - e % KV_Q8_BLOCK of them. */
static inline const int8_t *q8_at(const void *cache, size_t e, float *scale) {
    const KvBlock *b = (const KvBlock *)cache + e / KV_Q8_BLOCK;
    *scale = b->scale;
    return b->q + e % KV_Q8_BLOCK;
}

/* The run of a q8_0 slice [offset + i, offset + n) that lies in one block. */
static inline int q8_run(size_t offset, int i, int n) {
    int left = KV_Q8_BLOCK - (int)((offset + i) % KV_Q8_BLOCK);
    return n - i < left ? n - i : left;
}

/* cache[offset .. offset+n) = src, converted to the cache's type (q8_0:
 * whole blocks, offset and n multiples of KV_Q8_BLOCK) */
void kv_store(void *cache, int kv_type, size_t offset, const float *src, int n) {
    if (kv_type == KV_F32) {
        memcpy((float *)cache + offset, src, (size_t)n * sizeof(float));
        return;
    }
    if (kv_type == KV_Q8_0) {
        KvBlock *b = (KvBlock *)cache + offset / KV_Q8_BLOCK;
        for (int i = 0; i < n / KV_Q8_BLOCK; i++)
            b[i].scale = quantize_group(b[i].q, src + (size_t)i * KV_Q8_BLOCK, KV_Q8_BLOCK);
        return;
    }
    uint16_t *h = (uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) h[i] = float_to_half(src[i]);
}

/* out = cache[offset .. offset+n) as float32 */
void kv_load(float *out, const void *cache, int kv_type, size_t offset, int n) {
    if (kv_type == KV_F32) {
        memcpy(out, (const float *)cache + offset, (size_t)n * sizeof(float));
        return;
    }
    if (kv_type == KV_Q8_0) {
        for (int i = 0, run; i < n; i += run) {
            float s;
            const int8_t *restrict q = q8_at(cache, offset + i, &s);
            float *restrict o = out + i;
            run = q8_run(offset, i, n);
            for (int c = 0; c < run; c++) o[c] = s * q[c];
        }
        return;
    }
    const uint16_t *h = (const uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) out[i] = half_to_float(h[i]);
}

/* x = what a cache of kv_type gives back for x (n values; q8_0: n a
 * multiple of KV_Q8_BLOCK): the same values as kv_store then kv_load. */
void kv_round(float *x, int kv_type, int n) {
    if (kv_type == KV_F16)
        for (int i = 0; i < n; i++) x[i] = half_to_float(float_to_half(x[i]));
    if (kv_type != KV_Q8_0) return;
    for (int b = 0; b < n / KV_Q8_BLOCK; b++) {
        int8_t q[KV_Q8_BLOCK];
        float *xb = x + (size_t)b * KV_Q8_BLOCK, s = quantize_group(q, xb, KV_Q8_BLOCK);
        for (int i = 0; i < KV_Q8_BLOCK; i++) xb[i] = s * q[i];
    }
}

/* q . cache[offset .. offset+n) */
static inline float kv_dot(const float *q, const void *cache, int kv_type, size_t offset, int n) {
    if (kv_type == KV_F32) return dot(q, (const float *)cache + offset, n);
    if (kv_type == KV_Q8_0) { // per block: its scale times the float sum of q x the int8 values
        float sum = 0.0f;
        for (int i = 0, run; i < n; i += run) {
            float s, part = 0.0f;
            const int8_t *restrict k = q8_at(cache, offset + i, &s);
            run = q8_run(offset, i, n);
#pragma omp simd reduction(+ : part)
            for (int c = 0; c < run; c++) part += q[i + c] * k[c];
            sum += s * part;
        }
        return sum;
    }
    const uint16_t *h = (const uint16_t *)cache + offset;
    float sum = 0.0f, row[64]; // converted 64 at a time, then the float dot
    for (int i0 = 0; i0 < n; i0 += 64) {
        int m = n - i0 < 64 ? n - i0 : 64;
        for (int i = 0; i < m; i++) row[i] = half_to_float(h[i0 + i]);
        sum += dot(q + i0, row, m);
    }
    return sum;
}

/* out += a * cache[offset .. offset+n) */
static inline void kv_axpy(float *out, float a, const void *cache, int kv_type, size_t offset, int n) {
    if (kv_type == KV_F32) {
        const float *v = (const float *)cache + offset;
        for (int i = 0; i < n; i++) out[i] += a * v[i];
        return;
    }
    if (kv_type == KV_Q8_0) {
        for (int i = 0, run; i < n; i += run) {
            float s;
            const int8_t *restrict v = q8_at(cache, offset + i, &s);
            float *restrict o = out + i, as = a * s;
            run = q8_run(offset, i, n);
            for (int c = 0; c < run; c++) o[c] += as * v[c];
        }
        return;
    }
    const uint16_t *h = (const uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) out[i] += a * half_to_float(h[i]);
}

/* out += a[0] * row t + a[1] * row t+1 + a[2] * row t+2 + a[3] * row t+3 of
 * a cache, rows `stride` apart from offset: one pass over out for four rows
 * (q8_0: stride a multiple of KV_Q8_BLOCK, so the rows' blocks line up). */
static inline void kv_axpy4(float *out, const float *a, const void *cache, int kv_type, size_t offset, int stride,
                            int n) {
    if (kv_type == KV_F32) {
        const float *v0 = (const float *)cache + offset, *v1 = v0 + stride, *v2 = v1 + stride, *v3 = v2 + stride;
        for (int i = 0; i < n; i++) out[i] += a[0] * v0[i] + a[1] * v1[i] + a[2] * v2[i] + a[3] * v3[i];
        return;
    }
    if (kv_type == KV_Q8_0) {
        for (int i = 0, run; i < n; i += run) {
            float s[4];
            const int8_t *restrict v0 = q8_at(cache, offset + i, s);
            const int8_t *restrict v1 = q8_at(cache, offset + (size_t)stride + i, s + 1);
            const int8_t *restrict v2 = q8_at(cache, offset + 2 * (size_t)stride + i, s + 2);
            const int8_t *restrict v3 = q8_at(cache, offset + 3 * (size_t)stride + i, s + 3);
            float a0 = a[0] * s[0], a1 = a[1] * s[1], a2 = a[2] * s[2], a3 = a[3] * s[3], *restrict o = out + i;
            run = q8_run(offset, i, n);
            for (int c = 0; c < run; c++) o[c] += a0 * v0[c] + a1 * v1[c] + a2 * v2[c] + a3 * v3[c];
        }
        return;
    }
    const uint16_t *h0 = (const uint16_t *)cache + offset, *h1 = h0 + stride, *h2 = h1 + stride, *h3 = h2 + stride;
    for (int i = 0; i < n; i++)
        out[i] += a[0] * half_to_float(h0[i]) + a[1] * half_to_float(h1[i]) + a[2] * half_to_float(h2[i]) +
                  a[3] * half_to_float(h3[i]);
}

/* out = sum_j weights[j] * row j of the cache (kernels.h): four rows per
 * pass over out, then the rest one by one. */
void kv_mix(float *out, const float *weights, const void *cache, int kv_type, size_t offset, int stride, int n_rows,
            int n) {
    memset(out, 0, (size_t)n * sizeof(float));
    int j = 0;
    for (; j + 4 <= n_rows; j += 4) kv_axpy4(out, weights + j, cache, kv_type, offset + (size_t)j * stride, stride, n);
    for (; j < n_rows; j++) kv_axpy(out, weights[j], cache, kv_type, offset + (size_t)j * stride, n);
}

/* ==========================================================================
 * 2. SIMD kernels: the program's only intrinsics, AVX2 + FMA, and AVX-512
 * (the column kernel, generation's one-row kernels) and VNNI (q8_0's int8
 * products) where the compiler targets them (-march=native on a CPU that has
 * them: kernels.h's SIMD_FLOATS). Each kernel has its portable C
 * version right beside it, which computes the same sums in a different order
 * (results agree to float rounding; the tests compare the two). Builds
 * without AVX2 get only the C versions.
 * ========================================================================== */

/* out[t * ldo + r] = w_r . x_t  for R rows w_r and T rows x_t of n floats.
 * Each weight row, once loaded, serves all T tokens. */
static void dot_tile_f32_c(float *out, int ldo, const float *w, const float *x, int R, int T, int n) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = dot(w + (size_t)r * n, x + (size_t)t * n, n);
}

/* The column product: for rows r < rows and tokens t < B,
 *   out[t * ldo + r] (or out[r * ldo + t] when by_rows) = sum_{k < n} w_r[k] * xt[k * ldx + t]
 * with w_r[k] = w[r * w_row + k * w_col]: the rows of a matrix (w_col = 1),
 * or the columns of one (w_row = 1), against inputs transposed, the tokens
 * side by side in each row of xt. Blocks of matmul (rows of w against x
 * transposed; the SIMD version reads them in panels of a tile's tokens, see
 * cols_f32) and both products of a tile of attention (kernels.c, section 3)
 * are this product. */
static void cols_f32_c(float *out, int ldo, int by_rows, const float *w, size_t w_row, size_t w_col, int rows, int n,
                       const float *xt, int ldx, int B) {
    for (int r = 0; r < rows; r++)
        for (int t0 = 0; t0 < B; t0 += 64) { // 64 tokens' sums at a time, the loop over tokens innermost:
            int T = B - t0 < 64 ? B - t0 : 64; // xt's rows are read in order (a loop over k innermost
            float sum[64] = {0};               // would stride through them)
            for (int k = 0; k < n; k++) {
                float wk = w[r * w_row + k * w_col];
                const float *x = xt + (size_t)k * ldx + t0;
                for (int t = 0; t < T; t++) sum[t] += wk * x[t];
            }
            for (int t = 0; t < T; t++) out[by_rows ? (size_t)r * ldo + t0 + t : (size_t)(t0 + t) * ldo + r] = sum[t];
        }
}

/* The same as int8 dot products in groups: out[t * ldo + r] =
 *   sum over groups g of ws_r[g] * xs_t[g] * (sum of w_r[i] * x_t[i] over the group)
 * w: R rows of n int8 with scales ws (R, n/gs); x: T rows, scales xs (T, n/gs). */
static void dot_tile_q8_c(float *out, int ldo, const int8_t *w, const float *ws, const int8_t *x, const float *xs,
                          int R, int T, int n, int gs) {
    int groups = n / gs;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            const int8_t *wr = w + (size_t)r * n, *xt = x + (size_t)t * n;
            float sum = 0.0f;
            for (int g = 0; g < groups; g++) {
                int32_t isum = 0;
#pragma omp simd reduction(+ : isum)
                for (int i = g * gs; i < (g + 1) * gs; i++) isum += (int32_t)wr[i] * xt[i];
                sum += (float)isum * ws[(size_t)r * groups + g] * xs[(size_t)t * groups + g];
            }
            out[(size_t)t * ldo + r] = sum;
        }
}

/* One row of q4_0 (m == NULL) or q4_1 weights against one token quantized
 * as q8_0 in blocks of 32 (kernels.h's q4_method):
 *   sum over blocks g of d_g * xs_g * (sum_i w_i x_i) [+ m_g * xsum_g for q4_1]
 * w_i = q_i - 8 (q4_0) or q_i (q4_1), q the block's nibbles (qs: 16 bytes a
 * block), d and m halves, x the token's int8 values, xs their scales, xsum
 * each block's xs times the sum of its x (q4_1). */
static float dot_q4_c(const uint8_t *qs, const uint16_t *d, const uint16_t *m, const int8_t *x, const float *xs,
                      const float *xsum, int n) {
    int off = m ? 0 : 8;
    float sum = 0.0f;
    for (int g = 0; g < n / 32; g++) {
        const uint8_t *qg = qs + (size_t)g * 16;
        const int8_t *xg = x + (size_t)g * 32;
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) isum += ((qg[j] & 15) - off) * xg[j] + ((qg[j] >> 4) - off) * xg[j + 16];
        sum += (float)isum * (half_to_float(d[g]) * xs[g]);
        if (m) sum += half_to_float(m[g]) * xsum[g];
    }
    return sum;
}

/* A tile of ATT_KEYS keys rotated by one query's frame (section 3's
 * frame_scores): for each pair i, with (x, y) = the pair's components of the
 * tile's keys side by side (x = k_t + i * ATT_KEYS, y = k_t + (n_pairs + i) *
 * ATT_KEYS) and (cos, sin) the query's fine rows of the pair (fine_cos + i *
 * ATT_KEYS, pair-major),
 *   k_r[i][c] = x[c] cos[c] - y[c] sin[c],   k_r[n_pairs + i][c] = x[c] sin[c] + y[c] cos[c]
 * (rows of ATT_KEYS floats): key c rotated by fine row c. */
static void rotate_keys_c(float *k_r, const float *k_t, const float *fine_cos, const float *fine_sin, int n_pairs) {
    for (int i = 0; i < n_pairs; i++) {
        const float *x = k_t + (size_t)i * ATT_KEYS, *y = k_t + (size_t)(n_pairs + i) * ATT_KEYS;
        const float *fc = fine_cos + (size_t)i * ATT_KEYS, *fs = fine_sin + (size_t)i * ATT_KEYS;
        float *rx = k_r + (size_t)i * ATT_KEYS, *ry = k_r + (size_t)(n_pairs + i) * ATT_KEYS;
        for (int c = 0; c < ATT_KEYS; c++) rx[c] = x[c] * fc[c] - y[c] * fs[c], ry[c] = x[c] * fs[c] + y[c] * fc[c];
    }
}

/* acc[c] = sum over r < n of w[r] rows[r][c] (rows of ATT_KEYS floats): one
 * query's scores against a tile's keys laid out one dimension a row. */
static void rows_dot_c(float *acc, const float *rows, const float *w, int n) {
    for (int c = 0; c < ATT_KEYS; c++) acc[c] = 0.0f;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < ATT_KEYS; c++) acc[c] += w[r] * rows[(size_t)r * ATT_KEYS + c];
}

#if HAVE_SIMD
static float hsum_avx(__m256 v) { // the 8 lanes of v added
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The float32 SIMD kernels' vectors (kernels.h's SIMD_FLOATS): 16 floats
 * with AVX-512, else 8 with AVX2; the only place where that choice is
 * spelled. */
#if SIMD_FLOATS == 16
typedef __m512 vfloat;
#define vf_zero _mm512_setzero_ps
#define vf_load _mm512_loadu_ps
#define vf_store _mm512_storeu_ps
#define vf_set1 _mm512_set1_ps
#define vf_fma _mm512_fmadd_ps // a * b + c, one rounding
#define vf_fnma _mm512_fnmadd_ps // c - a * b, one rounding
#define vf_add _mm512_add_ps
#define vf_mul _mm512_mul_ps
#define vf_sum _mm512_reduce_add_ps // the lanes added
#define COLS_VECS 4            // vectors of tokens per tile: 6 x 4 sums + 4 x + 1 broadcast of 32 registers
#else
typedef __m256 vfloat;
#define vf_zero _mm256_setzero_ps
#define vf_load _mm256_loadu_ps
#define vf_store _mm256_storeu_ps
#define vf_set1 _mm256_set1_ps
#define vf_fma _mm256_fmadd_ps
#define vf_fnma _mm256_fnmadd_ps
#define vf_add _mm256_add_ps
#define vf_mul _mm256_mul_ps
#define vf_sum hsum_avx
#define COLS_VECS 2 // 6 x 2 sums + 2 x + 1 broadcast of 16 registers
#endif
_Static_assert(COLS_TOKENS == COLS_VECS * SIMD_FLOATS, "kernels.h's COLS_TOKENS: tokens per tile");

/* Vectors of SIMD_FLOATS int32 lanes for the q8_0 column kernel, which needs
 * VNNI's product of unsigned by signed bytes summed in fours into each lane
 * (AVX-512 VNNI, or AVX-VNNI at 256 bits); without VNNI, blocks with int8
 * activations take the int8 dot products (q8_method). */
#if HAVE_Q8_COLS && SIMD_FLOATS == 16
typedef __m512i vint;
#define vi_set1 _mm512_set1_epi32
#define vi_load(p) _mm512_loadu_si512((const void *)(p))
#define vi_dpbusd _mm512_dpbusd_epi32 // acc + four u8 x s8 products per lane
#define vi_to_float _mm512_cvtepi32_ps
#define Q8_COLS_VECS 2 // 6 x 2 int sums + 6 x 2 float sums + 2 x + 1 broadcast of 32 registers
#elif HAVE_Q8_COLS
typedef __m256i vint;
#define vi_set1 _mm256_set1_epi32
#define vi_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define vi_dpbusd dot_u8s8_avx
#define vi_to_float _mm256_cvtepi32_ps
#define Q8_COLS_VECS 1 // 6 int sums + 6 float sums + 1 x + 1 broadcast of 16 registers
#endif

/* The first T tokens' sums of a tile, acc[r][j] = R rows x J vectors of
 * tokens, into out: out[t * ldo + r], or out[r * ldo + t] when by_rows. */
static inline __attribute__((always_inline)) void store_tile(float *out, int ldo, int by_rows,
                                                            vfloat acc[6][COLS_VECS], int R, int J, int T) {
    if (by_rows && T == J * SIMD_FLOATS) { // whole vectors straight into out's rows
        for (int r = 0; r < R; r++)
            for (int j = 0; j < J; j++) vf_store(out + (size_t)r * ldo + j * SIMD_FLOATS, acc[r][j]);
        return;
    }
    float tile[6][COLS_TOKENS]; // stored whole first: a partial store loop over acc makes
                                // GCC write every sum to memory at every k as well
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) vf_store(&tile[r][j * SIMD_FLOATS], acc[r][j]);
    T = T < J * SIMD_FLOATS ? T : J * SIMD_FLOATS; // (always T: this tells the compiler so)
    if (by_rows)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) out[(size_t)r * ldo + t] = tile[r][t];
    else // each token's R outputs side by side: measured 1.3x the rate of storing row by row (rows of out far apart)
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) out[(size_t)t * ldo + r] = tile[r][t];
}

/* The column kernel, cols_f32_c's formula (the portable version above) for
 * R <= 6 rows and up to J vectors of tokens (J <= COLS_VECS; R and J
 * constants). For each k, one broadcast of w_r[k] per row meets J loads of
 * SIMD_FLOATS tokens' values xt[k * ldx + t]: R x J sums in registers, and no
 * horizontal sums. Each output is one FMA chain over k in order, so it is the
 * same whatever the tile, B or the thread count. xt must be readable for J
 * whole vectors from each row's start; only the first T tokens are stored
 * (the rest is padding). Measured against a 3 x 4 dot-product tile
 * (horizontal sums at the end): 1.65x the prefill rate of a 15M-shaped model
 * (AVX2). It runs k from k0 to k1 of n: the sums start at zero when k0 is 0,
 * else from carry (R x COLS_VECS vectors, where the pass before left them),
 * and go to out when k1 is n, else back to carry; stored and loaded as they
 * are, the chain over k stays the same. */
static inline __attribute__((always_inline)) void cols_tile_f32(float *out, int ldo, int by_rows, const float *w,
                                                               size_t w_row, size_t w_col, int k0, int k1, int n,
                                                               const float *xt, int ldx, int R, int J, int T,
                                                               vfloat *carry) {
    vfloat acc[6][COLS_VECS], x[COLS_VECS];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) acc[r][j] = k0 == 0 ? vf_zero() : carry[r * COLS_VECS + j];
    for (int k = k0; k < k1; k++) {
        for (int j = 0; j < J; j++) x[j] = vf_load(xt + (size_t)k * ldx + j * SIMD_FLOATS);
        for (int r = 0; r < R; r++) {
            vfloat wr = vf_set1(w[r * w_row + k * w_col]);
            for (int j = 0; j < J; j++) acc[r][j] = vf_fma(wr, x[j], acc[r][j]);
        }
    }
    if (k1 == n) {
        store_tile(out, ldo, by_rows, acc, R, J, T);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) carry[r * COLS_VECS + j] = acc[r][j];
}

/* cols_tile_f32 with R (a constant) rows and T <= COLS_TOKENS tokens: as many
 * vectors as T needs, each count its own instance. */
static inline __attribute__((always_inline)) void cols_tile_rows(float *out, int ldo, int by_rows, const float *w,
                                                                size_t w_row, size_t w_col, int k0, int k1, int n,
                                                                const float *xt, int ldx, int R, int T,
                                                                vfloat *carry) {
    int J = (T + SIMD_FLOATS - 1) / SIMD_FLOATS;
    if (J == 1) cols_tile_f32(out, ldo, by_rows, w, w_row, w_col, k0, k1, n, xt, ldx, R, 1, T, carry);
    else if (J == 2) cols_tile_f32(out, ldo, by_rows, w, w_row, w_col, k0, k1, n, xt, ldx, R, 2, T, carry);
#if COLS_VECS == 4
    else if (J == 3) cols_tile_f32(out, ldo, by_rows, w, w_row, w_col, k0, k1, n, xt, ldx, R, 3, T, carry);
    else cols_tile_f32(out, ldo, by_rows, w, w_row, w_col, k0, k1, n, xt, ldx, R, 4, T, carry);
#endif
}

/* The rows of the next tile when `left` rows remain: 6, and for the last
 * rows 4, 2 and 1 (the column kernels' tile heights, each a constant in its
 * own instance). */
static inline int tile_height(int left) { return left >= 6 ? 6 : left >= 4 ? 4 : left >= 2 ? 2 : 1; }

/* How cols_f32 cuts its work so that the tokens' values it reads stay in
 * the L1 cache: groups of COLS_GROUP_ROWS rows (4 tiles of 6: a matmul chunk),
 * and passes of COLS_K_BLOCK values of k, over which each group's tiles run in
 * turn on the same COLS_TOKENS tokens' 16 KiB of xt (256 x 16 floats with
 * AVX2); the sums go from pass to pass in carry. Before, a tile ran over all
 * of k, and each next tile read the tokens' values again from L2: on the AMD
 * EPYC (AVX2) the passes made 110M's float32 prompts of 600 tokens 1.15x
 * faster on one thread, 1.13x on two, and prompts of 300 tokens 1.07-1.10x
 * (float32, q8_0, SmolLM2's q8_0; interleaved, medians of 5; 128 and 64 a
 * pass gained less: docs/performance.md). AVX-512, not measured, keeps one
 * pass (64 tokens a tile: 256 bytes of xt a k). */
#define COLS_GROUP_ROWS 24
#if SIMD_FLOATS == 8
#define COLS_K_BLOCK 256
#else
#define COLS_K_BLOCK INT_MAX
#endif

/* cols_f32_c's formula in tiles of 6 rows x COLS_TOKENS tokens, the last
 * rows in tiles of 4, 2 and 1, in the groups and passes above. The tokens
 * of tile i (tokens i * COLS_TOKENS ...) start at xt + i * panel, their
 * values for k ldx apart: panel = COLS_TOKENS for xt as cols_f32_c reads it
 * (all tokens side by side in each row), n * COLS_TOKENS for matmul's panels
 * (transpose_block: each tile's tokens over all of k, one after the other).
 * Each tile's rows must be readable up to its T tokens rounded up to
 * SIMD_FLOATS. */
static void cols_f32(float *out, int ldo, int by_rows, const float *w, size_t w_row, size_t w_col, int rows, int n,
                     const float *xt, int ldx, size_t panel, int B) {
    vfloat carry[COLS_GROUP_ROWS][COLS_VECS]; // a row of the group: its sums between passes
    for (int i0 = 0; i0 < rows; i0 += COLS_GROUP_ROWS) {
        int i1 = rows - i0 < COLS_GROUP_ROWS ? rows : i0 + COLS_GROUP_ROWS;
        for (int b = 0; b < B; b += COLS_TOKENS) {
            const float *x = xt + (size_t)(b / COLS_TOKENS) * panel;
            int T = B - b < COLS_TOKENS ? B - b : COLS_TOKENS;
            for (int k0 = 0; k0 < n; k0 += COLS_K_BLOCK) {
                int k1 = n - k0 < COLS_K_BLOCK ? n : k0 + COLS_K_BLOCK;
                for (int i = i0, R; i < i1; i += R) {
                    R = tile_height(i1 - i);
                    const float *wi = w + (size_t)i * w_row;
                    float *o = out + (by_rows ? (size_t)i * ldo + b : (size_t)b * ldo + i);
                    vfloat *c = carry[i - i0]; // this tile's rows' sums between passes
                    if (R == 6) cols_tile_rows(o, ldo, by_rows, wi, w_row, w_col, k0, k1, n, x, ldx, 6, T, c);
                    else if (R == 4) cols_tile_rows(o, ldo, by_rows, wi, w_row, w_col, k0, k1, n, x, ldx, 4, T, c);
                    else if (R == 2) cols_tile_rows(o, ldo, by_rows, wi, w_row, w_col, k0, k1, n, x, ldx, 2, T, c);
                    else cols_tile_rows(o, ldo, by_rows, wi, w_row, w_col, k0, k1, n, x, ldx, 1, T, c);
                }
            }
        }
    }
}

/* Generation streams each weight matrix once, row after row: its one-row
 * kernels ask for the bytes PREFETCH_AHEAD past the ones they read (the
 * hardware prefetcher alone kept too few in flight). Measured at 2 threads
 * on the AVX-512 VM, medians of 4 interleaved runs: 110M q8_0 97 tok/s
 * without, 119 at 1 KiB ahead, 127 at 2 KiB, 137 at 4 KiB, 131 at 8 KiB, 128
 * at 16 KiB; at 4 KiB, the AVX2 build's q8_0 81 -> 128 and float32 36 -> 41;
 * 15M (in L3) unchanged. On an AMD EPYC (AVX2) float32 lost 20% with it, q8_0
 * gained 19%: kernels.h's prefetch_f32. A prefetch never faults, past the end
 * included. */
#define PREFETCH_AHEAD 4096 // bytes

/* Ask for the cache line PREFETCH_AHEAD bytes past p (address arithmetic on
 * integers: past the end of the matrix is no pointer, and no fault). */
static inline void prefetch_ahead(const void *p) { __builtin_prefetch((const void *)((uintptr_t)p + PREFETCH_AHEAD)); }

/* dot_tile_f32_c for one row and one token (generation): four partial sums
 * of SIMD_FLOATS lanes in turn, so that consecutive FMAs do not wait for each
 * other (an FMA takes 4 cycles; one chain would run at a quarter of the FMA
 * rate). Measured: 7-15% faster streaming of a 61 MB matrix than one sum, on
 * 1 and 2 threads (AVX2). */
static void dot_f32_avx(float *out, const float *w, const float *x, int n) {
    vfloat a0 = vf_zero(), a1 = a0, a2 = a0, a3 = a0;
    const int V = SIMD_FLOATS, prefetch = prefetch_f32; // kernels.h: the same sums either way
    int i = 0;
    for (; i + 4 * V <= n; i += 4 * V) {
        if (prefetch)
            for (int line = 0; line < 4 * V; line += 16) prefetch_ahead(w + i + line); // 16 floats a line
        a0 = vf_fma(vf_load(w + i), vf_load(x + i), a0);
        a1 = vf_fma(vf_load(w + i + V), vf_load(x + i + V), a1);
        a2 = vf_fma(vf_load(w + i + 2 * V), vf_load(x + i + 2 * V), a2);
        a3 = vf_fma(vf_load(w + i + 3 * V), vf_load(x + i + 3 * V), a3);
    }
    for (; i + V <= n; i += V) a0 = vf_fma(vf_load(w + i), vf_load(x + i), a0);
    float sum = vf_sum(vf_add(vf_add(a0, a1), vf_add(a2, a3)));
    for (; i < n; i++) sum += w[i] * x[i];
    *out = sum;
}

/* out[r * step] = w_r . x for the R <= 8 rows w_r = w + r * step * n (one
 * token), one SIMD_FLOATS-lane sum per row over its vectors in order, then
 * its lanes added (vf_sum): the same arithmetic for every row whatever the
 * rows beside it, or none (R = 1). Each vector of x, loaded once, meets the
 * R rows' vectors at the same offset (R FMA chains, so none waits for
 * another). n a multiple of SIMD_FLOATS. */
static inline __attribute__((always_inline)) void dot_rows_apart(float *out, const float *w, const float *x, int n,
                                                                size_t step, int R) {
    vfloat acc[8];
    for (int r = 0; r < R; r++) acc[r] = vf_zero();
    for (int i = 0; i < n; i += SIMD_FLOATS) {
        vfloat xv = vf_load(x + i);
        for (int r = 0; r < R; r++) acc[r] = vf_fma(vf_load(w + r * step * n + i), xv, acc[r]);
    }
    for (int r = 0; r < R; r++) out[r * step] = vf_sum(acc[r]);
}

/* Inside a parallel region: the calling thread's share a..b-1 of d rows,
 * ceil(d / threads) each in thread order, so the last threads may get fewer
 * or none (b = a). */
static void thread_rows(int d, int *a, int *b) {
    int threads = 1, t = 0;
#ifdef _OPENMP
    threads = omp_get_num_threads(), t = omp_get_thread_num();
#endif
    int per = (d + threads - 1) / threads;
    *a = t * per < d ? t * per : d;
    *b = *a + per < d ? *a + per : d;
}

/* out = w x for one token and float32 rows w (d, n) on AMD
 * (f32_rows_together = runs, 4 or 8), in `runs` streams per thread: a
 * thread's rows a..b-1 (the d rows shared out evenly) are `runs` runs of
 * len = (b - a) / runs rows, and it takes row i of every run together
 * (dot_rows_apart, rows len apart), the last (b - a) % runs rows one at a
 * time. Each stream then reads its run's rows one after the other, long
 * enough for the hardware prefetcher to follow.
 * On the AMD EPYC with Zen 3 cores (AVX2), a program streaming SmolLM2's
 * matrices per token: 8 consecutive rows side by side 30.5 tokens/s on one
 * thread and 43.9 on two, 8 runs 38.8 and 49.8, 4 runs 34.7 and 48.5; one
 * row at a time was level with 8 consecutive rows on one thread and slower on
 * two. On the Zen 5 EPYC (AVX-512) 4 runs were the fastest, 8-12% faster
 * than 8 runs on one thread (docs/performance.md, with `run` itself).
 * Every row's sum is the same arithmetic (dot_rows_apart) whatever `runs`,
 * so the result depends neither on it nor on the thread count. n a multiple
 * of SIMD_FLOATS. */
static void dot_rows_streams(float *out, const float *w, const float *x, int n, int d, int runs) {
    runs = runs == 8 ? 8 : 4; // the two the loop below takes
#pragma omp parallel if ((long)n * d >= PARALLEL_MIN_WORK)
    {
        int a, b;
        thread_rows(d, &a, &b);
        int len = (b - a) / runs;
        for (int i = 0; i < len; i++) {
            const float *first = w + (size_t)(a + i) * n; // row i of the first run
            if (runs == 8) dot_rows_apart(out + a + i, first, x, n, (size_t)len, 8);
            else dot_rows_apart(out + a + i, first, x, n, (size_t)len, 4);
        }
        for (int r = a + runs * len; r < b; r++) dot_rows_apart(out + r, w + (size_t)r * n, x, n, 1, 1);
    }
}

/* out[j] = q . k_j for the 8 keys k_j = k + j * stride, n floats each (n a
 * multiple of 8): one sum per key, then the 8 sums reduced together by a tree
 * of horizontal adds, which costs less than 8 separate reductions. */
static void dot8_f32_avx(float *out, const float *q, const float *k, int stride, int n) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (size_t)j * stride + i), acc[j]);
    }
    // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
    __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67); // keys 0-3 | keys 0-3
    __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

/* rotate_keys_c in vectors of the tile's keys: two loads of the keys, two of
 * the rows, four FMAs or products a vector and a pair. */
static void rotate_keys_avx(float *k_r, const float *k_t, const float *fine_cos, const float *fine_sin, int n_pairs) {
    for (int i = 0; i < n_pairs; i++) {
        const float *x = k_t + (size_t)i * ATT_KEYS, *y = k_t + (size_t)(n_pairs + i) * ATT_KEYS;
        const float *fc = fine_cos + (size_t)i * ATT_KEYS, *fs = fine_sin + (size_t)i * ATT_KEYS;
        float *rx = k_r + (size_t)i * ATT_KEYS, *ry = k_r + (size_t)(n_pairs + i) * ATT_KEYS;
        for (int c = 0; c < ATT_KEYS; c += SIMD_FLOATS) {
            vfloat xv = vf_load(x + c), yv = vf_load(y + c), cv = vf_load(fc + c), sv = vf_load(fs + c);
            vf_store(rx + c, vf_fnma(yv, sv, vf_mul(xv, cv)));
            vf_store(ry + c, vf_fma(xv, sv, vf_mul(yv, cv)));
        }
    }
}

/* rows_dot_c with the tile's keys in ATT_KEYS / SIMD_FLOATS vectors (3 with
 * AVX-512, 6 with AVX2), their sums in registers over the rows, each w[r]
 * broadcast once: one load and one FMA a vector and a row, in the order of
 * rows_dot_c's. */
static void rows_dot_avx(float *acc, const float *rows, const float *w, int n) {
    enum { V = ATT_KEYS / SIMD_FLOATS };
    vfloat sum[V];
    for (int v = 0; v < V; v++) sum[v] = vf_zero();
    for (int r = 0; r < n; r++) {
        vfloat wr = vf_set1(w[r]);
        for (int v = 0; v < V; v++) sum[v] = vf_fma(wr, vf_load(rows + (size_t)r * ATT_KEYS + v * SIMD_FLOATS), sum[v]);
    }
    for (int v = 0; v < V; v++) vf_store(acc + v * SIMD_FLOATS, sum[v]);
}

/* acc + the products a[i] * b[i] of 32 unsigned bytes a and signed bytes b,
 * summed in fours into acc's 8 int32 lanes. One instruction with VNNI
 * (AVX-512 VNNI, or AVX-VNNI on CPUs without AVX-512); else
 * _mm256_maddubs_epi16 sums pairs to int16 (at most 2 * 128 * 127 here, no
 * overflow: a <= 128 and |b| <= 127 in every caller) and _mm256_madd_epi16
 * pairs of those to int32. The sums are exact either way, so both give the
 * same bits. */
static inline __m256i dot_u8s8_avx(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

/* The int32 sums of w[i] * x[i] over one group of gs int8 values (gs a
 * multiple of 32), in 8 lanes. The products take unsigned bytes on one side,
 * so the sign of w moves onto x: |w| * (sign(w) x) = w x. That way round it is
 * exact for every int8 weight: |-128| is 128 as an unsigned byte, and x, our
 * own quantization, stays within +-127, so negating it cannot wrap. */
static inline __m256i group_dot_i8_avx(const int8_t *w, const int8_t *x, int gs) {
    __m256i isum = _mm256_setzero_si256();
    for (int i = 0; i < gs; i += 32) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + i)), wv = _mm256_loadu_si256((const __m256i *)(w + i));
        isum = dot_u8s8_avx(isum, _mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    }
    return isum;
}

/* dot_tile_q8_c for R <= 4, T <= 2 and gs a multiple of 32 (R, T, gs
 * constants): each group's integer sums (group_dot_i8_avx), converted to
 * float and scaled by ws_r[g] * xs_t[g] into R x T float sums. */
static inline __attribute__((always_inline)) void dot_tile_q8_avx(float *out, int ldo, const int8_t *w,
                                                                 const float *ws, const int8_t *x, const float *xs,
                                                                 int R, int T, int n, int gs) {
    int groups = n / gs;
    __m256 acc[4][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                const int8_t *wg = w + (size_t)r * n + (size_t)g * gs, *xg = x + (size_t)t * n + (size_t)g * gs;
                __m256i isum = group_dot_i8_avx(wg, xg, gs);
                __m256 scale = _mm256_set1_ps(ws[(size_t)r * groups + g] * xs[(size_t)t * groups + g]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[r][t]);
            }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = hsum_avx(acc[r][t]);
}

/* dot_tile_q8_c for one row and one token (generation), gs a multiple of 32:
 * two groups per step into two float sums, so that the conversions and FMAs
 * of consecutive groups do not wait for each other. Called with gs = 32 as
 * a constant when it is (the default), so the group loop disappears. */
static inline __attribute__((always_inline)) void dot_q8_avx(float *out, const int8_t *w, const float *ws,
                                                            const int8_t *x, const float *xs, int n, int gs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int groups = n / gs, g = 0;
    for (; g + 2 <= groups; g += 2) {
        prefetch_ahead(w + (size_t)g * gs);
        __m256i s0 = group_dot_i8_avx(w + (size_t)g * gs, x + (size_t)g * gs, gs);
        __m256i s1 = group_dot_i8_avx(w + (size_t)(g + 1) * gs, x + (size_t)(g + 1) * gs, gs);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ws[g] * xs[g]), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(ws[g + 1] * xs[g + 1]), acc1);
    }
    if (g < groups) {
        __m256i s0 = group_dot_i8_avx(w + (size_t)g * gs, x + (size_t)g * gs, gs);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ws[g] * xs[g]), acc0);
    }
    *out = hsum_avx(_mm256_add_ps(acc0, acc1));
}

#if HAVE_Q8_AVX512
/* dot_q8_avx for gs = 32 with 512-bit vectors and VNNI, for one row w0 (two
 * = 0) or two rows w0 and w1 (two = 1; scales ws0, ws1, sums out0, out1):
 * two groups per vector, eight per step. abs(w) and x with w's sign
 * (AVX-512 has no sign_epi8: x negated where w < 0, by mask; exact for every
 * int8 weight, as in group_dot_i8_avx), one VNNI product into 16 int32 lanes
 * (lanes 0-7 group g, 8-15 group g+1), converted and scaled by [d_g x 8 |
 * d_g+1 x 8], d = ws * xs, eight of which are computed at once. About half
 * the instructions per weight byte of the 256-bit kernel; the groups past the
 * last multiple of 8 go through it. Each row's sum is the same arithmetic
 * with one row or two: two rows (dot_q8_runs) share x's loads and keep two
 * streams of loads in flight where one row kept one. The two rows' steps
 * go side by side, both loads first: the same kernel written over an array
 * of rows, or with one row's steps after the other's, ran 8-28% slower on
 * the Zen 5 EPYC. */
static inline __attribute__((always_inline)) void dot_q8_32_avx512(float *out0, float *out1, const int8_t *w0,
                                                                  const int8_t *w1, const float *ws0,
                                                                  const float *ws1, const int8_t *x,
                                                                  const float *xs, int n, int two) {
    __m512 acc0[4], acc1[4];
    for (int p = 0; p < 4; p++) acc0[p] = _mm512_setzero_ps(), acc1[p] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); // lane i: i / 8
    int groups = n / 32, g = 0;
    for (; g + 8 <= groups; g += 8) {
        for (int p = 0; p < 4; p++) {
            prefetch_ahead(w0 + (size_t)(g + 2 * p) * 32);
            if (two) prefetch_ahead(w1 + (size_t)(g + 2 * p) * 32);
        }
        __m256 x_scales = _mm256_loadu_ps(xs + g);
        __m512 d0 = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_loadu_ps(ws0 + g), x_scales));
        __m512 d1 = two ? _mm512_castps256_ps512(_mm256_mul_ps(_mm256_loadu_ps(ws1 + g), x_scales)) : d0;
        for (int p = 0; p < 4; p++) { // groups g + 2p, g + 2p + 1
            __m512i xv = _mm512_loadu_si512(x + (size_t)(g + 2 * p) * 32);
            __m512i pick = _mm512_add_epi32(_mm512_set1_epi32(2 * p), halves); // lanes 0-7: d[2p], 8-15: d[2p+1]
            __m512i wv0 = _mm512_loadu_si512(w0 + (size_t)(g + 2 * p) * 32), wv1 = wv0, sx1 = wv0, i1 = wv0;
            if (two) wv1 = _mm512_loadu_si512(w1 + (size_t)(g + 2 * p) * 32);
            __m512i sx0 = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(wv0), zero, xv);
            if (two) sx1 = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(wv1), zero, xv);
            __m512i i0 = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv0), sx0);
            if (two) i1 = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv1), sx1);
            acc0[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_permutexvar_ps(pick, d0), acc0[p]);
            if (two) acc1[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_permutexvar_ps(pick, d1), acc1[p]);
        }
    }
    float rest0 = 0.0f, rest1 = 0.0f;
    if (g < groups) {
        dot_q8_avx(&rest0, w0 + (size_t)g * 32, ws0 + g, x + (size_t)g * 32, xs + g, n - g * 32, 32);
        if (two) dot_q8_avx(&rest1, w1 + (size_t)g * 32, ws1 + g, x + (size_t)g * 32, xs + g, n - g * 32, 32);
    }
    __m512 sum0 = _mm512_add_ps(_mm512_add_ps(acc0[0], acc0[1]), _mm512_add_ps(acc0[2], acc0[3]));
    *out0 = _mm512_reduce_add_ps(sum0) + rest0;
    if (two) {
        __m512 sum1 = _mm512_add_ps(_mm512_add_ps(acc1[0], acc1[1]), _mm512_add_ps(acc1[2], acc1[3]));
        *out1 = _mm512_reduce_add_ps(sum1) + rest1;
    }
}

/* dot_q8_32_avx512 for two rows (dot_q8_runs), kept a function of its own
 * (not inlined into the parallel loop), as it was measured. */
static __attribute__((noinline)) void dot_q8_32_avx512_pair(float *out0, float *out1, const int8_t *w0,
                                                            const int8_t *w1, const float *ws0, const float *ws1,
                                                            const int8_t *x, const float *xs, int n) {
#ifdef TESTING
#pragma omp atomic
    q8_pair_calls++;
#endif
    dot_q8_32_avx512(out0, out1, w0, w1, ws0, ws1, x, xs, n, 1);
}
#endif

#if HAVE_Q8_COLS
/* The q8_0 column kernel: dot_tile_q8_c's formula for blocks of tokens,
 *   out[t * ldo + r] = sum over groups g of ws_r[g] * xs_t[g] * (sum over the group of w_r[k] * xq_t[k])
 * with the products of the column kernel (cols_tile_f32): R <= 6 rows x J
 * vectors of tokens, one broadcast per row meeting J loads of tokens, but 4
 * bytes at a time. VNNI multiplies unsigned by signed bytes and adds the four
 * products of each lane, so x comes packed (pack_q8_block) as
 *   xqt[(k / 4) * 4 * ldx + 4 * t + k % 4] = xq_t[k] + 128     (0..255)
 * and each row's broadcast is its 4 int8 weights w_r[k..k+3]. The offset adds
 * 128 * (sum of w_r over the group) to every token's sum: each group's integer
 * sums start from wsum_r[g] = -128 * that sum (q8_group_sums), so they come
 * out exact: the same integers as the one-token kernels'. Then per group
 * sums converted to float and scaled by ws_r[g] * xst[g * ldx + t] (scales
 * transposed). int32 cannot overflow: |sum| <= 255 * 128 * gs. matmul uses
 * it for int8 activations (run's --q8-activations int8). Measured on
 * 110M-shaped matrices (AVX-512 VNNI, one thread): 2.1-2.3x the rate of
 * dequantized rows through cols_tile_f32 (a VNNI instruction does 64
 * multiply-adds, an FMA 16; measured in a loop here, 2.9 VNNI instructions
 * per ns against 5 FMAs). */
static inline __attribute__((always_inline)) void cols_tile_q8(float *out, int ldo, const int8_t *w, const float *ws,
                                                              const int32_t *wsum, int n, int gs,
                                                              const uint8_t *xqt, const float *xst, int ldx, int R,
                                                              int J, int T) {
    int groups = n / gs;
    vfloat acc[6][COLS_VECS]; // (Q8_COLS_VECS of them used)
    vint isum[6][Q8_COLS_VECS], x[Q8_COLS_VECS];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) acc[r][j] = vf_zero();
    for (int g = 0; g < groups; g++) {
        for (int r = 0; r < R; r++)
            for (int j = 0; j < J; j++) isum[r][j] = vi_set1(wsum[(size_t)r * groups + g]);
        for (int k = g * gs; k < (g + 1) * gs; k += 4) {
            for (int j = 0; j < J; j++) x[j] = vi_load(xqt + (size_t)k * ldx + j * 4 * SIMD_FLOATS);
            for (int r = 0; r < R; r++) {
                int32_t four; // w_r[k..k+3], side by side in each lane
                memcpy(&four, w + (size_t)r * n + k, 4);
                vint wr = vi_set1(four);
                for (int j = 0; j < J; j++) isum[r][j] = vi_dpbusd(isum[r][j], x[j], wr);
            }
        }
        for (int j = 0; j < J; j++) {
            vfloat xs = vf_load(xst + (size_t)g * ldx + j * SIMD_FLOATS);
            for (int r = 0; r < R; r++)
                acc[r][j] = vf_fma(vi_to_float(isum[r][j]), vf_mul(vf_set1(ws[(size_t)r * groups + g]), xs), acc[r][j]);
        }
    }
    store_tile(out, ldo, 0, acc, R, J, T);
}

/* cols_tile_q8 with R rows (a constant) and T <= Q8_COLS_VECS * SIMD_FLOATS
 * tokens; gs = 32 (q8_0's usual group) as a constant, so its loop unrolls. */
static inline __attribute__((always_inline)) void cols_tile_q8_rows(float *out, int ldo, const int8_t *w,
                                                                   const float *ws, const int32_t *wsum, int n,
                                                                   int gs, const uint8_t *xqt, const float *xst,
                                                                   int ldx, int R, int T) {
    int J = (T + SIMD_FLOATS - 1) / SIMD_FLOATS;
#if Q8_COLS_VECS == 2
    if (J == 2) {
        if (gs == 32) cols_tile_q8(out, ldo, w, ws, wsum, n, 32, xqt, xst, ldx, R, 2, T);
        else cols_tile_q8(out, ldo, w, ws, wsum, n, gs, xqt, xst, ldx, R, 2, T);
        return;
    }
#endif
    (void)J;
    if (gs == 32) cols_tile_q8(out, ldo, w, ws, wsum, n, 32, xqt, xst, ldx, R, 1, T);
    else cols_tile_q8(out, ldo, w, ws, wsum, n, gs, xqt, xst, ldx, R, 1, T);
}

/* cols_tile_q8 over `rows` rows (scales ws, sums wsum: (rows, n/gs)) and B
 * tokens, in tiles of 6 rows (the last in 4, 2, 1) x Q8_COLS_VECS vectors. */
static void cols_q8(float *out, int ldo, const int8_t *w, const float *ws, const int32_t *wsum, int rows, int n,
                    int gs, const uint8_t *xqt, const float *xst, int ldx, int B) {
    int groups = n / gs;
    for (int i = 0, R; i < rows; i += R) {
        R = tile_height(rows - i);
        const int8_t *wi = w + (size_t)i * n;
        const float *wsi = ws + (size_t)i * groups;
        const int32_t *sumi = wsum + (size_t)i * groups;
        for (int b = 0; b < B; b += Q8_COLS_VECS * SIMD_FLOATS) {
            float *o = out + (size_t)b * ldo + i;
            const uint8_t *x = xqt + (size_t)4 * b;
            int T = B - b < Q8_COLS_VECS * SIMD_FLOATS ? B - b : Q8_COLS_VECS * SIMD_FLOATS;
            if (R == 6) cols_tile_q8_rows(o, ldo, wi, wsi, sumi, n, gs, x, xst + b, ldx, 6, T);
            else if (R == 4) cols_tile_q8_rows(o, ldo, wi, wsi, sumi, n, gs, x, xst + b, ldx, 4, T);
            else if (R == 2) cols_tile_q8_rows(o, ldo, wi, wsi, sumi, n, gs, x, xst + b, ldx, 2, T);
            else cols_tile_q8_rows(o, ldo, wi, wsi, sumi, n, gs, x, xst + b, ldx, 1, T);
        }
    }
}
#endif
#endif

/* The tile functions matmul calls for what does not go through cols_f32
 * (blocks of float rows in a SIMD build, q8_0 rows dequantized included):
 * int8 q8_0 products (one token; blocks only when matmul has no w_rows
 * scratch) through the one tile kernel instantiated with constant sizes, so
 * an output is the same sum in the same order whatever the tile or the thread
 * count, and the portable tiles. A single token (generation)
 * has its own kernels (float32: dot_f32_avx, which matmul calls for a whole
 * chunk, so the branch below serves only blocks without matmul's x_t
 * scratch), which read the rows one after the other: one sequential stream,
 * which the hardware prefetcher follows best on the Intel VM (measured there:
 * 4 rows side by side streamed 15-25% slower for float32, and 25% slower for
 * q8_0); on AMD float32 rows go 4 or 8 side by side from as many runs of
 * rows (dot_rows_streams) and q8_0 rows from 2 runs, in turn or in one pass
 * (dot_q8_runs), which matmul calls instead. They sum in another order
 * than the tiles (float rounding; the tests bound it). */
static void dot_tile_f32(float *out, int ldo, const float *w, const float *x, int R, int T, int n) {
#if HAVE_SIMD
    if (use_simd && T == 1) { // blocks of tokens go through cols_f32 (see matmul)
        for (int r = 0; r < R; r++) dot_f32_avx(out + r, w + (size_t)r * n, x, n);
        return;
    }
#endif
    dot_tile_f32_c(out, ldo, w, x, R, T, n);
}
#if HAVE_SIMD
/* out = sum over groups g of ws[g] * xs[g] * (sum of w[i] * x[i] over the
 * group): dot_tile_q8_c for one row and one token (gs a multiple of 32), by
 * the widest kernel there is. */
static void dot_q8_row(float *out, const int8_t *w, const float *ws, const int8_t *x, const float *xs, int n, int gs) {
#if HAVE_Q8_AVX512
    if (gs == 32) {
        dot_q8_32_avx512(out, NULL, w, NULL, ws, NULL, x, xs, n, 0);
        return;
    }
#endif
    if (gs == 32) dot_q8_avx(out, w, ws, x, xs, n, 32);
    else dot_q8_avx(out, w, ws, x, xs, n, gs);
}
#endif

static void dot_tile_q8(float *out, int ldo, const int8_t *w, const float *ws, const int8_t *x, const float *xs, int R,
                        int T, int n, int gs) {
#if HAVE_SIMD
    if (use_simd && gs % 32 == 0) {
        int step = R == 4 && T > 1 ? 4 : 1;
        for (int r = 0; r < R; r += step) {
            float *o = out + r;
            const int8_t *wr = w + (size_t)r * n;
            const float *wsr = ws + (size_t)r * (n / gs);
            if (step == 4) dot_tile_q8_avx(o, ldo, wr, wsr, x, xs, 4, 2, n, gs);
            else if (T == 2) dot_tile_q8_avx(o, ldo, wr, wsr, x, xs, 1, 2, n, gs);
            else dot_q8_row(o, wr, wsr, x, xs, n, gs);
        }
        return;
    }
#endif
    dot_tile_q8_c(out, ldo, w, ws, x, xs, R, T, n, gs);
}

#if HAVE_SIMD
/* out = w x for one token and q8_0 rows w (d, n) on AMD (q8_runs = 2),
 * x quantized (x_q, x_scale): a thread's rows a..b-1 (the d rows shared out
 * evenly) are 2 runs of len = (b - a) / 2 rows, taken in turn, row i of one
 * run then row i of the other (the last row left over alone), each through
 * dot_q8_row and its prefetch, or with AVX-512 VNNI and gs = 32 both rows in one
 * pass (dot_q8_32_avx512_pair): two streams, each long, where a thread's
 * rows in order were one. Each row's sum is dot_q8_row's, so the result is
 * the same bits as the rows in order, on any number of threads. On the AMD
 * EPYC with Zen 3 cores (AVX2), interleaved, 5 runs, medians: 110M q8_0
 * generation 107.9 -> 119.5 tokens/s on one thread, 166.5 -> 195.2 on two;
 * SmolLM2 88.8 -> 106.2 and 134.5 -> 138.2; 4 and 8 runs taken in turn were
 * no faster than the rows in order. On the Zen 5 EPYC (AVX-512 VNNI) the
 * two rows in one pass gave SmolLM2 1.15-1.2x the rate of the two in turn,
 * 110M 0.97-1.13x; 4 runs' rows in one pass were slower
 * (docs/performance.md). gs a multiple of 32. */
#ifdef TESTING
int q8_runs_calls; // kernels.h: how often dot_q8_runs ran (the tests' check that it did)
int q8_pair_calls; // kernels.h: how often dot_q8_32_avx512_pair ran
#endif
static void dot_q8_runs(float *out, const int8_t *w, const float *ws, const int8_t *x, const float *xs, int n, int d,
                        int gs) {
#ifdef TESTING
    q8_runs_calls++;
#endif
#pragma omp parallel if ((long)n * d >= PARALLEL_MIN_WORK)
    {
        int a, b;
        thread_rows(d, &a, &b);
        int len = (b - a) / 2, groups = n / gs;
        for (int i = 0; i < len; i++) {
            size_t r = (size_t)a + i, next = r + len; // row i of the first run, row i of the second
#if HAVE_Q8_AVX512
            if (gs == 32) {
                dot_q8_32_avx512_pair(out + r, out + next, w + r * n, w + next * n, ws + r * groups,
                                      ws + next * groups, x, xs, n);
                continue;
            }
#endif
            dot_q8_row(out + r, w + r * n, ws + r * groups, x, xs, n, gs);
            dot_q8_row(out + next, w + next * n, ws + next * groups, x, xs, n, gs);
        }
        if ((b - a) % 2) dot_q8_row(out + b - 1, w + (size_t)(b - 1) * n, ws + (size_t)(b - 1) * groups, x, xs, n, gs);
    }
}
#endif

#if HAVE_SIMD
/* 8 IEEE halves as float32 (exact): one F16C instruction where the compiler
 * targets it (every AVX2 CPU has it), else one by one. */
static inline __m256 halves8(const uint16_t *h) {
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = half_to_float(h[i]);
    return _mm256_loadu_ps(f);
#endif
}

/* The 32 nibbles of a q4 block (16 bytes) as bytes 0..15 in value order:
 * the low nibbles (values 0-15) in the low 128 bits, the high ones above. */
static inline __m256i q4_unpack_avx(const uint8_t *qs) {
    __m128i b = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}

/* sum_i w_i x_i over one block in 8 int32 lanes (exact): q4_1's nibbles are
 * unsigned bytes as they are; q4_0's w = q - 8 takes group_dot_i8_avx's
 * signs (|w| by x with w's sign). */
static inline __attribute__((always_inline)) __m256i q4_block_avx(const uint8_t *qs, const int8_t *x, int q4_0) {
    __m256i q = q4_unpack_avx(qs), xv = _mm256_loadu_si256((const __m256i *)x), zero = _mm256_setzero_si256();
    if (!q4_0) return dot_u8s8_avx(zero, q, xv);
    __m256i w = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    return dot_u8s8_avx(zero, _mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
}

/* dot_q4_c with AVX2 (q4_0 a constant): 8 blocks a step, their d * xs
 * computed in one vector, two float sums; q4_1's m_g * xsum_g in a third. */
static inline __attribute__((always_inline)) float dot_q4_avx(const uint8_t *qs, const uint16_t *d,
                                                              const uint16_t *m, const int8_t *x, const float *xs,
                                                              const float *xsum, int n, int q4_0) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, accm = acc0;
    int groups = n / 32, g = 0;
    for (; g + 8 <= groups; g += 8) {
        float ds[8];
        _mm256_storeu_ps(ds, _mm256_mul_ps(halves8(d + g), _mm256_loadu_ps(xs + g)));
        if (!q4_0) accm = _mm256_fmadd_ps(halves8(m + g), _mm256_loadu_ps(xsum + g), accm);
        prefetch_ahead(qs + (size_t)g * 16);
        prefetch_ahead(qs + (size_t)g * 16 + 64);
        for (int k = 0; k < 8; k += 2) {
            __m256i s0 = q4_block_avx(qs + (size_t)(g + k) * 16, x + (size_t)(g + k) * 32, q4_0);
            __m256i s1 = q4_block_avx(qs + (size_t)(g + k + 1) * 16, x + (size_t)(g + k + 1) * 32, q4_0);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ds[k]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(ds[k + 1]), acc1);
        }
    }
    float rest = 0.0f;
    for (; g < groups; g++) {
        __m256i s0 = q4_block_avx(qs + (size_t)g * 16, x + (size_t)g * 32, q4_0);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(half_to_float(d[g]) * xs[g]), acc0);
        if (!q4_0) rest += half_to_float(m[g]) * xsum[g];
    }
    return hsum_avx(_mm256_add_ps(_mm256_add_ps(acc0, acc1), accm)) + rest;
}

#if HAVE_Q8_AVX512
/* dot_q4_avx with 512-bit vectors and VNNI: two blocks a vector (their 32
 * bytes of nibbles unpacked, the 128-bit quarters put in value order: block
 * g's low and high nibbles, then block g+1's), one VNNI product into 16
 * lanes (0-7 block g, 8-15 block g+1) scaled as dot_q8_32_avx512 does;
 * q4_0's signs as there. 8 blocks a step; the rest through dot_q4_avx. */
static inline __attribute__((always_inline)) float dot_q4_avx512(const uint8_t *qs, const uint16_t *d,
                                                                 const uint16_t *m, const int8_t *x,
                                                                 const float *xs, const float *xsum, int n,
                                                                 int q4_0) {
    __m512 acc[4];
    for (int p = 0; p < 4; p++) acc[p] = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    const __m512i zero = _mm512_setzero_si512(), eight = _mm512_set1_epi8(8);
    const __m256i mask = _mm256_set1_epi8(15);
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); // lane i: i / 8
    int groups = n / 32, g = 0;
    for (; g + 8 <= groups; g += 8) {
        prefetch_ahead(qs + (size_t)g * 16);
        prefetch_ahead(qs + (size_t)g * 16 + 64);
        __m512 ds = _mm512_castps256_ps512(_mm256_mul_ps(halves8(d + g), _mm256_loadu_ps(xs + g)));
        if (!q4_0) accm = _mm256_fmadd_ps(halves8(m + g), _mm256_loadu_ps(xsum + g), accm);
        for (int p = 0; p < 4; p++) { // blocks g + 2p, g + 2p + 1
            __m256i b = _mm256_loadu_si256((const __m256i *)(qs + (size_t)(g + 2 * p) * 16));
            __m256i lo = _mm256_and_si256(b, mask), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
            __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); // lo_g lo_g+1 hi_g hi_g+1
            q = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0));          // lo_g hi_g lo_g+1 hi_g+1
            __m512i xv = _mm512_loadu_si512(x + (size_t)(g + 2 * p) * 32), i;
            if (q4_0) {
                __m512i w = _mm512_sub_epi8(q, eight);
                i = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w),
                                        _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w), zero, xv));
            } else
                i = _mm512_dpbusd_epi32(zero, q, xv);
            __m512i pick = _mm512_add_epi32(_mm512_set1_epi32(2 * p), halves);
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(pick, ds), acc[p]);
        }
    }
    float rest = 0.0f;
    if (g < groups)
        rest = dot_q4_avx(qs + (size_t)g * 16, d + g, m ? m + g : NULL, x + (size_t)g * 32, xs + g,
                          xsum ? xsum + g : NULL, n - g * 32, q4_0);
    __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    return _mm512_reduce_add_ps(sum) + hsum_avx(accm) + rest;
}
#endif
#endif

/* dot_q4_c by this build's SIMD kernel (kernels.h's q4_avx512 picks the
 * 512-bit one where there is one; use_simd = 0: dot_q4_c). */
static float dot_q4_row(const uint8_t *qs, const uint16_t *d, const uint16_t *m, const int8_t *x, const float *xs,
                        const float *xsum, int n) {
#if HAVE_SIMD
    if (use_simd) {
#if HAVE_Q8_AVX512
        if (q4_avx512)
            return m ? dot_q4_avx512(qs, d, m, x, xs, xsum, n, 0) : dot_q4_avx512(qs, d, NULL, x, xs, NULL, n, 1);
#endif
        return m ? dot_q4_avx(qs, d, m, x, xs, xsum, n, 0) : dot_q4_avx(qs, d, NULL, x, xs, NULL, n, 1);
    }
#endif
    return dot_q4_c(qs, d, m, x, xs, xsum, n);
}

/* ==========================================================================
 * 3. Attention over the cache
 * ========================================================================== */

/* out[j] = q . row j of the cache, j < n_keys (kernels.h): 8 keys at a time
 * with SIMD and a float32 cache, the rest one by one. */
void kv_scores(float *out, const float *q, const void *cache, int kv_type, size_t offset, int stride, int n_keys,
               int n) {
    int j = 0;
#if HAVE_SIMD
    if (use_simd && kv_type == KV_F32 && n % 8 == 0)
        for (; j + 8 <= n_keys; j += 8) dot8_f32_avx(out + j, q, (const float *)cache + offset + (size_t)j * stride,
                                                     stride, n);
#endif
    for (; j < n_keys; j++) out[j] = kv_dot(q, cache, kv_type, offset + (size_t)j * stride, n);
}

/* attention_block (kernels.h's formula) works on tiles: ATT_QUERIES queries
 * of one head against ATT_KEYS keys at a time, everything stored keys x
 * queries or head_size x queries, the queries side by side:
 *   s  = K q_t     (ATT_KEYS, queries)    s[c][j] = k_c . q_j
 *   p  = exp(s * scale - m')              per query j, its keys only
 *   pv = V^T p     (head_size, queries)   pv[i][j] = sum_c v_c[i] p[c][j]
 *   o  = o * alpha + pv                   alpha[j] = exp(m_j - m'_j)
 * Both products are the column product (cols_f32_c, SIMD cols_f32), and the
 * softmax steps are elementwise over rows of queries, so every step runs in
 * SIMD lanes over queries with no horizontal sums, and the products store
 * whole vectors. The key and value tiles of 48 rows (9 KiB each at head_size
 * 48) stay in L1 while the 128 queries pass over them, so each key is read
 * from the cache memory once per 128 queries: a prompt or ppl block of 128
 * tokens reads a head's keys and values once (measured: 128 against 64
 * queries, ppl --ctx 8192 on a 15M shape 8% faster, where a head's 3 MiB of
 * keys and values no longer fit in L2; no slower at --ctx 256).
 * With frames (exact dynamic NTK) s is no product: every query rotates the
 * tile's keys its own way (frame_scores), in lanes over the tile's keys, once
 * for the G heads that share a key head (attention_block takes them together
 * then: G = n_heads / n_kv_heads, else 1).
 * Per thread, scratch (attention_block_floats), for each of the G heads:
 *   q_t    (head_size, ATT_QUERIES) the tile's queries transposed, zero past them
 *   s      (ATT_KEYS, ATT_QUERIES)  scores, then p
 *   o      (head_size, ATT_QUERIES) the output so far
 *   m, l   (ATT_QUERIES)            running maximum and sum
 *   qg_t                            second queries transposed
 *   sum_l  (ATT_QUERIES doubles)    the statistics' sum of weights
 * and, shared by the G heads (one head's step at a time):
 *   pv     (head_size, ATT_QUERIES) p's weighted values
 *   k, v   (ATT_KEYS, head_size)    an f16 or q8_0 cache's key and value tile as float32
 *   alpha, tile_max, shift, tile_u, dm (ATT_QUERIES)  exp(m - m'),
 *                                   online_softmax_tile's scratch and the tally's
 *   s_g                             second queries' scores
 *   k_t, k_r, q_r (head_size x ATT_KEYS twice, head_size)  frames: the key tile
 *                                   split and transposed, rotated for one
 *                                   query, and one query rotated
 * The products read whole vectors of q_t's and s's rows: their columns past
 * the tile's queries are zero (s: set once, never written after). */
#define ATT_QUERIES 128

/* Per-head scratch of attention_tile, in floats: sum_l (doubles), q_t, qg_t,
 * s, o, m, l; a multiple of 2, so that each head's doubles stay aligned. */
static size_t head_floats(size_t hs) { return 3 * hs * ATT_QUERIES + ATT_KEYS * ATT_QUERIES + 4 * ATT_QUERIES; }

size_t attention_block_floats(int head_size, int heads_per_kv_head) {
    size_t hs = (size_t)head_size; // heads' own, then the shared s_g, pv, k, v, k_t, k_r, alpha .. dm, q_r
    size_t n = heads_per_kv_head * head_floats(hs) + ATT_KEYS * ATT_QUERIES + hs * ATT_QUERIES + 4 * ATT_KEYS * hs +
               5 * ATT_QUERIES + hs;
    return (n + 15) / 16 * 16; // each thread's scratch 64-byte aligned (its doubles aligned, no line shared)
}

/* Rows k0 .. k0+n-1 of a head's slice of the cache (head_size values from
 * offset = k0 * kv_dim + the head's column) as float32 rows: the cache itself
 * when it is float32 (rows kv_dim apart), else converted into buf (rows
 * head_size apart). *ld gets the step between rows. */
static const float *kv_tile(float *buf, int *ld, const void *cache, int kv_type, size_t offset, int kv_dim, int n,
                            int head_size) {
    if (kv_type == KV_F32) {
        *ld = kv_dim;
        return (const float *)cache + offset;
    }
    for (int j = 0; j < n; j++) kv_load(buf + (size_t)j * head_size, cache, kv_type, offset + (size_t)j * kv_dim, head_size);
    *ld = head_size;
    return buf;
}

/* The column product (cols_f32_c's formula) by rows, SIMD when there is. */
static void cols_product(float *out, int ldo, const float *w, size_t w_row, size_t w_col, int rows, int n,
                         const float *xt, int ldx, int B) {
#if HAVE_SIMD
    if (use_simd) {
        cols_f32(out, ldo, 1, w, w_row, w_col, rows, n, xt, ldx, COLS_TOKENS, B);
        return;
    }
#endif
    cols_f32_c(out, ldo, 1, w, w_row, w_col, rows, n, xt, ldx, B);
}

/* The online softmax step for a tile of nk keys (from key k0) and the nq
 * queries at positions pos .. pos+nq-1: on entry s[c * ATT_QUERIES + j] =
 * k_c . q_j; on return exp(s * scale - m'_j), 0 for the keys query j does not
 * see (kernels.h: key k0 + c with lo_j <= k0 + c <= pos + j, or a sink,
 * k0 + c < n_sinks, at or before pos + j); m and l move to m' and l', and
 * alpha[j] = exp(m_j - m'_j), the factor for the output so far (1 for a query
 * that has seen no key yet). tile_max, shift: scratch, the tile's maximum
 * score and the value subtracted before exp (m', or 0 while m' is -inf:
 * every s is -inf then, and exp gives 0). With statistics (tile_u not NULL;
 * kernels.h's AttnTally), per query: tile_u[j] = the tile's sum of
 * e (s - m'), and dm[j] = m - m' (0 before the first key seen). */
static void online_softmax_tile(float *s, int nk, int nq, int k0, int pos, int window, int n_sinks, float scale,
                                float *m, float *l, float *alpha, float *tile_max, float *shift, float *tile_u,
                                float *dm) {
    for (int j = 0; j < nq; j++) tile_max[j] = -INFINITY;
    // masking is needed on the diagonal tile(s) and at a window's edge only (never on a tile of sinks)
    int masked = k0 + nk - 1 > pos || (window > 0 && k0 < pos + nq - window && k0 >= n_sinks);
    for (int c = 0; c < nk; c++) {
        float *row = s + (size_t)c * ATT_QUERIES;
        int key = k0 + c;
        if (masked) {
#pragma omp simd simdlen(SIMD_FLOATS)
            for (int j = 0; j < nq; j++) {
                int sees = key <= pos + j && (window <= 0 || key > pos + j - window || key < n_sinks);
                row[j] = sees ? row[j] * scale : -INFINITY;
            }
        } else {
#pragma omp simd simdlen(SIMD_FLOATS)
            for (int j = 0; j < nq; j++) row[j] *= scale;
        }
#pragma omp simd simdlen(SIMD_FLOATS)
        for (int j = 0; j < nq; j++) tile_max[j] = row[j] > tile_max[j] ? row[j] : tile_max[j];
    }
    for (int j = 0; j < nq; j++) { // m' = max(m, the tile's maximum)
        float m_new = tile_max[j] > m[j] ? tile_max[j] : m[j];
        alpha[j] = m_new == -INFINITY ? 1.0f : exp_fast(m[j] - m_new); // 0 on the first tile seen
        shift[j] = m_new == -INFINITY ? 0.0f : m_new;
        if (tile_u) dm[j] = l[j] > 0.0f ? m[j] - m_new : 0.0f, tile_u[j] = 0.0f;
        m[j] = m_new;
        l[j] *= alpha[j];
    }
    if (tile_u) { // the same, adding up each weight's e (s - m') (a key not seen: e = 0, s - m' = -inf)
        for (int c = 0; c < nk; c++) {
            float *row = s + (size_t)c * ATT_QUERIES;
#pragma omp simd simdlen(SIMD_FLOATS)
            for (int j = 0; j < nq; j++) {
                float x = row[j] - shift[j], e = exp_fast(x);
                row[j] = e;
                l[j] += e;
                tile_u[j] += e > 0.0f ? e * x : 0.0f;
            }
        }
        return;
    }
    for (int c = 0; c < nk; c++) {
        float *row = s + (size_t)c * ATT_QUERIES;
#pragma omp simd simdlen(SIMD_FLOATS)
        for (int j = 0; j < nq; j++) {
            row[j] = exp_fast(row[j] - shift[j]);
            l[j] += row[j];
        }
    }
}

/* q_t[i * ATT_QUERIES + j] = q_j[i] (q_j = q + j * ldq) for j < nq, zero
 * past them: a tile's queries side by side. */
static void transpose_queries(float *q_t, const float *q, int ldq, int nq, int head_size) {
    for (int i = 0; i < head_size; i++)
        for (int j = 0; j < ATT_QUERIES; j++) q_t[(size_t)i * ATT_QUERIES + j] = j < nq ? q[(size_t)j * ldq + i] : 0.0f;
}

/* The dims of RoPE pair i of a head: (2i, 2i+1) interleaved, (i, i + n_pairs) neox (run.c's rope). */
static inline int pair_first(int i, int layout) { return layout == ROPE_INTERLEAVED ? 2 * i : i; }
static inline int pair_second(int i, int n_pairs, int layout) {
    return layout == ROPE_INTERLEAVED ? 2 * i + 1 : i + n_pairs;
}

/* Frames (kernels.h's QueryFrames), for the G heads g of one key head:
 * s + g s_step holds head g's s[c * ATT_QUERIES + j] = query j rotated by its
 * coarse row k0 / ATT_KEYS . key k0 + c rotated by query j's fine row c, for
 * the nk keys of a tile starting at k0 (a multiple of ATT_KEYS) and the nq
 * queries at pos .. (head g's q_j = q + j * ldq + g * head_size, block
 * indices b0 + j); queries that do not reach the tile get 0 (masked
 * afterwards). k: the tile's unrotated keys, rows ldk apart. The key tile is
 * split into its pairs' first and second components and transposed once
 * (k_t: rows of the tile's keys side by side); then, for each query, its
 * fine rows rotate the tile (rotate_keys, into k_r's first rot_dim rows; the
 * dims past rot_dim, partial rotary, stay as they are in k_r's last rows),
 * and every head's query, rotated by its coarse row and split the same way,
 * takes its scores from k_r in lanes over the keys (rows_dot). The rotation,
 * the costly part (four multiply-adds a pair, where a score takes two), is
 * made once for the G heads that read the same keys. */
static void frame_scores(float *s, size_t s_step, const QueryFrames *f, int b0, int nq, int pos, int k0, int nk,
                         const float *k, int ldk, const float *q, int ldq, int head_size, int G, float *k_t,
                         float *k_r, float *q_r) {
    int n_pairs = f->rot_dim / 2, rot = f->rot_dim, u = k0 / ATT_KEYS;
    for (int d = 0; d < head_size; d++) { // k_t[d][c]: d < n_pairs first components, then seconds; the rest in k_r
        int dim = d < n_pairs ? pair_first(d, f->layout)
                : d < rot     ? pair_second(d - n_pairs, n_pairs, f->layout) : d;
        float *row = (d < rot ? k_t : k_r) + (size_t)d * ATT_KEYS;
        for (int c = 0; c < ATT_KEYS; c++) row[c] = c < nk ? k[(size_t)c * ldk + dim] : 0.0f;
    }
    for (int j = 0; j < nq; j++) {
        if (k0 > pos + j) { // a tile past this query's position
            for (int g = 0; g < G; g++)
                for (int c = 0; c < nk; c++) s[g * s_step + (size_t)c * ATT_QUERIES + j] = 0.0f;
            continue;
        }
        size_t b = (size_t)(b0 + j);
        const float *fine_cos = f->fine_cos + b * n_pairs * ATT_KEYS, *fine_sin = f->fine_sin + b * n_pairs * ATT_KEYS;
#if HAVE_SIMD
        if (use_simd) rotate_keys_avx(k_r, k_t, fine_cos, fine_sin, n_pairs);
        else
#endif
            rotate_keys_c(k_r, k_t, fine_cos, fine_sin, n_pairs);
        const float *cos_u = f->coarse_cos + ((size_t)u * f->block + b) * n_pairs;
        const float *sin_u = f->coarse_sin + ((size_t)u * f->block + b) * n_pairs;
        for (int g = 0; g < G; g++) {
            const float *qj = q + (size_t)j * ldq + (size_t)g * head_size;
            for (int i = 0; i < n_pairs; i++) { // q_r: the query rotated by its coarse row, split like k_r
                float x = qj[pair_first(i, f->layout)], y = qj[pair_second(i, n_pairs, f->layout)];
                q_r[i] = x * cos_u[i] - y * sin_u[i];
                q_r[n_pairs + i] = x * sin_u[i] + y * cos_u[i];
            }
            for (int d = rot; d < head_size; d++) q_r[d] = qj[d];
            float acc[ATT_KEYS];
#if HAVE_SIMD
            if (use_simd) rows_dot_avx(acc, k_r, q_r, head_size);
            else
#endif
                rows_dot_c(acc, k_r, q_r, head_size);
            for (int c = 0; c < nk; c++) s[g * s_step + (size_t)c * ATT_QUERIES + j] = acc[c];
        }
    }
}

/* The statistics' step for a tile (kernels.h's AttnTally), after
 * online_softmax_tile: rows[j * step ..] is query j's tally row, in which
 * [0] holds U so far and [1 + k] bucket k's mass so far (then the sinks'),
 * and sum_l[j] the sum of its weights so far, all before the division by l
 * and in double (a window's thousands of float terms would lose the 1e-6 the
 * tests hold). They move to the new maximum (alpha[j], dm[j] = m - m'), and
 * each weight e = s[c * ATT_QUERIES + j] of the tile (keys k0 .. k0+nk-1,
 * queries at pos .. pos+nq-1) goes to the bucket of its distance
 * pos + j - k0 - c, or for rows below n_sinks to the sinks' slot (a tile of
 * sinks holds only sinks). Most tiles lie in one bucket for all their pairs:
 * summed in lanes. */
static void tally_tile(double *rows, int step, double *sum_l, const AttnTally *tally, const float *s,
                       const float *alpha, const float *dm, const float *tile_u, int nk, int nq, int k0, int pos,
                       int n_sinks) {
    int nb = tally->n_buckets;
    for (int j = 0; j < nq; j++) { // to the new maximum: U' = alpha (U + l (m - m')), each mass and l times alpha
        double *row = rows + (size_t)j * step, a = alpha[j];
        row[0] = a * (row[0] + sum_l[j] * dm[j]) + tile_u[j];
        sum_l[j] *= a;
        if (a != 1.0)
            for (int k = 1; k <= nb + 1; k++) row[k] *= a;
    }
    // the tile's distances; those below 0 or from n_distances on are keys no query sees (weight 0)
    int d_lo = pos - (k0 + nk - 1), d_hi = pos + nq - 1 - k0, n_d = tally->n_distances;
    d_lo = d_lo > 0 ? d_lo : 0, d_hi = d_hi < n_d ? d_hi : n_d - 1;
    int one = k0 + nk <= n_sinks ? nb : d_hi < d_lo ? -1
            : tally->bucket[d_lo] == tally->bucket[d_hi] ? tally->bucket[d_hi] : -2;
    if (one == -1) return; // no pair at a distance some query sees: no weight
    if (one >= 0) { // one bucket (or the sinks): each query's weights summed, then added
        float sum[ATT_QUERIES] = {0};
        for (int c = 0; c < nk; c++) {
            const float *row = s + (size_t)c * ATT_QUERIES;
#pragma omp simd simdlen(SIMD_FLOATS)
            for (int j = 0; j < nq; j++) sum[j] += row[j];
        }
        for (int j = 0; j < nq; j++) rows[(size_t)j * step + 1 + one] += sum[j], sum_l[j] += sum[j];
        return;
    }
    for (int c = 0; c < nk; c++)
        for (int j = 0; j < nq; j++) {
            int d = pos + j - (k0 + c);
            float e = s[(size_t)c * ATT_QUERIES + j];
            if (d >= 0 && d < n_d) rows[(size_t)j * step + 1 + tally->bucket[d]] += e, sum_l[j] += e;
        }
}

/* G heads of one key head (h0 .. h0+G-1: G = 1, or with frames every head
 * of the key head), nq <= ATT_QUERIES queries at positions pos .. pos+nq-1
 * (head g's q_j = q + j * ldq + g * head_size, out_j likewise in out, ldo;
 * block indices b0 + j), against the keys and values of the key head's
 * slice of the caches (from `offset` in each row, rows kv_dim apart):
 * kernels.h's formula over the tiles of keys first .. pos+nq-1, first = the
 * first query's first key, and before them the sinks' rows 0..n_sinks-1 in
 * tiles of their own. Tiles past the last query's key are never read, nor
 * keys older than the first query's window (the sinks apart). Each key and
 * value tile is read once for the G heads, which then take their steps one
 * after the other. With second queries (q2: query j's at q2 + j * ldq;
 * second->keys laid out as the cache), key t scores against query j's second
 * query and second key t when Self-Extend's pos + j - t >= far, or t is a
 * sink: a tile wholly on that side computes those scores alone, a tile across
 * the line both, and takes each score from its side. With frames the scores
 * come from frame_scores, for the G heads at once, tiles at multiples of
 * ATT_KEYS. With a tally, query j's statistics for head g go to tally_rows +
 * j * tally_step + g * (n_buckets + 2) (AttnTally's row). */
static void attention_tile(float *out, int ldo, const float *q, int ldq, int nq, int pos, int window,
                           const void *keys, int key_type, const void *values, int value_type, const float *q2,
                           const SecondQueries *second, const QueryFrames *frames, int b0, size_t offset, int kv_dim,
                           int head_size, int G, const AttnTally *tally, double *tally_rows, int tally_step,
                           float *scratch) {
    size_t hs = (size_t)head_size, Q = ATT_QUERIES, per_head = head_floats(hs);
    // scratch: per head (g at scratch + g * per_head) sum_l, q_t, qg_t, s, o, m, l; then, shared,
    float *s_g = scratch + G * per_head, *pv = s_g + ATT_KEYS * Q, *k_buf = pv + hs * Q; // the transient
    float *v_buf = k_buf + ATT_KEYS * hs, *k_t = v_buf + ATT_KEYS * hs, *k_r = k_t + ATT_KEYS * hs; // steps'
    float *alpha = k_r + ATT_KEYS * hs, *tile_max = alpha + Q, *shift = tile_max + Q, *tile_u = shift + Q;
    float *dm = tile_u + Q, *q_r = dm + Q;
#define HEAD(g) (scratch + (size_t)(g) * per_head)
#define SUM_L(g) ((double *)HEAD(g))
#define Q_T(g) (HEAD(g) + 2 * Q)
#define QG_T(g) (Q_T(g) + hs * Q)
#define S(g) (QG_T(g) + hs * Q)
#define O(g) (S(g) + ATT_KEYS * Q)
#define M(g) (O(g) + hs * Q)
#define L(g) (M(g) + Q)
    float scale = 1.0f / sqrtf((float)head_size);
    int far = q2 ? second->far : 0, n_sinks = q2 ? second->n_sinks : 0, step = tally ? tally->n_buckets + 2 : 0;
    for (int g = 0; g < G; g++) {
        if (!frames) transpose_queries(Q_T(g), q + g * hs, ldq, nq, head_size);
        if (q2) transpose_queries(QG_T(g), q2 + g * hs, ldq, nq, head_size);
        memset(O(g), 0, hs * Q * sizeof(float));
        memset(S(g), 0, ATT_KEYS * Q * sizeof(float)); // the columns past nq stay zero
        for (int j = 0; j < ATT_QUERIES; j++) M(g)[j] = -INFINITY, L(g)[j] = 0.0f;
        if (tally)
            for (int j = 0; j < nq; j++) {
                SUM_L(g)[j] = 0.0; // the sum of the weights so far (tally_tile)
                memset(tally_rows + (size_t)j * tally_step + g * step, 0, (size_t)step * sizeof(double));
            }
    }
    memset(s_g, 0, ATT_KEYS * Q * sizeof(float));
    // query j (position pos + j) sees keys lo_j .. pos + j, lo_j = pos + j + 1 - window (at least 0) with a window
    int first = window > 0 && pos + 1 > window ? pos + 1 - window : 0, end = pos + nq;
    if (frames) first -= first % ATT_KEYS; // each tile from a multiple of ATT_KEYS: fine rows 0..
    // the sinks' tiles (0 .. n_sinks-1) first, then first .. end-1 (from n_sinks when the window reaches them)
    for (int k0 = n_sinks > 0 ? 0 : first; k0 < end;) {
        int stop = k0 < n_sinks && n_sinks < end ? n_sinks : end, ldk = 0, ldv; // a tile of sinks ends at n_sinks
        int nk = stop - k0 < ATT_KEYS ? stop - k0 : ATT_KEYS;
        int all_second = k0 + nk <= n_sinks || (far && pos - (k0 + nk - 1) >= far);
        int some_second = k0 < n_sinks || (far && pos + nq - 1 - k0 >= far);
        const float *v = kv_tile(v_buf, &ldv, values, value_type, offset + (size_t)k0 * kv_dim, kv_dim, nk, head_size);
        const float *k = all_second ? NULL
                       : kv_tile(k_buf, &ldk, keys, key_type, offset + (size_t)k0 * kv_dim, kv_dim, nk, head_size);
        if (frames && k) // every head's scores at once: the keys rotated once per query
            frame_scores(S(0), per_head, frames, b0, nq, pos, k0, nk, k, ldk, q, ldq, head_size, G, k_t, k_r, q_r);
        for (int g = 0; g < G; g++) {
            float *s = S(g);
            if (k && !frames) cols_product(s, ATT_QUERIES, k, (size_t)ldk, 1, nk, head_size, Q_T(g), ATT_QUERIES, nq);
            if (some_second) { // s_g = K_2 qg_t: second keys (float32) against second queries
                float *dst = all_second ? s : s_g;
                cols_product(dst, ATT_QUERIES, second->keys + offset + (size_t)k0 * kv_dim, (size_t)kv_dim, 1, nk,
                             head_size, QG_T(g), ATT_QUERIES, nq);
                if (!all_second) // across Self-Extend's line: query j takes key k0 + c's grouped score when it
                    for (int c = 0; c < nk; c++) // lies far or more positions back
                        for (int j = 0; j < nq; j++)
                            if (pos + j - (k0 + c) >= far) s[(size_t)c * Q + j] = s_g[(size_t)c * Q + j];
            }
            online_softmax_tile(s, nk, nq, k0, pos, window, n_sinks, scale, M(g), L(g), alpha, tile_max, // s -> p
                                shift, tally ? tile_u : NULL, dm);
            if (tally)
                tally_tile(tally_rows + g * step, tally_step, SUM_L(g), tally, s, alpha, dm, tile_u, nk, nq, k0, pos,
                           n_sinks);
            cols_product(pv, ATT_QUERIES, v, 1, (size_t)ldv, head_size, nk, s, ATT_QUERIES, nq); // pv = V^T p
            float *o = O(g);
            for (size_t i = 0; i < hs; i++) { // o = o * alpha + pv
                float *oi = o + i * Q;
                const float *add = pv + i * Q;
#pragma omp simd simdlen(SIMD_FLOATS)
                for (int j = 0; j < nq; j++) oi[j] = oi[j] * alpha[j] + add[j];
            }
        }
        k0 += nk;
        if (k0 >= n_sinks && k0 < first) k0 = first; // past the sinks: on to the first query's window
    }
    for (int g = 0; g < G; g++) {
        for (int j = 0; j < nq; j++) // out = o / l, back to one row per query
            for (size_t i = 0; i < hs; i++) out[(size_t)j * ldo + g * hs + i] = O(g)[i * Q + j] / L(g)[j];
        if (tally) // H = ln l - U / l; each mass / l
            for (int j = 0; j < nq; j++) {
                double *row = tally_rows + (size_t)j * tally_step + g * step;
                row[0] = log(SUM_L(g)[j]) - row[0] / SUM_L(g)[j];
                for (int k = 1; k < step; k++) row[k] /= SUM_L(g)[j];
            }
    }
#undef HEAD
#undef SUM_L
#undef Q_T
#undef QG_T
#undef S
#undef O
#undef M
#undef L
}

/* With frames, how many query heads of a key head one work item takes (a
 * divisor G of kv_mul): together they rotate each key tile once per query,
 * but fewer items may leave threads idle. The estimate of a thread's time,
 * rounds of items x an item's cost, counts a head's scores, softmax and
 * values as 5 and the rotation it shares as 4 (the multiply-adds a pair of a
 * key and a query: 2 for the score, 2 for the values, 4 for the rotation;
 * 1 for the softmax). Each head's arithmetic is the same whatever G, so the
 * choice changes the time, never the result. */
static int frame_group(int kv_mul, int n_kv_heads, int n_tiles, int threads) {
    int best = 1;
    long best_cost = -1;
    for (int G = 1; G <= kv_mul; G++) {
        if (kv_mul % G) continue;
        long items = (long)n_kv_heads * (kv_mul / G) * n_tiles, rounds = (items + threads - 1) / threads;
        long cost = rounds * (5L * G + 4);
        if (best_cost < 0 || cost < best_cost) best = G, best_cost = cost;
    }
    return best;
}

/* kernels.h: every head's tiles of ATT_QUERIES queries are independent work
 * items (with frames, G heads of a key head together: frame_group), split
 * over the threads; each one's result is the same whatever thread computes
 * it. */
void attention_block(float *out, const float *q, const void *keys, int key_type, const void *values, int value_type,
                     const SecondQueries *second, const QueryFrames *frames, const AttnTally *tally, int B, int pos0,
                     int window, int n_heads, int n_kv_heads, int head_size, float *scratch, int threads) {
    int dim = n_heads * head_size, kv_dim = n_kv_heads * head_size, kv_mul = n_heads / n_kv_heads;
    int n_tiles = (B + ATT_QUERIES - 1) / ATT_QUERIES, item;
    size_t per_thread = attention_block_floats(head_size, kv_mul);
#ifdef _OPENMP
    if (threads > omp_get_max_threads()) threads = omp_get_max_threads();
#endif
    // in parallel when the scores' multiply-adds, about B dim (pos0 + B), are worth it
    int parallel = (long)B * dim * (pos0 + B) >= PARALLEL_MIN_WORK;
    if (threads < 1 || !parallel) threads = 1;
    int G = frames ? frame_group(kv_mul, n_kv_heads, n_tiles, threads) : 1;
#pragma omp parallel for private(item) num_threads(threads) if (parallel)
    for (item = 0; item < n_heads / G * n_tiles; item++) {
        int h = item / n_tiles * G, b0 = item % n_tiles * ATT_QUERIES, nq = B - b0 < ATT_QUERIES ? B - b0 : ATT_QUERIES;
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        size_t at = (size_t)b0 * dim + (size_t)h * head_size; // query b0's head h in q and out
        const float *q2 = second && second->q ? second->q + at : NULL;
        int step = tally ? tally->n_buckets + 2 : 0; // a tally row; query b0's head h at (b0 n_heads + h) step
        double *rows = tally ? tally->out + ((size_t)b0 * n_heads + h) * step : NULL;
        attention_tile(out + at, dim, q + at, dim, nq, pos0 + b0, window, keys, key_type, values, value_type, q2,
                       second, frames, b0, (size_t)(h / kv_mul) * head_size, kv_dim, head_size, G, tally, rows,
                       n_heads * step, scratch + (size_t)thread * per_thread);
    }
}

/* ==========================================================================
 * 4. matmul over float32, q8_0, q4_0 or q4_1 weights
 * ========================================================================== */

Matrix matrix_rows(Matrix m, size_t first_row, size_t cols) {
    size_t first = first_row * cols; // values before the row
    if (m.type == WEIGHT_F32) {
        m.values = (const float *)m.values + first;
    } else if (m.type == WEIGHT_Q8_0) {
        m.values = (const int8_t *)m.values + first;
        m.scale += first / (size_t)m.group_size;
    } else { // q4_0, q4_1: two values a byte, a half d (and m) per 32
        m.values = (const uint8_t *)m.values + first / 2;
        m.half_scale += first / 32;
        if (m.half_min) m.half_min += first / 32;
    }
    return m;
}

/* out = the 32 values of each of n_blocks q4_0 or q4_1 blocks (kernels.h's
 * formulas, in float32 in the order written: gguf_quants.c's, the gguf
 * package's). */
static void q4_dequantize(float *out, const uint8_t *qs, const uint16_t *d, const uint16_t *m, int n_blocks) {
    for (int g = 0; g < n_blocks; g++) {
        const uint8_t *restrict q = qs + (size_t)g * 16;
        float *restrict o = out + (size_t)g * 32, s = half_to_float(d[g]);
        if (m) {
            float min = half_to_float(m[g]);
            for (int j = 0; j < 16; j++) {
                float lo = s * (float)(q[j] & 15), hi = s * (float)(q[j] >> 4);
                o[j] = lo + min, o[j + 16] = hi + min;
            }
        } else
            for (int j = 0; j < 16; j++) o[j] = s * (float)((q[j] & 15) - 8), o[j + 16] = s * (float)((q[j] >> 4) - 8);
    }
}

void matrix_row(float *out, Matrix m, int row, int cols) {
    m = matrix_rows(m, (size_t)row, (size_t)cols);
    if (m.type == WEIGHT_F32) {
        memcpy(out, m.values, (size_t)cols * sizeof(float));
        return;
    }
    if (m.type != WEIGHT_Q8_0) {
        q4_dequantize(out, m.values, m.half_scale, m.half_min, cols / 32);
        return;
    }
    int gs = m.group_size;
    for (int g = 0; g < cols / gs; g++) { // restrict: int8_t may alias anything, which kept GCC from vectorizing
        const int8_t *restrict q = (const int8_t *)m.values + (size_t)g * gs;
        float *restrict o = out + (size_t)g * gs;
        float s = m.scale[g];
        for (int i = 0; i < gs; i++) o[i] = q[i] * s;
    }
}

void quantize_q8(int8_t *qv, float *scale, const float *x, int B, int n, int gs) {
    long groups = (long)B * n / gs, g; // groups in parallel for blocks (one took 18% of a q8_0 prompt's time)
#pragma omp parallel for private(g) if ((long)B * n >= PARALLEL_MIN_WORK)
    for (g = 0; g < groups; g++) scale[g] = quantize_group(qv + g * gs, x + g * gs, gs);
}

/* Tiles of the dot-product kernels: rows of w x tokens of x that one call
 * computes: 4 x 2 for q8_0 (partial sums in 16 AVX2 registers) and 3 x 4 for
 * the portable float32 one. Each row of a tile, once loaded, serves all of
 * the tile's tokens. */
#define TILE_ROWS_F32 3
#define TILE_TOKENS_F32 4
#define TILE_ROWS_Q8 4
#define TILE_TOKENS_Q8 2

/* kernels.h: the choice, and its cost in accuracy. Without VNNI the float
 * FMA does 8 multiply-adds per instruction and the int8 kernels about 3, so
 * int8 activations in blocks are slower there than dequantized rows;
 * dequantizing a chunk of rows once costs little next to B tokens' products. */
int q8_method(const MatmulScratch *scratch, int B, int gs) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    if (B == 1 || !scratch || threads > scratch->threads) return Q8_DOTS;
    if (!scratch->int8_blocks) return scratch->w_rows ? Q8_ROWS : Q8_DOTS;
    if (HAVE_Q8_COLS && use_simd && scratch->x_qt && scratch->x_scale_t && scratch->w_sums && gs % 4 == 0 &&
        gs <= 4096) // (int32 sums: 255 * 128 * 4096 < 2^31)
        return Q8_COLUMNS;
    return Q8_DOTS;
}

/* kernels.h: as q8_method's Q8_ROWS where it has w_rows for this many
 * threads (then each thread's slice of w_rows is its own), else int8 dot
 * products token by token. */
int q4_method(const MatmulScratch *scratch, int B) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    if (B == 1 || !scratch || threads > scratch->threads || !scratch->w_rows) return Q8_DOTS;
    return Q8_ROWS;
}

/* xsum[g] = xs[g] * (sum of the 32 x_q of block g), for `blocks` blocks
 * (q4_1's min term, kernels.h). */
static void block_sums(float *xsum, const int8_t *xq, const float *xs, long blocks) {
    for (long g = 0; g < blocks; g++) {
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) isum += xq[g * 32 + i];
        xsum[g] = xs[g] * (float)isum;
    }
}

/* out[b * ldo + i] for rows i < rows of q4 matrix w (from its row 0) and T
 * tokens of x quantized (x_q, x_scale, x_sum: n / 32 of each a token). */
static void q4_rows(float *out, int ldo, Matrix w, int rows, const int8_t *xq, const float *xs, const float *xsum,
                    int T, int n) {
    int blocks = n / 32;
    for (int b = 0; b < T; b++)
        for (int i = 0; i < rows; i++) {
            size_t at = (size_t)i * blocks; // row i's first block
            out[(size_t)b * ldo + i] =
                dot_q4_row((const uint8_t *)w.values + at * 16, w.half_scale + at, w.half_min ? w.half_min + at : NULL,
                           xq + (size_t)b * n, xs + (size_t)b * blocks, xsum ? xsum + (size_t)b * blocks : NULL, n);
        }
}

#if HAVE_Q8_COLS
/* The block x_q (B, n), x_scale (B, n/gs) laid out for cols_q8:
 *   xqt[k4 * ldx + 4 * t + i] = x_q[t * n + k4 + i] + 128     (k4 = 0, 4, 8, ...; i < 4)
 *   xst[g * ldx + t] = x_scale[t * (n/gs) + g]
 * tokens B..ldx-1 padded with 128 (the value 0) and scale 0. */
static void pack_q8_block(uint8_t *xqt, float *xst, const int8_t *xq, const float *xs, int B, int ldx, int n,
                          int gs) {
    int k4, groups = n / gs;
#pragma omp parallel for private(k4) if ((long)B * n >= PARALLEL_MIN_WORK)
    for (k4 = 0; k4 < n; k4 += 4)
        for (int t = 0; t < ldx; t++)
            for (int i = 0; i < 4; i++)
                xqt[(size_t)k4 * ldx + 4 * t + i] = (uint8_t)(t < B ? xq[(size_t)t * n + k4 + i] + 128 : 128);
    for (int g = 0; g < groups; g++)
        for (int t = 0; t < ldx; t++) xst[(size_t)g * ldx + t] = t < B ? xs[(size_t)t * groups + g] : 0.0f;
}

/* sums[r * (n/gs) + g] = -128 * (sum of w_r over group g), for `rows` rows of
 * n int8 (cols_q8's starting values: they cancel pack_q8_block's offset).
 * 32 bytes at a time where gs allows: w + 128 (the sign bit flipped) as
 * unsigned bytes, summed by eights into 4 lanes (psadbw against zero). */
static void q8_group_sums(int32_t *sums, const int8_t *w, int rows, int n, int gs) {
    const __m256i zero = _mm256_setzero_si256(), sign = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < n / gs; g++) {
            const int8_t *wg = w + (size_t)r * n + (size_t)g * gs;
            int32_t sum = 0;
            if (gs % 32 == 0) {
                __m256i acc = zero;
                for (int i = 0; i < gs; i += 32) {
                    __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wg + i)), sign);
                    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, zero));
                }
                __m128i h = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
                sum = (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 128 * gs;
            } else
                for (int i = 0; i < gs; i++) sum += wg[i];
            sums[(size_t)r * (n / gs) + g] = -128 * sum;
        }
}
#endif

/* x (B, n) transposed into panels of COLS_TOKENS tokens, the column
 * kernel's tiles: token b = i * COLS_TOKENS + j goes to
 *   xt[i * n * COLS_TOKENS + k * COLS_TOKENS + j] = x[b * n + k]
 * for tokens b < padded (B rounded up to SIMD_FLOATS), tokens B..padded-1
 * zero; the last panel's tokens from padded on are neither written nor read
 * (the column kernel reads T tokens rounded up to SIMD_FLOATS). A tile's
 * tokens lie one after the other over k, so that a pass over k reads
 * contiguous memory: in rows of all the block's tokens side by side
 * (xt[k * padded + b]), a tile's 64-byte lines for consecutive k were padded
 * floats apart, 512 bytes for a block of 128, and fell into an eighth of the
 * L1 cache's sets, which then held 4 KiB of them, not the pass's 16 KiB. The
 * panels gave matmul 1.10x the rate on 110M's shapes (q8_0 dequantized, 128
 * tokens, one thread: 77 -> 85 GFLOP/s of the core's 94 on the AMD EPYC;
 * docs/performance.md). */
static void transpose_block(float *xt, const float *x, int B, int padded, int n) {
    int b0; // 8 tokens at a time: 8 rows of x read side by side; in parallel (run alone it took 2.5% of a prompt)
#pragma omp parallel for private(b0) if ((long)B * n >= PARALLEL_MIN_WORK)
    for (b0 = 0; b0 < padded; b0 += 8) {
        float *panel = xt + (size_t)(b0 / COLS_TOKENS) * n * COLS_TOKENS + b0 % COLS_TOKENS;
        for (int k = 0; k < n; k++)
            for (int b = b0; b < b0 + 8; b++)
                panel[(size_t)k * COLS_TOKENS + b - b0] = b < B ? x[(size_t)b * n + k] : 0.0f;
    }
}

/* out = x @ w^T        x (B, n), w (d, n) -> out (B, d)
 * w is float32, q8_0 (q8_method says how), q4_0 or q4_1 (q4_method);
 * kernels.h says which scratch each needs. Chunks of ROW_CHUNK rows are split across threads; a
 * chunk, once loaded, serves all B tokens (one token on AMD: each thread
 * takes an even share of the rows in runs, dot_rows_streams and
 * dot_q8_runs). Each output is computed by the same code whatever the thread
 * count. */
void matmul(float *out, const float *x, Matrix w, int B, int n, int d, const MatmulScratch *scratch) {
    int q8 = w.type == WEIGHT_Q8_0, q4 = w.type == WEIGHT_Q4_0 || w.type == WEIGHT_Q4_1, gs = w.group_size;
    int method = q8 ? q8_method(scratch, B, gs) : q4 ? q4_method(scratch, B) : -1;
    int dequant = method == Q8_ROWS, int8 = (q8 || q4) && !dequant, ldx = simd_round_up(B);
    if (int8) quantize_q8(scratch->x_q, scratch->x_scale, x, B, n, gs);
    if (int8 && w.type == WEIGHT_Q4_1) block_sums(scratch->x_sum, scratch->x_q, scratch->x_scale, (long)B * n / 32);
#if HAVE_Q8_COLS
    if (method == Q8_COLUMNS)
        pack_q8_block(scratch->x_qt, scratch->x_scale_t, scratch->x_q, scratch->x_scale, B, ldx, n, gs);
#endif
#if HAVE_SIMD
    if (use_simd && B == 1 && w.type == WEIGHT_F32 && (f32_rows_together == 4 || f32_rows_together == 8) &&
        n % SIMD_FLOATS == 0) {
        dot_rows_streams(out, (const float *)w.values, x, n, d, f32_rows_together); // one token, float32 rows, on AMD
        return;
    }
    if (use_simd && B == 1 && q8 && int8 && q8_runs == 2 && gs % 32 == 0) { // one token, q8_0 rows, on AMD
        dot_q8_runs(out, (const int8_t *)w.values, w.scale, scratch->x_q, scratch->x_scale, n, d, gs);
        return;
    }
#endif
    // Several tokens against float rows (float32, or q8_0 dequantized): the
    // column kernel, on x transposed once here.
    int by_columns = HAVE_SIMD && use_simd && B > 1 && !int8 && scratch && scratch->x_t;
    if (by_columns) transpose_block(scratch->x_t, x, B, ldx, n);
    int tile_rows = int8 ? TILE_ROWS_Q8 : TILE_ROWS_F32, tile_tokens = int8 ? TILE_TOKENS_Q8 : TILE_TOKENS_F32;
    int n_chunks = (d + ROW_CHUNK - 1) / ROW_CHUNK, chunk;
#pragma omp parallel for private(chunk) if ((long)B * n * d >= PARALLEL_MIN_WORK)
    for (chunk = 0; chunk < n_chunks; chunk++) {
        int start = chunk * ROW_CHUNK, end = start + ROW_CHUNK < d ? start + ROW_CHUNK : d, thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num(); // which slice of w_rows or w_sums is this thread's
#endif
        const float *rows = q8 || q4 ? NULL : (const float *)w.values + (size_t)start * n; // (end - start, n) floats
        if (q4 && int8) { // int8 products, token by token
            q4_rows(out + start, d, matrix_rows(w, (size_t)start, (size_t)n), end - start, scratch->x_q,
                    scratch->x_scale, w.type == WEIGHT_Q4_1 ? scratch->x_sum : NULL, B, n);
            continue;
        }
#if HAVE_Q8_COLS
        if (method == Q8_COLUMNS) {
            const int8_t *wq = (const int8_t *)w.values + (size_t)start * n;
            int32_t *sums = scratch->w_sums + (size_t)thread * ROW_CHUNK * (n / gs);
            q8_group_sums(sums, wq, end - start, n, gs);
            cols_q8(out + start, d, wq, w.scale + (size_t)start * (n / gs), sums, end - start, n, gs, scratch->x_qt,
                    scratch->x_scale_t, ldx, B);
            continue;
        }
#endif
        if (dequant) { // this thread's slice of w_rows = rows start..end of w
            float *slice = scratch->w_rows + (size_t)thread * ROW_CHUNK * n;
            for (int i = start; i < end; i++) matrix_row(slice + (size_t)(i - start) * n, w, i, n);
            rows = slice;
        }
#if HAVE_SIMD
        if (by_columns) {
            cols_f32(out + start, d, 0, rows, (size_t)n, 1, end - start, n, scratch->x_t, COLS_TOKENS,
                     (size_t)n * COLS_TOKENS, B);
            continue;
        }
        if (use_simd && B == 1 && !int8) { // one token against float rows: the one-row kernel
            for (int i = 0; i < end - start; i++) dot_f32_avx(out + start + i, rows + (size_t)i * n, x, n);
            continue;
        }
#endif
        for (int b = 0; b < B; b += tile_tokens) {
            int T = B - b < tile_tokens ? B - b : tile_tokens;
            for (int i = start; i < end; i += tile_rows) {
                int R = end - i < tile_rows ? end - i : tile_rows;
                float *o = out + (size_t)b * d + i; // (T, d) from row i on
                if (int8)
                    dot_tile_q8(o, d, (const int8_t *)w.values + (size_t)i * n, w.scale + (size_t)i * (n / gs),
                                scratch->x_q + (size_t)b * n, scratch->x_scale + (size_t)b * (n / gs), R, T, n, gs);
                else
                    dot_tile_f32(o, d, rows + (size_t)(i - start) * n, x + (size_t)b * n, R, T, n);
            }
        }
    }
}
