/* test_run.c: unit tests for run.c's RoPE, ops, sampler and checkpoint loader.
 *
 * Build (make test-c): the sources compiled with -DTESTING, which leaves
 * run.c's main out, and linked with this file; it calls what run.h, ppl.h and
 * passkey.h declare. Each check prints a line on
 * failure with the expected and actual values; the last line is
 * "run: N passed, N failed" and the exit status is 1 on any failure.
 *
 * Tolerances, and why:
 * - RoPE against docs/rope.md's float64 numbers (§3.1, §9): 2e-6 absolute on values of
 *   magnitude <= ~10, because the table is stored as float (relative rounding
 *   6e-8) and the rotation runs in float.
 * - inverse frequencies: computed in double here as in the spec: 1e-9 relative.
 * - shift invariance at positions up to 4096: |q||k| * (pos * 2^-24 + 1e-6),
 *   the float table's angle error grows with position (docs/rope.md §5.2).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "passkey.h"
#include "ppl.h"
#include "run.h"

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                                      \
    do {                                                                                                      \
        if (cond) {                                                                                           \
            n_pass++;                                                                                         \
        } else {                                                                                              \
            n_fail++;                                                                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            printf(__VA_ARGS__);                                                                              \
            printf("\n");                                                                                     \
        }                                                                                                     \
    } while (0)

static int close_to(double a, double b, double tol) { return fabs(a - b) <= tol; }

/* ---------------------------------------------------------------- RoPE --- */

static RopeConfig rope_cfg(int rot_dim, double base, int scaling, double factor, int orig_ctx) {
    RopeConfig r = {.base = base, .layout = ROPE_INTERLEAVED, .rot_dim = rot_dim, .scaling = scaling,
                    .factor = factor, .orig_ctx = orig_ctx, .beta_fast = 32, .beta_slow = 1, .attn_factor = 0,
                    .low_freq = 1, .high_freq = 4};
    return r;
}

/* Rotate one head of size d at position pos with a table built for r. */
static void rotate_at(float *v, int d, const RopeConfig *r, int pos, int layout) {
    int n_pairs = r->rot_dim / 2;
    double inv[64], mscale;
    float c[64], s[64];
    rope_frequencies(r, pos + 1, inv, &mscale);
    rope_fill_table(c, s, pos, 1, inv, n_pairs, mscale);
    rope(v, c, s, 1, 1, d, r->rot_dim, layout);
}

static double dot64(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void test_rope_worked_example(void) {
    // docs/rope.md §3: d=4, b=10000, q=[1,2,3,4], k=[5,6,7,8]
    static const double expect[2][2][2][4] = { // [pos-1][layout][q/k][4]
        {{{-1.1426396637, 1.9220755965, 2.9598506679, 4.0297995017},
          {-2.3473143795, 7.4491687592, 6.9196513362, 8.0695988367}},
         {{-1.9841106486, 1.9599006675, 2.4623779024, 4.0197996683},
          {-3.1887853643, 5.9197013358, 7.9894710651, 8.0595990033}}},
        {{{-2.2347416902, 0.0770037537, 2.9194053532, 4.0591960267},
          {-7.5365187437, 2.0496061148, 6.8386107131, 8.1383907202}},
         {{-3.1440391170, 1.9196053466, -0.3391430828, 4.0391973601},
          {-8.4458161705, 5.8388107065, 1.6334592783, 8.1183920535}}},
    };
    RopeConfig r = rope_cfg(4, 10000, ROPE_NONE, 1, 512);
    for (int layout = 0; layout < 2; layout++) {
        float q0[4] = {1, 2, 3, 4}, k0[4] = {5, 6, 7, 8};
        rotate_at(q0, 4, &r, 0, layout);
        rotate_at(k0, 4, &r, 0, layout);
        for (int i = 0; i < 4; i++)
            CHECK(q0[i] == (float)(i + 1) && k0[i] == (float)(i + 5), "pos 0 must be the identity: q0[%d]=%g", i,
                  q0[i]);
        for (int pos = 1; pos <= 2; pos++) {
            float q[4] = {1, 2, 3, 4}, k[4] = {5, 6, 7, 8};
            rotate_at(q, 4, &r, pos, layout);
            rotate_at(k, 4, &r, pos, layout);
            for (int i = 0; i < 4; i++) {
                CHECK(close_to(q[i], expect[pos - 1][layout][0][i], 2e-6), "d=4 %s pos %d q[%d]: expected %.10f got %.10f",
                      LAYOUT_NAMES[layout], pos, i, expect[pos - 1][layout][0][i], q[i]);
                CHECK(close_to(k[i], expect[pos - 1][layout][1][i], 2e-6), "d=4 %s pos %d k[%d]: expected %.10f got %.10f",
                      LAYOUT_NAMES[layout], pos, i, expect[pos - 1][layout][1][i], k[i]);
            }
        }
    }
    // Scores of the worked example (interleaved): q1.k0 == q2.k1 == 58.7766059493, q0.k2 = 49.632...
    float q1[4] = {1, 2, 3, 4}, k0[4] = {5, 6, 7, 8}, q2[4] = {1, 2, 3, 4}, k1[4] = {5, 6, 7, 8};
    float q0[4] = {1, 2, 3, 4}, k2[4] = {5, 6, 7, 8};
    rotate_at(q1, 4, &r, 1, 0);
    rotate_at(q2, 4, &r, 2, 0);
    rotate_at(k1, 4, &r, 1, 0);
    rotate_at(k2, 4, &r, 2, 0);
    CHECK(close_to(dot64(q1, k0, 4), 58.7766059493, 2e-5), "q1.k0 expected 58.7766059493 got %.10f", dot64(q1, k0, 4));
    CHECK(close_to(dot64(q2, k1, 4), 58.7766059493, 2e-5), "q2.k1 expected 58.7766059493 got %.10f", dot64(q2, k1, 4));
    CHECK(close_to(dot64(q0, k2, 4), 49.6320885061, 2e-5), "q0.k2 expected 49.6320885061 got %.10f", dot64(q0, k2, 4));
}

static uint64_t test_rng = 42;
static float randn(void) { // Box-Muller on the sampler's xorshift
    float u1 = random_f32(&test_rng) + 1e-7f, u2 = random_f32(&test_rng);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static void test_rope_properties(void) {
    const int d = 64;
    RopeConfig r = rope_cfg(d, 10000, ROPE_NONE, 1, 256);
    for (int layout = 0; layout < 2; layout++) {
        for (int trial = 0; trial < 20; trial++) {
            float q[64], k[64], qa[64], ka[64], qb[64], kb[64];
            for (int i = 0; i < d; i++) q[i] = randn(), k[i] = randn();
            int m = (int)(random_u32(&test_rng) % 2000), n = (int)(random_u32(&test_rng) % 2000);
            int shift = (int)(random_u32(&test_rng) % 2000);
            memcpy(qa, q, sizeof q), memcpy(ka, k, sizeof k), memcpy(qb, q, sizeof q), memcpy(kb, k, sizeof k);
            rotate_at(qa, d, &r, m, layout);
            rotate_at(ka, d, &r, n, layout);
            rotate_at(qb, d, &r, m + shift, layout);
            rotate_at(kb, d, &r, n + shift, layout);
            double nq = sqrt(dot64(q, q, d)), nk = sqrt(dot64(k, k, d));
            CHECK(close_to(sqrt(dot64(qa, qa, d)), nq, 1e-5 * nq), "norm not preserved at pos %d: %g vs %g", m,
                  sqrt(dot64(qa, qa, d)), nq);
            double tol = nq * nk * ((m + n + 2.0 * shift) * 6e-8 + 1e-6);
            CHECK(close_to(dot64(qa, ka, d), dot64(qb, kb, d), tol),
                  "%s score depends on absolute position: q%d.k%d=%.7f vs shifted by %d: %.7f", LAYOUT_NAMES[layout], m,
                  n, dot64(qa, ka, d), shift, dot64(qb, kb, d));
        }
    }
    // Layout equivalence: with P moving entry 2i+c to c*d/2 + i,
    // P * rope_interleaved(x) == rope_neox(P * x).
    for (int trial = 0; trial < 10; trial++) {
        float x[64], px[64], rx[64];
        for (int i = 0; i < d; i++) x[i] = randn();
        for (int i = 0; i < d / 2; i++) px[i] = x[2 * i], px[d / 2 + i] = x[2 * i + 1];
        int pos = 1 + (int)(random_u32(&test_rng) % 5000);
        memcpy(rx, x, sizeof x);
        rotate_at(rx, d, &r, pos, ROPE_INTERLEAVED);
        rotate_at(px, d, &r, pos, ROPE_NEOX);
        int same = 1;
        for (int i = 0; i < d / 2; i++) same &= rx[2 * i] == px[i] && rx[2 * i + 1] == px[d / 2 + i];
        CHECK(same, "layouts disagree under the permutation at pos %d", pos);
    }
    // Partial rotary: dims past rot_dim are untouched.
    RopeConfig rp = rope_cfg(16, 10000, ROPE_NONE, 1, 256);
    for (int layout = 0; layout < 2; layout++) {
        float v[32], orig[32];
        for (int i = 0; i < 32; i++) v[i] = orig[i] = randn();
        rotate_at(v, 32, &rp, 77, layout);
        int tail_same = 1, head_changed = 0;
        for (int i = 16; i < 32; i++) tail_same &= v[i] == orig[i];
        for (int i = 0; i < 16; i++) head_changed |= v[i] != orig[i];
        CHECK(tail_same && head_changed, "partial rotary (%s): tail unchanged=%d head changed=%d",
              LAYOUT_NAMES[layout], tail_same, head_changed);
    }
}

/* docs/rope.md §9.1, §9.2: inverse frequencies and mscale for each method (factor 1: §8.9). */
static void test_rope_scaling_vectors(void) {
    struct {
        const char *name;
        RopeConfig r;
        int cur_len;
        double inv[4], mscale;
    } cases[] = {
        {"none", rope_cfg(8, 1e4, ROPE_NONE, 1, 256), 1, {1, 0.1, 0.01, 0.001}, 1},
        {"linear 4", rope_cfg(8, 1e4, ROPE_LINEAR, 4, 256), 1, {0.25, 0.025, 0.0025, 0.00025}, 1},
        {"ntk 4", rope_cfg(8, 1e4, ROPE_NTK, 4, 256), 1, {1, 0.062996052495, 0.0039685026299, 0.00025}, 1},
        {"dynamic 4 @1024", rope_cfg(8, 1e4, ROPE_DYNAMIC, 4, 256), 1024,
         {1, 0.042529037028, 0.0018087189906, 7.6923076923e-05}, 1},
        {"yarn 4", rope_cfg(8, 1e4, ROPE_YARN, 4, 256), 1, {1, 0.0625, 0.0025, 0.00025}, 1.1386294361},
        {"llama3 8", rope_cfg(8, 5e5, ROPE_LLAMA3, 8, 8192), 1,
         {1, 0.037606030931, 5.2484616099e-04, 6.6478698712e-06}, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double inv[4], mscale;
        rope_frequencies(&cases[c].r, cases[c].cur_len, inv, &mscale);
        for (int i = 0; i < 4; i++)
            CHECK(close_to(inv[i], cases[c].inv[i], 1e-9 * cases[c].inv[i] + 1e-15),
                  "%s inv_freq[%d]: expected %.12g got %.12g", cases[c].name, i, cases[c].inv[i], inv[i]);
        CHECK(close_to(mscale, cases[c].mscale, 1e-9), "%s mscale: expected %.10f got %.10f", cases[c].name, cases[c].mscale,
              mscale);
    }
    // head_dim 64: first and last four of a few methods.
    struct {
        const char *name;
        RopeConfig r;
        double first[4], last[4];
    } wide[] = {
        {"d64 ntk 4", rope_cfg(64, 1e4, ROPE_NTK, 4, 256), {1, 0.7170983281, 0.5142300122, 0.3687534820},
         {9.0407379001e-05, 6.4830980330e-05, 4.6490187604e-05, 3.3338035804e-05}},
        {"d64 yarn 4", rope_cfg(64, 1e4, ROPE_YARN, 4, 256), {1, 0.7066310819, 0.4974557877, 0.3487105701},
         {7.9056941504e-05, 5.9284342642e-05, 4.4456985251e-05, 3.3338035804e-05}},
        {"d64 llama3 8", rope_cfg(64, 5e5, ROPE_LLAMA3, 8, 8192), {1, 0.6636012377, 0.4403666027, 0.2922278226},
         {1.2891731722e-06, 8.5549691264e-07, 5.6770881008e-07, 3.7673226902e-07}},
    };
    for (size_t c = 0; c < sizeof wide / sizeof wide[0]; c++) {
        double inv[32], mscale;
        rope_frequencies(&wide[c].r, 1, inv, &mscale);
        for (int i = 0; i < 4; i++) {
            CHECK(close_to(inv[i], wide[c].first[i], 1e-9), "%s inv_freq[%d]: expected %.10g got %.10g", wide[c].name,
                  i, wide[c].first[i], inv[i]);
            CHECK(close_to(inv[28 + i], wide[c].last[i], 1e-9 * wide[c].last[i]),
                  "%s inv_freq[%d]: expected %.10g got %.10g", wide[c].name, 28 + i, wide[c].last[i], inv[28 + i]);
        }
    }
    // Factor 1 reproduces the unscaled table exactly, for every method whose
    // frequencies s scales (LongRoPE's come from its factor arrays: below).
    for (int m = 0; m < ROPE_N_SCALINGS; m++) {
        if (m == ROPE_LONGROPE) continue;
        double base[32], scaled[32], a0, a1;
        RopeConfig r0 = rope_cfg(64, 1e4, ROPE_NONE, 1, 256), r1 = rope_cfg(64, 1e4, m, 1, 256);
        rope_frequencies(&r0, 200, base, &a0);
        rope_frequencies(&r1, 200, scaled, &a1);
        int same = a0 == a1;
        for (int i = 0; i < 32; i++) same &= base[i] == scaled[i];
        CHECK(same, "factor 1 is not the identity for %s", SCALING_NAMES[m]);
    }
    // LongRoPE (docs/rope.md §8.8): inv_i = f_i / short_i up to L tokens,
    // f_i / long_i beyond; mscale sqrt(1 + ln s / ln L) = sqrt(1.25) for s = 4,
    // L = 256, whatever the length; a stored attention factor replaces it.
    {
        static const float short_f[4] = {1, 1.5f, 2, 4}, long_f[4] = {1, 2, 8, 16};
        RopeConfig lr = rope_cfg(8, 1e4, ROPE_LONGROPE, 4, 256);
        lr.short_factor = short_f, lr.long_factor = long_f;
        double f[4] = {1, 0.1, 0.01, 0.001}, inv_s[4], inv_l[4], m_s, m_l;
        rope_frequencies(&lr, 256, inv_s, &m_s);
        rope_frequencies(&lr, 257, inv_l, &m_l);
        int ok = close_to(m_s, sqrt(1.25), 1e-15) && m_l == m_s;
        for (int i = 0; i < 4; i++)
            ok &= close_to(inv_s[i], f[i] / short_f[i], 1e-15 * f[i]) && close_to(inv_l[i], f[i] / long_f[i], 1e-15 * f[i]);
        lr.attn_factor = 1.3;
        rope_frequencies(&lr, 10, inv_s, &m_s);
        CHECK(ok && m_s == 1.3, "longrope: short/long frequencies or attention factor wrong (mscale %g)", m_s);
    }
    // YaRN cos/sin rows (docs/rope.md §9.3), already multiplied by mscale.
    RopeConfig y = rope_cfg(8, 1e4, ROPE_YARN, 4, 256);
    double inv[4], mscale;
    float c[4], s[4];
    rope_frequencies(&y, 1, inv, &mscale);
    rope_fill_table(c, s, 1000, 1, inv, 4, mscale);
    static const double yc[4] = {0.6403413705, 1.0765060926, -0.9122057032, 1.1032322044};
    static const double ys[4] = {0.9415093850, -0.3709604095, 0.6814380000, 0.2817014306};
    for (int i = 0; i < 4; i++)
        CHECK(close_to(c[i], yc[i], 2e-6) && close_to(s[i], ys[i], 2e-6),
              "yarn row 1000 pair %d: expected (%.10f, %.10f) got (%.10f, %.10f)", i, yc[i], ys[i], c[i], s[i]);
}

/* The float table against a direct double-precision rotation, at positions up
 * to 1e5: the angle is formed in double, so only the final float rounding of
 * cos/sin remains (6e-8 relative); a float angle would be off by ~1e-2 there. */
static void test_rope_table_precision(void) {
    RopeConfig r = rope_cfg(64, 1e4, ROPE_NONE, 1, 256);
    double inv[32], mscale, worst = 0;
    float c[32], s[32];
    rope_frequencies(&r, 1, inv, &mscale);
    int positions[] = {1, 999, 4096, 32767, 65536, 100000};
    for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
        rope_fill_table(c, s, positions[p], 1, inv, 32, mscale);
        for (int i = 0; i < 32; i++) {
            double a = positions[p] * pow(1e4, -2.0 * i / 64);
            double e = fmax(fabs(c[i] - cos(a)), fabs(s[i] - sin(a)));
            worst = e > worst ? e : worst;
        }
    }
    CHECK(worst < 1e-7, "table vs double rotation up to pos 1e5: max error %.3g (expected < 1e-7)", worst);
}

/* YaRN's attention factor multiplies cos and sin, so q and k each carry it
 * once and a logit q.k carries mscale^2 (docs/rope.md §7.3): with q = k = e_0 at
 * position 0 the dot product is exactly mscale^2, not mscale or mscale^4. */
static void test_attn_factor_applied_once(void) {
    RopeConfig r = rope_cfg(8, 1e4, ROPE_YARN, 4, 256);
    float q[8] = {1, 0, 0, 0, 0, 0, 0, 0}, k[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    rotate_at(q, 8, &r, 0, ROPE_INTERLEAVED);
    rotate_at(k, 8, &r, 0, ROPE_INTERLEAVED);
    double ms = 0.1 * log(4.0) + 1;
    CHECK(close_to(dot64(q, k, 8), ms * ms, 1e-6), "yarn q.k at pos 0: expected mscale^2 = %.7f, got %.7f", ms * ms,
          dot64(q, k, 8));
}

/* ----------------------------------------------------------------- ops --- */

/* A Transformer with just what attention reads: the head counts, n_ctx, a
 * float32 cache, the scores scratch (one query: n_heads * n_ctx floats) and
 * for a block attention_block's (one thread's attention_block_floats). */
static Transformer attention_fixture(int n_heads, int n_kv_heads, int head_size, int n_ctx, float *scores,
                                     float *attn_tiles) {
    Transformer t;
    memset(&t, 0, sizeof t);
    t.config.n_heads = n_heads, t.config.n_kv_heads = n_kv_heads, t.config.dim = n_heads * head_size;
    t.n_ctx = n_ctx, t.kv_type = KV_F32, t.state.scores = scores, t.state.attn_tiles = attn_tiles;
    t.state.mm.threads = 1;
    return t;
}

static void fill_randn(float *x, size_t n, float scale); // below, with the kernels' tests

static void test_ops(void) {
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, out[4];
    rmsnorm(out, x, w, 1, 4, 0.0f);
    double rms = sqrt((1 + 4 + 9 + 16) / 4.0);
    CHECK(close_to(out[2], 2 * 3 / rms, 1e-6) && close_to(out[3], 0.5 * 4 / rms, 1e-6), "rmsnorm: %g %g", out[2],
          out[3]);
    float m[6] = {1, 2, 3, 4, 5, 6}, v[3] = {1, 0, -1}, mo[2];
    matmul(mo, v, (Matrix){WEIGHT_F32, 0, m, NULL}, 1, 3, 2, NULL); // (1,3) @ (2,3)^T -> (1,2)
    CHECK(mo[0] == -2 && mo[1] == -2, "matmul: expected -2 -2 got %g %g", mo[0], mo[1]);
    float sm[3] = {1000, 1000, 1000};
    softmax(sm, 3);
    CHECK(close_to(sm[0], 1.0 / 3, 1e-6), "softmax of large equal logits: %g", sm[0]);
    float g[2] = {0, 2}, u[2] = {5, 3};
    swiglu(g, u, 2);
    CHECK(g[0] == 0 && close_to(g[1], 2 / (1 + exp(-2.0)) * 3, 1e-6), "swiglu: %g %g", g[0], g[1]);
    // GQA grouping: with 4 query heads and 2 kv heads, heads 0,1 read kv head 0.
    float keys[2 * 4] = {1, 0, 0, 1, 0, 0, 0, 0}, values[2 * 4] = {10, 20, 30, 40, 0, 0, 0, 0};
    float q[4 * 2] = {1, 0, 1, 0, 1, 0, 1, 0}, scores[4 * 2], o[4 * 2];
    Transformer t = attention_fixture(4, 2, 2, 2, scores, NULL);
    attention(o, q, &(RotatedKeys){.keys = keys, .key_type = KV_F32}, values, 1, 0, 0, &t);
    CHECK(o[0] == 10 && o[2] == 10 && o[4] == 30 && o[6] == 30, "GQA grouping: got %g %g %g %g", o[0], o[2], o[4],
          o[6]);
    // Bucket edges for L = 256, ctx = 4096.
    Bucket b[64];
    int nb = ppl_buckets(b, 256, 4096);
    CHECK(nb == 6 && b[0].end == 128 && b[1].end == 256 && b[2].end == 512 && b[5].start == 2048 && b[5].end == 4096,
          "ppl buckets for L=256 ctx=4096: n=%d", nb);
    nb = ppl_buckets(b, 256, 100);
    CHECK(nb == 1 && b[0].end == 100, "ppl buckets for ctx < L/2: n=%d end=%d", nb, b[0].end);
    float lg[3] = {0, 0, 0};
    CHECK(close_to(token_nll(lg, 3, 1), log(3.0), 1e-12), "nll of uniform: %g", token_nll(lg, 3, 1));
    // 32000 logits against the formula in double with libm, within
    // token_nll's stated 1e-6: random ones of scale 5, and a case whose
    // rounding errors all point one way (one logit at -1.463, the rest at
    // -9.551: 4.8e-7 measured, of a bound of 2.4e-7 + 6e-8 x 7.3).
    int V = 32000;
    float *big = malloc(sizeof(float) * V);
    for (int adversarial = 0; adversarial < 2; adversarial++) {
        if (adversarial)
            for (int i = 0; i < V; i++) big[i] = i == 0 ? -1.463f : -9.551f;
        else
            fill_randn(big, (size_t)V, 5.0f);
        double top = big[0], sum = 0;
        for (int i = 1; i < V; i++) top = fmax(top, big[i]);
        for (int i = 0; i < V; i++) sum += exp(big[i] - top);
        double worst = 0;
        for (int target = 0; target < V; target += 997)
            worst = fmax(worst, fabs(token_nll(big, V, target) - (top + log(sum) - big[target])));
        CHECK(worst < 1e-6, "token_nll over %d %s logits vs double: %.3g (expected < 1e-6)", V,
              adversarial ? "adversarial" : "random", worst);
    }
    free(big);
}

/* ------------------------------------------------------------- sampler --- */

static void test_sampler(void) {
    enum { V = 6 };
    const float base[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f};
    float logits[V];
    Sampler s;
    int hist[4] = {1, 1, 5, 0};

    build_sampler(&s, V, 0.0f, 0.9f, 0, 0.0f, 1.0f, 64, 1);
    memcpy(logits, base, sizeof base);
    CHECK(sample(&s, logits, hist, 0) == 1, "greedy must pick the argmax 1");
    free_sampler(&s);

    // Repetition penalty 2 over history {1, 5}: 3 -> 1.5, 2.9 -> 1.45, so 2 wins.
    build_sampler(&s, V, 0.0f, 1.0f, 0, 0.0f, 2.0f, 64, 1);
    memcpy(logits, base, sizeof base);
    CHECK(sample(&s, logits, hist, 3) == 2, "repetition penalty should make token 2 the argmax");
    memcpy(logits, base, sizeof base);
    s.repeat_last_n = 1; // only token 5 is recent: 1 (3.0) stays the best
    CHECK(sample(&s, logits, hist, 3) == 1, "repeat_last_n=1 should only penalize the last token");
    free_sampler(&s);

    // top-k 1, tiny top-p and min-p 1 all reduce to greedy.
    float settings[3][3] = {{1, 1.0f, 0}, {0, 1e-6f, 0}, {0, 1.0f, 1.0f}}; // topk, topp, minp
    for (int c = 0; c < 3; c++) {
        build_sampler(&s, V, 1.0f, settings[c][1], (int)settings[c][0], settings[c][2], 1.0f, 64, (uint64_t)c);
        int all_one = 1;
        for (int i = 0; i < 200; i++) {
            memcpy(logits, base, sizeof base);
            all_one &= sample(&s, logits, hist, 0) == 1;
        }
        CHECK(all_one, "truncation setting %d should always pick token 1", c);
        free_sampler(&s);
    }

    // Plain temperature-1 sampling follows softmax(logits): 40000 draws, 0.01 absolute.
    build_sampler(&s, V, 1.0f, 1.0f, 0, 0.0f, 1.0f, 64, 1234);
    int counts[V] = {0};
    for (int i = 0; i < 40000; i++) {
        memcpy(logits, base, sizeof base);
        counts[sample(&s, logits, hist, 0)]++;
    }
    float p[V];
    memcpy(p, base, sizeof base);
    softmax(p, V);
    for (int i = 0; i < V; i++)
        CHECK(close_to(counts[i] / 40000.0, p[i], 0.01), "token %d drawn %.4f of the time, softmax says %.4f", i,
              counts[i] / 40000.0, p[i]);
    free_sampler(&s);

    // top-k 2 only ever returns the two best (1 and 5); same seed, same draws.
    Sampler a, b;
    build_sampler(&a, V, 1.0f, 1.0f, 2, 0.0f, 1.0f, 64, 99);
    build_sampler(&b, V, 1.0f, 1.0f, 2, 0.0f, 1.0f, 64, 99);
    int only_top2 = 1, same = 1;
    for (int i = 0; i < 500; i++) {
        float la[V], lb[V];
        memcpy(la, base, sizeof base), memcpy(lb, base, sizeof base);
        int x = sample(&a, la, hist, 0), y = sample(&b, lb, hist, 0);
        only_top2 &= x == 1 || x == 5;
        same &= x == y;
    }
    CHECK(only_top2, "top-k 2 returned a token outside the top 2");
    CHECK(same, "two samplers with the same seed diverged");
    free_sampler(&a);
    free_sampler(&b);
}

/* -------------------------------------------------------------- loader --- */

static const char *tmp_path(const char *name) {
    static char buf[256];
    const char *dir = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/test_run_%d_%s", dir ? dir : "/tmp", (int)getpid(), name);
    return buf;
}

static void put_i32(unsigned char *p, int32_t v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}
static void put_f32(unsigned char *p, float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    put_i32(p, i);
}

/* A tiny valid version-1 header: dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 10. */
static void good_header(unsigned char *h) {
    memset(h, 0, CKPT_HEADER_BYTES);
    put_i32(h, (int32_t)CKPT_MAGIC);
    int32_t vals[] = {1, 8, 16, 1, 2, 1, 10, 16, 1, 1, 2, 0, 0};
    for (int i = 0; i < 13; i++) put_i32(h + 4 + 4 * i, vals[i]);
    put_f32(h + 56, 1e-5f);
    put_f32(h + 60, 10000.0f);
    put_i32(h + 64, 0);
    put_i32(h + 68, 4);
    put_i32(h + 72, 0);
    put_f32(h + 76, 1.0f);
}

/* Write header + `payload` zero bytes and try to load it. */
static int try_load(const unsigned char *h, size_t header_len, size_t payload, char *err, size_t err_len) {
    const char *path = tmp_path("ckpt.bin");
    FILE *f = fopen(path, "wb");
    fwrite(h, 1, header_len, f);
    for (size_t i = 0; i < payload; i++) fputc(0, f);
    fclose(f);
    Transformer t;
    int rc = load_checkpoint(&t, path, err, err_len);
    if (rc == 0) free_transformer(&t);
    remove(path);
    return rc;
}

static void test_loader(void) {
    unsigned char h[CKPT_HEADER_BYTES];
    char err[512];
    good_header(h);
    Config c;
    RopeConfig r;
    parse_header("x", h, sizeof h, &c, &r, err, sizeof err);
    size_t payload = expected_file_size(&c, &r) - CKPT_HEADER_BYTES;
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) == 0, "valid tiny checkpoint rejected: %s", err);
    CHECK(try_load(h, sizeof h, payload - 1, err, sizeof err) != 0 && strstr(err, "truncated"),
          "one byte short must be 'truncated': %s", err);
    CHECK(try_load(h, sizeof h, payload + 1, err, sizeof err) != 0 && strstr(err, "trailing"),
          "one byte extra must be 'trailing': %s", err);
    CHECK(try_load(h, 100, 0, err, sizeof err) != 0 && strstr(err, "header"), "short header: %s", err);
    CHECK(try_load(h, 0, 0, err, sizeof err) != 0 && strstr(err, "empty"), "empty file: %s", err);

    struct { int offset; int32_t value; const char *expect; } bad[] = {
        {4, 3, "version"}, {4, 0, "version"}, {8, 0, "dim"}, {20, 0, "n_heads"}, {24, 3, "n_kv_heads"}, {20, 3, "n_heads"},
        {16, -1, "n_layers"}, {28, 1 << 30, "vocab_size"}, {36, 2, "shared_classifier"}, {44, 10, "eos_id"},
        {48, 7, "weight_type"}, {64, 2, "rope_layout"}, {68, 5, "rot_dim"}, {68, 6, "rot_dim"}, {72, 9, "rope_scaling"},
        {200, 1, "reserved"}, {104, 1, "reserved"}, {72, ROPE_LONGROPE, "rope_scaling"}, // the last two: version 1
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        good_header(h);
        put_i32(h + bad[i].offset, bad[i].value);
        int rc = try_load(h, sizeof h, payload, err, sizeof err);
        CHECK(rc != 0 && strstr(err, bad[i].expect) && strstr(err, "test_run_"),
              "header field at %d = %d: expected an error naming '%s' and the file, got rc=%d '%s'", bad[i].offset,
              bad[i].value, bad[i].expect, rc, rc ? err : "");
    }
    good_header(h);
    put_f32(h + 56, -1.0f);
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "norm_eps"), "negative eps: %s", err);
    good_header(h);
    put_f32(h + 92, 1e30f); // an attention factor this large turns every logit into NaN
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "rope_attn_factor"),
          "rope_attn_factor 1e30: %s", err);
    // Version 2's fields: biases, the sliding window, the layers it covers.
    struct { int offset; int32_t value; const char *expect; } bad2[] = {
        {104, 8, "bias_flags"}, {104, -1, "bias_flags"}, {108, -1, "sliding_window"}, {108, MAX_CTX + 1, "sliding_window"},
        {112, -1, "window_first_layer"}, {112, 99, "window_first_layer"}, {116, 1, "reserved"}, {72, 7, "rope_scaling"},
    };
    for (size_t i = 0; i < sizeof bad2 / sizeof bad2[0]; i++) {
        good_header(h);
        put_i32(h + 4, 2);
        put_i32(h + bad2[i].offset, bad2[i].value);
        int rc = try_load(h, sizeof h, payload, err, sizeof err);
        CHECK(rc != 0 && strstr(err, bad2[i].expect), "version 2, header field at %d = %d: expected an error naming "
              "'%s', got rc=%d '%s'", bad2[i].offset, bad2[i].value, bad2[i].expect, rc, rc ? err : "");
    }
    good_header(h); // version 2 with every bias: the file must hold them
    put_i32(h + 4, 2);
    put_i32(h + 104, BIAS_ALL);
    put_i32(h + 108, 3);
    parse_header("x", h, sizeof h, &c, &r, err, sizeof err);
    size_t with_biases = expected_file_size(&c, &r) - CKPT_HEADER_BYTES;
    CHECK(with_biases > payload && try_load(h, sizeof h, with_biases, err, sizeof err) == 0 &&
          try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "truncated"),
          "version 2 with biases: %zu bytes (without: %zu): %s", with_biases, payload, err);
    put_i32(h, 0x12345678); // not our magic: read as a legacy header with absurd dims
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "out of range"), "bad magic: %s", err);

    // Legacy: a header claiming stories15M over 4 KB of data (crashes llama2.c).
    unsigned char lh[28];
    int32_t l15[7] = {288, 768, 6, 6, 6, 32000, 256};
    for (int i = 0; i < 7; i++) put_i32(lh + 4 * i, l15[i]);
    CHECK(try_load(lh, sizeof lh, 4096, err, sizeof err) != 0 && strstr(err, "truncated"), "legacy 15M over 4KB: %s",
          err);
    put_i32(lh + 12, 0); // n_heads = 0 (llama2.c divides by zero)
    CHECK(try_load(lh, sizeof lh, 4096, err, sizeof err) != 0 && strstr(err, "n_heads"), "legacy n_heads=0: %s", err);

    Transformer t;
    CHECK(load_checkpoint(&t, "/nonexistent/model.bin", err, sizeof err) != 0 && strstr(err, "/nonexistent/model.bin"),
          "missing file: %s", err);
    CHECK(load_checkpoint(&t, "/tmp", err, sizeof err) != 0 && strstr(err, "directory"), "directory: %s", err);
}

/* -------------------------------------------------- kernels and formats --- */

/* Fill n floats with N(0, 1) * scale. */
static void fill_randn(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = randn() * scale;
}


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
    Matrix mq = {WEIGHT_Q8_0, gs, wq, ws};
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
static void test_matmul_kernels(void) {
    int shapes[][3] = {{1, 288, 36}, {5, 288, 37}, {32, 64, 16}, {7, 172, 9}, {2, 96, 5}, {3, 512, 12},
                       {17, 100, 30}, {32, 768, 13}, {70, 96, 29}, {128, 64, 7}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int B = shapes[c][0], n = shapes[c][1], d = shapes[c][2], gs = n % 32 == 0 ? 32 : 4;
        float *x = malloc(sizeof(float) * B * n), *w = malloc(sizeof(float) * d * n);
        float *simd = malloc(sizeof(float) * B * d), *port = malloc(sizeof(float) * B * d);
        float *wd = malloc(sizeof(float) * d * n), *ws = malloc(sizeof(float) * d * n / gs);
        float *xs = malloc(sizeof(float) * B * n / gs);
        int8_t *wq = malloc((size_t)d * n), *xq = malloc((size_t)B * n);
        float *xt = malloc(sizeof(float) * n * simd_round_up(B)); // x transposed, for blocks (the column kernel)
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
        Matrix mf = {WEIGHT_F32, 0, w, NULL};
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
        // Token b alone (generation's one-row kernel, four partial sums) gives
        // its row of the block (one FMA chain per output) up to the summation
        // order: the same 2e-4.
        use_simd = HAVE_SIMD;
        double worst_alone = 0;
        for (int b = 0; b < B; b++) {
            matmul(port, x + (size_t)b * n, mf, 1, n, d, &fs);
            for (int i = 0; i < d; i++) worst_alone = fmax(worst_alone, fabs(port[i] - simd[(size_t)b * d + i]));
        }
        CHECK(worst_alone < 2e-4, "f32 matmul B=%d n=%d d=%d: a token alone differs from its block row by %.3g", B,
              n, d, worst_alone);

        // q8_0: quantize W; the kernels against each other and against the
        // float matmul with the dequantized W (error from quantizing x only).
        quantize_q8(wq, ws, w, d, n, gs);
        // -128: outside the format's -127..127 (export never writes it) but an
        // int8 all the same; every kernel must still be exact (no sign wrap)
        wq[0] = wq[(size_t)d * n - 1] = -128;
        for (size_t i = 0; i < (size_t)d * n; i++) wd[i] = wq[i] * ws[i / gs];
        Matrix mq = {WEIGHT_Q8_0, gs, wq, ws};
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
        Matrix mq = {WEIGHT_Q8_0, gs, wq, ws};
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
    // matrix_row dequantizes one row (the embedding lookup)
    int8_t q[8] = {1, -2, 3, -4, 127, 0, -127, 5};
    float sc[2] = {0.5f, 2.0f}, row[4];
    matrix_row(row, (Matrix){WEIGHT_Q8_0, 4, q, sc}, 1, 4);
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
static void test_attention_block_self_extend(void) {
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
        float *tiles = malloc(sizeof(float) * 2 * attention_block_floats(hs));
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
        int last = pos0 + B - 1;
        RotatedKeys rk = {keys, KV_F32, qg, grouped, last >= W ? last - W + 1 : 0};
        attention(out, q, &rk, values, B, pos0, 0, &t);
        for (int b = 0; b < B; b++) {
            RotatedKeys one = {keys, KV_F32, qg + (size_t)b * dim, grouped, pos0 + b >= W ? pos0 + b - W + 1 : 0};
            attention(out2 + (size_t)b * dim, q + (size_t)b * dim, &one, values, 1, pos0 + b, 0, &t);
        }
        for (int e = 0; e < B * dim; e++) worst = fmax(worst, abs_err(out[e], out2[e]));
        free(q), free(qg), free(out), free(out2), free(keys), free(grouped), free(values), free(scores), free(tiles);
    }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    CHECK(worst < 2e-5, "Self-Extend attention: block vs one query at a time %.3g (expected < 2e-5)", worst);
}

/* attention against the double reference, on every path: a block of B
 * tokens (kernels.c's attention_block: tiles of 128 queries x 48 keys, online
 * softmax; SIMD tiles in a SIMD build), the same block with the portable
 * loops forced (use_simd = 0), and the same tokens one at a time (kv_scores /
 * kv_mix), with a float32 cache and an f16 one.
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
 * The f16 cases compare against the reference on the f16-rounded keys and
 * values, so the same tolerance holds.
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
static void test_attention_block(void) {
    int head_sizes[] = {8, 16, 24, 64, 20}, heads[][2] = {{4, 2}, {6, 1}, {3, 3}}, blocks[] = {2, 7, 17, 140};
    int windows[] = {0, 1, 7, 40, 60, 100}, n_ctx = 150, n_windows = sizeof windows / sizeof windows[0];
    double worst[2][3] = {{0}}; // [f32, f16 cache][block, portable block, one at a time]
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
                    float *tiles = malloc(sizeof(float) * 2 * attention_block_floats(hs));
                    float *cache[2] = {malloc(sizeof(float) * cache_n), malloc(sizeof(float) * cache_n)};
                    float *rounded[2] = {malloc(sizeof(float) * cache_n), malloc(sizeof(float) * cache_n)};
                    uint16_t *half[2] = {malloc(sizeof(uint16_t) * cache_n), malloc(sizeof(uint16_t) * cache_n)};
                    double *ref[2] = {malloc(sizeof(double) * B * dim), malloc(sizeof(double) * B * dim)};
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
                    for (int kv = 0; kv < 2; kv++) // rows no query of the block sees: NaN
                        for (size_t e = 0; e < cache_n; e++)
                            if ((int)(e / kv_dim) < first || (int)(e / kv_dim) >= end)
                                cache[kv][e] = NAN, half[kv][e] = float_to_half(NAN);
                    Transformer t = attention_fixture(nh, nkv, hs, n_ctx, scores, tiles);
                    for (int f16 = 0; f16 < 2; f16++) {
                        const void *keys = f16 ? (void *)half[0] : (void *)cache[0];
                        const void *values = f16 ? (void *)half[1] : (void *)cache[1];
                        RotatedKeys rk = {.keys = keys, .key_type = f16 ? KV_F16 : KV_F32};
                        t.kv_type = rk.key_type;
                        double *r = ref[f16];
                        t.state.mm.threads = 1;
                        attention(out, q, &rk, values, B, pos0, W, &t);
                        for (int e = 0; e < B * dim; e++) worst[f16][0] = fmax(worst[f16][0], abs_err(out[e], r[e]));
                        if (at == 2) { // the longest blocks (a subset: on a loaded machine each parallel
                            t.state.mm.threads = 2; // region waits for a busy core)
                            attention(out2, q, &rk, values, B, pos0, W, &t);
                            differ_by_threads += memcmp(out, out2, sizeof(float) * B * dim) != 0;
                            thread_cases++;
                        }
                        use_simd = 0;
                        attention(out2, q, &rk, values, B, pos0, W, &t);
                        use_simd = HAVE_SIMD;
                        for (int e = 0; e < B * dim; e++) worst[f16][1] = fmax(worst[f16][1], abs_err(out2[e], r[e]));
                        for (int b = 0; b < B; b++)
                            attention(out2 + (size_t)b * dim, q + (size_t)b * dim, &rk, values, 1, pos0 + b, W, &t);
                        for (int e = 0; e < B * dim; e++) worst[f16][2] = fmax(worst[f16][2], abs_err(out2[e], r[e]));
                    }
                    free(q), free(out), free(out2), free(scores), free(tiles);
                    for (int kv = 0; kv < 2; kv++) free(cache[kv]), free(rounded[kv]), free(half[kv]), free(ref[kv]);
                }
#ifdef _OPENMP
    omp_set_num_threads(max_threads);
#endif
    for (int f16 = 0; f16 < 2; f16++)
        CHECK(worst[f16][0] < 2e-5 && worst[f16][1] < 2e-5 && worst[f16][2] < 2e-5,
              "attention vs double, %s cache: block %.3g, portable block %.3g, one token at a time %.3g "
              "(expected < 2e-5)", f16 ? "f16" : "float32", worst[f16][0], worst[f16][1], worst[f16][2]);
    CHECK(differ_by_threads == 0, "attention block: %d of %d cases differ between 1 and 2 threads",
          differ_by_threads, thread_cases);
}

/* exp_fast against libm's expf: 2 ulp (2.4e-7 relative) over its range, on a
 * dense grid and at the edges; 0 below -87.3, infinity above 88.3, NaN kept. */
static void test_exp_fast(void) {
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
static void test_attention_scores(void) {
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
static void test_half(void) {
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

/* Write a random version-1 checkpoint (float32, dims below) to path. */
static void write_random_checkpoint(const char *path, int dim, int hidden, int layers, int heads, int kv_heads,
                                    int vocab, int seq_len) {
    unsigned char h[CKPT_HEADER_BYTES];
    good_header(h);
    int32_t dims[] = {dim, hidden, layers, heads, kv_heads, vocab, seq_len};
    for (int i = 0; i < 7; i++) put_i32(h + 8 + 4 * i, dims[i]);
    put_i32(h + 68, dim / heads); // full rotary
    Config c;
    RopeConfig r;
    char err[256];
    parse_header(path, h, sizeof h, &c, &r, err, sizeof err);
    size_t n_floats = (expected_file_size(&c, &r) - CKPT_HEADER_BYTES) / sizeof(float);
    float *payload = malloc(n_floats * sizeof(float));
    fill_randn(payload, n_floats, 0.1f); // ~1/sqrt(dim): unit-scale activations
    Weights w;
    place_tensors(&c, &r, &w, (const char *)payload - CKPT_HEADER_BYTES); // norm weights near 1
    float *norms[] = {(float *)w.rms_att_weight, (float *)w.rms_ffn_weight, (float *)w.rms_final_weight};
    size_t norm_len[] = {(size_t)layers * dim, (size_t)layers * dim, (size_t)dim};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < norm_len[k]; i++) norms[k][i] = 1.0f + norms[k][i];
    FILE *f = fopen(path, "wb");
    fwrite(h, 1, sizeof h, f);
    fwrite(payload, sizeof(float), n_floats, f);
    fclose(f);
    free(payload);
}

/* Prefill in blocks equals token-by-token, and an f16 KV cache stays close.
 * Tolerances: blocks and single tokens sum each matmul output in a different
 * order (the tile kernel against generation's one-row kernel), so the logits
 * agree to float rounding: 1e-4 absolute on logits of magnitude ~1. f16 keys/values carry a relative error of 2^-11 each;
 * through 2 layers the logits move by about 1e-3; the bound is 2e-2. */
static void test_block_prefill(void) {
    const char *path = tmp_path("block.bin");
    write_random_checkpoint(path, 64, 96, 2, 4, 2, 50, 64);
    char err[512];
    Transformer a, b, h;
    int ok = build_transformer(&a, path, NULL, 0, KV_F32, err, sizeof err) == 0 &&
             build_transformer(&b, path, NULL, 0, KV_F32, err, sizeof err) == 0 &&
             build_transformer(&h, path, NULL, 0, KV_F16, err, sizeof err) == 0;
    CHECK(ok, "random checkpoint rejected: %s", err);
    if (!ok) return;
    int tokens[45], V = 50;
    for (int i = 0; i < 45; i++) tokens[i] = (int)(random_u32(&test_rng) % V);
    float *block = malloc(sizeof(float) * 45 * V);
    for (int p0 = 0; p0 < 45; p0 += 20) { // blocks of 20, 20 and 5 (FORWARD_BLOCK is the most a block may carry)
        int B = 45 - p0 < 20 ? 45 - p0 : 20;
        CHECK(forward_block(&a, tokens + p0, B, p0, LOGITS_ALL) == 0, "forward_block of %d tokens at %d failed", B, p0);
        memcpy(block + (size_t)p0 * V, a.state.logits, sizeof(float) * B * V);
    }
    double worst = 0, worst_f16 = 0;
    for (int p = 0; p < 45; p++) {
        float *one = forward(&b, tokens[p], p, NULL);
        for (int i = 0; i < V; i++) worst = fmax(worst, fabs(one[i] - block[(size_t)p * V + i]));
        float *half = forward(&h, tokens[p], p, NULL);
        for (int i = 0; i < V; i++) worst_f16 = fmax(worst_f16, fabs(half[i] - block[(size_t)p * V + i]));
    }
    CHECK(worst < 1e-4, "block prefill vs token by token: max logit difference %.3g (expected < 1e-4)", worst);
    CHECK(worst_f16 < 2e-2 && worst_f16 > 0, "f16 KV cache vs f32: max logit difference %.3g (expected (0, 2e-2))",
          worst_f16);
    free_transformer(&a);
    free_transformer(&b);
    // Self-Extend (G 3, W 7) goes in blocks too: the same 1e-4 against one
    // token at a time (generation's path: its own rotations of the cached
    // keys), and it must differ from plain RoPE past W.
    PositionOverrides se = {.se_group = {1, 3}, .se_window = {1, 7}};
    ok = build_transformer(&a, path, &se, 0, KV_F32, err, sizeof err) == 0 &&
         build_transformer(&b, path, &se, 0, KV_F32, err, sizeof err) == 0;
    CHECK(ok && block_limit(&a) > 1, "Self-Extend: %s, block limit %d", ok ? "built" : err, ok ? block_limit(&a) : 0);
    if (ok) {
        float *plain = malloc(sizeof(float) * 45 * V);
        memcpy(plain, block, sizeof(float) * 45 * V);
        for (int p0 = 0; p0 < 45; p0 += 20) {
            int B = 45 - p0 < 20 ? 45 - p0 : 20;
            CHECK(forward_block(&a, tokens + p0, B, p0, LOGITS_ALL) == 0, "Self-Extend block at %d failed", p0);
            memcpy(block + (size_t)p0 * V, a.state.logits, sizeof(float) * B * V);
        }
        double worst_se = 0, moved = 0;
        for (int p = 0; p < 45; p++) {
            float *one = forward(&b, tokens[p], p, NULL);
            for (int i = 0; i < V; i++) {
                worst_se = fmax(worst_se, fabs(one[i] - block[(size_t)p * V + i]));
                moved = fmax(moved, fabs(one[i] - plain[(size_t)p * V + i]));
            }
        }
        CHECK(worst_se < 1e-4 && moved > 1e-2,
              "Self-Extend: block vs token by token %.3g (expected < 1e-4), vs plain RoPE %.3g (expected > 1e-2)",
              worst_se, moved);
        free(plain);
        free_transformer(&a);
        free_transformer(&b);
    }
    free(block);
    free_transformer(&h);
    remove(path);
}

/* ppl_score rejects what it cannot score with -1 and a one-line message
 * (no crash, nothing leaked: the sanitizer builds run this too), and on good
 * input scores every text token once: n_ids tokens in ceil(...) windows. */
static void test_ppl_score_arguments(void) {
    const char *path = tmp_path("ppl.bin");
    write_random_checkpoint(path, 64, 96, 2, 4, 2, 50, 64);
    char err[512];
    Transformer t;
    if (build_transformer(&t, path, NULL, 16, KV_F32, err, sizeof err) != 0) {
        CHECK(0, "random checkpoint rejected: %s", err);
        return;
    }
    int ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i % 50;
    PplScore score;
    struct { const char *name; int n_ids, stride, bad_token; const char *expect; } cases[] = {
        {"empty text", 0, 15, 0, "no tokens"}, {"stride 0", 40, 0, 0, "--stride"},
        {"stride above ctx - 1", 40, 16, 0, "--stride"}, {"token outside the vocabulary", 40, 15, 1, "vocabulary"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ids[30] = cases[c].bad_token ? 50 : 30;
        err[0] = '\0';
        int rc = ppl_score(&t, ids, cases[c].n_ids, 1, cases[c].stride, &score, NULL, NULL, err, sizeof err);
        CHECK(rc == -1 && strstr(err, cases[c].expect) && !strchr(err, '\n') && !score.pos_sum,
              "ppl_score, %s: expected -1 and \"%s\", got %d \"%s\"", cases[c].name, cases[c].expect, rc, err);
    }
    ids[30] = 30;
    int rc = ppl_score(&t, ids, 40, 1, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && score.n_scored == 40 && score.n_windows == 4, "ppl_score of 40 tokens, ctx 16, stride 10: "
          "rc %d, %ld scored in %d windows (expected 40 in 4)", rc, score.n_scored, score.n_windows);
    free_ppl_score(&score);
    // Without BOS: spans of 16 tokens from 0, 10, 20, 30 (the last ends the text); the first token is
    // context only, and a window's first token was scored by the one before, so 39 scored.
    rc = ppl_score(&t, ids, 40, 0, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && score.n_scored == 39 && score.n_windows == 4 && score.pos_count[0] == 0 &&
              score.pos_count[1] == 1 && score.pos_count[15] == 3,
          "ppl_score without BOS, 40 tokens, ctx 16, stride 10: rc %d, %ld scored in %d windows (expected 39 in 4)",
          rc, score.n_scored, score.n_windows);
    free_ppl_score(&score);
    rc = ppl_score(&t, ids, 1, 0, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "no tokens"), "ppl_score without BOS of one token: %d \"%s\"", rc, err);
    free_transformer(&t);
    remove(path);
}

/* Attention sinks' cache map (docs/rope.md §13), checked by its properties
 * rather than by its formula: for every position, the slots in use get the
 * places 0..n-1 once each; the S sinks keep slot = place; the token just
 * written is at the newest place; a token keeps its slot while it stays, and
 * each step moves every other non-sink token one place older. */
static void test_cache_map(void) {
    Transformer t;
    memset(&t, 0, sizeof t);
    const int sinks[] = {0, 1, 3, 9};
    for (size_t k = 0; k < sizeof sinks / sizeof sinks[0]; k++) {
        t.n_ctx = 10, t.pos.n_sinks = sinks[k], t.keys = KEYS_SINKS;
        int S = sinks[k], ok = 1, prev_place[10];
        for (int pos = 0; pos < 60 && ok; pos++) {
            int n = pos < t.n_ctx ? pos + 1 : t.n_ctx, seen[10] = {0}, slot = cache_slot(&t, pos);
            ok = slot >= 0 && slot < t.n_ctx && (pos >= t.n_ctx || slot == pos);
            ok = ok && cache_place(&t, slot, pos) == n - 1; // the newest token
            for (int p = 0; p < n && ok; p++) {
                int place = cache_place(&t, p, pos);
                ok = place >= 0 && place < n && !seen[place]++;
                if (p < S || pos < t.n_ctx) ok = ok && place == p;
                else if (p != slot) ok = ok && place == prev_place[p] - 1; // one step older
            }
            for (int p = 0; p < n; p++) prev_place[p] = cache_place(&t, p, pos);
            CHECK(ok, "cache map, %d sinks, position %d: slot %d", S, pos, slot);
        }
    }
    t.keys = KEYS_ROTATED_ONCE; // no sinks: slot and place are the position
    CHECK(cache_slot(&t, 7) == 7 && cache_place(&t, 7, 7) == 7, "cache map without sinks");
}

/* Passkey: filler sentences (white space runs made one space, cut after
 * ".", "!" or "?" before a space), the prompt's layout, and the answer (the
 * first run of digits). docs/passkey.md is the specification. */
static void test_passkey_text(void) {
    const char text[] = "  One.  Two!\n\nThree?\tMr. Smith said \"hi.\" Four 2.5 five. end";
    const char *want[] = {"One.", "Two!", "Three?", "Mr.", "Smith said \"hi.\" Four 2.5 five.", "end"};
    Sentences f;
    split_sentences(&f, text, strlen(text));
    int ok = f.n == 6;
    for (int i = 0; ok && i < 6; i++) ok = strlen(want[i]) == f.len[i] && !memcmp(f.s[i], want[i], f.len[i]);
    CHECK(ok, "split_sentences: %d sentences, first \"%s\"", f.n, f.n ? f.s[0] : "");
    size_t len;
    char *p = passkey_prompt(&f, 4, 3, 1, "123", &len);
    const char *expect = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                         "them. I will quiz you about the important information there. Smith said \"hi.\" Four 2.5 "
                         "five. The pass key is 123. Remember it. 123 is the pass key. end One. What is the pass "
                         "key? The pass key is";
    CHECK(len == strlen(expect) && !strcmp(p, expect), "passkey_prompt (start 4, 3 sentences, key after 1): %s", p);
    free(p);
    p = passkey_prompt(&f, 0, 2, 2, "7", &len); // the key after the last sentence
    CHECK(strstr(p, "there. One. Two! The pass key is 7. Remember it. 7 is the pass key. What is") != NULL,
          "passkey_prompt (key last): %s", p);
    free(p);
    free_sentences(&f);
    split_sentences(&f, " \n\t ", 4);
    CHECK(f.n == 0, "split_sentences of white space: %d sentences", f.n);
    free_sentences(&f);
    struct { const char *text, *answer; } answers[] = {
        {" 12345.", "12345"}, {" is 123 or 456", "123"}, {"no digits", ""}, {"", ""}, {"x0042y", "0042"},
    };
    for (size_t k = 0; k < sizeof answers / sizeof answers[0]; k++) {
        size_t n;
        const char *a = passkey_answer(answers[k].text, &n);
        CHECK(n == strlen(answers[k].answer) && !memcmp(a, answers[k].answer, n), "passkey_answer(\"%s\"): \"%.*s\"",
              answers[k].text, (int)n, a);
    }
    struct { const char *text, *key; int correct; } scores[] = {
        {" 12345.", "12345", 1}, {" 12345", "12345", 1}, {" 123456.", "12345", 0}, {" 1234.", "12345", 0},
        {" is 12345 or 9", "12345", 1}, {" 9 or 12345", "12345", 0}, {"", "1", 0}, {"x1y", "1", 1},
    };
    for (size_t k = 0; k < sizeof scores / sizeof scores[0]; k++)
        CHECK(passkey_correct(scores[k].text, scores[k].key) == scores[k].correct, "passkey_correct(\"%s\", %s)",
              scores[k].text, scores[k].key);
}

int main(void) {
    test_rope_worked_example();
    test_rope_properties();
    test_rope_scaling_vectors();
    test_rope_table_precision();
    test_attn_factor_applied_once();
    test_ops();
    test_sampler();
    test_loader();
    test_matmul_kernels();
    test_attention_scores();
    test_exp_fast();
    test_attention_block();
    test_attention_block_self_extend();
    test_half();
    test_block_prefill();
    test_ppl_score_arguments();
    test_passkey_text();
    test_cache_map();
    printf("run: %d passed, %d failed (%s)\n", n_pass, n_fail,
           !HAVE_SIMD ? "SIMD kernels not built: portable kernels only"
           : SIMD_FLOATS == 16 ? "AVX-512 kernels compared with the portable ones"
#if defined(__AVXVNNI__)
                               : "AVX2 kernels (with AVX-VNNI) compared with the portable ones");
#else
                               : "AVX2 kernels compared with the portable ones");
#endif
    return n_fail ? 1 : 0;
}
