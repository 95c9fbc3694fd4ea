/* kernels.h: how run.c's ops touch memory, behind small interfaces.
 *
 * run.c states each operation as a formula and a plain loop (its
 * matmul_reference is the definition of matmul); kernels.c computes the same
 * things fast: weights stored float32, q8_0, q4_0 or q4_1, a KV cache of
 * float32, IEEE half or q8_0, SIMD tiles (AVX-512 or AVX2) that let one load
 * of a weight serve many tokens, and threads. Every kernel here has a
 * portable C version; tests/test_kernels.c (tests/test_q4.c for q4_0 and
 * q4_1) checks each one against run.c's matmul_reference or a
 * double-precision reference. Read run.c first; come here to see how the
 * time is spent.
 *
 * Shape names are model.h's (dim, kv_dim, head_size, n_ctx, ...); B is the
 * number of tokens a call carries.
 */
#ifndef KERNELS_H
#define KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model.h"

/* The SIMD kernels need AVX2 and FMA (x86-64 since 2013): `make` enables
 * them with -march=native where the CPU has them, and AVX-512 with them where
 * it has that too (chosen at compile time: a binary runs on CPUs like the one
 * that built it); `make portable` and other CPUs get the portable C versions
 * alone. use_simd = 0 selects the portable versions at run time in a SIMD
 * build (the tests do, to compare the two). */
#if defined(__AVX2__) && defined(__FMA__)
#define HAVE_SIMD 1
#else
#define HAVE_SIMD 0
#endif
extern int use_simd;

/* Whether generation's float32 one-row kernel prefetches its rows in
 * software (kernels.c's PREFETCH_AHEAD), chosen from the CPU by
 * kernels_init(): yes on Intel, where it streamed 110M's weights 14% faster,
 * no on AMD, where it cost 20% (docs/performance.md). It changes no result:
 * the tests run the kernel both ways. q8_0's one-row kernels prefetch on
 * every CPU (faster on both). */
extern int prefetch_f32;

/* How many float32 rows generation's kernel streams side by side, 1, 4 or 8
 * (any other value acts as 1), chosen from the CPU by kernels_init(): 8 on
 * AMD before Zen 5 (CPU family 25 and below), 4 on Zen 5 and later (family
 * 26 and up), 1 elsewhere. With 4 or 8, each thread reads its rows as that
 * many runs, one row of each at a time (kernels.c's dot_rows_streams): on a
 * Zen 3 core with AVX2 110M's and SmolLM2's float32 generation measured
 * 1.14-1.4x faster with 8 runs than with 8 consecutive rows side by side,
 * which were 1.2-1.3x faster than one row at a time; on a Zen 5 core with
 * AVX-512 4 runs were 8-12% faster than 8 on one thread (docs/performance.md;
 * Zen 4 takes 8, not measured). On the Intel VM 4 consecutive rows side by
 * side streamed 15-25% slower than one (kernels.c); runs were not measured
 * there. 4 and 8 runs give the same bits; one row at a time sums in another
 * order (float rounding, bounded by the tests, which run all three). */
extern int f32_rows_together;
/* How many runs of its rows a thread reads in turn in q8_0 generation, 1 or
 * 2 (any other value acts as 1), chosen from the CPU by kernels_init(): 2 on
 * AMD (kernels.c's dot_q8_runs: 1.03-1.2x the rate of the rows in order on a
 * Zen 3 core; with AVX-512 VNNI and groups of 32 the two runs' rows go
 * through one pass: SmolLM2 1.15-1.2x, 110M 0.97-1.13x the rate of the two
 * in turn on a Zen 5 core; docs/performance.md), 1
 * elsewhere (not measured on Intel). Each row is the same sum either way:
 * the same bits (the tests check). */
extern int q8_runs;
/* Whether q4_0 and q4_1 one-token products use the 512-bit kernel
 * (kernels.c's dot_q4_avx512, AVX-512 BW and VNNI builds) instead of the
 * 256-bit one (dot_q4_avx, with VNNI's instruction where the build has it).
 * 0 everywhere for now: on the Intel VM (AVX-512, 1 thread, SmolLM2's Q4_1
 * file, 5 interleaved rounds on a loaded machine) the 512-bit kernel gave a
 * median of 52.1 tokens/s against 53.2, slower in all 5 rounds; not measured
 * on AMD. Both give the same sums up to float rounding (the tests run both). */
extern int q4_avx512;
#ifdef TESTING
extern int q8_runs_calls; // how often the 2-run kernel ran (tests/test_kernels.c checks that it did)
extern int q8_pair_calls; // how often its two-row pass ran (AVX-512 VNNI builds, gs 32)
#endif
void kernels_init(void); // the CPU's choices above; call once, before the first matmul

/* Floats per vector of the float32 SIMD kernels (kernels.c: the column
 * kernel, the one-row kernel, the attention tiles' softmax), the widest the
 * compiler targets: 16 where -march=native finds AVX-512 (twice AVX2's
 * floating-point rate on the machines that have it), else 8. The column
 * kernel reads whole vectors of tokens: matmul writes its x_t up to B
 * rounded up to this (and allocates it rounded up to COLS_TOKENS, below). */
#if HAVE_SIMD && defined(__AVX512F__)
#define SIMD_FLOATS 16
#else
#define SIMD_FLOATS 8
#endif
/* 1 where the q8_0 column kernel (kernels.c: blocks of tokens against q8_0
 * rows in int8 products) can run: it needs VNNI, AVX-512 VNNI or AVX-VNNI
 * at the vector width above. */
#if HAVE_SIMD && ((SIMD_FLOATS == 16 && defined(__AVX512VNNI__)) ||                                                   \
                  (SIMD_FLOATS == 8 && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))))
#define HAVE_Q8_COLS 1
#else
#define HAVE_Q8_COLS 0
#endif
/* 1 where generation's q8_0 kernel for groups of 32 uses 512-bit vectors
 * (kernels.c's dot_q8_32_avx512): AVX-512 BW and VNNI. */
#if HAVE_SIMD && SIMD_FLOATS == 16 && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define HAVE_Q8_AVX512 1
#else
#define HAVE_Q8_AVX512 0
#endif
/* n rounded up to a whole number of vectors */
static inline int simd_round_up(int n) { return (n + SIMD_FLOATS - 1) / SIMD_FLOATS * SIMD_FLOATS; }
/* Tokens per tile of the float32 column kernel (kernels.c's cols_f32): 4
 * vectors with AVX-512, 2 with AVX2. matmul lays a block's tokens out in
 * panels of this many (MatmulScratch's x_t), so B is rounded up to it. */
#define COLS_TOKENS (SIMD_FLOATS == 16 ? 64 : 16)
static inline int cols_round_up(int B) { return (B + COLS_TOKENS - 1) / COLS_TOKENS * COLS_TOKENS; }

/* Below this many multiply-adds a parallel region costs more than it saves
 * (thread wake-up is microseconds; a 64x64 matmul is about a microsecond). */
#define PARALLEL_MIN_WORK (1 << 16)

/* a . b = sum_i a[i] * b[i]          a, b: (n)
 * `omp simd reduction` lets the compiler keep several partial sums in SIMD
 * registers (strict C would force one sum, added in order). */
static inline float dot(const float *a, const float *b, int n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* e^x for softmax and SiLU, written so that loops calling it vectorize (libm's
 * expf is one call per element: 12% of a prompt's instructions).
 *   e^x = 2^n * e^r,  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]
 * e^r by its Taylor series to r^7 (truncation < 1e-8 relative); ln 2 split in
 * two (Cody and Waite) so that n ln 2 is exact enough; 2^n built in the
 * exponent bits. Within 2 ulp of expf (the tests check). Below -87.3 it
 * returns 0 (no subnormals), above 88.3 infinity; NaN stays NaN. */
static inline float exp_fast(float x) {
    float c = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x; // n stays in [-126, 127]
    float t = c * 1.44269504f + 12582912.0f;                // 1.5 * 2^23: t's last bits hold n
    float n = t - 12582912.0f;
    float r = (c - n * 0.693359375f) - n * -2.12194440e-4f; // ln 2 = 0.693359375 - 2.12194440e-4
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720, p = p * r + 1.0f / 120, p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6, p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23; // 2^n: bits(t) = bits(1.5 * 2^23) + n
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.3f ? 0.0f : x > 88.3f ? INFINITY : p * two_n;
}

/* ------------------------------------------------------------------------
 * The KV cache: rows of kv_dim values per position, float32, IEEE 754 half
 * precision (--kv f16: half the memory; 11 significant bits, range +-65504)
 * or q8_0 (--kv q8_0: 9/32 of the memory): blocks of KV_Q8_BLOCK consecutive
 * values of a row, each block one float32 scale = max|x| / 127 and the
 * values q = round(x / scale) as int8, as quantize_q8 makes them (so |x -
 * scale q| <= scale / 2, up to float rounding; a block holding a NaN or an infinity reads back as
 * NaN). Blocks run along the whole row, across heads, so kv_dim must be a
 * multiple of KV_Q8_BLOCK (build_transformer refuses other shapes) and any
 * head_size works; the scale is float32, not half, so that it is exact and
 * small blocks (max|x| < 0.008, where a half scale would lose bits) keep the
 * bound. Values are converted on write and read back as float for the
 * arithmetic. `offset` counts elements from the start of `cache`; rows are
 * `stride` elements apart; a q8_0 cache is written in whole blocks.
 * ------------------------------------------------------------------------ */

#define KV_Q8_BLOCK 32 /* values per block of a q8_0 cache */
/* Bytes of n elements of a cache of kv_type: 4 n for KV_F32, 2 n for KV_F16,
 * 36 n / 32 for KV_Q8_0 (n a multiple of KV_Q8_BLOCK). */
size_t kv_bytes(int kv_type, size_t n);
/* cache[offset .. offset+n) = src, converted to the cache's type (q8_0:
 * offset and n multiples of KV_Q8_BLOCK) */
void kv_store(void *cache, int kv_type, size_t offset, const float *src, int n);
/* x = what a cache of kv_type gives back for x: kv_store then kv_load, in
 * place (q8_0: n a multiple of KV_Q8_BLOCK) */
void kv_round(float *x, int kv_type, int n);
/* out = cache[offset .. offset+n) as float32 */
void kv_load(float *out, const void *cache, int kv_type, size_t offset, int n);
/* out[j] = q . row j, for the n_keys rows of n values from offset on
 * (attention scores against cached keys, before scaling) */
void kv_scores(float *out, const float *q, const void *cache, int kv_type, size_t offset, int stride, int n_keys,
               int n);
/* out = sum_j weights[j] * row j, for the n_rows rows of n values from
 * offset on (attention's weighted sum of cached values) */
void kv_mix(float *out, const float *weights, const void *cache, int kv_type, size_t offset, int stride, int n_rows,
            int n);
/* IEEE half <-> float, portable versions (round to nearest even; infinities,
 * NaN, subnormals). The cache uses the compiler's _Float16 where there is one. */
uint16_t float_to_half_c(float f);
float half_to_float_c(uint16_t h);
/* The compiler's _Float16 where it has one (one instruction with F16C). */
#ifdef __FLT16_MAX__
static inline float half_to_float(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
static inline uint16_t float_to_half(float x) {
    _Float16 f = (_Float16)x;
    uint16_t h;
    memcpy(&h, &f, 2);
    return h;
}
#else
#define half_to_float half_to_float_c
#define float_to_half float_to_half_c
#endif

/* Causal attention for a block of B queries (prompt blocks, ppl windows;
 * any B >= 1), flash-attention style: every head's B queries against the
 * cache, tile by tile, with an online softmax, so that no row of n_ctx scores
 * is ever written. Query b (at row pos0 + b of the cache) sees the keys
 * t = lo_b .. pos0 + b, lo_b = 0, or pos0 + b + 1 - window when window > 0
 * and that is positive (and with attention sinks, below, rows 0..n_sinks-1
 * too); query head h reads kv head h / (n_heads / n_kv_heads). Per query,
 * over the tiles of keys it sees, with a running maximum m (from -inf), a
 * running sum l (from 0) and an output o (from 0, head_size values):
 *   s_t   = q . k_t / sqrt(head_size)                for the tile's keys t
 *   m'    = max(m, max_t s_t)
 *   o     = o * exp(m - m') + sum_t exp(s_t - m') v_t
 *   l     = l * exp(m - m') + sum_t exp(s_t - m'),   m = m'
 * and at the end out = o / l: softmax(s) . v, as run.c's attention states
 * it, equal to the one-query path up to float rounding (exp is exp_fast, and
 * the sums go in another order). With second queries (Self-Extend, sinks;
 * below) s_t is the second pair's score for the keys they name; with frames
 * (exact dynamic NTK; below) q and k_t are rotated per query first.
 * out, q: (B, n_heads, head_size); keys, values: one layer's (n_ctx, kv_dim)
 * of key_type / value_type, KV_F32, KV_F16 or KV_Q8_0 (an f16 or q8_0 tile
 * is converted to float32 first, then the same code). Tiles of 128 queries x ATT_KEYS keys
 * (kernels.c); keys past the last query's position, or older than the first
 * query's window, are never read. scratch: (threads,
 * attention_block_floats(head_size, n_heads / n_kv_heads)) floats; the heads
 * x tiles of queries (with frames, groups of a key head's query heads x
 * tiles) go over at most `threads` OpenMP threads, each output computed by
 * the same code whatever their number. SIMD tiles (AVX-512 or AVX2) for every
 * head_size, portable loops in a build without them. */
#define ATT_KEYS 48 /* keys per tile of attention_block */
size_t attention_block_floats(int head_size, int heads_per_kv_head);
/* Second queries (keys.c, through run.c's rope_stage; docs/rope.md §10 and
 * §13): some keys are scored against a second rotation of each query, and of
 * those keys, instead of q_b . k_t:
 *   Self-Extend (far = W > 0): the keys W or more positions before query
 *     b's, the query at its group position and the key at floor(t / G);
 *   attention sinks (n_sinks > 0): the rows 0..n_sinks-1, the query at its
 *     place in the rolling cache; every query sees them, whatever the window.
 * attention_block takes NULL, or a SecondQueries with q NULL, for none. */
typedef struct {
    const float *q;    // (B, n_heads, head_size) the block's queries in their second rotation
    const float *keys; // one layer's (n_ctx, kv_dim), float32: the keys in their second rotation
    int far;           // Self-Extend's neighbour window W; 0 = not Self-Extend
    int n_sinks;       // attention sinks: rows 0..n_sinks-1; 0 = none
} SecondQueries;
/* Per-query frames (keys.c's build_frames, through run.c's rope_stage;
 * docs/rope.md §11): with exact dynamic NTK past the original context every
 * query has RoPE frequencies of its own, so q and the keys come unrotated
 * and attention_block rotates them per query, from rows of that query's own
 * table (mscale * cos and sin of row * inv_freq_i, for its sequence length):
 *   fine:   rows c = 0 .. ATT_KEYS-1
 *   coarse: rows pos_b - ATT_KEYS * u for u = 0 .. pos_b / ATT_KEYS (pos_b = pos0 + b)
 * The key at t = ATT_KEYS * u + c is rotated by fine row c and query b by
 * coarse row u, which gives the score of the two rotated at their rows:
 *   R(pos_b th) q . R(t th) k = q . R((t - pos_b) th) k = R((pos_b - ATT_KEYS u) th) q . R(c th) k
 * (rotations keep dot products, and angles of one frequency add), so a query
 * needs ATT_KEYS + pos_b / ATT_KEYS + 1 rows of its table, not pos_b + 1.
 * Key tiles then start at multiples of ATT_KEYS. */
typedef struct {
    const float *fine_cos, *fine_sin;     // (B, n_pairs, ATT_KEYS) pair-major: query b's fine row c,
                                          // pair i at [b][i][c]
    const float *coarse_cos, *coarse_sin; // (n_coarse, block, n_pairs): query b's coarse row u at [u][b],
                                          // so that a key tile's rows for the block's queries are adjacent
    int n_coarse;                         // coarse rows per query: enough for the last position of the cache
    int block;                            // queries the coarse rows are laid out for (>= B)
    int rot_dim, layout;                  // rotated dims per head (partial rotary: the rest pass);
                                          // ROPE_INTERLEAVED | ROPE_NEOX
} QueryFrames;
/* Attention statistics of a block (ppl's --attn-stats, attn_stats.h), tallied
 * inside the online softmax, so that the weights are never stored. Per query
 * and head, with p_t = exp(s_t - m) / l its weights over the keys it sees:
 *   entropy  H = -sum_t p_t ln p_t = ln l - U / l,   U = sum_t exp(s_t - m) (s_t - m)
 *   mass     M_k = sum of p_t over the keys t at a distance (row of the
 *            query - row of the key) in bucket k; the sinks' rows apart
 * U and each M_k (before the division by l) follow m as l does: when the
 * running maximum moves from m to m', every term so far is multiplied by
 * alpha = exp(m - m'), and U also gains l (m - m') (each s_t - m becomes
 * s_t - m' = (s_t - m) + (m - m')). The rows of the cache view keep every
 * key's distance to the query for every key strategy (run.c's rope_stage). */
typedef struct {
    const int *bucket; // (n_distances) the distance bucket of each query-key distance 0..n_distances-1
    int n_distances;   // distances a query sees (n_ctx); the pairs farther apart have weight 0
    int n_buckets;     // distance buckets
    double *out;       // (B, n_heads, n_buckets + 2) per query and head: H, M_0 .. M_{n_buckets-1}, the sinks' mass
} AttnTally;
/* tally: NULL (no statistics), or one with room for the B queries' rows. */
void attention_block(float *out, const float *q, const void *keys, int key_type, const void *values, int value_type,
                     const SecondQueries *second, const QueryFrames *frames, const AttnTally *tally, int B, int pos0,
                     int window, int n_heads, int n_kv_heads, int head_size, float *scratch, int threads);

/* ------------------------------------------------------------------------
 * Weight matrices (model.h's Matrix: float32, q8_0, q4_0 or q4_1) and matmul
 * ------------------------------------------------------------------------ */

/* The layouts, row r of a (rows, cols) matrix at values + r * cols (in
 * elements of values' type), its scales at r * cols / group_size:
 *   float32  values float32 (rows, cols)
 *   q8_0     values int8 (rows, cols), scale float32 (rows, cols / group_size)
 *            x[i] = q[i] * scale[i / group_size]
 *   q4_0     values: 16 bytes per block of 32 (rows, cols / 2); half_scale:
 *            one IEEE half d per block (rows, cols / 32). Byte j of a block
 *            holds value j in its low nibble and value j + 16 in its high one
 *            (GGUF's order), q in 0..15:
 *              x[i] = d * (q[i] - 8)
 *   q4_1     as q4_0, and half_min: one IEEE half m per block (rows, cols / 32)
 *              x[i] = d * q[i] + m
 * q4_0 and q4_1 are GGUF's Q4_0 and Q4_1 blocks (f16 d [, f16 m], 16 bytes
 * of nibbles) with the scales moved out into arrays of their own, kept as
 * halves: the same bytes as the file (4.5 and 5 bits a value; float32 scales
 * would add 0.5 and 1 bit, 11% and 20% more to read a token), the nibbles of
 * consecutive blocks contiguous, and 8 blocks' scales one vector load (one
 * F16C conversion) in the SIMD kernels, where interleaved blocks would need a
 * gather. A block of rows (matrix_rows) is then three pointer offsets, as
 * for q8_0. The dequantized values (matrix_row) are the gguf package's, bit
 * for bit: a half widens to float32 exactly and each formula is evaluated in
 * float32 in the order written. */

/* Rows of w one thread takes at a time in matmul (a multiple of the tile
 * heights in kernels.c: 6, 4 and 3): with several tokens, the chunk's rows
 * stay in the cache while every tile of tokens passes over them. */
#define ROW_CHUNK 24

/* What matmul needs besides its operands.
 * Several tokens (SIMD build): x is transposed into x_t, so that one load
 * gives SIMD_FLOATS tokens' values of one column. q8_0 weights (q8_method
 * below says which way): x is quantized into x_q and x_scale for int8
 * products; dequantized rows go into each thread's slice of w_rows
 * (ROW_CHUNK rows at a time); the q8_0 column kernel reads x_q packed into
 * x_qt and x_scale_t, and each thread's chunk's group sums from its slice of
 * w_sums. Float32 weights need no scratch (NULL: blocks then take the
 * portable tiles); q8_0 and q4_0 weights need at least x_q and x_scale
 * (then int8 dot products for any B), q4_1 x_sum too. n below is
 * max(dim, hidden_dim). */
typedef struct {
    float *x_t;       // (n * cols_round_up(B)) the input transposed, in panels of COLS_TOKENS tokens; B > 1 only
    int8_t *x_q;      // (B, n) the input, quantized
    float *x_scale;   // (B, n / group_size) its scales
    float *w_rows;    // (threads, ROW_CHUNK, n) dequantized rows, or NULL
    int threads;      // slices in w_rows and w_sums (OpenMP threads when allocated)
    uint8_t *x_qt;    // (n / 4, simd_round_up(B), 4) x_q + 128, 4 columns per token side by side, or NULL
    float *x_scale_t; // (n / group_size, simd_round_up(B)) x_scale transposed
    int32_t *w_sums;  // (threads, ROW_CHUNK, n / group_size) -128 x each group's sum of weights
    float *x_sum;     // (B, n / 32) q4_1: each block's x_scale x the sum of its x_q (the min's term)
    int int8_blocks;  // 1: q8_0 blocks quantize their activations to int8 (run's --q8-activations; q8_method)
} MatmulScratch;

/* Rows [first_row, ...) of a stacked matrix of `cols` columns: layer l of wq
 * is matrix_rows(w->wq, l * dim, dim). */
Matrix matrix_rows(Matrix m, size_t first_row, size_t cols);
/* out = row `row` of m as floats (the embedding lookup)        out: (cols) */
void matrix_row(float *out, Matrix m, int row, int cols);
/* q8_0 quantization of B rows of n floats in groups of gs along each row:
 *   scale = max|x| / 127, qv = round(x / scale)
 * A group holding a NaN or an infinity gets qv = 0 and scale NaN, so its
 * products are NaN, as they would be in float32.
 * x: (B, n) -> qv (B, n), scale (B, n/gs) */
void quantize_q8(int8_t *qv, float *scale, const float *x, int B, int n, int gs);
/* How matmul multiplies q8_0 weights by B tokens with this scratch and group
 * size gs: one token, int8 dot products (reading the weights dominates, and
 * they stay int8). Several: by default dequantized rows and the float
 * kernel (float32 activations); with scratch->int8_blocks, x quantized as for
 * one token (the same integer sums) and the q8_0 column kernel where the CPU
 * has VNNI, else int8 dot products. The two differ by the rounding of x to
 * int8, within the q8_0 bounds the tests state; against the float32 model on
 * held-out text (KL in nats per token, top-1 agreement), the bundled model
 * 8.2e-5 and 99.1% with float activations, 2.2e-4 and 98.6% with int8 ones;
 * SmolLM2 0.0011 and 98.2%, 0.0039 and 96.7% (README, Command line: --q8-activations). */
enum { Q8_DOTS, Q8_COLUMNS, Q8_ROWS }; // int8 dot products, the q8_0 column kernel, dequantized rows
int q8_method(const MatmulScratch *scratch, int B, int gs);
/* q4_0 and q4_1 weights (needing x_q, x_scale, and x_sum for q4_1): one
 * token, x quantized as q8_0 in blocks of 32 (quantize_q8: scale = max|x| /
 * 127, round half away from zero, so each x_q is within scale / 2 of x) and
 * integer dot products of the nibbles by x_q, per block
 *   q4_0: d * x_scale * sum_i (q_i - 8) x_q,i
 *   q4_1: d * x_scale * sum_i q_i x_q,i + m * x_sum,   x_sum = x_scale * sum_i x_q,i
 * (the integer sums exact; the float ones rounded). Several tokens:
 * dequantized rows in w_rows and the float kernel, as Q8_ROWS (x float32),
 * or without w_rows the one-token products token by token. */
int q4_method(const MatmulScratch *scratch, int B);
/* out = x @ w^T        x (B, n), w (d, n) -> out (B, d)
 * run.c's matmul_reference with w float32, q8_0, q4_0 or q4_1, tiled and threaded. */
void matmul(float *out, const float *x, Matrix w, int B, int n, int d, const MatmulScratch *scratch);

#endif
