/* ppl.c: -m ppl, the model's loss on a text under teacher forcing, the
 * measurement the extrapolation study is built on:
 *   - ppl_score: the text in windows of --ctx tokens every --stride tokens,
 *     each token scored once with its in-window prefix (docs/rope.md §12.2);
 *     ppl_stream_score: in blocks through the rolling cache of sinks;
 *   - NLL by position bucket, standard errors with tokens or windows as the
 *     independent units, and a 95% interval;
 *   - --save-logits / --kl-base: every scored token's logits saved as a
 *     baseline, and a later run compared with it (KL, delta NLL, top-1).
 */
#define _DEFAULT_SOURCE /* mkstemp, lstat */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attn_stats.h"
#include "modes.h"
#include "ppl.h"

/* The sinks a logits file records: S, or -1 without a rolling cache. */
static int sinks_or_none(const Transformer *t) { return t->keys == KEYS_SINKS ? t->pos.n_sinks : -1; }

/* -log softmax(logits)[target] = logsumexp(logits) - logits[target]
 *   logsumexp(l) = max + log(sum_i exp(l_i - max))
 * The exponentials by exp_fast (float, within 2 ulp, in SIMD lanes), the sum
 * and the rest in double. Each term's relative error is at most 2.4e-7 (exp)
 * plus 6e-8 |l_i - max| (l_i - max rounded to float), and so is the log's
 * absolute error after the sum: within 2.4e-7 + 6e-8 x (the softmax-weighted
 * mean of max - l_i) of the formula in double, under 1e-6 while that mean is
 * under 12 nats. libm's exp in double took a third of a ppl run (32000 terms
 * per token, on one thread). */
double token_nll(const float *logits, int n, int target) {
    float max = logits[0];
#pragma omp simd reduction(max : max)
    for (int i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += exp_fast(logits[i] - max);
    return max + log(sum) - logits[target];
}


/* Position buckets [0, L/2), [L/2, L), [L, 2L), [2L, 4L), ... cut at n_ctx,
 * with L the original context of the RoPE settings (rope.orig_ctx: the
 * training context unless --rope-orig-ctx says otherwise). Returns the count
 * (at most 64). */
int ppl_buckets(Bucket *b, int L, int n_ctx) {
    int n = 0, edge = 0, next = L / 2 > 0 ? L / 2 : L;
    while (edge < n_ctx && n < 64) {
        int end = next < n_ctx ? next : n_ctx;
        b[n++] = (Bucket){edge, end, 0, 0.0, 0.0};
        edge = end;
        next = edge < L ? L : (edge > INT_MAX / 2 ? INT_MAX : edge * 2);
    }
    return n;
}


void free_ppl_score(PplScore *score) {
    free(score->pos_sum);
    free(score->pos_count);
    free(score->win_sum);
    free(score->win_count);
    score->pos_sum = NULL, score->pos_count = NULL, score->win_sum = NULL, score->win_count = NULL;
}

/* Standard error of a mean NLL over n tokens, from their sum and sum of
 * squares, as if the tokens were independent draws:
 *   se = sqrt(s^2 / n),  s^2 = (sq - sum^2 / n) / (n - 1)
 * NAN for fewer than 2 tokens. */
double nll_se(double sum, double sq, long n) {
    if (n < 2) return NAN;
    double var = (sq - sum * sum / n) / (n - 1);
    return isnan(var) ? NAN : sqrt(var > 0 ? var / n : 0); // var < 0: rounding of a zero spread
}

/* The same standard error with the windows as the independent units (tokens
 * of one window share its text, so they are not independent); the mean is a
 * ratio sum / count, whose standard error over K = n_windows windows is
 *   se = sqrt(K / (K - 1) * sum_w (T_w - m n_w)^2) / N,  m = N-weighted mean
 * (T_w, n_w: window w's NLL sum and token count; N = sum_w n_w). NAN for
 * fewer than 2 windows. */
double nll_se_windows(const double *win_sum, const long *win_count, int n_windows) {
    if (n_windows < 2) return NAN;
    double total = 0, dev = 0;
    long N = 0;
    for (int w = 0; w < n_windows; w++) total += win_sum[w], N += win_count[w];
    double m = total / N;
    for (int w = 0; w < n_windows; w++) dev += (win_sum[w] - m * win_count[w]) * (win_sum[w] - m * win_count[w]);
    return sqrt((double)n_windows / (n_windows - 1) * dev) / N;
}

/* Count one scored token's nll, scored by window w at position p (in-window,
 * or absolute when streaming), into the totals, its window's and its
 * position's sums, and its bucket. */
static void ppl_add(PplScore *out, int w, int p, double nll) {
    out->nll_sum += nll, out->nll_sq += nll * nll, out->n_scored++;
    out->win_sum[w] += nll, out->win_count[w]++;
    out->pos_sum[p] += nll, out->pos_count[p]++;
    for (int k = 0; k < out->n_buckets; k++)
        if (p >= out->buckets[k].start && p < out->buckets[k].end) {
            out->buckets[k].tokens++;
            out->buckets[k].nll_sum += nll;
            out->buckets[k].nll_sq += nll * nll;
        }
}



/* Teacher-forced NLL of the text ids[0..n_ids) (no BOS among them), the
 * windowing the extrapolation study relies on (docs/rope.md §12.2;
 * tests/reference/forward.py's ppl_reference computes the same in numpy):
 *   - a window is a span of the text; the model reads BOS (when the
 *     tokenizer adds one: add_bos) and then the span but its last token,
 *     from position 0, and predicts every token after the BOS: at most
 *     n_ctx - 1 positions, so a span is n_ctx - 1 tokens with BOS and n_ctx
 *     without (then its first token is context only);
 *   - a window starts every `stride` text tokens (1 <= stride <= n_ctx - 1),
 *     and the last one ends at the text's end;
 *   - a window scores only the text tokens no earlier window scored, each
 *     given its whole in-window prefix; so every token is scored once, the
 *     text's first one only with BOS.
 * Fills *out (its arrays allocated here, freed by free_ppl_score); hands
 * each scored token's logits to hook (when not NULL); returns 0, or -1 with a
 * message in err (nothing to score, a stride out of range, a token outside
 * the vocabulary, no memory, the hook's complaint). */
int ppl_score(Transformer *t, const int *ids, int n_ids, int add_bos, int stride, PplScore *out,
              PplProgress progress, const TokenHook *hook, char *err, size_t err_len) {
    int bos = add_bos ? 1 : 0, span = t->n_ctx - bos; // text tokens in a window's span
    int V = t->config.vocab_size, max_block = block_limit(t), scored_upto = 0;
    memset(out, 0, sizeof *out);
    if (n_ids < 2 - bos)
        return fail(err, err_len, "no tokens to score (%d text tokens%s)", n_ids, bos ? "" : " and no BOS");
    if (t->n_ctx < 2) return fail(err, err_len, "--ctx %d: ppl needs at least 2 positions", t->n_ctx);
    if (stride < 1 || stride > t->n_ctx - 1)
        return fail(err, err_len, "--stride %d: expected 1..%d (ctx - 1)", stride, t->n_ctx - 1);
    int n_windows = n_ids <= span ? 1 : 1 + (n_ids - span + stride - 1) / stride;
    out->n_positions = t->n_ctx;
    out->pos_sum = calloc((size_t)t->n_ctx, sizeof(double));
    out->pos_count = calloc((size_t)t->n_ctx, sizeof(long));
    out->win_sum = calloc((size_t)n_windows, sizeof(double));
    out->win_count = calloc((size_t)n_windows, sizeof(long));
    out->n_buckets = ppl_buckets(out->buckets, t->rope.orig_ctx, t->n_ctx);
    int *input = malloc((size_t)t->n_ctx * sizeof(int)); // one window: [BOS], then its span but the last
    double *nll = malloc((size_t)max_block * sizeof(double)); // a block's scored tokens' NLLs
    int rc = !input || !nll || !out->pos_sum || !out->pos_count || !out->win_sum || !out->win_count
                 ? fail(err, err_len, "ppl: out of memory") : 0;
    for (int start = 0; rc == 0; start += stride) {
        int end = start + span < n_ids ? start + span : n_ids;
        // Input position i holds input[i]; its logits predict the text token
        // j = start + i + 1 - bos, which sits at in-window position i + 1.
        int n_in = end - start - 1 + bos;
        if (bos) input[0] = t->config.bos_id;
        memcpy(input + bos, ids + start, (size_t)(n_in - bos) * sizeof(int));
        if (t->state.attn_stats) // count the queries whose tokens are scored: input positions from
            attn_stats_count(t->state.attn_stats, scored_upto - start - 1 + bos); // j >= scored_upto
        for (int p0 = 0; p0 < n_in && rc == 0; p0 += max_block) {
            int B = n_in - p0 < max_block ? n_in - p0 : max_block;
            int status = forward_block(t, input + p0, B, p0, LOGITS_ALL); // logits (B, vocab_size)
            if (status == FORWARD_NOT_FINITE) {
                rc = fail(err, err_len, "ppl: the logits of window %d are NaN or infinite (a NaN or infinite weight, "
                          "or activations that overflowed)", out->n_windows);
                break;
            }
            if (status != 0) {
                rc = fail(err, err_len, "ppl: a token of window %d is outside the vocabulary (0..%d)",
                          out->n_windows, V - 1);
                break;
            }
            int b; // the block's NLLs, in parallel (the logits are B x 32000 for a Llama 2 vocabulary)
#pragma omp parallel for private(b) if ((long)B * V >= PARALLEL_MIN_WORK)
            for (b = 0; b < B; b++) {
                int j = start + p0 + b + 1 - bos; // the token input position p0 + b predicts
                nll[b] = j >= scored_upto && ids[j] >= 0 && ids[j] < V
                             ? token_nll(t->state.logits + (size_t)b * V, V, ids[j]) : NAN;
            }
            for (b = 0; b < B; b++) {
                int i = p0 + b, j = start + i + 1 - bos, p = i + 1; // scored token, its in-window position
                if (j < scored_upto) continue;                       // an earlier window scored it
                if (ids[j] < 0 || ids[j] >= V) {
                    rc = fail(err, err_len, "ppl: token %d at %d is outside the vocabulary (0..%d)", ids[j], j, V - 1);
                    break;
                }
                const float *logits = t->state.logits + (size_t)b * V;
                if (hook && hook->fn(hook->ctx, logits, V, ids[j], err, err_len) != 0) {
                    rc = -1;
                    break;
                }
                ppl_add(out, out->n_windows, p, nll[b]);
            }
        }
        if (rc != 0) break;
        out->n_windows++;
        if (progress) progress(out->n_windows, n_windows);
        scored_upto = end;
        if (end == n_ids) break;
    }
    free(input);
    free(nll);
    if (rc != 0) free_ppl_score(out);
    return rc;
}

/* Teacher-forced NLL of ids[0..n_ids) in one pass through the rolling cache
 * of attention sinks (--sinks n; StreamingLLM's long-text evaluation): BOS
 * first when add_bos, then the text in blocks (forward_block; block_limit),
 * each text token scored given what the cache holds when it comes, as if fed
 * one by one (the first one only after BOS). Fills *out as ppl_score does, as
 * one window, with buckets and per-position sums by absolute position.
 * Returns 0, or -1 with a message in err. */
int ppl_stream_score(Transformer *t, const int *ids, int n_ids, int add_bos, PplScore *out, PplProgress progress,
                     const TokenHook *hook, char *err, size_t err_len) {
    int bos = add_bos ? 1 : 0, n = n_ids + bos, V = t->config.vocab_size; // n: tokens fed, BOS included
    int max_block = block_limit(t);
    memset(out, 0, sizeof *out);
    if (t->keys != KEYS_SINKS) return fail(err, err_len, "--streaming: needs a rolling cache (--sinks n)");
    if (n < 2) return fail(err, err_len, "no tokens to score (%d text tokens%s)", n_ids, bos ? "" : " and no BOS");
    out->n_positions = n;
    out->pos_sum = calloc((size_t)n, sizeof(double));
    out->pos_count = calloc((size_t)n, sizeof(long));
    out->win_sum = calloc(1, sizeof(double));
    out->win_count = calloc(1, sizeof(long));
    out->n_buckets = ppl_buckets(out->buckets, t->rope.orig_ctx, n);
    int *input = malloc((size_t)max_block * sizeof(int)); // one block of the stream
    if (!input || !out->pos_sum || !out->pos_count || !out->win_sum || !out->win_count) {
        free(input);
        free_ppl_score(out);
        return fail(err, err_len, "ppl: out of memory for %d positions", n);
    }
    int rc = 0;
    for (int p0 = 0; p0 + 1 < n && rc == 0; p0 += max_block) { // feed tokens p0 .. p0+B-1, score each one's next
        int B = n - 1 - p0 < max_block ? n - 1 - p0 : max_block;
        for (int b = 0; b < B; b++) input[b] = p0 + b < bos ? t->config.bos_id : ids[p0 + b - bos];
        int status = forward_block(t, input, B, p0, LOGITS_ALL); // logits (B, vocab_size)
        if (status == FORWARD_NOT_FINITE)
            rc = fail(err, err_len, "ppl: the logits near token %d are NaN or infinite (a NaN or infinite weight, "
                      "or activations that overflowed)", p0);
        else if (status != 0)
            rc = fail(err, err_len, "ppl: a token near %d is outside the vocabulary (0..%d)", p0, V - 1);
        for (int b = 0; b < B && rc == 0; b++) {
            int p = p0 + b, target = ids[p + 1 - bos]; // token p's logits predict token p + 1
            const float *logits = t->state.logits + (size_t)b * V;
            if (target < 0 || target >= V)
                rc = fail(err, err_len, "ppl: a token near %d is outside the vocabulary (0..%d)", p + 1, V - 1);
            else if (hook && hook->fn(hook->ctx, logits, V, target, err, err_len) != 0)
                rc = -1;
            else
                ppl_add(out, 0, p + 1, token_nll(logits, V, target));
        }
        if (progress && rc == 0) progress(p0 + B + 1, n);
    }
    free(input);
    if (rc != 0) {
        free_ppl_score(out);
        return rc;
    }
    out->n_windows = 1;
    out->streaming = 1;
    if (progress) progress(n, n);
    return 0;
}

/* ---- Comparing a run with a saved baseline (ppl --save-logits, --kl-base) --
 * A logits file holds every scored token's logits, so that a later run (q8_0
 * weights, an f16 cache, a scaling method) can be compared with this one
 * token by token, as llama.cpp's perplexity tool does. Little-endian:
 *   0   u32  magic 0x474f4c4c, the bytes "LLOG"
 *   4   i32  version 1
 *   8   i32  vocab_size
 *  12   i32  ctx, 16 i32 stride, 20 i32 add_bos: the windowing that scored them
 *  24   i64  n_tokens
 *  32   i32  streaming (1: ppl --streaming), 36 i32 sinks (-1: none)
 *  40..63    zero
 *  then n_tokens records: i32 the token predicted, vocab_size f32 logits */
#define LOGITS_MAGIC 0x474f4c4cu
#define LOGITS_HEADER_BYTES 64

typedef struct {
    FILE *f;
    const char *path;
    long n;
} LogitsWriter;

static int save_logits(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    LogitsWriter *w = ctx;
    int32_t id = target;
    if (fwrite(&id, 4, 1, w->f) != 1 || fwrite(logits, sizeof(float), (size_t)vocab, w->f) != (size_t)vocab)
        return fail(err, err_len, "--save-logits %s: write failed after %ld tokens (disk full?)", shown_path(w->path),
                    w->n);
    w->n++;
    return 0;
}

/* Per-token comparison with the baseline B of this run R, accumulated:
 *   KL(B || R) = sum_v p_B(v) (log p_B(v) - log p_R(v))
 *   top-1 agreement: argmax B == argmax R
 *   delta NLL = -log p_R(target) + log p_B(target) */
typedef struct {
    FILE *f;
    const char *path;
    float *base;               // (vocab_size) the baseline's logits of the current token
    long n, n_total;           // tokens compared so far, and in the file
    long top1;                 // tokens whose most likely id agrees
    double kl, kl_sq, dnll, dnll_sq;
} KlCompare;

static double log_sum_exp(const float *x, int n) {
    double max = x[argmax(x, n)], sum = 0;
    for (int i = 0; i < n; i++) sum += exp(x[i] - max);
    return max + log(sum);
}

static int compare_logits(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    KlCompare *c = ctx;
    int32_t id;
    if (c->n == c->n_total)
        return fail(err, err_len, "--kl-base %s: holds %ld tokens, this run scores more", shown_path(c->path),
                    c->n_total);
    if (fread(&id, 4, 1, c->f) != 1 || fread(c->base, sizeof(float), (size_t)vocab, c->f) != (size_t)vocab)
        return fail(err, err_len, "--kl-base %s: read error at token %ld", shown_path(c->path), c->n);
    if (id != target)
        return fail(err, err_len, "--kl-base %s: token %ld is %ld in the file, %d here (another text?)",
                    shown_path(c->path), c->n, (long)id, target);
    double lse_b = log_sum_exp(c->base, vocab), lse_r = log_sum_exp(logits, vocab), kl = 0;
    for (int v = 0; v < vocab; v++) {
        double lb = c->base[v] - lse_b, lr = logits[v] - lse_r;
        kl += exp(lb) * (lb - lr);
    }
    double dnll = (lse_r - logits[target]) - (lse_b - c->base[target]);
    c->kl += kl, c->kl_sq += kl * kl, c->dnll += dnll, c->dnll_sq += dnll * dnll;
    c->top1 += argmax(c->base, vocab) == argmax(logits, vocab);
    c->n++;
    return 0;
}

/* Open path as the baseline of a run with these settings that scores the
 * text tokens targets[0..n_targets): the header must match, the file hold
 * exactly its n_tokens records, and those predict the same tokens. Exits
 * with a message naming the file and what differs otherwise. */
static void open_kl_base(KlCompare *c, const char *path, const Transformer *t, int stride, int add_bos,
                         int streaming, const int *targets, int n_targets) {
    const char *name = shown_path(path); // the path as the messages show it
    struct stat path_st;
    if (stat(path, &path_st) == 0 && !S_ISREG(path_st.st_mode))
        die(EXIT_BAD_INPUT, "--kl-base %s: expected a logits file (-m ppl --save-logits), got a %s", name,
            S_ISDIR(path_st.st_mode) ? "directory" : "device, FIFO or socket");
    *c = (KlCompare){.f = fopen(path, "rb"), .path = path};
    c->base = malloc((size_t)t->config.vocab_size * sizeof(float));
    if (!c->f) die(EXIT_BAD_INPUT, "--kl-base %s: %s", name, strerror(errno));
    if (!c->base) die(EXIT_BAD_INPUT, "--kl-base %s: out of memory", name);
    unsigned char h[LOGITS_HEADER_BYTES];
    if (fread(h, 1, sizeof h, c->f) != sizeof h)
        die(EXIT_BAD_INPUT, "--kl-base %s: shorter than the %d-byte header", name, LOGITS_HEADER_BYTES);
    if ((uint32_t)read_le_i32(h) != LOGITS_MAGIC || read_le_i32(h + 4) != 1)
        die(EXIT_BAD_INPUT, "--kl-base %s: not a logits file of version 1 (written by -m ppl --save-logits)", name);
    const char *names[6] = {"vocab_size", "ctx", "stride", "add_bos", "streaming", "sinks"};
    int want[6] = {t->config.vocab_size, t->n_ctx, stride, add_bos, streaming, sinks_or_none(t)};
    const int at[6] = {8, 12, 16, 20, 32, 36};
    for (int k = 0; k < 6; k++)
        if (read_le_i32(h + at[k]) != want[k])
            die(EXIT_BAD_INPUT, "--kl-base %s: saved with %s %d, this run has %d", name, names[k],
                read_le_i32(h + at[k]), want[k]);
    int64_t n = (int64_t)((uint64_t)(uint32_t)read_le_i32(h + 24) | (uint64_t)(uint32_t)read_le_i32(h + 28) << 32);
    struct stat st;
    size_t record = 4 + 4 * (size_t)t->config.vocab_size;
    if (fstat(fileno(c->f), &st) != 0 || n < 0 || (uint64_t)n > (UINT64_MAX - LOGITS_HEADER_BYTES) / record ||
        (uint64_t)st.st_size != LOGITS_HEADER_BYTES + (uint64_t)n * record)
        die(EXIT_BAD_INPUT, "--kl-base %s: %lld bytes, expected %llu for its %lld tokens", name,
            (long long)st.st_size,
            (unsigned long long)(n < 0 || (uint64_t)n > (UINT64_MAX - 64) / record ? 0 : 64 + (uint64_t)n * record),
            (long long)n);
    c->n_total = (long)n;
    if (n != n_targets)
        die(EXIT_BAD_INPUT, "--kl-base %s: holds %lld tokens, this run scores %d (another text?)", name, (long long)n,
            n_targets);
    int vocab = t->config.vocab_size;
    for (long i = 0; i < n; i++) { // every record, before the run: the tokens it predicts, its logits finite
        int32_t id;
        if (fseek(c->f, (long)(LOGITS_HEADER_BYTES + i * record), SEEK_SET) != 0 || fread(&id, 4, 1, c->f) != 1 ||
            fread(c->base, sizeof(float), (size_t)vocab, c->f) != (size_t)vocab)
            die(EXIT_BAD_INPUT, "--kl-base %s: read error at token %ld", name, i);
        if (id != targets[i])
            die(EXIT_BAD_INPUT, "--kl-base %s: token %ld is %ld in the file, %d here (another text?)", name, i,
                (long)id, targets[i]);
        for (int v = 0; v < vocab; v++) // checked as this run's own logits are (forward_block)
            if (!isfinite(c->base[v]))
                die(EXIT_BAD_INPUT, "--kl-base %s: token %ld's logit %d is %g (expected a finite number)", name, i, v,
                    (double)c->base[v]);
    }
    if (fseek(c->f, LOGITS_HEADER_BYTES, SEEK_SET) != 0) die(EXIT_BAD_INPUT, "--kl-base %s: cannot seek", name);
}

/* Print a PplScore: JSON (--json; with --per-position the mean NLL at every
 * in-window position) or a table. */
static void ppl_report(const Transformer *t, const PplScore *score, const char *path, int stride, int json,
                       int per_position, const KlCompare *kl) {
    long n_scored = score->n_scored;
    int n_windows = score->n_windows, n_buckets = score->n_buckets;
    const Bucket *buckets = score->buckets;
    const double *pos_sum = score->pos_sum;
    const long *pos_count = score->pos_count;
    double nll = score->nll_sum / n_scored, se = nll_se(score->nll_sum, score->nll_sq, n_scored);
    double se_win = nll_se_windows(score->win_sum, score->win_count, n_windows);
    if (json) {
        printf("{\"file\": ");
        print_json_string(path);
        printf(", \"tokens\": %ld, ", n_scored);
        print_json_field("nll", nll);
        print_json_field("ppl", exp(nll));
        print_json_field("nll_se", se);
        print_json_field("nll_se_windows", se_win);
        print_json_field("ppl_lo", exp(nll - 1.96 * se)); // 95% interval under nll_se
        print_json_field("ppl_hi", exp(nll + 1.96 * se));
        printf("\"ctx\": %d, \"stride\": %d, \"windows\": %d, \"orig_ctx\": %d, \"scaling\": \"%s\", ",
               t->n_ctx, score->streaming ? 0 : stride, n_windows, t->rope.orig_ctx, SCALING_NAMES[t->rope.scaling]);
        if (t->keys == KEYS_SINKS) printf("\"sinks\": %d, ", t->pos.n_sinks);
        printf("\"position\": ");
        print_position_json(t);
        printf(", \"streaming\": %s, \"buckets\": [", score->streaming ? "true" : "false");
        int first = 1;
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            printf("%s{\"start\": %d, \"end\": %d, \"tokens\": %ld, ", first ? "" : ", ", buckets[b].start,
                   buckets[b].end, buckets[b].tokens);
            print_json_field("nll_se", nll_se(buckets[b].nll_sum, buckets[b].nll_sq, buckets[b].tokens));
            printf("\"nll\": ");
            print_json_number(bn);
            printf(", \"ppl\": ");
            print_json_number(exp(bn));
            printf("}");
            first = 0;
        }
        printf("]");
        if (per_position) { // mean NLL at in-window positions 0..ctx-1 (null: nothing scored there)
            printf(", \"per_position\": [");
            for (int p = 0; p < score->n_positions; p++) {
                if (p) printf(", ");
                if (pos_count[p]) print_json_number(pos_sum[p] / pos_count[p]);
                else printf("null");
            }
            printf("]");
        }
        if (kl) {
            printf(", \"kl_base\": {\"file\": ");
            print_json_string(kl->path);
            printf(", \"tokens\": %ld, ", kl->n);
            print_json_field("kl", kl->kl / kl->n);
            print_json_field("kl_se", nll_se(kl->kl, kl->kl_sq, kl->n));
            print_json_field("delta_nll", kl->dnll / kl->n);
            print_json_field("delta_nll_se", nll_se(kl->dnll, kl->dnll_sq, kl->n));
            printf("\"top1\": %.6f}", (double)kl->top1 / kl->n);
        }
        printf("}\n");
    } else {
        char setup[512];
        position_setup_text(setup, sizeof setup, t);
        if (score->streaming)
            printf("%s: %ld tokens, streamed through a cache of %d tokens (%d sinks); positions are absolute\n",
                   shown_path(path), n_scored, t->n_ctx, t->pos.n_sinks);
        else
            printf("%s: %ld tokens, %d windows of ctx %d (stride %d)\n", shown_path(path), n_scored, n_windows,
                   t->n_ctx, stride);
        printf("position: %s\n", setup);
        printf("nll %.4f +- %.4f  ppl %.3f [%.3f, %.3f]\n", nll, se, exp(nll), exp(nll - 1.96 * se),
               exp(nll + 1.96 * se));
        if (isnan(se_win))
            printf("(+- one standard error, [95%% interval], counting tokens as independent)\n");
        else
            printf("(+- one standard error, [95%% interval], counting tokens as independent; with windows as the\n"
                   " independent units the standard error is %.4f)\n", se_win);
        printf("%-18s %8s %8s %8s %10s\n", "positions", "tokens", "nll", "+-", "ppl");
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            char range[40];
            snprintf(range, sizeof range, "[%d, %d)", buckets[b].start, buckets[b].end);
            printf("%-18s %8ld %8.4f %8.4f %10.3f\n", range, buckets[b].tokens, bn,
                   nll_se(buckets[b].nll_sum, buckets[b].nll_sq, buckets[b].tokens), exp(bn));
        }
        if (kl)
            printf("against %s (%ld tokens): KL %.4g +- %.2g nats/token, delta nll %+.4g +- %.2g, "
                   "top-1 agreement %.2f%%\n", shown_path(kl->path), kl->n, kl->kl / kl->n,
                   nll_se(kl->kl, kl->kl_sq, kl->n), kl->dnll / kl->n, nll_se(kl->dnll, kl->dnll_sq, kl->n),
                   100.0 * kl->top1 / kl->n);
    }
}

/* ppl's progress line, on a terminal only, at most every 2 seconds. */
static void progress_line(const char *unit, int done, int total) {
    static double last = 0; // when the line was last written; 0 = never
    if (!isatty(STDERR_FILENO)) return;
    if (done == total) { // clear the line, if there is one
        if (last > 0) fprintf(stderr, "\r%40s\r", "");
        return;
    }
    if (now_seconds() - last < 2.0) return;
    last = now_seconds();
    fprintf(stderr, "\rppl: %s %d of %d", unit, done, total);
}
static void ppl_progress(int done, int total) { progress_line("window", done, total); }
static void tokenize_progress(size_t done, size_t total) { // in MiB, rounded up: the last call clears the line
    progress_line("MiB tokenized:", (int)((done + 0xFFFFF) >> 20), (int)((total + 0xFFFFF) >> 20));
}
static void stream_progress(int done, int total) { progress_line("token", done, total); }

/* ---- Output files: never half-written, never over something else ---------
 * --save-logits and --attn-stats write their file under a unique name beside
 * its path (PATH.XXXXXX, created with O_EXCL by mkstemp), rename it over PATH
 * once complete, and remove it on any failure (at exit, when a later step
 * dies) and on Ctrl-C or SIGTERM. PATH must be a regular file or not exist (a
 * device, a FIFO or a symlink is refused, never replaced), and must not be
 * one of the run's inputs. */
#define MAX_OUTPUTS 2 // --save-logits, --attn-stats
static char pending_tmp[MAX_OUTPUTS][4096]; // the temporary files not yet renamed; "" = none

typedef struct {
    FILE *f;          // the temporary file; NULL once closed
    const char *flag; // "--save-logits", "--attn-stats": the messages name it
    const char *path; // where the file goes when complete
    char *tmp;        // its entry of pending_tmp
} OutputFile;

/* Remove the temporary files not yet renamed: at exit (a die() between
 * opening one and finishing it) and on a signal. */
static void remove_pending_files(void) {
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending_tmp[i][0]) unlink(pending_tmp[i]); // async-signal-safe
}

static void remove_pending(int sig) {
    remove_pending_files();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Whether path and other name the same file (both exist). */
static int same_file(const char *path, const char *other) {
    struct stat a, b;
    return other && stat(path, &a) == 0 && stat(other, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Open the temporary file for `flag` PATH; exits with a message naming the
 * flag and PATH when it cannot be, or may not be, written. */
static OutputFile open_output_file(const char *flag, const char *path, const char *const inputs[], int n_inputs) {
    OutputFile out = {NULL, flag, path, NULL};
    for (int i = 0; i < MAX_OUTPUTS && !out.tmp; i++) // a free entry: one per flag, so there is one
        if (!pending_tmp[i][0]) out.tmp = pending_tmp[i];
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        die(EXIT_BAD_INPUT, "%s %s: exists and is not a regular file (a %s); give a new path", flag, shown_path(path),
            S_ISLNK(st.st_mode) ? "symbolic link" : S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO"
            : "device or socket");
    for (int i = 0; i < n_inputs; i++)
        if (same_file(path, inputs[i]))
            die(EXIT_BAD_INPUT, "%s %s: is an input of this run (%s); give a new path", flag, shown_path(path),
                shown_path(inputs[i]));
    if (strlen(path) + sizeof ".XXXXXX" > sizeof pending_tmp[0])
        die(EXIT_BAD_INPUT, "%s %s: path too long (expected under %zu bytes)", flag, shown_path(path),
            sizeof pending_tmp[0] - 8);
    char tmp[sizeof pending_tmp[0]];
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    mode_t umask_bits = umask(0);
    umask(umask_bits);
    if (fd >= 0) fchmod(fd, 0666 & ~umask_bits); // a new file's permissions, not mkstemp's 0600
    out.f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!out.f) {
        int e = errno;
        if (fd >= 0) close(fd), unlink(tmp);
        die(EXIT_BAD_INPUT, "%s %s: cannot create a file beside it: %s", flag, shown_path(path), strerror(e));
    }
    memcpy(out.tmp, tmp, sizeof tmp);
    static int registered;
    if (!registered) atexit(remove_pending_files), registered = 1;
    signal(SIGINT, remove_pending);
    signal(SIGTERM, remove_pending);
    return out;
}

/* Close the temporary file and rename it to its path (commit), or remove it. */
static int close_output_file(OutputFile *out, int commit, char *err, size_t err_len) {
    int failed = fclose(out->f) != 0;
    out->f = NULL;
    if (!failed && commit && rename(out->tmp, out->path) == 0) {
        out->tmp[0] = '\0';
        return 0;
    }
    int e = errno;
    unlink(out->tmp);
    out->tmp[0] = '\0';
    return commit ? fail(err, err_len, "%s %s: %s", out->flag, shown_path(out->path), strerror(e)) : 0;
}

/* The hook of a ppl run that saves its logits, compares them with a
 * baseline, or both. */
typedef struct {
    LogitsWriter *save;
    KlCompare *compare;
} PplHooks;

static int ppl_hooks(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    PplHooks *h = ctx;
    if (h->save && save_logits(h->save, logits, vocab, target, err, err_len) != 0) return -1;
    if (h->compare && compare_logits(h->compare, logits, vocab, target, err, err_len) != 0) return -1;
    return 0;
}

/* --attn-stats PATH: open its temporary file and hang fresh statistics on
 * the run state, for queries at positions below n_positions (exits with a
 * message naming the flag when it cannot). From here on attention tallies
 * them (run.c's attention, attn_stats_add). */
static OutputFile start_attn_stats(Transformer *t, const char *path, int n_positions, const char *const inputs[],
                                   int n_inputs) {
    OutputFile out = open_output_file("--attn-stats", path, inputs, n_inputs);
    t->state.attn_stats = attn_stats_new(t, n_positions);
    if (!t->state.attn_stats) {
        close_output_file(&out, 0, NULL, 0);
        die(EXIT_BAD_INPUT, "--attn-stats %s: out of memory for the statistics", shown_path(path));
    }
    return out;
}

/* Write the statistics into out and put the file under its name (commit), or
 * remove it; take them off the run state and free them. Returns 0, or -1
 * with a message in err. */
static int finish_attn_stats(Transformer *t, OutputFile *out, const char *text, int stride, int commit, char *err,
                             size_t err_len) {
    AttnStats *s = t->state.attn_stats;
    t->state.attn_stats = NULL;
    int rc = 0;
    if (commit && attn_stats_write(s, out->f, text, stride) != 0) {
        rc = fail(err, err_len, "%s %s: write failed (disk full?)", out->flag, shown_path(out->path));
        commit = 0;
    }
    if (commit) rc = close_output_file(out, 1, err, err_len);
    else close_output_file(out, 0, NULL, 0);
    if (rc == 0 && commit)
        fprintf(stderr, "ppl: attention statistics of %ld queries written to %s\n", s->n_queries,
                shown_path(out->path));
    attn_stats_free(s);
    return rc;
}

/* -m ppl: the NLL of a text file under teacher forcing (ppl_score, or
 * ppl_stream_score with --streaming), reported by ppl_report. The text is
 * encoded once, without BOS. */
void ppl_mode(const ModeInput *in) {
    Transformer *t = in->t;
    const Tokenizer *tok = in->tok;
    const Options *o = in->o;
    const char *path = in->text_name, *text = in->text, *save_path = o->save_logits, *kl_path = o->kl_base;
    const char *summary = in->summary;
    size_t len = in->text_len;
    int stride = o->stride, json = o->json, per_position = o->per_position, streaming = o->streaming;
    // In pieces of 1 MiB: memory follows the ids (4 bytes each), not the
    // encoder's work buffers (about 30 bytes per byte of text at once).
    int *ids, n_ids = tokenizer_encode_long(tok, text, len, ENCODE_PIECE, &ids, tokenize_progress);
    if (n_ids < 0) die(EXIT_BAD_INPUT, "-f %s: out of memory while encoding %zu bytes", shown_path(path), len);
    if (n_ids == 0) die(EXIT_BAD_INPUT, "-f %s: no tokens to score (empty text)", shown_path(path));
    int max_stride = t->n_ctx - 1; // positions a window predicts
    if (max_stride < 1) die(EXIT_USAGE, "--ctx %d: ppl needs at least 2 positions", t->n_ctx);
    if (stride <= 0) stride = max_stride;
    if (stride > max_stride) die(EXIT_USAGE, "--stride %d: expected 1..%d (ctx - 1)", stride, max_stride);
    // The baseline to compare with, and the files to write (open_output_file).
    KlCompare kl = {0};
    if (kl_path) // every text token is scored once, in order; the first only after BOS
        open_kl_base(&kl, kl_path, t, stride, tok->add_bos, streaming, ids + !tok->add_bos, n_ids - !tok->add_bos);
    const char *inputs[] = {in->o->prompt_file, in->checkpoint, in->tok_path, kl_path};
    OutputFile stats_out = {0};
    if (o->attn_stats) // query positions: in the window, or with --streaming in the text (BOS included)
        stats_out = start_attn_stats(t, o->attn_stats, streaming ? n_ids + tok->add_bos : t->n_ctx, inputs, 4);
    LogitsWriter saver = {NULL, save_path, 0};
    OutputFile logits_out = {0};
    if (save_path) {
        logits_out = open_output_file("--save-logits", save_path, inputs, 4);
        saver.f = logits_out.f;
        unsigned char zeros[LOGITS_HEADER_BYTES] = {0}; // the header, written once the count is known
        if (fwrite(zeros, 1, sizeof zeros, saver.f) != sizeof zeros) {
            int e = errno;
            close_output_file(&logits_out, 0, NULL, 0);
            die(EXIT_BAD_INPUT, "--save-logits %s: %s", shown_path(save_path), strerror(e));
        }
        fprintf(stderr, "ppl: saving %.1f MiB of logits (%zu bytes per token)\n",
                (double)n_ids * (4 + 4.0 * t->config.vocab_size) / 1048576, 4 + 4 * (size_t)t->config.vocab_size);
    }
    PplHooks hooks = {save_path ? &saver : NULL, kl_path ? &kl : NULL};
    TokenHook hook = {ppl_hooks, &hooks};
    fputs(summary, stderr);
    PplScore score;
    char err[512];
    double start_time = now_seconds();
    const TokenHook *h = save_path || kl_path ? &hook : NULL;
    int rc = streaming ? ppl_stream_score(t, ids, n_ids, tok->add_bos, &score, stream_progress, h, err, sizeof err)
                       : ppl_score(t, ids, n_ids, tok->add_bos, stride, &score, ppl_progress, h, err, sizeof err);
    if (rc == 0 && kl_path && kl.n != kl.n_total)
        rc = fail(err, sizeof err, "--kl-base %s: holds %ld tokens, this run scored %ld", shown_path(kl_path),
                  kl.n_total, kl.n);
    if (rc == 0 && save_path) { // the header, now that the count is known; then the file under its name
        unsigned char h[LOGITS_HEADER_BYTES] = {0};
        int32_t fields[10] = {(int32_t)LOGITS_MAGIC, 1, t->config.vocab_size, t->n_ctx, stride, tok->add_bos,
                              (int32_t)((uint64_t)saver.n & 0xffffffffu), (int32_t)((uint64_t)saver.n >> 32), streaming,
                              sinks_or_none(t)};
        for (int k = 0; k < 10; k++) // little-endian whatever the machine
            for (int b = 0; b < 4; b++) h[4 * k + b] = (unsigned char)((uint32_t)fields[k] >> (8 * b));
        if (fseek(saver.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, saver.f) != sizeof h)
            rc = fail(err, sizeof err, "--save-logits %s: %s", shown_path(save_path), strerror(errno)); // removed below
        else
            rc = close_output_file(&logits_out, 1, err, sizeof err); // renamed, or removed
    }
    if (o->attn_stats) {
        int stats_rc = finish_attn_stats(t, &stats_out, path, streaming ? 0 : stride, rc == 0, err, sizeof err);
        if (rc == 0) rc = stats_rc;
    }
    if (rc != 0) {
        if (logits_out.f) close_output_file(&logits_out, 0, NULL, 0);
        if (!strncmp(err, "--", 2)) die(EXIT_BAD_INPUT, "%s", err); // names its flag and file
        die(EXIT_BAD_INPUT, "-f %s: %s", shown_path(path), err);
    }
    if (streaming)
        fprintf(stderr, "ppl: %ld tokens scored, streamed, %.1f s\n", score.n_scored, now_seconds() - start_time);
    else
        fprintf(stderr, "ppl: %ld tokens scored in %d windows, %.1f s\n", score.n_scored, score.n_windows,
                now_seconds() - start_time);
    ppl_report(t, &score, path, stride, json, per_position, kl_path ? &kl : NULL);
    if (kl.f) fclose(kl.f);
    free(kl.base);
    free(ids);
    free_ppl_score(&score);
}
