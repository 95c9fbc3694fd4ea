/* attn_stats.c: attention statistics for -m ppl --attn-stats FILE: the
 * quantity the RoPE scaling methods are designed around (YaRN's attention
 * factor exists because the entropy of attention grows past the training
 * length). attn_stats.h says what is measured; docs/long-context.md gives the
 * JSON layout.
 *
 * The flow: ppl.c builds the statistics, hangs them on the run state
 * (RunState.attn_stats, which makes block_limit 1), and before each token
 * says whether its query is scored (attn_stats_count); forward_block calls
 * attn_stats_add after each layer's attention with the one query's weights;
 * ppl.c writes the JSON at the end (attn_stats_write).
 */
#define _POSIX_C_SOURCE 200809L /* model.h's read_file: fdopen */
#include <math.h>
#include <stdlib.h>

#include "attn_stats.h"
#include "modes.h"

AttnStats *attn_stats_new(const Transformer *t, int n_positions) {
    const Config *c = &t->config;
    size_t heads = (size_t)c->n_layers * c->n_heads;
    AttnStats *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->counting = 1;
    s->n_pos = ppl_buckets(s->pos, t->rope.orig_ctx, n_positions);
    s->n_dist = ppl_buckets(s->dist, t->rope.orig_ctx, t->n_ctx); // a key is at most n_ctx - 1 tokens back
    s->key_bucket = malloc((size_t)t->n_ctx * sizeof(int));
    s->entropy = calloc(heads * s->n_pos, sizeof(double));
    s->mass = calloc(heads * s->n_dist, sizeof(double));
    s->sink_mass = calloc(heads, sizeof(double));
    if (!s->key_bucket || !s->entropy || !s->mass || !s->sink_mass) {
        attn_stats_free(s);
        return NULL;
    }
    return s;
}

void attn_stats_free(AttnStats *s) {
    if (!s) return;
    free(s->key_bucket);
    free(s->entropy);
    free(s->mass);
    free(s->sink_mass);
    free(s);
}

void attn_stats_count(AttnStats *s, int counting) { s->counting = counting; }

/* The bucket of buckets[0..n) that holds x; -1 when none does. */
static int bucket_of(const Bucket *buckets, int n, int x) {
    for (int k = 0; k < n; k++)
        if (x >= buckets[k].start && x < buckets[k].end) return k;
    return -1;
}

/* Start the query at position pos: count it in its position bucket, and give
 * every cache slot it reads its distance bucket. A key's distance is q - j,
 * its position's distance from the query's in tokens; the cache's places
 * (cache_place) give it for every key strategy: slot j's place is j, except
 * in the rolling cache of sinks, where a key's place is as far from the
 * newest place as its token is from the query's. The sinks themselves (slots
 * below n_sinks) are marked -1. Both bucket lists cover every position and
 * distance the run reaches (attn_stats_new), so each lookup finds one. */
static void start_query(AttnStats *s, int pos) {
    const Transformer *t = s->t;
    int slot = cache_slot(t, pos), place = cache_place(t, slot, pos);
    int n_sinks = t->keys == KEYS_SINKS ? t->pos.n_sinks : 0;
    s->n_keys = place + 1;
    s->query_bucket = bucket_of(s->pos, s->n_pos, pos);
    s->pos[s->query_bucket].tokens++;
    s->n_queries++;
    for (int j = 0; j < s->n_keys; j++)
        s->key_bucket[j] = j < n_sinks ? -1 : bucket_of(s->dist, s->n_dist, place - cache_place(t, j, pos));
}

void attn_stats_add(AttnStats *s, int layer, int pos, const float *weights) {
    if (!s->counting) return;
    if (layer == 0) start_query(s, pos);
    const Config *c = &s->t->config;
    int n_ctx = s->t->n_ctx, h;
    // one head per thread, each writing only its own sums; a log per key
#pragma omp parallel for private(h) if ((long)c->n_heads * s->n_keys >= PARALLEL_MIN_WORK)
    for (h = 0; h < c->n_heads; h++) {
        size_t lh = (size_t)layer * c->n_heads + h; // this layer's head h
        const float *p = weights + (size_t)h * n_ctx;
        double H = 0, sinks = 0, *mass = s->mass + lh * s->n_dist;
        for (int j = 0; j < s->n_keys; j++) {
            if (p[j] <= 0.0f) continue; // a key the window leaves out, or a weight that underflowed: 0 ln 0 = 0
            H -= p[j] * log((double)p[j]);
            if (s->key_bucket[j] < 0) sinks += p[j];
            else mass[s->key_bucket[j]] += p[j];
        }
        s->entropy[lh * s->n_pos + s->query_bucket] += H;
        s->sink_mass[lh] += sinks;
    }
}

/* ---- The JSON file --------------------------------------------------------- */

/* v with 9 significant digits, or null when it is not finite. */
static void json_number(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* sum[layer][head][k] / count(k) as [[[k...] per head] per layer], with
 * count(k) the queries of position bucket k (buckets given: a bucket no
 * query fell in is left out), else n_all for every k. */
static void json_per_head(FILE *f, const AttnStats *s, const double *sum, int n, const Bucket *buckets, long n_all) {
    const Config *c = &s->t->config;
    fputc('[', f);
    for (int l = 0; l < c->n_layers; l++) {
        fputs(l ? ", [" : "[", f);
        for (int h = 0; h < c->n_heads; h++) {
            fputs(h ? ", [" : "[", f);
            const double *row = sum + ((size_t)l * c->n_heads + h) * n;
            int first = 1;
            for (int k = 0; k < n; k++) {
                long count = buckets ? buckets[k].tokens : n_all;
                if (buckets && !count) continue;
                if (!first) fputs(", ", f);
                json_number(f, row[k] / count);
                first = 0;
            }
            fputc(']', f);
        }
        fputc(']', f);
    }
    fputc(']', f);
}

/* The mass on the sink keys, per query, as [[head...] per layer]. */
static void json_sink_mass(FILE *f, const AttnStats *s) {
    const Config *c = &s->t->config;
    fputc('[', f);
    for (int l = 0; l < c->n_layers; l++) {
        fputs(l ? ", [" : "[", f);
        for (int h = 0; h < c->n_heads; h++) {
            if (h) fputs(", ", f);
            json_number(f, s->sink_mass[(size_t)l * c->n_heads + h] / s->n_queries);
        }
        fputc(']', f);
    }
    fputc(']', f);
}

int attn_stats_write(const AttnStats *s, FILE *f, const char *text, int stride) {
    const Transformer *t = s->t;
    const Config *c = &t->config;
    const PositionSettings *p = &t->pos;
    fputs("{\"file\": ", f);
    json_string(f, text);
    fprintf(f, ", \"ctx\": %d, \"orig_ctx\": %d, \"scaling\": \"%s\", \"rope_factor\": ", t->n_ctx, t->rope.orig_ctx,
            SCALING_NAMES[t->rope.scaling]);
    json_number(f, t->rope.factor);
    fputs(", \"attn_factor\": ", f);
    json_number(f, rope_magnitude(t));
    fprintf(f, ", \"keys\": \"%s\", \"kv\": \"%s\", \"window\": %d, \"window_first_layer\": %d, \"sinks\": ",
            KEY_NAMES[t->keys], KV_NAMES[t->kv_type], p->window, p->window > 0 ? p->window_first_layer : 0);
    if (t->keys == KEYS_SINKS) fprintf(f, "%d", p->n_sinks);
    else fputs("null", f);
    fputs(", \"self_extend\": ", f);
    if (p->se_group > 0) fprintf(f, "[%d, %d]", p->se_group, p->se_window);
    else fputs("null", f);
    fprintf(f, ", \"streaming\": %s, \"stride\": %d, \"layers\": %d, \"heads\": %d, \"queries\": %ld",
            stride ? "false" : "true", stride, c->n_layers, c->n_heads, s->n_queries);
    fputs(", \"position_buckets\": [", f);
    int first = 1;
    for (int k = 0; k < s->n_pos; k++) {
        if (!s->pos[k].tokens) continue;
        fprintf(f, "%s{\"start\": %d, \"end\": %d, \"queries\": %ld}", first ? "" : ", ", s->pos[k].start,
                s->pos[k].end, s->pos[k].tokens);
        first = 0;
    }
    fputs("], \"distance_buckets\": [", f);
    for (int k = 0; k < s->n_dist; k++)
        fprintf(f, "%s{\"start\": %d, \"end\": %d}", k ? ", " : "", s->dist[k].start, s->dist[k].end);
    fputs("], \"entropy\": ", f);
    json_per_head(f, s, s->entropy, s->n_pos, s->pos, 0);
    fputs(", \"mass\": ", f);
    json_per_head(f, s, s->mass, s->n_dist, NULL, s->n_queries);
    if (t->keys == KEYS_SINKS) {
        fputs(", \"sink_mass\": ", f);
        json_sink_mass(f, s);
    }
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}
