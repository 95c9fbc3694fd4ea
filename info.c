/* info.c: what a run is made of. The position setup: the context, RoPE and
 * its scaling with the parameters the method reads, how keys get their
 * positions, Self-Extend, attention sinks, the sliding window and the KV cache
 * type, as one line of text (position_setup_text) or one JSON object
 * (print_position_json). The load line and every report (ppl, passkey, rope)
 * state it through these two, so a saved result says how it was made.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modes.h"

/* ---- The position setup -------------------------------------------------- */

/* The RoPE parameters a scaling method reads besides base and rot_dim
 * (run.c's rope_frequencies and key strategies): a report states these and
 * no others. */
enum {
    READS_FACTOR = 1,    // s
    READS_ORIG_CTX = 2,  // L
    READS_BETAS = 4,     // YaRN's beta_fast, beta_slow
    READS_MAGNITUDE = 8, // YaRN's and LongRoPE's attn_factor (mscale)
    READS_LLAMA3 = 16,   // Llama 3's low_freq, high_freq
    READS_LENGTH = 32,   // the sequence length, hence the dynamic variant (--rope-dynamic)
};

static unsigned scaling_reads(int scaling) {
    switch (scaling) {
    case ROPE_LINEAR:
    case ROPE_NTK: return READS_FACTOR;
    case ROPE_DYNAMIC: return READS_FACTOR | READS_ORIG_CTX | READS_LENGTH;
    case ROPE_YARN: return READS_FACTOR | READS_ORIG_CTX | READS_BETAS | READS_MAGNITUDE;
    case ROPE_LLAMA3: return READS_FACTOR | READS_ORIG_CTX | READS_LLAMA3;
    case ROPE_LONGROPE: return READS_FACTOR | READS_ORIG_CTX | READS_MAGNITUDE | READS_LENGTH;
    default: return 0;
    }
}

/* The magnitude mscale the RoPE table of t carries: the stored or given
 * attn_factor, else the one derived from s (1 for the methods without one). */
static double rope_magnitude(const Transformer *t) {
    double mscale = 1.0, *scratch = malloc((size_t)(t->rope.rot_dim / 2) * sizeof(double));
    if (!scratch) die(EXIT_BAD_INPUT, "out of memory");
    rope_frequencies(&t->rope, t->n_ctx, scratch, &mscale);
    free(scratch);
    return mscale;
}

/* printf after the text already in out (size bytes in all); what does not
 * fit is cut. */
static void append(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t size, const char *fmt, ...) {
    size_t used = strlen(out);
    if (used + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, size - used, fmt, ap);
    va_end(ap);
}

/* The scaling method and, in parentheses, the parameters it reads:
 * "none", "linear (factor 4)", "yarn (factor 4, orig_ctx 256, beta_fast 32,
 * beta_slow 1, attn_factor 1.138629436)", ... */
static void scaling_text(char *out, size_t size, const Transformer *t) {
    const RopeConfig *r = &t->rope;
    unsigned reads = scaling_reads(r->scaling);
    append(out, size, "%s", SCALING_NAMES[r->scaling]);
    if (!reads) return;
    append(out, size, " (factor %g", r->factor);
    if (reads & READS_ORIG_CTX) append(out, size, ", orig_ctx %d", r->orig_ctx);
    if (reads & READS_BETAS) append(out, size, ", beta_fast %g, beta_slow %g", r->beta_fast, r->beta_slow);
    if (reads & READS_MAGNITUDE) append(out, size, ", attn_factor %.10g", rope_magnitude(t));
    if (reads & READS_LLAMA3) append(out, size, ", low_freq %g, high_freq %g", r->low_freq, r->high_freq);
    if (reads & READS_LENGTH) append(out, size, ", dynamic %s", DYNAMIC_NAMES[t->pos.dynamic_exact]);
    append(out, size, ")");
}

void position_setup_text(char *out, size_t size, const Transformer *t) {
    const RopeConfig *r = &t->rope;
    const PositionSettings *p = &t->pos;
    if (size == 0) return;
    out[0] = '\0';
    append(out, size, "ctx %d; rope %s, base %.10g, rot %d; scaling ", t->n_ctx, LAYOUT_NAMES[r->layout], r->base,
           r->rot_dim);
    scaling_text(out, size, t);
    append(out, size, "; keys %s; self-extend ", KEY_NAMES[t->keys]);
    if (p->se_group > 0) append(out, size, "G %d W %d", p->se_group, p->se_window);
    else append(out, size, "off");
    if (t->keys == KEYS_SINKS) append(out, size, "; sinks %d", p->n_sinks);
    else append(out, size, "; sinks off");
    if (p->window > 0)
        append(out, size, "; window %d (layers %d..%d)", p->window, p->window_first_layer, t->config.n_layers - 1);
    else append(out, size, "; window off");
    append(out, size, "; KV cache %s", KV_NAMES[t->kv_type]);
}

/* "key": v, when the method reads it, else "key": null; then ", ". The
 * object is written with out_printf: passkey's JSON goes out in parts. */
static void print_json_parameter(const char *key, double v, int read) {
    if (read) print_json_field(key, v);
    else out_printf("\"%s\": null, ", key);
}

void print_position_json(const Transformer *t) {
    const RopeConfig *r = &t->rope;
    const PositionSettings *p = &t->pos;
    unsigned reads = scaling_reads(r->scaling);
    out_printf("{\"ctx\": %d, \"layout\": \"%s\", ", t->n_ctx, LAYOUT_NAMES[r->layout]);
    print_json_field("base", r->base);
    out_printf("\"rot_dim\": %d, \"scaling\": \"%s\", ", r->rot_dim, SCALING_NAMES[r->scaling]);
    print_json_parameter("factor", r->factor, reads & READS_FACTOR);
    print_json_parameter("orig_ctx", r->orig_ctx, reads & READS_ORIG_CTX);
    print_json_parameter("beta_fast", r->beta_fast, reads & READS_BETAS);
    print_json_parameter("beta_slow", r->beta_slow, reads & READS_BETAS);
    print_json_parameter("attn_factor", reads & READS_MAGNITUDE ? rope_magnitude(t) : 0, reads & READS_MAGNITUDE);
    print_json_parameter("low_freq", r->low_freq, reads & READS_LLAMA3);
    print_json_parameter("high_freq", r->high_freq, reads & READS_LLAMA3);
    if (reads & READS_LENGTH) out_printf("\"dynamic\": \"%s\", ", DYNAMIC_NAMES[p->dynamic_exact]);
    else out_printf("\"dynamic\": null, ");
    out_printf("\"keys\": \"%s\", \"self_extend\": ", KEY_NAMES[t->keys]);
    if (p->se_group > 0) out_printf("{\"group\": %d, \"window\": %d}", p->se_group, p->se_window);
    else out_printf("null");
    out_printf(", \"sinks\": ");
    if (t->keys == KEYS_SINKS) out_printf("%d", p->n_sinks);
    else out_printf("null");
    out_printf(", \"sliding_window\": ");
    if (p->window > 0) out_printf("{\"size\": %d, \"first_layer\": %d}", p->window, p->window_first_layer);
    else out_printf("null");
    out_printf(", \"kv\": \"%s\"}", KV_NAMES[t->kv_type]);
}
