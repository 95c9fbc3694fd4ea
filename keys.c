/* keys.c: the long-context key strategies behind run.c's RoPE stage.
 *
 * run.c's rope_stage rotates q and k and caches the keys rotated, once, for
 * every scaling method: strategy (a), the default, whole there. The three
 * strategies that keep keys before RoPE in the cache and rotate them anew for
 * each block live here, each behind one call that rope_stage makes:
 *   (b) per_length_keys   --rope-dynamic exact: every key rotated for the
 *                         current sequence length; a block past L gets a
 *                         frame per query (rope_prepare, build_frames)
 *   (c) self_extend_keys  --self-extend G W: far keys at their group positions
 *                         against a second query
 *   (d) sinks_keys        --sinks n: a rolling cache (cache_slot, cache_place);
 *                         a block in one frame of distances (sinks_block)
 * Each returns the CacheView attention reads, so that forward_block and
 * attention read the same whichever strategy runs. docs/rope.md §10, §11 and
 * §13 are the specification; keys.h declares what run.c and the tests use.
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <string.h>

#include "keys.h"

/* ---- Tables and the rolling cache ---------------------------------------- */

/* The length a table is built for, for a sequence of length S: L while S <= L;
 * past it dynamic NTK needs S itself, LongRoPE only "longer than L" (L + 1). */
static int rope_table_length(const RopeConfig *r, int S) {
    int L = r->orig_ctx;
    if (S <= L) return L;
    return r->scaling == ROPE_LONGROPE ? L + 1 : S;
}

/* The exact variant: before the token at pos, make the rows up to pos right
 * for the current length S = pos + 1 (back to the short-sequence rows when
 * S <= L: a new sequence started). Dynamic NTK rebuilds rows 0..pos for every
 * new length (later rows are rebuilt before they are used); LongRoPE rebuilds
 * the whole table when the sequence crosses L, in either direction. */
static void rope_sync_length(Transformer *t, int pos) {
    if (!rope_length_dependent(&t->rope) || !t->pos.dynamic_exact) return;
    int S = rope_table_length(&t->rope, pos + 1);
    if (S == t->table_len) return;
    int whole = S == t->rope.orig_ctx || t->rope.scaling == ROPE_LONGROPE;
    rope_build_rows(t, S, 0, whole ? t->n_ctx : pos + 1);
    t->table_len = S;
}

/* Attention sinks (--sinks n_sinks, StreamingLLM; docs/rope.md §13): the
 * cache holds n_ctx tokens. Once it is full, the token at position pos >=
 * n_ctx takes the slot of the oldest token after the n_sinks sinks,
 *   slot(pos)  = n_sinks + (pos - n_sinks) mod R,   R = n_ctx - n_sinks,
 * and positions become places in the cache: the newest token is at n_ctx - 1
 * and the one in slot j at
 *   place(j)   = j                                  (j < n_sinks: a sink)
 *              = n_ctx - 1 - (slot(pos) - j) mod R  (the rest, oldest first).
 * Before the cache is full (and without sinks) slot and place are pos. */
int cache_slot(const Transformer *t, int pos) {
    int n_sinks = t->pos.n_sinks, R = t->n_ctx - n_sinks;
    return t->keys != KEYS_SINKS || pos < t->n_ctx ? pos : n_sinks + (pos - n_sinks) % R;
}

int cache_place(const Transformer *t, int slot, int pos) {
    int n_sinks = t->pos.n_sinks, R = t->n_ctx - n_sinks;
    if (t->keys != KEYS_SINKS || pos < t->n_ctx || slot < n_sinks) return slot;
    return t->n_ctx - 1 - ((cache_slot(t, pos) - slot) % R + R) % R;
}

/* ---- Keys before RoPE --------------------------------------------------- */

/* Self-Extend: how many cached keys the query at position `last` reads at
 * their group positions: the keys W or more tokens back, 0..last-W. */
static int grouped_keys(const Transformer *t, int last) {
    int W = t->pos.se_window;
    return t->keys == KEYS_SELF_EXTEND && last >= W ? last - W + 1 : 0;
}

/* Keys before RoPE in the cache: rotate the cached keys the queries at
 * positions pos .. pos+B-1 read (slots 0..pos+B-1, or the whole cache once
 * sinks have wrapped it) into key_rot at their own positions (their places,
 * with sinks), and with Self-Extend into key_grouped at their group positions
 * floor(j / G) (j: the key's position). One query (B = 1) reads each key one
 * way only (grouped when it lies W or more positions back), so only that
 * rotation is made; a block makes both for every key, since
 * attention_block's tiles across the line compute both scores for all their
 * keys (and keep one).
 * keys: one layer's (n_ctx, kv_dim) of t->kv_type; key_rot, key_grouped:
 * (n_ctx, kv_dim) float32. */
void rotate_cached_keys(float *key_rot, float *key_grouped, const void *keys, int pos, int B, const Transformer *t) {
    const Config *c = &t->config;
    int head_size = c->dim / c->n_heads, kv_dim = head_size * c->n_kv_heads, n_pairs = t->rope.rot_dim / 2;
    int last = pos + B - 1, n = last < t->n_ctx ? last + 1 : t->n_ctx, G = t->pos.se_group, i;
    int n_grouped = grouped_keys(t, last);
    // keys first_own..n-1 at their own positions, keys 0..end_grouped-1 at their group positions
    int first_own = B == 1 ? n_grouped : 0, end_grouped = B == 1 || !n_grouped ? n_grouped : n;
#pragma omp parallel for private(i) if ((long)n * kv_dim >= PARALLEL_MIN_WORK)
    for (i = 0; i < n; i++)
        for (int grouped = 0; grouped < 2; grouped++) {
            if (grouped ? i >= end_grouped : i < first_own) continue;
            int key_pos = grouped ? i / G : cache_place(t, i, last);
            float *k = (grouped ? key_grouped : key_rot) + (size_t)i * kv_dim;
            kv_load(k, keys, t->kv_type, (size_t)i * kv_dim, kv_dim);
            rope(k, t->state.rope_cos + (size_t)key_pos * n_pairs, t->state.rope_sin + (size_t)key_pos * n_pairs, 1,
                 c->n_kv_heads, head_size, t->rope.rot_dim, t->rope.layout);
        }
}

/* Write rows src[0..B) (kv_dim values each) of the tokens at pos0.. into
 * their slots of one layer's cache: the positions, or in the rolling cache of
 * sinks cache_slot's slots (consecutive, but where the rolling part wraps
 * around; a block longer than it leaves the last tokens there). */
void cache_store(const Transformer *t, void *cache, int pos0, int B, const float *src) {
    int kv_dim = t->config.dim / t->config.n_heads * t->config.n_kv_heads;
    for (int b = 0, run; b < B; b += run) {
        int slot = cache_slot(t, pos0 + b);
        for (run = 1; b + run < B && cache_slot(t, pos0 + b + run) == slot + run; run++) {}
        kv_store(cache, t->kv_type, (size_t)slot * kv_dim, src + (size_t)b * kv_dim, run * kv_dim);
    }
}

/* (b): whether the queries at positions pos0 .. pos0+B-1 share one table:
 * their lengths pos + 1 give one rope_table_length (all within L, or with
 * LongRoPE all past it; past L dynamic NTK gives every length its own). */
static int block_shares_table(const Transformer *t, int pos0, int B) {
    return rope_table_length(&t->rope, pos0 + 1) == rope_table_length(&t->rope, pos0 + B);
}

/* (b), a block whose queries do not share a table: for each query, the rows
 * of the table of its own length that attention_block's frames need
 * (kernels.h's QueryFrames): the fine rows 0..ATT_KEYS-1, pair-major, and the
 * coarse rows pos - ATT_KEYS u (row u of every query side by side), each made
 * as rope_fill_table makes a table row. Once per block (every layer reads
 * them); ATT_KEYS + pos / ATT_KEYS + 1 rows a query where the token path
 * rebuilds pos + 1. */
static void build_frames(Transformer *t, int pos0, int B) {
    RunState *st = &t->state;
    QueryFrames *f = &st->frames;
    int n_pairs = t->rope.rot_dim / 2, b;
    // in parallel from a few thousand sines and cosines (each costs tens of multiply-adds) on
#pragma omp parallel for private(b) if ((long)B * n_pairs * ATT_KEYS >= 4096)
    for (b = 0; b < B; b++) {
        int pos = pos0 + b;
        double *inv_freq = st->frame_freq + (size_t)b * n_pairs, mscale;
        rope_frequencies(&t->rope, pos + 1, inv_freq, &mscale); // the frequencies of length pos + 1
        float *fine_cos = (float *)f->fine_cos + (size_t)b * n_pairs * ATT_KEYS;
        float *fine_sin = (float *)f->fine_sin + (size_t)b * n_pairs * ATT_KEYS;
        for (int i = 0; i < n_pairs; i++) // pair i's rows 0..ATT_KEYS-1 side by side
            rope_fill_table(fine_cos + (size_t)i * ATT_KEYS, fine_sin + (size_t)i * ATT_KEYS, 0, ATT_KEYS,
                            inv_freq + i, 1, mscale);
        for (int u = 0; u * ATT_KEYS <= pos; u++) {
            size_t at = ((size_t)u * f->block + b) * n_pairs;
            rope_fill_table((float *)f->coarse_cos + at, (float *)f->coarse_sin + at, pos - u * ATT_KEYS, 1,
                            inv_freq, n_pairs, mscale);
        }
    }
}

/* What the RoPE stage needs once per block, before the layers (forward_block
 * calls it): with (b), the frames of a block whose queries do not share a
 * table. */
void rope_prepare(Transformer *t, int B, int pos0) {
    if (t->keys == KEYS_PER_LENGTH && !block_shares_table(t, pos0, B)) build_frames(t, pos0, B);
}

/* (d) with a block (B > 1) at positions pos0..: the keys its queries see,
 * laid out in one frame in which every key keeps its distance to every
 * query (docs/rope.md §13):
 *   rows 0 .. n_sinks-1: the sinks, at their places (their positions)
 *   rows n_sinks ..:     the other keys, from lo (the oldest the block's first
 *                        query sees) to the block's last: row = position - shift,
 *                        shift = lo - n_sinks
 * Query b sits at row pos0 - shift + b and sees the R = n_ctx - n_sinks rows
 * up to its own (a sliding window of R) and the sinks. A non-sink key's score
 * depends only on the distance between the two rows (one set of frequencies
 * for the whole table: block_limit), and that is the distance between their
 * places in the cache. A sink sits at its place, but a query's place
 * (n_ctx - 1 once the cache is full) is not its row: each query gets a second
 * rotation, at its place, for the sinks (attention_block's second queries).
 * Keys go into key_rot, rotated at their rows, and values into value_rows,
 * float32: the block's own from st->k and st->v, rounded as the cache rounds
 * them (kv_round: the values one token at a time reads), the older ones from
 * their slots, before the block's tokens take their slots (where they evict
 * keys its first queries still see). Rotates st->q at its rows and copies it into
 * q_second at the places. */
static CacheView sinks_block(Transformer *t, void *key_cache, void *value_cache, int B, int pos0) {
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    RunState *st = &t->state;
    int head_size = c->dim / c->n_heads, kv_dim = head_size * c->n_kv_heads, n_pairs = r->rot_dim / 2;
    int n_sinks = t->pos.n_sinks, R = t->n_ctx - n_sinks;
    int lo = pos0 - R + 1 > n_sinks ? pos0 - R + 1 : n_sinks, shift = lo - n_sinks, n_rows = pos0 + B - shift, row;
#pragma omp parallel for private(row) if ((long)n_rows * kv_dim >= PARALLEL_MIN_WORK)
    for (row = 0; row < n_rows; row++) {
        int pos = row < n_sinks ? row : row + shift; // the key's position in the text
        float *k = st->key_rot + (size_t)row * kv_dim, *v = st->value_rows + (size_t)row * kv_dim;
        if (pos >= pos0) { // one of the block's, as the cache will hold it (what one token reads)
            memcpy(k, st->k + (size_t)(pos - pos0) * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(v, st->v + (size_t)(pos - pos0) * kv_dim, (size_t)kv_dim * sizeof(float));
            kv_round(k, t->kv_type, kv_dim);
            kv_round(v, t->kv_type, kv_dim);
        } else {
            size_t at = (size_t)cache_slot(t, pos) * kv_dim;
            kv_load(k, key_cache, t->kv_type, at, kv_dim);
            kv_load(v, value_cache, t->kv_type, at, kv_dim);
        }
        rope(k, st->rope_cos + (size_t)row * n_pairs, st->rope_sin + (size_t)row * n_pairs, 1, c->n_kv_heads,
             head_size, r->rot_dim, r->layout);
    }
    memcpy(st->q_second, st->q, (size_t)B * c->dim * sizeof(float));
    for (int b = 0; b < B; b++) { // the second rotation: at the query's place, for the sinks
        size_t place = (size_t)cache_place(t, cache_slot(t, pos0 + b), pos0 + b) * n_pairs;
        rope(st->q_second + (size_t)b * c->dim, st->rope_cos + place, st->rope_sin + place, 1, c->n_heads,
             head_size, r->rot_dim, r->layout);
    }
    size_t first = (size_t)(pos0 - shift) * n_pairs; // the block's rows
    rope(st->q, st->rope_cos + first, st->rope_sin + first, B, c->n_heads, head_size, r->rot_dim, r->layout);
    cache_store(t, key_cache, pos0, B, st->k);
    cache_store(t, value_cache, pos0, B, st->v);
    return (CacheView){st->key_rot, KV_F32, st->value_rows, KV_F32, pos0 - shift, R,
                       {st->q_second, st->key_rot, 0, n_sinks}, NULL};
}

/* ---- The three strategies, as rope_stage calls them ---------------------- */

/* (b), (c), (d): store the block's keys and values before RoPE at their slots,
 * and the view of the cache at the block's first place (its position, or
 * with sinks its place in the rolling cache). */
static CacheView store_unrotated(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window) {
    cache_store(t, key_cache, pos0, B, t->state.k);
    cache_store(t, value_cache, pos0, B, t->state.v);
    int place = cache_place(t, cache_slot(t, pos0), pos0); // pos0, unless sinks wrapped the cache
    return (CacheView){key_cache, t->kv_type, value_cache, t->kv_type, place, window, {NULL, NULL, 0, 0}, NULL};
}

/* (b), (c), (d) for queries that share one table: make the table's rows right
 * for the block's length (b), rotate q at the rows of its places, and every
 * cached key it reads for this block (rotate_cached_keys); the view then
 * reads the rotated keys, float32. */
static void rotate_for_block(Transformer *t, CacheView *view, const void *key_cache, int B, int pos0) {
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    RunState *st = &t->state;
    int head_size = c->dim / c->n_heads, n_pairs = r->rot_dim / 2;
    rope_sync_length(t, view->pos0 + B - 1);
    size_t first = (size_t)view->pos0 * n_pairs; // (B, n_pairs): the rows of the B places
    rope(st->q, st->rope_cos + first, st->rope_sin + first, B, c->n_heads, head_size, r->rot_dim, r->layout);
    rotate_cached_keys(st->key_rot, st->key_grouped, key_cache, pos0, B, t);
    view->keys = st->key_rot, view->key_type = KV_F32;
}

/* (b) KEYS_PER_LENGTH: keys before RoPE; queries that share a table rotate
 * every key for their length; a block that does not leaves q and the keys
 * unrotated, and attention rotates them per query from the frames that
 * rope_prepare built. */
CacheView per_length_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window) {
    CacheView view = store_unrotated(t, key_cache, value_cache, B, pos0, window);
    if (!block_shares_table(t, pos0, B)) {
        view.frames = &t->state.frames;
        return view;
    }
    rotate_for_block(t, &view, key_cache, B, pos0);
    return view;
}

/* (c) KEYS_SELF_EXTEND: when some key lies W or more tokens before the last
 * query, a copy of the queries rotated at their group positions
 * floor(pos/G) + W - floor(W/G) (q_second), scored against those keys at
 * theirs (key_grouped); then every key as (b). The table never changes
 * under Self-Extend (check_positions refuses it with dynamic NTK and
 * LongRoPE), so the group rows are read before rotate_for_block's sync. */
CacheView self_extend_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window) {
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    RunState *st = &t->state;
    int head_size = c->dim / c->n_heads, n_pairs = r->rot_dim / 2;
    CacheView view = store_unrotated(t, key_cache, value_cache, B, pos0, window);
    if (grouped_keys(t, pos0 + B - 1)) {
        int G = t->pos.se_group, W = t->pos.se_window;
        memcpy(st->q_second, st->q, (size_t)B * c->dim * sizeof(float));
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)((pos0 + b) / G + W - W / G) * n_pairs;
            rope(st->q_second + (size_t)b * c->dim, st->rope_cos + row, st->rope_sin + row, 1, c->n_heads,
                 head_size, r->rot_dim, r->layout);
        }
        view.second = (SecondQueries){st->q_second, st->key_grouped, W, 0};
    }
    rotate_for_block(t, &view, key_cache, B, pos0);
    return view;
}

/* (d) KEYS_SINKS: one query reads every cached key rotated at its place in
 * the rolling cache; a block goes through sinks_block's frame of distances. */
CacheView sinks_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window) {
    if (B > 1) return sinks_block(t, key_cache, value_cache, B, pos0);
    CacheView view = store_unrotated(t, key_cache, value_cache, B, pos0, window);
    rotate_for_block(t, &view, key_cache, B, pos0);
    return view;
}
