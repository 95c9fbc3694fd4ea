/* attn_stats.h: attention statistics (-m ppl --attn-stats FILE, attn_stats.c).
 * For every layer and head, over every scored query of a ppl run:
 *   - the entropy of the attention weights, H = -sum_j p_j ln p_j (nats), by
 *     the query's position bucket (ppl's buckets: [0, L/2), [L/2, L), [L, 2L),
 *     ...);
 *   - the attention mass by query-key distance q - j, in the same buckets,
 *     averaged over the queries; with attention sinks the mass on the sink
 *     keys apart.
 * The weights come from run.c's one-query attention path, the only one that
 * keeps them (st->scores after the softmax), so a run that collects them goes
 * one token at a time (block_limit is 1 while RunState.attn_stats is set).
 */
#ifndef ATTN_STATS_H
#define ATTN_STATS_H

#include <stdio.h>

#include "ppl.h"
#include "run.h"

struct AttnStats {
    const Transformer *t; // the model whose attention is measured (shapes, key strategy, cache places)
    int counting;         // 1: the queries that come next are scored and counted (attn_stats_count)
    Bucket pos[64];       // query position buckets (start, end; tokens = queries counted there)
    int n_pos;
    Bucket dist[64];      // query-key distance buckets (start, end)
    int n_dist;
    int query_bucket;     // the current query's position bucket
    int n_keys;           // the current query's keys: cache slots 0..n_keys-1
    int *key_bucket;      // (n_ctx) the distance bucket of each slot for the current query; -1 = a sink
    double *entropy;      // (n_layers, n_heads, n_pos) entropy summed over the queries counted
    double *mass;         // (n_layers, n_heads, n_dist) weight summed over the queries counted
    double *sink_mass;    // (n_layers, n_heads) weight on the sink keys summed over the queries counted
    long n_queries;       // queries counted
};

/* Statistics for a run of t whose query positions go up to n_positions - 1
 * (the context, or with --streaming the text's length). NULL when memory runs
 * out. */
AttnStats *attn_stats_new(const Transformer *t, int n_positions);
void attn_stats_free(AttnStats *s);
/* Whether the queries forward_block runs next are counted (scored tokens:
 * 1; the context-only start of an overlapping window: 0). */
void attn_stats_count(AttnStats *s, int counting);
/* forward_block's hook, after layer `layer`'s attention for the one query at
 * position pos (in the window; with sinks, in the text): weights holds each
 * head's softmax weights over the cache slots, rows of n_ctx floats
 * (RunState.scores). Called for layers 0, 1, ... in order: layer 0 starts a
 * query. */
void attn_stats_add(AttnStats *s, int layer, int pos, const float *weights);
/* Write the statistics as one JSON object (docs/long-context.md gives the
 * layout); `text` names the scored file, `stride` the windows' stride (0:
 * streaming). Returns 0, or -1 when a write failed. */
int attn_stats_write(const AttnStats *s, FILE *f, const char *text, int stride);

#endif
