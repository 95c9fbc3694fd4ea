/* test_forward.c: the forward pass's pieces: the ops (rmsnorm, matmul,
 * softmax, SwiGLU, GQA's head grouping, perplexity buckets, token_nll against
 * double), prefill in blocks against token by token (float32 and f16 caches,
 * Self-Extend), and the key strategies that have a token path (attention
 * sinks, exact dynamic NTK) in blocks against it, on a random checkpoint;
 * the attention sinks' cache map.
 * Part of test_run (test_run.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "keys.h"
#include "ppl.h"

void test_ops(void) {
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, out[4];
    rmsnorm(out, x, w, 1, 4, 0.0f);
    double rms = sqrt((1 + 4 + 9 + 16) / 4.0);
    CHECK(close_to(out[2], 2 * 3 / rms, 1e-6) && close_to(out[3], 0.5 * 4 / rms, 1e-6), "rmsnorm: %g %g", out[2],
          out[3]);
    float m[6] = {1, 2, 3, 4, 5, 6}, v[3] = {1, 0, -1}, mo[2];
    matmul(mo, v, (Matrix){WEIGHT_F32, 0, m, NULL, NULL, NULL}, 1, 3, 2, NULL); // (1,3) @ (2,3)^T -> (1,2)
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
    attention(o, q, &(CacheView){.keys = keys, .key_type = KV_F32, .values = values, .value_type = KV_F32}, 1, &t);
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

/* Prefill in blocks equals token-by-token, and an f16 KV cache stays close.
 * Tolerances: blocks and single tokens sum each matmul output in a different
 * order (the tile kernel against generation's one-row kernel), so the logits
 * agree to float rounding: 1e-4 absolute on logits of magnitude ~1. f16 keys/values carry a relative error of 2^-11 each;
 * through 2 layers the logits move by about 1e-3; the bound is 2e-2. */
void test_block_prefill(void) {
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

/* The largest logit difference between a stream of n tokens fed through one
 * model in blocks (sizes blocks[0], blocks[1], ... in turn) and through
 * another one token at a time (forward: the token path of every key
 * strategy), both built from path with ov and n_ctx; -1 when a build or a
 * step failed. */
static double blocks_vs_tokens(const char *path, const PositionOverrides *ov, int n_ctx, const int *tokens, int n,
                               const int *blocks, int n_blocks, int *block_limit_out) {
    char err[512];
    Transformer a, b;
    if (build_transformer(&a, path, ov, n_ctx, KV_F32, err, sizeof err) != 0) return -1;
    if (build_transformer(&b, path, ov, n_ctx, KV_F32, err, sizeof err) != 0) {
        free_transformer(&a);
        return -1;
    }
    *block_limit_out = block_limit(&a);
    int V = a.config.vocab_size, ok = 1;
    double worst = 0;
    for (int p0 = 0, k = 0; p0 < n && ok; p0 += blocks[k++ % n_blocks]) {
        int B = n - p0 < blocks[k % n_blocks] ? n - p0 : blocks[k % n_blocks];
        ok = forward_block(&a, tokens + p0, B, p0, LOGITS_ALL) == 0;
        for (int i = 0; i < B && ok; i++) {
            float *one = forward(&b, tokens[p0 + i], p0 + i, NULL);
            ok = one != NULL;
            for (int v = 0; ok && v < V; v++) worst = fmax(worst, fabs(one[v] - a.state.logits[(size_t)i * V + v]));
        }
    }
    free_transformer(&a);
    free_transformer(&b);
    return ok ? worst : -1;
}

/* The key strategies that kept a token path go in blocks too, and agree with
 * it to float rounding: 1e-4 on the logits, as block prefill above (the
 * blocks' matmul and attention kernels sum in other orders; the rotations
 * are the same ones, split otherwise: docs/rope.md §11 and §13).
 *   - Attention sinks (3, and 0: a sliding window by place) in a cache of 24:
 *     a stream of 100 tokens in blocks of 20, 7, 33 (longer than the rolling
 *     part of 21 tokens: it evicts its own first tokens) and 1, so that
 *     blocks start among the sinks, fill the cache, cross the point where it
 *     first rolls, and start past it at every offset of the ring.
 *   - Exact dynamic NTK (factor 2, L = 16) in a context of 64: blocks of 10,
 *     20 and 30 tokens, the first within L (one table for the block), the
 *     others across L and past it (a table per query: frames), with no
 *     window and a window of 7; the block must differ from the hf variant
 *     (whose keys keep their rotation) by more than the tolerance. */
void test_block_strategies(void) {
    const char *path = tmp_path("strategies.bin");
    write_random_checkpoint(path, 64, 96, 2, 4, 2, 50, 64);
    int tokens[100], limit = 0;
    for (int i = 0; i < 100; i++) tokens[i] = (int)(random_u32(&test_rng) % 50);
    int sink_blocks[] = {20, 7, 33, 1};
    for (int sinks = 3; sinks >= 0; sinks -= 3) {
        PositionOverrides ov = {.sinks = {1, sinks}};
        double worst = blocks_vs_tokens(path, &ov, 24, tokens, 100, sink_blocks, 4, &limit);
        CHECK(worst >= 0 && worst < 1e-4 && limit == FORWARD_BLOCK,
              "sinks %d: blocks vs token by token %.3g (expected 0 <= x < 1e-4), block limit %d", sinks, worst, limit);
    }
    int exact_blocks[] = {10, 20, 30};
    for (int window = 0; window <= 7; window += 7) {
        PositionOverrides ov = {.scaling = {1, ROPE_DYNAMIC}, .factor = {1, 2.0}, .orig_ctx = {1, 16},
                                .dynamic_exact = {1, 1}, .window = {window > 0, window}};
        double worst = blocks_vs_tokens(path, &ov, 64, tokens, 60, exact_blocks, 3, &limit);
        CHECK(worst >= 0 && worst < 1e-4 && limit == FORWARD_BLOCK,
              "exact dynamic NTK, window %d: blocks vs token by token %.3g (expected 0 <= x < 1e-4), block limit %d",
              window, worst, limit);
    }
    // the hf variant against the exact one's token path: the exact rotations show
    PositionOverrides hf = {.scaling = {1, ROPE_DYNAMIC}, .factor = {1, 2.0}, .orig_ctx = {1, 16}};
    char err[512];
    Transformer a, b;
    if (build_transformer(&a, path, &hf, 64, KV_F32, err, sizeof err) == 0) {
        PositionOverrides exact = hf;
        exact.dynamic_exact = (IntSetting){1, 1};
        double moved = 0;
        if (build_transformer(&b, path, &exact, 64, KV_F32, err, sizeof err) == 0) {
            CHECK(prefill(&b, tokens, 60, 0, NULL) != NULL, "exact dynamic NTK: prefill of 60 tokens failed");
            float *last = prefill(&a, tokens, 60, 0, NULL);
            for (int v = 0; last && v < 50; v++) moved = fmax(moved, fabs(last[v] - b.state.logits[v]));
            free_transformer(&b);
        }
        CHECK(moved > 1e-3, "exact dynamic NTK vs hf at position 59: %.3g (expected > 1e-3)", moved);
        free_transformer(&a);
    }
    // sinks with dynamic NTK and a cache longer than L: one token at a time (block_limit)
    PositionOverrides long_sinks = {.scaling = {1, ROPE_DYNAMIC}, .factor = {1, 2.0}, .orig_ctx = {1, 16},
                                    .sinks = {1, 2}};
    double worst = blocks_vs_tokens(path, &long_sinks, 24, tokens, 40, (int[]){1}, 1, &limit);
    CHECK(worst >= 0 && worst < 1e-4 && limit == 1, "sinks, dynamic NTK, cache past L: %.3g, block limit %d "
          "(expected 1)", worst, limit);
    remove(path);
}

/* Attention sinks' cache map (docs/rope.md §13), checked by its properties
 * rather than by its formula: for every position, the slots in use get the
 * places 0..n-1 once each; the n_sinks sinks keep slot = place; the token just
 * written is at the newest place; a token keeps its slot while it stays, and
 * each step moves every other non-sink token one place older. */
void test_cache_map(void) {
    Transformer t;
    memset(&t, 0, sizeof t);
    const int sinks[] = {0, 1, 3, 9};
    for (size_t k = 0; k < sizeof sinks / sizeof sinks[0]; k++) {
        t.n_ctx = 10, t.pos.n_sinks = sinks[k], t.keys = KEYS_SINKS;
        int n_sinks = sinks[k], ok = 1, prev_place[10];
        for (int pos = 0; pos < 60 && ok; pos++) {
            int n = pos < t.n_ctx ? pos + 1 : t.n_ctx, seen[10] = {0}, slot = cache_slot(&t, pos);
            ok = slot >= 0 && slot < t.n_ctx && (pos >= t.n_ctx || slot == pos);
            ok = ok && cache_place(&t, slot, pos) == n - 1; // the newest token
            for (int p = 0; p < n && ok; p++) {
                int place = cache_place(&t, p, pos);
                ok = place >= 0 && place < n && !seen[place]++;
                if (p < n_sinks || pos < t.n_ctx) ok = ok && place == p;
                else if (p != slot) ok = ok && place == prev_place[p] - 1; // one step older
            }
            for (int p = 0; p < n; p++) prev_place[p] = cache_place(&t, p, pos);
            CHECK(ok, "cache map, %d sinks, position %d: slot %d", n_sinks, pos, slot);
        }
    }
    t.keys = KEYS_ROTATED_ONCE; // no sinks: slot and place are the position
    CHECK(cache_slot(&t, 7) == 7 && cache_place(&t, 7, 7) == 7, "cache map without sinks");
}
