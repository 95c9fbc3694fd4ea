/* attn_stats.c: attention statistics for -m ppl --attn-stats FILE: the
 * quantity the RoPE scaling methods are designed around (YaRN's attention
 * factor exists because the entropy of attention grows past the training
 * length). attn_stats.h says what is measured; docs/long-context.md gives the
 * JSON layout.
 *
 * The flow: ppl.c builds the statistics, hangs them on the run state
 * (RunState.attn_stats), and before each window says from which position its
 * queries are scored (attn_stats_count); attention hands attention_block the
 * tally (attn_stats_tally), and forward_block calls attn_stats_add after
 * each layer's attention, which sums each counted query's row (made from the
 * one query's weights when B = 1); ppl.c writes the JSON at the end
 * (attn_stats_write).
 */
#define _POSIX_C_SOURCE 200809L /* model.h's read_file: fdopen */
#include <math.h>
#include <stdlib.h>

#include "attn_stats.h"
#include "keys.h"
#include "modes.h"

AttnStats *attn_stats_new(const Transformer *t, int n_positions) {
    const Config *c = &t->config;
    size_t heads = (size_t)c->n_layers * c->n_heads;
    AttnStats *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->n_pos = ppl_buckets(s->pos, t->rope.orig_ctx, n_positions);
    s->n_dist = ppl_buckets(s->dist, t->rope.orig_ctx, t->n_ctx); // a key is at most n_ctx - 1 tokens back
    s->dist_bucket = malloc((size_t)t->n_ctx * sizeof(int));
    s->tally = (AttnTally){s->dist_bucket, t->n_ctx, s->n_dist,
                           malloc((size_t)FORWARD_BLOCK * c->n_heads * (s->n_dist + 2) * sizeof(double))};
    s->entropy = calloc(heads * s->n_pos, sizeof(double));
    s->mass = calloc(heads * s->n_dist, sizeof(double));
    s->sink_mass = calloc(heads * s->n_pos, sizeof(double));
    if (!s->dist_bucket || !s->tally.out || !s->entropy || !s->mass || !s->sink_mass) {
        attn_stats_free(s);
        return NULL;
    }
    for (int k = 0; k < s->n_dist; k++)
        for (int d = s->dist[k].start; d < s->dist[k].end; d++) s->dist_bucket[d] = k;
    return s;
}

void attn_stats_free(AttnStats *s) {
    if (!s) return;
    free(s->dist_bucket);
    free(s->tally.out);
    free(s->entropy);
    free(s->mass);
    free(s->sink_mass);
    free(s);
}

void attn_stats_count(AttnStats *s, int first) { s->count_from = first; }

const AttnTally *attn_stats_tally(const AttnStats *s) { return &s->tally; }

/* The bucket of buckets[0..n) that holds x; -1 when none does. */
static int bucket_of(const Bucket *buckets, int n, int x) {
    for (int k = 0; k < n; k++)
        if (x >= buckets[k].start && x < buckets[k].end) return k;
    return -1;
}

/* One query's tally rows (B = 1), from its weights: p, rows of n_ctx floats
 * per head over the cache slots it reads, 0..place. A key's distance is
 * q - j, its position's distance from the query's in tokens; the cache's
 * places (cache_place) give it for every key strategy: slot j's place is j,
 * except in the rolling cache of sinks, where a key's place is as far from
 * the newest place as its token is from the query's. The sinks themselves
 * (slots below n_sinks) go to the sinks' slot. */
static void rows_from_weights(AttnStats *s, int pos, const float *weights) {
    const Transformer *t = s->t;
    const Config *c = &t->config;
    int slot = cache_slot(t, pos), place = cache_place(t, slot, pos), step = s->n_dist + 2, h;
    int n_sinks = t->keys == KEYS_SINKS ? t->pos.n_sinks : 0;
    // one head per thread, each writing only its own row; a log per key
#pragma omp parallel for private(h) if ((long)c->n_heads * (place + 1) >= PARALLEL_MIN_WORK)
    for (h = 0; h < c->n_heads; h++) {
        const float *p = weights + (size_t)h * t->n_ctx;
        double *row = s->tally.out + (size_t)h * step;
        double sum_plogp = 0, sum_p = 0, sinks = 0;
        for (int k = 1; k <= s->n_dist; k++) row[k] = 0.0;
        for (int j = 0; j <= place; j++) {
            if (p[j] <= 0.0f) continue; // a key the window leaves out, or a weight that underflowed: 0 ln 0 = 0
            sum_plogp += p[j] * log((double)p[j]);
            sum_p += p[j];
            if (j < n_sinks) sinks += p[j];
            else row[1 + s->dist_bucket[place - cache_place(t, j, pos)]] += p[j];
        }
        // the weights renormalized in double (softmax's float sum over thousands of keys is off by
        // about 1e-6): with P = p / sum_p, H = -sum P ln P = ln sum_p - sum p ln p / sum_p
        row[0] = log(sum_p) - sum_plogp / sum_p;
        for (int k = 1; k <= s->n_dist; k++) row[k] /= sum_p;
        row[1 + s->n_dist] = sinks / sum_p;
    }
}

void attn_stats_add(AttnStats *s, int layer, int pos0, int B, const float *weights) {
    const Config *c = &s->t->config;
    int step = s->n_dist + 2;
    if (pos0 + B <= s->count_from) return; // no query of the block is counted
    if (weights) rows_from_weights(s, pos0, weights);
    for (int b = 0; b < B; b++) {
        int pos = pos0 + b, k = bucket_of(s->pos, s->n_pos, pos);
        if (pos < s->count_from) continue;
        if (layer == 0) s->pos[k].tokens++, s->n_queries++;
        for (int h = 0; h < c->n_heads; h++) {
            size_t lh = (size_t)layer * c->n_heads + h; // this layer's head h
            const double *row = s->tally.out + ((size_t)b * c->n_heads + h) * step;
            s->entropy[lh * s->n_pos + k] += row[0];
            for (int d = 0; d < s->n_dist; d++) s->mass[lh * s->n_dist + d] += row[1 + d];
            s->sink_mass[lh * s->n_pos + k] += row[1 + s->n_dist];
        }
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

/* The mass on the sink keys, per query, as [[head...] per layer]: the sums
 * of every position bucket over all the queries counted. */
static void json_sink_mass(FILE *f, const AttnStats *s) {
    const Config *c = &s->t->config;
    fputc('[', f);
    for (int l = 0; l < c->n_layers; l++) {
        fputs(l ? ", [" : "[", f);
        for (int h = 0; h < c->n_heads; h++) {
            const double *by_pos = s->sink_mass + ((size_t)l * c->n_heads + h) * s->n_pos;
            double sum = 0;
            for (int k = 0; k < s->n_pos; k++) sum += by_pos[k];
            if (h) fputs(", ", f);
            json_number(f, sum / s->n_queries);
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
        fputs(", \"sink_mass_by_position\": ", f);
        json_per_head(f, s, s->sink_mass, s->n_pos, s->pos, 0);
    }
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}
