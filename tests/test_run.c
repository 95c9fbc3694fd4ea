/* test_run.c: main of the unit tests for run.c and the files built with it,
 * and the helpers the test files share (declared in check.h).
 *
 * Build (make test-c): the sources compiled with -DTESTING, which leaves
 * run.c's main out, and linked with this file and the test files of
 * TEST_RUN_C in the Makefile, one subject each:
 *   test_rope.c      RoPE: the worked example, frequencies of every scaling
 *                    method, the cos/sin table, both layouts
 *   test_kernels.c   matmul kernels (float32, q8_0), attention kernels,
 *                    exp_fast, half conversions
 *   test_forward.c   ops (rmsnorm, matmul, softmax, SwiGLU, GQA, token NLL,
 *                    perplexity buckets), block prefill against token by
 *                    token (every key strategy), the attention sinks' cache map
 *   test_sampler.c   the sampler
 *   test_loader.c    the checkpoint loader's rejections
 *   test_modes.c     ppl_score's arguments, the passkey prompt and answers
 * They call what run.h, ppl.h and passkey.h declare. Each check prints a line
 * on failure with the expected and actual values; the last line is
 * "run: N passed, N failed" and the exit status is 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

int n_pass, n_fail;

int close_to(double a, double b, double tol) { return fabs(a - b) <= tol; }

double dot64(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

uint64_t test_rng = 42;
float randn(void) { // Box-Muller on the sampler's xorshift
    float u1 = random_f32(&test_rng) + 1e-7f, u2 = random_f32(&test_rng);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* Fill n floats with N(0, 1) * scale. */
void fill_randn(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = randn() * scale;
}

/* A Transformer with just what attention reads: the head counts, n_ctx, a
 * float32 cache, the scores scratch (one query: n_heads * n_ctx floats) and
 * for a block attention_block's (one thread's attention_block_floats). */
Transformer attention_fixture(int n_heads, int n_kv_heads, int head_size, int n_ctx, float *scores,
                              float *attn_tiles) {
    Transformer t;
    memset(&t, 0, sizeof t);
    t.config.n_heads = n_heads, t.config.n_kv_heads = n_kv_heads, t.config.dim = n_heads * head_size;
    t.n_ctx = n_ctx, t.kv_type = KV_F32, t.state.scores = scores, t.state.attn_tiles = attn_tiles;
    t.state.mm.threads = 1;
    return t;
}

const char *tmp_path(const char *name) {
    static char buf[256];
    const char *dir = getenv("TMPDIR");
    snprintf(buf, sizeof buf, "%s/test_run_%d_%s", dir ? dir : "/tmp", (int)getpid(), name);
    return buf;
}

void put_i32(unsigned char *p, int32_t v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}
void put_f32(unsigned char *p, float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    put_i32(p, i);
}

/* A tiny valid version-1 header: dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 10. */
void good_header(unsigned char *h) {
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

/* Write a random version-1 checkpoint (float32, dims below) to path. */
void write_random_checkpoint(const char *path, int dim, int hidden, int layers, int heads, int kv_heads, int vocab,
                             int seq_len) {
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
    test_generation_rows();
    test_generation_q8_runs();
    test_column_passes();
    test_q8_group_sizes();
    test_q8_rows_and_quantize();
    test_q4();
    test_attention_scores();
    test_exp_fast();
    test_attention_block();
    test_attention_block_self_extend();
    test_attention_block_sinks_and_frames();
    test_half();
    test_kv_q8();
    test_block_prefill();
    test_block_strategies();
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
