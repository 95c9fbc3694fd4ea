/* attn_stats.h: attention statistics (-m ppl --attn-stats FILE, attn_stats.c).
 * For every layer and head, over every scored query of a ppl run:
 *   - the entropy of the attention weights, H = -sum_j p_j ln p_j (nats), by
 *     the query's position bucket (ppl's buckets: [0, L/2), [L/2, L), [L, 2L),
 *     ...);
 *   - the attention mass by query-key distance q - j, in the same buckets,
 *     averaged over the queries; with attention sinks the mass on the sink
 *     keys apart, over all the queries and by position bucket.
 * A block's statistics are tallied inside attention_block's online softmax
 * (kernels.h's AttnTally: the weights are never stored), one query's (B = 1,
 * and every query in `make reference`) from the one-query path's weights
 * (st->scores after the softmax); both give each query and head one row of
 * the same numbers, summed here.
 */
#ifndef ATTN_STATS_H
#define ATTN_STATS_H

#include <stdio.h>

#include "ppl.h"
#include "run.h"

struct AttnStats {
    const Transformer *t; // the model whose attention is measured (shapes, key strategy, cache places)
    int count_from;       // queries at positions >= count_from are counted (attn_stats_count)
    Bucket pos[64];       // query position buckets (start, end; tokens = queries counted there)
    int n_pos;
    Bucket dist[64];      // query-key distance buckets (start, end)
    int n_dist;
    int *dist_bucket;     // (n_ctx) the distance bucket of each query-key distance
    AttnTally tally;      // per query and head of a block: H, the mass by distance bucket, the sinks' mass
    double *entropy;      // (n_layers, n_heads, n_pos) entropy summed over the queries counted
    double *mass;         // (n_layers, n_heads, n_dist) weight summed over the queries counted
    double *sink_mass;    // (n_layers, n_heads, n_pos) weight on the sink keys summed over the queries counted
    long n_queries;       // queries counted
};

/* Statistics for a run of t whose query positions go up to n_positions - 1
 * (the context, or with --streaming the text's length). NULL when memory runs
 * out. */
AttnStats *attn_stats_new(const Transformer *t, int n_positions);
void attn_stats_free(AttnStats *s);
/* Which queries forward_block runs next are counted: those at positions
 * from `first` on (scored tokens; the context-only start of an overlapping
 * window is not). */
void attn_stats_count(AttnStats *s, int first);
/* The tally attention_block fills for a block (kernels.h). */
const AttnTally *attn_stats_tally(const AttnStats *s);
/* forward_block's hook, after layer `layer`'s attention for the B queries at
 * positions pos0 .. pos0+B-1 (in the window; with sinks, in the text):
 * weights is NULL when attention_block ran, whose tally holds their
 * statistics; else the one query's softmax weights over the cache slots, a
 * row of n_ctx floats per head (RunState.scores). Called for layers 0, 1,
 * ... in order: layer 0 counts the queries. */
void attn_stats_add(AttnStats *s, int layer, int pos0, int B, const float *weights);
/* Write the statistics as one JSON object (docs/long-context.md gives the
 * layout); `text` names the scored file, `stride` the windows' stride (0:
 * streaming). Returns 0, or -1 when a write failed. */
int attn_stats_write(const AttnStats *s, FILE *f, const char *text, int stride);

#endif
