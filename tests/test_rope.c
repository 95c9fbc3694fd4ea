/* test_rope.c: RoPE: docs/rope.md's worked example and vectors for each
 * scaling method, the properties every rotation must have (norm kept, scores
 * that depend on relative position only, the two layouts one permutation
 * apart, partial rotary), the cos/sin table against double precision, and
 * YaRN's attention factor applied once. Part of test_run (test_run.c).
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
#include "check.h"

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

void test_rope_worked_example(void) {
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

void test_rope_properties(void) {
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
void test_rope_scaling_vectors(void) {
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
void test_rope_table_precision(void) {
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
void test_attn_factor_applied_once(void) {
    RopeConfig r = rope_cfg(8, 1e4, ROPE_YARN, 4, 256);
    float q[8] = {1, 0, 0, 0, 0, 0, 0, 0}, k[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    rotate_at(q, 8, &r, 0, ROPE_INTERLEAVED);
    rotate_at(k, 8, &r, 0, ROPE_INTERLEAVED);
    double ms = 0.1 * log(4.0) + 1;
    CHECK(close_to(dot64(q, k, 8), ms * ms, 1e-6), "yarn q.k at pos 0: expected mscale^2 = %.7f, got %.7f", ms * ms,
          dot64(q, k, 8));
}
