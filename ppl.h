/* ppl.h: teacher-forced perplexity (ppl.c), for -m ppl and the tests. */
#ifndef PPL_H
#define PPL_H

#include "run.h"

typedef struct {
    int start, end; // in-window positions [start, end) of the predicted token
    long tokens;
    double nll_sum, nll_sq; // the tokens' NLL summed, and its squares summed
} Bucket;

/* What ppl_score measures. */
typedef struct {
    long n_scored;      // tokens scored
    double nll_sum;     // their NLL, summed
    double nll_sq;      // and its squares summed, for the standard error
    double *win_sum;    // (n_windows) NLL summed over the tokens each window scored
    long *win_count;    // (n_windows) how many tokens each window scored
    int n_windows;
    Bucket buckets[64]; // NLL by in-window position range (ppl_buckets)
    int n_buckets;
    double *pos_sum;    // (n_positions) NLL summed per in-window position (streaming: absolute position)
    long *pos_count;    // (n_positions) tokens scored per position
    int n_positions;    // n_ctx, or with streaming the text's length
    int streaming;      // 1: scored by ppl_stream_score (positions are absolute)
} PplScore;

/* Called after each window with the windows done and their total. */
typedef void (*PplProgress)(int done, int total);

/* Called with the logits of each scored token, in text order, and the token
 * they predict (ppl --save-logits and --kl-base). Returns 0, or -1 with a
 * message in err to stop scoring. */
typedef struct {
    int (*fn)(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len);
    void *ctx;
} TokenHook;

/* -log softmax(logits)[target], to within 1e-6 of the formula in double. */
double token_nll(const float *logits, int n, int target);
/* Position buckets [0, L/2), [L/2, L), [L, 2L), [2L, 4L), ... cut at n_ctx. */
int ppl_buckets(Bucket *b, int L, int n_ctx);
void free_ppl_score(PplScore *score);
/* Standard errors of a mean NLL: tokens as independent draws, or windows. */
double nll_se(double sum, double sq, long n);
double nll_se_windows(const double *win_sum, const long *win_count, int n_windows);
/* The NLL of ids[0..n_ids) in windows of n_ctx (docs/rope.md §12.2). */
int ppl_score(Transformer *t, const int *ids, int n_ids, int add_bos, int stride, PplScore *out,
              PplProgress progress, const TokenHook *hook, char *err, size_t err_len);
/* The NLL of ids[0..n_ids) in one pass through the rolling cache of sinks. */
int ppl_stream_score(Transformer *t, const int *ids, int n_ids, int add_bos, PplScore *out, PplProgress progress,
                     const TokenHook *hook, char *err, size_t err_len);

#endif
