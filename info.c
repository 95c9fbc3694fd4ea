/* info.c: what a checkpoint and a run are made of.
 *   - The position setup: the context, RoPE and its scaling with the
 *     parameters the method reads, how keys get their positions, Self-Extend,
 *     attention sinks, the sliding window and the KV cache type, as one line
 *     of text (position_setup_text) or one JSON object (print_position_json).
 *     The load line and every report (ppl, passkey, rope) state it through
 *     these two, so a saved result says how it was made.
 *   - -m info: the checkpoint's header, the position setup of a run without
 *     position flags, and the tokenizer: its kind, pieces, BOS/EOS policy,
 *     stop ids, special tokens and chat template, as llama.cpp prints them
 *     at load; --json for the same as one object.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
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
double rope_magnitude(const Transformer *t) {
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
    append(out, size, "; KV cache %s, %zu bytes per position", KV_NAMES[t->kv_type],
           kv_position_bytes(t, t->kv_type));
}

/* The context E that Self-Extend with group size G and neighbour window W
 * covers for a model trained on L positions: every relative position stays
 * in 0..L-1 exactly while E <= G (L - W) + G floor(W/G), for W < L
 * (docs/rope.md §10.2). */
static long self_extend_reach(long G, long W, long L) { return G * (L - W) + G * (W / G); }

void self_extend_notice(const Transformer *t) {
    long G = t->pos.se_group, W = t->pos.se_window, E = t->n_ctx, L = t->rope.orig_ctx;
    if (t->keys != KEYS_SELF_EXTEND || E <= L || t->rope.scaling != ROPE_NONE) return;
    if (W >= L) {
        notice("--self-extend %ld %ld: neighbour keys up to %ld positions back are past the training length L = %ld, "
               "whatever G; Self-Extend needs W < L and ctx <= G (L - W) + G floor(W/G) (docs/rope.md §10.2)", G, W,
               (W < E ? W : E) - 1, L);
        return;
    }
    if (self_extend_reach(G, W, L) >= E) return;
    long fits = G;
    while (self_extend_reach(fits, W, L) < E) fits++;
    notice("--self-extend %ld %ld: --ctx %ld reaches positions past the training length L = %ld: Self-Extend covers "
           "ctx <= G (L - W) + G floor(W/G) = %ld (docs/rope.md §10.2); G = %ld fits", G, W, E, L,
           self_extend_reach(G, W, L), fits);
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
    out_printf(", \"kv\": \"%s\", \"kv_bytes_per_position\": %zu}", KV_NAMES[t->kv_type],
               kv_position_bytes(t, t->kv_type));
}

/* ---- -m info -------------------------------------------------------------- */

/* A piece as a JSON string: well-formed UTF-8 as it is, control characters
 * as \u00XX, each byte that is not UTF-8 as U+FFFD (JSON holds text only;
 * the text output and --pieces show those bytes as \xHH). */
static void print_json_piece(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = utf8_length(s + i, n - i);
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
        else if (len == 0) printf("\\ufffd");
        else fwrite(s + i, 1, (size_t)len, stdout);
        i += len > 0 ? (size_t)len : 1;
    }
    putchar('"');
}

/* One line of the text output: the name, padded, then what printf makes of fmt. */
static void field(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void field(const char *name, const char *fmt, ...) {
    printf("%-18s ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* "id "piece"" of a token, or "none" for -1. */
static void print_token(const Tokenizer *tok, int id) {
    if (id < 0 || id >= tok->vocab_size) {
        printf("none");
        return;
    }
    printf("%d ", id);
    print_piece(stdout, tok->vocab[id], (size_t)tok->vocab_len[id]);
}

/* A token line of the text output: its name, then the token. */
static void token_field(const Tokenizer *tok, const char *name, int id) {
    printf("%-18s ", name);
    print_token(tok, id);
    putchar('\n');
}

/* The biases a checkpoint's projections add, "qkv o mlp" or "none". */
static const char *bias_names(int flags) {
    static char names[16];
    snprintf(names, sizeof names, "%s%s%s", flags & BIAS_QKV ? "qkv " : "", flags & BIAS_O ? "o " : "",
             flags & BIAS_MLP ? "mlp " : "");
    size_t n = strlen(names);
    if (n == 0) return "none";
    names[n - 1] = '\0'; // the last space
    return names;
}

/* How many pieces of each kind (PIECE_NORMAL ..) the vocabulary holds. */
static void count_kinds(const Tokenizer *tok, int counts[PIECE_N_KINDS]) {
    memset(counts, 0, PIECE_N_KINDS * sizeof(int));
    for (int id = 0; id < tok->vocab_size; id++) counts[tok->kind[id]]++;
}

/* A system text of the chat template, quoted and escaped, or "none". */
static void text_field(const char *name, const char *text) {
    printf("%-18s ", name);
    if (*text) print_piece(stdout, text, strlen(text));
    else printf("none");
    putchar('\n');
}

/* The special pieces shown in the text output, at most; --json lists all. */
#define SPECIAL_SHOWN 24

/* A GGUF checkpoint's metadata keys, split as gguf_key_usage splits them:
 * read by the load (mapped onto the config, RoPE and tokenizer) or passed by
 * (ignored). Each list is its keys one after another, '\0' after each. */
typedef struct {
    char *keys[2]; // [0] ignored, [1] read
    size_t len[2];
    int n[2];
} GgufKeys;

static void add_gguf_key(const char *key, int read, void *ctx) {
    GgufKeys *k = ctx;
    size_t n = strlen(key) + 1;
    char *grown = realloc(k->keys[read], k->len[read] + n);
    if (!grown) return; // the list stays as it was: info then shows fewer keys
    memcpy(grown + k->len[read], key, n);
    k->keys[read] = grown, k->len[read] += n, k->n[read]++;
}

/* The two lists of the checkpoint's GGUF keys (its tokenizer's keys read
 * only when the tokenizer is its own), or 0 when it is not a GGUF (or, which
 * the load rules out, it cannot be read again). */
static int gguf_keys(const ModeInput *in, GgufKeys *k) {
    char err[512];
    const Transformer *t = in->t;
    memset(k, 0, sizeof *k);
    if (!t->mapping || memcmp(t->mapping, "GGUF", 4)) return 0;
    int own_tokenizer = in->tok->from_gguf && !strcmp(in->tok_path, in->checkpoint);
    return gguf_key_usage(t, own_tokenizer, add_gguf_key, k, err, sizeof err) == 0;
}

/* One list as text ("3: a, b, c") or as a JSON array. */
static void print_gguf_keys(const GgufKeys *k, int read, int json) {
    const char *key = k->keys[read];
    if (!json) printf("%d%s", k->n[read], k->n[read] ? ": " : "");
    else putchar('[');
    for (int i = 0; i < k->n[read]; i++, key += strlen(key) + 1) {
        if (i) fputs(", ", stdout);
        if (json) print_json_string(key);
        else fputs(key, stdout);
    }
    if (json) putchar(']');
}

/* The q8_0 cache's bytes per position, or why this model cannot have one. */
static const char *kv_q8_text(char *out, size_t size, const Transformer *t) {
    size_t bytes = kv_position_bytes(t, KV_Q8_0);
    if (bytes) snprintf(out, size, "%zu", bytes);
    else snprintf(out, size, "none (kv_dim %d is no multiple of %d)",
                  t->config.dim / t->config.n_heads * t->config.n_kv_heads, KV_Q8_BLOCK);
    return out;
}

/* -m info's text: one "name value" line per fact, the checkpoint first. */
static void print_info_text(const ModeInput *in) {
    const Transformer *t = in->t;
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    const Tokenizer *tok = in->tok;
    char text[1024] = "";
    field("file", "%s", in->checkpoint);
    field("file_size", "%zu bytes (%.1f MiB)", t->file_size, t->file_size / 1048576.0);
    const unsigned char *head = t->mapping;
    if (head && !memcmp(head, "GGUF", 4)) // gguf_model.c: read directly, its config as export.py would write it
        field("format", "GGUF version %d (llama.cpp), read directly; %.1f MiB of tensors converted at load",
              read_le_i32(head + 4), t->converted_size / 1048576.0);
    else if (c->version == 0) field("format", "llama2.c (version 0: RoPE, eps and token ids fixed)");
    else field("format", "LRPE version %d", c->version);
    GgufKeys keys;
    if (gguf_keys(in, &keys)) { // the metadata the load mapped, and what it passed by
        for (int read = 1; read >= 0; read--) {
            printf("%-18s ", read ? "gguf_keys_mapped" : "gguf_keys_ignored");
            print_gguf_keys(&keys, read, 0);
            putchar('\n');
        }
        free(keys.keys[0]), free(keys.keys[1]);
    }
    field("dim", "%d", c->dim);
    field("hidden_dim", "%d", c->hidden_dim);
    field("n_layers", "%d", c->n_layers);
    field("n_heads", "%d", c->n_heads);
    field("n_kv_heads", "%d", c->n_kv_heads);
    field("head_size", "%d", c->dim / c->n_heads);
    field("vocab_size", "%d", c->vocab_size);
    field("train_ctx", "%d", c->train_ctx);
    field("classifier", "%s", c->shared_classifier ? "shared with the token embedding" : "its own (wcls)");
    field("norm_eps", "%g", c->norm_eps);
    const Weights *w = &t->weights; // a GGUF's embedding and classifier may differ from the layers (model.h's Config)
    char others[96] = "";
    if (w->token_embedding.type != c->weight_type || w->wcls.type != c->weight_type)
        snprintf(others, sizeof others, " (token embedding %s, classifier %s)", WEIGHT_NAMES[w->token_embedding.type],
                 WEIGHT_NAMES[w->wcls.type]);
    if (c->weight_type != WEIGHT_F32)
        field("weights", "%s, groups of %d%s", WEIGHT_NAMES[c->weight_type], c->group_size, others);
    else field("weights", "%s%s", WEIGHT_NAMES[c->weight_type], others);
    field("biases", "%s", bias_names(c->bias_flags));
    if (c->sliding_window > 0)
        field("sliding_window", "%d (layers %d..%d)", c->sliding_window, c->window_first_layer, c->n_layers - 1);
    else field("sliding_window", "none");
    field("rope_layout", "%s", LAYOUT_NAMES[r->layout]);
    field("rope_theta", "%.10g", r->base);
    field("rot_dim", "%d of %d", r->rot_dim, c->dim / c->n_heads);
    scaling_text(text, sizeof text, t);
    field("rope_scaling", "%s", text);
    position_setup_text(text, sizeof text, t);
    field("position", "%s (a run without position flags)", text);
    field("kv_cache", "bytes per position (keys and values, every layer) with --kv f32 %zu, f16 %zu, q8_0 %s",
          kv_position_bytes(t, KV_F32), kv_position_bytes(t, KV_F16), kv_q8_text(text, sizeof text, t));
    field("tokenizer", "%s%s", in->tok_path, tok->from_gguf ? " (the GGUF's own vocabulary, tokenizer.ggml.*)" : "");
    field("tokenizer_kind", "%s, version %d", tokenizer_type_name(tok), tok->version);
    int kinds[PIECE_N_KINDS];
    count_kinds(tok, kinds);
    field("pieces", "%d: %d normal, %d special, %d byte, %d unused", tok->vocab_size, kinds[PIECE_NORMAL],
          kinds[PIECE_SPECIAL], kinds[PIECE_BYTE], kinds[PIECE_UNUSED]);
    field("merges", "%d", tok->n_merges);
    field("max_piece", "%d bytes", tok->max_token_length);
    token_field(tok, "bos", tok->bos_id);
    field("add_bos", "%s", tok->add_bos ? "yes: a prompt starts with BOS" : "no: a prompt starts with its text");
    token_field(tok, "eos", tok->eos_id);
    field("add_eos", "no: nothing is appended to a prompt");
    token_field(tok, "eot", tok->eot_id);
    token_field(tok, "pad", tok->pad_id);
    printf("%-18s ", "stop_ids");
    for (int i = 0; i < tok->n_stop; i++) fputs(i ? ", " : "", stdout), print_token(tok, tok->stop_ids[i]);
    printf("%s\n", tok->n_stop ? "" : "none: generation ends only at -n or the context");
    if (tok->chat_template == CHAT_UNSTATED && tok->type == TOK_SENTENCEPIECE && tok->version < 3)
        field("chat_template", "unstated (a version %d file cannot state one; -m chat uses llama2, as llama2.c's "
              "chat does, and says so; --chat-template chooses)", tok->version);
    else if (tok->chat_template == CHAT_UNSTATED) field("chat_template", "unstated (-m chat needs --chat-template)");
    else field("chat_template", "%s", CHAT_TEMPLATE_NAMES[tok->chat_template]);
    text_field("system_default", tok->system_default);
    text_field("system_prefix", tok->system_prefix);
    printf("%-18s %d", "special", kinds[PIECE_SPECIAL]);
    for (int id = 0, shown = 0; id < tok->vocab_size && shown < SPECIAL_SHOWN; id++)
        if (tok->kind[id] == PIECE_SPECIAL) fputs(shown++ ? ", " : ": ", stdout), print_token(tok, id);
    printf("%s\n", kinds[PIECE_SPECIAL] > SPECIAL_SHOWN ? ", ... (--json lists all)" : "");
}

/* -m info --json: the same facts as one object. */
static void print_info_json(const ModeInput *in) {
    const Transformer *t = in->t;
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    const Tokenizer *tok = in->tok;
    printf("{\"file\": ");
    print_json_string(in->checkpoint);
    printf(", \"file_size\": %zu, \"format_version\": %d, \"dim\": %d, \"hidden_dim\": %d, \"n_layers\": %d, "
           "\"n_heads\": %d, \"n_kv_heads\": %d, \"head_size\": %d, \"vocab_size\": %d, \"train_ctx\": %d, "
           "\"shared_classifier\": %s, ", t->file_size, c->version, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
           c->n_kv_heads, c->dim / c->n_heads, c->vocab_size, c->train_ctx, c->shared_classifier ? "true" : "false");
    if (t->mapping && !memcmp(t->mapping, "GGUF", 4)) // read directly (gguf_model.c)
        printf("\"gguf_version\": %d, \"converted_bytes\": %zu, ", read_le_i32((const unsigned char *)t->mapping + 4),
               t->converted_size);
    GgufKeys keys;
    if (gguf_keys(in, &keys)) {
        printf("\"gguf_keys_mapped\": ");
        print_gguf_keys(&keys, 1, 1);
        printf(", \"gguf_keys_ignored\": ");
        print_gguf_keys(&keys, 0, 1);
        printf(", ");
        free(keys.keys[0]), free(keys.keys[1]);
    }
    print_json_field("norm_eps", c->norm_eps);
    printf("\"weights\": \"%s\", \"group_size\": %d, \"biases\": [", WEIGHT_NAMES[c->weight_type], c->group_size);
    const char *bias[] = {"qkv", "o", "mlp"};
    for (int b = 0, n = 0; b < 3; b++)
        if (c->bias_flags & (1 << b)) printf("%s\"%s\"", n++ ? ", " : "", bias[b]);
    printf("], \"sliding_window\": %d, \"window_first_layer\": %d, \"bos_id\": %d, \"eos_id\": %d, ",
           c->sliding_window, c->window_first_layer, c->bos_id, c->eos_id);
    printf("\"rope\": {\"layout\": \"%s\", ", LAYOUT_NAMES[r->layout]);
    print_json_field("theta", r->base);
    printf("\"rot_dim\": %d, \"scaling\": \"%s\", ", r->rot_dim, SCALING_NAMES[r->scaling]);
    print_json_field("factor", r->factor);
    printf("\"orig_ctx\": %d, ", r->orig_ctx);
    print_json_field("beta_fast", r->beta_fast);
    print_json_field("beta_slow", r->beta_slow);
    print_json_field("attn_factor", r->attn_factor);
    print_json_field("low_freq", r->low_freq);
    printf("\"high_freq\": ");
    print_json_number(r->high_freq);
    printf("}, \"position\": ");
    print_position_json(t);
    printf(", \"kv_cache_bytes_per_position\": {\"f32\": %zu, \"f16\": %zu, \"q8_0\": ",
           kv_position_bytes(t, KV_F32), kv_position_bytes(t, KV_F16));
    if (kv_position_bytes(t, KV_Q8_0)) printf("%zu}", kv_position_bytes(t, KV_Q8_0));
    else printf("null}");
    int kinds[PIECE_N_KINDS];
    count_kinds(tok, kinds);
    printf(", \"tokenizer\": {\"file\": ");
    print_json_string(in->tok_path);
    printf(", \"source\": \"%s\"", tok->from_gguf ? "gguf" : "file"); // a GGUF's metadata, or a tokenizer file
    printf(", \"kind\": \"%s\", \"version\": %d, \"vocab_size\": %d, \"pieces\": {", tokenizer_type_name(tok),
           tok->version, tok->vocab_size);
    for (int k = 0; k < PIECE_N_KINDS; k++) printf("%s\"%s\": %d", k ? ", " : "", PIECE_KIND_NAMES[k], kinds[k]);
    printf("}, \"merges\": %d, \"max_piece_bytes\": %d, \"add_bos\": %s, \"bos_id\": %d, \"eos_id\": %d, "
           "\"eot_id\": %d, \"pad_id\": %d, \"stop_ids\": [", tok->n_merges, tok->max_token_length,
           tok->add_bos ? "true" : "false", tok->bos_id, tok->eos_id, tok->eot_id, tok->pad_id);
    for (int i = 0; i < tok->n_stop; i++) printf("%s%d", i ? ", " : "", tok->stop_ids[i]);
    printf("], \"chat_template\": \"%s\", \"system_default\": ", CHAT_TEMPLATE_NAMES[tok->chat_template]);
    print_json_piece(tok->system_default, strlen(tok->system_default));
    printf(", \"system_prefix\": ");
    print_json_piece(tok->system_prefix, strlen(tok->system_prefix));
    printf(", \"special\": [");
    for (int id = 0, n = 0; id < tok->vocab_size; id++)
        if (tok->kind[id] == PIECE_SPECIAL) {
            printf("%s{\"id\": %d, \"piece\": ", n++ ? ", " : "", id);
            print_json_piece(tok->vocab[id], (size_t)tok->vocab_len[id]);
            printf("}");
        }
    printf("]}}\n");
}

/* -m info: the checkpoint, a run's default position setup and the tokenizer;
 * nothing runs, so no load line. */
void info_mode(const ModeInput *in) {
    if (in->o->json) print_info_json(in);
    else print_info_text(in);
}
